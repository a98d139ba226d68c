// ufab's RDMA API for C++: a thin, header-only layer over the C API
// (<ufab/rdma.h>), with RAII objects and errors as values. Each fallible
// call returns Result<T> whose Error says what failed, why and what to do.
// docs/rdma-api.md is the guide; examples/rdma_example.cc a whole program.
//
//   (each Result checked; examples/rdma_example.cc shows how)
//   auto dev = rdma::Device::open("swnic:lab:0", {.ip = "10.0.0.1"});   // or "shm:lab"
//   auto pd  = (*dev)->alloc_pd();
//   auto mr  = pd->register_mr(buf, len, rdma::kLocalWrite | rdma::kRemoteWrite);
//   auto cq  = (*dev)->create_cq(256);
//   auto qp  = pd->create_qp({.type = rdma::QpType::kRc, .send_cq = cq->get(), .recv_cq = cq->get()});
//   (*qp)->connect(peer_connection_data);    // INIT -> RTR -> RTS in one call
//   (*qp)->post_send(wr);  (*cq)->poll(completions);
//
// Values are the C API's (verbs' numbers); the structs here are the C ones
// or convert to them inline. Lifetimes and threads: as the C API (objects
// may be destroyed in any order; any thread).
#pragma once

#include <algorithm>
#include <cstdio>
#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "ufab/rdma.h"

