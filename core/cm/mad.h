// The InfiniBand Communication Manager's messages (IBTA vol 1 ch 12, MADs
// per ch 13.4), as the Linux kernel's ib_cm puts them on the wire: a
// 256-byte MAD (24-byte common header, 232 bytes of CM attribute) sent as a
// UD datagram to QP 1 (the GSI, Q_Key 0x80010000). docs/cm.md has the
// tables.
//
// This is the codec only: parse_mad() checks the MAD's size, base version,
// management class, class version, method and attribute id, and the length
// fields inside a message (REJ ARI length, APR and SIDR_REP additional
// information lengths) and the 2-bit "message" codes of MRA and REJ;
// everything else is reported as found (reserved bits are ignored, as
// receivers must), so the connection state machine can answer a value it
// does not accept with the right REJ reason. build_mad() checks that every
// value fits its field and that private data fits its message.
//
// Private data: a CM message carries a fixed-size private data area and no
// length, so parse_mad() returns the whole area (kReqPrivateDataSize bytes
// for a REQ, and so on); build_mad() writes the caller's bytes and zeros
// after them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "base/error.h"

namespace ufab::cm {

// --- MAD framing -----------------------------------------------------------

inline constexpr size_t kMadSize = 256;
inline constexpr size_t kMadHeaderSize = 24;
inline constexpr size_t kCmDataSize = kMadSize - kMadHeaderSize;  // 232

inline constexpr uint8_t kMadBaseVersion = 1;
inline constexpr uint8_t kMgmtClassCm = 0x07;
inline constexpr uint8_t kCmClassVersion = 2;  // IBTA 1.2, what ib_cm sends and accepts

// The GSI: CM MADs go to QP 1 with this Q_Key.
inline constexpr uint32_t kGsiQpn = 1;
inline constexpr uint32_t kGsiQKey = 0x80010000;

// MAD methods (IBTA 13.4.5). The CM sends every message with kSend.
enum class Method : uint8_t {
  kGet = 0x01,
  kSet = 0x02,
  kSend = 0x03,
  kTrap = 0x05,
  kReport = 0x06,
  kTrapRepress = 0x07,
  kGetResp = 0x81,
  kReportResp = 0x86,
};

// CM attribute ids (IBTA table 104).
enum class AttributeId : uint16_t {
  kReq = 0x0010,
  kMra = 0x0011,
  kRej = 0x0012,
  kRep = 0x0013,
  kRtu = 0x0014,
  kDreq = 0x0015,
  kDrep = 0x0016,
  kSidrReq = 0x0017,
  kSidrRep = 0x0018,
  kLap = 0x0019,
  kApr = 0x001A,
};

// "REQ", "MRA", ... or "unknown".
std::string_view attribute_name(uint16_t attribute_id);

// The MAD common header (IBTA 13.4.2), 24 bytes, big-endian.
struct MadHeader {
  uint8_t base_version = kMadBaseVersion;
  uint8_t mgmt_class = kMgmtClassCm;
  uint8_t class_version = kCmClassVersion;
  uint8_t method = static_cast<uint8_t>(Method::kSend);  // bit 7 is the response bit
  uint16_t status = 0;
  uint16_t class_specific = 0;
  uint64_t transaction_id = 0;
  // Set by parse_mad(); build_mad() writes the id of the message it is
  // given and ignores this one.
  uint16_t attribute_id = 0;
  uint16_t reserved = 0;
  // ib_cm puts the ECE options (rdma_ucm_ece.attr_mod) here in REQ and REP.
  uint32_t attribute_modifier = 0;

