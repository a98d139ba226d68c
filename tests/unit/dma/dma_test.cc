#include "dma/dma.h"

#include <gtest/gtest.h>
#include <linux/vfio.h>
#include <unistd.h>

#include <cstring>
#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "tests/unit/dma/dma_world.h"

namespace ufab::dma {
namespace {

using testing::DmaWorld;
using testing::KiB;
using testing::MiB;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

uintptr_t addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

bool all_zero(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i)
    if (b[i] != 0) return false;
  return true;
}

Options small_pages(size_t cached = 1) {
  Options o;
  o.prefer_hugepages = false;
  o.cached_empty_chunks = cached;
  return o;
}

// ------------------------------------------------------------ software mode

TEST(SoftwareDma, EveryAllocationIsAlignedZeroedAndIovaIsVa) {
  auto allocator = DmaAllocator::create(nullptr, small_pages());
  ASSERT_TRUE(allocator) << allocator.error().message();
  struct Ask {
    size_t size, align;
  };
  const Ask asks[] = {{1, 1},      {63, 64},     {100, 64},      {1000, 256},     {4096, 4096}, {3, 8},
                      {5000, 128}, {65536, 65536}, {12345, 2048}, {200 * KiB, 64}, {1, 1 * MiB}};
  std::vector<DmaRegion> regions;
  for (const auto& ask : asks) {
    auto r = (*allocator)->allocate(ask.size, ask.align);
    ASSERT_TRUE(r) << ask.size << "/" << ask.align << ": " << r.error().message();
    EXPECT_TRUE(r->valid());
    EXPECT_EQ(r->size(), ask.size);
    const size_t expected_align = std::max<size_t>(ask.align, 64);
    EXPECT_EQ(addr(r->va()) % expected_align, 0u) << ask.size << "/" << ask.align;
    EXPECT_EQ(r->iova(), addr(r->va()));
    EXPECT_TRUE(all_zero(r->va(), r->size()));
    std::memset(r->va(), 0xa5, r->size());  // writable, and no overlap (checked below)
    regions.push_back(std::move(*r));
  }
  // No two regions overlap.
  for (size_t i = 0; i < regions.size(); ++i)
    for (size_t j = i + 1; j < regions.size(); ++j) {
      auto a = addr(regions[i].va()), b = addr(regions[j].va());
      EXPECT_TRUE(a + regions[i].size() <= b || b + regions[j].size() <= a) << i << " overlaps " << j;
    }
  Usage u = (*allocator)->usage();
  EXPECT_EQ(u.regions, regions.size());
  EXPECT_EQ(u.pinned_bytes, 0u);
  EXPECT_EQ(u.iommu_mappings, 0u);
  EXPECT_GE(u.chunks, 1u);
  regions.clear();
  u = (*allocator)->usage();
  EXPECT_EQ(u.regions, 0u);
  EXPECT_EQ(u.allocated_bytes, 0u);
  EXPECT_LE(u.chunks, 1u);  // at most the one cached chunk
}

TEST(SoftwareDma, ReusedSpaceIsZeroedAgain) {
  auto allocator = DmaAllocator::create(nullptr, small_pages());
  ASSERT_TRUE(allocator);
  void* first = nullptr;
  {
    auto r = (*allocator)->allocate(4096, 4096);
    ASSERT_TRUE(r);
    first = r->va();
    std::memset(r->va(), 0xff, 4096);
  }
  auto again = (*allocator)->allocate(4096, 4096);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->va(), first);  // the freed space came back
  EXPECT_TRUE(all_zero(again->va(), 4096));
}

TEST(SoftwareDma, IovaOfIsOffsetArithmeticInsideTheRegionOnly) {
  auto allocator = DmaAllocator::create(nullptr, small_pages());
  ASSERT_TRUE(allocator);
  auto r = (*allocator)->allocate(1000);
  ASSERT_TRUE(r);
  auto* base = static_cast<uint8_t*>(r->va());
  EXPECT_EQ(r->iova_of(base), r->iova());
  EXPECT_EQ(r->iova_of(base + 17), r->iova() + 17);
  EXPECT_EQ(r->iova_of(base + 999), r->iova() + 999);
  EXPECT_EQ(r->iova_of(base + 1000), 0u);  // one past the end
  EXPECT_EQ(r->iova_of(base - 1), 0u);
  EXPECT_EQ(r->iova_of(nullptr), 0u);
  DmaRegion empty;
  EXPECT_FALSE(empty.valid());
  EXPECT_EQ(empty.iova_of(base), 0u);
}

