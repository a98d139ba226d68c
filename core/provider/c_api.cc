// The C API (<ufab/rdma.h>) over the RDMA provider layer: picks the
// provider from the device name, owns the public handles and their
// lifetimes, and dispatches every call to the provider's table.
//
// Lifetimes: each handle counts the references to it (the application's,
// plus one per child that uses it: a QP holds its PD and CQs, an MR its PD,
// everything its device). Destroying drops the application's reference; the
// provider's object goes when the last reference does, so providers always
// see children destroyed first and applications may destroy in any order.
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>

#include "core/gpu/free_watch.h"
#include "core/gpu/region.h"
#include "core/regcache/cache.h"
#include "core/provider/providers.h"
#include "core/provider/registries.h"
#include "core/transport/verbs.h"
#include "ufab/rdma.h"

namespace {

using ufab::provider::last_error;

void set_error(const char* message) { last_error() = message != nullptr ? message : ""; }
void log_message(int level, const char* message) {
  static const char* const kLevels[] = {"error", "warning", "info", "debug"};
  if (level <= 1) std::fprintf(stderr, "ufab %s: %s\n", kLevels[level < 0 ? 0 : level], message);
}

const ufab_rdma_host kHost = {.size = sizeof(ufab_rdma_host), .reserved = 0, .set_error = set_error, .log = log_message};

int error(int err, const std::string& message) {
  last_error() = message;
  return -err;
}

// A reference count; release() returns true for the last one.
struct Refs {
  std::atomic<uint32_t> n{1};
  void hold() { n.fetch_add(1, std::memory_order_relaxed); }
  bool release() { return n.fetch_sub(1, std::memory_order_acq_rel) == 1; }
};

}  // namespace

struct ufab_device {
  Refs refs;
  const ufab_rdma_provider* ops;
  ufab_rdma_dev* p;
  ufab_device_attr attr;
};

struct ufab_pd {
  Refs refs;
  ufab_device* dev;
  ufab_rdma_pd* p;
};

namespace {
// A region's `cache` when no registration cache owns it: not null, so
// that ufab_mr_cache_release's one compare (mr->cache == cache) also
// refuses a null cache.
char not_cached_tag;
ufab_mr_cache* not_cached() { return reinterpret_cast<ufab_mr_cache*>(&not_cached_tag); }
}  // namespace

// On a cache line of its own: a cached region is read by every hit's
// release (cache, entry), so nothing another thread writes shares it.
struct alignas(64) ufab_mr {
  ufab_pd* pd;
  ufab_rdma_mr* p;
  uint32_t lkey, rkey;
  ufab_mr_cache* cache = not_cached();  // else owned by that registration cache
  void* entry = nullptr;                // its regcache::Cache::Entry
};

// The cache itself (no pointer between a hit and the cache's fields).
struct ufab_mr_cache final : ufab::regcache::Cache {
  // Registers through `owner` (ufab_mr_cache_create).
  ufab_mr_cache(ufab_pd* owner, ufab::regcache::Options options, std::string gpu_watch);
  ufab_pd* pd;
  std::string gpu_watch;  // ufab_mr_cache_gpu_watch
};

struct ufab_cq {
  Refs refs;
  const ufab_rdma_provider* ops;  // the device's, kept here for the poll path
  ufab_device* dev;
  ufab_rdma_cq* p;
  uint32_t depth;
};

struct ufab_qp {
  const ufab_rdma_provider* ops;  // the device's, kept here for the post path
  ufab_pd* pd;
  ufab_cq* send_cq;
  ufab_cq* recv_cq;
  ufab_rdma_qp* p;
  uint32_t qpn;
  uint32_t type;
};

struct ufab_ah {
  ufab_pd* pd;
  ufab_rdma_ah* p;
  ufab_av av;
};

