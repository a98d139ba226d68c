// Stream-ordered operations on real providers, with fake streams (CPU
// threads standing in for CUDA streams): soft-RoCE over the software NIC
// and the shm provider, through the C API's QPs (core/provider/stream_api.h
// gives the engine a QP's notify posts). A "kernel" writes data, a
// stream-ordered WRITE_WITH_IMM carries it, the peer's stream waits on the
// receive and a "kernel" there checks every byte; a ping-pong; READ; the
// CQ entries as for ufab_post_send; RESET and ERROR releasing waiters.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/provider/stream_api.h"
#include "core/streamops/engine.h"
#include "tests/unit/streamops/fake_stream.h"
#include "ufab/stream.h"
#include "ufab/stream.hpp"
#include "ufab/rdma.h"

namespace ufab::streamops {
namespace {

using namespace std::chrono_literals;

constexpr size_t kBuf = 64 * 1024;

struct Pair {
  ufab_device* dev[2] = {};
  ufab_pd* pd[2] = {};
  ufab_cq* cq[2] = {};
  ufab_qp* qp[2] = {};
  ufab_mr* mr[2] = {};
  std::vector<uint8_t> buf[2];

  void open(const std::string& provider, const std::string& tag) {
    const char* ips[2] = {"10.78.0.1", "10.78.0.2"};
    for (int i = 0; i < 2; ++i) {
      ufab_device_opts o{};
      o.size = sizeof o;
      o.ip = ips[i];
      o.progress_thread = 1;
      std::string name = provider == "swnic" ? "swnic:so" + std::to_string(getpid()) + tag + ":" + std::to_string(i)
                                             : "shm:so" + std::to_string(getpid()) + tag;
      ASSERT_EQ(ufab_device_open(name.c_str(), provider == "swnic" ? &o : nullptr, &dev[i]), 0) << ufab_last_error();
      ASSERT_EQ(ufab_pd_alloc(dev[i], &pd[i]), 0) << ufab_last_error();
      ASSERT_EQ(ufab_cq_create(dev[i], 256, &cq[i]), 0) << ufab_last_error();
      ufab_qp_init_attr init{};
      init.qp_type = UFAB_QPT_RC;
      init.send_cq = cq[i];
      init.recv_cq = cq[i];
      init.cap = {.max_send_wr = 64, .max_recv_wr = 64, .max_send_sge = 2, .max_recv_sge = 2, .max_inline_data = 64};
      ASSERT_EQ(ufab_qp_create(pd[i], &init, &qp[i]), 0) << ufab_last_error();
      buf[i].assign(kBuf, 0);
      ASSERT_EQ(ufab_mr_reg(pd[i], buf[i].data(), kBuf,
                            UFAB_ACCESS_LOCAL_WRITE | UFAB_ACCESS_REMOTE_WRITE | UFAB_ACCESS_REMOTE_READ, &mr[i]),
                0)
          << ufab_last_error();
    }
    ufab_conn c[2];
    for (int i = 0; i < 2; ++i) ASSERT_EQ(ufab_qp_local(qp[i], &c[i]), 0) << ufab_last_error();
    for (int i = 0; i < 2; ++i) ASSERT_EQ(ufab_qp_connect(qp[i], &c[1 - i], nullptr), 0) << ufab_last_error();
  }
  void close() {
    for (int i = 0; i < 2; ++i) {
      if (mr[i]) ufab_mr_dereg(mr[i]);
      if (qp[i]) ufab_qp_destroy(qp[i]);
      if (cq[i]) ufab_cq_destroy(cq[i]);
      if (pd[i]) ufab_pd_free(pd[i]);
      if (dev[i]) ufab_device_close(dev[i]);
      mr[i] = nullptr;
      qp[i] = nullptr;
      cq[i] = nullptr;
      pd[i] = nullptr;
      dev[i] = nullptr;
    }
  }
  ~Pair() { close(); }
  ufab_sge sge(int i, size_t off, size_t len) {
    return {.addr = reinterpret_cast<uintptr_t>(buf[i].data() + off), .length = static_cast<uint32_t>(len),
            .lkey = ufab_mr_lkey(mr[i])};
  }
  uint64_t raddr(int i, size_t off) { return reinterpret_cast<uintptr_t>(buf[i].data() + off); }
};

WordAllocator plain_memory() {
  return [](size_t bytes) -> Result<void*> {
    void* p = std::aligned_alloc(128, bytes);
    if (p == nullptr) return fail(ENOMEM, "no memory");
    return p;
  };
}

// Every completion on `cq` within `limit` (bounded).
std::vector<ufab_wc> drain(ufab_cq* cq, size_t want, std::chrono::milliseconds limit = 5s) {
  std::vector<ufab_wc> out;
  auto until = std::chrono::steady_clock::now() + limit;
  while (out.size() < want && std::chrono::steady_clock::now() < until) {
    ufab_wc wc[16];
    int n = ufab_cq_poll(cq, wc, 16);
    for (int i = 0; i < n; ++i) out.push_back(wc[i]);
    if (n == 0) std::this_thread::sleep_for(20us);
  }
  return out;
}

class StreamProviders : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    static int n = 0;
    ASSERT_NO_FATAL_FAILURE(p.open(GetParam(), "t" + std::to_string(++n)));
    auto e = Engine::create(plain_memory());
    ASSERT_TRUE(e);
    engine = std::move(*e);
    for (int i = 0; i < 2; ++i) engine->attach(p.qp[i], provider::stream_target(p.qp[i]));
  }
  void TearDown() override {
    for (int i = 0; i < 2; ++i) {
      engine->cancel(p.qp[i]);
    }
    p.close();
    for (int i = 0; i < 2; ++i) engine->finish(p.qp[i]);
  }
  Pair p;
  std::unique_ptr<Engine> engine;
};

