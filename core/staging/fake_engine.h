// The fake copy engine (a testing aid, device parameter gpu_copy=fake,
// docs/gpu.md): a thread that memcpy's each copy and then sets its word,
// after a configurable delay and, when asked, in random order, so the
// pipeline's logic is tested without a GPU. Tests can hold every copy
// (fake_hold) to check that nothing completes before placement.
#pragma once

#include <chrono>
#include <random>

#include "core/staging/copy_engine.h"

namespace ufab::staging {

struct FakeOptions {
  std::chrono::microseconds delay{0};  // a copy completes no earlier than this after submit
  bool random_order = false;           // complete due copies in random order, not FIFO
  uint32_t seed = 1;
};

class FakeCopyEngine final : public CopyEngine {
 public:
  static Result<std::unique_ptr<FakeCopyEngine>> create(const FakeOptions& options);
  ~FakeCopyEngine() override;
  Result<void*> alloc_host(size_t bytes) override;
  void free_host(void* p) override;
  const char* name() const override { return "fake"; }

 private:
  explicit FakeCopyEngine(const FakeOptions& options);
  void queue_locked(Job&& job) override;
  void run();

  FakeOptions options_;
  std::vector<uint32_t> word_storage_;
  struct Queued {
    Job job;
    std::chrono::steady_clock::time_point due;
  };
  std::vector<Queued> queue_;  // under mu_
  std::mt19937 rng_;
  bool stop_ = false;
  std::thread thread_;
};

// Process-wide controls of every fake engine, for tests.
// While held, no fake copy completes (they queue up).
void fake_hold(bool hold);
// Fake copies completed in this process so far, and queued now.
uint64_t fake_completed();
uint64_t fake_queued();
// A test double for cuMemFree under a live region (gpu_copy=fake has no
// buffer ids to compare): addresses in [p, p + n) count as freed GPU
// memory to the providers' buffer checks (the shm provider's
// Device::gpu_buffer_ok), until fake_unfree_all.
void fake_free(const void* p, size_t n);
void fake_unfree_all();
bool fake_freed(uint64_t addr);

}  // namespace ufab::staging
