#include "core/nic.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ufab::core {

// The framework's side of one open device, handed to the plugin as the
// opaque `ufab_host`. Every service reports failures as -errno plus a
// message in pending_error, which Nic::check turns into an Error. The
// message is per thread: it is read back by the thread whose op failed, and
// RX and TX may run on different threads.
struct Nic::HostBridge {
  Nic* nic = nullptr;
  static thread_local std::string pending_error;
  std::map<uint64_t, dma::DmaRegion> dma_regions;  // by cookie
  uint64_t next_cookie = 1;
  std::vector<vfio::KernelFd> irq_fds;

  ufab_host* handle() { return reinterpret_cast<ufab_host*>(this); }
  static HostBridge& from(ufab_host* h) { return *reinterpret_cast<HostBridge*>(h); }
  int error(int err, const std::string& message) {
    pending_error = message;
    return -err;
  }

  static const ufab_host_ops kOps;
};

namespace {

bool implements(const ufab_driver& driver, const char* op) {
  auto stubbed = stubbed_driver_ops(driver);
  return std::find(stubbed.begin(), stubbed.end(), op) == stubbed.end();
}

int log_threshold() {
  static const int level = [] {
    const char* v = std::getenv("UFAB_LOG_LEVEL");
    return v ? std::atoi(v) : UFAB_LOG_WARN;
  }();
  return level;
}

}  // namespace

thread_local std::string Nic::HostBridge::pending_error;

