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
// Cheaper still, each thread parks the entries it released, keeping those
// holds (up to 16 per cache, one per slot of its parking, by address): its
// next hit of the same range takes the hold back, and the release parks it
// again, with plain loads and stores (no atomic read-modify-write at all). The mutex holder takes parked holds back when it must evict and
// the hand found nothing else, and after it kills entries (unmapped
// memory, a stale GPU buffer), behind a process-wide memory barrier
// (membarrier(2)): a thread parking a dying entry, or taking its parked
// one, at that moment sees it (Parking, below the class). Without membarrier
// nothing is parked. The mutex is taken for misses, invalidation,
// eviction, the last release of a dead entry, and stats.
// The parked hit and release are inline (below the class), so a caller's
// hit is a few loads and stores with no call; everything else is out of
// line in cache.cc.
// docs/gpu.md ("Registration cache").
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
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
  // Let each thread park the entries it released (needs membarrier(2);
  // without it nothing is parked anyway). false: every hit is the
  // compare-and-swap path, for tests and comparisons.
  bool park_released = true;
  // A count of the CUDA calls that can free GPU memory (gpu::watch_frees(),
  // opt-in), or nullptr. With it, a GPU entry checked when the count was N
  // hits host-style (no CUDA question) while the count is still N:
  // gpu_checked().
  const std::atomic<uint64_t>* gpu_events = nullptr;
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
  uint64_t parked_hits = 0;    // of the hits, those that took the thread's parked hold back
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
  // Inline: hit_parked(), then hit_rest().
  Entry* acquire_hit(void* addr, uint64_t length, uint32_t access, uint64_t gpu_buffer = 0);
  // acquire_hit() in two, for callers that want the first part inline and
  // nothing else (no call, so no frame): the thread's parked entry when it
  // is this one (inline, below the class), else nullptr; then hit_rest()
  // (out of line), which must follow a nullptr from hit_parked() before
  // this thread's next hit or release of this cache (it also settles a
  // parked hold that hit_parked() took but could not keep).
  Entry* hit_parked(void* addr, uint64_t length, uint32_t access, uint64_t gpu_buffer = 0);
  Entry* hit_rest(void* addr, uint64_t length, uint32_t access, uint64_t gpu_buffer = 0);
  // Gives back one hold (lock-free unless it is the last hold of a dead
  // entry, or the cache is over its bounds), from any thread; the calling
  // thread may park it (keep it for its next hit). Each release matches
  // one acquire. Inline: parking (below the class).
  void release(Entry* e);
  // release(), returning 0 (also from the out-of-line parts it ends in),
  // for a C caller whose `return` of it is then a tail call: no frame.
  int release0(Entry* e);
  static void* handle(const Entry* e);  // inline

  Stats stats() const;
  bool busy() const;
  // "userfaultfd" when host memory is watched, else why it is not.
  const std::string& host_watch() const { return host_watch_; }
  const std::atomic<uint64_t>* gpu_events() const { return gpu_events_; }
  // The caller found `e` (a GPU entry) to be its buffer still, by a CUDA
  // question asked after reading gpu_events() as `count`: until the count
  // moves, a hit on its range takes it without asking (hit_parked()).
  static void gpu_checked(Entry* e, uint64_t count);

  static constexpr uint64_t kMaxHolds = (1u << 20) - 1;  // of one entry at once
  struct Parking;   // a thread's parked holds (below the class)
  struct ParkSlot;  // one of them

  // Whether create() would accept these.
  static Status check(const Registrar& registrar, const Options& options);

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

 protected:
  // For a caller that embeds the cache (the C API's ufab_mr_cache derives
  // from it, so a hit reads the cache's fields with no pointer to follow);
  // check() first.
  Cache(Registrar registrar, Options options);

 private:
  size_t slot_of(uint64_t addr, uint64_t length, uint32_t access) const {
    uint64_t h = (addr ^ (length * 0x9E3779B97F4A7C15ull) ^ access) * 0xC2B2AE3D27D4EB4Full;
    return static_cast<size_t>(h >> slot_shift_);
  }
  Parking* my_parking() const;
  // Out of line, behind the inline hit and release:
  Entry* hit_shared(uint64_t addr, uint64_t length, uint32_t access, uint64_t gpu_buffer);  // the slot table's CAS
  bool gpu_unchanged(const Entry* p, uint64_t gpu_buffer) const;
  [[gnu::cold]] Entry* hit_settle(Parking* pk, unsigned off, uint64_t addr, uint64_t length, uint32_t access,
                                  uint64_t gpu_buffer);  // after hit_parked() left a hold in the slot's `taking`
  int release_hold(Entry* e);  // gives back one hold through the state word; 0
  void release_slow(Entry* e, uint64_t old_state);
  void release_locked(Entry* e);
  // Takes parked holds back (behind a membarrier): all of them (to evict),
  // or, after entries were killed, those of dead entries.
  void unpark_locked(bool only_dead);
  // Both take the mutex. `slot`: where the thread took or parked `p`
  // (not from p->park_off: taken back meanwhile, p may have been
  // destroyed and reused for another range by now).
  bool parked_taken_back(ParkSlot& slot, Entry* p, uint64_t epoch);
  int unpark_dead(ParkSlot& slot, Entry* e);  // 0
  void park_here_locked();
  void set_over_bound(bool over);
  void set_release_flags(uint32_t flags);  // and release_key_
  void clock_locked();  // one CLOCK sweep (two passes at most) while over the bounds
  void drain_events_locked();
  void invalidate_locked(uint64_t start, uint64_t end);
  void unpublish_locked(Entry* e);  // out of the map and the slot table
  void drop_locked(Entry* e);       // unpublished and dead: deregistered now or at its last release
  void destroy_locked(Entry* e);    // deregistered, back to the pool
  void evict_locked();
  Result<Entry*> hold_locked(Entry* e);  // a valid cached entry found: held once more
  Entry* new_entry_locked();

  // What a hit and a release read, together on one cache line (written
  // only under the mutex, and rarely):
  //   events_: the unmap monitor's event word (UnmapMonitor::events(): its
  //   sequence number shifted left once, the low bit set while its reader
  //   is recording), or a word that stays 0 where host memory is not
  //   watched; seen_events_: that word as of the last events this cache
  //   took (even). They differ: unmappings not taken yet.
  //   uid_: this cache among all of the process's, for the threads'
  //   parking lookup (detail::parking_slot_of), never 0, a multiple of 16.
  //   release_key_: uid_ while a release may park, else uid_ with the top
  //   bit set (the same thread-local slot, whose uid never equals it): one
  //   compare of the release is both "may park" and "this thread's
  //   parking".
  //   release_flags_: why a release may not park: kOverBound (the cache is
  //   over its bounds: releases try to evict), kNoParking (no membarrier,
  //   or Options::park_released off).
  static constexpr uint32_t kOverBound = 1, kNoParking = 2;
  static constexpr uint64_t kNoPark = 1ull << 63;
  alignas(64) const std::atomic<uint64_t>* events_ = nullptr;
  const std::atomic<uint64_t>* gpu_events_ = nullptr;  // Options::gpu_events (on the hit's line)
  std::atomic<uint64_t> seen_events_{0};
  uint64_t uid_ = 0;
  std::atomic<uint64_t> release_key_{0};
  std::atomic<uint32_t> release_flags_{0};
  int slot_shift_ = 0;
  std::atomic<Entry*>* slot_table_ = nullptr;  // slots_'s array

  Registrar reg_;
  Options options_;
  UnmapMonitor* monitor_ = nullptr;
  std::string host_watch_;
  std::unique_ptr<std::atomic<Entry*>[]> slots_;  // the slot table (the lock-free hit's)
  size_t slot_count_ = 0;
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
// unpark_locked() acts as if membarrier(2) failed.
extern bool membarrier_fails;
}
#endif

