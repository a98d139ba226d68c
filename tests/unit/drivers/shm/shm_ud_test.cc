// UD queue pairs on the shm provider (docs/drivers/shm.md, "UD"): datagrams
// between processes both ways with the GRH area soft-RoCE gives, many
// sender processes into one receiver's queue (everything either received
// intact and in order per sender, or counted as dropped), sizes up to the
// 4096-byte limit, what is dropped and counted (bad Q_Key, no receive, a
// full queue), post-time refusals and address handle errors, a producer
// that died or stopped holding a cell (skipped, the queue goes on), a
// receiver asleep in wait_cq woken by a datagram, and a peer process
// killed mid-stream on either side.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>

#include "drivers/shm/ring.h"
#include "tests/unit/drivers/shm/pair.h"

namespace ufab::shm_test {
namespace {

constexpr uint32_t kQkey = 0x11223344;
constexpr uint32_t kGrh = 40;
constexpr uint32_t kSlot = 8192;

// One UD QP with its CQs, in RTS with `qkey`.
struct Ud {
  ufab_rdma_qp* qp = nullptr;
  ufab_rdma_cq* scq = nullptr;
  ufab_rdma_cq* rcq = nullptr;
  uint32_t qpn = 0;
};

inline int ud_up(ufab_rdma_qp* qp, uint32_t qkey) {
  ufab_qp_attr a = {};
  a.state = UFAB_QPS_INIT;
  a.port = 1;
  a.qkey = qkey;
  int rc = P()->modify_qp(qp, &a, UFAB_QP_STATE | UFAB_QP_PKEY_INDEX | UFAB_QP_PORT | UFAB_QP_QKEY);
  if (rc) return rc;
  a.state = UFAB_QPS_RTR;
  if ((rc = P()->modify_qp(qp, &a, UFAB_QP_STATE))) return rc;
  a.state = UFAB_QPS_RTS;
  a.sq_psn = 0;
  return P()->modify_qp(qp, &a, UFAB_QP_STATE | UFAB_QP_SQ_PSN);
}

inline bool make_ud(ufab_rdma_dev* dev, ufab_rdma_pd* pd, Ud& u, uint32_t qkey = kQkey, uint32_t depth = 512,
                    ufab_qp_cap cap = {64, 512, 4, 4, 128}) {
  TREQUIRE_OK(P()->create_cq(dev, depth, &u.scq));
  TREQUIRE_OK(P()->create_cq(dev, depth, &u.rcq));
  ufab_rdma_qp_init init = {UFAB_QPT_UD, 0, u.scq, u.rcq, cap};
  TREQUIRE_OK(P()->create_qp(pd, &init, &u.qp, &u.qpn));
  TREQUIRE_OK(ud_up(u.qp, qkey));
  TREQUIRE(qp_state(u.qp) == UFAB_QPS_RTS);
  return true;
}

inline void drop_ud(Ud& u) {
  if (u.qp) P()->destroy_qp(u.qp);
  if (u.scq) P()->destroy_cq(u.scq);
  if (u.rcq) P()->destroy_cq(u.rcq);
  u = Ud{};
}

inline int post_ud(ufab_rdma_qp* qp, uint64_t wr_id, const ufab_sge* sge, uint32_t nsge, uint32_t addr, uint32_t qpn,
                   uint32_t qkey = kQkey, std::optional<uint32_t> imm = std::nullopt, uint32_t op = UFAB_WR_SEND,
                   uint32_t flags = UFAB_SEND_SIGNALED) {
  ufab_send_wr wr = {};
  wr.wr_id = wr_id;
  wr.sg_list = sge;
  wr.num_sge = nsge;
  wr.opcode = imm ? static_cast<uint32_t>(UFAB_WR_SEND_WITH_IMM) : op;
  wr.imm_data = imm.value_or(0);
  wr.send_flags = flags;
  wr.ud = ufab_ud_dest{addr, qpn, qkey, 0, 64, 0};
  uint32_t bad = 0;
  return P()->post_send(qp, &wr, 1, &bad);
}

inline uint64_t rx_dropped(ufab_rdma_dev* dev) {
  ufab_device_stats st = {};
  P()->device_stats(dev, &st);
  return st.rx_dropped;
}

inline uint32_t dev_addr(ufab_rdma_dev* dev) {
  ufab_device_attr da = {};
  P()->query_device(dev, &da);
  return da.ip;
}

inline uint32_t be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

// A completed UD receive of `len` bytes of pattern `seed` from (addr, qpn).
// True when every check held (each failure is reported and counted).
bool check_ud_recv(const ufab_wc& wc, const uint8_t* buf, uint32_t len, uint32_t seed, uint32_t addr, uint32_t qpn,
                   std::optional<uint32_t> imm) {
  const int before = g_failures;
  TCHECK_EQ(wc.status, static_cast<uint32_t>(UFAB_WC_SUCCESS));
  TCHECK_EQ(wc.opcode, static_cast<uint32_t>(UFAB_WC_RECV));
  TCHECK_EQ(wc.byte_len, kGrh + len);
  TCHECK_EQ(wc.src_qp, qpn);
  TCHECK((wc.wc_flags & UFAB_WC_GRH) != 0);
  TCHECK_EQ((wc.wc_flags & UFAB_WC_WITH_IMM) != 0, imm.has_value());
  if (imm) TCHECK_EQ(wc.imm_data, *imm);
  // The GRH area: 20 zero bytes, then an IPv4 header whose source is the
  // sending device (what libufab-fi's DGRAM source lookup reads).
  for (uint32_t i = 0; i < 20; ++i) TCHECK_EQ(buf[i], 0);
  TCHECK_EQ(buf[20], 0x45);
  TCHECK_EQ(be32(buf + 32), addr);
  TCHECK_MSG(check_pattern(buf + kGrh, len, seed), "payload of " + std::to_string(len) + " bytes");
  return g_failures == before;
}

// The segment of the device at `addr`, as mapped in this process (its own
// mapping or a peer's: the same memfd).
shm::Segment* find_segment(uint32_t addr) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("memfd:ufab-shm") == std::string::npos) continue;
    unsigned long long start = 0, end = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx", &start, &end) != 2) continue;
    if (end - start < sizeof(shm::Segment)) continue;
    auto* s = reinterpret_cast<shm::Segment*>(start);
    if (s->hdr.magic == shm::kSegMagic && s->hdr.addr == addr) return s;
  }
  return nullptr;
}

