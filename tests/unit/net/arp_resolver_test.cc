// The ARP resolver: retry schedule, give-up, TTL, learning, eviction. Time
// is a parameter, so every schedule here is exact.
#include <gtest/gtest.h>

#include <vector>

#include "core/net/arp.h"

namespace ufab::net {
namespace {

using namespace std::chrono_literals;

const MacAddress kOurMac{0x52, 0x54, 0x00, 0x00, 0x00, 0x01};
const MacAddress kPeerMac{0x52, 0x54, 0x00, 0x00, 0x00, 0x02};
const MacAddress kNewPeerMac{0x52, 0x54, 0x00, 0x00, 0x00, 0x22};
const Ipv4Address kOurIp = Ipv4Address::of(10, 0, 0, 1);
const Ipv4Address kPeerIp = Ipv4Address::of(10, 0, 0, 2);
const Ipv4Address kOtherIp = Ipv4Address::of(10, 0, 0, 3);
const ArpTime t0 = ArpTime{} + 1000s;

ArpResolver resolver(ArpResolverOptions o = {}) { return std::move(*ArpResolver::create(kOurMac, {kOurIp}, o)); }

// The peer: a responder that answers our requests.
ArpResponder peer() { return std::move(*ArpResponder::create(kPeerMac, {kPeerIp})); }

ArpPacket parsed(const ArpFrame& f) {
  auto p = parse_arp(f);
  EXPECT_TRUE(p);
  return *p;
}

TEST(ArpResolver, FirstResolveBroadcastsARequest) {
  auto r = resolver();
  auto res = r.resolve(kPeerIp, t0);
  ASSERT_TRUE(res) << res.error().message();
  EXPECT_FALSE(res->ready());
  ASSERT_TRUE(res->request);
  ArpPacket p = parsed(*res->request);
  EXPECT_EQ(p.op, ArpOp::kRequest);
  EXPECT_EQ(p.eth_dst, kBroadcastMac);
  EXPECT_EQ(p.eth_src, kOurMac);
  EXPECT_EQ(p.sender_mac, kOurMac);
  EXPECT_EQ(p.sender_ip, kOurIp);
  EXPECT_EQ(p.target_mac, kZeroMac);
  EXPECT_EQ(p.target_ip, kPeerIp);
  EXPECT_EQ(r.lookup(kPeerIp)->state, NeighborState::kIncomplete);
  EXPECT_EQ(r.stats().requests_sent, 1u);
}

TEST(ArpResolver, RequestReplyRoundTripResolvesAndNotifies) {
  auto r = resolver();
  auto b = peer();
  auto res = r.resolve(kPeerIp, t0);
  auto reply = b.on_frame(*res->request);
  ASSERT_TRUE(reply) << "the peer answers our request";
  ArpEvents ev = r.on_frame(*reply, t0 + 3ms);
  ASSERT_EQ(ev.resolved.size(), 1u);
  EXPECT_EQ(ev.resolved[0], kPeerIp);
  EXPECT_TRUE(ev.changed.empty());
  auto again = r.resolve(kPeerIp, t0 + 4ms);
  ASSERT_TRUE(again);
  ASSERT_TRUE(again->ready());
  EXPECT_EQ(*again->mac, kPeerMac);
  EXPECT_FALSE(again->request);
  EXPECT_EQ(r.lookup(kPeerIp)->state, NeighborState::kReachable);
  // A second copy of the reply resolves nothing new.
  EXPECT_TRUE(r.on_frame(*reply, t0 + 5ms).resolved.empty());
}

TEST(ArpResolver, RetriesOnScheduleThenGivesUpClearly) {
  auto r = resolver();  // 1 s interval, 3 requests
  std::vector<int> sent_at_ms;
  Result<Resolution> last = fail(0, "");
  for (int ms = 0; ms <= 3000; ms += 250) {
    last = r.resolve(kPeerIp, t0 + std::chrono::milliseconds(ms));
    if (!last) {
      EXPECT_EQ(ms, 3000) << "gave up early";
      break;
    }
    EXPECT_FALSE(last->ready());
    if (last->request) sent_at_ms.push_back(ms);
  }
  EXPECT_EQ(sent_at_ms, (std::vector<int>{0, 1000, 2000}));
  ASSERT_FALSE(last);
  EXPECT_EQ(last.error().code(), EHOSTUNREACH);
  EXPECT_EQ(last.error().message(),
            "no ARP reply from 10.0.0.2 after 3 requests over 3 s: is the peer up and on this link?");
  EXPECT_EQ(r.stats().failures, 1u);
  EXPECT_EQ(r.stats().requests_sent, 3u);
  EXPECT_FALSE(r.lookup(kPeerIp)) << "a failed entry is dropped";
  // The next call starts a fresh round.
  auto again = r.resolve(kPeerIp, t0 + 3100ms);
  ASSERT_TRUE(again);
  EXPECT_TRUE(again->request);
}

TEST(ArpResolver, ScheduleFollowsTheOptions) {
  ArpResolverOptions o;
  o.retry_interval = 300ms;
  o.max_requests = 5;
  auto r = resolver(o);
  int sent = 0;
  for (int ms = 0; ms < 1500; ms += 50) {
    auto res = r.resolve(kPeerIp, t0 + std::chrono::milliseconds(ms));
    ASSERT_TRUE(res) << ms;
    sent += res->request.has_value();
  }
  EXPECT_EQ(sent, 5);
  auto res = r.resolve(kPeerIp, t0 + 1500ms);
  ASSERT_FALSE(res);
  EXPECT_NE(res.error().message().find("after 5 requests over 1.5 s"), std::string::npos) << res.error().message();

  o.retry_interval = 200ms;
  o.max_requests = 1;
  auto one = resolver(o);
  ASSERT_TRUE(one.resolve(kPeerIp, t0)->request);
  EXPECT_FALSE(one.resolve(kPeerIp, t0 + 199ms)->request);
  auto gone = one.resolve(kPeerIp, t0 + 200ms);
  ASSERT_FALSE(gone);
  EXPECT_NE(gone.error().message().find("after 1 request over 200 ms"), std::string::npos) << gone.error().message();
}

TEST(ArpResolver, LateReplyInsideTheRoundStillResolves) {
  auto r = resolver();
  auto b = peer();
  auto first = r.resolve(kPeerIp, t0);
  r.resolve(kPeerIp, t0 + 1s);
  r.resolve(kPeerIp, t0 + 2s);
  ArpEvents ev = r.on_frame(*b.on_frame(*first->request), t0 + 2900ms);
  EXPECT_EQ(ev.resolved.size(), 1u);
  auto res = r.resolve(kPeerIp, t0 + 3s);
  ASSERT_TRUE(res);
  EXPECT_EQ(*res->mac, kPeerMac);
}

TEST(ArpResolver, EntriesGoStaleAfterTheTtlAndAreReconfirmed) {
  ArpResolverOptions o;
  o.reachable_time = 30s;
  auto r = resolver(o);
  auto b = peer();
  r.on_frame(*b.on_frame(*r.resolve(kPeerIp, t0)->request), t0);
  auto fresh = r.resolve(kPeerIp, t0 + 30s - 1ms);
  ASSERT_TRUE(fresh->ready());
  EXPECT_FALSE(fresh->request);
  // TTL over: still usable (connections keep going) but reconfirmed with a
  // unicast probe to the MAC we have.
  auto stale = r.resolve(kPeerIp, t0 + 30s);
  ASSERT_TRUE(stale);
  ASSERT_TRUE(stale->ready());
  EXPECT_EQ(*stale->mac, kPeerMac);
  ASSERT_TRUE(stale->request);
  ArpPacket probe = parsed(*stale->request);
  EXPECT_EQ(probe.eth_dst, kPeerMac);
  EXPECT_EQ(probe.target_ip, kPeerIp);
  EXPECT_EQ(r.lookup(kPeerIp)->state, NeighborState::kStale);
  EXPECT_FALSE(r.resolve(kPeerIp, t0 + 30s + 500ms)->request);
  // The peer answers the probe: reachable for another TTL.
  ArpEvents ev = r.on_frame(*b.on_frame(*stale->request), t0 + 30s + 600ms);
  EXPECT_TRUE(ev.resolved.empty());
  EXPECT_TRUE(ev.changed.empty());
  EXPECT_EQ(r.lookup(kPeerIp)->state, NeighborState::kReachable);
  EXPECT_FALSE(r.resolve(kPeerIp, t0 + 60s)->request);
  EXPECT_TRUE(r.resolve(kPeerIp, t0 + 60s + 600ms)->request);
}

TEST(ArpResolver, AStalePeerThatNeverAnswersFails) {
  ArpResolverOptions o;
  o.reachable_time = 10s;
  auto r = resolver(o);
  auto b = peer();
  r.on_frame(*b.on_frame(*r.resolve(kPeerIp, t0)->request), t0);
  std::vector<int> probes_at;
  Result<Resolution> res = fail(0, "");
  for (int s = 10; s <= 13; ++s) {
    res = r.resolve(kPeerIp, t0 + std::chrono::seconds(s));
    if (!res) break;
    EXPECT_TRUE(res->ready()) << "a stale MAC stays usable while it is reconfirmed";
    if (res->request) probes_at.push_back(s);
  }
  EXPECT_EQ(probes_at, (std::vector<int>{10, 11, 12}));
  ASSERT_FALSE(res);
  EXPECT_EQ(res.error().code(), EHOSTUNREACH);
  EXPECT_EQ(res.error().message(),
            "no ARP reply from 10.0.0.2 after 3 requests over 3 s (its MAC 52:54:00:00:00:02 was last heard "
            "13 s ago): is the peer up and on this link?");
}

TEST(ArpResolver, LearnsFromRequestsAddressedToUs) {
  auto r = resolver();
  // The peer (say, rxe moving its QP to RTR) asks for us.
  ArpEvents ev = r.on_frame(build_arp_request(kPeerMac, kPeerIp, kOurIp), t0);
  EXPECT_TRUE(ev.resolved.empty());
  auto e = r.lookup(kPeerIp);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->mac, kPeerMac);
  EXPECT_EQ(e->state, NeighborState::kStale);  // heard, not confirmed (as Linux)
  EXPECT_FALSE(e->used);
  EXPECT_EQ(r.stats().learned, 1u);
  // Usable at once; a unicast probe goes out to confirm it.
  auto res = r.resolve(kPeerIp, t0 + 1ms);
  ASSERT_TRUE(res->ready());
  EXPECT_EQ(*res->mac, kPeerMac);
  ASSERT_TRUE(res->request);
  EXPECT_EQ(parsed(*res->request).eth_dst, kPeerMac);
}

TEST(ArpResolver, DoesNotLearnFromTrafficNotAboutUs) {
  auto r = resolver();
  r.on_frame(build_arp_request(kPeerMac, kPeerIp, kOtherIp), t0);  // asks for someone else
  r.on_frame(build_gratuitous_arp(kPeerMac, kPeerIp), t0);         // announcement, not cached before
  ArpPacket unsolicited = parsed(build_arp_request(kOurMac, kOurIp, kPeerIp));
  r.on_frame(build_arp_reply(unsolicited, kPeerMac), t0);          // reply we never asked for
  EXPECT_EQ(r.size(), 0u);
  EXPECT_EQ(r.stats().learned, 0u);
  EXPECT_EQ(r.stats().ignored, 3u);
}

TEST(ArpResolver, IgnoresOwnFramesProbesAndClaimsOnOurAddress) {
  auto r = resolver();
  r.resolve(kPeerIp, t0);
  r.on_frame(build_arp_request(kOurMac, kOurIp, kPeerIp), t0);            // our own, echoed
  r.on_frame(build_arp_request(kPeerMac, Ipv4Address{}, kOurIp), t0);     // probe: sender 0.0.0.0
  r.on_frame(build_gratuitous_arp(kPeerMac, kOurIp), t0);                 // someone claiming our address
  r.on_frame(std::vector<uint8_t>{1, 2, 3}, t0);                          // garbage
  EXPECT_EQ(r.lookup(kPeerIp)->state, NeighborState::kIncomplete);
  EXPECT_FALSE(r.lookup(kOurIp));
  EXPECT_EQ(r.stats().ignored, 4u);
}

TEST(ArpResolver, AnyArpFromAPendingAddressResolvesIt) {
  auto r = resolver();
  r.resolve(kPeerIp, t0);
  // The peer's own broadcast request (for someone else) still tells us its MAC.
  ArpEvents ev = r.on_frame(build_arp_request(kPeerMac, kPeerIp, kOtherIp), t0 + 10ms);
  ASSERT_EQ(ev.resolved.size(), 1u);
  EXPECT_EQ(r.lookup(kPeerIp)->state, NeighborState::kStale);  // unconfirmed
  auto res = r.resolve(kPeerIp, t0 + 20ms);
  ASSERT_TRUE(res->ready());
  EXPECT_TRUE(res->request) << "and gets confirmed";
}

TEST(ArpResolver, ReportsAPeerThatChangedItsMac) {
  auto r = resolver();
  auto b = peer();
  r.on_frame(*b.on_frame(*r.resolve(kPeerIp, t0)->request), t0);
  // Same MAC again: no news.
  EXPECT_TRUE(r.on_frame(build_gratuitous_arp(kPeerMac, kPeerIp), t0 + 1s).changed.empty());
  EXPECT_EQ(r.lookup(kPeerIp)->state, NeighborState::kReachable);
  // The peer's address moves to another NIC and announces it.
  ArpEvents ev = r.on_frame(build_gratuitous_arp(kNewPeerMac, kPeerIp), t0 + 2s);
  ASSERT_EQ(ev.changed.size(), 1u);
  EXPECT_EQ(ev.changed[0], kPeerIp);
  auto e = r.lookup(kPeerIp);
  EXPECT_EQ(e->mac, kNewPeerMac);
  EXPECT_EQ(e->state, NeighborState::kStale);
  EXPECT_EQ(*r.resolve(kPeerIp, t0 + 3s)->mac, kNewPeerMac);
}

TEST(ArpResolver, RefusesAddressesArpCannotResolve) {
  auto r = resolver();
  for (Ipv4Address bad : {Ipv4Address{}, Ipv4Address::of(255, 255, 255, 255), Ipv4Address::of(224, 0, 0, 5),
                          Ipv4Address::of(127, 0, 0, 1), kOurIp}) {
    auto res = r.resolve(bad, t0);
    ASSERT_FALSE(res) << bad.str();
    EXPECT_EQ(res.error().code(), EINVAL);
    EXPECT_NE(res.error().message().find(bad.str()), std::string::npos);
  }
  EXPECT_EQ(r.size(), 0u);
  EXPECT_EQ(r.stats().requests_sent, 0u);
}

TEST(ArpResolver, CacheIsBoundedWithLruEviction) {
  ArpResolverOptions o;
  o.capacity = 4;
  auto r = resolver(o);
  auto ip = [](int i) { return Ipv4Address::of(10, 0, 1, static_cast<uint8_t>(i)); };
  for (int i = 1; i <= 4; ++i) r.resolve(ip(i), t0);
  r.resolve(ip(1), t0 + 1ms);  // 1 is now the most recently used
  r.resolve(ip(5), t0 + 2ms);  // evicts 2, the least recently used
  EXPECT_EQ(r.size(), 4u);
  EXPECT_TRUE(r.lookup(ip(1)));
  EXPECT_FALSE(r.lookup(ip(2)));
  EXPECT_TRUE(r.lookup(ip(5)));
  for (int i = 6; i <= 100; ++i) {
    r.resolve(ip(i), t0 + 3ms);
    ASSERT_LE(r.size(), 4u);
  }
  EXPECT_EQ(r.stats().evictions, 96u);
  for (int i = 97; i <= 100; ++i) EXPECT_TRUE(r.lookup(ip(i))) << i;
}

TEST(ArpResolver, ARequestFloodCannotEvictNeighboursInUse) {
  ArpResolverOptions o;
  o.capacity = 4;
  auto r = resolver(o);
  auto b = peer();
  r.on_frame(*b.on_frame(*r.resolve(kPeerIp, t0)->request), t0);
  r.resolve(kOtherIp, t0);
  // 1000 requests for us from made-up senders.
  for (int i = 0; i < 1000; ++i) {
    Ipv4Address fake = Ipv4Address::of(10, 9, static_cast<uint8_t>(i >> 8), static_cast<uint8_t>(i));
    MacAddress mac{0x02, 0, 0, 0, static_cast<uint8_t>(i >> 8), static_cast<uint8_t>(i)};
    r.on_frame(build_arp_request(mac, fake, kOurIp), t0 + 1ms);
    ASSERT_LE(r.size(), 4u);
  }
  EXPECT_TRUE(r.lookup(kPeerIp));
  EXPECT_TRUE(r.lookup(kOtherIp));
  EXPECT_EQ(*r.resolve(kPeerIp, t0 + 2ms)->mac, kPeerMac);
  // With every slot in use, learning stops instead of evicting.
  r.resolve(Ipv4Address::of(10, 0, 0, 7), t0);
  r.resolve(Ipv4Address::of(10, 0, 0, 8), t0);
  uint64_t skipped = r.stats().learn_skipped;
  r.on_frame(build_arp_request(MacAddress{2, 0, 0, 0, 0, 9}, Ipv4Address::of(10, 9, 9, 9), kOurIp), t0 + 3ms);
  EXPECT_EQ(r.stats().learn_skipped, skipped + 1);
  EXPECT_FALSE(r.lookup(Ipv4Address::of(10, 9, 9, 9)));
}

TEST(ArpResolver, ClockGoingBackwardsIsHarmless) {
  auto r = resolver();
  ASSERT_TRUE(r.resolve(kPeerIp, t0)->request);
  auto res = r.resolve(kPeerIp, t0 - 10s);
  ASSERT_TRUE(res);
  EXPECT_FALSE(res->request);
  EXPECT_FALSE(res->ready());
}

TEST(ArpResolver, ForgetDropsAnEntry) {
  auto r = resolver();
  r.resolve(kPeerIp, t0);
  r.forget(kPeerIp);
  r.forget(kOtherIp);  // unknown: no-op
  EXPECT_EQ(r.size(), 0u);
  EXPECT_TRUE(r.resolve(kPeerIp, t0 + 1ms)->request);
}

TEST(ArpResolver, RefusesImpossibleConfigurations) {
  EXPECT_FALSE(ArpResolver::create(kBroadcastMac, {kOurIp}));
  EXPECT_FALSE(ArpResolver::create(kOurMac, {}));
  EXPECT_FALSE(ArpResolver::create(kOurMac, {Ipv4Address{}}));
  ArpResolverOptions o;
  o.capacity = 0;
  EXPECT_FALSE(ArpResolver::create(kOurMac, {kOurIp}, o));
  o = {};
  o.max_requests = 0;
  EXPECT_FALSE(ArpResolver::create(kOurMac, {kOurIp}, o));
  o = {};
  o.retry_interval = 0ms;
  EXPECT_FALSE(ArpResolver::create(kOurMac, {kOurIp}, o));
}

TEST(ArpResolver, StateNames) {
  EXPECT_STREQ(neighbor_state_name(NeighborState::kIncomplete), "incomplete");
  EXPECT_STREQ(neighbor_state_name(NeighborState::kReachable), "reachable");
  EXPECT_STREQ(neighbor_state_name(NeighborState::kStale), "stale");
}

}  // namespace
}  // namespace ufab::net
