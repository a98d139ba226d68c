// The IOMMU backend interface: what callers need from "an IOMMU context that
// devices attach to and DMA memory is mapped into", independent of whether
// the kernel offers it as a VFIO type1 container (/dev/vfio/vfio + groups,
// implemented in container.h) or as iommufd (/dev/iommu + VFIO device cdevs,
// Linux >= 6.6; see docs/vfio.md for how that backend slots in).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "base/pci_address.h"
#include "vfio/iova_allocator.h"
#include "vfio/kernel.h"

namespace ufab::vfio {

// Direction as seen by the device, as VFIO_DMA_MAP_FLAG_READ/WRITE mean it.
enum class DmaAccess : uint32_t {
  device_reads = 1,            // TX buffers, descriptor rings the device fetches
  device_writes = 2,           // RX buffers
  device_reads_and_writes = 3  // rings with write-back, most buffers
};

struct IommuInfo {
  // Bitmap of IOMMU page sizes; the lowest set bit is the mapping granule.
  uint64_t page_sizes = 0;
  // Usable IOVA ranges exactly as the kernel reported them (inclusive).
  std::vector<IovaRange> iova_ranges;
  // Whether iova_ranges came from the kernel (VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE)
  // or are ufab's conservative default for kernels older than 5.4.
  bool iova_ranges_reported = false;
  // VFIO_IOMMU_TYPE1_INFO_DMA_AVAIL at the last GET_INFO, when reported.
  std::optional<uint32_t> dma_mappings_available;
  // How many DMA mappings the container may hold at once, and where that
  // number came from ("DMA_AVAIL capability", the sysfs parameter, a default).
  uint32_t dma_entry_limit = 65535;
  std::string dma_entry_limit_source;

  uint64_t min_page_size() const { return page_sizes == 0 ? 4096 : (page_sizes & (~page_sizes + 1)); }
};

struct DmaUsage {
  size_t mappings = 0;
  uint64_t pinned_bytes = 0;
};

class IommuBackend;

// One live DMA mapping. Destroying it (or unmap()) unmaps exactly the IOVA
// range that was mapped, the only unmap type1 guarantees to honour, and
// returns the IOVA to the allocator. It holds a shared reference to its
// backend, so the container (and the IOMMU domain behind it) cannot go away
// while a mapping still exists. Keep the mapped memory alive at least as
// long as the mapping: the device may write to it until it is unmapped.
class DmaMapping {
 public:
  DmaMapping() = default;
  DmaMapping(DmaMapping&& other) noexcept;
  DmaMapping& operator=(DmaMapping&& other) noexcept;
  DmaMapping(const DmaMapping&) = delete;
  DmaMapping& operator=(const DmaMapping&) = delete;
  // Errors cannot be reported here; a failed unmap leaves the IOVA reserved
  // (never reused) until the container closes, which unmaps everything.
  ~DmaMapping();

  bool valid() const { return owner_ != nullptr; }
  uint64_t iova() const { return iova_; }
  uint64_t size() const { return size_; }
  void* vaddr() const { return vaddr_; }
  DmaAccess access() const { return access_; }
  // IOVA of an address inside the mapped memory; ERANGE outside it.
  Result<uint64_t> iova_of(const void* address) const;
  // Unmaps now and reports the outcome; the mapping is empty afterwards.
  Status unmap();

 private:
  friend class IommuBackend;
  std::shared_ptr<IommuBackend> owner_;
  uint64_t iova_ = 0;
  uint64_t size_ = 0;
  void* vaddr_ = nullptr;
  DmaAccess access_ = DmaAccess::device_reads_and_writes;
};

// Backends are created through factories that return std::shared_ptr; the
// objects that depend on a backend (devices, DMA mappings) hold a reference.
class IommuBackend : public std::enable_shared_from_this<IommuBackend> {
 public:
  virtual ~IommuBackend() = default;

  // "vfio-type1" or, later, "iommufd".
  virtual std::string_view kind() const = 0;
  virtual const Environment& environment() const = 0;

  // Attaches the device to this IOMMU context (type1: its group joins the
  // container) and returns the VFIO device fd.
  virtual Result<KernelFd> open_device(const PciAddress& address) = 0;

  // Pins [vaddr, vaddr + size) and maps it at an IOVA the backend chooses.
  // vaddr and size must be multiples of the IOMMU page size.
  virtual Result<DmaMapping> map_dma(void* vaddr, uint64_t size, DmaAccess access) = 0;

  // A snapshot: ranges can narrow when another device's group joins.
  virtual IommuInfo info() const = 0;
  virtual DmaUsage usage() const = 0;

 protected:
  friend class DmaMapping;
  // Undoes exactly one map_dma; called only by DmaMapping.
  virtual Status unmap_dma(uint64_t iova, uint64_t size) = 0;
  // For implementations of map_dma: wraps a successful kernel mapping in the
  // RAII handle. Fails when the backend is not owned by a std::shared_ptr.
  Result<DmaMapping> make_mapping(uint64_t iova, void* vaddr, uint64_t size, DmaAccess access);
};

}  // namespace ufab::vfio
