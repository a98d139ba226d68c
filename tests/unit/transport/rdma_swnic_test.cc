// The RDMA API (api/rdma.h) end to end over the software NIC, with the two
// ends in two processes: port 0 in the test process (gtest's assertions),
// port 1 in a forked child that reports its failures through a socketpair
// and its exit status.
//
// Covered: every operation in both directions and message sizes 0 .. 1 MiB
// (path MTU 1024) checked byte for byte; inline sends; gather and scatter;
// unsignaled sends; 256 RC QP pairs at once; blocking CQ waits (with and
// without a progress thread); every completion error verbs defines for RC
// that a peer can provoke, with the QP states afterwards; CQ overflow; and
// the errors post_send/post_recv report at post time.
//
// Every wait has a deadline. The two processes, their control channel and
// the checks that work in both: two_process.h.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
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

#include "ufab/rdma.hpp"
#include "tests/unit/transport/two_process.h"

namespace ufab::rdma_swnic_test {
namespace {

using namespace ::ufab::two_process;

// ---------------------------------------------------------------------------
// Patterns.

// Byte `off` of the message named by `seed`: every message (size, direction,
// tag) and every offset in it differ, so misplaced, reordered or stale data
// shows.
inline uint8_t pattern_byte(uint64_t seed, uint64_t off) {
  uint64_t x = (seed + 1) * 0x9E3779B97F4A7C15ull ^ (off * 0xD1B54A32D192ED03ull);
  x ^= x >> 31;
  return static_cast<uint8_t>(x ^ (x >> 17) ^ (x >> 40));
}

void fill_pattern(uint8_t* p, uint64_t len, uint64_t seed, uint64_t first_off = 0) {
  for (uint64_t i = 0; i < len; ++i) p[i] = pattern_byte(seed, first_off + i);
}

// -1 when [p, p + len) holds bytes first_off.. of message `seed`, else the
// first offset (relative to p) that does not.
int64_t pattern_mismatch(const uint8_t* p, uint64_t len, uint64_t seed, uint64_t first_off = 0) {
  for (uint64_t i = 0; i < len; ++i)
    if (p[i] != pattern_byte(seed, first_off + i)) return static_cast<int64_t>(i);
  return -1;
}

int64_t byte_mismatch(const uint8_t* p, uint64_t len, uint8_t v) {
  for (uint64_t i = 0; i < len; ++i)
    if (p[i] != v) return static_cast<int64_t>(i);
  return -1;
}

#define TCHECK_PATTERN(p, len, seed, first_off)                                                   \
  do {                                                                                            \
    int64_t tcp_bad_ = ::ufab::rdma_swnic_test::pattern_mismatch((p), (len), (seed), (first_off)); \
    if (tcp_bad_ >= 0)                                                                            \
      ::ufab::two_process::record_failure(                                                    \
          __FILE__, __LINE__,                                                                     \
          std::string("data differs at byte ") + std::to_string(tcp_bad_) + " of " +             \
              std::to_string(static_cast<uint64_t>(len)) + " (" #p ")");                         \
  } while (0)

#define TCHECK_BYTES(p, len, v)                                                                   \
  do {                                                                                            \
    int64_t tcb_bad_ = ::ufab::rdma_swnic_test::byte_mismatch((p), (len), (v));                   \
    if (tcb_bad_ >= 0)                                                                            \
      ::ufab::two_process::record_failure(                                                    \
          __FILE__, __LINE__,                                                                     \
          std::string("byte ") + std::to_string(tcb_bad_) + " of " #p " was overwritten");        \
  } while (0)

Status post_atomic(QueuePair& qp, uint64_t wr_id, WrOpcode op, const Sge& result, uint64_t remote_addr,
                   uint32_t rkey, uint64_t compare_add, uint64_t swap) {
  SendWr wr;
  wr.wr_id = wr_id;
  wr.opcode = op;
  wr.flags = rdma::kSendSignaled;
  wr.sgl = std::span<const Sge>(&result, 1);
  wr.remote_addr = remote_addr;
  wr.rkey = rkey;
  wr.compare_add = compare_add;
  wr.swap = swap;
  return qp.post_send(wr);
}

// What most scenarios start from: a 64 KiB arena registered for local
// writes and one connection made with `o`; then `body`.
using ConnectedBody = std::function<bool(Side&, Arena&, MemoryRegion&, Conn&)>;
std::function<bool(Side&)> connected(ConnectedBody body, ConnOptions o = {}) {
  return [body = std::move(body), o](Side& s) {
    Arena arena(1 << 16);
    auto mr = register_arena(s, arena, rdma::kLocalWrite);
    TREQUIRE(mr);
    Conn c;
    TREQUIRE(make_conn(s, c, o));
    return body(s, arena, *mr, c);
  };
}

// A request of `c` that completes in error on `cq` (c's send or receive CQ),
// after which the QP goes to ERROR.
bool expect_error(Side& s, Conn& c, CompletionQueue& cq, uint64_t wr_id, WcStatus status, milliseconds limit = 20s,
                  std::source_location loc = std::source_location::current()) {
  if (!expect_one(cq, {.wr_id = wr_id, .status = status, .qp_num = c.qp->qp_num()}, limit, loc)) return false;
  if (!wait_state(*s.dev, *c.qp, QpState::kError, 10s, loc)) record_failure(loc, "check failed: the QP in ERROR");
  return true;
}

// ===========================================================================
// 1. Every operation, both directions.

constexpr uint32_t kSizes[] = {0, 1, 1023, 1024, 1025, 2048, 4095, 4096, 65536, 1u << 20};
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
  TCHECK_EQ(s.dev->active_mtu(), 1024u);
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

TEST(RdmaSwnic, EveryOperationBothDirections) {
  run_pair({}, [](Side& s) { return every_operation(s, false); });
}

// The same with progress threads at both ends, and PSNs that wrap past
// 2^24 - 1 during the first direction.
TEST(RdmaSwnic, EveryOperationBothDirectionsWithProgressThreadsAndPsnWrap) {
  PairOptions o;
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

TEST(RdmaSwnic, ManyQueuePairsAtOnce) {
  run_pair({}, many_qps);
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

    // Nothing arrives: 0 after the timeout, not much earlier.
    for (int timeout : {200, 50}) {
      t0 = Clock::now();
      r = c.rcq->wait(out, milliseconds(timeout));
      ms = ms_since(t0);
      TREQUIRE_OK(r);
      TCHECK_EQ(*r, size_t{0});
      TCHECK_MSG(ms >= timeout - 2 && ms < timeout + 500,
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

TEST(RdmaSwnic, CqWaitBlocksUntilACompletionOrTheTimeout) {
  run_pair({}, connected(cq_wait));
}

TEST(RdmaSwnic, CqWaitWithProgressThread) {
  PairOptions o;
  o.progress_thread[0] = true;
  run_pair(o, connected(cq_wait));
}

// With a progress thread, the CQ's eventfd becomes readable while the
// application makes no ufab call at all.
TEST(RdmaSwnic, CqEventFdWithProgressThread) {
  PairOptions o;
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
TEST(RdmaSwnicErrors, LocalLengthError) {
  run_pair({}, connected([](Side& s, Arena&, MemoryRegion& mr, Conn& c) {
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
TEST(RdmaSwnicErrors, LocalProtectionError) {
  run_pair({}, [](Side& s) {
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
TEST(RdmaSwnicErrors, RemoteAccessError) {
  run_pair({}, [](Side& s) {
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
TEST(RdmaSwnicErrors, RemoteOperationalError) {
  run_pair({}, connected([](Side& s, Arena& arena, MemoryRegion& mr, Conn& c) {
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
TEST(RdmaSwnicErrors, RemoteInvalidRequest) {
  run_pair({}, [](Side& s) {
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
        // retransmissions of both packets of the 2000-byte SEND.
        TCHECK_EQ(timeouts, 3ull);
        TCHECK_EQ(retransmits, 4ull);
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

// RNR_RETRY_EXC_ERR: no receive at the peer, rnr_retry 1, min_rnr_timer 1
// (0.01 ms). The responder's QP stays in RTS. Then with rnr_retry 7
// (infinite) a receive posted 100 ms late is found.
TEST(RdmaSwnicErrors, RnrRetryExceeded) {
  run_pair({}, [](Side& s) {
    Arena arena(1 << 16);
    auto mr = register_arena(s, arena, rdma::kLocalWrite);
    TREQUIRE(mr);
    Conn c, late;
    ConnOptions o;
    o.tuning.min_rnr_timer = 1;
    o.tuning.rnr_retry = 1;
    TREQUIRE(make_conn(s, c, o));
    o.tuning.rnr_retry = 7;
    TREQUIRE(make_conn(s, late, o));
    if (s.parent()) {
      Sge sge = mr->sge(0, 64);
      auto t0 = Clock::now();
      TREQUIRE_OK(post_send(*c.qp, 0x80, WrOpcode::kSend, one(sge)));
      TREQUIRE(expect_error(s, c, *c.scq, 0x80, WcStatus::kRnrRetryExcErr, 10s));
      auto st = s.dev->stats();
      std::fprintf(stderr, "RNR_RETRY_EXC_ERR after %.1f ms, %llu RNR NAKs received\n", ms_since(t0),
                   static_cast<unsigned long long>(st.rnr_naks_received));
      TCHECK(st.rnr_naks_received >= 2);
      TREQUIRE(s.sync("first done"));
      TREQUIRE_OK(post_send(*late.qp, 0x81, WrOpcode::kSend, one(sge)));
      TREQUIRE(expect_one(*late.scq, {.wr_id = 0x81, .opcode = WcOpcode::kSend}, 10s));
      TREQUIRE(s.sync("second done"));
    } else {
      TREQUIRE(s.sync("first done"));
      TCHECK_EQ(c.qp->state(), QpState::kRts);
      expect_none(*c.rcq, 20ms);
      drive_for(*s.dev, 100ms);
      Sge sge = mr->sge(0, 64);
      TREQUIRE_OK(post_recv(*late.qp, 0x82, one(sge)));
      TREQUIRE(expect_one(*late.rcq, {.wr_id = 0x82, .opcode = WcOpcode::kRecv, .byte_len = 64}, 10s));
      TCHECK(s.dev->stats().rnr_naks_sent >= 2);
      TREQUIRE(s.sync("second done"));
    }
    return true;
  });
}

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

// WR_FLUSH_ERR: work queued behind a failed request, receives of a QP that
// went to ERROR, work posted after it went to ERROR, and modify(ERROR).
TEST(RdmaSwnicErrors, WorkRequestFlushed) {
  run_pair({}, [](Side& s) {
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
TEST(RdmaSwnicErrors, CqOverflow) {
  run_pair({}, [](Side& s) {
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

TEST(RdmaSwnic, PostTimeErrors) {
  run_pair({}, [](Side& s) {
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
      // Silent (no progress) while the parent fills its send queue.
      TREQUIRE(s.sync("stop"));
      TREQUIRE(s.sync("go", 30s, false));
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

    // Queue full: the peer is silent, so nothing completes.
    TREQUIRE(s.sync("stop"));
    Sge w = mr->sge(0, 64);
    for (uint64_t i = 0; i < caps.max_send_wr; ++i)
      TREQUIRE_OK(post_send(qp, 0xE0 + i, WrOpcode::kRdmaWrite, one(w), rdma::kSendSignaled, peer.addr + 64 * i, peer.rkey));
    expect_post_fails(post_send(qp, 0xEF, WrOpcode::kRdmaWrite, one(w), rdma::kSendSignaled, peer.addr, peer.rkey),
                      "send queue full (max_send_wr + 1)");
    for (uint64_t i = 0; i < caps.max_recv_wr; ++i) TREQUIRE_OK(post_recv(qp, 0xF0 + i, one(w)));
    expect_post_fails(post_recv(qp, 0xFF, one(w)), "receive queue full (max_recv_wr + 1)");
    TREQUIRE(s.sync("go"));
    auto wcs = poll_n(**scq, caps.max_send_wr);
    TREQUIRE(wcs.size() == caps.max_send_wr);
    for (uint64_t i = 0; i < caps.max_send_wr; ++i) expect_wc(wcs[i], {.wr_id = 0xE0 + i, .opcode = WcOpcode::kRdmaWrite});
    expect_none(**scq, 20ms);

    // An opcode the QP type lacks: RDMA WRITE, READ or an atomic on a UD QP.
    auto ud = s.pd->create_qp({.type = rdma::QpType::kUd, .send_cq = scq->get(), .recv_cq = rcq->get(), .caps = caps});
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

}  // namespace
}  // namespace ufab::rdma_swnic_test
