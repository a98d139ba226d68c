// The copy engine of the GPU staging pipeline (docs/gpu.md): copies between
// GPU memory and pinned host slots, done asynchronously by a copy thread.
// The progress engine submits a copy (a list of segments, copied in order)
// and later reads its completion word, one load from memory: no CUDA call,
// nothing that can block, on the progress path.
//
// Two engines: CudaCopyEngine (cuda_engine.h: a copy thread owning
// non-blocking streams; the word is written by cuStreamWriteValue32 after
// the copies on the same stream) and FakeCopyEngine (fake_engine.h: a
// thread that memcpy's, with a delay and out-of-order completion, for
// tests without a GPU).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"

namespace ufab::staging {

struct CopySegment {
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
};

class CopyEngine {
 public:
  // Copies in flight at most (tickets).
  static constexpr uint32_t kTickets = 4096;
  // A completion word's values.
  static constexpr uint32_t kPending = 0, kDone = 1, kFailed = 2;

  virtual ~CopyEngine() = default;
  CopyEngine(const CopyEngine&) = delete;
  CopyEngine& operator=(const CopyEngine&) = delete;

  // Run on the copy thread before a job's copies (so the progress path
  // never makes the CUDA call itself): it may rewrite the segments'
  // addresses (a CUDA IPC mapping opened there); a non-empty answer fails
  // the job with those words.
  using Prepare = std::function<std::string(std::vector<CopySegment>&)>;

  // Queues one copy (the segments in order; they must stay valid until it
  // is done) and returns its ticket. EAGAIN when kTickets are in flight.
  // Takes a mutex for a few instructions; never waits for a copy.
  // `device_to_device`: both ends are GPU memory (the CUDA engine gives
  // those their own stream, so they never wait behind staging copies).
  Result<uint32_t> submit(std::span<const CopySegment> segments, Prepare prepare = {},
                          bool device_to_device = false);
  // Runs `fn` on the copy thread once every copy submitted before it has
  // finished (CUDA: its streams synchronized): closing a CUDA IPC mapping
  // those copies used. No ticket; never waits here.
  void after_copies(std::function<void()> fn);
  // kPending, kDone or kFailed: one acquire load of the ticket's word.
  uint32_t state(uint32_t ticket) const { return __atomic_load_n(&words_[ticket], __ATOMIC_ACQUIRE); }
  // Why a kFailed ticket failed.
  std::string failure(uint32_t ticket);
  // Gives a finished (not pending) ticket back.
  void release(uint32_t ticket);

  // Host memory for slots: pinned (CUDA) or plain (fake).
  virtual Result<void*> alloc_host(size_t bytes) = 0;
  virtual void free_host(void* p) = 0;
  virtual const char* name() const = 0;

 protected:
  CopyEngine();
  struct Job {
    uint32_t ticket = 0;
    std::vector<CopySegment> segments;
    Prepare prepare;
    bool device_to_device = false;
    std::function<void()> after;  // an after_copies job (no ticket, no segments)
  };
  // The copy thread's half: hands the job over (under mu_).
  virtual void queue_locked(Job&& job) = 0;
  // Marks a ticket done or failed from the CPU (fake engine, CUDA fallback).
  void finish(uint32_t ticket, bool ok, std::string why = {});

  uint32_t* words_ = nullptr;  // kTickets words, set by the engine before its first submit
  std::mutex mu_;
  std::condition_variable cv_;

 private:
  std::vector<uint32_t> free_;
  std::vector<std::string> why_;
};

}  // namespace ufab::staging
