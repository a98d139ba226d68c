// One lane of a software RoCEv2 device: one queue pair of the NIC (its own
// Link, so its own RX ring, TX ring and buffer pool) and the QPs that live
// on it, behind the lane's own lock. QPs on different lanes never share a
// lock on post, receive or progress, so threads driving QPs on different
// lanes run in parallel.
//
// A QP lives on lane qpn % lane_count. The NIC steers a received RoCE
// frame to the RX queue of its destination QP's lane where it can
// (abi/raw_frame.h rx_steer); a frame that lands on another lane's queue
// anyway (a NIC that cannot steer) is handled on the spot under the owner's
// lock when that is free, else handed over through the owner's inbox:
// copied into a bounded ring, taken at the owner's next progress round.
//
// Locking: mutex() guards the lane, its link and its QPs; methods named
// *_locked expect it held. Lock order: a lane, then the device's ARP lock
// or a CQ's lock. A lane never takes another lane's lock.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/error.h"
#include "base/fd.h"
#include "core/net/addresses.h"
#include "core/rdma/memory.h"
#include "core/roce/builder.h"
#include "core/roce/parser.h"
#include "core/transport/link.h"
#include "core/transport/verbs.h"

namespace ufab::staging {
class Pool;
}

namespace ufab::transport {

class Context;
class QueuePairImpl;
using Clock = std::chrono::steady_clock;

class Lane {
 public:
  Lane(Context& device, uint16_t index, std::unique_ptr<Link> link);
  ~Lane();
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;

  std::mutex& mutex() { return mu_; }
  uint16_t index() const { return index_; }
  Link& link() { return *link_; }

  // For QPs (under the lock).
  verbs::MemoryRegionTable& memory();
  // The device's GPU staging pool; nullptr until a GPU region exists.
  staging::Pool* staging() const;
  net::Ipv4Address ip() const;
  uint32_t active_mtu() const;
  verbs::DeviceStats& stats() { return stats_; }
  // The MAC of `ip`: a value, nullopt while ARP is pending (a request has
  // been sent when one was due), or an error when ARP gave up.
  Result<std::optional<net::MacAddress>> resolve_locked(net::Ipv4Address ip);
  // Builds a frame into the next TX buffer and queues it; false (nothing
  // sent, tx_stalls counted) when the NIC has no free buffer. `device`,
  // when given, holds each payload piece's device address (0: none): a
  // NIC that gathers then reads those pieces where they lie (zero copy,
  // kGatherMinPayload bytes and up) instead of from a copy.
  bool send_frame_locked(const roce::FrameSpec& spec, std::span<const std::span<const uint8_t>> payload,
                         const uint64_t* device = nullptr);
  // Payloads below this are copied: a copy of a few hundred bytes costs
  // less than the NIC's extra segments (descriptors, for a DMA NIC).
  static constexpr size_t kGatherMinPayload = 256;
  // Queues a prebuilt frame (ARP); a busy NIC gets one flush to free a buffer.
  void send_raw_locked(std::span<const uint8_t> frame);
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

  // QPs (under the lock).
  void add_qp_locked(std::unique_ptr<QueuePairImpl> qp);
  void remove_qp_locked(QueuePairImpl* qp);
  bool any_qp_uses_locked(const void* cq) const;
  size_t qp_count_locked() const { return qp_list_.size(); }
  bool has_qp_locked(uint32_t qpn) const { return qps_.contains(qpn); }

  // Sends what `qp` has queued that the window allows, then rings the
  // NIC's doorbell once: the end of a post.
  void transmit_locked(QueuePairImpl& qp);
  // One round: the inbox, a burst from the RX queue, timers, transmit;
  // returns frames and timers handled.
  int progress_locked();
  // Rounds of progress_locked so far by threads that poll (not by CQ
  // waiters, which call note_waiter_round() after theirs): a waiter that
  // finds it moved while it slept knows a polling thread drives this
  // lane. Two waiters do not count each other.
  uint64_t rounds() const {
    return rounds_.load(std::memory_order_relaxed) - waiter_rounds_.load(std::memory_order_relaxed);
  }
  void note_waiter_round() {
    waiter_rounds_.store(waiter_rounds_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }

  // A frame this lane's RX queue took for another lane (see above). Any
  // thread, no lane lock needed; false when the inbox is full (dropped,
  // counted by the caller: RC recovers it as a loss).
  bool hand_over(std::span<const uint8_t> frame);

  // Sleeping on this lane: the fds that wake a sleeper (the NIC's RX
  // interrupt, the inbox), armed; call under the lock, sleep without it,
  // then call woke(). Returns the number of fds written to `fds` (0..2).
  int prepare_sleep_locked(int* fds);
  void woke();
  // Frames handed over and not yet taken (check after prepare_sleep_locked:
  // then no hand-over is missed).
  bool inbox_waiting() const;

  // This lane's progress thread (Context starts one per lane).
  void start_thread();
  void stop_thread();
  bool has_thread() const { return thread_.joinable(); }

 private:
  void on_frame_locked(std::span<const uint8_t> frame);
  // send_frame_locked's zero-copy form; false when this frame cannot go
  // that way (then it is copied).
  bool send_gathered_locked(const roce::FrameSpec& spec, std::span<const std::span<const uint8_t>> payload,
                            const uint64_t* device, std::span<uint8_t> buf);
  // A frame another lane received for this one, under this lane's lock.
  void deliver_locked(std::span<const uint8_t> frame);
  int drain_inbox_locked();
  void thread_main();

  // Inbox: a bounded ring of frame copies, many producers (other lanes'
  // receivers, under inbox_mu_), one consumer (this lane, under mu_).
  static constexpr uint32_t kInboxSlots = 1024;

  std::mutex mu_;
  Context& device_;
  const uint16_t index_;
  std::unique_ptr<Link> link_;
  net::MacAddress link_mac_{};
  Link::Gather gather_ = Link::Gather::kNone;
  verbs::DeviceStats stats_{};
  roce::Packet packet_;  // reused by every receive
  std::unordered_map<uint32_t, std::unique_ptr<QueuePairImpl>> qps_;
  std::vector<QueuePairImpl*> qp_list_;  // iteration order for timers and transmit
  Clock::time_point now_{};
  bool now_fresh_ = false;  // now_ was read in the current round

  std::mutex inbox_mu_;
  uint32_t inbox_slot_bytes_ = 0;          // the largest frame the link carries
  std::vector<uint8_t> inbox_;             // kInboxSlots slots of inbox_slot_bytes_
  std::vector<uint32_t> inbox_length_;     // per slot
  std::atomic<uint64_t> inbox_head_{0};    // consumer (under mu_)
  uint64_t inbox_tail_ = 0;                // producers (under inbox_mu_)
  std::atomic<uint64_t> inbox_ready_{0};   // inbox_tail_, for the consumer's lock-free look
  std::atomic<uint32_t> sleepers_{0};
  std::atomic<uint64_t> rounds_{0};         // written under the lane lock only
  std::atomic<uint64_t> waiter_rounds_{0};  // the same
  UniqueFd inbox_fd_;  // eventfd written when a frame is handed over to a sleeping lane

  std::thread thread_;
  std::atomic<bool> stop_{false};
};

}  // namespace ufab::transport
