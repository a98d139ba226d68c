#include "core/staging/cuda_engine.h"

namespace ufab::staging {

Result<std::unique_ptr<CudaCopyEngine>> CudaCopyEngine::create(int ordinal) {
  auto driver = gpu::Driver::get();
  if (!driver) return std::unexpected(driver.error().context("GPU staging copy engine"));
  std::unique_ptr<CudaCopyEngine> e(new CudaCopyEngine());
  e->driver_ = *driver;
  e->ordinal_ = ordinal;
  auto ctx = gpu::PrimaryContext::retain(**driver, ordinal);
  if (!ctx) return std::unexpected(ctx.error().context("GPU staging copy engine"));
  e->ctx_.emplace(std::move(*ctx));
  auto words = gpu::Allocation::allocate(**driver, ordinal, gpu::Allocation::Kind::kPinnedHost,
                                         kTickets * sizeof(uint32_t));
  if (!words) return std::unexpected(words.error().context("GPU staging copy engine: completion words"));
  e->words_alloc_.emplace(std::move(*words));
  e->words_ = static_cast<uint32_t*>(e->words_alloc_->data());
  for (uint32_t i = 0; i < kTickets; ++i) e->words_[i] = kDone;
  // Stream writes when the driver has them and they work on this GPU;
  // otherwise the thread synchronizes (only the copy thread ever blocks).
  if ((*driver)->probe_stream_memops(ordinal)) {
    if (auto dp = gpu::host_device_pointer(**driver, e->words_)) {
      e->words_device_ = *dp;
      e->stream_writes_ = true;
    }
  }
  e->thread_ = std::thread([p = e.get()] { p->run(); });
  std::unique_lock lock(e->mu_);
  e->cv_.wait(lock, [&] { return e->started_; });
  if (!e->start_error_.empty()) {
    return fail(EIO, "GPU staging copy engine on GPU " + std::to_string(ordinal) + ": " + e->start_error_);
  }
  return e;
}

CudaCopyEngine::~CudaCopyEngine() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard lock(mu_);
  host_allocs_.clear();
}

Result<void*> CudaCopyEngine::alloc_host(size_t bytes) {
  auto a = gpu::Allocation::allocate(*driver_, ordinal_, gpu::Allocation::Kind::kPinnedHost, bytes);
  if (!a) return std::unexpected(a.error().context("pinned staging slots"));
  void* p = a->data();
  std::lock_guard lock(mu_);
  host_allocs_.push_back(std::make_unique<gpu::Allocation>(std::move(*a)));
  return p;
}

void CudaCopyEngine::free_host(void* p) {
  std::lock_guard lock(mu_);
  std::erase_if(host_allocs_, [p](const auto& a) { return a->data() == p; });
}

void CudaCopyEngine::queue_locked(Job&& job) {
  queue_.push_back(std::move(job));
  queued_.store(queue_.size(), std::memory_order_release);
}

void CudaCopyEngine::run() {
  std::optional<gpu::AsyncStream> d2h, h2d, d2d;
  {
    std::string err;
    if (auto s = ctx_->make_current(); !s) err = s.error().message();
    if (err.empty()) {
      auto a = gpu::AsyncStream::create(*driver_);
      auto b = gpu::AsyncStream::create(*driver_);
      auto c = gpu::AsyncStream::create(*driver_);
      if (a && b && c) {
        d2h.emplace(std::move(*a));
        h2d.emplace(std::move(*b));
        d2d.emplace(std::move(*c));
      } else {
        err = (!a ? a.error() : !b ? b.error() : c.error()).message();
      }
    }
    std::lock_guard lock(mu_);
    start_error_ = err;
    started_ = true;
    cv_.notify_all();
    if (!err.empty()) return;
  }
  constexpr auto kSpin = std::chrono::microseconds(200);
  std::unique_lock lock(mu_);
  while (true) {
    if (queue_.empty() && !stop_) {
      // Spin a while without the lock (a job usually follows soon), then sleep.
      lock.unlock();
      const auto until = std::chrono::steady_clock::now() + kSpin;
      for (uint32_t i = 0; queued_.load(std::memory_order_acquire) == 0; ++i) {
        if ((i & 63) == 0 && std::chrono::steady_clock::now() >= until) break;
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
      }
      lock.lock();
      sleeping_ = true;
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      sleeping_ = false;
    }
    if (queue_.empty() && stop_) break;
    if (queue_.empty()) continue;
    Job job = std::move(queue_.front());
    queue_.pop_front();
    queued_.store(queue_.size(), std::memory_order_release);
    lock.unlock();
    if (job.after) {
      // Every copy queued before it is on a stream: wait for them here
      // (the copy thread may block), then run it.
      (void)d2h->synchronize();
      (void)h2d->synchronize();
      (void)d2d->synchronize();
      job.after();
      lock.lock();
      continue;
    }
    if (job.prepare) {
      std::string why = job.prepare(job.segments);
      if (!why.empty()) {
        finish(job.ticket, false, why);
        lock.lock();
        continue;
      }
    }
    // A job whose first destination is pinned slot memory copies out of
    // the GPU; the direction only picks the stream. Device to device (CUDA
    // IPC) has a stream of its own.
    gpu::AsyncStream* sp = nullptr;
    if (job.device_to_device) {
      sp = &*d2d;
    } else {
      auto dst_info = driver_->pointer_info(job.segments.empty() ? nullptr : job.segments[0].dst);
      const bool to_host = dst_info && dst_info->type != gpu::MemoryType::kDevice;
      sp = to_host ? &*d2h : &*h2d;
    }
    gpu::AsyncStream& s = *sp;
    Status st;
    for (const CopySegment& seg : job.segments) {
      if (!st) break;
      st = s.copy(seg.dst, seg.src, seg.bytes);
    }
    if (st && stream_writes_) {
      st = s.write_value(words_device_ + job.ticket * sizeof(uint32_t), kDone);
      if (!st) {
        // The copies may be queued: wait for them before saying anything.
        (void)s.synchronize();
      }
    } else if (st) {
      st = s.synchronize();
      if (st) finish(job.ticket, true);
    }
    if (!st) finish(job.ticket, false, st.error().message());
    lock.lock();
  }
  lock.unlock();
  if (d2h) (void)d2h->synchronize();
  if (h2d) (void)h2d->synchronize();
  if (d2d) (void)d2d->synchronize();
}

}  // namespace ufab::staging