size_t shm_mappings() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  size_t n = 0;
  while (std::getline(maps, line)) n += line.find("memfd:ufab-shm") != std::string::npos;
  return n;
}

// ---------------------------------------------------------------------------

// Both processes send every size (0 .. 4096 bytes, SEND and SEND_WITH_IMM)
// to each other at once; receives are scattered over two SGEs (the GRH
// area straddles them).
TEST(ShmUd, BothWaysAcrossProcesses) {
  EXPECT_TRUE(run_pair("ud-both", [](Side& s) {
    const uint32_t sizes[] = {0, 1, 7, 32, 33, 100, 1000, 1024, 1025, 2048, 4000, 4095, 4096};
    constexpr uint32_t n = sizeof sizes / sizeof sizes[0];
    Arena a(2 * n * kSlot);
    ufab_mr_attr ma = {sizeof ma, UFAB_ACCESS_LOCAL_WRITE, a.p, a.size, UFAB_MEM_HOST, 0};
    ufab_rdma_mr* mr;
    uint32_t lkey, rkey;
    TREQUIRE_OK(P()->reg_mr(s.pd, &ma, &mr, &lkey, &rkey));
    Ud u;
    TREQUIRE(make_ud(s.dev, s.pd, u));
    Info mine, peer;
    mine.addr = dev_addr(s.dev);
    mine.qpn = u.qpn;
    TREQUIRE(s.ch.exchange(mine, &peer));
    TCHECK(peer.addr != mine.addr);
    // An address handle for the peer's device: it connects now.
    ufab_av av = {};
    av.dest_ip = peer.addr;
    ufab_rdma_ah* ah = nullptr;
    TREQUIRE_OK(P()->create_ah(s.pd, &av, &ah));
    for (uint32_t i = 0; i < n; ++i) {
      uint64_t slot = a.addr(uint64_t{i} * kSlot);
      ufab_sge rs[2] = {{slot, 50, lkey}, {slot + 64, kSlot - 64, lkey}};
      TREQUIRE_OK(recv1(u.qp, 0x100 + i, rs, 2));
    }
    TREQUIRE(s.ch.sync("posted"));
    const uint32_t me = s.parent() ? 1 : 2, them = s.parent() ? 2 : 1;
    for (uint32_t i = 0; i < n; ++i) {
      uint8_t* src = a.p + (n + i) * kSlot;
      fill_pattern(src, sizes[i], me * 100 + i);
      ufab_sge ss = {a.addr((n + i) * uint64_t{kSlot}), sizes[i], lkey};
      std::optional<uint32_t> imm;
      if (i % 2) imm = 0xA0000000u | (me << 8) | i;
      TREQUIRE_OK(post_ud(u.qp, 0x200 + i, &ss, sizes[i] ? 1 : 0, peer.addr, peer.qpn, kQkey, imm));
    }
    for (uint32_t i = 0; i < n; ++i) TCHECK(expect_wc(u.scq, 0x200 + i, UFAB_WC_SUCCESS, UFAB_WC_SEND));
    for (uint32_t i = 0; i < n; ++i) {
      ufab_wc wc = {};
      TREQUIRE(expect_wc(u.rcq, 0x100 + i, UFAB_WC_SUCCESS, UFAB_WC_RECV, 10s, &wc));
      // Put the two pieces back together: [0, 50) and [64, ...).
      const uint32_t total = kGrh + sizes[i], first = total < 50 ? total : 50;
      std::vector<uint8_t> got(total);
      const uint8_t* slot = a.p + uint64_t{i} * kSlot;
      std::memcpy(got.data(), slot, first);
      std::memcpy(got.data() + first, slot + 64, total - first);
      std::optional<uint32_t> imm;
      if (i % 2) imm = 0xA0000000u | (them << 8) | i;
      TCHECK(check_ud_recv(wc, got.data(), sizes[i], them * 100 + i, peer.addr, peer.qpn, imm));
    }
    TCHECK(expect_none(u.rcq, 20ms));
    TREQUIRE(s.ch.sync("done"));
    TCHECK_EQ(P()->destroy_ah(ah), 0);
    drop_ud(u);
    TCHECK_EQ(P()->dereg_mr(mr), 0);
    return true;
  }));
}

