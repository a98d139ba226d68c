// The driver side of a virtio split virtqueue (virtio 1.1, section 2.6),
// over any memory: DMA memory in the driver, plain memory in unit tests
// (where the test plays the device).
//
// One descriptor per buffer (add), or a chain of device-readable
// descriptors linked by VIRTQ_DESC_F_NEXT for a buffer in several pieces
// (add_chain: gather transmit); no indirect tables, no event index: exactly
// what the virtio-net driver negotiates. The ring memory is one block laid
// out by RingLayout:
//
//   desc  [size] x 16 bytes  {le64 addr; le32 len; le16 flags; le16 next}  align 16
//   avail {le16 flags; le16 idx; le16 ring[size]; le16 used_event}         align 2
//   used  {le16 flags; le16 idx; {le32 id; le32 len}[size]; le16 avail_event} align 4
//
// Indices are free-running 16-bit counters (2.6.6, 2.6.8): the slot is
// idx % size, and `used.idx - last_used` counts new entries across the
// 65535 -> 0 wrap because size is a power of two dividing 65536.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "vfio/mmio.h"  // also brings Status (base/error.h)

namespace ufab::virtio {

// 2.6.5 descriptor flags, 2.6.6 avail flags, 2.6.8 used flags.
inline constexpr uint16_t kDescFlagNext = 1;
inline constexpr uint16_t kDescFlagWrite = 2;  // device writes (RX buffers)
inline constexpr uint16_t kAvailFlagNoInterrupt = 1;
inline constexpr uint16_t kUsedFlagNoNotify = 1;

// The largest split queue the spec allows (2.6: Queue Size <= 32768).
inline constexpr uint32_t kMaxQueueSize = 32768;
// Alignment asked of the ring block; more than 2.6's 16/2/4 so the block
// starts on a page and the used ring (device-written) starts on its own
// cache line, away from the driver-written avail ring.
inline constexpr size_t kRingBlockAlign = 4096;

struct RingLayout {
  uint32_t size = 0;
  size_t desc = 0;   // offsets in the block
  size_t avail = 0;
  size_t used = 0;
  size_t bytes = 0;  // total block size
  static RingLayout for_size(uint32_t size);
};

// One piece of a chained buffer: device address and length.
struct Piece {
  uint64_t addr;
  uint32_t len;
};

// A buffer the device has finished with.
struct Completion {
  void* cookie;  // what add() was given
  uint32_t len;  // bytes the device wrote into it (used.len; 0 for TX)
};

class SplitQueue {
 public:
  SplitQueue() = default;
  SplitQueue(const SplitQueue&) = delete;
  SplitQueue& operator=(const SplitQueue&) = delete;

  // `va` is zeroed memory of at least RingLayout::for_size(size).bytes,
  // 16-byte aligned; `iova` is the device's address of the same block.
  // size: a power of two in 1..32768.
  Status init(uint32_t size, void* va, uint64_t iova, size_t bytes);

  uint16_t size() const { return size_; }
  // Descriptors, not buffers: a chain of n pieces takes n.
  uint16_t free_count() const { return free_top_; }
  uint16_t in_flight() const { return size_ - free_top_; }
  uint64_t desc_iova() const { return iova_ + layout_.desc; }
  uint64_t avail_iova() const { return iova_ + layout_.avail; }
  uint64_t used_iova() const { return iova_ + layout_.used; }

  // Writes one descriptor and its avail ring slot; invisible to the device
  // until publish(). False when every descriptor is in flight.
  bool add(uint64_t addr, uint32_t len, bool device_writes, void* cookie) {
    if (free_top_ == 0) return false;
    uint16_t id = free_[--free_top_];
    write_desc(id, addr, len, device_writes ? kDescFlagWrite : 0, 0);
    announce(id, cookie, 1);
    return true;
  }

  // One buffer in `n` device-readable pieces, in order (2.6.4 "Message
  // Framing": the device sees their concatenation, however it is split): a
  // descriptor each, every one but the last with VIRTQ_DESC_F_NEXT and
  // `next` naming the following one (2.6.5, 2.6.13.1), one avail slot for
  // the head. The
  // device returns the chain as one used entry naming the head; reap()
  // then frees all n descriptors. Writes nothing and returns false unless
  // n is 1..size and n descriptors are free (never part of a chain).
  bool add_chain(const Piece* pieces, uint16_t n, void* cookie) {
    if (n == 0 || n > free_top_) return false;
    uint16_t head = free_[free_top_ - 1];
    uint16_t id = head;
    for (uint16_t k = 0; k < n; ++k) {
      --free_top_;
      bool more = k + 1 < n;
      uint16_t next = more ? free_[free_top_ - 1] : 0;
      write_desc(id, pieces[k].addr, pieces[k].len, more ? kDescFlagNext : 0, next);
      chain_next_[id] = next;
      slots_[id] = Slot{};  // a member is never in flight on its own
      id = next;
    }
    announce(head, cookie, n);
    return true;
  }

  // Makes everything add()ed so far visible: the descriptor and ring-slot
  // stores must reach memory before the index store that hands them over
  // (2.6.13.3: "the driver MUST perform a suitable memory barrier before
  // the idx update"). One barrier and one store per burst.
  void publish() {
    if (avail_shadow_ == avail_published_) return;
    vfio::barrier::descriptors_before_index_publish();
    avail_idx_.write(avail_shadow_);
    avail_published_ = avail_shadow_;
  }