namespace {

void release(ufab_device* dev) {
  if (dev->refs.release()) {
    dev->ops->close_device(dev->p);
    delete dev;
  }
}

void release(ufab_pd* pd) {
  if (pd->refs.release()) {
    // Cannot be busy: every region, QP and AH of it holds a reference.
    (void)pd->dev->ops->dealloc_pd(pd->p);
    release(pd->dev);
    delete pd;
  }
}

void release(ufab_cq* cq) {
  if (cq->refs.release()) {
    (void)cq->dev->ops->destroy_cq(cq->p);
    release(cq->dev);
    delete cq;
  }
}

const ufab_rdma_provider* ops(const ufab_pd* pd) { return pd->dev->ops; }
const ufab_rdma_provider* ops(const ufab_qp* qp) { return qp->ops; }
const ufab_rdma_provider* ops(const ufab_cq* cq) { return cq->ops; }

// For a name the fallback provider could not open: when it looks like
// "PREFIX:..." and no provider serves PREFIX, say so and name those there
// are (a plugin missing from the plugin directory shows up here).
std::string unserved_prefix_hint(const std::string& name) {
  auto colon = name.find(':');
  if (colon == std::string::npos || colon == 0) return "";
  std::string prefix = name.substr(0, colon);
  bool pci_domain = prefix.size() == 4 && prefix.find_first_not_of("0123456789abcdefABCDEF") == std::string::npos;
  if (pci_domain) return "";
  std::string known;
  for (const auto& p : ufab::provider::providers().providers()) known += (known.empty() ? "" : ", ") + p->name;
  return "; nor does any RDMA provider serve \"" + prefix + ":\" (providers: " + known +
         "; `ufab plugins` lists them, and UFAB_PLUGIN_PATH says where plugins are looked for)";
}

#define UFAB_REQUIRE(cond, what)                                          \
  do {                                                                    \
    if (!(cond)) return error(EINVAL, std::string(__func__) + ": " what); \
  } while (0)

}  // namespace

