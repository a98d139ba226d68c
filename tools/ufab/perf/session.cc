#include "tools/ufab/perf/session.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

#include "core/roce/gid.h"

namespace ufab::cli::perf {
namespace {

using std::chrono::milliseconds;

constexpr uint32_t kClockEvery = 64;
// How long a waiter busy-polls before it lets others have the core.
constexpr int64_t kSpinNs = 50'000;

// What a peer may do to our buffer and QPs in each test.
rdma::AccessFlags remote_access(Verb verb) {
  switch (verb) {
    case Verb::kWrite: return rdma::kRemoteWrite;
    case Verb::kRead: return rdma::kRemoteRead;
    case Verb::kAtomic: return rdma::kRemoteAtomic;
    case Verb::kSend: return rdma::kRemoteWrite;  // as perftest's INIT
    case Verb::kFlush: return 0;                   // flush_access() has its rights
  }
  return 0;
}

// The FLUSH rights of this side's buffer and QPs: those of --flush's type
// where the peer flushes us.
rdma::AccessFlags flush_access(const Config& cfg) {
  if (!cfg.flush_target()) return 0;
  return cfg.flush_type == rdma::kFlushTypePersistent ? rdma::kFlushPersistent : rdma::kFlushGlobal;
}

// READs, atomics and FLUSHes we let the peer have outstanding at us;
// perftest sends its device's maximum and uses ours as its initiator
// depth. A FLUSH behind every WRITE needs the same room (they count
// against max_rd_atomic like READs).
uint16_t out_reads(const Config& cfg) {
  return cfg.verb == Verb::kRead || cfg.verb == Verb::kAtomic || cfg.flush_type != 0 ? 16 : 1;
}

uint32_t mtu_enum(uint32_t mtu) {
  uint32_t e = 1;
  while ((128u << e) < mtu) ++e;
  return e;
}

uint64_t round_up(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

}  // namespace

std::vector<uint64_t> test_sizes(const Config& cfg) {
  if (!cfg.all_sizes) return {cfg.size};
  std::vector<uint64_t> out;
  for (uint64_t s = 2; s <= kAllSizesMax; s *= 2) out.push_back(s);
  return out;
}

Status with_progress(rdma::Device& dev, const std::function<Status()>& fn) {
  if (auto s = dev.start_progress_thread(); !s) return s;
  Status result = fn();
  dev.stop_progress_thread();
  return result;
}

Status Session::open_device() {
  auto dev = rdma::Device::open(cfg_.device, {.ip = cfg_.ip, .params = cfg_.params});
  if (!dev) return std::unexpected(dev.error());
  dev_ = std::move(*dev);
  if (cfg_.mtu > dev_->active_mtu()) {
    return fail(EINVAL, "-m " + std::to_string(cfg_.mtu) + " exceeds the active MTU " +
                            std::to_string(dev_->active_mtu()) + " of " + cfg_.device + "; use -m " +
                            std::to_string(dev_->active_mtu()) + " or less");
  }
  auto pd = dev_->alloc_pd();
  if (!pd) return std::unexpected(pd.error().context("allocating a PD"));
  pd_.emplace(std::move(*pd));

  if (cfg_.flush_type != 0) {
    if (auto c = check_flush_caps(false); !c) return c;
  }
  area_ = round_up(std::max<uint64_t>(cfg_.size, kCycleBuffer), kCacheLine);
  const uint64_t total = 2 * uint64_t(cfg_.qps) * area_;
  const bool cuda = cfg_.cuda_device >= 0;
  if (auto m = cuda ? map_cuda(total) : cfg_.pmem.empty() ? map_buffer(total) : map_pmem(total); !m) return m;
  buffer_ = memory_.get();
  // write-lat polls the last byte of what arrives, so its buffer starts
  // zeroed; the other tests send perftest's random bytes.
  {
    std::vector<uint8_t> init;
    uint8_t* fill = buffer_;
    if (cuda) {
      init.resize(total);
      fill = init.data();
    }
    if (cfg_.verb == Verb::kWrite && cfg_.kind == Kind::kLatency) {
      std::memset(fill, 0, total);
    } else {
      std::mt19937_64 rng(std::random_device{}());
      for (uint64_t i = 0; i < total; i += 8) {
        uint64_t r = rng();
        std::memcpy(fill + i, &r, std::min<uint64_t>(8, total - i));
      }
    }
    if (cuda) {
      if (auto w = store(0, fill, total); !w) return std::unexpected(w.error().context("initialising the GPU buffer"));
    }
  }
  const rdma::AccessFlags access = rdma::kLocalWrite | remote_access(cfg_.verb) | flush_access(cfg_);
  const rdma::MemoryType type = cuda                ? rdma::MemoryType::kCuda
                                : cfg_.pmem.empty() ? rdma::MemoryType::kHost
                                                    : rdma::MemoryType::kPersistent;
  auto mr = pd_->register_mr(buffer_, total, access, type);
  if (!mr) {
    return std::unexpected(mr.error().context(
        "registering the " + std::to_string(total) + "-byte buffer" +
        (cuda ? " (" + memory_kind_ + ")" : std::string()) +
        (cfg_.pmem.empty() ? std::string() : " (" + cfg_.pmem + ", " + memory_kind_ + ") as persistent memory") +
        (access & rdma::kFlushPersistent ? " with FLUSH_PERSISTENT" : "")));
  }
  mr_.emplace(std::move(*mr));
  // The target's capability once its memory is in: with --pmem the
  // registration has said first whether the provider takes durable memory.
  if (cfg_.flush_type != 0) {
    if (auto c = check_flush_caps(true); !c) return c;
  }

  auto cq = dev_->create_cq(cfg_.tx_depth * cfg_.qps + 16);
  if (!cq) return std::unexpected(cq.error().context("creating the send CQ"));
  send_cq_ = std::move(*cq);
  if (cfg_.verb == Verb::kSend) {
    auto rcq = dev_->create_cq(cfg_.rx_depth * cfg_.qps + 16);
    if (!rcq) return std::unexpected(rcq.error().context("creating the receive CQ"));
    recv_cq_ = std::move(*rcq);
  }
  for (uint32_t i = 0; i < cfg_.qps; ++i) {
    auto qp = pd_->create_qp({.type = rdma::QpType::kRc,
                              .send_cq = send_cq_.get(),
                              .recv_cq = recv_cq_ ? recv_cq_.get() : send_cq_.get(),
                              // A FLUSH rides behind every WRITE with --flush.
                              .caps = {.max_send_wr = cfg_.tx_depth * (cfg_.flush_type != 0 ? 2 : 1),
                                       .max_recv_wr = cfg_.verb == Verb::kSend ? cfg_.rx_depth : 1,
                                       .max_send_sge = 1,
                                       .max_recv_sge = 1,
                                       .max_inline_data = cfg_.inline_size}});
    if (!qp) return std::unexpected(qp.error().context("creating RC QP " + std::to_string(i)));
    rdma::QpAttr a;
    a.state = rdma::QpState::kInit;
    a.access_flags = remote_access(cfg_.verb) | flush_access(cfg_);
    if (auto s = (*qp)->modify(a, rdma::kAttrState | rdma::kAttrPkeyIndex | rdma::kAttrPort | rdma::kAttrAccessFlags);
        !s) {
      return std::unexpected(s.error().context("moving QP " + std::to_string(i) + " to INIT"));
    }
    qps_.push_back(std::move(*qp));
  }
  remote_.resize(cfg_.qps);
  return {};
}

// A memfd mapped MAP_SHARED and kept open: a provider that maps its peers'
// shared regions (shm) then copies straight into this buffer instead of
// through the kernel. Heap memory where there is no memfd.
Status Session::map_buffer(uint64_t total) {
  if (int fd = memfd_create("ufab-perf", MFD_CLOEXEC); fd >= 0) {
    void* p = MAP_FAILED;
    if (ftruncate(fd, off_t(total)) == 0) p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) {
      memory_ = {static_cast<uint8_t*>(p), [fd, total](uint8_t* q) {
                   munmap(q, total);
                   ::close(fd);
                 }};
      memory_kind_ = "memfd";
      return {};
    }
    ::close(fd);
  }
  void* mem = nullptr;
  if (int rc = posix_memalign(&mem, kCycleBuffer, total); rc != 0) {
    return fail(rc, "allocating the " + std::to_string(total) + "-byte buffer");
  }
  memory_ = {static_cast<uint8_t*>(mem), [](uint8_t* q) { std::free(q); }};
  memory_kind_ = "heap";
  return {};
}

// --use_cuda=DEV: device memory as perftest allocates it (cuMemAlloc of
// the size rounded up to 64 KiB), on the GPU's primary context.
Status Session::map_cuda(uint64_t total) {
  const std::string what = "--use_cuda=" + std::to_string(cfg_.cuda_device);
  // --param gpu_copy=fake (a testing aid, docs/gpu.md): host memory,
  // registered as cuda memory, stands for the GPU buffer; the provider's
  // fake copy engine moves it as it would move GPU memory, so the GPU
  // paths are measured structurally on a machine without a GPU.
  if (auto it = cfg_.params.find("gpu_copy"); it != cfg_.params.end() && it->second == "fake") {
    if (auto m = map_buffer(total); !m) return m;
    memory_kind_ = "host memory standing for GPU memory (gpu_copy=fake, a testing aid: no GPU)";
    return {};
  }
  auto driver = gpu::Driver::get();
  if (!driver) return std::unexpected(driver.error().context(what));
  auto n = (*driver)->device_count();
  if (!n) return std::unexpected(n.error().context(what));
  if (cfg_.cuda_device >= *n) {
    return fail(ENODEV, what + ": this machine has " + std::to_string(*n) + " GPU(s) (0.." + std::to_string(*n - 1) +
                            "); `ufab info gpu` lists them");
  }
  constexpr uint64_t kGpuPage = 64 << 10;
  auto a = gpu::Allocation::allocate(**driver, cfg_.cuda_device, gpu::Allocation::Kind::kDevice,
                                     (total + kGpuPage - 1) / kGpuPage * kGpuPage);
  if (!a) return std::unexpected(a.error().context(what));
  gpu_memory_.emplace(std::move(*a));
  memory_ = {static_cast<uint8_t*>(gpu_memory_->data()), [](uint8_t*) {}};  // gpu_memory_ frees it
  auto info = (*driver)->device(cfg_.cuda_device);
  memory_kind_ = "CUDA device memory on GPU " + std::to_string(cfg_.cuda_device) + (info ? " (" + info->name + ")" : "");
  return {};
}

Status Session::store(uint64_t offset, const uint8_t* src, uint64_t n) {
  if (gpu_memory_) return gpu_memory_->write(offset, src, n);
  std::memcpy(buffer_ + offset, src, n);
  return {};
}

Status Session::load(uint64_t offset, uint8_t* dst, uint64_t n) const {
  if (gpu_memory_) return gpu_memory_->read(offset, dst, n);
  std::memcpy(dst, buffer_ + offset, n);
  return {};
}

namespace {
// Device DAX maps in whole units of its alignment
// (/sys/dev/char/MAJ:MIN/device/align, or 2 MiB where it does not say).
uint64_t dax_align(dev_t rdev) {
  std::ifstream f("/sys/dev/char/" + std::to_string(major(rdev)) + ":" + std::to_string(minor(rdev)) + "/device/align");
  uint64_t a = 0;
  if (f >> a && a != 0 && (a & (a - 1)) == 0) return a;
  return 2u << 20;
}
uint64_t dax_size(dev_t rdev) {
  std::ifstream f("/sys/dev/char/" + std::to_string(major(rdev)) + ":" + std::to_string(minor(rdev)) + "/size");
  uint64_t v = 0;
  return f >> v ? v : 0;
}
}  // namespace

// --pmem PATH: the whole buffer is PATH, mapped MAP_SHARED from offset 0
// (its first bytes are overwritten). A regular file is created or extended
// (never shrunk) and its blocks allocated, so no WRITE waits for the file
// system to find space; it is mapped MAP_SYNC where the file system is DAX.
Status Session::map_pmem(uint64_t total) {
  const std::string& path = cfg_.pmem;
  const std::string what = "--pmem " + path;
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int e = errno;
    return fail(e, what + ": cannot open it read-write (" + std::strerror(e) +
                       "); give a file on a disk, a block device or /dev/daxN.M this user may write");
  }
  auto closing = [&](Error err) -> Status {
    ::close(fd);
    return std::unexpected(std::move(err));
  };
  struct stat st {};
  if (fstat(fd, &st) != 0) return closing(Error(errno, what + ": fstat failed"));
  uint64_t length = total;
  int flags = MAP_SHARED;
  if (S_ISREG(st.st_mode)) {
    if (uint64_t(st.st_size) < total) {
      if (int rc = posix_fallocate(fd, 0, off_t(total)); rc != 0) {
        return closing(Error(rc, what + ": cannot extend it to " + std::to_string(total) + " bytes (" +
                                     std::strerror(rc) + "); is its file system full?"));
      }
    }
    memory_kind_ = "file";
  } else if (S_ISBLK(st.st_mode)) {
    uint64_t size = 0;
    if (ioctl(fd, BLKGETSIZE64, &size) != 0) return closing(Error(errno, what + ": cannot read the block device's size"));
    if (size < total) {
      return closing(Error(ENOSPC, what + ": the block device holds " + std::to_string(size) + " bytes; the buffer needs " +
                                       std::to_string(total)));
    }
    memory_kind_ = "block device";
  } else if (S_ISCHR(st.st_mode)) {
    // Device DAX: no file system, no MAP_SYNC needed (nothing to sync).
    length = round_up(total, dax_align(st.st_rdev));
    if (uint64_t size = dax_size(st.st_rdev); size != 0 && size < length) {
      return closing(Error(ENOSPC, what + ": the DAX device holds " + std::to_string(size) + " bytes; the buffer needs " +
                                       std::to_string(length)));
    }
    memory_kind_ = "device DAX";
  } else {
    return closing(Error(EINVAL, what + ": not a regular file, a block device or a DAX character device"));
  }
  void* p = MAP_FAILED;
  if (S_ISREG(st.st_mode)) {
    // MAP_SYNC succeeds only on a DAX file system; elsewhere plain MAP_SHARED.
    p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED_VALIDATE | MAP_SYNC, fd, 0);
    if (p != MAP_FAILED) memory_kind_ = "file, DAX (MAP_SYNC)";
  }
  if (p == MAP_FAILED) p = mmap(nullptr, length, PROT_READ | PROT_WRITE, flags, fd, 0);
  if (p == MAP_FAILED) {
    const int e = errno;
    return closing(Error(e, what + ": mmap of " + std::to_string(length) + " bytes failed (" + std::strerror(e) + ")"));
  }
  memory_ = {static_cast<uint8_t*>(p), [fd, length](uint8_t* q) {
               munmap(q, length);
               ::close(fd);
             }};
  return {};
}

