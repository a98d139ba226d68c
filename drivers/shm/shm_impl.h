// The shm provider's objects (internal to drivers/shm/).
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "abi/rdma_provider.h"
#include "core/staging/pool.h"
#include "drivers/shm/ring.h"

namespace ufab::shm {

using Clock = std::chrono::steady_clock;

class Error {
 public:
  Error(int code, std::string msg) : code(code), msg(std::move(msg)) {}
  int code;
  std::string msg;
};

std::string hex(uint64_t v);
const char* op_name(uint32_t op);  // "RDMA_WRITE", ...

// A device we connected to (or that connected to us): its segment, mapped,
// and the socket whose end says it died.
struct Peer {
  uint32_t addr = 0;
  pid_t pid = 0;
  int sock = -1;
  Segment* seg = nullptr;
  size_t seg_size = 0;
  std::atomic<bool> dead{false};
  std::atomic<int> refs{1};
  // Whether this peer's device opens our GPU allocations through CUDA IPC
  // (gpu.cc, Qp::ipc_usable): -1 not looked at yet, 0 no, 1 yes.
  std::atomic<int> ipc_ok{-1};
};
void peer_ref(Peer* p);
void peer_unref(Peer* p);

struct Device;
struct Qp;

struct Pd {
  Device* dev;
  uint32_t id;
};

struct Mr {
  Pd* pd;
  uint32_t index;
  uint32_t key;
};

struct Cq {
  Device* dev = nullptr;
  std::mutex mu;
  std::vector<ufab_wc> ring;
  std::vector<std::string> details;  // beside ring: the words of error completions
  std::vector<std::string> polled;   // the details of the last poll, for wc_detail
  uint32_t head = 0, count = 0;
  bool overflow = false;
  std::atomic<uint32_t> avail{0};  // count, readable without the lock
  std::atomic<bool> armed{false};
  int event_fd = -1;

