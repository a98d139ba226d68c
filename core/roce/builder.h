// Builds RoCEv2-over-IPv4 frames the way Linux rxe puts them on the wire
// (rxe_net.c prepare4/prepare_udp_hdr, rxe_req.c/rxe_resp.c bth_init):
//
//   Ethernet | IPv4 (20 B, DF, TOS = traffic class, TTL = hop limit)
//   | UDP (dport 4791, checksum 0) | BTH | extension headers | payload
//   | pad to 4 bytes (zeros) | ICRC (little-endian)
//
// Everything is bounds-checked against the caller's buffer; nothing is
// written past it, and nothing at all when the result is an error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/roce/headers.h"
#include "core/roce/icrc.h"
#include "core/roce/opcodes.h"

namespace ufab::roce {

// What a frame is built from, besides the payload.
struct FrameSpec {
  MacAddr dst_mac{};
  MacAddr src_mac{};
  uint32_t src_ip = 0;  // host order
  uint32_t dst_ip = 0;
  uint8_t traffic_class = 0;  // IPv4 TOS (rxe: the AV's GRH traffic class)
  uint8_t hop_limit = 64;     // IPv4 TTL (rxe: the AV's GRH hop limit)
  // rxe takes the ID from the kernel's per-destination generator
  // (__ip_select_ident); no receiver looks at it because DF is set, but it
  // is inside the ICRC. A per-peer counter is the sensible choice.
  uint16_t ip_id = 0;
  uint8_t ip_flags = kIpFlagDontFragment;  // rxe sets DF; MF is refused
  uint16_t udp_sport = 0xC000;             // see udp_port.h
  // All fields but pad and tver, which the builder sets: pad from the
  // payload length, TVer 0.
  Bth bth;
  // Those named by the opcode's header mask are written; the rest ignored.
  ExtHeaders ext;
};

enum class BuildError : uint8_t {
  kOk = 0,
  kUnknownOpcode,      // bth.opcode not in the table
  kPayloadNotAllowed,  // payload given for an opcode without one
  kPayloadNotEight,    // ATOMIC_WRITE carries exactly 8 bytes
  kPayloadTooLarge,    // the IPv4 datagram would exceed 65535 bytes
  kFieldOutOfRange,    // a 24-bit field above 0xFFFFFF, a FETH field wider than its bits, or IPv4 flags with MF
  kBufferTooSmall,     // output buffer shorter than the frame
  kCount
};

const char* build_error_name(BuildError e);
const char* build_error_text(BuildError e);

struct BuildResult {
  BuildError error = BuildError::kOk;
  size_t length = 0;  // bytes written
  explicit operator bool() const { return error == BuildError::kOk; }
};

// Bytes before the payload (Ethernet through extension headers), or 0 for
// an unknown opcode.
size_t header_length(uint8_t opcode);
// Whole frame for `payload_len` bytes of payload (no Ethernet minimum-size
// padding: NICs add it), or 0 for an unknown opcode.
size_t frame_length(uint8_t opcode, size_t payload_len);

// A complete frame in `out`; the payload is gathered from `payload` in
// order (one copy, straight from the pieces into the frame). The pieces
// must not overlap `out`.
BuildResult build_frame_gather(const FrameSpec& spec, std::span<const std::span<const uint8_t>> payload,
                               std::span<uint8_t> out, CrcImpl crc = CrcImpl::kAuto);
// One contiguous payload (or none: pass {}).
BuildResult build_frame(const FrameSpec& spec, std::span<const uint8_t> payload, std::span<uint8_t> out,
                        CrcImpl crc = CrcImpl::kAuto);

// Zero-copy form for NICs that gather a frame from several buffers: writes
// the headers (header_length bytes) to `headers` and the pad plus ICRC to
// `trailer`, and reads the payload pieces only to compute the ICRC. The
// frame on the wire is headers | payload pieces | trailer.
inline constexpr size_t kMaxTrailerBytes = 3 + kIcrcBytes;

struct SplitBuildResult {
  BuildError error = BuildError::kOk;
  size_t header_length = 0;
  size_t trailer_length = 0;  // pad + 4
  explicit operator bool() const { return error == BuildError::kOk; }
};

SplitBuildResult build_frame_split(const FrameSpec& spec, std::span<const std::span<const uint8_t>> payload,
                                   std::span<uint8_t> headers, std::span<uint8_t, kMaxTrailerBytes> trailer,
                                   CrcImpl crc = CrcImpl::kAuto);

}  // namespace ufab::roce
