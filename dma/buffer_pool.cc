#include "dma/buffer_pool.h"

#include <cerrno>
#include <string>

#include "vfio/text.h"

namespace ufab::dma {

namespace {
constexpr uint32_t kStrideAlign = 64;   // cache line: no two buffers share one
constexpr size_t kRegionAlign = 4096;   // page: small power-of-two buffers never straddle a page
constexpr uint32_t kMaxBufferSize = 1u << 30;  // keeps the stride arithmetic far from overflow
}  // namespace

Result<std::unique_ptr<BufferPool>> BufferPool::create(std::shared_ptr<DmaAllocator> allocator, uint32_t count,
                                                       uint32_t buffer_size, uint32_t headroom) {
  const std::string what = "creating a pool of " + std::to_string(count) + " buffers of " +
                           std::to_string(buffer_size) + " bytes";
  if (!allocator) return fail(EINVAL, what + ": no DMA allocator given");
  if (count == 0) return fail(EINVAL, what + ": a pool needs at least one buffer");
  if (headroom >= buffer_size)
    return fail(EINVAL, what + ": the headroom (" + std::to_string(headroom) +
                            " bytes) leaves no room for a frame; make buffer_size larger than the headroom");
  if (buffer_size > kMaxBufferSize)
    return fail(EINVAL, what + ": buffers are limited to " + vfio::bytes(kMaxBufferSize) + " each");
  const uint32_t stride = (buffer_size + kStrideAlign - 1) & ~(kStrideAlign - 1);
  const uint64_t total = uint64_t{count} * stride;

  // One region for all buffers: inside a shared chunk when it fits, else one
  // dedicated mapping. Either way one IOMMU mapping at most, not one per buffer.
  auto memory = allocator->allocate(total, kRegionAlign);  // chunks are at least a page, so this is allowed
  if (!memory) return std::unexpected(memory.error().context(what));

  std::unique_ptr<BufferPool> pool(new BufferPool());
  pool->count_ = count;
  pool->buffer_size_ = buffer_size;
  pool->headroom_ = headroom;
  pool->stride_ = stride;
  pool->bufs_ = std::make_unique<ufab_buf[]>(count);
  pool->stack_ = std::make_unique<ufab_buf*[]>(count);
  pool->is_free_ = std::make_unique<uint8_t[]>(count);
  pool->memory_ = std::move(*memory);

  auto* base = static_cast<uint8_t*>(pool->memory_.va());
  const uint64_t base_iova = pool->memory_.iova();
  ufab_pool* handle = pool->handle();
  for (uint32_t i = 0; i < count; ++i) {
    ufab_buf& b = pool->bufs_[i];
    b.base = base + uint64_t{i} * stride;
    b.base_iova = base_iova + uint64_t{i} * stride;
    b.capacity = buffer_size;
    b.offset = headroom;
    b.len = 0;
    b.flags = 0;
    b.user = 0;
    b.pool = handle;
    // Pushed in reverse so the first allocations come out in address order.
    pool->stack_[count - 1 - i] = &b;
    pool->is_free_[i] = 1;
  }
  pool->top_ = count;
  return pool;
}

BufferPool::~BufferPool() {
  // A dangling handle should not look like a live pool to from_handle().
  magic_ = 0;
}

bool BufferPool::owns(const ufab_buf* buf) const {
  auto p = reinterpret_cast<uintptr_t>(buf);
  auto first = reinterpret_cast<uintptr_t>(bufs_.get());
  if (p < first) return false;
  uintptr_t delta = p - first;
  return delta / sizeof(ufab_buf) < count_ && delta % sizeof(ufab_buf) == 0;
}

uint32_t BufferPool::alloc(ufab_buf** out, uint32_t n) {
  const uint32_t take = n < top_ ? n : top_;
  for (uint32_t i = 0; i < take; ++i) {
    ufab_buf* b = stack_[--top_];
    is_free_[b - bufs_.get()] = 0;
    b->offset = headroom_;
    b->len = 0;
    b->flags = 0;
    b->user = 0;
    out[i] = b;
  }
  return take;
}

void BufferPool::free(ufab_buf* const* bufs, uint32_t n) {
  for (uint32_t i = 0; i < n; ++i) {
    ufab_buf* b = bufs[i];
    // The range check keeps a foreign pointer from being pushed (and later
    // handed out); the flag keeps a double free from putting one buffer on
    // the stack twice (two owners of one buffer, and an overflowing stack).
    if (!owns(b)) {
      ++misuse_;
      continue;
    }
    uint8_t& is_free = is_free_[b - bufs_.get()];
    if (is_free) {
      ++misuse_;
      continue;
    }
    is_free = 1;
    stack_[top_++] = b;
  }
}

BufferPool* BufferPool::from_handle(ufab_pool* h) {
  if (h == nullptr) return nullptr;
  auto* pool = reinterpret_cast<BufferPool*>(h);
  return pool->magic_ == kMagic ? pool : nullptr;
}

}  // namespace ufab::dma