  // False when the CQ is full: the completion is lost and the caller's QP
  // goes to ERROR.
  bool push(const ufab_wc& wc, const char* detail);
};

struct RecvWqe {
  uint64_t wr_id;
  uint32_t num_sge;
  ufab_sge sge[UFAB_MAX_SGE];
};

// A registered region's GPU side, known only to its owner (by key index).
struct GpuKey {
  bool gpu = false;
  uint64_t buffer_id = 0;  // CUDA's id of the allocation (made up with gpu_copy=fake)
  bool ipc = false;        // its allocation is exported for CUDA IPC (Segment::ipc)
};

// A peer's GPU allocation opened here through CUDA IPC (gpu.cc, the
// responder). `mapped` and `error` belong to the copy thread, which opens
// the handle before the first copy that uses it (CopyEngine::Prepare) and
// closes it after the copies before the close (CopyEngine::after_copies).
struct IpcMap {
  const Peer* peer = nullptr;  // identity only (with pid)
  pid_t pid = 0;
  unsigned char handle[kIpcHandleBytes] = {};
  uint64_t base = 0, size = 0;  // the allocation in the peer's address space
  uint64_t last_use = 0;
  uint64_t mapped = 0;  // copy thread
  std::string error;    // copy thread: why the open failed
};

// Which path GPU work took (process-wide, for tests and debugging):
// shm_gpu_stats() in drivers/shm/shm.h reads them.
struct GpuPathCounters {
  std::atomic<uint64_t> ipc_wrs{0};        // requester: WRs with a piece through CUDA IPC
  std::atomic<uint64_t> staged_wrs{0};     // requester: GPU WRs with a piece through its slots
  std::atomic<uint64_t> ipc_copies{0};     // responder: device-to-device copies through CUDA IPC
  std::atomic<uint64_t> staged_pieces{0};  // responder: pieces moved through its slots
  std::atomic<uint64_t> ipc_opens{0};      // handles opened (copy thread)
  std::atomic<uint64_t> ipc_closes{0};
  std::atomic<uint64_t> ipc_open_failures{0};
  std::atomic<uint64_t> ipc_exports{0};          // GPU regions exported at registration
  std::atomic<uint64_t> ipc_export_refused{0};   // GPU regions cuIpcGetMemHandle refused (staged)
};
GpuPathCounters& gpu_counters();

// A requester's GPU work request in flight. Several may be in flight per
// QP (docs/gpu.md, "shm"): consecutive GPU work requests of one kind (all
// Frag messages or all one-sided; READs only behind READs), while nothing
// else is; any other work request behind them starts once everything
// before it completed. Pieces of at most gpu_frag
// bytes, each inside one SGE, staged gpu_depth ahead over all of the QP's
// GPU work requests together; completed in order.
struct TxFrag {
  uint64_t off = 0;    // in the message
  uint32_t len = 0;
  uint64_t laddr = 0;  // the bytes here: a host SGE's, or a slot
  uint64_t gaddr = 0;  // the local GPU address, when staged through a slot
  bool ipc = false;     // laddr is our GPU memory, which the responder copies through CUDA IPC
  uint32_t lkey = 0;    // ipc: its key
  std::optional<uint32_t> slot;
  int64_t ticket = -1;  // the copy engine's, while a copy runs
  bool staged = false;  // the bytes are at laddr (WRITE, SEND)
  bool sent = false;
  uint32_t seq = 0;
  uint64_t ring_end = 0;  // the peer's request ring index past this message
  uint32_t pulled = 0;    // READ: bytes read from the responder's slots
  bool acked = false;     // the responder is done with it
  bool released = false;  // out of the gpu_depth budget: read by the peer (QpCtl::pulled), or retired
  bool done = false;
};
struct GpuTx {
  uint64_t wr = 0;        // its index in the send queue
  bool messages = false;  // Frag messages (a GPU region at the peer, or a SEND); else one-sided copies
  bool ipc = false;       // GPU pieces go through CUDA IPC (Qp::ipc_usable), no slots
  bool used_ipc = false, used_slots = false;  // what its pieces took (gpu_counters)
  uint8_t type = 0;       // kMsgFragWrite, kMsgFragRead, kMsgFragSend
  uint64_t total = 0, next_off = 0;
  uint32_t sge = 0;
  uint64_t sge_off = 0;
  std::deque<TxFrag> frags;
  // WRITE_WITH_IMM: kMsgWriteImm, sent once every piece is sent (Frag
  // messages: the responder holds it until their copies landed) or done
  // (one-sided); the work request completes at its ACK.
  bool imm = false, imm_sent = false, imm_acked = false;
  uint32_t imm_seq = 0;
  // Failed, completed when it reaches the head of the send queue (the
  // work requests before it complete first, in order).
  uint32_t fail = 0;
  bool fail_nak = false;  // the responder's NAK (else found here: the responder's QP is told by `fatal`)
  std::string fail_why;
  bool staged_all() const { return next_off == total; }
  bool sent_all() const {
    if (!staged_all()) return false;
    if (messages) {
      for (const TxFrag& f : frags) {
        if (!f.sent) return false;
      }
    }
    return !imm || imm_sent;
  }
  bool finished() const { return staged_all() && frags.empty() && (!imm || imm_acked); }
};

// The responder's copies into and out of GPU memory, completed in order.
struct RxJob {
  uint32_t seq = 0;
  int64_t ticket = -1;
  std::optional<uint32_t> slot;
  KeyEntry* pin = nullptr;
  bool ready = false;  // kMsgFragRead: answer kMsgFragReady and hold the slot (ipc: no slot)
  bool ipc = false;
  uint32_t piece_off = 0, piece_len = 0;
  bool completion = false;  // a receive completion waiting for the bytes before it
  RecvWqe r{};
  uint32_t len = 0, imm = 0, flags = 0;
};
struct GpuRx {
  std::deque<RxJob> jobs;
  struct Held {
    uint32_t seq, slot;
  };
  std::deque<Held> held;  // kMsgFragRead slots until the requester read them
  bool partial = false;   // the message at the ring's head is started up to `done`
  uint32_t partial_seq = 0;
  uint64_t done = 0;
  bool recv_open = false;  // a SEND in fragments is filling `recv`
  RecvWqe recv{};
  uint64_t recv_total = 0;
  bool have_ack = false;  // the last ACK sent
  uint32_t last_ack = 0;
};

// Qp::post_send sets every field (it does not zero the SGE array): a new
// field must be set there too.
struct SendWqe {
  ufab_send_wr wr;
  ufab_sge sge[UFAB_MAX_SGE];
  uint64_t length = 0;
  uint32_t seq = 0;
  bool signaled = false;
  bool is_inline = false;
  bool checked = false;
  bool data_done = false;  // WRITE_WITH_IMM: the data landed
  bool sent = false;       // a message for it is in the peer's ring
  bool local_gpu = false;  // an SGE is GPU memory
};

// A peer's registered region mapped into this process (KeyEntry's file):
// one-sided operations on it are a memcpy. Cached per QP by key.
struct DirectMap {
  uint32_t key = 0;
  uint64_t addr = 0, len = 0;  // the region, as the peer registered it
  unsigned char* base = nullptr;  // where `addr` is here; nullptr: use CMA
  void* map = nullptr;
  size_t map_len = 0;
  bool writable = false;
};

struct QpStats {
  uint64_t tx = 0, rx = 0, naks_sent = 0, naks_received = 0, rnr_sent = 0, rnr_received = 0, dropped = 0,
           retransmits = 0, stalls = 0;
};

// A UD QP's way to a destination device: its segment, through a peer
// connection (a reference) or this device's own (peer nullptr).
struct UdDest {
  uint32_t addr = 0;
  Peer* peer = nullptr;
};

struct Qp {
  ~Qp();
  Device* dev = nullptr;
  uint32_t index = 0;
  std::mutex mu;
  std::atomic<bool> active{false};  // created and not destroyed (slot reuse)
  std::atomic<bool> timer{false};   // waits for an RNR timer or room in the peer's ring
  std::atomic<bool> gpu_wait{false};  // copies to or from GPU memory in flight (polled, never slept on)
  // Set by progress_locked when nothing is left for it but new input in
  // the QP's rings, a fatal word or a dead peer, which Device::progress
  // checks without the lock; cleared by every other call that locks it.
  std::atomic<bool> idle{false};

