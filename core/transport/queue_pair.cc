#include "core/transport/queue_pair.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>

#include "core/roce/gid.h"
#include "core/roce/udp_port.h"
#include "core/transport/gpu_staging.h"
#include "core/transport/lane.h"
#include "core/transport/qp_transition.h"

namespace ufab::transport {

using namespace verbs;
using roce::psn_add;
using roce::psn_diff;

namespace {

WcOpcode wc_opcode_for(WrOpcode op) {
  switch (op) {
    case WrOpcode::kRdmaWrite:
    case WrOpcode::kRdmaWriteWithImm: return WcOpcode::kRdmaWrite;
    case WrOpcode::kSend:
    case WrOpcode::kSendWithImm: return WcOpcode::kSend;
    case WrOpcode::kRdmaRead: return WcOpcode::kRdmaRead;
    case WrOpcode::kAtomicCmpAndSwp: return WcOpcode::kCompSwap;
    case WrOpcode::kAtomicFetchAndAdd: return WcOpcode::kFetchAdd;
    case WrOpcode::kFlush: return WcOpcode::kFlush;
    case WrOpcode::kAtomicWrite: return WcOpcode::kAtomicWrite;
  }
  return WcOpcode::kSend;
}

}  // namespace

QueuePairImpl::QueuePairImpl(Lane& ctx, uint32_t qpn, PdId pd, QpType type, CompletionQueueImpl* send_cq,
                             CompletionQueueImpl* recv_cq, const QpCaps& caps, bool sq_sig_all,
                             uint32_t initial_psn)
    : ctx_(ctx),
      qpn_(qpn),
      pd_(pd),
      type_(type),
      send_cq_(send_cq),
      recv_cq_(recv_cq),
      caps_(caps),
      sq_sig_all_(sq_sig_all),
      initial_psn_(initial_psn & roce::kPsnMask),
      sq_(caps.max_send_wr),
      rq_(caps.max_recv_wr) {
  udp_sport_ = roce::rxe_sport_at_create(qpn);
}

// ------------------------------------------------------------- opcode table

const QueuePairImpl::OpcodeHandling& QueuePairImpl::handling(uint8_t opcode) {
  using Q = QueuePairImpl;
  using M = InMessage;
  namespace o = roce::op;
  static constexpr std::array<OpcodeHandling, 256> kRows = [] {
    std::array<OpcodeHandling, 256> t{};
    // Unknown here: requests refused before any check, duplicates and
    // responses dropped.
    for (auto& row : t) row.duplicate = &Q::duplicate_drop;
    const OpcodeHandling send{.message = M::kSend, .execute = &Q::execute_send,
                              .duplicate = &Q::duplicate_send_write};
    const OpcodeHandling write{.message = M::kWrite, .access = kRemoteWrite, .execute = &Q::execute_write,
                               .duplicate = &Q::duplicate_send_write};
    t[o::kRcSendFirst] = send;
    t[o::kRcSendFirst].needs_recv = true;
    t[o::kRcSendMiddle] = send;
    t[o::kRcSendLast] = send;
    t[o::kRcSendLastImm] = send;
    t[o::kRcSendOnly] = send;
    t[o::kRcSendOnly].needs_recv = true;
    t[o::kRcSendOnlyImm] = send;
    t[o::kRcSendOnlyImm].needs_recv = true;
    t[o::kRcWriteFirst] = write;
    t[o::kRcWriteMiddle] = write;
    t[o::kRcWriteLast] = write;
    t[o::kRcWriteLastImm] = write;
    t[o::kRcWriteLastImm].needs_recv = true;  // the immediate completes a receive
    t[o::kRcWriteOnly] = write;
    t[o::kRcWriteOnlyImm] = write;
    t[o::kRcWriteOnlyImm].needs_recv = true;
    t[o::kRcReadRequest] = {.access = kRemoteRead, .execute = &Q::execute_read, .duplicate = &Q::duplicate_read};
    t[o::kRcCompareSwap] = {.access = kRemoteAtomic, .execute = &Q::execute_atomic,
                            .duplicate = &Q::duplicate_replay};
    t[o::kRcFetchAdd] = t[o::kRcCompareSwap];
    // SEND with invalidate: refused before any check (no memory windows or
    // invalidation here); a resent one is still acknowledged like a SEND.
    t[o::kRcSendLastInv] = {.message = M::kSend, .duplicate = &Q::duplicate_send_write};
    t[o::kRcSendOnlyInv] = t[o::kRcSendLastInv];
    // FLUSH: the QP access its placement type names; ATOMIC_WRITE: remote
    // write, as rxe's check_qp_attr_access. Both take a responder resource
    // and are answered from the replay cache when they come again.
    t[o::kRcFlush] = {.access_for = &Q::flush_access, .execute = &Q::execute_flush,
                      .duplicate = &Q::duplicate_replay};
    t[o::kRcAtomicWrite] = {.access = kRemoteWrite, .execute = &Q::execute_atomic_write,
                            .duplicate = &Q::duplicate_replay};
    t[o::kRcReadResponseFirst].response = &Q::on_read_response;
    t[o::kRcReadResponseMiddle].response = &Q::on_read_response;
    t[o::kRcReadResponseLast].response = &Q::on_read_response;
    t[o::kRcReadResponseOnly].response = &Q::on_read_response;
    t[o::kRcAck].response = &Q::on_ack;
    t[o::kRcAtomicAck].response = &Q::on_atomic_ack;
    // UD datagrams take on_ud_send; they have no PSN checks or responses.
    return t;
  }();
  return kRows[opcode];
}

// ------------------------------------------------------------- state machine

Status QueuePairImpl::modify(const QpAttr& a, QpAttrMask mask) {
  // Everything is checked before anything changes (qp_transition.h).
  const PortLimits port{.active_mtu = ctx_.active_mtu(), .link_mtu = ctx_.link().mtu(), .own_ip = ctx_.ip().value};
  if (auto s = check_modify(type_, attr_, a, mask, &port); !s) {
    return fail(s.error().code(), "modifying QP " + hex(qpn_) + " " + s.error().message());
  }
  const QpState to = (mask & kAttrState) ? a.state : attr_.state;
  if (to == QpState::kError) {
    if (attr_.state != QpState::kError) enter_error("moved to ERROR by modify");
    return {};
  }
  if (to == QpState::kReset) {
    reset();
    return {};
  }
  apply(a, mask & ~kAttrState);
  if (to == QpState::kRtr && is_rc()) {
    // rxe's rule (rdma_get_udp_sport): flow label from the AV, or from the
    // two QP numbers, folded into the port.
    udp_sport_ = roce::rxe_sport_after_modify(attr_.av.flow_label, qpn_, attr_.dest_qpn);
  }
  if (to == QpState::kRtr && !is_rc()) mtu_ = ctx_.active_mtu();
  attr_.state = to;
  return {};
}

// RESET drops all work without completions and forgets the connection.
void QueuePairImpl::reset() {
  stage_abort(false);  // RESET drops work without completions
  for (auto& w : sq_) w = SendWqe{};
  sq_head_ = sq_next_ = sq_tail_ = 0;
  rq_head_ = rq_tail_ = 0;
  replies_.clear();
  replay_cache_.clear();
  in_message_ = InMessage::kNone;
  msg_offset_ = 0;
  msn_ = 0;
  nak_sent_ = false;
  stash_valid_ = false;
  undo_cwnd_ = 0;
  srtt_ = rttvar_ = {};
  rtt_start_.reset();
  backoff_ = 0;
  noack_pkts_ = 0;
  read_asks_.clear();
  cwnd_ = ssthresh_ = kMaxWindow;
  cwnd_acked_ = 0;
  recovering_ = false;
  nak_rewound_.reset();
  acked_through_.reset();
  timer_.reset();
  rnr_until_.reset();
  mac_.reset();
  rd_atomic_outstanding_ = 0;
  attr_ = QpAttr{};
}

// Takes the attributes in `given` (already checked) for a move to
// a.state or, without kAttrState, for a modify within the current state.
void QueuePairImpl::apply(const QpAttr& a, QpAttrMask given) {
  if (given & kAttrAccessFlags) attr_.access_flags = a.access_flags;
  if (given & kAttrQkey) attr_.qkey = a.qkey;
  if (given & kAttrAv) {
    attr_.av = a.av;
    mac_.reset();
  }
  if (given & kAttrPathMtu) attr_.path_mtu = mtu_ = a.path_mtu;
  if (given & kAttrDestQpn) attr_.dest_qpn = a.dest_qpn;
  if (given & kAttrRqPsn) attr_.rq_psn = epsn_ = a.rq_psn;
  if (given & kAttrMaxDestRdAtomic) {
    attr_.max_dest_rd_atomic = a.max_dest_rd_atomic;
    replay_cache_.assign(a.max_dest_rd_atomic, Replay{});
    replay_cache_next_ = 0;
  }
  if (given & kAttrMinRnrTimer) attr_.min_rnr_timer = a.min_rnr_timer;
  if (given & kAttrSqPsn) attr_.sq_psn = cursor_psn_ = una_psn_ = max_sent_psn_ = a.sq_psn;
  if (given & kAttrTimeout) attr_.timeout = a.timeout;
  if (given & kAttrRetryCnt) attr_.retry_cnt = retry_left_ = a.retry_cnt;
  if (given & kAttrRnrRetry) attr_.rnr_retry = rnr_left_ = a.rnr_retry;
  if (given & kAttrMaxQpRdAtomic) attr_.max_rd_atomic = a.max_rd_atomic;
}

// ------------------------------------------------------------------ posting

Status QueuePairImpl::post_send(const SendWr& wr) {
  // Formatted only on failure: posting is the fast path.
  auto who = [this] { return "post_send on QP " + hex(qpn_); };
  if (attr_.state != QpState::kRts && attr_.state != QpState::kError) {
    return fail(EINVAL, who() + ": the QP is in " + std::string(qp_state_name(attr_.state)) +
                            "; sends need RTS (connect() or modify to RTS first)");
  }
  if (sq_tail_ - sq_head_ >= sq_.size()) {
    return fail(ENOMEM, who() + ": the send queue is full (" + std::to_string(sq_.size()) +
                            " work requests outstanding); poll the CQ or create the QP with a larger max_send_wr");
  }
  if (wr.sgl.size() > caps_.max_send_sge) {
    return fail(EINVAL, who() + ": " + std::to_string(wr.sgl.size()) + " SGEs, the QP allows " +
                            std::to_string(caps_.max_send_sge) + " (max_send_sge)");
  }
  uint64_t length = 0;
  for (const Sge& s : wr.sgl) length += s.length;
  if (length > (1ull << 31)) return fail(EINVAL, who() + ": messages are at most 2 GiB");
  // GPU memory: one atomic load when no GPU region exists.
  auto gpu = check_gpu_sges(wr.sgl);
  if (!gpu) return fail(gpu.error().code(), who() + ": " + gpu.error().message());
  if (*gpu) {
    if (auto s = check_gpu_wr(wr, length); !s) return fail(s.error().code(), who() + ": " + s.error().message());
  }
  bool atomic = wr.opcode == WrOpcode::kAtomicCmpAndSwp || wr.opcode == WrOpcode::kAtomicFetchAndAdd;
  switch (wr.opcode) {
    case WrOpcode::kSend:
    case WrOpcode::kSendWithImm: break;
    case WrOpcode::kRdmaWrite:
    case WrOpcode::kRdmaWriteWithImm:
    case WrOpcode::kRdmaRead:
    case WrOpcode::kAtomicCmpAndSwp:
    case WrOpcode::kAtomicFetchAndAdd:
    case WrOpcode::kFlush:
    case WrOpcode::kAtomicWrite:
      if (!is_rc()) return fail(EINVAL, who() + ": " + wr_opcode_name(wr.opcode) + " needs an RC QP (this one is UD)");
      break;
    default: return fail(EINVAL, who() + ": unknown opcode " + std::to_string(static_cast<int>(wr.opcode)));
  }
  if (atomic && (wr.sgl.size() != 1 || length != 8)) {
    return fail(EINVAL, who() + ": " + wr_opcode_name(wr.opcode) + " needs exactly one 8-byte SGE for the result");
  }
  const bool placement = wr.opcode == WrOpcode::kFlush || wr.opcode == WrOpcode::kAtomicWrite;
  if (placement) {
    if (auto s = check_placement_wr(wr); !s) return fail(s.error().code(), who() + ": " + s.error().message());
  }
  bool is_inline = (wr.flags & kSendInline) && wr.opcode != WrOpcode::kRdmaRead && !atomic && !placement;
  if (is_inline && length > caps_.max_inline_data) {
    return fail(EINVAL, who() + ": " + std::to_string(length) + " bytes of inline data, the QP allows " +
                            std::to_string(caps_.max_inline_data) + " (max_inline_data)");
  }
  if (!is_rc() && length > mtu_) {
    return fail(EINVAL, who() + ": a UD message of " + std::to_string(length) + " bytes exceeds the path MTU " +
                            std::to_string(mtu_));
  }
  if (!is_rc() && !net::Ipv4Address{wr.ud.ip}.is_unicast()) {
    return fail(EINVAL, who() + ": UD destination " + net::Ipv4Address{wr.ud.ip}.str() + " is not unicast");
  }
  if ((wr.flags & kSendCommit) && attr_.state == QpState::kRts) {
    if (auto s = check_commit_wr(wr); !s) return fail(s.error().code(), who() + ": " + s.error().message());
    SendWr write = wr;
    write.flags &= ~(kSendCommit | kSendSignaled);
    enqueue(write, length, is_inline, SendWqe::Commit::kWrite, *gpu);
    SendWr flush{.wr_id = wr.wr_id, .opcode = WrOpcode::kFlush, .flags = wr.flags & kSendSignaled,
                 .remote_addr = wr.remote_addr, .rkey = wr.rkey, .flush_type = roce::feth::kPersistent,
                 .flush_level = roce::feth::kRange, .flush_length = length};
    enqueue(flush, 0, false, SendWqe::Commit::kFlush);
    return {};
  }
  enqueue(wr, length, is_inline, SendWqe::Commit::kNone, *gpu);
  return {};
}

// GPU memory at post time: true when an SGE names a live GPU region (the
// work request is staged, docs/gpu.md); a region whose GPU allocation was
// freed under it is refused (EACCES) before anything is queued. One atomic
// load when no GPU region is registered.
Result<bool> QueuePairImpl::check_gpu_sges(std::span<const Sge> sgl) const {
  if (ctx_.memory().gpu_regions() == 0) return false;
  bool gpu = false;
  for (size_t i = 0; i < sgl.size(); ++i) {
    if (sgl[i].length == 0) continue;
    if (auto e = ctx_.memory().gpu_check(sgl[i].lkey)) {
      if (e->kind != KeyError::kGpuMemory) {
        return fail(e->to_error().code(), "SGE " + std::to_string(i) + ": " + e->message());
      }
      gpu = true;
    }
  }
  return gpu;
}

// What GPU memory can be in a work request: the data of an RC SEND, WRITE
// (with or without IMM) or READ, staged through the device's pool.
Status QueuePairImpl::check_gpu_wr(const SendWr& wr, uint64_t length) const {
  const char* name = wr_opcode_name(wr.opcode);
  if (!is_rc()) {
    return fail(EOPNOTSUPP, std::string(name) + " from GPU memory on a UD QP: datagrams are not staged; use host "
                                                "memory, or an RC QP (docs/gpu.md)");
  }
  if (wr.flags & kSendInline) {
    return fail(EINVAL, std::string(name) + " with UFAB_SEND_INLINE from GPU memory: inline data is read by the "
                                            "CPU at post time; drop the inline flag");
  }
  switch (wr.opcode) {
    case WrOpcode::kSend:
    case WrOpcode::kSendWithImm:
    case WrOpcode::kRdmaWrite:
    case WrOpcode::kRdmaWriteWithImm: break;
    case WrOpcode::kRdmaRead: {
      const staging::Pool* pool = ctx_.staging();
      const uint64_t capacity = pool ? pool->frag() * pool->slot_count() : 0;
      if (length > capacity) {
        return fail(EINVAL, "RDMA_READ of " + std::to_string(length) + " bytes into GPU memory: a READ into GPU "
                            "memory reserves staging slots for its whole length, and the device's pool holds " +
                            std::to_string(capacity) + " bytes (gpu_slots x gpu_frag); split the READ or raise "
                            "gpu_slots");
      }
      break;
    }
    default:
      return fail(EOPNOTSUPP, std::string(name) + " with its SGE in GPU memory: atomics, FLUSH and ATOMIC_WRITE on "
                                                  "GPU memory are not supported; use host memory for the result");
  }
  if (ctx_.staging() == nullptr) {
    return fail(EOPNOTSUPP, std::string(name) + " on GPU memory: this device has no staging pool");
  }
  return {};
}

// A commit-complete WRITE: its range at the peer is flushed PERSISTENT.
Status QueuePairImpl::check_commit_wr(const SendWr& wr) const {
  if (wr.opcode != WrOpcode::kRdmaWrite && wr.opcode != WrOpcode::kRdmaWriteWithImm) {
    return fail(EINVAL, std::string("UFAB_SEND_COMMIT on ") + wr_opcode_name(wr.opcode) +
                            ": only RDMA_WRITE and RDMA_WRITE_WITH_IMM name a range to make durable (a SEND "
                            "lands durably when the receiver posts its receive into persistent memory)");
  }
  if (sq_tail_ - sq_head_ + 2 > sq_.size()) {
    return fail(ENOMEM, "the send queue has no room for a commit-complete WRITE, which takes two entries (" +
                            std::to_string(sq_tail_ - sq_head_) + " of " + std::to_string(sq_.size()) +
                            " in use); poll the CQ or create the QP with a larger max_send_wr");
  }
  return {};
}

void QueuePairImpl::enqueue(const SendWr& wr, uint64_t length, bool is_inline, SendWqe::Commit commit, bool gpu) {
  SendWqe& w = sq_at(sq_tail_);
  // The slot's inline buffer survives the reset: once a slot has held
  // inline data of some size, posting that much again allocates nothing.
  std::vector<uint8_t> inline_storage = std::move(w.inline_data);
  w = SendWqe{};
  inline_storage.clear();
  w.inline_data = std::move(inline_storage);
  w.wr = wr;
  w.wr.sgl = {};
  w.num_sge = static_cast<uint32_t>(wr.sgl.size());
  std::copy(wr.sgl.begin(), wr.sgl.end(), w.sge.begin());
  w.length = length;
  w.commit = commit;
  w.gpu = gpu;
  w.signaled = commit != SendWqe::Commit::kWrite && (sq_sig_all_ || (wr.flags & kSendSignaled));
  if (is_inline) {
    // Inline data is read now, through plain pointers as verbs does (the
    // lkey is not consulted), so the caller may reuse the buffer at once.
    w.is_inline = true;
    for (const Sge& s : wr.sgl) {
      if (s.length == 0) continue;
      const auto* src = reinterpret_cast<const uint8_t*>(s.addr);
      w.inline_data.insert(w.inline_data.end(), src, src + s.length);
    }
  }
  ++sq_tail_;
  if (attr_.state == QpState::kError) {
    // Verbs: work posted to a QP in ERROR completes, flushed.
    complete_send(w, WcStatus::kWrFlushErr, "posted while the QP is in ERROR (" + error_why_ + ")");
  }
}

// FLUSH and ATOMIC_WRITE carry their operands in the work request, never in
// SGEs; a FLUSH names a placement type and a selectivity IBA defines.
Status QueuePairImpl::check_placement_wr(const SendWr& wr) {
  const char* name = wr_opcode_name(wr.opcode);
  if (!wr.sgl.empty()) {
    return fail(EINVAL, std::string(name) + " takes no SGEs (" + std::to_string(wr.sgl.size()) + " given): " +
                            (wr.opcode == WrOpcode::kFlush
                                 ? "the range is remote_addr and flush_length at the peer"
                                 : "the 8 bytes stored are atomic_value"));
  }
  if (wr.opcode != WrOpcode::kFlush) return {};
  if (wr.flush_type == 0 || (wr.flush_type & ~(roce::feth::kGlobal | roce::feth::kPersistent)) != 0) {
    return fail(EINVAL, "flush_type " + std::to_string(wr.flush_type) +
                            " is not UFAB_FLUSH_GLOBAL (1), UFAB_FLUSH_PERSISTENT (2) or both (3)");
  }
  if (wr.flush_level > roce::feth::kWholeRegion) {
    return fail(EINVAL, "flush_level " + std::to_string(wr.flush_level) +
                            " is not UFAB_FLUSH_RANGE (0) or UFAB_FLUSH_MR (1)");
  }
  if (wr.flush_level == roce::feth::kRange && wr.flush_length > (1ull << 31)) {
    return fail(EINVAL, "a FLUSH range is at most 2 GiB (IBA C9-94), not " + std::to_string(wr.flush_length) +
                            " bytes; flush the whole region with UFAB_FLUSH_MR, or several ranges");
  }
  return {};
}

Status QueuePairImpl::post_recv(const RecvWr& wr) {
  auto who = [this] { return "post_recv on QP " + hex(qpn_); };
  if (attr_.state == QpState::kReset) {
    return fail(EINVAL, who() + ": the QP is in RESET; receives can be posted from INIT on");
  }
  if (rq_tail_ - rq_head_ >= rq_.size()) {
    return fail(ENOMEM, who() + ": the receive queue is full (" + std::to_string(rq_.size()) +
                            " outstanding); create the QP with a larger max_recv_wr");
  }
  if (wr.sgl.size() > caps_.max_recv_sge) {
    return fail(EINVAL, who() + ": " + std::to_string(wr.sgl.size()) + " SGEs, the QP allows " +
                            std::to_string(caps_.max_recv_sge) + " (max_recv_sge)");
  }
  auto gpu = check_gpu_sges(wr.sgl);
  if (!gpu) return fail(gpu.error().code(), who() + ": " + gpu.error().message());
  if (*gpu && (!is_rc() || ctx_.staging() == nullptr)) {
    return fail(EOPNOTSUPP, who() + ": a receive into GPU memory " +
                                (is_rc() ? "needs the device's staging pool" : "on a UD QP: datagrams are not staged"));
  }
  RecvWqe& r = rq_at(rq_tail_);
  r = RecvWqe{};
  r.wr_id = wr.wr_id;
  r.num_sge = static_cast<uint32_t>(wr.sgl.size());
  std::copy(wr.sgl.begin(), wr.sgl.end(), r.sge.begin());
  for (const Sge& s : wr.sgl) r.length += s.length;
  r.gpu = *gpu;
  ++rq_tail_;
  if (attr_.state == QpState::kError) {
    ++rq_head_;
    push_completion(recv_cq_, WorkCompletion{.wr_id = wr.wr_id, .status = WcStatus::kWrFlushErr,
                                             .opcode = WcOpcode::kRecv, .qp_num = qpn_,
                                             .error = "posted while the QP is in ERROR (" + error_why_ + ")"});
  }
  return {};
}

// ------------------------------------------------------------- completions

void QueuePairImpl::push_completion(CompletionQueueImpl* cq, WorkCompletion&& wc) {
  if (!cq->push(std::move(wc))) lost_completion_ = true;
}

void QueuePairImpl::complete_send(SendWqe& w, WcStatus status, std::string error) {
  if (is_read_or_atomic(w) && w.started && rd_atomic_outstanding_ > 0) --rd_atomic_outstanding_;
  if (w.commit == SendWqe::Commit::kWrite && status != WcStatus::kSuccess) sq_at(sq_head_ + 1).quiet = true;
  if ((status != WcStatus::kSuccess || w.signaled) && !w.quiet) {
    WorkCompletion wc;
    wc.wr_id = w.wr.wr_id;
    wc.status = status;
    wc.opcode = w.commit == SendWqe::Commit::kFlush ? WcOpcode::kRdmaWrite : wc_opcode_for(w.wr.opcode);
    wc.qp_num = qpn_;
    if (status == WcStatus::kSuccess &&
        (w.wr.opcode == WrOpcode::kRdmaRead || wc.opcode == WcOpcode::kCompSwap || wc.opcode == WcOpcode::kFetchAdd)) {
      wc.byte_len = static_cast<uint32_t>(w.length);
    }
    wc.error = std::move(error);
    if (w.commit == SendWqe::Commit::kFlush && status != WcStatus::kSuccess && status != WcStatus::kWrFlushErr) {
      wc.error = "commit-complete RDMA_WRITE: the FLUSH PERSISTENT of its range failed (the target region needs "
                 "FLUSH_PERSISTENT on durable memory, the target QP FLUSH_PERSISTENT access): " + wc.error;
    }
    push_completion(send_cq_, std::move(wc));
  }
  // Completions leave in order: only the head completes.
  ++sq_head_;
  if (w.started && status == WcStatus::kSuccess && is_rc()) {
    // Every PSN of a request that completed is acknowledged: the oldest
    // unacknowledged PSN is past it (whichever answer completed it), or a
    // go-back to there would resend the next request under an old PSN,
    // which the responder drops as a duplicate, forever.
    const uint32_t end = psn_add(w.first_psn, w.npkts);
    if (psn_diff(una_psn_, end) < 0) una_psn_ = end;
    // Completed before the cursor came back to it (an answer to a packet
    // sent before a go-back): the cursor moves past it too.
    if (sq_next_ < sq_head_ && psn_diff(cursor_psn_, end) < 0) cursor_psn_ = end;
  }
  if (sq_next_ < sq_head_) sq_next_ = sq_head_;
  w.inline_data.clear();
}

void QueuePairImpl::complete_recv(WcStatus status, WcOpcode opcode, uint32_t byte_len, std::optional<uint32_t> imm,
                                  uint32_t src_qp, std::string error) {
  RecvWqe& r = rq_at(rq_head_);
  WorkCompletion wc;
  wc.wr_id = r.wr_id;
  wc.status = status;
  wc.opcode = opcode;
  wc.byte_len = byte_len;
  wc.qp_num = qpn_;
  wc.src_qp = src_qp;
  if (imm) {
    wc.imm_data = *imm;
    wc.wc_flags |= kWcWithImm;
  }
  if (!is_rc()) wc.wc_flags |= kWcGrh;
  wc.error = std::move(error);
  ++rq_head_;
  if (stage_ && (stage_->pending_psn() || !stage_->deferred.empty())) {
    // Bytes before it are still on their way into GPU memory: it waits
    // for them (and keeps its place among receive completions).
    stage_->deferred.push_back(QpStaging::Deferred{rx_psn_, std::move(wc)});
    return;
  }
  push_completion(recv_cq_, std::move(wc));
}

void QueuePairImpl::enter_error(const std::string& why) {
  if (attr_.state == QpState::kError) return;
  attr_.state = QpState::kError;
  error_why_ = why;
  stage_abort(true);  // receive completions waiting for placement come out first, flushed
  while (sq_head_ < sq_tail_) {
    complete_send(sq_at(sq_head_), WcStatus::kWrFlushErr, "flushed: QP " + hex(qpn_) + " went to ERROR (" + why + ")");
  }
  sq_next_ = sq_head_;
  while (rq_head_ < rq_tail_) {
    complete_recv(WcStatus::kWrFlushErr, WcOpcode::kRecv, 0, std::nullopt, 0,
                  "flushed: QP " + hex(qpn_) + " went to ERROR (" + why + ")");
  }
  replies_.clear();
  in_message_ = InMessage::kNone;
  timer_.reset();
  rnr_until_.reset();
  rd_atomic_outstanding_ = 0;
}

void QueuePairImpl::fail_from(uint64_t index, WcStatus status, std::string error) {
  while (sq_head_ < index && sq_head_ < sq_tail_) {
    complete_send(sq_at(sq_head_), WcStatus::kWrFlushErr, "flushed: a later work request failed (" + error + ")");
  }
  if (sq_head_ < sq_tail_) complete_send(sq_at(sq_head_), status, error);
  enter_error(error);
}

// -------------------------------------------------------------- data copies

std::optional<Error> QueuePairImpl::scatter(const Sge* sge, uint32_t n, uint64_t offset,
                                            std::span<const uint8_t> data) {
  for (uint32_t i = 0; i < n && !data.empty(); ++i) {
    if (offset >= sge[i].length) {
      offset -= sge[i].length;
      continue;
    }
    uint64_t take = std::min<uint64_t>(sge[i].length - offset, data.size());
    auto access = ctx_.memory().check_local(sge[i].lkey, pd_, sge[i].addr + offset, take, true);
    if (!access) return access.error().to_error();
    std::memcpy(access->data(), data.data(), take);
    // Durable memory takes what lands through a receive (a SEND, a READ
    // response) durably before it is acknowledged or completed: no FLUSH
    // can name a receive buffer.
    if (access->durability() != Durability::kNone) {
      if (auto s = make_durable(access->durability(), access->data(), take); !s) return s.error();
    }
    data = data.subspan(take);
    offset = 0;
  }
  return std::nullopt;
}

roce::FrameSpec QueuePairImpl::frame_spec(uint8_t opcode, uint32_t psn, bool ack_req) {
  roce::FrameSpec spec;
  spec.src_mac = ctx_.link().mac();
  spec.src_ip = ctx_.ip().value;
  spec.dst_ip = attr_.av.dest_ip;
  spec.traffic_class = attr_.av.traffic_class;
  spec.hop_limit = attr_.av.hop_limit;
  spec.ip_id = ip_id_++;
  spec.udp_sport = udp_sport_;
  spec.bth.opcode = opcode;
  spec.bth.dest_qp = attr_.dest_qpn;
  spec.bth.psn = psn;
  spec.bth.ack_req = ack_req;
  if (mac_) spec.dst_mac = *mac_;
  return spec;
}

std::optional<net::MacAddress> QueuePairImpl::peer_mac(uint32_t ip, bool& failed) {
  failed = false;
  auto r = ctx_.resolve_locked(net::Ipv4Address{ip});
  if (!r) {
    failed = true;
    return std::nullopt;
  }
  return *r;
}

}  // namespace ufab::transport
