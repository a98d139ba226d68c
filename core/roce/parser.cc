#include "core/roce/parser.h"

#include "core/roce/bytes.h"

namespace ufab::roce {
namespace {

struct ErrorText {
  const char* name;
  const char* text;
};

constexpr ErrorText kErrorText[] = {
    {"ok", "accepted"},
    {"truncated_ethernet", "frame shorter than the 14-byte Ethernet header"},
    {"not_ipv4", "EtherType is not IPv4 (0x0800)"},
    {"truncated_ipv4", "frame too short for a 20-byte IPv4 header"},
    {"ipv4_version", "IPv4 version field is not 4"},
    {"ipv4_header_length", "IPv4 header length (IHL) below 5 words"},
    {"ipv4_options", "IPv4 header carries options, which RoCEv2 peers never send"},
    {"ipv4_length_too_short", "IPv4 total length smaller than its own header"},
    {"ipv4_length_exceeds_frame", "IPv4 total length runs past the end of the frame"},
    {"trailing_bytes", "bytes after the IPv4 datagram beyond Ethernet minimum-size padding"},
    {"ipv4_fragment", "IPv4 fragment (MF set or non-zero offset); RoCEv2 is never fragmented"},
    {"not_udp", "IPv4 protocol is not UDP (17)"},
    {"ipv4_checksum", "IPv4 header checksum does not verify"},
    {"truncated_udp", "IPv4 datagram too short for the 8-byte UDP header"},
    {"udp_length", "UDP length disagrees with the IPv4 total length"},
    {"not_roce", "UDP destination port is not RoCEv2 (4791)"},
    {"udp_checksum", "non-zero UDP checksum does not verify"},
    {"truncated_bth", "UDP payload shorter than the 12-byte base transport header"},
    {"bad_tver", "BTH transport header version is not 0"},
    {"unknown_opcode", "BTH opcode is not an RC, UC or UD opcode ufab knows"},
    {"truncated_ext_headers", "packet too short for the extension headers its opcode requires"},
    {"truncated_icrc", "fewer than 4 bytes left for the ICRC"},
    {"pad_exceeds_payload", "BTH pad count larger than the bytes before the ICRC"},
    {"misaligned_payload", "payload plus pad is not a multiple of 4 bytes"},
    {"unexpected_payload", "payload on an opcode that carries none (or not 8 bytes on ATOMIC_WRITE)"},
    {"bad_icrc", "ICRC does not match the packet"},
};
static_assert(std::size(kErrorText) == kParseErrorCount, "one text per ParseError");

}  // namespace

const char* parse_error_name(ParseError e) {
  auto i = static_cast<size_t>(e);
  return i < kParseErrorCount ? kErrorText[i].name : "invalid";
}

const char* parse_error_text(ParseError e) {
  auto i = static_cast<size_t>(e);
  return i < kParseErrorCount ? kErrorText[i].text : "invalid ParseError value";
}

ParseError parse_frame(std::span<const uint8_t> f, Packet& p, const ParseOptions& o) {
  using E = ParseError;
  const size_t n = f.size();

  // Ethernet. Untagged only: rxe over a VLAN device would add 802.1Q, and
  // ufab's NIC plugins deliver untagged frames.
  if (n < kEthBytes) return E::kTruncatedEthernet;
  p.eth = read_eth(f.first<kEthBytes>());
  if (p.eth.ethertype != kEtherTypeIpv4) return E::kNotIpv4;

  // IPv4: exactly 20 bytes, because rxe's ICRC covers sizeof(struct iphdr)
  // and nothing of options; a datagram that fits the frame; no fragments.
  p.ip_offset = kEthBytes;
  if (n < kEthBytes + kIpv4Bytes) return E::kTruncatedIpv4;
  auto iph = f.subspan<kEthBytes, kIpv4Bytes>();
  p.ip = read_ipv4(iph);
  if (p.ip.version != 4) return E::kIpv4Version;
  if (p.ip.ihl < 5) return E::kIpv4HeaderLength;
  if (p.ip.ihl > 5) return E::kIpv4Options;
  const size_t total = p.ip.total_length;
  if (total < kIpv4Bytes) return E::kIpv4LengthTooShort;
  if (total > n - kEthBytes) return E::kIpv4LengthExceedsFrame;
  p.frame_length = static_cast<uint32_t>(kEthBytes + total);
  // Senders pad frames to the 60-byte Ethernet minimum; anything longer
  // must end with the datagram (the FCS is stripped by the NIC).
  if (n > p.frame_length && n > kEthMinFrame) return E::kTrailingBytes;
  if ((p.ip.flags & kIpFlagMoreFragments) != 0 || p.ip.fragment_offset != 0) return E::kIpv4Fragment;
  if (p.ip.protocol != kIpProtoUdp) return E::kNotUdp;
  if (o.verify_ipv4_checksum && !ipv4_header_checksum_ok(iph)) return E::kIpv4Checksum;

  // UDP.
  p.udp_offset = kEthBytes + kIpv4Bytes;
  const size_t udp_len = total - kIpv4Bytes;
  if (udp_len < kUdpBytes) return E::kTruncatedUdp;
  p.udp = read_udp(f.subspan<kEthBytes + kIpv4Bytes, kUdpBytes>());
  if (p.udp.length != udp_len) return E::kUdpLength;
  if (p.udp.dport != kRoceV2Port) return E::kNotRoce;
  if (o.verify_udp_checksum && p.udp.checksum != 0 &&
      !udp_checksum_ok(p.ip.src, p.ip.dst, f.subspan(p.udp_offset, udp_len)))
    return E::kUdpChecksum;

  // BTH.
  p.bth_offset = kBthOffset;
  const size_t roce_len = udp_len - kUdpBytes;  // BTH through ICRC
  if (roce_len < kBthBytes) return E::kTruncatedBth;
  p.bth = read_bth(f.subspan<kBthOffset, kBthBytes>());
  if (p.bth.tver != 0) return E::kBadTver;
  p.op = opcode_info(p.bth.opcode);
  if (p.op == nullptr) return E::kUnknownOpcode;

  // Extension headers, then what is left: payload, pad, ICRC.
  const size_t ext_len = p.op->ext_bytes();
  if (roce_len - kBthBytes < ext_len) return E::kTruncatedExtHeaders;
  read_ext_headers(p.op->headers, f.subspan(kBthOffset + kBthBytes, ext_len), p.ext);
  const size_t rest = roce_len - kBthBytes - ext_len;
  if (rest < kIcrcBytes) return E::kTruncatedIcrc;
  const size_t body = rest - kIcrcBytes;  // payload + pad
  if (p.bth.pad > body) return E::kPadExceedsPayload;
  // Headers are whole words, so the packet is word-aligned exactly when
  // payload + pad is (IBA 9.2: PadCnt pads the payload to a 4-byte multiple).
  // This also pins PadCnt to (-payload) & 3.
  if (body % 4 != 0) return E::kMisalignedPayload;
  const size_t payload_len = body - p.bth.pad;
  if ((p.op->payload == PayloadRule::kNone && body != 0) ||
      (p.op->payload == PayloadRule::kExactly8 && payload_len != 8))
    return E::kUnexpectedPayload;

  p.payload_offset = static_cast<uint32_t>(kBthOffset + kBthBytes + ext_len);
  p.payload = f.subspan(p.payload_offset, payload_len);
  p.icrc_offset = static_cast<uint32_t>(p.payload_offset + body);
  p.icrc = load_le32(f.data() + p.icrc_offset);

  if (o.verify_icrc && icrc_ipv4(f.subspan(kEthBytes, total - kIcrcBytes), o.crc) != p.icrc)
    return E::kBadIcrc;
  return E::kOk;
}

ParseResult parse_frame(std::span<const uint8_t> frame, const ParseOptions& options) {
  ParseResult r;
  r.error = parse_frame(frame, r.packet, options);
  return r;
}

}  // namespace ufab::roce
