// ufab's RDMA API: devices, protection domains, memory regions, completion
// queues, RC and UD queue pairs, over any ufab NIC, with RoCEv2 on the wire
// as Linux rdma_rxe puts it. No libibverbs, no kernel verbs.
//
// The shape is that of verbs (docs/rdma-api.md maps every call), with
// errors as values: each fallible call returns Result<T> whose Error says
// what failed, why and what to do.
//
//   (each Result checked; examples/rdma_example.cc shows how)
//   auto dev = rdma::Device::open("swnic:lab:0", {.ip = "10.0.0.1"});
//   auto pd  = (*dev)->alloc_pd();
//   auto mr  = pd->register_mr(buf, len, rdma::kLocalWrite | rdma::kRemoteWrite);
//   auto cq  = (*dev)->create_cq(256);
//   auto qp  = pd->create_qp({.type = rdma::QpType::kRc, .send_cq = cq->get(), .recv_cq = cq->get()});
//   (*qp)->connect(peer_connection_data);    // INIT -> RTR -> RTS in one call
//   (*qp)->post_send(wr);  (*cq)->poll(completions);
//
// Lifetimes: every object keeps its device's transport alive, so they may
// be destroyed in any order; the NIC closes with the last of them.
//
// Threads: every object may be used from any thread; calls on one Device
// serialize on that device's lock. Progress (receiving, acknowledging,
// retransmitting) happens inside poll/wait/post calls, or on a progress
// thread when DeviceOptions::progress_thread is set.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/error.h"
#include "core/rdma/memory.h"
#include "core/transport/verbs.h"

namespace ufab::transport {
class Context;
class CompletionQueueImpl;
class QueuePairImpl;
}  // namespace ufab::transport

namespace ufab::rdma {
using namespace ufab::verbs;  // transitional: the vocabulary moves into the public API

class ProtectionDomain;
class AddressHandle;
class MemoryRegion;
class CompletionQueue;
class QueuePair;

struct DeviceOptions {
  // This port's IPv4 address, dotted quad (required: a vfio-bound NIC has no
  // kernel netdev to take it from). GID index 0 is ::ffff:<ip>.
  std::string ip{};
  // Plugin parameters for the NIC (e.g. swnic's "loss", "seed").
  std::map<std::string, std::string> params{};
  // Run a thread that drives progress, so peers are answered while the
  // application does not call into ufab.
  bool progress_thread = false;
  // Frames per RX/TX ring and buffers in the frame pool.
  uint32_t ring_size = 512;
};

class Device {
 public:
  // `spec` is what `ufab` takes: a PCI address bound to vfio-pci
  // ("0000:00:02.0") or a software NIC ("swnic:lab:0").
  static Result<std::unique_ptr<Device>> open(const std::string& spec, const DeviceOptions& options);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  uint32_t ip() const;  // host order
  // The active path MTU rxe would use on this link (1024 on a 1500-byte link).
  uint32_t active_mtu() const;
  std::string name() const;
  DeviceStats stats() const;

  Result<ProtectionDomain> alloc_pd();
  // A completion queue of `depth` entries. Overflow is an error: poll
  // reports it and the QPs that lost completions go to ERROR.
  Result<std::unique_ptr<CompletionQueue>> create_cq(uint32_t depth);

  // Runs the transport once: receive, acknowledge, retransmit, send queued
  // work. Returns how many frames and timers it handled. poll/wait call it;
  // call it directly when waiting on something else.
  int progress();
  // A progress thread for a while, e.g. while the application blocks in an
  // out-of-band exchange and peers still need answers (ARP, ACKs, READ
  // responses). Sleeps on the NIC's receive interrupt when idle. A no-op
  // when DeviceOptions::progress_thread already runs one; stop only from
  // the thread that started it.
  Status start_progress_thread();
  void stop_progress_thread();

  transport::Context& context() { return *context_; }

 private:
  explicit Device(std::shared_ptr<transport::Context> context);
  std::shared_ptr<transport::Context> context_;
  bool temporary_thread_ = false;  // started by start_progress_thread()
};

class ProtectionDomain {
 public:
  ProtectionDomain(ProtectionDomain&& other) noexcept;
  ProtectionDomain& operator=(ProtectionDomain&& other) noexcept;
  ~ProtectionDomain();

  PdId id() const { return id_; }

  // Registers [addr, addr + length) with `access` (kLocalWrite,
  // kRemoteWrite, kRemoteRead, kRemoteAtomic); verbs' rules apply (remote
  // write or atomic need local write). The memory must stay valid until the
  // MemoryRegion is destroyed. Keys are not guessable in sequence.
  Result<MemoryRegion> register_mr(void* addr, uint64_t length, AccessFlags access);

  // An address handle for UD sends (verbs' ibv_create_ah): the peer's
  // address as GID ::ffff:ip plus TOS and TTL. Creating one starts ARP for
  // the peer, so the first datagram need not wait for it.
  Result<AddressHandle> create_ah(const AddressVector& av);

  struct QpInit {
    QpType type = QpType::kRc;
    CompletionQueue* send_cq = nullptr;
    CompletionQueue* recv_cq = nullptr;
    QpCaps caps{};
    // Every send produces a completion, whatever kSendSignaled says.
    bool sq_sig_all = false;
  };
  Result<std::unique_ptr<QueuePair>> create_qp(const QpInit& init);

