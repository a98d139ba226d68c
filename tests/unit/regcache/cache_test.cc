// The registration cache on host memory with a fake registrar: hits,
// misses, invalidation when memory goes away (munmap, madvise, mremap,
// free of a large malloc block), bounds and eviction, held entries, memory
// that cannot be watched, GPU entries by buffer id; the lock-free hit and
// release under several threads, racing eviction and invalidation (also
// run under ThreadSanitizer by scripts/test.sh).
#include "core/regcache/cache.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "core/regcache/unmap_monitor.h"

namespace {

using ufab::regcache::Cache;
using ufab::regcache::Options;
using ufab::regcache::Registrar;

struct Fake {
  int next = 1;
  std::set<intptr_t> live;
  int regs = 0, deregs = 0;
  Registrar registrar() {
    Registrar r;
    r.reg = [this](void*, uint64_t, uint32_t) -> ufab::Result<void*> {
      ++regs;
      intptr_t h = next++;
      live.insert(h);
      return reinterpret_cast<void*>(h);
    };
    r.dereg = [this](void* h) {
      ++deregs;
      EXPECT_EQ(live.erase(reinterpret_cast<intptr_t>(h)), 1u) << "deregistered twice";
    };
    return r;
  }
};

constexpr size_t kMiB = 1 << 20;

char* map_anon(size_t n) {
  void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  EXPECT_NE(p, MAP_FAILED);
  return static_cast<char*>(p);
}

std::unique_ptr<Cache> make(Fake& f, Options o = {}) {
  auto c = Cache::create(f.registrar(), o);
  EXPECT_TRUE(c) << c.error().message();
  return std::move(*c);
}

#define NEED_MONITOR(c)                                                                     \
  if ((c)->host_watch() != "userfaultfd") GTEST_SKIP() << "no userfaultfd here: " << (c)->host_watch()

TEST(RegCache, SameRangeTwiceIsAHit) {
  Fake f;
  auto c = make(f);
  NEED_MONITOR(c);
  char* p = map_anon(kMiB);
  auto a = c->acquire(p, kMiB, 7, std::nullopt);
  ASSERT_TRUE(a) << a.error().message();
  c->release(*a);
  auto b = c->acquire(p, kMiB, 7, std::nullopt);
  ASSERT_TRUE(b);
  EXPECT_EQ(Cache::handle(*a), Cache::handle(*b));
  auto other_access = c->acquire(p, kMiB, 1, std::nullopt);  // another access: another registration
  auto sub = c->acquire(p + 4096, 4096, 7, std::nullopt);    // exact ranges only
  ASSERT_TRUE(other_access && sub);
  auto s = c->stats();
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 3u);
  EXPECT_EQ(s.entries, 3u);
  EXPECT_EQ(s.held, 3u);
  EXPECT_EQ(f.regs, 3);
  c->release(*b);
  c->release(*other_access);
  c->release(*sub);
  EXPECT_EQ(c->stats().held, 0u);
  EXPECT_EQ(f.deregs, 0);  // released entries stay registered
  munmap(p, kMiB);
}

TEST(RegCache, MunmapInvalidates) {
  Fake f;
  auto c = make(f);
  NEED_MONITOR(c);
  char* p = map_anon(kMiB);
  auto a = c->acquire(p, kMiB, 7, std::nullopt);
  ASSERT_TRUE(a);
  c->release(*a);
  ASSERT_EQ(munmap(p + 64 * 1024, 4096), 0);  // one page in the middle
  char* q = map_anon(kMiB);                   // and something else
  auto b = c->acquire(q, kMiB, 7, std::nullopt);
  ASSERT_TRUE(b);
  auto s = c->stats();
  EXPECT_EQ(s.invalidations, 1u);
  EXPECT_EQ(f.deregs, 1);
  EXPECT_EQ(s.entries, 1u);
  c->release(*b);
  munmap(p, kMiB);
  munmap(q, kMiB);
}