namespace ufab::rdma {

// ------------------------------------------------------------------ values

using AccessFlags = uint32_t;
inline constexpr AccessFlags kLocalWrite = UFAB_ACCESS_LOCAL_WRITE;
inline constexpr AccessFlags kRemoteWrite = UFAB_ACCESS_REMOTE_WRITE;
inline constexpr AccessFlags kRemoteRead = UFAB_ACCESS_REMOTE_READ;
inline constexpr AccessFlags kRemoteAtomic = UFAB_ACCESS_REMOTE_ATOMIC;
inline constexpr AccessFlags kRemoteAccess = kRemoteWrite | kRemoteRead | kRemoteAtomic;
// FLUSH targets: the QP may be asked, the region may be flushed (PERSISTENT
// only on durable memory; host memory with it is refused).
inline constexpr AccessFlags kFlushGlobal = UFAB_ACCESS_FLUSH_GLOBAL;
inline constexpr AccessFlags kFlushPersistent = UFAB_ACCESS_FLUSH_PERSISTENT;

enum class MemoryType : uint32_t { kHost = UFAB_MEM_HOST, kCuda = UFAB_MEM_CUDA, kPersistent = UFAB_MEM_PERSISTENT };

// `length` bytes at `addr` inside the region whose lkey is `lkey`.
using Sge = ::ufab_sge;
inline constexpr uint32_t kMaxSge = UFAB_MAX_SGE;

enum class WrOpcode : uint8_t {
  kRdmaWrite = UFAB_WR_RDMA_WRITE,
  kRdmaWriteWithImm = UFAB_WR_RDMA_WRITE_WITH_IMM,
  kSend = UFAB_WR_SEND,
  kSendWithImm = UFAB_WR_SEND_WITH_IMM,
  kRdmaRead = UFAB_WR_RDMA_READ,
  kAtomicCmpAndSwp = UFAB_WR_ATOMIC_CMP_AND_SWP,
  kAtomicFetchAndAdd = UFAB_WR_ATOMIC_FETCH_AND_ADD,
  kFlush = UFAB_WR_FLUSH,
  kAtomicWrite = UFAB_WR_ATOMIC_WRITE,
};

// FLUSH placement types (SendWr::flush_type, one or both) and selectivity
// (SendWr::flush_level).
inline constexpr uint8_t kFlushTypeGlobal = UFAB_FLUSH_GLOBAL;
inline constexpr uint8_t kFlushTypePersistent = UFAB_FLUSH_PERSISTENT;
inline constexpr uint8_t kFlushRange = UFAB_FLUSH_RANGE;
inline constexpr uint8_t kFlushWholeRegion = UFAB_FLUSH_MR;
inline const char* wr_opcode_name(WrOpcode op) { return ufab_wr_opcode_str(static_cast<uint32_t>(op)); }

using SendFlags = uint32_t;
inline constexpr SendFlags kSendFence = UFAB_SEND_FENCE;
inline constexpr SendFlags kSendSignaled = UFAB_SEND_SIGNALED;
inline constexpr SendFlags kSendSolicited = UFAB_SEND_SOLICITED;
inline constexpr SendFlags kSendInline = UFAB_SEND_INLINE;
inline constexpr SendFlags kSendCommit = UFAB_SEND_COMMIT;  // WRITE: complete once durable at the target

// Where a UD send goes.
struct UdDestination {
  uint32_t ip = 0;  // host order; GID ::ffff:ip
  uint32_t qpn = 0;
  uint32_t qkey = 0;
  uint8_t traffic_class = 0;
  uint8_t hop_limit = 64;
};

struct SendWr {
  uint64_t wr_id = 0;
  WrOpcode opcode = WrOpcode::kSend;
  SendFlags flags = 0;
  std::span<const Sge> sgl{};
  uint32_t imm_data = 0;  // a number; big-endian on the wire
  uint64_t remote_addr = 0;  // RDMA_WRITE*, RDMA_READ, atomics, FLUSH (range), ATOMIC_WRITE
  uint32_t rkey = 0;
  uint64_t compare_add = 0;  // CMP_AND_SWP: compare; FETCH_AND_ADD: add
  uint64_t swap = 0;
  uint64_t atomic_value = 0;  // ATOMIC_WRITE: the 8 bytes stored (host order); no SGEs
  uint8_t flush_type = 0;     // FLUSH: kFlushTypeGlobal and/or kFlushTypePersistent; no SGEs
  uint8_t flush_level = 0;    // FLUSH: kFlushRange or kFlushWholeRegion
  uint64_t flush_length = 0;  // FLUSH, kFlushRange: bytes from remote_addr
  UdDestination ud{};  // UD only
};

struct RecvWr {
  uint64_t wr_id = 0;
  std::span<const Sge> sgl{};
};

enum class WcStatus : uint8_t {
  kSuccess = UFAB_WC_SUCCESS,
  kLocLenErr = UFAB_WC_LOC_LEN_ERR,
  kLocQpOpErr = UFAB_WC_LOC_QP_OP_ERR,
  kLocProtErr = UFAB_WC_LOC_PROT_ERR,
  kWrFlushErr = UFAB_WC_WR_FLUSH_ERR,
  kBadRespErr = UFAB_WC_BAD_RESP_ERR,
  kLocAccessErr = UFAB_WC_LOC_ACCESS_ERR,
  kRemInvReqErr = UFAB_WC_REM_INV_REQ_ERR,
  kRemAccessErr = UFAB_WC_REM_ACCESS_ERR,
  kRemOpErr = UFAB_WC_REM_OP_ERR,
  kRetryExcErr = UFAB_WC_RETRY_EXC_ERR,
  kRnrRetryExcErr = UFAB_WC_RNR_RETRY_EXC_ERR,
  kGeneralErr = UFAB_WC_GENERAL_ERR,
};
inline const char* wc_status_name(WcStatus s) { return ufab_wc_status_str(static_cast<uint32_t>(s)); }

enum class WcOpcode : uint8_t {
  kSend = UFAB_WC_SEND,
  kRdmaWrite = UFAB_WC_RDMA_WRITE,
  kRdmaRead = UFAB_WC_RDMA_READ,
  kCompSwap = UFAB_WC_COMP_SWAP,
  kFetchAdd = UFAB_WC_FETCH_ADD,
  kFlush = UFAB_WC_FLUSH,
  kAtomicWrite = UFAB_WC_ATOMIC_WRITE,
  kRecv = UFAB_WC_RECV,
  kRecvRdmaWithImm = UFAB_WC_RECV_RDMA_WITH_IMM,
};
inline const char* wc_opcode_name(WcOpcode op) { return ufab_wc_opcode_str(static_cast<uint32_t>(op)); }

inline constexpr uint32_t kWcGrh = UFAB_WC_GRH;
inline constexpr uint32_t kWcWithImm = UFAB_WC_WITH_IMM;

struct WorkCompletion {
  uint64_t wr_id = 0;
  WcStatus status = WcStatus::kSuccess;
  WcOpcode opcode = WcOpcode::kSend;
  uint32_t byte_len = 0;
  uint32_t imm_data = 0;
  uint32_t qp_num = 0;
  uint32_t src_qp = 0;
  uint32_t wc_flags = 0;
  // What went wrong, for people (empty on success).
  std::string error{};
};

enum class QpType : uint8_t { kGsi = UFAB_QPT_GSI, kRc = UFAB_QPT_RC, kUd = UFAB_QPT_UD };

enum class QpState : uint8_t {
  kReset = UFAB_QPS_RESET,
  kInit = UFAB_QPS_INIT,
  kRtr = UFAB_QPS_RTR,
  kRts = UFAB_QPS_RTS,
  kError = UFAB_QPS_ERR,
};
inline const char* qp_state_name(QpState s) { return ufab_qp_state_str(static_cast<uint32_t>(s)); }

using QpAttrMask = uint32_t;
inline constexpr QpAttrMask kAttrState = UFAB_QP_STATE;
inline constexpr QpAttrMask kAttrAccessFlags = UFAB_QP_ACCESS_FLAGS;
inline constexpr QpAttrMask kAttrPkeyIndex = UFAB_QP_PKEY_INDEX;
inline constexpr QpAttrMask kAttrPort = UFAB_QP_PORT;
inline constexpr QpAttrMask kAttrQkey = UFAB_QP_QKEY;
inline constexpr QpAttrMask kAttrAv = UFAB_QP_AV;
inline constexpr QpAttrMask kAttrPathMtu = UFAB_QP_PATH_MTU;
inline constexpr QpAttrMask kAttrTimeout = UFAB_QP_TIMEOUT;
inline constexpr QpAttrMask kAttrRetryCnt = UFAB_QP_RETRY_CNT;
inline constexpr QpAttrMask kAttrRnrRetry = UFAB_QP_RNR_RETRY;
inline constexpr QpAttrMask kAttrRqPsn = UFAB_QP_RQ_PSN;
inline constexpr QpAttrMask kAttrMaxQpRdAtomic = UFAB_QP_MAX_QP_RD_ATOMIC;
inline constexpr QpAttrMask kAttrMinRnrTimer = UFAB_QP_MIN_RNR_TIMER;
inline constexpr QpAttrMask kAttrSqPsn = UFAB_QP_SQ_PSN;
inline constexpr QpAttrMask kAttrMaxDestRdAtomic = UFAB_QP_MAX_DEST_RD_ATOMIC;
inline constexpr QpAttrMask kAttrDestQpn = UFAB_QP_DEST_QPN;

struct AddressVector {
  uint32_t dest_ip = 0;  // host order (GID ::ffff:dest_ip)
  uint8_t traffic_class = 0;
  uint8_t hop_limit = 64;
  uint32_t flow_label = 0;  // 0: derived from the QP numbers, as rxe does
};

// verbs' defaults; see ufab_qp_attr in <ufab/rdma.h> for each field.
struct QpAttr {
  QpState state = QpState::kReset;
  AccessFlags access_flags = kRemoteWrite | kRemoteRead | kRemoteAtomic;
  uint16_t pkey_index = 0;
  uint8_t port = 1;
  uint32_t qkey = 0;
  AddressVector av{};
  uint32_t path_mtu = 1024;
  uint32_t dest_qpn = 0;
  uint32_t rq_psn = 0;
  uint8_t max_dest_rd_atomic = 16;
  uint8_t min_rnr_timer = 12;
  uint32_t sq_psn = 0;
  uint8_t timeout = 14;
  uint8_t retry_cnt = 7;
  uint8_t rnr_retry = 7;
  uint8_t max_rd_atomic = 16;
};

struct QpCaps {
  uint32_t max_send_wr = 256;
  uint32_t max_recv_wr = 256;
  uint32_t max_send_sge = 4;
  uint32_t max_recv_sge = 4;
  uint32_t max_inline_data = 256;
};

// A QP's identity as a peer needs it to connect, plus a buffer to target.
struct ConnectionData {
  uint32_t ip = 0;  // GID ::ffff:ip
  uint32_t qpn = 0;
  uint32_t psn = 0;
  uint32_t rkey = 0;
  uint64_t addr = 0;
  uint32_t length = 0;
};

using DeviceStats = ::ufab_device_stats;
// "tx 2002 rx 2002 frames (RoCE 2000, ARP 2), parse errors 0, ...".
inline std::string to_string(const DeviceStats& st) {
  auto n = [](uint64_t v) { return std::to_string(v); };
  return "tx " + n(st.tx_frames) + " rx " + n(st.rx_frames) + " frames (RoCE " + n(st.rx_roce) + ", ARP " +
         n(st.rx_arp) + "), parse errors " + n(st.rx_parse_errors) + ", dropped " + n(st.rx_dropped) +
         ", retransmits " + n(st.retransmits) + ", timeouts " + n(st.timeouts) + ", duplicates " +
         n(st.duplicates) + ", NAKs sent " + n(st.naks_sent) + " received " + n(st.naks_received) +
         ", RNR NAKs sent " + n(st.rnr_naks_sent) + " received " + n(st.rnr_naks_received) + ", sent/needed " +
         [&] {
           char b[32];
           std::snprintf(b, sizeof b, "%.2f", ufab_sent_per_needed(&st));
           return std::string(b);
         }();
}

struct DeviceOptions {
  // This port's IPv4 address, dotted quad (required on Ethernet NICs).
  std::string ip{};
  // Provider and plugin parameters (swnic's "loss", "seed").
  std::map<std::string, std::string> params{};
  bool progress_thread = false;
  uint32_t ring_size = 512;
};

// ------------------------------------------------------------ conversions

namespace detail {

// The error of the last failed C call on this thread.
inline std::unexpected<Error> last_error(int rc) {
  return std::unexpected(Error(-rc, ufab_last_error()));
}
inline Status status(int rc) {
  if (rc < 0) return last_error(rc);
  return {};
}

inline ufab_av to_c(const AddressVector& a) {
  return {.dest_ip = a.dest_ip, .traffic_class = a.traffic_class, .hop_limit = a.hop_limit, .reserved = 0,
          .flow_label = a.flow_label};
}
inline AddressVector from_c(const ufab_av& a) {
  return {.dest_ip = a.dest_ip, .traffic_class = a.traffic_class, .hop_limit = a.hop_limit, .flow_label = a.flow_label};
}

inline ufab_qp_attr to_c(const QpAttr& v) {
  ufab_qp_attr a{};
  a.state = static_cast<uint32_t>(v.state);
  a.access_flags = v.access_flags;
  a.pkey_index = v.pkey_index;
  a.port = v.port;
  a.qkey = v.qkey;
  a.av = to_c(v.av);
  a.path_mtu = v.path_mtu;
  a.dest_qpn = v.dest_qpn;
  a.rq_psn = v.rq_psn;
  a.sq_psn = v.sq_psn;
  a.max_dest_rd_atomic = v.max_dest_rd_atomic;
  a.min_rnr_timer = v.min_rnr_timer;
  a.timeout = v.timeout;
  a.retry_cnt = v.retry_cnt;
  a.rnr_retry = v.rnr_retry;
  a.max_rd_atomic = v.max_rd_atomic;
  return a;
}

inline QpAttr from_c(const ufab_qp_attr& a) {
  QpAttr v;
  v.state = static_cast<QpState>(a.state);
  v.access_flags = a.access_flags;
  v.pkey_index = a.pkey_index;
  v.port = a.port;
  v.qkey = a.qkey;
  v.av = from_c(a.av);
  v.path_mtu = a.path_mtu;
  v.dest_qpn = a.dest_qpn;
  v.rq_psn = a.rq_psn;
  v.sq_psn = a.sq_psn;
  v.max_dest_rd_atomic = a.max_dest_rd_atomic;
  v.min_rnr_timer = a.min_rnr_timer;
  v.timeout = a.timeout;
  v.retry_cnt = a.retry_cnt;
  v.rnr_retry = a.rnr_retry;
  v.max_rd_atomic = a.max_rd_atomic;
  return v;
}

inline ufab_send_wr to_c(const SendWr& w) {
  // compare_add, atomic_value and flush_length share 8 bytes: the one the
  // opcode reads goes in.
  const uint64_t operand = w.opcode == WrOpcode::kAtomicWrite ? w.atomic_value
                           : w.opcode == WrOpcode::kFlush     ? w.flush_length
                                                              : w.compare_add;
  return ufab_send_wr{
      .wr_id = w.wr_id,
      .sg_list = w.sgl.data(),
      .num_sge = static_cast<uint32_t>(w.sgl.size()),
      .opcode = static_cast<uint32_t>(w.opcode),
      .send_flags = w.flags,
      .imm_data = w.imm_data,
      .remote_addr = w.remote_addr,
      .rkey = w.rkey,
      .flush_type = w.flush_type,
      .flush_level = w.flush_level,
      .reserved = 0,
      .compare_add = operand,
      .swap = w.swap,
      .ud = {.ip = w.ud.ip, .qpn = w.ud.qpn, .qkey = w.ud.qkey, .traffic_class = w.ud.traffic_class,
             .hop_limit = w.ud.hop_limit, .reserved = 0},
  };
}

inline ConnectionData from_c(const ufab_conn& c) {
  return {.ip = c.ip, .qpn = c.qpn, .psn = c.psn, .rkey = c.rkey, .addr = c.addr, .length = c.length};
}
inline ufab_conn to_c(const ConnectionData& c) {
  return {.ip = c.ip, .qpn = c.qpn, .psn = c.psn, .rkey = c.rkey, .addr = c.addr, .length = c.length, .reserved = 0};
}

// Owns a reference to a C handle.
template <typename T, int (*Destroy)(T*)>
struct Handle {
  void operator()(T* p) const { (void)Destroy(p); }
};
inline int close_device(ufab_device* d) {
  ufab_device_close(d);
  return 0;
}

}  // namespace detail

// ----------------------------------------------------------------- objects

class ProtectionDomain;
class CompletionQueue;
class QueuePair;
class MemoryRegion;
class AddressHandle;

class Device {
 public:
  // `spec`: a PCI address bound to vfio-pci ("0000:00:02.0"), a software
  // NIC port ("swnic:lab:0") or a shared-memory domain ("shm:lab").
  static Result<std::unique_ptr<Device>> open(const std::string& spec, const DeviceOptions& options) {
    std::vector<std::string> kv;
    for (const auto& [k, v] : options.params) kv.push_back(k + "=" + v);
    std::vector<const char*> params;
    for (const auto& s : kv) params.push_back(s.c_str());
    params.push_back(nullptr);
    ufab_device_opts o{.size = sizeof(ufab_device_opts),
                       .ip = options.ip.c_str(),
                       .params = params.data(),
                       .progress_thread = options.progress_thread ? 1u : 0u,
                       .ring_size = options.ring_size};
    ufab_device* dev = nullptr;
    if (int rc = ufab_device_open(spec.c_str(), &o, &dev); rc < 0) return detail::last_error(rc);
    return std::unique_ptr<Device>(new Device(dev));
  }

