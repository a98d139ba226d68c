// A VFIO PCI device: regions (BARs, config space), interrupts, reset.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/pci_address.h"
#include "vfio/iommu.h"
#include "vfio/kernel.h"
#include "vfio/mmio.h"
#include "vfio/pci_config.h"

namespace ufab::vfio {

// vfio-pci's fixed region indexes (<linux/vfio.h> VFIO_PCI_*_REGION_INDEX).
inline constexpr uint32_t kBar0Region = 0;
inline constexpr uint32_t kRomRegion = 6;
inline constexpr uint32_t kConfigRegion = 7;

// vfio-pci's IRQ indexes (VFIO_PCI_*_IRQ_INDEX).
enum class IrqKind : uint32_t { intx = 0, msi = 1, msix = 2, error = 3, request = 4 };
std::string irq_kind_name(IrqKind kind);

struct DeviceInfo {
  uint32_t flags = 0;  // VFIO_DEVICE_FLAGS_*
  uint32_t num_regions = 0;
  uint32_t num_irqs = 0;
  bool reset_supported() const;  // VFIO_DEVICE_FLAGS_RESET
  bool is_pci() const;           // VFIO_DEVICE_FLAGS_PCI
};

struct MmapArea {
  uint64_t offset = 0;  // within the region
  uint64_t size = 0;
  bool operator==(const MmapArea&) const = default;
};

struct RegionInfo {
  uint32_t index = 0;
  uint32_t flags = 0;   // VFIO_REGION_INFO_FLAG_*
  uint64_t size = 0;
  uint64_t offset = 0;  // of the region within the device fd (pread/pwrite/mmap)
  // VFIO_REGION_INFO_CAP_SPARSE_MMAP: when present only these areas may be
  // mmapped (the kernel keeps e.g. an MSI-X table for itself).
  std::optional<std::vector<MmapArea>> sparse_areas;
  // VFIO_REGION_INFO_CAP_TYPE: device-specific regions.
  std::optional<uint32_t> type;
  std::optional<uint32_t> subtype;
  // VFIO_REGION_INFO_CAP_MSIX_MAPPABLE: the MSI-X table in this BAR may be
  // mmapped (it is still programmed only through SET_IRQS).
  bool msix_mappable = false;

  bool readable() const;
  bool writable() const;
  bool mappable() const;
  // What map_region() maps: the sparse areas, or the whole region.
  std::vector<MmapArea> mappable_areas() const;
};

struct IrqInfo {
  uint32_t index = 0;
  uint32_t flags = 0;  // VFIO_IRQ_INFO_*
  uint32_t count = 0;
  bool eventfd() const;
  bool maskable() const;
  bool automasked() const;
  bool noresize() const;
};

// The mmapped parts of one region. Owned by its Device, which unmaps it when
// destroyed; the pointer Device::map_region returns stays valid until then
// (or until unmap_region).
class MappedRegion {
 public:
  ~MappedRegion();
  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;

  uint32_t index() const { return index_; }
  uint64_t size() const { return size_; }
  // One view per mmapped area; offsets are region offsets.
  const std::vector<Mmio>& areas() const { return areas_; }
  // The view of the area holding [offset, offset + length); ERANGE when that
  // is not entirely inside one mmapped area.
  Result<Mmio> window(uint64_t offset, uint64_t length) const;
  // The whole region, when all of it is mmapped.
  Result<Mmio> mmio() const { return window(0, size_); }

  template <typename T>
  Result<Reg<T>> reg(uint64_t offset) const {
    auto w = window(offset, sizeof(T));
    if (!w) return std::unexpected(w.error());
    return w->template reg<T>(offset);
  }
  Result<Reg8> reg8(uint64_t offset) const { return reg<uint8_t>(offset); }
  Result<Reg16> reg16(uint64_t offset) const { return reg<uint16_t>(offset); }
  Result<Reg32> reg32(uint64_t offset) const { return reg<uint32_t>(offset); }
  Result<Reg64> reg64(uint64_t offset) const { return reg<uint64_t>(offset); }
  Result<uint32_t> read32(uint64_t offset) const {
    auto r = reg32(offset);
    if (!r) return std::unexpected(r.error());
    return r->read();
  }
  Status write32(uint64_t offset, uint32_t value) const {
    auto r = reg32(offset);
    if (!r) return std::unexpected(r.error());
    r->write(value);
    return {};
  }

