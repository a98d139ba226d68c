#include "core/roce/gid.h"

#include <gtest/gtest.h>

namespace ufab::roce {
namespace {

TEST(Gid, Ipv4MappedBothWays) {
  Gid g = gid_from_ipv4(0x0A000001);  // 10.0.0.1
  EXPECT_EQ(g, (Gid{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 10, 0, 0, 1}));
  EXPECT_TRUE(gid_is_ipv4_mapped(g));
  EXPECT_EQ(ipv4_from_gid(g), 0x0A000001u);

  Gid link_local{0xFE, 0x80, 0, 0, 0, 0, 0, 0, 0x50, 0x54, 0, 0xFF, 0xFE, 0x12, 0x34, 0x56};
  EXPECT_FALSE(gid_is_ipv4_mapped(link_local));
  EXPECT_EQ(ipv4_from_gid(link_local), std::nullopt);
  Gid almost = g;
  almost[11] = 0xFE;
  EXPECT_EQ(ipv4_from_gid(almost), std::nullopt);
}

TEST(Gid, RcPingpongWireForm) {
  Gid g = gid_from_ipv4(0xC0A80102);  // 192.168.1.2
  EXPECT_EQ(gid_to_wire_hex(g), "00000000000000000000ffffc0a80102");
  EXPECT_EQ(gid_from_wire_hex("00000000000000000000ffffc0a80102"), g);
  EXPECT_EQ(gid_from_wire_hex("00000000000000000000FFFFC0A80102"), g);
  EXPECT_EQ(gid_from_wire_hex("00000000000000000000ffffc0a8010"), std::nullopt);    // 31 digits
  EXPECT_EQ(gid_from_wire_hex("00000000000000000000ffffc0a801020"), std::nullopt);  // 33
  EXPECT_EQ(gid_from_wire_hex("00000000000000000000ffffc0a8010g"), std::nullopt);
}

TEST(Gid, TextAsPeersPrintIt) {
  Gid g = gid_from_ipv4(0x0A000001);
  EXPECT_EQ(gid_to_text(g), "::ffff:10.0.0.1");  // ibv_rc_pingpong (inet_ntop)
  EXPECT_EQ(gid_to_perftest_text(g), "00:00:00:00:00:00:00:00:00:00:255:255:10:00:00:01");  // perftest GID_FMT
  EXPECT_EQ(gid_to_colon_hex(g), "00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:01");
  EXPECT_EQ(gid_from_colon_hex("00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:01"), g);
  EXPECT_EQ(gid_from_colon_hex("00:00:00:00:00:00:00:00:00:00:FF:FF:0A:00:00:01"), g);
  EXPECT_EQ(gid_from_colon_hex("00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:01:"), std::nullopt);
  EXPECT_EQ(gid_from_colon_hex("00-00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:01"), std::nullopt);
  Gid ll{0xFE, 0x80, 0, 0, 0, 0, 0, 0, 0x50, 0x54, 0, 0xFF, 0xFE, 0x12, 0x34, 0x56};
  EXPECT_EQ(gid_to_text(ll), "fe80::5054:ff:fe12:3456");
}

TEST(Gid, Ipv4Text) {
  EXPECT_EQ(ipv4_to_string(0x0A000001), "10.0.0.1");
  EXPECT_EQ(ipv4_to_string(0xFFFFFFFF), "255.255.255.255");
  EXPECT_EQ(ipv4_from_string("192.168.1.2"), 0xC0A80102u);
  EXPECT_EQ(ipv4_from_string("0.0.0.0"), 0u);
  EXPECT_EQ(ipv4_from_string("256.0.0.1"), std::nullopt);
  EXPECT_EQ(ipv4_from_string("1.2.3"), std::nullopt);
  EXPECT_EQ(ipv4_from_string("1.2.3.4.5"), std::nullopt);
  EXPECT_EQ(ipv4_from_string("1.2.3.4 "), std::nullopt);
  EXPECT_EQ(ipv4_from_string("1..3.4"), std::nullopt);
  EXPECT_EQ(ipv4_from_string("0001.2.3.4"), std::nullopt);
}

}  // namespace
}  // namespace ufab::roce
