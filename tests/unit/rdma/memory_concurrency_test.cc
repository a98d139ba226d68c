// Readers checking keys while other threads register and deregister. Run it
// under ThreadSanitizer too (docs/memory-keys.md says how): the buffers are
// written with plain stores both by readers holding an Access and by the
// deregistering thread right after deregister_mr returns, so a pin that
// fails to hold would show up as a data race, not just as a wrong answer.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_set>
#include <vector>

#include "core/rdma/memory.h"

namespace ufab::verbs {
namespace {

TEST(MemoryConcurrency, ReadersNeverTouchDeregisteredMemory) {
  MemoryTableOptions o;
  o.max_regions = 16;
  o.reuse_delay = 0;  // reuse slots at once: the stale-key paths get exercised
  o.drain_timeout = std::chrono::seconds(30);
  auto table = std::move(*MemoryRegionTable::create(o));
  PdId pd = *table->alloc_pd();

  constexpr int kBuffers = 8;
  constexpr int kReaders = 3;
  constexpr int kCycles = 4000;
  std::vector<std::vector<uint8_t>> bufs(kBuffers, std::vector<uint8_t>(256));
  std::array<std::atomic<uint32_t>, kBuffers> published{};
  for (int i = 0; i < kBuffers; ++i) {
    published[i].store(table->register_mr(pd, bufs[i].data(), 256, kLocalWrite | kRemoteWrite)->rkey);
  }

  std::atomic<bool> done{false};
  std::atomic<uint64_t> granted{0}, refused{0}, unexpected{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < kReaders; ++r) {
    readers.emplace_back([&, r] {
      std::mt19937 rng(r);
      while (!done.load(std::memory_order_relaxed)) {
        int i = static_cast<int>(rng() % kBuffers);
        uint32_t key = published[i].load(std::memory_order_acquire);
        if (key == 0) continue;
        uint64_t va = reinterpret_cast<uintptr_t>(bufs[i].data()) + r;
        auto a = table->check_remote(key, pd, va, 1, kRemoteWrite);
        if (a) {
          if (a->data() != bufs[i].data() + r) unexpected.fetch_add(1);
          a->data()[0] = static_cast<uint8_t>(r + 1);  // plain store under the pin
          granted.fetch_add(1, std::memory_order_relaxed);
        } else {
          KeyError kind = a.error().kind;
          if (kind != KeyError::kUnknownKey && kind != KeyError::kStaleKey && kind != KeyError::kOutOfBounds) {
            unexpected.fetch_add(1);
          }
          refused.fetch_add(1, std::memory_order_relaxed);
        }
      }
    });
  }

  std::mt19937 rng(99);
  for (int c = 0; c < kCycles; ++c) {
    int i = static_cast<int>(rng() % kBuffers);
    uint32_t key = published[i].exchange(0);
    ASSERT_TRUE(table->deregister_mr(key)) << "cycle " << c;
    std::memset(bufs[i].data(), 0xEE, bufs[i].size());  // the memory is ours again
    auto keys = table->register_mr(pd, bufs[i].data(), 256, kLocalWrite | kRemoteWrite);
    ASSERT_TRUE(keys) << keys.error().message();
    published[i].store(keys->rkey, std::memory_order_release);
    if (c % 64 == 0) std::this_thread::yield();
  }
  done.store(true);
  for (auto& t : readers) t.join();
  EXPECT_EQ(unexpected.load(), 0u);
  EXPECT_GT(granted.load(), 0u);
  EXPECT_EQ(table->live_regions(), static_cast<uint32_t>(kBuffers));
}

TEST(MemoryConcurrency, ConcurrentRegistrationsNeverShareALiveKey) {
  auto table = std::move(*MemoryRegionTable::create({}));
  PdId pd = *table->alloc_pd();
  std::mutex mu;
  std::unordered_set<uint32_t> live;
  std::atomic<int> collisions{0}, failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      uint8_t b[64];
      std::vector<uint32_t> mine;
      for (int i = 0; i < 3000; ++i) {
        auto keys = table->register_mr(pd, b, sizeof(b), kLocalWrite);
        if (!keys) {
          failures.fetch_add(1);
          continue;
        }
        {
          std::lock_guard lock(mu);
          if (!live.insert(keys->lkey).second) collisions.fetch_add(1);
        }
        mine.push_back(keys->lkey);
        if (mine.size() > 50) {
          uint32_t old = mine.front();
          mine.erase(mine.begin());
          {
            std::lock_guard lock(mu);
            live.erase(old);
          }
          if (!table->deregister_mr(old)) failures.fetch_add(1);
        }
        if (!table->check_local(keys->lkey, pd, reinterpret_cast<uintptr_t>(b), 64, true)) failures.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(collisions.load(), 0);
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(table->live_regions(), 4u * 50u);
}

}  // namespace
}  // namespace ufab::verbs