 private:
  friend class Device;
  ProtectionDomain(std::shared_ptr<transport::Context> context, PdId id) : context_(std::move(context)), id_(id) {}
  void release();
  std::shared_ptr<transport::Context> context_;
  PdId id_;
};

class AddressHandle {
 public:
  const AddressVector& av() const { return av_; }
  // Where a UD send goes: this address, the peer's QP number and Q_Key
  // (SendWr::ud).
  UdDestination to(uint32_t qpn, uint32_t qkey) const {
    return UdDestination{.ip = av_.dest_ip, .qpn = qpn, .qkey = qkey, .traffic_class = av_.traffic_class,
                         .hop_limit = av_.hop_limit};
  }

 private:
  friend class ProtectionDomain;
  explicit AddressHandle(const AddressVector& av) : av_(av) {}
  AddressVector av_;
};

class MemoryRegion {
 public:
  MemoryRegion(MemoryRegion&& other) noexcept;
  MemoryRegion& operator=(MemoryRegion&& other) noexcept;
  // Deregisters; waits (bounded) for transfers touching it to finish.
  ~MemoryRegion();

  uint32_t lkey() const { return keys_.lkey; }
  uint32_t rkey() const { return keys_.rkey; }
  void* addr() const { return addr_; }
  uint64_t length() const { return length_; }
  // An SGE covering [offset, offset + length) of the region.
  Sge sge(uint64_t offset, uint32_t length) const;
  // Deregisters now and reports why when it cannot (EBUSY).
  Status deregister();

 private:
  friend class ProtectionDomain;
  MemoryRegion(std::shared_ptr<transport::Context> context, MemoryKeys keys, void* addr, uint64_t length)
      : context_(std::move(context)), keys_(keys), addr_(addr), length_(length) {}
  std::shared_ptr<transport::Context> context_;
  MemoryKeys keys_;
  void* addr_ = nullptr;
  uint64_t length_ = 0;
};

class CompletionQueue {
 public:
  ~CompletionQueue();

  // Up to out.size() completions, oldest first; 0 when none. Drives progress
  // first. An overflow since the last poll is an error (EOVERFLOW) naming
  // how many completions were lost; the completions that fitted are still
  // returned by the following polls.
  Result<size_t> poll(std::span<WorkCompletion> out);
  // Blocks until at least one completion is there or `timeout` passes
  // (sleeping on the NIC's receive interrupt when the device has no progress
  // thread, on the CQ's eventfd when it has one), then polls. 0 on timeout.
  Result<size_t> wait(std::span<WorkCompletion> out, std::chrono::milliseconds timeout);
  // For applications with their own event loop: after request_notify(),
  // event_fd() becomes readable when the next completion is added (read its
  // 8 bytes, request_notify() again, then poll). With no progress thread the
  // application must still call Device::progress() for completions to come.
  int event_fd() const;
  void request_notify();
  uint32_t depth() const;

 private:
  friend class Device;
  friend class ProtectionDomain;
  CompletionQueue(std::shared_ptr<transport::Context> context, transport::CompletionQueueImpl* impl)
      : context_(std::move(context)), impl_(impl) {}
  std::shared_ptr<transport::Context> context_;
  transport::CompletionQueueImpl* impl_;
};

class QueuePair {
 public:
  // Destroys the QP: outstanding work is dropped without completions.
  ~QueuePair();

  uint32_t qp_num() const;
  QpType type() const;
  QpState state() const;
  QpAttr attr() const;

  // verbs' ibv_modify_qp: sets the attributes named by `mask`, with the
  // transitions and required attributes of IBA 10.3.1 (RESET -> INIT ->
  // RTR -> RTS; any -> ERROR or RESET). A missing or invalid attribute is
  // EINVAL naming it.
  Status modify(const QpAttr& attr, QpAttrMask mask);
  // RESET -> INIT -> RTR -> RTS towards `peer` (RC) with `tuning`'s
  // timeouts, retries and MTU; or RESET -> INIT -> RTR -> RTS with
  // tuning.qkey (UD, `peer` unused but for its psn: our first sq_psn is
  // local().psn).
  Status connect(const ConnectionData& peer, const QpAttr& tuning = {});
  // What the peer needs to connect to this QP (ip, qpn, our first PSN).
  ConnectionData local() const;

  // Queues work. Errors found at post time (queue full, too many SGEs,
  // inline data too long, wrong state, an opcode the QP type lacks) fail
  // the call and queue nothing, as ibv_post_send does. Everything checked
  // while the request runs (keys, bounds, the peer's answer) comes back as
  // a completion.
  Status post_send(const SendWr& wr);
  // A list, as ibv_post_send's chain: posted in order, then one doorbell
  // for the frames they make. Stops at the first that fails; the error
  // names its index, and the ones before it stay posted.
  Status post_send(std::span<const SendWr> wrs);
  Status post_recv(const RecvWr& wr);

 private:
  friend class ProtectionDomain;
  QueuePair(std::shared_ptr<transport::Context> context, transport::QueuePairImpl* impl)
      : context_(std::move(context)), impl_(impl) {}
  std::shared_ptr<transport::Context> context_;
  transport::QueuePairImpl* impl_;
};

}  // namespace ufab::rdma
