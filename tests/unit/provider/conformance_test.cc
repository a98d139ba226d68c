// One conformance suite for every RDMA provider: the same scenarios, with
// the same expected results, run against soft-RoCE over swnic and against
// the shared-memory provider (drivers/shm), each with its two ends in two
// processes (tests/unit/transport/two_process.h: end 0 in the test process,
// end 1 in a forked child that reports its failures through a socketpair).
// Each end opens its device by name: "swnic:LINK:0/1" with an ip per port,
// or "shm:DOMAIN", a new LINK or DOMAIN per run.
//
// Covered, for each provider: every operation (SEND and SEND_WITH_IMM,
// RDMA_WRITE and WRITE_WITH_IMM, RDMA_READ, CMP_AND_SWP and FETCH_AND_ADD)
// in both directions, sizes 0 B .. 1 MiB checked byte for byte with guard
// bytes; inline sends; gather and scatter; unsignaled sends; post lists;
// 256 QP pairs at once; blocking CQ waits (with and without a progress
// thread) and the CQ's event fd; every completion status a peer can provoke
// (LOC_LEN_ERR + REM_INV_REQ_ERR, LOC_PROT_ERR, REM_ACCESS_ERR for a bad
// rkey, out of bounds and each missing right, REM_OP_ERR, a misaligned
// atomic, RNR_RETRY_EXC_ERR with rnr_retry 0 and 1, WR_FLUSH_ERR) with the
// QP states afterwards; CQ overflow; post-time errors; the QP state machine
// (each modify error names the attribute); and a peer SIGKILLed in the
// middle of a stream, with nothing leaked afterwards.
//
// Where the providers legitimately differ, Traits below says so, in one
// place, with the reason; the scenarios read it and check the provider's
// own behaviour instead of skipping. RoCE-only scenarios (ACK timeouts and
// retransmission counts, ARP, loss and reordering, UD traffic) stay in
// tests/unit/transport (rdma_swnic_test, rdma_faults_test).
//
// Every wait has a deadline.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <source_location>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "tests/unit/transport/two_process.h"
#include "ufab/rdma.h"
#include "ufab/rdma.hpp"

namespace ufab::provider_conformance_test {
namespace {

using namespace ::ufab::two_process;

// ===========================================================================
// Where the providers differ, and why. Everything not listed here is
// expected to behave identically.

struct Traits {
  const char* provider;  // Device::provider()
  // The path MTU QPs get. soft-RoCE: rxe's 1024 on swnic's 1500-byte link.
  // shm: no wire and no packets, so the largest verbs MTU, 4096.
  uint32_t active_mtu;
  // UD QPs and address handles. soft-RoCE and shm have both (a provider
  // without them fails creating either with EOPNOTSUPP). An address handle
  // names a peer: soft-RoCE's an IPv4 address (not its own), shm's a device
  // of the domain (its own too).
  bool ud;
  // Whether a QP notices by itself that its peer is gone. soft-RoCE: no; a
  // peer that closed, died or destroyed its QP is silence on the wire, seen
  // only when a request's ACK timeout runs out retry_cnt times: the request
  // in flight gets RETRY_EXC_ERR, and an idle QP stays in RTS. shm: yes, for
  // a peer whose device closed or whose process died (its socket closes):
  // the request in flight gets RETRY_EXC_ERR, and a QP with nothing in
  // flight goes to ERROR at once, its queued requests only flushed (a WRITE
  // completes at post time there, so a WRITE stream often has nothing in
  // flight). A destroyed peer QP is noticed by a request on both.
  bool notices_peer_death;
};

constexpr Traits kSoftRoce{.provider = "soft-roce", .active_mtu = 1024, .ud = true, .notices_peer_death = false};
constexpr Traits kShm{.provider = "shm", .active_mtu = 4096, .ud = true, .notices_peer_death = true};

// Differences that need no per-provider expectation, only scenarios that
// hold for both:
//  - shm runs a WRITE or READ itself at post time (a cross-process copy),
//    without the peer's progress; soft-RoCE needs the peer to answer. So the
//    queue-full check (PostTimeErrors) fills the send queue with SENDs,
//    which wait for the silent peer on both.
//  - shm has no packets: the PSN-wrap run (sq_psn just below 2^24, wrapping
//    inside the first 1 MiB SEND on soft-RoCE) exercises connecting by hand
//    there; its PSNs only advance per message in query().

const Traits& traits(Provider p) { return p == Provider::kShm ? kShm : kSoftRoce; }
const Traits& traits(const Side& s) { return traits(s.provider); }

class Conformance : public ::testing::TestWithParam<Provider> {
 protected:
  // Every run also checks that it leaks no fd and nothing in /dev/shm.
  PairOptions opts() const {
    PairOptions o;
    o.provider = GetParam();
    o.leak_check = true;
    return o;
  }
};

// ===========================================================================
// 1. Every operation, both directions.

// 1023 .. 1025 and 2048 straddle soft-RoCE's 1024-byte packets and shm's
// 1024-byte in-ring SEND limit; 65537 leaves a 1-byte last packet.
constexpr uint32_t kSizes[] = {0, 1, 1023, 1024, 1025, 2048, 4095, 4096, 65536, 65537, 1u << 20};
constexpr size_t kNumSizes = std::size(kSizes);
constexpr uint64_t kGuard = 64;  // bytes after each slot that must stay untouched

constexpr uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
constexpr uint64_t slot_offset(size_t i) {
  uint64_t off = 0;
  for (size_t j = 0; j < i; ++j) off += round_up(kSizes[j] + kGuard, 4096);
  return off;
}
constexpr uint64_t kAreaA = 0;          // SEND source / receive buffers / WRITE target / READ destination
constexpr uint64_t kAreaB = 2u << 20;   // READ source
constexpr uint64_t kAtomics = 4u << 20; // atomic targets
constexpr uint64_t kScratch = 5u << 20; // atomics' results, gather/scatter pieces, inline
constexpr uint64_t kArenaSize = 8u << 20;
static_assert(slot_offset(kNumSizes) <= kAreaB - kAreaA);

struct OpsCtx {
  Side& s;
  Arena& arena;
  MemoryRegion& mr;
  Conn& c;
  bool requester;  // this end issues the requests of this round
  uint64_t dir;    // 0: port 0 requests, 1: port 1 requests (part of every pattern seed)

