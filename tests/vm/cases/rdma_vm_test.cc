// ufab's RDMA API (api/rdma.h) over two real NIC models inside the VM test
// bed (tests/vm/suites/rdma.sh): an e1000e and a virtio-net on one QEMU hub,
// both bound to vfio-pci, opened as two RDMA devices in this one process,
// each with a progress thread. One RC QP on each connects them; every
// operation runs both ways with sizes up to 1 MiB (1024 packets at the
// 1024-byte path MTU) and every byte is checked.
//
// Environment:
//   UFAB_RDMA_PORTS     "SPEC,SPEC" (default 0000:00:02.0,0000:00:03.0). Any
//                       ports work, so the same program runs on the host
//                       over the software NIC (one line):
//                         UFAB_RDMA_PORTS=swnic:rdmavm:0,swnic:rdmavm:1
//                         bazel-bin/tests/vm/cases/rdma_vm_test
//   UFAB_RDMA_PARAMS    "K=V,K=V" driver parameters for both ports, e.g.
//                       loss=0.01,reorder=0.01,seed=7 on swnic
//   UFAB_RDMA_RING      DeviceOptions::ring_size (default: the API's, 512)
//   UFAB_RDMA_MAX_SIZE  largest transfer in bytes (default 1048576)
//   UFAB_RDMA_TIMEOUT   seconds to wait for one batch of completions (default 60)
//   UFAB_RDMA_PATH_MTU  path MTU the QPs ask for and the Connected test
//                       expects, with the devices' active MTU (default 1024;
//                       4096 with UFAB_RDMA_PARAMS=mtu=9000 on two e1000e,
//                       tests/vm/suites/drivers.sh)
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ufab/rdma.hpp"
#include "tests/vm/cases/vm_ports.h"

namespace ufab {
namespace {

using Clock = std::chrono::steady_clock;
using rdma::WcOpcode;
using rdma::WcStatus;
using rdma::WrOpcode;

// A failed completion ends the test: the QP is in ERROR and the next test
// reconnects it.
#define ASSERT_WC_OK(wc, side)               \
  ASSERT_EQ((wc).status, WcStatus::kSuccess) \
      << (side).spec << ": wr_id " << (wc).wr_id << ": " << rdma::wc_status_name((wc).status) << ": " << (wc).error

constexpr uint8_t kPoison = 0xA5;  // fills destinations, so an overrun or a missed byte shows

// Each side's memory: one region with a source area (what it sends, writes,
// or serves to READs), a destination area (where the peer's writes and
// sends land, and where its READs bring data), and 8-byte atomic slots.
struct Layout {
  uint64_t max = 0;
  uint64_t src() const { return 0; }
  uint64_t dst() const { return max + 64; }  // +64: room to detect an overrun
  uint64_t atomics() const { return 2 * max + 128; }
  uint64_t total() const { return atomics() + 4096; }
};

uint8_t pattern(uint32_t seed, uint64_t i) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t{seed} << 32 | seed);
  return static_cast<uint8_t>(x >> 56 ^ x >> 29);
}

struct Side {
  std::string spec;
  std::unique_ptr<rdma::Device> dev;
  std::optional<rdma::ProtectionDomain> pd;
  std::unique_ptr<uint8_t[]> mem;
  std::optional<rdma::MemoryRegion> mr;
  std::unique_ptr<rdma::CompletionQueue> cq;
  std::unique_ptr<rdma::QueuePair> qp;

  uint8_t* at(uint64_t offset) const { return mem.get() + offset; }
  uint64_t addr(uint64_t offset) const { return reinterpret_cast<uint64_t>(mem.get()) + offset; }

  void reset() {  // in the order verbs requires: QP, CQ, MR, PD, device
    qp.reset();
    cq.reset();
    mr.reset();
    pd.reset();
    dev.reset();
    mem.reset();
  }
};

// Opened once for all tests: opening a NIC, ARP and connecting are not what
// each test checks, and under TCG they cost seconds.
class RdmaVm : public ::testing::Test {
 protected:
  static Layout layout_;
  static Side sides_[2];
  static std::string setup_error_;
  static std::chrono::seconds timeout_;
  static uint32_t path_mtu_;