  // Whether the device asked to be notified (used.flags lacks NO_NOTIFY).
  // The full barrier orders the avail.idx store before the flags load
  // (2.6.13.4, 2.6.7.2): without it the CPU may read a stale "don't notify"
  // from before the device re-enabled notifications, and both sides sleep.
  bool device_wants_notify() const {
    vfio::barrier::full();
    return !(used_flags_.read() & kUsedFlagNoNotify);
  }

  // New used entries since the last reap (a volatile read of used.idx).
  uint16_t used_pending() const { return static_cast<uint16_t>(used_idx_.read() - last_used_); }

  // Takes up to `max` finished buffers, in the order the device used them,
  // and recycles their descriptors. Entries naming a descriptor that is not
  // in flight are skipped and counted in bad_used().
  uint16_t reap(Completion* out, uint16_t max) {
    uint16_t pending = static_cast<uint16_t>(used_idx_.read() - last_used_);
    if (pending == 0) return 0;
    // used.idx was read first; the entries it covers must not be read (nor
    // the buffers' contents) from before that load.
    vfio::barrier::device_status_before_descriptor_reads();
    uint16_t n = 0;
    for (uint16_t i = 0; i < pending && n < max; ++i) {
      const volatile uint8_t* e = used_ring_ + size_t{static_cast<uint16_t>(last_used_ & mask_)} * 8;
      uint32_t id = le32toh(*reinterpret_cast<const volatile uint32_t*>(e));
      uint32_t len = le32toh(*reinterpret_cast<const volatile uint32_t*>(e + 4));
      ++last_used_;
      if (id >= size_ || !slots_[id].busy) {
        ++bad_used_;  // out of range, not in flight, or a chain member (not its head)
        continue;
      }
      Slot& s = slots_[id];
      s.busy = false;
      out[n++] = Completion{s.cookie, len};
      release_chain(static_cast<uint16_t>(id), s.count);
    }
    return n;
  }

  // avail.flags NO_INTERRUPT: a hint to the device (2.6.7) that the driver
  // polls. Without EVENT_IDX this flag is the whole interrupt suppression.
  void set_interrupts(bool enabled) { avail_flags_.write(enabled ? 0 : kAvailFlagNoInterrupt); }

  // Enables interrupts and reports whether used entries were already
  // waiting: those were (or may have been) written while interrupts were
  // off, so no interrupt will announce them and the caller must not sleep.
  // The full barrier orders the flags store before the used.idx load.
  bool arm_interrupts() {
    set_interrupts(true);
    vfio::barrier::full();
    return used_pending() != 0;
  }

  // Device entries that named no in-flight descriptor (a device bug).
  uint64_t bad_used() const { return bad_used_; }
  uint16_t avail_idx() const { return avail_shadow_; }
  uint16_t last_used() const { return last_used_; }

  // After the device was reset: hands every in-flight cookie to `each` and
  // zeroes the ring, back to the state right after init().
  template <typename Fn>
  void reset(Fn&& each) {
    for (uint32_t id = 0; id < size_; ++id)
      if (slots_[id].busy) {
        slots_[id].busy = false;
        each(slots_[id].cookie);
      }
    clear();
  }

 private:
  // Per descriptor id; only a buffer's head descriptor is busy.
  struct Slot {
    void* cookie = nullptr;
    uint16_t count = 0;  // descriptors in the buffer's chain (1 without one)
    bool busy = false;
  };
  void clear();

  void write_desc(uint16_t id, uint64_t addr, uint32_t len, uint16_t flags, uint16_t next) {
    volatile uint8_t* d = desc_ + size_t{id} * 16;
    *reinterpret_cast<volatile uint64_t*>(d) = htole64(addr);
    *reinterpret_cast<volatile uint32_t*>(d + 8) = htole32(len);
    *reinterpret_cast<volatile uint16_t*>(d + 12) = htole16(flags);
    *reinterpret_cast<volatile uint16_t*>(d + 14) = htole16(next);
  }
  // Puts the buffer whose chain starts at `head` into the next avail slot.
  void announce(uint16_t head, void* cookie, uint16_t count) {
    avail_ring_[avail_shadow_ & mask_] = htole16(head);
    ++avail_shadow_;
    slots_[head] = Slot{cookie, count, true};
  }
  // Returns the `count` descriptors of the chain starting at `head` to the
  // free stack, following the driver's own copy of the links (chain_next_),
  // never the table the device can reach.
  void release_chain(uint16_t head, uint16_t count) {
    uint16_t id = head;
    for (uint16_t k = 0; k < count; ++k) {
      free_[free_top_++] = id;
      id = chain_next_[id];
    }
  }

  RingLayout layout_;
  uint8_t* base_ = nullptr;
  uint64_t iova_ = 0;
  uint16_t size_ = 0;
  uint16_t mask_ = 0;
  volatile uint8_t* desc_ = nullptr;
  volatile uint16_t* avail_ring_ = nullptr;
  const volatile uint8_t* used_ring_ = nullptr;
  vfio::Reg16 avail_flags_, avail_idx_, used_flags_, used_idx_;
  uint16_t avail_shadow_ = 0;     // next avail.idx
  uint16_t avail_published_ = 0;  // last value stored to avail.idx
  uint16_t last_used_ = 0;        // next used entry to read
  std::vector<Slot> slots_;
  std::vector<uint16_t> free_;  // stack of free descriptor ids
  std::vector<uint16_t> chain_next_;  // per id: the next descriptor of its chain
  uint16_t free_top_ = 0;
  uint64_t bad_used_ = 0;
};

}  // namespace ufab::virtio
