// The GPU staging pipeline of a queue pair (docs/gpu.md, "Staging
// pipeline"): GPU memory is never touched by the CPU; fragments move
// between it and pinned host slots of the device's pool through the copy
// engine, and the transport builds packets only from staged bytes and
// answers or completes only once received bytes are placed.
#include <algorithm>
#include <cstring>

#include "core/transport/gpu_staging.h"
#include "core/transport/lane.h"
#include "core/transport/queue_pair.h"

namespace ufab::transport {

using namespace verbs;
using roce::psn_add;
using roce::psn_diff;
using staging::CopyEngine;
using staging::CopySegment;

namespace {

bool is_send_or_write(WrOpcode op) {
  return op == WrOpcode::kSend || op == WrOpcode::kSendWithImm || op == WrOpcode::kRdmaWrite ||
         op == WrOpcode::kRdmaWriteWithImm;
}

// The segments that copy message bytes [from, from + n) between `slot`
// (the bytes at message offset `base`) and an SGE list, each SGE checked
// (GPU memory allowed) and pinned. `to_sges`: slot -> memory.
std::optional<KeyCheckError> sge_segments(const MemoryRegionTable& mem, PdId pd, const Sge* sge, uint32_t num_sge,
                                          uint64_t from, uint64_t n, uint8_t* slot, uint64_t base, bool to_sges,
                                          std::vector<CopySegment>& segs, std::vector<Access>& pins) {
  uint64_t skip = from;
  for (uint32_t i = 0; i < num_sge && n > 0; ++i) {
    if (skip >= sge[i].length) {
      skip -= sge[i].length;
      continue;
    }
    const uint64_t take = std::min<uint64_t>(sge[i].length - skip, n);
    auto a = mem.check_local(sge[i].lkey, pd, sge[i].addr + skip, take, to_sges, true);
    if (!a) return a.error();
    uint8_t* s = slot + (from - base);
    segs.push_back(to_sges ? CopySegment{a->data(), s, take} : CopySegment{s, a->data(), take});
    pins.push_back(std::move(*a));
    from += take;
    n -= take;
    skip = 0;
  }
  return std::nullopt;
}

}  // namespace

// ------------------------------------------------------------ QpStaging

QpStaging::~QpStaging() {
  clear_out();
  clear_reads();
  clear_in();
  clear_rr();
  give_back();  // destroyed under the lane lock: every queued frame was flushed
}

void QpStaging::retire(uint32_t ticket, bool pending, uint32_t slot) {
  if (pending) {
    pool.orphan(ticket, slot);  // not landed: no packet was built from it
  } else {
    give_later.push_back(slot);
  }
}

void QpStaging::give_back() {
  for (uint32_t s : give_later) pool.give(s);
  give_later.clear();
}

bool QpStaging::busy() const {
  for (const OutFrag& f : out) {
    if (!f.ready) return true;
  }
  for (const ReadStage& r : reads) {
    if (r.placed < r.slots.size()) return true;
  }
  return !in_jobs.empty() || !deferred.empty() || (rr.active && !rr.frags.empty());
}

void QpStaging::clear_out() {
  for (OutFrag& f : out) retire(f.ticket, !f.ready, f.slot);
  out.clear();
}

void QpStaging::clear_reads() {
  for (ReadStage& r : reads) {
    for (size_t k = 0; k < r.slots.size(); ++k) {
      if (r.ticket[k] >= 0) {
        // A copy started and not seen done: the pool frees the slot when it is.
        pool.orphan(static_cast<uint32_t>(r.ticket[k]), r.slots[k]);
      } else {
        pool.give(r.slots[k]);
      }
    }
  }
  reads.clear();
}

void QpStaging::clear_in() {
  if (fill.active) {
    // Copies of part of the filling slot may still read it: the newest of
    // them (the slot's) gives it back once done.
    if (fill.copied != fill.base && !in_jobs.empty()) {
      in_jobs.back().slot = fill.slot;
    } else {
      pool.give(fill.slot);
    }
  }
  for (InJob& j : in_jobs) pool.orphan(j.ticket, j.slot);
  in_jobs.clear();
  fill = Fill{};
  deferred.clear();
}

void QpStaging::clear_rr() {
  for (RespFrag& f : rr.frags) retire(f.ticket, !f.ready, f.slot);
  rr.frags.clear();
  rr.active = false;
}

// ------------------------------------------------------------ QP side

QueuePairImpl::~QueuePairImpl() = default;

QpStaging& QueuePairImpl::stage() {
  if (!stage_) stage_ = std::make_unique<QpStaging>(*ctx_.staging());
  return *stage_;
}

uint64_t QueuePairImpl::stage_frag() const { return stage_ ? stage_->frag : ctx_.staging()->frag(); }

void QueuePairImpl::stage_abort(bool emit) {
  if (!stage_) return;
  if (emit) stage_emit_deferred(true);
  stage_->clear_out();
  stage_->clear_reads();
  stage_->clear_in();
  stage_->clear_rr();
  in_gpu_ = false;
}

// One round: copies that landed, slots acknowledged, copies to start,
// completions that waited. Returns 1 while anything is in flight.
int QueuePairImpl::stage_progress() {
  QpStaging& st = *stage_;
  CopyEngine& eng = st.pool.engine();
  std::string failed;
  // Requester, out: landed copies; acknowledged fragments back to the pool.
  for (QpStaging::OutFrag& f : st.out) {
    if (f.ready) continue;
    uint32_t s = eng.state(f.ticket);
    if (s == CopyEngine::kPending) continue;
    if (s == CopyEngine::kFailed && failed.empty()) failed = eng.failure(f.ticket);
    eng.release(f.ticket);
    f.ready = true;
    f.pins.clear();
  }
  while (!st.out.empty()) {
    QpStaging::OutFrag& f = st.out.front();
    bool done = f.sq_index < sq_head_;
    if (!done) {
      SendWqe& w = sq_at(f.sq_index);
      done = w.started && psn_diff(una_psn_, psn_add(w.first_psn, f.end_pkts)) >= 0;
    }
    if (!done) break;
    st.retire(f.ticket, !f.ready, f.slot);
    st.out.pop_front();
  }
  if (st.out_sq < sq_head_) {
    st.out_sq = sq_head_;
    st.out_frag = 0;
  }
  // Start copies ahead, in send order.
  while (st.out.size() < st.depth && st.out_sq < sq_tail_ && failed.empty() && attr_.state == QpState::kRts) {
    SendWqe& w = sq_at(st.out_sq);
    const uint32_t nfrags = w.gpu && is_send_or_write(w.wr.opcode) ? static_cast<uint32_t>((w.length + st.frag - 1) / st.frag) : 0;
    if (st.out_frag >= nfrags) {
      ++st.out_sq;
      st.out_frag = 0;
      continue;
    }
    auto slot = st.pool.take();
    if (!slot) break;
    const uint64_t base = uint64_t{st.out_frag} * st.frag;
    const uint64_t n = std::min<uint64_t>(st.frag, w.length - base);
    std::vector<CopySegment> segs;
    QpStaging::OutFrag f{.sq_index = st.out_sq, .frag = st.out_frag,
                         .end_pkts = roce::packets_for(base + n, mtu_), .slot = *slot};
    if (auto e = sge_segments(ctx_.memory(), pd_, w.sge.data(), w.num_sge, base, n, st.pool.slot(*slot), base, false,
                              segs, f.pins)) {
      st.pool.give(*slot);
      fail_from(st.out_sq, WcStatus::kLocProtErr, std::string(wr_opcode_name(w.wr.opcode)) + " from GPU memory: " +
                                                      e->message());
      return 0;
    }
    auto t = eng.submit(segs);
    if (!t) {
      st.pool.give(*slot);
      break;  // every ticket in flight: later
    }
    f.ticket = *t;
    st.out.push_back(std::move(f));
    ++st.out_frag;
  }
  // Requester, READ into GPU memory: landed copies.
  bool read_landed = false;
  for (QpStaging::ReadStage& r : st.reads) {
    for (size_t k = 0; k < r.ticket.size(); ++k) {
      if (r.ticket[k] < 0) continue;
      uint32_t s = eng.state(static_cast<uint32_t>(r.ticket[k]));
      if (s == CopyEngine::kPending) continue;
      if (s == CopyEngine::kFailed && failed.empty()) failed = eng.failure(static_cast<uint32_t>(r.ticket[k]));
      eng.release(static_cast<uint32_t>(r.ticket[k]));
      r.ticket[k] = -2;
      r.pins[k].clear();
      ++r.placed;
      read_landed = true;
    }
  }
  while (!st.reads.empty() && st.reads.front().sq_index < sq_head_) {
    QpStaging::ReadStage& r = st.reads.front();
    for (size_t k = 0; k < r.slots.size(); ++k) {
      if (r.ticket[k] >= 0) {
        st.pool.orphan(static_cast<uint32_t>(r.ticket[k]), r.slots[k]);
      } else {
        st.pool.give(r.slots[k]);
      }
    }
    st.reads.pop_front();
  }
  // Responder: landed copies in, popped in PSN order (a later one that
  // landed first waits: answers go by the earliest unplaced byte).
  while (!st.in_jobs.empty()) {
    QpStaging::InJob& j = st.in_jobs.front();
    uint32_t s = eng.state(j.ticket);
    if (s == CopyEngine::kPending) break;
    if (s == CopyEngine::kFailed && failed.empty()) failed = eng.failure(j.ticket);
    eng.release(j.ticket);
    if (j.slot) st.pool.give(*j.slot);
    st.in_jobs.pop_front();
  }
  // Responder: the front READ reply's fragments.
  if (st.rr.active) {
    if (replies_.empty() || replies_.front().kind != Reply::kRead || !replies_.front().gpu ||
        replies_.front().psn != st.rr.psn || replies_.front().va != st.rr.va) {
      st.clear_rr();
    } else {
      for (QpStaging::RespFrag& f : st.rr.frags) {
        if (f.ready) continue;
        uint32_t s = eng.state(f.ticket);
        if (s == CopyEngine::kPending) continue;
        if (s == CopyEngine::kFailed && failed.empty()) failed = eng.failure(f.ticket);
        eng.release(f.ticket);
        f.ready = true;
        f.pin.release();
      }
    }
  }
  if (!failed.empty()) {
    if (attr_.state != QpState::kError) {
      fail_head(WcStatus::kLocQpOpErr, "GPU staging copy failed: " + failed);
    }
    return 0;
  }
  stage_emit_deferred(false);
  if (read_landed && sq_head_ < sq_tail_ && sq_at(sq_head_).gpu) complete_done();
  return st.busy() ? 1 : 0;
}

// Receive completions that waited for placement, in order, once every
// byte before their PSN is in place (all of them when `flush`: the QP is
// going to ERROR, and they complete flushed).
void QueuePairImpl::stage_emit_deferred(bool flush) {
  QpStaging& st = *stage_;
  while (!st.deferred.empty()) {
    QpStaging::Deferred& d = st.deferred.front();
    if (!flush) {
      auto pending = st.pending_psn();
      if (pending && psn_diff(d.psn, *pending) >= 0) break;
    } else {
      d.wc.status = WcStatus::kWrFlushErr;
      d.wc.error = "flushed: the QP went to ERROR before the data reached GPU memory";
    }
    push_completion(recv_cq_, std::move(d.wc));
    st.deferred.pop_front();
  }
}

// ------------------------------------------------------------ requester

int QueuePairImpl::staged_piece(SendWqe& w, const RequestPacket& p, Gather& g) {
  QpStaging& st = stage();
  const uint32_t k = static_cast<uint32_t>(p.offset / st.frag);
  for (const QpStaging::OutFrag& f : st.out) {
    if (f.sq_index != sq_next_ || f.frag != k) continue;
    if (!f.ready) return 0;
    g.device[g.n] = 0;
    g.pieces[g.n++] = {st.pool.slot(f.slot) + (p.offset - uint64_t{k} * st.frag), p.payload};
    return 1;
  }
  // Not staged: ahead of the copies (they get there), or behind them (a
  // go-back past what was acknowledged, which does not happen; copied
  // again from there to be safe).
  if (sq_next_ < st.out_sq || (sq_next_ == st.out_sq && k < st.out_frag)) {
    st.clear_out();
    st.out_sq = sq_next_;
    st.out_frag = k;
  }
  (void)w;
  return 0;
}

bool QueuePairImpl::stage_read_start(SendWqe& w) {
  QpStaging& st = stage();
  const uint32_t n = static_cast<uint32_t>((w.length + st.frag - 1) / st.frag);
  QpStaging::ReadStage r;
  if (!st.pool.take_n(n, r.slots)) return false;
  r.sq_index = sq_next_;
  r.got.assign(n, 0);
  r.ticket.assign(n, -1);
  r.pins.resize(n);
  st.reads.push_back(std::move(r));
  return true;
}

bool QueuePairImpl::stage_read_response(uint64_t sq_index, SendWqe& w, uint64_t offset,
                                        std::span<const uint8_t> payload) {
  QpStaging& st = stage();
  auto it = std::find_if(st.reads.begin(), st.reads.end(), [&](const auto& r) { return r.sq_index == sq_index; });
  if (it == st.reads.end()) {
    fail_head(WcStatus::kLocQpOpErr, "READ into GPU memory: no staging slots for its responses");
    return false;
  }
  const uint32_t k = static_cast<uint32_t>(offset / st.frag);
  const uint64_t base = uint64_t{k} * st.frag;
  uint8_t* slot = st.pool.slot(it->slots[k]);
  if (!payload.empty()) std::memcpy(slot + (offset - base), payload.data(), payload.size());
  const uint64_t n = std::min<uint64_t>(st.frag, w.length - base);
  // (base is a multiple of the MTU: gpu_frag is a multiple of 4096.)
  if (++it->got[k] < roce::packets_for(base + n, mtu_) - base / mtu_) return true;
  std::vector<CopySegment> segs;
  if (auto e = sge_segments(ctx_.memory(), pd_, w.sge.data(), w.num_sge, base, n, slot, base, true, segs,
                            it->pins[k])) {
    fail_head(WcStatus::kLocProtErr, "RDMA_READ destination: " + e->message());
    return false;
  }
  auto t = st.pool.engine().submit(segs);
  if (!t) {
    fail_head(WcStatus::kLocQpOpErr, "READ into GPU memory: " + t.error().message());
    return false;
  }
  it->ticket[k] = *t;
  return true;
}

bool QueuePairImpl::stage_read_placed(uint64_t sq_index) {
  if (!stage_) return false;
  for (const QpStaging::ReadStage& r : stage_->reads) {
    if (r.sq_index == sq_index) return r.placed == r.slots.size();
  }
  return false;
}

bool QueuePairImpl::stage_local_wait() {
  if (!stage_ || sq_head_ >= sq_tail_) return false;
  const SendWqe& h = sq_at(sq_head_);
  return h.gpu && h.started && h.wr.opcode == WrOpcode::kRdmaRead && h.rcv_pkts >= h.npkts;
}

// ------------------------------------------------------------ responder

int QueuePairImpl::stage_inbound(const roce::Packet& pkt, uint64_t offset, bool last) {
  QpStaging& st = stage();
  QpStaging::Fill& f = st.fill;
  const uint64_t base = offset / st.frag * st.frag;
  if (f.active && f.base != base) {
    if (!stage_issue_fill(true)) return -1;  // not expected: fragments end full
  }
  if (!f.active) {
    auto slot = st.pool.take();
    if (!slot) return 0;
    f = QpStaging::Fill{.active = true, .slot = *slot, .base = base, .copied = offset, .filled = offset};
  }
  if (f.filled == f.copied) f.first_psn = pkt.bth.psn;
  if (!pkt.payload.empty()) {
    std::memcpy(st.pool.slot(f.slot) + (offset - base), pkt.payload.data(), pkt.payload.size());
  }
  f.filled = offset + pkt.payload.size();
  if (last || f.filled - base == st.frag) {
    if (!stage_issue_fill(true)) return -1;
  } else if (pkt.bth.ack_req) {
    // The requester waits for this ACK: start copying what is here now, so
    // the copies for successive ACKs overlap instead of each starting when
    // the ACK before it left.
    if (!stage_issue_fill(false)) return -1;
  }
  return 1;
}

// Starts the copy of what the filling slot holds beyond the last copy;
// `final_part`: the slot is done with (full, or the message ended).
bool QueuePairImpl::stage_issue_fill(bool final_part) {
  QpStaging& st = *stage_;
  QpStaging::Fill& f = st.fill;
  if (!f.active) return true;
  const uint64_t from = f.copied, n = f.filled - f.copied;
  if (n == 0) {
    if (final_part) {
      // Nothing copied from it after all (a zero-length message), or every
      // byte is in an earlier job: the last job gives the slot back.
      if (!st.in_jobs.empty() && f.copied != f.base) {
        st.in_jobs.back().slot = f.slot;
      } else {
        st.pool.give(f.slot);
      }
      f = QpStaging::Fill{};
    }
    return true;
  }
  std::vector<CopySegment> segs;
  QpStaging::InJob j{.first_psn = f.first_psn};
  uint8_t* slot = st.pool.slot(f.slot);
  std::optional<KeyCheckError> err;
  if (rx_write_) {
    auto a = ctx_.memory().check_remote(write_rkey_, pd_, write_va_ + from, n, kRemoteWrite, true);
    if (!a) {
      err = a.error();
    } else {
      segs.push_back(CopySegment{a->data(), slot + (from - f.base), n});
      j.pins.push_back(std::move(*a));
    }
  } else {
    RecvWqe& r = rq_at(rq_head_);
    err = sge_segments(ctx_.memory(), pd_, r.sge.data(), r.num_sge, from, n, slot, f.base, true, segs, j.pins);
  }
  if (err) {
    send_nak(err->nak_syndrome(), f.first_psn, std::string(rx_write_ ? "RDMA WRITE" : "receive buffer") + ": " +
                                                   err->message(),
             rx_write_ ? WcStatus::kSuccess : WcStatus::kLocProtErr);
    return false;
  }
  auto t = st.pool.engine().submit(segs);
  if (!t) {
    send_nak(roce::aeth::nak_syndrome(roce::aeth::NakCode::kRemoteOperationalError), f.first_psn,
             "copy into GPU memory: " + t.error().message(), WcStatus::kLocQpOpErr);
    return false;
  }
  j.ticket = *t;
  f.copied = f.filled;
  if (final_part) {
    j.slot = f.slot;
    f = QpStaging::Fill{};
  }
  st.in_jobs.push_back(std::move(j));
  return true;
}

bool QueuePairImpl::stage_reply_ok(const Reply& r) {
  auto pending = stage_->pending_psn();
  if (!pending || psn_diff(r.psn, *pending) < 0) return true;
  // The answer waits for bytes still in the filling slot: copy them now.
  if (stage_->fill.active && stage_->fill.filled > stage_->fill.copied) (void)stage_issue_fill(false);
  return false;
}

// Response `index` of a READ of GPU memory, from its staged fragment: 1
// ready, 0 not yet (the reply stalls), -1 the QP failed (NAKed).
int QueuePairImpl::stage_read_piece(Reply& r, uint32_t index, uint32_t len, std::span<const uint8_t>& piece) {
  QpStaging& st = stage();
  QpStaging::RespRead& rr = st.rr;
  const uint64_t offset = uint64_t{index} * mtu_;
  const uint32_t k = static_cast<uint32_t>(offset / st.frag);
  if (!rr.active || rr.psn != r.psn || rr.va != r.va || rr.rkey != r.rkey || rr.length != r.length) {
    st.clear_rr();
    rr.active = true;
    rr.psn = r.psn;
    rr.va = r.va;
    rr.rkey = r.rkey;
    rr.length = r.length;
    rr.next = k;
  }
  while (!rr.frags.empty() && rr.frags.front().k < k) {
    st.retire(rr.frags.front().ticket, !rr.frags.front().ready, rr.frags.front().slot);
    rr.frags.pop_front();
  }
  if (rr.frags.empty() && rr.next < k) rr.next = k;
  while (rr.frags.size() < st.depth && uint64_t{rr.next} * st.frag < r.length) {
    auto slot = st.pool.take();
    if (!slot) break;
    const uint64_t base = uint64_t{rr.next} * st.frag;
    const uint64_t n = std::min<uint64_t>(st.frag, r.length - base);
    auto a = ctx_.memory().check_remote(r.rkey, pd_, r.va + base, n, kRemoteRead, true);
    if (!a) {
      st.pool.give(*slot);
      send_nak(a.error().nak_syndrome(), psn_add(r.psn, index), "READ source: " + a.error().message(),
               WcStatus::kSuccess);
      return -1;
    }
    CopySegment seg{st.pool.slot(*slot), a->data(), n};
    auto t = st.pool.engine().submit(std::span(&seg, 1));
    if (!t) {
      st.pool.give(*slot);
      break;
    }
    rr.frags.push_back(QpStaging::RespFrag{.k = rr.next, .slot = *slot, .ticket = *t, .pin = std::move(*a)});
    ++rr.next;
  }
  if (rr.frags.empty() || rr.frags.front().k != k) return 0;
  QpStaging::RespFrag& f = rr.frags.front();
  if (!f.ready) {
    uint32_t s = st.pool.engine().state(f.ticket);
    if (s == CopyEngine::kPending) return 0;
    if (s == CopyEngine::kFailed) {
      std::string why = st.pool.engine().failure(f.ticket);
      send_nak(roce::aeth::nak_syndrome(roce::aeth::NakCode::kRemoteOperationalError), psn_add(r.psn, index),
               "READ source: GPU staging copy failed: " + why, WcStatus::kSuccess);
      return -1;
    }
    st.pool.engine().release(f.ticket);
    f.ready = true;
    f.pin.release();
  }
  piece = {st.pool.slot(f.slot) + (offset - uint64_t{k} * st.frag), len};
  return 1;
}

// The front READ reply went out whole: its fragments go back.
void QueuePairImpl::stage_read_sent() {
  if (stage_) stage_->clear_rr();
}

}  // namespace ufab::transport
