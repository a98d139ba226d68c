// A completion queue of the software transport: a bounded ring of work
// completions plus an eventfd for sleepers. Called under the device lock.
#pragma once

#include <cstdint>
#include <memory>
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
  uint64_t take_overflow() { uint64_t n = overflow_; overflow_ = 0; return n; }

  bool empty() const { return count_ == 0; }
  uint32_t depth() const { return static_cast<uint32_t>(ring_.size()); }
  int event_fd() const { return event_fd_.get(); }
  // The next push writes the eventfd (once): verbs' req_notify_cq.
  void arm() { armed_ = true; }

 private:
  explicit CompletionQueueImpl(uint32_t depth) : ring_(depth) {}

  std::vector<verbs::WorkCompletion> ring_;
  uint32_t head_ = 0;  // oldest
  uint32_t count_ = 0;
  uint64_t overflow_ = 0;
  bool armed_ = false;
  UniqueFd event_fd_;
};

}  // namespace ufab::transport