// Kernel -> stream-ordered WRITE_WITH_IMM -> the peer's stream waits on the
// receive -> kernel checking every byte, for sizes across packet bounds.
TEST_P(StreamProviders, ProducerWriteImmConsumer) {
  FakeStream sa, sb;
  for (size_t len : {size_t{1}, size_t{8}, size_t{4096}, size_t{4097}, size_t{60000}}) {
    SCOPED_TRACE("length " + std::to_string(len));
    std::atomic<int> bad{-1};
    ufab_recv_wr rw{.wr_id = 0xb0 + len, .sg_list = nullptr, .num_sge = 0, .reserved = 0};
    auto recv = engine->post_recv(p.qp[1], &rw, 1);
    ASSERT_TRUE(recv) << recv.error().message();
    ASSERT_TRUE(engine->wait(*recv, sb));
    sb.host([&, len] {  // the verifying kernel
      int first_bad = 0;
      for (size_t i = 0; i < len && first_bad == 0; ++i) {
        if (p.buf[1][i] != static_cast<uint8_t>(i * 7 + len)) first_bad = static_cast<int>(i) + 1;
      }
      bad = first_bad;
    });
    sa.host([&, len] {  // the producing kernel
      for (size_t i = 0; i < len; ++i) p.buf[0][i] = static_cast<uint8_t>(i * 7 + len);
    });
    ufab_sge s = p.sge(0, 0, len);
    ufab_send_wr wr{};
    wr.wr_id = 0xa0 + len;
    wr.opcode = UFAB_WR_RDMA_WRITE_WITH_IMM;
    wr.sg_list = &s;
    wr.num_sge = 1;
    wr.imm_data = static_cast<uint32_t>(len);
    wr.send_flags = UFAB_SEND_SIGNALED;
    wr.remote_addr = p.raddr(1, 0);
    wr.rkey = ufab_mr_rkey(p.mr[1]);
    auto send = engine->post_send(p.qp[0], &wr, 1, sa);
    ASSERT_TRUE(send) << send.error().message();
    ASSERT_TRUE(engine->wait(*send, sa));
    ASSERT_TRUE(sa.synchronize());
    ASSERT_TRUE(sb.synchronize());
    EXPECT_EQ(sa.stuck(), "");
    EXPECT_EQ(sb.stuck(), "");
    EXPECT_EQ(bad.load(), 0) << "byte " << bad.load() - 1 << " wrong at the consumer";
    auto is = engine->query(*send), ir = engine->query(*recv);
    EXPECT_EQ(is.state, OpInfo::kDone);
    EXPECT_EQ(is.wc_status, uint32_t{UFAB_WC_SUCCESS});
    EXPECT_EQ(ir.wc_status, uint32_t{UFAB_WC_SUCCESS});
    // The CQ entries appear as for ufab_post_send, with the application's wr_ids.
    auto wa = drain(p.cq[0], 1), wb = drain(p.cq[1], 1);
    ASSERT_EQ(wa.size(), 1u);
    EXPECT_EQ(wa[0].wr_id, 0xa0 + len);
    EXPECT_EQ(wa[0].opcode, uint32_t{UFAB_WC_RDMA_WRITE});
    ASSERT_EQ(wb.size(), 1u);
    EXPECT_EQ(wb[0].wr_id, 0xb0 + len);
    EXPECT_EQ(wb[0].imm_data, static_cast<uint32_t>(len));
    EXPECT_EQ(wb[0].opcode, uint32_t{UFAB_WC_RECV_RDMA_WITH_IMM});
    engine->release(*send);
    engine->release(*recv);
  }
}

