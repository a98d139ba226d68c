#include "core/net/addresses.h"

#include <gtest/gtest.h>

#include <unordered_set>

namespace ufab::net {
namespace {

TEST(MacAddress, FormatsAndParses) {
  MacAddress m{0x52, 0x54, 0x00, 0xab, 0xCD, 0x01};
  EXPECT_EQ(format_mac(m), "52:54:00:ab:cd:01");
  EXPECT_EQ(*parse_mac("52:54:00:AB:cd:01"), m);
  EXPECT_EQ(*parse_mac("52-54-00-ab-cd-01"), m);
  for (const char* bad : {"", "52:54:00:ab:cd", "52:54:00:ab:cd:01:02", "52:54:00-ab:cd:01", "52:54:00:ab:cd:0g",
                          "525400abcd01", " 52:54:00:ab:cd:0"}) {
    auto r = parse_mac(bad);
    ASSERT_FALSE(r) << bad;
    EXPECT_EQ(r.error().code(), EINVAL);
    EXPECT_NE(r.error().message().find("e.g. 52:54:00:12:34:56"), std::string::npos);
  }
}

TEST(MacAddress, Classifies) {
  EXPECT_TRUE(is_multicast(kBroadcastMac));
  EXPECT_TRUE(is_multicast(MacAddress{0x01, 0x00, 0x5e, 0, 0, 1}));
  EXPECT_TRUE(is_zero(kZeroMac));
  EXPECT_FALSE(is_unicast(kZeroMac));
  EXPECT_FALSE(is_unicast(kBroadcastMac));
  EXPECT_TRUE(is_unicast(MacAddress{0x52, 0x54, 0, 0, 0, 1}));
  EXPECT_TRUE(is_unicast(MacAddress{0x02, 0, 0, 0, 0, 0}));  // locally administered is fine
}

TEST(Ipv4Address, ParsesAndPrints) {
  EXPECT_EQ(Ipv4Address::parse("10.0.0.2")->value, 0x0A000002u);
  EXPECT_EQ(Ipv4Address::parse("255.255.255.255")->value, 0xFFFFFFFFu);
  EXPECT_EQ(Ipv4Address::parse("0.0.0.0")->value, 0u);
  EXPECT_EQ(Ipv4Address::of(192, 168, 1, 20).str(), "192.168.1.20");
  EXPECT_EQ(Ipv4Address::of(10, 0, 0, 2), *Ipv4Address::parse("10.0.0.2"));
  for (const char* bad : {"", "1.2.3", "1.2.3.4.5", "256.0.0.1", "1.2.3.4 ", " 1.2.3.4", "1..3.4", "a.b.c.d",
                          "1.2.3.-4", "1234.1.1.1", "1.2.3.4/24", "+1.2.3.4", "010.0.0.1", "1.2.3.00"}) {
    auto r = Ipv4Address::parse(bad);
    ASSERT_FALSE(r) << bad;
    EXPECT_EQ(r.error().code(), EINVAL);
    EXPECT_NE(r.error().message().find("e.g. 10.0.0.2"), std::string::npos);
  }
}

TEST(Ipv4Address, Classifies) {
  EXPECT_TRUE(Ipv4Address::of(10, 0, 0, 1).is_unicast());
  EXPECT_FALSE(Ipv4Address{}.is_unicast());
  EXPECT_FALSE(Ipv4Address::of(255, 255, 255, 255).is_unicast());
  EXPECT_FALSE(Ipv4Address::of(224, 0, 0, 1).is_unicast());
  EXPECT_FALSE(Ipv4Address::of(239, 255, 255, 250).is_unicast());
  EXPECT_FALSE(Ipv4Address::of(127, 0, 0, 1).is_unicast());
  EXPECT_TRUE(Ipv4Address::of(223, 255, 255, 254).is_unicast());
  EXPECT_TRUE(Ipv4Address::of(240, 0, 0, 1).is_unicast());  // reserved, but not ours to refuse
}

TEST(Ipv4Address, HashesAndOrders) {
  std::unordered_set<Ipv4Address> s{Ipv4Address::of(10, 0, 0, 1), Ipv4Address::of(10, 0, 0, 1),
                                    Ipv4Address::of(10, 0, 0, 2)};
  EXPECT_EQ(s.size(), 2u);
  EXPECT_LT(Ipv4Address::of(9, 255, 255, 255), Ipv4Address::of(10, 0, 0, 0));
}

}  // namespace
}  // namespace ufab::net