  uint32_t ip() const { return attr_.ip; }  // host order
  // The path MTU QPs get (rxe's 1024 on a 1500-byte link).
  uint32_t active_mtu() const { return attr_.active_mtu; }
  // The name it was opened with ("0000:00:02.0", "swnic:lab:0", "shm:lab").
  std::string name() const { return attr_.name; }
  // "soft-roce", "shm", ...
  std::string provider() const { return attr_.provider; }
  // What carries it: "RoCEv2 over swnic:lab:0", "shared memory".
  std::string transport() const { return attr_.transport; }
  const ufab_device_attr& attr() const { return attr_; }
  DeviceStats stats() const {
    DeviceStats s{};
    (void)ufab_device_query_stats(dev_.get(), &s);
    return s;
  }

  Result<ProtectionDomain> alloc_pd();
  Result<std::unique_ptr<CompletionQueue>> create_cq(uint32_t depth);

  // Runs the provider once (receive, acknowledge, retransmit); returns the
  // work done. poll/wait call it; call it when waiting on something else.
  int progress() { return ufab_device_progress(dev_.get()); }
  // A progress thread for a while (e.g. during an out-of-band exchange); a
  // no-op when the device already has one.
  Status start_progress_thread() { return detail::status(ufab_device_start_progress_thread(dev_.get())); }
  void stop_progress_thread() { ufab_device_stop_progress_thread(dev_.get()); }