// Both sides stream-driven: A writes, B's stream waits, B writes back, A's
// stream waits; an unsignaled WRITE leaves no CQ entry.
TEST_P(StreamProviders, PingPongWithoutTheHost) {
  FakeStream sa, sb;
  constexpr int kRounds = 200;
  std::vector<Op*> ops;
  for (int r = 0; r < kRounds; ++r) {
    ufab_recv_wr rw{.wr_id = static_cast<uint64_t>(r), .sg_list = nullptr, .num_sge = 0, .reserved = 0};
    auto rb = engine->post_recv(p.qp[1], &rw, 1);
    auto ra = engine->post_recv(p.qp[0], &rw, 1);
    ASSERT_TRUE(rb && ra);
    for (int side = 0; side < 2; ++side) {
      FakeStream& s = side == 0 ? sa : sb;
      if (side == 1) {
        ASSERT_TRUE(engine->wait(*rb, s));
      }
      s.host([&, side, r] { p.buf[side][0] = static_cast<uint8_t>(r); });
      ufab_sge sg = p.sge(side, 0, 8);
      ufab_send_wr wr{};
      wr.opcode = UFAB_WR_RDMA_WRITE_WITH_IMM;
      wr.sg_list = &sg;
      wr.num_sge = 1;
      wr.remote_addr = p.raddr(1 - side, 64);
      wr.rkey = ufab_mr_rkey(p.mr[1 - side]);  // unsignaled: no send completion
      auto op = engine->post_send(p.qp[side], &wr, 1, s);
      ASSERT_TRUE(op) << op.error().message();
      ops.push_back(*op);
      if (side == 0) {
        ASSERT_TRUE(engine->wait(*ra, s));
      }
    }
    ops.push_back(*ra);
    ops.push_back(*rb);
    if (r % 32 == 31) {  // the receive queues hold 64
      ASSERT_TRUE(sa.synchronize(20s));
      ASSERT_TRUE(sb.synchronize(20s));
    }
  }
  ASSERT_TRUE(sa.synchronize(20s));
  ASSERT_TRUE(sb.synchronize(20s));
  EXPECT_EQ(sa.stuck(), "");
  EXPECT_EQ(sb.stuck(), "");
  EXPECT_EQ(p.buf[0][64], static_cast<uint8_t>(kRounds - 1));
  EXPECT_EQ(p.buf[1][64], static_cast<uint8_t>(kRounds - 1));
  for (Op* op : ops) {
    EXPECT_EQ(engine->query(op).wc_status, uint32_t{UFAB_WC_SUCCESS});
    engine->release(op);
  }
  auto wa = drain(p.cq[0], kRounds + 1, 200ms);
  EXPECT_EQ(wa.size(), size_t{kRounds}) << "only the receives complete: the WRITEs were unsignaled";
  for (auto& wc : wa) EXPECT_EQ(wc.opcode, uint32_t{UFAB_WC_RECV_RDMA_WITH_IMM});
}

