// Pure logic of the e1000e driver, kept apart so it can be unit-tested
// without a device: ring index arithmetic, legacy descriptor images, and the
// accumulation of the device's clear-on-read statistics.
#pragma once

#include <endian.h>

#include <cstdint>

#include "drivers/e1000e/regs.h"

namespace ufab::e1000e {

// ------------------------------------------------------------ ring sizes

// A ring size the driver accepts: a power of two in [kMinRing, kMaxRing].
// That also makes RDLEN/TDLEN (size * 16 bytes) a multiple of 128 as the
// datasheet requires, and the size a multiple of 8 descriptors.
constexpr bool valid_ring_size(uint32_t n) { return n >= kMinRing && n <= kMaxRing && (n & (n - 1)) == 0; }

// Index arithmetic on a power-of-two ring. The driver owns slots in
// [head, tail) (e1000e semantics: the device owns [HEAD, TAIL), software
// the rest); one slot always stays empty so that head == tail means empty.
struct Ring {
  uint32_t size = 0;  // power of two
  uint32_t mask() const { return size - 1; }
  uint32_t next(uint32_t i) const { return (i + 1) & mask(); }
  uint32_t add(uint32_t i, uint32_t n) const { return (i + n) & mask(); }
  // Slots from `from` up to (not including) `to`, going forward.
  uint32_t distance(uint32_t from, uint32_t to) const { return (to - from) & mask(); }
  // Most slots that can be in use at once.
  uint32_t capacity() const { return size - 1; }
  uint32_t free_after(uint32_t in_use) const { return capacity() - in_use; }
  // How many of `want` slots starting at `at` lie before the end of the
  // array (the rest wrap around to slot 0).
  uint32_t contiguous(uint32_t at, uint32_t want) const {
    uint32_t room = size - at;
    return want < room ? want : room;
  }
};

// ------------------------------------------------------------ descriptors

// Legacy transmit descriptor as the device reads it (little-endian).
struct TxDesc {
  uint64_t addr;
  uint32_t lower;  // length 15:0, CSO 23:16, CMD 31:24
  uint32_t upper;  // STA 7:0 (DD bit 0), CSS 15:8, special 31:16
};
static_assert(sizeof(TxDesc) == kDescBytes);

// Legacy receive descriptor (little-endian).
struct RxDesc {
  uint64_t addr;
  uint16_t length;
  uint16_t csum;
  uint8_t status;
  uint8_t errors;
  uint16_t special;
};
static_assert(sizeof(RxDesc) == kDescBytes);

// The CMD byte of one of a frame's descriptors. Datasheet 7.2, "Legacy
// Transmit Descriptor Format" (command field): a frame may span several
// descriptors and EOP marks its last one; IFCS is read only where EOP is
// set; the device writes DD back only to descriptors with RS. So a frame's
// last descriptor carries EOP|IFCS|RS (append the CRC, report when done)
// and the ones before it carry nothing: DD on the last one then means the
// device has read every buffer of the frame (descriptors are processed in
// ring order). QEMU follows the same rules (e1000e_txdesc_writeback).
constexpr uint8_t tx_cmd(bool last) { return last ? uint8_t{kTxCmdEop | kTxCmdIfcs | kTxCmdRs} : uint8_t{0}; }

// The "lower" word: length 15:0, CMD 31:24. By default the frame's only
// (hence last) descriptor.
constexpr uint32_t tx_lower(uint32_t len, bool last = true) {
  return (len & 0xffffu) | uint32_t{tx_cmd(last)} << 24;
}

// Descriptors live in DMA memory the device writes behind the compiler's
// back: every access is volatile and exactly as wide as the field.
inline void tx_fill(volatile TxDesc* d, uint64_t iova, uint32_t len, bool last = true) {
  d->addr = htole64(iova);
  d->lower = htole32(tx_lower(len, last));
  d->upper = 0;  // clears DD from the slot's previous use
}
inline bool tx_done(const volatile TxDesc* d) { return (le32toh(d->upper) & kTxStaDd) != 0; }

// Hands a receive buffer to the device: address, and a cleared write-back
// half (the device only sets DD; a stale DD would read as a new frame).
inline void rx_post(volatile RxDesc* d, uint64_t iova) {
  d->addr = htole64(iova);
  auto* upper = reinterpret_cast<volatile uint64_t*>(reinterpret_cast<volatile uint8_t*>(d) + 8);
  *upper = 0;
}
inline uint8_t rx_status(const volatile RxDesc* d) { return d->status; }
inline uint8_t rx_errors(const volatile RxDesc* d) { return d->errors; }
inline uint16_t rx_length(const volatile RxDesc* d) { return le16toh(d->length); }

// ------------------------------------------------------------- statistics

// One read of the device's statistics registers (each clear-on-read, so a
// snapshot holds the counts since the previous one).
struct CounterSnapshot {
  uint32_t gprc = 0, gptc = 0, tpr = 0, tpt = 0;
  uint64_t gorc = 0, gotc = 0, tor = 0, tot = 0;  // octets, CRC included
  uint32_t mpc = 0, rnbc = 0, crcerrs = 0, rxerrc = 0, ecol = 0, latecol = 0;
};

// Joins the two halves of a 64-bit counter (read low first, then high).
constexpr uint64_t join64(uint32_t low, uint32_t high) { return uint64_t{high} << 32 | low; }

// Counts since open: device snapshots summed, plus what the driver counted
// itself (frames handed out / taken, no-buffer events) for cross-checking.
struct StatsTotals {
  // From the device.
  uint64_t rx_good = 0, tx_good = 0, rx_total = 0, tx_total = 0;
  uint64_t rx_octets = 0, tx_octets = 0;  // with 4 CRC bytes per frame
  uint64_t rx_missed = 0, rx_no_buf = 0, rx_crc_errors = 0, rx_errors = 0;
  uint64_t tx_collisions = 0;
  // Counted by the driver.
  uint64_t sw_rx_packets = 0, sw_rx_bytes = 0, sw_tx_packets = 0, sw_tx_bytes = 0;
  uint64_t sw_rx_no_buffer = 0;  // receive slots left empty: the pool ran dry
  uint64_t sw_rx_errors = 0;     // descriptors with frame errors, dropped
  uint64_t sw_tx_rejected = 0;   // frames refused by tx_burst (bad length)
  uint64_t irqs = 0;

