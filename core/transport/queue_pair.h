// One queue pair of the software transport: the RC requester (segmentation,
// PSNs, ACK/NAK handling, go-back-N retransmission on NAK and timeout, RNR
// back-off, a congestion window, READ reassembly with selective re-requests,
// atomics, FLUSH and ATOMIC_WRITE), the RC responder (PSN checks,
// duplicate handling with a replay cache for atomics, FLUSH and
// ATOMIC_WRITE, key and bound checks
// before any byte lands, NAKs as rxe sends them) and UD datagrams.
// docs/transport.md describes the design. Everything runs under the
// lock of the QP's lane (lane.h).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/hex.h"
#include "core/net/addresses.h"
#include "core/roce/builder.h"
#include "core/roce/parser.h"
#include "core/transport/completion_queue.h"
#include "core/transport/verbs.h"

namespace ufab::transport {

class Lane;
struct QpStaging;  // gpu_staging.h
using Clock = std::chrono::steady_clock;

// "0x1a2b" for QP numbers, keys and syndromes in messages.
using ufab::hex;  // base/hex.h, for requester.cc and responder.cc

class QueuePairImpl {
 public:
  QueuePairImpl(Lane& ctx, uint32_t qpn, verbs::PdId pd, verbs::QpType type, CompletionQueueImpl* send_cq,
                CompletionQueueImpl* recv_cq, const verbs::QpCaps& caps, bool sq_sig_all, uint32_t initial_psn);
  ~QueuePairImpl();

  uint32_t qpn() const { return qpn_; }
  verbs::QpType type() const { return type_; }
  verbs::QpState state() const { return attr_.state; }
  const verbs::QpAttr& attr() const { return attr_; }
  uint32_t initial_psn() const { return initial_psn_; }
  bool uses(const CompletionQueueImpl* cq) const { return send_cq_ == cq || recv_cq_ == cq; }

  Status modify(const verbs::QpAttr& attr, verbs::QpAttrMask mask);
  Status post_send(const verbs::SendWr& wr);
  static Status check_placement_wr(const verbs::SendWr& wr);  // FLUSH, ATOMIC_WRITE operands
  Status post_recv(const verbs::RecvWr& wr);

  // A parsed packet addressed to this QP.
  void on_packet(const roce::Packet& pkt);
  // Retransmission and RNR timers; returns 1 when a timer fired. Reads
  // the context's clock only when a timer is armed.
  int on_timer();
  // Sends what is queued (responses first, then requests) while the NIC
  // has buffers; returns packets sent.
  int transmit();
  // Puts the QP in ERROR and flushes both queues (verbs' error state).
  void enter_error(const std::string& why);
  // The CQ could not take a completion of this QP.
  bool lost_completion() const { return lost_completion_; }
  // GPU staging (gpu_staging.cc): whether this QP ever staged, and one
  // round of it (copies landed, slots given back, copies started,
  // completions that waited for placement); returns 1 while copies are in
  // flight, so the lane keeps polling instead of sleeping.
  bool has_staging() const { return stage_ != nullptr; }
  int stage_progress();

