// How much a key check costs on the hot path (one per incoming RDMA WRITE
// packet): MemoryRegionTable::check_remote (seqlock read + pin/unpin)
// against the obvious alternative, a std::shared_mutex over a hash map.
// Prints ns per check for 1 and N threads, all threads on one region (the
// worst case for the shared pin counter) and each on its own region.
//
//   bazel run -c opt //tests/unit/rdma:key_lookup_bench -- [threads] [iterations]
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/rdma/memory.h"

using namespace ufab::verbs;

namespace {

struct Baseline {
  struct Region {
    uint32_t pd;
    uint32_t access;
    uint64_t iova, length;
    uint8_t* host;
  };
  mutable std::shared_mutex mu;
  std::unordered_map<uint32_t, Region> map;

  uint8_t* check(uint32_t key, uint32_t pd, uint64_t va, uint64_t len, uint32_t needed) const {
    std::shared_lock lock(mu);
    auto it = map.find(key);
    if (it == map.end()) return nullptr;
    const Region& r = it->second;
    if (r.pd != pd || (r.access & needed) != needed) return nullptr;
    if (va < r.iova || len > r.length || va - r.iova > r.length - len) return nullptr;
    return r.host + (va - r.iova);
  }
};

template <typename F>
double run(int threads, uint64_t iters, F&& body) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> ts;
  std::vector<double> ns(threads);
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      ready.fetch_add(1);
      while (!go.load()) {
      }
      auto t0 = std::chrono::steady_clock::now();
      body(t, iters);
      auto t1 = std::chrono::steady_clock::now();
      ns[t] = std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(iters);
    });
  }
  while (ready.load() != threads) {
  }
  go.store(true);
  for (auto& th : ts) th.join();
  double sum = 0;
  for (double v : ns) sum += v;
  return sum / threads;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = argc > 1 ? std::atoi(argv[1]) : 4;
  uint64_t iters = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 5'000'000;
  auto table = std::move(*MemoryRegionTable::create({}));
  PdId pd = *table->alloc_pd();
  std::vector<std::vector<uint8_t>> bufs(threads, std::vector<uint8_t>(65536));
  std::vector<uint32_t> keys;
  Baseline base;
  for (int t = 0; t < threads; ++t) {
    keys.push_back(table->register_mr(pd, bufs[t].data(), 65536, kLocalWrite | kRemoteWrite)->rkey);
    base.map[keys.back()] = {pd.value, kLocalWrite | kRemoteWrite, reinterpret_cast<uintptr_t>(bufs[t].data()),
                             65536, bufs[t].data()};
  }
  // Other regions in the table, as in a real process.
  for (int i = 0; i < 1000; ++i) {
    uint32_t k = table->register_mr(pd, bufs[0].data(), 64, 0)->lkey;
    base.map[k] = {pd.value, 0, 0, 64, bufs[0].data()};
  }
  std::atomic<uint64_t> sink{0};
  auto table_body = [&](bool shared_region) {
    return [&, shared_region](int t, uint64_t n) {
      int r = shared_region ? 0 : t;
      uint64_t va = reinterpret_cast<uintptr_t>(bufs[r].data());
      uint64_t acc = 0;
      for (uint64_t i = 0; i < n; ++i) {
        auto a = table->check_remote(keys[r], pd, va + (i & 0xFFF) * 8, 1024, kRemoteWrite);
        acc += reinterpret_cast<uintptr_t>(a->data());
      }
      sink.fetch_add(acc);
    };
  };
  auto base_body = [&](bool shared_region) {
    return [&, shared_region](int t, uint64_t n) {
      int r = shared_region ? 0 : t;
      uint64_t va = reinterpret_cast<uintptr_t>(bufs[r].data());
      uint64_t acc = 0;
      for (uint64_t i = 0; i < n; ++i) {
        acc += reinterpret_cast<uintptr_t>(base.check(keys[r], pd.value, va + (i & 0xFFF) * 8, 1024, kRemoteWrite));
      }
      sink.fetch_add(acc);
    };
  };
  std::printf("%-44s %10s %10s\n", "ns per check", "1 thread", std::to_string(threads).append(" threads").c_str());
  std::printf("%-44s %10.1f %10.1f\n", "check_remote, own region per thread", run(1, iters, table_body(false)),
              run(threads, iters, table_body(false)));
  std::printf("%-44s %10.1f %10.1f\n", "check_remote, all threads on one region", run(1, iters, table_body(true)),
              run(threads, iters, table_body(true)));
  std::printf("%-44s %10.1f %10.1f\n", "shared_mutex + unordered_map, own region", run(1, iters, base_body(false)),
              run(threads, iters, base_body(false)));
  std::printf("%-44s %10.1f %10.1f\n", "shared_mutex + unordered_map, one region", run(1, iters, base_body(true)),
              run(threads, iters, base_body(true)));
  return sink.load() == 42 ? 1 : 0;
}
