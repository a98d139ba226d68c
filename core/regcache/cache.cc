#include "core/regcache/cache.h"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <thread>

#include "core/regcache/unmap_monitor.h"

namespace ufab::regcache {

#ifdef UFAB_REGCACHE_TEST_HOOKS
namespace test_hooks {
void (*between_look_and_take)() = nullptr;
bool membarrier_fails = false;
}
#endif

namespace {

using detail::kDead;
using detail::kGenOne;
using detail::kHitMask;
using detail::kHitOne;
using detail::kHitShift;
using detail::kReferenced;
using detail::kRefMask;
using detail::kRefOne;

constexpr uint64_t refs_of(uint64_t s) { return s & kRefMask; }
constexpr uint64_t hits_of(uint64_t s) { return (s & kHitMask) >> kHitShift; }

constexpr size_t kChunk = 64;  // pool entries allocated at once

// The process's membarrier(2), registered once: whether threads may park.
bool membarrier_ready() {
  static const bool ok = ::syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
  return ok;
}

// Caches' uids: never 0, steps of sizeof(ParkingSlot) (cache.h).
std::atomic<uint64_t> next_uid{sizeof(detail::ParkingSlot)};

// Where host memory is not watched: an event word that never moves.
const std::atomic<uint64_t> kNoEvents{0};

}  // namespace

namespace detail {
__thread ParkingSlot tl_parkings[kParkingSlots] __attribute__((tls_model("initial-exec")));
}  // namespace detail

Cache::Cache(Registrar registrar, Options options)
    : events_(&kNoEvents),
      gpu_events_(options.gpu_events),
      uid_(next_uid.fetch_add(sizeof(detail::ParkingSlot), std::memory_order_relaxed)),
      reg_(std::move(registrar)),
      options_(options) {
  set_release_flags(options.park_released && membarrier_ready() ? 0 : kNoParking);
  // Twice the entries kept, a power of two from 64 to 64 Ki slots.
  uint64_t want = std::min<uint64_t>(std::max<uint64_t>(2ull * options_.max_entries, 64), 65536);
  slot_count_ = std::bit_ceil(want);
  slot_shift_ = 64 - std::countr_zero(slot_count_);
  slots_.reset(new std::atomic<Entry*>[slot_count_]);
  for (size_t i = 0; i < slot_count_; ++i) slots_[i].store(nullptr, std::memory_order_relaxed);
  slot_table_ = slots_.get();
  if (options_.watch_host) {
    auto m = UnmapMonitor::get();
    if (m) {
      monitor_ = *m;
      seen_events_.store((*m)->sequence() << 1, std::memory_order_relaxed);
      events_ = &(*m)->events();
      host_watch_ = "userfaultfd";
    } else {
      host_watch_ = m.error().message();
    }
  } else {
    host_watch_ = "off (Options::watch_host = false): host memory is not cached";
  }
}

Status Cache::check(const Registrar& registrar, const Options& options) {
  if (!registrar.reg || !registrar.dereg) return fail(EINVAL, "registration cache: reg and dereg are required");
  if (options.max_entries == 0) return fail(EINVAL, "registration cache: max_entries is 0");
  return {};
}

Result<std::unique_ptr<Cache>> Cache::create(Registrar registrar, Options options) {
  if (auto ok = check(registrar, options); !ok) return std::unexpected(ok.error());
  return std::unique_ptr<Cache>(new Cache(std::move(registrar), options));
}

Cache::~Cache() {
  std::lock_guard lock(mu_);
  for (Entry* e : all_) {
    if (e->live) reg_.dereg(e->handle);
  }
}

inline Cache::Entry* Cache::hit_shared(uint64_t a, uint64_t length, uint32_t access, uint64_t gpu_buffer) {
  Entry* e = slot_table_[slot_of(a, length, access)].load(std::memory_order_acquire);
  if (e == nullptr) return nullptr;
  uint64_t s = e->state.load(std::memory_order_acquire);
  // A few tries against other threads' hits and releases of the same
  // entry; then the slow path.
  for (int tries = 0; tries < 4; ++tries) {
    if ((s & kDead) != 0 || refs_of(s) == kRefMask || (s & kHitMask) == kHitMask) return nullptr;
    // Read after the state: a key from a later reuse comes with a later
    // generation, and the compare-and-swap below fails.
    if (!e->is_racy(a, length, access, gpu_buffer)) return nullptr;
    if (e->state.compare_exchange_weak(s, (s + kRefOne + kHitOne) | kReferenced, std::memory_order_acq_rel,
                                       std::memory_order_acquire)) {
      return e;
    }
  }
  return nullptr;
}

Cache::Entry* Cache::hit_settle(Parking* pk, unsigned off, uint64_t a, uint64_t length, uint32_t access,
                               uint64_t gpu_buffer) {
  // hit_parked() took the parked entry (stored null) but the slot's epoch
  // moved meanwhile (or was odd, or stays odd: membarrier failed), or the
  // entry is another range's.
  Parking::Slot& slot = pk->at(off);
  Entry* p = slot.taking;
  const uint64_t epoch = slot.taking_epoch;
  slot.taking = nullptr;
  if (slot.epoch.load(std::memory_order_acquire) != epoch && parked_taken_back(slot, p, epoch)) p = nullptr;
  if (p != nullptr) {  // this thread's hold
    if ((p->state.load(std::memory_order_acquire) & kDead) != 0) {
      release_hold(p);  // it died while parked (and could not be taken back: no membarrier)
    } else if (p->is_held(a, length, access) && gpu_unchanged(p, gpu_buffer)) {
      detail::bump_own(slot.hits);
      return p;
    } else if (p->gpu_buffer != 0 && gpu_events_ != nullptr &&
               p->gpu_count.load(std::memory_order_relaxed) != gpu_events_->load(std::memory_order_acquire)) {
      // A GPU range not checked since a watched call (often a freed
      // buffer): the slot is left to the range looked up now.
      release_hold(p);
    } else {
      release0(p);  // another range's: parked again (its slot is this one, and empty)
    }
  }
  if (events_->load(std::memory_order_acquire) != seen_events_.load(std::memory_order_acquire)) return nullptr;
  return hit_shared(a, length, access, gpu_buffer);
}

Cache::Entry* Cache::hit_rest(void* addr, uint64_t length, uint32_t access, uint64_t gpu_buffer) {
  const uint64_t a = reinterpret_cast<uintptr_t>(addr);
  if (Parking* pk = my_parking(); pk != nullptr) {
    const unsigned off = detail::park_off_of(a);
    if (pk->at(off).taking != nullptr) [[unlikely]] return hit_settle(pk, off, a, length, access, gpu_buffer);
  }
  if (events_->load(std::memory_order_acquire) != seen_events_.load(std::memory_order_acquire)) return nullptr;
  return hit_shared(a, length, access, gpu_buffer);
}

int Cache::release_hold(Entry* e) {
  const uint64_t old = e->state.fetch_sub(kRefOne, std::memory_order_acq_rel);
  if (refs_of(old) != 1) return 0;  // others still hold it
  if ((old & kDead) == 0 && (release_flags_.load(std::memory_order_relaxed) & kOverBound) == 0) return 0;
  release_slow(e, old);
  return 0;
}

void Cache::release_slow(Entry* e, uint64_t old_state) {
  std::lock_guard lock(mu_);
  if ((old_state & kDead) != 0) {
    // Dead before this last release (invalidated, or never cacheable):
    // nobody else can see it at zero holders, so this one deregisters.
    destroy_locked(e);
    return;
  }
  evict_locked();  // over the bounds, and one more entry is free to go
}

void Cache::release_locked(Entry* e) {
  const uint64_t old = e->state.fetch_sub(kRefOne, std::memory_order_acq_rel);
  if (refs_of(old) == 1 && (old & kDead) != 0) destroy_locked(e);
}

bool Cache::parked_taken_back(Parking::Slot& slot, Entry* p, uint64_t epoch) {
  std::lock_guard lock(mu_);
  return slot.stolen == p && slot.stolen_epoch > epoch;
}

int Cache::unpark_dead(Parking::Slot& slot, Entry* e) {
  std::lock_guard lock(mu_);
  Entry* expected = e;
  if (slot.parked.compare_exchange_strong(expected, nullptr, std::memory_order_acq_rel)) {
    stats_.unparked++;
    release_locked(e);
  }
  return 0;
}

void Cache::unpark_locked(bool only_dead) {
  if (only_dead) {
    if (!killed_) return;  // no held entry died: none can be parked dead
    killed_ = false;
  }
  // Nothing parked (no membarrier, or parking off), or membarrier failed
  // once (below): no hold is taken back.
  if (parkings_.empty() || (release_flags_.load(std::memory_order_relaxed) & kNoParking) != 0) return;
  // Each slot's epoch odd (only the mutex holder writes them).
  auto bump = [this] {
    for (auto& pk : parkings_) {
      for (auto& slot : pk->slot) {
        slot.epoch.store(slot.epoch.load(std::memory_order_relaxed) + 1, std::memory_order_release);
      }
    }
  };
  bump();
  // Every thread passes a full barrier: a thread's store (parking an
  // entry, or taking its parked one) from before it is seen below; one
  // after it sees the odd epoch, or the entry dead.
  bool failed = ::syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) != 0;
#ifdef UFAB_REGCACHE_TEST_HOOKS
  failed = failed || test_hooks::membarrier_fails;
#endif
  if (failed) [[unlikely]] {
    // Registered at start, so this cannot fail; if it did, taking holds
    // back would be unsafe: none is taken, nothing is parked from now on,
    // and the epochs stay odd, so that a parked hold's thread takes it
    // back only through hit_rest(), which looks at its state (a dead one
    // is given back).
    set_release_flags(release_flags_.load(std::memory_order_relaxed) | kNoParking);
    return;
  }
  for (auto& pk : parkings_) {
    for (auto& slot : pk->slot) {
      Entry* p = slot.parked.load(std::memory_order_acquire);
      if (p != nullptr && (!only_dead || (p->state.load(std::memory_order_acquire) & kDead) != 0) &&
          slot.parked.compare_exchange_strong(p, nullptr, std::memory_order_acq_rel)) {
        slot.stolen = p;
        slot.stolen_epoch = slot.epoch.load(std::memory_order_relaxed);
        stats_.unparked++;
        // Parked means used lately: a second chance for CLOCK.
        if (!only_dead) p->state.fetch_or(kReferenced, std::memory_order_relaxed);
        release_locked(p);
      }
    }
  }
  bump();  // even again
}