  void add(const CounterSnapshot& s) {
    rx_good += s.gprc;
    tx_good += s.gptc;
    rx_total += s.tpr;
    tx_total += s.tpt;
    rx_octets += s.gorc;
    tx_octets += s.gotc;
    rx_missed += s.mpc;
    rx_no_buf += s.rnbc;
    rx_crc_errors += s.crcerrs;
    rx_errors += s.rxerrc;
    tx_collisions += s.ecol + s.latecol;
  }

  // Frame bytes as the application sees them (no CRC): the device counts 4
  // CRC bytes per good frame in GORC/GOTC.
  static uint64_t without_crc(uint64_t octets, uint64_t frames) {
    return octets >= 4 * frames ? octets - 4 * frames : 0;
  }
  uint64_t rx_bytes() const { return without_crc(rx_octets, rx_good); }
  uint64_t tx_bytes() const { return without_crc(tx_octets, tx_good); }
  uint64_t dropped() const { return rx_missed + sw_rx_no_buffer; }
  uint64_t errors_rx() const { return rx_crc_errors + rx_errors + sw_rx_errors; }
};

// --------------------------------------------------------------- link

struct LinkState {
  bool up = false;
  uint32_t speed_mbps = 0;
  bool full_duplex = false;
};

constexpr LinkState decode_status(uint32_t status) {
  LinkState l;
  l.up = (status & kStatusLu) != 0;
  l.full_duplex = (status & kStatusFd) != 0;
  switch ((status & kStatusSpeedMask) >> kStatusSpeedShift) {
    case 0:
      l.speed_mbps = 10;
      break;
    case 1:
      l.speed_mbps = 100;
      break;
    default:
      l.speed_mbps = 1000;
      break;
  }
  if (!l.up) l.speed_mbps = 0;
  return l;
}

// MAC from RAL0/RAH0; false when RAH0's Address Valid bit is clear.
inline bool mac_from_ra(uint32_t ral, uint32_t rah, uint8_t mac[6]) {
  if (!(rah & kRahAv)) return false;
  for (int i = 0; i < 4; ++i) mac[i] = static_cast<uint8_t>(ral >> (8 * i));
  mac[4] = static_cast<uint8_t>(rah);
  mac[5] = static_cast<uint8_t>(rah >> 8);
  return true;
}
inline void mac_to_ra(const uint8_t mac[6], uint32_t* ral, uint32_t* rah) {
  *ral = uint32_t{mac[0]} | uint32_t{mac[1]} << 8 | uint32_t{mac[2]} << 16 | uint32_t{mac[3]} << 24;
  *rah = uint32_t{mac[4]} | uint32_t{mac[5]} << 8 | kRahAv;
}
// A usable station address: not all zeros, not multicast/broadcast.
inline bool mac_usable(const uint8_t mac[6]) {
  if (mac[0] & 1) return false;
  for (int i = 0; i < 6; ++i)
    if (mac[i]) return true;
  return false;
}

}  // namespace ufab::e1000e
