// Cache hits through the C API for callgrind (tests/bench/regcache_insn.sh):
// after one warm-up registration of each range, N x (ufab_mr_cache_reg +
// ufab_mr_cache_release), every one a hit. `--ranges 1`: the same range each
// time (the thread's parked entry); `--ranges 8`: eight adjacent ranges in
// turn (the compare-and-swap path). The measured pairs run inside
// insn_measured(), which the script names to callgrind's --toggle-collect.
//
//   regcache_insn_bench [--bytes N] [--ranges K] [--n PAIRS]
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "ufab/rdma.h"

namespace {

int failures = 0;

[[gnu::noinline]] void insn_measured(ufab_mr_cache* cache, char* base, uint64_t bytes, int ranges, int n,
                                     uint32_t access) {
  for (int i = 0; i < n; ++i) {
    ufab_mr* mr = nullptr;
    if (ufab_mr_cache_reg(cache, base + static_cast<uint64_t>(i % ranges) * bytes, bytes, access, &mr) != 0) {
      ++failures;
      continue;
    }
    ufab_mr_cache_release(cache, mr);
  }
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t bytes = 4096;
  int ranges = 1, n = 100000;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--bytes") && i + 1 < argc) {
      bytes = std::strtoull(argv[++i], nullptr, 0);
    } else if (!std::strcmp(argv[i], "--ranges") && i + 1 < argc) {
      ranges = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--n") && i + 1 < argc) {
      n = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--bytes N] [--ranges K] [--n PAIRS]\n", argv[0]);
      return 2;
    }
  }
  if (ranges < 1 || n < 1 || bytes == 0) {
    std::fprintf(stderr, "regcache_insn_bench: --bytes, --ranges and --n must be positive\n");
    return 2;
  }
  ufab_device_opts o{};
  o.size = sizeof o;
  o.ip = "10.78.0.1";
  std::string name = "swnic:reginsn" + std::to_string(getpid()) + ":0";
  ufab_device* dev = nullptr;
  ufab_pd* pd = nullptr;
  ufab_mr_cache* cache = nullptr;
  if (ufab_device_open(name.c_str(), &o, &dev) != 0 || ufab_pd_alloc(dev, &pd) != 0 ||
      ufab_mr_cache_create(pd, nullptr, &cache) != 0) {
    std::fprintf(stderr, "regcache_insn_bench: %s\n", ufab_last_error());
    return 1;
  }
  const uint32_t access = UFAB_ACCESS_LOCAL_WRITE | UFAB_ACCESS_REMOTE_WRITE | UFAB_ACCESS_REMOTE_READ;
  void* p = mmap(nullptr, bytes * ranges, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("regcache_insn_bench: mmap");
    return 1;
  }
  char* base = static_cast<char*>(p);
  // Warm-up: one miss per range. Counted too (the toggle is on the
  // function), so the script subtracts two runs of different N.
  insn_measured(cache, base, bytes, ranges, ranges, access);
  insn_measured(cache, base, bytes, ranges, n, access);
  ufab_mr_cache_stats st{};
  ufab_mr_cache_query_stats(cache, &st);
  std::printf("regcache_insn_bench: %s; %d pairs of %llu bytes over %d range(s): hits %llu misses %llu\n",
              ufab_mr_cache_host_watch(cache), n, (unsigned long long)bytes, ranges, (unsigned long long)st.hits,
              (unsigned long long)st.misses);
  ufab_mr_cache_destroy(cache);
  munmap(p, bytes * ranges);
  ufab_pd_free(pd);
  ufab_device_close(dev);
  return failures == 0 && st.misses == static_cast<uint64_t>(ranges) ? 0 : 1;
}