TEST(SoftwareDma, MovingARegionMovesOwnershipAndAssignmentReleasesTheOld) {
  auto allocator = DmaAllocator::create(nullptr, small_pages());
  ASSERT_TRUE(allocator);
  auto a = (*allocator)->allocate(100);
  auto b = (*allocator)->allocate(200);
  ASSERT_TRUE(a && b);
  void* a_va = a->va();
  DmaRegion moved(std::move(*a));
  EXPECT_FALSE(a->valid());
  EXPECT_TRUE(moved.valid());
  EXPECT_EQ(moved.va(), a_va);
  EXPECT_EQ((*allocator)->usage().regions, 2u);
  moved = std::move(*b);  // a's bytes go back
  EXPECT_EQ((*allocator)->usage().regions, 1u);
  EXPECT_EQ(moved.size(), 200u);
  moved.reset();
  EXPECT_FALSE(moved.valid());
  EXPECT_EQ((*allocator)->usage().regions, 0u);
}

TEST(SoftwareDma, RefusesBadArgumentsWithReasons) {
  Options bad;
  bad.chunk_size = 3 * MiB;
  auto refused = DmaAllocator::create(nullptr, bad);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), EINVAL);
  EXPECT_TRUE(contains(refused.error().message(), "power of two")) << refused.error().message();
  bad.chunk_size = 1024;
  EXPECT_FALSE(DmaAllocator::create(nullptr, bad));

  auto allocator = DmaAllocator::create(nullptr, small_pages());
  ASSERT_TRUE(allocator);
  auto zero = (*allocator)->allocate(0);
  ASSERT_FALSE(zero);
  EXPECT_TRUE(contains(zero.error().message(), "0 bytes")) << zero.error().message();
  auto odd = (*allocator)->allocate(64, 48);
  ASSERT_FALSE(odd);
  EXPECT_TRUE(contains(odd.error().message(), "power of two")) << odd.error().message();
  EXPECT_FALSE((*allocator)->allocate(64, 0));
  auto huge_align = (*allocator)->allocate(64, 4 * MiB);
  ASSERT_FALSE(huge_align);
  EXPECT_TRUE(contains(huge_align.error().message(), "chunk_size")) << huge_align.error().message();
  EXPECT_EQ((*allocator)->usage().chunks, 0u);
}

TEST(SoftwareDma, LargerThanAChunkGetsADedicatedMappingFreedWithIt) {
  auto allocator = DmaAllocator::create(nullptr, small_pages(/*cached=*/1));
  ASSERT_TRUE(allocator);
  auto big = (*allocator)->allocate(5 * MiB + 100, 4096);
  ASSERT_TRUE(big) << big.error().message();
  EXPECT_EQ(addr(big->va()) % (2 * MiB), 0u);  // large mappings are 2 MiB aligned
  EXPECT_TRUE(all_zero(big->va(), big->size()));
  std::memset(big->va(), 1, big->size());
  EXPECT_EQ((*allocator)->usage().chunks, 1u);
  big->reset();
  EXPECT_EQ((*allocator)->usage().chunks, 0u);  // dedicated chunks are never cached
}

TEST(SoftwareDma, ConcurrentAllocateAndFreeKeepTheBooksStraight) {
  auto allocator = DmaAllocator::create(nullptr, small_pages());
  ASSERT_TRUE(allocator);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::vector<DmaRegion> mine;
      for (int i = 0; i < 500; ++i) {
        auto r = (*allocator)->allocate(64 + 64 * ((i * 7 + t) % 50), 64);
        if (!r || !all_zero(r->va(), r->size())) {
          ++failures;
          continue;
        }
        std::memset(r->va(), t + 1, r->size());
        mine.push_back(std::move(*r));
        if (i % 3 == 0) mine.erase(mine.begin());
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  Usage u = (*allocator)->usage();
  EXPECT_EQ(u.regions, 0u);
  EXPECT_EQ(u.allocated_bytes, 0u);
}

// -------------------------------------------------------- IOMMU-backed mode

class IommuDmaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string error;
    container_ = world_.container(&error);
    ASSERT_TRUE(container_) << error;
  }
  void TearDown() override {
    container_.reset();
    EXPECT_EQ(world_.kernel.unmatched_unmaps, 0) << "an unmap did not name exactly one mapping";
    EXPECT_TRUE(world_.kernel.live_dma_maps().empty()) << "an IOMMU mapping outlived its owners";
    EXPECT_EQ(world_.kernel.live_anonymous_bytes(), 0u) << "DMA memory stayed mmapped";
    EXPECT_EQ(world_.kernel.open_fds(), 0u);
  }

  std::shared_ptr<DmaAllocator> make(Options options = small_pages()) {
    auto a = DmaAllocator::create(container_, options);
    EXPECT_TRUE(a) << a.error().message();
    return a ? *a : nullptr;
  }

  DmaWorld world_;
  std::shared_ptr<vfio::Container> container_;
};