 private:
  static constexpr uint32_t kNoAsk = 0xFFFFFFFF;
  struct SendWqe {
    verbs::SendWr wr;  // wr.sgl is unused: the SGEs are copied into sge
    std::array<verbs::Sge, verbs::kMaxSge> sge{};
    uint32_t num_sge = 0;
    std::vector<uint8_t> inline_data;  // cleared, not freed, between uses of the slot
    bool is_inline = false;
    bool signaled = false;
    uint64_t length = 0;
    bool started = false;
    uint32_t first_psn = 0;
    uint32_t npkts = 0;
    uint32_t rcv_pkts = 0;  // READ: response packets taken from index 0 on without a hole
    uint32_t read_seen = 0;    // READ: one past the highest response seen (npkts once its tail is known lost)
    uint32_t read_ask_at = kNoAsk;  // READ: the first missing response when it was last asked for again
    uint32_t read_got = 0;    // READ: response packets taken in all (holes filled later included)
    // A commit-complete WRITE (kSendCommit) is two WQEs: the WRITE, never
    // signaled, and a FLUSH PERSISTENT of its range that completes as the
    // application's RDMA_WRITE. One completion per work request: an error
    // of the WRITE part silences its FLUSH part.
    enum class Commit : uint8_t { kNone, kWrite, kFlush } commit = Commit::kNone;
    bool quiet = false;  // a FLUSH part whose WRITE part already reported an error
    bool gpu = false;    // an SGE is GPU memory: staged (gpu_staging.cc)
  };
  struct RecvWqe {
    uint64_t wr_id = 0;
    std::array<verbs::Sge, verbs::kMaxSge> sge{};
    uint32_t num_sge = 0;
    uint64_t length = 0;
    bool gpu = false;  // an SGE is GPU memory: a SEND into it is staged
  };
  // What the responder owes the requester, in PSN order. kReadRespAck is
  // the answer to FLUSH and ATOMIC_WRITE: RDMA READ Response Only with an
  // AETH and no payload, as rxe sends it (send_read_response_ack).
  struct Reply {
    enum Kind : uint8_t { kAck, kRead, kAtomicAck, kReadRespAck } kind = kAck;
    uint32_t psn = 0;  // ACK: the PSN acknowledged; READ: first response PSN
    uint32_t msn = 0;
    uint8_t syndrome = 0;  // ACK: an ACK, RNR NAK or sequence NAK
    // READ
    uint64_t va = 0;
    uint32_t rkey = 0;
    uint32_t length = 0;
    uint32_t sent_pkts = 0;
    // atomic
    uint64_t original = 0;
    bool replay = false;  // an answer to a duplicate request
    bool gpu = false;     // READ of GPU memory: responses from staged fragments
  };
  // A request the responder executed that a duplicate must not execute
  // again (atomics, FLUSH, ATOMIC_WRITE): the answer to send instead.
  struct Replay {
    bool valid = false;
    uint8_t opcode = 0;  // BTH opcode of the request
    uint32_t psn = 0;
    uint64_t original = 0;  // atomics: the value before the operation
  };

  // The multi-packet message a request packet belongs to (none for READ,
  // atomics and the rest).
  enum class InMessage : uint8_t { kNone, kSend, kWrite };

  // The transport's half of the opcode table: how this QP handles one BTH
  // opcode. What the packet is on the wire (position in its message,
  // extension headers, payload) is roce::OpcodeInfo's half; this row adds
  // what rxe's opcode masks add (the message it continues, the QP access it
  // needs, whether it needs a receive WQE) and names the handlers. A new
  // opcode is one row in QueuePairImpl::handling (queue_pair.cc) and its
  // handlers.
  using RequestHandler = void (QueuePairImpl::*)(const roce::Packet&);
  using ResponseHandler = bool (QueuePairImpl::*)(const roce::Packet&, SendWqe&);
  using AccessFor = verbs::AccessFlags (*)(const roce::Packet&);
  struct OpcodeHandling {
    InMessage message = InMessage::kNone;  // FIRST/MIDDLE packets carry exactly the MTU
    verbs::AccessFlags access = 0;         // QP access flag the operation needs
    // QP access that depends on the packet instead (FLUSH: its placement
    // type); nullptr: `access`.
    AccessFor access_for = nullptr;
    bool needs_recv = false;               // consumes (FIRST/ONLY) or completes a receive WQE
    // Responder, at the expected PSN after the generic checks (PSN, opcode
    // sequence, lengths, QP access, DMA length, receive WQE). nullptr: the
    // responder refuses the opcode before those checks.
    RequestHandler execute = nullptr;
    RequestHandler duplicate = nullptr;  // responder, PSN already executed
    // Requester, for a PSN inside the oldest outstanding work request;
    // true when it made progress (acknowledged PSNs). nullptr: dropped.
    ResponseHandler response = nullptr;
  };
  // The row for `opcode`; opcodes nobody handles get a row that refuses
  // requests and drops responses.
  static const OpcodeHandling& handling(uint8_t opcode);