  static std::string open_side(Side& s, const std::string& spec, const std::string& ip, bool first) {
    s.spec = spec;
    rdma::DeviceOptions options{.ip = ip, .params = {}, .progress_thread = true};
    options.ring_size = static_cast<uint32_t>(vmtest::env_count("UFAB_RDMA_RING", options.ring_size));
    // The software NIC used on the host: clear a segment a killed run left.
    if (first && spec.starts_with("swnic:")) options.params["stale"] = "reset";
    for (const auto& kv : vmtest::env_list("UFAB_RDMA_PARAMS")) {
      size_t eq = kv.find('=');
      if (eq == std::string::npos) return "UFAB_RDMA_PARAMS: " + kv + " is not K=V";
      options.params[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    auto dev = rdma::Device::open(spec, options);
    if (!dev) return "opening " + spec + ": " + dev.error().message();
    s.dev = std::move(*dev);
    auto pd = s.dev->alloc_pd();
    if (!pd) return "alloc_pd on " + spec + ": " + pd.error().message();
    s.pd.emplace(std::move(*pd));
    s.mem = std::make_unique<uint8_t[]>(layout_.total());
    auto mr = s.pd->register_mr(s.mem.get(), layout_.total(),
                                rdma::kLocalWrite | rdma::kRemoteWrite | rdma::kRemoteRead | rdma::kRemoteAtomic);
    if (!mr) return "register_mr on " + spec + ": " + mr.error().message();
    s.mr.emplace(std::move(*mr));
    auto cq = s.dev->create_cq(1024);
    if (!cq) return "create_cq on " + spec + ": " + cq.error().message();
    s.cq = std::move(*cq);
    rdma::ProtectionDomain::QpInit init{
        .type = rdma::QpType::kRc, .send_cq = s.cq.get(), .recv_cq = s.cq.get(), .caps = {}, .sq_sig_all = false};
    auto qp = s.pd->create_qp(init);
    if (!qp) return "create_qp on " + spec + ": " + qp.error().message();
    s.qp = std::move(*qp);
    return "";
  }

  static std::string connect_both() {
    rdma::QpAttr tuning;  // QpAttr's defaults, plus what the peer may do through the QP
    tuning.path_mtu = path_mtu_;
    tuning.access_flags = rdma::kRemoteWrite | rdma::kRemoteRead | rdma::kRemoteAtomic;
    for (int i = 0; i < 2; ++i) {
      rdma::ConnectionData peer = sides_[1 - i].qp->local();
      if (auto s = sides_[i].qp->connect(peer, tuning); !s) {
        return "connect " + sides_[i].spec + " -> " + sides_[1 - i].spec + ": " + s.error().message();
      }
    }
    return "";
  }

  static void SetUpTestSuite() {
    auto ports = vmtest::env_list("UFAB_RDMA_PORTS", "0000:00:02.0,0000:00:03.0");
    if (ports.size() != 2) {
      setup_error_ = "UFAB_RDMA_PORTS must name two ports";
      return;
    }
    layout_.max = vmtest::env_count("UFAB_RDMA_MAX_SIZE", 1u << 20);
    timeout_ = std::chrono::seconds(vmtest::env_count("UFAB_RDMA_TIMEOUT", 60));
    path_mtu_ = static_cast<uint32_t>(vmtest::env_count("UFAB_RDMA_PATH_MTU", 1024));
    const char* ips[2] = {"10.0.0.1", "10.0.0.2"};
    for (int i = 0; i < 2; ++i) {
      setup_error_ = open_side(sides_[i], ports[i], ips[i], i == 0);
      if (!setup_error_.empty()) return;
    }
    setup_error_ = connect_both();
    if (!setup_error_.empty()) return;
    std::printf("  %s (%s, QP 0x%x) <-> %s (%s, QP 0x%x), active MTU %u / %u\n", sides_[0].dev->name().c_str(), ips[0],
                sides_[0].qp->qp_num(), sides_[1].dev->name().c_str(), ips[1], sides_[1].qp->qp_num(),
                sides_[0].dev->active_mtu(), sides_[1].dev->active_mtu());
  }

  static void TearDownTestSuite() {
    for (auto& s : sides_) {
      if (s.dev) {
        auto st = s.dev->stats();
        std::printf(
            "  %s: rx %llu frames (%llu RoCE, %llu ARP, %llu other), tx %llu, parse errors %llu, unknown QP %llu, "
            "dropped %llu, retransmits %llu, timeouts %llu, NAKs %llu/%llu, RNR NAKs %llu/%llu, duplicates %llu, "
            "tx stalls %llu, gathered %llu\n",
            s.spec.c_str(), (unsigned long long)st.rx_frames, (unsigned long long)st.rx_roce,
            (unsigned long long)st.rx_arp, (unsigned long long)st.rx_other, (unsigned long long)st.tx_frames,
            (unsigned long long)st.rx_parse_errors, (unsigned long long)st.rx_unknown_qp,
            (unsigned long long)st.rx_dropped, (unsigned long long)st.retransmits, (unsigned long long)st.timeouts,
            (unsigned long long)st.naks_sent, (unsigned long long)st.naks_received,
            (unsigned long long)st.rnr_naks_sent, (unsigned long long)st.rnr_naks_received,
            (unsigned long long)st.duplicates, (unsigned long long)st.tx_stalls,
            (unsigned long long)st.tx_gather_frames);
      }
      s.reset();
    }
  }

  // Each test starts from two connected QPs and empty CQs, even after an
  // earlier test failed and left a QP in ERROR with flushed completions.
  void SetUp() override {
    ASSERT_TRUE(setup_error_.empty()) << setup_error_;
    for (auto& s : sides_) {
      rdma::WorkCompletion stale[64];
      for (int i = 0; i < 1000; ++i) {
        auto n = s.cq->poll(stale);
        if (n && *n == 0) break;
      }
    }
    if (sides_[0].qp->state() != rdma::QpState::kRts || sides_[1].qp->state() != rdma::QpState::kRts) {
      std::printf("  (reconnecting the QPs after an earlier failure)\n");
      for (auto& s : sides_) ASSERT_TRUE(s.qp->modify({}, rdma::kAttrState));  // to RESET
      // Frames of the old connection still on the wire meet a QP in RESET.
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      std::string err = connect_both();
      ASSERT_TRUE(err.empty()) << err;
    }
  }

  void TearDown() override {
    for (auto& s : sides_) {
      if (s.qp) {
        EXPECT_EQ(s.qp->state(), rdma::QpState::kRts) << s.spec << "'s QP left RTS";
      }
    }
  }

  // Waits for `n` completions on `side`'s CQ; fails the test on a timeout.
  static std::vector<rdma::WorkCompletion> wait_for(Side& side, size_t n) {
    std::vector<rdma::WorkCompletion> got;
    auto deadline = Clock::now() + timeout_;
    std::vector<rdma::WorkCompletion> batch(std::max<size_t>(n, 1));
    while (got.size() < n) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) break;
      auto r = side.cq->wait(std::span(batch.data(), n - got.size()), left);
      if (!r) {
        ADD_FAILURE() << side.spec << ": CQ: " << r.error().message();
        break;
      }
      for (size_t i = 0; i < *r; ++i) got.push_back(std::move(batch[i]));
    }
    EXPECT_EQ(got.size(), n) << side.spec << ": completions within " << timeout_.count() << " s";
    return got;
  }

