// The shm provider between two processes: every operation both ways with
// its data checked (0 B to 1 MiB), post lists with gather/scatter, inline
// and unsignaled sends, loopback within one device, and WRITE/READ on
// regions of MAP_SHARED memfds, which the peer maps and copies without CMA.
#include <gtest/gtest.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include <array>
#include <cstdlib>
#include <memory>

#include "tests/unit/drivers/shm/pair.h"

namespace ufab::shm_test {
namespace {

// The same, in a memfd mapped MAP_SHARED (its descriptor kept open): a
// peer maps such a region and copies with memcpy.
struct SharedArena {
  size_t size;
  int fd = -1;
  uint8_t* p = nullptr;
  explicit SharedArena(size_t n) : size(n) {
    fd = memfd_create("shm-ops-test", MFD_CLOEXEC);
    if (fd >= 0 && ftruncate(fd, static_cast<off_t>(n)) == 0) {
      void* m = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (m != MAP_FAILED) p = static_cast<uint8_t*>(m);
    }
  }
  ~SharedArena() {
    if (p) munmap(p, size);
    if (fd >= 0) close(fd);
  }
  uint64_t addr(uint64_t off = 0) const { return reinterpret_cast<uint64_t>(p) + off; }
};

const uint32_t kSizes[] = {0, 1, 32, 33, 40, 41, 1000, 1024, 1025, 4096, 65537, 1u << 20};
constexpr uint64_t kSrc = 0;          // requester's source / READ destination
constexpr uint64_t kDst = 2u << 20;   // responder's receive / WRITE / READ source area
constexpr uint64_t kWord = 4u << 20;  // atomics target
constexpr size_t kArena = (4u << 20) + 4096;

// One direction: `req` is the requester.
template <class A>  // Arena or SharedArena
bool one_direction(Side& s, A& a, const Reg& r, Conn& c, bool req, uint32_t round) {
  for (uint32_t size : kSizes) {
    uint32_t seed = size * 7 + round;
    ufab_sge src = {a.addr(kSrc), size, r.lkey};
    ufab_sge dst = {a.addr(kDst), size ? size : 1, r.lkey};
    // SEND and SEND_WITH_IMM
    for (int imm = 0; imm < 2; ++imm) {
      if (req) {
        TREQUIRE(s.ch.sync("recv posted"));
        fill_pattern(a.p + kSrc, size, seed + imm);
        TREQUIRE_OK(post1(c.qp, 0x100 + size, imm ? UFAB_WR_SEND_WITH_IMM : UFAB_WR_SEND, &src, 1,
                          UFAB_SEND_SIGNALED, 0, 0, 0xC0FFEE00 + size));
        TREQUIRE(expect_wc(c.scq, 0x100 + size, UFAB_WC_SUCCESS, UFAB_WC_SEND));
      } else {
        std::memset(a.p + kDst, 0, size + 1);
        TREQUIRE_OK(recv1(c.qp, 0x200 + size, &dst, 1));
        TREQUIRE(s.ch.sync("recv posted"));
        ufab_wc wc;
        TREQUIRE(expect_wc(c.rcq, 0x200 + size, UFAB_WC_SUCCESS, UFAB_WC_RECV, 10s, &wc));
        TCHECK_EQ(wc.byte_len, size);
        TCHECK_EQ(wc.qp_num, c.qpn);
        if (imm) {
          TCHECK_EQ(wc.imm_data, 0xC0FFEE00 + size);
          TCHECK(wc.wc_flags & UFAB_WC_WITH_IMM);
        } else {
          TCHECK(!(wc.wc_flags & UFAB_WC_WITH_IMM));
        }
        TCHECK_MSG(check_pattern(a.p + kDst, size, seed + imm), "SEND data of " + std::to_string(size) + " bytes");
        TCHECK_EQ(a.p[kDst + size], 0);  // nothing past the message
      }
    }
    // RDMA WRITE and WRITE_WITH_IMM
    for (int imm = 0; imm < 2; ++imm) {
      if (req) {
        TREQUIRE(s.ch.sync("write ready"));
        fill_pattern(a.p + kSrc, size, seed + 10 + imm);
        TREQUIRE_OK(post1(c.qp, 0x300 + size, imm ? UFAB_WR_RDMA_WRITE_WITH_IMM : UFAB_WR_RDMA_WRITE, &src, 1,
                          UFAB_SEND_SIGNALED, c.peer.vaddr + kDst, c.peer.rkey, 0xABC00000 + size));
        TREQUIRE(expect_wc(c.scq, 0x300 + size, UFAB_WC_SUCCESS, UFAB_WC_RDMA_WRITE));
        TREQUIRE(s.ch.sync("written"));
      } else {
        std::memset(a.p + kDst, 0, size + 1);
        if (imm) TREQUIRE_OK(recv1(c.qp, 0x400 + size, nullptr, 0));
        TREQUIRE(s.ch.sync("write ready"));
        if (imm) {
          ufab_wc wc;
          TREQUIRE(expect_wc(c.rcq, 0x400 + size, UFAB_WC_SUCCESS, UFAB_WC_RECV_RDMA_WITH_IMM, 10s, &wc));
          TCHECK_EQ(wc.byte_len, size);
          TCHECK_EQ(wc.imm_data, 0xABC00000 + size);
          TCHECK(wc.wc_flags & UFAB_WC_WITH_IMM);
        }
        TREQUIRE(s.ch.sync("written"));
        TCHECK_MSG(check_pattern(a.p + kDst, size, seed + 10 + imm), "WRITE data of " + std::to_string(size) + " bytes");
        TCHECK_EQ(a.p[kDst + size], 0);
      }
    }
    // RDMA READ
    if (req) {
      std::memset(a.p + kSrc, 0, size + 1);
      TREQUIRE(s.ch.sync("read ready"));
      TREQUIRE_OK(post1(c.qp, 0x500 + size, UFAB_WR_RDMA_READ, &src, 1, UFAB_SEND_SIGNALED, c.peer.vaddr + kDst,
                        c.peer.rkey));
      ufab_wc wc;
      TREQUIRE(expect_wc(c.scq, 0x500 + size, UFAB_WC_SUCCESS, UFAB_WC_RDMA_READ, 10s, &wc));
      TCHECK_EQ(wc.byte_len, size);
      TCHECK_MSG(check_pattern(a.p + kSrc, size, seed + 20), "READ data of " + std::to_string(size) + " bytes");
      TCHECK_EQ(a.p[kSrc + size], 0);
      TREQUIRE(s.ch.sync("read done"));
    } else {
      fill_pattern(a.p + kDst, size, seed + 20);
      TREQUIRE(s.ch.sync("read ready"));
      TREQUIRE(s.ch.sync("read done"));
    }
  }
  // Atomics: FETCH_AND_ADD then CMP_AND_SWP (a failing compare, then a hit).
  auto* word = reinterpret_cast<uint64_t*>(a.p + kWord);
  auto* result = reinterpret_cast<uint64_t*>(a.p + kWord + 64);
  if (req) {
    TREQUIRE(s.ch.sync("word set"));
    ufab_sge res = {a.addr(kWord + 64), 8, r.lkey};
    uint64_t target = c.peer.vaddr + kWord;
    TREQUIRE_OK(post_atomic(c.qp, 0x600, UFAB_WR_ATOMIC_FETCH_AND_ADD, res, target, c.peer.rkey, 5, 0));
    TREQUIRE(expect_wc(c.scq, 0x600, UFAB_WC_SUCCESS, UFAB_WC_FETCH_ADD));
    TCHECK_EQ(*result, 1000ull + round);
    TREQUIRE_OK(post_atomic(c.qp, 0x601, UFAB_WR_ATOMIC_CMP_AND_SWP, res, target, c.peer.rkey, 1, 77));
    TREQUIRE(expect_wc(c.scq, 0x601, UFAB_WC_SUCCESS, UFAB_WC_COMP_SWAP));
    TCHECK_EQ(*result, 1005ull + round);
    TREQUIRE_OK(post_atomic(c.qp, 0x602, UFAB_WR_ATOMIC_CMP_AND_SWP, res, target, c.peer.rkey, 1005 + round, 77));
    TREQUIRE(expect_wc(c.scq, 0x602, UFAB_WC_SUCCESS, UFAB_WC_COMP_SWAP));
    TCHECK_EQ(*result, 1005ull + round);
    TREQUIRE(s.ch.sync("atomics done"));
  } else {
    *word = 1000 + round;
    TREQUIRE(s.ch.sync("word set"));
    // The atomics need this side's progress: wait_cq drives it.
    auto until = Clock::now() + 10s;
    while (__atomic_load_n(word, __ATOMIC_SEQ_CST) != 77 && Clock::now() < until) P()->wait_cq(c.rcq, 1);
    TREQUIRE(s.ch.sync("atomics done"));
    TCHECK_EQ(*word, 77ull);
  }
  return true;
}

TEST(ShmOps, EveryOperationBothDirections) {
  EXPECT_TRUE(run_pair("ops", [](Side& s) {
    Arena a(kArena);
    Reg r;
    TREQUIRE(reg(s.pd, a.p, a.size, kAll, &r));
    Conn c;
    ConnOptions o;
    o.advertise = {0, 0, 0, r.rkey, a.addr(), a.size};
    TREQUIRE(make_conn(s, c, o));
    TREQUIRE(one_direction(s, a, r, c, s.parent(), 0));
    TREQUIRE(s.ch.sync("turn"));
    TREQUIRE(one_direction(s, a, r, c, !s.parent(), 1));
    TREQUIRE(s.ch.sync("end"));
    TCHECK_EQ(qp_state(c.qp), static_cast<uint32_t>(UFAB_QPS_RTS));
    drop_conn(c);
    TREQUIRE_OK(P()->dereg_mr(r.mr));
    return true;
  }));
}

// From here on this process cannot use process_vm_readv/writev (EPERM).
bool forbid_cma() {
  struct sock_filter f[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_process_vm_writev, 2, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_process_vm_readv, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
  };
  struct sock_fprog prog = {sizeof f / sizeof f[0], f};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

// Regions in MAP_SHARED memfds: every operation and size both ways (the
// WRITEs and READs by memcpy through the peer's mapping); then the child,
// with CMA forbidden by seccomp, still WRITEs and READs the parent's shared
// regions, including one registered after the first use and one registered
// again under a new key at the same index, while a WRITE to a private
// region fails for want of CMA (so the others did not use it).
TEST(ShmOps, SharedRegionsAreMappedNotCopiedByCma) {
  EXPECT_TRUE(run_pair("direct", [](Side& s) {
    SharedArena a(kArena);
    TREQUIRE(a.p != nullptr);
    Reg r;
    TREQUIRE(reg(s.pd, a.p, a.size, kAll, &r));
    Conn c;
    ConnOptions o;
    o.advertise = {0, 0, 0, r.rkey, a.addr(), a.size};
    TREQUIRE(make_conn(s, c, o));
    TREQUIRE(one_direction(s, a, r, c, s.parent(), 0));
    TREQUIRE(s.ch.sync("turn"));
    TREQUIRE(one_direction(s, a, r, c, !s.parent(), 1));
    TREQUIRE(s.ch.sync("no cma"));

    constexpr uint32_t kLen = 4096;
    Info none, theirs;
    if (s.parent()) {
      // The target: a region B in a second memfd, then B again under a new
      // key, then a private region; the child's writes are checked here.
      SharedArena b(1u << 20);
      TREQUIRE(b.p != nullptr);
      Reg rb;
      TREQUIRE(reg(s.pd, b.p, b.size, kAll, &rb));
      Info mine = {0, 0, 0, rb.rkey, b.addr(), b.size};
      TREQUIRE(s.ch.exchange(mine, &theirs));
      TREQUIRE(s.ch.sync("b written"));
      TCHECK(check_pattern(b.p + 8192, kLen, 51));
      TREQUIRE_OK(P()->dereg_mr(rb.mr));
      Reg rb2;
      TREQUIRE(reg(s.pd, b.p, b.size, kAll, &rb2));
      TCHECK((rb2.rkey & 0xfff) == (rb.rkey & 0xfff) && rb2.rkey != rb.rkey);
      mine.rkey = rb2.rkey;
      TREQUIRE(s.ch.exchange(mine, &theirs));
      TREQUIRE(s.ch.sync("b written again"));
      TCHECK(check_pattern(b.p + 12288, kLen, 52));
      Arena priv(1u << 16);
      Reg rp;
      TREQUIRE(reg(s.pd, priv.p, priv.size, kAll, &rp));
      mine = {0, 0, 0, rp.rkey, priv.addr(), priv.size};
      TREQUIRE(s.ch.exchange(mine, &theirs));
      TREQUIRE(s.ch.sync("private tried"));
      TCHECK_EQ(priv.p[0], 0);
      TREQUIRE(s.ch.sync("done"));
      drop_conn(c);
      TREQUIRE_OK(P()->dereg_mr(rp.mr));
      TREQUIRE_OK(P()->dereg_mr(rb2.mr));
    } else {
      TREQUIRE(forbid_cma());
      ufab_sge src = {a.addr(kSrc), kLen, r.lkey};
      // A: WRITE and READ back.
      fill_pattern(a.p + kSrc, kLen, 50);
      TREQUIRE_OK(post1(c.qp, 1, UFAB_WR_RDMA_WRITE, &src, 1, UFAB_SEND_SIGNALED, c.peer.vaddr + kDst, c.peer.rkey));
      TREQUIRE(expect_wc(c.scq, 1, UFAB_WC_SUCCESS, UFAB_WC_RDMA_WRITE));
      std::memset(a.p + kSrc, 0, kLen);
      TREQUIRE_OK(post1(c.qp, 2, UFAB_WR_RDMA_READ, &src, 1, UFAB_SEND_SIGNALED, c.peer.vaddr + kDst, c.peer.rkey));
      TREQUIRE(expect_wc(c.scq, 2, UFAB_WC_SUCCESS, UFAB_WC_RDMA_READ));
      TCHECK(check_pattern(a.p + kSrc, kLen, 50));
      // B, registered after A was mapped.
      TREQUIRE(s.ch.exchange(none, &theirs));
      fill_pattern(a.p + kSrc, kLen, 51);
      TREQUIRE_OK(post1(c.qp, 3, UFAB_WR_RDMA_WRITE, &src, 1, UFAB_SEND_SIGNALED, theirs.vaddr + 8192, theirs.rkey));
      TREQUIRE(expect_wc(c.scq, 3, UFAB_WC_SUCCESS, UFAB_WC_RDMA_WRITE));
      TREQUIRE(s.ch.sync("b written"));
      // B under its new key: the old mapping goes, the new one serves.
      TREQUIRE(s.ch.exchange(none, &theirs));
      fill_pattern(a.p + kSrc, kLen, 52);
      TREQUIRE_OK(post1(c.qp, 4, UFAB_WR_RDMA_WRITE, &src, 1, UFAB_SEND_SIGNALED, theirs.vaddr + 12288, theirs.rkey));
      TREQUIRE(expect_wc(c.scq, 4, UFAB_WC_SUCCESS, UFAB_WC_RDMA_WRITE));
      TREQUIRE(s.ch.sync("b written again"));
      // A private region: CMA only, and CMA is forbidden here.
      TREQUIRE(s.ch.exchange(none, &theirs));
      TREQUIRE_OK(post1(c.qp, 5, UFAB_WR_RDMA_WRITE, &src, 1, UFAB_SEND_SIGNALED, theirs.vaddr, theirs.rkey));
      ufab_wc wc;
      TREQUIRE(expect_wc(c.scq, 5, UFAB_WC_REM_OP_ERR, UFAB_WC_RDMA_WRITE, 10s, &wc));
      const char* d = P()->wc_detail(c.scq, wc.detail);
      TCHECK_MSG(d && std::strstr(d, "process_vm_writev"), d ? d : "(no detail)");
      TREQUIRE(s.ch.sync("private tried"));
      TREQUIRE(s.ch.sync("done"));
      drop_conn(c);
    }
    TREQUIRE_OK(P()->dereg_mr(r.mr));
    return true;
  }));
}

// A list of 32 work requests in one post_send (gather of 3 SGEs, some inline,
// some unsignaled, SENDs and WRITEs mixed) against 32 receives posted as one
// list with 2-SGE scatter; a list with one bad entry in the middle posts the
// ones before it and reports the index.
TEST(ShmOps, PostListsGatherScatterInlineUnsignaled) {
  EXPECT_TRUE(run_pair("lists", [](Side& s) {
    Arena a(1 << 20);
    Reg r;
    TREQUIRE(reg(s.pd, a.p, a.size, kAll, &r));
    Conn c;
    ConnOptions o;
    o.advertise = {0, 0, 0, r.rkey, a.addr(), a.size};
    TREQUIRE(make_conn(s, c, o));
    constexpr uint32_t kN = 32;
    if (s.parent()) {
      std::vector<ufab_send_wr> wrs(kN);
      std::vector<std::array<ufab_sge, 3>> sges(kN);
      for (uint32_t i = 0; i < kN; ++i) {
        uint32_t len = 10 + i * 97;  // up to ~3 KiB: ring-inline and CMA both
        uint64_t off = i * 8192;
        fill_pattern(a.p + off, len, i);
        uint32_t l1 = len / 3, l2 = len / 3, l3 = len - l1 - l2;
        sges[i] = {ufab_sge{a.addr(off), l1, r.lkey}, ufab_sge{a.addr(off + l1), l2, r.lkey},
                   ufab_sge{a.addr(off + l1 + l2), l3, r.lkey}};
        ufab_send_wr& w = wrs[i];
        w = {};
        w.wr_id = 0x1000 + i;
        w.sg_list = sges[i].data();
        w.num_sge = 3;
        w.opcode = (i % 4 == 3) ? UFAB_WR_RDMA_WRITE : UFAB_WR_SEND;
        w.remote_addr = c.peer.vaddr + 512 * 1024 + i * 4096;
        w.rkey = c.peer.rkey;
        w.send_flags = (i % 2 == 0 ? UFAB_SEND_SIGNALED : 0) | (i % 5 == 0 && len <= 128 ? UFAB_SEND_INLINE : 0);
      }
      TREQUIRE(s.ch.sync("receives posted"));
      uint32_t bad = 99;
      TREQUIRE_OK(P()->post_send(c.qp, wrs.data(), kN, &bad));
      for (uint32_t i = 0; i < kN; i += 2) TREQUIRE(expect_wc(c.scq, 0x1000 + i, UFAB_WC_SUCCESS));
      TREQUIRE(expect_none(c.scq, 20ms));
      TREQUIRE(s.ch.sync("sent"));
      // A list whose third entry has 5 SGEs (max_send_sge 4): the first two go.
      ufab_sge one = {a.addr(0), 16, r.lkey};
      ufab_sge five[5] = {one, one, one, one, one};
      ufab_send_wr l[4] = {};
      for (uint32_t i = 0; i < 4; ++i) {
        l[i].wr_id = 0x2000 + i;
        l[i].sg_list = i == 2 ? five : &one;
        l[i].num_sge = i == 2 ? 5 : 1;
        l[i].opcode = UFAB_WR_RDMA_WRITE;
        l[i].send_flags = UFAB_SEND_SIGNALED;
        l[i].remote_addr = c.peer.vaddr;
        l[i].rkey = c.peer.rkey;
      }
      bad = 99;
      int rc = P()->post_send(c.qp, l, 4, &bad);
      TCHECK_EQ(rc, -EINVAL);
      TCHECK_EQ(bad, 2u);
      TCHECK(!g_last_error.empty());
      TREQUIRE(expect_wc(c.scq, 0x2000, UFAB_WC_SUCCESS));
      TREQUIRE(expect_wc(c.scq, 0x2001, UFAB_WC_SUCCESS));
      TREQUIRE(expect_none(c.scq, 20ms));
    } else {
      std::vector<ufab_recv_wr> rws;
      std::vector<std::array<ufab_sge, 2>> sges(kN);
      for (uint32_t i = 0; i < kN; ++i) {
        if (i % 4 == 3) continue;
        uint64_t off = i * 8192;
        sges[i] = {ufab_sge{a.addr(off), 1000, r.lkey}, ufab_sge{a.addr(off + 1000), 4000, r.lkey}};
        rws.push_back({0x3000 + i, sges[i].data(), 2, 0});
      }
      uint32_t bad = 0;
      TREQUIRE_OK(P()->post_recv(c.qp, rws.data(), static_cast<uint32_t>(rws.size()), &bad));
      TREQUIRE(s.ch.sync("receives posted"));
      for (uint32_t i = 0; i < kN; ++i) {
        if (i % 4 == 3) continue;
        ufab_wc wc;
        TREQUIRE(expect_wc(c.rcq, 0x3000 + i, UFAB_WC_SUCCESS, UFAB_WC_RECV, 10s, &wc));
        TCHECK_EQ(wc.byte_len, 10 + i * 97);
        TCHECK_MSG(check_pattern(a.p + i * 8192, 10 + i * 97, i), "message " + std::to_string(i));
      }
      TREQUIRE(s.ch.sync("sent"));
      for (uint32_t i = 3; i < kN; i += 4) {
        TCHECK_MSG(check_pattern(a.p + 512 * 1024 + i * 4096, 10 + i * 97, i), "write " + std::to_string(i));
      }
    }
    TREQUIRE(s.ch.sync("end"));
    drop_conn(c);
    TREQUIRE_OK(P()->dereg_mr(r.mr));
    return true;
  }));
}

// Two QPs of one device connected to each other (loopback), in one process.
// The receiver polls the stamp word of the slot at its ring head. A
// message of several slots leaves payload bytes where later laps look for
// a stamp; those words are cleared as the message is consumed, so payload
// that looks like the stamp a later lap expects is never taken for a
// message. A fresh device's rings start at position 0: a SEND of 64 bytes
// takes positions 0 and 1, its payload word at byte 32 lands at the start
// of slot 1, and it holds stamp_of(257) = 257, what the receiver expects
// at position 257 (slot 1 again) one lap later; 255 one-slot SENDs bring
// the head there. Nothing must arrive there, and both QPs stay in RTS.
TEST(ShmOps, PayloadIsNeverTakenForAMessage) {
  ufab_rdma_dev* dev = nullptr;
  std::string name = "shm:" + unique_domain("stamp");
  ASSERT_EQ(P()->open_device(&kHost, name.c_str(), nullptr, &dev), 0) << g_last_error;
  ufab_rdma_pd* pd = nullptr;
  ASSERT_EQ(P()->alloc_pd(dev, &pd), 0);
  ufab_device_attr da = {};
  ASSERT_EQ(P()->query_device(dev, &da), 0);
  Arena a(1 << 16);
  ufab_mr_attr ma = {sizeof ma, kAll, a.p, a.size, UFAB_MEM_HOST, 0};
  ufab_rdma_mr* mr;
  uint32_t lkey, rkey;
  ASSERT_EQ(P()->reg_mr(pd, &ma, &mr, &lkey, &rkey), 0);
  ufab_rdma_cq *scq, *rcq;
  ASSERT_EQ(P()->create_cq(dev, 64, &scq), 0);
  ASSERT_EQ(P()->create_cq(dev, 64, &rcq), 0);
  ufab_rdma_qp_init init = {UFAB_QPT_RC, 1, scq, rcq, {16, 16, 2, 2, 64}};
  ufab_rdma_qp *q1, *q2;
  uint32_t n1, n2;
  ASSERT_EQ(P()->create_qp(pd, &init, &q1, &n1), 0);
  ASSERT_EQ(P()->create_qp(pd, &init, &q2, &n2), 0);
  ConnOptions o;
  ASSERT_EQ(connect_qp(q1, Info{da.ip, n2, 0, 0, 0, 0}, o), 0) << g_last_error;
  ASSERT_EQ(connect_qp(q2, Info{da.ip, n1, 0, 0, 0, 0}, o), 0) << g_last_error;
  auto one = [&](uint32_t len, uint64_t id) {
    ufab_sge rs = {a.addr(8192), 128, lkey};
    ufab_sge ss = {a.addr(0), len, lkey};
    if (recv1(q2, id, &rs, 1) != 0 || post1(q1, id, UFAB_WR_SEND, &ss, 1) != 0) return false;
    ufab_wc wc;
    return expect_wc(rcq, id, UFAB_WC_SUCCESS, UFAB_WC_RECV, 5s, &wc) && wc.byte_len == len &&
           expect_wc(scq, id, UFAB_WC_SUCCESS, UFAB_WC_SEND, 5s);
  };
  fill_pattern(a.p, 64, 9);
  const uint32_t lookalike = 257;  // stamp_of(257)
  std::memcpy(a.p + 32, &lookalike, 4);
  ASSERT_TRUE(one(64, 1));
  EXPECT_EQ(std::memcmp(a.p + 8192, a.p, 64), 0);
  for (uint64_t i = 0; i < 255; ++i) ASSERT_TRUE(one(8, 100 + i)) << "SEND " << i;
  // The receiver's head is at position 257 now, with nothing sent there.
  ufab_sge rs = {a.addr(8192), 128, lkey};
  ASSERT_EQ(recv1(q2, 999, &rs, 1), 0);
  EXPECT_TRUE(expect_none(rcq, 50ms));
  EXPECT_EQ(qp_state(q1), static_cast<uint32_t>(UFAB_QPS_RTS));
  EXPECT_EQ(qp_state(q2), static_cast<uint32_t>(UFAB_QPS_RTS));
  // And the ring goes on: a SEND of several slots, then one of one.
  ufab_sge ss = {a.addr(0), 100, lkey};
  fill_pattern(a.p, 100, 10);
  ASSERT_EQ(post1(q1, 1000, UFAB_WR_SEND, &ss, 1), 0);
  ufab_wc wc;
  ASSERT_TRUE(expect_wc(rcq, 999, UFAB_WC_SUCCESS, UFAB_WC_RECV, 5s, &wc));
  EXPECT_EQ(wc.byte_len, 100u);
  EXPECT_TRUE(check_pattern(a.p + 8192, 100, 10));
  ASSERT_TRUE(expect_wc(scq, 1000, UFAB_WC_SUCCESS, UFAB_WC_SEND, 5s));
  ASSERT_TRUE(one(8, 1001));
  for (auto* q : {q1, q2}) EXPECT_EQ(P()->destroy_qp(q), 0);
  EXPECT_EQ(P()->destroy_cq(scq), 0);
  EXPECT_EQ(P()->destroy_cq(rcq), 0);
  EXPECT_EQ(P()->dereg_mr(mr), 0);
  EXPECT_EQ(P()->dealloc_pd(pd), 0);
  P()->close_device(dev);
}

TEST(ShmOps, LoopbackInOneDevice) {
  ufab_rdma_dev* dev = nullptr;
  std::string name = "shm:" + unique_domain("loop");
  ASSERT_EQ(P()->open_device(&kHost, name.c_str(), nullptr, &dev), 0) << g_last_error;
  ufab_rdma_pd* pd = nullptr;
  ASSERT_EQ(P()->alloc_pd(dev, &pd), 0);
  ufab_device_attr da = {};
  ASSERT_EQ(P()->query_device(dev, &da), 0);
  EXPECT_STREQ(da.provider, "shm");
  EXPECT_EQ(da.ip >> 8, static_cast<uint32_t>(::getpid()));
  // CUDA memory through the staging pool where the build has the CUDA
  // headers (docs/gpu.md, "shm"; tests/unit/drivers/shm/shm_gpu_test.cc).
  EXPECT_EQ(da.mem_types & ~(1u << UFAB_MEM_CUDA), 1u << UFAB_MEM_HOST);
  Arena a(1 << 16);
  ufab_mr_attr ma = {sizeof ma, kAll, a.p, a.size, UFAB_MEM_HOST, 0};
  ufab_rdma_mr* mr;
  uint32_t lkey, rkey;
  ASSERT_EQ(P()->reg_mr(pd, &ma, &mr, &lkey, &rkey), 0);
  ufab_rdma_cq* cq;
  ASSERT_EQ(P()->create_cq(dev, 64, &cq), 0);
  ufab_rdma_qp_init init = {UFAB_QPT_RC, 1, cq, cq, {16, 16, 2, 2, 64}};
  ufab_rdma_qp *q1, *q2;
  uint32_t n1, n2;
  ASSERT_EQ(P()->create_qp(pd, &init, &q1, &n1), 0);
  ASSERT_EQ(P()->create_qp(pd, &init, &q2, &n2), 0);
  EXPECT_NE(n1, n2);
  ConnOptions o;
  ASSERT_EQ(connect_qp(q1, Info{da.ip, n2, 0, 0, 0, 0}, o), 0) << g_last_error;
  ASSERT_EQ(connect_qp(q2, Info{da.ip, n1, 0, 0, 0, 0}, o), 0) << g_last_error;
  // A third QP cannot connect to q2: it has its peer.
  ufab_rdma_qp* q3;
  uint32_t n3;
  ASSERT_EQ(P()->create_qp(pd, &init, &q3, &n3), 0);
  EXPECT_EQ(connect_qp(q3, Info{da.ip, n2, 0, 0, 0, 0}, o), -EBUSY);
  EXPECT_NE(g_last_error.find("already connected"), std::string::npos) << g_last_error;
  ufab_sge rs = {a.addr(4096), 100, lkey};
  ASSERT_EQ(recv1(q2, 7, &rs, 1), 0);
  fill_pattern(a.p, 100, 3);
  ufab_sge ss = {a.addr(0), 100, lkey};
  ASSERT_EQ(post1(q1, 8, UFAB_WR_SEND, &ss, 1, 0), 0);  // sq_sig_all: signaled anyway
  ufab_wc wc[2];
  int got = 0;
  auto until = Clock::now() + 5s;
  while (got < 2 && Clock::now() < until) {
    int n = P()->poll_cq(cq, wc + got, 2 - got);
    ASSERT_GE(n, 0);
    got += n;
  }
  ASSERT_EQ(got, 2);
  EXPECT_TRUE(check_pattern(a.p + 4096, 100, 3));
  // A connection to an address nobody has fails at RTR, with words.
  EXPECT_EQ(connect_qp(q3, Info{da.ip ^ 0x80, n2, 0, 0, 0, 0}, o), -ECONNREFUSED);
  EXPECT_NE(g_last_error.find("no device has that address"), std::string::npos) << g_last_error;
  // Memory of another type is refused, saying so; host memory is not CUDA
  // memory (no driver here: says so; with one: "not CUDA memory"); GPU
  // memory with REMOTE_ATOMIC is refused.
  ufab_mr_attr pmem = {sizeof pmem, kAll, a.p, 4096, UFAB_MEM_PERSISTENT, 0};
  ufab_rdma_mr* m2;
  EXPECT_EQ(P()->reg_mr(pd, &pmem, &m2, &lkey, &rkey), -EOPNOTSUPP);
  EXPECT_NE(g_last_error.find("persistent"), std::string::npos) << g_last_error;
  ufab_mr_attr cuda = {sizeof cuda, kAll, a.p, 4096, UFAB_MEM_CUDA, 0};
  EXPECT_EQ(P()->reg_mr(pd, &cuda, &m2, &lkey, &rkey), -EOPNOTSUPP);
  EXPECT_NE(g_last_error.find("REMOTE_ATOMIC: atomics on GPU memory are not supported"), std::string::npos)
      << g_last_error;
  cuda.access = UFAB_ACCESS_LOCAL_WRITE;
  EXPECT_LT(P()->reg_mr(pd, &cuda, &m2, &lkey, &rkey), 0);
  EXPECT_TRUE(g_last_error.find("no GPU") != std::string::npos ||
              g_last_error.find("not CUDA memory") != std::string::npos)
      << g_last_error;
  // RC and UD QPs (shm_ud_test); no GSI QP (the CM runs on soft-RoCE).
  ufab_rdma_qp_init gsi = init;
  gsi.qp_type = UFAB_QPT_GSI;
  ufab_rdma_qp* q4 = nullptr;
  uint32_t n4;
  EXPECT_EQ(P()->create_qp(pd, &gsi, &q4, &n4), -EOPNOTSUPP);
  EXPECT_NE(g_last_error.find("GSI"), std::string::npos) << g_last_error;
  for (auto* q : {q1, q2, q3}) EXPECT_EQ(P()->destroy_qp(q), 0);
  EXPECT_EQ(P()->destroy_cq(cq), 0);
  EXPECT_EQ(P()->dereg_mr(mr), 0);
  EXPECT_EQ(P()->dealloc_pd(pd), 0);
  P()->close_device(dev);
}

}  // namespace
}  // namespace ufab::shm_test