  ufab_device* c() const { return dev_.get(); }

 private:
  explicit Device(ufab_device* dev) : dev_(dev) { (void)ufab_device_query(dev, &attr_); }
  std::unique_ptr<ufab_device, detail::Handle<ufab_device, detail::close_device>> dev_;
  ufab_device_attr attr_{};
};

class AddressHandle {
 public:
  const AddressVector& av() const { return av_; }
  // Where a UD send goes: this address, the peer's QP number and Q_Key.
  UdDestination to(uint32_t qpn, uint32_t qkey) const {
    return UdDestination{.ip = av_.dest_ip, .qpn = qpn, .qkey = qkey, .traffic_class = av_.traffic_class,
                         .hop_limit = av_.hop_limit};
  }

 private:
  friend class ProtectionDomain;
  AddressHandle(ufab_ah* ah, const AddressVector& av) : ah_(ah, [](ufab_ah* p) { (void)ufab_ah_destroy(p); }), av_(av) {}
  std::shared_ptr<ufab_ah> ah_;
  AddressVector av_;
};

class MemoryRegion {
 public:
  MemoryRegion(MemoryRegion&& o) noexcept : mr_(std::exchange(o.mr_, nullptr)), addr_(o.addr_), length_(o.length_) {}
  MemoryRegion& operator=(MemoryRegion&& other) noexcept {
    if (this != &other) {
      (void)deregister();
      mr_ = std::exchange(other.mr_, nullptr);
      addr_ = other.addr_;
      length_ = other.length_;
    }
    return *this;
  }
  // Deregisters; waits (bounded) for transfers touching it.
  ~MemoryRegion() { (void)deregister(); }