void Cache::park_here_locked() {
  if ((release_flags_.load(std::memory_order_relaxed) & kNoParking) != 0 || my_parking() != nullptr) return;
  const std::thread::id me = std::this_thread::get_id();
  Parking* mine = nullptr;
  for (auto& pk : parkings_) {
    if (pk->owner == me) mine = pk.get();
  }
  if (mine == nullptr) {
    parkings_.push_back(std::make_unique<Parking>());
    mine = parkings_.back().get();
    mine->owner = me;
  }
  detail::parking_slot_of(uid_) = detail::ParkingSlot{uid_, mine};
}

Cache::Entry* Cache::new_entry_locked() {
  if (free_.empty()) {
    chunks_.emplace_back(new Entry[kChunk]);
    for (size_t i = 0; i < kChunk; ++i) {
      all_.push_back(&chunks_.back()[i]);
      free_.push_back(&chunks_.back()[kChunk - 1 - i]);
    }
  }
  Entry* e = free_.back();
  free_.pop_back();
  return e;
}

void Cache::destroy_locked(Entry* e) {
  reg_.dereg(e->handle);
  stats_.entries--;
  stats_.bytes -= e->length;
  retired_hits_ += hits_of(e->state.load(std::memory_order_relaxed));
  e->handle = nullptr;
  e->live = false;
  free_.push_back(e);
}

