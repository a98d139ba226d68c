// A completion queue of the software transport: a bounded ring of work
// completions plus an eventfd for sleepers. QPs on any lane push into it
// (under their lane's lock), the application pops: the CQ has its own lock,
// taken only for the moment of a push or a pop.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "base/error.h"
#include "base/fd.h"
#include "core/transport/verbs.h"

namespace ufab::transport {

class CompletionQueueImpl {
 public:
  static Result<std::unique_ptr<CompletionQueueImpl>> create(uint32_t depth);

  // Adds a completion; false when the ring is full (the completion is lost
  // and counted, and the next pop reports it).
  bool push(verbs::WorkCompletion&& wc);
  // Moves up to out.size() completions out, oldest first.
  size_t pop(std::span<verbs::WorkCompletion> out);
  // Completions lost to overflow since the last call, then zero.
  uint64_t take_overflow();

  // No lock: a hint that a pop would find nothing.
  bool empty() const { return count_.load(std::memory_order_acquire) == 0; }
  uint32_t depth() const { return static_cast<uint32_t>(ring_.size()); }
  int event_fd() const { return event_fd_.get(); }
  // The next push writes the eventfd (once): verbs' req_notify_cq.
  void arm() { armed_.store(true, std::memory_order_release); }

  // The lanes whose QPs complete into this CQ (bit i: lane i).
  uint64_t lanes() const { return lanes_.load(std::memory_order_relaxed); }
  void add_lane(uint16_t lane) { lanes_.fetch_or(uint64_t{1} << lane, std::memory_order_relaxed); }

  // What this CQ's last waiter saw: another thread drove its lanes while
  // it slept (Context::wait_for_completion sleeps passively then).
  bool others_poll() const { return others_poll_.load(std::memory_order_relaxed); }
  void set_others_poll(bool v) { others_poll_.store(v, std::memory_order_relaxed); }

 private:
  explicit CompletionQueueImpl(uint32_t depth) : ring_(depth) {}

  std::mutex mu_;
  std::vector<verbs::WorkCompletion> ring_;
  uint32_t head_ = 0;  // oldest
  std::atomic<uint32_t> count_{0};
  uint64_t overflow_ = 0;
  std::atomic<bool> armed_{false};
  std::atomic<uint64_t> lanes_{0};
  std::atomic<bool> others_poll_{false};
  UniqueFd event_fd_;
};

}  // namespace ufab::transport
