#include "vfio/device.h"

#include <linux/vfio.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>

#include "vfio/info_caps.h"
#include "vfio/text.h"

namespace ufab::vfio {
namespace {

static_assert(sizeof(vfio_region_info) == 32);  // caps start here
static_assert(sizeof(vfio_irq_info) == 16);
static_assert(sizeof(vfio_irq_set) == 20);      // + 4 bytes per eventfd
static_assert(offsetof(vfio_device_info, num_irqs) + 4 == 16);

uint64_t host_page_size() {
  long page = ::sysconf(_SC_PAGESIZE);
  return page > 0 ? static_cast<uint64_t>(page) : 4096;
}

uint64_t round_up(uint64_t value, uint64_t page) { return (value + page - 1) & ~(page - 1); }

std::string describe_areas(const std::vector<Mmio>& areas) {
  std::string out;
  for (const auto& a : areas) {
    if (!out.empty()) out += ", ";
    out += a.describe();
  }
  return out.empty() ? "none" : out;
}

}  // namespace

std::string irq_kind_name(IrqKind kind) {
  switch (kind) {
    case IrqKind::intx: return "INTx";
    case IrqKind::msi: return "MSI";
    case IrqKind::msix: return "MSI-X";
    case IrqKind::error: return "error";
    case IrqKind::request: return "request";
  }
  return "IRQ index " + std::to_string(static_cast<uint32_t>(kind));
}

bool DeviceInfo::reset_supported() const { return flags & VFIO_DEVICE_FLAGS_RESET; }
bool DeviceInfo::is_pci() const { return flags & VFIO_DEVICE_FLAGS_PCI; }
bool RegionInfo::readable() const { return flags & VFIO_REGION_INFO_FLAG_READ; }
bool RegionInfo::writable() const { return flags & VFIO_REGION_INFO_FLAG_WRITE; }
bool RegionInfo::mappable() const { return flags & VFIO_REGION_INFO_FLAG_MMAP; }
bool IrqInfo::eventfd() const { return flags & VFIO_IRQ_INFO_EVENTFD; }
bool IrqInfo::maskable() const { return flags & VFIO_IRQ_INFO_MASKABLE; }
bool IrqInfo::automasked() const { return flags & VFIO_IRQ_INFO_AUTOMASKED; }
bool IrqInfo::noresize() const { return flags & VFIO_IRQ_INFO_NORESIZE; }

std::vector<MmapArea> RegionInfo::mappable_areas() const {
  if (!mappable()) return {};
  if (sparse_areas) return *sparse_areas;
  return {{0, size}};
}

// ---- MappedRegion ----

MappedRegion::~MappedRegion() {
  // One munmap of the reservation removes every area mapped into it.
  if (reservation_ != nullptr) kernel_->munmap(reservation_, reservation_size_);
}

Result<Mmio> MappedRegion::window(uint64_t offset, uint64_t length) const {
  for (const auto& area : areas_)
    if (area.contains(offset, length)) return area;
  return fail(ERANGE, "offset " + hex(offset) + "+" + std::to_string(length) + " of " + name_ +
                          " is outside its mmapped areas (" + describe_areas(areas_) +
                          "); the kernel keeps the rest (e.g. an MSI-X table) for itself: use "
                          "Device::region_read/region_write (pread/pwrite) there");
}

// ---- Device ----

namespace {

Result<RegionInfo> query_region(Kernel& kernel, int fd, uint32_t index, const std::string& device) {
  const std::string what = "VFIO_DEVICE_GET_REGION_INFO(" + std::to_string(index) + ") of " + device;
  auto buffer = detail::query_info(kernel, fd, VFIO_DEVICE_GET_REGION_INFO, sizeof(vfio_region_info), what,
                                   [index](detail::InfoBuffer& b) { b.as<vfio_region_info>()->index = index; });
  if (!buffer) return std::unexpected(buffer.error());
  const auto* fixed = buffer->as<vfio_region_info>();
  RegionInfo info;
  info.index = index;
  info.flags = fixed->flags;
  info.size = fixed->size;
  info.offset = fixed->offset;
  if (!(fixed->flags & VFIO_REGION_INFO_FLAG_CAPS) || fixed->cap_offset == 0) return info;

  auto caps = detail::walk_info_caps(*buffer, sizeof(vfio_region_info), fixed->cap_offset, what);
  if (!caps) return std::unexpected(caps.error());
  for (const auto& cap : *caps) {
    const uint8_t* at = buffer->data() + cap.offset;
    switch (cap.id) {
      case VFIO_REGION_INFO_CAP_SPARSE_MMAP: {
        vfio_region_info_cap_sparse_mmap head;
        if (cap.length < sizeof head) return fail(EPROTO, what + ": truncated sparse-mmap capability");
        std::memcpy(&head, at, sizeof head);
        if (head.nr_areas > (cap.length - sizeof head) / sizeof(vfio_region_sparse_mmap_area))
          return fail(EPROTO, what + ": sparse-mmap capability claims " + std::to_string(head.nr_areas) +
                                  " areas but holds fewer");
        std::vector<MmapArea> areas;
        for (uint32_t i = 0; i < head.nr_areas; ++i) {
          vfio_region_sparse_mmap_area a;
          std::memcpy(&a, at + sizeof head + i * sizeof a, sizeof a);
          if (a.size == 0) continue;
          if (a.offset > info.size || a.size > info.size - a.offset)
            return fail(EPROTO, what + ": sparse-mmap area " + hex(a.offset) + "+" + hex(a.size) +
                                    " lies outside the " + bytes(info.size) + " region");
          areas.push_back({a.offset, a.size});
        }
        info.sparse_areas = std::move(areas);
        break;
      }
      case VFIO_REGION_INFO_CAP_TYPE: {
        vfio_region_info_cap_type t;
        if (cap.length < sizeof t) return fail(EPROTO, what + ": truncated region-type capability");
        std::memcpy(&t, at, sizeof t);
        info.type = t.type;
        info.subtype = t.subtype;
        break;
      }
      case VFIO_REGION_INFO_CAP_MSIX_MAPPABLE:
        info.msix_mappable = true;
        break;
      default:
        break;
    }
  }
  return info;
}

Result<IrqInfo> query_irq(Kernel& kernel, int fd, uint32_t index, const std::string& device) {
  vfio_irq_info irq{};
  irq.argsz = sizeof irq;
  irq.index = index;
  if (kernel.ioctl(fd, VFIO_DEVICE_GET_IRQ_INFO, &irq) != 0)
    return fail_errno("VFIO_DEVICE_GET_IRQ_INFO(" + irq_kind_name(static_cast<IrqKind>(index)) + ") of " + device);
  return IrqInfo{index, irq.flags, irq.count};
}

}  // namespace

Result<Device> Device::open(std::shared_ptr<IommuBackend> iommu, const PciAddress& address) {
  if (!iommu) return fail(EINVAL, "opening " + address.str() + ": no IOMMU backend given");
  auto fd = iommu->open_device(address);
  if (!fd) return std::unexpected(fd.error());

  Device device;
  device.kernel_ = iommu->environment().kernel;
  device.iommu_ = std::move(iommu);
  device.address_ = address;
  device.fd_ = std::move(*fd);
  Kernel& kernel = *device.kernel_;

  vfio_device_info info{};
  info.argsz = sizeof info;
  if (kernel.ioctl(device.fd_.get(), VFIO_DEVICE_GET_INFO, &info) != 0)
    return fail_errno("VFIO_DEVICE_GET_INFO of " + address.str());
  device.info_ = {info.flags, info.num_regions, info.num_irqs};
  if (!device.info_.is_pci())
    return fail(ENODEV, address.str() + " is not a vfio-pci device (VFIO device flags " + hex(info.flags) + ")");
  if (info.num_regions > 64 || info.num_irqs > 64)
    return fail(EPROTO, address.str() + " reports " + std::to_string(info.num_regions) + " regions and " +
                            std::to_string(info.num_irqs) + " IRQ indexes; implausible");

  // An absent region (the VGA index of a non-VGA device) answers EINVAL;
  // remember the error and report it when someone asks for that region.
  for (uint32_t i = 0; i < info.num_regions; ++i)
    device.regions_.push_back(query_region(kernel, device.fd_.get(), i, address.str()));
  for (uint32_t i = 0; i < info.num_irqs; ++i)
    device.irqs_.push_back(query_irq(kernel, device.fd_.get(), i, address.str()));
  return device;
}

Device& Device::operator=(Device&& other) noexcept {
  if (this != &other) {
    disable_all_irqs();
    mapped_.clear();
    fd_.reset();
    mapped_ = std::move(other.mapped_);
    enabled_irqs_ = std::move(other.enabled_irqs_);
    regions_ = std::move(other.regions_);
    irqs_ = std::move(other.irqs_);
    info_ = other.info_;
    fd_ = std::move(other.fd_);
    address_ = other.address_;
    kernel_ = other.kernel_;
    iommu_ = std::move(other.iommu_);
  }
  return *this;
}

Device::~Device() {
  disable_all_irqs();
  mapped_.clear();
}

void Device::disable_all_irqs() {
  if (!fd_.valid()) return;
  auto enabled = enabled_irqs_;
  for (const auto& [index, count] : enabled) (void)disable_irqs(static_cast<IrqKind>(index));
  enabled_irqs_.clear();
}

std::string Device::region_name(uint32_t index) const {
  std::string what;
  if (index <= 5) what = "BAR " + std::to_string(index);
  else if (index == kRomRegion) what = "the expansion ROM";
  else if (index == kConfigRegion) what = "config space";
  else what = "region " + std::to_string(index);
  return what + " of " + name();
}

Result<RegionInfo> Device::region_info(uint32_t index) const {
  if (index >= regions_.size())
    return fail(EINVAL, region_name(index) + " does not exist: the device has " + std::to_string(regions_.size()) +
                            " regions");
  return regions_[index];
}

Result<const MappedRegion*> Device::map_region(uint32_t index) {
  if (auto it = mapped_.find(index); it != mapped_.end()) return it->second.get();
  auto info = region_info(index);
  if (!info) return std::unexpected(info.error());
  if (info->size == 0)
    return fail(ENODEV, region_name(index) + " is not implemented (size 0)");
  if (!info->mappable())
    return fail(EINVAL, region_name(index) + " cannot be mmapped (no VFIO_REGION_INFO_FLAG_MMAP: an I/O port "
                        "BAR, a BAR smaller than a page, or config space); use region_read/region_write");
  auto areas = info->mappable_areas();
  if (areas.empty())
    return fail(ENOTSUP, region_name(index) + " has a sparse-mmap capability with no mappable area");

  const uint64_t page = host_page_size();
  auto region = std::unique_ptr<MappedRegion>(new MappedRegion());
  region->kernel_ = kernel_;
  region->name_ = region_name(index);
  region->index_ = index;
  region->size_ = info->size;
  // Reserve the whole region's address range first and map the areas into it
  // at their offsets: register offsets then stay region offsets, and the holes
  // stay PROT_NONE (a stray unchecked access faults instead of touching
  // something else).
  region->reservation_size_ = round_up(info->size, page);
  void* reservation = kernel_->mmap(nullptr, region->reservation_size_, PROT_NONE,
                                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (reservation == MAP_FAILED)
    return fail_errno("reserving " + bytes(region->reservation_size_) + " of address space for " +
                      region_name(index));
  region->reservation_ = reservation;

  int prot = (info->readable() ? PROT_READ : 0) | (info->writable() ? PROT_WRITE : 0);
  auto* base = static_cast<uint8_t*>(reservation);
  for (const auto& area : areas) {
    if (area.offset % page != 0)
      return fail(EPROTO, region_name(index) + ": mmap area at " + hex(area.offset) + " is not page aligned");
    void* at = kernel_->mmap(base + area.offset, round_up(area.size, page), prot, MAP_SHARED | MAP_FIXED, fd_.get(),
                             static_cast<off_t>(info->offset + area.offset));
    if (at == MAP_FAILED)
      return fail_errno("mmap of " + region_name(index) + " area " + hex(area.offset) + "+" + hex(area.size));
    region->areas_.push_back(Mmio::window(base, area.offset, area.offset + area.size));
  }
  const MappedRegion* result = region.get();
  mapped_[index] = std::move(region);
  return result;
}

Status Device::unmap_region(uint32_t index) {
  if (mapped_.erase(index) == 0) return fail(EINVAL, region_name(index) + " is not mapped");
  return {};
}

Status Device::region_access_check(uint32_t index, uint64_t offset, size_t width, bool write,
                                   const RegionInfo** info) const {
  if (index >= regions_.size() || !regions_[index])
    return fail(EINVAL, region_name(index) + " is not available" +
                            (index < regions_.size() ? ": " + regions_[index].error().message() : std::string()));
  const RegionInfo& r = *regions_[index];
  if (write ? !r.writable() : !r.readable())
    return fail(EPERM, region_name(index) + (write ? " is not writable" : " is not readable"));
  if (offset > r.size || r.size - offset < width)
    return fail(ERANGE, std::to_string(width * 8) + "-bit access at " + hex(offset) + " is outside " +
                            region_name(index) + " (" + bytes(r.size) + ")");
  if (offset % width != 0)
    return fail(EINVAL, std::to_string(width * 8) + "-bit access at " + hex(offset) + " of " + region_name(index) +
                            " is not " + std::to_string(width) + "-byte aligned");
  *info = &r;
  return {};
}

Result<std::vector<uint8_t>> Device::config_snapshot() const {
  auto info = region_info(kConfigRegion);
  if (!info) return std::unexpected(info.error());
  uint64_t size = std::min<uint64_t>(info->size, pci::kExpressConfigSize);
  std::vector<uint8_t> bytes_read(size);
  ssize_t n = kernel_->pread(fd_.get(), bytes_read.data(), size, static_cast<off_t>(info->offset));
  if (n < 0) return fail_errno("reading config space of " + name());
  bytes_read.resize(static_cast<size_t>(n));
  return bytes_read;
}

Status Device::enable_bus_master() const {
  auto command = config_read16(pci::kCommand);
  if (!command) return std::unexpected(command.error().context("enabling bus mastering"));
  if (*command & pci::kCommandBusMaster) return {};
  if (auto ok = config_write16(pci::kCommand, *command | pci::kCommandBusMaster); !ok)
    return std::unexpected(ok.error().context("enabling bus mastering"));
  auto after = config_read16(pci::kCommand);
  if (!after) return std::unexpected(after.error().context("enabling bus mastering"));
  if (!(*after & pci::kCommandBusMaster))
    return fail(EIO, "bus mastering of " + name() + " did not stick (command register reads " + hex(*after) +
                         " after setting bit 2)");
  return {};
}

Result<std::vector<pci::Capability>> Device::pci_capabilities() const {
  auto config = config_snapshot();
  if (!config) return std::unexpected(config.error());
  auto caps = pci::capabilities(*config);
  if (!caps) return std::unexpected(caps.error().context(name()));
  return caps;
}

Result<std::vector<pci::ExtendedCapability>> Device::pci_extended_capabilities() const {
  auto config = config_snapshot();
  if (!config) return std::unexpected(config.error());
  auto caps = pci::extended_capabilities(*config);
  if (!caps) return std::unexpected(caps.error().context(name()));
  return caps;
}

Result<std::optional<pci::MsixCapability>> Device::msix_capability() const {
  auto config = config_snapshot();
  if (!config) return std::unexpected(config.error());
  auto msix = pci::msix_capability(*config);
  if (!msix) return std::unexpected(msix.error().context(name()));
  return msix;
}

Result<IrqInfo> Device::irq_info(IrqKind kind) const {
  auto index = static_cast<uint32_t>(kind);
  if (index >= irqs_.size())
    return fail(EINVAL, name() + " has no " + irq_kind_name(kind) + " interrupt index (it reports " +
                            std::to_string(irqs_.size()) + ")");
  return irqs_[index];
}

uint32_t Device::enabled_irqs(IrqKind kind) const {
  auto it = enabled_irqs_.find(static_cast<uint32_t>(kind));
  return it == enabled_irqs_.end() ? 0 : it->second;
}

Status Device::set_irqs(IrqKind kind, uint32_t flags, uint32_t start, uint32_t count, const int32_t* fds,
                        const std::string& what) const {
  const size_t data_size = fds ? count * sizeof(int32_t) : 0;
  detail::InfoBuffer buffer(sizeof(vfio_irq_set) + data_size);
  auto* set = buffer.as<vfio_irq_set>();
  set->argsz = static_cast<uint32_t>(sizeof(vfio_irq_set) + data_size);
  set->flags = flags;
  set->index = static_cast<uint32_t>(kind);
  set->start = start;
  set->count = count;
  if (fds) std::memcpy(set->data, fds, data_size);
  if (kernel_->ioctl(fd_.get(), VFIO_DEVICE_SET_IRQS, set) != 0) return fail_errno(what);
  return {};
}

Result<std::vector<KernelFd>> Device::enable_irqs(IrqKind kind, uint32_t count) {
  const std::string what = "enabling " + std::to_string(count) + " " + irq_kind_name(kind) + " vector(s) of " + name();
  auto info = irq_info(kind);
  if (!info) return std::unexpected(info.error().context(what));
  if (count == 0) return fail(EINVAL, what + ": ask for at least one vector");
  if (info->count == 0) return fail(ENOTSUP, what + ": the device has no " + irq_kind_name(kind) + " interrupts");
  if (count > info->count)
    return fail(EINVAL, what + ": the device offers only " + std::to_string(info->count) + " " +
                            irq_kind_name(kind) + " vector(s)");
  if (!info->eventfd()) return fail(ENOTSUP, what + ": the index does not support eventfd signalling");
  if (auto current = enabled_irqs(kind); current != 0)
    return fail(EBUSY, what + ": " + std::to_string(current) + " vector(s) are already enabled; vectors cannot be "
                              "added to an enabled index (Linux 6.1), so disable_irqs() first and enable the "
                              "full count in one call");
  for (IrqKind other : {IrqKind::intx, IrqKind::msi, IrqKind::msix})
    if (other != kind && enabled_irqs(other) != 0 && kind <= IrqKind::msix)
      return fail(EBUSY, what + ": " + irq_kind_name(other) + " is enabled; a PCI function uses one of INTx, "
                                "MSI and MSI-X at a time: disable it first");

  std::vector<KernelFd> eventfds;
  std::vector<int32_t> fds;
  for (uint32_t i = 0; i < count; ++i) {
    int fd = kernel_->eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd < 0) return fail_errno(what + ": creating eventfd " + std::to_string(i));
    eventfds.emplace_back(*kernel_, fd);
    fds.push_back(fd);
  }
  if (auto ok = set_irqs(kind, VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER, 0, count, fds.data(),
                         "VFIO_DEVICE_SET_IRQS: " + what);
      !ok) {
    if (ok.error().code() == EINVAL && kind != IrqKind::intx)
      return std::unexpected(ok.error().context(
          "(the kernel could not allocate host vectors, or the index is already enabled by another path)"));
    return std::unexpected(ok.error());
  }
  enabled_irqs_[static_cast<uint32_t>(kind)] = count;
  return eventfds;
}

Status Device::disable_irqs(IrqKind kind) {
  // vfio-pci answers EINVAL to disabling an index that is not enabled;
  // asking twice is harmless here.
  if (enabled_irqs(kind) == 0) return {};
  auto ok = set_irqs(kind, VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER, 0, 0, nullptr,
                     "VFIO_DEVICE_SET_IRQS: disabling " + irq_kind_name(kind) + " of " + name());
  if (ok) enabled_irqs_.erase(static_cast<uint32_t>(kind));
  return ok;
}

Status Device::unmask_intx() {
  return set_irqs(IrqKind::intx, VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_UNMASK, 0, 1, nullptr,
                  "VFIO_DEVICE_SET_IRQS: unmasking INTx of " + name());
}

Status Device::trigger_irq(IrqKind kind, uint32_t vector) {
  if (vector >= enabled_irqs(kind))
    return fail(EINVAL, "triggering " + irq_kind_name(kind) + " vector " + std::to_string(vector) + " of " + name() +
                            ": only " + std::to_string(enabled_irqs(kind)) + " vector(s) are enabled");
  return set_irqs(kind, VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER, vector, 1, nullptr,
                  "VFIO_DEVICE_SET_IRQS: triggering " + irq_kind_name(kind) + " vector " + std::to_string(vector) +
                      " of " + name());
}

Status Device::reset() const {
  if (!info_.reset_supported())
    return fail(ENOTSUP, name() + " does not support reset through VFIO (no VFIO_DEVICE_FLAGS_RESET: no FLR, PM "
                                  "reset or bus reset the kernel could apply to it alone); reinitialise it "
                                  "through its own registers instead (e.g. e1000e CTRL.RST)");
  if (kernel_->ioctl_value(fd_.get(), VFIO_DEVICE_RESET, 0) != 0)
    return fail_errno("VFIO_DEVICE_RESET of " + name());
  return {};
}

}  // namespace ufab::vfio