  bool operator==(const MadHeader&) const = default;
};

// --- Field types -------------------------------------------------------------

using Gid = std::array<uint8_t, 16>;
using PrivateData = std::vector<uint8_t>;

// Private data area of each message, in bytes (ib_cm.h's IB_CM_*_SIZE).
inline constexpr size_t kReqPrivateDataSize = 92;
inline constexpr size_t kMraPrivateDataSize = 222;
inline constexpr size_t kRejPrivateDataSize = 148;
inline constexpr size_t kRepPrivateDataSize = 196;
inline constexpr size_t kRtuPrivateDataSize = 224;
inline constexpr size_t kDreqPrivateDataSize = 220;
inline constexpr size_t kDrepPrivateDataSize = 224;
inline constexpr size_t kSidrReqPrivateDataSize = 216;
inline constexpr size_t kSidrRepPrivateDataSize = 136;
inline constexpr size_t kLapPrivateDataSize = 168;
inline constexpr size_t kAprPrivateDataSize = 148;
// Additional (rejection) information areas.
inline constexpr size_t kRejAriSize = 72;
inline constexpr size_t kAprInfoSize = 72;
inline constexpr size_t kSidrRepInfoSize = 72;

// REQ transport service type (2 bits).
enum class TransportType : uint8_t { kRc = 0, kUc = 1, kRd = 2, kExtended = 3 };

// Which message an MRA or REJ answers (2 bits; 3 is reserved).
enum class MessageCode : uint8_t { kReq = 0, kRep = 1, kOther = 2 };

// REJ reasons (IBTA table 109; ib_cm.h enum ib_cm_rej_reason).
enum class RejectReason : uint16_t {
  kNoQp = 1,
  kNoEec = 2,
  kNoResources = 3,
  kTimeout = 4,
  kUnsupported = 5,
  kInvalidCommId = 6,
  kInvalidCommInstance = 7,
  kInvalidServiceId = 8,
  kInvalidTransportType = 9,
  kStaleConnection = 10,
  kRdcNotExist = 11,
  kInvalidGid = 12,
  kInvalidLid = 13,
  kInvalidSl = 14,
  kInvalidTrafficClass = 15,
  kInvalidHopLimit = 16,
  kInvalidPacketRate = 17,
  kInvalidAltGid = 18,
  kInvalidAltLid = 19,
  kInvalidAltSl = 20,
  kInvalidAltTrafficClass = 21,
  kInvalidAltHopLimit = 22,
  kInvalidAltPacketRate = 23,
  kPortCmRedirect = 24,
  kPortRedirect = 25,
  kInvalidMtu = 26,
  kInsufficientResponderResources = 27,
  kConsumerDefined = 28,
  kInvalidRnrRetry = 29,
  kDuplicateLocalCommId = 30,
  kInvalidClassVersion = 31,
  kInvalidFlowLabel = 32,
  kInvalidAltFlowLabel = 33,
  kVendorOptionNotSupported = 35,
};

// "consumer defined", ... or "unknown reason N".
std::string reject_reason_name(uint16_t reason);

// SIDR_REP status (IBTA table 121).
enum class SidrStatus : uint8_t {
  kSuccess = 0,
  kUnsupported = 1,  // no such service id
  kReject = 2,
  kNoQp = 3,
  kRedirect = 4,
  kUnsupportedVersion = 5,
};

// APR status (IBTA table 117).
enum class AprStatus : uint8_t {
  kSuccess = 0,
  kInvalidCommId = 1,
  kUnsupported = 2,
  kReject = 3,
  kRedirect = 4,
  kIsCurrent = 5,
  kInvalidQpnEecn = 6,
  kInvalidLid = 7,
  kInvalidGid = 8,
  kInvalidFlowLabel = 9,
  kInvalidTrafficClass = 10,
  kInvalidHopLimit = 11,
  kInvalidPacketRate = 12,
  kInvalidSl = 13,
};

// A path as REQ carries it (primary and alternate), 44 bytes. On RoCE the
// kernel writes LID 0xFFFF (permissive) when hop_limit > 1, GIDs are the
// RoCEv2 GIDs (IPv4-mapped for IPv4), and subnet_local = (hop_limit <= 1).
struct Path {
  uint16_t local_lid = 0;
  uint16_t remote_lid = 0;
  Gid local_gid{};
  Gid remote_gid{};
  uint32_t flow_label = 0;    // 20 bits
  uint8_t packet_rate = 0;    // 6 bits (IB rate enum)
  uint8_t traffic_class = 0;
  uint8_t hop_limit = 0;
  uint8_t sl = 0;             // 4 bits
  bool subnet_local = false;
  uint8_t local_ack_timeout = 0;  // 5 bits, 4.096 us * 2^n

  bool operator==(const Path&) const = default;
};

// LAP's alternate path: the same fields at other offsets (and in another
// order: traffic class before hop limit before packet rate).
using LapPath = Path;

// --- Messages (byte offsets in docs/cm.md) ---------------------------------

struct Req {
  uint32_t local_comm_id = 0;
  uint32_t vendor_id = 0;  // 24 bits (ECE)
  uint64_t service_id = 0;
  uint64_t local_ca_guid = 0;
  uint32_t local_qkey = 0;
  uint32_t local_qpn = 0;  // 24 bits
  uint8_t responder_resources = 0;
  uint32_t local_eecn = 0;  // 24 bits
  uint8_t initiator_depth = 0;
  uint32_t remote_eecn = 0;                // 24 bits
  uint8_t remote_cm_response_timeout = 0;  // 5 bits
  TransportType transport_service_type = TransportType::kRc;
  bool end_to_end_flow_control = false;
  uint32_t starting_psn = 0;              // 24 bits
  uint8_t local_cm_response_timeout = 0;  // 5 bits
  uint8_t retry_count = 0;                // 3 bits
  uint16_t partition_key = 0xFFFF;
  uint8_t path_mtu = 0;  // 4 bits (IB MTU enum: 1 = 256 .. 5 = 4096)
  bool rdc_exists = false;
  uint8_t rnr_retry_count = 0;  // 3 bits
  uint8_t max_cm_retries = 0;   // 4 bits
  bool srq = false;
  uint8_t extended_transport_type = 0;  // 3 bits (1 = XRC)
  Path primary;
  Path alternate;  // all zero when there is none
  bool sap_supported = false;
  PrivateData private_data;  // <= kReqPrivateDataSize