extern "C" {

const char* ufab_last_error(void) { return last_error().c_str(); }

// ------------------------------------------------------------------- device

int ufab_device_open(const char* name, const ufab_device_opts* opts, ufab_device** out) {
  UFAB_REQUIRE(name != nullptr && out != nullptr, "name and out are required");
  ufab_device_opts o{};
  o.size = sizeof o;
  if (opts != nullptr) {
    if (opts->size < offsetof(ufab_device_opts, progress_thread)) {
      return error(EINVAL, "ufab_device_open: opts->size is " + std::to_string(opts->size) +
                               "; set it to sizeof(struct ufab_device_opts)");
    }
    std::memcpy(&o, opts, std::min<size_t>(opts->size, sizeof o));
  }
  try {
    auto provider = ufab::provider::providers().for_device(name);
    if (!provider) return error(provider.error().code(), provider.error().message());
    const ufab_rdma_provider* table = &(*provider)->ops;
    ufab_rdma_dev* p = nullptr;
    last_error().clear();
    if (int rc = table->open_device(&kHost, name, &o, &p); rc < 0) {
      if (last_error().empty()) last_error() = std::string("opening ") + name + ": " + std::strerror(-rc);
      if (rc == -EINVAL && (*provider)->prefixes.empty()) last_error() += unserved_prefix_hint(name);
      return rc;
    }
    auto* dev = new ufab_device{{}, table, p, {}};
    (void)table->query_device(p, &dev->attr);
    *out = dev;
    return 0;
  } catch (const std::bad_alloc&) {
    return error(ENOMEM, std::string("opening ") + name + ": out of memory");
  }
}

void ufab_device_close(ufab_device* dev) {
  if (dev != nullptr) release(dev);
}

int ufab_device_query(ufab_device* dev, ufab_device_attr* out) {
  UFAB_REQUIRE(dev != nullptr && out != nullptr, "dev and out are required");
  *out = dev->attr;
  return 0;
}

int ufab_device_query_stats(ufab_device* dev, ufab_device_stats* out) {
  UFAB_REQUIRE(dev != nullptr && out != nullptr, "dev and out are required");
  *out = {};
  return dev->ops->device_stats(dev->p, out);
}

int ufab_device_progress(ufab_device* dev) { return dev->ops->progress(dev->p); }
int ufab_device_start_progress_thread(ufab_device* dev) { return dev->ops->start_progress_thread(dev->p); }
void ufab_device_stop_progress_thread(ufab_device* dev) { dev->ops->stop_progress_thread(dev->p); }

// ------------------------------------------------------------------- PD, MR

int ufab_pd_alloc(ufab_device* dev, ufab_pd** out) {
  UFAB_REQUIRE(dev != nullptr && out != nullptr, "dev and out are required");
  ufab_rdma_pd* p = nullptr;
  if (int rc = dev->ops->alloc_pd(dev->p, &p); rc < 0) return rc;
  dev->refs.hold();
  *out = new ufab_pd{{}, dev, p};
  return 0;
}

int ufab_pd_free(ufab_pd* pd) {
  if (pd != nullptr) release(pd);
  return 0;
}

int ufab_mr_reg_attr(ufab_pd* pd, const ufab_mr_attr* attr, ufab_mr** out) {
  UFAB_REQUIRE(pd != nullptr && attr != nullptr && out != nullptr, "pd, attr and out are required");
  UFAB_REQUIRE(attr->size >= offsetof(ufab_mr_attr, mem_type), "attr->size must be sizeof(struct ufab_mr_attr)");
  ufab_mr_attr a{};
  std::memcpy(&a, attr, std::min<size_t>(attr->size, sizeof a));
  a.size = sizeof a;
  // Memory registered as host memory may be GPU memory: where the process
  // has the CUDA driver loaded, its pointer attributes say (a process
  // without it has no GPU pointers and pays nothing). Device memory is
  // handed to the provider as UFAB_MEM_CUDA, so no provider ever copies
  // from it as if it were host memory; managed memory is refused here.
  if (a.mem_type == UFAB_MEM_HOST && a.addr != nullptr && a.length > 0) {
    auto region = ufab::gpu::detect_region(a.addr, a.length, false);
    if (!region) return error(region.error().code(), "ufab_mr_reg: " + region.error().message());
    if (region->device) a.mem_type = UFAB_MEM_CUDA;
  }
  ufab_rdma_mr* p = nullptr;
  uint32_t lkey = 0, rkey = 0;
  if (int rc = ops(pd)->reg_mr(pd->p, &a, &p, &lkey, &rkey); rc < 0) return rc;
  pd->refs.hold();
  *out = new ufab_mr{pd, p, lkey, rkey};
  return 0;
}

int ufab_mr_reg(ufab_pd* pd, void* addr, uint64_t length, uint32_t access, ufab_mr** out) {
  ufab_mr_attr a{.size = sizeof a, .access = access, .addr = addr, .length = length, .mem_type = UFAB_MEM_HOST,
                 .reserved = 0};
  return ufab_mr_reg_attr(pd, &a, out);
}

uint32_t ufab_mr_lkey(const ufab_mr* mr) { return mr->lkey; }
uint32_t ufab_mr_rkey(const ufab_mr* mr) { return mr->rkey; }

int ufab_mr_dereg(ufab_mr* mr) {
  if (mr == nullptr) return 0;
  if (mr->cache != not_cached()) {
    return error(EINVAL, "ufab_mr_dereg: this region belongs to a registration cache; give it back with "
                         "ufab_mr_cache_release");
  }
  if (int rc = ops(mr->pd)->dereg_mr(mr->p); rc < 0) return rc;
  release(mr->pd);
  delete mr;
  return 0;
}

// --------------------------------------------------------- registration cache

}  // extern "C"

namespace {

// What cache `c` registers with (called with its mutex held).
ufab::regcache::Registrar cache_registrar(ufab_mr_cache* c) {
  ufab::regcache::Registrar r;
  r.reg = [c](void* addr, uint64_t length, uint32_t access) -> ufab::Result<void*> {
    ufab_mr_attr a{.size = sizeof a, .access = access, .addr = addr, .length = length, .mem_type = UFAB_MEM_HOST,
                   .reserved = 0};
    ufab_mr* mr = nullptr;
    if (int rc = ufab_mr_reg_attr(c->pd, &a, &mr); rc < 0) return ufab::fail(-rc, ufab_last_error());
    mr->cache = c;
    return static_cast<void*>(mr);
  };
  r.dereg = [](void* handle) {
    auto* mr = static_cast<ufab_mr*>(handle);
    mr->cache = not_cached();
    (void)ufab_mr_dereg(mr);
  };
  // The entry is kept in the region once, before any thread can hit it:
  // a hit writes nothing to the region, a release reads it.
  r.bind = [](void* handle, void* entry) { static_cast<ufab_mr*>(handle)->entry = entry; };
  return r;
}

}  // namespace