  uint32_t lkey() const { return ufab_mr_lkey(mr_); }
  uint32_t rkey() const { return ufab_mr_rkey(mr_); }
  void* addr() const { return addr_; }
  uint64_t length() const { return length_; }
  // An SGE covering [offset, offset + length) of the region.
  Sge sge(uint64_t offset, uint32_t length) const {
    return Sge{reinterpret_cast<uint64_t>(addr_) + offset, length, lkey()};
  }
  // Deregisters now and says why when it cannot (EBUSY).
  Status deregister() {
    if (mr_ == nullptr) return {};
    if (int rc = ufab_mr_dereg(mr_); rc < 0) return detail::last_error(rc);
    mr_ = nullptr;
    return {};
  }

 private:
  friend class ProtectionDomain;
  MemoryRegion(ufab_mr* mr, void* addr, uint64_t length) : mr_(mr), addr_(addr), length_(length) {}
  ufab_mr* mr_ = nullptr;
  void* addr_ = nullptr;
  uint64_t length_ = 0;
};

class CompletionQueue {
 public:
  // Up to out.size() completions, oldest first; 0 when none. Drives
  // progress first. An overflow since the last poll is EOVERFLOW naming
  // how many completions were lost.
  Result<size_t> poll(std::span<WorkCompletion> out) { return convert(ufab_cq_poll(cq_.get(), raw(out), limit(out)), out); }
  // Blocks until a completion is there or `timeout` passes, then polls.
  Result<size_t> wait(std::span<WorkCompletion> out, std::chrono::milliseconds timeout) {
    int ms = static_cast<int>(std::min<int64_t>(timeout.count(), INT32_MAX));
    return convert(ufab_cq_wait(cq_.get(), raw(out), limit(out), ms), out);
  }
  // After request_notify(), event_fd() becomes readable at the next
  // completion (read its 8 bytes, request_notify() again, then poll).
  int event_fd() const { return ufab_cq_event_fd(cq_.get()); }
  void request_notify() { (void)ufab_cq_req_notify(cq_.get()); }
  uint32_t depth() const { return ufab_cq_depth(cq_.get()); }

