// swnic through its driver table, both ports in one process: open, info,
// link, bursts, wrap-around, full and empty rings, sizes, errors, naming,
// parameters and the segment's life cycle.
#include "drivers/swnic/swnic.h"

#include <gtest/gtest.h>

#include <barrier>
#include <cerrno>
#include <cstring>
#include <thread>

#include "tests/unit/drivers/swnic/test_host.h"

namespace ufab::swnic_test {
namespace {

auto fixed_len(uint32_t len) {
  return [len](uint64_t) { return len; };
}

// Drains up to `max` frames in bursts of 32, bounded by a number of empty polls.
std::vector<Received> drain(Port& p, size_t max = 1u << 20) {
  std::vector<Received> out;
  for (int empty = 0; empty < 3 && out.size() < max;) {
    int r = recv_burst(p, &out, 32);
    if (r < 0) break;
    empty = r == 0 ? empty + 1 : 0;
  }
  return out;
}

TEST(SwnicDriver, TableDescribesASoftwareDevice) {
  const ufab_driver* d = ufab_swnic_driver();
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->abi_major, UFAB_ABI_MAJOR);
  EXPECT_EQ(d->size, sizeof(ufab_driver));
  EXPECT_STREQ(d->name, "swnic");
  EXPECT_EQ(d->pci_match, nullptr);
  EXPECT_TRUE(d->flags & UFAB_DRIVER_F_SOFTWARE);
  for (auto op : {(void*)d->open, (void*)d->close, (void*)d->info, (void*)d->link, (void*)d->rx_queue_setup,
                  (void*)d->tx_queue_setup, (void*)d->start, (void*)d->stop, (void*)d->rx_burst, (void*)d->tx_burst,
                  (void*)d->stats, (void*)d->rx_irq, (void*)d->set_promiscuous})
    EXPECT_NE(op, nullptr);
}

TEST(SwnicDriver, OpenBothEndsSendAndReceiveBothWays) {
  std::string link = unique_link("basic");
  auto a = Port::open(link + ":0");
  ASSERT_TRUE(a);
  auto b = Port::open(link + ":1");
  ASSERT_TRUE(b);
  EXPECT_TRUE(a->host().logged("created segment /ufab-swnic-" + link));
  EXPECT_TRUE(b->host().logged("joined segment"));

  ASSERT_EQ(send_burst(*a, 0, 10, fixed_len(128)), 10);
  ASSERT_EQ(send_burst(*b, 100, 7, fixed_len(1514)), 7);

  std::vector<Received> at_b, at_a;
  ASSERT_EQ(recv_burst(*b, &at_b, 32), 10);
  ASSERT_EQ(recv_burst(*a, &at_a, 32), 7);
  for (size_t i = 0; i < at_b.size(); ++i) {
    EXPECT_TRUE(at_b[i].intact);
    EXPECT_EQ(at_b[i].seq, i);
    EXPECT_EQ(at_b[i].len, 128u);
  }
  for (size_t i = 0; i < at_a.size(); ++i) {
    EXPECT_TRUE(at_a[i].intact);
    EXPECT_EQ(at_a[i].seq, 100 + i);
  }
  ufab_stats sa = a->stats(), sb = b->stats();
  EXPECT_EQ(sa.tx_packets, 10u);
  EXPECT_EQ(sa.tx_bytes, 1280u);
  EXPECT_EQ(sa.rx_packets, 7u);
  EXPECT_EQ(sa.rx_bytes, 7u * 1514);
  EXPECT_EQ(sb.rx_packets, 10u);
  EXPECT_EQ(sb.tx_packets, 7u);
  EXPECT_EQ(sa.rx_dropped + sa.rx_errors + sa.tx_errors + sb.rx_dropped + sb.rx_errors + sb.tx_errors, 0u);
  // Every buffer went back: TX ones freed by the driver, RX ones by us.
  EXPECT_EQ(a->tx_pool().available(), a->tx_pool().count());
  EXPECT_EQ(b->rx_pool().available(), b->rx_pool().count());
}

TEST(SwnicDriver, InfoGivesLocallyAdministeredMacPerPort) {
  std::string link = unique_link("info");
  auto a = Port::open(link + ":0", {{"ring", "256"}, {"slot_size", "9018"}}, nullptr, nullptr, 64 + 9018);
  ASSERT_TRUE(a);
  auto b = Port::open(link + ":1");
  ASSERT_TRUE(b);
  ufab_dev_info ia{}, ib{};
  ASSERT_EQ(a->drv()->info(a->dev(), &ia), 0);
  ASSERT_EQ(b->drv()->info(b->dev(), &ib), 0);
  EXPECT_EQ(ia.mac[0], 0x02);
  EXPECT_EQ(ia.mac[1], 0x00);
  EXPECT_EQ(ia.mac[2], 0x00);
  EXPECT_EQ(ia.mac[5], 0);
  EXPECT_EQ(ib.mac[5], 1);
  EXPECT_EQ(0, std::memcmp(ia.mac, ib.mac, 5));
  EXPECT_EQ(ia.max_rx_queues, 1);
  EXPECT_EQ(ia.max_tx_queues, 1);
  // The joiner took the creator's geometry.
  EXPECT_EQ(ib.min_ring_size, 256);
  EXPECT_EQ(ib.max_ring_size, 256);
  EXPECT_EQ(ib.max_mtu, 9000u);
  EXPECT_EQ(ia.mtu, 1500u);
  EXPECT_TRUE(ia.caps & UFAB_DEV_CAP_RX_IRQ);
  EXPECT_TRUE(ia.caps & UFAB_DEV_CAP_LOOPBACK);
  EXPECT_NE(std::string(ia.model).find("swnic"), std::string::npos);

  // A different link name gives a different MAC (for these two names).
  std::string other = unique_link("info-other");
  auto c = Port::open(other + ":0");
  ASSERT_TRUE(c);
  ufab_dev_info ic{};
  c->drv()->info(c->dev(), &ic);
  EXPECT_EQ(ic.mac[0], 0x02);
  EXPECT_EQ(ic.mac[5], 0);
}

TEST(SwnicDriver, LinkIsDownWhilePeerAbsent) {
  std::string link = unique_link("link");
  auto a = Port::open(link + ":0");
  ASSERT_TRUE(a);
  ufab_link l{};
  ASSERT_EQ(a->drv()->link(a->dev(), &l), 0);
  EXPECT_EQ(l.up, 0u);
  EXPECT_EQ(l.speed_mbps, 0u);

  // Frames sent into a link with no far end are dropped and counted.
  EXPECT_EQ(send_burst(*a, 0, 5, fixed_len(100)), 5);
  EXPECT_EQ(a->stats().tx_errors, 5u);
  EXPECT_EQ(a->stats().tx_packets, 0u);

  auto b = Port::open(link + ":1");
  ASSERT_TRUE(b);
  EXPECT_TRUE(a->link_up());
  EXPECT_TRUE(b->link_up());
  // Nothing of what was sent while b was absent shows up.
  std::vector<Received> got;
  EXPECT_EQ(recv_burst(*b, &got, 32), 0);

  b->close();
  EXPECT_FALSE(a->link_up());
  auto b2 = Port::open(link + ":1");
  ASSERT_TRUE(b2);
  EXPECT_TRUE(a->link_up());
  ASSERT_EQ(send_burst(*a, 7, 1, fixed_len(100)), 1);
  ASSERT_EQ(recv_burst(*b2, &got, 32), 1);
  EXPECT_EQ(got[0].seq, 7u);
}

TEST(SwnicDriver, EmptyRingReturnsZero) {
  std::string link = unique_link("empty");
  auto a = Port::open(link + ":0");
  auto b = Port::open(link + ":1");
  ASSERT_TRUE(a && b);
  std::vector<Received> got;
  for (int i = 0; i < 100; ++i) EXPECT_EQ(recv_burst(*b, &got, 32), 0);
  EXPECT_EQ(recv_burst(*a, &got, 32), 0);
  // n = 0 is fine both ways.
  EXPECT_EQ(a->drv()->rx_burst(a->dev(), 0, nullptr, 0), 0);
  EXPECT_EQ(a->drv()->tx_burst(a->dev(), 0, nullptr, 0), 0);
  EXPECT_EQ(b->rx_pool().available(), b->rx_pool().count());
}

TEST(SwnicDriver, FullRingTakesFewerAndLosesNothing) {
  std::string link = unique_link("full");
  auto a = Port::open(link + ":0", {{"ring", "16"}});
  auto b = Port::open(link + ":1");
  ASSERT_TRUE(a && b);
  EXPECT_EQ(send_burst(*a, 0, 40, fixed_len(200)), 16);
  EXPECT_EQ(send_burst(*a, 16, 8, fixed_len(200)), 0);
  EXPECT_EQ(a->stats().tx_packets, 16u);
  EXPECT_EQ(a->tx_pool().available(), a->tx_pool().count());

  std::vector<Received> got;
  EXPECT_EQ(recv_burst(*b, &got, 5), 5);
  // Five slots free again.
  EXPECT_EQ(send_burst(*a, 16, 8, fixed_len(200)), 5);
  uint64_t next = 21;
  for (int guard = 0; next < 40 && guard < 1000; ++guard) {
    recv_burst(*b, &got, 3);
    int r = send_burst(*a, next, static_cast<uint32_t>(40 - next), fixed_len(200));
    ASSERT_GE(r, 0);
    next += static_cast<uint64_t>(r);
  }
  auto rest = drain(*b);
  got.insert(got.end(), rest.begin(), rest.end());
  ASSERT_EQ(got.size(), 40u);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].seq, i);
    EXPECT_TRUE(got[i].intact);
  }
}