  bool operator==(const Req&) const = default;
};

struct Mra {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  MessageCode message_mraed = MessageCode::kReq;
  uint8_t service_timeout = 0;  // 5 bits
  PrivateData private_data;     // <= kMraPrivateDataSize

  bool operator==(const Mra&) const = default;
};

struct Rej {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  MessageCode message_rejected = MessageCode::kReq;
  uint16_t reason = 0;  // RejectReason, kept raw: peers send codes we may not know
  std::vector<uint8_t> ari;  // additional rejection information, <= kRejAriSize (length is on the wire)
  PrivateData private_data;  // <= kRejPrivateDataSize

  bool operator==(const Rej&) const = default;
};

struct Rep {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  uint32_t local_qkey = 0;
  uint32_t local_qpn = 0;   // 24 bits
  uint32_t local_eecn = 0;  // 24 bits (the XRC target's QPN for XRC)
  uint32_t starting_psn = 0;  // 24 bits
  uint32_t vendor_id = 0;     // 24 bits, split over bytes 15, 19, 23 (ECE)
  uint8_t responder_resources = 0;
  uint8_t initiator_depth = 0;
  uint8_t target_ack_delay = 0;    // 5 bits
  uint8_t failover_accepted = 0;   // 2 bits
  bool end_to_end_flow_control = false;
  uint8_t rnr_retry_count = 0;  // 3 bits
  bool srq = false;
  uint64_t local_ca_guid = 0;
  PrivateData private_data;  // <= kRepPrivateDataSize

  bool operator==(const Rep&) const = default;
};

struct Rtu {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  PrivateData private_data;  // <= kRtuPrivateDataSize

  bool operator==(const Rtu&) const = default;
};

struct Dreq {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  uint32_t remote_qpn_eecn = 0;  // 24 bits
  PrivateData private_data;      // <= kDreqPrivateDataSize

  bool operator==(const Dreq&) const = default;
};

struct Drep {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  PrivateData private_data;  // <= kDrepPrivateDataSize

  bool operator==(const Drep&) const = default;
};

struct SidrReq {
  uint32_t request_id = 0;
  uint16_t partition_key = 0xFFFF;
  uint64_t service_id = 0;
  PrivateData private_data;  // <= kSidrReqPrivateDataSize

  bool operator==(const SidrReq&) const = default;
};

struct SidrRep {
  uint32_t request_id = 0;
  uint8_t status = 0;  // SidrStatus, kept raw
  uint32_t vendor_id = 0;  // 24 bits, bytes 6-7 and 11 (ECE)
  uint32_t qpn = 0;        // 24 bits
  uint64_t service_id = 0;
  uint32_t qkey = 0;
  std::vector<uint8_t> additional_info;  // <= kSidrRepInfoSize
  PrivateData private_data;              // <= kSidrRepPrivateDataSize

  bool operator==(const SidrRep&) const = default;
};

struct Lap {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  uint32_t remote_qpn_eecn = 0;            // 24 bits
  uint8_t remote_cm_response_timeout = 0;  // 5 bits
  LapPath alternate;
  PrivateData private_data;  // <= kLapPrivateDataSize

  bool operator==(const Lap&) const = default;
};

struct Apr {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  uint8_t status = 0;                    // AprStatus, kept raw
  std::vector<uint8_t> additional_info;  // <= kAprInfoSize
  PrivateData private_data;              // <= kAprPrivateDataSize

  bool operator==(const Apr&) const = default;
};

using Message = std::variant<Req, Mra, Rej, Rep, Rtu, Dreq, Drep, SidrReq, SidrRep, Lap, Apr>;

// The attribute id a message is sent with.
AttributeId attribute_of(const Message& message);

struct Mad {
  MadHeader header;
  Message message;

  bool operator==(const Mad&) const = default;
};

// A MAD header for a CM message: version 1, class 0x07, class version 2,
// method Send, the given transaction id.
MadHeader cm_header(uint64_t transaction_id, uint32_t attribute_modifier = 0);

// Parses one CM MAD (exactly kMadSize bytes: the UD payload after the
// GRH/BTH/DETH). Errors are EBADMSG (EMSGSIZE for a wrong size, EPROTONOSUPPORT
// for a version, ENOTSUP for an attribute or method the CM does not have),
// naming the field and the value found.
Result<Mad> parse_mad(std::span<const uint8_t> bytes);

// Parses only the common header (at least kMadHeaderSize bytes), without
// checking class or versions: for answering a bad MAD (e.g. a REJ with
// "invalid class version") and for logging.
Result<MadHeader> parse_mad_header(std::span<const uint8_t> bytes);

// Builds the 256-byte MAD. Fails (EINVAL, or EMSGSIZE for private data or
// additional information too long) naming the field whose value does not
// fit; nothing is written then.
Result<std::array<uint8_t, kMadSize>> build_mad(const Mad& mad);

}  // namespace ufab::cm
