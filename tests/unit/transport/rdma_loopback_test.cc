// Two ufab devices on the two ports of one software NIC, in one thread:
// the basic operations end to end, driven by explicit progress calls (and
// one case with a waiting thread beside a polling one).
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <map>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "ufab/rdma.hpp"

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
  void SetUp() override { connect({}, {}); }

  void connect(std::map<std::string, std::string> pa, std::map<std::string, std::string> pb,
               QpAttr tuning = {}) {
    a_ = Side{};
    b_ = Side{};
    std::string name = "loop" + std::to_string(::getpid());
    pa["stale"] = "reset";
    open(a_, "swnic:" + name + ":0", "10.0.0.1", pa);
    open(b_, "swnic:" + name + ":1", "10.0.0.2", pb);
    ASSERT_TRUE(a_.qp->connect(b_.qp->local(), tuning));
    ASSERT_TRUE(b_.qp->connect(a_.qp->local(), tuning));
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

TEST_F(Loopback, PostListGoesInOrderAndStopsAtTheFirstBadRequest) {
  for (uint32_t i = 0; i < 3000; ++i) a_.buf[i] = static_cast<uint8_t>(i * 5 + 1);
  Sge sges[3] = {a_.mr->sge(0, 1000), a_.mr->sge(1000, 1000), a_.mr->sge(2000, 1000)};
  std::vector<SendWr> wrs;
  for (uint64_t i = 0; i < 3; ++i) {
    wrs.push_back({.wr_id = 10 + i, .opcode = WrOpcode::kRdmaWrite, .flags = kSendSignaled, .sgl = {&sges[i], 1},
                   .remote_addr = reinterpret_cast<uintptr_t>(b_.buf.data()) + 1000 * i, .rkey = b_.mr->rkey()});
  }
  ASSERT_TRUE(a_.qp->post_send(std::span<const SendWr>(wrs)));
  for (uint64_t i = 0; i < 3; ++i) {
    WorkCompletion wc = next(a_);
    EXPECT_EQ(wc.status, WcStatus::kSuccess) << wc.error;
    EXPECT_EQ(wc.wr_id, 10 + i);  // in the order posted
  }
  EXPECT_EQ(0, std::memcmp(a_.buf.data(), b_.buf.data(), 3000));

  // The second has 17 SGEs (the QP allows 4): the first stays posted and
  // completes, the third is not posted.
  std::vector<Sge> many(17, sges[0]);
  wrs[1].sgl = {many.data(), many.size()};
  auto posted = a_.qp->post_send(std::span<const SendWr>(wrs));
  ASSERT_FALSE(posted);
  EXPECT_EQ(posted.error().code(), EINVAL);
  EXPECT_NE(posted.error().message().find("work request 1 of 3"), std::string::npos) << posted.error().message();
  EXPECT_EQ(next(a_).wr_id, 10u);
  WorkCompletion none[1];
  for (int i = 0; i < 100; ++i) {
    a_.dev->progress();
    b_.dev->progress();
  }
  auto n = a_.cq->poll(none);
  ASSERT_TRUE(n);
  EXPECT_EQ(*n, 0u);
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

// UD: datagrams with the 40-byte GRH area, Q_Key checked, one MTU at most.
TEST_F(Loopback, UdDatagramsCarryGrhAndAreFilteredByQkey) {
  auto ua = a_.pd->create_qp({.type = QpType::kUd, .send_cq = a_.cq.get(), .recv_cq = a_.cq.get()});
  auto ub = b_.pd->create_qp({.type = QpType::kUd, .send_cq = b_.cq.get(), .recv_cq = b_.cq.get()});
  ASSERT_TRUE(ua && ub);
  ASSERT_TRUE((*ua)->connect({}, QpAttr{.qkey = 0x1111}));
  ASSERT_TRUE((*ub)->connect({}, QpAttr{.qkey = 0x2222}));
  Sge r = b_.mr->sge(0, 40 + 1024);
  ASSERT_TRUE((*ub)->post_recv({.wr_id = 77, .sgl = {&r, 1}}));
  for (uint32_t i = 0; i < 1024; ++i) a_.buf[i] = static_cast<uint8_t>(i ^ 0x5a);
  Sge s = a_.mr->sge(0, 1024);
  auto ah = a_.pd->create_ah({.dest_ip = b_.dev->ip()});
  ASSERT_TRUE(ah) << ah.error().message();
  EXPECT_FALSE(a_.pd->create_ah({.dest_ip = a_.dev->ip()}));  // ourselves
  EXPECT_FALSE(a_.pd->create_ah({.dest_ip = 0xE0000001}));    // multicast
  UdDestination to = ah->to((*ub)->qp_num(), 0x9999);
  // Wrong Q_Key: dropped at the receiver, the receive stays posted.
  ASSERT_TRUE((*ua)->post_send({.wr_id = 1, .opcode = WrOpcode::kSend, .flags = kSendSignaled, .sgl = {&s, 1}, .ud = to}));
  EXPECT_EQ(next(a_).status, WcStatus::kSuccess);
  for (int i = 0; i < 20; ++i) a_.dev->progress(), b_.dev->progress();
  WorkCompletion none[1];
  EXPECT_EQ(*b_.cq->poll(none), 0u);
  EXPECT_GT(b_.dev->stats().rx_dropped, 0u);

  to.qkey = 0x2222;
  ASSERT_TRUE((*ua)->post_send({.wr_id = 2, .opcode = WrOpcode::kSendWithImm, .flags = kSendSignaled,
                                .sgl = {&s, 1}, .imm_data = 0xabcdef01, .ud = to}));
  EXPECT_EQ(next(a_).status, WcStatus::kSuccess);
  WorkCompletion wc = next(b_);
  ASSERT_EQ(wc.status, WcStatus::kSuccess) << wc.error;
  EXPECT_EQ(wc.wr_id, 77u);
  EXPECT_EQ(wc.byte_len, 40u + 1024u);
  EXPECT_EQ(wc.src_qp, (*ua)->qp_num());
  EXPECT_EQ(wc.imm_data, 0xabcdef01u);
  EXPECT_TRUE(wc.wc_flags & kWcGrh);
  EXPECT_TRUE(wc.wc_flags & kWcWithImm);
  EXPECT_EQ(b_.buf[20] >> 4, 4);  // the IPv4 header sits in the GRH area's last 20 bytes
  uint32_t src;
  std::memcpy(&src, b_.buf.data() + 32, 4);
  EXPECT_EQ(__builtin_bswap32(src), a_.dev->ip());
  EXPECT_EQ(0, std::memcmp(b_.buf.data() + 40, a_.buf.data(), 1024));

  // More than one MTU cannot be a datagram: refused at post time.
  Sge big = a_.mr->sge(0, 1025);
  auto posted = (*ua)->post_send({.wr_id = 3, .opcode = WrOpcode::kSend, .sgl = {&big, 1}, .ud = to});
  ASSERT_FALSE(posted);
  EXPECT_EQ(posted.error().code(), EINVAL);
  // RC opcodes are refused on UD.
  posted = (*ua)->post_send({.wr_id = 4, .opcode = WrOpcode::kRdmaWrite, .sgl = {&s, 1}, .ud = to});
  ASSERT_FALSE(posted);
  EXPECT_NE(posted.error().message().find("needs an RC QP"), std::string::npos);
}

// QP 1, the GSI: one per device, UD, takes datagrams to QP 1 with the
// GSI Q_Key 0x80010000 (what the connection manager sends).
TEST_F(Loopback, GsiIsQpOneOncePerDeviceAndTakesManagementDatagrams) {
  auto ga = a_.pd->create_qp({.type = QpType::kGsi, .send_cq = a_.cq.get(), .recv_cq = a_.cq.get()});
  auto gb = b_.pd->create_qp({.type = QpType::kGsi, .send_cq = b_.cq.get(), .recv_cq = b_.cq.get()});
  ASSERT_TRUE(ga && gb) << (ga ? gb.error().message() : ga.error().message());
  EXPECT_EQ((*ga)->qp_num(), 1u);
  EXPECT_EQ((*gb)->qp_num(), 1u);
  auto again = a_.pd->create_qp({.type = QpType::kGsi, .send_cq = a_.cq.get(), .recv_cq = a_.cq.get()});
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code(), EBUSY);
  EXPECT_NE(again.error().message().find("QP 1"), std::string::npos) << again.error().message();
  constexpr uint32_t kGsiQKey = 0x80010000;
  ASSERT_TRUE((*ga)->connect({}, QpAttr{.qkey = kGsiQKey}));
  ASSERT_TRUE((*gb)->connect({}, QpAttr{.qkey = kGsiQKey}));
  Sge r = b_.mr->sge(0, 40 + 256);
  ASSERT_TRUE((*gb)->post_recv({.wr_id = 5, .sgl = {&r, 1}}));
  for (uint32_t i = 0; i < 256; ++i) a_.buf[i] = static_cast<uint8_t>(i * 7);
  Sge s = a_.mr->sge(0, 256);
  auto ah = a_.pd->create_ah({.dest_ip = b_.dev->ip()});
  ASSERT_TRUE(ah);
  ASSERT_TRUE((*ga)->post_send(
      {.wr_id = 6, .opcode = WrOpcode::kSend, .flags = kSendSignaled, .sgl = {&s, 1}, .ud = ah->to(1, kGsiQKey)}));
  EXPECT_EQ(next(a_).status, WcStatus::kSuccess);
  WorkCompletion wc = next(b_);
  ASSERT_EQ(wc.status, WcStatus::kSuccess) << wc.error;
  EXPECT_EQ(wc.qp_num, 1u);
  EXPECT_EQ(wc.src_qp, 1u);
  EXPECT_EQ(wc.byte_len, 40u + 256u);
  EXPECT_EQ(0, std::memcmp(b_.buf.data() + 40, a_.buf.data(), 256));
  // Once destroyed, QP 1 can be created again.
  ga->reset();
  EXPECT_TRUE(a_.pd->create_qp({.type = QpType::kGsi, .send_cq = a_.cq.get(), .recv_cq = a_.cq.get()}));
}

// The state machine: transitions and required attributes as verbs has them.
TEST_F(Loopback, ModifyChecksTransitionsAndAttributes) {
  auto qp = a_.pd->create_qp({.type = QpType::kRc, .send_cq = a_.cq.get(), .recv_cq = a_.cq.get()});
  ASSERT_TRUE(qp);
  QpAttr attr;
  attr.state = QpState::kRts;
  auto s = (*qp)->modify(attr, kAttrState);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message().find("RESET -> RTS is not a valid transition"), std::string::npos) << s.error().message();
  attr.state = QpState::kInit;
  s = (*qp)->modify(attr, kAttrState | kAttrPort);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message().find("missing access_flags, pkey_index"), std::string::npos) << s.error().message();
  ASSERT_TRUE((*qp)->modify(attr, kAttrState | kAttrPort | kAttrPkeyIndex | kAttrAccessFlags));
  EXPECT_EQ((*qp)->state(), QpState::kInit);
  Sge sge = a_.mr->sge(0, 8);
  auto posted = (*qp)->post_send({.opcode = WrOpcode::kSend, .sgl = {&sge, 1}});
  ASSERT_FALSE(posted);
  EXPECT_NE(posted.error().message().find("sends need RTS"), std::string::npos);
  attr.state = QpState::kRtr;
  attr.path_mtu = 4096;
  attr.av.dest_ip = b_.dev->ip();
  attr.dest_qpn = 0x100;
  s = (*qp)->modify(attr, kAttrState | kAttrAv | kAttrPathMtu | kAttrDestQpn | kAttrRqPsn | kAttrMaxDestRdAtomic |
                              kAttrMinRnrTimer);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message().find("exceeds the port's active MTU 1024"), std::string::npos) << s.error().message();
  EXPECT_EQ((*qp)->state(), QpState::kInit);  // nothing changed
  attr.state = QpState::kError;
  ASSERT_TRUE((*qp)->modify(attr, kAttrState));
  EXPECT_EQ((*qp)->state(), QpState::kError);
  attr.state = QpState::kReset;
  ASSERT_TRUE((*qp)->modify(attr, kAttrState));
  EXPECT_EQ((*qp)->state(), QpState::kReset);
}

