#include "dma/buffer_pool.h"

#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <vector>

#include "tests/unit/dma/dma_world.h"

namespace ufab::dma {
namespace {

using testing::DmaWorld;
using testing::KiB;
using testing::MiB;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::shared_ptr<DmaAllocator> software_allocator() {
  Options o;
  o.prefer_hugepages = false;
  auto a = DmaAllocator::create(nullptr, o);
  EXPECT_TRUE(a) << a.error().message();
  return a ? *a : nullptr;
}

std::unique_ptr<BufferPool> make_pool(std::shared_ptr<DmaAllocator> allocator, uint32_t count,
                                      uint32_t buffer_size = 2048, uint32_t headroom = 128) {
  auto pool = BufferPool::create(std::move(allocator), count, buffer_size, headroom);
  EXPECT_TRUE(pool) << pool.error().message();
  return pool ? std::move(*pool) : nullptr;
}

TEST(BufferPool, BuffersAreLaidOutContiguouslyInDmaMemory) {
  auto pool = make_pool(software_allocator(), 16);
  ASSERT_TRUE(pool);
  EXPECT_EQ(pool->capacity(), 16u);
  EXPECT_EQ(pool->available(), 16u);
  EXPECT_EQ(pool->buffer_size(), 2048u);
  EXPECT_EQ(pool->headroom(), 128u);
  EXPECT_EQ(pool->stride(), 2048u);
  ufab_buf* bufs[16];
  ASSERT_EQ(pool->alloc(bufs, 16), 16u);
  const auto* base = static_cast<const uint8_t*>(pool->memory().va());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(base) % 4096, 0u);
  for (uint32_t i = 0; i < 16; ++i) {
    // The first allocation comes out in address order.
    EXPECT_EQ(bufs[i]->base, base + i * 2048) << i;
    EXPECT_EQ(bufs[i]->base_iova, pool->memory().iova() + i * 2048) << i;
    EXPECT_EQ(bufs[i]->capacity, 2048u);
    EXPECT_EQ(bufs[i]->offset, 128u);
    EXPECT_EQ(bufs[i]->len, 0u);
    EXPECT_EQ(bufs[i]->pool, pool->handle());
    EXPECT_TRUE(pool->owns(bufs[i]));
    for (uint32_t j = 0; j < 2048; ++j) ASSERT_EQ(bufs[i]->base[j], 0) << "buffer memory is zeroed";
    std::memset(bufs[i]->base, static_cast<int>(i), 2048);
  }
  // Each write stayed in its own buffer.
  for (uint32_t i = 0; i < 16; ++i) EXPECT_EQ(bufs[i]->base[2047], static_cast<uint8_t>(i));
  pool->free(bufs, 16);
  EXPECT_EQ(pool->available(), 16u);
  EXPECT_EQ(pool->misuse_count(), 0u);
}

TEST(BufferPool, OddBufferSizesAreStridedToCacheLines) {
  auto pool = make_pool(software_allocator(), 8, 1500, 64);
  ASSERT_TRUE(pool);
  EXPECT_EQ(pool->stride(), 1536u);
  ufab_buf* bufs[2];
  ASSERT_EQ(pool->alloc(bufs, 2), 2u);
  EXPECT_EQ(bufs[0]->capacity, 1500u);
  EXPECT_EQ(bufs[1]->base - bufs[0]->base, 1536);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(bufs[1]->base) % 64, 0u);
  pool->free(bufs, 2);
}

TEST(BufferPool, AllocHandsOutWhatIsLeftThenNothing) {
  auto pool = make_pool(software_allocator(), 8);
  ASSERT_TRUE(pool);
  ufab_buf* bufs[16] = {};
  EXPECT_EQ(pool->alloc(bufs, 5), 5u);
  EXPECT_EQ(pool->available(), 3u);
  EXPECT_EQ(pool->alloc(bufs + 5, 10), 3u);  // fewer than asked
  EXPECT_EQ(pool->available(), 0u);
  ufab_buf* none[4] = {};
  EXPECT_EQ(pool->alloc(none, 4), 0u);
  EXPECT_EQ(none[0], nullptr);
  std::set<ufab_buf*> distinct(bufs, bufs + 8);
  EXPECT_EQ(distinct.size(), 8u);
  EXPECT_EQ(pool->alloc(bufs, 0), 0u);
  pool->free(bufs, 8);
  EXPECT_EQ(pool->available(), 8u);
  EXPECT_EQ(pool->misuse_count(), 0u);
}

