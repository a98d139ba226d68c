// soft-RoCE over the software NIC, the scenarios only RoCE has, with the two
// ends in two processes: port 0 in the test process (gtest's assertions),
// port 1 in a forked child that reports its failures through a socketpair
// and its exit status.
//
// Covered here: RETRY_EXC_ERR from the transport's own ACK timeouts and
// retransmissions (a peer closed, killed, never answering ARP, dropping
// everything, or our own port dropping everything), with the exact count of
// timeouts and retransmissions; and an RNR wait longer than the ACK timeout,
// which must not count as a transport retry.
//
// Every scenario that is not RoCE's own (every operation and size, many
// QPs, CQ waits, the completion errors, flushes, CQ overflow, post-time
// errors, the QP state machine, a killed peer) is written once in
// tests/unit/provider/conformance_test.cc and runs there against soft-RoCE
// over swnic and against shm. Loss, reordering and duplication:
// rdma_faults_test.
//
// Every wait has a deadline. The two processes, their control channel and
// the checks that work in both: two_process.h.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include "ufab/rdma.hpp"
#include "tests/unit/transport/two_process.h"

namespace ufab::rdma_swnic_test {
namespace {

using namespace ::ufab::two_process;

// ===========================================================================
// Completion errors that come from RoCE's timers.

// RETRY_EXC_ERR: timeout 8 (~1 ms), retry_cnt 2; the parent is the sender.
enum class Gone {
  kPeerClosed,        // the peer closed its device and exited after one exchange
  kPeerKilled,        // the peer was SIGKILLed after one exchange (its port still marked present)
  kPeerNeverAnswered, // the peer closed before any exchange: ARP is never answered
  kPeerDrops,         // the peer's port drops everything it sends (loss=1.0): no ARP reply, no ACK
  kOwnPortDrops,      // our port drops everything it sends (loss=1.0); the peer's MAC is known
                      // from an ARP request it sent, so the transport's own timeouts run out
};

void retry_exceeded(Gone mode) {
  PairOptions o;
  if (mode == Gone::kPeerKilled) o.child_may_die = true;
  if (mode == Gone::kPeerDrops) o.params[1] = {{"loss", "1.0"}};
  if (mode == Gone::kOwnPortDrops) o.params[0] = {{"loss", "1.0"}};
  run_pair(o, [mode](Side& s) {
    Arena arena(1 << 16);
    auto mr = register_arena(s, arena, rdma::kLocalWrite);
    TREQUIRE(mr);
    Conn c, arp, w;
    ConnOptions co;
    co.tuning.timeout = 8;
    co.tuning.retry_cnt = 2;
    TREQUIRE(make_conn(s, c, co));
    const bool warm = mode == Gone::kPeerClosed || mode == Gone::kPeerKilled;
    const bool peer_goes = warm || mode == Gone::kPeerNeverAnswered;
    if (mode == Gone::kOwnPortDrops) TREQUIRE(make_conn(s, arp, co));
    // The warm-up QP has the default timeout (67 ms) and infinite retries,
    // so a loaded machine cannot fail it; ARP is per device.
    if (warm) TREQUIRE(make_conn(s, w));
    if (s.parent()) {
      if (warm) {
        // One SEND: ARP resolved, the QPs work.
        TREQUIRE(s.sync("warm-up receive posted"));
        Sge sge = mr->sge(0, 100);
        TREQUIRE_OK(post_send(*w.qp, 0x6F, WrOpcode::kSend, one(sge)));
        TREQUIRE(expect_one(*w.scq, {.wr_id = 0x6F, .opcode = WcOpcode::kSend}));
      }
      if (peer_goes) {
        TREQUIRE(s.sync("going"));
        TCHECK_MSG(s.ch.wait_eof(Clock::now() + 10s, nullptr), "the child did not go away");
      } else {
        TREQUIRE(s.sync("posted"));
      }
      fill_pattern(arena.p, 2000, 0x99);
      Sge sge = mr->sge(0, 2000);
      auto before = s.dev->stats();
      auto t0 = Clock::now();
      TREQUIRE_OK(post_send(*c.qp, 0x70, WrOpcode::kSend, one(sge)));
      auto wc = expect_one(*c.scq, {.wr_id = 0x70, .status = WcStatus::kRetryExcErr, .qp_num = c.qp->qp_num()}, 10s);
      double ms = ms_since(t0);
      TREQUIRE(wc);
      TCHECK(wait_state(*s.dev, *c.qp, QpState::kError));
      auto st = s.dev->stats();
      uint64_t timeouts = st.timeouts - before.timeouts, retransmits = st.retransmits - before.retransmits;
      std::fprintf(stderr, "RETRY_EXC_ERR (mode %d) after %.1f ms: %llu timeouts, %llu retransmits: %s\n",
                   static_cast<int>(mode), ms, static_cast<unsigned long long>(timeouts),
                   static_cast<unsigned long long>(retransmits), wc->error.c_str());
      if (warm || mode == Gone::kOwnPortDrops) {
        // The transport's own retries: retry_cnt 2 = 3 timeouts, 2
        // retransmissions of the first packet of the 2000-byte SEND (after
        // a timeout the window is one packet until an ACK comes back).
        TCHECK_EQ(timeouts, 3ull);
        TCHECK_EQ(retransmits, 2ull);
        TCHECK_MSG(ms < 1000, "took " + std::to_string(ms) + " ms with a ~1 ms timeout");
      }
      if (!peer_goes) TREQUIRE(s.sync("done"));
    } else {
      if (peer_goes) {
        if (warm) {
          Sge sge = mr->sge(0, 4096);
          TREQUIRE_OK(post_recv(*w.qp, 0x6E, one(sge)));
          TREQUIRE(s.sync("warm-up receive posted"));
          TREQUIRE(expect_one(*w.rcq, {.wr_id = 0x6E, .opcode = WcOpcode::kRecv, .byte_len = 100}));
        }
        TREQUIRE(s.sync("going"));
        if (mode == Gone::kPeerKilled) ::kill(::getpid(), SIGKILL);
        return true;  // closes the device and exits
      }
      Sge sge = mr->sge(0, 4096);
      TREQUIRE_OK(post_recv(*c.qp, 0x71, one(sge)));
      if (mode == Gone::kOwnPortDrops) {
        // A SEND towards the parent makes us ARP for it: the parent learns
        // our MAC from the request. (Our SEND fails: the parent's ARP
        // replies are lost.)
        Sge a = mr->sge(8192, 8);
        TREQUIRE_OK(post_send(*arp.qp, 0x72, WrOpcode::kSend, one(a)));
        drive_for(*s.dev, 20ms);
      }
      TREQUIRE(s.sync("posted"));
      TREQUIRE(s.sync("done", 30s));
      // Nothing came: the parent could not resolve our MAC (kPeerDrops), or
      // everything it sent was dropped (kOwnPortDrops).
      expect_none(*c.rcq, 20ms);
    }
    return true;
  });
}

TEST(RdmaSwnicErrors, RetryExceededPeerClosed) { retry_exceeded(Gone::kPeerClosed); }
TEST(RdmaSwnicErrors, RetryExceededPeerKilled) { retry_exceeded(Gone::kPeerKilled); }
TEST(RdmaSwnicErrors, RetryExceededPeerNeverAnsweredArp) { retry_exceeded(Gone::kPeerNeverAnswered); }
TEST(RdmaSwnicErrors, RetryExceededPeerDropsEverything) { retry_exceeded(Gone::kPeerDrops); }
TEST(RdmaSwnicErrors, RetryExceededOwnPortDropsEverything) { retry_exceeded(Gone::kOwnPortDrops); }

// An RNR wait longer than the ACK timeout is not a transport timeout:
// timeout 10 (4.2 ms), retry_cnt 2, rnr_retry 7 (infinite), the responder's
// RNR timer 18 (5.12 ms) and its receive posted 40 ms late: success.
TEST(RdmaSwnicErrors, RnrWaitLongerThanAckTimeoutIsNoRetry) {
  ConnOptions o;
  o.tuning.timeout = 10;
  o.tuning.retry_cnt = 2;
  o.tuning.rnr_retry = 7;
  o.tuning.min_rnr_timer = 18;
  run_pair({}, connected([](Side& s, Arena&, MemoryRegion& mr, Conn& c) {
    if (s.parent()) {
      Sge sge = mr.sge(0, 64);
      TREQUIRE_OK(post_send(*c.qp, 0x85, WrOpcode::kSend, one(sge)));
      TREQUIRE(expect_one(*c.scq, {.wr_id = 0x85, .opcode = WcOpcode::kSend}, 10s));
      auto st = s.dev->stats();
      std::fprintf(stderr, "RNR wait: %llu RNR NAKs, %llu timeouts\n",
                   static_cast<unsigned long long>(st.rnr_naks_received), static_cast<unsigned long long>(st.timeouts));
      TREQUIRE(s.sync("done"));
    } else {
      drive_for(*s.dev, 40ms);
      Sge sge = mr.sge(0, 64);
      TREQUIRE_OK(post_recv(*c.qp, 0x86, one(sge)));
      TREQUIRE(expect_one(*c.rcq, {.wr_id = 0x86, .opcode = WcOpcode::kRecv, .byte_len = 64}, 10s));
      TREQUIRE(s.sync("done"));
    }
    return true;
  }, o));
}

}  // namespace
}  // namespace ufab::rdma_swnic_test
