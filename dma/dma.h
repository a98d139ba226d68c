// DMA memory for devices: zeroed host memory that a device can read and
// write, with the device-side address (IOVA) of every byte.
//
// Memory comes from large chunks (2 MiB by default, huge pages when the host
// has free ones). Each chunk is mapped into the IOMMU once, and allocations
// are carved out of it, so a driver with thousands of descriptors and buffers
// costs a handful of IOMMU mappings, not one per object (type1 allows 65535
// per container by default). See docs/dma.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "base/error.h"
#include "vfio/iommu.h"

namespace ufab::dma {

struct Options {
  // Back chunks with 2 MiB pages (MAP_HUGETLB | MAP_HUGE_2MB) when the host
  // has free ones; 4 KiB pages otherwise. Huge pages let the IOMMU map a
  // chunk with one IOTLB entry and keep the memory physically contiguous.
  bool prefer_hugepages = true;
  // Allocations are carved from chunks of this size: a power of two, at
  // least the host and IOMMU page size, at most 1 GiB. Requests larger than
  // a chunk get a dedicated mapping of their own.
  size_t chunk_size = 2u << 20;
  // How many empty chunks stay mapped for the next allocation instead of
  // being unmapped at once (pinning 2 MiB is a few hundred microseconds, and
  // drivers often free a ring and allocate it again on reconfiguration).
  // 0: every chunk is unmapped as soon as its last region goes.
  size_t cached_empty_chunks = 1;
};

struct Usage {
  size_t regions = 0;            // live DmaRegions
  size_t chunks = 0;             // chunks held, dedicated and cached ones included
  uint64_t pinned_bytes = 0;     // bytes pinned and IOMMU-mapped (0 in software mode)
  size_t hugepage_chunks = 0;    // chunks backed by 2 MiB pages
  size_t iommu_mappings = 0;     // IOMMU mappings held (one per chunk; 0 in software mode)
  uint64_t chunk_bytes = 0;      // memory held in chunks, pinned or not
  uint64_t allocated_bytes = 0;  // bytes handed out to live regions (after rounding to 64)
};

class DmaAllocator;
namespace detail {
struct Chunk;
}

// A piece of DMA memory. Destroying it (or reset()) returns its bytes to the
// allocator; the device must have stopped using them by then. It holds a
// reference to its allocator, which holds the IOMMU context, so the memory
// stays mapped for as long as the region exists. Movable, not copyable.
class DmaRegion {
 public:
  DmaRegion() = default;
  DmaRegion(DmaRegion&& other) noexcept;
  DmaRegion& operator=(DmaRegion&& other) noexcept;
  DmaRegion(const DmaRegion&) = delete;
  DmaRegion& operator=(const DmaRegion&) = delete;
  ~DmaRegion();

  void* va() const { return va_; }
  // The address the device uses. Equal to va() in software mode.
  uint64_t iova() const { return iova_; }
  // The size that was asked for.
  size_t size() const { return size_; }
  bool valid() const { return owner_ != nullptr; }
  // IOVA of `p`, which must lie inside [va(), va() + size()); 0 otherwise
  // (0 is never a valid IOVA: the IOVA allocator does not hand it out).
  uint64_t iova_of(const void* p) const;
  // Returns the bytes now; the region is empty afterwards.
  void reset();

 private:
  friend class DmaAllocator;
  std::shared_ptr<DmaAllocator> owner_;
  detail::Chunk* chunk_ = nullptr;
  uint64_t offset_ = 0;    // inside the chunk
  uint64_t reserved_ = 0;  // bytes taken from the chunk (size rounded up)
  void* va_ = nullptr;
  uint64_t iova_ = 0;
  size_t size_ = 0;
};

// Hands out DMA memory for one IOMMU context (or, without one, for software
// devices). Thread-safe: allocation and release take a mutex; neither is a
// hot-path operation (buffer pools sit on top for that).
class DmaAllocator : public std::enable_shared_from_this<DmaAllocator> {
 public:
  // iommu == nullptr: memory for software devices (not pinned, not mapped
  // anywhere); iova() == (uint64_t)va(). Otherwise every chunk is pinned and
  // mapped through iommu->map_dma, with device read and write access.
  static Result<std::shared_ptr<DmaAllocator>> create(std::shared_ptr<vfio::IommuBackend> iommu,
                                                      Options options = {});
  // Runs when the last region and the last other owner are gone: every chunk
  // is unmapped from the IOMMU and then from the process.
  ~DmaAllocator();
  DmaAllocator(const DmaAllocator&) = delete;
  DmaAllocator& operator=(const DmaAllocator&) = delete;

  // Zeroed memory whose va() and iova() are both multiples of `align` (a
  // power of two, at most the chunk size; raised to 64, the allocation
  // granule). Sizes above the chunk size get a dedicated mapping, unmapped
  // when the region goes.
  Result<DmaRegion> allocate(size_t size, size_t align = 64);
  Usage usage() const;

  const Options& options() const { return options_; }
  // nullptr in software mode.
  vfio::IommuBackend* iommu() const { return iommu_.get(); }

 private:
  friend class DmaRegion;
  DmaAllocator(std::shared_ptr<vfio::IommuBackend> iommu, Options options, vfio::Kernel* kernel,
               size_t page_size);
  // Sub-allocates from an existing chunk; false when none fits.
  bool carve_locked(uint64_t length, uint64_t align, DmaRegion* out);
  Result<std::unique_ptr<detail::Chunk>> make_chunk_locked(uint64_t length, uint64_t align, bool dedicated);
  Result<void*> map_memory(uint64_t length, uint64_t align, bool huge);
  Status check_memlock_locked(uint64_t length) const;
  void release(detail::Chunk* chunk, uint64_t offset, uint64_t length);

  // Declared first, destroyed last: the chunks' DmaMappings need the
  // backend while they unmap.
  std::shared_ptr<vfio::IommuBackend> iommu_;
  Options options_;
  vfio::Kernel* kernel_;  // mmap/munmap/getrlimit go through the seam
  size_t page_size_;      // max(host page, IOMMU page)

  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<detail::Chunk>> chunks_;
  size_t regions_ = 0;
  uint64_t allocated_bytes_ = 0;
};

}  // namespace ufab::dma
