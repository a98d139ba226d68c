#include "core/staging/pool.h"

#include <cstdlib>

#include "core/staging/cuda_engine.h"
#include "core/staging/fake_engine.h"

namespace ufab::staging {

namespace {

Result<uint64_t> number(const std::string& key, const std::string& v, uint64_t lo, uint64_t hi, const char* what) {
  char* end = nullptr;
  unsigned long long n = std::strtoull(v.c_str(), &end, 10);
  uint64_t mult = 1;
  if (end != nullptr && (*end == 'k' || *end == 'K')) mult = 1024, ++end;
  else if (end != nullptr && (*end == 'm' || *end == 'M')) mult = 1024 * 1024, ++end;
  if (v.empty() || end == nullptr || *end != '\0' || n * mult < lo || n * mult > hi) {
    return fail(EINVAL, "parameter " + key + "=" + v + ": " + what);
  }
  return n * mult;
}

}  // namespace

Result<Params> take_params(std::map<std::string, std::string>& params) {
  Params p;
  bool slots_given = false;
  for (auto it = params.begin(); it != params.end();) {
    const std::string& k = it->first;
    const std::string& v = it->second;
    if (k == "gpu_copy") {
      if (v != "cuda" && v != "fake") {
        return fail(EINVAL, "parameter gpu_copy=" + v + ": use gpu_copy=cuda (the default) or gpu_copy=fake (a "
                            "testing aid: a thread copies, and host memory registered as UFAB_MEM_CUDA counts as GPU "
                            "memory)");
      }
      p.fake = v == "fake";
    } else if (k == "gpu_frag") {
      auto n = number(k, v, 4096, 64ull << 20, "give the staging fragment size in bytes (k/m suffixes), a multiple of "
                                               "4096 from 4k to 64m");
      if (!n) return std::unexpected(n.error());
      if (*n % 4096 != 0) {
        return fail(EINVAL, "parameter gpu_frag=" + v + ": the fragment size must be a multiple of 4096, so no packet "
                            "of any path MTU spans two fragments");
      }
      p.frag = *n;
    } else if (k == "gpu_depth") {
      auto n = number(k, v, 1, 1024, "give the fragments staged ahead per stream, 1..1024");
      if (!n) return std::unexpected(n.error());
      p.depth = static_cast<uint32_t>(*n);
    } else if (k == "gpu_slots") {
      auto n = number(k, v, 2, 65536, "give the number of pinned staging slots, 2..65536");
      if (!n) return std::unexpected(n.error());
      p.slots = static_cast<uint32_t>(*n);
      slots_given = true;
    } else if (k == "gpu_fake_delay_us") {
      auto n = number(k, v, 0, 10'000'000, "give the fake copy delay in microseconds, 0..10000000");
      if (!n) return std::unexpected(n.error());
      p.fake_delay = std::chrono::microseconds(*n);
    } else if (k == "gpu_fake_order") {
      if (v != "fifo" && v != "random") {
        return fail(EINVAL, "parameter gpu_fake_order=" + v + ": use fifo or random");
      }
      p.fake_random = v == "random";
    } else {
      ++it;
      continue;
    }
    it = params.erase(it);
  }
  if (!slots_given) p.slots = std::max<uint32_t>(p.slots, 2 * p.depth);
  if (p.slots < 2 * p.depth) {
    return fail(EINVAL, "parameter gpu_slots=" + std::to_string(p.slots) + " is below 2 * gpu_depth (" +
                            std::to_string(2 * p.depth) + "): each queue pair stages up to gpu_depth fragments "
                            "each way");
  }
  return p;
}

Result<std::unique_ptr<Pool>> Pool::create(const Params& params, int ordinal) {
  std::unique_ptr<Pool> pool(new Pool());
  pool->params_ = params;
  pool->ordinal_ = ordinal;
  if (params.fake) {
    auto e = FakeCopyEngine::create(FakeOptions{.delay = params.fake_delay, .random_order = params.fake_random});
    if (!e) return std::unexpected(e.error());
    pool->engine_ = std::move(*e);
  } else {
    auto e = CudaCopyEngine::create(ordinal);
    if (!e) return std::unexpected(e.error());
    pool->engine_ = std::move(*e);
  }
  auto mem = pool->engine_->alloc_host(params.frag * params.slots);
  if (!mem) {
    return std::unexpected(mem.error().context("GPU staging pool of " + std::to_string(params.slots) + " slots of " +
                                               std::to_string(params.frag) + " bytes (lower gpu_slots or gpu_frag)"));
  }
  pool->base_ = static_cast<uint8_t*>(*mem);
  pool->free_.reserve(params.slots);
  for (uint32_t i = params.slots; i > 0; --i) pool->free_.push_back(i - 1);
  return pool;
}

Pool::~Pool() {
  if (engine_) {
    engine_.reset();  // the thread finishes or drops what is queued first
  }
}

void Pool::reap_locked() {
  std::erase_if(orphans_, [&](const Orphan& o) {
    if (engine_->state(o.ticket) == CopyEngine::kPending) return false;
    engine_->release(o.ticket);
    if (o.slot) free_.push_back(*o.slot);
    return true;
  });
}

std::optional<uint32_t> Pool::take() {
  std::lock_guard lock(mu_);
  if (free_.empty() && !orphans_.empty()) reap_locked();
  if (free_.empty()) return std::nullopt;
  uint32_t s = free_.back();
  free_.pop_back();
  return s;
}

bool Pool::take_n(uint32_t n, std::vector<uint32_t>& out) {
  std::lock_guard lock(mu_);
  if (free_.size() < n && !orphans_.empty()) reap_locked();
  if (free_.size() < n) return false;
  for (uint32_t i = 0; i < n; ++i) {
    out.push_back(free_.back());
    free_.pop_back();
  }
  return true;
}

void Pool::give(uint32_t i) {
  std::lock_guard lock(mu_);
  free_.push_back(i);
}

void Pool::orphan(uint32_t ticket, std::optional<uint32_t> slot) {
  std::lock_guard lock(mu_);
  orphans_.push_back(Orphan{ticket, slot});
  reap_locked();
}

uint32_t Pool::free_slots() {
  std::lock_guard lock(mu_);
  reap_locked();
  return static_cast<uint32_t>(free_.size());
}

}  // namespace ufab::staging
