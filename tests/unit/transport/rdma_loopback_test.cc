// Two ufab devices on the two ports of one software NIC, in one thread:
// the basic operations end to end, driven by explicit progress calls.
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "api/rdma.h"

namespace ufab::rdma {
namespace {

struct Side {
  std::unique_ptr<Device> dev;
  std::optional<ProtectionDomain> pd;
  std::unique_ptr<CompletionQueue> cq;
  std::unique_ptr<QueuePair> qp;
  std::vector<uint8_t> buf;
  std::optional<MemoryRegion> mr;
};

class Loopback : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string name = "loop" + std::to_string(::getpid());
    open(a_, "swnic:" + name + ":0", "10.0.0.1", {{"stale", "reset"}});
    open(b_, "swnic:" + name + ":1", "10.0.0.2", {});
    ASSERT_TRUE(a_.qp->connect(b_.qp->local()));
    ASSERT_TRUE(b_.qp->connect(a_.qp->local()));
  }

  void open(Side& s, const std::string& spec, const std::string& ip, std::map<std::string, std::string> params) {
    auto dev = Device::open(spec, {.ip = ip, .params = params});
    ASSERT_TRUE(dev) << dev.error().message();
    s.dev = std::move(*dev);
    auto pd = s.dev->alloc_pd();
    ASSERT_TRUE(pd);
    s.pd.emplace(std::move(*pd));
    auto cq = s.dev->create_cq(64);
    ASSERT_TRUE(cq);
    s.cq = std::move(*cq);
    auto qp = s.pd->create_qp({.type = QpType::kRc, .send_cq = s.cq.get(), .recv_cq = s.cq.get()});
    ASSERT_TRUE(qp) << qp.error().message();
    s.qp = std::move(*qp);
    s.buf.assign(1 << 20, 0);
    auto mr = s.pd->register_mr(s.buf.data(), s.buf.size(), kLocalWrite | kRemoteAccess);
    ASSERT_TRUE(mr);
    s.mr.emplace(std::move(*mr));
  }

  // Polls `s` while progressing both sides until one completion arrives.
  WorkCompletion next(Side& s) {
    WorkCompletion wc[1];
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < deadline) {
      a_.dev->progress();
      b_.dev->progress();
      auto n = s.cq->poll(wc);
      EXPECT_TRUE(n);
      if (n && *n == 1) return wc[0];
    }
    ADD_FAILURE() << "no completion within 5 s";
    return {};
  }

  Side a_, b_;
};

TEST_F(Loopback, SendRecvAcrossMtu) {
  for (uint32_t size : {0u, 1u, 1024u, 1025u, 5000u}) {
    for (uint32_t i = 0; i < size; ++i) a_.buf[i] = static_cast<uint8_t>(i * 7 + size);
    Sge rsge = b_.mr->sge(0, 8192);
    ASSERT_TRUE(b_.qp->post_recv({.wr_id = 7, .sgl = {&rsge, 1}}));
    Sge ssge = a_.mr->sge(0, size);
    ASSERT_TRUE(a_.qp->post_send({.wr_id = 9, .opcode = WrOpcode::kSend, .flags = kSendSignaled, .sgl = {&ssge, 1}}));
    WorkCompletion r = next(b_);
    EXPECT_EQ(r.status, WcStatus::kSuccess) << r.error;
    EXPECT_EQ(r.wr_id, 7u);
    EXPECT_EQ(r.opcode, WcOpcode::kRecv);
    EXPECT_EQ(r.byte_len, size);
    WorkCompletion s = next(a_);
    EXPECT_EQ(s.status, WcStatus::kSuccess) << s.error;
    EXPECT_EQ(s.wr_id, 9u);
    EXPECT_EQ(0, std::memcmp(a_.buf.data(), b_.buf.data(), size));
  }
}

TEST_F(Loopback, WriteReadAtomics) {
  for (uint32_t i = 0; i < 70000; ++i) a_.buf[i] = static_cast<uint8_t>(i * 13);
  Sge s = a_.mr->sge(0, 70000);
  uint64_t remote = reinterpret_cast<uint64_t>(b_.buf.data()) + 4096;
  ASSERT_TRUE(a_.qp->post_send({.wr_id = 1, .opcode = WrOpcode::kRdmaWrite, .flags = kSendSignaled,
                                .sgl = {&s, 1}, .remote_addr = remote, .rkey = b_.mr->rkey()}));
  WorkCompletion wc = next(a_);
  ASSERT_EQ(wc.status, WcStatus::kSuccess) << wc.error;
  EXPECT_EQ(0, std::memcmp(a_.buf.data(), b_.buf.data() + 4096, 70000));

  Sge back = a_.mr->sge(200000, 70000);
  ASSERT_TRUE(a_.qp->post_send({.wr_id = 2, .opcode = WrOpcode::kRdmaRead, .flags = kSendSignaled,
                                .sgl = {&back, 1}, .remote_addr = remote, .rkey = b_.mr->rkey()}));
  wc = next(a_);
  ASSERT_EQ(wc.status, WcStatus::kSuccess) << wc.error;
  EXPECT_EQ(wc.opcode, WcOpcode::kRdmaRead);
  EXPECT_EQ(wc.byte_len, 70000u);
  EXPECT_EQ(0, std::memcmp(a_.buf.data(), a_.buf.data() + 200000, 70000));

  uint64_t counter = 40;
  std::memcpy(b_.buf.data(), &counter, 8);
  Sge result = a_.mr->sge(300000, 8);
  ASSERT_TRUE(a_.qp->post_send({.wr_id = 3, .opcode = WrOpcode::kAtomicFetchAndAdd, .flags = kSendSignaled,
                                .sgl = {&result, 1}, .remote_addr = reinterpret_cast<uint64_t>(b_.buf.data()),
                                .rkey = b_.mr->rkey(), .compare_add = 2}));
  wc = next(a_);
  ASSERT_EQ(wc.status, WcStatus::kSuccess) << wc.error;
  uint64_t original;
  std::memcpy(&original, a_.buf.data() + 300000, 8);
  EXPECT_EQ(original, 40u);
  std::memcpy(&counter, b_.buf.data(), 8);
  EXPECT_EQ(counter, 42u);

  ASSERT_TRUE(a_.qp->post_send({.wr_id = 4, .opcode = WrOpcode::kAtomicCmpAndSwp, .flags = kSendSignaled,
                                .sgl = {&result, 1}, .remote_addr = reinterpret_cast<uint64_t>(b_.buf.data()),
                                .rkey = b_.mr->rkey(), .compare_add = 42, .swap = 99}));
  wc = next(a_);
  ASSERT_EQ(wc.status, WcStatus::kSuccess) << wc.error;
  std::memcpy(&counter, b_.buf.data(), 8);
  EXPECT_EQ(counter, 99u);
}

TEST_F(Loopback, BadRkeyIsRemoteAccessErrorAndBothSidesGoToError) {
  Sge s = a_.mr->sge(0, 100);
  ASSERT_TRUE(a_.qp->post_send({.wr_id = 5, .opcode = WrOpcode::kRdmaWrite, .flags = kSendSignaled,
                                .sgl = {&s, 1}, .remote_addr = reinterpret_cast<uint64_t>(b_.buf.data()),
                                .rkey = b_.mr->rkey() ^ 0x100}));
  WorkCompletion wc = next(a_);
  EXPECT_EQ(wc.status, WcStatus::kRemAccessErr) << wc.error;
  EXPECT_EQ(a_.qp->state(), QpState::kError);
  EXPECT_EQ(b_.qp->state(), QpState::kError);
}

}  // namespace
}  // namespace ufab::rdma