const ufab_host_ops Nic::HostBridge::kOps = {
    .size = sizeof(ufab_host_ops),
    .log =
        [](ufab_host* h, int level, const char* message) {
          if (level > log_threshold()) return;
          static const char* names[] = {"error", "warning", "info", "debug"};
          std::fprintf(stderr, "ufab %s [%s]: %s\n", from(h).nic->name_.c_str(),
                       names[level < 0 ? 0 : level > 3 ? 3 : level], message);
        },
    .set_error = [](ufab_host*, const char* message) { pending_error = message ? message : ""; },
    .name = [](ufab_host* h) { return from(h).nic->name_.c_str(); },
    .param =
        [](ufab_host* h, const char* key) -> const char* {
          const auto& params = from(h).nic->params_;
          auto it = key ? params.find(key) : params.end();
          return it == params.end() ? nullptr : it->second.c_str();
        },
    .map_bar =
        [](ufab_host* h, uint32_t index, volatile void** base, uint64_t* size) -> int {
          HostBridge& host = from(h);
          vfio::Device* device = host.nic->device_.get();
          if (!device) return host.error(ENODEV, "map_bar: a software device has no BARs");
          auto region = device->map_region(index);
          if (!region) return host.error(region.error().code(), region.error().message());
          auto whole = (*region)->mmio();
          if (!whole) return host.error(whole.error().code(), whole.error().message());
          *base = whole->origin();
          *size = whole->size();
          return 0;
        },
    .config_read =
        [](ufab_host* h, uint32_t offset, uint32_t len, uint32_t* value) -> int {
          HostBridge& host = from(h);
          vfio::Device* d = host.nic->device_.get();
          if (!d) return host.error(ENODEV, "config_read: a software device has no config space");
          Result<uint32_t> v = fail(EINVAL, "config_read: length must be 1, 2 or 4");
          if (len == 1) {
            auto r = d->config_read8(offset);
            v = r ? Result<uint32_t>(*r) : std::unexpected(r.error());
          } else if (len == 2) {
            auto r = d->config_read16(offset);
            v = r ? Result<uint32_t>(*r) : std::unexpected(r.error());
          } else if (len == 4) {
            v = d->config_read32(offset);
          }
          if (!v) return host.error(v.error().code(), v.error().message());
          *value = *v;
          return 0;
        },
    .config_write =
        [](ufab_host* h, uint32_t offset, uint32_t len, uint32_t value) -> int {
          HostBridge& host = from(h);
          vfio::Device* d = host.nic->device_.get();
          if (!d) return host.error(ENODEV, "config_write: a software device has no config space");
          Status s = len == 1   ? d->config_write8(offset, static_cast<uint8_t>(value))
                     : len == 2 ? d->config_write16(offset, static_cast<uint16_t>(value))
                     : len == 4 ? d->config_write32(offset, value)
                                : Status(fail(EINVAL, "config_write: length must be 1, 2 or 4"));
          return s ? 0 : host.error(s.error().code(), s.error().message());
        },
    .enable_bus_master =
        [](ufab_host* h) -> int {
          HostBridge& host = from(h);
          vfio::Device* d = host.nic->device_.get();
          if (!d) return 0;  // nothing to enable for software devices
          auto s = d->enable_bus_master();
          return s ? 0 : host.error(s.error().code(), s.error().message());
        },
    .dma_alloc =
        [](ufab_host* h, size_t size, size_t align, ufab_dma_mem* out) -> int {
          HostBridge& host = from(h);
          auto region = host.nic->dma_->allocate(size, align);
          if (!region) return host.error(region.error().code(), region.error().message());
          uint64_t cookie = host.next_cookie++;
          *out = ufab_dma_mem{region->va(), region->iova(), region->size(), cookie};
          host.dma_regions.emplace(cookie, std::move(*region));
          return 0;
        },
    .dma_free =
        [](ufab_host* h, ufab_dma_mem* mem) {
          if (mem) from(h).dma_regions.erase(mem->cookie);
        },
    .irq_enable =
        [](ufab_host* h, uint32_t count, int* fds) -> int {
          HostBridge& host = from(h);
          vfio::Device* d = host.nic->device_.get();
          if (!d) return host.error(ENODEV, "irq_enable: a software device has no MSI-X vectors");
          auto got = d->enable_irqs(vfio::IrqKind::msix, count);
          if (!got) return host.error(got.error().code(), got.error().message());
          host.irq_fds = std::move(*got);
          for (uint32_t i = 0; i < count; ++i) fds[i] = host.irq_fds[i].get();
          return 0;
        },
    .irq_disable =
        [](ufab_host* h) -> int {
          HostBridge& host = from(h);
          vfio::Device* d = host.nic->device_.get();
          if (!d) return 0;
          auto s = d->disable_irqs(vfio::IrqKind::msix);
          host.irq_fds.clear();
          return s ? 0 : host.error(s.error().code(), s.error().message());
        },
    .buf_alloc =
        [](ufab_host* h, ufab_pool* pool, ufab_buf** bufs, uint32_t n) -> int {
          dma::BufferPool* p = dma::BufferPool::from_handle(pool);
          if (!p) return from(h).error(EINVAL, "buf_alloc: not a buffer pool (a queue set up without one?)");
          return static_cast<int>(p->alloc(bufs, n));
        },
    .buf_free =
        [](ufab_host*, ufab_buf** bufs, uint32_t n) {
          // Runs of buffers from one pool are freed together (the usual case).
          uint32_t i = 0;
          while (i < n) {
            uint32_t j = i + 1;
            while (j < n && bufs[j]->pool == bufs[i]->pool) ++j;
            // A buffer with a stale pool pointer is the plugin's bug: dropped
            // (counted by no pool) rather than written through.
            if (dma::BufferPool* p = dma::BufferPool::from_handle(bufs[i]->pool)) p->free(bufs + i, j - i);
            i = j;
          }
        },
};

Result<std::unique_ptr<Nic>> Nic::open_pci(const ufab_driver& driver, const PciAddress& address, NicParams params,
                                           vfio::Environment env) {
  if (driver.flags & UFAB_DRIVER_F_SOFTWARE) {
    return fail(EINVAL, std::string("driver '") + driver.name + "' is for software devices, not PCI NICs");
  }
  std::unique_ptr<Nic> nic(new Nic());
  nic->name_ = address.str();
  nic->params_ = std::move(params);
  nic->driver_ = complete_driver_ops(driver);
  nic->can_gather_ = implements(driver, "tx_burst_gather");
  auto container = vfio::Container::open(env);
  if (!container) return std::unexpected(container.error().context("opening " + nic->name_));
  nic->iommu_ = *container;
  auto device = vfio::Device::open(nic->iommu_, address);
  if (!device) return std::unexpected(device.error());
  nic->device_ = std::make_unique<vfio::Device>(std::move(*device));
  auto dma = dma::DmaAllocator::create(nic->iommu_);
  if (!dma) return std::unexpected(dma.error().context("DMA memory for " + nic->name_));
  nic->dma_ = *dma;
  if (auto s = nic->open_plugin(); !s) return std::unexpected(s.error());
  return nic;
}