// ---------------------------------------------------------------------------
// Internals the inline hit and release need (cache.cc has the rest).

namespace detail {
// An entry's state word:
//   bits  0-19  holders (refs)
//   bits 20-39  hits since they were last folded into the cache's count
//   bit  40     referenced (CLOCK): set by every hit, cleared by the hand
//   bit  41     dead: no hit may hold it any more; the party that sees it
//               dead with no holders (the one that killed it, or its last
//               releaser) deregisters it
//   bits 42-63  generation, bumped each time the pool entry is reused
// Only holders, hits and referenced change without the mutex (a hit's
// compare-and-swap, a release's decrement); dead and the generation
// change only under it.
inline constexpr uint64_t kRefOne = 1;
inline constexpr uint64_t kRefMask = (1ull << 20) - 1;
inline constexpr int kHitShift = 20;
inline constexpr uint64_t kHitOne = 1ull << kHitShift;
inline constexpr uint64_t kHitMask = ((1ull << 20) - 1) << kHitShift;
inline constexpr uint64_t kReferenced = 1ull << 40;
inline constexpr int kDeadBit = 41;
inline constexpr uint64_t kDead = 1ull << kDeadBit;
inline constexpr uint64_t kGenOne = 1ull << 42;

// Holds a thread keeps parked per cache, and the slot an entry parks in,
// by its address: the page number times a multiplier with a bit every
// four places, top four bits. Ranges that lie 2^k pages apart fill
// distinct slots (the product's top bits are their index, rotated, plus
// at most a carry), so a thread cycling through 8 such buffers keeps a
// hold on each (through 16, on all but one or two). (Entries of one address with other lengths or
// access share a slot: the one parked first keeps it.)
inline constexpr unsigned kParkSlots = 16;
inline unsigned park_slot_of(uint64_t addr) {
  return static_cast<unsigned>(((addr >> 12) * 0x1111111111111111ull) >> 60);
}
// The same as a byte offset into Parking::slot (64-byte slots).
inline unsigned park_off_of(uint64_t addr) { return park_slot_of(addr) * 64; }
// Whether atomic word `w` holds `v` now, and whether bit `bit` of it is
// set: acquire loads, compared in place (x86: one cmp or bt with a memory
// operand, where gcc loads an atomic into a register first; every x86
// load is an acquire load, and the "memory" clobber keeps the compiler
// from moving later loads above it). Under ThreadSanitizer, or elsewhere,
// the atomic load.
template <class T>
[[gnu::always_inline]] inline bool word_is(const std::atomic<T>& w, T v) {
#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
  static_assert(sizeof w == sizeof(uint64_t) && std::atomic<T>::is_always_lock_free);
  bool eq;
  asm volatile("cmpq %2, %1" : "=@cce"(eq) : "m"(w), "re"(v) : "memory");
  return eq;
#else
  return w.load(std::memory_order_acquire) == v;
#endif
}
template <int bit>
[[gnu::always_inline]] inline bool bit_is_set(const std::atomic<uint64_t>& w) {
#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
  bool set;
  asm volatile("btq %2, %1" : "=@ccc"(set) : "m"(w), "J"(bit) : "memory");
  return set;
#else
  return (w.load(std::memory_order_acquire) >> bit) & 1;
#endif
}
}  // namespace detail

