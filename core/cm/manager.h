// The connection manager behind ufab/cm.h: one per device. It owns the
// device's GSI QP (QP 1), a thread that receives CM MADs there and runs the
// retransmission timers, and the connections' state machines (IBTA vol 1
// 12.9, as the Linux kernel's ib_cm keeps them; docs/cm.md draws them).
//
// Locking: mu_ guards everything below it. API calls take it and send
// what they must right away; the thread takes it for each MAD and each
// timer round. Nothing here blocks on the wire under mu_: the GSI QP's
// post_send only queues.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/error.h"
#include "base/fd.h"
#include "core/cm/mad.h"
#include "ufab/cm.h"
#include "ufab/rdma.h"

namespace ufab::cm {

using Clock = std::chrono::steady_clock;

// IBA's 4.096 us * 2^code timeouts.
constexpr Clock::duration iba_time(uint8_t code) {
  return std::chrono::nanoseconds(uint64_t{4096} << (code & 31));
}

class Manager {
 public:
  static Result<std::unique_ptr<Manager>> open(ufab_device* dev, const ufab_cm_opts& opts);
  ~Manager();
  Manager(const Manager&) = delete;
  Manager& operator=(const Manager&) = delete;

  int event_fd() const { return event_fd_.get(); }
  Status get_event(ufab_cm_event& out, int timeout_ms);

  Result<ufab_cm_listener*> listen(uint16_t port_space, uint16_t port);
  void close_listener(ufab_cm_listener* listener);
  Result<ufab_cm_id*> connect(ufab_qp* qp, uint32_t dest_ip, uint16_t port, const ufab_cm_conn_param& param);
  Result<ufab_cm_id*> resolve_ud(uint32_t dest_ip, uint16_t port, const ufab_cm_conn_param& param);
  Status accept(ufab_cm_id* id, ufab_qp* qp, const ufab_cm_conn_param& param);
  Status reject(ufab_cm_id* id, std::span<const uint8_t> private_data);
  Status disconnect(ufab_cm_id* id);
  void destroy(ufab_cm_id* id);

 private:
  enum class State : uint8_t {
    kReqSent,      // active: REQ out, waiting for REP/REJ/MRA
    kMraReceived,  // active: the peer asked for more time
    kReqReceived,  // passive: CONNECT_REQUEST given to the application
    kMraSent,      // passive: a REQ came again while the application decides
    kRepSent,      // passive: accepted, waiting for RTU
    kEstablished,
    kDreqSent,     // waiting for DREP
    kTimewait,     // over; kept a while to answer stray DREQs and REQs
  };
  static const char* state_name(State s);

  struct Conn {
    State state = State::kReqSent;
    bool active = false;
    bool ud = false;  // SIDR: a UD service resolution, not a connection
    bool rejected = false;  // passive: we answered REJ (kept in `answer` for a repeated REQ)
    uint32_t local_id = 0, remote_id = 0;
    uint64_t tid = 0;  // of the REQ: REP, RTU, MRA and REJ answer it
    uint32_t peer_ip = 0;
    uint16_t peer_port = 0, local_port = 0;
    ufab_qp* qp = nullptr;
    Req req;  // the REQ sent (active) or received (passive)
    Rep rep;  // the REP received (active) or sent (passive)
    SidrReq sidr;  // UD: the SIDR_REQ sent (active) or received (passive)
    // What the timer sends again (REQ, REP, DREQ) and what a duplicate of
    // the peer's last message gets (MRA, RTU, DREP).
    std::optional<std::array<uint8_t, kMadSize>> resend, answer;
    std::optional<Clock::time_point> deadline;
    Clock::duration interval{};
    uint8_t retries_left = 0;
    ufab_cm_id* handle = nullptr;            // nullptr: the application let go
    ufab_cm_listener* listener = nullptr;    // passive
  };

  Manager() = default;
  Status start(ufab_device* dev, const ufab_cm_opts& opts);
  void run();

  // The wire.
  void post_receives();
  void on_completion(const ufab_wc& wc);
  void on_mad(uint32_t peer_ip, std::span<const uint8_t> bytes);
  // Posts the MAD, or queues it while every send slot is in flight.
  void send(uint32_t peer_ip, const std::array<uint8_t, kMadSize>& mad);
  void post_send(uint32_t peer_ip, const std::array<uint8_t, kMadSize>& mad);
  void drain_backlog();  // posts what waits, as slots come back
  std::optional<std::array<uint8_t, kMadSize>> build(uint64_t tid, Message message);
  // Builds, sends and returns the MAD (to keep for resending).
  std::optional<std::array<uint8_t, kMadSize>> send_message(uint32_t peer_ip, uint64_t tid, Message message);
  std::optional<std::array<uint8_t, kMadSize>> send_rej(uint32_t peer_ip, uint64_t tid, uint32_t local_id,
                                                        uint32_t remote_id, MessageCode what, RejectReason reason,
                                                        std::span<const uint8_t> private_data = {});

