// The software RoCEv2 transport of one device: its lanes (one per NIC
// queue pair, each with its own lock: lane.h), our address, ARP, the
// memory-key table and the CQs. Nothing here is a device-wide lock on the
// data path: posting takes the QP's lane, polling takes the CQ's lock and
// try-locks the lanes that feed it, waiting spins briefly and then sleeps
// on the fds of those lanes.
//
// Locking: control_mu_ serialises creating and destroying CQs and QPs;
// arp_mu_ guards ARP (taken under a lane's lock, never the other way).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "base/error.h"
#include "core/net/arp.h"
#include "core/rdma/memory.h"
#include "core/staging/pool.h"
#include "core/transport/completion_queue.h"
#include "core/transport/lane.h"
#include "core/transport/link.h"
#include "core/transport/verbs.h"

namespace ufab::transport {

class QueuePairImpl;

class Context {
 public:
  // One lane per link (the queues of one NIC: open_nic_links). `steered`:
  // the NIC puts each RoCE frame in the queue of its QP's lane.
  // `staging`: the GPU staging pipeline's parameters (core/staging/pool.h).
  static Result<std::unique_ptr<Context>> create(std::vector<std::unique_ptr<Link>> links, net::Ipv4Address ip,
                                                 bool steered, const staging::Params& staging = {});
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  verbs::MemoryRegionTable& memory() { return *memory_; }
  // GPU staging (docs/gpu.md): the pool, once the first GPU region made
  // it (one acquire load); staging_for creates it for GPU `ordinal` (slow
  // path: registration). One GPU per device: a region on another GPU is
  // refused.
  staging::Pool* staging() const { return pool_ptr_.load(std::memory_order_acquire); }
  Result<staging::Pool*> staging_for(int ordinal);
  const staging::Params& staging_params() const { return staging_params_; }
  // gpu_copy=fake: host memory registered as UFAB_MEM_CUDA counts as GPU
  // memory (a testing aid), moved by the fake copy engine.
  bool fake_gpu() const { return staging_params_.fake; }
  net::Ipv4Address ip() const { return ip_; }
  uint32_t active_mtu() const { return active_mtu_; }
  uint16_t lane_count() const { return static_cast<uint16_t>(lanes_.size()); }
  Lane& lane(uint16_t i) { return *lanes_[i]; }
  // The lane QP `qpn` lives on.
  Lane& lane_of(uint32_t qpn) { return *lanes_[qpn % lanes_.size()]; }
  // Every lane's counters added up (takes each lane's lock in turn).
  verbs::DeviceStats stats();

  Result<CompletionQueueImpl*> create_cq(uint32_t depth);
  Status destroy_cq(CompletionQueueImpl* cq);
  // The QP goes on the lane with the fewest QPs; its number says which.
  Result<QueuePairImpl*> create_qp(verbs::PdId pd, verbs::QpType type, CompletionQueueImpl* send_cq,
                                   CompletionQueueImpl* recv_cq, const verbs::QpCaps& caps, bool sq_sig_all);
  void destroy_qp(QueuePairImpl* qp);

  // One progress round on every lane (blocking on each lane's lock).
  int progress();
  // Progress on the lanes that feed `cq`, skipping a lane another thread
  // is progressing right now.
  // `waiter`: called by wait_for_completion (its rounds do not count as
  // another thread polling, see Lane::rounds).
  int progress_for(const CompletionQueueImpl& cq, bool waiter = false);

  // Blocks until `cq` is non-empty or `deadline`: progresses its lanes
  // for a short spin, then sleeps on their RX interrupts and inboxes and
  // on the CQ's eventfd, waking at least every millisecond for timers.
  void wait_for_completion(CompletionQueueImpl& cq, Clock::time_point deadline);

  // A progress thread per lane.
  Status start_progress_threads();
  // Joins them; polling drives progress again. Only from the thread that
  // started them, with no other thread using the context.
  void stop_progress_threads();
  bool has_progress_threads() const { return lanes_[0]->has_thread(); }

  // For lanes.
  // ARP: a frame received on `via` (requests answered through it).
  void on_arp_frame(Lane& via, std::span<const uint8_t> frame);
  Result<std::optional<net::MacAddress>> resolve(Lane& via, net::Ipv4Address ip);

 private:
  Context() = default;
  // The lanes to progress (or sleep on) for `cq`: those of its QPs, and
  // lane 0 when frames for them may land there.
  uint64_t feeding(const CompletionQueueImpl& cq) const;
  uint64_t rounds_of(uint64_t lanes) const;

  std::vector<std::unique_ptr<Lane>> lanes_;
  net::Ipv4Address ip_;
  uint32_t active_mtu_ = 1024;
  bool steered_ = true;
  std::unique_ptr<verbs::MemoryRegionTable> memory_;
  staging::Params staging_params_;
  std::mutex pool_mu_;
  std::unique_ptr<staging::Pool> pool_;  // outlives the lanes (destroyed after them)
  std::atomic<staging::Pool*> pool_ptr_{nullptr};

  std::mutex arp_mu_;
  std::optional<net::ArpResponder> arp_responder_;
  std::optional<net::ArpResolver> arp_resolver_;
  std::atomic<bool> arp_pending_{false};  // a resolution awaits a reply

  std::mutex control_mu_;
  std::vector<std::unique_ptr<CompletionQueueImpl>> cqs_;
  uint32_t next_qpn_ = 0;
};

}  // namespace ufab::transport
