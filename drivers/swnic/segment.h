// swnic shared-memory segment: the layout both ends of a link map.
//
// One POSIX shared memory object per link, "/ufab-swnic-NAME", holds a
// header page, the ring control blocks, and `queues` rings of fixed-size
// slots per direction: direction 0 carries frames from port 0 to port 1,
// direction 1 from port 1 to port 0; ring q of a direction feeds the
// receiver's RX queue q. Everything here is plain data plus lock-free
// atomics, so two processes (or two threads) mapping the object with
// MAP_SHARED agree on it.
//
//   offset 0      SegHeader (magic written last, with release ordering)
//   offset 4096   RingCtl of (direction d, queue q) at 4096 + (d * 16 + q) * 256:
//                 head, tail, waiting/futex word, injection counters, one
//                 cache line each (room for kMaxQueues whatever `queues` is)
//   offset 12288  direction 0: ring 0 slots, ring 1 slots, ... (each ring x
//   ...           stride bytes, rounded up to 4 KiB); then direction 1
//
// Seen from the segment, every ring is single-producer/single-consumer:
// the sending port publishes `head` (frames written), the receiving port's
// RX queue publishes `tail` (frames consumed). The sending port may feed one
// ring from several TX queues (threads); they agree among themselves, in
// the sender's private memory, on who writes which slots and in which order
// `head` moves (swnic.cc, "TX"), so nothing in the segment needs a
// compare-and-swap, and a peer cannot stall them by writing to it.
//
// A slot is {u32 len; u32 reserved; bytes[slot_size]}, stride rounded up to
// a cache line. Nothing read from the segment is trusted: the peer is another
// process, and the reader checks every length and index before use.
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
inline constexpr uint32_t kVersion = 2;  // 2: `queues` rings per direction

inline constexpr size_t kCacheLine = 64;
inline constexpr size_t kPage = 4096;
inline constexpr uint32_t kSlotHeader = 8;  // u32 len + u32 reserved

inline constexpr uint32_t kMinRing = 2;
inline constexpr uint32_t kMaxRing = 32768;
inline constexpr uint32_t kDefaultRing = 1024;
inline constexpr uint32_t kMinSlotSize = 1518;
inline constexpr uint32_t kMaxSlotSize = 65536;
inline constexpr uint32_t kDefaultSlotSize = 2048;
inline constexpr uint32_t kMaxQueues = 16;  // RX/TX queues per port ("queues" parameter)
inline constexpr uint32_t kDefaultQueues = 1;

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
  uint32_t queues;             // rings per direction = RX and TX queues per port, 1..kMaxQueues
  uint32_t reserved1;
  uint64_t ring_bytes;         // bytes from one ring's slots to the next ring's
  // Receive steering of each port (rx_steer), read by the peer's tx_burst:
  // steer_word(mode, nqueues); 0 is UFAB_STEER_NONE. Written only by the
  // port itself; the reader checks it (a bad word steers to queue 0).
  std::atomic<uint32_t> steer[2];
};

// Control block of one ring. The producing port owns head, the consumer
// owns tail; the injection counters are the producing port's (added to by
// any of its TX queues); `waiting` is set by the consumer when it is about
// to sleep and cleared by the producer that wakes it.
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

inline constexpr size_t kHeaderBytes = kPage;  // the SegHeader's page, mapped first by an opener
inline constexpr size_t kRingCtlStride = 256;
inline constexpr size_t kRingCtlOffset = kPage;
inline constexpr size_t kSlotsOffset = kRingCtlOffset + 2 * kMaxQueues * kRingCtlStride;

static_assert(sizeof(SegHeader) <= kHeaderBytes);
static_assert(sizeof(RingCtl) <= kRingCtlStride);
static_assert(kSlotsOffset % kPage == 0);

// Receive steering as SegHeader::steer holds it.
constexpr uint32_t steer_word(uint32_t mode, uint32_t nqueues) { return mode << 16 | (nqueues & 0xffff); }
constexpr uint32_t steer_mode(uint32_t word) { return word >> 16; }
constexpr uint32_t steer_nqueues(uint32_t word) { return word & 0xffff; }

constexpr uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
constexpr bool is_pow2(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

// Where everything lies for a given ring and slot size.
struct Layout {
  uint32_t ring = 0;
  uint32_t slot_size = 0;
  uint32_t queues = 0;
  uint32_t stride = 0;
  uint64_t ring_bytes = 0;
  uint64_t slots_offset[2] = {0, 0};  // ring 0 of each direction; ring q is q * ring_bytes further
  uint64_t total_size = 0;
};

constexpr bool layout_params_valid(uint32_t ring, uint32_t slot_size, uint32_t queues = 1) {
  return is_pow2(ring) && ring >= kMinRing && ring <= kMaxRing && slot_size >= kMinSlotSize &&
         slot_size <= kMaxSlotSize && queues >= 1 && queues <= kMaxQueues;
}

constexpr Layout make_layout(uint32_t ring, uint32_t slot_size, uint32_t queues = 1) {
  Layout l;
  l.ring = ring;
  l.slot_size = slot_size;
  l.queues = queues;
  l.stride = static_cast<uint32_t>(align_up(uint64_t{kSlotHeader} + slot_size, kCacheLine));
  l.ring_bytes = align_up(uint64_t{ring} * l.stride, kPage);
  l.slots_offset[0] = kSlotsOffset;
  l.slots_offset[1] = kSlotsOffset + queues * l.ring_bytes;
  l.total_size = kSlotsOffset + 2 * queues * l.ring_bytes;
  return l;
}

inline SegHeader* header_of(void* base) { return static_cast<SegHeader*>(base); }
// Control block of ring `queue` of direction `dir` (0: port 0 -> port 1).
inline RingCtl* ring_ctl_of(void* base, int dir, uint32_t queue = 0) {
  return reinterpret_cast<RingCtl*>(static_cast<uint8_t*>(base) + kRingCtlOffset +
                                    (static_cast<size_t>(dir) * kMaxQueues + queue) * kRingCtlStride);
}

}  // namespace ufab::swnic
