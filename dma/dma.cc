#include "dma/dma.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <map>
#include <string>
#include <utility>

#include "base/hex.h"
#include "vfio/container.h"
#include "vfio/text.h"

#ifndef MAP_HUGE_SHIFT
#define MAP_HUGE_SHIFT 26
#endif
#ifndef MAP_HUGE_2MB
#define MAP_HUGE_2MB (21 << MAP_HUGE_SHIFT)
#endif

namespace ufab::dma {

using vfio::bytes;

namespace {

constexpr uint64_t kGranule = 64;         // every allocation is cache-line aligned and sized
constexpr uint64_t kHugePage = 2ull << 20;
constexpr uint64_t kMaxChunkSize = 1ull << 30;

uint64_t round_up(uint64_t value, uint64_t align) { return (value + align - 1) & ~(align - 1); }

bool power_of_two(uint64_t value) { return value != 0 && (value & (value - 1)) == 0; }

// Largest power of two that divides `value` (value != 0).
uint64_t lowest_bit(uint64_t value) { return value & (~value + 1); }

}  // namespace

namespace detail {

// One mmap'ed, (in IOMMU mode) pinned and mapped piece of memory that
// regions are carved from. Owned by the allocator; regions point at it.
struct Chunk {
  vfio::Kernel* kernel = nullptr;
  void* va = nullptr;
  uint64_t length = 0;
  uint64_t iova = 0;
  // va and iova are both multiples of this (capped at the length), so an
  // offset aligned to it gives an address aligned on both sides.
  uint64_t align_limit = 0;
  bool hugepages = false;
  bool dedicated = false;  // one region only; unmapped when it goes
  vfio::DmaMapping mapping;  // empty in software mode
  // Free extents, offset -> length: disjoint and never adjacent (freeing
  // merges neighbours), so a chunk whose regions are all gone is one extent.
  std::map<uint64_t, uint64_t> free;
  size_t live = 0;
  // Bytes at and beyond this offset were never handed out and are still the
  // kernel's zero pages: allocate() zeroes only what was used before.
  uint64_t dirty_end = 0;

  Chunk() = default;
  Chunk(const Chunk&) = delete;
  Chunk& operator=(const Chunk&) = delete;
  ~Chunk() {
    // IOMMU first, so the device loses access before the pages go back. A
    // failed unmap leaves the pages pinned by the kernel (not reusable by
    // anyone) until the container closes; dropping our view is still safe.
    (void)mapping.unmap();
    if (va != nullptr) kernel->munmap(va, length);
  }

  bool empty() const { return live == 0; }

  void give_back(uint64_t offset, uint64_t length_) {
    auto next = free.lower_bound(offset);
    uint64_t start = offset, end = offset + length_;
    if (next != free.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == start) {
        start = prev->first;
        free.erase(prev);
      }
    }
    if (next != free.end() && next->first == end) {
      end += next->second;
      free.erase(next);
    }
    free[start] = end - start;
  }
};

}  // namespace detail

// ---------------------------------------------------------------- DmaRegion

DmaRegion::DmaRegion(DmaRegion&& other) noexcept
    : owner_(std::move(other.owner_)),
      chunk_(std::exchange(other.chunk_, nullptr)),
      offset_(std::exchange(other.offset_, 0)),
      reserved_(std::exchange(other.reserved_, 0)),
      va_(std::exchange(other.va_, nullptr)),
      iova_(std::exchange(other.iova_, 0)),
      size_(std::exchange(other.size_, 0)) {}