  QueuePair& qp() { return *c.qp; }
  uint64_t remote(uint64_t off) const { return c.peer.addr + off; }
  uint64_t seed(uint64_t op, uint64_t size) const { return (dir << 60) | (op << 40) | size; }
};

bool phase_send(OpsCtx& x, bool with_imm) {
  const std::string name = with_imm ? "SEND_WITH_IMM" : "SEND";
  const uint64_t op = with_imm ? 2 : 1;
  uint8_t* a = x.arena.p + kAreaA;
  if (!x.requester) {
    std::memset(a, 0xEE, slot_offset(kNumSizes));
    for (size_t i = 0; i < kNumSizes; ++i) {
      // The buffer is larger than the message: byte_len says how much came.
      Sge sge = x.mr.sge(kAreaA + slot_offset(i), static_cast<uint32_t>(kSizes[i] + kGuard));
      TREQUIRE_OK(post_recv(x.qp(), 0x100 + i, one(sge)));
    }
  }
  TREQUIRE(x.s.sync(name + " receives posted"));
  if (x.requester) {
    for (size_t i = 0; i < kNumSizes; ++i) fill_pattern(a + slot_offset(i), kSizes[i], x.seed(op, kSizes[i]));
    for (size_t i = 0; i < kNumSizes; ++i) {
      Sge sge = x.mr.sge(kAreaA + slot_offset(i), kSizes[i]);
      std::span<const Sge> sgl = kSizes[i] ? one(sge) : std::span<const Sge>();
      TREQUIRE_OK(post_send(x.qp(), 0x200 + i, with_imm ? WrOpcode::kSendWithImm : WrOpcode::kSend, sgl,
                            rdma::kSendSignaled, 0, 0, 0xC0DE0000u + static_cast<uint32_t>(i)));
    }
    auto wcs = poll_n(*x.c.scq, kNumSizes);
    TREQUIRE(wcs.size() == kNumSizes);
    for (size_t i = 0; i < kNumSizes; ++i)
      expect_wc(wcs[i], {.wr_id = 0x200 + i, .opcode = WcOpcode::kSend, .qp_num = x.qp().qp_num()});
  } else {
    auto wcs = poll_n(*x.c.rcq, kNumSizes);
    TREQUIRE(wcs.size() == kNumSizes);
    for (size_t i = 0; i < kNumSizes; ++i) {
      WcExpect e{.wr_id = 0x100 + i, .opcode = WcOpcode::kRecv, .byte_len = kSizes[i], .qp_num = x.qp().qp_num()};
      if (with_imm)
        e.imm = 0xC0DE0000u + static_cast<uint32_t>(i);
      else
        e.no_imm = true;
      expect_wc(wcs[i], e);
      TCHECK_PATTERN(a + slot_offset(i), kSizes[i], x.seed(op, kSizes[i]), 0);
      TCHECK_BYTES(a + slot_offset(i) + kSizes[i], kGuard, 0xEE);
    }
  }
  TREQUIRE(x.s.sync(name + " done"));
  return true;
}

bool phase_write(OpsCtx& x, bool with_imm) {
  const std::string name = with_imm ? "RDMA_WRITE_WITH_IMM" : "RDMA_WRITE";
  const uint64_t op = with_imm ? 4 : 3;
  uint8_t* a = x.arena.p + kAreaA;
  if (!x.requester) {
    std::memset(a, 0xEE, slot_offset(kNumSizes));
    if (with_imm)
      for (size_t i = 0; i < kNumSizes; ++i) TREQUIRE_OK(post_recv(x.qp(), 0x300 + i, {}));
  }
  TREQUIRE(x.s.sync(name + " ready"));
  if (x.requester) {
    for (size_t i = 0; i < kNumSizes; ++i) fill_pattern(a + slot_offset(i), kSizes[i], x.seed(op, kSizes[i]));
    for (size_t i = 0; i < kNumSizes; ++i) {
      Sge sge = x.mr.sge(kAreaA + slot_offset(i), kSizes[i]);
      std::span<const Sge> sgl = kSizes[i] ? one(sge) : std::span<const Sge>();
      TREQUIRE_OK(post_send(x.qp(), 0x400 + i, with_imm ? WrOpcode::kRdmaWriteWithImm : WrOpcode::kRdmaWrite, sgl,
                            rdma::kSendSignaled, x.remote(kAreaA + slot_offset(i)), x.c.peer.rkey,
                            0xBEEF0000u + static_cast<uint32_t>(i)));
    }
    auto wcs = poll_n(*x.c.scq, kNumSizes);
    TREQUIRE(wcs.size() == kNumSizes);
    for (size_t i = 0; i < kNumSizes; ++i)
      expect_wc(wcs[i], {.wr_id = 0x400 + i, .opcode = WcOpcode::kRdmaWrite, .qp_num = x.qp().qp_num()});
  } else if (with_imm) {
    auto wcs = poll_n(*x.c.rcq, kNumSizes);
    TREQUIRE(wcs.size() == kNumSizes);
    for (size_t i = 0; i < kNumSizes; ++i)
      // byte_len of RECV_RDMA_WITH_IMM: the length of the WRITE (as rxe reports it).
      expect_wc(wcs[i], {.wr_id = 0x300 + i,
                         .opcode = WcOpcode::kRecvRdmaWithImm,
                         .byte_len = kSizes[i],
                         .imm = 0xBEEF0000u + static_cast<uint32_t>(i),
                         .qp_num = x.qp().qp_num()});
  }
  TREQUIRE(x.s.sync(name + " done"));  // the requester has its completions: the data is here
  if (!x.requester) {
    for (size_t i = 0; i < kNumSizes; ++i) {
      TCHECK_PATTERN(a + slot_offset(i), kSizes[i], x.seed(op, kSizes[i]), 0);
      TCHECK_BYTES(a + slot_offset(i) + kSizes[i], kGuard, 0xEE);
    }
    if (!with_imm) expect_none(*x.c.rcq, 20ms);  // a plain WRITE consumes no receive
  }
  TREQUIRE(x.s.sync(name + " checked"));
  return true;
}

bool phase_read(OpsCtx& x) {
  const uint64_t op = 5;
  uint8_t* a = x.arena.p + kAreaA;
  uint8_t* b = x.arena.p + kAreaB;
  if (!x.requester)
    for (size_t i = 0; i < kNumSizes; ++i) fill_pattern(b + slot_offset(i), kSizes[i], x.seed(op, kSizes[i]));
  TREQUIRE(x.s.sync("RDMA_READ source ready"));
  if (x.requester) {
    std::memset(a, 0xEE, slot_offset(kNumSizes));
    for (size_t i = 0; i < kNumSizes; ++i) {
      Sge sge = x.mr.sge(kAreaA + slot_offset(i), kSizes[i]);
      std::span<const Sge> sgl = kSizes[i] ? one(sge) : std::span<const Sge>();
      TREQUIRE_OK(post_send(x.qp(), 0x500 + i, WrOpcode::kRdmaRead, sgl, rdma::kSendSignaled,
                            x.remote(kAreaB + slot_offset(i)), x.c.peer.rkey));
    }
    auto wcs = poll_n(*x.c.scq, kNumSizes);
    TREQUIRE(wcs.size() == kNumSizes);
    for (size_t i = 0; i < kNumSizes; ++i) {
      expect_wc(wcs[i],
                {.wr_id = 0x500 + i, .opcode = WcOpcode::kRdmaRead, .byte_len = kSizes[i], .qp_num = x.qp().qp_num()});
      TCHECK_PATTERN(a + slot_offset(i), kSizes[i], x.seed(op, kSizes[i]), 0);
      TCHECK_BYTES(a + slot_offset(i) + kSizes[i], kGuard, 0xEE);
    }
  }
  TREQUIRE(x.s.sync("RDMA_READ done"));
  return true;
}

bool phase_atomics(OpsCtx& x) {
  auto* w = reinterpret_cast<uint64_t*>(x.arena.p + kAtomics);
  auto* r = reinterpret_cast<uint64_t*>(x.arena.p + kScratch);
  const uint64_t big = 0x0123456789ABCDEFull;
  if (!x.requester) {
    w[0] = 100;
    w[1] = 5;
    w[2] = big;
    w[3] = 7;
  }
  TREQUIRE(x.s.sync("atomics ready"));
  if (x.requester) {
    for (int i = 0; i < 8; ++i) r[i] = 0xEEEEEEEEEEEEEEEEull;
    auto res = [&](int i) { return x.mr.sge(kScratch + 8u * static_cast<unsigned>(i), 8); };
    auto rem = [&](int i) { return x.remote(kAtomics + 8u * static_cast<unsigned>(i)); };
    uint32_t rkey = x.c.peer.rkey;
    TREQUIRE_OK(post_atomic(x.qp(), 0x600, WrOpcode::kAtomicCmpAndSwp, res(0), rem(0), rkey, 100, 200));  // match
    TREQUIRE_OK(post_atomic(x.qp(), 0x601, WrOpcode::kAtomicCmpAndSwp, res(1), rem(0), rkey, 100, 300));  // mismatch
    TREQUIRE_OK(post_atomic(x.qp(), 0x602, WrOpcode::kAtomicFetchAndAdd, res(2), rem(1), rkey, 7, 0));
    TREQUIRE_OK(post_atomic(x.qp(), 0x603, WrOpcode::kAtomicFetchAndAdd, res(3), rem(1), rkey, ~0ull, 0));  // -1
    TREQUIRE_OK(post_atomic(x.qp(), 0x604, WrOpcode::kAtomicCmpAndSwp, res(4), rem(2), rkey, big, ~big));  // 64-bit
    TREQUIRE_OK(post_atomic(x.qp(), 0x605, WrOpcode::kAtomicFetchAndAdd, res(5), rem(3), rkey, 1ull << 40, 0));
    auto wcs = poll_n(*x.c.scq, 6);
    TREQUIRE(wcs.size() == 6);
    const WcOpcode ops[6] = {WcOpcode::kCompSwap, WcOpcode::kCompSwap, WcOpcode::kFetchAdd,
                             WcOpcode::kFetchAdd, WcOpcode::kCompSwap, WcOpcode::kFetchAdd};
    for (size_t i = 0; i < 6; ++i)
      expect_wc(wcs[i], {.wr_id = 0x600 + i, .opcode = ops[i], .byte_len = 8, .qp_num = x.qp().qp_num()});
    TCHECK_EQ(r[0], 100ull);  // original value; swapped to 200
    TCHECK_EQ(r[1], 200ull);  // mismatch: returns the current value, stores nothing
    TCHECK_EQ(r[2], 5ull);
    TCHECK_EQ(r[3], 12ull);
    TCHECK_EQ(r[4], big);
    TCHECK_EQ(r[5], 7ull);
    TCHECK_EQ(r[6], 0xEEEEEEEEEEEEEEEEull);  // nothing beyond the 8-byte SGEs
  }
  TREQUIRE(x.s.sync("atomics done"));
  if (!x.requester) {
    TCHECK_EQ(w[0], 200ull);
    TCHECK_EQ(w[1], 11ull);
    TCHECK_EQ(w[2], ~big);
    TCHECK_EQ(w[3], 7ull + (1ull << 40));
  }
  TREQUIRE(x.s.sync("atomics checked"));
  return true;
}

// Inline sends: the data comes from unregistered memory that is overwritten
// right after the post.
bool phase_inline(OpsCtx& x) {
  const uint64_t op = 6;
  const uint32_t sizes[] = {1, 100, 256};  // 256 = max_inline_data
  uint8_t* rbuf = x.arena.p + kScratch;
  if (!x.requester) {
    std::memset(rbuf, 0xEE, 4 * 512);
    for (size_t i = 0; i < 4; ++i) {
      Sge sge = x.mr.sge(kScratch + 512 * i, 512);
      TREQUIRE_OK(post_recv(x.qp(), 0x700 + i, one(sge)));
    }
  }
  TREQUIRE(x.s.sync("inline ready"));
  if (x.requester) {
    std::vector<uint8_t> tmp(512);
    for (size_t i = 0; i < 3; ++i) {
      fill_pattern(tmp.data(), sizes[i], x.seed(op, sizes[i]));
      Sge sge{.addr = reinterpret_cast<uint64_t>(tmp.data()), .length = sizes[i], .lkey = 0};
      TREQUIRE_OK(post_send(x.qp(), 0x710 + i, WrOpcode::kSend, one(sge), rdma::kSendSignaled | rdma::kSendInline));
      std::memset(tmp.data(), 0x5A, tmp.size());
    }
    // Two pieces, 100 + 156 bytes, from two unregistered buffers.
    std::vector<uint8_t> t2(200);
    fill_pattern(tmp.data(), 100, x.seed(op, 999), 0);
    fill_pattern(t2.data(), 156, x.seed(op, 999), 100);
    Sge sges[2] = {{.addr = reinterpret_cast<uint64_t>(tmp.data()), .length = 100, .lkey = 0x12345},
                   {.addr = reinterpret_cast<uint64_t>(t2.data()), .length = 156, .lkey = 0}};
    TREQUIRE_OK(post_send(x.qp(), 0x713, WrOpcode::kSendWithImm, sges, rdma::kSendSignaled | rdma::kSendInline, 0, 0, 77));
    std::memset(tmp.data(), 0x5A, tmp.size());
    std::memset(t2.data(), 0x5A, t2.size());
    auto wcs = poll_n(*x.c.scq, 4);
    TREQUIRE(wcs.size() == 4);
    for (size_t i = 0; i < 4; ++i) expect_wc(wcs[i], {.wr_id = 0x710 + i, .opcode = WcOpcode::kSend});
  } else {
    auto wcs = poll_n(*x.c.rcq, 4);
    TREQUIRE(wcs.size() == 4);
    for (size_t i = 0; i < 3; ++i) {
      expect_wc(wcs[i], {.wr_id = 0x700 + i, .opcode = WcOpcode::kRecv, .byte_len = sizes[i], .no_imm = true});
      TCHECK_PATTERN(rbuf + 512 * i, sizes[i], x.seed(op, sizes[i]), 0);
      TCHECK_BYTES(rbuf + 512 * i + sizes[i], 512 - sizes[i], 0xEE);
    }
    expect_wc(wcs[3], {.wr_id = 0x703, .opcode = WcOpcode::kRecv, .byte_len = 256, .imm = 77});
    TCHECK_PATTERN(rbuf + 512 * 3, 256, x.seed(op, 999), 0);
  }
  TREQUIRE(x.s.sync("inline done"));
  return true;
}

// Gather on the send side, scatter on the receive side; gather for WRITE,
// scatter for READ. Pieces are placed with gaps that must stay untouched.
bool phase_sge(OpsCtx& x) {
  const uint64_t op = 7;
  uint8_t* base = x.arena.p + kScratch;
  const uint64_t kBlk = 8192;  // one piece per block, gaps 0xEE
  // The SEND: 4 pieces, 3098 bytes, into 3 receive pieces of 100 + 3000 + 64.
  const uint32_t send_pieces[4] = {1, 1000, 1500, 597};
  const uint32_t recv_pieces[3] = {100, 3000, 64};
  const uint32_t total = 3098;
  // The WRITE: 3 gathered pieces into one remote range; the READ: one remote
  // range into 3 scattered pieces.
  const uint32_t write_pieces[3] = {10, 2000, 90};
  const uint32_t read_pieces[3] = {1024, 1, 2000};
  auto piece_off = [&](size_t k) { return 7 + k * kBlk; };  // odd offsets on purpose
  std::memset(base, 0xEE, 16 * kBlk);
  if (!x.requester) {
    std::vector<Sge> sgl;
    for (size_t k = 0; k < 3; ++k) sgl.push_back(x.mr.sge(kScratch + piece_off(k), recv_pieces[k]));
    TREQUIRE_OK(post_recv(x.qp(), 0x800, sgl));
    // The READ source: 3025 bytes at block 8.
    fill_pattern(base + 8 * kBlk, 3025, x.seed(op, 3), 0);
  }
  TREQUIRE(x.s.sync("sge ready"));
  if (x.requester) {
    std::vector<Sge> sgl;
    uint64_t msg_off = 0;
    for (size_t k = 0; k < 4; ++k) {
      fill_pattern(base + piece_off(k), send_pieces[k], x.seed(op, 1), msg_off);
      sgl.push_back(x.mr.sge(kScratch + piece_off(k), send_pieces[k]));
      msg_off += send_pieces[k];
    }
    TREQUIRE_OK(post_send(x.qp(), 0x810, WrOpcode::kSend, sgl));
    std::vector<Sge> wsgl;
    msg_off = 0;
    for (size_t k = 0; k < 3; ++k) {
      fill_pattern(base + piece_off(4 + k), write_pieces[k], x.seed(op, 2), msg_off);
      wsgl.push_back(x.mr.sge(kScratch + piece_off(4 + k), write_pieces[k]));
      msg_off += write_pieces[k];
    }
    TREQUIRE_OK(post_send(x.qp(), 0x811, WrOpcode::kRdmaWrite, wsgl, rdma::kSendSignaled, x.remote(kScratch + 12 * kBlk + 3),
                          x.c.peer.rkey));
    std::vector<Sge> rsgl;
    for (size_t k = 0; k < 3; ++k) rsgl.push_back(x.mr.sge(kScratch + piece_off(8 + k), read_pieces[k]));
    TREQUIRE_OK(post_send(x.qp(), 0x812, WrOpcode::kRdmaRead, rsgl, rdma::kSendSignaled, x.remote(kScratch + 8 * kBlk),
                          x.c.peer.rkey));
    auto wcs = poll_n(*x.c.scq, 3);
    TREQUIRE(wcs.size() == 3);
    expect_wc(wcs[0], {.wr_id = 0x810, .opcode = WcOpcode::kSend});
    expect_wc(wcs[1], {.wr_id = 0x811, .opcode = WcOpcode::kRdmaWrite});
    expect_wc(wcs[2], {.wr_id = 0x812, .opcode = WcOpcode::kRdmaRead, .byte_len = 3025});
    msg_off = 0;
    for (size_t k = 0; k < 3; ++k) {
      TCHECK_PATTERN(base + piece_off(8 + k), read_pieces[k], x.seed(op, 3), msg_off);
      TCHECK_BYTES(base + piece_off(8 + k) + read_pieces[k], 64, 0xEE);
      TCHECK_BYTES(base + piece_off(8 + k) - 7, 7, 0xEE);
      msg_off += read_pieces[k];
    }
  } else {
    TREQUIRE(expect_one(*x.c.rcq, {.wr_id = 0x800, .opcode = WcOpcode::kRecv, .byte_len = total}));
    uint64_t msg_off = 0;
    for (size_t k = 0; k < 3; ++k) {
      uint32_t n = std::min<uint32_t>(recv_pieces[k], static_cast<uint32_t>(total - msg_off));
      TCHECK_PATTERN(base + piece_off(k), n, x.seed(op, 1), msg_off);
      TCHECK_BYTES(base + piece_off(k) + n, kBlk - 7 - n, 0xEE);
      TCHECK_BYTES(base + piece_off(k) - 7, 7, 0xEE);
      msg_off += n;
    }
  }
  TREQUIRE(x.s.sync("sge done"));
  if (!x.requester) {
    TCHECK_PATTERN(base + 12 * kBlk + 3, 2100, x.seed(op, 2), 0);
    TCHECK_BYTES(base + 12 * kBlk, 3, 0xEE);
    TCHECK_BYTES(base + 12 * kBlk + 3 + 2100, 64, 0xEE);
  }
  TREQUIRE(x.s.sync("sge checked"));
  return true;
}

// Five unsignaled SENDs, then a signaled one: one send completion.
bool phase_unsignaled(OpsCtx& x) {
  const uint64_t op = 8;
  uint8_t* base = x.arena.p + kScratch;
  if (!x.requester) {
    for (size_t i = 0; i < 6; ++i) {
      Sge sge = x.mr.sge(kScratch + 4096 * i, 4096);
      TREQUIRE_OK(post_recv(x.qp(), 0x900 + i, one(sge)));
    }
  }
  TREQUIRE(x.s.sync("unsignaled ready"));
  if (x.requester) {
    for (size_t i = 0; i < 6; ++i) {
      uint32_t len = 500 + 300 * static_cast<uint32_t>(i);
      fill_pattern(base + 4096 * i, len, x.seed(op, i));
      Sge sge = x.mr.sge(kScratch + 4096 * i, len);
      TREQUIRE_OK(post_send(x.qp(), 0x910 + i, WrOpcode::kSend, one(sge), i == 5 ? rdma::kSendSignaled : 0));
    }
    TREQUIRE(expect_one(*x.c.scq, {.wr_id = 0x915, .opcode = WcOpcode::kSend}));
    expect_none(*x.c.scq, 50ms);
  } else {
    auto wcs = poll_n(*x.c.rcq, 6);
    TREQUIRE(wcs.size() == 6);
    for (size_t i = 0; i < 6; ++i) {
      uint32_t len = 500 + 300 * static_cast<uint32_t>(i);
      expect_wc(wcs[i], {.wr_id = 0x900 + i, .opcode = WcOpcode::kRecv, .byte_len = len});
      TCHECK_PATTERN(base + 4096 * i, len, x.seed(op, i), 0);
    }
  }
  TREQUIRE(x.s.sync("unsignaled done"));
  return true;
}

bool every_operation(Side& s, bool psn_wrap) {
  TCHECK_EQ(s.dev->active_mtu(), traits(s).active_mtu);
  TCHECK_EQ(s.dev->provider(), std::string(traits(s).provider));
  Arena arena(kArenaSize);
  auto mr = register_arena(s, arena, rdma::kLocalWrite | rdma::kRemoteAccess);
  TREQUIRE(mr);
  TCHECK(mr->rkey() != 0);
  Conn c;
  ConnOptions o;
  o.tuning.path_mtu = 1024;
  o.advertise = advertise(*mr);
  // PSNs 700 / 650 below 2^24: they wrap inside the first 1 MiB SEND.
  if (psn_wrap) o.psn = 0xFFFFFFu - 700 + 50 * static_cast<uint32_t>(s.role);
  TREQUIRE(make_conn(s, c, o));
  TCHECK_EQ(c.qp->attr().path_mtu, 1024u);
  for (uint64_t dir = 0; dir < 2; ++dir) {
    OpsCtx x{s, arena, *mr, c, static_cast<uint64_t>(s.role) == dir, dir};
    TREQUIRE(phase_send(x, false));
    TREQUIRE(phase_send(x, true));
    TREQUIRE(phase_write(x, false));
    TREQUIRE(phase_write(x, true));
    TREQUIRE(phase_read(x));
    TREQUIRE(phase_atomics(x));
    TREQUIRE(phase_inline(x));
    TREQUIRE(phase_sge(x));
    TREQUIRE(phase_unsignaled(x));
  }
  expect_none(*c.scq, 20ms);
  expect_none(*c.rcq, 20ms);
  TCHECK_EQ(c.qp->state(), QpState::kRts);
  TREQUIRE(s.sync("end"));
  return true;
}

TEST_P(Conformance, EveryOperationBothDirections) {
  run_pair(opts(), [](Side& s) { return every_operation(s, false); });
}

// The same with progress threads at both ends, and PSNs that wrap past
// 2^24 - 1 during the first direction.
TEST_P(Conformance, EveryOperationBothDirectionsWithProgressThreadsAndPsnWrap) {
  PairOptions o = opts();
  o.progress_thread[0] = o.progress_thread[1] = true;
  run_pair(o, [](Side& s) { return every_operation(s, true); });
}

// ===========================================================================
// 2. Many QPs at once.

constexpr uint32_t kManyQps = 256;
constexpr uint32_t kManyMsgs = 8;
constexpr uint32_t kManySlot = 4096;

uint32_t many_len(uint32_t q, uint32_t m, int sender) {
  return 1 + (q * 37 + m * 1031 + static_cast<uint32_t>(sender) * 577) % 3000;
}

bool many_qps(Side& s) {
  const uint64_t per_side = uint64_t{kManyQps} * kManyMsgs * kManySlot;
  Arena arena(2 * per_side);  // receive slots, then send slots
  auto mr = register_arena(s, arena, rdma::kLocalWrite);
  TREQUIRE(mr);
  auto scq = s.dev->create_cq(kManyQps * kManyMsgs);
  TREQUIRE_OK(scq);
  auto rcq = s.dev->create_cq(kManyQps * kManyMsgs);
  TREQUIRE_OK(rcq);
  std::vector<std::unique_ptr<QueuePair>> qps;
  std::vector<ConnectionData> mine, theirs;
  rdma::QpCaps caps{.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1, .max_inline_data = 0};
  for (uint32_t q = 0; q < kManyQps; ++q) {
    auto qp = s.pd->create_qp({.type = rdma::QpType::kRc, .send_cq = scq->get(), .recv_cq = rcq->get(), .caps = caps});
    TREQUIRE_OK(qp);
    mine.push_back((*qp)->local());
    qps.push_back(std::move(*qp));
  }
  TREQUIRE(s.exchange_vector(mine, &theirs));
  TREQUIRE(theirs.size() == kManyQps);
  for (uint32_t q = 0; q < kManyQps; ++q) TREQUIRE_OK(qps[q]->connect(theirs[q]));
  auto slot = [&](uint32_t q, uint32_t m) { return (uint64_t{q} * kManyMsgs + m) * kManySlot; };
  std::memset(arena.p, 0xEE, per_side);
  for (uint32_t q = 0; q < kManyQps; ++q)
    for (uint32_t m = 0; m < kManyMsgs; ++m) {
      Sge sge = mr->sge(slot(q, m), kManySlot);
      TREQUIRE_OK(post_recv(*qps[q], (uint64_t{q} << 16) | m, one(sge)));
    }
  TREQUIRE(s.sync("all posted"));
  const int peer = 1 - s.role;
  for (uint32_t m = 0; m < kManyMsgs; ++m)
    for (uint32_t q = 0; q < kManyQps; ++q) {
      uint32_t len = many_len(q, m, s.role);
      fill_pattern(arena.p + per_side + slot(q, m), len, (uint64_t{q} << 32) | (m << 8) | static_cast<uint64_t>(s.role));
      Sge sge = mr->sge(per_side + slot(q, m), len);
      TREQUIRE_OK(post_send(*qps[q], (uint64_t{q} << 16) | m, WrOpcode::kSend, one(sge)));
    }
  const size_t total = size_t{kManyQps} * kManyMsgs;
  size_t sends = 0, recvs = 0;
  std::vector<uint32_t> next_m(kManyQps, 0);
  std::vector<WorkCompletion> wcs(64);
  int reported = 0;
  auto t0 = Clock::now();
  auto deadline = t0 + 90s;
  while ((sends < total || recvs < total) && Clock::now() < deadline) {
    auto n = (*scq)->poll(wcs);
    TREQUIRE_OK(n);
    for (size_t i = 0; i < *n; ++i, ++sends) {
      const auto& wc = wcs[i];
      uint32_t q = static_cast<uint32_t>(wc.wr_id >> 16);
      if ((wc.status != WcStatus::kSuccess || q >= kManyQps || wc.qp_num != qps[q]->qp_num()) && reported++ < 10)
        record_failure(__FILE__, __LINE__, "send completion wr_id " + show(wc.wr_id) + " " + show(wc.status) + " " + wc.error);
    }
    n = (*rcq)->poll(wcs);
    TREQUIRE_OK(n);
    for (size_t i = 0; i < *n; ++i, ++recvs) {
      const auto& wc = wcs[i];
      uint32_t q = static_cast<uint32_t>(wc.wr_id >> 16), m = static_cast<uint32_t>(wc.wr_id & 0xffff);
      bool ok = wc.status == WcStatus::kSuccess && q < kManyQps && m < kManyMsgs && wc.qp_num == qps[q]->qp_num() &&
                wc.opcode == WcOpcode::kRecv && m == next_m[q] && wc.byte_len == many_len(q, m, peer) &&
                pattern_mismatch(arena.p + slot(q, m), many_len(q, m, peer),
                                 (uint64_t{q} << 32) | (m << 8) | static_cast<uint64_t>(peer)) < 0;
      if (q < kManyQps) next_m[q] = m + 1;
      if (!ok && reported++ < 10)
        record_failure(__FILE__, __LINE__,
                       "receive wr_id " + show(wc.wr_id) + " " + show(wc.status) + " qp_num " + show(wc.qp_num) +
                           " byte_len " + show(wc.byte_len) + " " + wc.error + ": wrong QP, order, length or data");
    }
  }
  std::fprintf(stderr, "[port %d] %u QP pairs: %zu sends and %zu receives completed in %.1f ms\n", s.role, kManyQps, sends,
               recvs, ms_since(t0));
  TCHECK_EQ(sends, total);
  TCHECK_EQ(recvs, total);
  TREQUIRE(s.sync("all done"));
  expect_none(**scq, 20ms);
  expect_none(**rcq, 20ms);
  for (auto& qp : qps) TCHECK_EQ(qp->state(), QpState::kRts);
  TREQUIRE(s.sync("end"));
  return true;
}

TEST_P(Conformance, ManyQueuePairsAtOnce) {
  run_pair(opts(), many_qps);
}

// ===========================================================================
// 3. Blocking waits on a CQ.

bool cq_wait(Side& s, Arena& arena, MemoryRegion& mr, Conn& c) {
  WorkCompletion wc;
  std::span<WorkCompletion> out(&wc, 1);
  if (s.parent()) {
    // A receive completion that arrives 300 ms after the wait started.
    Sge sge = mr.sge(0, 4096);
    TREQUIRE_OK(post_recv(*c.qp, 0xA1, one(sge)));
    TREQUIRE(s.sync("armed"));
    auto t0 = Clock::now();
    auto r = c.rcq->wait(out, 5000ms);
    double ms = ms_since(t0);
    TREQUIRE_OK(r);
    TCHECK_EQ(*r, size_t{1});
    if (*r == 1) expect_wc(wc, {.wr_id = 0xA1, .opcode = WcOpcode::kRecv, .byte_len = 1000});
    TCHECK_MSG(ms >= 250 && ms < 4000, "wait returned after " + std::to_string(ms) + " ms, the send came after 300");
    std::fprintf(stderr, "wait for a receive sent 300 ms later: %.1f ms\n", ms);
    TCHECK_PATTERN(arena.p, 1000, 0xA1, 0);
    TREQUIRE(s.sync("received"));

    // Nothing arrives: 0 after the timeout, not earlier. The upper bound only
    // catches a wait that ignores its timeout: on a loaded 2-core machine
    // (busy-polling tests beside this one) a sleeper can be seconds late.
    for (int timeout : {200, 50}) {
      t0 = Clock::now();
      r = c.rcq->wait(out, milliseconds(timeout));
      ms = ms_since(t0);
      TREQUIRE_OK(r);
      TCHECK_EQ(*r, size_t{0});
      TCHECK_MSG(ms >= timeout - 2 && ms < timeout + 10000,
                 "wait(" + std::to_string(timeout) + " ms) with nothing coming returned after " + std::to_string(ms) + " ms");
    }

    // A send completion (woken by the ACK) for a SEND the peer can take only
    // after it posts a receive 200 ms later (RNR NAKs meanwhile).
    fill_pattern(arena.p + 8192, 3000, 0xA2);
    Sge ssge = mr.sge(8192, 3000);
    TREQUIRE_OK(post_send(*c.qp, 0xA2, WrOpcode::kSend, one(ssge)));
    TREQUIRE(s.sync("sent"));
    t0 = Clock::now();
    r = c.scq->wait(out, 5000ms);
    ms = ms_since(t0);
    TREQUIRE_OK(r);
    TCHECK_EQ(*r, size_t{1});
    if (*r == 1) expect_wc(wc, {.wr_id = 0xA2, .opcode = WcOpcode::kSend});
    TCHECK_MSG(ms >= 150 && ms < 4000, "send completion after " + std::to_string(ms) + " ms, the receive came after 200");
    TREQUIRE(s.sync("done"));
  } else {
    TREQUIRE(s.sync("armed"));
    std::this_thread::sleep_for(300ms);
    fill_pattern(arena.p, 1000, 0xA1);
    Sge sge = mr.sge(0, 1000);
    TREQUIRE_OK(post_send(*c.qp, 0xB1, WrOpcode::kSend, one(sge)));
    TREQUIRE(expect_one(*c.scq, {.wr_id = 0xB1, .opcode = WcOpcode::kSend}));
    TREQUIRE(s.sync("received"));
    TREQUIRE(s.sync("sent"));
    drive_for(*s.dev, 200ms);
    Sge rsge = mr.sge(8192, 4096);
    TREQUIRE_OK(post_recv(*c.qp, 0xB2, one(rsge)));
    TREQUIRE(expect_one(*c.rcq, {.wr_id = 0xB2, .opcode = WcOpcode::kRecv, .byte_len = 3000}));
    TCHECK_PATTERN(arena.p + 8192, 3000, 0xA2, 0);
    TREQUIRE(s.sync("done"));
  }
  return true;
}

TEST_P(Conformance, CqWaitBlocksUntilACompletionOrTheTimeout) {
  run_pair(opts(), connected(cq_wait));
}

TEST_P(Conformance, CqWaitWithProgressThread) {
  PairOptions o = opts();
  o.progress_thread[0] = true;
  run_pair(o, connected(cq_wait));
}

// With a progress thread, the CQ's eventfd becomes readable while the
// application makes no ufab call at all.
TEST_P(Conformance, CqEventFdWithProgressThread) {
  PairOptions o = opts();
  o.progress_thread[0] = true;
  run_pair(o, connected([](Side& s, Arena&, MemoryRegion& mr, Conn& c) {
    if (s.parent()) {
      Sge sge = mr.sge(0, 4096);
      TREQUIRE_OK(post_recv(*c.qp, 0xC1, one(sge)));
      c.rcq->request_notify();
      TREQUIRE(s.sync("armed", 30s, false));
      struct pollfd pfd = {c.rcq->event_fd(), POLLIN, 0};
      int r = ::poll(&pfd, 1, 5000);
      TCHECK_EQ(r, 1);
      uint64_t v = 0;
      if (r == 1) TCHECK_EQ(::read(pfd.fd, &v, sizeof v), static_cast<ssize_t>(sizeof v));
      TREQUIRE(expect_one(*c.rcq, {.wr_id = 0xC1, .opcode = WcOpcode::kRecv, .byte_len = 100}));
      TREQUIRE(s.sync("done"));
    } else {
      TREQUIRE(s.sync("armed"));
      std::this_thread::sleep_for(100ms);
      Sge sge = mr.sge(0, 100);
      TREQUIRE_OK(post_send(*c.qp, 0xD1, WrOpcode::kSend, one(sge)));
      TREQUIRE(expect_one(*c.scq, {.wr_id = 0xD1, .opcode = WcOpcode::kSend}));
      TREQUIRE(s.sync("done"));
    }
    return true;
  }));
}

// ===========================================================================
// 4. Completion errors.

// Receive buffer too small: LOC_LEN_ERR at the receiver, REM_INV_REQ_ERR at
// the sender; both QPs go to ERROR. The child is the sender here.
TEST_P(Conformance, LocalLengthError) {
  run_pair(opts(), connected([](Side& s, Arena&, MemoryRegion& mr, Conn& c) {
    if (s.parent()) {
      Sge sge = mr.sge(0, 16);
      TREQUIRE_OK(post_recv(*c.qp, 0x11, one(sge)));
      Sge sge2 = mr.sge(4096, 4096);
      TREQUIRE_OK(post_recv(*c.qp, 0x12, one(sge2)));  // flushed when the QP goes to ERROR
      TREQUIRE(s.sync("posted"));
      auto wcs = poll_n(*c.rcq, 2);
      TREQUIRE(wcs.size() == 2);
      expect_wc(wcs[0], {.wr_id = 0x11, .status = WcStatus::kLocLenErr, .qp_num = c.qp->qp_num()});
      expect_wc(wcs[1], {.wr_id = 0x12, .status = WcStatus::kWrFlushErr, .qp_num = c.qp->qp_num()});
      TCHECK(wait_state(*s.dev, *c.qp, QpState::kError));
      TREQUIRE(s.sync("done"));
    } else {
      TREQUIRE(s.sync("posted"));
      Sge sge = mr.sge(0, 100);
      TREQUIRE_OK(post_send(*c.qp, 0x21, WrOpcode::kSend, one(sge)));
      TREQUIRE(expect_error(s, c, *c.scq, 0x21, WcStatus::kRemInvReqErr));
      TREQUIRE(s.sync("done"));
    }
    return true;
  }));
}

// A bad lkey, an SGE outside its region and an lkey of another PD in a
// send's gather list: LOC_PROT_ERR, the QP in ERROR, nothing sent.
TEST_P(Conformance, LocalProtectionError) {
  run_pair(opts(), [](Side& s) {
    Arena arena(1 << 16);
    TREQUIRE(arena.p);
    auto mr = s.pd->register_mr(arena.p, 1 << 15, rdma::kLocalWrite);
    TREQUIRE_OK(mr);
    auto pd2 = s.dev->alloc_pd();
    TREQUIRE_OK(pd2);
    auto mr2 = pd2->register_mr(arena.p + (1 << 15), 1 << 15, rdma::kLocalWrite);
    TREQUIRE_OK(mr2);
    Conn c[3];
    for (auto& cc : c) TREQUIRE(make_conn(s, cc));
    if (s.parent()) {
      Sge bad[3] = {{.addr = arena.addr(), .length = 64, .lkey = mr->lkey() ^ 0x5A},
                    {.addr = arena.addr((1 << 15) - 32), .length = 64, .lkey = mr->lkey()},
                    {.addr = arena.addr(1 << 15), .length = 64, .lkey = mr2->lkey()}};
      for (int i = 0; i < 3; ++i) TREQUIRE_OK(post_send(*c[i].qp, 0x30 + static_cast<uint64_t>(i), WrOpcode::kSend, one(bad[i])));
      for (int i = 0; i < 3; ++i) {
        TREQUIRE(expect_error(s, c[i], *c[i].scq, 0x30 + static_cast<uint64_t>(i), WcStatus::kLocProtErr));
      }
      TREQUIRE(s.sync("sent"));
    } else {
      for (int i = 0; i < 3; ++i) {
        Sge sge = mr->sge(4096 * static_cast<uint64_t>(i), 4096);
        TREQUIRE_OK(post_recv(*c[i].qp, 0x40, one(sge)));
      }
      TREQUIRE(s.sync("sent"));
      for (auto& cc : c) {
        expect_none(*cc.rcq, 50ms);
        TCHECK_EQ(cc.qp->state(), QpState::kRts);
      }
    }
    TREQUIRE(s.sync("end"));
    return true;
  });
}

// REMOTE_ACCESS_ERR: WRITE with a wrong rkey, WRITE out of bounds, WRITE to
// a region without REMOTE_WRITE, READ from one without REMOTE_READ, atomic on
// one without REMOTE_ATOMIC. The requester's QP goes to ERROR, and so does
// the responder's (IBA class C, rxe's do_class_ac_error).
TEST_P(Conformance, RemoteAccessError) {
  run_pair(opts(), [](Side& s) {
    Arena arena(1 << 20);
    TREQUIRE(arena.p);
    const uint64_t kPart = 1 << 18;
    std::memset(arena.p, 0xEE, arena.size);
    auto full = s.pd->register_mr(arena.p, kPart, rdma::kLocalWrite | rdma::kRemoteAccess);
    TREQUIRE_OK(full);
    auto no_write = s.pd->register_mr(arena.p + kPart, kPart, rdma::kLocalWrite | rdma::kRemoteRead);
    TREQUIRE_OK(no_write);
    auto no_read = s.pd->register_mr(arena.p + 2 * kPart, kPart, rdma::kLocalWrite | rdma::kRemoteWrite);
    TREQUIRE_OK(no_read);
    auto no_atomic = s.pd->register_mr(arena.p + 3 * kPart, kPart, rdma::kLocalWrite | rdma::kRemoteWrite | rdma::kRemoteRead);
    TREQUIRE_OK(no_atomic);
    struct Keys {
      ConnectionData full, no_write, no_read, no_atomic;
    } mine{advertise(*full), advertise(*no_write), advertise(*no_read), advertise(*no_atomic)}, peer{};
    TREQUIRE(s.exchange(mine, &peer));
    constexpr int kCases = 5;
    Conn c[kCases];
    for (auto& cc : c) TREQUIRE(make_conn(s, cc));
    if (s.parent()) {
      // Local source/destination: the first 64 KiB of `full`.
      fill_pattern(arena.p, 4096, 0x77);
      Sge src = full->sge(0, 100);
      Sge res = full->sge(8192, 8);
      TREQUIRE_OK(post_send(*c[0].qp, 0x50, WrOpcode::kRdmaWrite, one(src), rdma::kSendSignaled, peer.full.addr + 64,
                            peer.full.rkey ^ 0x3C));
      TREQUIRE_OK(post_send(*c[1].qp, 0x51, WrOpcode::kRdmaWrite, one(src), rdma::kSendSignaled,
                            peer.full.addr + peer.full.length - 10, peer.full.rkey));
      TREQUIRE_OK(post_send(*c[2].qp, 0x52, WrOpcode::kRdmaWrite, one(src), rdma::kSendSignaled, peer.no_write.addr,
                            peer.no_write.rkey));
      Sge dst = full->sge(4096, 100);
      TREQUIRE_OK(post_send(*c[3].qp, 0x53, WrOpcode::kRdmaRead, one(dst), rdma::kSendSignaled, peer.no_read.addr,
                            peer.no_read.rkey));
      TREQUIRE_OK(post_atomic(*c[4].qp, 0x54, WrOpcode::kAtomicFetchAndAdd, res, peer.no_atomic.addr, peer.no_atomic.rkey, 1, 0));
      for (int i = 0; i < kCases; ++i) {
        TREQUIRE(expect_error(s, c[i], *c[i].scq, 0x50 + static_cast<uint64_t>(i), WcStatus::kRemAccessErr));
      }
      TREQUIRE(s.sync("done"));
    } else {
      TREQUIRE(s.sync("done"));
      for (int i = 0; i < kCases; ++i) TCHECK(wait_state(*s.dev, *c[i].qp, QpState::kError, 2s));
      // Nothing was written anywhere.
      TCHECK_BYTES(arena.p, arena.size, 0xEE);
    }
    TREQUIRE(s.sync("end"));
    return true;
  });
}

// A receive whose scatter list has a bad lkey (post_recv does not check
// keys, as in verbs): the SEND into it ends with LOC_PROT_ERR at the
// receiver and REM_OP_ERR at the sender (NAK "remote operational error");
// both QPs go to ERROR.
TEST_P(Conformance, RemoteOperationalError) {
  run_pair(opts(), connected([](Side& s, Arena& arena, MemoryRegion& mr, Conn& c) {
    if (!s.parent()) {
      Sge bad{.addr = arena.addr(), .length = 4096, .lkey = mr.lkey() ^ 0x5A};
      TREQUIRE_OK(post_recv(*c.qp, 0x65, one(bad)));
      TREQUIRE(s.sync("posted"));
      TREQUIRE(expect_error(s, c, *c.rcq, 0x65, WcStatus::kLocProtErr));
    } else {
      TREQUIRE(s.sync("posted"));
      Sge sge = mr.sge(0, 100);
      TREQUIRE_OK(post_send(*c.qp, 0x66, WrOpcode::kSend, one(sge)));
      TREQUIRE(expect_error(s, c, *c.scq, 0x66, WcStatus::kRemOpErr));
    }
    TREQUIRE(s.sync("done"));
    return true;
  }));
}

// A misaligned atomic: REM_INV_REQ_ERR, and the target is untouched.
TEST_P(Conformance, RemoteInvalidRequest) {
  run_pair(opts(), [](Side& s) {
    Arena arena(1 << 16);
    auto mr = register_arena(s, arena, rdma::kLocalWrite | rdma::kRemoteAccess);
    TREQUIRE(mr);
    auto* w = reinterpret_cast<uint64_t*>(arena.p);
    w[0] = 1;
    w[1] = 2;
    Conn c;
    ConnOptions o;
    o.advertise = advertise(*mr);
    TREQUIRE(make_conn(s, c, o));
    if (s.parent()) {
      Sge res = mr->sge(4096, 8);
      TREQUIRE_OK(post_atomic(*c.qp, 0x60, WrOpcode::kAtomicCmpAndSwp, res, c.peer.addr + 4, c.peer.rkey, 1, 9));
      TREQUIRE(expect_error(s, c, *c.scq, 0x60, WcStatus::kRemInvReqErr));
    }
    TREQUIRE(s.sync("done"));
    if (!s.parent()) {
      TCHECK_EQ(w[0], 1ull);
      TCHECK_EQ(w[1], 2ull);
      TCHECK(wait_state(*s.dev, *c.qp, QpState::kError, 2s));
    }
    TREQUIRE(s.sync("end"));
    return true;
  });
}

// RNR_RETRY_EXC_ERR: no receive at the peer, min_rnr_timer 1 (0.01 ms),
// rnr_retry 0 (the first RNR NAK fails the SEND) and rnr_retry 1 (the
// second does). The responder's QPs stay in RTS. Then with rnr_retry 7
// (infinite) a receive posted 100 ms late is found.
TEST_P(Conformance, RnrRetryExceeded) {
  run_pair(opts(), [](Side& s) {
    Arena arena(1 << 16);
    auto mr = register_arena(s, arena, rdma::kLocalWrite);
    TREQUIRE(mr);
    Conn zero, c, late;
    ConnOptions o;
    o.tuning.min_rnr_timer = 1;
    o.tuning.rnr_retry = 0;
    TREQUIRE(make_conn(s, zero, o));
    o.tuning.rnr_retry = 1;
    TREQUIRE(make_conn(s, c, o));
    o.tuning.rnr_retry = 7;
    TREQUIRE(make_conn(s, late, o));
    if (s.parent()) {
      Sge sge = mr->sge(0, 64);
      auto before = s.dev->stats();
      auto t0 = Clock::now();
      TREQUIRE_OK(post_send(*zero.qp, 0x7F, WrOpcode::kSend, one(sge)));
      TREQUIRE(expect_error(s, zero, *zero.scq, 0x7F, WcStatus::kRnrRetryExcErr, 10s));
      auto st = s.dev->stats();
      std::fprintf(stderr, "rnr_retry 0: RNR_RETRY_EXC_ERR after %.1f ms, %llu RNR NAKs received\n", ms_since(t0),
                   static_cast<unsigned long long>(st.rnr_naks_received - before.rnr_naks_received));
      TCHECK_EQ(st.rnr_naks_received - before.rnr_naks_received, 1ull);
      t0 = Clock::now();
      TREQUIRE_OK(post_send(*c.qp, 0x80, WrOpcode::kSend, one(sge)));
      TREQUIRE(expect_error(s, c, *c.scq, 0x80, WcStatus::kRnrRetryExcErr, 10s));
      auto st2 = s.dev->stats();
      std::fprintf(stderr, "rnr_retry 1: RNR_RETRY_EXC_ERR after %.1f ms, %llu RNR NAKs received\n", ms_since(t0),
                   static_cast<unsigned long long>(st2.rnr_naks_received - st.rnr_naks_received));
      TCHECK_EQ(st2.rnr_naks_received - st.rnr_naks_received, 2ull);
      TREQUIRE(s.sync("first done"));
      TREQUIRE_OK(post_send(*late.qp, 0x81, WrOpcode::kSend, one(sge)));
      TREQUIRE(expect_one(*late.scq, {.wr_id = 0x81, .opcode = WcOpcode::kSend}, 10s));
      TREQUIRE(s.sync("second done"));
    } else {
      TREQUIRE(s.sync("first done"));
      TCHECK_EQ(zero.qp->state(), QpState::kRts);
      TCHECK_EQ(c.qp->state(), QpState::kRts);
      expect_none(*zero.rcq, 20ms);
      expect_none(*c.rcq, 20ms);
      TCHECK(s.dev->stats().rnr_naks_sent >= 3);
      drive_for(*s.dev, 100ms);
      Sge sge = mr->sge(0, 64);
      TREQUIRE_OK(post_recv(*late.qp, 0x82, one(sge)));
      TREQUIRE(expect_one(*late.rcq, {.wr_id = 0x82, .opcode = WcOpcode::kRecv, .byte_len = 64}, 10s));
      TCHECK(s.dev->stats().rnr_naks_sent >= 4);
      TREQUIRE(s.sync("second done"));
    }
    return true;
  });
}

// WR_FLUSH_ERR: work queued behind a failed request, receives of a QP that
// went to ERROR, work posted after it went to ERROR, and modify(ERROR).
TEST_P(Conformance, WorkRequestFlushed) {
  run_pair(opts(), [](Side& s) {
    Arena arena(1 << 16);
    auto mr = register_arena(s, arena, rdma::kLocalWrite);
    TREQUIRE(mr);
    Conn c, m;
    TREQUIRE(make_conn(s, c));
    TREQUIRE(make_conn(s, m));
    if (s.parent()) {
      Sge r0 = mr->sge(0, 1024), r1 = mr->sge(1024, 1024);
      TREQUIRE_OK(post_recv(*c.qp, 0x90, one(r0)));
      TREQUIRE_OK(post_recv(*c.qp, 0x91, one(r1)));
      Sge bad{.addr = arena.addr(4096), .length = 64, .lkey = mr->lkey() ^ 0x11};
      Sge good = mr->sge(4096, 64);
      TREQUIRE_OK(post_send(*c.qp, 0xA0, WrOpcode::kSend, one(bad)));
      TREQUIRE_OK(post_send(*c.qp, 0xA1, WrOpcode::kSend, one(good)));
      TREQUIRE_OK(post_send(*c.qp, 0xA2, WrOpcode::kRdmaWrite, one(good), rdma::kSendSignaled, c.peer.addr, c.peer.rkey));
      // Unsignaled: a request completed in error (a flush included) always
      // produces a completion (IBA 10.8.3.1, as rxe).
      TREQUIRE_OK(post_send(*c.qp, 0xA3, WrOpcode::kSend, one(good), 0));
      auto wcs = poll_n(*c.scq, 4);
      TREQUIRE(wcs.size() == 4);
      expect_wc(wcs[0], {.wr_id = 0xA0, .status = WcStatus::kLocProtErr});
      for (int i = 1; i < 4; ++i) expect_wc(wcs[i], {.wr_id = 0xA0 + static_cast<uint64_t>(i), .status = WcStatus::kWrFlushErr});
      auto rw = poll_n(*c.rcq, 2);
      TREQUIRE(rw.size() == 2);
      expect_wc(rw[0], {.wr_id = 0x90, .status = WcStatus::kWrFlushErr, .qp_num = c.qp->qp_num()});
      expect_wc(rw[1], {.wr_id = 0x91, .status = WcStatus::kWrFlushErr, .qp_num = c.qp->qp_num()});
      TCHECK_EQ(c.qp->state(), QpState::kError);

      // Posted after the QP went to ERROR: flushed (verbs allows posting in ERROR).
      auto ps = post_send(*c.qp, 0xA4, WrOpcode::kSend, one(good));
      auto pr = post_recv(*c.qp, 0x92, one(r0));
      TCHECK_MSG(ps.has_value(), ps ? "" : ps.error().message());
      TCHECK_MSG(pr.has_value(), pr ? "" : pr.error().message());
      if (ps) expect_one(*c.scq, {.wr_id = 0xA4, .status = WcStatus::kWrFlushErr});
      if (pr) expect_one(*c.rcq, {.wr_id = 0x92, .status = WcStatus::kWrFlushErr});

      // modify(ERROR) flushes the receives that wait.
      TREQUIRE_OK(post_recv(*m.qp, 0x93, one(r0)));
      TREQUIRE_OK(post_recv(*m.qp, 0x94, one(r1)));
      QpAttr err;
      err.state = QpState::kError;
      TREQUIRE_OK(m.qp->modify(err, rdma::kAttrState));
      TCHECK_EQ(m.qp->state(), QpState::kError);
      rw = poll_n(*m.rcq, 2);
      TREQUIRE(rw.size() == 2);
      expect_wc(rw[0], {.wr_id = 0x93, .status = WcStatus::kWrFlushErr});
      expect_wc(rw[1], {.wr_id = 0x94, .status = WcStatus::kWrFlushErr});
      expect_none(*c.scq, 20ms);
      expect_none(*c.rcq, 20ms);
    }
    TREQUIRE(s.sync("done"));
    if (!s.parent()) {
      expect_none(*c.rcq, 20ms);
      TCHECK_EQ(c.qp->state(), QpState::kRts);
    }
    TREQUIRE(s.sync("end"));
    return true;
  });
}

// A CQ of depth 4 given 8 completions: poll reports EOVERFLOW, the QP goes
// to ERROR, and the 4 that fitted still come out.
TEST_P(Conformance, CqOverflow) {
  run_pair(opts(), [](Side& s) {
    Arena arena(1 << 16);
    auto mr = register_arena(s, arena, rdma::kLocalWrite | rdma::kRemoteWrite);
    TREQUIRE(mr);
    Conn c;
    ConnOptions o;
    o.cq_depth = 4;
    o.advertise = advertise(*mr);
    TREQUIRE(make_conn(s, c, o));
    if (s.parent()) {
      TCHECK_EQ(c.scq->depth(), 4u);
      const uint32_t n = c.scq->depth() + 4;
      Sge sge = mr->sge(0, 64);
      for (uint32_t i = 0; i < n; ++i)
        TREQUIRE_OK(post_send(*c.qp, 0xB0 + i, WrOpcode::kRdmaWrite, one(sge), rdma::kSendSignaled, c.peer.addr + 64 * i,
                              c.peer.rkey));
      // Run the transport without polling the CQ until the QP fails.
      TCHECK(wait_state(*s.dev, *c.qp, QpState::kError));
      std::vector<WorkCompletion> out(16);
      auto r = c.scq->poll(out);
      TCHECK(!r);
      if (!r) {
        TCHECK_EQ(r.error().code(), EOVERFLOW);
        std::fprintf(stderr, "overflow: %s\n", r.error().message().c_str());
      }
      auto wcs = poll_n(*c.scq, c.scq->depth());
      TREQUIRE(wcs.size() == c.scq->depth());
      for (uint32_t i = 0; i < wcs.size(); ++i) expect_wc(wcs[i], {.wr_id = 0xB0 + i, .opcode = WcOpcode::kRdmaWrite});
      // Whatever comes later can only be the flushed rest.
      auto deadline = Clock::now() + 50ms;
      while (Clock::now() < deadline) {
        auto again = c.scq->poll(out);
        TREQUIRE_OK(again);
        for (size_t i = 0; i < *again; ++i) {
          TCHECK_EQ(out[i].status, WcStatus::kWrFlushErr);
          TCHECK(out[i].wr_id >= 0xB0 + c.scq->depth() && out[i].wr_id < 0xB0 + n);
        }
      }
    }
    TREQUIRE(s.sync("done"));
    return true;
  });
}

// ===========================================================================
// 5. Errors at post time.

TEST_P(Conformance, PostTimeErrors) {
  run_pair(opts(), [](Side& s) {
    Arena arena(1 << 16);
    auto mr = register_arena(s, arena, rdma::kLocalWrite | rdma::kRemoteWrite);
    TREQUIRE(mr);
    rdma::QpCaps caps{.max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 4, .max_recv_sge = 4, .max_inline_data = 256};
    auto scq = s.dev->create_cq(64);
    TREQUIRE_OK(scq);
    auto rcq = s.dev->create_cq(64);
    TREQUIRE_OK(rcq);
    auto qpr = s.pd->create_qp({.type = rdma::QpType::kRc, .send_cq = scq->get(), .recv_cq = rcq->get(), .caps = caps});
    TREQUIRE_OK(qpr);
    QueuePair& qp = **qpr;
    if (!s.parent()) {
      // The parent connects by hand; exchange, then connect.
      ConnectionData mine = qp.local(), peer;
      mine.rkey = mr->rkey();
      mine.addr = arena.addr();
      mine.length = static_cast<uint32_t>(arena.size);
      TREQUIRE(s.exchange(mine, &peer));
      TREQUIRE_OK(qp.connect(peer));
      for (uint64_t i = 0; i < 4; ++i) {
        Sge sge = mr->sge(4096 * i, 4096);
        TREQUIRE_OK(post_recv(qp, 0xC0 + i, one(sge)));
      }
      TREQUIRE(s.sync("child ready"));
      TREQUIRE(s.sync("one send"));
      TREQUIRE(expect_one(**rcq, {.wr_id = 0xC0, .opcode = WcOpcode::kRecv, .byte_len = 321}));
      TCHECK_PATTERN(arena.p, 321, 0xF00D, 0);
      expect_none(**rcq, 50ms);  // the failed posts sent nothing
      Sge back = mr->sge(32768, 77);
      fill_pattern(arena.p + 32768, 77, 0xBAC);
      TREQUIRE_OK(post_send(qp, 0xC9, WrOpcode::kSend, one(back)));
      TREQUIRE(expect_one(**scq, {.wr_id = 0xC9, .opcode = WcOpcode::kSend}));
      // Receives for the parent's queue-full SENDs (3 of the first 4 are
      // left); then silent (no progress) while the parent fills its send
      // queue, so none of its SENDs can complete.
      for (uint64_t i = 0; i < 5; ++i) {  // 3 + 5 = max_recv_wr
        Sge sge = mr->sge(4096 * (9 + i), 64);
        TREQUIRE_OK(post_recv(qp, 0xC4 + i, one(sge)));
      }
      TREQUIRE(s.sync("stop"));
      TREQUIRE(s.sync("go", 30s, false));
      auto got = poll_n(**rcq, 8);  // the 8 SENDs, in order, into 0xC1 .. 0xC8
      TREQUIRE(got.size() == 8);
      for (uint64_t i = 0; i < 8; ++i) expect_wc(got[i], {.wr_id = 0xC1 + i, .opcode = WcOpcode::kRecv, .byte_len = 64});
      TREQUIRE(s.sync("end"));
      return true;
    }
    ConnectionData mine = qp.local(), peer;
    TREQUIRE(s.exchange(mine, &peer));
    Sge sge = mr->sge(0, 64);
    auto expect_post_fails = [&](const Status& st, const char* what, std::source_location loc = std::source_location::current()) {
      if (st) {
        record_failure(loc, std::string(what) + ": accepted");
      } else {
        if (st.error().code() == 0 || st.error().message().empty())
          record_failure(loc, std::string(what) + ": error without errno or message");
        std::fprintf(stderr, "%s: errno %d: %s\n", what, st.error().code(), st.error().message().c_str());
      }
    };
    // RESET: no sends, no receives.
    TCHECK_EQ(qp.state(), QpState::kReset);
    expect_post_fails(post_send(qp, 0xD0, WrOpcode::kSend, one(sge)), "post_send in RESET");
    expect_post_fails(post_recv(qp, 0xD1, one(sge)), "post_recv in RESET");
    // INIT: receives yes, sends no.
    QpAttr a;
    a.state = QpState::kInit;
    a.access_flags = rdma::kRemoteWrite;
    TREQUIRE_OK(qp.modify(a, rdma::kAttrState | rdma::kAttrPkeyIndex | rdma::kAttrPort | rdma::kAttrAccessFlags));
    TCHECK_EQ(qp.state(), QpState::kInit);
    expect_post_fails(post_send(qp, 0xD2, WrOpcode::kSend, one(sge)), "post_send in INIT");
    Sge rs = mr->sge(16384, 4096);
    TREQUIRE_OK(post_recv(qp, 0xD3, one(rs)));
    // RTR by hand; a missing attribute is EINVAL.
    a.state = QpState::kRtr;
    a.av.dest_ip = peer.ip;
    a.path_mtu = 1024;
    a.dest_qpn = peer.qpn;
    a.rq_psn = peer.psn;
    const rdma::QpAttrMask rtr = rdma::kAttrState | rdma::kAttrAv | rdma::kAttrPathMtu | rdma::kAttrDestQpn |
                                 rdma::kAttrRqPsn | rdma::kAttrMaxDestRdAtomic | rdma::kAttrMinRnrTimer;
    auto missing = qp.modify(a, rtr & ~rdma::kAttrDestQpn);
    TCHECK(!missing);
    if (!missing) TCHECK_EQ(missing.error().code(), EINVAL);
    TCHECK_EQ(qp.state(), QpState::kInit);
    TREQUIRE_OK(qp.modify(a, rtr));
    TCHECK_EQ(qp.state(), QpState::kRtr);
    expect_post_fails(post_send(qp, 0xD4, WrOpcode::kSend, one(sge)), "post_send in RTR");
    a.state = QpState::kRts;
    a.sq_psn = mine.psn;
    TREQUIRE_OK(qp.modify(a, rdma::kAttrState | rdma::kAttrTimeout | rdma::kAttrRetryCnt | rdma::kAttrRnrRetry |
                                 rdma::kAttrSqPsn | rdma::kAttrMaxQpRdAtomic));
    TCHECK_EQ(qp.state(), QpState::kRts);
    TREQUIRE(s.sync("child ready"));

    // RTS: too many SGEs, inline too long.
    std::vector<Sge> five(5, mr->sge(0, 8)), many(rdma::kMaxSge + 1, mr->sge(0, 8));
    expect_post_fails(post_send(qp, 0xD5, WrOpcode::kSend, five), "5 SGEs with max_send_sge 4");
    expect_post_fails(post_send(qp, 0xD6, WrOpcode::kSend, many), "17 SGEs");
    expect_post_fails(post_recv(qp, 0xD7, five), "post_recv with 5 SGEs, max_recv_sge 4");
    std::vector<uint8_t> big(257, 1);
    Sge inl{.addr = reinterpret_cast<uint64_t>(big.data()), .length = 257, .lkey = 0};
    expect_post_fails(post_send(qp, 0xD8, WrOpcode::kSend, one(inl), rdma::kSendSignaled | rdma::kSendInline),
                      "inline of 257 bytes, max_inline_data 256");
    // One real send: the only thing the peer receives.
    fill_pattern(arena.p, 321, 0xF00D);
    Sge ok = mr->sge(0, 321);
    TREQUIRE_OK(post_send(qp, 0xD9, WrOpcode::kSend, one(ok)));
    TREQUIRE(expect_one(**scq, {.wr_id = 0xD9, .opcode = WcOpcode::kSend}));
    expect_none(**scq, 20ms);
    TREQUIRE(s.sync("one send"));
    // The receive posted in INIT takes the peer's answer.
    TREQUIRE(expect_one(**rcq, {.wr_id = 0xD3, .opcode = WcOpcode::kRecv, .byte_len = 77}));
    TCHECK_PATTERN(arena.p + 16384, 77, 0xBAC, 0);

    // Queue full: the peer is silent, so no SEND completes. (SENDs, not
    // WRITEs: shm executes a WRITE itself at post time, without the peer,
    // so WRITEs would complete and never fill the queue there.)
    TREQUIRE(s.sync("stop"));
    Sge w = mr->sge(0, 64);
    for (uint64_t i = 0; i < caps.max_send_wr; ++i) TREQUIRE_OK(post_send(qp, 0xE0 + i, WrOpcode::kSend, one(w)));
    expect_post_fails(post_send(qp, 0xEF, WrOpcode::kSend, one(w)), "send queue full (max_send_wr + 1)");
    expect_post_fails(post_send(qp, 0xEF, WrOpcode::kRdmaWrite, one(w), rdma::kSendSignaled, peer.addr, peer.rkey),
                      "send queue full (max_send_wr + 1), a WRITE");
    // One receive (0xD3) was taken by the peer's answer: the queue is empty.
    for (uint64_t i = 0; i < caps.max_recv_wr; ++i) TREQUIRE_OK(post_recv(qp, 0xF0 + i, one(w)));
    expect_post_fails(post_recv(qp, 0xFF, one(w)), "receive queue full (max_recv_wr + 1)");
    TREQUIRE(s.sync("go"));
    auto wcs = poll_n(**scq, caps.max_send_wr);
    TREQUIRE(wcs.size() == caps.max_send_wr);
    for (uint64_t i = 0; i < caps.max_send_wr; ++i) expect_wc(wcs[i], {.wr_id = 0xE0 + i, .opcode = WcOpcode::kSend});
    expect_none(**scq, 20ms);

    // An opcode the QP type lacks: RDMA WRITE, READ or an atomic on a UD QP.
    auto ud = s.pd->create_qp({.type = rdma::QpType::kUd, .send_cq = scq->get(), .recv_cq = rcq->get(), .caps = caps});
    if (!traits(s).ud) {
      // A provider without UD QPs refuses to create one, and says so.
      TCHECK(!ud);
      if (!ud) {
        TCHECK_EQ(ud.error().code(), EOPNOTSUPP);
        TCHECK_MSG(ud.error().message().find("UD") != std::string::npos, ud.error().message());
      }
      TREQUIRE(s.sync("end"));
      return true;
    }
    TREQUIRE_OK(ud);
    QpAttr udt;
    udt.qkey = 0x11111111;
    TREQUIRE_OK((*ud)->connect(ConnectionData{}, udt));
    TCHECK_EQ((*ud)->state(), QpState::kRts);
    SendWr uw;
    uw.wr_id = 0xDA;
    uw.opcode = WrOpcode::kRdmaWrite;
    uw.flags = rdma::kSendSignaled;
    uw.sgl = one(w);
    uw.remote_addr = peer.addr;
    uw.rkey = peer.rkey;
    uw.ud = {.ip = peer.ip, .qpn = peer.qpn, .qkey = 0x11111111};
    expect_post_fails((*ud)->post_send(uw), "RDMA_WRITE on a UD QP");
    uw.opcode = WrOpcode::kRdmaRead;
    expect_post_fails((*ud)->post_send(uw), "RDMA_READ on a UD QP");
    Sge r8 = mr->sge(0, 8);
    uw.opcode = WrOpcode::kAtomicFetchAndAdd;
    uw.sgl = one(r8);
    expect_post_fails((*ud)->post_send(uw), "ATOMIC_FETCH_AND_ADD on a UD QP");
    expect_none(**scq, 20ms);
    TREQUIRE(s.sync("end"));
    return true;
  });
}


// ===========================================================================
// 6. Post lists.

// A list of work requests in one post: posted in order with one doorbell
// and completed in order. A list with a bad request in the middle posts the
// ones before it, none after it, and the error names the index refused.
// Receives are posted as lists through the C API (the C++ layer posts one).
TEST_P(Conformance, PostLists) {
  run_pair(opts(), [](Side& s) {
    constexpr uint32_t kSlot = 8192;
    Arena arena(1 << 20);
    auto mr = register_arena(s, arena, rdma::kLocalWrite | rdma::kRemoteWrite);
    TREQUIRE(mr);
    Conn c;
    ConnOptions o;
    o.advertise = advertise(*mr);
    TREQUIRE(make_conn(s, c, o));
    auto send_len = [](uint64_t k) { return static_cast<uint32_t>(100 + 997 * k); };  // 8 SENDs, 100 .. 7079 bytes
    if (!s.parent()) {
      std::memset(arena.p, 0xEE, arena.size);
      ufab_sge sg[9];
      ufab_recv_wr rw[9];
      for (uint32_t i = 0; i < 9; ++i) {
        sg[i] = mr->sge(uint64_t{kSlot} * i, kSlot);
        rw[i] = ufab_recv_wr{.wr_id = 0x100 + i, .sg_list = &sg[i], .num_sge = 1, .reserved = 0};
      }
      uint32_t bad = 99;
      TREQUIRE(ufab_post_recv(c.qp->c(), rw, 6, &bad) == 0);
      // [ok, ok, 5 SGEs with max_recv_sge 4, ok]: two posted, bad = 2.
      ufab_sge five[5] = {sg[6], sg[6], sg[6], sg[6], sg[6]};
      ufab_recv_wr list2[4] = {rw[6], rw[7], rw[8], rw[8]};
      list2[2].sg_list = five;
      list2[2].num_sge = 5;
      list2[3].wr_id = 0x1FF;
      int rc = ufab_post_recv(c.qp->c(), list2, 4, &bad);
      TCHECK_EQ(rc, -EINVAL);
      TCHECK_EQ(bad, 2u);
      std::string why = ufab_last_error();
      TCHECK_MSG(why.find("request 2 of 4") != std::string::npos, why);
      std::fprintf(stderr, "post_recv list: %s\n", why.c_str());
      TREQUIRE(s.sync("receives posted"));
      auto wcs = poll_n(*c.rcq, 8);
      TREQUIRE(wcs.size() == 8);
      for (uint64_t k = 0; k < 8; ++k) {
        expect_wc(wcs[k], {.wr_id = 0x100 + k, .opcode = WcOpcode::kRecv, .byte_len = send_len(k), .no_imm = true});
        TCHECK_PATTERN(arena.p + kSlot * k, send_len(k), 0x5E00 + k, 0);
        TCHECK_BYTES(arena.p + kSlot * k + send_len(k), kSlot - send_len(k), 0xEE);
      }
      expect_none(*c.rcq, 20ms);  // 0x1FF was not posted
      TREQUIRE(s.sync("sends done"));
      for (uint64_t k = 0; k < 6; ++k) TCHECK_PATTERN(arena.p + (1 << 19) + kSlot * k, 4096, 0x3E00 + k, 0);
      TCHECK_BYTES(arena.p + (1 << 19) + kSlot * 6, kSlot, 0xEE);  // the WRITE after the bad one was not posted
      TREQUIRE(s.sync("end"));
      return true;
    }
    TREQUIRE(s.sync("receives posted"));
    // List A: 12 requests, WRITEs and SENDs alternating.
    std::vector<Sge> sges(16);
    std::vector<SendWr> a;
    uint64_t sends = 0, writes = 0;
    for (uint64_t i = 0; i < 12; ++i) {
      SendWr wr;
      wr.wr_id = 0x200 + i;
      wr.flags = rdma::kSendSignaled;
      if (i % 2 == 0) {
        fill_pattern(arena.p + kSlot * i, 4096, 0x3E00 + writes);
        sges[i] = mr->sge(kSlot * i, 4096);
        wr.opcode = WrOpcode::kRdmaWrite;
        wr.remote_addr = c.peer.addr + (1 << 19) + kSlot * writes++;
        wr.rkey = c.peer.rkey;
      } else {
        fill_pattern(arena.p + kSlot * i, send_len(sends), 0x5E00 + sends);
        sges[i] = mr->sge(kSlot * i, send_len(sends++));
        wr.opcode = WrOpcode::kSend;
      }
      wr.sgl = std::span<const Sge>(&sges[i], 1);
      a.push_back(wr);
    }
    TREQUIRE_OK(c.qp->post_send(a));
    // List B: [SEND, SEND, a SEND with 5 SGEs (max_send_sge 4), WRITE].
    std::vector<SendWr> b;
    Sge five[5];
    for (uint64_t i = 0; i < 2; ++i) {
      fill_pattern(arena.p + kSlot * (12 + i), send_len(sends), 0x5E00 + sends);
      sges[12 + i] = mr->sge(kSlot * (12 + i), send_len(sends++));
      b.push_back(SendWr{.wr_id = 0x210 + i, .opcode = WrOpcode::kSend, .flags = rdma::kSendSignaled,
                         .sgl = std::span<const Sge>(&sges[12 + i], 1)});
    }
    for (auto& f : five) f = mr->sge(0, 8);
    b.push_back(SendWr{.wr_id = 0x212, .opcode = WrOpcode::kSend, .flags = rdma::kSendSignaled, .sgl = five});
    sges[14] = mr->sge(0, 4096);
    b.push_back(SendWr{.wr_id = 0x213, .opcode = WrOpcode::kRdmaWrite, .flags = rdma::kSendSignaled,
                       .sgl = std::span<const Sge>(&sges[14], 1), .remote_addr = c.peer.addr + (1 << 19) + kSlot * 6,
                       .rkey = c.peer.rkey});
    auto r = c.qp->post_send(b);
    TCHECK(!r);
    if (!r) {
      TCHECK_EQ(r.error().code(), EINVAL);
      TCHECK_MSG(r.error().message().find("request 2 of 4") != std::string::npos, r.error().message());
      std::fprintf(stderr, "post_send list: %s\n", r.error().message().c_str());
    }
    auto wcs = poll_n(*c.scq, 14);
    TREQUIRE(wcs.size() == 14);
    for (uint64_t i = 0; i < 14; ++i) {
      bool write = i < 12 && i % 2 == 0;
      expect_wc(wcs[i], {.wr_id = i < 12 ? 0x200 + i : 0x210 + (i - 12),
                         .opcode = write ? WcOpcode::kRdmaWrite : WcOpcode::kSend,
                         .qp_num = c.qp->qp_num()});
    }
    expect_none(*c.scq, 20ms);
    TCHECK_EQ(c.qp->state(), QpState::kRts);
    TREQUIRE(s.sync("sends done"));
    TREQUIRE(s.sync("end"));
    return true;
  });
}

// ===========================================================================
// 7. The QP state machine.

// modify() that must fail with EINVAL, leave the QP in `state`, and name
// every word of `words` in its message.
void modify_fails(QueuePair& qp, const QpAttr& a, rdma::QpAttrMask mask, std::initializer_list<const char*> words,
                  std::source_location loc = std::source_location::current()) {
  QpState before = qp.state();
  auto r = qp.modify(a, mask);
  if (r) {
    record_failure(loc, "modify from " + show(before) + " to " + show(a.state) + " was accepted");
    return;
  }
  if (r.error().code() != EINVAL) record_failure(loc, "errno " + std::to_string(r.error().code()) + ", expected EINVAL");
  for (const char* w : words)
    if (r.error().message().find(w) == std::string::npos)
      record_failure(loc, "the error does not name \"" + std::string(w) + "\": " + r.error().message());
  if (qp.state() != before) record_failure(loc, "a failed modify moved the QP to " + show(qp.state()));
}

constexpr rdma::QpAttrMask kInitMask = rdma::kAttrState | rdma::kAttrPkeyIndex | rdma::kAttrPort | rdma::kAttrAccessFlags;
constexpr rdma::QpAttrMask kRtrMask = rdma::kAttrState | rdma::kAttrAv | rdma::kAttrPathMtu | rdma::kAttrDestQpn |
                                      rdma::kAttrRqPsn | rdma::kAttrMaxDestRdAtomic | rdma::kAttrMinRnrTimer;
constexpr rdma::QpAttrMask kRtsMask = rdma::kAttrState | rdma::kAttrSqPsn | rdma::kAttrTimeout | rdma::kAttrRetryCnt |
                                      rdma::kAttrRnrRetry | rdma::kAttrMaxQpRdAtomic;

// Every transition by hand, each kind of modify error on the way (IBA
// 10.3.1: invalid transitions, missing attributes, attributes the
// transition does not take, bad values), traffic, then recovery: both ends
// to ERROR (receives flush), to RESET, connected again, and traffic again.
TEST_P(Conformance, QpStateMachine) {
  run_pair(opts(), [](Side& s) {
    Arena arena(1 << 16);
    auto mr = register_arena(s, arena, rdma::kLocalWrite);
    TREQUIRE(mr);
    auto scq = s.dev->create_cq(64);
    TREQUIRE_OK(scq);
    auto rcq = s.dev->create_cq(64);
    TREQUIRE_OK(rcq);
    auto qpr = s.pd->create_qp({.type = rdma::QpType::kRc, .send_cq = scq->get(), .recv_cq = rcq->get()});
    TREQUIRE_OK(qpr);
    QueuePair& qp = **qpr;
    TCHECK_EQ(qp.state(), QpState::kReset);
    ConnectionData mine = qp.local(), peer;
    TREQUIRE(s.exchange(mine, &peer));

    QpAttr a;
    a.pkey_index = 0;
    a.port = 1;
    a.access_flags = rdma::kRemoteWrite;
    a.av.dest_ip = peer.ip;
    a.dest_qpn = peer.qpn;
    a.rq_psn = peer.psn;
    a.path_mtu = 1024;
    a.sq_psn = mine.psn;
    // RESET
    a.state = QpState::kRtr;
    modify_fails(qp, a, kRtrMask, {"RESET -> RTR", "not a valid transition"});
    a.state = QpState::kRts;
    modify_fails(qp, a, kRtsMask, {"RESET -> RTS", "not a valid transition"});
    a.state = QpState::kInit;
    modify_fails(qp, a, kInitMask & ~rdma::kAttrAccessFlags, {"missing", "access_flags"});
    modify_fails(qp, a, kInitMask & ~(rdma::kAttrPort | rdma::kAttrPkeyIndex), {"missing", "pkey_index", "port"});
    modify_fails(qp, a, kInitMask | rdma::kAttrTimeout, {"timeout", "cannot be set"});
    QpAttr bad = a;
    bad.port = 2;
    modify_fails(qp, bad, kInitMask, {"port 2"});
    bad = a;
    bad.pkey_index = 1;
    modify_fails(qp, bad, kInitMask, {"pkey_index 1"});
    a.state = QpState::kError;
    modify_fails(qp, a, rdma::kAttrState | rdma::kAttrTimeout, {"only the state", "timeout"});
    a.state = QpState::kInit;
    TREQUIRE_OK(qp.modify(a, kInitMask));
    TCHECK_EQ(qp.state(), QpState::kInit);
    TREQUIRE_OK(qp.modify(a, kInitMask));  // INIT -> INIT
    // INIT
    a.state = QpState::kRts;
    modify_fails(qp, a, kRtsMask, {"INIT -> RTS", "not a valid transition"});
    a.state = QpState::kRtr;
    modify_fails(qp, a, kRtrMask & ~(rdma::kAttrDestQpn | rdma::kAttrRqPsn), {"missing", "dest_qpn", "rq_psn"});
    modify_fails(qp, a, kRtrMask & ~rdma::kAttrAv, {"missing", "av"});
    modify_fails(qp, a, kRtrMask | rdma::kAttrSqPsn, {"sq_psn", "cannot be set"});
    bad = a;
    bad.path_mtu = 1000;
    modify_fails(qp, bad, kRtrMask, {"path_mtu 1000"});
    bad = a;
    bad.rq_psn = 1u << 24;
    modify_fails(qp, bad, kRtrMask, {"PSN", "24 bits"});
    bad = a;
    bad.dest_qpn = 1;
    modify_fails(qp, bad, kRtrMask, {"dest_qpn"});
    bad = a;
    bad.max_dest_rd_atomic = 0;
    modify_fails(qp, bad, kRtrMask, {"max_dest_rd_atomic"});
    bad = a;
    bad.min_rnr_timer = 32;
    modify_fails(qp, bad, kRtrMask, {"min_rnr_timer"});
    Sge rs = mr->sge(0, 4096);
    TREQUIRE_OK(post_recv(qp, 0x10, one(rs)));  // from INIT on
    TREQUIRE_OK(qp.modify(a, kRtrMask));
    TCHECK_EQ(qp.state(), QpState::kRtr);
    // RTR
    a.state = QpState::kRts;
    modify_fails(qp, a, kRtsMask & ~(rdma::kAttrTimeout | rdma::kAttrRetryCnt), {"missing", "timeout", "retry_cnt"});
    modify_fails(qp, a, kRtsMask | rdma::kAttrPathMtu, {"path_mtu", "cannot be set"});
    bad = a;
    bad.retry_cnt = 8;
    modify_fails(qp, bad, kRtsMask, {"retry_cnt"});
    bad = a;
    bad.rnr_retry = 8;
    modify_fails(qp, bad, kRtsMask, {"rnr_retry"});
    bad = a;
    bad.max_rd_atomic = 0;
    modify_fails(qp, bad, kRtsMask, {"max_rd_atomic"});
    bad = a;
    bad.sq_psn = 1u << 24;
    modify_fails(qp, bad, kRtsMask, {"PSN", "24 bits"});
    a.state = QpState::kInit;
    modify_fails(qp, a, kInitMask, {"RTR -> INIT", "not a valid transition"});
    a.state = QpState::kRts;
    TREQUIRE_OK(qp.modify(a, kRtsMask));
    TCHECK_EQ(qp.state(), QpState::kRts);
    // RTS: RTS -> RTS takes access flags and the RNR timer, not the MTU.
    a.min_rnr_timer = 14;
    TREQUIRE_OK(qp.modify(a, rdma::kAttrState | rdma::kAttrMinRnrTimer));
    modify_fails(qp, a, rdma::kAttrState | rdma::kAttrPathMtu, {"path_mtu", "cannot be set"});
    a.state = QpState::kRtr;
    modify_fails(qp, a, kRtrMask, {"RTS -> RTR", "not a valid transition"});
    QpAttr now = qp.attr();
    TCHECK_EQ(now.state, QpState::kRts);
    TCHECK_EQ(now.dest_qpn, peer.qpn);
    TCHECK_EQ(now.path_mtu, 1024u);
    TCHECK_EQ(now.av.dest_ip, peer.ip);
    TCHECK_EQ(now.min_rnr_timer, uint8_t{14});
    TREQUIRE(s.sync("both in RTS"));

    // Traffic: one SEND each way.
    fill_pattern(arena.p + 8192, 300, 0x51 + static_cast<uint64_t>(s.role));
    Sge ss = mr->sge(8192, 300);
    TREQUIRE_OK(post_send(qp, 0x20, WrOpcode::kSend, one(ss)));
    TREQUIRE(expect_one(**scq, {.wr_id = 0x20, .opcode = WcOpcode::kSend}));
    TREQUIRE(expect_one(**rcq, {.wr_id = 0x10, .opcode = WcOpcode::kRecv, .byte_len = 300}));
    TCHECK_PATTERN(arena.p, 300, 0x51 + static_cast<uint64_t>(1 - s.role), 0);
    TREQUIRE(s.sync("traffic"));

    // ERROR: a receive waiting there flushes; then RESET drops everything.
    TREQUIRE_OK(post_recv(qp, 0x11, one(rs)));
    QpAttr to;
    to.state = QpState::kError;
    TREQUIRE_OK(qp.modify(to, rdma::kAttrState));
    TCHECK_EQ(qp.state(), QpState::kError);
    TREQUIRE(expect_one(**rcq, {.wr_id = 0x11, .status = WcStatus::kWrFlushErr}));
    to.state = QpState::kRts;
    modify_fails(qp, to, kRtsMask, {"ERROR -> RTS", "not a valid transition"});
    TREQUIRE(s.sync("both in ERROR"));
    to.state = QpState::kReset;
    TREQUIRE_OK(qp.modify(to, rdma::kAttrState));
    TCHECK_EQ(qp.state(), QpState::kReset);
    {
      auto p = post_recv(qp, 0x12, one(rs));
      TCHECK_MSG(!p, "post_recv in RESET was accepted");
    }
    TREQUIRE(s.sync("both in RESET"));
    // Connected again, with fresh connection data.
    ConnectionData again = qp.local();
    TREQUIRE(s.exchange(again, &peer));
    TREQUIRE_OK(qp.connect(peer));
    TCHECK_EQ(qp.state(), QpState::kRts);
    TREQUIRE_OK(post_recv(qp, 0x13, one(rs)));
    TREQUIRE(s.sync("connected again"));
    fill_pattern(arena.p + 8192, 700, 0x61 + static_cast<uint64_t>(s.role));
    Sge s2 = mr->sge(8192, 700);
    TREQUIRE_OK(post_send(qp, 0x21, WrOpcode::kSend, one(s2)));
    TREQUIRE(expect_one(**scq, {.wr_id = 0x21, .opcode = WcOpcode::kSend}));
    TREQUIRE(expect_one(**rcq, {.wr_id = 0x13, .opcode = WcOpcode::kRecv, .byte_len = 700}));
    TCHECK_PATTERN(arena.p, 700, 0x61 + static_cast<uint64_t>(1 - s.role), 0);
    expect_none(**scq, 20ms);
    expect_none(**rcq, 20ms);
    TREQUIRE(s.sync("end"));
    return true;
  });
}

// ===========================================================================
// 8. What each provider offers (Traits), checked rather than assumed.

TEST_P(Conformance, DeviceAttributesAndUnsupportedObjects) {
  run_pair(opts(), [](Side& s) {
    const Traits& t = traits(s);
    const ufab_device_attr& at = s.dev->attr();
    TCHECK_EQ(s.dev->provider(), std::string(t.provider));
    TCHECK_EQ(at.active_mtu, t.active_mtu);
    TCHECK(s.dev->ip() != 0);
    TCHECK_EQ((at.caps & UFAB_DEVICE_CAP_UD) != 0, t.ud);
    TCHECK((at.caps & UFAB_DEVICE_CAP_ATOMICS) != 0);
    TCHECK(at.max_qp >= 256);
    TCHECK(at.max_sge >= 4);
    TCHECK(at.max_inline_data >= 256);
    auto cq = s.dev->create_cq(16);
    TREQUIRE_OK(cq);
    auto ud = s.pd->create_qp({.type = rdma::QpType::kUd, .send_cq = cq->get(), .recv_cq = cq->get()});
    const bool shm = std::string(t.provider) == "shm";
    auto ah = s.pd->create_ah({.dest_ip = shm ? s.dev->ip() : s.parent() ? 0x0A000002u : 0x0A000001u});
    if (t.ud) {
      TCHECK_MSG(ud.has_value(), ud ? "" : ud.error().message());
      TCHECK_MSG(ah.has_value(), ah ? "" : ah.error().message());
    } else {
      // Refused, with a reason, and nothing half made.
      TCHECK(!ud);
      TCHECK(!ah);
      if (!ud) TCHECK_EQ(ud.error().code(), EOPNOTSUPP);
      if (!ah) TCHECK_EQ(ah.error().code(), EOPNOTSUPP);
      if (!ud) TCHECK_MSG(ud.error().message().find("UD") != std::string::npos, ud.error().message());
      if (!ah) TCHECK_MSG(ah.error().message().find("address handle") != std::string::npos, ah.error().message());
    }
    TREQUIRE(s.sync("end"));
    return true;
  });
}

// ===========================================================================
// 9. A peer killed in the middle of a transfer.

// The child is SIGKILLed while the parent streams 64 KiB WRITEs on one QP
// and 64 KiB SENDs on another, 8 in flight on each. The survivor's QPs go to
// ERROR (soft-RoCE: ACK timeout 14 (67 ms) running out retry_cnt 2 times;
// shm: its device sees the peer die), every request posted completes
// exactly once and in order (successes, then one error, then WR_FLUSH_ERR;
// the first error per Traits::notices_peer_death), and the
// survivor's posted receives flush. After the run, with the device closed
// and the child reaped, this process has as many fds as before and /dev/shm
// nothing of the run (PairOptions::leak_check).
TEST_P(Conformance, KilledPeerMidTransfer) {
  PairOptions o = opts();
  o.child_may_die = true;
  o.leak_check = true;
  o.limit = std::chrono::seconds(60);
  run_pair(o, [](Side& s) {
    constexpr uint32_t kMsg = 64 << 10;
    constexpr uint64_t kWindow = 8;
    constexpr int kRecvs = 16;
    constexpr int kKillAfter = 24;  // SENDs the child takes before it dies
    Arena arena(4 << 20);
    auto mr = register_arena(s, arena, rdma::kLocalWrite | rdma::kRemoteWrite);
    TREQUIRE(mr);
    Conn w, m;  // the WRITE stream, the SEND stream
    ConnOptions co;
    co.tuning.timeout = 14;
    co.tuning.retry_cnt = 2;
    co.advertise = advertise(*mr);
    co.caps.max_send_wr = 64;
    TREQUIRE(make_conn(s, w, co));
    TREQUIRE(make_conn(s, m, co));
    if (!s.parent()) {
      for (int i = 0; i < kRecvs; ++i) {
        Sge sge = mr->sge(uint64_t{kMsg} * static_cast<uint64_t>(i), kMsg);
        TREQUIRE_OK(post_recv(*m.qp, static_cast<uint64_t>(i), one(sge)));
      }
      TREQUIRE(s.sync("receives posted"));
      int got = 0;
      std::vector<WorkCompletion> wcs(16);
      auto deadline = Clock::now() + 20s;
      while (got < kKillAfter && Clock::now() < deadline) {
        auto n = m.rcq->poll(wcs);
        TREQUIRE_OK(n);
        for (size_t i = 0; i < *n; ++i, ++got) {
          TCHECK_EQ(wcs[i].status, WcStatus::kSuccess);
          TCHECK_EQ(wcs[i].byte_len, kMsg);
          Sge sge = mr->sge(uint64_t{kMsg} * (wcs[i].wr_id % kRecvs), kMsg);
          TREQUIRE_OK(post_recv(*m.qp, wcs[i].wr_id, one(sge)));
        }
      }
      TCHECK_MSG(got >= kKillAfter, "only " + std::to_string(got) + " SENDs arrived");
      s.ch.send("dying");
      ::kill(::getpid(), SIGKILL);
      return true;
    }

    // The survivor. Receives that must flush when the SEND QP fails.
    for (uint64_t i = 0; i < 4; ++i) {
      Sge sge = mr->sge((2u << 20) + 4096 * i, 4096);
      TREQUIRE_OK(post_recv(*m.qp, 0x9000 + i, one(sge)));
    }
    TREQUIRE(s.sync("receives posted"));
    struct Stream {
      Conn* c;
      WrOpcode op;
      uint64_t posted = 0, completed = 0, successes = 0, errors = 0;
      bool failed = false;  // an error completion came: post no more
    } streams[2] = {{&w, WrOpcode::kRdmaWrite}, {&m, WrOpcode::kSend}};
    std::vector<WorkCompletion> wcs(32);
    auto t0 = Clock::now();
    double first_error_ms = -1;
    auto deadline = t0 + 30s;
    while (Clock::now() < deadline) {
      bool done = true;
      for (int k = 0; k < 2; ++k) {
        Stream& st = streams[k];
        while (!st.failed && st.posted - st.completed < kWindow) {
          Sge sge = mr->sge(uint64_t{kMsg} * (k * 8 + st.posted % 8), kMsg);
          uint64_t remote = st.c->peer.addr + (2u << 20) + uint64_t{kMsg} * (st.posted % 16);
          auto p = post_send(*st.c->qp, st.posted, st.op, one(sge), rdma::kSendSignaled, remote, st.c->peer.rkey);
          TREQUIRE_OK(p);
          ++st.posted;
        }
        auto n = st.c->scq->poll(wcs);
        TREQUIRE_OK(n);
        for (size_t i = 0; i < *n; ++i) {
          const WorkCompletion& wc = wcs[i];
          const char* name = k == 0 ? "WRITE stream" : "SEND stream";
          if (wc.wr_id != st.completed)
            record_failure(__FILE__, __LINE__, std::string(name) + ": completion of wr_id " + show(wc.wr_id) +
                                                   ", expected " + show(st.completed) + " (each once, in order)");
          ++st.completed;
          if (wc.status == WcStatus::kSuccess) {
            if (st.errors)
              record_failure(__FILE__, __LINE__, std::string(name) + ": a success after an error, wr_id " + show(wc.wr_id));
            ++st.successes;
            continue;
          }
          if (wc.error.empty()) record_failure(__FILE__, __LINE__, std::string(name) + ": an error without a text");
          if (st.errors == 0) {
            if (first_error_ms < 0) first_error_ms = ms_since(t0);
            bool ok = wc.status == WcStatus::kRetryExcErr ||
                      (wc.status == WcStatus::kWrFlushErr && traits(s).notices_peer_death);
            std::fprintf(stderr, "%s: first error after %llu successes: %s: %s\n", name,
                         static_cast<unsigned long long>(st.successes), show(wc.status).c_str(), wc.error.c_str());
            if (!ok) record_failure(__FILE__, __LINE__, std::string(name) + ": first error " + show(wc.status) + ": " + wc.error);
          } else if (wc.status != WcStatus::kWrFlushErr) {
            record_failure(__FILE__, __LINE__, std::string(name) + ": after the first error " + show(wc.status) +
                                                   ", expected WR_FLUSH_ERR: " + wc.error);
          }
          ++st.errors;
          st.failed = true;
        }
        if (!st.failed || st.completed != st.posted) done = false;
      }
      if (done) break;
    }
    std::fprintf(stderr, "[%s] killed peer: WRITE stream %llu posted, %llu succeeded; SEND stream %llu posted, %llu "
                 "succeeded; first error %.1f ms into the stream\n",
                 provider_name(s.provider), static_cast<unsigned long long>(streams[0].posted),
                 static_cast<unsigned long long>(streams[0].successes), static_cast<unsigned long long>(streams[1].posted),
                 static_cast<unsigned long long>(streams[1].successes), first_error_ms);
    for (const Stream& st : streams) {
      TCHECK(st.failed);
      TCHECK_EQ(st.completed, st.posted);
      TCHECK(st.successes > 0);  // the transfer was under way when the peer died
    }
    TCHECK(wait_state(*s.dev, *w.qp, QpState::kError, 10s));
    TCHECK(wait_state(*s.dev, *m.qp, QpState::kError, 10s));
    auto rw = poll_n(*m.rcq, 4, 10s);
    TREQUIRE(rw.size() == 4);
    for (uint64_t i = 0; i < 4; ++i) expect_wc(rw[i], {.wr_id = 0x9000 + i, .status = WcStatus::kWrFlushErr});
    // Posted now: flushed at once.
    Sge late = mr->sge(0, 64);
    TREQUIRE_OK(post_send(*m.qp, 0xABC, WrOpcode::kSend, one(late)));
    TREQUIRE(expect_one(*m.scq, {.wr_id = 0xABC, .status = WcStatus::kWrFlushErr}, 10s));
    expect_none(*w.scq, 20ms);
    expect_none(*m.scq, 20ms);
    expect_none(*m.rcq, 20ms);
    std::string last;
    TCHECK_MSG(s.ch.recv(&last, Clock::now() + 10s, nullptr) && last == "dying",
               "the child's last message: \"" + last + "\" " + s.ch.last_error());
    return true;
  });
}

// A peer that goes away without being killed: first it destroys one QP
// (its device stays), then it closes its device and exits. A SEND to each
// completes with RETRY_EXC_ERR (soft-RoCE: ACK timeout 12, ~17 ms, retry_cnt
// 2) and the QP goes to ERROR; except that shm notices the closed device
// with no request in flight (Traits::notices_peer_death), so that QP is in
// ERROR before the SEND, which is flushed.
TEST_P(Conformance, PeerQpDestroyedThenDeviceClosed) {
  PairOptions o = opts();
  run_pair(o, [](Side& s) {
    Arena arena(1 << 16);
    auto mr = register_arena(s, arena, rdma::kLocalWrite);
    TREQUIRE(mr);
    Conn a, b;
    ConnOptions co;
    co.tuning.timeout = 12;
    co.tuning.retry_cnt = 2;
    TREQUIRE(make_conn(s, a, co));
    TREQUIRE(make_conn(s, b, co));
    Sge sge = mr->sge(0, 100);
    if (!s.parent()) {
      TREQUIRE_OK(post_recv(*a.qp, 0x1, one(mr->sge(0, 4096))));
      TREQUIRE_OK(post_recv(*b.qp, 0x2, one(mr->sge(4096, 4096))));
      TREQUIRE(s.sync("posted"));
      TREQUIRE(expect_one(*a.rcq, {.wr_id = 0x1, .opcode = WcOpcode::kRecv, .byte_len = 100}));
      TREQUIRE(expect_one(*b.rcq, {.wr_id = 0x2, .opcode = WcOpcode::kRecv, .byte_len = 100}));
      a.qp.reset();
      TREQUIRE(s.sync("destroyed"));
      TREQUIRE(s.sync("a failed"));
      // Close the device: every object of it, then the device itself.
      b = Conn{};
      a = Conn{};
      mr.reset();
      s.pd.reset();
      s.dev.reset();
      TREQUIRE(s.ch.send("closed"));
      return true;
    }
    TREQUIRE(s.sync("posted"));
    TREQUIRE_OK(post_send(*a.qp, 0x11, WrOpcode::kSend, one(sge)));
    TREQUIRE_OK(post_send(*b.qp, 0x12, WrOpcode::kSend, one(sge)));
    TREQUIRE(expect_one(*a.scq, {.wr_id = 0x11, .opcode = WcOpcode::kSend}));
    TREQUIRE(expect_one(*b.scq, {.wr_id = 0x12, .opcode = WcOpcode::kSend}));
    TREQUIRE(s.sync("destroyed"));
    TCHECK_EQ(a.qp->state(), QpState::kRts);
    auto t0 = Clock::now();
    TREQUIRE_OK(post_send(*a.qp, 0x13, WrOpcode::kSend, one(sge)));
    TREQUIRE(expect_error(s, a, *a.scq, 0x13, WcStatus::kRetryExcErr, 10s));
    std::fprintf(stderr, "[%s] SEND to a destroyed QP: RETRY_EXC_ERR after %.1f ms\n", provider_name(s.provider),
                 ms_since(t0));
    TREQUIRE(s.sync("a failed"));
    std::string closed;
    TREQUIRE(s.ch.recv(&closed, Clock::now() + 10s, s.dev.get()));
    TCHECK_EQ(closed, std::string("closed"));
    TCHECK_MSG(s.ch.wait_eof(Clock::now() + 10s, s.dev.get()), "the child did not exit");
    if (traits(s).notices_peer_death) {
      TREQUIRE(wait_state(*s.dev, *b.qp, QpState::kError, 10s));
      TREQUIRE_OK(post_send(*b.qp, 0x14, WrOpcode::kSend, one(sge)));
      TREQUIRE(expect_one(*b.scq, {.wr_id = 0x14, .status = WcStatus::kWrFlushErr}, 10s));
    } else {
      drive_for(*s.dev, 100ms);
      TCHECK_EQ(b.qp->state(), QpState::kRts);  // nothing told it
      t0 = Clock::now();
      TREQUIRE_OK(post_send(*b.qp, 0x14, WrOpcode::kSend, one(sge)));
      TREQUIRE(expect_error(s, b, *b.scq, 0x14, WcStatus::kRetryExcErr, 10s));
      std::fprintf(stderr, "[%s] SEND to a closed device: RETRY_EXC_ERR after %.1f ms\n", provider_name(s.provider),
                   ms_since(t0));
    }
    TCHECK_EQ(b.qp->state(), QpState::kError);
    expect_none(*b.scq, 20ms);
    return true;
  });
}

INSTANTIATE_TEST_SUITE_P(Providers, Conformance, ::testing::Values(Provider::kSoftRoceSwnic, Provider::kShm),
                         [](const ::testing::TestParamInfo<Provider>& i) {
                           return i.param == Provider::kShm ? std::string("shm") : std::string("SoftRoceOverSwnic");
                         });

}  // namespace
}  // namespace ufab::provider_conformance_test