  // Fills `from`'s source area with a fresh pattern and poisons `to`'s
  // destination area (one extra byte included).
  static void prepare(Side& from, Side& to, uint64_t size, uint32_t seed) {
    for (uint64_t i = 0; i < size; ++i) *from.at(layout_.src() + i) = pattern(seed, i);
    std::memset(to.at(layout_.dst()), kPoison, size + 1);
  }

  // `size` bytes at `side`'s destination area carry `seed`'s pattern and the
  // byte after them is untouched.
  static void expect_data(const Side& side, uint64_t size, uint32_t seed, const std::string& what) {
    const uint8_t* d = side.at(layout_.dst());
    uint64_t bad = 0, first = size;
    for (uint64_t i = 0; i < size; ++i) {
      if (d[i] != pattern(seed, i)) {
        if (first == size) first = i;
        ++bad;
      }
    }
    EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << size << " bytes differ, the first at offset " << first;
    EXPECT_EQ(d[size], kPoison) << what << ": wrote past the end";
  }

  static rdma::SendWr wr(uint64_t id, WrOpcode op, const rdma::Sge* sge, uint32_t flags = rdma::kSendSignaled) {
    rdma::SendWr w;
    w.wr_id = id;
    w.opcode = op;
    w.flags = flags;
    w.sgl = sge ? std::span<const rdma::Sge>(sge, 1) : std::span<const rdma::Sge>();
    return w;
  }

