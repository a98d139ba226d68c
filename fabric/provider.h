// The libfabric provider "ufab" (libufab-fi.so): libfabric's objects over
// ufab's public C API (<ufab/rdma.h>, <ufab/cm.h>). docs/fabric.md says
// what it offers and how it is configured.
//
// The objects are C structs libfabric sees (fid_* first), each wrapped in
// one of the structs below. Locks: g_cm_mu (connection routing: which
// endpoint or passive endpoint a CM event belongs to), then an EQ's mutex;
// a domain's mutex guards its CQs' queues, counters and in-flight
// operations. No call blocks while holding a lock.
#pragma once

#include <netinet/in.h>
#include <rdma/fabric.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/providers/fi_prov.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ufab/cm.h"
#include "ufab/rdma.h"

namespace ufab_fi {

inline constexpr const char* kProviderName = "ufab";
inline constexpr const char* kFabricName = "ufab";
inline constexpr uint32_t kProviderVersion = FI_VERSION(1, 0);
inline constexpr uint32_t kApiVersion = FI_VERSION(1, 17);
// The Q_Key every DGRAM endpoint of this provider uses ("ufab").
inline constexpr uint32_t kUdQkey = 0x75666162u;
// UD receives start with the 40-byte GRH area (FI_MSG_PREFIX).
inline constexpr size_t kUdPrefix = 40;
// CM data a connect carries (a REQ's private data after rdma_cm's header).
inline constexpr size_t kConnectDataMax = UFAB_CM_REQ_PRIVATE_DATA;
inline constexpr size_t kAcceptDataMax = UFAB_CM_REP_PRIVATE_DATA;
inline constexpr size_t kRejectDataMax = UFAB_CM_REJ_PRIVATE_DATA;

// One configured ufab device (FI_UFAB_DEVICES), opened once per process.
struct Dev {
  std::string name;
  std::string ip_text;
  uint32_t ip = 0;  // host order
  ufab_device* dev = nullptr;
  ufab_device_attr attr{};
  ufab_pd* pd = nullptr;
  // Connection manager, opened on first use (passive endpoint, connect).
  ufab_cm* cm = nullptr;
  std::thread cm_thread;
  std::atomic<bool> stop{false};
  bool soft_roce() const;
  // FI_EP_MSG: soft-RoCE through ufab's CM, shm through shm_cm.cc.
  bool has_msg() const;
  bool has_ud() const { return (attr.caps & UFAB_DEVICE_CAP_UD) != 0; }
  bool has_atomics() const { return (attr.caps & UFAB_DEVICE_CAP_ATOMICS) != 0; }
  // FI_HMEM: the device moves CUDA memory (soft-RoCE's staging pipeline:
  // a build with CUDA's headers, or gpu_copy=fake). shm has no pipeline.
  bool has_hmem() const;
  // FI_RMA_PMEM / FI_COMMIT_COMPLETE: FLUSH PERSISTENT, so a WRITE can
  // complete once durable at a persistent-memory target.
  bool has_pmem() const;
};

// Devices from FI_UFAB_DEVICES, opened (or the reason they are not).
struct DeviceList {
  std::vector<Dev*> devs;
};
const DeviceList& devices();
Dev* device_by_name(const char* name);
Dev* device_by_ip(uint32_t ip);
int ensure_cm(Dev* d);  // 0 or -FI_errno
bool progress_thread_on();
void shutdown_devices();

struct Fabric;
struct Domain;
struct Cq;
struct Cntr;
struct Eq;
struct Ep;
struct Av;

struct Fabric {
  fid_fabric fab{};
};

// A ufab CQ an endpoint's QP completes into: a libfabric CQ's (owner set),
// or the endpoint's own when none was bound (completions then only count).
struct UCq {
  ufab_cq* ucq = nullptr;
  Cq* owner = nullptr;
  // dom->mu: signaled operations posted to QPs completing here and not yet
  // taken in. A CQ read that found work drives the other ufab CQs only
  // where this is not 0 (or every 64th read): quiet operations
  // complete into nothing.
  uint32_t inflight = 0;
};

struct Op {
  Ep* ep = nullptr;  // null once its endpoint closed (the completion is dropped)
  void* context = nullptr;
  uint64_t flags = 0;  // FI_SEND|FI_MSG, FI_RMA|FI_WRITE, ...
  bool want_cq = false;
  Cntr* cntr = nullptr;
  void* buf = nullptr;  // receive: the first buffer (source address for DGRAM)
  uint64_t len = 0;
  Op* prev = nullptr;  // its endpoint's OpList
  Op* next = nullptr;
  // One of the domain's quiet ops (Domain::quiet): the wr_id of every
  // operation posted unsignaled (no completion and no counter wanted).
  // Such an operation completes in ufab without a work completion, unless
  // it fails: then its error reaches the CQ with no context. Never freed.
  bool quiet = false;
};

// An endpoint's operations in flight: an intrusive list (no allocation
// per operation), used as the set it replaced (insert, erase, iterate).
class OpList {
 public:
  void insert(Op* o) {
    o->prev = nullptr;
    o->next = head_;
    if (head_ != nullptr) head_->prev = o;
    head_ = o;
  }
  void erase(Op* o) {
    if (o->prev != nullptr) o->prev->next = o->next; else if (head_ == o) head_ = o->next; else return;
    if (o->next != nullptr) o->next->prev = o->prev;
    o->prev = o->next = nullptr;
  }
  void clear() {
    for (Op* o = head_; o != nullptr;) {
      Op* n = o->next;
      o->prev = o->next = nullptr;
      o = n;
    }
    head_ = nullptr;
  }
  bool empty() const { return head_ == nullptr; }
  struct iterator {
    Op* o;
    Op* operator*() const { return o; }
    iterator& operator++() {
      o = o->next;
      return *this;
    }
    bool operator!=(const iterator& b) const { return o != b.o; }
  };
  iterator begin() const { return {head_}; }
  iterator end() const { return {nullptr}; }