TEST(BufferPool, LastFreedIsFirstReused) {
  auto pool = make_pool(software_allocator(), 8);
  ASSERT_TRUE(pool);
  ufab_buf* bufs[4];
  ASSERT_EQ(pool->alloc(bufs, 4), 4u);
  ufab_buf* back[2] = {bufs[1], bufs[3]};
  pool->free(back, 2);
  ufab_buf* again[2];
  ASSERT_EQ(pool->alloc(again, 2), 2u);
  EXPECT_EQ(again[0], bufs[3]);
  EXPECT_EQ(again[1], bufs[1]);
}

TEST(BufferPool, AllocResetsOffsetLengthFlagsAndUser) {
  auto pool = make_pool(software_allocator(), 2, 2048, 256);
  ASSERT_TRUE(pool);
  ufab_buf* b = nullptr;
  ASSERT_EQ(pool->alloc(&b, 1), 1u);
  EXPECT_EQ(b->offset, 256u);
  b->offset = 14;
  b->len = 1500;
  b->flags = UFAB_BUF_F_RX_CSUM_BAD;
  b->user = 0xdeadbeef;
  pool->free(&b, 1);
  ufab_buf* c = nullptr;
  ASSERT_EQ(pool->alloc(&c, 1), 1u);
  ASSERT_EQ(c, b);
  EXPECT_EQ(c->offset, 256u);
  EXPECT_EQ(c->len, 0u);
  EXPECT_EQ(c->flags, 0u);
  EXPECT_EQ(c->user, 0u);
  // What describes the memory is untouched.
  EXPECT_EQ(c->capacity, 2048u);
  EXPECT_EQ(c->pool, pool->handle());
}

TEST(BufferPool, MisuseIsCountedAndNeverCorruptsThePool) {
  auto allocator = software_allocator();
  auto pool = make_pool(allocator, 4);
  auto other = make_pool(allocator, 4);
  ASSERT_TRUE(pool && other);
  ufab_buf* mine[2];
  ASSERT_EQ(pool->alloc(mine, 2), 2u);
  ufab_buf* theirs = nullptr;
  ASSERT_EQ(other->alloc(&theirs, 1), 1u);

  ufab_buf on_stack{};
  auto* inside_a_header = reinterpret_cast<ufab_buf*>(reinterpret_cast<uint8_t*>(mine[0]) + 8);
  ufab_buf* bad[] = {&on_stack, theirs, nullptr, inside_a_header};
  pool->free(bad, 4);
  EXPECT_EQ(pool->misuse_count(), 4u);
  EXPECT_EQ(pool->available(), 2u);

  pool->free(mine, 2);
  EXPECT_EQ(pool->available(), 4u);
  pool->free(mine, 2);  // double free
  EXPECT_EQ(pool->misuse_count(), 6u);
  EXPECT_EQ(pool->available(), 4u);

  // The pool still hands out each of its buffers exactly once.
  ufab_buf* all[8] = {};
  ASSERT_EQ(pool->alloc(all, 8), 4u);
  std::set<ufab_buf*> distinct(all, all + 4);
  EXPECT_EQ(distinct.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(pool->owns(all[i]));
  EXPECT_FALSE(pool->owns(theirs));
  EXPECT_EQ(other->misuse_count(), 0u);
  other->free(&theirs, 1);
  EXPECT_EQ(other->available(), 4u);
}

TEST(BufferPool, HandleRoundTrips) {
  auto pool = make_pool(software_allocator(), 4);
  ASSERT_TRUE(pool);
  EXPECT_EQ(BufferPool::from_handle(pool->handle()), pool.get());
  EXPECT_EQ(BufferPool::from_handle(nullptr), nullptr);
  ufab_buf* b = nullptr;
  ASSERT_EQ(pool->alloc(&b, 1), 1u);
  // What a plugin does: free through the pool a buffer names.
  BufferPool* owner = BufferPool::from_handle(b->pool);
  ASSERT_EQ(owner, pool.get());
  owner->free(&b, 1);
  EXPECT_EQ(pool->available(), 4u);
}

TEST(BufferPool, RefusesBadParametersWithReasons) {
  auto allocator = software_allocator();
  auto none = BufferPool::create(allocator, 0);
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().code(), EINVAL);
  EXPECT_TRUE(contains(none.error().message(), "at least one buffer")) << none.error().message();
  auto no_room = BufferPool::create(allocator, 4, 128, 128);
  ASSERT_FALSE(no_room);
  EXPECT_TRUE(contains(no_room.error().message(), "headroom")) << no_room.error().message();
  EXPECT_FALSE(BufferPool::create(nullptr, 4));
  EXPECT_EQ(allocator->usage().regions, 0u);
}