void Cache::unpublish_locked(Entry* e) {
  if (!e->cached) return;
  const Key k = e->key();
  map_.erase(k);
  Entry* expected = e;
  slots_[slot_of(k.addr, k.length, k.access)].compare_exchange_strong(expected, nullptr,
                                                                        std::memory_order_relaxed);
  e->cached = false;
}

void Cache::drop_locked(Entry* e) {
  unpublish_locked(e);
  const uint64_t old = e->state.fetch_or(kDead, std::memory_order_acq_rel);
  if ((old & kDead) == 0 && refs_of(old) == 0) {
    destroy_locked(e);
    return;
  }
  // Else held: its last release sees it dead and deregisters it; a parked
  // hold is taken back by unpark_locked(true).
  killed_ = true;
}

void Cache::invalidate_locked(uint64_t start, uint64_t end) {
  std::vector<Entry*> hit;
  for (auto& [k, e] : map_) {
    if (e->gpu_buffer == 0 && k.addr < end && start < k.addr + k.length) {
      hit.push_back(e);
    }
  }
  for (Entry* e : hit) {
    stats_.invalidations++;
    drop_locked(e);
  }
}

void Cache::drain_events_locked() {
  if (monitor_ == nullptr) return;
  const uint64_t seen = seen_events_.load(std::memory_order_relaxed) >> 1;
  const uint64_t now = monitor_->sequence();
  if (now == seen) return;
  for (uint64_t s = seen; s < now; ++s) {
    Range r;
    if (!monitor_->event(s, &r)) {
      // Fell behind the ring: whatever was unmapped is unknown, so every
      // host entry goes.
      invalidate_locked(0, UINT64_MAX);
      break;
    }
    invalidate_locked(r.start, r.end);
  }
  unpark_locked(true);
  // Published after the entries are dead: a hit that sees `now` finds
  // them dead.
  seen_events_.store(now << 1, std::memory_order_release);
}