  static std::vector<uint64_t> sizes() {
    std::vector<uint64_t> out;
    for (uint64_t s : {1ull, 64ull, 1023ull, 1024ull, 1025ull, 4096ull, 65536ull, 1ull << 20}) {
      if (s <= layout_.max) out.push_back(s);
    }
    return out;
  }

  static std::string label(const Side& from, const Side& to, const char* op, uint64_t size) {
    return std::string(op) + " " + std::to_string(size) + " B " + from.spec + " -> " + to.spec;
  }
};

Layout RdmaVm::layout_;
Side RdmaVm::sides_[2];
std::string RdmaVm::setup_error_;
std::chrono::seconds RdmaVm::timeout_{60};
uint32_t RdmaVm::path_mtu_ = 1024;

TEST_F(RdmaVm, Connected) {
  for (auto& s : sides_) {
    EXPECT_EQ(s.qp->state(), rdma::QpState::kRts) << s.spec;
    EXPECT_EQ(s.qp->attr().path_mtu, path_mtu_) << s.spec;
    EXPECT_EQ(s.dev->active_mtu(), path_mtu_) << s.spec;
  }
  EXPECT_EQ(sides_[0].qp->attr().dest_qpn, sides_[1].qp->qp_num());
  EXPECT_EQ(sides_[1].qp->attr().dest_qpn, sides_[0].qp->qp_num());
}

// RDMA WRITE: the requester's completion means the responder acknowledged,
// so the bytes are in its memory.
TEST_F(RdmaVm, WriteBothWays) {
  uint32_t seed = 100;
  for (int dir = 0; dir < 2; ++dir) {
    Side &from = sides_[dir], &to = sides_[1 - dir];
    for (uint64_t size : sizes()) {
      std::string what = label(from, to, "RDMA_WRITE", size);
      SCOPED_TRACE(what);
      prepare(from, to, size, ++seed);
      rdma::Sge sge = from.mr->sge(layout_.src(), static_cast<uint32_t>(size));
      auto w = wr(seed, WrOpcode::kRdmaWrite, &sge);
      w.remote_addr = to.addr(layout_.dst());
      w.rkey = to.mr->rkey();
      const auto before = from.dev->stats();
      auto posted = from.qp->post_send(w);
      ASSERT_TRUE(posted) << posted.error().message();
      auto wcs = wait_for(from, 1);
      ASSERT_EQ(wcs.size(), 1u);
      ASSERT_WC_OK(wcs[0], from);
      EXPECT_EQ(wcs[0].wr_id, seed);
      EXPECT_EQ(wcs[0].opcode, WcOpcode::kRdmaWrite);
      expect_data(to, size, seed, what);
      if (size == 1ull << 20) {
        // One packet per path MTU of payload (256 at 4096, 1024 at 1024);
        // without retransmissions (a lossy swnic run has them) no more
        // than that and a few ACKs of the other direction.
        const auto after = from.dev->stats();
        const uint64_t packets = size / path_mtu_;
        const uint64_t sent = after.tx_frames - before.tx_frames;
        std::printf("  %s: %llu frames at path MTU %u\n", what.c_str(), static_cast<unsigned long long>(sent),
                    path_mtu_);
        EXPECT_GE(sent, packets);
        if (after.retransmits == before.retransmits) {
          EXPECT_LE(sent, packets + 16);
        }
      }
    }
    // Full packets went out as gathered frames, the NIC reading the payload
    // from the memory region through the IOMMU (zero copy), unless the
    // ports were opened with zerocopy=off.
    const char* params = std::getenv("UFAB_RDMA_PARAMS");
    if (layout_.max >= 1024 && (params == nullptr || std::string(params).find("zerocopy=off") == std::string::npos)) {
      EXPECT_GT(from.dev->stats().tx_gather_frames, 0u) << from.spec << " gathered no frame";
    }
  }
}