  bool is_rc() const { return type_ == verbs::QpType::kRc; }
  // Work that takes a responder resource (counted against max_rd_atomic,
  // waited for by kSendFence): READ, atomics, FLUSH, ATOMIC_WRITE.
  // (Inline: the requester asks these per packet and per completion.)
  bool is_read_or_atomic(const SendWqe& w) const { return answered_by_read_response(w) || is_atomic(w); }
  // CMP_AND_SWP and FETCH_AND_ADD, answered by an atomic ACK.
  static bool is_atomic(const SendWqe& w) {
    return w.wr.opcode == verbs::WrOpcode::kAtomicCmpAndSwp || w.wr.opcode == verbs::WrOpcode::kAtomicFetchAndAdd;
  }
  // READ, FLUSH and ATOMIC_WRITE, answered by READ responses; for these
  // rcv_pkts counts the responses taken.
  static bool answered_by_read_response(const SendWqe& w) {
    return w.wr.opcode == verbs::WrOpcode::kRdmaRead || is_placement(w);
  }
  // FLUSH and ATOMIC_WRITE: one request, one empty READ Response Only.
  static bool is_placement(const SendWqe& w) {
    return w.wr.opcode == verbs::WrOpcode::kFlush || w.wr.opcode == verbs::WrOpcode::kAtomicWrite;
  }
  SendWqe& sq_at(uint64_t index) { return sq_[index % sq_.size()]; }
  RecvWqe& rq_at(uint64_t index) { return rq_[index % rq_.size()]; }

  // modify: RESET's forgetting, and taking checked attributes.
  void reset();
  void apply(const verbs::QpAttr& a, verbs::QpAttrMask given);

  // Requester.
  Status check_commit_wr(const verbs::SendWr& wr) const;  // kSendCommit
  // GPU regions at post time: true when an SGE is GPU memory (staged),
  // an error for a freed GPU buffer.
  Result<bool> check_gpu_sges(std::span<const verbs::Sge> sgl) const;
  // What a work request with GPU SGEs may be (RC SEND/WRITE/READ).
  Status check_gpu_wr(const verbs::SendWr& wr, uint64_t length) const;
  // Fills the next send queue entry (post_send checked everything).
  void enqueue(const verbs::SendWr& wr, uint64_t length, bool is_inline, SendWqe::Commit commit, bool gpu = false);
  bool start_wqe(SendWqe& w, bool sending_now);
  int send_request_packet(SendWqe& w);  // 1 sent, 0 no buffer/MAC yet, 2 WQE failed (completed), -1 QP left RTS
  // One request packet as built, before its payload is gathered.
  struct RequestPacket {
    roce::FrameSpec spec;
    uint64_t offset = 0;    // of the payload (or of a re-requested READ) in the message
    uint32_t payload = 0;   // bytes
    uint32_t psn_step = 1;  // PSNs the packet takes (a READ: its responses)
    bool last = true;       // the work request's last packet
  };
  struct Gather {
    std::array<std::span<const uint8_t>, verbs::kMaxSge> pieces;
    std::array<uint64_t, verbs::kMaxSge> device;     // each piece's device address, 0: none (inline)
    std::array<verbs::Access, verbs::kMaxSge> pins;  // keep the regions pinned until the frame is built
    size_t n = 0;
  };
  int build_ud_request(SendWqe& w, RequestPacket& p);
  int build_rc_request(SendWqe& w, RequestPacket& p);
  int gather_request(SendWqe& w, const RequestPacket& p, Gather& g);
  void on_response(const roce::Packet& pkt);
  bool ack_earlier(uint32_t psn);  // completes WQEs before psn; false when it rewound or failed
  void note_progress();            // the peer answered: retries start over
  // Response handlers (OpcodeHandling::response).
  bool on_ack(const roce::Packet& pkt, SendWqe& w);
  bool on_nak(const roce::Packet& pkt, SendWqe& w);
  bool on_read_response(const roce::Packet& pkt, SendWqe& w);
  bool on_atomic_ack(const roce::Packet& pkt, SendWqe& w);
  void take_placement_response(const roce::Packet& pkt, uint64_t sq_index, SendWqe& w);
  void complete_send(SendWqe& w, verbs::WcStatus status, std::string error = {});
  void handle_response(const roce::Packet& pkt);
  void take_read_response(const roce::Packet& pkt);
  // READ responses: the bitmap of the READ in sq slot `slot`, what arrived,
  // asking again for the holes, completing READs in order.
  std::vector<uint64_t>& read_bits(uint64_t sq_index);
  bool read_has(uint64_t sq_index, const SendWqe& w, uint32_t index);
  void read_mark(uint64_t sq_index, SendWqe& w, uint32_t index);
  uint32_t read_missing_end(uint64_t sq_index, const SendWqe& w, uint32_t from, uint32_t end);
  void ask_read_hole(uint64_t sq_index, SendWqe& w);
  void complete_done();
  int send_read_rerequest();  // 1 sent, 0 none or no buffer
  // Congestion window: halve on a NAK (once per window), one packet after a
  // timeout; grow back (doubling up to ssthresh_, then one per window).
  void window_loss(uint32_t psn, bool timeout);
  void window_acked(uint32_t packets);
  void rewind(uint32_t psn);
  void arm_timer();
  bool retry_exhausted(bool rnr);
  // Completes the WQEs before sq index `index` as flushed, that one with
  // `status`, and puts the QP in ERROR.
  void fail_from(uint64_t index, verbs::WcStatus status, std::string error);
  void fail_head(verbs::WcStatus status, std::string error) { fail_from(sq_head_, status, std::move(error)); }
  std::optional<net::MacAddress> peer_mac(uint32_t ip, bool& failed);