  ufab_cq* get_c() const { return cq_.get(); }

 private:
  friend class Device;
  explicit CompletionQueue(ufab_cq* cq) : cq_(cq) {}
  static constexpr uint32_t kBatch = 64;
  ufab_wc* raw(std::span<WorkCompletion>) { return raw_.data(); }
  static uint32_t limit(std::span<WorkCompletion> out) { return static_cast<uint32_t>(std::min<size_t>(out.size(), kBatch)); }
  Result<size_t> convert(int rc, std::span<WorkCompletion> out) {
    if (rc < 0) return detail::last_error(rc);
    for (int i = 0; i < rc; ++i) {
      const ufab_wc& w = raw_[i];
      WorkCompletion& c = out[i];
      c.wr_id = w.wr_id;
      c.status = static_cast<WcStatus>(w.status);
      c.opcode = static_cast<WcOpcode>(w.opcode);
      c.byte_len = w.byte_len;
      c.imm_data = w.imm_data;
      c.qp_num = w.qp_num;
      c.src_qp = w.src_qp;
      c.wc_flags = w.wc_flags;
      if (w.status == UFAB_WC_SUCCESS) {
        c.error.clear();
      } else {
        c.error = ufab_cq_wc_detail(cq_.get(), &w);
      }
    }
    return static_cast<size_t>(rc);
  }
  std::unique_ptr<ufab_cq, detail::Handle<ufab_cq, ufab_cq_destroy>> cq_;
  std::array<ufab_wc, kBatch> raw_{};
};

class QueuePair {
 public:
  uint32_t qp_num() const { return ufab_qp_num(qp_.get()); }
  QpType type() const { return type_; }
  QpState state() const { return attr().state; }
  QpAttr attr() const {
    ufab_qp_attr a{};
    (void)ufab_qp_query(qp_.get(), &a);
    return detail::from_c(a);
  }

