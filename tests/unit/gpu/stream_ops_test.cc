// Stream-ordered operations with real CUDA streams and kernels
// (<ufab/stream.h>, docs/gpu.md): a kernel produces data, a stream-ordered
// WRITE_WITH_IMM carries it, the other side's stream waits for the receive
// and a kernel verifies every byte; batches; a send behind a running kernel
// is not posted before the kernel ends; a QP destroyed under an armed
// doorbell; GPU memory regions. Over soft-RoCE (swnic) and shm. Without a
// GPU every test skips with "no GPU: <why>" (the README test command);
// tests/gpu/run.sh runs it on the GPU machine.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/gpu/stream_common.h"

namespace ufab::gpu_test {
namespace {

using namespace std::chrono_literals;

#define NEED_GPU()                                                         \
  do {                                                                     \
    if (std::string why = ufab::gpu::unavailable_reason(); !why.empty()) { \
      GTEST_SKIP() << "no GPU: " << why;                                   \
    }                                                                      \
  } while (0)

class StreamOps : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    NEED_GPU();
    std::string why = g.open();
    ASSERT_EQ(why, "");
    static int n = 0;
    why = p.open(*g.d, GetParam(), "g" + std::to_string(++n), kBytes);
    ASSERT_EQ(why, "");
    for (auto& s : streams) {
      auto r = g.d->stream_create();
      ASSERT_TRUE(r) << r.error().message();
      s = *r;
    }
    auto bad = Allocation::allocate(*g.d, 0, Allocation::Kind::kPinnedHost, 64);
    ASSERT_TRUE(bad) << bad.error().message();
    counters.emplace(std::move(*bad));
    std::memset(counters->data(), 0, 64);
  }
  void TearDown() override {
    for (auto s : streams) {
      if (s != nullptr) {
        EXPECT_TRUE(g.idle_within(s, 10s)) << "a stream is stuck";
        g.d->stream_destroy(s);
      }
    }
  }
  unsigned* counter(int i) const { return static_cast<unsigned*>(counters->data()) + i; }
  static constexpr size_t kBytes = 4 << 20;
  Gpu g;
  QpPair p;
  void* streams[3] = {};
  std::optional<Allocation> counters;
};

TEST_P(StreamOps, KernelWriteImmWaitKernelEveryByteChecked) {
  void* sa = streams[0];
  void* sb = streams[1];
  unsigned seed = 1;
  for (size_t len : {size_t{1}, size_t{8}, size_t{4096}, size_t{4099}, size_t{65536}, size_t{1} << 20, kBytes}) {
    SCOPED_TRACE("bytes " + std::to_string(len));
    ++seed;
    *counter(0) = 0;
    std::memset(p.data(1), 0, len);
    // B: a receive, the stream waits for it, then the verifying kernel.
    ufab_recv_wr rw{.wr_id = 0xb00 + seed, .sg_list = nullptr, .num_sge = 0, .reserved = 0};
    ufab_stream_op* recv = nullptr;
    ASSERT_EQ(ufab_stream_post_recv(p.qp[1], &rw, 1, &recv), 0) << ufab_last_error();
    ASSERT_EQ(ufab_stream_wait(recv, sb), 0) << ufab_last_error();
    ASSERT_TRUE(g.launch_check(sb, p.data(1), len, seed, counter(0)));
    // A: the producing kernel, the WRITE in stream order, a wait for it.
    ASSERT_TRUE(g.launch_fill(sa, p.data(0), len, seed));
    ufab_sge s = p.sge(0, 0, len);
    ufab_send_wr wr = p.write_imm(0, &s, 0, seed, true);
    ufab_stream_op* send = nullptr;
    ASSERT_EQ(ufab_stream_post_send(p.qp[0], &wr, 1, sa, &send), 0) << ufab_last_error();
    ASSERT_EQ(ufab_stream_wait(send, sa), 0) << ufab_last_error();
    ASSERT_TRUE(g.idle_within(sa, 10s));
    ASSERT_TRUE(g.idle_within(sb, 10s));
    EXPECT_EQ(*counter(0), 0u) << "bytes wrong at the consumer";
    for (auto* op : {send, recv}) {
      ufab_stream_op_info info{};
      const char* why = nullptr;
      ASSERT_EQ(ufab_stream_op_query(op, &info, &why), 0);
      EXPECT_EQ(info.state, uint32_t{UFAB_STREAM_OP_DONE});
      EXPECT_EQ(info.wc_status, uint32_t{UFAB_WC_SUCCESS}) << why;
      ufab_stream_op_free(op);
    }
    ufab_wc wc{};
    ASSERT_EQ(ufab_cq_wait(p.cq[0], &wc, 1, 5000), 1);
    EXPECT_EQ(wc.wr_id, seed);
    EXPECT_EQ(wc.opcode, uint32_t{UFAB_WC_RDMA_WRITE});
    ASSERT_EQ(ufab_cq_wait(p.cq[1], &wc, 1, 5000), 1);
    EXPECT_EQ(wc.wr_id, 0xb00 + seed);
    EXPECT_EQ(wc.imm_data, seed);
  }
}