// Four sender processes stream 150 datagrams each (1 .. 4096 bytes, the
// sender and sequence in the immediate data; bursts of 4 every 50 us, all
// at once) into one receiver QP: every datagram is received intact, in
// order per sender, or counted in the receiver's rx_dropped (the queue was
// full); nothing else.
TEST(ShmUd, ManySendersOneReceiver) {
  constexpr uint32_t kSenders = 4, kEach = 150;
  auto size_of = [](uint32_t id, uint32_t seq) { return 1 + (seq * 997 + id * 131) % 4096; };
  std::string domain = unique_domain("ud-many");
  std::string name = "shm:" + domain;
  int pipes[kSenders][2];
  pid_t kids[kSenders];
  std::fflush(nullptr);
  for (uint32_t id = 0; id < kSenders; ++id) {
    ASSERT_EQ(::pipe(pipes[id]), 0);
    kids[id] = ::fork();
    ASSERT_GE(kids[id], 0);
    if (kids[id] == 0) {
      g_who = "sender";
      ::close(pipes[id][1]);
      Info dest;
      struct pollfd pfd = {pipes[id][0], POLLIN, 0};
      if (::poll(&pfd, 1, 10000) != 1 || ::read(pipes[id][0], &dest, sizeof dest) != static_cast<ssize_t>(sizeof dest))
        ::_exit(2);
      ufab_rdma_dev* dev = nullptr;
      ufab_rdma_pd* pd = nullptr;
      if (P()->open_device(&kHost, name.c_str(), nullptr, &dev) != 0 || P()->alloc_pd(dev, &pd) != 0) ::_exit(3);
      Arena a(4096);
      ufab_mr_attr ma = {sizeof ma, UFAB_ACCESS_LOCAL_WRITE, a.p, a.size, UFAB_MEM_HOST, 0};
      ufab_rdma_mr* mr;
      uint32_t lkey, rkey;
      Ud u;
      if (P()->reg_mr(pd, &ma, &mr, &lkey, &rkey) != 0 || !make_ud(dev, pd, u)) ::_exit(4);
      for (uint32_t seq = 0; seq < kEach; ++seq) {
        const uint32_t len = size_of(id, seq);
        fill_pattern(a.p, len, id * 1000 + seq);
        ufab_sge ss = {a.addr(), len, lkey};
        if (post_ud(u.qp, seq, &ss, 1, dest.addr, dest.qpn, kQkey, (id << 16) | seq) != 0) ::_exit(5);
        if (!expect_wc(u.scq, seq, UFAB_WC_SUCCESS, UFAB_WC_SEND)) ::_exit(6);
        if (seq % 4 == 3) std::this_thread::sleep_for(50us);  // bursts of 4, all senders at once
      }
      drop_ud(u);
      P()->dereg_mr(mr);
      P()->dealloc_pd(pd);
      P()->close_device(dev);
      ::_exit(g_failures == 0 ? 0 : 7);
    }
    ::close(pipes[id][0]);
  }
  ufab_rdma_dev* dev = nullptr;
  ufab_rdma_pd* pd = nullptr;
  // The receiver drains its queue on a progress thread while it checks
  // what it received.
  ufab_device_opts opts = {};
  opts.size = sizeof opts;
  opts.progress_thread = 1;
  ASSERT_EQ(P()->open_device(&kHost, name.c_str(), &opts, &dev), 0) << g_last_error;
  ASSERT_EQ(P()->alloc_pd(dev, &pd), 0);
  constexpr uint32_t kRecvs = 256;
  Arena a(uint64_t{kRecvs} * kSlot);
  ufab_mr_attr ma = {sizeof ma, UFAB_ACCESS_LOCAL_WRITE, a.p, a.size, UFAB_MEM_HOST, 0};
  ufab_rdma_mr* mr;
  uint32_t lkey, rkey;
  ASSERT_EQ(P()->reg_mr(pd, &ma, &mr, &lkey, &rkey), 0);
  Ud u;
  ASSERT_TRUE(make_ud(dev, pd, u));
  for (uint32_t i = 0; i < kRecvs; ++i) {
    ufab_sge rs = {a.addr(uint64_t{i} * kSlot), kSlot, lkey};
    ASSERT_EQ(recv1(u.qp, i, &rs, 1), 0);
  }
  const uint64_t dropped0 = rx_dropped(dev);
  Info me;
  me.addr = dev_addr(dev);
  me.qpn = u.qpn;
  for (uint32_t id = 0; id < kSenders; ++id) {
    ASSERT_EQ(::write(pipes[id][1], &me, sizeof me), static_cast<ssize_t>(sizeof me));
    ::close(pipes[id][1]);
  }
  uint32_t received = 0, bad = 0;
  uint64_t dropped = 0;
  std::map<uint32_t, int64_t> last;  // per sender: the last sequence number received
  std::map<uint32_t, uint32_t> per;
  auto deadline = Clock::now() + 30s;
  while (received + dropped < kSenders * kEach && Clock::now() < deadline) {
    ufab_wc wc[16];
    int got = P()->poll_cq(u.rcq, wc, 16);
    ASSERT_GE(got, 0) << g_last_error;
    for (int k = 0; k < got; ++k) {
      const uint32_t id = wc[k].imm_data >> 16, seq = wc[k].imm_data & 0xffff;
      const uint8_t* buf = a.p + wc[k].wr_id * kSlot;
      // The source address is the sender's device: its pid << 8 | n.
      if (id >= kSenders || seq >= kEach || (be32(buf + 32) >> 8) != static_cast<uint32_t>(kids[id]) ||
          !check_ud_recv(wc[k], buf, size_of(id, seq), id * 1000 + seq, be32(buf + 32), wc[k].src_qp,
                         wc[k].imm_data)) {
        ++bad;
      }
      if (last.count(id)) {
        EXPECT_GT(static_cast<int64_t>(seq), last[id]) << "sender " << id << ": out of order";
      }
      last[id] = seq;
      ++per[id];
      ++received;
      ufab_sge rs = {a.addr(wc[k].wr_id * kSlot), kSlot, lkey};
      ASSERT_EQ(recv1(u.qp, wc[k].wr_id, &rs, 1), 0);
    }
    dropped = rx_dropped(dev) - dropped0;
    if (got == 0) P()->wait_cq(u.rcq, 10);
  }
  for (uint32_t id = 0; id < kSenders; ++id) {
    int status = 0;
    pid_t r = 0;
    for (int i = 0; i < 10000 && (r = ::waitpid(kids[id], &status, WNOHANG)) == 0; ++i) std::this_thread::sleep_for(1ms);
    if (r == 0) {
      ::kill(kids[id], SIGKILL);
      ::waitpid(kids[id], &status, 0);
    }
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "sender " << id << " status 0x" << std::hex << status;
  }
  std::printf("%u datagrams from %u senders: %u received, %llu dropped (queue full)\n", kSenders * kEach, kSenders,
              received, static_cast<unsigned long long>(dropped));
  EXPECT_EQ(received + dropped, uint64_t{kSenders} * kEach) << "every datagram received or counted";
  EXPECT_EQ(bad, 0u);
  for (uint32_t id = 0; id < kSenders; ++id) EXPECT_GT(per[id], 0u) << "sender " << id;
  drop_ud(u);
  P()->dereg_mr(mr);
  P()->dealloc_pd(pd);
  P()->close_device(dev);
}