  // verbs' ibv_modify_qp (IBA 10.3.1 transitions; a missing or invalid
  // attribute is EINVAL naming it, and nothing changes).
  Status modify(const QpAttr& attr, QpAttrMask mask) {
    ufab_qp_attr a = detail::to_c(attr);
    return detail::status(ufab_qp_modify(qp_.get(), &a, mask));
  }
  // RESET -> INIT -> RTR -> RTS towards `peer` (RC), with `tuning`'s
  // timeouts, retries and MTU; to RTS with tuning.qkey (UD).
  Status connect(const ConnectionData& peer, const QpAttr& tuning = {}) {
    ufab_conn p = detail::to_c(peer);
    ufab_qp_attr t = detail::to_c(tuning);
    return detail::status(ufab_qp_connect(qp_.get(), &p, &t));
  }
  // What the peer needs to connect to this QP (ip, qpn, our first PSN).
  ConnectionData local() const {
    ufab_conn c{};
    (void)ufab_qp_local(qp_.get(), &c);
    return detail::from_c(c);
  }

  // Queues work; post-time errors (queue full, too many SGEs, inline too
  // long, wrong state, an opcode the QP lacks) fail the call and queue
  // nothing. Everything checked later comes back as a completion.
  Status post_send(const SendWr& wr) {
    ufab_send_wr w = detail::to_c(wr);
    return detail::status(ufab_post_send(qp_.get(), &w, 1, nullptr));
  }
  // A list: posted in order with one doorbell; stops at the first that
  // fails, whose index the error names (the ones before it stay posted).
  Status post_send(std::span<const SendWr> wrs) {
    constexpr size_t kChunk = 64;
    std::array<ufab_send_wr, kChunk> c;
    for (size_t at = 0; at < wrs.size(); at += kChunk) {
      size_t n = std::min(kChunk, wrs.size() - at);
      for (size_t i = 0; i < n; ++i) c[i] = detail::to_c(wrs[at + i]);
      uint32_t bad = 0;
      if (int rc = ufab_post_send(qp_.get(), c.data(), static_cast<uint32_t>(n), &bad); rc < 0) {
        if (at == 0) return detail::last_error(rc);
        return std::unexpected(Error(-rc, "work request " + std::to_string(at + bad) + " of " +
                                              std::to_string(wrs.size()) + ": " + ufab_last_error()));
      }
    }
    return {};
  }
  Status post_recv(const RecvWr& wr) {
    ufab_recv_wr w{.wr_id = wr.wr_id, .sg_list = wr.sgl.data(), .num_sge = static_cast<uint32_t>(wr.sgl.size()),
                   .reserved = 0};
    return detail::status(ufab_post_recv(qp_.get(), &w, 1, nullptr));
  }

