// swnic's queues: the "queues" open parameter, agreed by both ports of a
// link; queue ids checked by every per-queue operation; each queue its own.
#include <gtest/gtest.h>

#include <cstring>

#include "drivers/swnic/segment.h"
#include "drivers/swnic/swnic.h"
#include "tests/unit/drivers/swnic/test_host.h"

namespace ufab::swnic_test {
namespace {

ufab_dev_info info_of(Port& p) {
  ufab_dev_info i{};
  EXPECT_EQ(p.drv()->info(p.dev(), &i), 0);
  return i;
}

TEST(SwnicQueues, DefaultIsOneQueue) {
  std::string link = unique_link("q-default");
  auto a = Port::open(link + ":0");
  ASSERT_TRUE(a);
  ufab_dev_info i = info_of(*a);
  EXPECT_EQ(i.max_rx_queues, 1);
  EXPECT_EQ(i.max_tx_queues, 1);
  EXPECT_EQ(a->queues(), 1);
}

TEST(SwnicQueues, ParameterSetsTheQueuesOfBothPorts) {
  std::string link = unique_link("q-four");
  auto a = Port::open(link + ":0", {{"queues", "4"}});
  ASSERT_TRUE(a);
  EXPECT_EQ(info_of(*a).max_rx_queues, 4);
  EXPECT_EQ(info_of(*a).max_tx_queues, 4);
  // The second port may leave it unset: it takes the link's.
  auto b = Port::open(link + ":1");
  ASSERT_TRUE(b);
  EXPECT_EQ(info_of(*b).max_rx_queues, 4);
  EXPECT_EQ(b->queues(), 4);
  // Or give the same value.
  b.reset();
  b = Port::open(link + ":1", {{"queues", "4"}});
  ASSERT_TRUE(b);
  EXPECT_TRUE(a->host().logged("4 queue(s)"));
}

TEST(SwnicQueues, MismatchIsAClearError) {
  std::string link = unique_link("q-mismatch");
  auto a = Port::open(link + ":0", {{"queues", "2"}});
  ASSERT_TRUE(a);
  int rc = 0;
  std::string err;
  EXPECT_FALSE(Port::open(link + ":1", {{"queues", "4"}}, &rc, &err));
  EXPECT_EQ(rc, -EINVAL);
  EXPECT_NE(err.find("exists with queues=2, but queues=4 was asked"), std::string::npos) << err;
  EXPECT_NE(err.find("both ends must agree"), std::string::npos) << err;
  // The default is 1 only for the port that creates the link.
  EXPECT_FALSE(Port::open(link + ":1", {{"queues", "1"}}, &rc, &err));
  EXPECT_EQ(rc, -EINVAL);
}

TEST(SwnicQueues, OutOfRangeValuesAreRefused) {
  for (const char* bad : {"0", "17", "-1", "two", ""}) {
    int rc = 0;
    std::string err;
    EXPECT_FALSE(Port::open(unique_link("q-bad") + ":0", {{"queues", bad}}, &rc, &err)) << bad;
    EXPECT_EQ(rc, -EINVAL) << bad;
    EXPECT_NE(err.find("queues="), std::string::npos) << err;
  }
  EXPECT_TRUE(Port::open(unique_link("q-max") + ":0", {{"queues", "16"}, {"ring", "64"}}));
}

TEST(SwnicQueues, BadQueueIdsAreRefusedByEveryOperation) {
  std::string link = unique_link("q-ids");
  auto a = Port::open(link + ":0", {{"queues", "2"}});
  auto b = Port::open(link + ":1");
  ASSERT_TRUE(a && b);
  const ufab_driver* d = a->drv();
  ufab_dev* dev = a->dev();
  ufab_buf* bufs[4];
  int fd = -1;
  EXPECT_EQ(d->rx_burst(dev, 2, bufs, 4), -EINVAL);
  std::string err = a->host().last_error();
  EXPECT_NE(err.find("RX queue 2 does not exist"), std::string::npos) << err;
  EXPECT_NE(err.find("queues=2"), std::string::npos) << err;
  EXPECT_EQ(d->tx_burst(dev, 2, bufs, 0), -EINVAL);
  EXPECT_NE(a->host().last_error().find("TX queue 2 does not exist"), std::string::npos);
  EXPECT_EQ(d->rx_burst(dev, 0xffff, bufs, 4), -EINVAL);
  EXPECT_EQ(d->rx_irq(dev, 2, 1, &fd), -EINVAL);
  EXPECT_EQ(d->rx_irq_arm(dev, 2), -EINVAL);
  EXPECT_EQ(d->stop(dev), 0);
  ufab_queue_conf rxc{1024, a->rx_pool().handle()};
  ufab_queue_conf txc{1024, nullptr};
  EXPECT_EQ(d->rx_queue_setup(dev, 2, &rxc), -EINVAL);
  EXPECT_EQ(d->tx_queue_setup(dev, 2, &txc), -EINVAL);
  // Queue 1 exists.
  EXPECT_EQ(d->rx_queue_setup(dev, 1, &rxc), 0);
  EXPECT_EQ(d->tx_queue_setup(dev, 1, &txc), 0);
  EXPECT_EQ(d->start(dev), 0);
  EXPECT_EQ(d->rx_burst(dev, 1, bufs, 4), 0);
}

// Driven through the table with only queue 0 set up.
TEST(SwnicQueues, QueuesNotSetUpAreRefused) {
  std::string link = unique_link("q-setup");
  TestHost host(link + ":0", {{"queues", "3"}});
  TestPool pool(64, 4096);
  const ufab_driver* d = ufab_swnic_driver();
  ufab_dev* dev = nullptr;
  ASSERT_EQ(d->open(host.ops(), host.host(), &dev), 0);
  ufab_queue_conf rxc{1024, pool.handle()};
  ufab_queue_conf txc{1024, nullptr};
  ASSERT_EQ(d->rx_queue_setup(dev, 0, &rxc), 0);
  ASSERT_EQ(d->tx_queue_setup(dev, 0, &txc), 0);
  ASSERT_EQ(d->start(dev), 0);
  ufab_buf* bufs[4];
  EXPECT_EQ(d->rx_burst(dev, 2, bufs, 4), -EINVAL);
  EXPECT_NE(host.last_error().find("RX queue 2 is not set up"), std::string::npos) << host.last_error();
  EXPECT_EQ(d->tx_burst(dev, 1, bufs, 0), -EINVAL);
  EXPECT_NE(host.last_error().find("TX queue 1 is not set up"), std::string::npos) << host.last_error();
  EXPECT_EQ(d->rx_burst(dev, 0, bufs, 4), 0);
  d->close(dev);
}

TEST(SwnicQueues, WithoutSteeringEveryTxQueueFeedsRxQueueZero) {
  std::string link = unique_link("q-nosteer");
  auto a = Port::open(link + ":0", {{"queues", "4"}});
  auto b = Port::open(link + ":1");
  ASSERT_TRUE(a && b);
  for (uint16_t q = 0; q < 4; ++q) ASSERT_EQ(send_roce(*a, q, /*qp=*/q, 10 * q, 3, 128, q), 3);
  for (uint16_t q = 1; q < 4; ++q) EXPECT_TRUE(drain(*b, q).empty());
  auto got = drain(*b, 0);
  ASSERT_EQ(got.size(), 12u);
  // In the order sent (one thread sent them all).
  for (size_t i = 0; i < got.size(); ++i) {
    uint32_t qp = 0, tag = 0;
    uint64_t seq = 0;
    ASSERT_TRUE(parse_roce_frame(got[i].data(), static_cast<uint32_t>(got[i].size()), &qp, &seq, &tag));
    EXPECT_EQ(tag, i / 3);
    EXPECT_EQ(seq, 10 * (i / 3) + i % 3);
  }
  EXPECT_EQ(b->stats().rx_packets, 12u);
  EXPECT_EQ(a->stats().tx_packets, 12u);
}

TEST(SwnicQueues, EachRxRingHasItsOwnSpace) {
  // A full RX ring holds back frames for it, not frames for the others.
  std::string link = unique_link("q-full");
  auto a = Port::open(link + ":0", {{"queues", "2"}, {"ring", "64"}});
  auto b = Port::open(link + ":1");
  ASSERT_TRUE(a && b);
  ASSERT_EQ(b->steer(UFAB_STEER_ROCE_QPN, 2), 0);
  ASSERT_EQ(send_roce(*a, 0, /*qp=*/1, 0, 64), 64);
  EXPECT_EQ(send_roce(*a, 0, 1, 64, 1), 0);  // ring of RX queue 1 is full
  EXPECT_EQ(send_roce(*a, 0, 0, 0, 64), 64);  // RX queue 0's is not
  EXPECT_EQ(drain(*b, 1).size(), 64u);
  EXPECT_EQ(drain(*b, 0).size(), 64u);
  EXPECT_EQ(send_roce(*a, 0, 1, 64, 1), 1);
}

TEST(SwnicQueues, SegmentOfAnOlderLayoutIsRefused) {
  std::string link = unique_link("q-oldver");
  auto a = Port::open(link + ":0");
  ASSERT_TRUE(a);
  SegmentView v(link);
  ASSERT_TRUE(v.ok());
  v.hdr()->version = 1;
  int rc = 0;
  std::string err;
  EXPECT_FALSE(Port::open(link + ":1", {}, &rc, &err));
  EXPECT_EQ(rc, -EPROTO);
  EXPECT_NE(err.find("layout version 1"), std::string::npos) << err;
  v.hdr()->version = swnic::kVersion;
  v.hdr()->queues = 17;
  EXPECT_FALSE(Port::open(link + ":1", {}, &rc, &err));
  EXPECT_EQ(rc, -EPROTO);
  EXPECT_NE(err.find("corrupt"), std::string::npos) << err;
  v.hdr()->queues = 1;
  EXPECT_TRUE(Port::open(link + ":1"));
}

}  // namespace
}  // namespace ufab::swnic_test