TEST(SwnicDriver, WrapAroundWithVaryingBursts) {
  std::string link = unique_link("wrap");
  auto a = Port::open(link + ":0", {{"ring", "64"}});
  auto b = Port::open(link + ":1");
  ASSERT_TRUE(a && b);
  const uint64_t total = 50000;  // ~780 times around the ring
  uint64_t sent = 0, x = 12345;
  std::vector<Received> got;
  got.reserve(total);
  for (int guard = 0; (sent < total || got.size() < total) && guard < 1000000; ++guard) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t tx_n = 1 + static_cast<uint32_t>((x >> 33) % 100);
    uint16_t rx_n = static_cast<uint16_t>(1 + (x >> 45) % 77);
    if (sent < total) {
      tx_n = static_cast<uint32_t>(std::min<uint64_t>(tx_n, total - sent));
      int r = send_burst(*a, sent, tx_n, [](uint64_t s) { return static_cast<uint32_t>(60 + s % 1455); });
      ASSERT_GE(r, 0);
      sent += static_cast<uint64_t>(r);
    }
    ASSERT_GE(recv_burst(*b, &got, rx_n), 0);
  }
  ASSERT_EQ(got.size(), total);
  for (uint64_t i = 0; i < total; ++i) {
    ASSERT_EQ(got[i].seq, i);
    ASSERT_EQ(got[i].len, 60 + i % 1455);
    ASSERT_TRUE(got[i].intact);
  }
  EXPECT_EQ(b->stats().rx_packets, total);
}