void Cache::evict_locked() {
  auto over = [this] { return stats_.entries > options_.max_entries || stats_.bytes > options_.max_bytes; };
  // CLOCK: the hand passes over the pool; a released cached entry that
  // was hit since the last pass gets a second chance (its referenced bit
  // is cleared), one that was not is evicted. Two passes at most: after
  // the first every released entry has its bit clear, unless a hit sets
  // it again meanwhile.
  if (!over()) {
    set_over_bound(false);
    return;
  }
  clock_locked();
  if (over()) {
    // Parked holds do not keep entries: taken back (a membarrier), then
    // the hand goes round again.
    bool parked = false;
    for (auto& pk : parkings_) {
      for (auto& slot : pk->slot) parked = parked || slot.parked.load(std::memory_order_relaxed) != nullptr;
    }
    if (parked) {
      unpark_locked(false);
      clock_locked();
    }
  }
  set_over_bound(over());
}

void Cache::set_over_bound(bool over) {
  const uint32_t f = release_flags_.load(std::memory_order_relaxed);
  const uint32_t want = over ? (f | kOverBound) : (f & ~kOverBound);
  if (want != f) set_release_flags(want);
}

void Cache::set_release_flags(uint32_t flags) {
  // Only the mutex holder (or the constructor) writes them.
  release_flags_.store(flags, std::memory_order_relaxed);
  release_key_.store(flags == 0 ? uid_ : uid_ | kNoPark, std::memory_order_relaxed);
}

void Cache::clock_locked() {
  auto over = [this] { return stats_.entries > options_.max_entries || stats_.bytes > options_.max_bytes; };
  const size_t n = all_.size();
  for (size_t step = 0; step < 2 * n && over(); ++step) {
    Entry* e = all_[clock_hand_];
    clock_hand_ = (clock_hand_ + 1) % n;
    if (!e->live || !e->cached) continue;
    uint64_t s = e->state.load(std::memory_order_acquire);
    if (refs_of(s) != 0) continue;  // held: never evicted
    if ((s & kReferenced) != 0) {
      e->state.fetch_and(~kReferenced, std::memory_order_relaxed);
      continue;
    }
    // Dead only if still unheld and unreferenced (a hit may have come).
    if (!e->state.compare_exchange_strong(s, s | kDead, std::memory_order_acq_rel)) continue;
    stats_.evictions++;
    unpublish_locked(e);
    destroy_locked(e);
  }
}

Result<Cache::Entry*> Cache::hold_locked(Entry* e) {
  // A cached entry is not dead (dead is set only under the mutex), so
  // only other threads' hits and releases move its state meanwhile. The
  // hits counted in the word are folded into retired_hits_ here, so the
  // word's count never overflows.
  uint64_t s = e->state.load(std::memory_order_acquire);
  for (;;) {
    if (refs_of(s) == kRefMask) {
      return fail(EOVERFLOW, "registration cache: this registration is already held " + std::to_string(kRefMask) +
                                 " times at once; release some first");
    }
    if (e->state.compare_exchange_weak(s, ((s & ~kHitMask) + kRefOne) | kReferenced, std::memory_order_acq_rel,
                                       std::memory_order_acquire)) {
      retired_hits_ += hits_of(s) + 1;
      break;
    }
  }
  const Key k = e->key();
  slots_[slot_of(k.addr, k.length, k.access)].store(e, std::memory_order_release);
  return e;
}