TEST_F(IommuDmaTest, RegionsOfOneChunkShareOneIommuMapping) {
  auto allocator = make();
  std::vector<DmaRegion> regions;
  const size_t aligns[] = {64, 128, 4096, 64, 256 * KiB, 512, 8192, 1 * MiB};
  for (size_t i = 0; i < std::size(aligns); ++i) {
    auto r = allocator->allocate(100 + 37 * i, aligns[i]);
    ASSERT_TRUE(r) << r.error().message();
    EXPECT_EQ(addr(r->va()) % aligns[i], 0u) << "va, align " << aligns[i];
    EXPECT_EQ(r->iova() % aligns[i], 0u) << "iova, align " << aligns[i];
    EXPECT_TRUE(all_zero(r->va(), r->size()));
    regions.push_back(std::move(*r));
  }
  ASSERT_EQ(world_.kernel.map_calls.size(), 1u);
  const auto map = world_.kernel.map_calls[0];
  EXPECT_EQ(map.size, 2 * MiB);
  EXPECT_EQ(map.flags, uint32_t{VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE});
  for (const auto& r : regions) {
    // Inside the one mapping, at the same offset on both sides.
    EXPECT_GE(r.iova(), map.iova);
    EXPECT_LE(r.iova() + r.size(), map.iova + map.size);
    EXPECT_EQ(r.iova() - map.iova, addr(r.va()) - map.vaddr);
    EXPECT_EQ(r.iova_of(static_cast<uint8_t*>(r.va()) + 5), r.iova() + 5);
  }
  Usage u = allocator->usage();
  EXPECT_EQ(u.iommu_mappings, 1u);
  EXPECT_EQ(u.chunks, 1u);
  EXPECT_EQ(u.pinned_bytes, 2 * MiB);
  EXPECT_EQ(u.regions, regions.size());
  EXPECT_EQ(container_->usage().mappings, 1u);
}

TEST_F(IommuDmaTest, FreedSpaceIsReusedWithoutANewMapping) {
  auto allocator = make();
  auto a = allocator->allocate(1 * MiB);
  auto b = allocator->allocate(512 * KiB);
  ASSERT_TRUE(a && b);
  const uint64_t a_iova = a->iova();
  void* a_va = a->va();
  a->reset();
  auto c = allocator->allocate(1 * MiB);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->va(), a_va);
  EXPECT_EQ(c->iova(), a_iova);
  // The chunk holds 1.5 MiB now; 600 KiB more no longer fits: a second chunk.
  auto d = allocator->allocate(600 * KiB);
  ASSERT_TRUE(d);
  EXPECT_EQ(world_.kernel.map_calls.size(), 2u);
  // Free neighbours merge: with b gone, 1 MiB fits where b and the tail were.
  b->reset();
  auto e = allocator->allocate(1 * MiB);
  ASSERT_TRUE(e);
  EXPECT_EQ(world_.kernel.map_calls.size(), 2u);
}

