#include "drivers/virtio_net/virtqueue.h"

#include <cstring>
#include <string>

namespace ufab::virtio {
namespace {

size_t align_up(size_t v, size_t a) { return (v + a - 1) & ~(a - 1); }

}  // namespace

RingLayout RingLayout::for_size(uint32_t size) {
  RingLayout l;
  l.size = size;
  l.desc = 0;
  l.avail = size_t{16} * size;                      // desc table: 16-byte aligned at 0
  size_t avail_end = l.avail + 4 + 2 * size_t{size} + 2;  // flags, idx, ring, used_event
  l.used = align_up(avail_end, 64);                 // spec needs 4; 64 = own cache line
  l.bytes = l.used + 4 + 8 * size_t{size} + 2;      // flags, idx, ring, avail_event
  return l;
}

Status SplitQueue::init(uint32_t size, void* va, uint64_t iova, size_t bytes) {
  if (size == 0 || size > kMaxQueueSize || (size & (size - 1)) != 0)
    return fail(EINVAL, "virtqueue size " + std::to_string(size) +
                            " is not a power of two in 1..32768 (virtio 1.1 2.6); pick e.g. 256");
  RingLayout layout = RingLayout::for_size(size);
  if (va == nullptr || bytes < layout.bytes)
    return fail(EINVAL, "virtqueue of " + std::to_string(size) + " entries needs " + std::to_string(layout.bytes) +
                            " bytes of ring memory, got " + std::to_string(bytes));
  if (reinterpret_cast<uintptr_t>(va) % 16 != 0 || iova % 16 != 0)
    return fail(EINVAL, "virtqueue memory must be 16-byte aligned (virtio 1.1 2.6: descriptor table alignment)");

  vfio::Mmio mem(va, layout.bytes);
  auto af = mem.reg16(layout.avail);
  auto ai = mem.reg16(layout.avail + 2);
  auto uf = mem.reg16(layout.used);
  auto ui = mem.reg16(layout.used + 2);
  if (!af || !ai || !uf || !ui) return fail(EINVAL, "virtqueue ring layout does not fit its memory block");

  layout_ = layout;
  base_ = static_cast<uint8_t*>(va);
  iova_ = iova;
  size_ = static_cast<uint16_t>(size == kMaxQueueSize ? kMaxQueueSize : size);
  mask_ = static_cast<uint16_t>(size - 1);
  desc_ = base_ + layout.desc;
  avail_ring_ = reinterpret_cast<volatile uint16_t*>(base_ + layout.avail + 4);
  used_ring_ = base_ + layout.used + 4;
  avail_flags_ = *af;
  avail_idx_ = *ai;
  used_flags_ = *uf;
  used_idx_ = *ui;
  slots_.assign(size, Slot{});
  free_.assign(size, 0);
  chain_next_.assign(size, 0);
  bad_used_ = 0;
  clear();
  return {};
}

void SplitQueue::clear() {
  std::memset(base_, 0, layout_.bytes);
  avail_shadow_ = avail_published_ = last_used_ = 0;
  // Hand out low ids first (a stack: top of the stack is id 0).
  free_top_ = size_;
  for (uint32_t i = 0; i < size_; ++i) free_[i] = static_cast<uint16_t>(size_ - 1 - i);
  for (auto& s : slots_) s = Slot{};
}

}  // namespace ufab::virtio