ufab_mr_cache::ufab_mr_cache(ufab_pd* owner, ufab::regcache::Options options, std::string watch)
    : Cache(cache_registrar(this), options), pd(owner), gpu_watch(std::move(watch)) {}

extern "C" {

int ufab_mr_cache_create(ufab_pd* pd, const ufab_mr_cache_attr* attr, ufab_mr_cache** out) {
  UFAB_REQUIRE(pd != nullptr && out != nullptr, "pd and out are required");
  ufab::regcache::Options options;
  std::string gpu_watch = "not asked (UFAB_MR_CACHE_WATCH_GPU_FREES): every GPU hit asks CUDA for the buffer id";
  if (attr != nullptr) {
    UFAB_REQUIRE(attr->size >= offsetof(ufab_mr_cache_attr, flags),
                 "attr->size must be sizeof(struct ufab_mr_cache_attr)");
    if (attr->max_entries != 0) options.max_entries = attr->max_entries;
    if (attr->max_bytes != 0) options.max_bytes = attr->max_bytes;
    const uint32_t flags = attr->size >= sizeof(ufab_mr_cache_attr) ? attr->flags : 0;
    UFAB_REQUIRE((flags & ~UFAB_MR_CACHE_WATCH_GPU_FREES) == 0, "attr->flags has a flag this library does not know");
    if (flags & UFAB_MR_CACHE_WATCH_GPU_FREES) {
      auto w = ufab::gpu::watch_frees();
      if (w) {
        options.gpu_events = *w;
        gpu_watch = "cupti";
      } else {
        gpu_watch = w.error().message() + " (every GPU hit asks CUDA for the buffer id)";
      }
    }
  }
  if (auto ok = ufab::regcache::Cache::check(cache_registrar(nullptr), options); !ok) {
    return error(ok.error().code(), "ufab_mr_cache_create: " + ok.error().message());
  }
  *out = new ufab_mr_cache(pd, options, std::move(gpu_watch));
  pd->refs.hold();
  return 0;
}

int ufab_mr_cache_destroy(ufab_mr_cache* c) {
  if (c == nullptr) return 0;
  if (c->busy()) {
    return error(EBUSY, "ufab_mr_cache_destroy: regions from this cache are still held; release them first");
  }
  ufab_pd* pd = c->pd;
  delete c;
  release(pd);
  return 0;
}

}  // extern "C"

