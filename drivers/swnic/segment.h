// swnic shared-memory segment: the layout both ends of a link map.
//
// One POSIX shared memory object per link, "/ufab-swnic-NAME", holds a
// header page and two single-producer/single-consumer rings of fixed-size
// slots: ring 0 carries frames from port 0 to port 1, ring 1 from port 1 to
// port 0. Everything here is plain data plus lock-free atomics, so two
// processes (or two threads) mapping the object with MAP_SHARED agree on it.
//
//   offset 0      SegHeader (magic written last, with release ordering)
//   offset 1024   RingCtl for ring 0 (head, tail, waiting/futex word,
//   offset 1536   RingCtl for ring 1  injection counters; one cache line each)
//   offset 4096   ring 0 slots: ring x stride bytes, rounded up to 4 KiB
//   ...           ring 1 slots
//
// A slot is {u32 len; u32 reserved; bytes[slot_size]}, stride rounded up to
// a cache line. Nothing read from the segment is trusted: the peer is
// another process, and the reader checks every length and index before use.
//
// Also used by the unit tests, which tamper with a segment to play a
// hostile peer. See docs/drivers/swnic.md.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace ufab::swnic {

inline constexpr uint32_t kMagic = 0x314e5753;      // "SWN1" little-endian
inline constexpr uint32_t kDeadMagic = 0x44414544;  // "DEAD": last end closed, name unlinked
inline constexpr uint32_t kVersion = 1;

inline constexpr size_t kCacheLine = 64;
inline constexpr size_t kPage = 4096;
inline constexpr uint32_t kSlotHeader = 8;  // u32 len + u32 reserved

inline constexpr uint32_t kMinRing = 2;
inline constexpr uint32_t kMaxRing = 32768;
inline constexpr uint32_t kDefaultRing = 1024;
inline constexpr uint32_t kMinSlotSize = 1518;
inline constexpr uint32_t kMaxSlotSize = 65536;
inline constexpr uint32_t kDefaultSlotSize = 2048;

inline constexpr const char* kShmPrefix = "/ufab-swnic-";

static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<int32_t>::is_always_lock_free);

// One port's presence. Written only under the segment's lock (flock on the
// shm descriptor); read without it by the peer's link() and tx_burst().
struct PortState {
  std::atomic<uint32_t> present;     // 1 while a process has this port open
  std::atomic<int32_t> pid;          // that process
  std::atomic<uint64_t> start_time;  // its start time (/proc/PID/stat field 22), 0 if unknown
};

struct SegHeader {
  std::atomic<uint32_t> magic;  // kMagic once initialised, kDeadMagic after the last close
  uint32_t version;             // kVersion
  uint32_t ring;                // slots per direction, a power of two
  uint32_t slot_size;           // largest frame a slot holds, bytes
  uint32_t stride;              // bytes from one slot to the next
  uint32_t reserved0;
  uint64_t total_size;       // bytes of the whole object
  uint64_t slots_offset[2];  // where each ring's slots begin
  std::atomic<int32_t> creator_pid;
  std::atomic<uint32_t> refs;  // ports open (0, 1 or 2)
  PortState port[2];
};

// Control block of one ring. The producer owns head and the injection
// counters, the consumer owns tail; `waiting` is set by the consumer when it
// is about to sleep and cleared by the producer that wakes it.
struct RingCtl {
  alignas(kCacheLine) std::atomic<uint64_t> head;      // frames published (producer)
  alignas(kCacheLine) std::atomic<uint64_t> tail;      // frames consumed (consumer)
  alignas(kCacheLine) std::atomic<uint32_t> waiting;   // consumer armed its interrupt
  std::atomic<uint32_t> wake_seq;                      // futex word, bumped on each wake-up
  alignas(kCacheLine) std::atomic<uint64_t> inj_loss;  // frames dropped by injection
  std::atomic<uint64_t> inj_dup;                       // extra copies sent
  std::atomic<uint64_t> inj_reorder;                   // frames held back behind the next one
  std::atomic<uint64_t> inj_corrupt;                   // frames with one bit flipped
};

inline constexpr size_t kRingCtlOffset[2] = {1024, 1536};
inline constexpr size_t kHeaderBytes = kPage;

static_assert(sizeof(SegHeader) <= kRingCtlOffset[0]);
static_assert(sizeof(RingCtl) <= kRingCtlOffset[1] - kRingCtlOffset[0]);
static_assert(kRingCtlOffset[1] + sizeof(RingCtl) <= kHeaderBytes);

constexpr uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
constexpr bool is_pow2(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

// Where everything lies for a given ring and slot size.
struct Layout {
  uint32_t ring = 0;
  uint32_t slot_size = 0;
  uint32_t stride = 0;
  uint64_t slots_offset[2] = {0, 0};
  uint64_t total_size = 0;
};

constexpr bool layout_params_valid(uint32_t ring, uint32_t slot_size) {
  return is_pow2(ring) && ring >= kMinRing && ring <= kMaxRing && slot_size >= kMinSlotSize &&
         slot_size <= kMaxSlotSize;
}

constexpr Layout make_layout(uint32_t ring, uint32_t slot_size) {
  Layout l;
  l.ring = ring;
  l.slot_size = slot_size;
  l.stride = static_cast<uint32_t>(align_up(uint64_t{kSlotHeader} + slot_size, kCacheLine));
  uint64_t ring_bytes = align_up(uint64_t{ring} * l.stride, kPage);
  l.slots_offset[0] = kHeaderBytes;
  l.slots_offset[1] = kHeaderBytes + ring_bytes;
  l.total_size = kHeaderBytes + 2 * ring_bytes;
  return l;
}

inline SegHeader* header_of(void* base) { return static_cast<SegHeader*>(base); }
inline RingCtl* ring_ctl_of(void* base, int ring) {
  return reinterpret_cast<RingCtl*>(static_cast<uint8_t*>(base) + kRingCtlOffset[ring]);
}

}  // namespace ufab::swnic
