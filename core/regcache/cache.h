// A registration cache: registering the same range with the same access
// again is a lookup, not a registration. Entries are exact (address,
// length, access) matches, reference-counted while held; released ones
// stay registered until they are evicted (CLOCK, an approximation of least
// recently used, beyond max_entries or max_bytes) or their memory goes
// away:
//   - host memory: watched by the process's UnmapMonitor (userfaultfd
//     events for munmap, madvise(DONTNEED), brk, mremap); memory it cannot
//     watch (a file on a disk, a device mapping, no userfaultfd) is not
//     cached: registered on acquire and deregistered on release;
//   - GPU memory: keyed by its CUDA buffer id too, which the caller learns
//     at the address on every acquire (a freed or reallocated buffer
//     misses, and its stale entry is dropped).
// An entry invalidated while held is deregistered when its last holder
// releases it.
//
// Thread-safe. A hit and a release take no lock: a hit finds its entry in
// a direct-mapped table of atomic pointers and holds it with one
// compare-and-swap of the entry's state word (holders, hits, a CLOCK
// "referenced" bit, a dead bit and a generation); a release is one atomic
// decrement. Entries live in a pool for the life of the cache (a stale
// pointer always points at an Entry), and the generation, bumped each time
// an entry is reused, makes a hit on a reused entry fail.
// Cheaper still, each thread parks the last entry it released, keeping
// that hold: its next hit of the same range takes it back, and the release
// parks it again, with plain loads and stores (no atomic read-modify-write
// at all). The mutex holder takes parked holds back when it must evict and
// the hand found nothing else, and after it kills entries (unmapped
// memory, a stale GPU buffer), behind a process-wide memory barrier
// (membarrier(2)): a thread parking a dying entry, or taking its parked
// one, at that moment sees it (Parking in cache.cc). Without membarrier
// nothing is parked. The mutex is taken for misses, invalidation,
// eviction, the last release of a dead entry, and stats.
// docs/gpu.md ("Registration cache").
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/error.h"

namespace ufab::regcache {

class UnmapMonitor;

// What the cache registers with: the caller's registration and
// deregistration (ufab_mr_reg / ufab_mr_dereg, or a test's fake). Called
// with the cache's mutex held.
struct Registrar {
  // Registers [addr, addr + length) with `access`; an opaque handle back.
  std::function<Result<void*>(void* addr, uint64_t length, uint32_t access)> reg;
  std::function<void(void* handle)> dereg;
  // Optional: told which entry a new handle belongs to before any other
  // thread can hit it (the C API keeps it in its ufab_mr for the release).
  std::function<void(void* handle, void* entry)> bind;
};

struct Options {
  uint32_t max_entries = 1024;       // registrations kept (held ones count, and are never evicted)
  uint64_t max_bytes = 16ull << 30;  // bytes they cover
  // Watch host memory for unmapping (userfaultfd). false: host memory is
  // not cached at all (every acquire registers), for tests and for
  // processes that cannot have userfaultfd.
  bool watch_host = true;
  // Let each thread park the entry it released last (needs membarrier(2);
  // without it nothing is parked anyway). false: every hit is the
  // compare-and-swap path, for tests and comparisons.
  bool park_released = true;
};

struct Stats {
  uint64_t hits = 0;           // acquires answered from the cache
  uint64_t misses = 0;         // acquires that registered
  uint64_t uncached = 0;       // of the misses, memory that could not be cached (not watchable)
  uint64_t evictions = 0;      // entries deregistered to stay within the bounds
  uint64_t invalidations = 0;  // entries dropped because their memory went away (unmapped, GPU buffer freed)
  uint64_t entries = 0;        // registered now
  uint64_t bytes = 0;          // bytes those cover
  uint64_t held = 0;           // entries acquired and not released (a thread's parked hold is not one)
  uint64_t unparked = 0;       // parked holds the cache took back (to evict, or their entry died)
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
  // EOVERFLOW when one entry is already held kMaxHolds times.
  Result<Entry*> acquire(void* addr, uint64_t length, uint32_t access, std::optional<uint64_t> gpu_buffer);
  // The lock-free first look: a cached entry for exactly this range and
  // access, acquired, or nullptr (then ask acquire(), which also covers
  // everything this gives up on: unmap events not yet taken, a contended
  // entry). `gpu_buffer` 0: host memory, which needs no question about what
  // the memory is now: the monitor watches it, and an unmapping (which any
  // remapping, a GPU allocation's included, starts with) drops it. Else the
  // CUDA buffer id the caller has just learned at `addr`: only an entry of
  // that buffer hits.
  Entry* acquire_hit(void* addr, uint64_t length, uint32_t access, uint64_t gpu_buffer = 0);
  // Gives back one hold (lock-free unless it is the last hold of a dead
  // entry, or the cache is over its bounds), from any thread; the calling
  // thread may park it (keep it for its next hit). Each release matches
  // one acquire.
  void release(Entry* e);
  static void* handle(const Entry* e);