// A pool entry, on a cache line of its own (a hit reads its key, state and
// handle; nothing another thread writes often shares the line).
struct alignas(64) Cache::Entry {
  std::atomic<uint64_t> state{detail::kDead};
  // The key: written under the mutex while the entry is dead (no holders),
  // read by the slot table's hit without it, which may read a reused
  // entry's and then fail its compare-and-swap on the new generation:
  // those accesses are atomic (std::atomic_ref). A holder (a parked hit:
  // the thread holds its parked entry) and the mutex holder read them
  // plainly: no write can come while either looks, so the compiler may
  // compare them in place (a relaxed atomic load is a separate
  // instruction for gcc).
  uint64_t addr = 0, length = 0, gpu_buffer = 0;  // gpu_buffer 0: host memory
  uint32_t access = 0;
  uint16_t park_off = 0;   // park_off_of(addr): where a thread parks it
  void* handle = nullptr;  // written before the entry is published, read by its holders
  // Cache::gpu_checked(): the free-watch count this GPU entry was last found
  // valid at (kNeverChecked: never, or no watch).
  static constexpr uint64_t kNeverChecked = ~uint64_t{0};
  std::atomic<uint64_t> gpu_count{kNeverChecked};
  // Under the mutex:
  bool live = false;    // registered (in use from the pool)
  bool cached = false;  // in map_ and maybe a slot
  Key key() const { return Key{addr, length, access}; }  // under the mutex, or by a holder
  // Without the mutex, on an entry that may be reused meanwhile.
  bool is_racy(uint64_t a, uint64_t n, uint32_t acc, uint64_t gpu) const {
    return racy(addr) == a && racy(length) == n && racy(access) == acc && racy(gpu_buffer) == gpu;
  }
  // Written under the mutex while the entry is dead.
  void set_key(uint64_t a, uint64_t n, uint32_t acc, uint64_t gpu) {
    std::atomic_ref<uint64_t>(addr).store(a, std::memory_order_relaxed);
    std::atomic_ref<uint64_t>(length).store(n, std::memory_order_relaxed);
    std::atomic_ref<uint32_t>(access).store(acc, std::memory_order_relaxed);
    std::atomic_ref<uint64_t>(gpu_buffer).store(gpu, std::memory_order_relaxed);
    gpu_count.store(kNeverChecked, std::memory_order_relaxed);  // checked again by its new owner
    park_off = static_cast<uint16_t>(detail::park_off_of(a));  // read by holders only
  }
  // By a holder.
  // (The buffer id is compared by Cache::gpu_unchanged().)
  bool is_held(uint64_t a, uint64_t n, uint32_t acc) const { return addr == a && length == n && access == acc; }