// --flush needs a provider that speaks FLUSH (shm does not), and where the
// peer flushes this side, the placement type's capability.
Status Session::check_flush_caps(bool as_target) const {
  const uint32_t caps = dev_->attr().caps;
  const char* type = flush_type_name(cfg_.flush_type);
  if (!as_target && !(caps & (UFAB_DEVICE_CAP_FLUSH_GLOBAL | UFAB_DEVICE_CAP_FLUSH_PERSISTENT))) {
    return fail(EOPNOTSUPP, "--flush " + std::string(type) + ": " + cfg_.device + " (provider " + dev_->provider() +
                                ") has no FLUSH (its device caps lack UFAB_DEVICE_CAP_FLUSH_GLOBAL and _PERSISTENT; "
                                "`ufab info " + cfg_.device + "` shows them); use a soft-RoCE port (swnic:LINK:PORT or "
                                "a NIC on vfio-pci)");
  }
  const uint32_t needed =
      cfg_.flush_type == rdma::kFlushTypePersistent ? UFAB_DEVICE_CAP_FLUSH_PERSISTENT : UFAB_DEVICE_CAP_FLUSH_GLOBAL;
  if (as_target && cfg_.flush_target() && !(caps & needed)) {
    return fail(EOPNOTSUPP, "--flush " + std::string(type) + ": " + cfg_.device + " (provider " + dev_->provider() +
                                ") cannot be the target of a FLUSH " + type + " (no UFAB_DEVICE_CAP_FLUSH_" +
                                (needed == UFAB_DEVICE_CAP_FLUSH_PERSISTENT ? "PERSISTENT" : "GLOBAL") +
                                "; `ufab info " + cfg_.device + "` shows what it offers)");
  }
  return {};
}

