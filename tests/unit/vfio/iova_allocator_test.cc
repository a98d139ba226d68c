#include "vfio/iova_allocator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace ufab::vfio {
namespace {

constexpr uint64_t KiB = 1024, MiB = 1024 * KiB;
constexpr uint64_t k39Bits = (1ull << 39) - 1;

// The ranges Linux reports under QEMU's intel-iommu (39-bit, MSI window out).
std::vector<IovaRange> qemu_ranges() { return {{0, 0xfedfffff}, {0xfef00000, k39Bits}}; }

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(IovaAllocator, NeverReturnsIovaZero) {
  auto a = IovaAllocator::create({{0, 16 * KiB - 1}});
  ASSERT_TRUE(a) << a.error().message();
  EXPECT_EQ(a->ranges().front().first, 4 * KiB);
  std::set<uint64_t> got;
  for (int i = 0; i < 3; ++i) {
    auto iova = a->allocate(4 * KiB);
    ASSERT_TRUE(iova) << iova.error().message();
    EXPECT_NE(*iova, 0u);
    got.insert(*iova);
  }
  EXPECT_EQ(got, (std::set<uint64_t>{4 * KiB, 8 * KiB, 12 * KiB}));
  EXPECT_FALSE(a->allocate(4 * KiB));  // page 0 is not a fourth page
}

TEST(IovaAllocator, RoundsSizesToPagesAndHonoursAlignment) {
  auto a = IovaAllocator::create(qemu_ranges());
  ASSERT_TRUE(a);
  auto small = a->allocate(100);
  ASSERT_TRUE(small);
  EXPECT_EQ(*small, 4 * KiB);
  auto big = a->allocate(2 * MiB, 2 * MiB);
  ASSERT_TRUE(big);
  EXPECT_EQ(*big % (2 * MiB), 0u);
  EXPECT_EQ(*big, 2 * MiB);  // first 2 MiB-aligned address past the first page
  auto next = a->allocate(4 * KiB);
  ASSERT_TRUE(next);
  EXPECT_EQ(*next, 8 * KiB);  // the gap below the aligned block is reused first
  // 100 bytes took a whole page: freeing with the original size works.
  EXPECT_TRUE(a->free(*small, 100));
}

TEST(IovaAllocator, RejectsBadSizesAndAlignments) {
  auto a = IovaAllocator::create(qemu_ranges());
  ASSERT_TRUE(a);
  auto zero = a->allocate(0);
  ASSERT_FALSE(zero);
  EXPECT_EQ(zero.error().code(), EINVAL);
  auto odd = a->allocate(4 * KiB, 3 * KiB);
  ASSERT_FALSE(odd);
  EXPECT_TRUE(contains(odd.error().message(), "power of two"));
  EXPECT_FALSE(IovaAllocator::create(qemu_ranges(), 3000));
}

TEST(IovaAllocator, StaysInsideRangesAroundTheMsiWindow) {
  // Two ranges split by the MSI window; the low one holds exactly 1 MiB.
  auto a = IovaAllocator::create({{0xfed00000, 0xfedfffff}, {0xfef00000, 0xfeffffff}});
  ASSERT_TRUE(a);
  auto first = a->allocate(1 * MiB);
  ASSERT_TRUE(first);
  EXPECT_EQ(*first, 0xfed00000u);
  // A second MiB cannot straddle the window: it must come from the upper range.
  auto second = a->allocate(1 * MiB);
  ASSERT_TRUE(second);
  EXPECT_EQ(*second, 0xfef00000u);
  for (uint64_t iova : {*first, *second}) {
    EXPECT_FALSE(iova <= 0xfeefffff && iova + MiB - 1 >= 0xfee00000) << std::hex << iova;
  }
  EXPECT_FALSE(a->allocate(4 * KiB));
}

TEST(IovaAllocator, NeverGoesPastA39BitRange) {
  // Only 8 MiB below 2^39 remain in the reported range.
  auto a = IovaAllocator::create({{k39Bits + 1 - 8 * MiB, k39Bits}});
  ASSERT_TRUE(a);
  auto low = a->allocate(8 * MiB);
  ASSERT_TRUE(low);
  EXPECT_EQ(*low + 8 * MiB - 1, k39Bits);
  auto more = a->allocate(4 * KiB);
  ASSERT_FALSE(more) << "allocated " << std::hex << *more << " beyond the 39-bit range";
}

TEST(IovaAllocator, TrimsRangesToWholePages) {
  auto a = IovaAllocator::create({{0x1800, 0x4fff}, {0x10000, 0x12ffe}});
  ASSERT_TRUE(a);
  EXPECT_EQ(a->ranges(), (std::vector<IovaRange>{{0x2000, 0x4fff}, {0x10000, 0x11fff}}));
  EXPECT_EQ(a->free_bytes(), 5 * 4 * KiB);
}

TEST(IovaAllocator, HandlesARangeEndingAtTheTopOfTheAddressSpace) {
  auto a = IovaAllocator::create({{UINT64_MAX - 2 * MiB + 1, UINT64_MAX}});
  ASSERT_TRUE(a);
  auto iova = a->allocate(2 * MiB);
  ASSERT_TRUE(iova);
  EXPECT_EQ(*iova, UINT64_MAX - 2 * MiB + 1);
  EXPECT_TRUE(a->free(*iova, 2 * MiB));
  EXPECT_EQ(a->free_bytes(), 2 * MiB);
}

TEST(IovaAllocator, EmptyRangesAreAnError) {
  auto a = IovaAllocator::create({{0, 0xfff}});  // only page 0, which is excluded
  ASSERT_FALSE(a);
  EXPECT_EQ(a.error().code(), ENOSPC);
  EXPECT_TRUE(contains(a.error().message(), "no usable IOVA range"));
}

TEST(IovaAllocator, ExhaustionSaysWhatWasAskedAndWhatIsFree) {
  auto a = IovaAllocator::create({{0x1000, 0x100fff}});  // 1 MiB
  ASSERT_TRUE(a);
  auto x = a->allocate(512 * KiB);
  ASSERT_TRUE(x);
  auto y = a->allocate(2 * MiB);
  ASSERT_FALSE(y);
  EXPECT_EQ(y.error().code(), ENOSPC);
  const std::string& m = y.error().message();
  EXPECT_TRUE(contains(m, "cannot allocate 2 MiB")) << m;
  EXPECT_TRUE(contains(m, "512 KiB free")) << m;
  EXPECT_TRUE(contains(m, "largest 512 KiB")) << m;
  EXPECT_TRUE(contains(m, "0x1000-0x100fff")) << m;
}

TEST(IovaAllocator, AlignmentCanMakeFreeSpaceUnusable) {
  auto a = IovaAllocator::create({{0x1000, 0x1fffff}});  // just under 2 MiB, never 2 MiB aligned
  ASSERT_TRUE(a);
  auto r = a->allocate(4 * KiB, 2 * MiB);
  ASSERT_FALSE(r);
  EXPECT_TRUE(contains(r.error().message(), "aligned to 2 MiB")) << r.error().message();
}

TEST(IovaAllocator, FreeCoalescesNeighbours) {
  auto a = IovaAllocator::create({{0x1000, 0x4fff}});  // 4 pages
  ASSERT_TRUE(a);
  auto p1 = a->allocate(4 * KiB), p2 = a->allocate(4 * KiB), p3 = a->allocate(4 * KiB), p4 = a->allocate(4 * KiB);
  ASSERT_TRUE(p1 && p2 && p3 && p4);
  EXPECT_EQ(a->free_bytes(), 0u);
  EXPECT_TRUE(a->free(*p2, 4 * KiB));
  EXPECT_TRUE(a->free(*p4, 4 * KiB));
  EXPECT_EQ(a->free_block_count(), 2u);
  EXPECT_TRUE(a->free(*p3, 4 * KiB));  // joins both neighbours
  EXPECT_EQ(a->free_block_count(), 1u);
  EXPECT_TRUE(a->free(*p1, 4 * KiB));
  EXPECT_EQ(a->free_block_count(), 1u);
  // Coalesced: one 16 KiB block is allocatable again.
  auto whole = a->allocate(16 * KiB);
  ASSERT_TRUE(whole);
  EXPECT_EQ(*whole, 0x1000u);
}

TEST(IovaAllocator, FreeMustMatchAnAllocationExactly) {
  auto a = IovaAllocator::create(qemu_ranges());
  ASSERT_TRUE(a);
  auto iova = a->allocate(8 * KiB);
  ASSERT_TRUE(iova);
  auto wrong_size = a->free(*iova, 4 * KiB);
  ASSERT_FALSE(wrong_size);
  EXPECT_TRUE(contains(wrong_size.error().message(), "allocated with 8 KiB, not 4 KiB"));
  auto wrong_address = a->free(*iova + 4 * KiB, 4 * KiB);
  ASSERT_FALSE(wrong_address);
  EXPECT_TRUE(contains(wrong_address.error().message(), "was not allocated"));
  EXPECT_TRUE(a->free(*iova, 8 * KiB));
  auto twice = a->free(*iova, 8 * KiB);
  ASSERT_FALSE(twice);
  EXPECT_TRUE(contains(twice.error().message(), "already freed"));
}

TEST(IovaAllocator, NarrowedRangesKeepLiveAllocationsAndDropFreeSpace) {
  auto a = IovaAllocator::create({{0x1000, 0xfffff}});
  ASSERT_TRUE(a);
  auto live = a->allocate(4 * KiB);
  ASSERT_TRUE(live);
  // A new group reserves 0x80000-0xfffff.
  ASSERT_TRUE(a->set_ranges({{0x1000, 0x7ffff}}));
  EXPECT_EQ(a->free_bytes(), 0x7f000u - 4 * KiB);
  EXPECT_FALSE(a->allocate(0x80000));
  EXPECT_TRUE(a->free(*live, 4 * KiB));
  EXPECT_EQ(a->free_bytes(), 0x7f000u);
  // Ranges that would orphan a live allocation are refused.
  auto again = a->allocate(4 * KiB);
  ASSERT_TRUE(again);
  auto refused = a->set_ranges({{0x10000, 0x7ffff}});
  ASSERT_FALSE(refused);
  EXPECT_TRUE(contains(refused.error().message(), "outside the new usable IOVA ranges"));
}

TEST(IovaAllocator, ManyAllocationsNeverOverlap) {
  auto a = IovaAllocator::create(qemu_ranges());
  ASSERT_TRUE(a);
  std::vector<std::pair<uint64_t, uint64_t>> blocks;
  for (uint64_t i = 1; i <= 200; ++i) {
    uint64_t size = (i % 7 + 1) * 4 * KiB;
    auto iova = a->allocate(size, i % 5 == 0 ? 64 * KiB : 0);
    ASSERT_TRUE(iova);
    blocks.push_back({*iova, size});
    if (i % 3 == 0) {  // free an earlier one to fragment the space
      auto [at, sz] = blocks[blocks.size() / 2];
      ASSERT_TRUE(a->free(at, sz));
      blocks.erase(blocks.begin() + static_cast<long>(blocks.size() / 2));
    }
  }
  std::sort(blocks.begin(), blocks.end());
  for (size_t i = 1; i < blocks.size(); ++i) EXPECT_LE(blocks[i - 1].first + blocks[i - 1].second, blocks[i].first);
  EXPECT_EQ(a->allocation_count(), blocks.size());
}

}  // namespace
}  // namespace ufab::vfio