// Two devices of one process (one connection between them, as between
// processes): sizes up to the limit, what is dropped and counted, errors.
TEST(ShmUd, LimitsDropsAndErrors) {
  std::string name = "shm:" + unique_domain("ud-limits");
  ufab_rdma_dev *da = nullptr, *db = nullptr;
  ASSERT_EQ(P()->open_device(&kHost, name.c_str(), nullptr, &da), 0) << g_last_error;
  ASSERT_EQ(P()->open_device(&kHost, name.c_str(), nullptr, &db), 0) << g_last_error;
  ufab_device_attr at = {};
  ASSERT_EQ(P()->query_device(da, &at), 0);
  EXPECT_NE(at.caps & UFAB_DEVICE_CAP_UD, 0u);
  EXPECT_EQ(at.active_mtu, 4096u);  // the largest datagram
  ufab_rdma_pd *pa, *pb;
  ASSERT_EQ(P()->alloc_pd(da, &pa), 0);
  ASSERT_EQ(P()->alloc_pd(db, &pb), 0);
  Arena ba(64 * kSlot), bb(64 * kSlot);
  ufab_rdma_mr *ma, *mb;
  uint32_t la, lb, rk;
  ufab_mr_attr maa = {sizeof maa, UFAB_ACCESS_LOCAL_WRITE, ba.p, ba.size, UFAB_MEM_HOST, 0};
  ufab_mr_attr mab = {sizeof mab, UFAB_ACCESS_LOCAL_WRITE, bb.p, bb.size, UFAB_MEM_HOST, 0};
  ASSERT_EQ(P()->reg_mr(pa, &maa, &ma, &la, &rk), 0);
  ASSERT_EQ(P()->reg_mr(pb, &mab, &mb, &lb, &rk), 0);
  Ud qa, qb;
  ASSERT_TRUE(make_ud(da, pa, qa));
  ASSERT_TRUE(make_ud(db, pb, qb));
  const uint32_t addr_a = dev_addr(da), addr_b = dev_addr(db);
  auto recv_b = [&](uint64_t wr_id, uint32_t slot, uint32_t len = kSlot) {
    ufab_sge rs = {bb.addr(uint64_t{slot} * kSlot), len, lb};
    return recv1(qb.qp, wr_id, &rs, 1);
  };
  auto send_a = [&](uint64_t wr_id, uint32_t len, uint32_t seed, uint32_t dest_addr, uint32_t dest_qpn,
                    uint32_t qkey = kQkey) {
    fill_pattern(ba.p, len, seed);
    ufab_sge ss = {ba.addr(), len, la};
    return post_ud(qa.qp, wr_id, &ss, 1, dest_addr, dest_qpn, qkey);
  };

  // The largest datagram, and one byte more (refused at post, as soft-RoCE
  // refuses one beyond the path MTU).
  ASSERT_EQ(recv_b(1, 0), 0);
  ASSERT_EQ(send_a(2, 4096, 9, addr_b, qb.qpn), 0);
  EXPECT_TRUE(expect_wc(qa.scq, 2, UFAB_WC_SUCCESS));
  ufab_wc wc = {};
  ASSERT_TRUE(expect_wc(qb.rcq, 1, UFAB_WC_SUCCESS, UFAB_WC_RECV, 5s, &wc));
  EXPECT_TRUE(check_ud_recv(wc, bb.p, 4096, 9, addr_a, qa.qpn, std::nullopt));
  EXPECT_EQ(send_a(3, 4097, 9, addr_b, qb.qpn), -EINVAL);
  EXPECT_NE(g_last_error.find("exceeds the path MTU 4096"), std::string::npos) << g_last_error;
  // Only SEND and SEND_WITH_IMM on a UD QP.
  ufab_sge ss = {ba.addr(), 8, la};
  EXPECT_EQ(post_ud(qa.qp, 4, &ss, 1, addr_b, qb.qpn, kQkey, std::nullopt, UFAB_WR_RDMA_WRITE), -EINVAL);
  EXPECT_NE(g_last_error.find("needs an RC QP"), std::string::npos) << g_last_error;
  EXPECT_EQ(post_ud(qa.qp, 4, &ss, 1, addr_b, qb.qpn, kQkey, std::nullopt, UFAB_WR_ATOMIC_FETCH_AND_ADD), -EINVAL);

  // A wrong Q_Key: dropped and counted; the receive stays for the next.
  uint64_t d0 = rx_dropped(db);
  ASSERT_EQ(recv_b(10, 1), 0);
  ASSERT_EQ(send_a(11, 64, 1, addr_b, qb.qpn, kQkey + 1), 0);
  EXPECT_TRUE(expect_wc(qa.scq, 11, UFAB_WC_SUCCESS));  // a datagram completes once sent
  EXPECT_TRUE(expect_none(qb.rcq, 50ms));
  EXPECT_EQ(rx_dropped(db), d0 + 1);
  ASSERT_EQ(send_a(12, 64, 2, addr_b, qb.qpn), 0);
  EXPECT_TRUE(expect_wc(qa.scq, 12, UFAB_WC_SUCCESS));
  ASSERT_TRUE(expect_wc(qb.rcq, 10, UFAB_WC_SUCCESS, UFAB_WC_RECV, 5s, &wc));
  EXPECT_TRUE(check_ud_recv(wc, bb.p + kSlot, 64, 2, addr_a, qa.qpn, std::nullopt));

  // No receive posted: dropped (UD has no RNR) and counted; not kept.
  ASSERT_EQ(send_a(13, 64, 3, addr_b, qb.qpn), 0);
  EXPECT_TRUE(expect_wc(qa.scq, 13, UFAB_WC_SUCCESS));
  P()->progress(db);
  EXPECT_EQ(rx_dropped(db), d0 + 2);
  ASSERT_EQ(recv_b(14, 2), 0);
  EXPECT_TRUE(expect_none(qb.rcq, 50ms));

  // A receive too small for GRH + data: LOC_LEN_ERR, the QP stays in RTS;
  // a receive with a bad key: LOC_PROT_ERR. Both leave the QP working.
  ASSERT_EQ(send_a(15, 64, 4, addr_b, qb.qpn), 0);
  EXPECT_TRUE(expect_wc(qa.scq, 15, UFAB_WC_SUCCESS));
  ASSERT_TRUE(expect_wc(qb.rcq, 14, UFAB_WC_SUCCESS, UFAB_WC_RECV, 5s, &wc));
  ASSERT_EQ(recv_b(16, 3, kGrh + 10), 0);
  ASSERT_EQ(send_a(17, 11, 5, addr_b, qb.qpn), 0);
  EXPECT_TRUE(expect_wc(qa.scq, 17, UFAB_WC_SUCCESS));
  ASSERT_TRUE(expect_wc(qb.rcq, 16, UFAB_WC_LOC_LEN_ERR, UFAB_WC_RECV, 5s, &wc));
  const char* d = P()->wc_detail(qb.rcq, wc.detail);
  EXPECT_TRUE(d && std::strstr(d, "+40 GRH")) << (d ? d : "(none)");
  EXPECT_EQ(qp_state(qb.qp), static_cast<uint32_t>(UFAB_QPS_RTS));
  ufab_sge badr = {bb.addr(4 * kSlot), kSlot, lb ^ 0x1000};
  ASSERT_EQ(recv1(qb.qp, 18, &badr, 1), 0);
  ASSERT_EQ(send_a(19, 11, 5, addr_b, qb.qpn), 0);
  EXPECT_TRUE(expect_wc(qa.scq, 19, UFAB_WC_SUCCESS));
  EXPECT_TRUE(expect_wc(qb.rcq, 18, UFAB_WC_LOC_PROT_ERR, UFAB_WC_RECV));
  EXPECT_EQ(qp_state(qb.qp), static_cast<uint32_t>(UFAB_QPS_RTS));
  // A send with a bad lkey: LOC_PROT_ERR, and the QP stays in RTS.
  ufab_sge bads = {ba.addr(), 8, la ^ 0x1000};
  ASSERT_EQ(post_ud(qa.qp, 20, &bads, 1, addr_b, qb.qpn), 0);
  EXPECT_TRUE(expect_wc(qa.scq, 20, UFAB_WC_LOC_PROT_ERR, UFAB_WC_SEND));
  EXPECT_EQ(qp_state(qa.qp), static_cast<uint32_t>(UFAB_QPS_RTS));

  // To a QP number nobody has: completes, nothing arrives anywhere.
  ASSERT_EQ(recv_b(21, 5), 0);
  ASSERT_EQ(send_a(22, 8, 6, addr_b, qb.qpn ^ 0x100), 0);
  EXPECT_TRUE(expect_wc(qa.scq, 22, UFAB_WC_SUCCESS));
  EXPECT_TRUE(expect_none(qb.rcq, 50ms));

  // A full queue: B does not run progress while A sends 40; 32 fit its
  // queue, 8 are dropped and counted at B.
  for (uint32_t i = 0; i < 40; ++i) ASSERT_EQ(recv_b(100 + i, 6 + i), 0);
  d0 = rx_dropped(db);
  for (uint32_t i = 0; i < 40; ++i) {
    ASSERT_EQ(send_a(200 + i, 100, 50 + i, addr_b, qb.qpn), 0);
    ASSERT_TRUE(expect_wc(qa.scq, 200 + i, UFAB_WC_SUCCESS));
  }
  EXPECT_EQ(rx_dropped(db), d0 + 8);
  ASSERT_TRUE(expect_wc(qb.rcq, 21, UFAB_WC_SUCCESS, UFAB_WC_RECV, 5s, &wc));  // the first of the 32
  EXPECT_TRUE(check_ud_recv(wc, bb.p + 5 * kSlot, 100, 50, addr_a, qa.qpn, std::nullopt));
  for (uint32_t i = 0; i < 31; ++i) {
    ASSERT_TRUE(expect_wc(qb.rcq, 100 + i, UFAB_WC_SUCCESS, UFAB_WC_RECV, 5s, &wc));
    EXPECT_TRUE(check_ud_recv(wc, bb.p + (6 + i) * kSlot, 100, 51 + i, addr_a, qa.qpn, std::nullopt));
  }
  EXPECT_TRUE(expect_none(qb.rcq, 50ms));

  // Within one device: to another QP of it, and to itself.
  Ud qa2;
  ASSERT_TRUE(make_ud(da, pa, qa2));
  ufab_sge r2 = {ba.addr(kSlot), kSlot, la};
  ASSERT_EQ(recv1(qa2.qp, 30, &r2, 1), 0);
  ASSERT_EQ(send_a(31, 300, 7, addr_a, qa2.qpn), 0);
  EXPECT_TRUE(expect_wc(qa.scq, 31, UFAB_WC_SUCCESS));
  ASSERT_TRUE(expect_wc(qa2.rcq, 30, UFAB_WC_SUCCESS, UFAB_WC_RECV, 5s, &wc));
  EXPECT_TRUE(check_ud_recv(wc, ba.p + kSlot, 300, 7, addr_a, qa.qpn, std::nullopt));
  ufab_sge r3 = {ba.addr(2 * kSlot), kSlot, la};
  ASSERT_EQ(recv1(qa.qp, 32, &r3, 1), 0);
  ASSERT_EQ(send_a(33, 5, 8, addr_a, qa.qpn), 0);
  EXPECT_TRUE(expect_wc(qa.scq, 33, UFAB_WC_SUCCESS));
  ASSERT_TRUE(expect_wc(qa.rcq, 32, UFAB_WC_SUCCESS, UFAB_WC_RECV, 5s, &wc));
  EXPECT_TRUE(check_ud_recv(wc, ba.p + 2 * kSlot, 5, 8, addr_a, qa.qpn, std::nullopt));

  // Address handles: address 0 and an address nobody serves are refused,
  // saying why; this device's own address and a peer's are taken.
  ufab_av av = {};
  ufab_rdma_ah* ah = nullptr;
  EXPECT_EQ(P()->create_ah(pa, &av, &ah), -EINVAL);
  EXPECT_NE(g_last_error.find("address 0"), std::string::npos) << g_last_error;
  const uint32_t nobody = addr_a ^ 0x80;
  av.dest_ip = nobody;
  EXPECT_EQ(P()->create_ah(pa, &av, &ah), -ECONNREFUSED);
  EXPECT_NE(g_last_error.find("no device has that address"), std::string::npos) << g_last_error;
  av.dest_ip = addr_a;
  ASSERT_EQ(P()->create_ah(pa, &av, &ah), 0) << g_last_error;
  EXPECT_EQ(P()->destroy_ah(ah), 0);
  av.dest_ip = addr_b;
  ASSERT_EQ(P()->create_ah(pa, &av, &ah), 0) << g_last_error;
  EXPECT_EQ(P()->destroy_ah(ah), 0);
  // A datagram to an address nobody serves: RETRY_EXC_ERR (soft-RoCE's
  // for a destination that does not answer ARP); the QP stays in RTS.
  ASSERT_EQ(send_a(34, 8, 9, nobody, qb.qpn), 0);
  ASSERT_TRUE(expect_wc(qa.scq, 34, UFAB_WC_RETRY_EXC_ERR, UFAB_WC_SEND, 5s, &wc));
  EXPECT_EQ(qp_state(qa.qp), static_cast<uint32_t>(UFAB_QPS_RTS));

  // UD transitions: the Q_Key at INIT, nothing RC-only.
  ufab_rdma_qp_init init = {UFAB_QPT_UD, 0, qa.scq, qa.rcq, {4, 4, 1, 1, 0}};
  ufab_rdma_qp* q;
  uint32_t qn;
  ASSERT_EQ(P()->create_qp(pa, &init, &q, &qn), 0);
  ufab_qp_attr a = {};
  a.state = UFAB_QPS_INIT;
  a.port = 1;
  EXPECT_EQ(P()->modify_qp(q, &a, UFAB_QP_STATE | UFAB_QP_PKEY_INDEX | UFAB_QP_PORT), -EINVAL);
  EXPECT_NE(g_last_error.find("missing qkey"), std::string::npos) << g_last_error;
  EXPECT_EQ(P()->modify_qp(q, &a, UFAB_QP_STATE | UFAB_QP_PKEY_INDEX | UFAB_QP_PORT | UFAB_QP_QKEY), 0);
  a.state = UFAB_QPS_RTR;
  EXPECT_EQ(P()->modify_qp(q, &a, UFAB_QP_STATE | UFAB_QP_AV), -EINVAL);
  EXPECT_NE(g_last_error.find("cannot be set"), std::string::npos) << g_last_error;
  EXPECT_EQ(P()->destroy_qp(q), 0);

  ufab_device_stats st = {};
  ASSERT_EQ(P()->device_stats(da, &st), 0);
  EXPECT_GE(st.tx_frames, 45u);
  drop_ud(qa2);
  drop_ud(qa);
  drop_ud(qb);
  P()->dereg_mr(ma);
  P()->dereg_mr(mb);
  P()->dealloc_pd(pa);
  P()->dealloc_pd(pb);
  P()->close_device(da);
  P()->close_device(db);
}