Result<std::unique_ptr<Nic>> Nic::open_software(const ufab_driver& driver, const std::string& name,
                                                NicParams params) {
  if (!(driver.flags & UFAB_DRIVER_F_SOFTWARE)) {
    return fail(EINVAL, std::string("driver '") + driver.name + "' drives PCI NICs; open it by PCI address");
  }
  std::unique_ptr<Nic> nic(new Nic());
  nic->name_ = name;
  nic->params_ = std::move(params);
  nic->driver_ = complete_driver_ops(driver);
  nic->can_gather_ = implements(driver, "tx_burst_gather");
  auto dma = dma::DmaAllocator::create(nullptr);
  if (!dma) return std::unexpected(dma.error());
  nic->dma_ = *dma;
  if (auto s = nic->open_plugin(); !s) return std::unexpected(s.error());
  return nic;
}

Status Nic::open_plugin() {
  host_ = std::make_unique<HostBridge>();
  host_->nic = this;
  if (auto s = call("opening", [&] { return driver_.open(&HostBridge::kOps, host_->handle(), &dev_); }); !s) return s;
  return call("querying", [&] { return driver_.info(dev_, &info_); });
}

Nic::~Nic() {
  if (dev_) {
    driver_.stop(dev_);
    driver_.close(dev_);
    dev_ = nullptr;
  }
  host_.reset();   // IRQ eventfds and DMA regions the plugin did not free
  pools_.clear();  // every buffer is back now
}

Status Nic::call(const std::string& what, const std::function<int()>& op) {
  HostBridge::pending_error.clear();  // an explanation belongs to this op only
  int rc = op();
  if (rc >= 0) return {};
  std::string why = HostBridge::pending_error;
  if (why.empty()) why = rc == -EOPNOTSUPP ? "the driver does not support this" : std::strerror(-rc);
  return fail(-rc, std::string(driver_.name) + " " + what + " " + name_ + ": " + why);
}

std::string Nic::last_error() const { return HostBridge::pending_error; }

Result<ufab_link> Nic::link() {
  ufab_link l{};
  if (auto s = call("reading the link of", [&] { return driver_.link(dev_, &l); }); !s) return std::unexpected(s.error());
  return l;
}

Result<ufab_stats> Nic::stats() {
  ufab_stats st{};
  if (auto s = call("reading the statistics of", [&] { return driver_.stats(dev_, &st); }); !s) return std::unexpected(s.error());
  return st;
}

Result<std::shared_ptr<dma::BufferPool>> Nic::create_pool(uint32_t count, uint32_t buffer_size) {
  auto pool = dma::BufferPool::create(dma_, count, buffer_size);
  if (!pool) return std::unexpected(pool.error().context("buffers for " + name_));
  pools_.push_back(std::shared_ptr<dma::BufferPool>(std::move(*pool)));
  return pools_.back();
}

Status Nic::setup_rx_queue(uint16_t queue, uint32_t size, dma::BufferPool& pool) {
  ufab_queue_conf conf{size, pool.handle()};
  return call("setting up RX queue " + std::to_string(queue) + " of", [&] { return driver_.rx_queue_setup(dev_, queue, &conf); });
}

Status Nic::setup_tx_queue(uint16_t queue, uint32_t size) {
  ufab_queue_conf conf{size, nullptr};
  return call("setting up TX queue " + std::to_string(queue) + " of", [&] { return driver_.tx_queue_setup(dev_, queue, &conf); });
}

Status Nic::start() { return call("starting", [&] { return driver_.start(dev_); }); }
Status Nic::stop() { return call("stopping", [&] { return driver_.stop(dev_); }); }
Status Nic::set_promiscuous(bool enable) {
  return call("setting promiscuous mode on", [&] { return driver_.set_promiscuous(dev_, enable ? 1 : 0); });
}

Status Nic::set_rx_steering(uint32_t mode, uint16_t nqueues) {
  return call("setting receive steering on", [&] { return driver_.rx_steer(dev_, mode, nqueues); });
}

Result<int> Nic::enable_rx_irq(uint16_t queue) {
  int fd = -1;
  if (auto s = call("arming the RX interrupt of", [&] { return driver_.rx_irq(dev_, queue, 1, &fd); }); !s) {
    return std::unexpected(s.error());
  }
  return fd;
}

Status Nic::disable_rx_irq(uint16_t queue) {
  int fd = -1;
  return call("disarming the RX interrupt of", [&] { return driver_.rx_irq(dev_, queue, 0, &fd); });
}

}  // namespace ufab::core