// 5% loss, duplication and reordering each way: every message arrives once,
// in order, intact. (The two-process fault tests run far more messages.)
TEST_F(Loopback, LossyLinkDeliversEveryMessageOnceInOrder) {
  std::map<std::string, std::string> faults{{"loss", "0.05"}, {"dup", "0.02"}, {"reorder", "0.02"}};
  auto fa = faults, fb = faults;
  fa["seed"] = "1";
  fb["seed"] = "2";
  connect(fa, fb, QpAttr{.timeout = 8});
  constexpr uint32_t kMessages = 20000, kSlots = 32, kSize = 1500;
  uint32_t posted = 0, sent = 0, received = 0, send_done = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  auto post_recv = [&] {
    Sge r = b_.mr->sge(uint64_t{posted % kSlots} * 2048, 2048);
    ASSERT_TRUE(b_.qp->post_recv({.wr_id = posted, .sgl = {&r, 1}}));
    ++posted;
  };
  for (uint32_t i = 0; i < kSlots; ++i) post_recv();
  WorkCompletion wc[16];
  while (received < kMessages && std::chrono::steady_clock::now() < deadline) {
    while (sent < kMessages && sent - send_done < kSlots) {
      uint8_t* p = a_.buf.data() + uint64_t{sent % kSlots} * 2048;
      for (uint32_t i = 0; i < kSize; ++i) p[i] = static_cast<uint8_t>(sent * 31 + i);
      Sge s = a_.mr->sge(uint64_t{sent % kSlots} * 2048, kSize);
      ASSERT_TRUE(a_.qp->post_send({.wr_id = sent, .opcode = WrOpcode::kSend, .flags = kSendSignaled, .sgl = {&s, 1}}));
      ++sent;
    }
    a_.dev->progress();
    b_.dev->progress();
    auto n = b_.cq->poll(wc);
    ASSERT_TRUE(n) << n.error().message();
    for (size_t i = 0; i < *n; ++i) {
      ASSERT_EQ(wc[i].status, WcStatus::kSuccess) << wc[i].error;
      ASSERT_EQ(wc[i].wr_id, received);
      ASSERT_EQ(wc[i].byte_len, kSize);
      const uint8_t* p = b_.buf.data() + uint64_t{received % kSlots} * 2048;
      for (uint32_t j = 0; j < kSize; ++j) ASSERT_EQ(p[j], static_cast<uint8_t>(received * 31 + j)) << received;
      ++received;
      post_recv();
    }
    n = a_.cq->poll(wc);
    ASSERT_TRUE(n) << n.error().message();
    for (size_t i = 0; i < *n; ++i) {
      ASSERT_EQ(wc[i].status, WcStatus::kSuccess) << wc[i].error;
      ASSERT_EQ(wc[i].wr_id, send_done++);
    }
  }
  EXPECT_EQ(received, kMessages);
  DeviceStats st = a_.dev->stats();
  EXPECT_GT(st.retransmits, 0u);
  std::printf("retransmits %llu timeouts %llu naks %llu\n", (unsigned long long)st.retransmits,
              (unsigned long long)st.timeouts, (unsigned long long)st.naks_received);
}