  ufab_qp* c() const { return qp_.get(); }

 private:
  friend class ProtectionDomain;
  QueuePair(ufab_qp* qp, QpType type) : qp_(qp), type_(type) {}
  std::unique_ptr<ufab_qp, detail::Handle<ufab_qp, ufab_qp_destroy>> qp_;
  QpType type_;
};

class ProtectionDomain {
 public:
  // Registers [addr, addr + length) with `access`; verbs' rules apply. The
  // memory must stay valid until the MemoryRegion is destroyed.
  Result<MemoryRegion> register_mr(void* addr, uint64_t length, AccessFlags access,
                                   MemoryType type = MemoryType::kHost) {
    ufab_mr_attr a{.size = sizeof(ufab_mr_attr), .access = access, .addr = addr, .length = length,
                   .mem_type = static_cast<uint32_t>(type), .reserved = 0};
    ufab_mr* mr = nullptr;
    if (int rc = ufab_mr_reg_attr(pd_.get(), &a, &mr); rc < 0) return detail::last_error(rc);
    return MemoryRegion(mr, addr, length);
  }

  // An address handle for UD sends; creating one starts ARP for the peer.
  Result<AddressHandle> create_ah(const AddressVector& av) {
    ufab_av a = detail::to_c(av);
    ufab_ah* ah = nullptr;
    if (int rc = ufab_ah_create(pd_.get(), &a, &ah); rc < 0) return detail::last_error(rc);
    return AddressHandle(ah, av);
  }

  struct QpInit {
    QpType type = QpType::kRc;
    CompletionQueue* send_cq = nullptr;
    CompletionQueue* recv_cq = nullptr;
    QpCaps caps{};
    // Every send produces a completion, whatever kSendSignaled says.
    bool sq_sig_all = false;
  };
  Result<std::unique_ptr<QueuePair>> create_qp(const QpInit& init) {
    ufab_qp_init_attr a{.qp_type = static_cast<uint32_t>(init.type),
                        .sq_sig_all = init.sq_sig_all ? 1u : 0u,
                        .send_cq = init.send_cq != nullptr ? init.send_cq->get_c() : nullptr,
                        .recv_cq = init.recv_cq != nullptr ? init.recv_cq->get_c() : nullptr,
                        .cap = {.max_send_wr = init.caps.max_send_wr,
                                .max_recv_wr = init.caps.max_recv_wr,
                                .max_send_sge = init.caps.max_send_sge,
                                .max_recv_sge = init.caps.max_recv_sge,
                                .max_inline_data = init.caps.max_inline_data}};
    ufab_qp* qp = nullptr;
    if (int rc = ufab_qp_create(pd_.get(), &a, &qp); rc < 0) return detail::last_error(rc);
    return std::unique_ptr<QueuePair>(new QueuePair(qp, init.type));
  }

  ufab_pd* c() const { return pd_.get(); }

 private:
  friend class Device;
  explicit ProtectionDomain(ufab_pd* pd) : pd_(pd) {}
  std::unique_ptr<ufab_pd, detail::Handle<ufab_pd, ufab_pd_free>> pd_;
};

inline Result<ProtectionDomain> Device::alloc_pd() {
  ufab_pd* pd = nullptr;
  if (int rc = ufab_pd_alloc(dev_.get(), &pd); rc < 0) return detail::last_error(rc);
  return ProtectionDomain(pd);
}

inline Result<std::unique_ptr<CompletionQueue>> Device::create_cq(uint32_t depth) {
  ufab_cq* cq = nullptr;
  if (int rc = ufab_cq_create(dev_.get(), depth, &cq); rc < 0) return detail::last_error(rc);
  return std::unique_ptr<CompletionQueue>(new CompletionQueue(cq));
}

}  // namespace ufab::rdma
