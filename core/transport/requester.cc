// The requester half of a queue pair: turns send work requests into
// packets, tracks PSNs and acknowledgements, retransmits (go-back-N) on a
// sequence NAK, an RNR NAK or a timeout, and completes work in order.
#include <algorithm>
#include <cstdio>
#include <cstring>

#include "core/transport/lane.h"
#include "core/transport/queue_pair.h"

namespace ufab::transport {

using namespace verbs;
using roce::psn_add;
using roce::psn_diff;

namespace {

// Packets in flight per QP before the requester waits for ACKs: far below
// the 2^23 PSN half-window, enough to keep a NIC ring busy, and small enough
// that a loss (go-back-N resends everything after it) costs little.
constexpr uint32_t kMaxInflightPackets = 256;
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
  if (!w.is_inline && is_rc() && !checked_by_gather) {
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
      // One request for everything not yet received (a retry asks only
      // for the rest, as rxe's req_retry does).
      p.offset = uint64_t{index} * mtu_;
      p.spec = frame_spec(roce::op::kRcReadRequest, cursor_psn_, true);
      p.spec.ext.reth = {w.wr.remote_addr + p.offset, w.wr.rkey, static_cast<uint32_t>(w.length - p.offset)};
      p.psn_step = w.npkts - index;
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
    default: {
      // SEND and WRITE: cut at the path MTU.
      p.offset = uint64_t{index} * mtu_;
      p.payload = static_cast<uint32_t>(std::min<uint64_t>(mtu_, w.length - p.offset));
      p.last = index + 1 == w.npkts;
      bool ack_req = p.last || ++noack_pkts_ >= kMaxPacketsPerAck;
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
  if (p.payload > 0 && w.is_inline) {
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
  if (int r = is_rc() ? build_rc_request(w, p) : build_ud_request(w, p); r != 1) return r;
  Gather g;
  if (int r = gather_request(w, p, g); r != 1) return r;
  if (!ctx_.send_frame_locked(p.spec, std::span(g.pieces.data(), g.n))) return 0;

  if (is_rc() && psn_diff(cursor_psn_, max_sent_psn_) < 0) ++ctx_.stats().retransmits;
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

void QueuePairImpl::arm_timer() {
  if (attr_.timeout == 0) {
    timer_.reset();  // IBA: 0 means wait forever
    return;
  }
  timer_ = ctx_.now() + std::chrono::nanoseconds(uint64_t{4096} << attr_.timeout);
}

int QueuePairImpl::transmit() {
  int sent = 0;
  // Responses first: the peer's requester is waiting for them.
  while (!replies_.empty()) {
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
  while (sq_next_ < sq_tail_ && attr_.state == QpState::kRts) {
    SendWqe& w = sq_at(sq_next_);
    const bool window_open = !is_rc() || psn_diff(cursor_psn_, una_psn_) < static_cast<int32_t>(kMaxInflightPackets);
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

// Go back to `psn` (go-back-N): everything from there is sent again.
void QueuePairImpl::rewind(uint32_t psn) {
  una_psn_ = psn;
  cursor_psn_ = psn;
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
  ++ctx_.stats().timeouts;
  if (retry_exhausted(false)) {
    fail_head(WcStatus::kRetryExcErr, "no acknowledgement from " + net::Ipv4Address{attr_.av.dest_ip}.str() +
                                          " QP " + hex(attr_.dest_qpn) + " after " +
                                          std::to_string(attr_.retry_cnt) + " retries (timeout " +
                                          std::to_string(attr_.timeout) + ")");
    return 1;
  }
  // The oldest unacknowledged packet: for a READ, the next response.
  uint32_t from = una_psn_;
  if (sq_head_ < sq_tail_) {
    SendWqe& h = sq_at(sq_head_);
    if (h.started && h.wr.opcode == WrOpcode::kRdmaRead) from = psn_add(h.first_psn, h.rcv_pkts);
  }
  rewind(from);
  arm_timer();
  return 1;
}

// ACKs, NAKs, READ responses and atomic ACKs for this QP's requests: the
// checks every response passes, then the opcode's response handler.
void QueuePairImpl::on_response(const roce::Packet& pkt) {
  if (attr_.state != QpState::kRts) {
    ++ctx_.stats().rx_dropped;
    return;
  }
  const uint32_t psn = pkt.bth.psn;
  // Only PSNs we sent and that are not acknowledged yet mean anything. After
  // a rewind the cursor is behind what was sent before; answers to those
  // packets still count.
  if (psn_diff(psn, max_sent_psn_) >= 0 || psn_diff(psn, una_psn_) < 0) {
    ++ctx_.stats().rx_dropped;
    return;
  }
  if (!ack_earlier(psn)) return;
  if (sq_head_ == sq_tail_ || !sq_at(sq_head_).started) return;  // nothing started contains psn
  const ResponseHandler handler = handling(pkt.bth.opcode).response;
  if (handler == nullptr) {
    note_progress();
    ++ctx_.stats().rx_dropped;
    return;
  }
  if (!(this->*handler)(pkt, sq_at(sq_head_))) return;
  // Acknowledged beyond the cursor (answers to packets sent before a
  // rewind): skip what the peer already has.
  if (psn_diff(una_psn_, cursor_psn_) > 0) rewind(una_psn_);
  if (sq_head_ == sq_next_ && psn_diff(cursor_psn_, una_psn_) <= 0) {
    timer_.reset();
  } else {
    arm_timer();
  }
}

// Earlier SENDs and WRITEs are acknowledged implicitly by any response to
// a later PSN; an earlier READ or atomic still waiting means its responses
// were lost: ask again (and return false, as when retries ran out).
bool QueuePairImpl::ack_earlier(uint32_t psn) {
  while (sq_head_ < sq_tail_ && sq_at(sq_head_).started) {
    SendWqe& w = sq_at(sq_head_);
    uint32_t last_psn = psn_add(w.first_psn, w.npkts - 1);
    if (psn_diff(last_psn, psn) >= 0) break;
    if (is_read_or_atomic(w)) {
      if (retry_exhausted(false)) {
        fail_head(WcStatus::kRetryExcErr, "responses to " + std::string(wr_opcode_name(w.wr.opcode)) + " lost too often");
        return false;
      }
      rewind(psn_add(w.first_psn, w.rcv_pkts));
      return false;
    }
    complete_send(w, WcStatus::kSuccess);
  }
  return true;
}

// Progress: the peer is alive, retries start over.
void QueuePairImpl::note_progress() {
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
// NAK: resend from its PSN. Any other code ends `w` and the QP.
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
    rewind(psn);
    rnr_until_ = ctx_.now() + std::chrono::microseconds(roce::aeth::rnr_timer_usec(roce::aeth::value(syndrome)));
    arm_timer();
    return false;
  }
  ++ctx_.stats().naks_received;
  uint8_t code = roce::aeth::value(syndrome);
  if (type == roce::aeth::Type::kNak && code == static_cast<uint8_t>(roce::aeth::NakCode::kPsnSequenceError)) {
    if (retry_exhausted(false)) {
      fail_head(WcStatus::kRetryExcErr, "PSN sequence errors beyond retry_cnt");
      return false;
    }
    rewind(psn);
    arm_timer();
    return false;
  }
  fail_head(status_for_nak(code), std::string(wr_opcode_name(w.wr.opcode)) + " NAKed by " +
                                      net::Ipv4Address{attr_.av.dest_ip}.str() + ": " +
                                      roce::aeth::nak_code_name(code) + " (AETH " + hex(syndrome) + ")");
  return false;
}

// READ RESPONSE FIRST/MIDDLE/LAST/ONLY: in PSN order, in the right position
// and of exactly the expected length, scattered into the READ's SGEs.
bool QueuePairImpl::on_read_response(const roce::Packet& pkt, SendWqe& w) {
  note_progress();
  const uint32_t psn = pkt.bth.psn;
  if (w.wr.opcode != WrOpcode::kRdmaRead) {
    fail_head(WcStatus::kBadRespErr, "READ response for a " + std::string(wr_opcode_name(w.wr.opcode)));
    return false;
  }
  uint32_t expected = psn_add(w.first_psn, w.rcv_pkts);
  if (psn != expected) {
    // A response went missing: ask for the rest once; stragglers of the
    // old answer that follow must not trigger more requests.
    if (psn_diff(psn, expected) > 0 && !(read_retry_ && *read_retry_ == expected)) {
      read_retry_ = expected;
      rewind(expected);
    }
    return false;
  }
  uint64_t offset = uint64_t{w.rcv_pkts} * mtu_;
  bool is_last = w.rcv_pkts + 1 == w.npkts;
  uint64_t want = is_last ? w.length - offset : mtu_;
  // A re-requested READ is answered from FIRST (or ONLY) again, so only
  // the end of the message is checked against the position.
  bool position_ok = is_last == pkt.op->last() && (w.rcv_pkts > 0 || pkt.op->first());
  if (!position_ok || pkt.payload.size() != want) {
    fail_head(WcStatus::kBadRespErr, "READ response " + std::string(roce::opcode_full_name(pkt.bth.opcode)) +
                                         " with " + std::to_string(pkt.payload.size()) + " bytes, expected " +
                                         std::to_string(want));
    return false;
  }
  if (auto err = scatter(w.sge.data(), w.num_sge, offset, pkt.payload)) {
    fail_head(WcStatus::kLocProtErr, "RDMA_READ destination: " + err->message());
    return false;
  }
  ++w.rcv_pkts;
  una_psn_ = psn_add(psn, 1);
  if (is_last) complete_send(w, WcStatus::kSuccess);
  return true;
}

// ATOMIC ACKNOWLEDGE: the original value, 8 bytes in host order, into the
// atomic's SGE.
bool QueuePairImpl::on_atomic_ack(const roce::Packet& pkt, SendWqe& w) {
  note_progress();
  const uint32_t psn = pkt.bth.psn;
  if (!is_read_or_atomic(w) || w.wr.opcode == WrOpcode::kRdmaRead || psn != w.first_psn) return false;
  uint64_t original = pkt.ext.atomic_ack.original;
  uint8_t bytes[8];
  std::memcpy(bytes, &original, 8);  // host order, like the target memory
  if (auto err = scatter(w.sge.data(), w.num_sge, 0, bytes)) {
    fail_head(WcStatus::kLocProtErr, "atomic result: " + err->message());
    return false;
  }
  una_psn_ = psn_add(psn, 1);
  complete_send(w, WcStatus::kSuccess);
  return true;
}

}  // namespace ufab::transport
