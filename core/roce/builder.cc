#include "core/roce/builder.h"

#include <cstring>

#include "core/roce/bytes.h"

namespace ufab::roce {
namespace {

struct ErrorText {
  const char* name;
  const char* text;
};

constexpr ErrorText kErrorText[] = {
    {"ok", "built"},
    {"unknown_opcode", "opcode is not an RC, UC or UD opcode ufab knows"},
    {"payload_not_allowed", "payload given for an opcode that carries none"},
    {"payload_not_eight", "ATOMIC_WRITE carries exactly 8 bytes of payload"},
    {"payload_too_large", "payload makes the IPv4 datagram longer than 65535 bytes"},
    {"field_out_of_range",
     "a 24-bit field (QPN, PSN, MSN) exceeds 0xFFFFFF, a FETH field exceeds its 4 or 2 bits, or IPv4 flags set MF"},
    {"buffer_too_small", "output buffer is shorter than the frame"},
};
static_assert(std::size(kErrorText) == static_cast<size_t>(BuildError::kCount));

constexpr size_t kMaxDatagram = 0xFFFF;

// Everything about a frame that does not depend on where it is written.
struct Layout {
  BuildError error = BuildError::kOk;
  const OpcodeInfo* op = nullptr;
  size_t payload_len = 0;
  uint8_t pad = 0;
  size_t header_len = 0;  // Ethernet .. extension headers
  size_t ip_total = 0;
};

Layout plan(const FrameSpec& s, std::span<const std::span<const uint8_t>> payload) {
  Layout l;
  l.op = opcode_info(s.bth.opcode);
  if (l.op == nullptr) return l.error = BuildError::kUnknownOpcode, l;

  constexpr uint32_t k24 = 0xFFFFFF;
  if (s.bth.dest_qp > k24 || s.bth.psn > k24 || (l.op->has(kAeth) && s.ext.aeth.msn > k24) ||
      (l.op->has(kDeth) && s.ext.deth.src_qp > k24) ||
      (l.op->has(kFeth) && (s.ext.feth.placement_type > feth::kPlacementMask ||
                            s.ext.feth.selectivity_level > feth::kSelectivityMask)) ||
      s.ip_flags > 0x7 ||
      (s.ip_flags & kIpFlagMoreFragments) != 0)
    return l.error = BuildError::kFieldOutOfRange, l;

  const size_t ext = l.op->ext_bytes();
  const size_t fixed = kIpv4Bytes + kUdpBytes + kBthBytes + ext + kIcrcBytes;
  // Sum piece by piece so the total can never wrap.
  for (auto piece : payload) {
    if (piece.size() > kMaxDatagram - fixed - l.payload_len) return l.error = BuildError::kPayloadTooLarge, l;
    l.payload_len += piece.size();
  }
  if (l.op->payload == PayloadRule::kNone && l.payload_len != 0)
    return l.error = BuildError::kPayloadNotAllowed, l;
  if (l.op->payload == PayloadRule::kExactly8 && l.payload_len != 8) return l.error = BuildError::kPayloadNotEight, l;
  l.pad = pad_for(l.payload_len);
  if (fixed + l.payload_len + l.pad > kMaxDatagram) return l.error = BuildError::kPayloadTooLarge, l;
  l.header_len = kBthOffset + kBthBytes + ext;
  l.ip_total = fixed + l.payload_len + l.pad;
  return l;
}

// Writes Ethernet through extension headers into `h` (l.header_len bytes)
// and returns the ICRC register after them.
uint32_t write_headers(const FrameSpec& s, const Layout& l, uint8_t* h, CrcImpl crc) {
  write_eth(std::span<uint8_t, kEthBytes>(h, kEthBytes), EthHeader{s.dst_mac, s.src_mac, kEtherTypeIpv4});

  Ipv4Header ip;
  ip.tos = s.traffic_class;
  ip.total_length = static_cast<uint16_t>(l.ip_total);
  ip.id = s.ip_id;
  ip.flags = s.ip_flags;
  ip.ttl = s.hop_limit;
  ip.protocol = kIpProtoUdp;
  ip.src = s.src_ip;
  ip.dst = s.dst_ip;
  auto iph = std::span<uint8_t, kIpv4Bytes>(h + kEthBytes, kIpv4Bytes);
  write_ipv4(iph, ip);
  store_be16(h + kEthBytes + 10, ipv4_header_checksum(iph));

  // UDP checksum 0, as rxe sends it (prepare_udp_hdr): the ICRC covers
  // the datagram, and a zero checksum means "none" over IPv4.
  write_udp(std::span<uint8_t, kUdpBytes>(h + kEthBytes + kIpv4Bytes, kUdpBytes),
            UdpHeader{s.udp_sport, kRoceV2Port, static_cast<uint16_t>(l.ip_total - kIpv4Bytes), 0});

  Bth bth = s.bth;
  bth.pad = l.pad;
  bth.tver = 0;
  write_bth(std::span<uint8_t, kBthBytes>(h + kBthOffset, kBthBytes), bth);
  const size_t ext = l.op->ext_bytes();
  write_ext_headers(l.op->headers, std::span<uint8_t>(h + kBthOffset + kBthBytes, ext), s.ext);

  uint32_t state = icrc_begin(std::span<const uint8_t, kIcrcHeaderBytes>(h + kEthBytes, kIcrcHeaderBytes), crc);
  state = icrc_update(state, std::span<const uint8_t>(h + kBthOffset + kBthBytes, ext), crc);
  // rxe's FLUSH ICRC covers the BTH and extension headers twice (icrc.h);
  // a FLUSH has no payload or pad, so the repeat goes right here.
  if (icrc_repeats_headers(bth.opcode)) {
    state = icrc_update(state, std::span<const uint8_t>(h + kBthOffset, kBthBytes + ext), crc);
  }
  return state;
}

// Pad (zeros, as rxe writes it) and ICRC into `t`; returns bytes written.
size_t write_trailer(uint32_t state, uint8_t pad, uint8_t* t, CrcImpl crc) {
  static constexpr uint8_t kZeros[3] = {0, 0, 0};
  std::memset(t, 0, pad);
  state = icrc_update(state, std::span<const uint8_t>(kZeros, pad), crc);
  store_le32(t + pad, icrc_finish(state));
  return pad + kIcrcBytes;
}

}  // namespace

const char* build_error_name(BuildError e) {
  auto i = static_cast<size_t>(e);
  return i < std::size(kErrorText) ? kErrorText[i].name : "invalid";
}

const char* build_error_text(BuildError e) {
  auto i = static_cast<size_t>(e);
  return i < std::size(kErrorText) ? kErrorText[i].text : "invalid BuildError value";
}

size_t header_length(uint8_t opcode) {
  const OpcodeInfo* op = opcode_info(opcode);
  return op ? kBthOffset + kBthBytes + op->ext_bytes() : 0;
}

size_t frame_length(uint8_t opcode, size_t payload_len) {
  size_t h = header_length(opcode);
  return h ? h + payload_len + pad_for(payload_len) + kIcrcBytes : 0;
}

BuildResult build_frame_gather(const FrameSpec& spec, std::span<const std::span<const uint8_t>> payload,
                               std::span<uint8_t> out, CrcImpl crc) {
  BuildResult r;
  Layout l = plan(spec, payload);
  if (l.error != BuildError::kOk) return r.error = l.error, r;
  const size_t len = kEthBytes + l.ip_total;
  if (out.size() < len) return r.error = BuildError::kBufferTooSmall, r;

  uint8_t* f = out.data();
  uint32_t state = write_headers(spec, l, f, crc);
  uint8_t* p = f + l.header_len;
  for (auto piece : payload) {
    if (piece.empty()) continue;
    std::memcpy(p, piece.data(), piece.size());
    p += piece.size();
  }
  state = icrc_update(state, std::span<const uint8_t>(f + l.header_len, l.payload_len), crc);
  write_trailer(state, l.pad, p, crc);
  r.length = len;
  return r;
}

BuildResult build_frame(const FrameSpec& spec, std::span<const uint8_t> payload, std::span<uint8_t> out,
                        CrcImpl crc) {
  return build_frame_gather(spec, std::span<const std::span<const uint8_t>>(&payload, 1), out, crc);
}

SplitBuildResult build_frame_split(const FrameSpec& spec, std::span<const std::span<const uint8_t>> payload,
                                   std::span<uint8_t> headers, std::span<uint8_t, kMaxTrailerBytes> trailer,
                                   CrcImpl crc) {
  SplitBuildResult r;
  Layout l = plan(spec, payload);
  if (l.error != BuildError::kOk) return r.error = l.error, r;
  if (headers.size() < l.header_len) return r.error = BuildError::kBufferTooSmall, r;

  uint32_t state = write_headers(spec, l, headers.data(), crc);
  for (auto piece : payload) state = icrc_update(state, piece, crc);
  r.header_length = l.header_len;
  r.trailer_length = write_trailer(state, l.pad, trailer.data(), crc);
  return r;
}

}  // namespace ufab::roce