// A thread waiting on one CQ while another thread polls a second CQ of
// the same device: the waiter sleeps passively (no spin, no interrupt)
// while the lane is driven by the poller, and must still get its
// completion at once, and again after the poller stops (then it drives
// progress itself).
TEST_F(Loopback, WaiterBesideAPollerGetsItsCompletionsBeforeAndAfterThePollerStops) {
  auto cq2 = b_.dev->create_cq(16);
  ASSERT_TRUE(cq2);
  auto bqp2 = b_.pd->create_qp({.type = QpType::kRc, .send_cq = cq2->get(), .recv_cq = cq2->get()});
  ASSERT_TRUE(bqp2) << bqp2.error().message();
  auto aqp2 = a_.pd->create_qp({.type = QpType::kRc, .send_cq = a_.cq.get(), .recv_cq = a_.cq.get()});
  ASSERT_TRUE(aqp2) << aqp2.error().message();
  ASSERT_TRUE((*aqp2)->connect((*bqp2)->local(), {}));
  ASSERT_TRUE((*bqp2)->connect((*aqp2)->local(), {}));

  std::atomic<bool> polling{true};
  std::thread poller([&] {
    WorkCompletion wc[4];
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (polling.load() && std::chrono::steady_clock::now() < end) (void)b_.cq->poll(wc);
  });
  std::atomic<int> got{0};
  std::atomic<uint64_t> wr_ids[2] = {0, 0};
  std::thread waiter([&] {
    WorkCompletion wc[1];
    for (int k = 0; k < 2; ++k) {
      auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (std::chrono::steady_clock::now() < end) {
        auto n = (*cq2)->wait(wc, std::chrono::milliseconds(100));
        if (n && *n == 1) {
          wr_ids[k] = wc[0].status == WcStatus::kSuccess ? wc[0].wr_id : ~uint64_t{0};
          got++;
          break;
        }
      }
    }
  });
  auto deliver = [&](int k) {
    Sge rsge = b_.mr->sge(0, 64);
    EXPECT_TRUE((*bqp2)->post_recv({.wr_id = 100u + k, .sgl = {&rsge, 1}}));
    Sge ssge = a_.mr->sge(0, 8);
    EXPECT_TRUE((*aqp2)->post_send({.wr_id = 1, .opcode = WrOpcode::kSend, .flags = kSendSignaled, .sgl = {&ssge, 1}}));
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    while (got.load() <= k && std::chrono::steady_clock::now() < end) a_.dev->progress();
    WorkCompletion wc[4];
    (void)a_.cq->poll(wc);  // the send's completion
    return got.load() > k;
  };
  // The waiter has slept beside the poller at least once: passive now.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  bool first = deliver(0);
  polling = false;
  poller.join();
  bool second = deliver(1);
  waiter.join();
  EXPECT_TRUE(first) << "the waiter missed a completion while another thread polled";
  EXPECT_TRUE(second) << "the waiter missed a completion after the other thread stopped polling";
  EXPECT_EQ(wr_ids[0].load(), 100u);
  EXPECT_EQ(wr_ids[1].load(), 101u);
}

}  // namespace
}  // namespace ufab::rdma