TEST(SwnicDriver, MixedSizesUpToSlotSize) {
  std::string link = unique_link("sizes");
  auto a = Port::open(link + ":0");
  auto b = Port::open(link + ":1");
  ASSERT_TRUE(a && b);
  // Every length from 60 to the slot size (2048), several per burst.
  const uint64_t first = 60, last = 2048;
  uint64_t next = first;
  std::vector<Received> got;
  for (int guard = 0; next <= last && guard < 100000; ++guard) {
    uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(13, last + 1 - next));
    int r = send_burst(*a, next, n, [](uint64_t s) { return static_cast<uint32_t>(s); });
    ASSERT_GE(r, 0);
    next += static_cast<uint64_t>(r);
    recv_burst(*b, &got, 16);
  }
  auto rest = drain(*b);
  got.insert(got.end(), rest.begin(), rest.end());
  ASSERT_EQ(got.size(), last - first + 1);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].seq, first + i);
    EXPECT_EQ(got[i].len, first + i);
    EXPECT_TRUE(got[i].intact) << "len " << first + i;
  }
  EXPECT_EQ(b->stats().rx_errors, 0u);
}

TEST(SwnicDriver, OversizedFramesAreDroppedAndCounted) {
  std::string link = unique_link("oversize");
  // Port 1's receive buffers hold 256 - 64 = 192 bytes.
  auto a = Port::open(link + ":0");
  auto b = Port::open(link + ":1", {}, nullptr, nullptr, 256);
  ASSERT_TRUE(a && b);
  // TX: longer than a slot (2048): taken, freed, counted, not sent.
  EXPECT_EQ(send_burst(*a, 0, 1, fixed_len(2049)), 1);
  // TX: longer than its own buffer, and empty: the same.
  EXPECT_EQ(send_burst(*a, 1, 1, fixed_len(64 + 4096 + 64)), 1);
  EXPECT_EQ(send_burst(*a, 2, 1, fixed_len(0)), 1);
  EXPECT_EQ(a->stats().tx_errors, 3u);
  EXPECT_EQ(a->stats().tx_packets, 0u);
  EXPECT_EQ(a->tx_pool().available(), a->tx_pool().count());

  // RX: one frame fits port 1's buffer, one does not, then one fits.
  EXPECT_EQ(send_burst(*a, 10, 1, fixed_len(100)), 1);
  EXPECT_EQ(send_burst(*a, 11, 1, fixed_len(500)), 1);
  EXPECT_EQ(send_burst(*a, 12, 1, fixed_len(192)), 1);
  auto got = drain(*b);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].seq, 10u);
  EXPECT_EQ(got[1].seq, 12u);
  EXPECT_TRUE(got[0].intact && got[1].intact);
  EXPECT_EQ(b->stats().rx_errors, 1u);
  EXPECT_EQ(b->stats().rx_packets, 2u);
  EXPECT_EQ(b->rx_pool().available(), b->rx_pool().count());
}

