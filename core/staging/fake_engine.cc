#include "core/staging/fake_engine.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

namespace ufab::staging {

namespace {
std::atomic<bool> g_hold{false};
std::atomic<uint64_t> g_completed{0};
std::atomic<uint64_t> g_queued{0};
std::mutex g_freed_mu;
std::vector<std::pair<uint64_t, uint64_t>> g_freed;  // [begin, end)
std::atomic<bool> g_any_freed{false};
}  // namespace

void fake_free(const void* p, size_t n) {
  std::lock_guard<std::mutex> g(g_freed_mu);
  const auto a = reinterpret_cast<uint64_t>(p);
  g_freed.emplace_back(a, a + n);
  g_any_freed.store(true);
}
void fake_unfree_all() {
  std::lock_guard<std::mutex> g(g_freed_mu);
  g_freed.clear();
  g_any_freed.store(false);
}
bool fake_freed(uint64_t addr) {
  if (!g_any_freed.load(std::memory_order_relaxed)) return false;
  std::lock_guard<std::mutex> g(g_freed_mu);
  for (auto [b, e] : g_freed) {
    if (addr >= b && addr < e) return true;
  }
  return false;
}

void fake_hold(bool hold) { g_hold.store(hold); }
uint64_t fake_completed() { return g_completed.load(); }
uint64_t fake_queued() { return g_queued.load(); }

FakeCopyEngine::FakeCopyEngine(const FakeOptions& options)
    : options_(options), word_storage_(kTickets, kDone), rng_(options.seed) {
  words_ = word_storage_.data();
}

Result<std::unique_ptr<FakeCopyEngine>> FakeCopyEngine::create(const FakeOptions& options) {
  std::unique_ptr<FakeCopyEngine> e(new FakeCopyEngine(options));
  e->thread_ = std::thread([p = e.get()] { p->run(); });
  return e;
}

FakeCopyEngine::~FakeCopyEngine() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Result<void*> FakeCopyEngine::alloc_host(size_t bytes) {
  void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  if (p == nullptr) return fail(ENOMEM, "fake copy engine: no memory for " + std::to_string(bytes) + " bytes of slots");
  return p;
}

void FakeCopyEngine::free_host(void* p) { std::free(p); }

void FakeCopyEngine::queue_locked(Job&& job) {
  const bool copy = !job.after;
  queue_.push_back(Queued{std::move(job), std::chrono::steady_clock::now() + options_.delay});
  if (copy) g_queued.fetch_add(1);
}

void FakeCopyEngine::run() {
  std::unique_lock lock(mu_);
  while (true) {
    if (stop_) break;
    if (queue_.empty() || g_hold.load()) {
      cv_.wait_for(lock, std::chrono::microseconds(200));
      continue;
    }
    if (queue_.front().job.after) {
      // Everything before it is done: it runs now.
      Queued q = std::move(queue_.front());
      queue_.erase(queue_.begin());
      lock.unlock();
      q.job.after();
      lock.lock();
      continue;
    }
    const auto now = std::chrono::steady_clock::now();
    std::vector<size_t> due;
    for (size_t i = 0; i < queue_.size() && !queue_[i].job.after; ++i) {
      if (queue_[i].due <= now) due.push_back(i);
    }
    if (due.empty()) {
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(20));
      lock.lock();
      continue;
    }
    size_t pick = options_.random_order ? due[std::uniform_int_distribution<size_t>(0, due.size() - 1)(rng_)] : due[0];
    Queued q = std::move(queue_[pick]);
    queue_.erase(queue_.begin() + static_cast<ptrdiff_t>(pick));
    lock.unlock();
    std::string why = q.job.prepare ? q.job.prepare(q.job.segments) : std::string();
    if (why.empty()) {
      for (const CopySegment& s : q.job.segments) std::memcpy(s.dst, s.src, s.bytes);
    }
    g_queued.fetch_sub(1);
    g_completed.fetch_add(1);
    finish(q.job.ticket, why.empty(), why);
    lock.lock();
  }
  // Copies still queued at the end are done now: slots and flags are freed after.
  for (Queued& q : queue_) {
    if (q.job.after) {
      q.job.after();
      continue;
    }
    std::string why = q.job.prepare ? q.job.prepare(q.job.segments) : std::string();
    if (why.empty()) {
      for (const CopySegment& s : q.job.segments) std::memcpy(s.dst, s.src, s.bytes);
    }
    g_queued.fetch_sub(1);
    finish(q.job.ticket, why.empty(), why);
  }
  queue_.clear();
}

}  // namespace ufab::staging