const char* flush_type_name(uint8_t type) {
  switch (type) {
    case 0: return "none";
    case rdma::kFlushTypeGlobal: return "global";
    case rdma::kFlushTypePersistent: return "persistent";
  }
  return "global+persistent";
}

std::string ufab_mark(uint8_t flush_type) { return "ufab:" + std::to_string(flush_type); }

// Both sides of a run with --flush must be `ufab perf` with the same
// --flush: perftest has no FLUSH (its target would refuse it, or, as the
// requester, never send one), and a ufab peer without it grants no FLUSH
// rights. Checked right after the version exchange, before any QP moves.
Status Session::check_peer_flush(const std::string& peer_version, const std::string& peer_tail) const {
  const bool ufab = peer_tail.rfind("ufab:", 0) == 0 && peer_tail.size() > 5;
  const std::string mine = flush_type_name(cfg_.flush_type);
  if (!ufab) {
    if (cfg_.flush_type == 0) return {};
    return fail(EPROTO, "--flush " + mine + ": the peer is not `ufab perf` (it announced perftest " + peer_version +
                            " without ufab's mark): perftest's tools (ib_write_bw, ib_write_lat, ...) have no FLUSH. "
                            "Run `ufab perf` with the same --flush on both sides, or leave --flush out");
  }
  const uint8_t theirs = uint8_t(std::strtoul(peer_tail.c_str() + 5, nullptr, 10));
  if (theirs != cfg_.flush_type) {
    return fail(EPROTO, std::string("the peer runs with ") +
                            (theirs ? "--flush " + std::string(flush_type_name(theirs)) : "no --flush") +
                            ", this side with " + (cfg_.flush_type ? "--flush " + mine : "none") +
                            ": give both sides the same --flush (and the same test and options)");
  }
  return {};
}