// RDMA READ: the data comes back into the requester's destination area.
TEST_F(RdmaVm, ReadBothWays) {
  uint32_t seed = 200;
  for (int dir = 0; dir < 2; ++dir) {
    Side &reader = sides_[dir], &target = sides_[1 - dir];
    for (uint64_t size : sizes()) {
      std::string what = label(reader, target, "RDMA_READ", size);
      SCOPED_TRACE(what);
      prepare(target, reader, size, ++seed);
      rdma::Sge sge = reader.mr->sge(layout_.dst(), static_cast<uint32_t>(size));
      auto w = wr(seed, WrOpcode::kRdmaRead, &sge);
      w.remote_addr = target.addr(layout_.src());
      w.rkey = target.mr->rkey();
      auto posted = reader.qp->post_send(w);
      ASSERT_TRUE(posted) << posted.error().message();
      auto wcs = wait_for(reader, 1);
      ASSERT_EQ(wcs.size(), 1u);
      ASSERT_WC_OK(wcs[0], reader);
      EXPECT_EQ(wcs[0].opcode, WcOpcode::kRdmaRead);
      EXPECT_EQ(wcs[0].byte_len, size);
      expect_data(reader, size, seed, what);
    }
  }
}

// SEND and SEND_WITH_IMM into a receive the responder posted first.
TEST_F(RdmaVm, SendRecvWithAndWithoutImmBothWays) {
  uint32_t seed = 300;
  for (bool imm : {false, true}) {
    for (int dir = 0; dir < 2; ++dir) {
      Side &from = sides_[dir], &to = sides_[1 - dir];
      for (uint64_t size : sizes()) {
        std::string what = label(from, to, imm ? "SEND_WITH_IMM" : "SEND", size);
        SCOPED_TRACE(what);
        prepare(from, to, size, ++seed);
        rdma::Sge rsge = to.mr->sge(layout_.dst(), static_cast<uint32_t>(layout_.max));
        auto recv_posted = to.qp->post_recv({.wr_id = 0x10000u + seed, .sgl = {&rsge, 1}});
        ASSERT_TRUE(recv_posted) << recv_posted.error().message();
        rdma::Sge sge = from.mr->sge(layout_.src(), static_cast<uint32_t>(size));
        auto w = wr(seed, imm ? WrOpcode::kSendWithImm : WrOpcode::kSend, &sge);
        w.imm_data = 0xC0DE0000u + seed;
        auto posted = from.qp->post_send(w);
        ASSERT_TRUE(posted) << posted.error().message();
        auto sent = wait_for(from, 1);
        ASSERT_EQ(sent.size(), 1u);
        ASSERT_WC_OK(sent[0], from);
        EXPECT_EQ(sent[0].opcode, WcOpcode::kSend);
        auto got = wait_for(to, 1);
        ASSERT_EQ(got.size(), 1u);
        ASSERT_WC_OK(got[0], to);
        EXPECT_EQ(got[0].wr_id, 0x10000u + seed);
        EXPECT_EQ(got[0].opcode, WcOpcode::kRecv);
        EXPECT_EQ(got[0].byte_len, size);
        EXPECT_EQ(got[0].qp_num, to.qp->qp_num());
        if (imm) {
          EXPECT_TRUE(got[0].wc_flags & rdma::kWcWithImm);
          EXPECT_EQ(got[0].imm_data, 0xC0DE0000u + seed);
        } else {
          EXPECT_FALSE(got[0].wc_flags & rdma::kWcWithImm);
        }
        expect_data(to, size, seed, what);
      }
    }
  }
}