TEST(SwnicDriver, NoReceiveBuffersLeavesFramesInTheRing) {
  std::string link = unique_link("nobuf");
  auto a = Port::open(link + ":0");
  auto b = Port::open(link + ":1");
  ASSERT_TRUE(a && b);
  ASSERT_EQ(send_burst(*a, 0, 4, fixed_len(100)), 4);
  std::vector<ufab_buf*> hold(b->rx_pool().count());
  ASSERT_EQ(b->rx_pool().alloc(hold.data(), b->rx_pool().count()), static_cast<int>(b->rx_pool().count()));
  std::vector<Received> got;
  EXPECT_EQ(recv_burst(*b, &got, 32), 0);
  b->rx_pool().free(hold.data(), b->rx_pool().count());
  EXPECT_EQ(recv_burst(*b, &got, 32), 4);
  EXPECT_EQ(b->stats().rx_dropped, 0u);
}

TEST(SwnicDriver, BurstsBeforeStartAndOnMissingQueuesFail) {
  std::string link = unique_link("states");
  auto a = Port::open(link + ":0");
  ASSERT_TRUE(a);
  ASSERT_EQ(a->drv()->stop(a->dev()), 0);
  ufab_buf* bufs[1];
  EXPECT_EQ(a->drv()->rx_burst(a->dev(), 0, bufs, 1), -ENETDOWN);
  EXPECT_EQ(a->drv()->tx_burst(a->dev(), 0, bufs, 1), -ENETDOWN);
  EXPECT_NE(a->host().last_error().find("before start"), std::string::npos);
  ASSERT_EQ(a->drv()->start(a->dev()), 0);
  EXPECT_EQ(a->drv()->rx_burst(a->dev(), 1, bufs, 1), -EINVAL);
  EXPECT_EQ(a->drv()->tx_burst(a->dev(), 1, bufs, 1), -EINVAL);
  ufab_queue_conf conf{64, nullptr};
  EXPECT_EQ(a->drv()->rx_queue_setup(a->dev(), 0, &conf), -EBUSY);  // started
  a->drv()->stop(a->dev());
  EXPECT_EQ(a->drv()->rx_queue_setup(a->dev(), 0, &conf), -EINVAL);  // no pool
  EXPECT_EQ(a->drv()->tx_queue_setup(a->dev(), 3, &conf), -EINVAL);
  EXPECT_EQ(a->drv()->set_promiscuous(a->dev(), 1), 0);
}

