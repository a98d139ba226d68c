// The engine's streams on a CUDA GPU: doorbell and completion words in
// pinned host memory (cuMemHostAlloc), written and waited on with the
// stream memory operations (docs/gpu.md).
#include <optional>

#include "core/gpu/cuda.h"
#include "core/stream/engine.h"

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
    return driver_.stream_wait_value32_geq(stream, device_address(word), value);
  }

 private:
  uint64_t device_address(uint32_t* word) const {
    return device_base_ + (reinterpret_cast<uintptr_t>(word) - reinterpret_cast<uintptr_t>(words_->data()));
  }
  const gpu::Driver& driver_;
  gpu::PrimaryContext ctx_;
  std::optional<gpu::Allocation> words_;
  uint64_t device_base_ = 0;
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