namespace {

// The cold end of the cache's C calls: argument errors, and everything but
// a hit, out of line so that the hit path has no frame to set up.
[[gnu::cold, gnu::noinline]] int invalid_argument(const char* func, const char* what) {
  return error(EINVAL, std::string(func) + ": " + what);
}

// A miss, or GPU memory (cache_reg_rest's tail call).
[[gnu::noinline]] int cache_reg_miss(ufab_mr_cache* c, void* addr, uint64_t length, uint32_t access, ufab_mr** out) {
  std::optional<uint64_t> gpu_buffer;
  // With the free watch, the count read before the questions below is the
  // one their answer holds for (gpu_checked): a free that ran meanwhile
  // moved it, on entering and on returning.
  const auto* watch = c->gpu_events();
  const uint64_t count = watch ? watch->load(std::memory_order_acquire) : 0;
  if (addr != nullptr && length > 0) {
    // GPU memory hits on its buffer id: one cuPointerGetAttributes of one
    // attribute. An entry of that id was classified when it was
    // registered, and the id names that one allocation for the life of
    // the process.
    if (const ufab::gpu::Driver* d = ufab::gpu::Driver::if_loaded()) {
      auto id = d->buffer_id(addr);
      if (id && *id != 0) {
        if (auto* hit = c->acquire_hit(addr, length, access, *id)) {
          if (watch) ufab::regcache::Cache::gpu_checked(hit, count);
          *out = static_cast<ufab_mr*>(ufab::regcache::Cache::handle(hit));
          return 0;
        }
      }
    }
    // A miss (or a hit the first look gave up on): what the memory is, in
    // full. GPU memory is cached under its buffer id (and refused when
    // managed).
    auto region = ufab::gpu::detect_region(addr, length, false);
    if (!region) return error(region.error().code(), "ufab_mr_cache_reg: " + region.error().message());
    if (region->device) gpu_buffer = region->buffer_id;
  }
  auto e = c->acquire(addr, length, access, gpu_buffer);
  if (!e) return error(e.error().code(), "ufab_mr_cache_reg: " + e.error().message());
  if (gpu_buffer && watch) ufab::regcache::Cache::gpu_checked(*e, count);
  *out = static_cast<ufab_mr*>(ufab::regcache::Cache::handle(*e));
  return 0;
}

// Everything after a failed parked hit (ufab_mr_cache_reg's tail call):
// the rest of the host look, then cache_reg_miss.
[[gnu::noinline]] int cache_reg_rest(ufab_mr_cache* c, void* addr, uint64_t length, uint32_t access, ufab_mr** out) {
  if (auto* hit = c->hit_rest(addr, length, access)) {
    *out = static_cast<ufab_mr*>(ufab::regcache::Cache::handle(hit));
    return 0;
  }
  return cache_reg_miss(c, addr, length, access, out);
}

}  // namespace