TEST(RegCache, RemappedAtTheSameAddressMisses) {
  Fake f;
  auto c = make(f);
  NEED_MONITOR(c);
  char* p = map_anon(kMiB);
  auto a = c->acquire(p, kMiB, 7, std::nullopt);
  ASSERT_TRUE(a);
  void* old_handle = Cache::handle(*a);
  c->release(*a);
  ASSERT_EQ(munmap(p, kMiB), 0);
  void* again = mmap(p, kMiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  ASSERT_EQ(again, p);
  auto b = c->acquire(p, kMiB, 7, std::nullopt);
  ASSERT_TRUE(b);
  EXPECT_NE(Cache::handle(*b), old_handle);
  EXPECT_EQ(c->stats().hits, 0u);
  c->release(*b);
  munmap(p, kMiB);
}

TEST(RegCache, MadviseDontneedAndMremapInvalidate) {
  Fake f;
  auto c = make(f);
  NEED_MONITOR(c);
  char* p = map_anon(kMiB);
  char* q = map_anon(kMiB);
  auto a = c->acquire(p, kMiB, 7, std::nullopt);
  auto b = c->acquire(q, kMiB, 7, std::nullopt);
  ASSERT_TRUE(a && b);
  c->release(*a);
  c->release(*b);
  ASSERT_EQ(madvise(p, 4096, MADV_DONTNEED), 0);
  void* moved = mremap(q, kMiB, 2 * kMiB, MREMAP_MAYMOVE);
  ASSERT_NE(moved, MAP_FAILED);
  auto again = c->acquire(p, kMiB, 7, std::nullopt);
  ASSERT_TRUE(again);
  EXPECT_EQ(c->stats().invalidations, 2u);
  EXPECT_EQ(c->stats().hits, 0u);
  c->release(*again);
  munmap(p, kMiB);
  munmap(moved, 2 * kMiB);
}

TEST(RegCache, FreeOfALargeMallocBlockInvalidates) {
  Fake f;
  auto c = make(f);
  NEED_MONITOR(c);
  char* p = static_cast<char*>(std::malloc(8 * kMiB));  // above glibc's mmap threshold: its own mapping
  ASSERT_NE(p, nullptr);
  p[0] = 1;
  auto a = c->acquire(p, 8 * kMiB, 7, std::nullopt);
  ASSERT_TRUE(a);
  c->release(*a);
  std::free(p);
  EXPECT_EQ(c->stats().entries, 1u);  // events are taken on the next call
  char* q = map_anon(kMiB);
  auto b = c->acquire(q, kMiB, 7, std::nullopt);
  ASSERT_TRUE(b);
  EXPECT_EQ(c->stats().invalidations, 1u);
  c->release(*b);
  munmap(q, kMiB);
}

TEST(RegCache, InvalidatedWhileHeldIsDeregisteredAtRelease) {
  Fake f;
  auto c = make(f);
  NEED_MONITOR(c);
  char* p = map_anon(kMiB);
  auto a = c->acquire(p, kMiB, 7, std::nullopt);
  ASSERT_TRUE(a);
  ASSERT_EQ(munmap(p, kMiB), 0);
  char* q = map_anon(4096);
  auto b = c->acquire(q, 4096, 7, std::nullopt);  // takes the event
  ASSERT_TRUE(b);
  EXPECT_EQ(c->stats().invalidations, 1u);
  EXPECT_EQ(f.deregs, 0);  // still held
  c->release(*a);
  EXPECT_EQ(f.deregs, 1);
  c->release(*b);
  munmap(q, 4096);
}

TEST(RegCache, BoundsEvictLeastRecentlyUsedNeverHeld) {
  Fake f;
  Options o;
  o.max_entries = 3;
  o.max_bytes = 1ull << 40;
  auto c = make(f, o);
  NEED_MONITOR(c);
  char* p = map_anon(16 * 4096);
  Cache::Entry* e[5];
  for (int i = 0; i < 5; ++i) {
    auto r = c->acquire(p + i * 4096, 4096, 7, std::nullopt);
    ASSERT_TRUE(r);
    e[i] = *r;
  }
  // All held: nothing can go, the bound is exceeded for now.
  EXPECT_EQ(c->stats().entries, 5u);
  EXPECT_EQ(c->stats().evictions, 0u);
  c->release(e[3]);
  c->release(e[0]);  // order of release = recency: 3 is the oldest
  EXPECT_EQ(c->stats().evictions, 2u);
  EXPECT_EQ(c->stats().entries, 3u);
  auto again = c->acquire(p + 3 * 4096, 4096, 7, std::nullopt);  // evicted: a miss
  ASSERT_TRUE(again);
  EXPECT_EQ(c->stats().hits, 0u);
  c->release(*again);
  c->release(e[1]);
  c->release(e[2]);
  c->release(e[4]);
  EXPECT_LE(c->stats().entries, 3u);
  Options ob;
  ob.max_bytes = 8192;
  Fake g;
  auto cb = make(g, ob);
  for (int i = 0; i < 4; ++i) {
    auto r = cb->acquire(p + i * 4096, 4096, 7, std::nullopt);
    ASSERT_TRUE(r);
    cb->release(*r);
  }
  EXPECT_LE(cb->stats().bytes, 8192u);
  EXPECT_EQ(cb->stats().evictions, 2u);
  munmap(p, 16 * 4096);
}

TEST(RegCache, FileMappingsAreNotCached) {
  Fake f;
  auto c = make(f);
  NEED_MONITOR(c);
  char path[] = "/var/tmp/ufab_regcache_XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 65536), 0);
  void* m = mmap(nullptr, 65536, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(m, MAP_FAILED);
  for (int i = 0; i < 2; ++i) {
    auto a = c->acquire(m, 65536, 7, std::nullopt);
    ASSERT_TRUE(a);
    c->release(*a);
  }
  auto s = c->stats();
  // tmpfs (shmem) can be watched; a disk file system cannot.
  // A file on a disk file system cannot be watched: registered and
  // deregistered each time. (On tmpfs, shared memory, it would be cached.)
  if (s.uncached > 0) {
    EXPECT_EQ(s.uncached, 2u);
    EXPECT_EQ(f.deregs, 2);  // registered and deregistered each time
    EXPECT_EQ(s.entries, 0u);
  }
  munmap(m, 65536);
  close(fd);
  unlink(path);
}

TEST(RegCache, WithoutWatchingNothingIsCached) {
  Fake f;
  Options o;
  o.watch_host = false;
  auto c = make(f, o);
  char* p = map_anon(4096);
  for (int i = 0; i < 3; ++i) {
    auto a = c->acquire(p, 4096, 7, std::nullopt);
    ASSERT_TRUE(a);
    c->release(*a);
  }
  EXPECT_EQ(c->stats().hits, 0u);
  EXPECT_EQ(c->stats().uncached, 3u);
  EXPECT_EQ(f.deregs, 3);
  munmap(p, 4096);
}

TEST(RegCache, GpuEntriesAreCheckedAgainstTheBufferId) {
  Fake f;
  Options o;
  o.watch_host = false;  // GPU entries do not need the monitor
  auto c = make(f, o);
  void* gpu = reinterpret_cast<void*>(0x7f0000000000ull);
  auto a = c->acquire(gpu, kMiB, 7, 11);
  ASSERT_TRUE(a);
  c->release(*a);
  auto b = c->acquire(gpu, kMiB, 7, 11);
  ASSERT_TRUE(b);
  EXPECT_EQ(c->stats().hits, 1u);
  void* old_handle = Cache::handle(*b);
  c->release(*b);
  // Freed and allocated again at the same address: the caller finds id 12.
  auto d = c->acquire(gpu, kMiB, 7, 12);
  ASSERT_TRUE(d);
  EXPECT_NE(Cache::handle(*d), old_handle);
  EXPECT_EQ(c->stats().invalidations, 1u);
  EXPECT_EQ(f.deregs, 1);
  c->release(*d);
}

// With a free watch (Options::gpu_events), a GPU entry found valid at
// count N is taken by the host look (no CUDA question) while the count is
// N; once a watched call ran it is not, until the caller asks again.
TEST(RegCache, WatchedGpuEntriesHitWithoutAQuestionWhileNoFreeRan) {
  Fake f;
  std::atomic<uint64_t> frees{5};
  Options o;
  o.watch_host = false;
  o.gpu_events = &frees;
  auto c = make(f, o);
  void* gpu = reinterpret_cast<void*>(0x7f0000000000ull);
  auto a = c->acquire(gpu, kMiB, 7, 11);
  ASSERT_TRUE(a);
  c->release(*a);
  EXPECT_EQ(c->acquire_hit(gpu, kMiB, 7), nullptr) << "never checked: the host look must not take it";
  Cache::Entry* checked = c->acquire_hit(gpu, kMiB, 7, 11);  // the caller asked CUDA: still buffer 11
  ASSERT_EQ(checked, *a);
  Cache::gpu_checked(checked, 5);
  c->release(checked);
  const uint64_t parked_before = c->stats().parked_hits;
  Cache::Entry* k = c->acquire_hit(gpu, kMiB, 7, 11);
  ASSERT_EQ(k, *a);
  c->release(k);
  if (c->stats().parked_hits == parked_before) GTEST_SKIP() << "nothing is parked here (no membarrier)";
  Cache::Entry* h = c->acquire_hit(gpu, kMiB, 7);  // the host look: no buffer id asked
  EXPECT_EQ(h, *a) << "a checked GPU entry was not taken while no free ran";
  if (h) c->release(h);
  frees = 6;  // a watched call (a free, an allocation, ...) started
  EXPECT_EQ(c->acquire_hit(gpu, kMiB, 7), nullptr) << "taken although a free may have run";
  EXPECT_EQ(c->acquire_hit(gpu, kMiB, 3), nullptr);  // other access: never
  // Asked again at count 7 (the call returned): buffer 12 is there now.
  frees = 7;
  void* old_handle = Cache::handle(*a);
  auto d = c->acquire(gpu, kMiB, 7, 12);
  ASSERT_TRUE(d);
  EXPECT_NE(Cache::handle(*d), old_handle);
  EXPECT_EQ(c->stats().invalidations, 1u);
  EXPECT_EQ(f.deregs, 1);
  Cache::Entry* early = c->acquire_hit(gpu, kMiB, 7);
  EXPECT_EQ(early, nullptr) << "a new entry is not checked yet";
  if (early) c->release(early);
  Cache::gpu_checked(*d, 7);
  c->release(*d);
  Cache::Entry* h2 = c->acquire_hit(gpu, kMiB, 7);
  EXPECT_EQ(h2, *d);
  if (h2) c->release(h2);
  EXPECT_EQ(c->acquire_hit(gpu, kMiB, 7, 11), nullptr);  // the old buffer: gone
}

// A watched GPU entry not checked since a free, parked in the slot of an
// address another range now starts at (a freed buffer, a new one of
// another size at its address), leaves the slot to the new range.
TEST(RegCache, AStaleWatchedGpuEntryLeavesItsParkingSlot) {
  Fake f;
  std::atomic<uint64_t> frees{0};
  Options o;
  o.watch_host = false;
  o.gpu_events = &frees;
  auto c = make(f, o);
  // Does this thread park at all (membarrier)? A probe elsewhere.
  void* probe = reinterpret_cast<void*>(0x7e0000000000ull);
  auto pr = c->acquire(probe, 4096, 7, 99);
  ASSERT_TRUE(pr);
  c->release(*pr);
  uint64_t parked_before = c->stats().parked_hits;
  Cache::Entry* ph = c->acquire_hit(probe, 4096, 7, 99);
  ASSERT_EQ(ph, *pr);
  c->release(ph);
  if (c->stats().parked_hits == parked_before) GTEST_SKIP() << "nothing is parked here (no membarrier)";

  void* gpu = reinterpret_cast<void*>(0x7f0000000000ull);
  auto a = c->acquire(gpu, 4096, 7, 11);
  ASSERT_TRUE(a);
  Cache::gpu_checked(*a, 0);
  c->release(*a);  // parked in the slot of `gpu`
  frees = 2;       // freed; a 1 MiB buffer (id 12) is allocated at the address
  EXPECT_EQ(c->acquire_hit(gpu, kMiB, 7), nullptr);
  auto b = c->acquire(gpu, kMiB, 7, 12);
  ASSERT_TRUE(b);
  Cache::gpu_checked(*b, 2);
  c->release(*b);
  // The host look above found the stale 4 KiB entry in the slot and gave
  // its hold up, so b parked there on its release.
  Cache::Entry* q = c->acquire_hit(gpu, kMiB, 7, 12);
  ASSERT_EQ(q, *b);
  c->release(q);
  parked_before = c->stats().parked_hits;
  for (int i = 0; i < 10; ++i) {
    Cache::Entry* h = c->acquire_hit(gpu, kMiB, 7);
    ASSERT_EQ(h, *b) << "round " << i << ": the checked 1 MiB entry was not taken by the host look";
    c->release(h);
  }
  EXPECT_EQ(c->stats().parked_hits - parked_before, 10u) << "the new range did not get the slot";
}

TEST(RegCache, LockFreeHitFindsHostAndGpuEntriesByTheirOwnKey) {
  Fake f;
  auto c = make(f);
  NEED_MONITOR(c);
  char* p = map_anon(kMiB);
  EXPECT_EQ(c->acquire_hit(p, kMiB, 7), nullptr);  // nothing cached yet
  auto a = c->acquire(p, kMiB, 7, std::nullopt);
  ASSERT_TRUE(a);
  c->release(*a);
  Cache::Entry* h = c->acquire_hit(p, kMiB, 7);
  ASSERT_EQ(h, *a);
  EXPECT_EQ(c->acquire_hit(p, kMiB, 3), nullptr);       // other access
  EXPECT_EQ(c->acquire_hit(p, kMiB / 2, 7), nullptr);   // other length
  EXPECT_EQ(c->acquire_hit(p, kMiB, 7, 99), nullptr);   // a host entry is no GPU buffer
  EXPECT_EQ(c->stats().held, 1u);
  c->release(h);
  EXPECT_EQ(c->stats().held, 0u);
  EXPECT_EQ(c->stats().hits, 1u);
  void* gpu = reinterpret_cast<void*>(0x7f0000000000ull);
  auto g = c->acquire(gpu, kMiB, 7, 11);
  ASSERT_TRUE(g);
  c->release(*g);
  EXPECT_EQ(c->acquire_hit(gpu, kMiB, 7), nullptr);      // GPU memory is not answered as host memory
  EXPECT_EQ(c->acquire_hit(gpu, kMiB, 7, 12), nullptr);  // another buffer now at the address
  Cache::Entry* gh = c->acquire_hit(gpu, kMiB, 7, 11);
  ASSERT_EQ(gh, *g);
  c->release(gh);
  EXPECT_EQ(c->stats().hits, 2u);
  EXPECT_EQ(f.regs, 2);
  munmap(p, kMiB);
}

TEST(RegCache, UnmapBeforeALockFreeHitMakesItMiss) {
  Fake f;
  auto c = make(f);
  NEED_MONITOR(c);
  char* p = map_anon(kMiB);
  auto a = c->acquire(p, kMiB, 7, std::nullopt);
  ASSERT_TRUE(a);
  c->release(*a);
  ASSERT_NE(c->acquire_hit(p, kMiB, 7), nullptr);
  c->release(*a);
  void* old_handle = Cache::handle(*a);  // (a's pool entry may be reused below)
  ASSERT_EQ(madvise(p, 4096, MADV_DONTNEED), 0);
  // The event is not taken yet, so the first look must give up (and the
  // slow path drops the entry).
  EXPECT_EQ(c->acquire_hit(p, kMiB, 7), nullptr);
  auto b = c->acquire(p, kMiB, 7, std::nullopt);
  ASSERT_TRUE(b);
  EXPECT_NE(Cache::handle(*b), old_handle);
  EXPECT_EQ(c->stats().invalidations, 1u);
  c->release(*b);
  munmap(p, kMiB);
}

TEST(RegCache, HitCountSurvivesTheStateWordsFold) {
  // The state word counts 2^20 - 1 hits; more fold into the cache's count.
  Fake f;
  auto c = make(f);
  NEED_MONITOR(c);
  char* p = map_anon(4096);
  auto a = c->acquire(p, 4096, 7, std::nullopt);
  ASSERT_TRUE(a);
  c->release(*a);
  const uint64_t n = (1u << 21) + 5;
  uint64_t fast = 0;
  for (uint64_t i = 0; i < n; ++i) {
    Cache::Entry* e = c->acquire_hit(p, 4096, 7);
    if (e != nullptr) {
      ++fast;
    } else {
      auto r = c->acquire(p, 4096, 7, std::nullopt);
      ASSERT_TRUE(r);
      e = *r;
    }
    c->release(e);
  }
  EXPECT_GT(fast, n - 10);  // nearly all without the lock
  EXPECT_EQ(c->stats().hits, n);
  EXPECT_EQ(c->stats().held, 0u);
  munmap(p, 4096);
}

TEST(RegCache, TooManyHoldsOfOneEntryIsAnError) {
  Fake f;
  auto c = make(f);
  NEED_MONITOR(c);
  char* p = map_anon(4096);
  auto a = c->acquire(p, 4096, 7, std::nullopt);
  ASSERT_TRUE(a);
  for (uint64_t i = 1; i < Cache::kMaxHolds; ++i) ASSERT_NE(c->acquire_hit(p, 4096, 7), nullptr) << i;
  EXPECT_EQ(c->acquire_hit(p, 4096, 7), nullptr);
  auto over = c->acquire(p, 4096, 7, std::nullopt);
  ASSERT_FALSE(over);
  EXPECT_EQ(over.error().code(), EOVERFLOW);
  for (uint64_t i = 0; i < Cache::kMaxHolds; ++i) c->release(*a);
  EXPECT_FALSE(c->busy());
  EXPECT_EQ(c->stats().hits, Cache::kMaxHolds - 1);
  EXPECT_EQ(f.deregs, 0);
  munmap(p, 4096);
}

// A registrar for several threads: handle n is slot n of `alive`, so a
// holder checks without a lock that its registration was not taken away.
struct ThreadSafeFake {
  static constexpr size_t kMax = 1 << 20;
  std::unique_ptr<std::atomic<int>[]> alive{new std::atomic<int>[kMax]()};
  std::atomic<uint64_t> next{1};
  std::atomic<uint64_t> regs{0}, deregs{0}, bad{0};
  Registrar registrar() {
    Registrar r;
    r.reg = [this](void*, uint64_t, uint32_t) -> ufab::Result<void*> {
      uint64_t h = next.fetch_add(1);
      if (h >= kMax) return ufab::fail(ENOSPC, "test registrar: out of handles");
      alive[h].store(1);
      regs++;
      return reinterpret_cast<void*>(h);
    };
    r.dereg = [this](void* h) {
      if (alive[reinterpret_cast<uintptr_t>(h)].exchange(0) != 1) bad++;  // deregistered twice
      deregs++;
    };
    return r;
  }
  bool live(void* h) const { return alive[reinterpret_cast<uintptr_t>(h)].load() == 1; }
};

// What the C API does: the lock-free look, then the slow path.
Cache::Entry* get(Cache& c, void* p, uint64_t n) {
  if (Cache::Entry* e = c.acquire_hit(p, n, 7)) return e;
  auto r = c.acquire(p, n, 7, std::nullopt);
  return r ? *r : nullptr;
}

class RegCacheThreads : public ::testing::TestWithParam<bool> {};  // parking on, off

TEST_P(RegCacheThreads, HitAndReleaseWhileEntriesAreEvicted) {
  ThreadSafeFake f;
  Options o;
  o.park_released = GetParam();
  o.max_entries = 6;  // 16 ranges: evictions all the time
  auto made = Cache::create(f.registrar(), o);
  ASSERT_TRUE(made);
  Cache& c = **made;
  NEED_MONITOR(&c);
  constexpr int kRanges = 16, kThreads = 4, kIters = 20000;
  char* p = map_anon(kRanges * 4096);
  std::atomic<uint64_t> acquires{0}, failures{0}, taken_away{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      uint32_t x = 12345u + t;
      Cache::Entry* held[3] = {};
      for (int i = 0; i < kIters; ++i) {
        x = x * 1664525u + 1013904223u;
        // Mostly the first 4 ranges (hits), sometimes any (misses, evictions).
        int r = (x >> 28) < 12 ? (x >> 8) % 4 : (x >> 8) % kRanges;
        int k = i % 3;
        if (held[k] != nullptr) c.release(held[k]);
        held[k] = get(c, p + r * 4096, 4096);
        if (held[k] == nullptr) {
          failures++;
          continue;
        }
        acquires++;
        if (!f.live(Cache::handle(held[k]))) taken_away++;
      }
      for (Cache::Entry* e : held) {
        if (e != nullptr) c.release(e);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0u);
  EXPECT_EQ(taken_away.load(), 0u) << "a held registration was deregistered";
  auto s = c.stats();
  EXPECT_EQ(s.hits + s.misses, acquires.load());
  EXPECT_GT(s.hits, 0u);
  EXPECT_GT(s.evictions, 0u);
  EXPECT_EQ(s.held, 0u);
  std::printf("%llu acquires, %llu hits, %llu evictions, %llu parked holds taken back\n",
              (unsigned long long)acquires.load(), (unsigned long long)s.hits, (unsigned long long)s.evictions,
              (unsigned long long)s.unparked);
  EXPECT_LE(s.entries, o.max_entries);
  EXPECT_EQ(f.regs.load() - f.deregs.load(), s.entries);
  made->reset();
  EXPECT_EQ(f.regs.load(), f.deregs.load());
  EXPECT_EQ(f.bad.load(), 0u);
  munmap(p, kRanges * 4096);
}

TEST_P(RegCacheThreads, InvalidationRacingHitsNeverHitsGoneMemoryNorDropsAHeldOne) {
  ThreadSafeFake f;
  Options o;
  o.park_released = GetParam();
  auto made = Cache::create(f.registrar(), o);
  ASSERT_TRUE(made);
  Cache& c = **made;
  NEED_MONITOR(&c);
  char* p = map_anon(2 * kMiB);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> hits_seen{0}, taken_away{0};
  std::vector<std::thread> hitters;
  for (int t = 0; t < 3; ++t) {
    hitters.emplace_back([&, t] {
      // Bounded: the mutator stops them, and they stop by themselves.
      for (int i = 0; i < 2000000 && !stop.load(std::memory_order_relaxed); ++i) {
        char* where = (i + t) % 4 == 0 ? p + kMiB : p;  // mostly the range being invalidated
        Cache::Entry* e = get(c, where, kMiB);
        if (e == nullptr) continue;
        hits_seen++;
        if (!f.live(Cache::handle(e))) taken_away++;
        // Hold it a while (across an invalidation, now and then), looking.
        for (int k = 0; k < 64; ++k) {
          if (!f.live(Cache::handle(e))) taken_away++;
        }
        if (i % 7 == 0) std::this_thread::yield();
        if (!f.live(Cache::handle(e))) taken_away++;
        c.release(e);
      }
    });
  }
  // The mutator: the memory goes away (madvise DONTNEED: an unmap event,
  // the range stays mapped for the others), then its own look up must not
  // find any registration made before that.
  // At least 300 rounds, more (up to 20000) until the hitters have done
  // 100000 acquires meanwhile.
  uint64_t stale = 0, rounds = 0;
  for (; rounds < 20000 && (rounds < 300 || hits_seen.load() < 100000); ++rounds) {
    const uint64_t before = f.next.load();
    ASSERT_EQ(madvise(p, kMiB, MADV_DONTNEED), 0);
    Cache::Entry* e = get(c, p, kMiB);
    ASSERT_NE(e, nullptr);
    if (reinterpret_cast<uintptr_t>(Cache::handle(e)) < before) stale++;
    c.release(e);
  }
  stop = true;
  for (auto& th : hitters) th.join();
  EXPECT_EQ(stale, 0u) << "a registration of memory that went away was hit";
  EXPECT_EQ(taken_away.load(), 0u) << "a held registration was deregistered";
  auto s = c.stats();
  EXPECT_GE(s.invalidations, 1u);
  EXPECT_EQ(s.held, 0u);
  EXPECT_GT(hits_seen.load(), 0u);
  std::printf("%llu rounds of invalidation, %llu acquires by the hitters, %llu invalidations, %llu parked holds "
              "taken back\n",
              (unsigned long long)rounds, (unsigned long long)hits_seen.load(), (unsigned long long)s.invalidations,
              (unsigned long long)s.unparked);
  EXPECT_EQ(f.regs.load() - f.deregs.load(), s.entries);
  made->reset();
  EXPECT_EQ(f.regs.load(), f.deregs.load());
  EXPECT_EQ(f.bad.load(), 0u);
  munmap(p, 2 * kMiB);
}

INSTANTIATE_TEST_SUITE_P(Parking, RegCacheThreads, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "parked" : "cas_only"; });

// The race the parking protocol exists for, made to happen: a thread sees
// its parked entry and, before it takes it back, the mutex holder takes it
// back (to evict; another entry goes, this one stays cached, unheld). The
// thread must notice (the epoch moved, and its entry is the one taken)
// and hold it anew, not use a hold it no longer has.
std::atomic<int> hook_phase{0};  // 1: the hitter is in the hook; 2: the evictor is done
void wait_in_hook() {
  if (hook_phase.load() != 0) return;  // once
  hook_phase.store(1);
  for (int i = 0; i < 2000000 && hook_phase.load() != 2; ++i) std::this_thread::yield();
}

TEST(RegCache, ParkedEntryTakenBackWhileItsThreadTakesItIsHeldAnew) {
  ThreadSafeFake f;
  Options o;
  o.max_entries = 2;
  auto made = Cache::create(f.registrar(), o);
  ASSERT_TRUE(made);
  Cache& c = **made;
  NEED_MONITOR(&c);
  char* p = map_anon(3 * 4096);
  hook_phase.store(0);
  // This thread parks q (the first entry of the pool, so the hand evicts
  // it first), the hitter parks its own.
  Cache::Entry* q = get(c, p + 4096, 4096);
  ASSERT_NE(q, nullptr);
  c.release(q);
  Cache::Entry* got = nullptr;
  uint64_t held_then = 0;
  bool got_live = false;
  std::thread hitter([&] {
    Cache::Entry* e = get(c, p, 4096);
    if (e == nullptr) return;
    c.release(e);  // parked
    ufab::regcache::test_hooks::between_look_and_take = wait_in_hook;
    got = get(c, p, 4096);  // sees its parked entry; the cache takes it back meanwhile
    ufab::regcache::test_hooks::between_look_and_take = nullptr;
    if (got != nullptr) {
      got_live = f.live(Cache::handle(got));
      held_then = c.stats().held;
      c.release(got);
    }
  });
  for (int i = 0; i < 2000000 && hook_phase.load() != 1; ++i) std::this_thread::yield();
  ASSERT_EQ(hook_phase.load(), 1) << "the hitter never reached its parked entry";
  // A miss over the bound with both other entries parked: the cache takes
  // both back and evicts q.
  auto r = c.acquire(p + 2 * 4096, 4096, 7, std::nullopt);
  ASSERT_TRUE(r);
  EXPECT_EQ(c.stats().unparked, 2u);
  EXPECT_EQ(c.stats().evictions, 1u);
  hook_phase.store(2);
  hitter.join();
  ASSERT_NE(got, nullptr);
  EXPECT_TRUE(got_live);
  EXPECT_EQ(held_then, 2u) << "the hitter's entry is held without a reference (and could be evicted under it)";
  EXPECT_EQ(f.regs.load(), 3u);  // p, q, r: p's entry stayed
  c.release(*r);
  auto s = c.stats();
  EXPECT_EQ(s.held, 0u);
  made->reset();
  EXPECT_EQ(f.regs.load(), f.deregs.load());
  EXPECT_EQ(f.bad.load(), 0u);
  munmap(p, 3 * 4096);
}

// The C API's split of a hit: hit_parked() inline, and when it gives up,
// hit_rest() (or a caller going straight to acquire()). Here the cache
// takes the parked hold back (to make room) between the thread's look and
// its take, in the same thread through the hook: hit_parked() sees the
// epoch move and leaves the entry it took in the parking. Whichever comes
// next must see that the cache has that hold, not give it back a second
// time: the entry stays registered (the thread holds it once more), so a
// second give-back would show as a hold nobody has.
Cache* hook_cache = nullptr;
char* hook_range = nullptr;
std::optional<ufab::Result<Cache::Entry*>> hook_result;
void take_back_in_hook() {
  // A miss over the bound (one entry) with the other entry held: the hand
  // finds nothing to evict, so the parked hold is taken back.
  if (!hook_result) hook_result = hook_cache->acquire(hook_range, 4096, 7, std::nullopt);
}

TEST(RegCache, ParkedHoldTakenBackMidHitIsSettledByHitRestOrAcquire) {
  for (bool through_hit_rest : {true, false}) {
    SCOPED_TRACE(through_hit_rest ? "hit_rest" : "acquire");
    ThreadSafeFake f;
    Options o;
    o.max_entries = 1;
    auto made = Cache::create(f.registrar(), o);
    ASSERT_TRUE(made);
    Cache& c = **made;
    NEED_MONITOR(&c);
    char* p = map_anon(2 * 4096);
    Cache::Entry* a = get(c, p, 4096);
    ASSERT_NE(a, nullptr);
    c.release(a);  // parked
    Cache::Entry* parked = c.hit_parked(p, 4096, 7);
    if (parked == nullptr) GTEST_SKIP() << "nothing is parked here (no membarrier)";
    c.release(parked);  // parked again
    auto held = c.acquire(p, 4096, 7, std::nullopt);  // and held once more (the slow path: not the parked hold)
    ASSERT_TRUE(held);
    ASSERT_EQ(*held, a);
    hook_cache = &c;
    hook_range = p + 4096;
    hook_result.reset();
    ufab::regcache::test_hooks::between_look_and_take = take_back_in_hook;
    Cache::Entry* hit = c.hit_parked(p, 4096, 7);
    ufab::regcache::test_hooks::between_look_and_take = nullptr;
    EXPECT_EQ(hit, nullptr) << "hit_parked kept a hold the cache had taken back";
    ASSERT_TRUE(hook_result && *hook_result);
    Cache::Entry* b = **hook_result;
    EXPECT_EQ(c.stats().unparked, 1u);
    EXPECT_EQ(c.stats().evictions, 0u);  // a is held, b is held
    Cache::Entry* again = nullptr;
    if (through_hit_rest) {
      again = c.hit_rest(p, 4096, 7);  // a fresh hold (the slot table's)
    } else {
      auto r = c.acquire(p, 4096, 7, std::nullopt);  // a fresh hold (the map's)
      ASSERT_TRUE(r);
      again = *r;
    }
    ASSERT_EQ(again, a);
    EXPECT_TRUE(f.live(Cache::handle(a)));
    EXPECT_EQ(c.stats().held, 2u);  // entries: a (held twice: `held`, `again`) and b
    void* const a_handle = Cache::handle(a);
    c.release(again);
    EXPECT_TRUE(f.live(a_handle)) << "deregistered while still held (a hold was given back twice)";
    c.release(*held);
    c.release(b);
    auto s = c.stats();
    EXPECT_EQ(s.held, 0u) << "a hold was given back twice (or not at all)";
    EXPECT_EQ(f.bad.load(), 0u) << "a registration was deregistered twice";
    made->reset();
    EXPECT_EQ(f.regs.load(), f.deregs.load());
    EXPECT_EQ(f.bad.load(), 0u);
    munmap(p, 2 * 4096);
  }
}

// A thread keeps a parked hold per slot of its parking: cycling through
// eight page-apart ranges, every hit after the first round takes a parked
// hold back (no atomic read-modify-write). An unmapping takes back that
// range's hold alone (and deregisters it); the others stay parked.
TEST(RegCache, ThreadParksAHoldPerRangeAndUnmapTakesBackOnlyItsOwn) {
  ThreadSafeFake f;
  auto made = Cache::create(f.registrar());
  ASSERT_TRUE(made);
  Cache& c = **made;
  NEED_MONITOR(&c);
  constexpr int kRanges = 8;
  char* p = map_anon(kRanges * 4096);
  std::vector<void*> handles;
  for (int i = 0; i < kRanges; ++i) {
    Cache::Entry* e = get(c, p + i * 4096, 4096);
    ASSERT_NE(e, nullptr);
    handles.push_back(Cache::handle(e));
    c.release(e);
  }
  const uint64_t parked_before = c.stats().parked_hits;
  for (int round = 0; round < 100; ++round) {
    for (int i = 0; i < kRanges; ++i) {
      Cache::Entry* e = c.hit_parked(p + i * 4096, 4096, 7);
      if (e == nullptr) {
        if (round == 0 && i == 0) GTEST_SKIP() << "nothing is parked here (no membarrier)";
        FAIL() << "range " << i << " was not parked (round " << round << ")";
      }
      EXPECT_EQ(Cache::handle(e), handles[i]);
      c.release(e);
    }
  }
  auto s = c.stats();
  EXPECT_EQ(s.parked_hits - parked_before, 100u * kRanges);
  EXPECT_EQ(s.held, 0u);
  EXPECT_FALSE(c.busy());
  // The fourth range goes away: its parked hold is taken back and it is
  // deregistered; the rest stay parked.
  ASSERT_EQ(munmap(p + 3 * 4096, 4096), 0);
  EXPECT_EQ(c.acquire_hit(p, 4096, 7), nullptr);  // the unmapping is not taken yet: the slow path
  auto r = c.acquire(p, 4096, 7, std::nullopt);  // takes it, then hits
  ASSERT_TRUE(r);
  EXPECT_EQ(Cache::handle(*r), handles[0]);
  c.release(*r);
  s = c.stats();
  EXPECT_EQ(s.invalidations, 1u);
  EXPECT_EQ(s.unparked, 1u);
  EXPECT_FALSE(f.live(handles[3]));
  for (int i = 0; i < kRanges; ++i) {
    if (i == 3) continue;
    EXPECT_TRUE(f.live(handles[i]));
    Cache::Entry* e = c.hit_parked(p + i * 4096, 4096, 7);
    EXPECT_NE(e, nullptr) << "range " << i << " lost its parked hold";
    if (e != nullptr) c.release(e);
  }
  made->reset();
  EXPECT_EQ(f.regs.load(), f.deregs.load());
  EXPECT_EQ(f.bad.load(), 0u);
  munmap(p, kRanges * 4096);
}

// Two ranges whose entries park in one slot (the same address, another
// length): the first parked keeps the slot. A hit of the second takes the
// slot's entry (the key is compared only once the hold is the thread's),
// finds it is the other range's and parks it again (hit_rest), then hits
// through the slot table; the first range's next hit is still a parked
// one, and no hold is lost or given back twice.
TEST(RegCache, AnotherRangeInTheSlotIsParkedAgain) {
  ThreadSafeFake f;
  auto made = Cache::create(f.registrar());
  ASSERT_TRUE(made);
  Cache& c = **made;
  NEED_MONITOR(&c);
  char* p = map_anon(2 * 4096);
  Cache::Entry* a = get(c, p, 4096);
  Cache::Entry* b = get(c, p, 2 * 4096);
  ASSERT_TRUE(a != nullptr && b != nullptr && a != b);
  c.release(a);  // parked
  c.release(b);  // its slot is taken: given back through the state word
  if (c.hit_parked(p, 4096, 7) == nullptr) GTEST_SKIP() << "nothing is parked here (no membarrier)";
  c.release(a);  // parked again
  const uint64_t parked_before = c.stats().parked_hits;
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(c.hit_parked(p, 2 * 4096, 7), nullptr) << "the slot's entry is the other range's";
    Cache::Entry* again = c.hit_rest(p, 2 * 4096, 7);
    ASSERT_EQ(again, b);
    c.release(again);
    Cache::Entry* first = c.hit_parked(p, 4096, 7);
    ASSERT_EQ(first, a) << "the first range lost its parked hold (round " << i << ")";
    c.release(first);
  }
  auto s = c.stats();
  EXPECT_EQ(s.parked_hits - parked_before, 100u);
  EXPECT_EQ(s.hits, 1u + 2 * 100);
  EXPECT_EQ(s.held, 0u);
  EXPECT_FALSE(c.busy());
  // And both go away with their memory: the parked one is taken back.
  ASSERT_EQ(munmap(p, 2 * 4096), 0);
  char* q = map_anon(4096);
  auto r = c.acquire(q, 4096, 7, std::nullopt);  // takes the unmapping
  ASSERT_TRUE(r);
  s = c.stats();
  EXPECT_EQ(s.invalidations, 2u);
  EXPECT_EQ(s.unparked, 1u);
  EXPECT_EQ(s.entries, 1u);  // q's
  c.release(*r);
  made->reset();
  munmap(q, 4096);
  EXPECT_EQ(f.regs.load(), f.deregs.load());
  EXPECT_EQ(f.bad.load(), 0u);
}

// If membarrier(2) fails (it cannot after its registration succeeded; the
// hook makes it), no parked hold may be taken back: the cache stops
// parking and leaves the slots' epochs odd, so each parked hold goes back
// through hit_rest(), which gives a dead one up (its memory went away)
// and keeps a live one. Nothing is deregistered twice or hit after its
// memory went away.
TEST(RegCache, MembarrierFailingStopsParkingAndDeadParkedHoldsAreGivenUp) {
  ThreadSafeFake f;
  auto made = Cache::create(f.registrar());
  ASSERT_TRUE(made);
  Cache& c = **made;
  NEED_MONITOR(&c);
  char* p = map_anon(2 * 4096);
  Cache::Entry* a = get(c, p, 4096);         // parked, then goes away
  Cache::Entry* b = get(c, p + 4096, 4096);  // parked, stays
  ASSERT_TRUE(a != nullptr && b != nullptr);
  void* const a_handle = Cache::handle(a);
  c.release(a);
  c.release(b);
  if (c.hit_parked(p, 4096, 7) == nullptr) GTEST_SKIP() << "nothing is parked here (no membarrier)";
  c.release(a);
  ufab::regcache::test_hooks::membarrier_fails = true;
  ASSERT_EQ(munmap(p, 4096), 0);
  auto other = c.acquire(p + 4096, 4096, 1, std::nullopt);  // takes the unmapping: a dies, parked
  ufab::regcache::test_hooks::membarrier_fails = false;
  ASSERT_TRUE(other);
  c.release(*other);  // not parked any more
  auto s = c.stats();
  EXPECT_EQ(s.invalidations, 1u);
  EXPECT_EQ(s.unparked, 0u) << "a parked hold was taken back without the barrier";
  EXPECT_TRUE(f.live(a_handle)) << "deregistered while its thread still has it parked";
  // The dead entry's thread hits its range: the parked hold is given up
  // (deregistered), and the lookup misses.
  EXPECT_EQ(c.hit_parked(p, 4096, 7), nullptr);
  EXPECT_EQ(c.hit_rest(p, 4096, 7), nullptr);
  EXPECT_FALSE(f.live(a_handle));
  // The live one is still this thread's, taken back through hit_rest(),
  // and released without parking from now on: every later hit is the
  // slot table's.
  const uint64_t parked_before = c.stats().parked_hits;
  EXPECT_EQ(c.hit_parked(p + 4096, 4096, 7), nullptr);
  Cache::Entry* kept = c.hit_rest(p + 4096, 4096, 7);
  ASSERT_EQ(kept, b);
  c.release(kept);
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(c.hit_parked(p + 4096, 4096, 7), nullptr);
    Cache::Entry* e = c.hit_rest(p + 4096, 4096, 7);
    ASSERT_EQ(e, b);
    c.release(e);
  }
  s = c.stats();
  EXPECT_EQ(s.parked_hits - parked_before, 1u);  // the one taken back through hit_rest()
  EXPECT_EQ(s.held, 0u);
  EXPECT_EQ(s.entries, 2u);  // b, and `other` (another access)
  EXPECT_FALSE(c.busy());
  made->reset();
  EXPECT_EQ(f.regs.load(), f.deregs.load());
  EXPECT_EQ(f.bad.load(), 0u);
  munmap(p + 4096, 4096);
}

}  // namespace
