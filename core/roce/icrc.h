// CRC-32 and the RoCEv2 invariant CRC (ICRC) exactly as Linux rxe computes
// it (drivers/infiniband/sw/rxe/rxe_icrc.c).
//
// The CRC is the Ethernet/zlib CRC-32: reflected, polynomial 0xEDB88320. The
// ICRC of an IPv4 RoCEv2 packet is
//
//   crc32(8 x 0xFF || IPv4 header || UDP header || BTH || ext headers ||
//         payload || pad)
//
// with the fields a router may change masked to all ones: IPv4 TOS, TTL and
// header checksum, the UDP checksum, and BTH byte 4 (FECN, BECN, reserved).
// The 8 bytes of 0xFF stand for the Local Route Header of native IB, which
// RoCE does not carry but the IBA ICRC definition covers (masked). The result
// is stored in the 4 bytes after the pad, least significant byte first.
//
// Three implementations compute the same function: bytewise (one table
// lookup per byte; the reference for tests), slice-by-8 (eight tables, eight
// bytes per step) and PCLMULQDQ folding (x86-64 with the carry-less multiply
// instruction, checked at run time; any length >= 16, tail and final
// reduction without tables).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace ufab::roce {

enum class CrcImpl : uint8_t { kBytewise, kSlice8, kPclmul, kAuto };

const char* crc_impl_name(CrcImpl impl);
// kPclmul needs x86-64 and a CPU with PCLMULQDQ and SSE4.1; the others
// always work.
bool crc_impl_available(CrcImpl impl);
// What kAuto resolves to on this machine.
CrcImpl best_crc_impl();

// The raw CRC register update, no inversion before or after: what the
// kernel's crc32_le(state, data, len) returns. An unavailable `impl` falls
// back to slice-by-8.
uint32_t crc32_update(uint32_t state, std::span<const uint8_t> data, CrcImpl impl = CrcImpl::kAuto);

// zlib's crc32(0, data, len): ~crc32_update(~0, data).
inline uint32_t crc32(std::span<const uint8_t> data, CrcImpl impl = CrcImpl::kAuto) {
  return ~crc32_update(0xFFFFFFFFu, data, impl);
}

// The CRC register after the 8 masked LRH bytes (0xFF) from the initial
// ~0: rxe's starting value.
inline constexpr uint32_t kIcrcSeed = 0xDEBB20E3;

// The masked part: IPv4 header (20, no options) + UDP (8) + BTH (12).
inline constexpr size_t kIcrcHeaderBytes = 40;

// Incremental ICRC for frames assembled from pieces: icrc_begin over the 40
// header bytes (as they go on the wire; masking is done here), icrc_update
// over the extension headers, payload pieces and pad, in order, then
// icrc_finish. The result goes on the wire little-endian.
uint32_t icrc_begin(std::span<const uint8_t, kIcrcHeaderBytes> ip_udp_bth, CrcImpl impl = CrcImpl::kAuto);
inline uint32_t icrc_update(uint32_t state, std::span<const uint8_t> data, CrcImpl impl = CrcImpl::kAuto) {
  return crc32_update(state, data, impl);
}
inline uint32_t icrc_finish(uint32_t state) { return ~state; }

// rxe's FLUSH ICRC (Linux 6.2 to at least 6.12): rxe's opcode table gives
// RC FLUSH (0x1C) no payload offset, so the "payload" its ICRC code feeds
// the CRC after the extension headers starts at the BTH and runs to the
// ICRC. A FLUSH's ICRC thus covers the masked IPv4/UDP/BTH, FETH and RETH
// as for any packet, then the BTH, FETH and RETH a second time, as they
// are on the wire (BTH byte 4 unmasked). rxe sends it so and drops a FLUSH
// whose ICRC is computed without the repeat (seen in the VM test bed:
// tests/vm/rxe_flush_guest.sh), so ufab computes it rxe's way on both
// sides. Only FLUSH: every other opcode rxe knows has its payload offset.
inline constexpr bool icrc_repeats_headers(uint8_t opcode) { return opcode == 0x1C; }

// ICRC of one contiguous IPv4 RoCEv2 datagram: `datagram` runs from the
// first byte of the IPv4 header to the last pad byte (the ICRC itself
// excluded); a FLUSH (icrc_repeats_headers) is computed rxe's way.
// Requires datagram.size() >= kIcrcHeaderBytes; returns 0 and reads
// nothing otherwise.
uint32_t icrc_ipv4(std::span<const uint8_t> datagram, CrcImpl impl = CrcImpl::kAuto);

}  // namespace ufab::roce
