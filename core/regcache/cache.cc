#include "core/regcache/cache.h"

#include <vector>

#include "core/regcache/unmap_monitor.h"

namespace ufab::regcache {

struct Cache::Entry {
  Key key;
  void* handle = nullptr;
  uint64_t gpu_buffer = 0;  // 0: host memory
  uint32_t refs = 0;
  bool cached = true;   // in map_ (false: dropped or never cacheable; deregistered at last release)
  bool in_lru = false;
  Entry* lru_prev = nullptr;
  Entry* lru_next = nullptr;
};

void Cache::lru_unlink(Entry* e) {
  (e->lru_prev ? e->lru_prev->lru_next : lru_head_) = e->lru_next;
  (e->lru_next ? e->lru_next->lru_prev : lru_tail_) = e->lru_prev;
  e->lru_prev = e->lru_next = nullptr;
  e->in_lru = false;
}

void Cache::lru_push_back(Entry* e) {
  e->lru_prev = lru_tail_;
  e->lru_next = nullptr;
  (lru_tail_ ? lru_tail_->lru_next : lru_head_) = e;
  lru_tail_ = e;
  e->in_lru = true;
}

Result<std::unique_ptr<Cache>> Cache::create(Registrar registrar, Options options) {
  if (!registrar.reg || !registrar.dereg) return fail(EINVAL, "registration cache: reg and dereg are required");
  if (options.max_entries == 0) return fail(EINVAL, "registration cache: max_entries is 0");
  std::unique_ptr<Cache> c(new Cache(std::move(registrar), options));
  if (options.watch_host) {
    auto m = UnmapMonitor::get();
    if (m) {
      c->monitor_ = *m;
      c->seen_seq_ = (*m)->sequence();
      c->host_watch_ = "userfaultfd";
    } else {
      c->host_watch_ = m.error().message();
    }
  } else {
    c->host_watch_ = "off (Options::watch_host = false): host memory is not cached";
  }
  return c;
}

Cache::~Cache() {
  std::lock_guard lock(mu_);
  std::vector<Entry*> all;
  for (auto& [k, e] : map_) all.push_back(e);
  map_.clear();
  lru_head_ = lru_tail_ = nullptr;
  for (Entry* e : all) {
    reg_.dereg(e->handle);
    delete e;
  }
}

void* Cache::handle(const Entry* e) { return e->handle; }

void Cache::destroy_locked(Entry* e) {
  reg_.dereg(e->handle);
  stats_.entries--;
  stats_.bytes -= e->key.length;
  delete e;
}

void Cache::drop_locked(Entry* e) {
  if (e->cached) {
    map_.erase(e->key);
    e->cached = false;
  }
  if (e->in_lru) lru_unlink(e);
  if (e->refs == 0) destroy_locked(e);
}

void Cache::invalidate_locked(uint64_t start, uint64_t end) {
  std::vector<Entry*> hit;
  for (auto& [k, e] : map_) {
    if (e->gpu_buffer == 0 && k.addr < end && start < k.addr + k.length) hit.push_back(e);
  }
  for (Entry* e : hit) {
    stats_.invalidations++;
    drop_locked(e);
  }
}

void Cache::drain_events_locked() {
  if (monitor_ == nullptr) return;
  uint64_t now = monitor_->sequence();
  if (now == seen_seq_) return;
  for (uint64_t s = seen_seq_; s < now; ++s) {
    Range r;
    if (!monitor_->event(s, &r)) {
      // Fell behind the ring: whatever was unmapped is unknown, so every
      // host entry goes.
      invalidate_locked(0, UINT64_MAX);
      break;
    }
    invalidate_locked(r.start, r.end);
  }
  seen_seq_ = now;
}

void Cache::evict_locked() {
  while ((stats_.entries > options_.max_entries || stats_.bytes > options_.max_bytes) && lru_head_ != nullptr) {
    Entry* e = lru_head_;
    stats_.evictions++;
    drop_locked(e);
  }
}

Cache::Entry* Cache::hit_locked(Entry* e) {
  if (e->in_lru) lru_unlink(e);
  if (e->refs++ == 0) stats_.held++;
  stats_.hits++;
  return e;
}

Cache::Entry* Cache::acquire_host_hit(void* addr, uint64_t length, uint32_t access) {
  std::lock_guard lock(mu_);
  drain_events_locked();
  auto it = map_.find(Key{reinterpret_cast<uintptr_t>(addr), length, access});
  if (it == map_.end() || it->second->gpu_buffer != 0) return nullptr;
  return hit_locked(it->second);
}

Result<Cache::Entry*> Cache::acquire(void* addr, uint64_t length, uint32_t access, std::optional<uint64_t> gpu_buffer) {
  std::lock_guard lock(mu_);
  drain_events_locked();
  Key key{reinterpret_cast<uintptr_t>(addr), length, access};
  if (auto it = map_.find(key); it != map_.end()) {
    Entry* e = it->second;
    // GPU entries: the allocation at the address must be the one
    // registered (a freed buffer's memory may be given out again).
    bool valid = e->gpu_buffer == 0 ? !gpu_buffer.has_value() : gpu_buffer && *gpu_buffer == e->gpu_buffer;
    if (valid) return hit_locked(e);
    stats_.invalidations++;
    drop_locked(e);
  }
  stats_.misses++;
  const bool gpu = gpu_buffer.has_value();
  // Host memory is cached only when the monitor watches it.
  bool cacheable = gpu;
  if (!gpu && monitor_ != nullptr) cacheable = static_cast<bool>(monitor_->watch(key.addr, key.addr + length));
  if (!cacheable) stats_.uncached++;
  auto h = reg_.reg(addr, length, access);
  if (!h) return std::unexpected(h.error());
  auto* e = new Entry{.key = key, .handle = *h, .gpu_buffer = gpu ? *gpu_buffer : 0, .refs = 1, .cached = cacheable};
  stats_.entries++;
  stats_.bytes += length;
  stats_.held++;
  if (cacheable) map_.emplace(key, e);
  evict_locked();
  return e;
}

void Cache::release(Entry* e) {
  std::lock_guard lock(mu_);
  if (--e->refs != 0) return;
  stats_.held--;
  if (!e->cached) {
    destroy_locked(e);
    return;
  }
  lru_push_back(e);
  drain_events_locked();  // its memory may already be gone
  evict_locked();
}

Stats Cache::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

bool Cache::busy() const {
  std::lock_guard lock(mu_);
  return stats_.held != 0;
}

}  // namespace ufab::regcache
