// The responder half of a queue pair: checks every request (PSN, opcode
// sequence, length, QP access, key, bounds) before a byte lands, executes
// it, and answers with ACKs, READ responses, atomic ACKs, the empty READ
// response that answers FLUSH and ATOMIC_WRITE, or the NAK IBA 9.7.5 and
// Linux rxe (rxe_resp.c) give. UD receives live here too.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>

#include "core/transport/gpu_staging.h"
#include "core/transport/lane.h"
#include "core/transport/queue_pair.h"

namespace ufab::transport {

using namespace verbs;
using roce::psn_add;
using roce::psn_diff;
namespace aeth = roce::aeth;

namespace {

// Bytes verbs reserves at the start of a UD receive buffer for the GRH; for
// RoCEv2 over IPv4 the IPv4 header sits in its last 20 bytes (as rxe does).
constexpr uint32_t kGrhBytes = 40;

constexpr uint8_t kNakInvalid = aeth::nak_syndrome(aeth::NakCode::kInvalidRequest);
constexpr uint8_t kNakSequence = aeth::nak_syndrome(aeth::NakCode::kPsnSequenceError);
constexpr uint8_t kNakRemoteOp = aeth::nak_syndrome(aeth::NakCode::kRemoteOperationalError);

}  // namespace

void QueuePairImpl::on_packet(const roce::Packet& pkt) {
  // A connected QP talks to one peer only (rxe check_addr).
  if (is_rc() && pkt.ip.src != attr_.av.dest_ip) {
    ++ctx_.stats().rx_dropped;
    return;
  }
  if (pkt.op->request) {
    on_request(pkt);
  } else if (is_rc()) {
    on_response(pkt);
  } else {
    ++ctx_.stats().rx_dropped;
  }
}

size_t QueuePairImpl::pending_rd_atomic(bool replays) const {
  return static_cast<size_t>(std::count_if(replies_.begin(), replies_.end(), [replays](const Reply& r) {
    return r.kind != Reply::kAck && r.replay == replays;
  }));
}

bool QueuePairImpl::send_ack_frame(uint8_t opcode, uint32_t psn, const roce::Aeth& a, const roce::ExtHeaders* ext) {
  if (!mac_) {
    bool failed = false;
    mac_ = peer_mac(attr_.av.dest_ip, failed);
    if (!mac_) return false;
  }
  roce::FrameSpec spec = frame_spec(opcode, psn, false);
  if (ext != nullptr) spec.ext = *ext;
  spec.ext.aeth = a;
  return ctx_.send_frame_locked(spec, {});
}

// A NAK that ends the connection (invalid request, remote access or
// operational error): sent at once, then the QP goes to ERROR as verbs'
// responder does.
void QueuePairImpl::send_nak(uint8_t syndrome, uint32_t psn, const std::string& why, WcStatus recv_status) {
  ++ctx_.stats().naks_sent;
  if (recv_status != WcStatus::kSuccess && rq_head_ < rq_tail_) {
    complete_recv(recv_status, WcOpcode::kRecv, 0, std::nullopt, 0, why);
  }
  replies_.clear();  // nothing queued before the NAK matters once the QP dies
  (void)send_ack_frame(roce::op::kRcAck, psn, roce::Aeth{syndrome, msn_ & roce::kPsnMask}, nullptr);
  enter_error("responder: " + why);
}

void QueuePairImpl::send_rnr_nak(uint32_t psn) {
  ++ctx_.stats().rnr_naks_sent;
  replies_.push_back(Reply{.kind = Reply::kAck, .psn = psn, .msn = msn_,
                           .syndrome = aeth::rnr_nak_syndrome(attr_.min_rnr_timer)});
}

// ACKs coalesce: a later ACK replaces one not yet sent. Not while bytes
// are on their way into GPU memory: an ACK waits for the bytes before its
// PSN, and one that moved forward with every new packet would wait until
// the requester's window ran dry; each goes as soon as its own bytes are
// placed instead.
void QueuePairImpl::queue_ack(uint32_t psn) {
  if (!replies_.empty() && replies_.back().kind == Reply::kAck && replies_.back().syndrome == aeth::ack_syndrome() &&
      !(stage_ && stage_->pending_psn())) {
    replies_.back().psn = psn;
    replies_.back().msn = msn_;
    return;
  }
  replies_.push_back(Reply{.kind = Reply::kAck, .psn = psn, .msn = msn_, .syndrome = aeth::ack_syndrome()});
}

bool QueuePairImpl::send_reply_packet(Reply& r) {
  switch (r.kind) {
    case Reply::kAck:
      return send_ack_frame(roce::op::kRcAck, r.psn, roce::Aeth{r.syndrome, r.msn & roce::kPsnMask}, nullptr);
    case Reply::kAtomicAck: {
      roce::ExtHeaders ext;
      ext.atomic_ack.original = r.original;
      return send_ack_frame(roce::op::kRcAtomicAck, r.psn, aeth::ack(r.msn), &ext);
    }
    case Reply::kReadRespAck:
      return send_ack_frame(roce::op::kRcReadResponseOnly, r.psn, aeth::ack(r.msn), nullptr);
    case Reply::kRead: break;
  }
  const uint32_t npkts = roce::packets_for(r.length, mtu_);
  while (r.sent_pkts < npkts) {
    if (!mac_) {
      bool failed = false;
      mac_ = peer_mac(attr_.av.dest_ip, failed);
      if (!mac_) return false;
    }
    uint32_t i = r.sent_pkts;
    uint64_t offset = uint64_t{i} * mtu_;
    uint32_t len = static_cast<uint32_t>(std::min<uint64_t>(mtu_, r.length - offset));
    bool first = i == 0, last = i + 1 == npkts;
    namespace o = roce::op;
    uint8_t opcode = first && last ? o::kRcReadResponseOnly
                     : first       ? o::kRcReadResponseFirst
                     : last        ? o::kRcReadResponseLast
                                   : o::kRcReadResponseMiddle;
    roce::FrameSpec spec = frame_spec(opcode, psn_add(r.psn, i), false);
    spec.ext.aeth = aeth::ack(r.msn);
    std::span<const uint8_t> piece;
    uint64_t device = 0;
    Access access;
    if (len > 0 && r.gpu) {
      // GPU memory: from the fragment staged for it (the key was checked
      // when the copy started).
      int got = stage_read_piece(r, i, len, piece);
      if (got < 0) return true;  // NAKed, the QP is in ERROR
      if (got == 0) return false;
    } else if (len > 0) {
      // Checked again per packet: the region may have been deregistered
      // since the request arrived.
      auto a = ctx_.memory().check_remote(r.rkey, pd_, r.va + offset, len, kRemoteRead);
      if (!a) {
        send_nak(a.error().nak_syndrome(), psn_add(r.psn, i), "READ source: " + a.error().message(),
                 WcStatus::kSuccess);
        return true;
      }
      access = std::move(*a);
      piece = {access.data(), len};
      device = access.device_addr();
    }
    if (!ctx_.send_frame_locked(spec, std::span(&piece, len > 0 ? 1 : 0), &device)) return false;
    ++r.sent_pkts;
    ++ctx_.stats().tx_data_packets;
    if (r.replay) ++ctx_.stats().tx_data_resent;
  }
  if (r.gpu) stage_read_sent();
  return true;
}

// Every RC request: the generic checks in rxe's order (check_psn,
// check_op_seq, check_op_valid, check_resource, then the handler's own
// key, length and resource checks), then the opcode's handler.
void QueuePairImpl::on_request(const roce::Packet& pkt) {
  if (!is_rc()) {
    on_ud_send(pkt);
    return;
  }
  if (attr_.state != QpState::kRtr && attr_.state != QpState::kRts) {
    ++ctx_.stats().rx_dropped;
    return;
  }
  ++ctx_.stats().rx_data_packets;
  rx_psn_ = pkt.bth.psn;
  if (!check_psn(pkt)) return;
  const OpcodeHandling& h = handling(pkt.bth.opcode);
  if (h.execute == nullptr) {
    send_nak(kNakInvalid, pkt.bth.psn,
             std::string(roce::opcode_full_name(pkt.bth.opcode)) +
                 (pkt.has(roce::kIeth) ? " (SEND with invalidate)" : "") + " is not supported by this responder",
             WcStatus::kSuccess);
    return;
  }
  if (!check_request(pkt, h)) return;
  (this->*h.execute)(pkt);
  if (stash_valid_) take_stash();
}

// Keeps a copy of `pkt` (a request one PSN ahead of the expected one).
void QueuePairImpl::stash(const roce::Packet& pkt) {
  stash_ = pkt;
  stash_payload_.assign(pkt.payload.begin(), pkt.payload.end());
  stash_.payload = stash_payload_;
  stash_valid_ = true;
}

// After a request at the expected PSN ran: the kept packet, if it is the
// next one now, runs too, and an ACK for it goes out (the requester, which
// got the NAK, skips the go-back when the ACK comes with it). A kept packet
// left behind is dropped.
void QueuePairImpl::take_stash() {
  if (attr_.state != QpState::kRtr && attr_.state != QpState::kRts) {
    stash_valid_ = false;
    return;
  }
  const int32_t diff = psn_diff(stash_.bth.psn, epsn_);
  if (diff > 0) return;
  stash_valid_ = false;
  if (diff < 0) return;
  // Counted when it arrived (as not taken); it is taken now.
  --ctx_.stats().rx_data_packets;
  --ctx_.stats().rx_data_unneeded;
  on_request(stash_);
  if (psn_diff(epsn_, stash_.bth.psn) > 0 && (attr_.state == QpState::kRtr || attr_.state == QpState::kRts)) {
    queue_ack(psn_add(epsn_, roce::kPsnMask));
  }
}

// True for the expected PSN; one behind it is a duplicate, for the
// opcode's duplicate handler. A PSN ahead of it gets one sequence NAK
// (IBA 9.7.5.1.2) and is dropped. The requester then goes back to the
// expected PSN and sends everything from there again, so no further NAK
// goes out until that go-back shows:
//  - a packet at or before the one that drew the NAK, after the requester
//    had sent beyond it (the go-back itself), or
//  - every PSN seen ahead of the gap taken.
// The packet overtaken by one (the expected PSN arriving right after its
// successor) is taken without ending the wait: the go-back is still coming,
// and the old packets after it would otherwise draw a second NAK for the
// successor and a second go-back for one gap, as rxe's responder does (the
// requester ignores a repeated NAK of the same PSN, requester.cc).
bool QueuePairImpl::check_psn(const roce::Packet& pkt) {
  const uint32_t psn = pkt.bth.psn;
  const int32_t diff = psn_diff(psn, epsn_);
  if (diff > 0) {
    ++ctx_.stats().rx_data_unneeded;
    if (!nak_sent_) {
      nak_sent_ = true;
      ahead_first_ = ahead_max_ = psn;
      ++ctx_.stats().naks_sent;
      replies_.push_back(Reply{.kind = Reply::kAck, .psn = epsn_, .msn = msn_, .syndrome = kNakSequence});
      if (diff == 1 && pkt.payload.size() <= mtu_) stash(pkt);
    } else if (psn_diff(psn, ahead_max_) > 0) {
      ahead_max_ = psn;
    }
    return false;
  }
  if (nak_sent_ && (psn_diff(psn, ahead_max_) >= 0 ||
                    (psn_diff(psn, ahead_first_) <= 0 && psn_diff(ahead_max_, ahead_first_) > 0))) {
    nak_sent_ = false;
  }
  if (diff < 0) {
    ++ctx_.stats().rx_data_unneeded;
    ++ctx_.stats().duplicates;
    (this->*handling(pkt.bth.opcode).duplicate)(pkt);
    return false;
  }
  return true;
}

// The checks every request at the expected PSN passes before its handler
// runs; false when one failed and the packet was answered.
bool QueuePairImpl::check_request(const roce::Packet& pkt, const OpcodeHandling& h) {
  const roce::OpcodeInfo& op = *pkt.op;
  const uint32_t psn = pkt.bth.psn;
  const uint32_t len = static_cast<uint32_t>(pkt.payload.size());
  auto opname = [&] { return std::string(roce::opcode_full_name(pkt.bth.opcode)); };
  // Opcode sequence (IBA 9.7.5.1.3 / rxe check_op_seq): inside a message
  // only its MIDDLE and LAST, outside one only FIRST and single packets.
  const bool continues = !op.first();
  if (continues ? (in_message_ == InMessage::kNone || h.message != in_message_) : in_message_ != InMessage::kNone) {
    send_nak(kNakInvalid, psn, opname() + " out of sequence", WcStatus::kSuccess);
    return false;
  }
  // Payload sizes (rxe check_length): FIRST and MIDDLE carry exactly one MTU.
  if (h.message != InMessage::kNone &&
      ((!op.last() && len != mtu_) || (op.last() && !op.first() && (len == 0 || len > mtu_)) ||
       (op.only() && len > mtu_))) {
    send_nak(kNakInvalid, psn,
             opname() + " with " + std::to_string(len) + " bytes of payload at path MTU " + std::to_string(mtu_),
             WcStatus::kSuccess);
    return false;
  }
  // QP access before resources, as rxe (check_op_valid, then
  // check_resource): a forbidden operation is an invalid request, not RNR.
  // Every flag needed must be there (a FLUSH of both placement types needs
  // both FLUSH flags).
  const AccessFlags need = h.access_for != nullptr ? h.access_for(pkt) : h.access;
  if (need && (attr_.access_flags & need) != need) {
    send_nak(kNakInvalid, psn, opname() + " on a QP without " + access_string(need & ~attr_.access_flags) + " access",
             WcStatus::kSuccess);
    return false;
  }
  // IBA C9-94: a DMA length above 2^31 is an invalid request.
  if (op.has(roce::kReth) && pkt.ext.reth.dma_length > (1u << 31)) {
    send_nak(kNakInvalid, psn, opname() + " with a DMA length above 2^31", WcStatus::kSuccess);
    return false;
  }
  if (h.needs_recv && rq_head_ == rq_tail_) {
    send_rnr_nak(psn);
    return false;
  }
  return true;
}

void QueuePairImpl::finish_request(const roce::Packet& pkt) {
  epsn_ = psn_add(pkt.bth.psn, 1);
  if (pkt.bth.ack_req) queue_ack(pkt.bth.psn);
}

// SEND FIRST/MIDDLE/LAST/ONLY: scattered into the receive WQE at the head;
// the last packet completes it.
void QueuePairImpl::execute_send(const roce::Packet& pkt) {
  const roce::OpcodeInfo& op = *pkt.op;
  const uint32_t psn = pkt.bth.psn;
  const uint32_t len = static_cast<uint32_t>(pkt.payload.size());
  if (op.first()) msg_offset_ = 0;
  RecvWqe& r = rq_at(rq_head_);
  if (msg_offset_ + len > r.length) {
    send_nak(kNakInvalid, psn,
             "SEND of at least " + std::to_string(msg_offset_ + len) + " bytes into a receive of " +
                 std::to_string(r.length),
             WcStatus::kLocLenErr);
    return;
  }
  if (r.gpu) {
    // Into GPU memory: through a staging slot; the completion waits for
    // the copy (complete_recv defers it).
    rx_write_ = false;
    int got = stage_inbound(pkt, msg_offset_, op.last());
    if (got < 0) return;
    if (got == 0) {
      ++ctx_.stats().rx_dropped;  // no slot free: RC sends it again
      return;
    }
  } else if (auto err = scatter(r.sge.data(), r.num_sge, msg_offset_, pkt.payload)) {
    send_nak(kNakRemoteOp, psn, "receive buffer: " + err->message(), WcStatus::kLocProtErr);
    return;
  }
  msg_offset_ += len;
  in_message_ = op.last() ? InMessage::kNone : InMessage::kSend;
  if (op.last()) {
    ++msn_;
    complete_recv(WcStatus::kSuccess, WcOpcode::kRecv, static_cast<uint32_t>(msg_offset_),
                  op.has(roce::kImmDt) ? std::optional(pkt.ext.immdt.imm) : std::nullopt, 0);
  }
  finish_request(pkt);
}

// The RETH of a WRITE's first packet: the whole range is checked before
// any byte lands (zero-length WRITEs are not, IBA C9-88). `whole` keeps
// the range pinned, so the first packet's bytes land through it without a
// second lookup.
bool QueuePairImpl::start_write(const roce::Packet& pkt, Access& whole) {
  const roce::Reth& reth = pkt.ext.reth;
  in_gpu_ = false;
  if (reth.dma_length > 0) {
    auto a = ctx_.memory().check_remote(reth.rkey, pd_, reth.va, reth.dma_length, kRemoteWrite, true);
    if (!a) {
      send_nak(a.error().nak_syndrome(), pkt.bth.psn, "RDMA WRITE: " + a.error().message(), WcStatus::kSuccess);
      return false;
    }
    if (a->gpu_device() >= 0) {
      in_gpu_ = true;  // staged: the CPU never writes it
    } else {
      whole = std::move(*a);
    }
  }
  write_va_ = reth.va;
  write_rkey_ = reth.rkey;
  write_length_ = reth.dma_length;
  msg_offset_ = 0;
  return true;
}

// RDMA WRITE FIRST/MIDDLE/LAST/ONLY: each packet's slice is checked again
// as it lands; the payload must add up to the RETH length exactly.
void QueuePairImpl::execute_write(const roce::Packet& pkt) {
  const roce::OpcodeInfo& op = *pkt.op;
  const uint32_t psn = pkt.bth.psn;
  const uint32_t len = static_cast<uint32_t>(pkt.payload.size());
  Access whole;  // the first packet's: the RETH's whole range, pinned
  if (op.first() && !start_write(pkt, whole)) return;
  if (msg_offset_ + len > write_length_ || (op.last() && msg_offset_ + len != write_length_)) {
    send_nak(kNakInvalid, psn,
             "RDMA WRITE payload (" + std::to_string(msg_offset_ + len) + " bytes so far) disagrees with "
             "its RETH length " + std::to_string(write_length_),
             WcStatus::kSuccess);
    return;
  }
  if (in_gpu_) {
    rx_write_ = true;
    int got = stage_inbound(pkt, msg_offset_, op.last());
    if (got < 0) return;
    if (got == 0) {
      ++ctx_.stats().rx_dropped;  // no slot free: RC sends it again
      return;
    }
  } else if (len > 0 && whole.data() != nullptr) {
    // The first packet: inside the range just checked (offset 0, len at
    // most the RETH length, checked above).
    std::memcpy(whole.data(), pkt.payload.data(), len);
  } else if (len > 0) {
    auto a = ctx_.memory().check_remote(write_rkey_, pd_, write_va_ + msg_offset_, len, kRemoteWrite);
    if (!a) {
      send_nak(a.error().nak_syndrome(), psn, "RDMA WRITE: " + a.error().message(), WcStatus::kSuccess);
      return;
    }
    std::memcpy(a->data(), pkt.payload.data(), len);
  }
  msg_offset_ += len;
  in_message_ = op.last() ? InMessage::kNone : InMessage::kWrite;
  if (op.last()) {
    ++msn_;
    if (op.has(roce::kImmDt)) {
      complete_recv(WcStatus::kSuccess, WcOpcode::kRecvRdmaWithImm, write_length_, pkt.ext.immdt.imm, 0);
    }
    in_gpu_ = false;
  }
  finish_request(pkt);
}

// RDMA READ: the key is checked now and again per response packet; the
// responses are queued and take the PSNs the request covers.
void QueuePairImpl::execute_read(const roce::Packet& pkt) {
  const uint32_t psn = pkt.bth.psn;
  const roce::Reth& reth = pkt.ext.reth;
  bool gpu = false;
  if (reth.dma_length > 0) {
    auto a = ctx_.memory().check_remote(reth.rkey, pd_, reth.va, reth.dma_length, kRemoteRead, true);
    if (!a) {
      send_nak(a.error().nak_syndrome(), psn, "RDMA READ: " + a.error().message(), WcStatus::kSuccess);
      return;
    }
    gpu = a->gpu_device() >= 0;
  }
  if (pending_rd_atomic(false) >= attr_.max_dest_rd_atomic) {
    send_nak(kNakInvalid, psn, "more READs/atomics outstanding than max_dest_rd_atomic", WcStatus::kSuccess);
    return;
  }
  ++msn_;
  replies_.push_back(Reply{.kind = Reply::kRead, .psn = psn, .msn = msn_, .va = reth.va, .rkey = reth.rkey,
                           .length = reth.dma_length, .gpu = gpu});
  epsn_ = psn_add(psn, roce::packets_for(reth.dma_length, mtu_));
}

// COMPARE_SWAP and FETCH_ADD with the CPU's atomics, so they are atomic
// against local threads too; the original value goes to the replay cache.
void QueuePairImpl::execute_atomic(const roce::Packet& pkt) {
  const uint32_t psn = pkt.bth.psn;
  if (!rd_atomic_resource_free(pkt)) return;
  const roce::AtomicEth& a = pkt.ext.atomic_eth;
  auto access = ctx_.memory().check_remote(a.rkey, pd_, a.va, 8, kRemoteAtomic);
  if (!access) {
    send_nak(access.error().nak_syndrome(), psn,
             std::string(roce::opcode_full_name(pkt.bth.opcode)) + ": " + access.error().message(),
             WcStatus::kSuccess);
    return;
  }
  auto* target = reinterpret_cast<uint64_t*>(access->data());
  uint64_t original;
  if (pkt.bth.opcode == roce::op::kRcCompareSwap) {
    original = a.compare;
    __atomic_compare_exchange_n(target, &original, a.swap_add, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  } else {
    original = __atomic_fetch_add(target, a.swap_add, __ATOMIC_SEQ_CST);
  }
  finish_replayed(pkt, Reply::kAtomicAck, original);
}

// READs, atomics, FLUSH and ATOMIC_WRITE each hold a responder resource
// until their answer leaves; more than max_dest_rd_atomic at once is the
// requester's fault (rxe: RESPST_ERR_TOO_MANY_RDMA_ATM_REQ, invalid request).
bool QueuePairImpl::rd_atomic_resource_free(const roce::Packet& pkt) {
  if (pending_rd_atomic(false) < attr_.max_dest_rd_atomic) return true;
  send_nak(kNakInvalid, pkt.bth.psn,
           std::string(roce::opcode_full_name(pkt.bth.opcode)) + ": more READs/atomics/FLUSHes outstanding than "
               "max_dest_rd_atomic (" + std::to_string(attr_.max_dest_rd_atomic) + ")",
           WcStatus::kSuccess);
  return false;
}

void QueuePairImpl::finish_replayed(const roce::Packet& pkt, Reply::Kind kind, uint64_t original) {
  const uint32_t psn = pkt.bth.psn;
  if (!replay_cache_.empty()) {
    replay_cache_[replay_cache_next_] = Replay{true, pkt.bth.opcode, psn, original};
    replay_cache_next_ = (replay_cache_next_ + 1) % replay_cache_.size();
  }
  ++msn_;
  replies_.push_back(Reply{.kind = kind, .psn = psn, .msn = msn_, .original = original});
  epsn_ = psn_add(psn, 1);
}

// The QP access a FLUSH needs: the flag of each placement type it asks for
// (rxe's check_qp_attr_access). Undefined type bits need nothing here;
// execute_flush refuses them.
AccessFlags QueuePairImpl::flush_access(const roce::Packet& pkt) {
  const uint8_t t = pkt.ext.feth.placement_type;
  return ((t & roce::feth::kGlobal) ? kFlushGlobal : 0) | ((t & roce::feth::kPersistent) ? kFlushPersistent : 0);
}

// FLUSH (IBA memory placement extensions, rxe's process_flush): the rkey
// must grant the flag of each placement type asked for; a RANGE flush
// must lie inside the region (a whole-region flush names no range).
// GLOBAL: a release fence makes every earlier write (this responder's, in
// PSN order) visible to every thread and device that reads after it.
// PERSISTENT: the range is made durable the way its region's memory is
// (core/rdma/durable.h: cache-line write-back on DAX, msync on a file or
// block device) before the answer leaves. Only durable memory is ever
// registered with FLUSH_PERSISTENT, so DRAM fails the rkey check first
// (remote access error).
void QueuePairImpl::execute_flush(const roce::Packet& pkt) {
  const uint32_t psn = pkt.bth.psn;
  const roce::Feth& f = pkt.ext.feth;
  const roce::Reth& reth = pkt.ext.reth;
  if (!roce::feth::defined(f)) {
    // Stricter than rxe, on what rxe never sends: it reads only the two
    // type bits and treats every selectivity but RANGE as whole region.
    send_nak(kNakInvalid, psn,
             "FLUSH with placement type " + std::to_string(f.placement_type) + " (" +
                 roce::feth::placement_name(f.placement_type) + ") and selectivity " +
                 std::to_string(f.selectivity_level) + " (" + roce::feth::selectivity_name(f.selectivity_level) +
                 "): IBA defines types GLOBAL (1), PERSISTENT (2) or both, and selectivity RANGE (0) or MR (1)",
             WcStatus::kSuccess);
    return;
  }
  if (!rd_atomic_resource_free(pkt)) return;
  const AccessFlags need = flush_access(pkt);
  auto a = f.selectivity_level == roce::feth::kWholeRegion
               ? ctx_.memory().check_remote_region(reth.rkey, pd_, need)
               : ctx_.memory().check_remote(reth.rkey, pd_, reth.va, reth.dma_length, need);
  if (!a) {
    send_nak(a.error().nak_syndrome(), psn,
             std::string("FLUSH ") + roce::feth::placement_name(f.placement_type) + ": " + a.error().message(),
             WcStatus::kSuccess);
    return;
  }
  std::atomic_thread_fence(std::memory_order_release);
  if (f.placement_type & roce::feth::kPersistent) {
    if (auto s = make_durable(a->durability(), a->data(), a->length()); !s) {
      send_nak(kNakRemoteOp, psn, "FLUSH PERSISTENT: " + s.error().message(), WcStatus::kSuccess);
      return;
    }
  }
  finish_replayed(pkt, Reply::kReadRespAck, 0);
}

// ATOMIC_WRITE (rxe's atomic_write_reply): exactly 8 bytes, the rkey with
// remote write over them (remote access error otherwise), 8-byte aligned
// (invalid request otherwise, IBA A19.4.2), stored as one 8-byte release
// store: a local thread that reads the new value also sees every write
// this responder did before it.
void QueuePairImpl::execute_atomic_write(const roce::Packet& pkt) {
  const uint32_t psn = pkt.bth.psn;
  const roce::Reth& reth = pkt.ext.reth;
  if (!rd_atomic_resource_free(pkt)) return;
  auto a = ctx_.memory().check_remote(reth.rkey, pd_, reth.va, reth.dma_length, kRemoteWrite);
  if (!a) {
    send_nak(a.error().nak_syndrome(), psn, "ATOMIC_WRITE: " + a.error().message(), WcStatus::kSuccess);
    return;
  }
  if (reth.dma_length != 8 || pkt.payload.size() != 8) {
    send_nak(kNakInvalid, psn,
             "ATOMIC_WRITE with a RETH length of " + std::to_string(reth.dma_length) + ": it stores exactly 8 bytes",
             WcStatus::kSuccess);
    return;
  }
  if ((reth.va & 7) != 0 || (reinterpret_cast<uintptr_t>(a->data()) & 7) != 0) {
    send_nak(kNakInvalid, psn, "ATOMIC_WRITE to va " + hex(reth.va) + ", which is not 8-byte aligned",
             WcStatus::kSuccess);
    return;
  }
  uint64_t value;
  std::memcpy(&value, pkt.payload.data(), 8);  // the bytes as they travel are the bytes stored
  __atomic_store_n(reinterpret_cast<uint64_t*>(a->data()), value, __ATOMIC_RELEASE);
  finish_replayed(pkt, Reply::kReadRespAck, 0);
}

// Duplicates: requests for a PSN already executed (the ACK or response was
// lost).

// SEND and WRITE are not executed again. Acknowledge everything received
// so far, but only where the requester asked (AckReq): a go-back-N resend
// ends with such a packet anyway, and rxe's completer can complete a WQE it
// is still resending when ACKs arrive in the middle of the resend (seen as
// a stalled rxe requester in the interop tests).
void QueuePairImpl::duplicate_send_write(const roce::Packet& pkt) {
  if (pkt.bth.ack_req) queue_ack(psn_add(epsn_, roce::kPsnMask));
}

// READs are idempotent: answer again from memory, re-checking the key (rxe
// does the same). The request may ask for part of a READ (a requester that
// lost some responses asks again from the first missing one, for the
// range it lacks): queued answers that start inside that range are
// replaced by this one; others (earlier ranges, later READs) stay.
void QueuePairImpl::duplicate_read(const roce::Packet& pkt) {
  const uint32_t psn = pkt.bth.psn;
  const roce::Reth& reth = pkt.ext.reth;
  if (!(attr_.access_flags & kRemoteRead)) return;
  bool gpu = false;
  if (reth.dma_length > 0) {
    auto a = ctx_.memory().check_remote(reth.rkey, pd_, reth.va, reth.dma_length, kRemoteRead, true);
    if (!a) return;
    gpu = a->gpu_device() >= 0;
  }
  const uint32_t end = psn_add(psn, roce::packets_for(reth.dma_length, mtu_));
  std::erase_if(replies_, [&](const Reply& r) {
    return r.kind == Reply::kRead && psn_diff(r.psn, psn) >= 0 && psn_diff(r.psn, end) < 0;
  });
  if (pending_rd_atomic(true) >= attr_.max_dest_rd_atomic) {
    ++ctx_.stats().rx_dropped;  // a flood of old READs must not queue unbounded responses
    return;
  }
  replies_.push_back(Reply{.kind = Reply::kRead, .psn = psn, .msn = msn_, .va = reth.va, .rkey = reth.rkey,
                           .length = reth.dma_length, .replay = true, .gpu = gpu});
}

// Atomics, FLUSH and ATOMIC_WRITE are never executed twice: the answer
// comes from the replay cache, for the same PSN and opcode only (rxe's
// find_resource by PSN; a request of another kind at that PSN is not the
// one that ran).
void QueuePairImpl::duplicate_replay(const roce::Packet& pkt) {
  const uint32_t psn = pkt.bth.psn;
  for (const Replay& c : replay_cache_) {
    if (c.valid && c.psn == psn && c.opcode == pkt.bth.opcode) {
      if (pending_rd_atomic(true) >= attr_.max_dest_rd_atomic) break;
      const Reply::Kind kind = pkt.op->kind == roce::OpKind::kAtomic ? Reply::kAtomicAck : Reply::kReadRespAck;
      replies_.push_back(Reply{.kind = kind, .psn = psn, .msn = msn_, .original = c.original, .replay = true});
      return;
    }
  }
  ++ctx_.stats().rx_dropped;  // too old to replay, or not what ran; the requester will time out
}

void QueuePairImpl::duplicate_drop(const roce::Packet&) { ++ctx_.stats().rx_dropped; }

void QueuePairImpl::on_ud_send(const roce::Packet& pkt) {
  if ((attr_.state != QpState::kRtr && attr_.state != QpState::kRts) || pkt.op->kind != roce::OpKind::kSend ||
      pkt.ext.deth.qkey != attr_.qkey) {
    ++ctx_.stats().rx_dropped;
    return;
  }
  if (rq_head_ == rq_tail_) {
    ++ctx_.stats().rx_dropped;  // UD has no RNR: no receive, no datagram
    return;
  }
  RecvWqe& r = rq_at(rq_head_);
  const uint32_t len = static_cast<uint32_t>(pkt.payload.size());
  std::optional<uint32_t> imm;
  if (pkt.op->has(roce::kImmDt)) imm = pkt.ext.immdt.imm;
  if (kGrhBytes + uint64_t{len} > r.length) {
    complete_recv(WcStatus::kLocLenErr, WcOpcode::kRecv, 0, imm, pkt.ext.deth.src_qp,
                  "UD datagram of " + std::to_string(len) + " bytes (+40 GRH) into a receive of " +
                      std::to_string(r.length));
    return;
  }
  std::array<uint8_t, kGrhBytes> grh{};
  roce::write_ipv4(std::span<uint8_t, roce::kIpv4Bytes>(grh.data() + 20, roce::kIpv4Bytes), pkt.ip);
  auto err = scatter(r.sge.data(), r.num_sge, 0, grh);
  if (!err) err = scatter(r.sge.data(), r.num_sge, kGrhBytes, pkt.payload);
  if (err) {
    complete_recv(WcStatus::kLocProtErr, WcOpcode::kRecv, 0, imm, pkt.ext.deth.src_qp, err->message());
    return;
  }
  complete_recv(WcStatus::kSuccess, WcOpcode::kRecv, kGrhBytes + len, imm, pkt.ext.deth.src_qp);
}

}  // namespace ufab::transport
