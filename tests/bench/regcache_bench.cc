// Registration through the cache over uncached registration (issue 12's
// goal: at most 0.01), through the C API on a soft-RoCE device over the
// software NIC: per size, the median of 5 runs of N x (ufab_mr_reg +
// ufab_mr_dereg) against N x (ufab_mr_cache_reg + ufab_mr_cache_release)
// of the same range (after one warm-up registration), in ns per pair;
// "host/8": eight 4 KiB ranges in turn, so that no hit is of the entry
// the thread released last (each has its own slot in the thread's
// parking).
// Host memory always; GPU device memory too where a GPU is present, with
// what a GPU hit asks CUDA, timed alone: the buffer id query a hit makes
// (cuPointerGetAttributes of one attribute), the full pointer attributes a
// miss asks for (six), and the whole miss-side classification
// (detect_region); and "cuda/w", GPU memory through a cache that watches
// GPU frees (UFAB_MR_CACHE_WATCH_GPU_FREES: CUPTI), whose hits ask CUDA
// nothing while no freeing call ran. Then the C++ cache alone on host memory (no
// registration behind it), with the share of its hits that took the
// thread's parked hold, and once with parking off (every hit the
// compare-and-swap path). Prints a table and writes JSON (--json FILE).
//
//   regcache_bench [--iters N] [--json FILE]
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "base/json.h"
#include "core/gpu/cuda.h"
#include "core/gpu/region.h"
#include "core/regcache/cache.h"
#include "ufab/rdma.h"

namespace {

using Clock = std::chrono::steady_clock;

double ns_per(Clock::duration d, int n) { return std::chrono::duration<double, std::nano>(d).count() / n; }

template <typename F>
double median_of_5(F&& run) {
  std::vector<double> v;
  for (int i = 0; i < 5; ++i) v.push_back(run());
  std::sort(v.begin(), v.end());
  return v[2];
}

struct CudaQuery {
  std::string what;
  uint64_t bytes;
  double ns;
};

struct Row {
  std::string memory;
  uint64_t bytes;
  double uncached_ns, cached_ns;
};

struct CxxRow {
  std::string what;    // "parked", or "cas" (Options::park_released off)
  uint64_t bytes;
  double ns;           // per Cache::acquire_hit + Cache::release
  double parked;       // of those hits, the share that took the thread's parked hold
};

}  // namespace

