#include "core/pci/host.h"

#include <gtest/gtest.h>

namespace ufab::pci {
namespace {

// Captured from a Linux 6.x guest: default route via 192.0.2.1 on eth0.
const char* kProcNetRoute =
    "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
    "eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
    "eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
    "eth1\t0064A8C0\t00000000\t0000\t0\t0\t0\t00FFFFFF\t0\t0\t0\n";  // not up: ignored

const char* kProcNetIpv6Route =
    "fd000000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 "
    "00000100 00000001 00000000 00000001     eth0\n"
    "fe800000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 "
    "00000100 00000002 00000000 00000001     eth0\n"
    "00000000000000000000000000000000 00 00000000000000000000000000000000 00 fd000000000000000000000000000001 "
    "00000400 00000002 00000000 00000003     eth0\n"
    "00000000000000000000000000000001 80 00000000000000000000000000000000 00 00000000000000000000000000000000 "
    "00000000 00000003 00000000 80200001       lo\n"
    "fd000000000000000000000000000002 80 00000000000000000000000000000000 00 00000000000000000000000000000000 "
    "00000000 00000003 00000000 80200001     eth0\n"
    "ff000000000000000000000000000000 08 00000000000000000000000000000000 00 00000000000000000000000000000000 "
    "00000100 00000003 00000000 00000001     eth0\n"
    "00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 "
    "ffffffff 00000001 00000000 00200200       lo\n";

TEST(HostRoutes, ParsesIpv4RoutesInNetworkByteOrder) {
  auto routes = parse_ipv4_routes(kProcNetRoute);
  ASSERT_TRUE(routes) << routes.error().message();
  ASSERT_EQ(routes->size(), 2u);
  EXPECT_EQ((*routes)[0].interface, "eth0");
  EXPECT_TRUE((*routes)[0].is_default());
  EXPECT_EQ((*routes)[0].gateway, "192.0.2.1");
  EXPECT_EQ((*routes)[0].str(), "default via 192.0.2.1");
  EXPECT_EQ((*routes)[1].destination, "192.0.2.0");
  EXPECT_EQ((*routes)[1].prefix_length, 24u);
  EXPECT_EQ((*routes)[1].str(), "192.0.2.0/24");
}

TEST(HostRoutes, Ipv6SkipsLinkLocalMulticastLocalLoopbackAndReject) {
  auto routes = parse_ipv6_routes(kProcNetIpv6Route);
  ASSERT_TRUE(routes) << routes.error().message();
  ASSERT_EQ(routes->size(), 2u);
  EXPECT_EQ((*routes)[0].str(), "fd00::/64");
  EXPECT_TRUE((*routes)[0].ipv6);
  EXPECT_EQ((*routes)[1].str(), "default via fd00::1");
}

TEST(HostRoutes, MalformedLinesAreErrorsThatQuoteTheLine) {
  auto v4 = parse_ipv4_routes("Iface\tDestination\neth0\tzzzz\t0\t1\t0\t0\t0\t0\n");
  ASSERT_FALSE(v4);
  EXPECT_NE(v4.error().message().find("line 2"), std::string::npos);
  EXPECT_NE(v4.error().message().find("zzzz"), std::string::npos);
  auto v6 = parse_ipv6_routes("fe80 40 short\n");
  ASSERT_FALSE(v6);
  EXPECT_NE(v6.error().message().find("ipv6_route"), std::string::npos);
}

TEST(HostRoutes, EmptyTablesAreFine) {
  auto v4 = parse_ipv4_routes("Iface\tDestination\tGateway\n");
  ASSERT_TRUE(v4);
  EXPECT_TRUE(v4->empty());
  auto v6 = parse_ipv6_routes("");
  ASSERT_TRUE(v6);
  EXPECT_TRUE(v6->empty());
}

TEST(HostAddresses, TextForm) {
  InterfaceAddress a{"eth0", "192.0.2.2", 24, false, false};
  EXPECT_EQ(a.str(), "192.0.2.2/24");
}

// Reads only: this machine's interfaces and routes through the default probe.
TEST(HostDefaults, ReadsThisMachinesNetworkAndMemlock) {
  auto net = read_host_network(HostPaths{});
  ASSERT_TRUE(net) << net.error().message();
  bool has_loopback = false;
  for (const InterfaceAddress& a : net->addresses) has_loopback = has_loopback || a.address == "127.0.0.1";
  EXPECT_TRUE(has_loopback);
  for (const Route& r : net->routes) EXPECT_NE(r.interface, "lo");
  auto memlock = read_memlock_limit();
  ASSERT_TRUE(memlock);
  EXPECT_LE(memlock->soft, memlock->hard);
}

}  // namespace
}  // namespace ufab::pci
