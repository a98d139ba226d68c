// A queue pair's state in the GPU staging pipeline (docs/gpu.md), kept
// apart from QueuePairImpl so a QP that never touches GPU memory carries
// one null pointer. Everything here runs under the QP's lane lock; the
// only thing shared with other threads is the device's Pool (its own
// mutex) and the copy engine's completion words (read with one load).
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "core/rdma/memory.h"
#include "core/staging/pool.h"
#include "core/transport/verbs.h"

namespace ufab::transport {

struct QpStaging {
  explicit QpStaging(staging::Pool& p) : pool(p), frag(p.frag()), depth(p.depth()) {}
  ~QpStaging();

  staging::Pool& pool;
  const uint64_t frag;
  const uint32_t depth;

  // Requester, SEND/WRITE from GPU memory: fragments copied out (device to
  // host) in send order, `depth` at most, each held until every packet of
  // it is acknowledged (a go-back resends from the slot).
  struct OutFrag {
    uint64_t sq_index = 0;
    uint32_t frag = 0;
    uint32_t end_pkts = 0;  // packets of the message up to this fragment's end
    uint32_t slot = 0;
    uint32_t ticket = 0;
    bool ready = false;
    std::vector<verbs::Access> pins;  // the source regions, while the copy runs
  };
  std::deque<OutFrag> out;
  uint64_t out_sq = 0;     // the next fragment to stage: its WQE ...
  uint32_t out_frag = 0;   // ... and index

  // Requester, READ into GPU memory: every fragment's slot reserved at
  // start; a fragment whose responses all arrived is copied in.
  struct ReadStage {
    uint64_t sq_index = 0;
    std::vector<uint32_t> slots;
    std::vector<uint32_t> got;                 // response packets per fragment
    std::vector<int64_t> ticket;               // -1: not copied yet, -2: placed
    std::vector<std::vector<verbs::Access>> pins;
    uint32_t placed = 0;
  };
  std::deque<ReadStage> reads;

  // Responder, WRITE/SEND into GPU memory: packets land in the filling
  // slot; a copy in starts when the fragment is full, at the message's
  // last packet, at a packet that asks for an ACK, or when an answer waits
  // for the bytes so far. Answers
  // (ACK, NAK, READ responses) and receive completions leave only once
  // every byte before their PSN is placed.
  struct InJob {
    uint32_t first_psn = 0;
    uint32_t ticket = 0;
    std::optional<uint32_t> slot;  // given back when this job is done (the fragment's last)
    std::vector<verbs::Access> pins;
  };
  std::deque<InJob> in_jobs;
  struct Fill {
    bool active = false;
    uint32_t slot = 0;
    uint64_t base = 0;    // message offset of the slot's first byte
    uint64_t copied = 0;  // message offsets: [base, copied) has a copy started
    uint64_t filled = 0;  // [base, filled) landed in the slot
    uint32_t first_psn = 0;  // PSN of the first byte not yet in a copy
  } fill;
  struct Deferred {
    uint32_t psn = 0;
    verbs::WorkCompletion wc;
  };
  std::deque<Deferred> deferred;  // receive completions waiting for placement, in order

  // Responder, READ of GPU memory: the front READ reply's fragments copied
  // out ahead of its responses, `depth` at most.
  struct RespFrag {
    uint32_t k = 0;
    uint32_t slot = 0;
    uint32_t ticket = 0;
    bool ready = false;
    verbs::Access pin;
  };
  struct RespRead {
    bool active = false;
    uint32_t psn = 0, rkey = 0, length = 0;
    uint64_t va = 0;
    uint32_t next = 0;  // the next fragment to stage
    std::deque<RespFrag> frags;
  } rr;

  // The earliest PSN whose bytes are not placed yet, if any.
  std::optional<uint32_t> pending_psn() const {
    if (!in_jobs.empty()) return in_jobs.front().first_psn;
    if (fill.active && fill.filled > fill.copied) return fill.first_psn;
    return std::nullopt;
  }
  bool busy() const;
  // Gives back a slot packets were built from (out, READ responses): one
  // whose copy is pending once it lands; a landed one only at the QP's next
  // transmit (give_back), since a frame queued from it is read when the
  // lane flushes its TX batch.
  void retire(uint32_t ticket, bool pending, uint32_t slot);
  void give_back();
  std::vector<uint32_t> give_later;
  void clear_out();
  void clear_reads();
  void clear_in();
  void clear_rr();
};

}  // namespace ufab::transport
