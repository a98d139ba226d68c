// A registration cache: registering the same range with the same access
// again is a lookup, not a registration. Entries are exact (address,
// length, access) matches, reference-counted while held; released ones
// stay registered until they are evicted (least recently used, beyond
// max_entries or max_bytes) or their memory goes away:
//   - host memory: watched by the process's UnmapMonitor (userfaultfd
//     events for munmap, madvise(DONTNEED), brk, mremap); memory it cannot
//     watch (a file on a disk, a device mapping, no userfaultfd) is not
//     cached: registered on acquire and deregistered on release;
//   - GPU memory: keyed by its CUDA buffer id too, which the caller learns
//     at the address on every acquire (a freed or reallocated buffer
//     misses, and its stale entry is dropped).
// An entry invalidated while held is deregistered when its last holder
// releases it. Thread-safe (one mutex). docs/gpu.md.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "base/error.h"

namespace ufab::regcache {

class UnmapMonitor;

// What the cache registers with: the caller's registration and
// deregistration (ufab_mr_reg / ufab_mr_dereg, or a test's fake).
struct Registrar {
  // Registers [addr, addr + length) with `access`; an opaque handle back.
  std::function<Result<void*>(void* addr, uint64_t length, uint32_t access)> reg;
  std::function<void(void* handle)> dereg;
};

struct Options {
  uint32_t max_entries = 1024;       // registrations kept (held ones count, and are never evicted)
  uint64_t max_bytes = 16ull << 30;  // bytes they cover
  // Watch host memory for unmapping (userfaultfd). false: host memory is
  // not cached at all (every acquire registers), for tests and for
  // processes that cannot have userfaultfd.
  bool watch_host = true;
};

struct Stats {
  uint64_t hits = 0;           // acquires answered from the cache
  uint64_t misses = 0;         // acquires that registered
  uint64_t uncached = 0;       // of the misses, memory that could not be cached (not watchable)
  uint64_t evictions = 0;      // entries deregistered to stay within the bounds
  uint64_t invalidations = 0;  // entries dropped because their memory went away (unmapped, GPU buffer freed)
  uint64_t entries = 0;        // registered now
  uint64_t bytes = 0;          // bytes those cover
  uint64_t held = 0;           // entries acquired and not released
};

class Cache {
 public:
  struct Entry;  // opaque to users: handle() gives the registration

  static Result<std::unique_ptr<Cache>> create(Registrar registrar, Options options = {});
  // Deregisters every entry; entries still held are deregistered too (the
  // owner must release before destroying: busy() says whether any is).
  ~Cache();
  Cache(const Cache&) = delete;
  Cache& operator=(const Cache&) = delete;

  // A registration covering exactly [addr, addr + length) with `access`,
  // held until release(). `gpu_buffer`: the memory is GPU memory of that
  // CUDA buffer id, which the caller has just learned at `addr` (an entry
  // under another id is stale: dropped), nullopt for host memory.
  Result<Entry*> acquire(void* addr, uint64_t length, uint32_t access, std::optional<uint64_t> gpu_buffer);
  // The cheap first look: a cached host-memory entry for exactly this range
  // and access, acquired, or nullptr (then ask acquire()). A host entry
  // needs no question about what the memory is now: the monitor watches
  // it, and an unmapping (which any remapping, a GPU allocation's
  // included, starts with) drops it.
  Entry* acquire_host_hit(void* addr, uint64_t length, uint32_t access);
  void release(Entry* e);
  static void* handle(const Entry* e);

  Stats stats() const;
  bool busy() const;
  // "userfaultfd" when host memory is watched, else why it is not.
  const std::string& host_watch() const { return host_watch_; }

 private:
  struct Key {
    uint64_t addr, length;
    uint32_t access;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      uint64_t h = k.addr * 0x9E3779B97F4A7C15ull ^ (k.length + 0x632BE59BD9B4E019ull) * 0xC2B2AE3D27D4EB4Full;
      return static_cast<size_t>(h ^ (h >> 29) ^ k.access);
    }
  };

  Cache(Registrar registrar, Options options) : reg_(std::move(registrar)), options_(options) {}
  void drain_events_locked();
  void invalidate_locked(uint64_t start, uint64_t end);
  void drop_locked(Entry* e);  // out of the map; deregistered now or at its last release
  void destroy_locked(Entry* e);
  void evict_locked();
  Entry* hit_locked(Entry* e);  // a valid entry found: held once more
  void lru_unlink(Entry* e);
  void lru_push_back(Entry* e);

  Registrar reg_;
  Options options_;
  UnmapMonitor* monitor_ = nullptr;
  std::string host_watch_;
  mutable std::mutex mu_;
  std::unordered_map<Key, Entry*, KeyHash> map_;
  // Released entries, least recently used first: a list through the
  // entries themselves (a release allocates nothing).
  Entry* lru_head_ = nullptr;
  Entry* lru_tail_ = nullptr;
  uint64_t seen_seq_ = 0;
  Stats stats_;
};

}  // namespace ufab::regcache