  void reject_timeout(Conn& c);  // REJ "timeout" for a REQ we give up on

  // Message handlers.
  void on_req(uint32_t peer_ip, const MadHeader& h, const Req& m);
  void on_rep(const MadHeader& h, const Rep& m);
  void on_rtu(const Rtu& m);
  void on_rej(uint32_t peer_ip, const Rej& m);
  void on_mra(const Mra& m);
  void on_dreq(uint32_t peer_ip, const MadHeader& h, const Dreq& m);
  void on_drep(const Drep& m);
  void on_sidr_req(uint32_t peer_ip, const MadHeader& h, const SidrReq& m);
  void on_sidr_rep(const SidrRep& m);
  Status accept_ud(Conn& c, ufab_cm_id* id, ufab_qp* qp, const ufab_cm_conn_param& param);
  void answer_sidr(Conn& c, SidrStatus status, uint32_t qpn, uint32_t qkey, std::span<const uint8_t> private_data);

  // Connections.
  // Files a new connection with an id for the application (and, passive,
  // under the peer's id for its repeats).
  Conn& file(std::unique_ptr<Conn> c);
  // A request for `listener` (REQ or SIDR_REQ), not filed yet: the caller
  // adds what the request carried.
  std::unique_ptr<Conn> passive_conn(uint32_t peer_ip, uint64_t tid, uint32_t remote_id, uint16_t peer_port,
                                     uint16_t local_port, ufab_cm_listener* listener);
  Conn* find(uint32_t local_id);
  // Passive requests (REQ, SIDR_REQ) the application has not answered:
  // bounded by UFAB_CM_MAX_PENDING_REQUESTS against a peer's flood.
  size_t pending_requests() const;
  Conn* find_rc(uint32_t local_id);  // a connection, not a SIDR
  Conn* find_handle(ufab_cm_id* id);
  uint32_t new_local_id();
  void arm(Conn& c, Clock::duration interval, uint8_t retries);
  void run_timers(Clock::time_point now);
  void enter_timewait(Conn& c);
  void forget(Conn& c);
  void send_dreq(Conn& c);  // QP to ERROR, DREQ out, retransmitted until DREP
  void qp_to_error(Conn& c);
  Status connect_qp(Conn& c, ufab_qp* qp, uint32_t remote_qpn, uint32_t remote_psn, uint8_t responder_resources,
                    uint8_t initiator_depth, uint8_t retry, uint8_t rnr_retry);
  std::optional<Clock::time_point> next_deadline() const;

  // Events.
  void push(Conn& c, uint32_t type, int status, std::span<const uint8_t> private_data = {}, uint16_t reason = 0);
  void push(ufab_cm_event event);
  // Takes events out of the queue (a destroyed id's, a closed listener's);
  // the event fd goes quiet when none is left.
  void drop_events(const std::function<bool(const ufab_cm_event&)>& which);

  ufab_device* dev_ = nullptr;
  uint32_t ip_ = 0;
  uint32_t mtu_ = 1024;
  uint8_t response_timeout_ = 18;
  uint8_t max_retries_ = 7;
  ufab_pd* pd_ = nullptr;
  ufab_cq* cq_ = nullptr;
  ufab_qp* gsi_ = nullptr;
  ufab_mr* mr_ = nullptr;
  std::vector<uint8_t> buffers_;  // receive slots, then send slots
  std::vector<uint16_t> free_sends_;
  std::vector<uint32_t> send_peer_;  // per send slot: where it went
  std::deque<std::pair<uint32_t, std::array<uint8_t, kMadSize>>> backlog_;  // waiting for a send slot

  std::thread thread_;
  std::atomic<bool> stop_{false};

  std::mutex mu_;
  std::unordered_map<uint32_t, std::unique_ptr<Conn>> conns_;       // by local comm id
  std::map<std::pair<uint32_t, uint32_t>, uint32_t> by_remote_;      // (peer ip, remote comm id) -> local id
  std::map<std::pair<uint16_t, uint16_t>, ufab_cm_listener*> listeners_;  // by (port space, port)
  std::vector<std::unique_ptr<ufab_cm_id>> handles_;
  std::vector<std::unique_ptr<ufab_cm_listener>> listener_handles_;
  std::deque<ufab_cm_event> events_;
  std::condition_variable events_cv_;
  UniqueFd event_fd_;
  uint64_t tid_high_ = 0;
  uint32_t dropped_ = 0;  // MADs dropped (malformed, unmatched)
};

}  // namespace ufab::cm

// The C API's handles.
struct ufab_cm {
  std::unique_ptr<ufab::cm::Manager> manager;
};
struct ufab_cm_listener {
  ufab::cm::Manager* manager = nullptr;
  uint16_t port_space = 0;
  uint16_t port = 0;
};
struct ufab_cm_id {
  ufab::cm::Manager* manager = nullptr;
  uint32_t local_id = 0;
  ufab_qp* qp = nullptr;
  void* context = nullptr;
};