// A producer that claimed a cell and never published it: when its process
// is gone, the receiver skips the cell after ~10 ms; when it lives but
// does not finish, after 1 s. Either way the datagrams behind it arrive,
// the skipped one is counted, and the late producer cannot publish.
TEST(ShmUd, AClaimNeverPublishedIsSkipped) {
  std::string name = "shm:" + unique_domain("ud-claim");
  ufab_rdma_dev *da = nullptr, *db = nullptr;
  ASSERT_EQ(P()->open_device(&kHost, name.c_str(), nullptr, &da), 0) << g_last_error;
  ASSERT_EQ(P()->open_device(&kHost, name.c_str(), nullptr, &db), 0) << g_last_error;
  ufab_rdma_pd *pa, *pb;
  ASSERT_EQ(P()->alloc_pd(da, &pa), 0);
  ASSERT_EQ(P()->alloc_pd(db, &pb), 0);
  Arena ba(kSlot), bb(4 * kSlot);
  ufab_rdma_mr *ma, *mb;
  uint32_t la, lb, rk;
  ufab_mr_attr maa = {sizeof maa, UFAB_ACCESS_LOCAL_WRITE, ba.p, ba.size, UFAB_MEM_HOST, 0};
  ufab_mr_attr mab = {sizeof mab, UFAB_ACCESS_LOCAL_WRITE, bb.p, bb.size, UFAB_MEM_HOST, 0};
  ASSERT_EQ(P()->reg_mr(pa, &maa, &ma, &la, &rk), 0);
  ASSERT_EQ(P()->reg_mr(pb, &mab, &mb, &lb, &rk), 0);
  Ud qa, qb;
  ASSERT_TRUE(make_ud(da, pa, qa));
  ASSERT_TRUE(make_ud(db, pb, qb));
  const uint32_t addr_b = dev_addr(db);
  shm::Segment* seg = find_segment(addr_b);
  ASSERT_NE(seg, nullptr) << "B's segment is not mapped here";
  const uint32_t idx = qb.qpn % shm::kMaxQp;
  shm::QpCtl& c = seg->ctl[idx];
  // Claims the next cell as a producer of `pid` would, and stops there.
  auto claim = [&](pid_t pid) -> uint64_t {
    uint64_t t = c.req.tail.load();
    auto& cell = seg->ud[idx].cells[t % shm::kUdCells];
    uint64_t want = shm::ud_state(t, shm::kUdFree, 0);
    EXPECT_TRUE(cell.h.state.compare_exchange_strong(want, shm::ud_state(t, shm::kUdClaimed, uint32_t(pid) << 8)));
    c.req.tail.store(t + 1);
    return t;
  };
  pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ASSERT_GT(dead, 0);
  ASSERT_EQ(::waitpid(dead, nullptr, 0), dead);
  for (pid_t who : {dead, ::getppid()}) {
    const bool gone = who == dead;
    const uint64_t d0 = rx_dropped(db);
    const uint64_t t = claim(who);
    ufab_sge rs = {bb.addr(), kSlot, lb};
    ASSERT_EQ(recv1(qb.qp, 1, &rs, 1), 0);
    fill_pattern(ba.p, 500, 42);
    ufab_sge ss = {ba.addr(), 500, la};
    auto start = Clock::now();
    ASSERT_EQ(post_ud(qa.qp, 2, &ss, 1, addr_b, qb.qpn), 0);
    ASSERT_TRUE(expect_wc(qa.scq, 2, UFAB_WC_SUCCESS));
    ufab_wc wc = {};
    ASSERT_TRUE(expect_wc(qb.rcq, 1, UFAB_WC_SUCCESS, UFAB_WC_RECV, 5s, &wc));
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
    EXPECT_TRUE(check_ud_recv(wc, bb.p, 500, 42, dev_addr(da), qa.qpn, std::nullopt));
    std::printf("claim by %s process: the datagram behind it arrived after %lld ms\n", gone ? "a dead" : "a live",
                static_cast<long long>(took));
    if (gone) {
      EXPECT_LT(took, 900) << "a dead claimer is found before the 1 s bound";
    } else {
      EXPECT_GE(took, 1000);
      EXPECT_LT(took, 3000);
    }
    EXPECT_EQ(rx_dropped(db), d0 + 1);
    // The stopped producer resumes: its publish fails.
    auto& cell = seg->ud[idx].cells[t % shm::kUdCells];
    uint64_t claimed = shm::ud_state(t, shm::kUdClaimed, uint32_t(who) << 8);
    EXPECT_FALSE(cell.h.state.compare_exchange_strong(claimed, shm::ud_state(t, shm::kUdReady, uint32_t(who) << 8)));
    EXPECT_TRUE(expect_none(qb.rcq, 20ms));
  }
  drop_ud(qa);
  drop_ud(qb);
  P()->dereg_mr(ma);
  P()->dereg_mr(mb);
  P()->dealloc_pd(pa);
  P()->dealloc_pd(pb);
  P()->close_device(da);
  P()->close_device(db);
}