Status Session::hello() {
  const uint32_t mtu = cfg_.mtu ? cfg_.mtu : dev_->active_mtu();
  auto agreed = channel_->hello(kCycleBuffer, kCacheLine, mtu_enum(mtu), cfg_.timeout, ufab_mark(cfg_.flush_type));
  if (!agreed) return std::unexpected(agreed.error());
  if (auto f = check_peer_flush(channel_->peer_version(), channel_->peer_tail()); !f) return f;
  path_mtu_ = 128u << agreed->mtu_enum;
  // perftest walks its requests through the larger of the two page sizes
  // from our vaddr; our areas are sized for 4 KiB pages.
  if (agreed->cycle_buffer > area_) {
    return fail(ENOTSUP, "the peer's cycle buffer (page size) is " + std::to_string(agreed->cycle_buffer) +
                             " bytes; ufab perf sizes its buffer for " + std::to_string(kCycleBuffer) +
                             "-byte pages: use -s " + std::to_string(agreed->cycle_buffer) + " or more");
  }
  return {};
}

Status Session::open_channel() {
  if (cfg_.rdma_cm) return open_channel_cm();
  return with_progress(*dev_, [&]() -> Status {
    if (cfg_.server()) {
      auto listener = exchange::TcpChannel::listen(cfg_.port);
      if (!listener) return std::unexpected(listener.error().context("listening for the client"));
      // Not in perftest's output; scripts wait for it before they start a
      // perftest client, which does not retry its connect.
      std::fprintf(stderr, "perf: waiting for a client on TCP port %u\n", unsigned(listener->port()));
      std::fflush(stderr);
      auto ch = exchange::PerftestChannel::accept(*listener, cfg_.timeout);
      if (!ch) return std::unexpected(ch.error().context("waiting for the client on TCP port " +
                                                         std::to_string(listener->port())));
      channel_.emplace(std::move(*ch));
    } else {
      auto ch = exchange::PerftestChannel::connect(cfg_.server_host, cfg_.port, cfg_.timeout);
      if (!ch) return std::unexpected(ch.error());
      channel_.emplace(std::move(*ch));
    }
    return hello();
  });
}

