// The engine's streams on a CUDA GPU: doorbell and completion words in
// pinned host memory (cuMemHostAlloc). A doorbell is written with a stream
// memory operation (cuStreamWriteValue32); a wait is cuStreamWaitValue32,
// or, when the application asks for it, a one-thread kernel that polls the
// completion word (wait_kernel.h; docs/gpu.md, "Wait modes").
#include <atomic>
#include <mutex>
#include <optional>
#include <string>

#include "core/gpu/cuda.h"
#include "core/stream/engine.h"
#include "core/stream/wait_kernel.h"
#include "ufab/stream.h"

namespace ufab::stream {
namespace {

class CudaStreams final : public Streams {
 public:
  CudaStreams(const gpu::Driver& driver, gpu::PrimaryContext ctx) : driver_(driver), ctx_(std::move(ctx)) {}

  Result<uint32_t*> allocate_words(size_t n) override {
    if (words_) return fail(EBUSY, "CUDA streams: words already allocated");
    auto a = gpu::Allocation::allocate(driver_, ctx_.ordinal(), gpu::Allocation::Kind::kPinnedHost, n * sizeof(uint32_t));
    if (!a) return std::unexpected(a.error());
    auto d = a->device_address();
    if (!d) return std::unexpected(d.error());
    words_.emplace(std::move(*a));
    device_base_ = *d;
    auto* w = static_cast<uint32_t*>(words_->data());
    for (size_t i = 0; i < n; ++i) w[i] = 0;
    return w;
  }
  Status write(void* stream, uint32_t* word, uint32_t value) override {
    if (auto c = ctx_.make_current(); !c) return c;
    return driver_.stream_write_value32(stream, device_address(word), value);
  }
  Status wait_geq(void* stream, uint32_t* word, uint32_t value) override {
    if (auto c = ctx_.make_current(); !c) return c;
    uint64_t address = device_address(word);
    if (mode_.load(std::memory_order_relaxed) == UFAB_STREAM_WAIT_KERNEL) {
      void* args[] = {&address, &value};
      auto s = driver_.launch(wait_kernel_, stream, 1, args);
      if (s) return s;
      // A stream the kernel cannot run on (another context, say): the
      // memory operation waits just the same, only reacts later.
      if (auto m = driver_.stream_wait_value32_geq(stream, address, value); m) return m;
      return std::unexpected(s.error().context("launching the wait kernel"));
    }
    return driver_.stream_wait_value32_geq(stream, address, value);
  }
  Status set_wait_mode(int mode) override {
    if (mode == UFAB_STREAM_WAIT_MEMOP) {
      mode_.store(mode);
      return {};
    }
    if (mode != UFAB_STREAM_WAIT_KERNEL) {
      return fail(EINVAL, "unknown wait mode " + std::to_string(mode) +
                              " (UFAB_STREAM_WAIT_KERNEL or UFAB_STREAM_WAIT_MEMOP)");
    }
    // Loaded on first use (a JIT of a few lines of PTX), kept for the
    // process (gpu::Driver::kernel).
    std::lock_guard lock(kernel_mu_);
    if (wait_kernel_ == nullptr) {
      auto k = driver_.kernel(ctx_.ordinal(), kWaitKernelPtx, kWaitKernelName);
      if (!k) return fail(ENOTSUP, "the wait kernel is not available on this GPU: " + k.error().message());
      wait_kernel_ = *k;
    }
    mode_.store(mode);
    return {};
  }
  int wait_mode() const override { return mode_.load(); }
  uint64_t device_address(const uint32_t* word) const override {
    return device_base_ + (reinterpret_cast<uintptr_t>(word) - reinterpret_cast<uintptr_t>(words_->data()));
  }

 private:
  const gpu::Driver& driver_;
  gpu::PrimaryContext ctx_;
  std::optional<gpu::Allocation> words_;
  uint64_t device_base_ = 0;
  std::mutex kernel_mu_;
  void* wait_kernel_ = nullptr;  // CUfunction, loaded for the process's lifetime (gpu::Driver::kernel)
  std::atomic<int> mode_{UFAB_STREAM_WAIT_MEMOP};
};

}  // namespace

Result<std::unique_ptr<Streams>> cuda_streams(int ordinal) {
  auto driver = gpu::Driver::get();
  if (!driver) return std::unexpected(driver.error());
  if (auto probe = (*driver)->probe_stream_memops(ordinal); !probe) {
    return std::unexpected(probe.error().context("GPU " + std::to_string(ordinal) + ": stream memory operations"));
  }
  auto ctx = gpu::PrimaryContext::retain(**driver, ordinal);
  if (!ctx) return std::unexpected(ctx.error());
  return std::unique_ptr<Streams>(new CudaStreams(**driver, std::move(*ctx)));
}

}  // namespace ufab::stream
