// The soft-RoCE provider: ufab's user-space RoCEv2 transport
// (core/transport) behind the RDMA provider ABI, over any raw-frame plugin.
// Each operation converts the ABI's C structs to the transport's vocabulary
// (namespace ufab::verbs, the same numeric values) and calls it under the
// lock it needs: a QP's lane for posts and QP changes, none for memory
// registration (the key table is thread-safe) and CQ polling (the CQ locks
// itself). There is no device-wide lock.
#include "core/provider/softroce.h"

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/gpu/region.h"
#include "core/net/addresses.h"
#include "core/nic_open.h"
#include "core/transport/context.h"
#include "core/transport/link.h"
#include "core/transport/queue_pair.h"

namespace ufab::provider {
namespace {

using transport::Clock;
using transport::Context;

// The provider's objects. The ABI's handle types are opaque; these are
// what they point to (cast at the boundary, see h()).
struct Dev {
  const ufab_rdma_host* host = nullptr;
  // Mappings of deregistered regions that a NIC might still have been
  // reading (quiesce_tx timed out): unmapped after the NIC stops, with
  // ctx (declared after them, so destroyed first).
  std::vector<std::unique_ptr<transport::Link::DeviceMapping>> late_mappings;
  std::mutex late_mu;
  std::unique_ptr<Context> ctx;
  std::string name;
  bool temporary_thread = false;
};
struct Pd {
  Dev* dev;
  verbs::PdId id;
};
struct Mr {
  Dev* dev;
  verbs::MemoryKeys keys;
  // The region mapped for a NIC that gathers frames from it (zero copy).
  std::unique_ptr<transport::Link::DeviceMapping> mapping;
};
struct Cq {
  Dev* dev;
  transport::CompletionQueueImpl* impl;
  std::mutex poll_mu;  // one poller at a time uses scratch and details
  std::array<verbs::WorkCompletion, 32> scratch{};
  std::vector<std::string> details;  // texts of the last poll's errors; wc.detail = index + 1
};
struct Qp {
  Dev* dev;
  transport::QueuePairImpl* impl;
  transport::Lane* lane;
};
struct Ah {
  verbs::AddressVector av;
};

// Set once, by softroce_provider(), before any device opens.
const core::PluginRegistry* g_raw_plugins = nullptr;

Dev* h(ufab_rdma_dev* p) { return reinterpret_cast<Dev*>(p); }
Pd* h(ufab_rdma_pd* p) { return reinterpret_cast<Pd*>(p); }
Mr* h(ufab_rdma_mr* p) { return reinterpret_cast<Mr*>(p); }
Cq* h(ufab_rdma_cq* p) { return reinterpret_cast<Cq*>(p); }
Qp* h(ufab_rdma_qp* p) { return reinterpret_cast<Qp*>(p); }
Ah* h(ufab_rdma_ah* p) { return reinterpret_cast<Ah*>(p); }
template <typename Handle, typename T>
Handle* out(T* p) {
  return reinterpret_cast<Handle*>(p);
}

// Reports `e` through the host and returns its negative errno.
int report(const ufab_rdma_host* host, const Error& e) {
  if (host != nullptr) host->set_error(e.message().c_str());
  return -(e.code() != 0 ? e.code() : EIO);
}

// Runs an operation body, turning exceptions (allocation failure) into errors:
// none may cross the C ABI.
template <typename F>
int guarded(const ufab_rdma_host* host, const char* what, F&& f) {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return report(host, Error(ENOMEM, std::string(what) + ": out of memory"));
  } catch (const std::exception& e) {
    return report(host, Error(EIO, std::string(what) + ": " + e.what()));
  }
}

// --------------------------------------------------------------- conversions

verbs::AddressVector to_verbs(const ufab_av& a) {
  return {.dest_ip = a.dest_ip, .traffic_class = a.traffic_class, .hop_limit = a.hop_limit, .flow_label = a.flow_label};
}

ufab_av to_c(const verbs::AddressVector& a) {
  return {.dest_ip = a.dest_ip, .traffic_class = a.traffic_class, .hop_limit = a.hop_limit, .reserved = 0,
          .flow_label = a.flow_label};
}

verbs::QpAttr to_verbs(const ufab_qp_attr& a) {
  verbs::QpAttr v;
  v.state = static_cast<verbs::QpState>(a.state);
  v.access_flags = a.access_flags;
  v.pkey_index = a.pkey_index;
  v.port = a.port;
  v.qkey = a.qkey;
  v.av = to_verbs(a.av);
  v.path_mtu = a.path_mtu;
  v.dest_qpn = a.dest_qpn;
  v.rq_psn = a.rq_psn;
  v.max_dest_rd_atomic = a.max_dest_rd_atomic;
  v.min_rnr_timer = a.min_rnr_timer;
  v.sq_psn = a.sq_psn;
  v.timeout = a.timeout;
  v.retry_cnt = a.retry_cnt;
  v.rnr_retry = a.rnr_retry;
  v.max_rd_atomic = a.max_rd_atomic;
  return v;
}

ufab_qp_attr to_c(const verbs::QpAttr& v) {
  ufab_qp_attr a{};
  a.state = static_cast<uint32_t>(v.state);
  a.access_flags = v.access_flags;
  a.pkey_index = v.pkey_index;
  a.port = v.port;
  a.qkey = v.qkey;
  a.av = to_c(v.av);
  a.path_mtu = v.path_mtu;
  a.dest_qpn = v.dest_qpn;
  a.rq_psn = v.rq_psn;
  a.sq_psn = v.sq_psn;
  a.max_dest_rd_atomic = v.max_dest_rd_atomic;
  a.min_rnr_timer = v.min_rnr_timer;
  a.timeout = v.timeout;
  a.retry_cnt = v.retry_cnt;
  a.rnr_retry = v.rnr_retry;
  a.max_rd_atomic = v.max_rd_atomic;
  return a;
}

std::span<const verbs::Sge> sgl(const ufab_sge* list, uint32_t n) {
  static_assert(sizeof(verbs::Sge) == sizeof(ufab_sge) && offsetof(verbs::Sge, lkey) == offsetof(ufab_sge, lkey));
  return {reinterpret_cast<const verbs::Sge*>(list), n};
}

verbs::SendWr to_verbs(const ufab_send_wr& w) {
  return verbs::SendWr{
      .wr_id = w.wr_id,
      .opcode = static_cast<verbs::WrOpcode>(w.opcode),
      .flags = w.send_flags,
      .sgl = sgl(w.sg_list, w.num_sge),
      .imm_data = w.imm_data,
      .remote_addr = w.remote_addr,
      .rkey = w.rkey,
      .compare_add = w.compare_add,
      .swap = w.swap,
      .atomic_value = w.atomic_value,
      .flush_type = w.flush_type,
      .flush_level = w.flush_level,
      .flush_length = w.flush_length,
      .ud = {.ip = w.ud.ip, .qpn = w.ud.qpn, .qkey = w.ud.qkey, .traffic_class = w.ud.traffic_class,
             .hop_limit = w.ud.hop_limit},
  };
}

// Parameters "key=value" into the NIC's map; a string without '=' is an error.
Result<core::NicParams> parse_params(const char* const* params) {
  core::NicParams out;
  for (; params != nullptr && *params != nullptr; ++params) {
    std::string kv = *params;
    auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      return fail(EINVAL, "parameter \"" + kv + "\" is not key=value (e.g. \"loss=0.01\")");
    }
    out[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return out;
}

// Takes the soft-RoCE parameters out of `params`: "lanes=N" (use at most N
// of the NIC's queue pairs, 1..64), "steering=nic|software" (software:
// do not ask the NIC to steer; frames reach their lane through lane 0) and
// "zerocopy=on|off" (off: copy every payload into a frame buffer even when
// the NIC could read it from the memory region).
Status take_link_params(core::NicParams& params, transport::NicLinkOptions& options) {
  if (auto it = params.find("lanes"); it != params.end()) {
    char* end = nullptr;
    unsigned long n = std::strtoul(it->second.c_str(), &end, 10);
    if (it->second.empty() || *end != '\0' || n < 1 || n > 64) {
      return fail(EINVAL, "parameter lanes=" + it->second + ": give the number of NIC queue pairs to use, 1..64");
    }
    options.max_queues = static_cast<uint16_t>(n);
    params.erase(it);
  }
  if (auto it = params.find("steering"); it != params.end()) {
    if (it->second != "nic" && it->second != "software") {
      return fail(EINVAL, "parameter steering=" + it->second + ": use steering=nic (the default) or steering=software");
    }
    options.nic_steering = it->second == "nic";
    params.erase(it);
  }
  if (auto it = params.find("zerocopy"); it != params.end()) {
    if (it->second != "on" && it->second != "off") {
      return fail(EINVAL, "parameter zerocopy=" + it->second + ": use zerocopy=on (the default) or zerocopy=off");
    }
    options.gather = it->second == "on";
    params.erase(it);
  }
  return {};
}

// ------------------------------------------------------------------- device

int open_device(const ufab_rdma_host* host, const char* name, const ufab_device_opts* opts, ufab_rdma_dev** result) {
  return guarded(host, "opening a soft-RoCE device", [&]() -> int {
    std::string spec = name;
    // Which NIC first: a name nothing serves is a better error than a
    // missing address.
    if (auto plugin = core::plugin_for(*g_raw_plugins, spec); !plugin) return report(host, plugin.error());
    if (opts == nullptr || opts->ip == nullptr || *opts->ip == '\0') {
      return report(host, Error(EINVAL, "opening " + spec + ": no IPv4 address given; a ufab port needs its own "
                                        "(ufab_device_opts.ip = \"10.0.0.1\"), since the kernel has no netdev for it"));
    }
    auto ip = net::Ipv4Address::parse(opts->ip);
    if (!ip) return report(host, ip.error().context("opening " + spec));
    auto params = parse_params(opts->params);
    if (!params) return report(host, params.error().context("opening " + spec));
    // The transport's own parameters; the rest are the NIC plugin's.
    transport::NicLinkOptions link_options;
    link_options.ring_size = opts->ring_size != 0 ? opts->ring_size : 512;
    if (auto s = take_link_params(*params, link_options); !s) return report(host, s.error().context("opening " + spec));
    auto staging = staging::take_params(*params);  // gpu_copy, gpu_frag, gpu_depth, ... (core/staging/pool.h)
    if (!staging) return report(host, staging.error().context("opening " + spec));
    core::OpenOptions open_options;
    open_options.params = std::move(*params);
    auto nic = core::open_nic(*g_raw_plugins, spec, open_options);
    if (!nic) return report(host, nic.error());
    auto links = transport::open_nic_links(std::move(*nic), link_options);
    if (!links) return report(host, links.error().context("opening " + spec));
    auto ctx = Context::create(std::move(links->links), *ip, links->steered, *staging);
    if (!ctx) return report(host, ctx.error().context("opening " + spec));
    auto dev = std::make_unique<Dev>();
    dev->host = host;
    dev->ctx = std::move(*ctx);
    dev->name = spec;
    if (opts->progress_thread != 0) {
      if (auto s = dev->ctx->start_progress_threads(); !s) return report(host, s.error());
    }
    *result = out<ufab_rdma_dev>(dev.release());
    return 0;
  });
}

void close_device(ufab_rdma_dev* d) { delete h(d); }

int query_device(ufab_rdma_dev* d, ufab_device_attr* a) {
  Dev* dev = h(d);
  *a = {};
  std::snprintf(a->name, sizeof a->name, "%s", dev->name.c_str());
  std::snprintf(a->provider, sizeof a->provider, "soft-roce");
  std::snprintf(a->transport, sizeof a->transport, "RoCEv2 over %s", dev->name.c_str());
  a->ip = dev->ctx->ip().value;
  a->active_mtu = dev->ctx->active_mtu();
  a->caps = UFAB_DEVICE_CAP_UD | UFAB_DEVICE_CAP_ATOMICS | UFAB_DEVICE_CAP_WIRE_ROCEV2 |
            UFAB_DEVICE_CAP_FLUSH_GLOBAL | UFAB_DEVICE_CAP_FLUSH_PERSISTENT | UFAB_DEVICE_CAP_ATOMIC_WRITE;
  a->mem_types = 1u << UFAB_MEM_HOST | 1u << UFAB_MEM_PERSISTENT;
  // GPU memory moves through the staging pipeline (docs/gpu.md): with a
  // GPU build (the driver is needed at registration), or the fake engine.
  if (gpu::built_with_cuda() || dev->ctx->fake_gpu()) a->mem_types |= 1u << UFAB_MEM_CUDA;
  a->max_qp = 1u << 20;  // Context::create_qp's limit
  a->max_qp_wr = 1u << 16;
  a->max_sge = verbs::kMaxSge;
  a->max_inline_data = 1024;
  a->max_cqe = 1u << 22;  // CompletionQueueImpl::create's limit
  a->max_qp_rd_atom = 16;
  a->max_mr_size = 1ull << 40;
  return 0;
}

int device_stats(ufab_rdma_dev* d, ufab_device_stats* out_stats) {
  *out_stats = h(d)->ctx->stats();
  return 0;
}

int progress(ufab_rdma_dev* d) { return h(d)->ctx->progress(); }

int start_progress_thread(ufab_rdma_dev* d) {
  Dev* dev = h(d);
  if (dev->ctx->has_progress_threads()) return 0;  // the device's own, or already started
  if (auto s = dev->ctx->start_progress_threads(); !s) return report(dev->host, s.error());
  dev->temporary_thread = true;
  return 0;
}

void stop_progress_thread(ufab_rdma_dev* d) {
  Dev* dev = h(d);
  if (!dev->temporary_thread) return;
  dev->temporary_thread = false;
  dev->ctx->stop_progress_threads();
}

// ------------------------------------------------------------- PD, MR, AH

int alloc_pd(ufab_rdma_dev* d, ufab_rdma_pd** result) {
  Dev* dev = h(d);
  return guarded(dev->host, "allocating a PD", [&]() -> int {
    auto id = dev->ctx->memory().alloc_pd();
    if (!id) return report(dev->host, id.error());
    *result = out<ufab_rdma_pd>(new Pd{dev, *id});
    return 0;
  });
}

int dealloc_pd(ufab_rdma_pd* p) {
  Pd* pd = h(p);
  if (auto s = pd->dev->ctx->memory().dealloc_pd(pd->id); !s) return report(pd->dev->host, s.error());
  delete pd;
  return 0;
}

int reg_mr(ufab_rdma_pd* p, const ufab_mr_attr* attr, ufab_rdma_mr** result, uint32_t* lkey, uint32_t* rkey) {
  Pd* pd = h(p);
  return guarded(pd->dev->host, "registering memory", [&]() -> int {
    if (attr->mem_type != UFAB_MEM_HOST && attr->mem_type != UFAB_MEM_PERSISTENT && attr->mem_type != UFAB_MEM_CUDA) {
      return report(pd->dev->host, Error(EOPNOTSUPP, "registering memory of type " + std::to_string(attr->mem_type) +
                                                         ": soft-RoCE takes host memory (UFAB_MEM_HOST), CUDA "
                                                         "device memory (UFAB_MEM_CUDA) and persistent memory "
                                                         "(UFAB_MEM_PERSISTENT)"));
    }
    // GPU memory: UFAB_MEM_CUDA (the C API also hands device memory
    // registered as host memory on as UFAB_MEM_CUDA: core/gpu/region.h).
    // A GPU region is registered with its allocation's buffer id; its
    // transfers go through the device's staging pool, made now on the
    // first one (docs/gpu.md). gpu_copy=fake: host memory registered as
    // UFAB_MEM_CUDA stands for GPU memory (a testing aid), with a made-up
    // buffer id.
    std::optional<verbs::GpuMemory> gpu;
    if (attr->mem_type == UFAB_MEM_CUDA && pd->dev->ctx->fake_gpu()) {
      if (attr->access & (UFAB_ACCESS_FLUSH_PERSISTENT | UFAB_ACCESS_REMOTE_ATOMIC)) {
        return report(pd->dev->host,
                      Error(EOPNOTSUPP, "registering GPU memory with " +
                                            verbs::access_string(attr->access & (UFAB_ACCESS_FLUSH_PERSISTENT |
                                                                                 UFAB_ACCESS_REMOTE_ATOMIC)) +
                                            ": atomics on GPU memory and durable GPU memory are not supported"));
      }
      static std::atomic<uint64_t> fake_ids{1};
      gpu = verbs::GpuMemory{.device = 0, .buffer_id = fake_ids.fetch_add(1)};
    } else if (attr->mem_type == UFAB_MEM_CUDA) {
      auto region = gpu::detect_region(attr->addr, attr->length, true);
      if (!region) return report(pd->dev->host, region.error());
      if (region->device) {
        if (attr->access & (UFAB_ACCESS_FLUSH_PERSISTENT | UFAB_ACCESS_REMOTE_ATOMIC)) {
          return report(pd->dev->host,
                        Error(EOPNOTSUPP, "registering GPU memory with " +
                                              verbs::access_string(attr->access & (UFAB_ACCESS_FLUSH_PERSISTENT |
                                                                                   UFAB_ACCESS_REMOTE_ATOMIC)) +
                                              ": atomics on GPU memory and durable GPU memory are not supported"));
        }
        gpu = verbs::GpuMemory{.device = region->ordinal, .buffer_id = region->buffer_id};
      }
    }
    if (gpu) {
      if (auto pool = pd->dev->ctx->staging_for(gpu->device); !pool) {
        return report(pd->dev->host, pool.error().context("registering GPU memory"));
      }
    }
    // Persistent memory, or a FLUSH PERSISTENT target: how its bytes are
    // made durable is learned from the mapping (core/rdma/durable.h).
    verbs::Durability durability = verbs::Durability::kNone;
    if (attr->mem_type == UFAB_MEM_PERSISTENT || (attr->access & UFAB_ACCESS_FLUSH_PERSISTENT)) {
      auto kind = verbs::classify_mapping(attr->addr, attr->length);
      if (!kind) {
        const bool told = attr->mem_type == UFAB_MEM_PERSISTENT;
        return report(pd->dev->host,
                      Error(kind.error().code(),
                            std::string(told ? "registering persistent memory (UFAB_MEM_PERSISTENT)"
                                             : "registering memory with UFAB_ACCESS_FLUSH_PERSISTENT") +
                                ": " + kind.error().message() +
                                ". Plain host memory (DRAM) is never durable: a peer's FLUSH PERSISTENT would be "
                                "told its data survives a power loss when it does not; register DRAM with "
                                "UFAB_ACCESS_FLUSH_GLOBAL (visibility) instead (docs/persistence.md)"));
      }
      durability = kind->kind;
    }
    // A NIC that reads frames from memory by DMA reads payloads straight
    // from a region mapped for it. Mapping pins the pages; where it fails
    // (a limit: RLIMIT_MEMLOCK, the IOMMU's mapping count) the region is
    // still registered, and its payloads are copied.
    std::unique_ptr<transport::Link::DeviceMapping> mapping;
    uint64_t device_addr = 0;
    transport::Link& link = pd->dev->ctx->lane(0).link();
    if (!gpu && link.gather() == transport::Link::Gather::kDevice && attr->length > 0 && attr->addr != nullptr) {
      if (auto m = link.map_for_device(attr->addr, attr->length)) {
        mapping = std::move(*m);
        device_addr = mapping->device_addr();
      }
    }
    auto keys = pd->dev->ctx->memory().register_mr(pd->id, attr->addr, attr->length, attr->access, std::nullopt,
                                                   device_addr, durability, gpu);
    if (!keys) return report(pd->dev->host, keys.error());
    *result = out<ufab_rdma_mr>(new Mr{pd->dev, *keys, std::move(mapping)});
    *lkey = keys->lkey;
    *rkey = keys->rkey;
    return 0;
  });
}

int dereg_mr(ufab_rdma_mr* m) {
  Mr* mr = h(m);
  // No lane lock: checks in flight hold pins, and deregister_mr waits for
  // them, which needs the transport to keep running.
  if (auto s = mr->dev->ctx->memory().deregister_mr(mr->keys.lkey); !s) return report(mr->dev->host, s.error());
  if (mr->mapping) {
    // Frames queued before the region went may still be read by the NIC:
    // unmap once every lane's NIC queue has sent what it holds.
    bool idle = true;
    Context& ctx = *mr->dev->ctx;
    for (uint16_t i = 0; i < ctx.lane_count(); ++i) {
      std::lock_guard lock(ctx.lane(i).mutex());
      idle = ctx.lane(i).link().quiesce_tx(std::chrono::milliseconds(100)) && idle;
    }
    if (!idle) {
      std::lock_guard lock(mr->dev->late_mu);
      mr->dev->late_mappings.push_back(std::move(mr->mapping));
    }
  }
  delete mr;
  return 0;
}

int create_ah(ufab_rdma_pd* p, const ufab_av* av, ufab_rdma_ah** result) {
  Pd* pd = h(p);
  return guarded(pd->dev->host, "creating an address handle", [&]() -> int {
    net::Ipv4Address ip{av->dest_ip};
    Context& ctx = *pd->dev->ctx;
    if (!ip.is_unicast() || ip == ctx.ip()) {
      return report(pd->dev->host, Error(EINVAL, "address handle for " + ip.str() +
                                                     ": not a unicast IPv4 address of a peer (GID ::ffff:a.b.c.d)"));
    }
    transport::Lane& lane = ctx.lane(0);
    std::lock_guard lock(lane.mutex());
    auto mac = lane.resolve_locked(ip);  // sends the first ARP request now
    if (!mac) return report(pd->dev->host, mac.error().context("address handle for " + ip.str()));
    lane.link().tx_flush();
    *result = out<ufab_rdma_ah>(new Ah{to_verbs(*av)});
    return 0;
  });
}

int destroy_ah(ufab_rdma_ah* a) {
  delete h(a);
  return 0;
}

// ---------------------------------------------------------------------- CQ

int create_cq(ufab_rdma_dev* d, uint32_t depth, ufab_rdma_cq** result) {
  Dev* dev = h(d);
  return guarded(dev->host, "creating a CQ", [&]() -> int {
    auto impl = dev->ctx->create_cq(depth);
    if (!impl) return report(dev->host, impl.error());
    auto cq = std::make_unique<Cq>();
    cq->dev = dev;
    cq->impl = *impl;
    cq->details.reserve(cq->scratch.size());
    *result = out<ufab_rdma_cq>(cq.release());
    return 0;
  });
}

int destroy_cq(ufab_rdma_cq* c) {
  Cq* cq = h(c);
  if (auto s = cq->dev->ctx->destroy_cq(cq->impl); !s) return report(cq->dev->host, s.error());
  delete cq;
  return 0;
}

ufab_wc to_c(verbs::WorkCompletion& w, std::vector<std::string>& details) {
  ufab_wc wc{.wr_id = w.wr_id,
             .status = static_cast<uint32_t>(w.status),
             .opcode = static_cast<uint32_t>(w.opcode),
             .byte_len = w.byte_len,
             .imm_data = w.imm_data,
             .qp_num = w.qp_num,
             .src_qp = w.src_qp,
             .wc_flags = w.wc_flags,
             .detail = 0};
  if (!w.error.empty()) {
    details.push_back(std::move(w.error));
    wc.detail = static_cast<uint32_t>(details.size());
  }
  return wc;
}

int poll_cq(ufab_rdma_cq* c, ufab_wc* wc, uint32_t n) {
  Cq* cq = h(c);
  Context& ctx = *cq->dev->ctx;
  if (cq->impl->empty() && !ctx.has_progress_threads()) ctx.progress_for(*cq->impl);
  std::lock_guard lock(cq->poll_mu);
  cq->details.clear();
  if (uint64_t lost = cq->impl->take_overflow()) {
    return report(cq->dev->host,
                  Error(EOVERFLOW, "completion queue overflow: " + std::to_string(lost) + " completions did not fit its " +
                                       std::to_string(cq->impl->depth()) +
                                       " entries and were lost, and the QPs they belonged to went to ERROR; "
                                       "poll more often or create a deeper CQ"));
  }
  uint32_t done = 0;
  while (done < n) {
    size_t want = std::min<size_t>(n - done, cq->scratch.size());
    size_t got = cq->impl->pop(std::span(cq->scratch.data(), want));
    for (size_t i = 0; i < got; ++i) wc[done + i] = to_c(cq->scratch[i], cq->details);
    done += static_cast<uint32_t>(got);
    if (got < want) break;
  }
  return static_cast<int>(done);
}

int wait_cq(ufab_rdma_cq* c, int timeout_ms) {
  Cq* cq = h(c);
  Context& ctx = *cq->dev->ctx;
  if (timeout_ms >= 0) {
    ctx.wait_for_completion(*cq->impl, Clock::now() + std::chrono::milliseconds(timeout_ms));
  } else {
    // No limit: hour-long waits until something is there.
    for (;;) {
      ctx.wait_for_completion(*cq->impl, Clock::now() + std::chrono::hours(1));
      if (!cq->impl->empty()) break;
    }
  }
  return cq->impl->empty() ? 0 : 1;
}

const char* wc_detail(ufab_rdma_cq* c, uint32_t detail) {
  Cq* cq = h(c);
  if (detail == 0 || detail > cq->details.size()) return nullptr;
  return cq->details[detail - 1].c_str();
}

int req_notify_cq(ufab_rdma_cq* c) {
  h(c)->impl->arm();
  return 0;
}

int cq_event_fd(ufab_rdma_cq* c) { return h(c)->impl->event_fd(); }

// ---------------------------------------------------------------------- QP

int create_qp(ufab_rdma_pd* p, const ufab_rdma_qp_init* init, ufab_rdma_qp** result, uint32_t* qpn) {
  Pd* pd = h(p);
  return guarded(pd->dev->host, "creating a QP", [&]() -> int {
    Context& ctx = *pd->dev->ctx;
    verbs::QpCaps caps{.max_send_wr = init->cap.max_send_wr,
                       .max_recv_wr = init->cap.max_recv_wr,
                       .max_send_sge = init->cap.max_send_sge,
                       .max_recv_sge = init->cap.max_recv_sge,
                       .max_inline_data = init->cap.max_inline_data};
    auto impl = ctx.create_qp(pd->id, static_cast<verbs::QpType>(init->qp_type),
                                     init->send_cq ? h(init->send_cq)->impl : nullptr,
                                     init->recv_cq ? h(init->recv_cq)->impl : nullptr, caps, init->sq_sig_all != 0);
    if (!impl) return report(pd->dev->host, impl.error());
    *result = out<ufab_rdma_qp>(new Qp{pd->dev, *impl, &ctx.lane_of((*impl)->qpn())});
    *qpn = (*impl)->qpn();
    return 0;
  });
}

int destroy_qp(ufab_rdma_qp* q) {
  Qp* qp = h(q);
  qp->dev->ctx->destroy_qp(qp->impl);
  delete qp;
  return 0;
}

int modify_qp(ufab_rdma_qp* q, const ufab_qp_attr* attr, uint32_t mask) {
  Qp* qp = h(q);
  return guarded(qp->dev->host, "modifying a QP", [&]() -> int {
    std::lock_guard lock(qp->lane->mutex());
    if (auto s = qp->impl->modify(to_verbs(*attr), mask); !s) return report(qp->dev->host, s.error());
    return 0;
  });
}

int query_qp(ufab_rdma_qp* q, ufab_qp_attr* result) {
  Qp* qp = h(q);
  std::lock_guard lock(qp->lane->mutex());
  *result = to_c(qp->impl->attr());
  return 0;
}

int qp_initial_psn(ufab_rdma_qp* q, uint32_t* psn) {
  *psn = h(q)->impl->initial_psn();
  return 0;
}

int post_send(ufab_rdma_qp* q, const ufab_send_wr* wrs, uint32_t n, uint32_t* bad) {
  Qp* qp = h(q);
  return guarded(qp->dev->host, "posting a send", [&]() -> int {
    transport::Lane& lane = *qp->lane;
    std::lock_guard lock(lane.mutex());
    int rc = 0;
    for (uint32_t i = 0; i < n; ++i) {
      if (auto s = qp->impl->post_send(to_verbs(wrs[i])); !s) {
        *bad = i;
        rc = report(qp->dev->host, s.error());
        break;
      }
    }
    // Straight to the wire when the window allows, one doorbell for the
    // list; the rest goes out as ACKs arrive.
    lane.transmit_locked(*qp->impl);
    return rc;
  });
}

int post_recv(ufab_rdma_qp* q, const ufab_recv_wr* wrs, uint32_t n, uint32_t* bad) {
  Qp* qp = h(q);
  return guarded(qp->dev->host, "posting a receive", [&]() -> int {
    std::lock_guard lock(qp->lane->mutex());
    for (uint32_t i = 0; i < n; ++i) {
      if (auto s = qp->impl->post_recv({.wr_id = wrs[i].wr_id, .sgl = sgl(wrs[i].sg_list, wrs[i].num_sge)}); !s) {
        *bad = i;
        return report(qp->dev->host, s.error());
      }
    }
    return 0;
  });
}

const char* const kPrefixes[] = {nullptr};

const ufab_rdma_provider kProvider = {
    .abi_major = UFAB_RDMA_ABI_MAJOR,
    .abi_minor = UFAB_RDMA_ABI_MINOR,
    .size = sizeof(ufab_rdma_provider),
    .name = "soft-roce",
    .description = "RoCEv2 in user space, wire-compatible with Linux rdma_rxe, over any raw-frame NIC plugin",
    .prefixes = kPrefixes,
    .flags = 0,
    .reserved = 0,
    .open_device = open_device,
    .close_device = close_device,
    .query_device = query_device,
    .device_stats = device_stats,
    .progress = progress,
    .start_progress_thread = start_progress_thread,
    .stop_progress_thread = stop_progress_thread,
    .alloc_pd = alloc_pd,
    .dealloc_pd = dealloc_pd,
    .reg_mr = reg_mr,
    .dereg_mr = dereg_mr,
    .create_cq = create_cq,
    .destroy_cq = destroy_cq,
    .poll_cq = poll_cq,
    .wait_cq = wait_cq,
    .wc_detail = wc_detail,
    .req_notify_cq = req_notify_cq,
    .cq_event_fd = cq_event_fd,
    .create_qp = create_qp,
    .destroy_qp = destroy_qp,
    .modify_qp = modify_qp,
    .query_qp = query_qp,
    .qp_initial_psn = qp_initial_psn,
    .post_send = post_send,
    .post_recv = post_recv,
    .create_ah = create_ah,
    .destroy_ah = destroy_ah,
};

}  // namespace

const ufab_rdma_provider* softroce_provider(const core::PluginRegistry& raw_plugins) {
  g_raw_plugins = &raw_plugins;
  return &kProvider;
}

}  // namespace ufab::provider