DmaRegion& DmaRegion::operator=(DmaRegion&& other) noexcept {
  if (this != &other) {
    reset();
    owner_ = std::move(other.owner_);
    chunk_ = std::exchange(other.chunk_, nullptr);
    offset_ = std::exchange(other.offset_, 0);
    reserved_ = std::exchange(other.reserved_, 0);
    va_ = std::exchange(other.va_, nullptr);
    iova_ = std::exchange(other.iova_, 0);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

DmaRegion::~DmaRegion() { reset(); }

void DmaRegion::reset() {
  if (!owner_) return;
  // Keep the allocator alive through release(); it may be the last owner.
  std::shared_ptr<DmaAllocator> owner = std::move(owner_);
  owner_.reset();
  owner->release(chunk_, offset_, reserved_);
  chunk_ = nullptr;
  offset_ = reserved_ = 0;
  va_ = nullptr;
  iova_ = 0;
  size_ = 0;
}

uint64_t DmaRegion::iova_of(const void* p) const {
  auto begin = reinterpret_cast<uintptr_t>(va_);
  auto at = reinterpret_cast<uintptr_t>(p);
  if (!valid() || at < begin || at - begin >= size_) return 0;
  return iova_ + (at - begin);
}

// ------------------------------------------------------------- DmaAllocator

DmaAllocator::DmaAllocator(std::shared_ptr<vfio::IommuBackend> iommu, Options options, vfio::Kernel* kernel,
                           size_t page_size)
    : iommu_(std::move(iommu)), options_(options), kernel_(kernel), page_size_(page_size) {}

DmaAllocator::~DmaAllocator() {
  // Regions hold a reference to the allocator, so only empty (cached) chunks
  // can be left; destroying them unmaps them from the IOMMU, then munmaps.
  chunks_.clear();
}

Result<std::shared_ptr<DmaAllocator>> DmaAllocator::create(std::shared_ptr<vfio::IommuBackend> iommu,
                                                           Options options) {
  long host_page = ::sysconf(_SC_PAGESIZE);
  uint64_t page = host_page > 0 ? static_cast<uint64_t>(host_page) : 4096;
  vfio::Kernel* kernel = &vfio::Kernel::real();
  if (iommu) {
    page = std::max<uint64_t>(page, iommu->info().min_page_size());
    kernel = iommu->environment().kernel;
  }
  const uint64_t chunk = options.chunk_size;
  if (!power_of_two(chunk) || chunk < page || chunk > kMaxChunkSize)
    return fail(EINVAL, "DMA allocator: chunk size " + bytes(chunk) + " is not a power of two between the page size (" +
                            bytes(page) + ") and " + bytes(kMaxChunkSize) +
                            "; use the default (2 MiB) or another power of two in that range");
  return std::shared_ptr<DmaAllocator>(new DmaAllocator(std::move(iommu), options, kernel, page));
}

Result<DmaRegion> DmaAllocator::allocate(size_t size, size_t align) {
  const uint64_t chunk_size = options_.chunk_size;
  if (size == 0) return fail(EINVAL, "DMA allocation of 0 bytes: ask for at least one byte");
  if (!power_of_two(align) || align > chunk_size)
    return fail(EINVAL, "DMA allocation of " + bytes(size) + " aligned to " + std::to_string(align) +
                            ": the alignment must be a power of two no larger than the chunk size (" +
                            bytes(chunk_size) + "); raise Options::chunk_size for larger alignments");
  if (size > (uint64_t{1} << 46))  // far beyond any host; keeps the rounding below from overflowing
    return fail(EINVAL, "DMA allocation of " + bytes(size) + ": larger than any host can pin");
  const uint64_t alignment = std::max<uint64_t>(align, kGranule);
  const std::string what = "allocating " + bytes(size) + " of DMA memory";

  DmaRegion region;
  uint64_t zero_from = 0, zero_to = 0;  // offsets inside the region that may hold old data
  {
    std::lock_guard lock(mutex_);
    detail::Chunk* chunk = nullptr;
    uint64_t offset = 0, length = 0;
    if (size <= chunk_size) {
      length = round_up(size, kGranule);
      // First fit over the chunks that can honour the alignment on both the
      // CPU and the device side.
      for (auto& c : chunks_) {
        if (c->dedicated || c->align_limit < alignment) continue;
        for (auto& [extent, extent_length] : c->free) {
          uint64_t at = round_up(extent, alignment);
          if (at + length <= extent + extent_length) {
            chunk = c.get();
            offset = at;
            break;
          }
        }
        if (chunk) break;
      }
      if (!chunk) {
        auto fresh = make_chunk_locked(chunk_size, alignment, false);
        if (!fresh) return std::unexpected(fresh.error().context(what));
        if ((*fresh)->align_limit < alignment)
          return fail(ENOTSUP, what + " aligned to " + bytes(alignment) + ": the IOMMU mapped a new chunk at IOVA " +
                                   hex((*fresh)->iova) + " for vaddr " +
                                   hex(reinterpret_cast<uintptr_t>((*fresh)->va)) + ", which are both aligned only to " +
                                   bytes((*fresh)->align_limit) + " (the IOMMU aligns IOVAs to its page sizes); ask "
                                   "for at most that alignment");
        chunk = fresh->get();
        offset = 0;
        chunks_.push_back(std::move(*fresh));
      }
    } else {
      auto fresh = make_chunk_locked(size, alignment, true);
      if (!fresh) return std::unexpected(fresh.error().context(what));
      if ((*fresh)->align_limit < alignment)
        return fail(ENOTSUP, what + " aligned to " + bytes(alignment) + ": the IOMMU mapped it at IOVA " +
                                 hex((*fresh)->iova) + ", aligned only to " + bytes((*fresh)->align_limit) +
                                 "; ask for at most that alignment");
      chunk = fresh->get();
      offset = 0;
      length = chunk->length;
      chunks_.push_back(std::move(*fresh));
    }

    // Take [offset, offset + length) out of the extent that holds it.
    auto it = std::prev(chunk->free.upper_bound(offset));
    const uint64_t extent = it->first, extent_end = it->first + it->second;
    chunk->free.erase(it);
    if (offset > extent) chunk->free[extent] = offset - extent;
    if (offset + length < extent_end) chunk->free[offset + length] = extent_end - (offset + length);

    zero_from = 0;
    zero_to = chunk->dirty_end > offset ? std::min(length, chunk->dirty_end - offset) : 0;
    chunk->dirty_end = std::max(chunk->dirty_end, offset + length);
    ++chunk->live;
    ++regions_;
    allocated_bytes_ += length;

    region.owner_ = shared_from_this();
    region.chunk_ = chunk;
    region.offset_ = offset;
    region.reserved_ = length;
    region.va_ = static_cast<uint8_t*>(chunk->va) + offset;
    region.iova_ = chunk->iova + offset;
    region.size_ = size;
  }
  // Outside the lock: the bytes are this region's alone now.
  if (zero_to > zero_from) std::memset(static_cast<uint8_t*>(region.va_) + zero_from, 0, zero_to - zero_from);
  return region;
}

void DmaAllocator::release(detail::Chunk* chunk, uint64_t offset, uint64_t length) {
  std::unique_ptr<detail::Chunk> doomed;  // destroyed after the lock is dropped
  {
    std::lock_guard lock(mutex_);
    chunk->give_back(offset, length);
    --chunk->live;
    --regions_;
    allocated_bytes_ -= length;
    if (!chunk->empty()) return;
    bool keep = false;
    if (!chunk->dedicated) {
      size_t cached = 0;
      for (const auto& c : chunks_)
        if (c.get() != chunk && !c->dedicated && c->empty()) ++cached;
      keep = cached < options_.cached_empty_chunks;
    }
    if (keep) return;
    auto it = std::find_if(chunks_.begin(), chunks_.end(), [&](const auto& c) { return c.get() == chunk; });
    doomed = std::move(*it);
    chunks_.erase(it);
  }
  // The IOMMU unmap and munmap run without the allocator's lock held.
}

Usage DmaAllocator::usage() const {
  std::lock_guard lock(mutex_);
  Usage u;
  u.regions = regions_;
  u.allocated_bytes = allocated_bytes_;
  for (const auto& c : chunks_) {
    ++u.chunks;
    u.chunk_bytes += c->length;
    if (c->hugepages) ++u.hugepage_chunks;
    if (c->mapping.valid()) {
      ++u.iommu_mappings;
      u.pinned_bytes += c->length;
    }
  }
  return u;
}

Status DmaAllocator::check_memlock_locked(uint64_t length) const {
  const vfio::Environment& env = iommu_->environment();
  // As the type1 driver does: CAP_IPC_LOCK lifts the limit.
  if (env.kernel->has_cap_ipc_lock()) return {};
  rlimit limit{};
  // An unreadable limit is left to the kernel to enforce at MAP_DMA.
  if (env.kernel->getrlimit(RLIMIT_MEMLOCK, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return {};
  const uint64_t cap = limit.rlim_cur;
  const auto locked = vfio::locked_memory_bytes(env);
  const uint64_t pinned = iommu_->usage().pinned_bytes;
  uint64_t already = 0;
  std::string counted;
  if (!locked) {
    already = pinned;
    counted = "this IOMMU context already pins " + bytes(pinned) + " (the process's total, VmLck in " +
              env.proc_root + "/self/status, was unreadable, so other locked memory is not counted)";
  } else if (iommu_->kind() == "vfio-type1") {
    // type1 charges its pins to the process's locked_vm, which VmLck shows:
    // they are already inside *locked and must not be added twice.
    already = std::max(*locked, pinned);
    counted = "this process already has " + bytes(already) + " locked (VmLck in " + env.proc_root +
              "/self/status, which includes the " + bytes(pinned) + " this IOMMU context pins)";
  } else {
    already = *locked + pinned;
    counted = "this process already has " + bytes(*locked) + " locked (VmLck in " + env.proc_root +
              "/self/status) and this IOMMU context pins " + bytes(pinned);
  }
  if (already <= cap && length <= cap - already) return {};
  return fail(ENOMEM, "cannot pin " + bytes(length) + " more for DMA: RLIMIT_MEMLOCK is " + bytes(cap) + " and " +
                          counted + ", so " + bytes(length) +
                          " more would exceed it. Raise the limit: `ulimit -l unlimited` in the shell that starts "
                          "the program, a line `<user> - memlock unlimited` in /etc/security/limits.conf, "
                          "LimitMEMLOCK=infinity for a systemd service, or run with CAP_IPC_LOCK (root has it)");
}

Result<void*> DmaAllocator::map_memory(uint64_t length, uint64_t align, bool huge) {
  constexpr int prot = PROT_READ | PROT_WRITE;
  const std::string what = "mmap of " + bytes(length) + (huge ? " in 2 MiB huge pages" : " of anonymous memory");
  if (huge) {
    // hugetlb mappings come 2 MiB aligned; align is at most that here.
    void* p = kernel_->mmap(nullptr, length, prot,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE | MAP_HUGETLB | MAP_HUGE_2MB, -1, 0);
    if (p == MAP_FAILED) return fail_errno(what);
    if (reinterpret_cast<uintptr_t>(p) % align != 0) {
      kernel_->munmap(p, length);
      return fail(EINVAL, what + ": the kernel returned " + hex(reinterpret_cast<uintptr_t>(p)) +
                              ", not aligned to " + bytes(align));
    }
    return p;
  }
  const uint64_t host_page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  if (align <= host_page) {
    void* p = kernel_->mmap(nullptr, length, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) return fail_errno(what);
    return p;
  }
  // Over-map by the alignment and give back head and tail, so the chunk
  // starts on a boundary of its own size. Aligned chunks let the IOMMU place
  // the IOVA on the same boundary (and use large IOMMU pages where
  // transparent huge pages back the memory). Not populated yet: the slack
  // would be faulted in only to be thrown away.
  const uint64_t span = length + align - host_page;
  void* reserved = kernel_->mmap(nullptr, span, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (reserved == MAP_FAILED) return fail_errno(what);
  const auto base = reinterpret_cast<uintptr_t>(reserved);
  const uintptr_t at = round_up(base, align);
  if (at > base) kernel_->munmap(reserved, at - base);
  if (base + span > at + length) kernel_->munmap(reinterpret_cast<void*>(at + length), base + span - (at + length));
  // Fault every page in now, as MAP_POPULATE would have, so software devices
  // take no page faults on the data path (an IOMMU pin would do it anyway).
  auto* bytes_at = reinterpret_cast<volatile uint8_t*>(at);
  for (uint64_t off = 0; off < length; off += host_page) bytes_at[off] = 0;
  return reinterpret_cast<void*>(at);
}

Result<std::unique_ptr<detail::Chunk>> DmaAllocator::make_chunk_locked(uint64_t size, uint64_t align,
                                                                       bool dedicated) {
  // A regular chunk is chunk_size long and aligned to it; a dedicated one is
  // the request rounded up to pages and aligned to the request (at least to
  // 2 MiB when it is that large, for the IOMMU's sake).
  const uint64_t small_length = dedicated ? round_up(size, page_size_) : size;
  const uint64_t small_align =
      dedicated ? std::max<uint64_t>(align, std::min<uint64_t>(std::bit_floor(small_length), kHugePage)) : size;
  const uint64_t huge_length = round_up(small_length, kHugePage);
  const char* noun = dedicated ? "dedicated DMA mapping" : "DMA chunk";

  if (iommu_) {
    if (auto ok = check_memlock_locked(small_length); !ok)
      return std::unexpected(ok.error().context("a new " + bytes(small_length) + " " + noun));
  }

  // Huge pages only where they fit: 2 MiB multiples, alignments hugetlb
  // gives by itself, and within the memlock budget.
  bool huge = options_.prefer_hugepages && align <= kHugePage && (dedicated || small_length % kHugePage == 0) &&
              (!iommu_ || check_memlock_locked(huge_length).has_value());
  void* va = nullptr;
  uint64_t length = small_length;
  if (huge) {
    // Fails (ENOMEM) when the host has no free 2 MiB pages; 4 KiB pages then.
    if (auto mapped = map_memory(huge_length, kHugePage, true)) {
      va = *mapped;
      length = huge_length;
    } else {
      huge = false;
    }
  }
  if (va == nullptr) {
    auto mapped = map_memory(small_length, small_align, false);
    if (!mapped) return std::unexpected(mapped.error().context("a new " + bytes(small_length) + " " + noun));
    va = *mapped;
  }

  // From here the chunk owns the memory: every return below munmaps it.
  auto chunk = std::make_unique<detail::Chunk>();
  chunk->kernel = kernel_;
  chunk->va = va;
  chunk->length = length;
  chunk->hugepages = huge;
  chunk->dedicated = dedicated;
  if (iommu_) {
    // A fork() must not turn pinned pages copy-on-write: the parent's next
    // write would land on a fresh page the device never sees (older kernels;
    // since 5.8 pinned pages are copied for the child instead). The child has
    // no use for DMA memory of a device it does not own. Advice only: a
    // failure changes nothing for this process.
    (void)::madvise(va, length, MADV_DONTFORK);
    auto mapping = iommu_->map_dma(va, length, vfio::DmaAccess::device_reads_and_writes);
    if (!mapping)
      return std::unexpected(mapping.error().context("mapping a new " + bytes(length) + " " + noun + " at vaddr " +
                                                     hex(reinterpret_cast<uintptr_t>(va)) + " into the IOMMU"));
    chunk->iova = mapping->iova();
    chunk->mapping = std::move(*mapping);
  } else {
    chunk->iova = reinterpret_cast<uintptr_t>(va);
  }
  chunk->align_limit =
      std::min<uint64_t>(lowest_bit(reinterpret_cast<uintptr_t>(va) | chunk->iova), std::bit_floor(length));
  chunk->free[0] = length;
  return chunk;
}

}  // namespace ufab::dma
