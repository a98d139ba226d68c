// Header codecs for RoCEv2 over IPv4: Ethernet, IPv4, UDP, the IBA base
// transport header (BTH) and its extension headers.
//
// Every header is a plain struct of host-order fields plus a read_X and a
// write_X over a fixed-size span, so the size is checked by the type and the
// byte order by the code (all IBA and IP headers are big-endian). Reserved
// bits are written as zero and ignored on read, as IBA 9.2 asks.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "core/roce/opcodes.h"

namespace ufab::roce {

using MacAddr = std::array<uint8_t, 6>;

inline constexpr size_t kEthBytes = 14;
inline constexpr size_t kIpv4Bytes = 20;  // no options: rxe never sends them
inline constexpr size_t kUdpBytes = 8;
inline constexpr size_t kBthOffset = kEthBytes + kIpv4Bytes + kUdpBytes;  // 42
inline constexpr size_t kEthMinFrame = 60;  // without FCS; shorter frames are padded

inline constexpr uint16_t kEtherTypeIpv4 = 0x0800;
inline constexpr uint8_t kIpProtoUdp = 17;
inline constexpr uint16_t kRoceV2Port = 4791;  // IANA, RoCEv2 annex A17.2
inline constexpr uint16_t kDefaultPkey = 0xFFFF;  // rxe's only P_Key

// IPv4 flags field (3 bits, RFC 791): reserved, DF, MF.
inline constexpr uint8_t kIpFlagReserved = 0x4;
inline constexpr uint8_t kIpFlagDontFragment = 0x2;
inline constexpr uint8_t kIpFlagMoreFragments = 0x1;

struct EthHeader {
  MacAddr dst{};
  MacAddr src{};
  uint16_t ethertype = kEtherTypeIpv4;
  bool operator==(const EthHeader&) const = default;
};

struct Ipv4Header {
  uint8_t version = 4;
  uint8_t ihl = 5;  // header length in 32-bit words
  uint8_t tos = 0;  // RoCE: the GRH traffic class
  uint16_t total_length = 0;
  uint16_t id = 0;
  uint8_t flags = kIpFlagDontFragment;
  uint16_t fragment_offset = 0;  // in 8-byte units
  uint8_t ttl = 64;              // RoCE: the GRH hop limit
  uint8_t protocol = kIpProtoUdp;
  uint16_t checksum = 0;
  uint32_t src = 0;  // host order: 10.0.0.1 is 0x0A000001
  uint32_t dst = 0;
  bool operator==(const Ipv4Header&) const = default;
};

struct UdpHeader {
  uint16_t sport = 0;
  uint16_t dport = kRoceV2Port;
  uint16_t length = 0;
  uint16_t checksum = 0;  // rxe sends 0: the ICRC protects the datagram
  bool operator==(const UdpHeader&) const = default;
};

// Base transport header (IBA 9.2): 12 bytes.
//   0: opcode | 1: SE(7) MigReq(6) PadCnt(5:4) TVer(3:0) | 2-3: P_Key
//   4: FECN(7) BECN(6) reserved(5:0) | 5-7: DestQP
//   8: AckReq(7) reserved(6:0) | 9-11: PSN
struct Bth {
  uint8_t opcode = 0;
  bool se = false;       // solicited event
  bool migreq = false;   // rxe always sends 0 (bth_init(..., mig = 0, ...))
  uint8_t pad = 0;       // 0-3 bytes after the payload
  uint8_t tver = 0;      // transport header version: must be 0
  uint16_t pkey = kDefaultPkey;
  bool fecn = false;
  bool becn = false;
  uint32_t dest_qp = 0;  // 24 bits
  bool ack_req = false;
  uint32_t psn = 0;      // 24 bits
  bool operator==(const Bth&) const = default;
};

// RDMA extended transport header (IBA 9.3.3): WRITE FIRST/ONLY, READ
// request, ATOMIC_WRITE, FLUSH.
struct Reth {
  uint64_t va = 0;
  uint32_t rkey = 0;
  uint32_t dma_length = 0;
  bool operator==(const Reth&) const = default;
};

// ACK extended transport header (IBA 9.3.5): syndrome and 24-bit MSN.
struct Aeth {
  uint8_t syndrome = 0;
  uint32_t msn = 0;
  bool operator==(const Aeth&) const = default;
};

// Atomic extended transport header (IBA 9.3.4): 28 bytes.
struct AtomicEth {
  uint64_t va = 0;
  uint32_t rkey = 0;
  uint64_t swap_add = 0;
  uint64_t compare = 0;
  bool operator==(const AtomicEth&) const = default;
};

// Atomic acknowledge extended transport header (IBA 9.3.6).
struct AtomicAckEth {
  uint64_t original = 0;
  bool operator==(const AtomicAckEth&) const = default;
};

// Immediate data (IBA 9.3.7). `imm` is the big-endian wire value read as a
// number; verbs hand it to applications as __be32, i.e. htonl(imm).
struct ImmDt {
  uint32_t imm = 0;
  bool operator==(const ImmDt&) const = default;
};

// Datagram extended transport header (IBA 9.3.2): Q_Key, reserved byte,
// 24-bit source QP.
struct Deth {
  uint32_t qkey = 0;
  uint32_t src_qp = 0;
  bool operator==(const Deth&) const = default;
};

// Invalidate extended transport header (IBA 9.3.8): the R_Key to invalidate.
struct Ieth {
  uint32_t rkey = 0;
  bool operator==(const Ieth&) const = default;
};

// FLUSH extended transport header (IBA memory placement extensions, as rxe
// 6.2 reads it, rxe_hdr.h): one big-endian 32-bit word, bits 3:0 the
// placement type, bits 5:4 the selectivity level, bits 31:6 reserved
// (written as zero, ignored on read, like every reserved bit here).
struct Feth {
  uint8_t placement_type = 0;     // 4 bits: feth::kGlobal | feth::kPersistent
  uint8_t selectivity_level = 0;  // 2 bits: feth::kRange or feth::kWholeRegion
  static constexpr Feth make(uint8_t placement_type, uint8_t selectivity_level) {
    return Feth{placement_type, selectivity_level};
  }
  bool operator==(const Feth&) const = default;
};

namespace feth {
// Placement types (bits of the 4-bit field; verbs' IB_FLUSH_GLOBAL and
// IB_FLUSH_PERSISTENT). A FLUSH asks for one or both.
inline constexpr uint8_t kGlobal = 1;      // make the range globally visible
inline constexpr uint8_t kPersistent = 2;  // make the range durable
// Selectivity levels (verbs' IB_FLUSH_RANGE, IB_FLUSH_MR).
inline constexpr uint8_t kRange = 0;        // the RETH's [va, va + length)
inline constexpr uint8_t kWholeRegion = 1;  // the whole region the rkey names; RETH va and length unused
// Field widths: a value that does not fit is refused by the builder.
inline constexpr uint8_t kPlacementMask = 0xF;
inline constexpr uint8_t kSelectivityMask = 0x3;
inline constexpr uint32_t kReservedMask = 0xFFFFFFC0u;  // bits 31:6

// Whether a FETH asks for something IBA defines: a placement type of
// GLOBAL, PERSISTENT or both, and a selectivity of RANGE or whole region.
// The wire codecs carry any value that fits its field; a responder refuses
// the others (invalid request).
constexpr bool defined(const Feth& f) {
  return f.placement_type != 0 && (f.placement_type & ~(kGlobal | kPersistent)) == 0 &&
         f.selectivity_level <= kWholeRegion;
}
// "GLOBAL", "PERSISTENT", "GLOBAL|PERSISTENT", "type 0x4" ...
const char* placement_name(uint8_t placement_type);
const char* selectivity_name(uint8_t selectivity_level);
}  // namespace feth

// The extension headers of one packet; which of them are meaningful is the
// opcode's header mask (OpcodeInfo::headers).
struct ExtHeaders {
  Deth deth;
  Feth feth;
  Reth reth;
  AtomicEth atomic_eth;
  Aeth aeth;
  AtomicAckEth atomic_ack;
  ImmDt immdt;
  Ieth ieth;
};

// ---- codecs ----------------------------------------------------------------

EthHeader read_eth(std::span<const uint8_t, kEthBytes> in);
void write_eth(std::span<uint8_t, kEthBytes> out, const EthHeader& h);

// Reads the fixed 20-byte part; the caller checks ihl before trusting more.
Ipv4Header read_ipv4(std::span<const uint8_t, kIpv4Bytes> in);
// Writes a 20-byte header (ihl forced to 5) with `h.checksum` as given; see
// ipv4_header_checksum.
void write_ipv4(std::span<uint8_t, kIpv4Bytes> out, const Ipv4Header& h);

UdpHeader read_udp(std::span<const uint8_t, kUdpBytes> in);
void write_udp(std::span<uint8_t, kUdpBytes> out, const UdpHeader& h);

Bth read_bth(std::span<const uint8_t, kBthBytes> in);
// Masks dest_qp and psn to 24 bits, pad to 2 and tver to 4.
void write_bth(std::span<uint8_t, kBthBytes> out, const Bth& h);

Reth read_reth(std::span<const uint8_t, kRethBytes> in);
void write_reth(std::span<uint8_t, kRethBytes> out, const Reth& h);
Aeth read_aeth(std::span<const uint8_t, kAethBytes> in);
void write_aeth(std::span<uint8_t, kAethBytes> out, const Aeth& h);
AtomicEth read_atomic_eth(std::span<const uint8_t, kAtomicEthBytes> in);
void write_atomic_eth(std::span<uint8_t, kAtomicEthBytes> out, const AtomicEth& h);
AtomicAckEth read_atomic_ack_eth(std::span<const uint8_t, kAtomicAckEthBytes> in);
void write_atomic_ack_eth(std::span<uint8_t, kAtomicAckEthBytes> out, const AtomicAckEth& h);
ImmDt read_immdt(std::span<const uint8_t, kImmDtBytes> in);
void write_immdt(std::span<uint8_t, kImmDtBytes> out, const ImmDt& h);
Deth read_deth(std::span<const uint8_t, kDethBytes> in);
void write_deth(std::span<uint8_t, kDethBytes> out, const Deth& h);
Ieth read_ieth(std::span<const uint8_t, kIethBytes> in);
void write_ieth(std::span<uint8_t, kIethBytes> out, const Ieth& h);
Feth read_feth(std::span<const uint8_t, kFethBytes> in);
void write_feth(std::span<uint8_t, kFethBytes> out, const Feth& h);

// The extension headers named by `mask`, in wire order, starting right
// after the BTH. Return false (touching nothing) when the span is shorter
// than ext_headers_size(mask).
bool read_ext_headers(uint16_t mask, std::span<const uint8_t> in, ExtHeaders& out);
bool write_ext_headers(uint16_t mask, std::span<uint8_t> out, const ExtHeaders& h);

// ---- checksums ---------------------------------------------------------------

// The value to store in the checksum field of `hdr` (bytes 10-11 are
// ignored): the one's complement of the one's complement sum (RFC 791/1071).
uint16_t ipv4_header_checksum(std::span<const uint8_t, kIpv4Bytes> hdr);
// True when the header, checksum included, sums to 0xFFFF (how Linux checks).
bool ipv4_header_checksum_ok(std::span<const uint8_t, kIpv4Bytes> hdr);
// True when a UDP datagram (header + data, `udp.size()` == its length field)
// carries checksum 0 (none, what rxe sends) or one that verifies against the
// IPv4 pseudo-header (RFC 768); Linux checks a non-zero one before handing
// the datagram to rxe.
bool udp_checksum_ok(uint32_t src_ip, uint32_t dst_ip, std::span<const uint8_t> udp);

// ---- AETH syndromes (IBA 9.3.5, table 42; values as rxe uses them) ----------

namespace aeth {

// Bits 6:5 of the syndrome; bit 7 is reserved.
enum class Type : uint8_t { kAck = 0, kRnrNak = 1, kReserved = 2, kNak = 3 };

enum class NakCode : uint8_t {
  kPsnSequenceError = 0,
  kInvalidRequest = 1,
  kRemoteAccessError = 2,
  kRemoteOperationalError = 3,
  kInvalidRdRequest = 4,  // RD only; never sent by rxe
};

// rxe acknowledges with credit count 0x1F ("unlimited", AETH_ACK_UNLIMITED)
// because it does not do end-to-end flow control.
inline constexpr uint8_t kAckUnlimited = 0x1F;

constexpr Type type(uint8_t syndrome) { return static_cast<Type>((syndrome >> 5) & 0x3); }
// The low five bits: credit count (ACK), timer (RNR NAK) or code (NAK).
constexpr uint8_t value(uint8_t syndrome) { return syndrome & 0x1F; }

constexpr uint8_t ack_syndrome(uint8_t credits = kAckUnlimited) { return credits & 0x1F; }
constexpr uint8_t rnr_nak_syndrome(uint8_t timer) { return 0x20 | (timer & 0x1F); }
constexpr uint8_t nak_syndrome(NakCode code) { return 0x60 | (static_cast<uint8_t>(code) & 0x1F); }

inline Aeth ack(uint32_t msn) { return Aeth{ack_syndrome(), msn & 0xFFFFFF}; }
inline Aeth rnr_nak(uint8_t timer, uint32_t msn) { return Aeth{rnr_nak_syndrome(timer), msn & 0xFFFFFF}; }
inline Aeth nak(NakCode code, uint32_t msn) { return Aeth{nak_syndrome(code), msn & 0xFFFFFF}; }

// The RNR NAK timer field in microseconds (IBA table 45): 0 is 655.36 ms,
// 1..31 run from 0.01 ms to 491.52 ms.
uint32_t rnr_timer_usec(uint8_t timer);

const char* nak_code_name(uint8_t code);

}  // namespace aeth

// ---- PSN arithmetic (24-bit, IBA 9.7.1) --------------------------------------

inline constexpr uint32_t kPsnMask = 0xFFFFFF;
constexpr uint32_t psn_add(uint32_t psn, uint32_t n) { return (psn + n) & kPsnMask; }
// Signed distance a - b in the 24-bit circle, in [-2^23, 2^23): negative
// when a is behind b. rxe compares PSNs the same way (psn_compare).
constexpr int32_t psn_diff(uint32_t a, uint32_t b) {
  return static_cast<int32_t>(((a - b) & kPsnMask) << 8) >> 8;
}

// ---- MTU and segmentation (rxe) ---------------------------------------------

// Bytes of pad after a payload of `len` bytes: to the next multiple of 4.
constexpr uint8_t pad_for(size_t len) { return static_cast<uint8_t>((4 - (len & 3)) & 3); }

// rxe's active path MTU for a netdev MTU: the largest IB MTU (256 .. 4096)
// not above netdev_mtu - 80 (RXE_MAX_HDR_LENGTH), and 256 when even that
// does not fit. 1500 gives 1024.
uint32_t rxe_active_mtu(uint32_t netdev_mtu);

// Packets (and PSNs) a message of `len` bytes takes at path MTU `mtu`: every
// packet but the last carries exactly `mtu` bytes; an empty message takes one.
constexpr uint32_t packets_for(uint64_t len, uint32_t mtu) {
  return len == 0 ? 1 : static_cast<uint32_t>((len + mtu - 1) / mtu);
}

}  // namespace ufab::roce
