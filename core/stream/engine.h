// Stream-ordered operations (<ufab/stream.h>, docs/gpu.md): a proxy
// thread that posts prepared work requests when a stream writes their
// doorbell word and writes a completion word, which streams wait on, when
// they complete. Written on the public C API, so it serves every provider.
//
// The streams are behind `Streams`: CUDA's stream memory operations on
// pinned host words (cuda_streams), or a test double.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/error.h"
#include "ufab/rdma.h"

namespace ufab::stream {

class Streams {
 public:
  virtual ~Streams() = default;
  // `n` zeroed 32-bit words the streams can write and wait on, owned by
  // this object, at least as long as it lives.
  virtual Result<uint32_t*> allocate_words(size_t n) = 0;
  // When `stream` gets here: *word = value (visible to the host).
  virtual Status write(void* stream, uint32_t* word, uint32_t value) = 0;
  // `stream` waits here until *word >= value.
  virtual Status wait_geq(void* stream, uint32_t* word, uint32_t value) = 0;
  // How wait_geq waits, where there is a choice (CUDA: a polling kernel or
  // a stream memory operation, <ufab/stream.h>'s UFAB_STREAM_WAIT_*).
  virtual Status set_wait_mode(int mode) {
    return mode == 0 ? Status{} : fail(ENOTSUP, "these streams have one way to wait");
  }
  virtual int wait_mode() const { return 0; }
  // The address a GPU kernel reads and writes `word` at (the host address
  // where there is no GPU, as in a test double).
  virtual uint64_t device_address(const uint32_t* word) const { return reinterpret_cast<uintptr_t>(word); }
};

// CUDA's streams on GPU `ordinal`: cuStreamWriteValue32 / cuStreamWaitValue32
// on words of cuMemHostAlloc memory.
Result<std::unique_ptr<Streams>> cuda_streams(int ordinal);

class Engine {
 public:
  static Result<std::unique_ptr<Engine>> create(ufab_cq* cq, std::unique_ptr<Streams> streams, uint32_t slots);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  Result<uint64_t> post_send(ufab_qp* qp, std::span<const ufab_send_wr> wrs, void* stream);
  // A word a kernel reads or writes itself, and the value it stands for.
  struct Word {
    uint64_t device_address;
    uint32_t value;
  };
  // Device-initiated: as post_send, but no stream writes the doorbell; a
  // kernel does (the returned word, <ufab/stream_device.cuh>). The QP's
  // device-rung tickets are posted in ticket order.
  Result<uint64_t> post_send_device(ufab_qp* qp, std::span<const ufab_send_wr> wrs, Word* doorbell);
  // The completion word of `ticket` and the value it reaches (for a kernel
  // to wait on, <ufab/stream_device.cuh>).
  Result<Word> wait_word(uint64_t ticket);
  Result<uint64_t> post_recv(ufab_qp* qp, const ufab_recv_wr& wr);
  Status wait(uint64_t ticket, void* stream);
  // 1 complete, 0 not yet, or the error (EIO, ECANCELED, EINVAL).
  Result<int> status(uint64_t ticket);
  size_t poll(std::span<ufab_wc> out);
  // How later waits wait (Streams::set_wait_mode).
  Status set_wait_mode(int mode) { return streams_->set_wait_mode(mode); }
  int wait_mode() const { return streams_->wait_mode(); }

 private:
  enum class State : uint8_t { kFree, kArmed, kPosted, kDone, kFailed, kCancelled };
  struct Slot {
    State state = State::kFree;
    uint64_t ticket = 0;
    ufab_qp* qp = nullptr;
    std::vector<ufab_send_wr> wrs;
    std::vector<ufab_sge> sges;
    std::vector<uint64_t> app_wr_ids;  // by index in the batch
    uint32_t error_status = 0;         // the first error completion's status
  };

  Engine(ufab_cq* cq, std::unique_ptr<Streams> streams, uint32_t slots, uint32_t* words);
  Result<uint64_t> arm(const char* who, ufab_qp* qp, std::span<const ufab_send_wr> wrs, void* stream, Word* doorbell);
  Result<uint32_t> held_slot(const char* who, uint64_t ticket);  // under mu_
  void run();
  void on_completion(ufab_wc wc);
  Result<Slot*> take_slot(uint64_t* ticket);
  void complete(Slot& s, uint32_t slot_index, State state);
  uint32_t seq(uint64_t ticket) const { return static_cast<uint32_t>(ticket + 1); }
  uint32_t index(uint64_t ticket) const { return static_cast<uint32_t>(ticket % slots_.size()); }
  // wr_ids the engine gives its work requests: a tag, the slot, the index
  // in the batch (kRecv for a receive).
  static constexpr uint64_t kTag = 0xf57e'0000'0000'0000ull, kTagMask = 0xffff'0000'0000'0000ull;
  static constexpr uint32_t kRecv = 0xffff;
  static uint64_t token(uint32_t slot, uint32_t i) { return kTag | uint64_t(slot) << 16 | i; }

  ufab_cq* cq_;
  std::unique_ptr<Streams> streams_;
  // Held by post_send from taking a ticket to queueing it as armed, so a
  // stream's doorbell writes are enqueued in its tickets' order; the CUDA
  // call runs outside mu_, so the proxy is not kept waiting on it.
  std::mutex post_mu_;
  uint32_t* doorbells_;    // slots_.size() words, then as many completion words
  uint32_t* completions_;
  std::mutex mu_;          // slots_, next_ticket_, armed_, completions queue
  std::vector<Slot> slots_;
  uint64_t next_ticket_ = 0;
  // Armed slots per stream (per QP for device-rung tickets, keyed by the
  // QP's address with the low bit set), in ticket order. A stream rings its
  // doorbells in that order, so the proxy looks only at each one's oldest.
  std::vector<std::pair<void*, std::deque<uint32_t>>> armed_;
  size_t posted_ = 0;  // slots in kPosted
  std::deque<ufab_wc> out_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace ufab::stream