// perftest -R: establish_connection over rdma_cm, the version/system/MTU
// exchange over it, then create_rdma_cm_connection (a key exchange, the
// test QPs through the connection manager, a key exchange). The keys of
// those two exchanges are QP 0's (perftest sends zeros there; nobody reads
// them).
Status Session::open_channel_cm() {
  return with_progress(*dev_, [&]() -> Status {
    auto cm = exchange::PerftestCm::open(*dev_, cfg_.port, cfg_.timeout);
    if (!cm) return std::unexpected(cm.error());
    cm_ = std::move(*cm);
    std::optional<uint32_t> server_ip;
    if (cfg_.server()) {
      // Not in perftest's output: for scripts, as the TCP line.
      std::fprintf(stderr, "perf: waiting for a client on rdma_cm port %u (%s)\n", unsigned(cfg_.port),
                   roce::ipv4_to_string(dev_->ip()).c_str());
      std::fflush(stderr);
      auto link = cm_->accept_control();
      if (!link) return std::unexpected(link.error());
      channel_.emplace(std::move(*link), false);
    } else {
      server_ip = roce::ipv4_from_string(cfg_.server_host);
      if (!server_ip) {
        return fail(EINVAL, "-R: the server " + cfg_.server_host +
                                " must be its RoCE IPv4 address (A.B.C.D), which rdma_cm connects to");
      }
      auto link = cm_->connect_control(*server_ip);
      if (!link) return std::unexpected(link.error());
      channel_.emplace(std::move(*link), true);
    }
    if (auto h = hello(); !h) return h;
    if (auto k = channel_->swap_keys(my_keys(0), cfg_.timeout); !k) {
      return std::unexpected(k.error().context("-R: the exchange before the test QPs connect"));
    }
    std::vector<rdma::QueuePair*> qps;
    for (auto& qp : qps_) qps.push_back(qp.get());
    // perftest's conn_param: out_reads for READ and atomics, else 0 (1
    // here: ufab_cm_conn_param's 0 means its default).
    const uint8_t depth = cfg_.verb == Verb::kRead || cfg_.verb == Verb::kAtomic ? uint8_t(out_reads(cfg_)) : 1;
    Status connected = cfg_.server() ? cm_->accept_qps(qps, depth) : cm_->connect_qps(qps, *server_ip, depth);
    if (!connected) return connected;
    if (auto k = channel_->swap_keys(my_keys(0), cfg_.timeout); !k) {
      return std::unexpected(k.error().context("-R: the exchange after the test QPs connected"));
    }
    // The path MTU is the connection manager's (the smaller port's).
    path_mtu_ = qps_[0]->attr().path_mtu;
    return {};
  });
}

