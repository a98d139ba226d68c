// swnic against a hostile or broken peer: lengths, indices and headers
// written straight into the shared segment are checked, never trusted.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "drivers/swnic/segment.h"
#include "drivers/swnic/swnic.h"
#include "tests/unit/drivers/swnic/test_host.h"

namespace ufab::swnic_test {
namespace {

auto len100 = [](uint64_t) { return 100u; };

void set_len(SegmentView& v, int ring, uint64_t index, uint32_t len) {
  std::memcpy(v.slot(ring, index), &len, sizeof len);
}

TEST(SwnicHostile, ImpossibleLengthsInSlotsAreRejected) {
  std::string link = unique_link("badlen");
  auto a = Port::open(link + ":0");
  auto b = Port::open(link + ":1");
  ASSERT_TRUE(a && b);
  SegmentView v(link);
  ASSERT_TRUE(v.ok());
  // Four frames; the peer then rewrites three of their lengths.
  ASSERT_EQ(send_burst(*a, 0, 4, len100), 4);
  set_len(v, 0, 0, 0xffffffffu);
  set_len(v, 0, 1, 2048 + 1);  // one more than a slot holds
  set_len(v, 0, 2, 0);
  std::vector<Received> got;
  ASSERT_EQ(recv_burst(*b, &got, 32), 1);
  EXPECT_EQ(got[0].seq, 3u);
  EXPECT_TRUE(got[0].intact);
  EXPECT_EQ(b->stats().rx_errors, 3u);
  EXPECT_EQ(b->stats().rx_packets, 1u);
  EXPECT_EQ(b->rx_pool().available(), b->rx_pool().count());
  // And the link carries on.
  ASSERT_EQ(send_burst(*a, 10, 2, len100), 2);
  got.clear();
  ASSERT_EQ(recv_burst(*b, &got, 32), 2);
  EXPECT_EQ(got[1].seq, 11u);
}

TEST(SwnicHostile, ProducerIndexRunningAheadIsAnError) {
  std::string link = unique_link("badhead");
  auto a = Port::open(link + ":0", {{"ring", "64"}});
  auto b = Port::open(link + ":1");
  ASSERT_TRUE(a && b);
  SegmentView v(link);
  ASSERT_TRUE(v.ok());
  v.ctl(0)->head.store(v.ctl(0)->tail.load() + 64 + 5);
  ufab_buf* bufs[8];
  EXPECT_EQ(b->drv()->rx_burst(b->dev(), 0, bufs, 8), -EIO);
  EXPECT_NE(b->host().last_error().find("corrupt"), std::string::npos) << b->host().last_error();
  EXPECT_EQ(b->rx_pool().available(), b->rx_pool().count());
  // A peer that sets it back is served again.
  v.ctl(0)->head.store(v.ctl(0)->tail.load());
  EXPECT_EQ(b->drv()->rx_burst(b->dev(), 0, bufs, 8), 0);
}

TEST(SwnicHostile, ConsumerIndexOutOfRangeIsAnError) {
  std::string link = unique_link("badtail");
  auto a = Port::open(link + ":0", {{"ring", "64"}});
  auto b = Port::open(link + ":1");
  ASSERT_TRUE(a && b);
  SegmentView v(link);
  ASSERT_TRUE(v.ok());
  // Fill the ring so the producer must look at the consumer's tail.
  ASSERT_EQ(send_burst(*a, 0, 64, len100), 64);
  v.ctl(0)->tail.store(v.ctl(0)->head.load() + 10);  // ahead of the head
  EXPECT_EQ(send_burst(*a, 64, 1, len100), -EIO);
  EXPECT_NE(a->host().last_error().find("consumer index"), std::string::npos);
  EXPECT_EQ(a->tx_pool().available(), a->tx_pool().count());
}

TEST(SwnicHostile, CorruptHeaderIsRefusedAtOpen) {
  std::string link = unique_link("badhdr");
  {
    auto a = Port::open(link + ":0");
    ASSERT_TRUE(a);
    SegmentView v(link);
    ASSERT_TRUE(v.ok());
    v.hdr()->ring = 1000;  // not a power of two
    int rc = 0;
    std::string err;
    EXPECT_FALSE(Port::open(link + ":1", {}, &rc, &err));
    EXPECT_EQ(rc, -EPROTO);
    EXPECT_NE(err.find("corrupt"), std::string::npos) << err;
    v.hdr()->ring = 1024;
    v.hdr()->total_size = 1u << 30;  // inconsistent with ring and slot_size
    EXPECT_FALSE(Port::open(link + ":1", {}, &rc, &err));
    EXPECT_EQ(rc, -EPROTO);
    v.hdr()->total_size = swnic::make_layout(1024, 2048).total_size;
    v.hdr()->version = 99;
    EXPECT_FALSE(Port::open(link + ":1", {}, &rc, &err));
    EXPECT_EQ(rc, -EPROTO);
    EXPECT_NE(err.find("version 99"), std::string::npos) << err;
    v.hdr()->version = swnic::kVersion;
    EXPECT_TRUE(Port::open(link + ":1"));
  }
  EXPECT_FALSE(segment_exists(link));
}

TEST(SwnicHostile, ObjectSmallerThanItsHeaderSaysIsRefused) {
  std::string link = unique_link("short");
  auto a = Port::open(link + ":0");
  ASSERT_TRUE(a);
  int fd = ::open(("/dev/shm/ufab-swnic-" + link).c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, 8192), 0);  // port 0 must not touch the rings from here on
  ::close(fd);
  int rc = 0;
  std::string err;
  EXPECT_FALSE(Port::open(link + ":1", {}, &rc, &err));
  EXPECT_EQ(rc, -EPROTO);
  EXPECT_NE(err.find("bytes, its header says"), std::string::npos) << err;
  // Restore the size so port 0 can close cleanly.
  fd = ::open(("/dev/shm/ufab-swnic-" + link).c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(swnic::make_layout(1024, 2048).total_size)), 0);
  ::close(fd);
}

}  // namespace
}  // namespace ufab::swnic_test