TEST_F(IommuDmaTest, AnEmptyChunkIsUnmappedExactlyAsMapped) {
  auto allocator = make(small_pages(/*cached=*/0));
  auto r = allocator->allocate(3000);
  ASSERT_TRUE(r);
  ASSERT_EQ(world_.kernel.map_calls.size(), 1u);
  const auto map = world_.kernel.map_calls[0];
  EXPECT_EQ(world_.kernel.live_anonymous_bytes(), 2 * MiB);
  r->reset();
  ASSERT_EQ(world_.kernel.unmap_calls.size(), 1u);
  EXPECT_EQ(world_.kernel.unmap_calls[0], std::make_pair(map.iova, map.size));
  EXPECT_EQ(world_.kernel.unmatched_unmaps, 0);
  EXPECT_TRUE(world_.kernel.live_dma_maps().empty());
  EXPECT_EQ(world_.kernel.live_anonymous_bytes(), 0u);
  Usage u = allocator->usage();
  EXPECT_EQ(u.chunks, 0u);
  EXPECT_EQ(u.pinned_bytes, 0u);
  EXPECT_EQ(u.iommu_mappings, 0u);
  EXPECT_EQ(container_->usage().pinned_bytes, 0u);
}

TEST_F(IommuDmaTest, OneEmptyChunkStaysCachedTheRestAreUnmapped) {
  auto allocator = make(small_pages(/*cached=*/1));
  auto a = allocator->allocate(1536 * KiB);
  auto b = allocator->allocate(1536 * KiB);  // does not fit beside a
  ASSERT_TRUE(a && b);
  ASSERT_EQ(world_.kernel.map_calls.size(), 2u);
  a->reset();
  EXPECT_EQ(world_.kernel.unmap_calls.size(), 0u);  // kept for the next allocation
  b->reset();
  ASSERT_EQ(world_.kernel.unmap_calls.size(), 1u);  // a second empty one is not
  EXPECT_EQ(world_.kernel.unmap_calls[0],
            std::make_pair(world_.kernel.map_calls[1].iova, world_.kernel.map_calls[1].size));
  EXPECT_EQ(allocator->usage().chunks, 1u);
  // The cached chunk serves the next allocation without a new MAP_DMA.
  auto c = allocator->allocate(2 * MiB);
  ASSERT_TRUE(c) << c.error().message();
  EXPECT_EQ(world_.kernel.map_calls.size(), 2u);
  c->reset();
  allocator.reset();  // the cached chunk goes with the allocator
  EXPECT_EQ(world_.kernel.unmap_calls.size(), 2u);
  EXPECT_TRUE(world_.kernel.live_dma_maps().empty());
}

TEST_F(IommuDmaTest, MemlockIsCheckedBeforeAnythingIsMappedOrPinned) {
  world_.kernel.memlock = {3 * MiB, 3 * MiB};
  world_.sysfs.set_locked_kib(2048);  // 2 MiB already locked by someone
  auto allocator = make();
  auto r = allocator->allocate(64);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ENOMEM);
  const std::string& m = r.error().message();
  EXPECT_TRUE(contains(m, "RLIMIT_MEMLOCK is 3 MiB")) << m;
  EXPECT_TRUE(contains(m, "2 MiB locked")) << m;
  EXPECT_TRUE(contains(m, "cannot pin 2 MiB more")) << m;
  EXPECT_TRUE(contains(m, "ulimit -l")) << m;
  EXPECT_TRUE(contains(m, "/etc/security/limits.conf")) << m;
  EXPECT_TRUE(contains(m, "CAP_IPC_LOCK")) << m;
  EXPECT_EQ(world_.kernel.anonymous_mmaps, 0);  // refused before mmap
  EXPECT_TRUE(world_.kernel.map_calls.empty());
  EXPECT_EQ(allocator->usage().chunks, 0u);

  // CAP_IPC_LOCK lifts the limit, as it does in the type1 driver.
  world_.kernel.cap_ipc_lock = true;
  auto ok = allocator->allocate(64);
  EXPECT_TRUE(ok) << ok.error().message();
}

TEST_F(IommuDmaTest, MemlockCountsWhatTheContainerPinsWhenVmLckIsUnreadable) {
  world_.kernel.memlock = {3 * MiB, 3 * MiB};
  ASSERT_EQ(::unlink((world_.sysfs.proc() + "/self/status").c_str()), 0);
  auto allocator = make();
  auto first = allocator->allocate(1536 * KiB);
  ASSERT_TRUE(first) << first.error().message();
  const int mmaps = world_.kernel.anonymous_mmaps;
  auto second = allocator->allocate(1 * MiB);  // needs a second chunk: 4 MiB > 3 MiB
  ASSERT_FALSE(second);
  EXPECT_EQ(second.error().code(), ENOMEM);
  EXPECT_TRUE(contains(second.error().message(), "already pins 2 MiB")) << second.error().message();
  EXPECT_TRUE(contains(second.error().message(), "ulimit -l")) << second.error().message();
  EXPECT_EQ(world_.kernel.anonymous_mmaps, mmaps);
  EXPECT_EQ(world_.kernel.map_calls.size(), 1u);
  // What still fits in the existing chunk is served.
  EXPECT_TRUE(allocator->allocate(256 * KiB));
}