  Stats stats() const;
  bool busy() const;
  // "userfaultfd" when host memory is watched, else why it is not.
  const std::string& host_watch() const { return host_watch_; }

  static constexpr uint64_t kMaxHolds = (1u << 20) - 1;  // of one entry at once
  struct Parking;  // a thread's parked hold (cache.cc)

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

  Cache(Registrar registrar, Options options);
  size_t slot_of(uint64_t addr, uint64_t length, uint32_t access) const {
    uint64_t h = (addr ^ (length * 0x9E3779B97F4A7C15ull) ^ access) * 0xC2B2AE3D27D4EB4Full;
    return static_cast<size_t>(h >> slot_shift_);
  }
  bool events_pending() const;
  Parking* my_parking() const;
  void release_hold(Entry* e);  // gives back one hold through the state word
  void release_slow(Entry* e, uint64_t old_state);
  void release_locked(Entry* e);
  // Takes parked holds back (behind a membarrier): all of them (to evict),
  // or, after entries were killed, those of dead entries.
  void unpark_locked(bool only_dead);
  bool parked_taken_back(Parking* pk, Entry* p, uint64_t epoch);  // takes the mutex
  void unpark_dead(Parking* pk, Entry* e);                          // takes the mutex
  void park_here_locked();
  void clock_locked();  // one CLOCK sweep (two passes at most) while over the bounds
  void drain_events_locked();
  void invalidate_locked(uint64_t start, uint64_t end);
  void unpublish_locked(Entry* e);  // out of the map and the slot table
  void drop_locked(Entry* e);       // unpublished and dead: deregistered now or at its last release
  void destroy_locked(Entry* e);    // deregistered, back to the pool
  void evict_locked();
  Result<Entry*> hold_locked(Entry* e);  // a valid cached entry found: held once more
  Entry* new_entry_locked();

  Registrar reg_;
  Options options_;
  UnmapMonitor* monitor_ = nullptr;
  std::string host_watch_;
  // Lock-free side: the slot table, the unmap events taken so far, and
  // whether the cache is over its bounds (then releases try to evict).
  std::unique_ptr<std::atomic<Entry*>[]> slots_;
  size_t slot_count_ = 0;
  int slot_shift_ = 0;
  std::atomic<uint64_t> seen_seq_{0};
  std::atomic<bool> over_bound_{false};
  uint64_t uid_ = 0;       // this cache among all of the process's, for the threads' parking lookup
  std::atomic<bool> park_ok_{false};  // membarrier is there: threads park released entries
  // Under mu_:
  mutable std::mutex mu_;
  std::unordered_map<Key, Entry*, KeyHash> map_;
  std::vector<std::unique_ptr<Entry[]>> chunks_;  // the pool: entries are never freed before the cache
  std::vector<Entry*> all_;                       // every pool entry, in order: the CLOCK ring
  std::vector<Entry*> free_;
  size_t clock_hand_ = 0;
  std::vector<std::unique_ptr<Parking>> parkings_;  // one per thread that missed here; kept for the cache's life
  bool killed_ = false;                             // entries died since the last unpark_locked(true)
  uint64_t retired_hits_ = 0;  // hits of entries since destroyed, and hits folded out of state words
  Stats stats_;                // hits and held are counted from the entries in stats()
};

#ifdef UFAB_REGCACHE_TEST_HOOKS
// Built only into //core/regcache:regcache_test_hooks (tests): called by a
// hit between seeing its thread's parked entry and taking it back, so a
// test can have the mutex holder take it back right then.
namespace test_hooks {
extern void (*between_look_and_take)();
}
#endif

}  // namespace ufab::regcache