  // Everything below is guarded by mu.
  uint32_t type = UFAB_QPT_RC;  // UFAB_QPT_RC or UFAB_QPT_UD
  Pd* pd = nullptr;
  Cq* scq = nullptr;
  Cq* rcq = nullptr;
  uint32_t qpn = 0;
  bool sig_all = false;
  ufab_qp_cap cap{};
  ufab_qp_attr attr{};
  uint32_t initial_psn = 0;

  QpCtl* ctl = nullptr;  // ours, in our segment
  RingView in_req, in_resp;
  Peer* peer = nullptr;
  QpCtl* peer_ctl = nullptr;
  RingView out_req, out_resp;  // the peer QP's rings, in its segment
  // The peer's consumer indices of out_req/out_resp as last read: the
  // producer re-reads the shared `head` (a cache line the consumer writes)
  // only when the ring looks full, not once per message.
  mutable uint64_t out_req_head = 0, out_resp_head = 0;

  std::vector<SendWqe> sq;
  std::vector<unsigned char> inline_buf;
  uint64_t sq_head = 0, sq_next = 0, sq_tail = 0;
  std::vector<RecvWqe> rq;
  uint64_t rq_head = 0, rq_tail = 0;

  // Requester
  uint32_t next_seq = 0;
  uint32_t msgs_sent = 0;
  uint8_t rnr_left = 0;
  bool rnr_wait = false;
  Clock::time_point rnr_until{};
  // Responder
  uint32_t expected_seq = 0;
  uint32_t msgs_received = 0;
  bool ack_owed = false;
  uint32_t ack_seq = 0;

  // UD (qp.cc, "UD"): this QP's inbound datagram queue in our segment,
  // the destinations it sent to, and a cell found Claimed at the head
  // (since when).
  UdQueue* ud_in = nullptr;
  std::vector<UdDest> ud_dests;
  bool ud_stuck = false;
  uint64_t ud_stuck_pos = 0;
  Clock::time_point ud_stuck_since{};

  QpStats stats;

  // qp.cc
  int modify(const ufab_qp_attr& a, uint32_t mask);
  void query(ufab_qp_attr* out);
  int post_send(const ufab_send_wr* wrs, uint32_t n, uint32_t* bad);
  int post_recv(const ufab_recv_wr* wrs, uint32_t n, uint32_t* bad);
  int progress_locked();  // both sides, one round
  void destroy_locked();
  void peer_died_locked();
  void ud_release_dests(bool dead_only);  // UD: lets go of the destinations' devices (dead_only: those that died)
  void enter_error();
  void reset_locked();