Result<Cache::Entry*> Cache::acquire(void* addr, uint64_t length, uint32_t access, std::optional<uint64_t> gpu_buffer) {
  std::lock_guard lock(mu_);
  if (Parking* pk = my_parking(); pk != nullptr) {
    for (auto& slot : pk->slot) {
      if (slot.taking == nullptr) [[likely]] continue;
      // hit_parked() left a hold it could not keep and no hit_rest()
      // came (a caller that skipped it): given back, unless the cache
      // took it.
      Entry* p = slot.taking;
      slot.taking = nullptr;
      if (!(slot.stolen == p && slot.stolen_epoch > slot.taking_epoch)) release_locked(p);
    }
  }
  drain_events_locked();
  park_here_locked();  // this thread's place for the entries it releases
  Key key{reinterpret_cast<uintptr_t>(addr), length, access};
  if (auto it = map_.find(key); it != map_.end()) {
    Entry* e = it->second;
    // GPU entries: the allocation at the address must be the one
    // registered (a freed buffer's memory may be given out again).
    const uint64_t id = e->gpu_buffer;
    bool valid = id == 0 ? !gpu_buffer.has_value() : gpu_buffer && *gpu_buffer == id;
    if (valid) return hold_locked(e);
    stats_.invalidations++;
    drop_locked(e);
    unpark_locked(true);
  }
  stats_.misses++;
  const bool gpu = gpu_buffer.has_value();
  // Host memory is cached only when the monitor watches it.
  bool cacheable = gpu;
  if (!gpu && monitor_ != nullptr) cacheable = static_cast<bool>(monitor_->watch(key.addr, key.addr + length));
  if (!cacheable) stats_.uncached++;
  auto h = reg_.reg(addr, length, access);
  if (!h) return std::unexpected(h.error());
  Entry* e = new_entry_locked();
  const uint64_t old = e->state.load(std::memory_order_relaxed);  // dead, no holders
  e->set_key(key.addr, length, access, gpu ? *gpu_buffer : 0);
  e->handle = *h;
  e->live = true;
  e->cached = cacheable;
  if (reg_.bind) reg_.bind(*h, e);
  // The next generation, held once; an uncacheable entry is born dead, so
  // its release deregisters it.
  e->state.store(((old & ~(kGenOne - 1)) + kGenOne) | kRefOne | (cacheable ? 0 : kDead), std::memory_order_release);
  stats_.entries++;
  stats_.bytes += length;
  if (cacheable) {
    map_.emplace(key, e);
    slots_[slot_of(key.addr, length, access)].store(e, std::memory_order_release);
  }
  evict_locked();
  return e;
}

namespace {

// Holders of `e` other than parked holds (which are the cache's, not an
// application's). A snapshot: threads hit and release meanwhile.
uint64_t holders(const Cache::Entry* e, uint64_t refs, const std::vector<const Cache::Entry*>& parked) {
  uint64_t n = 0;
  for (const Cache::Entry* p : parked) n += p == e;
  return refs > n ? refs - n : 0;
}

}  // namespace

Stats Cache::stats() const {
  std::lock_guard lock(mu_);
  Stats s = stats_;
  s.hits = retired_hits_;
  s.held = 0;
  std::vector<const Entry*> parked;
  for (const auto& pk : parkings_) {
    for (const auto& slot : pk->slot) {
      s.hits += slot.hits.load(std::memory_order_relaxed);
      s.parked_hits += slot.hits.load(std::memory_order_relaxed);
      if (const Entry* p = slot.parked.load(std::memory_order_acquire)) parked.push_back(p);
    }
  }
  for (const Entry* e : all_) {
    if (!e->live) continue;
    const uint64_t st = e->state.load(std::memory_order_acquire);
    s.hits += hits_of(st);
    if (holders(e, refs_of(st), parked) != 0) s.held++;
  }
  return s;
}

bool Cache::busy() const {
  std::lock_guard lock(mu_);
  std::vector<const Entry*> parked;
  for (const auto& pk : parkings_) {
    for (const auto& slot : pk->slot) {
      if (const Entry* p = slot.parked.load(std::memory_order_acquire)) parked.push_back(p);
    }
  }
  for (const Entry* e : all_) {
    if (e->live && holders(e, refs_of(e->state.load(std::memory_order_acquire)), parked) != 0) return true;
  }
  return false;
}

}  // namespace ufab::regcache