// A receiver asleep in wait_cq is woken by a datagram from another
// process 200 ms later (the sender wakes its futex), and uses little CPU
// meanwhile.
TEST(ShmUd, WaitCqIsWokenByADatagram) {
  EXPECT_TRUE(run_pair("ud-wait", [](Side& s) {
    Arena a(2 * kSlot);
    ufab_mr_attr ma = {sizeof ma, UFAB_ACCESS_LOCAL_WRITE, a.p, a.size, UFAB_MEM_HOST, 0};
    ufab_rdma_mr* mr;
    uint32_t lkey, rkey;
    TREQUIRE_OK(P()->reg_mr(s.pd, &ma, &mr, &lkey, &rkey));
    Ud u;
    TREQUIRE(make_ud(s.dev, s.pd, u));
    Info mine, peer;
    mine.addr = dev_addr(s.dev);
    mine.qpn = u.qpn;
    if (s.parent()) {
      ufab_sge rs = {a.addr(), kSlot, lkey};
      TREQUIRE_OK(recv1(u.qp, 1, &rs, 1));
    }
    TREQUIRE(s.ch.exchange(mine, &peer));
    if (!s.parent()) {
      std::this_thread::sleep_for(200ms);
      fill_pattern(a.p, 100, 3);
      ufab_sge ss = {a.addr(), 100, lkey};
      TREQUIRE_OK(post_ud(u.qp, 2, &ss, 1, peer.addr, peer.qpn));
      TCHECK(expect_wc(u.scq, 2, UFAB_WC_SUCCESS));
    } else {
      timespec c0, c1;
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
      auto t0 = Clock::now();
      TCHECK_EQ(P()->wait_cq(u.rcq, 5000), 1);
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
      const double cpu_ms = (c1.tv_sec - c0.tv_sec) * 1e3 + (c1.tv_nsec - c0.tv_nsec) / 1e6;
      std::printf("woken after %lld ms with %.2f ms of CPU\n", static_cast<long long>(ms), cpu_ms);
      TCHECK(ms >= 150 && ms < 2000);
      TCHECK(cpu_ms < 50);
      ufab_wc wc = {};
      TREQUIRE(expect_wc(u.rcq, 1, UFAB_WC_SUCCESS, UFAB_WC_RECV, 1s, &wc));
      TCHECK(check_ud_recv(wc, a.p, 100, 3, peer.addr, peer.qpn, std::nullopt));
    }
    TREQUIRE(s.ch.sync("end"));
    drop_ud(u);
    P()->dereg_mr(mr);
    return true;
  }));
}

