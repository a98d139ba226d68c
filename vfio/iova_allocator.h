// IOVA (I/O virtual address) allocation over the ranges the kernel reports
// for a container (VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE).
//
// Why not IOVA = VA: user virtual addresses on x86-64 sit near 2^47, while an
// IOMMU's input width may be much smaller (39 bits in QEMU 7.2's
// intel-iommu; 10.0 defaults to 48), and the kernel carves reserved windows out of the IOVA space (the
// x86 MSI window 0xfee00000-0xfeefffff, PCI bridge windows). An IOVA must lie
// inside a reported range, so ufab allocates them instead.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "base/error.h"

namespace ufab::vfio {

// An inclusive range [first, last], the way VFIO reports IOVA ranges
// (struct vfio_iova_range's end is the last usable address).
struct IovaRange {
  uint64_t first = 0;
  uint64_t last = 0;
  bool operator==(const IovaRange&) const = default;
};

// First-fit allocation (low IOVAs first, which keeps mappings inside narrow
// IOMMU widths) in whole IOMMU pages. IOVA 0 is never handed out, so 0 can
// mean "no mapping" and a device writing to a zeroed descriptor address faults
// instead of hitting a buffer. Not thread-safe; the owner locks.
class IovaAllocator {
 public:
  // `page_size` is the smallest IOMMU page size (a power of two); ranges are
  // trimmed to whole pages. Fails when nothing usable is left.
  static Result<IovaAllocator> create(const std::vector<IovaRange>& ranges, uint64_t page_size = 4096);

  // `size` is rounded up to whole pages; `alignment` (a power of two, 0 for
  // one page) is raised to at least one page. ENOSPC when no free block fits.
  Result<uint64_t> allocate(uint64_t size, uint64_t alignment = 0);
  // Returns exactly one earlier allocation: same IOVA, same size as asked.
  // Neighbouring free blocks merge again.
  Status free(uint64_t iova, uint64_t size);

  // The kernel narrowed (or changed) the usable ranges, e.g. because another
  // group with reserved regions joined the container. Live allocations stay;
  // the free space becomes the new ranges minus them. Fails, without changing
  // anything, when a live allocation lies outside the new ranges.
  Status set_ranges(const std::vector<IovaRange>& ranges);

  uint64_t page_size() const { return page_size_; }
  // The usable ranges after page trimming and with page 0 removed.
  const std::vector<IovaRange>& ranges() const { return ranges_; }
  uint64_t free_bytes() const;
  uint64_t largest_free_block() const;
  size_t free_block_count() const { return free_.size(); }
  size_t allocation_count() const { return allocated_.size(); }
  // "0x1000-0xfedfffff, 0xfef00000-0x7fffffffff"
  std::string describe_ranges() const;

 private:
  IovaAllocator() = default;
  Result<uint64_t> round_to_pages(uint64_t size, const char* what) const;
  void rebuild_free_list();
  void insert_free(uint64_t first, uint64_t last);

  uint64_t page_size_ = 4096;
  std::vector<IovaRange> ranges_;
  std::map<uint64_t, uint64_t> free_;       // first -> last, disjoint, not adjacent
  std::map<uint64_t, uint64_t> allocated_;  // iova -> size in bytes (page multiple)
};

}  // namespace ufab::vfio
