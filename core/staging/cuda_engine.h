// The CUDA copy engine: one copy thread per GPU owning two non-blocking
// streams on the GPU's primary context, one per direction (device to host,
// host to device), so staging out and staging in overlap. The progress
// engine only queues jobs (a mutex, a notify); the thread issues each
// job's cuMemcpyAsync calls and then, on the same stream,
// cuStreamWriteValue32 of "done" into the job's word in pinned host
// memory, which the progress engine reads. A driver without working stream
// memory operations gets the fallback: the thread synchronizes the stream
// after each job and writes the word itself. Between jobs the thread spins
// for up to 200 us before it sleeps: a condition variable's wake-up costs
// tens of microseconds, more than a fragment's copy.
#pragma once

#include <memory>
#include <optional>

#include "core/gpu/cuda.h"
#include "core/staging/copy_engine.h"

namespace ufab::staging {

class CudaCopyEngine final : public CopyEngine {
 public:
  // Loads the driver, retains GPU `ordinal`'s primary context, allocates
  // the words and starts the thread (which creates the streams).
  static Result<std::unique_ptr<CudaCopyEngine>> create(int ordinal);
  ~CudaCopyEngine() override;
  Result<void*> alloc_host(size_t bytes) override;
  void free_host(void* p) override;
  const char* name() const override { return "cuda"; }
  bool uses_stream_writes() const { return stream_writes_; }

 private:
  CudaCopyEngine() = default;
  void queue_locked(Job&& job) override;
  void run();

  const gpu::Driver* driver_ = nullptr;
  int ordinal_ = 0;
  std::optional<gpu::PrimaryContext> ctx_;
  std::optional<gpu::Allocation> words_alloc_;
  uint64_t words_device_ = 0;
  bool stream_writes_ = false;
  std::vector<std::unique_ptr<gpu::Allocation>> host_allocs_;  // under mu_
  std::deque<Job> queue_;  // under mu_
  std::atomic<size_t> queued_{0};  // queue_.size(), for the copy thread's spin without the lock
  bool sleeping_ = false;          // under mu_: the copy thread waits on cv_ (submit must notify)
  bool stop_ = false;
  std::string start_error_;  // the thread could not create its streams
  bool started_ = false;
  std::thread thread_;
};

}  // namespace ufab::staging