Status Session::finish() {
  if (!cm_) return {};
  Status s = with_progress(*dev_, [&]() -> Status { return cm_->disconnect_qps(); });
  for (const auto& w : cm_->take_warnings()) std::fprintf(stderr, "perf: -R: %s\n", w.c_str());
  return s;
}

Status Session::open() {
  if (auto s = open_device(); !s) return s;
  return open_channel();
}

exchange::PerftestKeys Session::my_keys(uint32_t i) const {
  exchange::PerftestKeys k;
  k.lid = 0;
  k.out_reads = out_reads(cfg_);
  auto local = qps_[i]->local();
  k.qpn = local.qpn;
  k.psn = local.psn;
  k.rkey = mr_->rkey();
  k.vaddr = reinterpret_cast<uintptr_t>(remote_area(i));
  k.gid = roce::gid_from_ipv4(dev_->ip());
  return k;
}

Status Session::swap_keys(bool first_only) {
  return with_progress(*dev_, [&]() -> Status {
    for (uint32_t i = 0; i < (first_only ? 1 : cfg_.qps); ++i) {
      auto k = channel_->swap_keys(my_keys(i), cfg_.timeout);
      if (!k) return std::unexpected(k.error());
      remote_[i] = *k;
    }
    return {};
  });
}

Status Session::connect() {
  if (cfg_.rdma_cm) return {};  // connected by the connection manager in open()
  for (uint32_t i = 0; i < cfg_.qps; ++i) {
    const exchange::PerftestKeys& peer = remote_[i];
    auto ip = roce::ipv4_from_gid(peer.gid);
    if (!ip) {
      return fail(EPROTO, "the peer's GID " + roce::gid_to_text(peer.gid) +
                              " is not an IPv4-mapped address (::ffff:a.b.c.d): ufab speaks RoCEv2 over IPv4; give "
                              "perftest the -x index of its ::ffff:a.b.c.d GID whose type is \"RoCE v2\"");
    }
    rdma::QpAttr a;
    a.state = rdma::QpState::kRtr;
    a.path_mtu = path_mtu_;
    a.dest_qpn = peer.qpn;
    a.rq_psn = peer.psn;
    a.max_dest_rd_atomic = uint8_t(out_reads(cfg_));
    a.min_rnr_timer = 12;
    a.av.dest_ip = *ip;
    // perftest asks for hop limit 255; the kernel puts its route's TTL (64)
    // on the wire, and so do we.
    a.av.hop_limit = 64;
    if (auto s = qps_[i]->modify(a, rdma::kAttrState | rdma::kAttrAv | rdma::kAttrPathMtu | rdma::kAttrDestQpn |
                                        rdma::kAttrRqPsn | rdma::kAttrMaxDestRdAtomic | rdma::kAttrMinRnrTimer);
        !s) {
      return std::unexpected(s.error().context("moving QP " + std::to_string(i) + " to RTR"));
    }
    a.state = rdma::QpState::kRts;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = qps_[i]->local().psn;
    // The peer's responder depth is our initiator depth, as in perftest,
    // within what ufab allows.
    a.max_rd_atomic = uint8_t(std::clamp<uint32_t>(peer.out_reads, 1, 16));
    if (auto s = qps_[i]->modify(a, rdma::kAttrState | rdma::kAttrTimeout | rdma::kAttrRetryCnt |
                                        rdma::kAttrRnrRetry | rdma::kAttrSqPsn | rdma::kAttrMaxQpRdAtomic);
        !s) {
      return std::unexpected(s.error().context("moving QP " + std::to_string(i) + " to RTS"));
    }
  }
  return {};
}

