#include "core/roce/builder.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "core/roce/bytes.h"
#include "core/roce/parser.h"
#include "core/roce/wire_error.h"
#include "tests/unit/roce/test_util.h"

namespace ufab::roce {
namespace {

using Frame = std::vector<uint8_t>;
using Piece = std::span<const uint8_t>;
using testdata::kIcrcVectors;

// The builder reproduces, byte for byte, every frame the independent
// Python generator made from the same fields.
TEST(Builder, ReproducesIndependentVectorsExactly) {
  for (const auto& v : kIcrcVectors) {
    FrameSpec s = testing::spec_from_vector(v);
    Frame out(v.frame_len + 8, 0xEE);
    BuildResult r = build_frame(s, testing::vector_payload(v), out);
    ASSERT_TRUE(r) << v.name << ": " << build_error_name(r.error);
    ASSERT_EQ(r.length, v.frame_len) << v.name;
    EXPECT_EQ(Frame(out.begin(), out.begin() + r.length), Frame(v.frame, v.frame + v.frame_len)) << v.name;
    EXPECT_EQ(out[r.length], 0xEE) << v.name << ": wrote past the frame";
    for (CrcImpl impl : {CrcImpl::kBytewise, CrcImpl::kSlice8, CrcImpl::kPclmul}) {
      Frame again(v.frame_len);
      ASSERT_TRUE(build_frame(s, testing::vector_payload(v), again, impl));
      EXPECT_EQ(again, Frame(v.frame, v.frame + v.frame_len)) << v.name << " " << crc_impl_name(impl);
    }
  }
}

TEST(Builder, WritesWhatRxeWrites) {
  std::mt19937_64 rng(7);
  FrameSpec s = testing::random_spec(rng, op::kRcSendOnly);
  s.ip_flags = kIpFlagDontFragment;
  s.bth.tver = 9;  // ignored: TVer is always 0
  s.bth.pad = 2;   // ignored: derived from the payload
  Frame payload(5, 0x77);
  Frame f = testing::build(s, payload);
  ASSERT_EQ(f.size(), 14u + 20 + 8 + 12 + 5 + 3 + 4);
  EXPECT_EQ(load_be16(f.data() + 12), 0x0800);
  EXPECT_EQ(f[14], 0x45);                          // IPv4, no options
  EXPECT_EQ(f[15], s.traffic_class);               // TOS = traffic class
  EXPECT_EQ(load_be16(f.data() + 16), f.size() - 14);
  EXPECT_EQ(load_be16(f.data() + 18), s.ip_id);
  EXPECT_EQ(load_be16(f.data() + 20), 0x4000);     // DF, offset 0
  EXPECT_EQ(f[22], s.hop_limit);                   // TTL = hop limit
  EXPECT_EQ(f[23], 17);
  EXPECT_TRUE(ipv4_header_checksum_ok(std::span<const uint8_t, 20>(f.data() + 14, 20)));
  EXPECT_EQ(load_be16(f.data() + 34), s.udp_sport);
  EXPECT_EQ(load_be16(f.data() + 36), 4791);
  EXPECT_EQ(load_be16(f.data() + 38), f.size() - 34);
  EXPECT_EQ(load_be16(f.data() + 40), 0);          // no UDP checksum
  EXPECT_EQ(f[43] & 0x0F, 0);                      // TVer 0
  EXPECT_EQ((f[43] >> 4) & 3, 3);                  // pad 3 for 5 bytes
  EXPECT_EQ(f[59], 0);                             // pad bytes are zero
  EXPECT_EQ(f[60], 0);
  EXPECT_EQ(f[61], 0);
  EXPECT_EQ(load_le32(f.data() + 62), icrc_ipv4(std::span<const uint8_t>(f).subspan(14, f.size() - 18)));
}

// FLUSH and ATOMIC_WRITE byte for byte as rxe's init_req_packet lays them
// out: FLUSH = BTH | FETH (feth_init: level << 4 | type, big-endian) | RETH,
// no payload; ATOMIC_WRITE = BTH | RETH (length 8) | the 8 bytes as given.
TEST(Builder, FlushAndAtomicWriteAsRxeLaysThemOut) {
  FrameSpec s;
  s.bth.opcode = op::kRcFlush;
  s.bth.psn = 0x123456;
  s.bth.dest_qp = 0x11;
  s.bth.ack_req = true;
  s.ext.reth = Reth{0x00007F0012345678ull, 0xA1B2C3D4, 4096};
  const struct {
    uint8_t type, level, byte;
  } feths[] = {{feth::kGlobal, feth::kRange, 0x01},       {feth::kPersistent, feth::kRange, 0x02},
               {feth::kGlobal | feth::kPersistent, feth::kRange, 0x03},
               {feth::kGlobal, feth::kWholeRegion, 0x11}, {feth::kPersistent, feth::kWholeRegion, 0x12},
               {feth::kGlobal | feth::kPersistent, feth::kWholeRegion, 0x13}};
  for (const auto& c : feths) {
    s.ext.feth = Feth::make(c.type, c.level);
    Frame f = testing::build(s, {});
    ASSERT_EQ(f.size(), 14u + 20 + 8 + 12 + 4 + 16 + 4);
    EXPECT_EQ(f[42], 0x1C);
    EXPECT_EQ((f[43] >> 4) & 3, 0);  // no pad
    EXPECT_EQ(f[50] & 0x80, 0x80);   // AckReq
    EXPECT_EQ(Frame(f.begin() + 54, f.begin() + 58), (Frame{0, 0, 0, c.byte}));
    EXPECT_EQ(load_be64(f.data() + 58), s.ext.reth.va);
    EXPECT_EQ(load_be32(f.data() + 66), s.ext.reth.rkey);
    EXPECT_EQ(load_be32(f.data() + 70), 4096u);
    auto r = parse_frame(f);
    ASSERT_TRUE(r) << parse_error_name(r.error);
    EXPECT_EQ(r.packet.ext.feth, s.ext.feth);
    EXPECT_EQ(r.packet.ext.reth, s.ext.reth);
    EXPECT_TRUE(r.packet.payload.empty());
  }

  s.bth.opcode = op::kRcAtomicWrite;
  s.ext.reth = Reth{0x00007F0012345678ull, 0xA1B2C3D4, 8};
  const Frame value{0xEF, 0xCD, 0xAB, 0x89, 0x67, 0x45, 0x23, 0x01};  // 0x0123456789ABCDEF in x86 memory
  Frame f = testing::build(s, value);
  ASSERT_EQ(f.size(), 14u + 20 + 8 + 12 + 16 + 8 + 4);
  EXPECT_EQ(f[42], 0x1D);
  EXPECT_EQ((f[43] >> 4) & 3, 0);
  EXPECT_EQ(load_be64(f.data() + 54), s.ext.reth.va);
  EXPECT_EQ(load_be32(f.data() + 62), s.ext.reth.rkey);
  EXPECT_EQ(load_be32(f.data() + 66), 8u);
  EXPECT_EQ(Frame(f.begin() + 70, f.begin() + 78), value);  // no byte swap: stored as it travels
}

// The ICRC of a FLUSH as Linux rxe (6.12) computes it: over the masked
// IPv4/UDP/BTH and the FETH and RETH, then the BTH, FETH and RETH once more
// (icrc.h says why). The frame is one rxe sent in the VM test bed
// (tests/vm/rxe_flush_guest.sh, rdma-core 56's ibv_wr_flush, FLUSH GLOBAL of
// a 4 KiB range); built from the same fields, ufab's is the same, byte for
// byte, and each side's parser takes the other's. The ICRC without the
// repeat (what IBA's definition gives) is refused, as rxe refuses it.
TEST(Builder, FlushIcrcAsRxeComputesIt) {
  const Frame rxe = {
      0x52, 0x54, 0x00, 0x00, 0x00, 0x01, 0x52, 0x54, 0x00, 0x00, 0x00, 0x02, 0x08, 0x00, 0x45, 0x00,  //
      0x00, 0x40, 0x18, 0x34, 0x40, 0x00, 0x40, 0x11, 0x0e, 0x77, 0x0a, 0x00, 0x00, 0x01, 0x0a, 0x00,  //
      0x00, 0x02, 0xe4, 0x4c, 0x12, 0xb7, 0x00, 0x2c, 0x00, 0x00, 0x1c, 0x00, 0xff, 0xff, 0x00, 0x17,  //
      0x11, 0x34, 0x80, 0xf7, 0x88, 0xae, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x7f, 0xb6, 0xce, 0x66,  //
      0x40, 0x00, 0xcd, 0x46, 0xa0, 0x9e, 0x00, 0x00, 0x10, 0x00, 0x84, 0xb6, 0x28, 0x15};
  auto r = parse_frame(rxe);
  ASSERT_TRUE(r) << parse_error_name(r.error);
  EXPECT_EQ(r.packet.bth.opcode, op::kRcFlush);
  EXPECT_EQ(r.packet.ext.feth, Feth::make(feth::kGlobal, feth::kRange));
  EXPECT_EQ(r.packet.ext.reth, (Reth{0x00007FB6CE664000ull, 0xCD46A09E, 4096}));
  EXPECT_EQ(r.packet.icrc, 0x1528B684u);

  FrameSpec s;
  s.dst_mac = {0x52, 0x54, 0x00, 0x00, 0x00, 0x01};
  s.src_mac = {0x52, 0x54, 0x00, 0x00, 0x00, 0x02};
  s.src_ip = 0x0A000001;
  s.dst_ip = 0x0A000002;
  s.ip_id = 0x1834;
  s.udp_sport = 0xE44C;
  s.bth = r.packet.bth;
  s.ext.feth = r.packet.ext.feth;
  s.ext.reth = r.packet.ext.reth;
  EXPECT_EQ(testing::build(s, {}), rxe);

  // IBA's ICRC (the headers once) is not what rxe takes.
  std::span<const uint8_t> datagram(rxe.data() + 14, rxe.size() - 18);
  uint32_t once = icrc_begin(datagram.first<kIcrcHeaderBytes>());
  once = icrc_finish(icrc_update(once, datagram.subspan(kIcrcHeaderBytes)));
  EXPECT_NE(once, 0x1528B684u);
  Frame iba = rxe;
  store_le32(iba.data() + iba.size() - 4, once);
  EXPECT_EQ(parse_frame(iba).error, ParseError::kBadIcrc);

  // Every other opcode: the headers once (a WRITE ONLY of the same size).
  s.bth.opcode = op::kRcWriteOnly;
  const Frame four(4, 0x5A);
  Frame w = testing::build(s, four);
  std::span<const uint8_t> wd(w.data() + 14, w.size() - 18);
  uint32_t st = icrc_begin(wd.first<kIcrcHeaderBytes>());
  EXPECT_EQ(load_le32(w.data() + w.size() - 4), icrc_finish(icrc_update(st, wd.subspan(kIcrcHeaderBytes))));
}

// Each FETH field has its width; a value that does not fit is refused, not
// truncated into another field.
TEST(Builder, FethFieldsMustFitTheirBits) {
  FrameSpec s;
  s.bth.opcode = op::kRcFlush;
  Frame out(128, 0xAB);
  s.ext.feth = Feth::make(0x10, 0);
  EXPECT_EQ(build_frame(s, {}, out).error, BuildError::kFieldOutOfRange);
  s.ext.feth = Feth::make(1, 4);
  EXPECT_EQ(build_frame(s, {}, out).error, BuildError::kFieldOutOfRange);
  EXPECT_EQ(out, Frame(128, 0xAB)) << "nothing written";
  s.ext.feth = Feth::make(0xF, 3);  // widest values that fit: built (a responder refuses them)
  ASSERT_TRUE(build_frame(s, {}, out));
  EXPECT_EQ(load_be32(out.data() + 54), 0x3Fu);
  s.bth.opcode = op::kRcWriteOnly;  // FETH not in a WRITE: ignored
  s.ext.feth = Feth::make(0xFF, 0xFF);
  EXPECT_TRUE(build_frame(s, {}, out));
}

void expect_same_fields(const FrameSpec& s, Piece payload, const Packet& p) {
  EXPECT_EQ(p.eth.dst, s.dst_mac);
  EXPECT_EQ(p.eth.src, s.src_mac);
  EXPECT_EQ(p.ip.src, s.src_ip);
  EXPECT_EQ(p.ip.dst, s.dst_ip);
  EXPECT_EQ(p.ip.tos, s.traffic_class);
  EXPECT_EQ(p.ip.ttl, s.hop_limit);
  EXPECT_EQ(p.ip.id, s.ip_id);
  EXPECT_EQ(p.ip.flags, s.ip_flags);
  EXPECT_EQ(p.udp.sport, s.udp_sport);
  Bth want = s.bth;
  want.pad = pad_for(payload.size());
  want.tver = 0;
  EXPECT_EQ(p.bth, want);
  const uint16_t h = p.op->headers;
  if (h & kDeth) {
    EXPECT_EQ(p.ext.deth, s.ext.deth);
  }
  if (h & kFeth) {
    EXPECT_EQ(p.ext.feth, s.ext.feth);
  }
  if (h & kReth) {
    EXPECT_EQ(p.ext.reth, s.ext.reth);
  }
  if (h & kAtomicEth) {
    EXPECT_EQ(p.ext.atomic_eth, s.ext.atomic_eth);
  }
  if (h & kAeth) {
    EXPECT_EQ(p.ext.aeth, s.ext.aeth);
  }
  if (h & kAtomicAckEth) {
    EXPECT_EQ(p.ext.atomic_ack, s.ext.atomic_ack);
  }
  if (h & kImmDt) {
    EXPECT_EQ(p.ext.immdt, s.ext.immdt);
  }
  if (h & kIeth) {
    EXPECT_EQ(p.ext.ieth, s.ext.ieth);
  }
  ASSERT_EQ(p.payload.size(), payload.size());
  EXPECT_TRUE(std::equal(payload.begin(), payload.end(), p.payload.begin()));
}

// Build then parse every opcode with every payload size from 0 to 4100
// (so every pad value, around every MTU), random header fields each time.
TEST(Builder, RoundTripsEveryOpcodeAndPayloadSize) {
  std::mt19937_64 rng(42);
  Frame payload(4100);
  for (auto& b : payload) b = static_cast<uint8_t>(rng());
  Frame out(8192);
  size_t frames = 0;
  for (const auto& e : opcode_table()) {
    size_t max = e.payload == PayloadRule::kAny ? 4100 : 0;
    for (size_t n = 0; n <= max; ++n) {
      size_t len = e.payload == PayloadRule::kExactly8 ? 8 : n;
      FrameSpec s = testing::random_spec(rng, e.opcode);
      size_t off = std::min<size_t>(rng() % 8, payload.size() - len);  // vary alignment
      Piece pl = Piece(payload).subspan(off, len);
      BuildResult b = build_frame(s, pl, out);
      ASSERT_TRUE(b) << opcode_full_name(e.opcode) << " " << len << ": " << build_error_name(b.error);
      ASSERT_EQ(b.length, frame_length(e.opcode, len));
      auto r = parse_frame(Piece(out.data(), b.length));
      ASSERT_TRUE(r) << opcode_full_name(e.opcode) << " " << len << ": " << parse_error_name(r.error);
      expect_same_fields(s, pl, r.packet);
      if (::testing::Test::HasFailure()) FAIL() << opcode_full_name(e.opcode) << " payload " << len;
      ++frames;
    }
  }
  EXPECT_EQ(frames, 32u * 4101 + 7);  // 32 opcodes with payload, 6 without, ATOMIC_WRITE
}

TEST(Builder, GathersPayloadPieces) {
  std::mt19937_64 rng(3);
  FrameSpec s = testing::random_spec(rng, op::kRcWriteFirst);
  Frame data(1500);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  Frame want = testing::build(s, data);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<Piece> pieces;
    size_t at = 0;
    while (at < data.size()) {
      size_t n = std::min<size_t>(rng() % 300, data.size() - at);  // empty pieces too
      pieces.push_back(Piece(data).subspan(at, n));
      at += n;
    }
    Frame out(want.size());
    BuildResult r = build_frame_gather(s, pieces, out);
    ASSERT_TRUE(r);
    ASSERT_EQ(out, want);

    // Zero-copy form: headers + untouched payload + trailer.
    Frame headers(header_length(s.bth.opcode));
    std::array<uint8_t, kMaxTrailerBytes> trailer{};
    SplitBuildResult sr = build_frame_split(s, pieces, headers, trailer);
    ASSERT_TRUE(sr);
    ASSERT_EQ(sr.header_length, headers.size());
    Frame joined = headers;
    joined.insert(joined.end(), data.begin(), data.end());
    joined.insert(joined.end(), trailer.begin(), trailer.begin() + sr.trailer_length);
    ASSERT_EQ(joined, want);
  }
}

TEST(Builder, SplitTrailerCarriesPadAndIcrc) {
  std::mt19937_64 rng(5);
  for (size_t n : {0u, 1u, 2u, 3u, 4u}) {
    FrameSpec s = testing::random_spec(rng, op::kUdSendOnly);
    Frame data(n, 0x42);
    Piece one[] = {data};
    Frame headers(100);
    std::array<uint8_t, kMaxTrailerBytes> trailer{};
    auto r = build_frame_split(s, one, headers, trailer);
    ASSERT_TRUE(r);
    EXPECT_EQ(r.header_length, 14u + 20 + 8 + 12 + 8);
    EXPECT_EQ(r.trailer_length, pad_for(n) + 4u);
  }
  FrameSpec s;
  s.bth.opcode = op::kRcSendOnly;
  Frame small(53);
  std::array<uint8_t, kMaxTrailerBytes> trailer{};
  EXPECT_EQ(build_frame_split(s, {}, small, trailer).error, BuildError::kBufferTooSmall);
}

TEST(Builder, RefusesBadRequestsWithoutWriting) {
  Frame out(70000, 0xAB);
  auto untouched = [&] { return std::all_of(out.begin(), out.end(), [](uint8_t b) { return b == 0xAB; }); };
  FrameSpec s;
  Frame four(4, 1), eight(8, 1);

  s.bth.opcode = 0x15;
  EXPECT_EQ(build_frame(s, {}, out).error, BuildError::kUnknownOpcode);
  s.bth.opcode = op::kRcAck;
  EXPECT_EQ(build_frame(s, four, out).error, BuildError::kPayloadNotAllowed);
  s.bth.opcode = op::kRcReadRequest;
  EXPECT_EQ(build_frame(s, four, out).error, BuildError::kPayloadNotAllowed);
  s.bth.opcode = op::kRcAtomicWrite;
  EXPECT_EQ(build_frame(s, four, out).error, BuildError::kPayloadNotEight);
  EXPECT_TRUE(untouched());
  EXPECT_TRUE(build_frame(s, eight, out));

  out.assign(out.size(), 0xAB);
  s.bth.opcode = op::kRcSendOnly;
  s.bth.dest_qp = 0x1000000;
  EXPECT_EQ(build_frame(s, {}, out).error, BuildError::kFieldOutOfRange);
  s.bth.dest_qp = 1;
  s.bth.psn = 0x1000000;
  EXPECT_EQ(build_frame(s, {}, out).error, BuildError::kFieldOutOfRange);
  s.bth.psn = 1;
  s.ip_flags = kIpFlagDontFragment | kIpFlagMoreFragments;
  EXPECT_EQ(build_frame(s, {}, out).error, BuildError::kFieldOutOfRange);
  s.ip_flags = 8;
  EXPECT_EQ(build_frame(s, {}, out).error, BuildError::kFieldOutOfRange);
  s.ip_flags = kIpFlagDontFragment;
  s.bth.opcode = op::kRcAck;
  s.ext.aeth.msn = 0x1000000;
  EXPECT_EQ(build_frame(s, {}, out).error, BuildError::kFieldOutOfRange);
  s.bth.opcode = op::kRcSendOnly;  // MSN is not in a SEND: ignored
  EXPECT_TRUE(build_frame(s, {}, out));
  out.assign(out.size(), 0xAB);
  s.bth.opcode = op::kUdSendOnly;
  s.ext.deth.src_qp = 0x1000000;
  EXPECT_EQ(build_frame(s, {}, out).error, BuildError::kFieldOutOfRange);
  EXPECT_TRUE(untouched());
}

TEST(Builder, LargestDatagramAndBufferBounds) {
  FrameSpec s;
  s.bth.opcode = op::kRcSendOnly;
  // 65535 = 20 IPv4 + 8 UDP + 12 BTH + payload + pad + 4 ICRC, so payload
  // + pad <= 65491; the largest payload is 65488 (pad 0), since 65489..65491
  // need 3, 2, 1 bytes of pad.
  const size_t max_payload = 65488;
  Frame big(max_payload + 8, 0x5C);
  Frame out(70000);
  size_t best = 0;
  for (size_t n = max_payload - 4; n <= max_payload + 4; ++n) {
    BuildResult r = build_frame(s, Piece(big).first(n), out);
    if (r) {
      best = n;
      EXPECT_LE(r.length - 14, 65535u);
      EXPECT_TRUE(parse_frame(Piece(out.data(), r.length)));
    } else {
      EXPECT_EQ(r.error, BuildError::kPayloadTooLarge) << n;
    }
  }
  EXPECT_EQ(best, max_payload);
  // Two pieces that only together are too large.
  Piece two[] = {Piece(big).first(40000), Piece(big).first(30000)};
  EXPECT_EQ(build_frame_gather(s, two, out).error, BuildError::kPayloadTooLarge);

  // Exactly the frame length fits; one byte less does not, and nothing is written.
  Frame payload(10, 9);
  size_t len = frame_length(op::kRcSendOnly, payload.size());
  Frame exact(len);
  EXPECT_TRUE(build_frame(s, payload, exact));
  Frame short_buf(len - 1, 0xCD);
  EXPECT_EQ(build_frame(s, payload, short_buf).error, BuildError::kBufferTooSmall);
  EXPECT_TRUE(std::all_of(short_buf.begin(), short_buf.end(), [](uint8_t b) { return b == 0xCD; }));
}

TEST(Builder, LengthsAndErrorNames) {
  EXPECT_EQ(header_length(op::kRcSendOnly), 54u);
  EXPECT_EQ(header_length(op::kRcWriteOnlyImm), 74u);
  EXPECT_EQ(header_length(op::kRcCompareSwap), 82u);
  EXPECT_EQ(header_length(0x15), 0u);
  EXPECT_EQ(frame_length(op::kRcSendOnly, 0), 58u);
  EXPECT_EQ(frame_length(op::kRcSendOnly, 1), 62u);
  EXPECT_EQ(frame_length(op::kRcAck, 0), 62u);
  EXPECT_EQ(frame_length(0x15, 0), 0u);
  EXPECT_STREQ(build_error_name(BuildError::kBufferTooSmall), "buffer_too_small");
  EXPECT_STREQ(build_error_name(BuildError::kCount), "invalid");
  EXPECT_EQ(to_error(BuildError::kBufferTooSmall).code(), ENOBUFS);
}

}  // namespace
}  // namespace ufab::roce