TEST(SwnicDriver, BadNamesAndParametersAreRefused) {
  std::string link = unique_link("params");
  struct Case {
    std::string name;
    std::map<std::string, std::string> params;
    int rc;
    std::string says;
  };
  std::vector<Case> cases = {
      {link, {}, -EINVAL, "NAME:PORT"},
      {link + ":2", {}, -EINVAL, "must be 0 or 1"},
      {":0", {}, -EINVAL, "NAME:PORT"},
      {"a/b:0", {}, -EINVAL, "may only hold"},
      {link + ":0", {{"ring", "1000"}}, -EINVAL, "power of two"},
      {link + ":0", {{"ring", "65536"}}, -EINVAL, "power of two"},
      {link + ":0", {{"ring", "abc"}}, -EINVAL, "not an unsigned integer"},
      {link + ":0", {{"slot_size", "1500"}}, -EINVAL, "slot_size=1500"},
      {link + ":0", {{"loss", "1.5"}}, -EINVAL, "probability"},
      {link + ":0", {{"dup", "-0.1"}}, -EINVAL, "probability"},
      {link + ":0", {{"seed", "x"}}, -EINVAL, "seed"},
      {link + ":0", {{"stale", "maybe"}}, -EINVAL, "stale"},
  };
  for (const Case& c : cases) {
    int rc = 0;
    std::string err;
    auto p = Port::open(c.name, c.params, &rc, &err);
    EXPECT_FALSE(p) << c.name;
    EXPECT_EQ(rc, c.rc) << c.name;
    EXPECT_NE(err.find(c.says), std::string::npos) << c.name << ": " << err;
  }
  EXPECT_FALSE(segment_exists(link));
}

TEST(SwnicDriver, BothEndsMustAgreeOnGeometry) {
  std::string link = unique_link("geometry");
  auto a = Port::open(link + ":0", {{"ring", "128"}});
  ASSERT_TRUE(a);
  int rc = 0;
  std::string err;
  EXPECT_FALSE(Port::open(link + ":1", {{"ring", "256"}}, &rc, &err));
  EXPECT_EQ(rc, -EINVAL);
  EXPECT_NE(err.find("both ends must agree"), std::string::npos) << err;
  EXPECT_FALSE(Port::open(link + ":1", {{"slot_size", "4096"}}, &rc, &err));
  EXPECT_EQ(rc, -EINVAL);
  EXPECT_TRUE(Port::open(link + ":1", {{"ring", "128"}, {"slot_size", "2048"}}));
}

TEST(SwnicDriver, APortOpensOnce) {
  std::string link = unique_link("busy");
  auto a = Port::open(link + ":0");
  ASSERT_TRUE(a);
  int rc = 0;
  std::string err;
  EXPECT_FALSE(Port::open(link + ":0", {}, &rc, &err));
  EXPECT_EQ(rc, -EBUSY);
  EXPECT_NE(err.find("already open"), std::string::npos) << err;
  // The failed open left the segment and port 0 as they were.
  auto b = Port::open(link + ":1");
  ASSERT_TRUE(b);
  EXPECT_TRUE(a->link_up());
}

