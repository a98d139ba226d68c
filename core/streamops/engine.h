// Stream-ordered operations (issue 12, docs/gpu.md "Stream-ordered
// operations"): work requests prepared now and posted when a stream (a CUDA
// stream) reaches them, and stream waits for their completion.
//
// A send op is a batch of work requests on one QP, validated and copied at
// enqueue. The stream gets a write of the op's value into the op's doorbell
// word (pinned host memory); the engine's watcher thread loads each armed
// doorbell (one load per armed op, no CUDA call), and when the value is
// there it posts the batch through the provider's post_send_notify, which
// attaches the op's completion word to the batch's last work request. The
// provider stores the value there when that request retires (after its
// completion, if any, is in the CQ), and a stream waiting on the word
// (wait-value GEQ) goes on. A recv op is posted at once and gets the same
// completion word.
//
// Words live in slots of a pool that is never freed (a stream may still
// hold a write or a wait on any of them): each use of a slot takes the
// next value of the slot's counter, so a late wait on an earlier use is
// satisfied and a slot is reused only once its doorbell fired and its
// completion came.
//
// Nothing here calls CUDA: the stream is an interface (Stream); the CUDA
// one is in core/streamops/cuda_stream, and tests use a CPU thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "abi/rdma_provider.h"
#include "base/error.h"

namespace ufab::streamops {

// What the engine needs of a stream: two operations enqueued in stream
// order. Both words are host memory the stream's device can reach.
class Stream {
 public:
  virtual ~Stream() = default;
  // When the stream gets here, after everything before it in the stream is
  // visible to the host: *word = value.
  virtual Status write_value(uint32_t* word, uint32_t value) = 0;
  // The stream goes on past here once (int32_t)(*word - value) >= 0.
  virtual Status wait_value(uint32_t* word, uint32_t value) = 0;
};

// Where a batch goes: a QP's post operations and its device's progress.
// The engine calls them from its watcher thread, under its lock.
struct Target {
  std::function<int(const ufab_send_wr*, uint32_t, uint32_t*, const ufab_rdma_notify*)> post_send;
  std::function<int(const ufab_recv_wr*, uint32_t, uint32_t*, const ufab_rdma_notify*)> post_recv;
  std::function<void()> progress;               // one round of the device's progress; may be empty
  std::function<std::string()> last_error;      // the words of the post that just failed
};

// Memory for word slots: host memory the GPU can read and write
// (cuMemHostAlloc), or plain memory for tests. Never given back.
using WordAllocator = std::function<Result<void*>(size_t bytes)>;

struct Options {
  // A watcher with ops in flight spins; after this long without any
  // doorbell or completion it sleeps `idle_sleep_us` between looks.
  uint32_t spin_us = 2000;
  uint32_t idle_sleep_us = 20;
  // Work requests in one op.
  uint32_t max_batch = 64;
};

struct OpInfo {
  enum State : uint32_t { kArmed = 0, kPosted = 1, kDone = 2 } state = kArmed;
  uint32_t wc_status = 0;  // kDone: the last work request's enum ufab_wc_status
  int post_error = 0;      // negative errno when the batch could not be posted (or was cancelled)
  std::string error;       // its words
};

class Engine;

// One op; the application's handle. Freed with Engine::release.
struct Op;

class Engine {
 public:
  static Result<std::unique_ptr<Engine>> create(WordAllocator alloc, Options options = {});
  ~Engine();  // stops the watcher; armed ops are left unposted
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // A QP the engine may post on; `key` identifies it for cancel(). Again
  // for a key it knows: nothing.
  void attach(const void* key, Target target);
  // Before the QP goes: armed ops of `key` are cancelled (their completion
  // words written, state kDone, post_error -ECANCELED) and nothing is
  // posted or progressed for it any more. finish() after the provider
  // destroyed the QP writes the words of ops still in flight that the
  // provider did not (status UFAB_WC_WR_FLUSH_ERR).
  void cancel(const void* key);
  void finish(const void* key);

  // Validates and copies wrs[0..n) and enqueues the doorbell write on
  // `stream`. Errors now: EINVAL (arguments, opcodes other than SEND,
  // SEND_WITH_IMM, RDMA_WRITE, RDMA_WRITE_WITH_IMM, RDMA_READ), ENOENT (no
  // attached QP), the stream's error.
  Result<Op*> post_send(const void* key, const ufab_send_wr* wrs, uint32_t n, Stream& stream);
  // Posts now, with a completion word.
  Result<Op*> post_recv(const void* key, const ufab_recv_wr* wrs, uint32_t n);
  // Enqueues on `stream` a wait for the op's completion.
  Status wait(Op* op, Stream& stream);
  OpInfo query(const Op* op) const;
  // The application is done with the handle (the op still runs to its end
  // when armed or in flight).
  void release(Op* op);

  // For tests: ops armed or in flight, slots taken, slots in the pool.
  struct Counts {
    size_t armed = 0, in_flight = 0, slots_used = 0, slots_total = 0, quarantined = 0;
  };
  Counts counts() const;

  struct Slot;   // engine.cc
  struct Queue;

 private:
  explicit Engine(WordAllocator alloc, Options options);
  Result<Slot*> take_slot_locked();
  void free_slot_locked(Slot* s);
  void start_locked();
  void watcher();
  bool round_locked();  // one look at everything; true when something happened
  void post_locked(Op* op);
  void finish_op_locked(Op* op, uint32_t wc_status, int post_error, std::string error);
  void drop_if_finished_locked(Op* op);

  WordAllocator alloc_;
  Options options_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::vector<std::unique_ptr<Queue>> queues_;
  std::vector<Op*> armed_;      // enqueue order
  std::vector<Op*> in_flight_;  // posted, completion word not yet there
  std::vector<Slot*> free_;
  std::vector<Slot*> quarantine_;  // cancelled before the stream wrote the doorbell
  size_t slots_total_ = 0;
  size_t slots_used_ = 0;
  std::thread thread_;
  bool stop_ = false;
};

}  // namespace ufab::streamops