// ------------------------------------------------------ over the fake IOMMU

class IommuPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string error;
    container_ = world_.container(&error);
    ASSERT_TRUE(container_) << error;
    Options o;
    o.prefer_hugepages = false;
    o.cached_empty_chunks = 0;
    auto a = DmaAllocator::create(container_, o);
    ASSERT_TRUE(a) << a.error().message();
    allocator_ = *a;
  }
  void TearDown() override {
    allocator_.reset();
    container_.reset();
    EXPECT_EQ(world_.kernel.unmatched_unmaps, 0);
    EXPECT_TRUE(world_.kernel.live_dma_maps().empty());
    EXPECT_EQ(world_.kernel.live_anonymous_bytes(), 0u);
  }

  DmaWorld world_;
  std::shared_ptr<vfio::Container> container_;
  std::shared_ptr<DmaAllocator> allocator_;
};

TEST_F(IommuPoolTest, ASmallPoolSharesAChunkAndItsOneMapping) {
  auto a = make_pool(allocator_, 256);  // 512 KiB
  auto b = make_pool(allocator_, 256);
  ASSERT_TRUE(a && b);
  ASSERT_EQ(world_.kernel.map_calls.size(), 1u);
  const auto map = world_.kernel.map_calls[0];
  ufab_buf* bufs[256];
  ASSERT_EQ(a->alloc(bufs, 256), 256u);
  for (auto* buf : bufs) {
    // Every byte the device may touch lies inside the IOMMU mapping, at the
    // same offset as on the CPU side.
    EXPECT_GE(buf->base_iova, map.iova);
    EXPECT_LE(buf->base_iova + buf->capacity, map.iova + map.size);
    EXPECT_EQ(buf->base_iova - map.iova, reinterpret_cast<uintptr_t>(buf->base) - map.vaddr);
  }
  a->free(bufs, 256);
}

TEST_F(IommuPoolTest, ABigPoolIsOneDedicatedMappingNotOnePerBuffer) {
  auto pool = make_pool(allocator_, 4096);  // 8 MiB
  ASSERT_TRUE(pool);
  ASSERT_EQ(world_.kernel.map_calls.size(), 1u);
  EXPECT_EQ(world_.kernel.map_calls[0].size, 8 * MiB);
  EXPECT_EQ(allocator_->usage().iommu_mappings, 1u);
  ufab_buf* bufs[4096];
  ASSERT_EQ(pool->alloc(bufs, 4096), 4096u);
  EXPECT_EQ(bufs[4095]->base_iova - bufs[0]->base_iova, 4095u * 2048);
  pool->free(bufs, 4096);
  pool.reset();
  EXPECT_TRUE(world_.kernel.live_dma_maps().empty());
  EXPECT_EQ(allocator_->usage().chunks, 0u);
}

TEST_F(IommuPoolTest, APoolKeepsItsMemoryMappedAfterEveryoneElseLetGo) {
  auto pool = make_pool(allocator_, 64);
  ASSERT_TRUE(pool);
  allocator_.reset();
  container_.reset();
  ufab_buf* b = nullptr;
  ASSERT_EQ(pool->alloc(&b, 1), 1u);
  std::memset(b->base, 0x5a, b->capacity);
  EXPECT_EQ(world_.kernel.live_dma_maps().size(), 1u);
  pool->free(&b, 1);
  pool.reset();
  EXPECT_TRUE(world_.kernel.live_dma_maps().empty());
  EXPECT_EQ(world_.kernel.open_fds(), 0u);
}

TEST_F(IommuPoolTest, MemlockFailureNamesThePool) {
  world_.kernel.memlock = {1 * MiB, 1 * MiB};
  auto pool = BufferPool::create(allocator_, 1024);
  ASSERT_FALSE(pool);
  EXPECT_EQ(pool.error().code(), ENOMEM);
  EXPECT_TRUE(contains(pool.error().message(), "pool of 1024 buffers")) << pool.error().message();
  EXPECT_TRUE(contains(pool.error().message(), "RLIMIT_MEMLOCK")) << pool.error().message();
  EXPECT_TRUE(world_.kernel.map_calls.empty());
}

}  // namespace
}  // namespace ufab::dma