// The receiver process is killed while 4096-byte datagrams stream to it:
// the sender's datagrams keep completing (until the receiver is found
// gone: then RETRY_EXC_ERR, the address nobody's), its QP stays in RTS and
// works, and the dead receiver's segment is unmapped.
TEST(ShmUd, ReceiverKilledMidStream) {
  EXPECT_TRUE(run_pair(
      "ud-rx-dies",
      [](Side& s) {
        Arena a(64 * kSlot);
        ufab_mr_attr ma = {sizeof ma, UFAB_ACCESS_LOCAL_WRITE, a.p, a.size, UFAB_MEM_HOST, 0};
        ufab_rdma_mr* mr;
        uint32_t lkey, rkey;
        TREQUIRE_OK(P()->reg_mr(s.pd, &ma, &mr, &lkey, &rkey));
        Ud u;
        TREQUIRE(make_ud(s.dev, s.pd, u));
        Info mine, peer;
        mine.addr = dev_addr(s.dev);
        mine.qpn = u.qpn;
        if (!s.parent()) {
          for (uint32_t i = 0; i < 64; ++i) {
            ufab_sge rs = {a.addr(uint64_t{i} * kSlot), kSlot, lkey};
            TREQUIRE_OK(recv1(u.qp, i, &rs, 1));
          }
          TREQUIRE(s.ch.exchange(mine, &peer));
          // Take 20, then die with the stream still coming.
          for (int i = 0; i < 20; ++i) TREQUIRE(next_wc(u.rcq, 10s).has_value());
          ::kill(::getpid(), SIGKILL);
        }
        const size_t maps0 = shm_mappings();
        TREQUIRE(s.ch.exchange(mine, &peer));
        ufab_sge ss = {a.addr(), 4096, lkey};
        uint64_t ok = 0;
        bool refused = false;
        auto deadline = Clock::now() + 10s;
        for (uint64_t i = 0; !refused && Clock::now() < deadline; ++i) {
          TREQUIRE_OK(post_ud(u.qp, i, &ss, 1, peer.addr, peer.qpn));
          auto wc = next_wc(u.scq, 5s);
          TREQUIRE(wc.has_value());
          if (wc->status == UFAB_WC_SUCCESS) {
            ++ok;
          } else {
            TCHECK_EQ(wc->status, static_cast<uint32_t>(UFAB_WC_RETRY_EXC_ERR));
            const char* d = P()->wc_detail(u.scq, wc->detail);
            // Nobody at that address any more, or (caught dying) a
            // connection reset in the middle of the handshake.
            TCHECK_MSG(d && std::strstr(d, "UD destination") &&
                           (std::strstr(d, "no device has that address") || std::strstr(d, "no answer from the peer")),
                       d ? d : "(none)");
            refused = true;
          }
          if (i % 16 == 0) std::this_thread::sleep_for(1ms);
        }
        std::printf("%llu datagrams completed before the receiver was found gone\n", static_cast<unsigned long long>(ok));
        TCHECK(refused);
        TCHECK(ok >= 20);
        TCHECK_EQ(qp_state(u.qp), static_cast<uint32_t>(UFAB_QPS_RTS));
        TCHECK(s.ch.wait_eof(5s));
        // The dead peer's segment is let go (mappings back to what they
        // were before it connected).
        P()->progress(s.dev);
        TCHECK_EQ(shm_mappings(), maps0);
        // And the QP still works (to itself).
        ufab_sge rs = {a.addr(kSlot), kSlot, lkey};
        TREQUIRE_OK(recv1(u.qp, 77, &rs, 1));
        fill_pattern(a.p, 64, 5);
        ufab_sge s64 = {a.addr(), 64, lkey};
        TREQUIRE_OK(post_ud(u.qp, 78, &s64, 1, mine.addr, u.qpn));
        ufab_wc wc = {};
        TREQUIRE(expect_wc(u.rcq, 77, UFAB_WC_SUCCESS, UFAB_WC_RECV, 5s, &wc));
        TCHECK(check_ud_recv(wc, a.p + kSlot, 64, 5, mine.addr, u.qpn, std::nullopt));
        drop_ud(u);
        P()->dereg_mr(mr);
        return true;
      },
      true));
}