 private:
  int requester_send();
  int requester_responses();
  // UD: sends every posted datagram (each completes once enqueued or
  // dropped), takes in the queue's datagrams.
  int ud_send();
  int ud_receive();
  int ud_progress_locked();
  void ud_enqueue(Segment* s, const SendWqe& w, const unsigned char* inline_data);
  void ud_deliver(const UdCellHdr& h, const unsigned char* data);
  Segment* ud_segment(uint32_t addr, std::string* why);  // nullptr: unreachable (why says so)
  void ud_reset_queue();
  int responder();
  void retire_done();
  void complete_send(SendWqe& w, uint32_t status, const std::string& detail);
  void complete_recv(const RecvWqe& r, uint32_t status, uint32_t opcode, uint32_t len, uint32_t imm, uint32_t flags,
                     const std::string& detail);
  void flush_all();
  void ack_through(uint32_t seq, bool inclusive);
  bool resp_space(uint32_t slots) const;
  bool send_resp(uint8_t type, uint32_t seq, uint64_t value);
  uint32_t check_local(const ufab_sge& s, bool need_write, std::string* why) const;
  uint32_t one_sided(SendWqe& w, std::string* why);
  uint32_t check_remote_key(uint32_t rkey, uint64_t addr, uint64_t len, uint32_t right, Segment* seg,
                            uint32_t target_pd, KeyEntry** pinned, std::string* why) const;
  bool send_message(SendWqe& w);
  // The peer's region of `rkey` (its entry pinned and checked) mapped here,
  // or nullptr; mapped on first use, unmapped when the key changes or the
  // peer goes.
  const DirectMap* direct(uint32_t rkey, const KeyEntry& e);
  void drop_direct();
  std::vector<DirectMap> direct_;
  void release_peer();
  void notify_peer();
  void fail_head(uint32_t status, const std::string& detail);

  // gpu.cc: GPU memory through the device's staging pool.
  enum { kGpuDone, kGpuPending, kGpuFailed };
  bool remote_gpu(const SendWqe& w) const;
  bool ipc_usable();  // the peer opens our GPU allocations through CUDA IPC
  uint32_t gpu_tx_start(SendWqe& w, std::string* why);
  int gpu_tx_step(GpuTx& t, SendWqe& w, bool may_stage, bool may_send, uint32_t* budget, uint32_t* status,
                  std::string* why);
  int gpu_tx_run();  // steps every GPU work request in flight; completes the finished ones in order
  bool gpu_tx_may_join(const SendWqe& w) const;
  void gpu_tx_ack(uint32_t seq);
  int gpu_tx_owns(uint32_t seq) const;  // the index in gtxq_ of the one that sent message `seq`, or -1
  uint32_t gpu_tx_ready(const MsgHdr& h, std::string* why);
  void gpu_tx_clear();               // all of them
  void gpu_tx_drop(GpuTx& t);        // one: its slots back (or quarantined)
  void gpu_tx_rewind(size_t k, bool keep);  // RNR: drop gtxq_[k..] (keep: gtxq_[k] keeps its data)
  uint32_t remote_copy(uint32_t rkey, uint64_t raddr, void* local, uint64_t len, bool read, std::string* why);
  enum { kRxNext, kRxStall, kRxRnr, kRxFatal, kRxDead };
  bool recv_is_gpu(const RecvWqe& r) const;
  int gpu_request(const MsgHdr& h, uint64_t at);
  int gpu_request_ipc(const MsgHdr& h, const FragBody& b, bool write, uint32_t right,
                      const std::function<int(uint32_t, const std::string&)>& nak);
  int gpu_pull(const MsgHdr& h, uint64_t at, uint64_t laddr, uint64_t pos, struct iovec* local, unsigned long nl);
  void gpu_rx_drain();
  void gpu_rx_clear(bool complete);  // complete: flush the waiting receives
  void responder_ack();
  bool gpu_idle() const { return gtxq_.empty() && grx_.jobs.empty() && grx_.held.empty(); }
  std::deque<GpuTx> gtxq_;
  int gtx_work_ = 0;  // what gpu_tx_step did, for progress's count
  GpuRx grx_;

