// The RoCEv2 packet opcodes ufab knows, as data: which extension headers
// follow the BTH, whether a payload may follow them, where the packet sits
// in a message, and which side sends it.
//
// Facts from IBA vol. 1 (sections 9.2 and 9.3, table 37 "OpCode field") and
// Linux rxe (drivers/infiniband/sw/rxe/rxe_opcode.c), which is the peer the
// wire format has to match. The set is exactly the RC, UC and UD opcodes
// rxe handles; RD (0x40-0x56) and CNP (0x81) are unknown on purpose, since
// rxe never sends them and drops them on receive.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace ufab::roce {

// Sizes of the headers after UDP (IBA 9.2-9.3; RoCEv2 annex A17).
inline constexpr size_t kBthBytes = 12;
inline constexpr size_t kDethBytes = 8;
inline constexpr size_t kFethBytes = 4;
inline constexpr size_t kRethBytes = 16;
inline constexpr size_t kAtomicEthBytes = 28;
inline constexpr size_t kAethBytes = 4;
inline constexpr size_t kAtomicAckEthBytes = 8;
inline constexpr size_t kImmDtBytes = 4;
inline constexpr size_t kIethBytes = 4;
inline constexpr size_t kIcrcBytes = 4;

// Extension headers as bits of a mask. The enumerators are declared in the
// order the headers appear on the wire, so a header's offset is the sum of
// the sizes of the present headers declared before it. That single order
// holds for every opcode in the table: DETH before ImmDt (UD with
// immediate), FETH before RETH (FLUSH), RETH before ImmDt (WRITE with
// immediate), AETH before AtomicAckETH (atomic ACK).
enum ExtHeader : uint16_t {
  kDeth = 1u << 0,
  kFeth = 1u << 1,
  kReth = 1u << 2,
  kAtomicEth = 1u << 3,
  kAeth = 1u << 4,
  kAtomicAckEth = 1u << 5,
  kImmDt = 1u << 6,
  kIeth = 1u << 7,
};
inline constexpr int kExtHeaderKinds = 8;

constexpr size_t ext_header_size(ExtHeader h) {
  switch (h) {
    case kDeth: return kDethBytes;
    case kFeth: return kFethBytes;
    case kReth: return kRethBytes;
    case kAtomicEth: return kAtomicEthBytes;
    case kAeth: return kAethBytes;
    case kAtomicAckEth: return kAtomicAckEthBytes;
    case kImmDt: return kImmDtBytes;
    case kIeth: return kIethBytes;
  }
  return 0;
}

// Offset of header `h` counted from the end of the BTH, for a packet whose
// extension headers are `mask`.
constexpr size_t ext_header_offset(uint16_t mask, ExtHeader h) {
  size_t off = 0;
  for (int i = 0; i < kExtHeaderKinds; ++i) {
    auto bit = static_cast<ExtHeader>(1u << i);
    if (bit == h) break;
    if (mask & bit) off += ext_header_size(bit);
  }
  return off;
}

// Total size of the extension headers in `mask`.
constexpr size_t ext_headers_size(uint16_t mask) {
  size_t n = 0;
  for (int i = 0; i < kExtHeaderKinds; ++i)
    if (mask & (1u << i)) n += ext_header_size(static_cast<ExtHeader>(1u << i));
  return n;
}

enum class Transport : uint8_t { kRc, kUc, kUd };

// What the packet does, independent of its position in a message.
enum class OpKind : uint8_t {
  kSend,
  kRdmaWrite,
  kReadRequest,
  kReadResponse,
  kAck,
  kAtomic,       // COMPARE_SWAP, FETCH_ADD
  kAtomicAck,
  kFlush,        // IBA memory placement extensions; rxe since 6.2
  kAtomicWrite,  // likewise
};

enum class PayloadRule : uint8_t {
  kNone,       // nothing may follow the headers but the ICRC (and no pad)
  kAny,        // 0 or more bytes
  kExactly8,   // ATOMIC_WRITE carries one 8-byte value
};

// Position of a packet in its message. ONLY is FIRST|LAST.
enum Position : uint8_t {
  kFirst = 1u << 0,
  kMiddle = 1u << 1,
  kLast = 1u << 2,
  kOnly = kFirst | kLast,
};

