// A pool of fixed-size frame buffers (struct ufab_buf) in DMA memory, the
// thing a driver's RX ring is refilled from and a TX burst is built in.
//
// Single-threaded by design: one pool per queue or per thread, so alloc and
// free are a few loads and stores with no lock and no atomics. Sharing a
// pool between threads needs the caller's own lock. See docs/dma.md.
#pragma once

#include <cstdint>
#include <memory>

#include "base/error.h"
#include "dma/dma.h"
#include "abi/raw_frame.h"

namespace ufab::dma {

class BufferPool {
 public:
  // `count` buffers of `buffer_size` bytes each (ufab_buf.capacity), the
  // frame starting `headroom` bytes in (ufab_buf.offset). All buffers lie in
  // one DMA region from `allocator` (a dedicated mapping when larger than a
  // chunk), one after another at a stride of buffer_size rounded up to 64
  // bytes; the region is 4 KiB aligned, so power-of-two buffers up to 4 KiB
  // never cross a page. Headers (struct ufab_buf) live in ordinary memory.
  static Result<std::unique_ptr<BufferPool>> create(std::shared_ptr<DmaAllocator> allocator, uint32_t count,
                                                    uint32_t buffer_size = 2048, uint32_t headroom = 128);
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // Up to n buffers into out[0..); returns how many (fewer when the pool runs
  // low, 0 when empty). Each comes with offset = headroom, len = 0,
  // flags = 0, user = 0. Last freed, first handed out (cache-warm).
  uint32_t alloc(ufab_buf** out, uint32_t n);
  // Returns the n buffers in bufs[0..n). A pointer that is not one of this
  // pool's buffers, or a buffer that is already free, is skipped and counted
  // in misuse_count(); the pool stays intact.
  void free(ufab_buf* const* bufs, uint32_t n);

  uint32_t available() const { return top_; }
  uint32_t capacity() const { return count_; }
  uint32_t buffer_size() const { return buffer_size_; }
  uint32_t headroom() const { return headroom_; }
  // Bytes between the starts of neighbouring buffers.
  uint32_t stride() const { return stride_; }
  // Frees of foreign pointers, null pointers and double frees so far.
  uint64_t misuse_count() const { return misuse_; }
  // Whether `buf` is one of this pool's headers (free or not).
  bool owns(const ufab_buf* buf) const;
  // The DMA memory the buffers live in.
  const DmaRegion& memory() const { return memory_; }

  // What ufab_buf.pool holds; opaque to plugins.
  ufab_pool* handle() { return reinterpret_cast<ufab_pool*>(this); }
  // The pool behind a handle; nullptr for nullptr or (best effort, by a
  // magic number) a pointer that is not a live pool's handle.
  static BufferPool* from_handle(ufab_pool* h);

 private:
  BufferPool() = default;

  static constexpr uint64_t kMagic = 0x75666162706f6f6cull;  // "ufabpool"
  uint64_t magic_ = kMagic;
  uint32_t count_ = 0;
  uint32_t buffer_size_ = 0;
  uint32_t headroom_ = 0;
  uint32_t stride_ = 0;
  uint32_t top_ = 0;  // stack_[0..top_) are free; stack_[top_ - 1] goes out next
  uint64_t misuse_ = 0;
  std::unique_ptr<ufab_buf[]> bufs_;    // headers, index i <-> buffer i
  std::unique_ptr<ufab_buf*[]> stack_;  // LIFO free list
  std::unique_ptr<uint8_t[]> is_free_;  // per buffer, for double-free detection
  DmaRegion memory_;
};

}  // namespace ufab::dma
