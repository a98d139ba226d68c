#include "core/roce/parser.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "core/roce/bytes.h"
#include "core/roce/wire_error.h"
#include "tests/unit/roce/test_util.h"

namespace ufab::roce {
namespace {

using Frame = std::vector<uint8_t>;
using testdata::kIcrcVectors;
using testing::fix_checksums;

Frame make(uint8_t opcode, size_t payload_len) {
  std::mt19937_64 rng(opcode * 1000 + payload_len);
  FrameSpec s = testing::random_spec(rng, opcode);
  s.ip_flags = kIpFlagDontFragment;
  Frame payload(payload_len);
  for (auto& b : payload) b = static_cast<uint8_t>(rng());
  Frame f = testing::build(s, payload);
  EXPECT_FALSE(f.empty());
  return f;
}

// Gives the frame a UDP payload (BTH onwards, ICRC included) of exactly
// `len` bytes, cutting or appending zeros, and makes IPv4/UDP lengths and
// checksums consistent, so only the RoCE layer is wrong.
void set_roce_len(Frame& f, size_t len) {
  f.resize(kBthOffset + len, 0);
  store_be16(f.data() + kEthBytes + 2, static_cast<uint16_t>(kIpv4Bytes + kUdpBytes + len));
  store_be16(f.data() + kEthBytes + kIpv4Bytes + 4, static_cast<uint16_t>(kUdpBytes + len));
  fix_checksums(f);
}

ParseError parse_err(const Frame& f) { return parse_frame(f).error; }

TEST(Parser, AcceptsEveryIndependentVectorWithItsFields) {
  for (const auto& v : kIcrcVectors) {
    SCOPED_TRACE(v.name);
    auto r = parse_frame(testing::vector_frame(v));
    ASSERT_TRUE(r) << parse_error_name(r.error);
    const Packet& p = r.packet;
    EXPECT_EQ(p.eth.dst, v.dst_mac);
    EXPECT_EQ(p.eth.src, v.src_mac);
    EXPECT_EQ(p.ip.src, v.src_ip);
    EXPECT_EQ(p.ip.dst, v.dst_ip);
    EXPECT_EQ(p.ip.tos, v.tos);
    EXPECT_EQ(p.ip.ttl, v.ttl);
    EXPECT_EQ(p.ip.id, v.ip_id);
    EXPECT_EQ(p.ip.flags, kIpFlagDontFragment);
    EXPECT_EQ(p.udp.sport, v.sport);
    EXPECT_EQ(p.udp.dport, kRoceV2Port);
    EXPECT_EQ(p.udp.checksum, 0);
    EXPECT_EQ(p.bth.opcode, v.opcode);
    EXPECT_EQ(p.bth.se, v.se);
    EXPECT_EQ(p.bth.migreq, v.migreq);
    EXPECT_EQ(p.bth.pad, pad_for(v.payload_len));
    EXPECT_EQ(p.bth.pkey, v.pkey);
    EXPECT_EQ(p.bth.fecn, v.fecn);
    EXPECT_EQ(p.bth.becn, v.becn);
    EXPECT_EQ(p.bth.dest_qp, v.dest_qp);
    EXPECT_EQ(p.bth.ack_req, v.ack_req);
    EXPECT_EQ(p.bth.psn, v.psn);
    ASSERT_NE(p.op, nullptr);
    EXPECT_EQ(p.op->opcode, v.opcode);
    if (p.has(kReth)) {
      EXPECT_EQ(p.ext.reth, (Reth{v.va, v.rkey, v.dma_len}));
    }
    if (p.has(kAtomicEth)) {
      EXPECT_EQ(p.ext.atomic_eth, (AtomicEth{v.va, v.rkey, v.swap_add, v.compare}));
    }
    if (p.has(kAeth)) {
      EXPECT_EQ(p.ext.aeth, (Aeth{v.syndrome, v.msn}));
    }
    if (p.has(kAtomicAckEth)) {
      EXPECT_EQ(p.ext.atomic_ack.original, v.orig);
    }
    if (p.has(kImmDt)) {
      EXPECT_EQ(p.ext.immdt.imm, v.imm);
    }
    if (p.has(kDeth)) {
      EXPECT_EQ(p.ext.deth, (Deth{v.qkey, v.src_qp}));
    }
    if (p.has(kIeth)) {
      EXPECT_EQ(p.ext.ieth.rkey, v.inv_rkey);
    }
    if (p.has(kFeth)) {
      EXPECT_EQ(p.ext.feth.placement_type, v.feth & 0xF);
      EXPECT_EQ(p.ext.feth.selectivity_level, (v.feth >> 4) & 0x3);
    }
    EXPECT_EQ(p.payload.size(), v.payload_len);
    EXPECT_EQ(p.payload.data(), v.frame + header_length(v.opcode));
    EXPECT_EQ(p.icrc, v.icrc);
    EXPECT_EQ(p.ip_offset, 14u);
    EXPECT_EQ(p.udp_offset, 34u);
    EXPECT_EQ(p.bth_offset, 42u);
    EXPECT_EQ(p.payload_offset, header_length(v.opcode));
    EXPECT_EQ(p.icrc_offset, v.frame_len - 4);
    EXPECT_EQ(p.frame_length, v.frame_len);
  }
}

// Each reason provoked on an otherwise valid frame. The three groups are
// plain functions so that one test can also check that together they
// provoke every reason.
using Seen = std::set<ParseError>;

void expect_reject(Seen& seen, const Frame& f, ParseError want, const char* what) {
  ParseError got = parse_err(f);
  EXPECT_EQ(got, want) << what << ": got " << parse_error_name(got) << ", want " << parse_error_name(want);
  seen.insert(got);
}

void reject_ethernet_and_ipv4(Seen& seen) {
  const Frame base = make(op::kRcSendOnly, 37);
  ASSERT_TRUE(parse_frame(base));

  expect_reject(seen, Frame(base.begin(), base.begin() + 13), ParseError::kTruncatedEthernet, "13 bytes");
  Frame f = base;
  f[12] = 0x86, f[13] = 0xDD;
  expect_reject(seen, f, ParseError::kNotIpv4, "IPv6 EtherType");
  f[12] = 0x81, f[13] = 0x00;
  expect_reject(seen, f, ParseError::kNotIpv4, "VLAN tag");
  expect_reject(seen, Frame(base.begin(), base.begin() + 33), ParseError::kTruncatedIpv4, "33 bytes");

  f = base, f[14] = 0x65, fix_checksums(f);
  expect_reject(seen, f, ParseError::kIpv4Version, "version 6");
  f = base, f[14] = 0x44, fix_checksums(f);
  expect_reject(seen, f, ParseError::kIpv4HeaderLength, "IHL 4");
  f = base, f[14] = 0x46, fix_checksums(f);
  expect_reject(seen, f, ParseError::kIpv4Options, "IHL 6");

  f = base, store_be16(f.data() + 16, 19), fix_checksums(f);
  expect_reject(seen, f, ParseError::kIpv4LengthTooShort, "total length 19");
  f = base, store_be16(f.data() + 16, static_cast<uint16_t>(base.size() - 14 + 1)), fix_checksums(f);
  expect_reject(seen, f, ParseError::kIpv4LengthExceedsFrame, "total length one past the frame");

  f = base, f.push_back(0);
  expect_reject(seen, f, ParseError::kTrailingBytes, "a byte after the datagram of a 98-byte frame");

  f = base, f[20] |= 0x20, fix_checksums(f);  // MF
  expect_reject(seen, f, ParseError::kIpv4Fragment, "MF");
  f = base, f[21] = 1, fix_checksums(f);  // offset 8 bytes
  expect_reject(seen, f, ParseError::kIpv4Fragment, "fragment offset");

  f = base, f[23] = 6, fix_checksums(f);
  expect_reject(seen, f, ParseError::kNotUdp, "TCP");
  f = base, f[24] ^= 0x01;
  expect_reject(seen, f, ParseError::kIpv4Checksum, "checksum off by one bit");
  f = base, f[22] -= 1;  // TTL changed without fixing the checksum
  expect_reject(seen, f, ParseError::kIpv4Checksum, "TTL edited");
}

void reject_udp(Seen& seen) {
  const Frame base = make(op::kRcSendOnly, 37);
  Frame f(base.begin(), base.begin() + kEthBytes + kIpv4Bytes + 7);
  store_be16(f.data() + 16, kIpv4Bytes + 7), fix_checksums(f);
  expect_reject(seen, f, ParseError::kTruncatedUdp, "7-byte UDP datagram");

  f = base, store_be16(f.data() + 38, load_be16(f.data() + 38) + 1);
  expect_reject(seen, f, ParseError::kUdpLength, "UDP length + 1");
  f = base, store_be16(f.data() + 38, load_be16(f.data() + 38) - 1);
  expect_reject(seen, f, ParseError::kUdpLength, "UDP length - 1");
  f = base, store_be16(f.data() + 38, 7);
  expect_reject(seen, f, ParseError::kUdpLength, "UDP length 7");

  f = base, store_be16(f.data() + 36, 4792);
  expect_reject(seen, f, ParseError::kNotRoce, "port 4792");

  f = base, store_be16(f.data() + 40, 0x1234);
  expect_reject(seen, f, ParseError::kUdpChecksum, "wrong UDP checksum");
}

// FETH as rxe's feth_plt/feth_sel read it: bits 3:0 and 5:4; the reserved
// bits 31:6 are ignored, whatever they hold.
TEST(Parser, ReadsEveryFethFieldAndIgnoresReservedBits) {
  Frame base = make(op::kRcFlush, 0);
  for (uint32_t reserved : {0u, 0x3FFFFFFu, 0x2AAAAAAu}) {
    for (uint8_t type = 0; type < 16; ++type) {
      for (uint8_t level = 0; level < 4; ++level) {
        Frame f = base;
        store_be32(f.data() + kBthOffset + kBthBytes, reserved << 6 | uint32_t(level) << 4 | type);
        fix_checksums(f);
        auto r = parse_frame(f);
        ASSERT_TRUE(r) << parse_error_name(r.error);
        EXPECT_EQ(r.packet.ext.feth.placement_type, type);
        EXPECT_EQ(r.packet.ext.feth.selectivity_level, level);
        EXPECT_EQ(feth::defined(r.packet.ext.feth), (type == 1 || type == 2 || type == 3) && level <= 1);
      }
    }
  }
  // The RETH follows the FETH.
  auto r = parse_frame(base);
  ASSERT_TRUE(r);
  EXPECT_EQ(r.packet.ext.reth.va, load_be64(base.data() + kBthOffset + kBthBytes + kFethBytes));
}

TEST(Parser, AtomicWriteCarriesExactlyEightBytes) {
  Frame f = make(op::kRcAtomicWrite, 8);
  auto r = parse_frame(f);
  ASSERT_TRUE(r) << parse_error_name(r.error);
  ASSERT_EQ(r.packet.payload.size(), 8u);
  EXPECT_EQ(r.packet.payload.data(), f.data() + kBthOffset + kBthBytes + kRethBytes);
  for (size_t n : {0u, 4u, 12u, 16u}) {
    Frame g = f;
    set_roce_len(g, kBthBytes + kRethBytes + n + kIcrcBytes);
    EXPECT_EQ(parse_err(g), ParseError::kUnexpectedPayload) << n << " bytes";
  }
  Frame flush = make(op::kRcFlush, 0);
  set_roce_len(flush, kBthBytes + kFethBytes + kRethBytes + 4 + kIcrcBytes);
  EXPECT_EQ(parse_err(flush), ParseError::kUnexpectedPayload) << "FLUSH carries no payload";
}

TEST(Parser, AcceptsACorrectUdpChecksum) {
  Frame f = make(op::kRcSendOnly, 37);
  // RFC 768 checksum over the pseudo-header and the datagram (field zero).
  uint32_t src = load_be32(f.data() + 26), dst = load_be32(f.data() + 30);
  size_t udp_len = f.size() - 34;
  uint64_t sum = (src >> 16) + (src & 0xFFFF) + (dst >> 16) + (dst & 0xFFFF) + 17 + udp_len;
  for (size_t i = 34; i < f.size(); i += 2) sum += (f[i] << 8) | (i + 1 < f.size() ? f[i + 1] : 0);
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  uint16_t c = static_cast<uint16_t>(~sum);
  store_be16(f.data() + 40, c == 0 ? 0xFFFF : c);
  auto r = parse_frame(f);
  ASSERT_TRUE(r) << parse_error_name(r.error);
  EXPECT_EQ(r.packet.udp.checksum, c == 0 ? 0xFFFF : c);
  ParseOptions o;
  o.verify_udp_checksum = false;
  store_be16(f.data() + 40, 0x1234);
  EXPECT_TRUE(parse_frame(f, o));
}

void reject_transport(Seen& seen) {
  const Frame base = make(op::kRcSendOnly, 37);
  Frame f = base;
  set_roce_len(f, 11);
  expect_reject(seen, f, ParseError::kTruncatedBth, "11-byte UDP payload");

  f = base, f[43] |= 0x01, fix_checksums(f);
  expect_reject(seen, f, ParseError::kBadTver, "TVer 1");
  f = base, f[42] = 0x15, fix_checksums(f);
  expect_reject(seen, f, ParseError::kUnknownOpcode, "reserved opcode 0x15");
  f = base, f[42] = 0x40, fix_checksums(f);
  expect_reject(seen, f, ParseError::kUnknownOpcode, "RD opcode");
  f = base, f[42] = 0x81, fix_checksums(f);
  expect_reject(seen, f, ParseError::kUnknownOpcode, "CNP");

  f = make(op::kRcWriteOnly, 64);
  set_roce_len(f, kBthBytes + kRethBytes - 1);
  expect_reject(seen, f, ParseError::kTruncatedExtHeaders, "RETH one byte short");

  f = base;
  set_roce_len(f, kBthBytes + 3);
  expect_reject(seen, f, ParseError::kTruncatedIcrc, "3 bytes for the ICRC");

  f = make(op::kRcSendOnly, 0);
  f[43] |= 0x10, fix_checksums(f);  // pad 1 with nothing before the ICRC
  expect_reject(seen, f, ParseError::kPadExceedsPayload, "pad 1 on an empty payload");

  f = make(op::kRcSendOnly, 4);
  set_roce_len(f, kBthBytes + 5 + kIcrcBytes);
  expect_reject(seen, f, ParseError::kMisalignedPayload, "payload + pad = 5");

  f = make(op::kRcAck, 0);
  set_roce_len(f, kBthBytes + kAethBytes + 4 + kIcrcBytes);
  expect_reject(seen, f, ParseError::kUnexpectedPayload, "4 payload bytes on an ACK");
  f = make(op::kRcAtomicWrite, 8);
  set_roce_len(f, kBthBytes + kRethBytes + 4 + kIcrcBytes);
  expect_reject(seen, f, ParseError::kUnexpectedPayload, "4-byte ATOMIC_WRITE");

  f = base, f[f.size() - 1] ^= 0x80;
  expect_reject(seen, f, ParseError::kBadIcrc, "ICRC bit flipped");
  f = base, f[60] ^= 0x01;
  expect_reject(seen, f, ParseError::kBadIcrc, "payload bit flipped");
  f = base, f[53] ^= 0x01, fix_checksums(f);  // PSN edited, ICRC recomputed: fine
  EXPECT_TRUE(parse_frame(f));
  f[53] ^= 0x02;
  expect_reject(seen, f, ParseError::kBadIcrc, "PSN edited after the ICRC");
}

TEST(ParserRejects, EthernetAndIpv4) {
  Seen seen;
  reject_ethernet_and_ipv4(seen);
}

TEST(ParserRejects, Udp) {
  Seen seen;
  reject_udp(seen);
}

TEST(ParserRejects, TransportHeaders) {
  Seen seen;
  reject_transport(seen);
}

TEST(ParserRejects, EveryReasonIsProvoked) {
  Seen seen;
  reject_ethernet_and_ipv4(seen);
  reject_udp(seen);
  reject_transport(seen);
  for (size_t i = 1; i < kParseErrorCount; ++i)
    EXPECT_EQ(seen.count(static_cast<ParseError>(i)), 1u) << parse_error_name(static_cast<ParseError>(i));
}

TEST(Parser, ReasonNamesAreDistinct) {
  std::set<std::string> names;
  for (size_t i = 0; i < kParseErrorCount; ++i) {
    auto e = static_cast<ParseError>(i);
    names.insert(parse_error_name(e));
    if (i > 0) {
      EXPECT_GT(strlen(parse_error_text(e)), 20u) << parse_error_name(e);
    }
  }
  EXPECT_EQ(names.size(), kParseErrorCount);
  EXPECT_STREQ(parse_error_name(ParseError::kBadIcrc), "bad_icrc");
  EXPECT_STREQ(parse_error_name(ParseError::kCount), "invalid");
}

TEST(Parser, EthernetMinimumPaddingIsAllowed) {
  Frame f = make(op::kRcSendOnly, 0);
  ASSERT_EQ(f.size(), 58u);
  f.resize(60, 0);
  auto r = parse_frame(f);
  ASSERT_TRUE(r) << parse_error_name(r.error);
  EXPECT_EQ(r.packet.frame_length, 58u);
  EXPECT_TRUE(r.packet.payload.empty());
  f.push_back(0);
  EXPECT_EQ(parse_err(f), ParseError::kTrailingBytes);
}

// Every prefix of every vector is rejected, and for the right reason: the
// IPv4 total length is checked before anything behind it is read.
TEST(Parser, EveryTruncationIsRejected) {
  for (const auto& v : kIcrcVectors) {
    auto full = testing::vector_frame(v);
    for (size_t n = 0; n < full.size(); ++n) {
      ParseError want = n < kEthBytes                ? ParseError::kTruncatedEthernet
                        : n < kEthBytes + kIpv4Bytes ? ParseError::kTruncatedIpv4
                                                     : ParseError::kIpv4LengthExceedsFrame;
      // A copy of exactly n bytes, so a sanitizer sees any read past it.
      Frame cut(full.begin(), full.begin() + n);
      ASSERT_EQ(parse_err(cut), want) << v.name << " cut to " << n;
    }
  }
}

// Datagrams whose IPv4 and UDP lengths agree but end inside the RoCE
// headers: the reason names the header that is cut.
TEST(Parser, ConsistentTruncationNamesTheHeader) {
  for (const auto& e : opcode_table()) {
    Frame base = make(e.opcode, e.payload == PayloadRule::kExactly8 ? 8 : 0);
    size_t ext = e.ext_bytes();
    for (size_t len = 0; len < kBthBytes + ext + kIcrcBytes; ++len) {
      Frame f = base;
      set_roce_len(f, len);
      ParseError want = len < kBthBytes         ? ParseError::kTruncatedBth
                        : len < kBthBytes + ext ? ParseError::kTruncatedExtHeaders
                                                : ParseError::kTruncatedIcrc;
      ASSERT_EQ(parse_err(f), want) << opcode_full_name(e.opcode) << " roce len " << len;
    }
  }
}

TEST(Parser, OptionsSkipChecks) {
  Frame f = make(op::kRcWriteOnly, 100);
  f[f.size() - 2] ^= 1;
  f[24] ^= 1;
  EXPECT_EQ(parse_err(f), ParseError::kIpv4Checksum);
  ParseOptions o;
  o.verify_ipv4_checksum = false;
  EXPECT_EQ(parse_frame(f, o).error, ParseError::kBadIcrc);
  o.verify_icrc = false;
  EXPECT_TRUE(parse_frame(f, o));
  for (CrcImpl impl : {CrcImpl::kBytewise, CrcImpl::kSlice8, CrcImpl::kPclmul}) {
    ParseOptions c;
    c.crc = impl;
    EXPECT_TRUE(parse_frame(make(op::kRcWriteOnly, 100), c));
  }
}

TEST(Parser, OutParameterFormAndErrorValues) {
  Packet p;
  EXPECT_EQ(parse_frame(testing::vector_frame(kIcrcVectors[0]), p), ParseError::kOk);
  EXPECT_EQ(p.bth.opcode, kIcrcVectors[0].opcode);

  Frame bad = make(op::kRcSendOnly, 3);
  bad.back() ^= 1;
  auto r = parse_frame_result(bad);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), EBADMSG);
  EXPECT_NE(r.error().message().find("bad_icrc"), std::string::npos) << r.error().message();
  EXPECT_TRUE(parse_frame_result(make(op::kRcSendOnly, 3)).has_value());
}

}  // namespace
}  // namespace ufab::roce