  // Responder.
  void on_request(const roce::Packet& pkt);
  bool check_psn(const roce::Packet& pkt);  // false: a gap or a duplicate, handled
  bool check_request(const roce::Packet& pkt, const OpcodeHandling& h);  // false: NAKed
  void finish_request(const roce::Packet& pkt);  // one PSN done: expect the next, ACK if asked
  void on_ud_send(const roce::Packet& pkt);
  // Request handlers (OpcodeHandling::execute).
  void execute_send(const roce::Packet& pkt);
  void execute_write(const roce::Packet& pkt);
  bool start_write(const roce::Packet& pkt, verbs::Access& whole);
  void execute_read(const roce::Packet& pkt);
  void execute_atomic(const roce::Packet& pkt);
  void execute_flush(const roce::Packet& pkt);
  void execute_atomic_write(const roce::Packet& pkt);
  static verbs::AccessFlags flush_access(const roce::Packet& pkt);  // OpcodeHandling::access_for of FLUSH
  // A request that took a responder resource was executed: remember its
  // answer for duplicates, count it, queue the answer, expect the next PSN.
  void finish_replayed(const roce::Packet& pkt, Reply::Kind kind, uint64_t original);
  bool rd_atomic_resource_free(const roce::Packet& pkt);  // false: NAKed
  // Duplicate handlers (OpcodeHandling::duplicate).
  void duplicate_send_write(const roce::Packet& pkt);
  void duplicate_read(const roce::Packet& pkt);
  void duplicate_replay(const roce::Packet& pkt);  // atomics, FLUSH, ATOMIC_WRITE
  void duplicate_drop(const roce::Packet& pkt);
  void send_nak(uint8_t syndrome, uint32_t psn, const std::string& why, verbs::WcStatus recv_status);
  void send_rnr_nak(uint32_t psn);
  void queue_ack(uint32_t psn);
  // READ responses and atomic ACKs queued, for new requests or for
  // duplicates (each bounded by max_dest_rd_atomic).
  size_t pending_rd_atomic(bool replays) const;
  bool send_reply_packet(Reply& r);  // true when r is fully sent
  bool send_ack_frame(uint8_t opcode, uint32_t psn, const roce::Aeth& aeth, const roce::ExtHeaders* ext);
  void complete_recv(verbs::WcStatus status, verbs::WcOpcode opcode, uint32_t byte_len, std::optional<uint32_t> imm,
                     uint32_t src_qp, std::string error = {});

