// The one MMIO header of ufab: typed little-endian register access over a
// mapped region, and memory barriers named by what they order.
//
// Hot-path pattern: validate a register once at init, then access it without
// checks:
//
//   auto tdt = bar0.reg32(kTdt);              // Result<Reg32>: bounds+alignment
//   if (!tdt) return tdt.error().context("e1000e TX init");
//   ...fill descriptors in DMA memory...
//   barrier::descriptors_before_doorbell();   // once per burst
//   tdt->write(tail);                         // one volatile 32-bit store
//
// The same types work over ordinary memory (unit tests, descriptor rings in
// DMA buffers): a device reads rings little-endian whatever the CPU is.
#pragma once

#include <endian.h>

#include <cerrno>
#include <cstdint>
#include <string>
#include <type_traits>

#include "base/error.h"
#include "vfio/text.h"

namespace ufab::vfio {

// Barriers between the CPU's accesses and a device's view of them. Each name
// says which accesses it orders; the instruction follows from the platform.
//
// On x86-64 the CPU's own order (TSO) already keeps stores in program order
// with respect to other stores and loads in order with respect to other
// loads, for write-back RAM and for uncached (UC) MMIO alike: VFIO maps BARs
// UC (pgprot_noncached in vfio-pci), and a UC store is not performed before
// earlier stores are globally visible. The only reordering x86 allows is a
// later load passing an earlier store. So the first three barriers only need
// to stop the compiler from moving accesses across them (as Linux's
// writel()/dma_wmb()/dma_rmb() do on x86), and full() is an mfence. If a BAR
// were ever mapped write-combining (WC), descriptors_before_doorbell() would
// need an sfence; ufab never maps WC.
//
// On weaker orders (arm64) each of these emits a real fence; they mirror the
// kernel's dma_wmb() (dmb oshst), dma_rmb() (dmb oshld) and a full fence
// for the outer-shareable domain that devices belong to.
namespace barrier {

// Stops the compiler only; the building block for the x86 cases.
inline void compiler() { asm volatile("" ::: "memory"); }

// Descriptor (and buffer) writes in DMA memory become visible to the device
// before the MMIO doorbell store that tells it to fetch them (e.g. e1000e
// TDT, virtio notify). One per burst, right before the doorbell.
inline void descriptors_before_doorbell() {
#if defined(__x86_64__) || defined(__i386__)
  compiler();
#elif defined(__aarch64__)
  asm volatile("dmb oshst" ::: "memory");
#else
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}

// Descriptor writes become visible before a later store to RAM that the
// device polls instead of a doorbell (virtio's avail->idx). Same order as
// above, but RAM to RAM.
inline void descriptors_before_index_publish() { descriptors_before_doorbell(); }

// After reading a status word the device wrote by DMA (a "descriptor done"
// bit, virtio used->idx), the reads of the descriptor's other fields and of
// the buffer must not be satisfied from before that status was seen.
inline void device_status_before_descriptor_reads() {
#if defined(__x86_64__) || defined(__i386__)
  compiler();
#elif defined(__aarch64__)
  asm volatile("dmb oshld" ::: "memory");
#else
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}

// Orders earlier stores before later loads too: needed when the CPU
// publishes something and then reads a flag the device writes to decide
// whether to notify (virtio: write avail->idx, then read used->flags or the
// event index). The one case x86 needs a real fence for.
inline void full() {
#if defined(__x86_64__) || defined(__i386__)
  asm volatile("mfence" ::: "memory");
#elif defined(__aarch64__)
  asm volatile("dmb osh" ::: "memory");
#else
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}

}  // namespace barrier

namespace detail {

template <typename T>
inline constexpr bool kRegisterWidth = std::is_same_v<T, uint8_t> || std::is_same_v<T, uint16_t> ||
                                       std::is_same_v<T, uint32_t> || std::is_same_v<T, uint64_t>;

template <typename T>
inline T host_to_le(T v) {
  if constexpr (sizeof(T) == 1) return v;
  else if constexpr (sizeof(T) == 2) return htole16(v);
  else if constexpr (sizeof(T) == 4) return htole32(v);
  else return htole64(v);
}

template <typename T>
inline T le_to_host(T v) {
  if constexpr (sizeof(T) == 1) return v;
  else if constexpr (sizeof(T) == 2) return le16toh(v);
  else if constexpr (sizeof(T) == 4) return le32toh(v);
  else return le64toh(v);
}

}  // namespace detail

// A register whose offset was validated when it was obtained from an Mmio.
// read()/write() are single volatile accesses of exactly sizeof(T) bytes with
// no checks: the caller must keep the mapping alive. Note that some devices
// (and QEMU models) split or reject 64-bit MMIO accesses; use two 32-bit
// registers where the datasheet says so.
template <typename T>
class Reg {
  static_assert(detail::kRegisterWidth<T>, "registers are 8, 16, 32 or 64 bits wide");

 public:
  Reg() = default;
  T read() const { return detail::le_to_host(*address_); }
  void write(T value) const { *address_ = detail::host_to_le(value); }
  volatile T* address() const { return address_; }