extern "C" {

int ufab_mr_cache_reg(ufab_mr_cache* c, void* addr, uint64_t length, uint32_t access, ufab_mr** out) {
  if (c == nullptr || out == nullptr) [[unlikely]] return invalid_argument(__func__, "cache and out are required");
  // The thread's parked entry, inline, with no call (so no frame): host
  // memory first, without asking CUDA anything (cache.h says why).
  if (auto* hit = c->hit_parked(addr, length, access)) [[likely]] {
    *out = static_cast<ufab_mr*>(ufab::regcache::Cache::handle(hit));
    return 0;
  }
  return cache_reg_rest(c, addr, length, access, out);
}

int ufab_mr_cache_release(ufab_mr_cache* c, ufab_mr* mr) {
  if (mr == nullptr) [[unlikely]] return invalid_argument(__func__, "cache and mr are required");
  // A null `c` fails this too: no region's cache is null (not_cached()).
  if (mr->cache != c) [[unlikely]] {
    return invalid_argument(__func__, c == nullptr ? "cache and mr are required"
                                                   : "this region is not from this registration cache");
  }
  return c->release0(static_cast<ufab::regcache::Cache::Entry*>(mr->entry));
}

int ufab_mr_cache_query_stats(ufab_mr_cache* c, ufab_mr_cache_stats* out) {
  UFAB_REQUIRE(c != nullptr && out != nullptr, "cache and out are required");
  auto s = c->stats();
  *out = {.hits = s.hits, .misses = s.misses, .uncached = s.uncached, .evictions = s.evictions,
          .invalidations = s.invalidations, .entries = s.entries, .bytes = s.bytes, .held = s.held};
  return 0;
}

const char* ufab_mr_cache_host_watch(ufab_mr_cache* c) { return c ? c->host_watch().c_str() : ""; }
const char* ufab_mr_cache_gpu_watch(ufab_mr_cache* c) { return c ? c->gpu_watch.c_str() : ""; }

// ---------------------------------------------------------------------- AH

int ufab_ah_create(ufab_pd* pd, const ufab_av* av, ufab_ah** out) {
  UFAB_REQUIRE(pd != nullptr && av != nullptr && out != nullptr, "pd, av and out are required");
  ufab_rdma_ah* p = nullptr;
  if (int rc = ops(pd)->create_ah(pd->p, av, &p); rc < 0) return rc;
  pd->refs.hold();
  *out = new ufab_ah{pd, p, *av};
  return 0;
}

int ufab_ah_destroy(ufab_ah* ah) {
  if (ah == nullptr) return 0;
  (void)ops(ah->pd)->destroy_ah(ah->p);
  release(ah->pd);
  delete ah;
  return 0;
}

ufab_ud_dest ufab_ah_dest(const ufab_ah* ah, uint32_t qpn, uint32_t qkey) {
  return ufab_ud_dest{.ip = ah->av.dest_ip, .qpn = qpn, .qkey = qkey, .traffic_class = ah->av.traffic_class,
                      .hop_limit = ah->av.hop_limit, .reserved = 0};
}

// ---------------------------------------------------------------------- CQ

int ufab_cq_create(ufab_device* dev, uint32_t depth, ufab_cq** out) {
  UFAB_REQUIRE(dev != nullptr && out != nullptr, "dev and out are required");
  ufab_rdma_cq* p = nullptr;
  if (int rc = dev->ops->create_cq(dev->p, depth, &p); rc < 0) return rc;
  dev->refs.hold();
  *out = new ufab_cq{{}, dev->ops, dev, p, depth};
  return 0;
}

int ufab_cq_destroy(ufab_cq* cq) {
  if (cq != nullptr) release(cq);
  return 0;
}

uint32_t ufab_cq_depth(const ufab_cq* cq) { return cq->depth; }

int ufab_cq_poll(ufab_cq* cq, ufab_wc* wc, uint32_t n) { return ops(cq)->poll_cq(cq->p, wc, n); }

int ufab_cq_wait(ufab_cq* cq, ufab_wc* wc, uint32_t n, int timeout_ms) {
  if (int rc = ops(cq)->poll_cq(cq->p, wc, n); rc != 0) return rc;
  if (int rc = ops(cq)->wait_cq(cq->p, timeout_ms); rc < 0) return rc;
  return ops(cq)->poll_cq(cq->p, wc, n);
}

const char* ufab_cq_wc_detail(ufab_cq* cq, const ufab_wc* wc) {
  if (wc->status == UFAB_WC_SUCCESS) return "";
  const char* d = wc->detail != 0 ? ops(cq)->wc_detail(cq->p, wc->detail) : nullptr;
  return d != nullptr ? d : ufab_wc_status_str(wc->status);
}

int ufab_cq_req_notify(ufab_cq* cq) { return ops(cq)->req_notify_cq(cq->p); }
int ufab_cq_event_fd(ufab_cq* cq) { return ops(cq)->cq_event_fd(cq->p); }

// ---------------------------------------------------------------------- QP

int ufab_qp_create(ufab_pd* pd, const ufab_qp_init_attr* init, ufab_qp** out) {
  UFAB_REQUIRE(pd != nullptr && init != nullptr && out != nullptr, "pd, init and out are required");
  UFAB_REQUIRE(init->send_cq != nullptr && init->recv_cq != nullptr,
               "a send CQ and a receive CQ are required (they may be the same)");
  UFAB_REQUIRE(init->send_cq->dev == pd->dev && init->recv_cq->dev == pd->dev,
               "the CQs belong to another device than the PD");
  ufab_rdma_qp_init pi{.qp_type = init->qp_type,
                       .sq_sig_all = init->sq_sig_all,
                       .send_cq = init->send_cq->p,
                       .recv_cq = init->recv_cq->p,
                       .cap = init->cap};
  ufab_rdma_qp* p = nullptr;
  uint32_t qpn = 0;
  if (int rc = ops(pd)->create_qp(pd->p, &pi, &p, &qpn); rc < 0) return rc;
  pd->refs.hold();
  init->send_cq->refs.hold();
  init->recv_cq->refs.hold();
  *out = new ufab_qp{ops(pd), pd, init->send_cq, init->recv_cq, p, qpn, init->qp_type};
  return 0;
}

int ufab_qp_destroy(ufab_qp* qp) {
  if (qp == nullptr) return 0;
  (void)ops(qp)->destroy_qp(qp->p);
  release(qp->send_cq);
  release(qp->recv_cq);
  release(qp->pd);
  delete qp;
  return 0;
}

uint32_t ufab_qp_num(const ufab_qp* qp) { return qp->qpn; }
uint32_t ufab_qp_type(const ufab_qp* qp) { return qp->type; }
ufab_device* ufab_qp_device(const ufab_qp* qp) { return qp->pd->dev; }

int ufab_qp_modify(ufab_qp* qp, const ufab_qp_attr* attr, uint32_t mask) {
  UFAB_REQUIRE(qp != nullptr && attr != nullptr, "qp and attr are required");
  return ops(qp)->modify_qp(qp->p, attr, mask);
}

int ufab_qp_query(ufab_qp* qp, ufab_qp_attr* out) {
  UFAB_REQUIRE(qp != nullptr && out != nullptr, "qp and out are required");
  return ops(qp)->query_qp(qp->p, out);
}

void ufab_qp_attr_defaults(ufab_qp_attr* a) {
  *a = {};
  a->state = UFAB_QPS_RESET;
  a->access_flags = UFAB_ACCESS_REMOTE_WRITE | UFAB_ACCESS_REMOTE_READ | UFAB_ACCESS_REMOTE_ATOMIC;
  a->port = 1;
  a->av.hop_limit = 64;
  a->path_mtu = 1024;
  a->max_dest_rd_atomic = 16;
  a->min_rnr_timer = 12;
  a->timeout = 14;
  a->retry_cnt = 7;
  a->rnr_retry = 7;
  a->max_rd_atomic = 16;
}

int ufab_qp_local(ufab_qp* qp, ufab_conn* out) {
  UFAB_REQUIRE(qp != nullptr && out != nullptr, "qp and out are required");
  uint32_t psn = 0;
  if (int rc = ops(qp)->qp_initial_psn(qp->p, &psn); rc < 0) return rc;
  *out = ufab_conn{.ip = qp->pd->dev->attr.ip, .qpn = qp->qpn, .psn = psn, .rkey = 0, .addr = 0, .length = 0,
                   .reserved = 0};
  return 0;
}

int ufab_qp_connect(ufab_qp* qp, const ufab_conn* peer, const ufab_qp_attr* tuning) {
  UFAB_REQUIRE(qp != nullptr && peer != nullptr, "qp and peer are required");
  ufab_qp_attr a;
  if (tuning != nullptr) {
    a = *tuning;
  } else {
    ufab_qp_attr_defaults(&a);
  }
  uint32_t psn = 0;
  if (int rc = ops(qp)->qp_initial_psn(qp->p, &psn); rc < 0) return rc;
  a.state = UFAB_QPS_INIT;
  a.pkey_index = 0;
  a.port = 1;
  if (qp->type == UFAB_QPT_RC) {
    if (int rc = ufab_qp_modify(qp, &a, UFAB_QP_STATE | UFAB_QP_PKEY_INDEX | UFAB_QP_PORT | UFAB_QP_ACCESS_FLAGS);
        rc < 0) {
      return rc;
    }
    a.state = UFAB_QPS_RTR;
    a.av.dest_ip = peer->ip;
    a.dest_qpn = peer->qpn;
    a.rq_psn = peer->psn;
    a.path_mtu = std::min(a.path_mtu, qp->pd->dev->attr.active_mtu);
    if (int rc = ufab_qp_modify(qp, &a,
                                UFAB_QP_STATE | UFAB_QP_AV | UFAB_QP_PATH_MTU | UFAB_QP_DEST_QPN | UFAB_QP_RQ_PSN |
                                    UFAB_QP_MAX_DEST_RD_ATOMIC | UFAB_QP_MIN_RNR_TIMER);
        rc < 0) {
      return rc;
    }
    a.state = UFAB_QPS_RTS;
    a.sq_psn = psn;
    return ufab_qp_modify(qp, &a,
                          UFAB_QP_STATE | UFAB_QP_SQ_PSN | UFAB_QP_TIMEOUT | UFAB_QP_RETRY_CNT | UFAB_QP_RNR_RETRY |
                              UFAB_QP_MAX_QP_RD_ATOMIC);
  }
  if (int rc = ufab_qp_modify(qp, &a, UFAB_QP_STATE | UFAB_QP_PKEY_INDEX | UFAB_QP_PORT | UFAB_QP_QKEY); rc < 0) {
    return rc;
  }
  a.state = UFAB_QPS_RTR;
  if (int rc = ufab_qp_modify(qp, &a, UFAB_QP_STATE); rc < 0) return rc;
  a.state = UFAB_QPS_RTS;
  a.sq_psn = psn;
  return ufab_qp_modify(qp, &a, UFAB_QP_STATE | UFAB_QP_SQ_PSN);
}

int ufab_post_send(ufab_qp* qp, const ufab_send_wr* wrs, uint32_t n, uint32_t* bad) {
  uint32_t at = 0;
  int rc = ops(qp)->post_send(qp->p, wrs, n, &at);
  if (rc < 0) {
    if (bad != nullptr) *bad = at;
    if (n > 1) {
      last_error() = "work request " + std::to_string(at) + " of " + std::to_string(n) + " (the ones before it are posted): " +
                last_error();
    }
  }
  return rc;
}

int ufab_post_recv(ufab_qp* qp, const ufab_recv_wr* wrs, uint32_t n, uint32_t* bad) {
  uint32_t at = 0;
  int rc = ops(qp)->post_recv(qp->p, wrs, n, &at);
  if (rc < 0) {
    if (bad != nullptr) *bad = at;
    if (n > 1) {
      last_error() = "receive request " + std::to_string(at) + " of " + std::to_string(n) +
                " (the ones before it are posted): " + last_error();
    }
  }
  return rc;
}

// ------------------------------------------------------------------- words

const char* ufab_wc_status_str(uint32_t status) {
  switch (status) {
    case UFAB_WC_SUCCESS: return "success";
    case UFAB_WC_LOC_LEN_ERR: return "local length error";
    case UFAB_WC_LOC_QP_OP_ERR: return "local QP operation error";
    case UFAB_WC_LOC_PROT_ERR: return "local protection error";
    case UFAB_WC_WR_FLUSH_ERR: return "Work Request Flushed Error";
    case UFAB_WC_BAD_RESP_ERR: return "bad response error";
    case UFAB_WC_LOC_ACCESS_ERR: return "local access error";
    case UFAB_WC_REM_INV_REQ_ERR: return "remote invalid request error";
    case UFAB_WC_REM_ACCESS_ERR: return "remote access error";
    case UFAB_WC_REM_OP_ERR: return "remote operation error";
    case UFAB_WC_RETRY_EXC_ERR: return "transport retry counter exceeded";
    case UFAB_WC_RNR_RETRY_EXC_ERR: return "RNR retry counter exceeded";
    case UFAB_WC_GENERAL_ERR: return "general error";
    default: return "unknown status";
  }
}

const char* ufab_wc_opcode_str(uint32_t opcode) {
  switch (opcode) {
    case UFAB_WC_SEND: return "SEND";
    case UFAB_WC_RDMA_WRITE: return "RDMA_WRITE";
    case UFAB_WC_RDMA_READ: return "RDMA_READ";
    case UFAB_WC_COMP_SWAP: return "COMP_SWAP";
    case UFAB_WC_FETCH_ADD: return "FETCH_ADD";
    case UFAB_WC_FLUSH: return "FLUSH";
    case UFAB_WC_ATOMIC_WRITE: return "ATOMIC_WRITE";
    case UFAB_WC_RECV: return "RECV";
    case UFAB_WC_RECV_RDMA_WITH_IMM: return "RECV_RDMA_WITH_IMM";
    default: return "unknown opcode";
  }
}

// The transport's words for these two, so each name is written once. Its
// enums are 8 bits wide: a larger value is unknown, not truncated.
const char* ufab_wr_opcode_str(uint32_t opcode) {
  return opcode > 0xff ? "unknown opcode" : ufab::verbs::wr_opcode_name(static_cast<ufab::verbs::WrOpcode>(opcode));
}

const char* ufab_qp_state_str(uint32_t state) {
  return state > 0xff ? "unknown state" : ufab::verbs::qp_state_name(static_cast<ufab::verbs::QpState>(state));
}

}  // extern "C"