TEST(SwnicDriver, SegmentIsUnlinkedWhenBothEndsClose) {
  std::string link = unique_link("unlink");
  EXPECT_FALSE(segment_exists(link));
  auto a = Port::open(link + ":0");
  ASSERT_TRUE(a);
  EXPECT_TRUE(segment_exists(link));
  {
    SegmentView v(link);
    ASSERT_TRUE(v.ok());
    EXPECT_EQ(v.hdr()->refs.load(), 1u);
  }
  auto b = Port::open(link + ":1");
  ASSERT_TRUE(b);
  {
    SegmentView v(link);
    EXPECT_EQ(v.hdr()->refs.load(), 2u);
  }
  a->close();
  EXPECT_TRUE(segment_exists(link));
  b->close();
  EXPECT_FALSE(segment_exists(link));
  // And a new pair starts afresh.
  auto c = Port::open(link + ":1");
  ASSERT_TRUE(c);
  EXPECT_TRUE(c->host().logged("created segment"));
  c->close();
  EXPECT_FALSE(segment_exists(link));
}

TEST(SwnicDriver, ConcurrentOpensOfBothEndsAgree) {
  // Both ends race to create the segment (O_CREAT|O_EXCL); every round
  // must end with one segment, both ports on it, and traffic flowing.
  for (int round = 0; round < 100; ++round) {
    std::string link = unique_link("race");
    std::unique_ptr<Port> ports[2];
    int rcs[2] = {1, 1};
    std::barrier sync(2);
    auto opener = [&](int p) {
      sync.arrive_and_wait();
      ports[p] = Port::open(link + ":" + std::to_string(p), {}, &rcs[p]);
    };
    std::thread t0(opener, 0), t1(opener, 1);
    t0.join();
    t1.join();
    ASSERT_EQ(rcs[0], 0) << round;
    ASSERT_EQ(rcs[1], 0) << round;
    ASSERT_TRUE(ports[0]->link_up());
    ASSERT_TRUE(ports[1]->link_up());
    ASSERT_EQ(send_burst(*ports[0], round, 1, fixed_len(64)), 1);
    std::vector<Received> got;
    ASSERT_EQ(recv_burst(*ports[1], &got, 4), 1);
    EXPECT_EQ(got[0].seq, static_cast<uint64_t>(round));
    // Close concurrently too.
    std::thread c0([&] { ports[0].reset(); }), c1([&] { ports[1].reset(); });
    c0.join();
    c1.join();
    ASSERT_FALSE(segment_exists(link)) << round;
  }
}

TEST(SwnicDriver, CloseAndReopenWhilePeerStaysKeepsTraffic) {
  std::string link = unique_link("reopen");
  auto a = Port::open(link + ":0");
  ASSERT_TRUE(a);
  for (int i = 0; i < 20; ++i) {
    auto b = Port::open(link + ":1");
    ASSERT_TRUE(b);
    ASSERT_EQ(send_burst(*a, i, 1, fixed_len(80)), 1);
    ASSERT_EQ(send_burst(*b, 1000 + i, 1, fixed_len(80)), 1);
    std::vector<Received> at_a, at_b;
    ASSERT_EQ(recv_burst(*b, &at_b, 8), 1);
    ASSERT_EQ(at_b[0].seq, static_cast<uint64_t>(i));
    ASSERT_EQ(recv_burst(*a, &at_a, 8), 1);
    ASSERT_EQ(at_a[0].seq, static_cast<uint64_t>(1000 + i));
    // A frame sent just before b goes is not delivered to the next b.
    ASSERT_EQ(send_burst(*a, 5000 + i, 1, fixed_len(80)), 1);
  }
}

}  // namespace
}  // namespace ufab::swnic_test