TEST_P(StreamOps, ABatchOnOneDoorbell) {
  void* sa = streams[0];
  constexpr size_t kChunk = 8192;
  ASSERT_TRUE(g.launch_fill(sa, p.data(0), 4 * kChunk, 77));
  ufab_sge s[4];
  ufab_send_wr wrs[4];
  for (int i = 0; i < 4; ++i) {
    s[i] = p.sge(0, i * kChunk, kChunk);
    wrs[i] = p.write_imm(0, &s[i], i * kChunk, i, false);
    wrs[i].opcode = UFAB_WR_RDMA_WRITE;
  }
  ufab_stream_op* op = nullptr;
  ASSERT_EQ(ufab_stream_post_send(p.qp[0], wrs, 4, sa, &op), 0) << ufab_last_error();
  ASSERT_EQ(ufab_stream_wait(op, sa), 0);
  ASSERT_TRUE(g.launch_check(sa, p.data(1), 4 * kChunk, 77, counter(1)));
  ASSERT_TRUE(g.idle_within(sa, 10s));
  EXPECT_EQ(*counter(1), 0u);
  ufab_stream_op_info info{};
  ASSERT_EQ(ufab_stream_op_query(op, &info, nullptr), 0);
  EXPECT_EQ(info.wc_status, uint32_t{UFAB_WC_SUCCESS});
  ufab_stream_op_free(op);
  ufab_wc wc{};
  EXPECT_EQ(ufab_cq_poll(p.cq[0], &wc, 1), 0) << "unsignaled WRITEs left a completion";
}

TEST_P(StreamOps, NotPostedBeforeTheKernelBeforeItEnds) {
  void* sa = streams[0];
  std::memset(p.data(1), 0, 64);
  ASSERT_TRUE(g.launch_spin(sa, 100'000'000, counter(2)));  // 100 ms
  ASSERT_TRUE(g.launch_fill(sa, p.data(0), 64, 9));
  ufab_sge s = p.sge(0, 0, 64);
  ufab_send_wr wr = p.write_imm(0, &s, 0, 9, false);
  wr.opcode = UFAB_WR_RDMA_WRITE;
  ufab_stream_op* op = nullptr;
  ASSERT_EQ(ufab_stream_post_send(p.qp[0], &wr, 1, sa, &op), 0) << ufab_last_error();
  std::this_thread::sleep_for(30ms);
  ufab_stream_op_info info{};
  ASSERT_EQ(ufab_stream_op_query(op, &info, nullptr), 0);
  EXPECT_EQ(*counter(2), 0u) << "the kernel ended early; the check below means nothing";
  EXPECT_EQ(info.state, uint32_t{UFAB_STREAM_OP_ARMED}) << "posted while the kernel before it ran";
  EXPECT_EQ(p.data(1)[1], 0) << "data arrived before the kernel ended";
  ASSERT_TRUE(g.idle_within(sa, 10s));
  auto until = std::chrono::steady_clock::now() + 5s;
  do {
    ASSERT_EQ(ufab_stream_op_query(op, &info, nullptr), 0);
  } while (info.state != UFAB_STREAM_OP_DONE && std::chrono::steady_clock::now() < until);
  EXPECT_EQ(info.state, uint32_t{UFAB_STREAM_OP_DONE});
  EXPECT_EQ(p.data(1)[1], static_cast<uint8_t>(7 + 9));
  ufab_stream_op_free(op);
}

