// The shm provider's operations table: the ABI boundary. Every operation
// catches what its body throws and returns a negative errno after
// host->set_error.
#include <dirent.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <new>

#include "core/gpu/cuda.h"
#include "core/gpu/region.h"
#include "drivers/shm/shm.h"
#include "drivers/shm/shm_impl.h"

struct ufab_rdma_dev {
  ufab::shm::Device d;
};
struct ufab_rdma_pd {
  ufab::shm::Pd p;
};
struct ufab_rdma_mr {
  ufab::shm::Mr m;
};
struct ufab_rdma_cq {
  ufab::shm::Cq c;
};
struct ufab_rdma_qp {
  ufab::shm::Qp* q;
};
// A UD destination: the device at `addr`, connected (peer, a reference)
// unless it is this device.
struct ufab_rdma_ah {
  ufab::shm::Device* dev;
  uint32_t addr;
  ufab::shm::Peer* peer;
};

namespace ufab::shm {
namespace {

constexpr uint32_t kMaxWr = 16384;
constexpr uint32_t kMaxInline = 512;
constexpr uint32_t kMaxCqe = 1u << 20;
constexpr uint64_t kMaxMrSize = 1ull << 46;

template <class F>
int guard(const Device* dev, const ufab_rdma_host* host, F&& f) {
  auto say = [&](const std::string& m) {
    if (dev) {
      dev->error(m);
    } else if (host && host->set_error) {
      host->set_error(m.c_str());
    }
  };
  try {
    return f();
  } catch (const Error& e) {
    say(e.msg);
    return -(e.code > 0 ? e.code : EIO);
  } catch (const std::bad_alloc&) {
    say("shm: out of memory");
    return -ENOMEM;
  } catch (const std::exception& e) {
    say(std::string("shm: internal error: ") + e.what());
    return -EIO;
  } catch (...) {
    say("shm: internal error");
    return -EIO;
  }
}

int open_device(const ufab_rdma_host* host, const char* name, const ufab_device_opts* opts, ufab_rdma_dev** out) {
  return guard(nullptr, host, [&] {
    auto* d = new ufab_rdma_dev;
    try {
      d->d.open(host, name, opts);
      if (opts && opts->size >= offsetof(ufab_device_opts, progress_thread) + sizeof(uint32_t) && opts->progress_thread) {
        d->d.progress_stop = false;
        d->d.progress_running = true;
        Device* dv = &d->d;
        d->d.progress_thread = std::thread([dv] {
          while (!dv->progress_stop.load()) {
            if (dv->progress() == 0) dv->sleep(Clock::now() + std::chrono::seconds(1), [] { return false; });
          }
        });
      }
    } catch (...) {
      d->d.close();
      delete d;
      throw;
    }
    *out = d;
    return 0;
  });
}

void close_device(ufab_rdma_dev* dev) {
  if (!dev) return;
  try {
    dev->d.close();
  } catch (...) {
  }
  delete dev;
}

int query_device(ufab_rdma_dev* dev, ufab_device_attr* out) {
  return guard(&dev->d, nullptr, [&] {
    *out = ufab_device_attr{};
    std::snprintf(out->name, sizeof out->name, "%s", dev->d.name.c_str());
    std::snprintf(out->provider, sizeof out->provider, "shm");
    std::snprintf(out->transport, sizeof out->transport, "shared memory");
    out->ip = dev->d.addr;
    out->active_mtu = 4096;
    out->caps = UFAB_DEVICE_CAP_ATOMICS | UFAB_DEVICE_CAP_UD;
    out->mem_types = 1u << UFAB_MEM_HOST;
    // GPU memory through the staging pool (docs/gpu.md, "shm"): in a build
    // with the CUDA headers (the driver is needed at registration), and
    // with gpu_copy=fake.
    if (gpu::built_with_cuda() || dev->d.gparams.fake) out->mem_types |= 1u << UFAB_MEM_CUDA;
    out->max_qp = kMaxQp;
    out->max_qp_wr = kMaxWr;
    out->max_sge = UFAB_MAX_SGE;
    out->max_inline_data = kMaxInline;
    out->max_cqe = kMaxCqe;
    out->max_qp_rd_atom = 128;
    out->max_mr_size = kMaxMrSize;
    return 0;
  });
}

void add(ufab_device_stats* o, const QpStats& s) {
  o->tx_frames += s.tx;
  o->rx_frames += s.rx;
  o->rx_dropped += s.dropped;
  o->naks_sent += s.naks_sent;
  o->naks_received += s.naks_received;
  o->rnr_naks_sent += s.rnr_sent;
  o->rnr_naks_received += s.rnr_received;
  o->retransmits += s.retransmits;
  o->tx_stalls += s.stalls;
}

int device_stats(ufab_rdma_dev* dev, ufab_device_stats* out) {
  return guard(&dev->d, nullptr, [&] {
    Device& d = dev->d;
    *out = ufab_device_stats{};
    std::lock_guard<std::mutex> g(d.objects_mu);
    add(out, d.retired);
    uint32_t n = d.qp_high.load();
    for (uint32_t i = 0; i < n; ++i) {
      Qp* q = d.qps[i].get();
      std::lock_guard<std::mutex> qg(q->mu);
      if (!q->active) continue;
      // UD: datagrams senders could not enqueue, counted in our segment.
      if (q->type == UFAB_QPT_UD) q->stats.dropped += q->ctl->ud_lost.exchange(0);
      add(out, q->stats);
    }
    return 0;
  });
}

int progress(ufab_rdma_dev* dev) {
  return guard(&dev->d, nullptr, [&] { return dev->d.progress(); });
}

int start_progress_thread(ufab_rdma_dev* dev) {
  return guard(&dev->d, nullptr, [&] {
    Device& d = dev->d;
    if (d.progress_running) return 0;
    d.progress_stop = false;
    d.progress_running = true;
    Device* dv = &d;
    d.progress_thread = std::thread([dv] {
      while (!dv->progress_stop.load()) {
        if (dv->progress() == 0) dv->sleep(Clock::now() + std::chrono::seconds(1), [] { return false; });
      }
    });
    return 0;
  });
}

void stop_progress_thread(ufab_rdma_dev* dev) {
  Device& d = dev->d;
  if (!d.progress_running) return;
  d.progress_stop = true;
  d.wake_self();
  d.progress_thread.join();
  d.progress_running = false;
}

int alloc_pd(ufab_rdma_dev* dev, ufab_rdma_pd** out) {
  return guard(&dev->d, nullptr, [&] {
    auto* p = new ufab_rdma_pd;
    p->p.dev = &dev->d;
    std::lock_guard<std::mutex> g(dev->d.objects_mu);
    p->p.id = dev->d.next_pd++;
    *out = p;
    return 0;
  });
}

int dealloc_pd(ufab_rdma_pd* pd) {
  delete pd;
  return 0;
}

// The file behind [a, a + len) when the range lies in one MAP_SHARED
// mapping of a file and this process holds a descriptor of it (a memfd an
// application mapped and kept): peers then map the region themselves
// (KeyEntry). fd -1: none; peers copy with CMA.
struct SharedFile {
  int fd = -1;
  uint64_t off = 0, dev = 0, ino = 0;
};

SharedFile find_shared_file(uint64_t a, uint64_t len) {
  SharedFile out;
  if (len == 0) return out;
  FILE* maps = std::fopen("/proc/self/maps", "re");
  if (!maps) return out;
  char line[8192];
  bool found = false;
  while (std::fgets(line, sizeof line, maps)) {
    unsigned long long start = 0, end = 0, off = 0, ino = 0;
    unsigned maj = 0, min = 0;
    char perms[8] = {};
    if (std::sscanf(line, "%llx-%llx %7s %llx %x:%x %llu", &start, &end, perms, &off, &maj, &min, &ino) != 7) continue;
    if (a < start || a >= end) continue;
    if (a + len <= end && perms[3] == 's' && ino != 0) {
      out.off = off + (a - start);
      out.dev = makedev(maj, min);
      out.ino = ino;
      found = true;
    }
    break;
  }
  std::fclose(maps);
  if (!found) return out;
  DIR* d = ::opendir("/proc/self/fd");
  if (!d) return out;
  const int skip = ::dirfd(d);
  while (struct dirent* ent = ::readdir(d)) {
    char* end = nullptr;
    long fd = std::strtol(ent->d_name, &end, 10);
    if (end == ent->d_name || *end != '\0' || fd == skip) continue;
    struct stat st;
    if (::fstat(static_cast<int>(fd), &st) == 0 && static_cast<uint64_t>(st.st_dev) == out.dev &&
        static_cast<uint64_t>(st.st_ino) == out.ino) {
      out.fd = static_cast<int>(fd);
      break;
    }
  }
  ::closedir(d);
  return out;
}

int reg_mr(ufab_rdma_pd* pd, const ufab_mr_attr* attr, ufab_rdma_mr** out, uint32_t* lkey, uint32_t* rkey) {
  Device& d = *pd->p.dev;
  return guard(&d, nullptr, [&]() -> int {
    uint32_t mem_type = attr->size >= offsetof(ufab_mr_attr, mem_type) + sizeof(uint32_t) ? attr->mem_type : 0;
    // GPU memory (UFAB_MEM_CUDA; the C API hands device memory registered
    // as host memory on as UFAB_MEM_CUDA too): registered with its
    // allocation's buffer id, moved only by this process's staging pool,
    // made now on the first one. gpu_copy=fake: host memory registered as
    // UFAB_MEM_CUDA stands for GPU memory (a testing aid), a made-up id.
    std::optional<GpuKey> gpu;
    std::optional<gpu::Driver::IpcExport> ipc_export;
    int ordinal = 0;
    if (mem_type == UFAB_MEM_CUDA) {
      if (attr->access & UFAB_ACCESS_REMOTE_ATOMIC) {
        throw Error(EOPNOTSUPP, "registering GPU memory on " + d.name +
                                    " with REMOTE_ATOMIC: atomics on GPU memory are not supported (SEND/RECV, "
                                    "WRITE and READ are, through the staging pipeline: docs/gpu.md)");
      }
      if (d.gparams.fake) {
        static std::atomic<uint64_t> fake_ids{1};
        gpu = GpuKey{true, fake_ids.fetch_add(1)};
      } else {
        auto region = gpu::detect_region(attr->addr, attr->length, true);
        if (!region) throw Error(region.error().code(), "registering memory on " + d.name + ": " + region.error().message());
        if (region->device) {
          gpu = GpuKey{true, region->buffer_id};
          ordinal = region->ordinal;
        } else {
          mem_type = UFAB_MEM_HOST;  // pinned host memory CUDA knows: host memory
        }
      }
      if (gpu && attr->length == 0) gpu.reset();
      if (gpu) d.staging_for(ordinal);  // throws with the reason (no driver, no memory for the slots)
      // Exported for CUDA IPC (peers in other processes copy GPU<->GPU
      // directly, gpu.cc); memory cuIpcGetMemHandle refuses (VMM, pool
      // allocations) stages.
      if (gpu && !d.gparams.fake && d.ipc_param) {
        auto drv = gpu::Driver::get();
        auto x = drv ? (*drv)->ipc_export(attr->addr, ordinal)
                     : Result<gpu::Driver::IpcExport>(std::unexpected(drv.error()));
        if (x) {
          ipc_export = *x;
          gpu->ipc = true;
          gpu_counters().ipc_exports.fetch_add(1, std::memory_order_relaxed);
        } else {
          gpu_counters().ipc_export_refused.fetch_add(1, std::memory_order_relaxed);
          d.log(2, "shm device " + d.name + ": GPU memory at " + hex(reinterpret_cast<uint64_t>(attr->addr)) +
                       " stages through host slots (no CUDA IPC): " + x.error().message());
        }
      }
      if (gpu) mem_type = UFAB_MEM_HOST;  // passes the check below; gpu says the rest
    }
    if (mem_type != UFAB_MEM_HOST) {
      throw Error(EOPNOTSUPP, "registering memory on " + d.name + ": memory type " + std::to_string(mem_type) +
                                  (mem_type == UFAB_MEM_CUDA         ? " (CUDA)"
                                   : mem_type == UFAB_MEM_PERSISTENT ? " (persistent)"
                                                                     : "") +
                                  " is not supported; the shm provider registers host and CUDA memory (use a "
                                  "soft-RoCE device for persistent memory)");
    }
    if (attr->access & (UFAB_ACCESS_FLUSH_GLOBAL | UFAB_ACCESS_FLUSH_PERSISTENT)) {
      throw Error(EOPNOTSUPP, "registering memory on " + d.name +
                                  " with UFAB_ACCESS_FLUSH_*: the shm provider does not implement FLUSH; use a "
                                  "soft-RoCE device (swnic or a NIC) for FLUSH and ATOMIC_WRITE");
    }
    const uint32_t rights = UFAB_ACCESS_LOCAL_WRITE | UFAB_ACCESS_REMOTE_WRITE | UFAB_ACCESS_REMOTE_READ |
                            UFAB_ACCESS_REMOTE_ATOMIC;
    if (attr->access & ~rights) throw Error(EINVAL, "registering memory: access " + hex(attr->access) + " has unknown bits");
    if ((attr->access & (UFAB_ACCESS_REMOTE_WRITE | UFAB_ACCESS_REMOTE_ATOMIC)) &&
        !(attr->access & UFAB_ACCESS_LOCAL_WRITE)) {
      throw Error(EINVAL, "registering memory: REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE too (verbs' rule)");
    }
    if (!attr->addr && attr->length) throw Error(EINVAL, "registering memory: addr is NULL");
    uint64_t a = reinterpret_cast<uint64_t>(attr->addr);
    if (attr->length > kMaxMrSize || a + attr->length < a) {
      throw Error(EINVAL, "registering memory: " + std::to_string(attr->length) + " bytes exceed max_mr_size");
    }
    const SharedFile file = gpu ? SharedFile{} : find_shared_file(a, attr->length);
    auto* m = new ufab_rdma_mr;
    std::lock_guard<std::mutex> g(d.objects_mu);
    uint32_t idx = kMaxMr;
    for (uint32_t i = 0; i < kMaxMr; ++i) {
      if (!d.key_used[i]) {
        idx = i;
        break;
      }
    }
    if (idx == kMaxMr) {
      delete m;
      throw Error(ENOMEM, "registering memory on " + d.name + ": all " + std::to_string(kMaxMr) +
                              " memory keys are in use; deregister regions or use fewer, larger ones");
    }
    uint32_t gen = d.key_gen[idx];
    d.key_gen[idx] = gen + 1 >= (1u << (32 - kKeyIndexBits)) ? 1 : gen + 1;
    uint32_t key = (gen << kKeyIndexBits) | idx;
    KeyEntry& e = d.seg->keys[idx];
    e.access.store(attr->access, std::memory_order_relaxed);
    e.pd.store(pd->p.id, std::memory_order_relaxed);
    e.addr.store(a, std::memory_order_relaxed);
    e.length.store(attr->length, std::memory_order_relaxed);
    e.fd1.store(static_cast<uint32_t>(file.fd + 1), std::memory_order_relaxed);
    e.file_off.store(file.off, std::memory_order_relaxed);
    e.file_dev.store(file.dev, std::memory_order_relaxed);
    e.file_ino.store(file.ino, std::memory_order_relaxed);
    e.flags.store(gpu ? kKeyGpu : 0, std::memory_order_relaxed);
    d.gpu_keys[idx] = gpu ? *gpu : GpuKey{};
    IpcExport& x = d.seg->ipc[idx];
    x.key.store(0, std::memory_order_relaxed);
    if (ipc_export) {
      x.base = ipc_export->base;
      x.size = ipc_export->size;
      x.buffer_id = gpu->buffer_id;
      std::memcpy(x.handle, ipc_export->handle, sizeof x.handle);
      x.key.store(key, std::memory_order_release);  // before the KeyEntry's key (release below)
    }
    if (gpu) d.gpu_regions.fetch_add(1);
    e.key.store(key, std::memory_order_release);
    d.key_used[idx] = true;
    m->m = Mr{&pd->p, idx, key};
    *out = m;
    *lkey = *rkey = key;
    return 0;
  });
}

int dereg_mr(ufab_rdma_mr* mr) {
  Device& d = *mr->m.pd->dev;
  return guard(&d, nullptr, [&]() -> int {
    KeyEntry& e = d.seg->keys[mr->m.index];
    e.key.store(0, std::memory_order_seq_cst);
    auto deadline = Clock::now() + std::chrono::seconds(2);
    while (e.pins.load(std::memory_order_seq_cst) != 0) {
      if (Clock::now() > deadline) {
        e.key.store(mr->m.key, std::memory_order_seq_cst);
        throw Error(EBUSY, "deregistering key " + hex(mr->m.key) + ": a peer's transfer has used it for 2 s; the "
                           "region stays registered; try again once transfers to it completed");
      }
      ::usleep(50);
    }
    std::lock_guard<std::mutex> g(d.objects_mu);
    d.key_used[mr->m.index] = false;
    if (d.gpu_keys[mr->m.index].gpu) d.gpu_regions.fetch_sub(1);
    d.gpu_keys[mr->m.index] = GpuKey{};
    e.flags.store(0, std::memory_order_relaxed);
    d.seg->ipc[mr->m.index].key.store(0, std::memory_order_release);
    delete mr;
    return 0;
  });
}

int create_cq(ufab_rdma_dev* dev, uint32_t depth, ufab_rdma_cq** out) {
  return guard(&dev->d, nullptr, [&] {
    if (depth == 0 || depth > kMaxCqe) {
      throw Error(EINVAL, "creating a CQ: depth " + std::to_string(depth) + " is not 1 .. " + std::to_string(kMaxCqe));
    }
    auto* c = new ufab_rdma_cq;
    c->c.dev = &dev->d;
    c->c.ring.resize(depth);
    c->c.details.resize(depth);
    c->c.polled.resize(depth);
    c->c.event_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (c->c.event_fd < 0) {
      int e = errno;
      delete c;
      throw Error(e, "creating a CQ: eventfd failed");
    }
    *out = c;
    return 0;
  });
}

int destroy_cq(ufab_rdma_cq* cq) {
  ::close(cq->c.event_fd);
  delete cq;
  return 0;
}

int poll_cq(ufab_rdma_cq* cq, ufab_wc* wc, uint32_t n) {
  Cq& c = cq->c;
  return guard(c.dev, nullptr, [&]() -> int {
    if (c.avail.load(std::memory_order_acquire) == 0) {
      c.dev->progress();
      // Still empty: nothing to take and no overflow to report (an
      // overflow leaves the CQ full until this poll reports it), so no lock.
      if (c.avail.load(std::memory_order_acquire) == 0) return 0;
    }
    std::lock_guard<std::mutex> g(c.mu);
    if (c.overflow) {
      c.overflow = false;
      throw Error(EOVERFLOW, "polling a CQ of depth " + std::to_string(c.ring.size()) +
                                 ": completions were lost because it was full, and their QPs went to ERROR; poll "
                                 "more often or create a deeper CQ");
    }
    uint32_t k = 0;
    uint32_t size = static_cast<uint32_t>(c.ring.size());
    for (; k < n && c.count > 0; ++k) {
      wc[k] = c.ring[c.head];
      if (!c.details[c.head].empty()) {
        c.polled[k].swap(c.details[c.head]);
        c.details[c.head].clear();
        wc[k].detail = k + 1;
      } else {
        wc[k].detail = 0;
      }
      c.head = (c.head + 1) % size;
      --c.count;
    }
    c.avail.store(c.count, std::memory_order_release);
    return static_cast<int>(k);
  });
}

// 1 when the CQ has a completion (or lost some), 0 when timeout_ms passed;
// a negative timeout waits without limit.
int wait_cq(ufab_rdma_cq* cq, int timeout_ms) {
  Cq& c = cq->c;
  return guard(c.dev, nullptr, [&]() -> int {
    auto until = timeout_ms < 0 ? Clock::time_point::max() : Clock::now() + std::chrono::milliseconds(timeout_ms);
    auto ready = [&] { return c.avail.load(std::memory_order_acquire) != 0; };
    for (;;) {
      if (ready()) return 1;
      c.dev->progress();
      if (ready()) return 1;
      if (Clock::now() >= until) return 0;
      c.dev->sleep(until, ready);
    }
  });
}

const char* wc_detail(ufab_rdma_cq* cq, uint32_t detail) {
  if (detail == 0 || detail > cq->c.polled.size()) return nullptr;
  const std::string& s = cq->c.polled[detail - 1];
  return s.empty() ? nullptr : s.c_str();
}

int req_notify_cq(ufab_rdma_cq* cq) {
  cq->c.armed.store(true);
  return 0;
}

int cq_event_fd(ufab_rdma_cq* cq) { return cq->c.event_fd; }

int create_qp(ufab_rdma_pd* pd, const ufab_rdma_qp_init* init, ufab_rdma_qp** out, uint32_t* qpn) {
  Device& d = *pd->p.dev;
  return guard(&d, nullptr, [&]() -> int {
    if (init->qp_type != UFAB_QPT_RC && init->qp_type != UFAB_QPT_UD) {
      throw Error(EOPNOTSUPP, "creating a QP on " + d.name + ": type " + std::to_string(init->qp_type) +
                                  (init->qp_type == UFAB_QPT_GSI ? " (GSI)" : "") +
                                  " is not supported; the shm provider has RC and UD QPs (the GSI QP and the "
                                  "connection manager run on soft-RoCE)");
    }
    if (!init->send_cq || !init->recv_cq) throw Error(EINVAL, "creating a QP: send_cq and recv_cq are required");
    const ufab_qp_cap& cap = init->cap;
    if (cap.max_send_wr > kMaxWr || cap.max_recv_wr > kMaxWr) {
      throw Error(EINVAL, "creating a QP: max_send_wr and max_recv_wr are at most " + std::to_string(kMaxWr));
    }
    if (cap.max_send_sge > UFAB_MAX_SGE || cap.max_recv_sge > UFAB_MAX_SGE) {
      throw Error(EINVAL, "creating a QP: max_send_sge and max_recv_sge are at most " + std::to_string(UFAB_MAX_SGE));
    }
    if (cap.max_inline_data > kMaxInline) {
      throw Error(EINVAL, "creating a QP: max_inline_data " + std::to_string(cap.max_inline_data) + " exceeds " +
                              std::to_string(kMaxInline));
    }
    auto* h = new ufab_rdma_qp;
    std::lock_guard<std::mutex> g(d.objects_mu);
    uint32_t n = d.qp_high.load();
    uint32_t idx = n;
    for (uint32_t i = 0; i < n; ++i) {
      if (!d.qps[i]->active.load()) {
        idx = i;
        break;
      }
    }
    if (idx == kMaxQp) {
      delete h;
      throw Error(ENOMEM, "creating a QP on " + d.name + ": the device has " + std::to_string(kMaxQp) +
                              " QPs already; destroy some or open another device");
    }
    if (idx == n) d.qps[idx] = std::make_unique<Qp>();
    Qp* q = d.qps[idx].get();
    {
      std::lock_guard<std::mutex> qg(q->mu);
      q->dev = &d;
      q->index = idx;
      q->pd = &pd->p;
      q->scq = &init->send_cq->c;
      q->rcq = &init->recv_cq->c;
      q->sig_all = init->sq_sig_all != 0;
      q->cap = cap;
      uint16_t gen = ++d.qp_gen[idx];
      if (gen == 0) gen = d.qp_gen[idx] = 1;
      q->qpn = (static_cast<uint32_t>(gen) << 8) | idx;
      uint32_t r = 0;
      if (::getrandom(&r, sizeof r, GRND_NONBLOCK) != static_cast<ssize_t>(sizeof r)) {
        r = static_cast<uint32_t>(Clock::now().time_since_epoch().count()) ^ (q->qpn * 2654435761u);
      }
      q->initial_psn = r & 0xFFFFFF;
      q->ctl = &d.seg->ctl[idx];
      q->type = init->qp_type;
      q->ud_in = init->qp_type == UFAB_QPT_UD ? &d.seg->ud[idx] : nullptr;
      q->ctl->type.store(init->qp_type, std::memory_order_relaxed);
      q->ctl->ud_lost.store(0, std::memory_order_relaxed);
      q->in_req = RingView{&q->ctl->req, d.seg->rings[idx].req};
      q->in_resp = RingView{&q->ctl->resp, d.seg->rings[idx].resp};
      q->sq.assign(cap.max_send_wr, SendWqe{});
      q->rq.assign(cap.max_recv_wr, RecvWqe{});
      q->inline_buf.assign(static_cast<size_t>(cap.max_send_wr) * cap.max_inline_data, 0);
      q->stats = QpStats{};
      q->reset_locked();
      q->ctl->pd.store(pd->p.id);
      q->ctl->qpn.store(q->qpn, std::memory_order_release);
      q->idle.store(false);
      q->active.store(true);
    }
    if (idx == n) d.qp_high.store(n + 1, std::memory_order_release);
    h->q = q;
    *out = h;
    *qpn = q->qpn;
    return 0;
  });
}

int destroy_qp(ufab_rdma_qp* qp) {
  Qp* q = qp->q;
  Device& d = *q->dev;
  return guard(&d, nullptr, [&] {
    std::lock_guard<std::mutex> g(d.objects_mu);
    std::lock_guard<std::mutex> qg(q->mu);
    q->destroy_locked();
    const QpStats& s = q->stats;
    d.retired.tx += s.tx;
    d.retired.rx += s.rx;
    d.retired.dropped += s.dropped;
    d.retired.naks_sent += s.naks_sent;
    d.retired.naks_received += s.naks_received;
    d.retired.rnr_sent += s.rnr_sent;
    d.retired.rnr_received += s.rnr_received;
    d.retired.retransmits += s.retransmits;
    d.retired.stalls += s.stalls;
    delete qp;
    return 0;
  });
}

int modify_qp(ufab_rdma_qp* qp, const ufab_qp_attr* attr, uint32_t mask) {
  Qp* q = qp->q;
  return guard(q->dev, nullptr, [&] {
    std::lock_guard<std::mutex> g(q->mu);
    q->idle.store(false, std::memory_order_relaxed);
    return q->modify(*attr, mask);
  });
}

int query_qp(ufab_rdma_qp* qp, ufab_qp_attr* out) {
  Qp* q = qp->q;
  return guard(q->dev, nullptr, [&] {
    std::lock_guard<std::mutex> g(q->mu);
    q->query(out);
    return 0;
  });
}

int qp_initial_psn(ufab_rdma_qp* qp, uint32_t* psn) {
  std::lock_guard<std::mutex> g(qp->q->mu);
  *psn = qp->q->initial_psn;
  return 0;
}

int post_send(ufab_rdma_qp* qp, const ufab_send_wr* wrs, uint32_t n, uint32_t* bad) {
  Qp* q = qp->q;
  return guard(q->dev, nullptr, [&] {
    std::lock_guard<std::mutex> g(q->mu);
    q->idle.store(false, std::memory_order_relaxed);
    return q->post_send(wrs, n, bad);
  });
}

int post_recv(ufab_rdma_qp* qp, const ufab_recv_wr* wrs, uint32_t n, uint32_t* bad) {
  Qp* q = qp->q;
  return guard(q->dev, nullptr, [&] {
    std::lock_guard<std::mutex> g(q->mu);
    q->idle.store(false, std::memory_order_relaxed);
    return q->post_recv(wrs, n, bad);
  });
}

// An address handle names a device of the domain by its address (the
// peer's ufab_device_attr.ip): connected now, so a bad address fails here
// and the first datagram does not wait for the connection.
int create_ah(ufab_rdma_pd* pd, const ufab_av* av, ufab_rdma_ah** out) {
  Device& d = *pd->p.dev;
  return guard(&d, nullptr, [&]() -> int {
    if (av->dest_ip == 0) {
      throw Error(EINVAL, "creating an address handle on " + d.name +
                              ": address 0 is no device (an shm address is the peer device's ufab_device_attr.ip)");
    }
    Peer* p = nullptr;
    if (av->dest_ip != d.addr) {
      try {
        p = d.connect_peer(av->dest_ip);
      } catch (Error& e) {
        e.msg = "creating an address handle on " + d.name + ": " + e.msg;
        throw;
      }
    }
    *out = new ufab_rdma_ah{&d, av->dest_ip, p};
    return 0;
  });
}

int destroy_ah(ufab_rdma_ah* ah) {
  if (ah->peer) peer_unref(ah->peer);
  delete ah;
  return 0;
}

const char* const kPrefixes[] = {"shm", nullptr};

const ufab_rdma_provider kProvider = {
    UFAB_RDMA_ABI_MAJOR,
    UFAB_RDMA_ABI_MINOR,
    sizeof(ufab_rdma_provider),
    "shm",
    "shared memory between processes of one host (memfd rings, CMA copies)",
    kPrefixes,
    0,
    0,
    open_device,
    close_device,
    query_device,
    device_stats,
    progress,
    start_progress_thread,
    stop_progress_thread,
    alloc_pd,
    dealloc_pd,
    reg_mr,
    dereg_mr,
    create_cq,
    destroy_cq,
    poll_cq,
    wait_cq,
    wc_detail,
    req_notify_cq,
    cq_event_fd,
    create_qp,
    destroy_qp,
    modify_qp,
    query_qp,
    qp_initial_psn,
    post_send,
    post_recv,
    create_ah,
    destroy_ah,
};

}  // namespace
}  // namespace ufab::shm

extern "C" const struct ufab_rdma_provider* ufab_shm_provider(void) { return &ufab::shm::kProvider; }
