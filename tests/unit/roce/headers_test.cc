#include "core/roce/headers.h"

#include <gtest/gtest.h>

#include <vector>

#include "core/roce/bytes.h"

namespace ufab::roce {
namespace {

using Bytes = std::vector<uint8_t>;

template <size_t N>
Bytes to_bytes(const std::array<uint8_t, N>& a) {
  return Bytes(a.begin(), a.end());
}

TEST(Headers, BthKnownBytes) {
  Bth b;
  b.opcode = 0x0A;
  b.se = true;
  b.pad = 3;
  b.pkey = 0xFFFF;
  b.fecn = true;
  b.dest_qp = 0x123456;
  b.ack_req = true;
  b.psn = 0xABCDEF;
  std::array<uint8_t, kBthBytes> out{};
  write_bth(out, b);
  EXPECT_EQ(to_bytes(out), (Bytes{0x0A, 0xB0, 0xFF, 0xFF, 0x80, 0x12, 0x34, 0x56, 0x80, 0xAB, 0xCD, 0xEF}));
  EXPECT_EQ(read_bth(out), b);

  b.se = false;
  b.migreq = true;
  b.pad = 1;
  b.tver = 0xF;
  b.fecn = false;
  b.becn = true;
  b.ack_req = false;
  write_bth(out, b);
  EXPECT_EQ(out[1], 0x5F);
  EXPECT_EQ(out[4], 0x40);
  EXPECT_EQ(out[8], 0x00);
  EXPECT_EQ(read_bth(out), b);
}

TEST(Headers, BthMasksWideFieldsAndIgnoresReservedBits) {
  Bth b;
  b.dest_qp = 0xFF123456;
  b.psn = 0x01ABCDEF;
  std::array<uint8_t, kBthBytes> out{};
  write_bth(out, b);
  Bth r = read_bth(out);
  EXPECT_EQ(r.dest_qp, 0x123456u);
  EXPECT_EQ(r.psn, 0xABCDEFu);
  out[4] |= 0x3F;  // reserved bits beside FECN/BECN
  out[8] |= 0x7F;  // reserved bits beside AckReq
  r = read_bth(out);
  EXPECT_FALSE(r.fecn);
  EXPECT_FALSE(r.becn);
  EXPECT_FALSE(r.ack_req);
  EXPECT_EQ(r.dest_qp, 0x123456u);
  EXPECT_EQ(r.psn, 0xABCDEFu);
}

TEST(Headers, RethAethAtomicKnownBytes) {
  std::array<uint8_t, kRethBytes> reth{};
  write_reth(reth, Reth{0x0102030405060708ull, 0x11223344, 0x00001000});
  EXPECT_EQ(to_bytes(reth), (Bytes{1, 2, 3, 4, 5, 6, 7, 8, 0x11, 0x22, 0x33, 0x44, 0, 0, 0x10, 0}));
  EXPECT_EQ(read_reth(reth), (Reth{0x0102030405060708ull, 0x11223344, 0x1000}));

  std::array<uint8_t, kAethBytes> aeth{};
  write_aeth(aeth, Aeth{0x1F, 0xFF000102});
  EXPECT_EQ(to_bytes(aeth), (Bytes{0x1F, 0x00, 0x01, 0x02}));
  EXPECT_EQ(read_aeth(aeth), (Aeth{0x1F, 0x000102}));

  std::array<uint8_t, kAtomicEthBytes> at{};
  AtomicEth a{0x1111111122222222ull, 0x33333333, 0x4444444455555555ull, 0x6666666677777777ull};
  write_atomic_eth(at, a);
  EXPECT_EQ(load_be64(at.data()), a.va);
  EXPECT_EQ(load_be32(at.data() + 8), a.rkey);
  EXPECT_EQ(load_be64(at.data() + 12), a.swap_add);  // unaligned on purpose (IBA 9.3.4)
  EXPECT_EQ(load_be64(at.data() + 20), a.compare);
  EXPECT_EQ(read_atomic_eth(at), a);

  std::array<uint8_t, kAtomicAckEthBytes> ack{};
  write_atomic_ack_eth(ack, AtomicAckEth{0xCAFEBABEDEADBEEFull});
  EXPECT_EQ(to_bytes(ack), (Bytes{0xCA, 0xFE, 0xBA, 0xBE, 0xDE, 0xAD, 0xBE, 0xEF}));
  EXPECT_EQ(read_atomic_ack_eth(ack).original, 0xCAFEBABEDEADBEEFull);
}

TEST(Headers, SmallHeadersKnownBytes) {
  std::array<uint8_t, kImmDtBytes> imm{};
  write_immdt(imm, ImmDt{0x01020304});
  EXPECT_EQ(to_bytes(imm), (Bytes{1, 2, 3, 4}));
  EXPECT_EQ(read_immdt(imm).imm, 0x01020304u);

  std::array<uint8_t, kDethBytes> deth{0, 0, 0, 0, 0xEE, 0, 0, 0};
  write_deth(deth, Deth{0x80010000, 0xAB000001});
  EXPECT_EQ(to_bytes(deth), (Bytes{0x80, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01}));  // reserved byte zeroed
  deth[4] = 0x77;
  EXPECT_EQ(read_deth(deth), (Deth{0x80010000, 1}));  // and ignored

  std::array<uint8_t, kIethBytes> ieth{};
  write_ieth(ieth, Ieth{0xDEADBEEF});
  EXPECT_EQ(to_bytes(ieth), (Bytes{0xDE, 0xAD, 0xBE, 0xEF}));
  EXPECT_EQ(read_ieth(ieth).rkey, 0xDEADBEEFu);

  std::array<uint8_t, kFethBytes> feth{};
  write_feth(feth, Feth::make(2, 1));
  EXPECT_EQ(to_bytes(feth), (Bytes{0, 0, 0, 0x12}));
  EXPECT_EQ(read_feth(feth).placement_type, 2);
  EXPECT_EQ(read_feth(feth).selectivity_level, 1);
}

// Every FETH field in both directions, as rxe's feth_init writes it
// (level << 4 | type, big-endian) and feth_plt/feth_sel read it.
TEST(Headers, FethEveryFieldAndReservedBits) {
  for (uint8_t type = 0; type < 16; ++type) {
    for (uint8_t level = 0; level < 4; ++level) {
      std::array<uint8_t, kFethBytes> b{};
      write_feth(b, Feth::make(type, level));
      EXPECT_EQ(to_bytes(b), (Bytes{0, 0, 0, uint8_t(level << 4 | type)}));
      EXPECT_EQ(read_feth(b), Feth::make(type, level));
      b[0] = 0xFF;  // reserved bits 31:6 set by a peer: ignored
      b[1] = 0xFF;
      b[2] = 0xFF;
      b[3] |= 0xC0;
      EXPECT_EQ(read_feth(b), Feth::make(type, level));
    }
  }
  std::array<uint8_t, kFethBytes> b{};
  write_feth(b, Feth::make(0xFF, 0xFF));  // the codec masks; the builder refuses such values first
  EXPECT_EQ(to_bytes(b), (Bytes{0, 0, 0, 0x3F}));
  EXPECT_TRUE(feth::defined(Feth::make(feth::kGlobal, feth::kRange)));
  EXPECT_TRUE(feth::defined(Feth::make(feth::kGlobal | feth::kPersistent, feth::kWholeRegion)));
  EXPECT_FALSE(feth::defined(Feth::make(0, feth::kRange)));
  EXPECT_FALSE(feth::defined(Feth::make(4, feth::kRange)));
  EXPECT_FALSE(feth::defined(Feth::make(feth::kGlobal, 2)));
  EXPECT_STREQ(feth::placement_name(3), "GLOBAL|PERSISTENT");
  EXPECT_STREQ(feth::selectivity_name(1), "whole region (MR)");
}

TEST(Headers, EthIpv4UdpRoundTrip) {
  EthHeader e{{1, 2, 3, 4, 5, 6}, {7, 8, 9, 10, 11, 12}, 0x0800};
  std::array<uint8_t, kEthBytes> eb{};
  write_eth(eb, e);
  EXPECT_EQ(to_bytes(eb), (Bytes{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 8, 0}));
  EXPECT_EQ(read_eth(eb), e);

  Ipv4Header ip;
  ip.tos = 0x68;
  ip.total_length = 0x1234;
  ip.id = 0xBEEF;
  ip.flags = kIpFlagDontFragment;
  ip.ttl = 1;
  ip.src = 0x0A000001;
  ip.dst = 0xC0A80102;
  ip.checksum = 0x5555;
  std::array<uint8_t, kIpv4Bytes> ib{};
  write_ipv4(ib, ip);
  EXPECT_EQ(ib[0], 0x45);
  EXPECT_EQ(ib[6], 0x40);  // DF
  EXPECT_EQ(ib[7], 0x00);
  EXPECT_EQ(read_ipv4(ib), ip);

  UdpHeader u{0xC123, 4791, 100, 0};
  std::array<uint8_t, kUdpBytes> ub{};
  write_udp(ub, u);
  EXPECT_EQ(to_bytes(ub), (Bytes{0xC1, 0x23, 0x12, 0xB7, 0, 100, 0, 0}));
  EXPECT_EQ(read_udp(ub), u);
}

TEST(Headers, Ipv4ChecksumKnownValue) {
  // A commonly quoted example header whose checksum is 0xB861.
  std::array<uint8_t, kIpv4Bytes> h{0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11,
                                    0x00, 0x00, 0xC0, 0xA8, 0x00, 0x01, 0xC0, 0xA8, 0x00, 0xC7};
  EXPECT_EQ(ipv4_header_checksum(h), 0xB861);
  EXPECT_FALSE(ipv4_header_checksum_ok(h));
  h[10] = 0xB8;
  h[11] = 0x61;
  EXPECT_TRUE(ipv4_header_checksum_ok(h));
  EXPECT_EQ(ipv4_header_checksum(h), 0xB861);  // the stored field is ignored
  h[8] = 0x3F;
  EXPECT_FALSE(ipv4_header_checksum_ok(h));
}

TEST(Headers, UdpChecksum) {
  // 8-byte header + 5 data bytes, checksum computed by hand-rolled sums.
  Bytes d{0xC0, 0x00, 0x12, 0xB7, 0x00, 0x0D, 0x00, 0x00, 'h', 'e', 'l', 'l', 'o'};
  uint32_t src = 0x0A000001, dst = 0x0A000002;
  EXPECT_TRUE(udp_checksum_ok(src, dst, d));  // zero: no checksum
  uint32_t sum = 0x0A00 + 0x0001 + 0x0A00 + 0x0002 + 17 + 13;
  for (size_t i = 0; i + 1 < d.size(); i += 2) sum += (d[i] << 8) | d[i + 1];
  sum += d.back() << 8;
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  uint16_t c = static_cast<uint16_t>(~sum);
  d[6] = c >> 8;
  d[7] = c & 0xFF;
  EXPECT_TRUE(udp_checksum_ok(src, dst, d));
  EXPECT_FALSE(udp_checksum_ok(src, dst + 1, d));
  d[9] ^= 1;
  EXPECT_FALSE(udp_checksum_ok(src, dst, d));
  EXPECT_FALSE(udp_checksum_ok(src, dst, std::span<const uint8_t>(d.data(), 7)));
}

TEST(Headers, ExtHeadersInWireOrder) {
  ExtHeaders h;
  h.feth = Feth::make(1, 2);
  h.reth = Reth{0x1000, 0x2000, 0x3000};
  h.deth = Deth{0x11111111, 0x222222};
  h.immdt = ImmDt{0x44444444};
  Bytes out(20, 0xAA);
  ASSERT_TRUE(write_ext_headers(kFeth | kReth, out, h));
  EXPECT_EQ(load_be32(out.data()), 0x21u);       // FETH first
  EXPECT_EQ(load_be64(out.data() + 4), 0x1000u);  // then RETH
  ExtHeaders r;
  ASSERT_TRUE(read_ext_headers(kFeth | kReth, out, r));
  EXPECT_EQ(r.feth, h.feth);
  EXPECT_EQ(r.reth, h.reth);

  Bytes ud(12);
  ASSERT_TRUE(write_ext_headers(kDeth | kImmDt, ud, h));
  EXPECT_EQ(load_be32(ud.data()), 0x11111111u);
  EXPECT_EQ(load_be32(ud.data() + 8), 0x44444444u);

  Bytes small(11, 0x5A);
  EXPECT_FALSE(write_ext_headers(kDeth | kImmDt, small, h));
  EXPECT_EQ(small, Bytes(11, 0x5A));  // untouched
  EXPECT_FALSE(read_ext_headers(kDeth | kImmDt, small, r));
}

TEST(Headers, AethSyndromesAsRxeUsesThem) {
  EXPECT_EQ(aeth::ack(5).syndrome, 0x1F);
  EXPECT_EQ(aeth::ack(5).msn, 5u);
  EXPECT_EQ(aeth::rnr_nak(12, 7).syndrome, 0x2C);
  EXPECT_EQ(aeth::nak(aeth::NakCode::kPsnSequenceError, 1).syndrome, 0x60);
  EXPECT_EQ(aeth::nak(aeth::NakCode::kInvalidRequest, 1).syndrome, 0x61);
  EXPECT_EQ(aeth::nak(aeth::NakCode::kRemoteAccessError, 1).syndrome, 0x62);
  EXPECT_EQ(aeth::nak(aeth::NakCode::kRemoteOperationalError, 1).syndrome, 0x63);
  EXPECT_EQ(aeth::ack(0x1234567).msn, 0x234567u);

  EXPECT_EQ(aeth::type(0x1F), aeth::Type::kAck);
  EXPECT_EQ(aeth::type(0x2C), aeth::Type::kRnrNak);
  EXPECT_EQ(aeth::type(0x40), aeth::Type::kReserved);
  EXPECT_EQ(aeth::type(0x62), aeth::Type::kNak);
  EXPECT_EQ(aeth::value(0x2C), 12);
  EXPECT_EQ(aeth::value(0x62), 2);
  EXPECT_STREQ(aeth::nak_code_name(2), "remote access error");

  EXPECT_EQ(aeth::rnr_timer_usec(0), 655360u);
  EXPECT_EQ(aeth::rnr_timer_usec(1), 10u);
  EXPECT_EQ(aeth::rnr_timer_usec(12), 640u);  // ibv_rc_pingpong's min_rnr_timer
  EXPECT_EQ(aeth::rnr_timer_usec(14), 1280u);
  EXPECT_EQ(aeth::rnr_timer_usec(31), 491520u);
}

TEST(Headers, PsnArithmeticWraps) {
  EXPECT_EQ(psn_add(0xFFFFFF, 1), 0u);
  EXPECT_EQ(psn_add(0xFFFFFE, 5), 3u);
  EXPECT_EQ(psn_diff(0, 0xFFFFFF), 1);
  EXPECT_EQ(psn_diff(0xFFFFFF, 0), -1);
  EXPECT_EQ(psn_diff(100, 50), 50);
  EXPECT_EQ(psn_diff(0x800000, 0), -0x800000);
  EXPECT_EQ(psn_diff(0x7FFFFF, 0), 0x7FFFFF);
}

TEST(Headers, PadMtuAndSegmentation) {
  EXPECT_EQ(pad_for(0), 0);
  EXPECT_EQ(pad_for(1), 3);
  EXPECT_EQ(pad_for(2), 2);
  EXPECT_EQ(pad_for(3), 1);
  EXPECT_EQ(pad_for(4), 0);
  EXPECT_EQ(pad_for(1023), 1);

  EXPECT_EQ(rxe_active_mtu(1500), 1024u);
  EXPECT_EQ(rxe_active_mtu(9000), 4096u);
  EXPECT_EQ(rxe_active_mtu(4176), 4096u);
  EXPECT_EQ(rxe_active_mtu(4175), 2048u);
  EXPECT_EQ(rxe_active_mtu(1100), 512u);
  EXPECT_EQ(rxe_active_mtu(200), 256u);

  EXPECT_EQ(packets_for(0, 1024), 1u);
  EXPECT_EQ(packets_for(1, 1024), 1u);
  EXPECT_EQ(packets_for(1024, 1024), 1u);
  EXPECT_EQ(packets_for(1025, 1024), 2u);
  EXPECT_EQ(packets_for(65536, 1024), 64u);
}

}  // namespace
}  // namespace ufab::roce