 private:
  friend class Device;
  MappedRegion() = default;

  Kernel* kernel_ = nullptr;
  std::string name_;  // "BAR 0 of 0000:00:03.0"
  uint32_t index_ = 0;
  uint64_t size_ = 0;
  void* reservation_ = nullptr;
  size_t reservation_size_ = 0;
  std::vector<Mmio> areas_;
};

class Device {
 public:
  // Attaches the device through `iommu` (its group joins the container) and
  // reads its device, region and IRQ information. Holds `iommu` alive.
  static Result<Device> open(std::shared_ptr<IommuBackend> iommu, const PciAddress& address);

  Device(Device&&) noexcept = default;
  Device& operator=(Device&&) noexcept;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  // Disables the interrupts it enabled, unmaps its regions, closes the fd.
  ~Device();

  const PciAddress& address() const { return address_; }
  int fd() const { return fd_.get(); }
  const DeviceInfo& info() const { return info_; }
  const std::shared_ptr<IommuBackend>& iommu() const { return iommu_; }

  // Regions
  Result<RegionInfo> region_info(uint32_t index) const;
  // mmaps the region (MAP_SHARED at the offset region info gives): only the
  // sparse areas when the kernel lists some. Refused for regions without the
  // MMAP flag. Mapping an already mapped region returns the same mapping.
  Result<const MappedRegion*> map_region(uint32_t index);
  Status unmap_region(uint32_t index);
  // pread/pwrite of one naturally aligned little-endian value, for regions
  // (or parts) that cannot be mmapped.
  template <typename T>
  Result<T> region_read(uint32_t index, uint64_t offset) const;
  template <typename T>
  Status region_write(uint32_t index, uint64_t offset, T value) const;

  // Config space (region 7), through vfio-pci's virtualised view.
  Result<uint8_t> config_read8(uint32_t offset) const { return region_read<uint8_t>(kConfigRegion, offset); }
  Result<uint16_t> config_read16(uint32_t offset) const { return region_read<uint16_t>(kConfigRegion, offset); }
  Result<uint32_t> config_read32(uint32_t offset) const { return region_read<uint32_t>(kConfigRegion, offset); }
  Status config_write8(uint32_t offset, uint8_t v) const { return region_write<uint8_t>(kConfigRegion, offset, v); }
  Status config_write16(uint32_t offset, uint16_t v) const { return region_write<uint16_t>(kConfigRegion, offset, v); }
  Status config_write32(uint32_t offset, uint32_t v) const { return region_write<uint32_t>(kConfigRegion, offset, v); }
  // The whole config region (256 or 4096 bytes) in one pread.
  Result<std::vector<uint8_t>> config_snapshot() const;
  // vfio-pci clears Bus Master Enable when the device is opened; without it
  // the device cannot DMA. Sets command bit 2 and reads it back.
  Status enable_bus_master() const;
  Result<std::vector<pci::Capability>> pci_capabilities() const;
  Result<std::vector<pci::ExtendedCapability>> pci_extended_capabilities() const;
  Result<std::optional<pci::MsixCapability>> msix_capability() const;