// RDMA_WRITE_WITH_IMM: the data lands where the requester said, and the
// immediate consumes a receive at the responder.
TEST_F(RdmaVm, WriteWithImmBothWays) {
  uint32_t seed = 400;
  for (int dir = 0; dir < 2; ++dir) {
    Side &from = sides_[dir], &to = sides_[1 - dir];
    for (uint64_t size : {uint64_t{64}, uint64_t{4096}, layout_.max}) {
      std::string what = label(from, to, "RDMA_WRITE_WITH_IMM", size);
      SCOPED_TRACE(what);
      prepare(from, to, size, ++seed);
      auto recv_posted = to.qp->post_recv({.wr_id = 0x20000u + seed, .sgl = {}});
      ASSERT_TRUE(recv_posted) << recv_posted.error().message();
      rdma::Sge sge = from.mr->sge(layout_.src(), static_cast<uint32_t>(size));
      auto w = wr(seed, WrOpcode::kRdmaWriteWithImm, &sge);
      w.remote_addr = to.addr(layout_.dst());
      w.rkey = to.mr->rkey();
      w.imm_data = 0xBEEF0000u + seed;
      auto posted = from.qp->post_send(w);
      ASSERT_TRUE(posted) << posted.error().message();
      auto sent = wait_for(from, 1);
      ASSERT_EQ(sent.size(), 1u);
      ASSERT_WC_OK(sent[0], from);
      EXPECT_EQ(sent[0].opcode, WcOpcode::kRdmaWrite);
      auto got = wait_for(to, 1);
      ASSERT_EQ(got.size(), 1u);
      ASSERT_WC_OK(got[0], to);
      EXPECT_EQ(got[0].opcode, WcOpcode::kRecvRdmaWithImm);
      EXPECT_TRUE(got[0].wc_flags & rdma::kWcWithImm);
      EXPECT_EQ(got[0].imm_data, 0xBEEF0000u + seed);
      EXPECT_EQ(got[0].byte_len, size);  // rxe reports the write's length
      expect_data(to, size, seed, what);
    }
  }
}

// FETCH_AND_ADD and CMP_AND_SWP (a match and a mismatch) both ways.
TEST_F(RdmaVm, AtomicsBothWays) {
  for (int dir = 0; dir < 2; ++dir) {
    Side &from = sides_[dir], &to = sides_[1 - dir];
    SCOPED_TRACE(from.spec + " -> " + to.spec);
    uint64_t* counter = reinterpret_cast<uint64_t*>(to.at(layout_.atomics()));
    uint64_t* result = reinterpret_cast<uint64_t*>(from.at(layout_.atomics() + 8));
    const uint64_t start = 0x0123456789abcdefull + dir;
    *counter = start;
    rdma::Sge sge = from.mr->sge(layout_.atomics() + 8, 8);

    auto run = [&](rdma::SendWr w, WcOpcode expect_op) {
      w.remote_addr = to.addr(layout_.atomics());
      w.rkey = to.mr->rkey();
      *result = 0xdeadbeefdeadbeefull;
      auto posted = from.qp->post_send(w);
      ASSERT_TRUE(posted) << posted.error().message();
      auto wcs = wait_for(from, 1);
      ASSERT_EQ(wcs.size(), 1u);
      ASSERT_WC_OK(wcs[0], from);
      EXPECT_EQ(wcs[0].opcode, expect_op);
      EXPECT_EQ(wcs[0].byte_len, 8u);
    };

    auto add = wr(1, WrOpcode::kAtomicFetchAndAdd, &sge);
    add.compare_add = 0x1111;
    run(add, WcOpcode::kFetchAdd);
    EXPECT_EQ(*result, start) << "FETCH_AND_ADD returns the old value";
    EXPECT_EQ(*counter, start + 0x1111);

    // 64 more in flight at once: each returns the value before it, the sum is exact.
    constexpr int kAdds = 64;
    std::vector<uint64_t> fetched(kAdds);
    for (int i = 0; i < kAdds; ++i) {
      rdma::Sge s = from.mr->sge(layout_.atomics() + 16 + 8 * static_cast<uint64_t>(i), 8);
      auto w = wr(100 + static_cast<uint64_t>(i), WrOpcode::kAtomicFetchAndAdd, &s);
      w.remote_addr = to.addr(layout_.atomics());
      w.rkey = to.mr->rkey();
      w.compare_add = 1;
      auto posted = from.qp->post_send(w);
      ASSERT_TRUE(posted) << posted.error().message();
    }
    auto wcs = wait_for(from, kAdds);
    ASSERT_EQ(wcs.size(), static_cast<size_t>(kAdds));
    for (int i = 0; i < kAdds; ++i) {
      ASSERT_WC_OK(wcs[i], from);
      EXPECT_EQ(wcs[i].wr_id, 100u + i) << "completions come in posting order";
      std::memcpy(&fetched[i], from.at(layout_.atomics() + 16 + 8 * static_cast<uint64_t>(i)), 8);
      EXPECT_EQ(fetched[i], start + 0x1111 + static_cast<uint64_t>(i));
    }
    const uint64_t now = start + 0x1111 + kAdds;
    EXPECT_EQ(*counter, now);

    auto cas = wr(2, WrOpcode::kAtomicCmpAndSwp, &sge);
    cas.compare_add = now + 1;  // does not match: nothing stored
    cas.swap = 42;
    run(cas, WcOpcode::kCompSwap);
    EXPECT_EQ(*result, now);
    EXPECT_EQ(*counter, now);

    cas.wr_id = 3;
    cas.compare_add = now;  // matches: swapped
    run(cas, WcOpcode::kCompSwap);
    EXPECT_EQ(*result, now);
    EXPECT_EQ(*counter, 42u);
  }
}