// A sender process is killed while it streams datagrams into the
// receiver's queue (perhaps between claiming a cell and publishing it):
// the receiver's queue goes on; a datagram sent after the kill arrives.
TEST(ShmUd, SenderKilledMidStream) {
  EXPECT_TRUE(run_pair(
      "ud-tx-dies",
      [](Side& s) {
        Arena a(64 * kSlot);
        ufab_mr_attr ma = {sizeof ma, UFAB_ACCESS_LOCAL_WRITE, a.p, a.size, UFAB_MEM_HOST, 0};
        ufab_rdma_mr* mr;
        uint32_t lkey, rkey;
        TREQUIRE_OK(P()->reg_mr(s.pd, &ma, &mr, &lkey, &rkey));
        Ud u;
        TREQUIRE(make_ud(s.dev, s.pd, u));
        Info mine, peer;
        mine.addr = dev_addr(s.dev);
        mine.qpn = u.qpn;
        mine.psn = static_cast<uint32_t>(::getpid());
        TREQUIRE(s.ch.exchange(mine, &peer));
        if (!s.parent()) {
          // Stream without waiting for anything until killed.
          ufab_sge ss = {a.addr(), 4096, lkey};
          for (uint64_t i = 0;; ++i) {
            post_ud(u.qp, i, &ss, 1, peer.addr, peer.qpn, kQkey, std::nullopt, UFAB_WR_SEND, 0);
          }
        }
        for (uint32_t i = 0; i < 64; ++i) {
          ufab_sge rs = {a.addr(uint64_t{i} * kSlot), kSlot, lkey};
          TREQUIRE_OK(recv1(u.qp, i, &rs, 1));
        }
        // Take some, kill the sender, take what is left.
        uint32_t got = 0;
        for (; got < 10; ++got) TREQUIRE(next_wc(u.rcq, 10s).has_value());
        ::kill(static_cast<pid_t>(peer.psn), SIGKILL);
        TCHECK(s.ch.wait_eof(5s));
        const uint64_t d0 = rx_dropped(s.dev);
        drive_for(s, 50ms);
        while (auto wc = next_wc(u.rcq, 50ms)) {
          TCHECK_EQ(wc->status, static_cast<uint32_t>(UFAB_WC_SUCCESS));
          ++got;
        }
        std::printf("received %u datagrams; %llu dropped after the kill\n", got,
                    static_cast<unsigned long long>(rx_dropped(s.dev) - d0));
        // Not wedged: one more (to itself) arrives.
        for (uint32_t i = 0; i < 64; ++i) {
          ufab_sge rs = {a.addr(uint64_t{i} * kSlot), kSlot, lkey};
          if (recv1(u.qp, 100 + i, &rs, 1) != 0) break;
        }
        fill_pattern(a.p + 63 * kSlot, 64, 6);
        ufab_sge s64 = {a.addr(63 * kSlot), 64, lkey};
        TREQUIRE_OK(post_ud(u.qp, 999, &s64, 1, mine.addr, u.qpn));
        bool arrived = false;
        auto deadline = Clock::now() + 3s;
        while (!arrived && Clock::now() < deadline) {
          auto wc = next_wc(u.rcq, 100ms);
          if (wc && wc->src_qp == u.qpn && wc->byte_len == kGrh + 64) arrived = true;
        }
        TCHECK(arrived);
        drop_ud(u);
        P()->dereg_mr(mr);
        return true;
      },
      true));
}

}  // namespace
}  // namespace ufab::shm_test