Status Session::close() {
  return with_progress(*dev_, [&]() -> Status { return channel_->close(my_keys(0), cfg_.timeout); });
}

Result<exchange::PerftestBwReport> Session::swap_bw_report(const exchange::PerftestBwReport& mine) {
  Result<exchange::PerftestBwReport> theirs = std::unexpected(Error(ENOTCONN, "no report"));
  auto s = with_progress(*dev_, [&]() -> Status {
    theirs = channel_->swap_bw_report(mine, cfg_.timeout);
    return theirs ? Status{} : std::unexpected(theirs.error());
  });
  if (!s) return std::unexpected(s.error());
  return theirs;
}

namespace {
constexpr char kResultLine[] = "---------------------------------------------------------------------------------------\n";
}

void Session::print_rule() const { std::fputs(kResultLine, out()); }

void Session::print_banner(const char* title) const {
  FILE* out = this->out();
  std::fputs(kResultLine, out);
  std::fprintf(out, "                    %s\n", title);
  std::fprintf(out, " Dual-port       : OFF\t\tDevice         : %s\n", cfg_.device.c_str());
  std::fprintf(out, " Number of qps   : %u\t\tTransport type : IB\n", cfg_.qps);
  std::fprintf(out, " Connection type : RC\t\tUsing SRQ      : OFF\n");
  std::fprintf(out, " PCIe relax order: OFF\n");
  std::fprintf(out, " ibv_wr* API     : OFF\n");
  if (!cfg_.server()) std::fprintf(out, " TX depth        : %u\n", cfg_.tx_depth);
  if (cfg_.verb == Verb::kSend && cfg_.server()) std::fprintf(out, " RX depth        : %u\n", cfg_.rx_depth);
  if (cfg_.kind == Kind::kBandwidth) std::fprintf(out, " CQ Moderation   : %u\n", cfg_.cq_mod);
  std::fprintf(out, " Mtu             : %u[B]\n", path_mtu_);
  std::fprintf(out, " Link type       : Ethernet\n");
  std::fprintf(out, " GID index       : 0\n");
  if (cfg_.verb == Verb::kRead || cfg_.verb == Verb::kAtomic || cfg_.verb == Verb::kFlush) {
    std::fprintf(out, " Outstand reads  : %u\n", unsigned(out_reads(cfg_)));
  } else {
    std::fprintf(out, " Max inline data : %u[B]\n", cfg_.inline_size);
  }
  // Not perftest's: what a FLUSH run flushes, and durable memory.
  if (cfg_.flush_type != 0) {
    std::fprintf(out, " FLUSH           : %s%s\n", flush_type_name(cfg_.flush_type),
                 cfg_.verb == Verb::kFlush ? ", RANGE of the message size" : ", RANGE, behind each WRITE");
  }
  if (!cfg_.pmem.empty()) std::fprintf(out, " Memory          : persistent, %s (%s)\n", cfg_.pmem.c_str(), memory_kind_.c_str());
  if (cfg_.cuda_device >= 0) std::fprintf(out, " Memory          : %s\n", memory_kind_.c_str());
  std::fprintf(out, " rdma_cm QPs\t : %s\n", cfg_.rdma_cm ? "ON" : "OFF");
  std::fprintf(out, " Data ex. method : %s\n", cfg_.rdma_cm ? "rdma_cm" : "Ethernet");
  std::fputs(kResultLine, out);
}

void Session::print_addresses(bool remote) const {
  FILE* out = this->out();
  auto line = [&](const char* side, const exchange::PerftestKeys& k) {
    // perftest's "%#04x"-style fields: zero prints without 0x.
    auto hex = [](uint64_t v, int width) {
      char b[32];
      std::snprintf(b, sizeof b, "%#0*llx", width, static_cast<unsigned long long>(v));
      return std::string(b);
    };
    std::fprintf(out, " %s address: LID %s QPN %s PSN %s", side, hex(k.lid, 4).c_str(), hex(k.qpn, 6).c_str(),
                 hex(k.psn, 6).c_str());
    // With -R perftest prints these lines with its control connection's
    // verb, SEND: no OUT, RKey or VAddr (ctx_print_pingpong_data reads
    // comm->rdma_params->verb).
    const Verb verb = cfg_.rdma_cm ? Verb::kSend : cfg_.verb;
    if (verb == Verb::kRead) std::fprintf(out, " OUT %s", hex(k.out_reads, 4).c_str());
    if (verb == Verb::kRead || verb == Verb::kWrite || verb == Verb::kFlush) {
      std::fprintf(out, " RKey %s VAddr %s", hex(k.rkey, 8).c_str(), hex(k.vaddr, 16).c_str());
    }
    std::fprintf(out, "\n GID: %s\n", roce::gid_to_perftest_text(k.gid).c_str());
  };
  for (uint32_t i = 0; i < cfg_.qps; ++i) {
    if (remote) {
      line("remote", remote_[i]);
    } else {
      line("local", my_keys(i));
    }
  }
}

