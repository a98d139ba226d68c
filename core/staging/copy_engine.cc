#include "core/staging/copy_engine.h"

namespace ufab::staging {

CopyEngine::CopyEngine() : why_(kTickets) {
  free_.reserve(kTickets);
  for (uint32_t t = kTickets; t > 0; --t) free_.push_back(t - 1);
}

Result<uint32_t> CopyEngine::submit(std::span<const CopySegment> segments, Prepare prepare, bool device_to_device) {
  std::lock_guard lock(mu_);
  if (free_.empty()) {
    return fail(EAGAIN, std::string(name()) + " copy engine: " + std::to_string(kTickets) + " copies in flight");
  }
  uint32_t t = free_.back();
  free_.pop_back();
  __atomic_store_n(&words_[t], kPending, __ATOMIC_RELEASE);
  Job job;
  job.ticket = t;
  job.segments.assign(segments.begin(), segments.end());
  job.prepare = std::move(prepare);
  job.device_to_device = device_to_device;
  queue_locked(std::move(job));
  cv_.notify_one();
  return t;
}

void CopyEngine::after_copies(std::function<void()> fn) {
  std::lock_guard lock(mu_);
  Job job;
  job.after = std::move(fn);
  queue_locked(std::move(job));
  cv_.notify_one();
}

std::string CopyEngine::failure(uint32_t ticket) {
  std::lock_guard lock(mu_);
  return why_[ticket];
}

void CopyEngine::release(uint32_t ticket) {
  std::lock_guard lock(mu_);
  why_[ticket].clear();
  free_.push_back(ticket);
}

void CopyEngine::finish(uint32_t ticket, bool ok, std::string why) {
  if (!ok) {
    std::lock_guard lock(mu_);
    why_[ticket] = std::move(why);
  }
  __atomic_store_n(&words_[ticket], ok ? kDone : kFailed, __ATOMIC_RELEASE);
}

}  // namespace ufab::staging
