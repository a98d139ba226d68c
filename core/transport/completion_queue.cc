#include "core/transport/completion_queue.h"

#include <sys/eventfd.h>
#include <unistd.h>

namespace ufab::transport {

Result<std::unique_ptr<CompletionQueueImpl>> CompletionQueueImpl::create(uint32_t depth) {
  if (depth == 0 || depth > (1u << 22)) {
    return fail(EINVAL, "completion queue depth " + std::to_string(depth) + " is outside 1.." +
                            std::to_string(1u << 22));
  }
  std::unique_ptr<CompletionQueueImpl> cq(new CompletionQueueImpl(depth));
  cq->event_fd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!cq->event_fd_.valid()) return fail_errno("creating the completion queue's eventfd");
  return cq;
}

bool CompletionQueueImpl::push(verbs::WorkCompletion&& wc) {
  {
    std::lock_guard lock(mu_);
    uint32_t count = count_.load(std::memory_order_relaxed);
    if (count == ring_.size()) {
      ++overflow_;
      return false;
    }
    ring_[(head_ + count) % ring_.size()] = std::move(wc);
    count_.store(count + 1, std::memory_order_release);
  }
  if (armed_.load(std::memory_order_acquire) && armed_.exchange(false, std::memory_order_acq_rel)) {
    uint64_t one = 1;
    // A full eventfd counter (2^64-2) cannot happen with one write per arm.
    [[maybe_unused]] ssize_t n = ::write(event_fd_.get(), &one, sizeof one);
  }
  return true;
}

size_t CompletionQueueImpl::pop(std::span<verbs::WorkCompletion> out) {
  std::lock_guard lock(mu_);
  uint32_t count = count_.load(std::memory_order_relaxed);
  size_t n = 0;
  while (n < out.size() && count > 0) {
    out[n++] = std::move(ring_[head_]);
    head_ = (head_ + 1) % static_cast<uint32_t>(ring_.size());
    --count;
  }
  count_.store(count, std::memory_order_release);
  return n;
}

uint64_t CompletionQueueImpl::take_overflow() {
  std::lock_guard lock(mu_);
  uint64_t n = overflow_;
  overflow_ = 0;
  return n;
}

}  // namespace ufab::transport