 private:
  Op* head_ = nullptr;
};

// A registered range of CUDA memory (FI_HMEM_CUDA), so an inject from it
// (no descriptor) is refused: inline data is read by the CPU.
struct CudaRange {
  uintptr_t addr = 0;
  uint64_t len = 0;
};

struct Domain {
  fid_domain dom{};
  Fabric* fabric = nullptr;
  Dev* dev = nullptr;
  fi_info* info = nullptr;
  std::mutex mu;
  std::vector<Op*> free_ops;
  std::unordered_set<UCq*> ucqs;  // every ufab CQ of the domain (counters drive them)
  std::atomic<int> refs{0};
  std::mutex mr_mu;                   // cuda_ranges
  std::vector<CudaRange> cuda_ranges;  // live FI_HMEM_CUDA regions
  std::atomic<int> cuda_mrs{0};        // their count (0: no check at inject)
  // Whether [addr, addr + len) touches a CUDA region of this domain.
  bool touches_cuda(const void* addr, uint64_t len);
  Op* get_op();       // mu held
  void put_op(Op*);   // mu held
  // The wr_id of unsignaled operations, by kind: [0] FI_MSG|FI_SEND,
  // [1] FI_RMA|FI_WRITE, [2] FI_RMA|FI_READ, [3] FI_ATOMIC|FI_READ.
  Op quiet[4];
  // Polls every ufab CQ of the domain once (counters' progress), but
  // `except`.
  void progress_all(UCq* except = nullptr);
};

struct Mr {
  fid_mr mr{};
  Domain* dom = nullptr;
  ufab_mr* umr = nullptr;
  uint32_t lkey = 0;
  bool cuda = false;  // registered as FI_HMEM_CUDA (ufab's UFAB_MEM_CUDA)
  uintptr_t addr = 0;
  uint64_t len = 0;
};
// The lkey behind a descriptor from fi_mr_desc.
inline uint32_t desc_lkey(void* desc) { return static_cast<Mr*>(desc)->lkey; }

struct CqEntry {
  fi_cq_tagged_entry e{};
  fi_addr_t src = FI_ADDR_NOTAVAIL;
  bool is_err = false;
  int err = 0;
  int prov_errno = 0;
  std::string detail;
};

struct Cq {
  fid_cq cq{};
  Domain* dom = nullptr;
  UCq u;
  fi_cq_format format = FI_CQ_FORMAT_CONTEXT;
  fi_wait_obj wait_obj = FI_WAIT_NONE;
  std::deque<CqEntry> q;   // dom->mu
  std::atomic<size_t> qlen{0};  // q.size(), read without the lock (an empty CQ is polled without it)
  uint32_t reads = 0;           // reads that polled ufab (every 64th drives all of the domain's other CQs)
  std::string last_err;    // err_data handed out by readerr
  std::atomic<int> refs{0};
  std::atomic<bool> signaled{false};
};

struct Cntr {
  fid_cntr cntr{};
  Domain* dom = nullptr;
  std::atomic<uint64_t> value{0};
  std::atomic<uint64_t> errors{0};
  std::atomic<int> refs{0};
};

struct EqEntry {
  uint32_t event = 0;
  bool is_err = false;
  std::vector<uint8_t> bytes;  // fi_eq_cm_entry + data, or fi_eq_entry
  fi_eq_err_entry err{};
  std::vector<uint8_t> err_data;
};

struct Eq {
  fid_eq eq{};
  Fabric* fabric = nullptr;
  fi_wait_obj wait_obj = FI_WAIT_NONE;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<EqEntry> q;
  std::vector<uint8_t> last_err;
  int efd = -1;  // eventfd (semaphore): readable while entries wait
  std::atomic<int> refs{0};
  void push(EqEntry e);
};

struct AvEntry {
  uint32_t ip = 0;
  uint32_t qpn = 0;
  uint32_t qkey = 0;
  ufab_ah* ah = nullptr;
  bool valid = false;
};

struct Av {
  fid_av av{};
  Domain* dom = nullptr;
  std::mutex mu;
  std::vector<AvEntry> table;
  std::atomic<int> refs{0};
  fi_addr_t reverse(uint32_t ip, uint32_t qpn);
};

// A connection request handed to the application as fi_info.handle.
struct Pep;
struct ConnReq {
  fid fid_{};
  Dev* dev = nullptr;
  ufab_cm_id* id = nullptr;
  // shm devices (shm_cm.cc): the socket it came on, its listener, the
  // peer's QP, and whether FI_CONNREQ went out.
  void* shm_link = nullptr;
  Pep* shm_pep = nullptr;
  uint32_t shm_peer_ip = 0, shm_peer_qpn = 0, shm_peer_psn = 0;
  bool shm_announced = false;
};

struct Pep {
  fid_pep pep{};
  Fabric* fabric = nullptr;
  fi_info* info = nullptr;
  Dev* dev = nullptr;
  Eq* eq = nullptr;
  ufab_cm_listener* listener = nullptr;
  void* shm_link = nullptr;  // shm devices: the listening socket
  uint16_t port = 0;
};

enum class EpState { kIdle, kConnecting, kAccepting, kConnected, kShutdown };

struct Ep {
  fid_ep ep{};
  Domain* dom = nullptr;
  fi_info* info = nullptr;
  fi_ep_type type = FI_EP_MSG;
  ufab_qp* qp = nullptr;
  Cq* txcq = nullptr;
  Cq* rxcq = nullptr;
  bool tx_selective = false, rx_selective = false;
  Cntr* send_cntr = nullptr;
  Cntr* recv_cntr = nullptr;
  Cntr* read_cntr = nullptr;
  Cntr* write_cntr = nullptr;
  Eq* eq = nullptr;
  Av* av = nullptr;
  UCq own_tx, own_rx;  // when no CQ is bound for that direction
  UCq* tx_u = nullptr;
  UCq* rx_u = nullptr;
  uint64_t tx_op_flags = 0, rx_op_flags = 0;
  bool enabled = false;
  std::atomic<EpState> state{EpState::kIdle};
  ufab_cm_id* id = nullptr;
  ConnReq* connreq = nullptr;  // passive side until accepted
  void* shm_link = nullptr;    // shm devices: the connection's socket
  sockaddr_in local{}, peer{};
  OpList ops;  // dom->mu: in flight
  uint32_t quiet_posts = 0;  // signaled sends whose completion nobody wants (a counter only; every 32nd empties the send CQ)
  uint32_t max_inline = 0;
  uint32_t max_sge = 0;
  int hmem_p2p = FI_HMEM_P2P_ENABLED;  // FI_OPT_FI_HMEM_P2P (never P2P: staged copies)
};

// Translating work completions into libfabric completions (dom->mu held).
void handle_wc(Domain* dom, UCq* u, const ufab_wc& wc, const char* detail);
// Polls one ufab CQ into its libfabric queue; returns completions taken.
int poll_ucq(Domain* dom, UCq* u);
int poll_ucq_locked(Domain* dom, UCq* u);  // dom->mu held
constexpr int kPollBatch = 32;             // work completions per ufab_cq_poll

// The libfabric errno for a work completion status.
int wc_status_to_fi(uint32_t status);

// Object constructors (provider.cc, ep.cc, cq.cc, cm.cc).
int fabric_open(fi_fabric_attr* attr, fid_fabric** fabric, void* context);
int domain_open(fid_fabric* fabric, fi_info* info, fid_domain** dom, void* context);
int eq_open(fid_fabric* fabric, fi_eq_attr* attr, fid_eq** eq, void* context);
int pep_open(fid_fabric* fabric, fi_info* info, fid_pep** pep, void* context);
int cq_open(fid_domain* domain, fi_cq_attr* attr, fid_cq** cq, void* context);
int cntr_open(fid_domain* domain, fi_cntr_attr* attr, fid_cntr** cntr, void* context);
int av_open(fid_domain* domain, fi_av_attr* attr, fid_av** av, void* context);
int mr_reg(fid* fid, const void* buf, size_t len, uint64_t access, uint64_t offset, uint64_t requested_key,
           uint64_t flags, fid_mr** mr, void* context);
int mr_regv(fid* fid, const iovec* iov, size_t count, uint64_t access, uint64_t offset, uint64_t requested_key,
            uint64_t flags, fid_mr** mr, void* context);
int mr_regattr(fid* fid, const fi_mr_attr* attr, uint64_t flags, fid_mr** mr);
int ep_open(fid_domain* domain, fi_info* info, fid_ep** ep, void* context);

// The connection manager glue (cm.cc).
int cm_listen(Pep* pep);
void cm_forget_pep(Pep* pep);
int cm_connect(Ep* ep, const sockaddr_in& dest, const void* param, size_t len);
int cm_accept(Ep* ep, const void* param, size_t len);
int cm_reject(Pep* pep, ConnReq* req, const void* param, size_t len);
int cm_shutdown(Ep* ep);
void cm_forget_ep(Ep* ep);
void cm_register_ep(Ep* ep);

// shm devices' connection exchange (shm_cm.cc); called with the CM lock.
bool shm_device(const Dev* d);
int shm_listen(Pep* pep);
void shm_forget_pep(Pep* pep);
int shm_connect(Ep* ep, const sockaddr_in& dest, const void* param, size_t len);
int shm_accept(Ep* ep, const void* param, size_t len);
int shm_reject(ConnReq* req, const void* param, size_t len);
int shm_shutdown(Ep* ep);
void shm_forget_ep(Ep* ep);
void shm_shutdown_all();

int getinfo(uint32_t version, const char* node, const char* service, uint64_t flags, const fi_info* hints,
            fi_info** info);

// Helpers.
int neg(int err);  // -err for a positive errno, as libfabric wants them
std::string ip_text(uint32_t ip_host);
fi_info* make_info(Dev* d, fi_ep_type type, const fi_info* hints);
// The DGRAM address string of (ip, qpn): "fi_ufab_ud://A.B.C.D:QPN".
std::string ud_name(uint32_t ip, uint32_t qpn);
bool parse_ud_name(const char* s, size_t len, uint32_t* ip, uint32_t* qpn);

// Not-implemented entry points (return -FI_ENOSYS) shared by every object.
extern fi_ops_ep g_ep_ops_none;

}  // namespace ufab_fi