// A batch: two WRITEs and a READ of what they wrote, one doorbell.
TEST_P(StreamProviders, BatchOfWritesAndARead) {
  FakeStream s;
  for (size_t i = 0; i < 2048; ++i) p.buf[0][i] = static_cast<uint8_t>(i ^ 0x5a);
  ufab_sge w1 = p.sge(0, 0, 1024), w2 = p.sge(0, 1024, 1024), rd = p.sge(0, 8192, 2048);
  ufab_send_wr wrs[3] = {};
  for (int i = 0; i < 2; ++i) {
    wrs[i].opcode = UFAB_WR_RDMA_WRITE;
    wrs[i].sg_list = i == 0 ? &w1 : &w2;
    wrs[i].num_sge = 1;
    wrs[i].remote_addr = p.raddr(1, 1024 * i);
    wrs[i].rkey = ufab_mr_rkey(p.mr[1]);
  }
  wrs[2].wr_id = 33;
  wrs[2].opcode = UFAB_WR_RDMA_READ;
  wrs[2].sg_list = &rd;
  wrs[2].num_sge = 1;
  wrs[2].remote_addr = p.raddr(1, 0);
  wrs[2].rkey = ufab_mr_rkey(p.mr[1]);
  wrs[2].send_flags = UFAB_SEND_SIGNALED;
  auto op = engine->post_send(p.qp[0], wrs, 3, s);
  ASSERT_TRUE(op) << op.error().message();
  ASSERT_TRUE(engine->wait(*op, s));
  std::atomic<bool> same{false};
  s.host([&] { same = std::memcmp(p.buf[0].data(), p.buf[0].data() + 8192, 2048) == 0; });
  ASSERT_TRUE(s.synchronize());
  EXPECT_EQ(s.stuck(), "");
  EXPECT_TRUE(same) << "the READ did not bring back what the WRITEs wrote";
  auto wc = drain(p.cq[0], 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 33u);
  EXPECT_EQ(wc[0].opcode, uint32_t{UFAB_WC_RDMA_READ});
  engine->release(*op);
}

// A remote access error: the stream goes on, the op says what happened,
// and the CQ has the error as for ufab_post_send.
TEST_P(StreamProviders, ARemoteErrorReleasesTheStreamWithTheStatus) {
  FakeStream s;
  ufab_sge sg = p.sge(0, 0, 64);
  ufab_send_wr wr{};
  wr.wr_id = 5;
  wr.opcode = UFAB_WR_RDMA_WRITE;
  wr.sg_list = &sg;
  wr.num_sge = 1;
  wr.remote_addr = p.raddr(1, 0);
  wr.rkey = ufab_mr_rkey(p.mr[1]) ^ 0x100;  // a key the peer never gave
  auto op = engine->post_send(p.qp[0], &wr, 1, s);
  ASSERT_TRUE(op);
  ASSERT_TRUE(engine->wait(*op, s));
  ASSERT_TRUE(s.synchronize());
  EXPECT_EQ(s.stuck(), "");
  auto i = engine->query(*op);
  EXPECT_EQ(i.state, OpInfo::kDone);
  EXPECT_EQ(i.wc_status, uint32_t{UFAB_WC_REM_ACCESS_ERR});
  auto wc = drain(p.cq[0], 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, uint32_t{UFAB_WC_REM_ACCESS_ERR});
  EXPECT_EQ(wc[0].wr_id, 5u);
  engine->release(*op);
}

// Receives dropped by a modify to RESET (no completions) still release a
// stream waiting on them, flushed.
TEST_P(StreamProviders, ResetReleasesWaitersOnDroppedWork) {
  FakeStream s;
  ufab_recv_wr rw{.wr_id = 1, .sg_list = nullptr, .num_sge = 0, .reserved = 0};
  auto op = engine->post_recv(p.qp[1], &rw, 1);
  ASSERT_TRUE(op);
  ASSERT_TRUE(engine->wait(*op, s));
  std::this_thread::sleep_for(10ms);
  EXPECT_EQ(engine->query(*op).state, OpInfo::kPosted);
  ufab_qp_attr a{};
  a.state = UFAB_QPS_RESET;
  ASSERT_EQ(ufab_qp_modify(p.qp[1], &a, UFAB_QP_STATE), 0) << ufab_last_error();
  ASSERT_TRUE(s.synchronize());
  EXPECT_EQ(s.stuck(), "");
  EXPECT_EQ(engine->query(*op).wc_status, uint32_t{UFAB_WC_WR_FLUSH_ERR});
  engine->release(*op);
}