 private:
  template <class T>
  static T racy(const T& field) {
    return std::atomic_ref<T>(const_cast<T&>(field)).load(std::memory_order_relaxed);
  }
};

// A thread's parked holds, kParkSlots of them, each entry in the slot its
// address hashes to (park_slot_of). Its thread parks and takes back with
// plain stores; the mutex holder takes them back with compare-and-swaps,
// with the slot's `epoch` odd (each slot has its own; only the mutex
// holder writes them) and behind a membarrier, so that a thread taking a
// hold at the same moment sees the epoch move (then it asks, under the
// mutex, whether its entry was taken: `stolen`). One cache line per slot,
// everything a hit or a release of that slot touches at constant offsets
// from the slot's address (one register for all of it).
struct alignas(64) Cache::ParkSlot {
  std::atomic<Entry*> parked{nullptr};  // a hold; only its thread stores non-null
  std::atomic<uint64_t> epoch{0};       // odd while the mutex holder takes parked holds back
  std::atomic<uint64_t> hits{0};        // hits through this slot's parked holds; written by its thread only
  // Its thread's only: a parked hold hit_parked() took (stored null)
  // but found the epoch moved, or of another range; hit_rest() (or
  // acquire()) settles it.
  Entry* taking = nullptr;
  uint64_t taking_epoch = 0;
  // Under the mutex: the last entry taken back from this slot, and the
  // epoch (odd) then.
  Entry* stolen = nullptr;
  uint64_t stolen_epoch = 0;
};

struct alignas(64) Cache::Parking {
  using Slot = ParkSlot;
  Slot slot[detail::kParkSlots];
  std::thread::id owner;
  // The slot at byte offset `off` (Entry::park_off, park_off_of()).
  Slot& at(unsigned off) { return *reinterpret_cast<Slot*>(reinterpret_cast<char*>(slot) + off); }
};