struct OpcodeInfo {
  uint8_t opcode;
  const char* name;  // IBA name without the transport, e.g. "SEND_FIRST"
  Transport transport;
  OpKind kind;
  uint16_t headers;  // ExtHeader mask
  PayloadRule payload;
  uint8_t position;  // Position bits
  bool request;      // true: requester -> responder; false: a response
  bool in_rxe_6_1;   // false: Linux 6.1 rxe drops it (FLUSH, ATOMIC_WRITE)

  bool has(ExtHeader h) const { return (headers & h) != 0; }
  size_t ext_bytes() const { return ext_headers_size(headers); }
  size_t offset_of(ExtHeader h) const { return ext_header_offset(headers, h); }
  bool first() const { return (position & kFirst) != 0; }
  bool last() const { return (position & kLast) != 0; }
  bool only() const { return (position & kOnly) == kOnly; }
  bool middle() const { return (position & kMiddle) != 0; }
  bool has_payload() const { return payload != PayloadRule::kNone; }
};

// The entry for `opcode`, or nullptr for an opcode ufab does not know.
const OpcodeInfo* opcode_info(uint8_t opcode);

// Every known opcode, in ascending order.
std::span<const OpcodeInfo> opcode_table();

// "RC_SEND_FIRST", "UD_SEND_ONLY", ... or "UNKNOWN".
const char* opcode_full_name(uint8_t opcode);

// Named opcodes (IBA table 37). The transport is the top three bits.
namespace op {
inline constexpr uint8_t kRcSendFirst = 0x00;
inline constexpr uint8_t kRcSendMiddle = 0x01;
inline constexpr uint8_t kRcSendLast = 0x02;
inline constexpr uint8_t kRcSendLastImm = 0x03;
inline constexpr uint8_t kRcSendOnly = 0x04;
inline constexpr uint8_t kRcSendOnlyImm = 0x05;
inline constexpr uint8_t kRcWriteFirst = 0x06;
inline constexpr uint8_t kRcWriteMiddle = 0x07;
inline constexpr uint8_t kRcWriteLast = 0x08;
inline constexpr uint8_t kRcWriteLastImm = 0x09;
inline constexpr uint8_t kRcWriteOnly = 0x0A;
inline constexpr uint8_t kRcWriteOnlyImm = 0x0B;
inline constexpr uint8_t kRcReadRequest = 0x0C;
inline constexpr uint8_t kRcReadResponseFirst = 0x0D;
inline constexpr uint8_t kRcReadResponseMiddle = 0x0E;
inline constexpr uint8_t kRcReadResponseLast = 0x0F;
inline constexpr uint8_t kRcReadResponseOnly = 0x10;
inline constexpr uint8_t kRcAck = 0x11;
inline constexpr uint8_t kRcAtomicAck = 0x12;
inline constexpr uint8_t kRcCompareSwap = 0x13;
inline constexpr uint8_t kRcFetchAdd = 0x14;
inline constexpr uint8_t kRcSendLastInv = 0x16;
inline constexpr uint8_t kRcSendOnlyInv = 0x17;
inline constexpr uint8_t kRcFlush = 0x1C;
inline constexpr uint8_t kRcAtomicWrite = 0x1D;
inline constexpr uint8_t kUcSendFirst = 0x20;
inline constexpr uint8_t kUcSendMiddle = 0x21;
inline constexpr uint8_t kUcSendLast = 0x22;
inline constexpr uint8_t kUcSendLastImm = 0x23;
inline constexpr uint8_t kUcSendOnly = 0x24;
inline constexpr uint8_t kUcSendOnlyImm = 0x25;
inline constexpr uint8_t kUcWriteFirst = 0x26;
inline constexpr uint8_t kUcWriteMiddle = 0x27;
inline constexpr uint8_t kUcWriteLast = 0x28;
inline constexpr uint8_t kUcWriteLastImm = 0x29;
inline constexpr uint8_t kUcWriteOnly = 0x2A;
inline constexpr uint8_t kUcWriteOnlyImm = 0x2B;
inline constexpr uint8_t kUdSendOnly = 0x64;
inline constexpr uint8_t kUdSendOnlyImm = 0x65;
}  // namespace op

}  // namespace ufab::roce