Result<std::optional<rdma::WorkCompletion>> Session::wait_completion(rdma::CompletionQueue& cq,
                                                                     const std::string& what,
                                                                     const std::function<bool()>& stop) {
  rdma::WorkCompletion wc;
  const int64_t deadline = now_ns() + int64_t(cfg_.timeout.count()) * 1'000'000;
  // Busy-poll for kSpinNs, then wait on the CQ (the provider spins a
  // little more, then sleeps on the NIC), so two processes sharing a core
  // (one VM, an oversubscribed host) take turns instead of each spinning
  // out its time slice. The clock is read every kClockEvery empty polls: a
  // clock read costs as much as a poll of a shared-memory CQ.
  const int64_t spin_end = now_ns() + kSpinNs;
  bool spinning = true;
  for (uint32_t polls = 0;; ++polls) {
    auto n = spinning ? cq.poll({&wc, 1}) : cq.wait({&wc, 1}, std::chrono::milliseconds(1));
    if (!n) return std::unexpected(n.error().context(what));
    if (*n == 1) break;
    if (stop && stop()) return std::nullopt;
    if ((!spinning || polls % kClockEvery == 0) && now_ns() > deadline) {
      return fail(ETIMEDOUT, "no completion for " + std::to_string(cfg_.timeout.count() / 1000) + " s while waiting for " +
                                 what + "; is the peer still running with the same test and options? (" +
                                 counters() + ")");
    }
    if (spinning && polls % kClockEvery == 0 && now_ns() > spin_end) spinning = false;
  }
  if (wc.status != rdma::WcStatus::kSuccess) {
    return fail(EIO, std::string("completion with error ") + rdma::wc_status_name(wc.status) + " (" +
                         std::to_string(int(wc.status)) + ") for " + what + (wc.error.empty() ? "" : ": " + wc.error) +
                         " (" + counters() + ")");
  }
  return std::optional(wc);
}

Status Session::wait_byte(const uint8_t* byte, uint8_t value, const std::string& what,
                          const std::function<bool()>& stop) {
  const int64_t deadline = now_ns() + int64_t(cfg_.timeout.count()) * 1'000'000;
  const int64_t spin_end = now_ns() + kSpinNs;
  // The transport writes this memory from dev.progress() on this thread.
  for (uint32_t polls = 0; *reinterpret_cast<const volatile uint8_t*>(byte) != value; ++polls) {
    if (stop && stop()) return {};
    // The deadline holds even while the transport is busy (retransmitting
    // to a peer that is gone, with retry_cnt 7 = forever).
    dev_->progress();
    // Past the spin, yield now and then: no CQ says when a WRITE lands, so
    // this is how a poller that shares its core lets the peer run.
    if (polls % kClockEvery != 0) continue;
    const int64_t now = now_ns();
    if (now > spin_end) std::this_thread::yield();
    if (now > deadline) {
      return fail(ETIMEDOUT, "nothing arrived for " + std::to_string(cfg_.timeout.count() / 1000) + " s while waiting for " +
                                 what + "; is the peer still running with the same -s and -n? (" + counters() + ")");
    }
  }
  return {};
}

void Session::linger(milliseconds how_long) {
  for (const int64_t until = now_ns() + int64_t(how_long.count()) * 1'000'000; now_ns() < until;) {
    if (dev_->progress() == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

DurationClock::DurationClock(uint32_t duration_s)
    : start_(now_ns()), margin_ns_(int64_t(duration_s / 4) * 1'000'000'000), duration_ns_(int64_t(duration_s) * 1'000'000'000) {}

DurationClock::State DurationClock::state() {
  const int64_t t = now_ns() - start_;
  if (t < margin_ns_) return State::kWarmup;
  if (sample_start_ == 0) sample_start_ = now_ns();
  if (t < duration_ns_ - margin_ns_) return State::kSample;
  if (sample_end_ == 0) sample_end_ = now_ns();
  return t < duration_ns_ ? State::kTail : State::kEnd;
}

std::string Session::counters() const { return rdma::to_string(dev_->stats()); }

}  // namespace ufab::cli::perf