 private:
  friend class Mmio;
  explicit Reg(volatile T* address) : address_(address) {}
  volatile T* address_ = nullptr;
};

using Reg8 = Reg<uint8_t>;
using Reg16 = Reg<uint16_t>;
using Reg32 = Reg<uint32_t>;
using Reg64 = Reg<uint64_t>;

// A view (not an owner) of a mapped window. Offsets are relative to
// origin(); only [begin(), end()) may be accessed. A whole BAR has origin at
// BAR offset 0 and the window [0, size); a sparse-mmap area of a BAR keeps the
// BAR's origin, so register offsets stay those of the datasheet.
class Mmio {
 public:
  Mmio() = default;
  Mmio(void* base, uint64_t size) : origin_(static_cast<uint8_t*>(base)), begin_(0), end_(size) {}
  static Mmio window(void* origin, uint64_t begin, uint64_t end) {
    Mmio m;
    m.origin_ = static_cast<uint8_t*>(origin);
    m.begin_ = begin;
    m.end_ = end;
    return m;
  }

  uint8_t* origin() const { return origin_; }
  uint64_t begin() const { return begin_; }
  uint64_t end() const { return end_; }
  uint64_t size() const { return end_ - begin_; }
  bool contains(uint64_t offset, uint64_t length) const {
    return offset >= begin_ && offset <= end_ && end_ - offset >= length;
  }

  // Bounds and natural alignment of a `width`-byte access at `offset`.
  Status check(uint64_t offset, uint64_t width) const {
    if (origin_ == nullptr)
      return fail(EFAULT, std::to_string(width * 8) + "-bit MMIO access at offset " + hex(offset) +
                              " through an empty mapping; map the region first");
    if (!contains(offset, width))
      return fail(ERANGE, std::to_string(width * 8) + "-bit MMIO access at offset " + hex(offset) +
                              " lies outside the mapped window " + describe() +
                              "; check the register offset against the BAR layout");
    auto address = reinterpret_cast<uintptr_t>(origin_) + offset;
    if (offset % width != 0 || address % width != 0)
      return fail(EINVAL, std::to_string(width * 8) + "-bit MMIO access at offset " + hex(offset) +
                              " is not " + std::to_string(width) +
                              "-byte aligned; devices need naturally aligned register accesses");
    return {};
  }

  template <typename T>
  Result<Reg<T>> reg(uint64_t offset) const {
    if (auto ok = check(offset, sizeof(T)); !ok) return std::unexpected(ok.error());
    return Reg<T>(reinterpret_cast<volatile T*>(origin_ + offset));
  }
  Result<Reg8> reg8(uint64_t offset) const { return reg<uint8_t>(offset); }
  Result<Reg16> reg16(uint64_t offset) const { return reg<uint16_t>(offset); }
  Result<Reg32> reg32(uint64_t offset) const { return reg<uint32_t>(offset); }
  Result<Reg64> reg64(uint64_t offset) const { return reg<uint64_t>(offset); }

  // Checked one-shot accesses, for init paths and tools.
  template <typename T>
  Result<T> read(uint64_t offset) const {
    auto r = reg<T>(offset);
    if (!r) return std::unexpected(r.error());
    return r->read();
  }
  template <typename T>
  Status write(uint64_t offset, T value) const {
    auto r = reg<T>(offset);
    if (!r) return std::unexpected(r.error());
    r->write(value);
    return {};
  }
  Result<uint8_t> read8(uint64_t offset) const { return read<uint8_t>(offset); }
  Result<uint16_t> read16(uint64_t offset) const { return read<uint16_t>(offset); }
  Result<uint32_t> read32(uint64_t offset) const { return read<uint32_t>(offset); }
  Result<uint64_t> read64(uint64_t offset) const { return read<uint64_t>(offset); }
  Status write8(uint64_t offset, uint8_t value) const { return write<uint8_t>(offset, value); }
  Status write16(uint64_t offset, uint16_t value) const { return write<uint16_t>(offset, value); }
  Status write32(uint64_t offset, uint32_t value) const { return write<uint32_t>(offset, value); }
  Status write64(uint64_t offset, uint64_t value) const { return write<uint64_t>(offset, value); }

  // A narrower window with the same origin (offsets unchanged).
  Result<Mmio> subwindow(uint64_t offset, uint64_t length) const {
    if (!contains(offset, length))
      return fail(ERANGE, "window " + hex(offset) + "+" + hex(length) + " lies outside " + describe());
    return window(origin_, offset, offset + length);
  }

  // "0x0-0x1ffff (128 KiB)"
  std::string describe() const {
    if (end_ == begin_) return "(empty)";
    return hex(begin_) + "-" + hex(end_ - 1) + " (" + bytes(end_ - begin_) + ")";
  }

 private:
  uint8_t* origin_ = nullptr;
  uint64_t begin_ = 0;
  uint64_t end_ = 0;
};

}  // namespace ufab::vfio