  // GPU staging (gpu_staging.cc, docs/gpu.md).
  QpStaging& stage();
  uint64_t stage_frag() const;
  // Requester: the payload of `p` from its staged fragment; 1 ready, 0
  // not staged yet (the send stalls), -1 the QP failed.
  int staged_piece(SendWqe& w, const RequestPacket& p, Gather& g);
  bool stage_read_start(SendWqe& w);  // false: no slots yet
  // A READ response into GPU memory: into its fragment's slot, copied out
  // once the fragment is whole. False: the QP failed.
  bool stage_read_response(uint64_t sq_index, SendWqe& w, uint64_t offset, std::span<const uint8_t> payload);
  bool stage_read_placed(uint64_t sq_index);
  bool stage_local_wait();  // the head waits for this side's copies (not a peer loss)
  // Responder: a WRITE/SEND packet into GPU memory; 1 taken, 0 no slot
  // (dropped, RC recovers it), -1 NAKed.
  int stage_inbound(const roce::Packet& pkt, uint64_t offset, bool last);
  bool stage_issue_fill(bool final_part);  // false: NAKed
  bool stage_reply_ok(const Reply& r);  // every byte before r.psn is placed
  int stage_read_piece(Reply& r, uint32_t index, uint32_t len, std::span<const uint8_t>& piece);
  void stage_read_sent();
  // Error or reset: copies in flight orphaned; receive completions that
  // waited for placement complete flushed (`emit`) or are dropped (RESET).
  void stage_abort(bool emit);
  void stage_emit_deferred(bool flush);

  // Copies data into / out of SGE lists through the key table.
  std::optional<Error> scatter(const verbs::Sge* sge, uint32_t n, uint64_t offset, std::span<const uint8_t> data);
  roce::FrameSpec frame_spec(uint8_t opcode, uint32_t psn, bool ack_req);
  void push_completion(CompletionQueueImpl* cq, verbs::WorkCompletion&& wc);

  Lane& ctx_;  // the lane the QP lives on
  const uint32_t qpn_;
  const verbs::PdId pd_;
  const verbs::QpType type_;
  CompletionQueueImpl* const send_cq_;
  CompletionQueueImpl* const recv_cq_;
  const verbs::QpCaps caps_;
  const bool sq_sig_all_;
  const uint32_t initial_psn_;
  verbs::QpAttr attr_;
  uint32_t mtu_ = 1024;
  bool lost_completion_ = false;
  std::string error_why_;  // why the QP went to ERROR, for work posted afterwards
  uint16_t ip_id_ = 0;
  uint16_t udp_sport_ = 0xC000;
  std::optional<net::MacAddress> mac_;  // the RC peer's, once resolved