TEST_P(StreamOps, QpDestroyedUnderAnArmedDoorbell) {
  void* sa = streams[0];
  void* sw = streams[2];
  ASSERT_TRUE(g.launch_spin(sa, 50'000'000, counter(3)));
  ufab_sge s = p.sge(0, 0, 64);
  ufab_send_wr wr = p.write_imm(0, &s, 0, 1, true);
  ufab_stream_op* op = nullptr;
  ASSERT_EQ(ufab_stream_post_send(p.qp[0], &wr, 1, sa, &op), 0) << ufab_last_error();
  ASSERT_EQ(ufab_stream_wait(op, sw), 0);
  ufab_mr_dereg(p.mr[0]);
  p.mr[0] = nullptr;
  ASSERT_EQ(ufab_qp_destroy(p.qp[0]), 0);
  p.qp[0] = nullptr;
  EXPECT_TRUE(g.idle_within(sw, 5s)) << "a stream waiting on a cancelled op is stuck";
  ufab_stream_op_info info{};
  const char* why = nullptr;
  ASSERT_EQ(ufab_stream_op_query(op, &info, &why), 0);
  EXPECT_EQ(info.state, uint32_t{UFAB_STREAM_OP_DONE});
  EXPECT_EQ(info.post_error, -ECANCELED) << why;
  ASSERT_TRUE(g.idle_within(sa, 5s));  // its doorbell write lands in a quarantined slot
  ufab_stream_op_free(op);
}

// A GPU memory region as the source: soft-RoCE carries it through the
// staging pipeline, every byte checked by a kernel at the target.
TEST_P(StreamOps, GpuMemorySource) {
  void* sa = streams[0];
  auto dev = Allocation::allocate(*g.d, 0, Allocation::Kind::kDevice, 65536);
  ASSERT_TRUE(dev) << dev.error().message();
  ufab_mr* mr = nullptr;
  int rc = ufab_mr_reg(p.pd[0], dev->data(), 65536, UFAB_ACCESS_LOCAL_WRITE, &mr);
  if (std::string(GetParam()) == "shm" && rc < 0) {
    // The shm provider registers no GPU memory (docs/drivers/shm.md).
    EXPECT_EQ(rc, -EOPNOTSUPP) << ufab_last_error();
    return;
  }
  ASSERT_EQ(rc, 0) << ufab_last_error();
  ASSERT_TRUE(g.launch_fill(sa, dev->data(), 65536, 5));
  ufab_sge s{.addr = reinterpret_cast<uintptr_t>(dev->data()), .length = 65536, .lkey = ufab_mr_lkey(mr)};
  ufab_send_wr wr = p.write_imm(0, &s, 0, 5, true);
  wr.opcode = UFAB_WR_RDMA_WRITE;
  ufab_stream_op* op = nullptr;
  ASSERT_EQ(ufab_stream_post_send(p.qp[0], &wr, 1, sa, &op), 0) << ufab_last_error();
  ASSERT_EQ(ufab_stream_wait(op, sa), 0);
  ASSERT_TRUE(g.launch_check(sa, p.data(1), 65536, 5, counter(4)));
  ASSERT_TRUE(g.idle_within(sa, 10s));
  ufab_stream_op_info info{};
  const char* why = nullptr;
  ASSERT_EQ(ufab_stream_op_query(op, &info, &why), 0);
  EXPECT_EQ(info.state, uint32_t{UFAB_STREAM_OP_DONE});
  EXPECT_EQ(info.post_error, 0) << why;
  EXPECT_EQ(info.wc_status, uint32_t{UFAB_WC_SUCCESS});
  EXPECT_EQ(*counter(4), 0u) << "bytes wrong at the target";
  ufab_stream_op_free(op);
  ufab_wc wc{};
  (void)ufab_cq_wait(p.cq[0], &wc, 1, 1000);
  EXPECT_EQ(ufab_mr_dereg(mr), 0);
}

TEST_P(StreamOps, ErrorsComeBackAtEnqueue) {
  ufab_sge s = p.sge(0, 0, 8);
  ufab_send_wr wr = p.write_imm(0, &s, 0, 1, true);
  wr.opcode = UFAB_WR_ATOMIC_FETCH_AND_ADD;
  ufab_stream_op* op = nullptr;
  EXPECT_EQ(ufab_stream_post_send(p.qp[0], &wr, 1, streams[0], &op), -EINVAL);
  EXPECT_NE(std::string(ufab_last_error()).find("RDMA_READ"), std::string::npos) << ufab_last_error();
  ufab_qp_attr a{};
  a.state = UFAB_QPS_ERR;
  ASSERT_EQ(ufab_qp_modify(p.qp[0], &a, UFAB_QP_STATE), 0);
  wr.opcode = UFAB_WR_RDMA_WRITE;
  EXPECT_EQ(ufab_stream_post_send(p.qp[0], &wr, 1, streams[0], &op), -EINVAL);
  EXPECT_NE(std::string(ufab_last_error()).find("need RTS"), std::string::npos) << ufab_last_error();
}

INSTANTIATE_TEST_SUITE_P(Providers, StreamOps, ::testing::Values("swnic", "shm"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace ufab::gpu_test
