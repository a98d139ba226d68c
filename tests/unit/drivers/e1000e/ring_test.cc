// Pure logic of the e1000e driver: ring sizes and index arithmetic,
// descriptor images, statistics accumulation, STATUS and MAC decoding.
#include "drivers/e1000e/ring.h"

#include <gtest/gtest.h>

#include <cstring>

namespace ufab::e1000e {
namespace {

TEST(RingSize, PowersOfTwoFrom64To4096) {
  for (uint32_t n : {64u, 128u, 256u, 512u, 1024u, 2048u, 4096u}) EXPECT_TRUE(valid_ring_size(n)) << n;
  for (uint32_t n : {0u, 1u, 8u, 32u, 63u, 65u, 96u, 100u, 4095u, 8192u}) EXPECT_FALSE(valid_ring_size(n)) << n;
}

TEST(RingSize, ValidSizesMeetTheDatasheetLengthRules) {
  for (uint32_t n = kMinRing; n <= kMaxRing; n *= 2) {
    EXPECT_EQ(n % 8, 0u);
    EXPECT_EQ(n * kDescBytes % 128, 0u);  // RDLEN/TDLEN multiple of 128
  }
}

TEST(Ring, NextWrapsAtSize) {
  Ring r{64};
  EXPECT_EQ(r.next(0), 1u);
  EXPECT_EQ(r.next(63), 0u);
  EXPECT_EQ(r.add(60, 10), 6u);
}

TEST(Ring, DistanceAcrossTheWrap) {
  Ring r{64};
  EXPECT_EQ(r.distance(0, 0), 0u);
  EXPECT_EQ(r.distance(10, 20), 10u);
  EXPECT_EQ(r.distance(60, 4), 8u);
  EXPECT_EQ(r.distance(1, 0), 63u);
}

TEST(Ring, OneSlotStaysEmpty) {
  Ring r{256};
  EXPECT_EQ(r.capacity(), 255u);
  EXPECT_EQ(r.free_after(0), 255u);
  EXPECT_EQ(r.free_after(255), 0u);
}

TEST(Ring, ContiguousStopsAtTheEnd) {
  Ring r{64};
  EXPECT_EQ(r.contiguous(0, 63), 63u);
  EXPECT_EQ(r.contiguous(60, 10), 4u);
  EXPECT_EQ(r.contiguous(60, 3), 3u);
}

TEST(TxDescriptor, OneFramePerDescriptorWithEopIfcsRs) {
  EXPECT_EQ(tx_lower(60), 0x0B00003Cu);
  EXPECT_EQ(tx_lower(1514), 0x0B0005EAu);
  alignas(16) TxDesc d;
  std::memset(&d, 0xff, sizeof d);  // stale DD and garbage from a previous use
  tx_fill(&d, 0x123456789a0ull, 1514);
  const uint8_t* b = reinterpret_cast<const uint8_t*>(&d);
  EXPECT_EQ(b[0], 0xa0);
  EXPECT_EQ(b[5], 0x01);
  EXPECT_EQ(b[8], 0xEA);  // length, little-endian
  EXPECT_EQ(b[9], 0x05);
  EXPECT_EQ(b[10], 0x00);  // CSO
  EXPECT_EQ(b[11], kTxCmdEop | kTxCmdIfcs | kTxCmdRs);
  EXPECT_EQ(b[12], 0x00);  // status: DD clear
  EXPECT_FALSE(tx_done(&d));
  reinterpret_cast<uint8_t*>(&d)[12] = kTxStaDd;
  EXPECT_TRUE(tx_done(&d));
}

TEST(TxDescriptor, OnlyTheLastDescriptorOfAFrameCarriesEopIfcsRs) {
  EXPECT_EQ(tx_cmd(true), kTxCmdEop | kTxCmdIfcs | kTxCmdRs);
  EXPECT_EQ(tx_cmd(false), 0);
  EXPECT_EQ(tx_lower(17, false), 17u) << "a middle descriptor: length only";
  EXPECT_EQ(tx_lower(17, true), tx_lower(17));
  alignas(16) TxDesc d;
  std::memset(&d, 0xff, sizeof d);
  tx_fill(&d, 0x2001, 33, false);
  const uint8_t* b = reinterpret_cast<const uint8_t*>(&d);
  EXPECT_EQ(b[0], 0x01);
  EXPECT_EQ(b[1], 0x20);
  EXPECT_EQ(b[8], 33);
  EXPECT_EQ(b[11], 0);   // no EOP, no IFCS, no RS: the device writes no DD here
  EXPECT_EQ(b[12], 0);   // stale DD cleared all the same
}

TEST(RxDescriptor, PostClearsTheWriteBackHalf) {
  alignas(16) RxDesc d;
  std::memset(&d, 0xff, sizeof d);
  rx_post(&d, 0x1000);
  const uint8_t* b = reinterpret_cast<const uint8_t*>(&d);
  EXPECT_EQ(b[0], 0x00);
  EXPECT_EQ(b[1], 0x10);
  for (int i = 8; i < 16; ++i) EXPECT_EQ(b[i], 0) << i;
  EXPECT_EQ(rx_status(&d) & kRxStaDd, 0);
}

TEST(RxDescriptor, FieldsAtTheLegacyOffsets) {
  alignas(16) uint8_t raw[16] = {};
  raw[8] = 0xEA;  // length 1514
  raw[9] = 0x05;
  raw[12] = kRxStaDd | kRxStaEop;
  raw[13] = 0x40;  // IPE
  auto* d = reinterpret_cast<RxDesc*>(raw);
  EXPECT_EQ(rx_length(d), 1514);
  EXPECT_EQ(rx_status(d), kRxStaDd | kRxStaEop);
  EXPECT_EQ(rx_errors(d) & kRxErrCsum, 0x40);
  EXPECT_EQ(rx_errors(d) & kRxErrFrame, 0);
}

TEST(Stats, Join64LowThenHigh) { EXPECT_EQ(join64(0x89abcdef, 0x01234567), 0x0123456789abcdefull); }

TEST(Stats, ClearOnReadSnapshotsAccumulate) {
  StatsTotals t;
  CounterSnapshot a;
  a.gprc = 10;
  a.gorc = 10 * (100 + 4);
  a.gptc = 3;
  a.gotc = 3 * (60 + 4);
  t.add(a);
  CounterSnapshot b;
  b.gprc = 5;
  b.gorc = 5 * (1514 + 4);
  b.mpc = 2;
  t.add(b);
  t.add(CounterSnapshot{});  // a read with nothing new
  EXPECT_EQ(t.rx_good, 15u);
  EXPECT_EQ(t.tx_good, 3u);
  EXPECT_EQ(t.rx_bytes(), 10u * 100 + 5u * 1514);  // CRC bytes removed
  EXPECT_EQ(t.tx_bytes(), 3u * 60);
  EXPECT_EQ(t.rx_missed, 2u);
}

TEST(Stats, OctetCountersPastFourGigabytes) {
  StatsTotals t;
  CounterSnapshot s;
  s.gprc = 3000000;
  s.gorc = join64(0x1000, 0x1);  // more than 2^32 octets in one read
  t.add(s);
  t.add(s);
  EXPECT_EQ(t.rx_octets, 2 * ((1ull << 32) + 0x1000));
  EXPECT_EQ(t.rx_bytes(), t.rx_octets - 4ull * 6000000);
}

TEST(Stats, BytesNeverUnderflow) { EXPECT_EQ(StatsTotals::without_crc(3, 1), 0u); }

TEST(Stats, DroppedAddsDeviceAndNoBuffer) {
  StatsTotals t;
  t.rx_missed = 4;
  t.sw_rx_no_buffer = 7;
  EXPECT_EQ(t.dropped(), 11u);
}

TEST(Status, LinkUpAt1000FullDuplex) {
  // QEMU's reset value: LU | ASDV 1000; STATUS reads add FD and speed 1000.
  LinkState l = decode_status(kStatusLu | kStatusFd | (2u << kStatusSpeedShift));
  EXPECT_TRUE(l.up);
  EXPECT_TRUE(l.full_duplex);
  EXPECT_EQ(l.speed_mbps, 1000u);
  EXPECT_EQ(decode_status(kStatusLu | (3u << kStatusSpeedShift)).speed_mbps, 1000u);
  EXPECT_EQ(decode_status(kStatusLu | (1u << kStatusSpeedShift)).speed_mbps, 100u);
  EXPECT_EQ(decode_status(kStatusLu).speed_mbps, 10u);
}

TEST(Status, LinkDownHasNoSpeed) {
  LinkState l = decode_status(2u << kStatusSpeedShift);
  EXPECT_FALSE(l.up);
  EXPECT_EQ(l.speed_mbps, 0u);
}

TEST(Mac, FromReceiveAddressZero) {
  uint8_t mac[6];
  ASSERT_TRUE(mac_from_ra(0x00005452, 0x80000100, mac));  // 52:54:00:00:00:01, AV
  const uint8_t want[6] = {0x52, 0x54, 0x00, 0x00, 0x00, 0x01};
  EXPECT_EQ(std::memcmp(mac, want, 6), 0);
  EXPECT_FALSE(mac_from_ra(0x00005452, 0x00000100, mac));  // AV clear
}

TEST(Mac, RoundTrip) {
  const uint8_t mac[6] = {0x02, 0x11, 0x22, 0x33, 0x44, 0x55};
  uint32_t ral, rah;
  mac_to_ra(mac, &ral, &rah);
  EXPECT_EQ(ral, 0x33221102u);
  EXPECT_EQ(rah, 0x80005544u);
  uint8_t back[6];
  ASSERT_TRUE(mac_from_ra(ral, rah, back));
  EXPECT_EQ(std::memcmp(mac, back, 6), 0);
}

TEST(Mac, UsableMeansUnicastAndNotZero) {
  const uint8_t zero[6] = {};
  const uint8_t multicast[6] = {0x01, 0, 0x5e, 0, 0, 1};
  const uint8_t broadcast[6] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
  const uint8_t ok[6] = {0x52, 0x54, 0, 0, 0, 2};
  EXPECT_FALSE(mac_usable(zero));
  EXPECT_FALSE(mac_usable(multicast));
  EXPECT_FALSE(mac_usable(broadcast));
  EXPECT_TRUE(mac_usable(ok));
}

}  // namespace
}  // namespace ufab::e1000e
