// The software RoCEv2 transport of one device: the link, our address, ARP,
// the memory-key table, and every CQ and QP, behind one lock. progress()
// receives and dispatches frames, runs the QPs' timers and transmits their
// queued work; an optional thread calls it when the application does not.
//
// Locking: mutex() guards everything here and in every CQ and QP of the
// context. The public API (api/rdma.cc) takes it on each call; methods
// named *_locked expect it held.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/error.h"
#include "core/net/arp.h"
#include "core/rdma/memory.h"
#include "core/roce/builder.h"
#include "core/roce/parser.h"
#include "core/transport/completion_queue.h"
#include "core/transport/link.h"
#include "core/transport/verbs.h"

namespace ufab::transport {

class QueuePairImpl;
using Clock = std::chrono::steady_clock;

class Context {
 public:
  static Result<std::unique_ptr<Context>> create(std::unique_ptr<Link> link, net::Ipv4Address ip);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  std::mutex& mutex() { return mu_; }
  verbs::MemoryRegionTable& memory() { return *memory_; }
  Link& link() { return *link_; }
  net::Ipv4Address ip() const { return ip_; }
  uint32_t active_mtu() const { return active_mtu_; }
  verbs::DeviceStats& stats() { return stats_; }

  Result<CompletionQueueImpl*> create_cq_locked(uint32_t depth);
  Status destroy_cq_locked(CompletionQueueImpl* cq);
  Result<QueuePairImpl*> create_qp_locked(verbs::PdId pd, verbs::QpType type, CompletionQueueImpl* send_cq,
                                          CompletionQueueImpl* recv_cq, const verbs::QpCaps& caps, bool sq_sig_all);
  void destroy_qp_locked(QueuePairImpl* qp);

  // Sends what `qp` has queued that the window allows, then rings the
  // NIC's doorbell once: the end of a post.
  void transmit_locked(QueuePairImpl& qp);

  // One round of receive, timers and transmit; returns frames and timers
  // handled.
  int progress_locked();

  // Blocks until `cq` is non-empty or `deadline` (see CompletionQueue::wait).
  void wait_for_completion(CompletionQueueImpl& cq, Clock::time_point deadline);

  Status start_progress_thread();
  // Joins the thread; polling drives progress again. Only from the thread
  // that started it, with no other thread using the context.
  void stop_progress_thread();
  bool has_progress_thread() const { return thread_.joinable(); }

  // For QPs (under the lock):
  // The MAC of `ip`: a value, nullopt while ARP is pending (a request has
  // been sent when one was due), or an error when ARP gave up.
  Result<std::optional<net::MacAddress>> resolve_locked(net::Ipv4Address ip);
  // Builds a frame into the next TX buffer and queues it; false (nothing
  // sent, tx_stalls counted) when the NIC has no free buffer.
  bool send_frame_locked(const roce::FrameSpec& spec, std::span<const std::span<const uint8_t>> payload);
  // The time, read at most once per round: the first call after a round
  // starts (progress_locked, transmit_locked) reads the clock, later ones
  // in the same round reuse it. A round that needs no time (nothing
  // received, no timer armed, no ARP) never reads the clock.
  Clock::time_point now() {
    if (!now_fresh_) {
      now_ = Clock::now();
      now_fresh_ = true;
    }
    return now_;
  }

 private:
  Context() = default;
  void on_frame_locked(std::span<const uint8_t> frame);
  void send_arp_locked(const net::ArpFrame& frame);
  void progress_thread_main();

  std::mutex mu_;
  std::unique_ptr<Link> link_;
  net::Ipv4Address ip_;
  net::MacAddress link_mac_{};
  uint32_t active_mtu_ = 1024;
  std::unique_ptr<verbs::MemoryRegionTable> memory_;
  std::optional<net::ArpResponder> arp_responder_;
  std::optional<net::ArpResolver> arp_resolver_;
  verbs::DeviceStats stats_{};
  roce::Packet packet_;  // reused by every receive

  std::vector<std::unique_ptr<CompletionQueueImpl>> cqs_;
  std::unordered_map<uint32_t, std::unique_ptr<QueuePairImpl>> qps_;
  std::vector<QueuePairImpl*> qp_list_;  // iteration order for timers and transmit
  uint32_t next_qpn_ = 0;
  Clock::time_point now_{};
  bool now_fresh_ = false;  // now_ was read in the current round

  std::thread thread_;
  std::atomic<bool> stop_{false};
};

}  // namespace ufab::transport
