// Parses a received Ethernet frame as RoCEv2 over IPv4, trusting nothing in
// it: every length is checked against the bytes actually there before any
// field behind it is read, and every rejection has its own reason so the
// transport can count what it drops.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/roce/headers.h"
#include "core/roce/icrc.h"
#include "core/roce/opcodes.h"

namespace ufab::roce {

// Why a frame was not accepted, in the order the parser checks. Values are
// stable within a build and dense, so they index counter arrays.
enum class ParseError : uint8_t {
  kOk = 0,
  kTruncatedEthernet,      // shorter than the 14-byte Ethernet header
  kNotIpv4,                // EtherType is not 0x0800 (VLAN tags included)
  kTruncatedIpv4,          // shorter than Ethernet + 20-byte IPv4 header
  kIpv4Version,            // version field is not 4
  kIpv4HeaderLength,       // IHL below 5 words
  kIpv4Options,            // IHL above 5: options, which rxe never sends
  kIpv4LengthTooShort,     // total length below the 20-byte header
  kIpv4LengthExceedsFrame, // total length runs past the end of the frame
  kTrailingBytes,          // bytes after the datagram beyond minimum-size padding
  kIpv4Fragment,           // MF set or fragment offset non-zero
  kNotUdp,                 // protocol is not 17
  kIpv4Checksum,           // header checksum does not verify
  kTruncatedUdp,           // datagram too short for the UDP header
  kUdpLength,              // UDP length disagrees with the IPv4 total length
  kNotRoce,                // UDP destination port is not 4791
  kUdpChecksum,            // non-zero UDP checksum that does not verify
  kTruncatedBth,           // UDP payload shorter than the 12-byte BTH
  kBadTver,                // BTH transport version is not 0
  kUnknownOpcode,          // opcode not in the table (RD, CNP, reserved)
  kTruncatedExtHeaders,    // too short for the opcode's extension headers
  kTruncatedIcrc,          // fewer than 4 bytes left for the ICRC
  kPadExceedsPayload,      // PadCnt larger than the bytes before the ICRC
  kMisalignedPayload,      // payload + pad is not a multiple of 4
  kUnexpectedPayload,      // payload on an opcode that carries none (or not 8 for ATOMIC_WRITE)
  kBadIcrc,                // ICRC does not match
  kCount
};

inline constexpr size_t kParseErrorCount = static_cast<size_t>(ParseError::kCount);

// Short stable identifier for counters and logs, e.g. "bad_icrc".
const char* parse_error_name(ParseError e);
// One sentence for people, e.g. "ICRC does not match the packet".
const char* parse_error_text(ParseError e);

// A parsed packet. Header fields are decoded copies; `payload` is a view
// into the frame that was parsed and lives as long as that buffer.
struct Packet {
  EthHeader eth;
  Ipv4Header ip;
  UdpHeader udp;
  Bth bth;
  const OpcodeInfo* op = nullptr;  // never null after a successful parse
  ExtHeaders ext;                  // those in op->headers are valid
  std::span<const uint8_t> payload;  // without pad and ICRC
  uint32_t icrc = 0;                 // as received

  // Offsets into the frame.
  uint32_t ip_offset = 0;
  uint32_t udp_offset = 0;
  uint32_t bth_offset = 0;
  uint32_t payload_offset = 0;
  uint32_t icrc_offset = 0;
  uint32_t frame_length = 0;  // Ethernet header + IPv4 datagram; the rest was padding

  bool has(ExtHeader h) const { return op != nullptr && op->has(h); }
};

struct ParseOptions {
  // Switches for tests and for NICs that already verified a checksum; the
  // defaults check everything.
  bool verify_ipv4_checksum = true;
  bool verify_udp_checksum = true;
  bool verify_icrc = true;
  CrcImpl crc = CrcImpl::kAuto;
};

struct ParseResult {
  ParseError error = ParseError::kOk;
  Packet packet;  // meaningful only when error == kOk
  explicit operator bool() const { return error == ParseError::kOk; }
};

ParseResult parse_frame(std::span<const uint8_t> frame, const ParseOptions& options = {});

// The same, filling `out` (for loops that reuse one Packet). On failure the
// fields decoded before the failing check are filled, the rest unspecified.
ParseError parse_frame(std::span<const uint8_t> frame, Packet& out, const ParseOptions& options = {});

}  // namespace ufab::roce