int main(int argc, char** argv) {
  int iters = 20000;
  const char* json_path = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) {
      iters = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--json") && i + 1 < argc) {
      json_path = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--iters N] [--json FILE]\n", argv[0]);
      return 2;
    }
  }
  ufab_device_opts o{};
  o.size = sizeof o;
  o.ip = "10.78.0.1";
  std::string name = "swnic:regbench" + std::to_string(getpid()) + ":0";
  ufab_device* dev = nullptr;
  ufab_pd* pd = nullptr;
  if (ufab_device_open(name.c_str(), &o, &dev) != 0 || ufab_pd_alloc(dev, &pd) != 0) {
    std::fprintf(stderr, "regcache_bench: %s\n", ufab_last_error());
    return 1;
  }
  ufab_mr_cache* cache = nullptr;
  ufab_mr_cache* watched = nullptr;  // watching GPU frees (the cuda/w rows)
  if (ufab_mr_cache_create(pd, nullptr, &cache) != 0) {
    std::fprintf(stderr, "regcache_bench: %s\n", ufab_last_error());
    return 1;
  }
  const uint32_t access = UFAB_ACCESS_LOCAL_WRITE | UFAB_ACCESS_REMOTE_WRITE | UFAB_ACCESS_REMOTE_READ;
  std::vector<Row> rows;
  std::vector<CudaQuery> queries;
  bool failed = false;
  // `ranges` > 1: pair i uses the (i % ranges)-th of that many adjacent
  // ranges of n bytes, so no pair repeats the one before it.
  auto measure = [&](const char* memory, void* base, uint64_t n, int ranges = 1, ufab_mr_cache* through = nullptr) {
    ufab_mr_cache* cache_used = through ? through : cache;
    auto at = [&](int i) { return static_cast<char*>(base) + static_cast<uint64_t>(i % ranges) * n; };
    int it = n >= (64u << 20) ? std::max(1, iters / 10) : iters;
    double unc = median_of_5([&] {
      auto t0 = Clock::now();
      for (int i = 0; i < it; ++i) {
        ufab_mr* mr = nullptr;
        if (ufab_mr_reg(pd, at(i), n, access, &mr) != 0 || ufab_mr_dereg(mr) != 0) failed = true;
      }
      return ns_per(Clock::now() - t0, it);
    });
    for (int r = 0; r < ranges; ++r) {
      ufab_mr* warm = nullptr;
      if (ufab_mr_cache_reg(cache_used, at(r), n, access, &warm) != 0) failed = true;
      ufab_mr_cache_release(cache_used, warm);
    }
    double cached = median_of_5([&] {
      auto t0 = Clock::now();
      for (int i = 0; i < it; ++i) {
        ufab_mr* mr = nullptr;
        if (ufab_mr_cache_reg(cache_used, at(i), n, access, &mr) != 0) failed = true;
        ufab_mr_cache_release(cache_used, mr);
      }
      return ns_per(Clock::now() - t0, it);
    });
    rows.push_back({memory, n, unc, cached});
  };
  for (uint64_t n : {4096ull, 1ull << 20, 64ull << 20}) {
    void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    std::memset(p, 1, n);
    measure("host", p, n);
    munmap(p, n);
  }
  {
    // Eight buffers in turn: a hit is never of the entry this thread
    // released last (each is parked in a slot of its own).
    const uint64_t n = 4096;
    void* p = mmap(nullptr, 8 * n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    std::memset(p, 1, 8 * n);
    measure("host/8", p, n, 8);
    munmap(p, 8 * n);
  }
  // The C++ cache alone, with a registrar that registers nothing: the same
  // host sizes in the same order (each range unmapped before the next, as
  // above), and how many of the hits took the thread's parked hold. Says
  // what the C API adds, and whether parking still works on this machine
  // after the cache took unmap events back (a membarrier each time).
  std::vector<CxxRow> cxx_rows;
  std::string cxx_note;
  auto cxx = [&](bool park, std::initializer_list<uint64_t> sizes) {
    ufab::regcache::Registrar none;
    none.reg = [](void*, uint64_t, uint32_t) -> ufab::Result<void*> { return reinterpret_cast<void*>(1); };
    none.dereg = [](void*) {};
    ufab::regcache::Options opts;
    opts.park_released = park;
    auto made = ufab::regcache::Cache::create(std::move(none), opts);
    if (!made) {
      cxx_note = made.error().message();
      return;
    }
    ufab::regcache::Cache& cc = **made;
    if (cc.host_watch() != "userfaultfd") cxx_note = cc.host_watch();
    for (uint64_t n : sizes) {
      void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      std::memset(p, 1, n);
      auto warm = cc.acquire(p, n, access, std::nullopt);
      if (!warm) {
        failed = true;
        munmap(p, n);
        continue;
      }
      cc.release(*warm);
      const uint64_t parked_before = cc.stats().parked_hits;
      int it = n >= (64u << 20) ? std::max(1, iters / 10) : iters;
      double ns = median_of_5([&] {
        auto t0 = Clock::now();
        for (int i = 0; i < it; ++i) {
          ufab::regcache::Cache::Entry* e = cc.acquire_hit(p, n, access);
          if (e == nullptr) {
            auto r = cc.acquire(p, n, access, std::nullopt);
            if (!r) {
              failed = true;
              continue;
            }
            e = *r;
          }
          cc.release(e);
        }
        return ns_per(Clock::now() - t0, it);
      });
      cxx_rows.push_back({park ? "parked" : "cas", n, ns,
                          double(cc.stats().parked_hits - parked_before) / (5.0 * it)});
      munmap(p, n);
    }
  };
  cxx(true, {4096ull, 1ull << 20, 64ull << 20});
  cxx(false, {4096ull});
  std::string gpu_note = ufab::gpu::unavailable_reason();
  if (gpu_note.empty()) {
    const ufab::gpu::Driver* d = *ufab::gpu::Driver::get();
    for (uint64_t n : {4096ull, 1ull << 20, 64ull << 20}) {
      auto mem = ufab::gpu::Allocation::allocate(*d, 0, ufab::gpu::Allocation::Kind::kDevice, n);
      if (!mem) {
        std::fprintf(stderr, "regcache_bench: %s\n", mem.error().message().c_str());
        return 1;
      }
      measure("cuda", mem->data(), n);
      void* p = mem->data();
      auto time_query = [&](const char* what, auto&& call) {
        double ns = median_of_5([&] {
          auto t0 = Clock::now();
          for (int i = 0; i < iters; ++i) {
            if (!call()) failed = true;
          }
          return ns_per(Clock::now() - t0, iters);
        });
        queries.push_back({what, n, ns});
      };
      time_query("buffer_id", [&] { return static_cast<bool>(d->buffer_id(p)); });
      time_query("pointer_info", [&] { return static_cast<bool>(d->pointer_info(p)); });
      time_query("detect_region", [&] { return static_cast<bool>(ufab::gpu::detect_region(p, n, false)); });
    }
    // The same through a cache that watches GPU frees (CUPTI; after the
    // rows above, since the watch stays on for the process).
    ufab_mr_cache_attr wa{};
    wa.size = sizeof wa;
    wa.flags = UFAB_MR_CACHE_WATCH_GPU_FREES;
    if (ufab_mr_cache_create(pd, &wa, &watched) != 0) {
      std::fprintf(stderr, "regcache_bench: %s\n", ufab_last_error());
      return 1;
    }
    if (std::string(ufab_mr_cache_gpu_watch(watched)) == "cupti") {
      for (uint64_t n : {4096ull, 1ull << 20, 64ull << 20}) {
        auto mem = ufab::gpu::Allocation::allocate(*d, 0, ufab::gpu::Allocation::Kind::kDevice, n);
        if (!mem) {
          std::fprintf(stderr, "regcache_bench: %s\n", mem.error().message().c_str());
          return 1;
        }
        measure("cuda/w", mem->data(), n, 1, watched);
      }
    }
  }
  // The floor of a lock-free hit + release: the two atomic
  // read-modify-writes it is made of (a compare-and-swap to hold, a
  // decrement to release), alone on a word of this thread's.
  std::atomic<uint64_t> word{0};
  const double rmw_floor_ns = median_of_5([&] {
    auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) {
      uint64_t v = word.load(std::memory_order_acquire);
      word.compare_exchange_weak(v, v + 3, std::memory_order_acq_rel, std::memory_order_acquire);
      word.fetch_sub(1, std::memory_order_acq_rel);
    }
    return ns_per(Clock::now() - t0, iters);
  });
  ufab_mr_cache_stats st{};
  ufab_mr_cache_query_stats(cache, &st);
  if (failed) std::fprintf(stderr, "regcache_bench: a registration failed: %s\n", ufab_last_error());
  std::printf("registration cache (%s), %d pairs per run, median of 5; ns per register+deregister pair\n",
              ufab_mr_cache_host_watch(cache), iters);
  std::printf("%-6s %10s %12s %12s %10s\n", "memory", "bytes", "uncached_ns", "cached_ns", "ratio");
  for (const Row& r : rows) {
    std::printf("%-6s %10llu %12.1f %12.1f %10.4f\n", r.memory.c_str(), (unsigned long long)r.bytes, r.uncached_ns,
                r.cached_ns, r.cached_ns / r.uncached_ns);
  }
  std::printf("floor of a hit: one compare-and-swap + one atomic decrement alone: %.1f ns\n", rmw_floor_ns);
  std::printf("C++ cache alone (no registration behind it): ns per acquire_hit + release, share of parked hits%s%s\n",
              cxx_note.empty() ? "" : "; ", cxx_note.c_str());
  for (const CxxRow& r : cxx_rows) {
    std::printf("c++ %-6s %10llu %12.1f %11.0f%%\n", r.what.c_str(), (unsigned long long)r.bytes, r.ns,
                100 * r.parked);
  }
  if (!gpu_note.empty()) std::printf("cuda: not measured (%s)\n", gpu_note.c_str());
  if (watched != nullptr) {
    std::printf("cuda/w: a cache watching GPU frees (UFAB_MR_CACHE_WATCH_GPU_FREES): %s\n",
                ufab_mr_cache_gpu_watch(watched));
  }
  if (!queries.empty()) {
    std::printf("what a GPU hit asks CUDA, alone (ns per call, median of 5 runs of %d):\n", iters);
    std::printf("%-14s %10s %10s\n", "query", "bytes", "ns");
    for (const CudaQuery& q : queries) {
      std::printf("%-14s %10llu %10.1f\n", q.what.c_str(), (unsigned long long)q.bytes, q.ns);
    }
  }
  std::printf("cache: hits %llu misses %llu invalidations %llu\n", (unsigned long long)st.hits,
              (unsigned long long)st.misses, (unsigned long long)st.invalidations);
  if (json_path) {
    ufab::JsonWriter w;
    w.begin_object().field("bench", "regcache").field("host_watch", ufab_mr_cache_host_watch(cache));
    w.field("iters", static_cast<int64_t>(iters)).field("rmw_floor_ns", rmw_floor_ns).key("rows").begin_array();
    for (const Row& r : rows) {
      w.begin_object().field("memory", r.memory).field("bytes", static_cast<int64_t>(r.bytes));
      w.field("uncached_ns", r.uncached_ns).field("cached_ns", r.cached_ns);
      w.field("ratio", r.cached_ns / r.uncached_ns).end_object();
    }
    w.end_array().key("cxx_rows").begin_array();
    for (const CxxRow& r : cxx_rows) {
      w.begin_object().field("path", r.what).field("bytes", static_cast<int64_t>(r.bytes)).field("ns", r.ns);
      w.field("parked_share", r.parked).end_object();
    }
    w.end_array().key("cuda_queries").begin_array();
    for (const CudaQuery& q : queries) {
      w.begin_object().field("query", q.what).field("bytes", static_cast<int64_t>(q.bytes));
      w.field("ns", q.ns).end_object();
    }
    w.end_array().end_object();
    if (FILE* f = std::fopen(json_path, "w")) {
      std::fprintf(f, "%s\n", w.str().c_str());
      std::fclose(f);
    }
  }
  ufab_mr_cache_destroy(cache);
  if (watched != nullptr) ufab_mr_cache_destroy(watched);
  ufab_pd_free(pd);
  ufab_device_close(dev);
  return failed ? 1 : 0;
}