namespace detail {
// Each thread's parkings of the caches it used lately, by cache uid (a uid
// is never reused, so a destroyed cache's slot is never followed). Plain
// thread-local data (__thread: no constructor, no access wrapper), in the
// initial-exec model: one %fs-relative load where libufab.so is a shared
// object, not a call to __tls_get_addr. (A library loaded with dlopen takes
// it from glibc's surplus of static TLS, which is there for this: 128
// bytes.)
// A slot's uid is 0 (never a cache's) until its thread parks there, and
// its parking then never null. Caches' uids step by sizeof(ParkingSlot),
// so a cache's slot is at byte offset uid & 0x70: no shift.
struct ParkingSlot {
  uint64_t uid;
  Cache::Parking* parking;
};
inline constexpr size_t kParkingSlots = 8;
extern __thread ParkingSlot tl_parkings[kParkingSlots] __attribute__((tls_model("initial-exec")));
[[gnu::always_inline]] inline ParkingSlot& parking_slot_of(uint64_t uid) {
  return tl_parkings[(uid / sizeof(ParkingSlot)) % kParkingSlots];
}
// Adds one to a counter that only the calling thread writes (others read
// it): one instruction (x86's add to memory), where gcc makes a relaxed
// load and store three. A reader's load sees the old or the new value
// (aligned 8 bytes). Under ThreadSanitizer, or elsewhere, the plain
// load and store (an asm statement is invisible to TSan).
[[gnu::always_inline]] inline void bump_own(std::atomic<uint64_t>& n) {
#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
  static_assert(sizeof n == sizeof(uint64_t));
  asm("addq $1, %0" : "+m"(n));
#else
  n.store(n.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
#endif
}
}  // namespace detail

inline void* Cache::handle(const Entry* e) { return e->handle; }

[[gnu::always_inline]] inline Cache::Parking* Cache::my_parking() const {
  const detail::ParkingSlot& slot = detail::parking_slot_of(uid_);
  return slot.uid == uid_ ? slot.parking : nullptr;
}

[[gnu::always_inline]] inline Cache::Entry* Cache::hit_parked(void* addr, uint64_t length, uint32_t access,
                                                              uint64_t gpu_buffer) {
  // Unmappings not yet taken (or being recorded): the slow path takes them
  // first.
  if (!detail::word_is(seen_events_, events_->load(std::memory_order_acquire))) [[unlikely]] {
    return nullptr;
  }
  const detail::ParkingSlot& ps = detail::parking_slot_of(uid_);
  if (ps.uid != uid_) [[unlikely]] return nullptr;  // no parking for this cache here (yet)
  // The entry this thread parked in the slot of this address, taken back
  // with a plain store; the mutex holder makes the slot's epoch odd and
  // runs membarrier before it looks, so either it sees the store (and
  // leaves the hold alone) or the epoch read after the store has moved
  // (and the mutex says who has the hold: hit_rest() asks). An odd epoch
  // (the mutex holder is at it now) is taken as moved: `epoch` is what
  // was read with its low bit cleared, which the epoch read after the
  // store cannot equal.
  const uint64_t a = reinterpret_cast<uintptr_t>(addr);
  Parking::Slot& slot = ps.parking->at(detail::park_off_of(a));
  const uint64_t epoch = slot.epoch.load(std::memory_order_acquire) & ~uint64_t{1};
  Entry* p = slot.parked.load(std::memory_order_acquire);
  if (p == nullptr) [[unlikely]] return nullptr;
#ifdef UFAB_REGCACHE_TEST_HOOKS
  if (test_hooks::between_look_and_take != nullptr) test_hooks::between_look_and_take();
#endif
  slot.parked.store(nullptr, std::memory_order_relaxed);
  std::atomic_signal_fence(std::memory_order_seq_cst);  // the store above, then the load below
  // No look at p's state: an entry dies only under the mutex, whose
  // holder then takes the parked holds of dead entries back
  // (unpark_locked, behind membarrier) before it lets the mutex go (and,
  // for an unmapping, before seen_events_ moves). So a hit that sees no
  // epoch move took its hold before that barrier: it is concurrent with
  // the death, as if it came just before (its release sees the entry dead
  // and gives the hold up). Should membarrier ever fail, the epochs stay
  // odd, and every take goes through hit_rest(), which looks.
  // The key is compared only now, when the hold is this thread's: p's key
  // cannot change while it is held, so it is read in place (before the
  // take, the mutex holder could have taken p back and reused it). Another
  // range parked in this slot (the same address, or a colliding one) is
  // left to hit_rest(), which parks it again.
  if (!detail::word_is(slot.epoch, epoch) || !p->is_held(a, length, access) ||
      !gpu_unchanged(p, gpu_buffer)) [[unlikely]] {
    slot.taking = p;
    slot.taking_epoch = epoch;
    return nullptr;
  }
  detail::bump_own(slot.hits);
  return p;
}

// A host look (gpu_buffer 0) that found a GPU entry of its range: taken
// only while the free watch's count is the one it was last checked at.
[[gnu::always_inline]] inline bool Cache::gpu_unchanged(const Entry* p, uint64_t gpu_buffer) const {
  if (p->gpu_buffer == gpu_buffer) [[likely]] return true;
  return gpu_buffer == 0 && gpu_events_ != nullptr &&
         p->gpu_count.load(std::memory_order_relaxed) == gpu_events_->load(std::memory_order_acquire);
}

inline void Cache::gpu_checked(Entry* e, uint64_t count) { e->gpu_count.store(count, std::memory_order_relaxed); }

[[gnu::always_inline]] inline Cache::Entry* Cache::acquire_hit(void* addr, uint64_t length, uint32_t access,
                                                               uint64_t gpu_buffer) {
  if (Entry* e = hit_parked(addr, length, access, gpu_buffer)) [[likely]] return e;
  return hit_rest(addr, length, access, gpu_buffer);
}

[[gnu::always_inline]] inline int Cache::release0(Entry* e) {
  // Parked: this thread keeps the hold for its next hit of the entry. Not
  // while over the bounds (the release may let one go), not where the
  // entry's slot in the thread's parking is taken, not without membarrier
  // (release_key_ then matches no thread's slot).
  const uint64_t key = release_key_.load(std::memory_order_relaxed);
  const detail::ParkingSlot& ps = detail::parking_slot_of(key);
  if (ps.uid == key) [[likely]] {
    Parking::Slot& slot = ps.parking->at(e->park_off);  // e is held: its key stays
    if (detail::word_is<Entry*>(slot.parked, nullptr)) [[likely]] {
      slot.parked.store(e, std::memory_order_release);
      std::atomic_signal_fence(std::memory_order_seq_cst);  // the store above, then the load below
      // Dead (before or meanwhile)? The killer marks it dead, runs
      // membarrier, then looks at the parked holds: either it sees this
      // one, or this load sees dead (then the hold is given up here,
      // unless it was taken; a dead entry's last release deregisters it).
      if (detail::bit_is_set<detail::kDeadBit>(e->state)) [[unlikely]] return unpark_dead(slot, e);
      return 0;
    }
  }
  return release_hold(e);
}

[[gnu::always_inline]] inline void Cache::release(Entry* e) { (void)release0(e); }

}  // namespace ufab::regcache