TEST_F(IommuDmaTest, MapDmaFailureLeavesNothingMappedOrMmapped) {
  auto allocator = make();
  world_.kernel.fail_ioctl(VFIO_IOMMU_MAP_DMA, EFAULT);
  auto r = allocator->allocate(4096);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), EFAULT);
  EXPECT_TRUE(contains(r.error().message(), "into the IOMMU")) << r.error().message();
  EXPECT_TRUE(contains(r.error().message(), "VFIO_IOMMU_MAP_DMA")) << r.error().message();
  EXPECT_GT(world_.kernel.anonymous_mmaps, 0);           // it did mmap ...
  EXPECT_EQ(world_.kernel.live_anonymous_bytes(), 0u);  // ... and gave it back
  EXPECT_TRUE(world_.kernel.live_dma_maps().empty());
  Usage u = allocator->usage();
  EXPECT_EQ(u.chunks, 0u);
  EXPECT_EQ(u.regions, 0u);
  EXPECT_EQ(container_->usage().mappings, 0u);
  EXPECT_EQ(container_->usage().pinned_bytes, 0u);
  // The next attempt works.
  EXPECT_TRUE(allocator->allocate(4096));
}

TEST_F(IommuDmaTest, DmaEntryLimitErrorComesThroughWithItsAdvice) {
  world_.kernel.dma_entry_limit = 1;
  std::string error;
  // The limit is read when the group joins: a fresh container sees it.
  container_.reset();
  container_ = world_.container(&error);
  ASSERT_TRUE(container_) << error;
  auto allocator = make(small_pages(/*cached=*/0));
  auto a = allocator->allocate(5 * MiB);  // dedicated mapping: the one entry
  ASSERT_TRUE(a) << a.error().message();
  auto b = allocator->allocate(64);
  ASSERT_FALSE(b);
  EXPECT_EQ(b.error().code(), ENOSPC);
  EXPECT_TRUE(contains(b.error().message(), "dma_entry_limit")) << b.error().message();
  EXPECT_EQ(world_.kernel.live_anonymous_bytes(), 5 * MiB);  // the refused chunk was munmapped
}

TEST_F(IommuDmaTest, EverythingIsUnmappedWhenTheLastOwnerGoes) {
  auto allocator = make(small_pages(/*cached=*/1));
  auto region = allocator->allocate(10000, 4096);
  ASSERT_TRUE(region);
  auto big = allocator->allocate(3 * MiB);
  ASSERT_TRUE(big);
  // Drop every other reference: the regions keep allocator and container up.
  allocator.reset();
  std::weak_ptr<vfio::Container> weak = container_;
  container_.reset();
  ASSERT_FALSE(weak.expired());
  std::memset(region->va(), 7, region->size());
  EXPECT_EQ(world_.kernel.live_dma_maps().size(), 2u);
  big->reset();
  EXPECT_EQ(world_.kernel.live_dma_maps().size(), 1u);  // dedicated: gone at once
  region->reset();                                      // last owner: all goes
  EXPECT_TRUE(weak.expired());
  EXPECT_TRUE(world_.kernel.live_dma_maps().empty());
  EXPECT_EQ(world_.kernel.live_anonymous_bytes(), 0u);
  EXPECT_EQ(world_.kernel.open_fds(), 0u);  // the container closed too
}