// Many requests in flight at once, of every kind, then a READ that must see
// the WRITEs before it (RC executes in order).
TEST_F(RdmaVm, PipelinedWritesThenReadBothWays) {
  uint32_t seed = 500;
  constexpr uint64_t kChunk = 64 * 1024;
  for (int dir = 0; dir < 2; ++dir) {
    Side &from = sides_[dir], &to = sides_[1 - dir];
    const uint64_t chunks = std::min<uint64_t>(16, layout_.max / kChunk);
    if (chunks == 0) GTEST_SKIP() << "UFAB_RDMA_MAX_SIZE below 64 KiB";
    const uint64_t size = chunks * kChunk;
    std::string what = label(from, to, "16 pipelined RDMA_WRITEs + RDMA_READ", size);
    SCOPED_TRACE(what);
    prepare(from, to, size, ++seed);
    std::vector<rdma::Sge> sges(chunks);
    for (uint64_t c = 0; c < chunks; ++c) {
      sges[c] = from.mr->sge(layout_.src() + c * kChunk, kChunk);
      // Only the last is signaled: the others complete silently, as
      // applications batch them.
      auto w = wr(c, WrOpcode::kRdmaWrite, &sges[c], c + 1 == chunks ? rdma::kSendSignaled : 0);
      w.remote_addr = to.addr(layout_.dst() + c * kChunk);
      w.rkey = to.mr->rkey();
      auto posted = from.qp->post_send(w);
      ASSERT_TRUE(posted) << posted.error().message();
    }
    // Read the peer's destination back into our destination area.
    std::memset(from.at(layout_.dst()), kPoison, size + 1);
    rdma::Sge rsge = from.mr->sge(layout_.dst(), static_cast<uint32_t>(size));
    auto r = wr(1000, WrOpcode::kRdmaRead, &rsge);
    r.remote_addr = to.addr(layout_.dst());
    r.rkey = to.mr->rkey();
    auto posted = from.qp->post_send(r);
    ASSERT_TRUE(posted) << posted.error().message();
    auto wcs = wait_for(from, 2);
    ASSERT_EQ(wcs.size(), 2u);
    ASSERT_WC_OK(wcs[0], from);
    ASSERT_WC_OK(wcs[1], from);
    EXPECT_EQ(wcs[0].wr_id, chunks - 1);
    EXPECT_EQ(wcs[1].wr_id, 1000u);
    expect_data(to, size, seed, what + " (target)");
    expect_data(from, size, seed, what + " (read back)");
  }
}

// Zero-length operations are legal (IBA C9-88: a zero-length READ/WRITE
// carries any rkey and address) and complete normally.
TEST_F(RdmaVm, ZeroLengthOperations) {
  Side &from = sides_[0], &to = sides_[1];
  auto w = wr(1, WrOpcode::kRdmaWrite, nullptr);
  w.remote_addr = 0;
  w.rkey = 0;
  ASSERT_TRUE(from.qp->post_send(w));
  auto r = wr(2, WrOpcode::kRdmaRead, nullptr);
  ASSERT_TRUE(from.qp->post_send(r));
  rdma::Sge rsge = to.mr->sge(layout_.dst(), 64);
  ASSERT_TRUE(to.qp->post_recv({.wr_id = 3, .sgl = {&rsge, 1}}));
  ASSERT_TRUE(from.qp->post_send(wr(4, WrOpcode::kSend, nullptr)));
  auto wcs = wait_for(from, 3);
  ASSERT_EQ(wcs.size(), 3u);
  for (auto& wc : wcs) {
    ASSERT_WC_OK(wc, from);
  }
  auto got = wait_for(to, 1);
  ASSERT_EQ(got.size(), 1u);
  ASSERT_WC_OK(got[0], to);
  EXPECT_EQ(got[0].byte_len, 0u);
}

}  // namespace
}  // namespace ufab
