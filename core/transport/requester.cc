// The requester half of a queue pair: turns send work requests into
// packets, tracks PSNs and acknowledgements, retransmits (go-back-N) on a
// sequence NAK, an RNR NAK or a timeout, keeps a congestion window, takes
// READ responses in any order and asks again only for the missing ones, and
// completes work in order. FLUSH and ATOMIC_WRITE are single-packet
// requests answered by an empty READ Response Only, counted and retried
// like READs.
#include <algorithm>
#include <cstdio>
#include <cstring>

#include "core/transport/gpu_staging.h"
#include "core/transport/lane.h"
#include "core/transport/queue_pair.h"

namespace ufab::transport {

using namespace verbs;
using roce::psn_add;
using roce::psn_diff;

namespace {

// rxe asks for an ACK at least every this many packets (RXE_MAX_PKT_PER_ACK).
constexpr uint32_t kMaxPacketsPerAck = 64;

uint8_t send_opcode(WrOpcode op, uint32_t index, uint32_t npkts) {
  bool first = index == 0, last = index + 1 == npkts;
  bool imm = op == WrOpcode::kSendWithImm || op == WrOpcode::kRdmaWriteWithImm;
  namespace o = roce::op;
  if (op == WrOpcode::kSend || op == WrOpcode::kSendWithImm) {
    if (first && last) return imm ? o::kRcSendOnlyImm : o::kRcSendOnly;
    if (first) return o::kRcSendFirst;
    if (last) return imm ? o::kRcSendLastImm : o::kRcSendLast;
    return o::kRcSendMiddle;
  }
  if (first && last) return imm ? o::kRcWriteOnlyImm : o::kRcWriteOnly;
  if (first) return o::kRcWriteFirst;
  if (last) return imm ? o::kRcWriteLastImm : o::kRcWriteLast;
  return o::kRcWriteMiddle;
}

WcStatus status_for_nak(uint8_t code) {
  switch (static_cast<roce::aeth::NakCode>(code)) {
    case roce::aeth::NakCode::kInvalidRequest: return WcStatus::kRemInvReqErr;
    case roce::aeth::NakCode::kRemoteAccessError: return WcStatus::kRemAccessErr;
    case roce::aeth::NakCode::kRemoteOperationalError: return WcStatus::kRemOpErr;
    default: return WcStatus::kBadRespErr;
  }
}

}  // namespace

// Checks a WQE's local keys and gives it its PSNs. False when it cannot
// start yet (limits) or failed (completed with an error, QP in ERROR).
//
// `sending_now`: the caller sends the WQE's first packet right after (the
// window is open). A one-packet SEND or WRITE to a resolved peer then
// skips the check here: gather_request checks (and pins) the same SGEs,
// whole, in the same call, and fails the WQE the same way, so each SGE is
// looked up once.
bool QueuePairImpl::start_wqe(SendWqe& w, bool sending_now) {
  if (is_read_or_atomic(w) && rd_atomic_outstanding_ >= attr_.max_rd_atomic) return false;
  if ((w.wr.flags & kSendFence) && rd_atomic_outstanding_ > 0) return false;
  const bool checked_by_gather = sending_now && mac_.has_value() && !is_read_or_atomic(w) && w.length <= mtu_;
  // GPU work: its SGEs are checked as its fragments are staged; a READ
  // into GPU memory first reserves the slots its responses land in.
  if (w.gpu && w.wr.opcode == WrOpcode::kRdmaRead && !stage_read_start(w)) return false;
  if (!w.is_inline && is_rc() && !checked_by_gather && !w.gpu) {
    bool writes = is_read_or_atomic(w);
    for (uint32_t i = 0; i < w.num_sge; ++i) {
      const Sge& s = w.sge[i];
      if (s.length == 0) continue;
      auto access = ctx_.memory().check_local(s.lkey, pd_, s.addr, s.length, writes);
      if (!access) {
        fail_from(sq_next_, WcStatus::kLocProtErr, std::string(wr_opcode_name(w.wr.opcode)) + " SGE " +
                                                        std::to_string(i) + ": " + access.error().message());
        return false;
      }
    }
  }
  w.started = true;
  w.first_psn = cursor_psn_;
  w.npkts = w.wr.opcode == WrOpcode::kRdmaRead ? roce::packets_for(w.length, mtu_)
            : is_read_or_atomic(w)             ? 1
            : is_rc()                          ? roce::packets_for(w.length, mtu_)
                                               : 1;
  if (is_read_or_atomic(w)) ++rd_atomic_outstanding_;
  if (w.wr.opcode == WrOpcode::kRdmaRead) {
    read_bits(sq_next_).assign((std::min(w.npkts, kReadTrack) + 63) / 64, 0);
  }
  return true;
}

// The UD datagram of `w`: SEND or SEND_WITH_IMM with a DETH, to the
// work request's destination. Returns as send_request_packet.
int QueuePairImpl::build_ud_request(SendWqe& w, RequestPacket& p) {
  bool failed = false;
  auto mac = peer_mac(w.wr.ud.ip, failed);
  if (failed) {
    complete_send(w, WcStatus::kRetryExcErr,
                  "UD destination " + net::Ipv4Address{w.wr.ud.ip}.str() + " did not answer ARP");
    return 2;
  }
  if (!mac) return 0;
  roce::FrameSpec& spec = p.spec;
  spec = frame_spec(w.wr.opcode == WrOpcode::kSendWithImm ? roce::op::kUdSendOnlyImm : roce::op::kUdSendOnly,
                    cursor_psn_, false);
  spec.dst_mac = *mac;
  spec.dst_ip = w.wr.ud.ip;
  spec.traffic_class = w.wr.ud.traffic_class;
  spec.hop_limit = w.wr.ud.hop_limit;
  spec.bth.dest_qp = w.wr.ud.qpn;
  spec.ext.deth = {w.wr.ud.qkey, qpn_};
  spec.ext.immdt.imm = w.wr.imm_data;
  spec.bth.se = (w.wr.flags & kSendSolicited) != 0;
  p.payload = static_cast<uint32_t>(w.length);
  return 1;
}

// The RC packet of `w` at cursor_psn_, by work request opcode. Returns as
// send_request_packet.
int QueuePairImpl::build_rc_request(SendWqe& w, RequestPacket& p) {
  if (!mac_) {
    bool failed = false;
    mac_ = peer_mac(attr_.av.dest_ip, failed);
    if (failed) {
      fail_head(WcStatus::kRetryExcErr,
                "peer " + net::Ipv4Address{attr_.av.dest_ip}.str() + " did not answer ARP requests");
      return -1;
    }
    if (!mac_) return 0;
  }
  const uint32_t index = static_cast<uint32_t>(psn_diff(cursor_psn_, w.first_psn));
  switch (w.wr.opcode) {
    case WrOpcode::kRdmaRead: {
      // The whole READ the first time. After a go-back only its first
      // missing range: rxe moves the start of a READ it is asked again for
      // to the new request's, and drops later requests below it, so a READ
      // is asked again only from its lowest missing response, and the next
      // hole only once that one arrived (ask_read_hole).
      const uint32_t first = std::min(w.rcv_pkts, w.npkts);
      cursor_psn_ = psn_add(w.first_psn, first);
      if (first == w.npkts) {
        // Everything arrived: nothing to ask, on to the next request.
        cursor_psn_ = psn_add(w.first_psn, w.npkts);
        ++sq_next_;
        return 3;
      }
      const uint32_t end = read_missing_end(sq_next_, w, first, w.npkts);
      p.offset = uint64_t{first} * mtu_;
      p.spec = frame_spec(roce::op::kRcReadRequest, cursor_psn_, true);
      p.spec.ext.reth = {w.wr.remote_addr + p.offset, w.wr.rkey,
                         static_cast<uint32_t>(std::min<uint64_t>(w.length, uint64_t{end} * mtu_) - p.offset)};
      p.psn_step = w.npkts - first;
      if (first > 0 || w.read_got > 0) w.read_ask_at = first;
      break;
    }
    case WrOpcode::kAtomicCmpAndSwp:
    case WrOpcode::kAtomicFetchAndAdd: {
      bool cas = w.wr.opcode == WrOpcode::kAtomicCmpAndSwp;
      p.spec = frame_spec(cas ? roce::op::kRcCompareSwap : roce::op::kRcFetchAdd, cursor_psn_, true);
      p.spec.ext.atomic_eth = {w.wr.remote_addr, w.wr.rkey, cas ? w.wr.swap : w.wr.compare_add,
                               cas ? w.wr.compare_add : 0};
      break;
    }
    case WrOpcode::kFlush:
    case WrOpcode::kAtomicWrite: {
      if (w.rcv_pkts >= w.npkts) {
        // Answered already (a go-back passed it while an earlier READ
        // waited): nothing to ask, on to the next request.
        cursor_psn_ = psn_add(w.first_psn, w.npkts);
        ++sq_next_;
        return 3;
      }
      if (w.wr.opcode == WrOpcode::kFlush) {
        // As rxe's init_req_packet: FETH, then the RETH with the range. A
        // whole-region flush sends length 0: the responder looks at
        // neither va nor length then, but still refuses a length above
        // 2^31 (IBA C9-94), so flush_length, unused, must not reach it.
        p.spec = frame_spec(roce::op::kRcFlush, cursor_psn_, true);
        p.spec.ext.feth = roce::Feth::make(w.wr.flush_type, w.wr.flush_level);
        const bool whole = w.wr.flush_level == roce::feth::kWholeRegion;
        p.spec.ext.reth = {w.wr.remote_addr, w.wr.rkey, whole ? 0u : static_cast<uint32_t>(w.wr.flush_length)};
      } else {
        p.spec = frame_spec(roce::op::kRcAtomicWrite, cursor_psn_, true);
        p.spec.ext.reth = {w.wr.remote_addr, w.wr.rkey, 8};
        p.payload = 8;  // gather_request takes it from the work request
      }
      break;
    }
    default: {
      // SEND and WRITE: cut at the path MTU.
      p.offset = uint64_t{index} * mtu_;
      p.payload = static_cast<uint32_t>(std::min<uint64_t>(mtu_, w.length - p.offset));
      p.last = index + 1 == w.npkts;
      // AckReq also twice per window, so a small window reopens without
      // waiting for a message's end or the 64th packet.
      bool ack_req = p.last || ++noack_pkts_ >= std::min(kMaxPacketsPerAck, std::max<uint32_t>(1, cwnd_ / 2));
      // GPU work: an ACK at each fragment's end, so its slot goes back soon.
      if (w.gpu && (p.offset + p.payload) % stage_frag() == 0) ack_req = true;
      p.spec = frame_spec(send_opcode(w.wr.opcode, index, w.npkts), cursor_psn_, ack_req);
      if (index == 0 && (w.wr.opcode == WrOpcode::kRdmaWrite || w.wr.opcode == WrOpcode::kRdmaWriteWithImm)) {
        p.spec.ext.reth = {w.wr.remote_addr, w.wr.rkey, static_cast<uint32_t>(w.length)};
      }
      p.spec.ext.immdt.imm = w.wr.imm_data;
      p.spec.bth.se = p.last && (w.wr.flags & kSendSolicited);
      break;
    }
  }
  if (p.spec.bth.ack_req) noack_pkts_ = 0;
  return 1;
}

// The payload of `p`: inline bytes, or the SGEs through the key table
// (re-checked per packet, so a region deregistered meanwhile is caught).
// Returns as send_request_packet, 1 when the pieces are ready.
int QueuePairImpl::gather_request(SendWqe& w, const RequestPacket& p, Gather& g) {
  if (w.wr.opcode == WrOpcode::kAtomicWrite) {
    // The 8 bytes live in the work request (host order, as they will be in
    // the peer's memory), which outlives the frame's build.
    g.device[g.n] = 0;
    g.pieces[g.n++] = {reinterpret_cast<const uint8_t*>(&w.wr.atomic_value), 8};
    return 1;
  }
  if (w.gpu && p.payload > 0) return staged_piece(w, p, g);
  if (p.payload > 0 && w.is_inline) {
    g.device[g.n] = 0;
    g.pieces[g.n++] = std::span<const uint8_t>(w.inline_data).subspan(p.offset, p.payload);
    return 1;
  }
  uint64_t skip = p.offset, want = p.payload;
  for (uint32_t i = 0; i < w.num_sge && want > 0; ++i) {
    const Sge& s = w.sge[i];
    if (skip >= s.length) {
      skip -= s.length;
      continue;
    }
    uint64_t take = std::min<uint64_t>(s.length - skip, want);
    auto access = ctx_.memory().check_local(s.lkey, pd_, s.addr + skip, take, false);
    if (!access) {
      if (is_rc()) {
        fail_from(sq_next_, WcStatus::kLocProtErr, std::string(wr_opcode_name(w.wr.opcode)) + " SGE " +
                                                       std::to_string(i) + ": " + access.error().message());
        return -1;
      }
      complete_send(w, WcStatus::kLocProtErr, access.error().message());
      return 2;
    }
    g.device[g.n] = access->device_addr();
    g.pieces[g.n++] = {access->data(), static_cast<size_t>(take)};
    g.pins[i] = std::move(*access);
    want -= take;
    skip = 0;
  }
  return 1;
}

// Sends the packet of `w` at cursor_psn_.
int QueuePairImpl::send_request_packet(SendWqe& w) {
  RequestPacket p;
  if (int r = is_rc() ? build_rc_request(w, p) : build_ud_request(w, p); r != 1) return r == 3 ? 2 : r;
  Gather g;
  if (int r = gather_request(w, p, g); r != 1) return r;
  // A datagram completes as soon as its frame is queued (below), before the
  // NIC reads it: its payload is copied into the frame, never gathered
  // from the caller's buffer, which is the caller's again at the completion.
  if (!ctx_.send_frame_locked(p.spec, std::span(g.pieces.data(), g.n), is_rc() ? g.device.data() : nullptr)) return 0;

  if (is_rc()) {
    DeviceStats& st = ctx_.stats();
    ++st.tx_data_packets;
    if (psn_diff(cursor_psn_, max_sent_psn_) < 0) {
      ++st.retransmits;
      ++st.tx_data_resent;
    } else if (!rtt_start_ && p.spec.bth.ack_req && ++rtt_skip_ >= kRttEvery) {
      // One round trip measured at a time, on a packet sent once (Karn),
      // every kRttEvery-th AckReq: a clock read per sample.
      rtt_skip_ = 0;
      rtt_start_ = ctx_.now();
      rtt_psn_ = cursor_psn_;
    }
  }
  cursor_psn_ = psn_add(cursor_psn_, p.psn_step);
  if (psn_diff(cursor_psn_, max_sent_psn_) > 0) max_sent_psn_ = cursor_psn_;
  if (p.last) ++sq_next_;
  if (!is_rc()) {
    // Datagrams are done once on the wire.
    una_psn_ = cursor_psn_;
    complete_send(w, WcStatus::kSuccess);
  } else if (!timer_) {
    arm_timer();
  }
  return 1;
}

// The ACK timeout: the QP's (4.096 us * 2^timeout), or the measured round
// trip with four times its variation (RFC 6298) when that is longer (a
// loaded machine, a slow peer: a timeout that fires before the ACK could
// come back resends for nothing), doubled per timeout in a row without
// progress.
void QueuePairImpl::arm_timer() {
  if (attr_.timeout == 0) {
    timer_.reset();  // IBA: 0 means wait forever
    return;
  }
  const auto base = std::chrono::nanoseconds(uint64_t{4096} << attr_.timeout);
  timer_ = ctx_.now() + std::max<std::chrono::nanoseconds>(base, srtt_ + 4 * rttvar_) * (1u << backoff_);
}

int QueuePairImpl::transmit() {
  int sent = 0;
  if (stage_) {
    stage_->give_back();  // slots of frames the last flush sent
    stage_progress();
  }
  // Responses first: the peer's requester is waiting for them. With GPU
  // staging, none leaves before the bytes it acknowledges are placed.
  while (!replies_.empty()) {
    if (stage_ && !stage_reply_ok(replies_.front())) return sent;
    if (!send_reply_packet(replies_.front())) return sent;
    if (replies_.empty()) return sent;  // the reply turned into a NAK that ended the QP
    replies_.pop_front();
    ++sent;
  }
  if (attr_.state != QpState::kRts) return sent;
  if (rnr_until_) {
    if (ctx_.now() < *rnr_until_) return sent;
    rnr_until_.reset();
    arm_timer();  // the ACK timeout starts with the retry, not with the RNR NAK
  }
  // READ responses asked for again, ahead of new requests (not counted
  // against the window: they are few, kMaxReadAsks at most).
  while (!read_asks_.empty() && send_read_rerequest() == 1) ++sent;
  while (sq_next_ < sq_tail_ && attr_.state == QpState::kRts) {
    SendWqe& w = sq_at(sq_next_);
    const bool window_open = !is_rc() || psn_diff(cursor_psn_, una_psn_) < static_cast<int32_t>(cwnd_);
    if (!w.started && !start_wqe(w, window_open)) break;
    if (!window_open) break;
    int r = send_request_packet(w);
    if (r < 0) break;    // the QP left RTS
    if (r == 0) break;   // no buffer or MAC yet: the next progress retries
    if (r == 2) continue;  // the WQE completed with an error; on to the next
    ++sent;
  }
  return sent;
}

// Go back to `psn` (go-back-N): everything from there is sent again, but
// of a READ only the responses still missing.
void QueuePairImpl::rewind(uint32_t psn) {
  rtt_start_.reset();  // an ACK after a resend says nothing about the round trip
  una_psn_ = psn;
  cursor_psn_ = psn;
  read_asks_.clear();  // the cursor asks for every hole it passes
  sq_next_ = sq_head_;
  while (sq_next_ < sq_tail_) {
    SendWqe& w = sq_at(sq_next_);
    if (!w.started) break;
    uint32_t end = psn_add(w.first_psn, w.npkts);
    if (psn_diff(psn, end) < 0) break;  // psn lies inside w
    ++sq_next_;
  }
  noack_pkts_ = 0;
}

bool QueuePairImpl::retry_exhausted(bool rnr) {
  uint8_t& left = rnr ? rnr_left_ : retry_left_;
  uint8_t limit = rnr ? attr_.rnr_retry : attr_.retry_cnt;
  if (limit == 7) return false;  // 7: retry forever (rxe treats both counters so)
  if (left == 0) return true;
  --left;
  return false;
}

int QueuePairImpl::on_timer() {
  if (!timer_ || attr_.state != QpState::kRts) return 0;
  if (rnr_until_) return 0;  // waiting out an RNR NAK is not a missing ACK
  if (ctx_.now() < *timer_) return 0;
  // Acknowledged beyond the cursor (answers to packets sent before a
  // rewind): skip what the peer already has.
  if (psn_diff(una_psn_, cursor_psn_) > 0) rewind(una_psn_);
  if (sq_head_ == sq_next_ && psn_diff(cursor_psn_, una_psn_) <= 0) {
    timer_.reset();  // nothing outstanding
    return 0;
  }
  if (stage_local_wait()) {
    arm_timer();  // waiting for this side's own copies, not for the peer
    return 0;
  }
  ++ctx_.stats().timeouts;
  if (backoff_ < kMaxBackoff) ++backoff_;
  if (retry_exhausted(false)) {
    fail_head(WcStatus::kRetryExcErr, "no acknowledgement from " + net::Ipv4Address{attr_.av.dest_ip}.str() +
                                          " QP " + hex(attr_.dest_qpn) + " after " +
                                          std::to_string(attr_.retry_cnt) + " retries (timeout " +
                                          std::to_string(attr_.timeout) + ")");
    return 1;
  }
  // The oldest unacknowledged packet: for a READ, its first missing
  // response. The go-back asks a READ only for the responses it lacks.
  uint32_t from = una_psn_;
  if (sq_head_ < sq_tail_) {
    SendWqe& h = sq_at(sq_head_);
    if (h.started && h.wr.opcode == WrOpcode::kRdmaRead) from = psn_add(h.first_psn, h.rcv_pkts);
  }
  const uint32_t cwnd = cwnd_, ssthresh = ssthresh_;
  window_loss(from, true);
  undo_cwnd_ = cwnd;
  undo_ssthresh_ = ssthresh;
  undo_psn_ = from;
  rewind(from);
  arm_timer();
  return 1;
}

// ------------------------------------------------------ congestion window

// A loss halves the window (AIMD, as TCP Reno): a sequence or RNR NAK
// once per window of packets (losses of packets sent before the last cut
// belong to the same event), down to kMinWindow. A timeout leaves one
// packet in flight: if the ACKs were only late, what they acknowledge skips
// the rest of the go-back (on_response), so a spurious timeout costs one
// packet instead of a window.
void QueuePairImpl::window_loss(uint32_t psn, bool timeout) {
  if (!timeout && recovering_ && psn_diff(psn, recover_psn_) < 0) return;
  ssthresh_ = std::max(kMinWindow, cwnd_ / 2);
  cwnd_ = timeout ? 1 : ssthresh_;
  cwnd_acked_ = 0;
  recovering_ = true;
  recover_psn_ = max_sent_psn_;
  ++ctx_.stats().window_cuts;
}

// Packets newly acknowledged: below ssthresh_ the window grows by as many
// (slow start, back to where the last loss halved it), above it by one per
// window's worth (additive increase), up to kMaxWindow.
void QueuePairImpl::window_acked(uint32_t packets) {
  if (rtt_start_ && psn_diff(una_psn_, rtt_psn_) > 0) {
    const auto sample = std::chrono::duration_cast<std::chrono::nanoseconds>(ctx_.now() - *rtt_start_);
    if (srtt_.count() == 0) {
      srtt_ = sample;
      rttvar_ = sample / 2;
    } else {
      // RFC 6298's estimator.
      rttvar_ = (3 * rttvar_ + std::chrono::abs(srtt_ - sample)) / 4;
      srtt_ = (7 * srtt_ + sample) / 8;
    }
    rtt_start_.reset();
  }
  if (recovering_ && psn_diff(una_psn_, recover_psn_) >= 0) recovering_ = false;
  if (nak_rewound_ && psn_diff(una_psn_, *nak_rewound_) > 0) nak_rewound_.reset();
  if (cwnd_ >= kMaxWindow) return;
  if (cwnd_ < ssthresh_) {
    cwnd_ = std::min(ssthresh_, cwnd_ + packets);
    return;
  }
  cwnd_acked_ += packets;
  while (cwnd_acked_ >= cwnd_ && cwnd_ < kMaxWindow) {
    cwnd_acked_ -= cwnd_;
    ++cwnd_;
  }
}

// ------------------------------------------------------------ responses

// ACKs, NAKs, READ responses and atomic ACKs for this QP's requests. What
// they acknowledge opens the window.
void QueuePairImpl::on_response(const roce::Packet& pkt) {
  const uint32_t before = una_psn_;
  handle_response(pkt);
  if (attr_.state != QpState::kRts) return;
  const int32_t acked = psn_diff(una_psn_, before);
  if (acked > 0) window_acked(static_cast<uint32_t>(acked));
}

// The checks every response passes, then the opcode's response handler.
void QueuePairImpl::handle_response(const roce::Packet& pkt) {
  if (attr_.state != QpState::kRts) {
    ++ctx_.stats().rx_dropped;
    return;
  }
  const uint32_t psn = pkt.bth.psn;
  const bool read_response = pkt.op->kind == roce::OpKind::kReadResponse;
  // Only PSNs we sent and that are not acknowledged yet mean anything. After
  // a rewind the cursor is behind what was sent before; answers to those
  // packets still count.
  if (psn_diff(psn, max_sent_psn_) >= 0 || psn_diff(psn, una_psn_) < 0) {
    if (read_response && psn_diff(psn, una_psn_) < 0) {
      ++ctx_.stats().rx_read_responses;
      ++ctx_.stats().rx_read_response_dups;
    }
    ++ctx_.stats().rx_dropped;
    return;
  }
  if (pkt.op->kind == roce::OpKind::kAck && roce::aeth::type(pkt.ext.aeth.syndrome) == roce::aeth::Type::kAck &&
      (!acked_through_ || psn_diff(psn, *acked_through_) > 0)) {
    acked_through_ = psn;  // remembered while an earlier READ waits for its holes
  }
  if (!ack_earlier(psn) && (!read_response || attr_.state != QpState::kRts)) return;
  if (read_response) {
    take_read_response(pkt);
  } else {
    if (sq_head_ == sq_tail_ || !sq_at(sq_head_).started) return;  // nothing started contains psn
    const ResponseHandler handler = handling(pkt.bth.opcode).response;
    if (handler == nullptr) {
      note_progress();
      ++ctx_.stats().rx_dropped;
      return;
    }
    if (!(this->*handler)(pkt, sq_at(sq_head_))) return;
  }
  if (attr_.state != QpState::kRts) return;
  // Acknowledged beyond the cursor (answers to packets sent before a
  // rewind): skip what the peer already has. If at most one packet was
  // resent since the last go-back, the go-back was not needed (the ACKs
  // were late, or the NAK was for packets that were only swapped and the
  // responder ran both, responder.cc): its window cut is undone.
  if (psn_diff(una_psn_, cursor_psn_) > 0) {
    if (undo_cwnd_ != 0 && psn_diff(cursor_psn_, undo_psn_) <= 1) {
      cwnd_ = std::max(cwnd_, undo_cwnd_);
      ssthresh_ = std::max(ssthresh_, undo_ssthresh_);
      recovering_ = false;
    }
    rewind(una_psn_);
  }
  undo_cwnd_ = 0;
  if (sq_head_ == sq_next_ && psn_diff(cursor_psn_, una_psn_) <= 0) {
    timer_.reset();
  } else {
    arm_timer();
  }
}

// Earlier SENDs and WRITEs are acknowledged implicitly by any response to
// a later PSN. An earlier READ still missing responses lost them: ask for
// the missing ones (once; false, the READ blocks completions). An earlier
// atomic lost its answer: go back to it (false, as when retries ran out).
bool QueuePairImpl::ack_earlier(uint32_t psn) {
  while (sq_head_ < sq_tail_ && sq_at(sq_head_).started) {
    SendWqe& w = sq_at(sq_head_);
    uint32_t last_psn = psn_add(w.first_psn, w.npkts - 1);
    if (psn_diff(last_psn, psn) >= 0) break;
    if (w.wr.opcode == WrOpcode::kRdmaRead) {
      if (w.rcv_pkts < w.npkts) {
        w.read_seen = w.npkts;  // its tail was lost
        if (sq_head_ < sq_next_) ask_read_hole(sq_head_, w);
        return false;
      }
    } else if (is_atomic(w) || (is_placement(w) && w.rcv_pkts < w.npkts)) {
      if (retry_exhausted(false)) {
        fail_head(WcStatus::kRetryExcErr, "responses to " + std::string(wr_opcode_name(w.wr.opcode)) + " lost too often");
        return false;
      }
      rewind(w.first_psn);
      return false;
    }
    complete_send(w, WcStatus::kSuccess);
  }
  return true;
}

// Completes, in order, the work requests at the head that are done: READs
// with every response in, SENDs and WRITEs an ACK covered while an earlier
// READ was waiting. Moves the oldest unacknowledged PSN on.
void QueuePairImpl::complete_done() {
  if (acked_through_ && psn_diff(*acked_through_, una_psn_) < 0) acked_through_.reset();  // nothing left it covers
  while (sq_head_ < sq_tail_ && attr_.state == QpState::kRts) {
    SendWqe& w = sq_at(sq_head_);
    if (!w.started) break;
    const uint32_t end = psn_add(w.first_psn, w.npkts);
    if (answered_by_read_response(w)) {
      if (w.rcv_pkts < w.npkts) {
        uint32_t una = psn_add(w.first_psn, w.rcv_pkts);
        if (psn_diff(una, una_psn_) > 0) una_psn_ = una;
        break;
      }
      if (w.gpu && !stage_read_placed(sq_head_)) break;  // copies into GPU memory still running
    } else if (is_atomic(w) || !acked_through_ || psn_diff(psn_add(end, roce::kPsnMask), *acked_through_) > 0) {
      break;
    }
    if (psn_diff(end, una_psn_) > 0) una_psn_ = end;
    complete_send(w, WcStatus::kSuccess);
  }
}

// Progress: the peer is alive, retries start over.
void QueuePairImpl::note_progress() {
  backoff_ = 0;
  retry_left_ = attr_.retry_cnt;
  rnr_left_ = attr_.rnr_retry;
}

// ACKNOWLEDGE: an ACK completes `w` at its last PSN; a NAK goes to on_nak.
bool QueuePairImpl::on_ack(const roce::Packet& pkt, SendWqe& w) {
  if (roce::aeth::type(pkt.ext.aeth.syndrome) != roce::aeth::Type::kAck) return on_nak(pkt, w);
  note_progress();
  if (is_read_or_atomic(w)) return false;  // an ACK cannot answer these
  const uint32_t psn = pkt.bth.psn;
  una_psn_ = psn_add(psn, 1);
  if (psn == psn_add(w.first_psn, w.npkts - 1)) complete_send(w, WcStatus::kSuccess);
  return true;
}

// RNR NAK: back off for the NAK's timer and resend from its PSN. Sequence
// NAK: resend from its PSN, once per gap. Any other code ends `w` and the
// QP. Both retries halve the window.
bool QueuePairImpl::on_nak(const roce::Packet& pkt, SendWqe& w) {
  const uint32_t psn = pkt.bth.psn;
  const uint8_t syndrome = pkt.ext.aeth.syndrome;
  const auto type = roce::aeth::type(syndrome);
  if (type == roce::aeth::Type::kRnrNak) {
    ++ctx_.stats().rnr_naks_received;
    retry_left_ = attr_.retry_cnt;  // the peer is alive: only RNR retries count down
    if (retry_exhausted(true)) {
      fail_head(WcStatus::kRnrRetryExcErr, "the peer had no receive posted (RNR NAK) " +
                                               std::to_string(attr_.rnr_retry) + " times");
      return false;
    }
    window_loss(psn, false);
    rewind(psn);
    rnr_until_ = ctx_.now() + std::chrono::microseconds(roce::aeth::rnr_timer_usec(roce::aeth::value(syndrome)));
    arm_timer();
    return false;
  }
  ++ctx_.stats().naks_received;
  uint8_t code = roce::aeth::value(syndrome);
  if (type == roce::aeth::Type::kNak && code == static_cast<uint8_t>(roce::aeth::NakCode::kPsnSequenceError)) {
    // The same gap NAKed again (a duplicated frame, or a responder that
    // repeats itself): the go-back already under way answers it.
    if (nak_rewound_ && *nak_rewound_ == psn) return false;
    if (retry_exhausted(false)) {
      fail_head(WcStatus::kRetryExcErr, "PSN sequence errors beyond retry_cnt");
      return false;
    }
    const uint32_t cwnd = cwnd_, ssthresh = ssthresh_;
    window_loss(psn, false);
    undo_cwnd_ = cwnd;
    undo_ssthresh_ = ssthresh;
    undo_psn_ = psn;
    nak_rewound_ = psn;
    rewind(psn);
    arm_timer();
    return false;
  }
  std::string hint;
  if (code == static_cast<uint8_t>(roce::aeth::NakCode::kInvalidRequest) &&
      (is_atomic(w) || w.wr.opcode == WrOpcode::kAtomicWrite) && (w.wr.remote_addr & 7) != 0) {
    hint = ": remote_addr " + hex(w.wr.remote_addr) + " is not 8-byte aligned";
  }
  fail_head(status_for_nak(code), std::string(wr_opcode_name(w.wr.opcode)) + " NAKed by " +
                                      net::Ipv4Address{attr_.av.dest_ip}.str() + ": " +
                                      roce::aeth::nak_code_name(code) + " (AETH " + hex(syndrome) + ")" + hint);
  return false;
}

// ------------------------------------------------------------------- READ

std::vector<uint64_t>& QueuePairImpl::read_bits(uint64_t sq_index) {
  if (read_bits_.size() != sq_.size()) read_bits_.resize(sq_.size());
  return read_bits_[sq_index % sq_.size()];
}

// Whether response `index` of the READ in sq slot `sq_index` arrived.
// Beyond the tracked window nothing has (it is dropped, and asked for again).
bool QueuePairImpl::read_has(uint64_t sq_index, const SendWqe& w, uint32_t index) {
  if (index < w.rcv_pkts) return true;
  if (index >= w.npkts || index - w.rcv_pkts >= kReadTrack) return false;
  const uint32_t bit = index % kReadTrack;
  const std::vector<uint64_t>& bits = read_bits(sq_index);
  return bit / 64 < bits.size() && ((bits[bit / 64] >> (bit % 64)) & 1) != 0;
}

// Response `index` (inside the tracked window) arrived; the prefix without
// holes moves on over what is there.
void QueuePairImpl::read_mark(uint64_t sq_index, SendWqe& w, uint32_t index) {
  std::vector<uint64_t>& bits = read_bits(sq_index);
  const uint32_t bit = index % kReadTrack;
  bits[bit / 64] |= uint64_t{1} << (bit % 64);
  ++w.read_got;
  while (w.rcv_pkts < w.npkts) {
    const uint32_t b = w.rcv_pkts % kReadTrack;
    if (((bits[b / 64] >> (b % 64)) & 1) == 0) break;
    bits[b / 64] &= ~(uint64_t{1} << (b % 64));
    ++w.rcv_pkts;
  }
}

// The first index in [from, end) that arrived, or end.
uint32_t QueuePairImpl::read_missing_end(uint64_t sq_index, const SendWqe& w, uint32_t from, uint32_t end) {
  uint32_t i = from;
  while (i < end && !read_has(sq_index, w, i)) ++i;
  return i;
}

// Asks again for the lowest missing range of responses of `w` when a later
// response shows it lost (one READ request at its PSN with the RETH va and
// length of that range), unless that hole was asked for already and has
// not arrived. Holes are asked for from the lowest up, one at a time: rxe
// answers a request from the middle of a READ it executed, but moves the
// READ's start there and drops later requests below it. What does not fit
// in kMaxReadAsks waits for the next response or the timeout.
void QueuePairImpl::ask_read_hole(uint64_t sq_index, SendWqe& w) {
  if (w.rcv_pkts >= w.npkts || w.rcv_pkts >= w.read_seen) return;      // no hole known
  if (w.read_ask_at != kNoAsk && w.rcv_pkts <= w.read_ask_at) return;  // asked, not answered yet
  std::erase_if(read_asks_, [&](const ReadAsk& a) { return a.sq_index == sq_index; });
  if (read_asks_.size() >= kMaxReadAsks) return;
  const uint32_t end = read_missing_end(sq_index, w, w.rcv_pkts, w.npkts);
  read_asks_.push_back(ReadAsk{sq_index, w.rcv_pkts, end - w.rcv_pkts});
  w.read_ask_at = w.rcv_pkts;
}

// Sends the oldest READ range asked for again (what arrived meanwhile is
// left out). 1 when a request went out.
int QueuePairImpl::send_read_rerequest() {
  while (!read_asks_.empty()) {
    ReadAsk& a = read_asks_.front();
    SendWqe& w = sq_at(a.sq_index);
    if (a.sq_index < sq_head_ || a.sq_index >= sq_next_ || !w.started || w.wr.opcode != WrOpcode::kRdmaRead) {
      read_asks_.erase(read_asks_.begin());  // done, or the cursor asks again
      continue;
    }
    const uint32_t stop = a.first + a.count;
    uint32_t first = a.first;
    while (first < stop && read_has(a.sq_index, w, first)) ++first;
    if (first == stop) {
      read_asks_.erase(read_asks_.begin());
      continue;
    }
    if (!mac_) return 0;
    const uint32_t end = read_missing_end(a.sq_index, w, first, stop);
    const uint64_t offset = uint64_t{first} * mtu_;
    roce::FrameSpec spec = frame_spec(roce::op::kRcReadRequest, psn_add(w.first_psn, first), true);
    spec.ext.reth = {w.wr.remote_addr + offset, w.wr.rkey,
                     static_cast<uint32_t>(std::min<uint64_t>(w.length, uint64_t{end} * mtu_) - offset)};
    if (!ctx_.send_frame_locked(spec, {})) return 0;
    DeviceStats& st = ctx_.stats();
    ++st.retransmits;
    ++st.tx_data_packets;
    ++st.tx_data_resent;
    if (end == stop) {
      read_asks_.erase(read_asks_.begin());
    } else {
      a.count = stop - end;
      a.first = end;
    }
    if (!timer_) arm_timer();
    return 1;
  }
  return 0;
}

// READ RESPONSE FIRST/MIDDLE/LAST/ONLY, for any READ in flight and in any
// order: the PSN gives the response's index, hence its offset; lengths are
// checked before a byte lands (every packet but the READ's last carries one
// MTU, the last the rest and ends a response), then the bytes go through the
// key table into the READ's SGEs. A response that skips indices leaves holes,
// asked for again once; earlier READs still missing responses lost them.
void QueuePairImpl::take_read_response(const roce::Packet& pkt) {
  note_progress();
  const uint32_t psn = pkt.bth.psn;
  DeviceStats& st = ctx_.stats();
  ++st.rx_read_responses;
  uint64_t i = sq_head_;
  for (; i < sq_tail_ && sq_at(i).started; ++i) {
    SendWqe& v = sq_at(i);
    if (psn_diff(psn, psn_add(v.first_psn, v.npkts)) < 0) break;  // psn lies in v
    if (v.wr.opcode == WrOpcode::kRdmaRead && v.rcv_pkts < v.npkts && i < sq_next_) {
      v.read_seen = v.npkts;  // its tail was lost
      ask_read_hole(i, v);
    }
  }
  if (i == sq_tail_ || !sq_at(i).started) {
    ++st.rx_dropped;
    return;
  }
  SendWqe& w = sq_at(i);
  if (!answered_by_read_response(w)) {
    fail_head(WcStatus::kBadRespErr, "READ response for a " + std::string(wr_opcode_name(w.wr.opcode)));
    return;
  }
  // The responder has every request before this one: SENDs and WRITEs
  // there are acknowledged.
  if (const uint32_t before = psn_add(w.first_psn, roce::kPsnMask);
      !acked_through_ || psn_diff(before, *acked_through_) > 0) {
    acked_through_ = before;
  }
  if (is_placement(w)) {
    take_placement_response(pkt, i, w);
    return;
  }
  const uint32_t index = static_cast<uint32_t>(psn_diff(psn, w.first_psn));
  const bool is_last = index + 1 == w.npkts;
  const uint64_t offset = uint64_t{index} * mtu_;
  const uint64_t want = is_last ? w.length - offset : mtu_;
  if ((is_last && !pkt.op->last()) || pkt.payload.size() != want) {
    fail_head(WcStatus::kBadRespErr, "READ response " + std::string(roce::opcode_full_name(pkt.bth.opcode)) +
                                         " with " + std::to_string(pkt.payload.size()) + " bytes at packet " +
                                         std::to_string(index) + " of " + std::to_string(w.npkts) + ", expected " +
                                         std::to_string(want));
    return;
  }
  if (read_has(i, w, index)) {
    ++st.rx_read_response_dups;  // answered twice (a re-request crossed a late response)
    return;
  }
  if (index - w.rcv_pkts >= kReadTrack) {
    ++st.rx_dropped;  // beyond the tracked window: asked for again once the holes before it fill
    return;
  }
  if (w.gpu) {
    if (!stage_read_response(i, w, offset, pkt.payload)) return;
  } else if (auto err = scatter(w.sge.data(), w.num_sge, offset, pkt.payload)) {
    fail_head(WcStatus::kLocProtErr, "RDMA_READ destination: " + err->message());
    return;
  }
  read_mark(i, w, index);
  // The responder answers each request in PSN order: a response past the
  // first missing one shows a hole.
  if (index >= w.read_seen) w.read_seen = index + 1;
  if (i < sq_next_) ask_read_hole(i, w);
  if (i == sq_head_) complete_done();
}

// The table's row for READ responses (handle_response routes them to
// take_read_response before the row's handler would run).
bool QueuePairImpl::on_read_response(const roce::Packet& pkt, SendWqe&) {
  take_read_response(pkt);
  return true;
}

// The answer to a FLUSH or ATOMIC_WRITE: READ Response Only with an AETH
// and nothing else, at the request's PSN (rxe's send_read_response_ack).
// The FLUSH is done (the range visible or durable as asked), the 8 bytes
// stored. Work requests still complete in order: one behind a READ that
// waits for responses completes after it.
void QueuePairImpl::take_placement_response(const roce::Packet& pkt, uint64_t sq_index, SendWqe& w) {
  if (pkt.bth.opcode != roce::op::kRcReadResponseOnly || !pkt.payload.empty()) {
    fail_head(WcStatus::kBadRespErr, std::string(roce::opcode_full_name(pkt.bth.opcode)) + " with " +
                                         std::to_string(pkt.payload.size()) + " bytes of payload answering " +
                                         wr_opcode_name(w.wr.opcode) + " (expected READ Response Only, empty)");
    return;
  }
  if (w.rcv_pkts >= w.npkts) {
    ++ctx_.stats().rx_read_response_dups;  // answered twice (a resend crossed a late answer)
    return;
  }
  w.rcv_pkts = w.npkts;
  if (sq_index == sq_head_) complete_done();
}

// ATOMIC ACKNOWLEDGE: the original value, 8 bytes in host order, into the
// atomic's SGE.
bool QueuePairImpl::on_atomic_ack(const roce::Packet& pkt, SendWqe& w) {
  note_progress();
  const uint32_t psn = pkt.bth.psn;
  if (!is_atomic(w) || psn != w.first_psn) return false;
  uint64_t original = pkt.ext.atomic_ack.original;
  uint8_t bytes[8];
  std::memcpy(bytes, &original, 8);  // host order, like the target memory
  if (auto err = scatter(w.sge.data(), w.num_sge, 0, bytes)) {
    fail_head(WcStatus::kLocProtErr, "atomic result: " + err->message());
    return false;
  }
  una_psn_ = psn_add(psn, 1);
  complete_send(w, WcStatus::kSuccess);
  complete_done();
  return true;
}

}  // namespace ufab::transport