TEST_F(IommuDmaTest, UsageReturnsToZero) {
  auto allocator = make(small_pages(/*cached=*/0));
  {
    std::vector<DmaRegion> regions;
    for (int i = 0; i < 50; ++i) {
      auto r = allocator->allocate(80 * KiB + i, 64);  // 25 per chunk
      ASSERT_TRUE(r);
      regions.push_back(std::move(*r));
    }
    Usage u = allocator->usage();
    EXPECT_EQ(u.regions, 50u);
    EXPECT_EQ(u.chunks, 2u);
    EXPECT_EQ(u.iommu_mappings, 2u);
    EXPECT_EQ(u.pinned_bytes, 4 * MiB);
    EXPECT_EQ(container_->usage().pinned_bytes, 4 * MiB);
  }
  Usage u = allocator->usage();
  EXPECT_EQ(u.regions, 0u);
  EXPECT_EQ(u.chunks, 0u);
  EXPECT_EQ(u.pinned_bytes, 0u);
  EXPECT_EQ(u.iommu_mappings, 0u);
  EXPECT_EQ(u.chunk_bytes, 0u);
  EXPECT_EQ(u.allocated_bytes, 0u);
  EXPECT_EQ(container_->usage().mappings, 0u);
  EXPECT_EQ(container_->usage().pinned_bytes, 0u);
}

TEST_F(IommuDmaTest, HugePagesWhenTheHostHasThem) {
  world_.kernel.free_hugepages = 2;
  Options o;
  o.cached_empty_chunks = 0;
  auto allocator = make(o);
  auto a = allocator->allocate(100);
  ASSERT_TRUE(a);
  EXPECT_EQ(world_.kernel.hugetlb_attempts, 1);
  Usage u = allocator->usage();
  EXPECT_EQ(u.hugepage_chunks, 1u);
  ASSERT_EQ(world_.kernel.map_calls.size(), 1u);
  EXPECT_EQ(world_.kernel.map_calls[0].vaddr % (2 * MiB), 0u);
  EXPECT_EQ(world_.kernel.map_calls[0].iova % (2 * MiB), 0u);  // the IOMMU can use a 2 MiB page

  // A dedicated 3 MiB mapping needs two huge pages; one is left: 4 KiB pages.
  auto big = allocator->allocate(3 * MiB);
  ASSERT_TRUE(big) << big.error().message();
  EXPECT_EQ(allocator->usage().hugepage_chunks, 1u);
  EXPECT_EQ(world_.kernel.map_calls.back().size, 3 * MiB);
  big->reset();
  a->reset();
  EXPECT_EQ(world_.kernel.free_hugepages, 2u);

  // With two free, the same request is rounded up to 4 MiB of huge pages.
  auto big2 = allocator->allocate(3 * MiB);
  ASSERT_TRUE(big2);
  EXPECT_EQ(allocator->usage().hugepage_chunks, 1u);
  EXPECT_EQ(world_.kernel.map_calls.back().size, 4 * MiB);
}

TEST_F(IommuDmaTest, NoHugePageAttemptWhenNotPreferred) {
  world_.kernel.free_hugepages = 4;
  auto allocator = make(small_pages());
  ASSERT_TRUE(allocator->allocate(100));
  EXPECT_EQ(world_.kernel.hugetlb_attempts, 0);
  EXPECT_EQ(allocator->usage().hugepage_chunks, 0u);
  // Without hugepages the chunk is still placed on a 2 MiB boundary.
  EXPECT_EQ(world_.kernel.map_calls[0].vaddr % (2 * MiB), 0u);
}

TEST_F(IommuDmaTest, AlignmentTheIommuCannotGiveIsRefusedWithAReason) {
  // An IOMMU with 4 KiB pages only: IOVAs are 4 KiB aligned, no more.
  world_.kernel.page_sizes = 4 * KiB;
  std::string error;
  container_.reset();
  container_ = world_.container(&error);
  ASSERT_TRUE(container_) << error;
  auto allocator = make(small_pages(/*cached=*/0));
  auto small = allocator->allocate(64, 4096);
  ASSERT_TRUE(small) << small.error().message();
  EXPECT_EQ(small->iova() % 4096, 0u);
  if (world_.kernel.map_calls[0].iova % (64 * KiB) == 0) GTEST_SKIP() << "the IOVA happened to be aligned";
  auto big = allocator->allocate(64, 64 * KiB);
  ASSERT_FALSE(big);
  EXPECT_EQ(big.error().code(), ENOTSUP);
  EXPECT_TRUE(contains(big.error().message(), "aligned only to")) << big.error().message();
  EXPECT_EQ(world_.kernel.live_dma_maps().size(), 1u);  // the extra chunk did not stay
}

}  // namespace
}  // namespace ufab::dma
