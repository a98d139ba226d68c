#include "core/streamops/engine.h"

#include <algorithm>
#include <atomic>
#include <chrono>

namespace ufab::streamops {

namespace {

// The words of one slot, in memory the stream's device reaches. The
// doorbell (written by the stream) and the completion words (written here
// and by providers) sit on separate halves of the cache line's pair.
struct alignas(64) Words {
  uint32_t doorbell;
  uint32_t pad0[15];
  uint32_t done;
  uint32_t status;
  uint32_t pad1[14];
};
static_assert(sizeof(Words) == 128);

constexpr size_t kSlotsPerChunk = 1024;

// Cyclic "at or past", as cuStreamWaitValue32's GEQ compares.
bool reached(uint32_t word, uint32_t value) { return static_cast<int32_t>(word - value) >= 0; }
uint32_t load(const uint32_t& w) { return std::atomic_ref<const uint32_t>(w).load(std::memory_order_acquire); }
void store(uint32_t& w, uint32_t v, std::memory_order o) { std::atomic_ref<uint32_t>(w).store(v, o); }

inline void cpu_relax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

struct Engine::Slot {
  Words* w = nullptr;
  uint32_t counter = 0;  // the value of its last use
};

struct Engine::Queue {
  const void* key = nullptr;
  Target target;
  bool cancelled = false;
  size_t in_flight = 0;
};

struct Op {
  Engine::Queue* queue = nullptr;
  Engine::Slot* slot = nullptr;
  uint32_t value = 0;
  std::vector<ufab_send_wr> wrs;
  std::vector<ufab_sge> sges;
  OpInfo info;
  bool released = false;  // the application gave the handle back
  bool settled = false;   // kDone and out of every list
  bool quarantined = false;  // cancelled while armed: the slot is the quarantine's
};

Engine::Engine(WordAllocator alloc, Options options) : alloc_(std::move(alloc)), options_(options) {}

Result<std::unique_ptr<Engine>> Engine::create(WordAllocator alloc, Options options) {
  if (!alloc) return fail(EINVAL, "stream-ordered operations: no memory for doorbell words");
  return std::unique_ptr<Engine>(new Engine(std::move(alloc), options));
}

Engine::~Engine() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (Op* op : armed_) delete op;
  for (Op* op : in_flight_) delete op;
  // Slots and their words stay: a stream may still write or wait on them.
  for (Slot* s : free_) delete s;
  for (Slot* s : quarantine_) delete s;
}

Result<Engine::Slot*> Engine::take_slot_locked() {
  if (free_.empty()) {
    auto mem = alloc_(kSlotsPerChunk * sizeof(Words));
    if (!mem) {
      return std::unexpected(mem.error().context("stream-ordered operations: allocating " +
                                                 std::to_string(kSlotsPerChunk) + " doorbell slots"));
    }
    auto* words = static_cast<Words*>(*mem);
    for (size_t i = kSlotsPerChunk; i-- > 0;) {
      words[i] = Words{};
      free_.push_back(new Slot{&words[i], 0});
    }
    slots_total_ += kSlotsPerChunk;
  }
  Slot* s = free_.back();
  free_.pop_back();
  ++slots_used_;
  return s;
}

void Engine::free_slot_locked(Slot* s) {
  --slots_used_;
  free_.push_back(s);
}

void Engine::attach(const void* key, Target target) {
  std::lock_guard lock(mu_);
  for (auto& q : queues_) {
    if (q->key == key && !q->cancelled) return;  // known already
  }
  auto q = std::make_unique<Queue>();
  q->key = key;
  q->target = std::move(target);
  queues_.push_back(std::move(q));
}

void Engine::finish_op_locked(Op* op, uint32_t wc_status, int post_error, std::string error) {
  Words& w = *op->slot->w;
  store(w.status, wc_status, std::memory_order_relaxed);
  store(w.done, op->value, std::memory_order_release);
  op->info.state = OpInfo::kDone;
  op->info.wc_status = wc_status;
  op->info.post_error = post_error;
  op->info.error = std::move(error);
}

void Engine::drop_if_finished_locked(Op* op) {
  if (!op->settled || !op->released) return;
  if (!op->quarantined) free_slot_locked(op->slot);
  delete op;
}

void Engine::cancel(const void* key) {
  std::lock_guard lock(mu_);
  for (auto& q : queues_) {
    if (q->key != key || q->cancelled) continue;
    q->cancelled = true;
    std::erase_if(armed_, [&](Op* op) {
      if (op->queue != q.get()) return false;
      finish_op_locked(op, UFAB_WC_WR_FLUSH_ERR, -ECANCELED,
                       "cancelled: the QP was destroyed before the stream reached the operation");
      op->settled = true;
      // The stream will still write the doorbell: the slot waits for that
      // in quarantine (which frees it), not for the handle.
      op->quarantined = true;
      quarantine_.push_back(op->slot);
      if (op->released) delete op;
      return true;
    });
  }
}

void Engine::finish(const void* key) {
  std::lock_guard lock(mu_);
  for (auto it = queues_.begin(); it != queues_.end(); ++it) {
    Queue* q = it->get();
    if (q->key != key) continue;
    std::erase_if(in_flight_, [&](Op* op) {
      if (op->queue != q) return false;
      if (!reached(load(op->slot->w->done), op->value)) {
        finish_op_locked(op, UFAB_WC_WR_FLUSH_ERR, 0, "flushed: the QP was destroyed");
      } else {
        op->info.state = OpInfo::kDone;
        op->info.wc_status = load(op->slot->w->status);
      }
      op->settled = true;
      op->queue = nullptr;
      drop_if_finished_locked(op);
      return true;
    });
    for (Op* op : armed_) {
      if (op->queue == q) op->queue = nullptr;  // none: cancel() took them
    }
    queues_.erase(it);
    return;
  }
}

Result<Op*> Engine::post_send(const void* key, const ufab_send_wr* wrs, uint32_t n, Stream& stream) {
  if (wrs == nullptr || n == 0 || n > options_.max_batch) {
    return fail(EINVAL, "a stream-ordered send takes 1 to " + std::to_string(options_.max_batch) +
                            " work requests (" + std::to_string(n) + " given)");
  }
  size_t total_sge = 0;
  for (uint32_t i = 0; i < n; ++i) {
    const ufab_send_wr& wr = wrs[i];
    const std::string which = "work request " + std::to_string(i) + ": ";
    switch (wr.opcode) {
      case UFAB_WR_SEND:
      case UFAB_WR_SEND_WITH_IMM:
      case UFAB_WR_RDMA_WRITE:
      case UFAB_WR_RDMA_WRITE_WITH_IMM:
      case UFAB_WR_RDMA_READ: break;
      default:
        return fail(EINVAL, which + "stream-ordered operations are SEND, SEND_WITH_IMM, RDMA_WRITE, "
                                    "RDMA_WRITE_WITH_IMM and RDMA_READ (opcode " + std::to_string(wr.opcode) + ")");
    }
    if (wr.num_sge > UFAB_MAX_SGE || (wr.num_sge > 0 && wr.sg_list == nullptr)) {
      return fail(EINVAL, which + std::to_string(wr.num_sge) + " SGEs " +
                              (wr.num_sge > UFAB_MAX_SGE ? "(at most UFAB_MAX_SGE)" : "but sg_list is NULL"));
    }
    if (wr.send_flags & UFAB_SEND_COMMIT) {
      return fail(EINVAL, which + "UFAB_SEND_COMMIT is not taken in stream order (post it from the host)");
    }
    total_sge += wr.num_sge;
  }
  auto op = std::make_unique<Op>();
  op->wrs.assign(wrs, wrs + n);
  op->sges.reserve(total_sge);
  for (auto& wr : op->wrs) {
    const ufab_sge* from = wr.sg_list;
    wr.sg_list = op->sges.data() + op->sges.size();  // reserved: no reallocation
    op->sges.insert(op->sges.end(), from, from + wr.num_sge);
  }
  std::unique_lock lock(mu_);
  auto q = std::find_if(queues_.begin(), queues_.end(), [&](auto& x) { return x->key == key && !x->cancelled; });
  if (q == queues_.end()) return fail(ENOENT, "stream-ordered send: the QP is not known to the engine");
  auto slot = take_slot_locked();
  if (!slot) return std::unexpected(slot.error());
  op->queue = q->get();
  op->slot = *slot;
  op->value = ++op->slot->counter;
  // Armed before the stream gets the write (its doorbell cannot fire
  // before), so one thread's ops are armed in their stream order. The
  // stream call is made without the lock: enqueueing blocks while the
  // stream's queue is full, and the stream may be waiting on work only the
  // watcher (which needs the lock) can do.
  Op* raw = op.release();
  armed_.push_back(raw);
  start_locked();
  lock.unlock();
  auto s = stream.write_value(&raw->slot->w->doorbell, raw->value);
  if (!s) {
    lock.lock();
    // Nothing was enqueued. Unless QP teardown took it meanwhile (then
    // its slot waits in quarantine for a write that will not come: take
    // it back), the op goes.
    if (std::erase(armed_, raw) == 0) std::erase(quarantine_, raw->slot);
    free_slot_locked(raw->slot);
    delete raw;
    return std::unexpected(s.error().context("stream-ordered send: enqueuing the doorbell write"));
  }
  wake_.notify_one();
  return raw;
}

Result<Op*> Engine::post_recv(const void* key, const ufab_recv_wr* wrs, uint32_t n) {
  if (wrs == nullptr || n == 0 || n > options_.max_batch) {
    return fail(EINVAL, "a stream-ordered receive takes 1 to " + std::to_string(options_.max_batch) +
                            " work requests (" + std::to_string(n) + " given)");
  }
  std::unique_lock lock(mu_);
  auto q = std::find_if(queues_.begin(), queues_.end(), [&](auto& x) { return x->key == key && !x->cancelled; });
  if (q == queues_.end()) return fail(ENOENT, "stream-ordered receive: the QP is not known to the engine");
  auto slot = take_slot_locked();
  if (!slot) return std::unexpected(slot.error());
  auto op = std::make_unique<Op>();
  op->queue = q->get();
  op->slot = *slot;
  op->value = ++op->slot->counter;
  ufab_rdma_notify notify{.word = &op->slot->w->done, .status = &op->slot->w->status, .value = op->value, .reserved = 0};
  uint32_t bad = 0;
  if (int rc = op->queue->target.post_recv(wrs, n, &bad, &notify); rc < 0) {
    std::string why = op->queue->target.last_error ? op->queue->target.last_error() : "";
    free_slot_locked(op->slot);  // the provider took no notify
    return fail(-rc, "stream-ordered receive: work request " + std::to_string(bad) + " of " + std::to_string(n) +
                         " refused (the ones before it are posted, without a completion word): " + why);
  }
  op->info.state = OpInfo::kPosted;
  ++op->queue->in_flight;
  in_flight_.push_back(op.get());
  start_locked();
  lock.unlock();
  wake_.notify_one();
  return op.release();
}

Status Engine::wait(Op* op, Stream& stream) {
  if (op == nullptr) return fail(EINVAL, "stream wait: no operation");
  uint32_t* word = nullptr;
  uint32_t value = 0;
  {
    std::lock_guard lock(mu_);
    if (op->released) return fail(EINVAL, "stream wait: the operation was released");
    word = &op->slot->w->done;
    value = op->value;
  }
  // Without the lock (see post_send); a slot reused meanwhile only moves
  // the word past `value`.
  if (auto s = stream.wait_value(word, value); !s) {
    return std::unexpected(s.error().context("stream wait: enqueuing the wait"));
  }
  return {};
}

OpInfo Engine::query(const Op* op) const {
  std::lock_guard lock(mu_);
  OpInfo i = op->info;
  // A completion the watcher has not looked at yet counts as done.
  if (i.state == OpInfo::kPosted && reached(load(op->slot->w->done), op->value)) {
    i.state = OpInfo::kDone;
    i.wc_status = load(op->slot->w->status);
  }
  return i;
}

void Engine::release(Op* op) {
  if (op == nullptr) return;
  std::lock_guard lock(mu_);
  op->released = true;
  drop_if_finished_locked(op);
}

Engine::Counts Engine::counts() const {
  std::lock_guard lock(mu_);
  return {armed_.size(), in_flight_.size(), slots_used_, slots_total_, quarantine_.size()};
}

void Engine::start_locked() {
  if (!thread_.joinable()) thread_ = std::thread([this] { watcher(); });
}

void Engine::post_locked(Op* op) {
  Queue& q = *op->queue;
  ufab_rdma_notify notify{.word = &op->slot->w->done, .status = &op->slot->w->status, .value = op->value, .reserved = 0};
  uint32_t bad = 0;
  int rc = q.target.post_send(op->wrs.data(), static_cast<uint32_t>(op->wrs.size()), &bad, &notify);
  if (rc < 0) {
    std::string why = q.target.last_error ? q.target.last_error() : "";
    // The stream must not wait forever: the words say it failed.
    finish_op_locked(op, UFAB_WC_GENERAL_ERR, rc,
                     "posting when the stream reached it: work request " + std::to_string(bad) + " of " +
                         std::to_string(op->wrs.size()) + " refused (the ones before it are posted): " + why);
    op->settled = true;
    drop_if_finished_locked(op);
    return;
  }
  op->info.state = OpInfo::kPosted;
  ++q.in_flight;
  in_flight_.push_back(op);
}

bool Engine::round_locked() {
  bool did = false;
  // Doorbells, in enqueue order: one load each.
  if (!armed_.empty()) {
    std::vector<Op*> fired;
    std::erase_if(armed_, [&](Op* op) {
      if (!reached(load(op->slot->w->doorbell), op->value)) return false;
      fired.push_back(op);
      return true;
    });
    for (Op* op : fired) post_locked(op);
    did = did || !fired.empty();
  }
  // Progress where completions are awaited (a device without a progress
  // thread gets one here; one with a thread is only looked at sooner).
  for (auto& q : queues_) {
    if (q->in_flight > 0 && !q->cancelled && q->target.progress) q->target.progress();
  }
  std::erase_if(in_flight_, [&](Op* op) {
    if (!reached(load(op->slot->w->done), op->value)) return false;
    op->info.state = OpInfo::kDone;
    op->info.wc_status = load(op->slot->w->status);
    if (op->queue != nullptr) --op->queue->in_flight;
    op->settled = true;
    did = true;
    drop_if_finished_locked(op);
    return true;
  });
  std::erase_if(quarantine_, [&](Slot* s) {
    if (!reached(load(s->w->doorbell), s->counter)) return false;
    free_slot_locked(s);
    return true;
  });
  return did;
}

void Engine::watcher() {
  using Clock = std::chrono::steady_clock;
  std::unique_lock lock(mu_);
  Clock::time_point last = Clock::now();
  while (!stop_) {
    if (armed_.empty() && in_flight_.empty()) {
      // Nothing a stream can trigger: sleep, looking at quarantined slots
      // now and then.
      if (quarantine_.empty()) {
        wake_.wait(lock, [&] { return stop_ || !armed_.empty() || !in_flight_.empty() || !quarantine_.empty(); });
      } else {
        wake_.wait_for(lock, std::chrono::milliseconds(1));
        round_locked();
      }
      last = Clock::now();
      continue;
    }
    bool did = round_locked();
    lock.unlock();
    Clock::time_point now = Clock::now();
    if (did) {
      last = now;
    } else if (now - last > std::chrono::microseconds(options_.spin_us)) {
      std::this_thread::sleep_for(std::chrono::microseconds(options_.idle_sleep_us));
    } else {
      for (int i = 0; i < 16; ++i) cpu_relax();
    }
    lock.lock();
  }
}

}  // namespace ufab::streamops