  // Interrupts
  Result<IrqInfo> irq_info(IrqKind kind) const;
  // Creates `count` eventfds (non-blocking, close-on-exec) and binds them to
  // vectors 0..count-1 with ONE VFIO_DEVICE_SET_IRQS(DATA_EVENTFD |
  // ACTION_TRIGGER): Linux 6.1 cannot add MSI-X vectors to an enabled index,
  // so all are set at once. The caller owns the eventfds (read or poll them);
  // the Device remembers the index is enabled and disables it on destruction.
  Result<std::vector<KernelFd>> enable_irqs(IrqKind kind, uint32_t count);
  // VFIO_DEVICE_SET_IRQS(DATA_NONE | ACTION_TRIGGER, count 0); a no-op when
  // this Device did not enable `kind`.
  Status disable_irqs(IrqKind kind);
  // Re-arms an automasked INTx line after its interrupt was handled.
  Status unmask_intx();
  // Signals vector `vector` from the kernel side as if the device had fired
  // it (VFIO's loopback test), to check the eventfd path without hardware.
  Status trigger_irq(IrqKind kind, uint32_t vector);
  // Number of vectors enabled for `kind`, 0 when disabled.
  uint32_t enabled_irqs(IrqKind kind) const;

  // VFIO_DEVICE_RESET, only when the device reports VFIO_DEVICE_FLAGS_RESET.
  // The kernel picks FLR, PM or bus reset; some devices advertise a reset
  // that does nothing (QEMU's e1000e ignores PM reset), so drivers still
  // reset the function through its own registers.
  Status reset() const;

 private:
  Device() = default;
  Status region_access_check(uint32_t index, uint64_t offset, size_t width, bool write,
                             const RegionInfo** info) const;
  Status set_irqs(IrqKind kind, uint32_t flags, uint32_t start, uint32_t count, const int32_t* fds,
                  const std::string& what) const;
  void disable_all_irqs();
  std::string name() const { return address_.str(); }
  std::string region_name(uint32_t index) const;

  // Declared first so it is destroyed last: the IOMMU context outlives the
  // device fd.
  std::shared_ptr<IommuBackend> iommu_;
  Kernel* kernel_ = nullptr;
  PciAddress address_;
  KernelFd fd_;
  DeviceInfo info_;
  std::vector<Result<RegionInfo>> regions_;
  std::vector<Result<IrqInfo>> irqs_;
  std::map<uint32_t, std::unique_ptr<MappedRegion>> mapped_;
  std::map<uint32_t, uint32_t> enabled_irqs_;  // IRQ index -> vector count
};

// Implementation of the templates.
template <typename T>
Result<T> Device::region_read(uint32_t index, uint64_t offset) const {
  static_assert(detail::kRegisterWidth<T>);
  const RegionInfo* info = nullptr;
  if (auto ok = region_access_check(index, offset, sizeof(T), false, &info); !ok) return std::unexpected(ok.error());
  T value{};
  ssize_t n = kernel_->pread(fd_.get(), &value, sizeof(T), static_cast<off_t>(info->offset + offset));
  if (n != static_cast<ssize_t>(sizeof(T))) {
    if (n < 0) return fail_errno("reading " + std::to_string(sizeof(T) * 8) + " bits at " + hex(offset) + " of " +
                                 region_name(index));
    return fail(EIO, "short read at " + hex(offset) + " of " + region_name(index));
  }
  return detail::le_to_host(value);
}

template <typename T>
Status Device::region_write(uint32_t index, uint64_t offset, T value) const {
  static_assert(detail::kRegisterWidth<T>);
  const RegionInfo* info = nullptr;
  if (auto ok = region_access_check(index, offset, sizeof(T), true, &info); !ok) return ok;
  T le = detail::host_to_le(value);
  ssize_t n = kernel_->pwrite(fd_.get(), &le, sizeof(T), static_cast<off_t>(info->offset + offset));
  if (n != static_cast<ssize_t>(sizeof(T))) {
    if (n < 0) return fail_errno("writing " + std::to_string(sizeof(T) * 8) + " bits at " + hex(offset) + " of " +
                                 region_name(index));
    return fail(EIO, "short write at " + hex(offset) + " of " + region_name(index));
  }
  return {};
}

}  // namespace ufab::vfio
