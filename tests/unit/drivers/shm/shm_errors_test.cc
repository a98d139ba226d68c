// Every completion status the shm provider produces, the QPs it moves to
// ERROR, and the errors it returns at post time, as soft-RoCE does them
// (tests/unit/transport/rdma_swnic_test.cc is the reference).
#include <gtest/gtest.h>

#include <cstdlib>

#include "tests/unit/drivers/shm/pair.h"

namespace ufab::shm_test {
namespace {

constexpr uint32_t kErr = UFAB_QPS_ERR, kRts = UFAB_QPS_RTS;

// Receive too small: LOC_LEN_ERR at the receiver (the next receive flushed),
// REM_INV_REQ_ERR at the sender; both QPs in ERROR.
TEST(ShmErrors, LocalLengthError) {
  EXPECT_TRUE(run_pair("len", [](Side& s) {
    Arena a(1 << 16);
    Reg r;
    TREQUIRE(reg(s.pd, a.p, a.size, kAll, &r));
    Conn c;
    TREQUIRE(make_conn(s, c));
    if (s.parent()) {
      ufab_sge small = {a.addr(), 16, r.lkey}, big = {a.addr(4096), 4096, r.lkey};
      TREQUIRE_OK(recv1(c.qp, 0x11, &small, 1));
      TREQUIRE_OK(recv1(c.qp, 0x12, &big, 1));
      TREQUIRE(s.ch.sync("posted"));
      TCHECK(expect_wc(c.rcq, 0x11, UFAB_WC_LOC_LEN_ERR));
      TCHECK(expect_wc(c.rcq, 0x12, UFAB_WC_WR_FLUSH_ERR));
      TCHECK(wait_state(s, c.qp, kErr));
    } else {
      TREQUIRE(s.ch.sync("posted"));
      ufab_sge sge = {a.addr(), 100, r.lkey};
      TREQUIRE_OK(post1(c.qp, 0x21, UFAB_WR_SEND, &sge, 1));
      TCHECK(expect_wc(c.scq, 0x21, UFAB_WC_REM_INV_REQ_ERR));
      TCHECK_EQ(qp_state(c.qp), kErr);
    }
    TREQUIRE(s.ch.sync("done"));
    drop_conn(c);
    P()->dereg_mr(r.mr);
    return true;
  }));
}

// A bad lkey, an SGE past its region's end and an lkey of another PD:
// LOC_PROT_ERR, the sender's QP in ERROR, nothing sent (the peer stays RTS).
TEST(ShmErrors, LocalProtectionError) {
  EXPECT_TRUE(run_pair("lprot", [](Side& s) {
    Arena a(1 << 16);
    Reg r, r2;
    TREQUIRE(reg(s.pd, a.p, 1 << 15, UFAB_ACCESS_LOCAL_WRITE, &r));
    ufab_rdma_pd* pd2;
    TREQUIRE_OK(P()->alloc_pd(s.dev, &pd2));
    TREQUIRE(reg(pd2, a.p + (1 << 15), 1 << 15, UFAB_ACCESS_LOCAL_WRITE, &r2));
    Conn c[3];
    for (auto& cc : c) TREQUIRE(make_conn(s, cc));
    if (s.parent()) {
      ufab_sge bad[3] = {{a.addr(), 64, r.lkey ^ 0x5A000},
                         {a.addr((1 << 15) - 32), 64, r.lkey},
                         {a.addr(1 << 15), 64, r2.lkey}};
      for (int i = 0; i < 3; ++i) TREQUIRE_OK(post1(c[i].qp, 0x30 + i, UFAB_WR_SEND, &bad[i], 1));
      for (int i = 0; i < 3; ++i) {
        TCHECK(expect_wc(c[i].scq, 0x30 + i, UFAB_WC_LOC_PROT_ERR));
        TCHECK_EQ(qp_state(c[i].qp), kErr);
      }
      TREQUIRE(s.ch.sync("sent"));
    } else {
      for (int i = 0; i < 3; ++i) {
        ufab_sge sge = {a.addr(4096 * i), 4096, r.lkey};
        TREQUIRE_OK(recv1(c[i].qp, 0x40, &sge, 1));
      }
      TREQUIRE(s.ch.sync("sent"));
      for (auto& cc : c) {
        TCHECK(expect_none(cc.rcq, 30ms));
        TCHECK_EQ(qp_state(cc.qp), kRts);
      }
    }
    TREQUIRE(s.ch.sync("end"));
    for (auto& cc : c) drop_conn(cc);
    P()->dereg_mr(r.mr);
    P()->dereg_mr(r2.mr);
    P()->dealloc_pd(pd2);
    return true;
  }));
}

// REM_ACCESS_ERR: a wrong rkey, out of bounds, no REMOTE_WRITE, no
// REMOTE_READ, no REMOTE_ATOMIC, an rkey of another PD. Both QPs go to
// ERROR; nothing is written. A target QP without REMOTE_WRITE in its
// access flags: REM_INV_REQ_ERR (as rxe).
TEST(ShmErrors, RemoteAccessError) {
  EXPECT_TRUE(run_pair("racc", [](Side& s) {
    constexpr uint64_t kPart = 1 << 16;
    Arena a(6 * kPart);
    std::memset(a.p, 0xEE, a.size);
    Reg full, no_write, no_read, no_atomic, other_pd;
    TREQUIRE(reg(s.pd, a.p, kPart, kAll, &full));
    TREQUIRE(reg(s.pd, a.p + kPart, kPart, UFAB_ACCESS_LOCAL_WRITE | UFAB_ACCESS_REMOTE_READ, &no_write));
    TREQUIRE(reg(s.pd, a.p + 2 * kPart, kPart, UFAB_ACCESS_LOCAL_WRITE | UFAB_ACCESS_REMOTE_WRITE, &no_read));
    TREQUIRE(reg(s.pd, a.p + 3 * kPart, kPart,
                 UFAB_ACCESS_LOCAL_WRITE | UFAB_ACCESS_REMOTE_WRITE | UFAB_ACCESS_REMOTE_READ, &no_atomic));
    ufab_rdma_pd* pd2;
    TREQUIRE_OK(P()->alloc_pd(s.dev, &pd2));
    TREQUIRE(reg(pd2, a.p + 4 * kPart, kPart, kAll, &other_pd));
    struct Keys {
      uint32_t full, no_write, no_read, no_atomic, other_pd;
      uint64_t base;
    } mine{full.rkey, no_write.rkey, no_read.rkey, no_atomic.rkey, other_pd.rkey, a.addr()}, peer{};
    TREQUIRE(s.ch.exchange(mine, &peer));
    constexpr int kCases = 7;
    Conn c[kCases];
    for (int i = 0; i < kCases; ++i) {
      ConnOptions o;
      if (i == 6) o.access = UFAB_ACCESS_LOCAL_WRITE | UFAB_ACCESS_REMOTE_READ;  // the QP refuses WRITE
      TREQUIRE(make_conn(s, c[i], o));
    }
    if (s.parent()) {
      std::memset(a.p + 5 * kPart, 0x77, 4096);
      ufab_sge src = {a.addr(0), 100, full.lkey};
      ufab_sge dst = {a.addr(4096), 100, full.lkey};
      ufab_sge res = {a.addr(8192), 8, full.lkey};
      uint64_t b = peer.base;
      TREQUIRE_OK(post1(c[0].qp, 0x50, UFAB_WR_RDMA_WRITE, &src, 1, UFAB_SEND_SIGNALED, b + 64, peer.full ^ 0x3C000));
      TREQUIRE_OK(post1(c[1].qp, 0x51, UFAB_WR_RDMA_WRITE, &src, 1, UFAB_SEND_SIGNALED, b + kPart - 10, peer.full));
      TREQUIRE_OK(post1(c[2].qp, 0x52, UFAB_WR_RDMA_WRITE, &src, 1, UFAB_SEND_SIGNALED, b + kPart, peer.no_write));
      TREQUIRE_OK(post1(c[3].qp, 0x53, UFAB_WR_RDMA_READ, &dst, 1, UFAB_SEND_SIGNALED, b + 2 * kPart, peer.no_read));
      TREQUIRE_OK(post_atomic(c[4].qp, 0x54, UFAB_WR_ATOMIC_FETCH_AND_ADD, res, b + 3 * kPart, peer.no_atomic, 1, 0));
      TREQUIRE_OK(post1(c[5].qp, 0x55, UFAB_WR_RDMA_WRITE, &src, 1, UFAB_SEND_SIGNALED, b + 4 * kPart, peer.other_pd));
      TREQUIRE_OK(post1(c[6].qp, 0x56, UFAB_WR_RDMA_WRITE, &src, 1, UFAB_SEND_SIGNALED, b, peer.full));
      for (int i = 0; i < 6; ++i) {
        TCHECK(expect_wc(c[i].scq, 0x50 + i, UFAB_WC_REM_ACCESS_ERR));
        TCHECK_EQ(qp_state(c[i].qp), kErr);
      }
      TCHECK(expect_wc(c[6].scq, 0x56, UFAB_WC_REM_INV_REQ_ERR));
      TREQUIRE(s.ch.sync("done"));
    } else {
      // The atomic needs this side's progress; wait_state drives it.
      for (int i = 0; i < kCases; ++i) TCHECK_MSG(wait_state(s, c[i].qp, kErr), "responder QP " + std::to_string(i));
      TREQUIRE(s.ch.sync("done"));
      for (size_t i = 0; i < 5 * kPart; ++i) {
        if (a.p[i] != 0xEE) {
          TCHECK_MSG(false, "byte " + std::to_string(i) + " was written");
          break;
        }
      }
    }
    TREQUIRE(s.ch.sync("end"));
    for (auto& cc : c) drop_conn(cc);
    for (Reg* r : {&full, &no_write, &no_read, &no_atomic, &other_pd}) TREQUIRE_OK(P()->dereg_mr(r->mr));
    P()->dealloc_pd(pd2);
    return true;
  }));
}

// A receive with a bad lkey: LOC_PROT_ERR at the receiver, REM_OP_ERR at the
// sender; both in ERROR. A misaligned atomic: REM_INV_REQ_ERR, target untouched.
TEST(ShmErrors, RemoteOperationalAndInvalidRequest) {
  EXPECT_TRUE(run_pair("rop", [](Side& s) {
    Arena a(1 << 16);
    Reg r;
    TREQUIRE(reg(s.pd, a.p, a.size, kAll, &r));
    auto* w = reinterpret_cast<uint64_t*>(a.p + 8192);
    w[0] = 1;
    w[1] = 2;
    Conn c, d;
    ConnOptions o;
    o.advertise = {0, 0, 0, r.rkey, a.addr(), a.size};
    TREQUIRE(make_conn(s, c, o));
    TREQUIRE(make_conn(s, d, o));
    if (!s.parent()) {
      ufab_sge bad = {a.addr(), 4096, r.lkey ^ 0x5A000};
      TREQUIRE_OK(recv1(c.qp, 0x65, &bad, 1));
      TREQUIRE(s.ch.sync("posted"));
      TCHECK(expect_wc(c.rcq, 0x65, UFAB_WC_LOC_PROT_ERR));
      TCHECK_EQ(qp_state(c.qp), kErr);
      TREQUIRE(s.ch.sync("atomic"));
      TCHECK(wait_state(s, d.qp, kErr));
      TCHECK_EQ(w[0], 1ull);
      TCHECK_EQ(w[1], 2ull);
    } else {
      TREQUIRE(s.ch.sync("posted"));
      ufab_sge sge = {a.addr(), 100, r.lkey};
      TREQUIRE_OK(post1(c.qp, 0x66, UFAB_WR_SEND, &sge, 1));
      TCHECK(expect_wc(c.scq, 0x66, UFAB_WC_REM_OP_ERR));
      ufab_sge res = {a.addr(4096), 8, r.lkey};
      TREQUIRE_OK(post_atomic(d.qp, 0x60, UFAB_WR_ATOMIC_CMP_AND_SWP, res, c.peer.vaddr + 8192 + 4, c.peer.rkey, 1, 9));
      // The target's progress answers the atomic.
      TREQUIRE(s.ch.sync("atomic"));
      TCHECK(expect_wc(d.scq, 0x60, UFAB_WC_REM_INV_REQ_ERR));
      TCHECK_EQ(qp_state(d.qp), kErr);
    }
    TREQUIRE(s.ch.sync("end"));
    drop_conn(c);
    drop_conn(d);
    P()->dereg_mr(r.mr);
    return true;
  }));
}

// WR_FLUSH_ERR: work behind a failed request (unsignaled included), the
// receives of a QP that went to ERROR, posts in ERROR, modify(ERROR).
TEST(ShmErrors, WorkRequestFlushed) {
  EXPECT_TRUE(run_pair("flush", [](Side& s) {
    Arena a(1 << 16);
    Reg r;
    TREQUIRE(reg(s.pd, a.p, a.size, kAll, &r));
    Conn c, m;
    ConnOptions o;
    o.advertise = {0, 0, 0, r.rkey, a.addr(), a.size};
    TREQUIRE(make_conn(s, c, o));
    TREQUIRE(make_conn(s, m, o));
    if (s.parent()) {
      ufab_sge r0 = {a.addr(0), 1024, r.lkey}, r1 = {a.addr(1024), 1024, r.lkey};
      TREQUIRE_OK(recv1(c.qp, 0x90, &r0, 1));
      TREQUIRE_OK(recv1(c.qp, 0x91, &r1, 1));
      ufab_sge bad = {a.addr(4096), 64, r.lkey ^ 0x11000}, good = {a.addr(4096), 64, r.lkey};
      TREQUIRE_OK(post1(c.qp, 0xA0, UFAB_WR_SEND, &bad, 1));
      TREQUIRE_OK(post1(c.qp, 0xA1, UFAB_WR_SEND, &good, 1));
      TREQUIRE_OK(post1(c.qp, 0xA2, UFAB_WR_RDMA_WRITE, &good, 1, UFAB_SEND_SIGNALED, c.peer.vaddr, c.peer.rkey));
      TREQUIRE_OK(post1(c.qp, 0xA3, UFAB_WR_SEND, &good, 1, 0));
      TCHECK(expect_wc(c.scq, 0xA0, UFAB_WC_LOC_PROT_ERR));
      for (int i = 1; i < 4; ++i) TCHECK(expect_wc(c.scq, 0xA0 + i, UFAB_WC_WR_FLUSH_ERR));
      TCHECK(expect_wc(c.rcq, 0x90, UFAB_WC_WR_FLUSH_ERR));
      TCHECK(expect_wc(c.rcq, 0x91, UFAB_WC_WR_FLUSH_ERR));
      TCHECK_EQ(qp_state(c.qp), kErr);
      // Posted in ERROR: accepted, flushed.
      TCHECK_EQ(post1(c.qp, 0xA4, UFAB_WR_SEND, &good, 1), 0);
      TCHECK_EQ(recv1(c.qp, 0x92, &r0, 1), 0);
      TCHECK(expect_wc(c.scq, 0xA4, UFAB_WC_WR_FLUSH_ERR));
      TCHECK(expect_wc(c.rcq, 0x92, UFAB_WC_WR_FLUSH_ERR));
      // modify(ERROR) flushes the receives that wait; attributes besides the state are refused.
      TREQUIRE_OK(recv1(m.qp, 0x93, &r0, 1));
      TREQUIRE_OK(recv1(m.qp, 0x94, &r1, 1));
      ufab_qp_attr e = {};
      e.state = UFAB_QPS_ERR;
      TCHECK_EQ(P()->modify_qp(m.qp, &e, UFAB_QP_STATE | UFAB_QP_TIMEOUT), -EINVAL);
      TREQUIRE_OK(P()->modify_qp(m.qp, &e, UFAB_QP_STATE));
      TCHECK_EQ(qp_state(m.qp), kErr);
      TCHECK(expect_wc(m.rcq, 0x93, UFAB_WC_WR_FLUSH_ERR));
      TCHECK(expect_wc(m.rcq, 0x94, UFAB_WC_WR_FLUSH_ERR));
      TCHECK(expect_none(c.scq, 20ms));
    }
    TREQUIRE(s.ch.sync("done"));
    if (!s.parent()) {
      TCHECK(expect_none(c.rcq, 20ms));
      TCHECK_EQ(qp_state(c.qp), kRts);
      // A SEND to the QP the parent moved to ERROR: RETRY_EXC_ERR (soft-RoCE
      // times out to the same status).
      ufab_sge g = {a.addr(8192), 64, r.lkey};
      TREQUIRE_OK(post1(m.qp, 0xA5, UFAB_WR_SEND, &g, 1));
      TREQUIRE_OK(post1(m.qp, 0xA6, UFAB_WR_SEND, &g, 1));
      TCHECK(expect_wc(m.scq, 0xA5, UFAB_WC_RETRY_EXC_ERR));
      TCHECK(expect_wc(m.scq, 0xA6, UFAB_WC_WR_FLUSH_ERR));
    } else {
      drive_for(s, 300ms);
    }
    TREQUIRE(s.ch.sync("end"));
    drop_conn(c);
    drop_conn(m);
    P()->dereg_mr(r.mr);
    return true;
  }));
}

// A CQ of depth 4 given 8 completions: poll says EOVERFLOW once, the QP goes
// to ERROR, the 4 that fitted come out, anything later is a flush.
TEST(ShmErrors, CqOverflow) {
  EXPECT_TRUE(run_pair("ovf", [](Side& s) {
    Arena a(1 << 16);
    Reg r;
    TREQUIRE(reg(s.pd, a.p, a.size, kAll, &r));
    Conn c;
    ConnOptions o;
    o.cq_depth = 4;
    o.advertise = {0, 0, 0, r.rkey, a.addr(), a.size};
    TREQUIRE(make_conn(s, c, o));
    if (s.parent()) {
      ufab_sge sge = {a.addr(), 64, r.lkey};
      for (uint32_t i = 0; i < 8; ++i)
        TREQUIRE_OK(post1(c.qp, 0xB0 + i, UFAB_WR_RDMA_WRITE, &sge, 1, UFAB_SEND_SIGNALED, c.peer.vaddr + 64 * i,
                          c.peer.rkey));
      TCHECK(wait_state(s, c.qp, kErr));
      ufab_wc wc[16];
      TCHECK_EQ(P()->poll_cq(c.scq, wc, 16), -EOVERFLOW);
      TCHECK(g_last_error.find("deeper CQ") != std::string::npos);
      int n = P()->poll_cq(c.scq, wc, 16);
      TCHECK_EQ(n, 4);
      for (int i = 0; i < n; ++i) {
        TCHECK_EQ(wc[i].wr_id, 0xB0ull + i);
        TCHECK_EQ(wc[i].status, static_cast<uint32_t>(UFAB_WC_SUCCESS));
      }
      n = P()->poll_cq(c.scq, wc, 16);
      for (int i = 0; i < n; ++i) TCHECK_EQ(wc[i].status, static_cast<uint32_t>(UFAB_WC_WR_FLUSH_ERR));
    }
    TREQUIRE(s.ch.sync("done"));
    drop_conn(c);
    P()->dereg_mr(r.mr);
    return true;
  }));
}

// RNR: rnr_retry 0 and no receive: RNR_RETRY_EXC_ERR at once, the responder
// stays RTS. rnr_retry 1: two RNR NAKs. rnr_retry 7 (forever) with a receive
// posted 100 ms late: success.
TEST(ShmErrors, ReceiverNotReady) {
  EXPECT_TRUE(run_pair("rnr", [](Side& s) {
    Arena a(1 << 16);
    Reg r;
    TREQUIRE(reg(s.pd, a.p, a.size, kAll, &r));
    Conn c0, c1, late;
    ConnOptions o;
    o.rnr_retry = 0;
    TREQUIRE(make_conn(s, c0, o));
    o.rnr_retry = 1;
    TREQUIRE(make_conn(s, c1, o));
    o.rnr_retry = 7;
    o.min_rnr_timer = 14;  // 1.28 ms
    TREQUIRE(make_conn(s, late, o));
    if (s.parent()) {
      ufab_sge sge = {a.addr(), 64, r.lkey};
      TREQUIRE_OK(post1(c0.qp, 0x80, UFAB_WR_SEND, &sge, 1));
      TREQUIRE_OK(post1(c0.qp, 0x81, UFAB_WR_SEND, &sge, 1));
      TCHECK(expect_wc(c0.scq, 0x80, UFAB_WC_RNR_RETRY_EXC_ERR));
      TCHECK(expect_wc(c0.scq, 0x81, UFAB_WC_WR_FLUSH_ERR));
      TCHECK_EQ(qp_state(c0.qp), kErr);
      ufab_device_stats st0 = {};
      P()->device_stats(s.dev, &st0);
      TREQUIRE_OK(post1(c1.qp, 0x82, UFAB_WR_SEND, &sge, 1));
      TCHECK(expect_wc(c1.scq, 0x82, UFAB_WC_RNR_RETRY_EXC_ERR));
      ufab_device_stats st1 = {};
      P()->device_stats(s.dev, &st1);
      TCHECK_EQ(st1.rnr_naks_received - st0.rnr_naks_received, 2ull);
      TREQUIRE(s.ch.sync("first done"));
      fill_pattern(a.p, 64, 5);
      auto t0 = Clock::now();
      TREQUIRE_OK(post1(late.qp, 0x83, UFAB_WR_SEND, &sge, 1));
      TCHECK(expect_wc(late.scq, 0x83, UFAB_WC_SUCCESS, UFAB_WC_SEND));
      TCHECK(Clock::now() - t0 >= 90ms);
      TREQUIRE(s.ch.sync("second done"));
    } else {
      // Progress while the parent's sends meet no receive.
      auto until = Clock::now() + 10s;
      while (Clock::now() < until) {
        P()->progress(s.dev);
        ufab_device_stats st = {};
        P()->device_stats(s.dev, &st);
        if (st.rnr_naks_sent >= 3) break;
      }
      TREQUIRE(s.ch.sync("first done"));
      TCHECK_EQ(qp_state(c0.qp), kRts);
      TCHECK_EQ(qp_state(c1.qp), kRts);
      TCHECK(expect_none(c0.rcq, 10ms));
      drive_for(s, 100ms);
      ufab_sge sge = {a.addr(4096), 64, r.lkey};
      TREQUIRE_OK(recv1(late.qp, 0x84, &sge, 1));
      ufab_wc wc;
      TCHECK(expect_wc(late.rcq, 0x84, UFAB_WC_SUCCESS, UFAB_WC_RECV, 10s, &wc));
      TCHECK(check_pattern(a.p + 4096, 64, 5));
      TREQUIRE(s.ch.sync("second done"));
    }
    drop_conn(c0);
    drop_conn(c1);
    drop_conn(late);
    P()->dereg_mr(r.mr);
    return true;
  }));
}

// Errors at post time fail the call, queue nothing and explain themselves.
TEST(ShmErrors, PostTimeErrors) {
  EXPECT_TRUE(run_pair("post", [](Side& s) {
    Arena a(1 << 16);
    Reg r;
    TREQUIRE(reg(s.pd, a.p, a.size, kAll, &r));
    Conn c;
    ConnOptions o;
    o.cap = {8, 8, 4, 4, 256};
    o.connect = false;
    o.advertise = {0, 0, 0, r.rkey, a.addr(), a.size};
    TREQUIRE(make_conn(s, c, o));
    ufab_sge sge = {a.addr(), 64, r.lkey};
    auto fails = [&](int rc, const char* what) {
      TCHECK_MSG(rc < 0, std::string(what) + " was accepted");
      TCHECK_MSG(!g_last_error.empty(), std::string(what) + ": no words");
      std::fprintf(stderr, "[%s] %s: %d: %s\n", g_who, what, rc, g_last_error.c_str());
      g_last_error.clear();
    };
    if (s.parent()) {
      fails(post1(c.qp, 1, UFAB_WR_SEND, &sge, 1), "post_send in RESET");
      fails(recv1(c.qp, 2, &sge, 1), "post_recv in RESET");
      ufab_qp_attr at = {};
      at.state = UFAB_QPS_RTS;
      fails(P()->modify_qp(c.qp, &at, UFAB_QP_STATE), "RESET -> RTS");
      at.state = UFAB_QPS_INIT;
      at.port = 1;
      fails(P()->modify_qp(c.qp, &at, UFAB_QP_STATE | UFAB_QP_PORT), "RESET -> INIT without access_flags");
      TREQUIRE_OK(P()->modify_qp(c.qp, &at, UFAB_QP_STATE | UFAB_QP_PORT | UFAB_QP_PKEY_INDEX | UFAB_QP_ACCESS_FLAGS));
      fails(post1(c.qp, 3, UFAB_WR_SEND, &sge, 1), "post_send in INIT");
      TREQUIRE_OK(recv1(c.qp, 4, &sge, 1));  // receives from INIT on
    }
    if (!s.parent()) TREQUIRE_OK(connect_qp(c.qp, c.peer, o));
    TREQUIRE(s.ch.sync("child connected"));
    if (s.parent()) {
      TREQUIRE_OK(connect_qp(c.qp, c.peer, o));
      TCHECK_EQ(qp_state(c.qp), kRts);
      ufab_qp_attr q = {};
      TREQUIRE_OK(P()->query_qp(c.qp, &q));
      TCHECK_EQ(q.dest_qpn, c.peer.qpn);
      TCHECK_EQ(q.av.dest_ip, c.peer.addr);
      ufab_sge five[5] = {sge, sge, sge, sge, sge};
      fails(post1(c.qp, 5, UFAB_WR_SEND, five, 5), "5 SGEs, max_send_sge 4");
      fails(recv1(c.qp, 6, five, 5), "post_recv with 5 SGEs");
      std::vector<uint8_t> big(257, 1);
      ufab_sge inl = {reinterpret_cast<uint64_t>(big.data()), 257, 0};
      fails(post1(c.qp, 7, UFAB_WR_SEND, &inl, 1, UFAB_SEND_SIGNALED | UFAB_SEND_INLINE), "inline of 257, max 256");
      fails(post1(c.qp, 8, 42, &sge, 1), "opcode 42");
      ufab_sge four = {a.addr(), 4, r.lkey};
      fails(post_atomic(c.qp, 9, UFAB_WR_ATOMIC_FETCH_AND_ADD, four, c.peer.vaddr, c.peer.rkey, 1, 0),
            "atomic with a 4-byte result");
      // Queue full: SENDs the peer does not answer (it does not progress).
      for (uint64_t i = 0; i < 8; ++i) TREQUIRE_OK(post1(c.qp, 0xE0 + i, UFAB_WR_SEND, &sge, 1));
      int rc = post1(c.qp, 0xEF, UFAB_WR_SEND, &sge, 1);
      TCHECK_EQ(rc, -ENOMEM);
      fails(rc, "send queue full");
      for (uint64_t i = 0; i < 7; ++i) TREQUIRE_OK(recv1(c.qp, 0xF0 + i, &sge, 1));
      rc = recv1(c.qp, 0xFF, &sge, 1);
      TCHECK_EQ(rc, -ENOMEM);
      fails(rc, "receive queue full");
      TCHECK(expect_none(c.scq, 10ms));
    }
    TREQUIRE(s.ch.sync("go"));
    if (s.parent()) {
      for (uint64_t i = 0; i < 8; ++i) TCHECK(expect_wc(c.scq, 0xE0 + i, UFAB_WC_SUCCESS, UFAB_WC_SEND));
      TCHECK(expect_none(c.scq, 10ms));
    } else {
      ufab_sge big = {a.addr(), 4096, r.lkey};
      for (uint64_t i = 0; i < 8; ++i) TREQUIRE_OK(recv1(c.qp, 0xD0 + i, &big, 1));
      for (uint64_t i = 0; i < 8; ++i) TCHECK(expect_wc(c.rcq, 0xD0 + i, UFAB_WC_SUCCESS, UFAB_WC_RECV));
      TCHECK(expect_none(c.rcq, 10ms));  // the failed posts sent nothing
    }
    TREQUIRE(s.ch.sync("end"));
    drop_conn(c);
    P()->dereg_mr(r.mr);
    return true;
  }));
}

}  // namespace
}  // namespace ufab::shm_test