  // Send queue: [head_, next_) started and not complete, [next_, tail_) not sent.
  std::vector<SendWqe> sq_;
  uint64_t sq_head_ = 0, sq_next_ = 0, sq_tail_ = 0;
  uint32_t cursor_psn_ = 0;    // PSN of the next request packet
  uint32_t una_psn_ = 0;       // oldest PSN not acknowledged
  uint32_t max_sent_psn_ = 0;  // one past the highest PSN ever sent (retransmit accounting)
  uint32_t rd_atomic_outstanding_ = 0;
  uint32_t noack_pkts_ = 0;
  // Packets in flight at most: the largest window, and the smallest it
  // shrinks to.
  static constexpr uint32_t kMaxWindow = 256;
  static constexpr uint32_t kMinWindow = 8;
  uint32_t cwnd_ = kMaxWindow;      // packets in flight allowed now
  uint32_t ssthresh_ = kMaxWindow;  // below it the window doubles per window acknowledged, above it grows by one
  uint32_t cwnd_acked_ = 0;         // packets acknowledged toward the next +1
  // The window before the last cut (NAK or timeout), restored when the next
  // response acknowledges past the cursor while at most one packet was
  // resent since the go-back to undo_psn_: the go-back was not needed (a
  // late ACK, or packets that were only swapped). 0: none.
  uint32_t undo_cwnd_ = 0, undo_ssthresh_ = 0, undo_psn_ = 0;
  bool recovering_ = false;     // a loss was answered; losses before recover_psn_ belong to it
  uint32_t recover_psn_ = 0;
  std::optional<uint32_t> nak_rewound_;     // PSN of the last go-back on a sequence NAK
  std::optional<uint32_t> acked_through_;   // highest PSN an ACK covered (SEND/WRITE)
  // READ: per send-queue slot, which response packets arrived (bit i % kReadTrack
  // for index i, from rcv_pkts on); storage kept between uses of the slot.
  static constexpr uint32_t kReadTrack = 32768;
  std::vector<std::vector<uint64_t>> read_bits_;
  // READ ranges to ask for again, apart from the cursor (bounded).
  struct ReadAsk {
    uint64_t sq_index = 0;
    uint32_t first = 0;  // response index
    uint32_t count = 0;  // response packets
  };
  static constexpr size_t kMaxReadAsks = 8;
  std::vector<ReadAsk> read_asks_;
  uint8_t retry_left_ = 7, rnr_left_ = 7;
  std::optional<Clock::time_point> timer_;      // retransmission deadline
  std::chrono::nanoseconds srtt_{0};            // smoothed round trip (0: not measured)
  std::chrono::nanoseconds rttvar_{0};          // its mean deviation
  std::optional<Clock::time_point> rtt_start_;  // when rtt_psn_ was sent (a sample under way)
  uint32_t rtt_psn_ = 0;
  static constexpr uint8_t kRttEvery = 32;
  uint8_t rtt_skip_ = kRttEvery - 1;  // the first AckReq packet starts a sample
  static constexpr uint8_t kMaxBackoff = 6;     // the timeout doubles at most this often in a row
  uint8_t backoff_ = 0;
  std::optional<Clock::time_point> rnr_until_;  // no requests before this (RNR back-off)

  // Receive queue.
  std::vector<RecvWqe> rq_;
  uint64_t rq_head_ = 0, rq_tail_ = 0;

  // Responder.
  uint32_t epsn_ = 0;  // expected PSN
  uint32_t msn_ = 0;
  bool nak_sent_ = false;  // a sequence NAK went out; the requester will go back
  uint32_t ahead_first_ = 0;  // the PSN ahead of the gap that drew the NAK
  uint32_t ahead_max_ = 0;    // the highest PSN seen ahead of the gap since
  // The packet one ahead of the expected PSN that drew the NAK, kept: when
  // the expected one arrives next (the two were swapped), it runs right
  // after it, and an ACK tells the requester that its go-back is not needed.
  bool stash_valid_ = false;
  roce::Packet stash_{};
  std::vector<uint8_t> stash_payload_;
  void stash(const roce::Packet& pkt);
  void take_stash();
  InMessage in_message_ = InMessage::kNone;
  uint64_t msg_offset_ = 0;  // bytes of the current message so far
  uint64_t write_va_ = 0;
  uint32_t write_rkey_ = 0;
  uint32_t write_length_ = 0;
  std::deque<Reply> replies_;
  std::vector<Replay> replay_cache_;  // max_dest_rd_atomic entries, a ring
  uint32_t replay_cache_next_ = 0;
  bool in_gpu_ = false;  // the message in progress lands in GPU memory (staged)
  bool rx_write_ = false;  // ... and is a WRITE (else a SEND)
  uint32_t rx_psn_ = 0;  // PSN of the request being executed
  std::unique_ptr<QpStaging> stage_;  // created on first GPU use
};

}  // namespace ufab::transport