  bool notify_ = false;
  bool stalled_ = false;
};

// A requester's slot a peer may still read (a Frag message sent, its QP
// gone to ERROR before the answer): back to the pool once the peer's ring
// consumer passed the message, or the peer died.
struct Quarantined {
  uint32_t slot;
  int64_t ticket;
  Peer* peer;  // a reference
  const RingIdx* idx;
  uint64_t ring_end;
};

struct Device {
  const ufab_rdma_host* host = nullptr;
  // GPU staging (gpu.cc): parameters from open, the pool made at the first
  // GPU registration. Declared before qps, so QPs go first.
  staging::Params gparams;
  std::mutex pool_mu;
  std::unique_ptr<staging::Pool> pool;
  std::atomic<staging::Pool*> pool_ptr{nullptr};
  GpuKey gpu_keys[kMaxMr];            // written under objects_mu before the key is published
  std::atomic<uint32_t> gpu_regions{0};
  std::mutex quarantine_mu;
  std::vector<Quarantined> quarantine;
  std::atomic<uint32_t> quarantined{0};
  void take_gpu_params(const ufab_device_opts* opts);
  staging::Pool* staging_for(int ordinal);  // throws Error
  // The GPU region of lkey/rkey index `index` still has its allocation at `addr`.
  bool gpu_buffer_ok(uint32_t index, uint64_t addr, std::string* why) const;
  void reap_quarantine(bool all);
  // CUDA IPC (gpu.cc): gpu_ipc=0|1 (default 1); the peers' allocations
  // opened here, at most kIpcMaps, least recently used closed first.
  bool ipc_param = true;
  static constexpr size_t kIpcMaps = 64;
  std::mutex ipc_mu;
  std::vector<std::shared_ptr<IpcMap>> ipc_maps;
  uint64_t ipc_clock = 0;
  // Closes (after their copies) the mappings of `p`, or all (nullptr).
  void ipc_forget(const Peer* p);

  std::string name, domain;
  uint32_t addr = 0;
  pid_t pid = 0;
  uid_t uid = 0;
  int memfd = -1;
  Segment* seg = nullptr;
  size_t seg_size = 0;
  int listen_fd = -1;
  int ctl_fd = -1;  // eventfd: wakes the control thread
  std::thread control;
  std::atomic<bool> stopping{false};

  std::mutex peers_mu;
  std::vector<Peer*> peers;
  std::atomic<uint32_t> dead_gen{0};
  std::atomic<uint32_t> dead_handled{0};

  std::mutex objects_mu;  // create/destroy only, never on the data path
  std::unique_ptr<Qp> qps[kMaxQp];
  std::atomic<uint32_t> qp_high{0};  // slots [0, qp_high) may be active
  uint16_t qp_gen[kMaxQp] = {};
  uint32_t key_gen[kMaxMr] = {};
  bool key_used[kMaxMr] = {};
  uint32_t next_pd = 1;
  QpStats retired;  // statistics of destroyed QPs

  std::thread progress_thread;
  std::atomic<bool> progress_stop{false};
  bool progress_running = false;

  // device.cc
  void open(const ufab_rdma_host* h, const char* name, const ufab_device_opts* opts);
  void close();
  int progress();
  // Sleeps until someone wakes this device or `until` passes (at most
  // `cap`); `ready` says whether there is already something to do.
  template <class Ready>
  void sleep(Clock::time_point until, Ready ready);
  void wake_self();
  static void wake(Segment* seg);
  Peer* connect_peer(uint32_t addr);  // a reference; throws Error
  void handle_dead_peers();
  bool pending_input() const;
  bool any_timer() const;
  bool any_gpu_wait() const;
  void control_loop();
  void accept_one();
  std::string socket_name(uint32_t a) const;
  void error(const std::string& msg) const {
    if (host && host->set_error) host->set_error(msg.c_str());
  }
  void log(int level, const std::string& msg) const {
    if (host && host->log) host->log(level, msg.c_str());
  }
};

int futex_wait(std::atomic<uint32_t>* word, uint32_t expected, int timeout_us);
// process_vm_readv/writev (CMA) with the peer `pid` until everything moved
// (the iovecs are advanced); 0 or an errno, and what that errno means here.
int cma(pid_t pid, bool write, struct iovec* local, unsigned long nl, struct iovec* remote, unsigned long nr);
std::string cma_words(int e, bool write, pid_t pid);
void futex_wake(std::atomic<uint32_t>* word);

template <class Ready>
void Device::sleep(Clock::time_point until, Ready ready) {
  auto now = Clock::now();
  if (now >= until) return;
  // Copies between GPU memory and the slots land within microseconds and
  // wake nobody: a thread waiting on them yields and polls again.
  if (any_gpu_wait()) {
    std::this_thread::yield();
    return;
  }
  auto left = std::chrono::duration_cast<std::chrono::microseconds>(until - now).count();
  // Timers (RNR waits, a full peer ring) are polled every 200 us; everything
  // else wakes us through the futex.
  int64_t cap = any_timer() ? 200 : 1000000;
  int us = static_cast<int>(left < cap ? left : cap);
  uint32_t key = seg->hdr.epoch.load(std::memory_order_acquire);
  seg->hdr.sleepers.fetch_add(1, std::memory_order_seq_cst);
  if (!ready() && !pending_input()) futex_wait(&seg->hdr.epoch, key, us);
  seg->hdr.sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

}  // namespace ufab::shm
