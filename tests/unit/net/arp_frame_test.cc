// ARP frames (parse, build) and the responder.
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/net/arp.h"

namespace ufab::net {
namespace {

const MacAddress kOurMac{0x52, 0x54, 0x00, 0x00, 0x00, 0x01};
const MacAddress kPeerMac{0x52, 0x54, 0x00, 0x00, 0x00, 0x02};
const MacAddress kOtherMac{0x52, 0x54, 0x00, 0x00, 0x00, 0x03};
const Ipv4Address kOurIp = Ipv4Address::of(10, 0, 0, 1);
const Ipv4Address kOurIp2 = Ipv4Address::of(192, 168, 7, 1);
const Ipv4Address kPeerIp = Ipv4Address::of(10, 0, 0, 2);
const Ipv4Address kOtherIp = Ipv4Address::of(10, 0, 0, 3);

std::vector<uint8_t> bytes_of(const ArpFrame& f) { return std::vector<uint8_t>(f.begin(), f.end()); }

std::vector<uint8_t> hex(const char* s) {
  std::vector<uint8_t> out;
  auto nib = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  for (; s[0] && s[1]; s += 2) {
    while (*s == ' ') ++s;
    if (!s[0] || !s[1]) break;
    out.push_back(static_cast<uint8_t>(nib(s[0]) << 4 | nib(s[1])));
  }
  return out;
}

// A request as Linux puts it on the wire: "who has 10.0.0.1? tell 10.0.0.2".
std::vector<uint8_t> linux_request() {
  auto f = hex("ffffffffffff 525400000002 0806 0001 0800 06 04 0001 525400000002 0a000002 000000000000 0a000001");
  f.resize(60, 0);
  return f;
}

ArpResponder responder() { return std::move(*ArpResponder::create(kOurMac, {kOurIp, kOurIp2})); }

// -------------------------------------------------------------------- frames

TEST(ArpFrame, ParsesAWireRequest) {
  auto p = parse_arp(linux_request());
  ASSERT_TRUE(p) << arp_drop_name(p.error());
  EXPECT_EQ(p->eth_dst, kBroadcastMac);
  EXPECT_EQ(p->eth_src, kPeerMac);
  EXPECT_EQ(p->op, ArpOp::kRequest);
  EXPECT_EQ(p->sender_mac, kPeerMac);
  EXPECT_EQ(p->sender_ip, kPeerIp);
  EXPECT_EQ(p->target_mac, kZeroMac);
  EXPECT_EQ(p->target_ip, kOurIp);
}

TEST(ArpFrame, BuildsTheSameBytesLinuxSends) {
  EXPECT_EQ(bytes_of(build_arp_request(kPeerMac, kPeerIp, kOurIp)), linux_request());
}

TEST(ArpFrame, BuildThenParseRoundTrips) {
  ArpPacket p;
  p.eth_dst = kPeerMac;
  p.eth_src = kOurMac;
  p.op = ArpOp::kReply;
  p.sender_mac = kOurMac;
  p.sender_ip = kOurIp;
  p.target_mac = kPeerMac;
  p.target_ip = kPeerIp;
  ArpFrame f = build_arp_frame(p);
  EXPECT_EQ(f.size(), 60u);
  for (size_t i = kArpFrameSize; i < f.size(); ++i) EXPECT_EQ(f[i], 0) << "padding byte " << i;
  auto back = parse_arp(f);
  ASSERT_TRUE(back);
  EXPECT_EQ(*back, p);
  // Exactly 42 bytes (no padding, as some capture tools deliver) parse too.
  EXPECT_EQ(*parse_arp(std::span<const uint8_t>(f.data(), kArpFrameSize)), p);
  // And trailing bytes beyond 60 (padding from other stacks) are ignored.
  std::vector<uint8_t> longer(f.begin(), f.end());
  longer.resize(1514, 0xAA);
  EXPECT_EQ(*parse_arp(longer), p);
}

TEST(ArpFrame, UnicastRequestGoesToTheGivenMac) {
  auto p = *parse_arp(build_arp_request(kOurMac, kOurIp, kPeerIp, kPeerMac));
  EXPECT_EQ(p.eth_dst, kPeerMac);
  EXPECT_EQ(p.target_mac, kZeroMac);
  EXPECT_EQ(p.target_ip, kPeerIp);
}

TEST(ArpFrame, GratuitousArpAnnouncesTheAddress) {
  auto req = *parse_arp(build_gratuitous_arp(kOurMac, kOurIp));
  EXPECT_EQ(req.op, ArpOp::kRequest);
  EXPECT_EQ(req.eth_dst, kBroadcastMac);
  EXPECT_EQ(req.eth_src, kOurMac);
  EXPECT_EQ(req.sender_mac, kOurMac);
  EXPECT_EQ(req.sender_ip, kOurIp);
  EXPECT_EQ(req.target_ip, kOurIp);
  EXPECT_EQ(req.target_mac, kZeroMac);
  auto rep = *parse_arp(build_gratuitous_arp(kOurMac, kOurIp, ArpOp::kReply));
  EXPECT_EQ(rep.op, ArpOp::kReply);
  EXPECT_EQ(rep.eth_dst, kBroadcastMac);
  EXPECT_EQ(rep.target_mac, kOurMac);
  EXPECT_EQ(rep.target_ip, kOurIp);
}

struct Corruption {
  size_t offset;
  std::vector<uint8_t> bytes;
  ArpDrop expected;
};

TEST(ArpFrame, EveryWrongFieldIsRejectedWithItsReason) {
  const std::vector<Corruption> cases = {
      {12, {0x08, 0x00}, ArpDrop::kNotArp},         // IPv4
      {12, {0x81, 0x00}, ArpDrop::kNotArp},         // 802.1Q tag
      {12, {0x86, 0xdd}, ArpDrop::kNotArp},         // IPv6
      {12, {0x80, 0x35}, ArpDrop::kNotArp},         // RARP
      {14, {0x00, 0x06}, ArpDrop::kHardwareType},   // IEEE 802
      {14, {0x00, 0x00}, ArpDrop::kHardwareType},
      {14, {0xff, 0xff}, ArpDrop::kHardwareType},
      {16, {0x86, 0xdd}, ArpDrop::kProtocolType},
      {16, {0x08, 0x06}, ArpDrop::kProtocolType},
      {18, {0x00}, ArpDrop::kHardwareSize},
      {18, {0x08}, ArpDrop::kHardwareSize},
      {18, {0xff}, ArpDrop::kHardwareSize},
      {19, {0x00}, ArpDrop::kProtocolSize},
      {19, {0x10}, ArpDrop::kProtocolSize},
      {20, {0x00, 0x00}, ArpDrop::kOperation},
      {20, {0x00, 0x03}, ArpDrop::kOperation},      // RARP request
      {20, {0x00, 0x08}, ArpDrop::kOperation},      // InARP request
      {20, {0x01, 0x01}, ArpDrop::kOperation},
      {20, {0xff, 0xff}, ArpDrop::kOperation},
      {22, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, ArpDrop::kBadSenderMac},  // broadcast sender
      {22, {0x01, 0x00, 0x5e, 0x00, 0x00, 0x01}, ArpDrop::kBadSenderMac},  // multicast sender
      {22, {0x00, 0x00, 0x00, 0x00, 0x00, 0x00}, ArpDrop::kBadSenderMac},  // zero sender
      {6, {0x01, 0x00, 0x5e, 0x00, 0x00, 0x01}, ArpDrop::kBadSenderMac},   // multicast Ethernet source
      {6, {0x00, 0x00, 0x00, 0x00, 0x00, 0x00}, ArpDrop::kBadSenderMac},   // zero Ethernet source
  };
  auto r = responder();
  uint64_t expected_total = 0;
  for (const auto& c : cases) {
    auto f = linux_request();
    std::copy(c.bytes.begin(), c.bytes.end(), f.begin() + static_cast<long>(c.offset));
    auto p = parse_arp(f);
    ASSERT_FALSE(p) << "offset " << c.offset;
    EXPECT_EQ(p.error(), c.expected) << "offset " << c.offset << ": got " << arp_drop_name(p.error());
    EXPECT_FALSE(r.on_frame(f));
    ++expected_total;
    EXPECT_EQ(r.stats().malformed[static_cast<size_t>(c.expected)] > 0, true);
  }
  EXPECT_EQ(r.stats().malformed_total(), expected_total);
  EXPECT_EQ(r.stats().answered, 0u);
}

TEST(ArpFrame, TruncationAtEveryByteIsRejected) {
  auto full = linux_request();
  auto r = responder();
  for (size_t n = 0; n < kArpFrameSize; ++n) {
    // A copy of exactly n bytes, so a read past the end is caught by ASan.
    std::vector<uint8_t> cut(full.begin(), full.begin() + static_cast<long>(n));
    auto p = parse_arp(cut);
    ASSERT_FALSE(p) << n;
    EXPECT_EQ(p.error(), ArpDrop::kTruncated) << n;
    EXPECT_FALSE(r.on_frame(cut));
  }
  EXPECT_EQ(r.stats().malformed[static_cast<size_t>(ArpDrop::kTruncated)], kArpFrameSize);
  for (size_t n = kArpFrameSize; n <= full.size(); ++n) {
    EXPECT_TRUE(parse_arp(std::span<const uint8_t>(full.data(), n))) << n;
  }
  // A short frame of another protocol is "not ARP", not "truncated".
  auto ipv4 = full;
  ipv4[12] = 0x08;
  ipv4[13] = 0x00;
  EXPECT_EQ(parse_arp(std::span<const uint8_t>(ipv4.data(), 20)).error(), ArpDrop::kNotArp);
}

TEST(ArpFrame, RandomAndMutatedFramesNeverBreakTheParser) {
  std::mt19937 rng(1234);
  auto base = linux_request();
  auto r = responder();
  int parsed = 0;
  for (int i = 0; i < 200000; ++i) {
    std::vector<uint8_t> f;
    if (i % 2 == 0) {
      f.resize(rng() % 80);
      for (auto& b : f) b = static_cast<uint8_t>(rng());
    } else {
      f = base;
      f.resize(rng() % 70);
      for (int m = rng() % 4; m >= 0; --m) {
        if (!f.empty()) f[rng() % f.size()] = static_cast<uint8_t>(rng());
      }
    }
    auto p = parse_arp(f);
    if (p) {
      ++parsed;
      // Whatever parses re-encodes to a frame that parses to the same packet.
      ASSERT_EQ(*parse_arp(build_arp_frame(*p)), *p);
    }
    (void)r.on_frame(f);
  }
  EXPECT_GT(parsed, 1000);  // the mutations keep many frames valid
}

TEST(ArpFrame, DropReasonsHaveNames) {
  std::set<std::string> names;
  for (size_t i = 0; i < kArpDropCount; ++i) names.insert(arp_drop_name(static_cast<ArpDrop>(i)));
  EXPECT_EQ(names.size(), kArpDropCount);
}

// ----------------------------------------------------------------- responder

TEST(ArpResponder, AnswersARequestForOurAddress) {
  auto r = responder();
  auto reply = r.on_frame(linux_request());
  ASSERT_TRUE(reply);
  auto p = parse_arp(*reply);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->op, ArpOp::kReply);
  EXPECT_EQ(p->eth_dst, kPeerMac);  // unicast back to the asker
  EXPECT_EQ(p->eth_src, kOurMac);
  EXPECT_EQ(p->sender_mac, kOurMac);
  EXPECT_EQ(p->sender_ip, kOurIp);
  EXPECT_EQ(p->target_mac, kPeerMac);
  EXPECT_EQ(p->target_ip, kPeerIp);
  EXPECT_EQ(r.stats().answered, 1u);
}

TEST(ArpResponder, AnswersForEachOfItsAddressesWithThatAddress) {
  auto r = responder();
  auto reply = r.on_frame(build_arp_request(kPeerMac, kPeerIp, kOurIp2));
  ASSERT_TRUE(reply);
  EXPECT_EQ(parse_arp(*reply)->sender_ip, kOurIp2);
  EXPECT_TRUE(r.owns(kOurIp));
  EXPECT_TRUE(r.owns(kOurIp2));
  EXPECT_FALSE(r.owns(kPeerIp));
}

TEST(ArpResponder, AnswersAUnicastRequestToOurMac) {
  auto r = responder();
  EXPECT_TRUE(r.on_frame(build_arp_request(kPeerMac, kPeerIp, kOurIp, kOurMac)));
}

TEST(ArpResponder, IgnoresRequestsForOtherAddresses) {
  auto r = responder();
  EXPECT_FALSE(r.on_frame(build_arp_request(kPeerMac, kPeerIp, kOtherIp)));
  EXPECT_FALSE(r.on_frame(build_arp_request(kPeerMac, kPeerIp, Ipv4Address::of(10, 0, 0, 255))));
  EXPECT_FALSE(r.on_frame(build_gratuitous_arp(kPeerMac, kPeerIp)));  // the peer announcing itself
  EXPECT_EQ(r.stats().not_for_us, 3u);
  EXPECT_EQ(r.stats().answered, 0u);
}

TEST(ArpResponder, IgnoresRepliesOwnFramesAndOthersUnicast) {
  auto r = responder();
  ArpPacket req = *parse_arp(build_arp_request(kPeerMac, kPeerIp, kOtherIp));
  EXPECT_FALSE(r.on_frame(build_arp_reply(req, kOtherMac)));                     // another host's reply
  EXPECT_FALSE(r.on_frame(build_arp_request(kOurMac, kOurIp, kOurIp2)));         // our own request, echoed
  EXPECT_FALSE(r.on_frame(build_gratuitous_arp(kOurMac, kOurIp)));               // our own announcement
  EXPECT_FALSE(r.on_frame(build_arp_request(kPeerMac, kPeerIp, kOurIp, kOtherMac)));  // unicast to another host
  EXPECT_EQ(r.stats().not_a_request, 1u);
  EXPECT_EQ(r.stats().own_frames, 2u);
  EXPECT_EQ(r.stats().wrong_destination, 1u);
  EXPECT_EQ(r.stats().answered, 0u);
}

TEST(ArpResponder, AnswersAnAddressProbeAndCountsConflicts) {
  auto r = responder();
  // RFC 5227 probe: sender IP 0.0.0.0, "is anyone using 10.0.0.1?"
  auto reply = r.on_frame(build_arp_request(kPeerMac, Ipv4Address{}, kOurIp));
  ASSERT_TRUE(reply);
  auto p = *parse_arp(*reply);
  EXPECT_EQ(p.eth_dst, kPeerMac);
  EXPECT_EQ(p.sender_ip, kOurIp);
  EXPECT_EQ(p.target_ip, Ipv4Address{});
  EXPECT_EQ(r.stats().conflicts, 0u);
  // Another host announcing our address, or asking from it: counted, not
  // answered (as Linux).
  EXPECT_FALSE(r.on_frame(build_gratuitous_arp(kPeerMac, kOurIp)));
  EXPECT_EQ(r.stats().conflicts, 1u);
  EXPECT_FALSE(r.on_frame(build_arp_request(kPeerMac, kOurIp, kOurIp2)));
  EXPECT_EQ(r.stats().conflicts, 2u);
  EXPECT_EQ(r.stats().answered, 1u);
}

TEST(ArpResponder, RefusesImpossibleConfigurations) {
  EXPECT_FALSE(ArpResponder::create(kBroadcastMac, {kOurIp}));
  EXPECT_FALSE(ArpResponder::create(kZeroMac, {kOurIp}));
  EXPECT_FALSE(ArpResponder::create(MacAddress{0x01, 0, 0x5e, 0, 0, 1}, {kOurIp}));
  EXPECT_FALSE(ArpResponder::create(kOurMac, {}));
  for (Ipv4Address bad : {Ipv4Address{}, Ipv4Address::of(255, 255, 255, 255), Ipv4Address::of(224, 0, 0, 1),
                          Ipv4Address::of(127, 0, 0, 1)}) {
    auto r = ArpResponder::create(kOurMac, {kOurIp, bad});
    ASSERT_FALSE(r) << bad.str();
    EXPECT_EQ(r.error().code(), EINVAL);
    EXPECT_NE(r.error().message().find(bad.str()), std::string::npos);
  }
}

}  // namespace
}  // namespace ufab::net