// A send the stream reaches while the QP is in ERROR: flushed, the stream
// goes on, the CQ has the flush as for ufab_post_send.
TEST_P(StreamProviders, AQpInErrorFlushesWhatTheStreamTriggers) {
  FakeStream s;
  s.gate();
  ufab_sge sg = p.sge(0, 0, 8);
  ufab_send_wr wr{};
  wr.wr_id = 77;
  wr.opcode = UFAB_WR_SEND;
  wr.sg_list = &sg;
  wr.num_sge = 1;
  auto op = engine->post_send(p.qp[0], &wr, 1, s);
  ASSERT_TRUE(op);
  ASSERT_TRUE(engine->wait(*op, s));
  ufab_qp_attr a{};
  a.state = UFAB_QPS_ERR;
  ASSERT_EQ(ufab_qp_modify(p.qp[0], &a, UFAB_QP_STATE), 0) << ufab_last_error();
  s.open();
  ASSERT_TRUE(s.synchronize());
  EXPECT_EQ(s.stuck(), "");
  EXPECT_EQ(engine->query(*op).wc_status, uint32_t{UFAB_WC_WR_FLUSH_ERR});
  auto wc = drain(p.cq[0], 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 77u);
  EXPECT_EQ(wc[0].status, uint32_t{UFAB_WC_WR_FLUSH_ERR});
  engine->release(*op);
}

// The QP destroyed under an armed doorbell: the waiter goes on; the
// stream's late doorbell posts nothing.
TEST_P(StreamProviders, DestroyWithAnArmedDoorbell) {
  FakeStream s;
  s.gate();
  ufab_sge sg = p.sge(0, 0, 8);
  ufab_send_wr wr{};
  wr.opcode = UFAB_WR_RDMA_WRITE;
  wr.sg_list = &sg;
  wr.num_sge = 1;
  wr.remote_addr = p.raddr(1, 0);
  wr.rkey = ufab_mr_rkey(p.mr[1]);
  auto op = engine->post_send(p.qp[0], &wr, 1, s);
  ASSERT_TRUE(op);
  FakeStream waiter;
  ASSERT_TRUE(engine->wait(*op, waiter));
  engine->cancel(p.qp[0]);
  ufab_mr_dereg(p.mr[0]);
  p.mr[0] = nullptr;
  ufab_qp_destroy(p.qp[0]);
  engine->finish(p.qp[0]);
  p.qp[0] = nullptr;
  ASSERT_TRUE(waiter.synchronize());
  EXPECT_EQ(engine->query(*op).post_error, -ECANCELED);
  s.open();
  ASSERT_TRUE(s.synchronize());
  engine->release(*op);
}

TEST(StreamCApi, WithoutAGpuTheCallsSayWhy) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(p.open("swnic", "capi"));
  ufab_sge sg = p.sge(0, 0, 8);
  ufab_send_wr wr{};
  wr.opcode = UFAB_WR_SEND;
  wr.sg_list = &sg;
  wr.num_sge = 1;
  ufab_stream_op* op = nullptr;
  int rc = ufab_stream_post_send(p.qp[0], &wr, 1, nullptr, &op);
  if (rc == 0) GTEST_SKIP() << "this machine has a GPU: the GPU suite tests the calls";
  std::string why = ufab_last_error();
  EXPECT_NE(why.find("ufab_stream_post_send: "), std::string::npos) << why;
  EXPECT_TRUE(why.find("no GPU driver") != std::string::npos || why.find("no GPU support") != std::string::npos ||
              why.find("no GPU is visible") != std::string::npos)
      << why;
}

// The C++ layer over the same calls: the error comes back as a value.
TEST(StreamCpp, WithoutAGpuPostSendSaysWhy) {
  auto dev = rdma::Device::open("swnic:socpp" + std::to_string(getpid()) + ":0",
                                rdma::DeviceOptions{.ip = "10.78.1.1"});
  ASSERT_TRUE(dev) << dev.error().message();
  auto pd = (*dev)->alloc_pd();
  ASSERT_TRUE(pd);
  auto cq = (*dev)->create_cq(16);
  ASSERT_TRUE(cq);
  auto qp = pd->create_qp({.type = rdma::QpType::kRc, .send_cq = cq->get(), .recv_cq = cq->get()});
  ASSERT_TRUE(qp) << qp.error().message();
  rdma::SendWr wr{};
  wr.opcode = rdma::WrOpcode::kSend;
  auto op = rdma::StreamOp::post_send(**qp, wr, nullptr);
  if (op) GTEST_SKIP() << "this machine has a GPU: the GPU suite tests the calls";
  EXPECT_NE(op.error().message().find("ufab_stream_post_send: "), std::string::npos) << op.error().message();
  EXPECT_NE(op.error().code(), 0);
}

INSTANTIATE_TEST_SUITE_P(Providers, StreamProviders, ::testing::Values("swnic", "shm"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace ufab::streamops
