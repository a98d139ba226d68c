// swnic gather transmit (tx_burst_gather, ABI 1.3): a frame made of up to
// four segments arrives as one frame, byte for byte, on every TX path (one
// queue, steered runs, fault injection); malformed frames are dropped and
// counted, their buffers freed; a full ring takes whole frames only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <vector>

#include "drivers/swnic/swnic.h"
#include "tests/unit/drivers/swnic/test_host.h"

namespace ufab::swnic_test {
namespace {

// A frame's bytes cut into `nsegs` pieces: the first piece lies in the
// frame's own TX buffer (as the transport's headers do), the others in
// `payload` (memory the driver must read where it lies).
struct Gathered {
  std::vector<uint8_t> bytes;  // the frame as it must arrive
  std::vector<uint8_t> payload;
  ufab_tx_frame frame{};
};

Gathered make(Port& port, uint32_t qp, uint64_t seq, uint32_t len, uint32_t nsegs) {
  Gathered g;
  g.bytes.resize(len);
  fill_roce_frame(g.bytes.data(), len, qp, seq, 0);
  ufab_buf* buf = nullptr;
  EXPECT_EQ(port.tx_pool().alloc(&buf, 1), 1);
  g.frame.buf = buf;
  g.frame.nsegs = nsegs;
  g.frame.len = len;
  // The first segment holds the headers steering reads (kRoceMinLen).
  uint32_t first = nsegs == 1 ? len : kRoceMinLen;
  std::memcpy(buf->base + buf->offset, g.bytes.data(), first);
  g.frame.segs[0] = {buf->base + buf->offset, 0, first, 0};
  g.payload.assign(g.bytes.begin() + first, g.bytes.end());
  uint32_t left = len - first, at = 0;
  for (uint32_t k = 1; k < nsegs; ++k) {
    // Uneven pieces, each at least a byte, leaving a byte for each after it.
    uint32_t after = nsegs - 1 - k;
    uint32_t piece = after == 0 ? left : std::min(left - after, left / (after + 1) + k);
    g.frame.segs[k] = {g.payload.data() + at, 0, piece, 0};
    at += piece;
    left -= piece;
  }
  return g;
}

int send(Port& port, uint16_t queue, std::vector<Gathered>& frames) {
  std::vector<ufab_tx_frame> f;
  for (auto& g : frames) f.push_back(g.frame);
  return port.drv()->tx_burst_gather(port.dev(), queue, f.data(), static_cast<uint16_t>(f.size()));
}

TEST(SwnicGather, SegmentsArriveAsOneFrame) {
  std::string link = unique_link("gather");
  auto a = Port::open(link + ":0");
  auto b = Port::open(link + ":1");
  ASSERT_TRUE(a && b);
  ASSERT_NE(a->drv()->tx_burst_gather, nullptr);
  std::vector<Gathered> frames;
  uint64_t seq = 0;
  for (uint32_t nsegs = 1; nsegs <= UFAB_TX_SEGS_MAX; ++nsegs)
    for (uint32_t len : {kRoceMinLen + 3, 333u, 1081u, 1500u}) frames.push_back(make(*a, 7, seq++, len, nsegs));
  size_t free_before = a->tx_pool().available();
  ASSERT_EQ(send(*a, 0, frames), static_cast<int>(frames.size()));
  // The buffers are the driver's once taken, and a software NIC is done
  // with them when the call returns.
  EXPECT_EQ(a->tx_pool().available(), free_before + frames.size());
  auto got = drain(*b, 0);
  ASSERT_EQ(got.size(), frames.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], frames[i].bytes) << "frame " << i;
  EXPECT_EQ(a->stats().tx_packets, frames.size());
}

TEST(SwnicGather, SteeredRunsUseTheFirstSegmentsHeaders) {
  std::string link = unique_link("gather-st");
  auto a = Port::open(link + ":0", {{"queues", "2"}});
  auto b = Port::open(link + ":1", {{"queues", "2"}});
  ASSERT_TRUE(a && b);
  ASSERT_EQ(b->steer(UFAB_STEER_ROCE_QPN, 2), 0);
  std::vector<Gathered> frames;
  for (uint32_t i = 0; i < 12; ++i) frames.push_back(make(*a, i, i, 600 + i, 1 + i % 4));
  ASSERT_EQ(send(*a, 1, frames), 12);
  for (uint16_t q = 0; q < 2; ++q) {
    auto got = drain(*b, q);
    EXPECT_EQ(got.size(), 6u);
    for (const auto& f : got) {
      uint32_t qp = 0;
      uint64_t s = 0;
      ASSERT_TRUE(parse_roce_frame(f.data(), static_cast<uint32_t>(f.size()), &qp, &s));
      EXPECT_EQ(qp % 2, q);
      EXPECT_EQ(f, frames[s].bytes);
    }
  }
}

TEST(SwnicGather, FaultInjectionCopiesTheGatheredBytes) {
  // Duplicates and reordering copy a frame twice or hold it back: both
  // from the segments, so the copies arrive whole.
  std::string link = unique_link("gather-inj");
  auto a = Port::open(link + ":0", {{"dup", "0.3"}, {"reorder", "0.3"}, {"seed", "5"}});
  auto b = Port::open(link + ":1");
  ASSERT_TRUE(a && b);
  std::vector<Gathered> frames;
  for (uint32_t i = 0; i < 40; ++i) frames.push_back(make(*a, 1, i, 200 + 17 * i, 1 + i % 4));
  ASSERT_EQ(send(*a, 0, frames), 40);
  ASSERT_EQ(a->drv()->tx_burst(a->dev(), 0, nullptr, 0), 0);  // the held frame
  std::map<uint64_t, int> seen;
  for (const auto& f : drain(*b, 0)) {
    uint32_t qp = 0;
    uint64_t s = 0;
    ASSERT_TRUE(parse_roce_frame(f.data(), static_cast<uint32_t>(f.size()), &qp, &s));
    ASSERT_LT(s, 40u);
    EXPECT_EQ(f, frames[s].bytes);
    ++seen[s];
  }
  EXPECT_EQ(seen.size(), 40u);  // nothing lost: loss was not asked for
  int dups = 0;
  for (auto& [s, n] : seen) dups += n - 1;
  EXPECT_GT(dups, 0);
}

TEST(SwnicGather, MalformedFramesAreDroppedAndFreed) {
  std::string link = unique_link("gather-bad");
  auto a = Port::open(link + ":0");
  auto b = Port::open(link + ":1");
  ASSERT_TRUE(a && b);
  std::vector<Gathered> frames;
  for (int i = 0; i < 5; ++i) frames.push_back(make(*a, 1, static_cast<uint64_t>(i), 300, 3));
  frames[0].frame.nsegs = 0;                 // no segment
  frames[1].frame.nsegs = UFAB_TX_SEGS_MAX + 1;
  frames[2].frame.segs[1].len = 0;           // an empty segment
  frames[3].frame.len += 1;                  // lengths do not add up
  size_t free_before = a->tx_pool().available();
  ASSERT_EQ(send(*a, 0, frames), 5);  // taken: four dropped, one sent
  EXPECT_EQ(a->tx_pool().available(), free_before + 5);
  auto got = drain(*b, 0);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], frames[4].bytes);
  EXPECT_EQ(a->stats().tx_errors, 4u);
}

TEST(SwnicGather, FullRingTakesWholeFramesOnly) {
  std::string link = unique_link("gather-full");
  auto a = Port::open(link + ":0", {{"ring", "64"}});
  auto b = Port::open(link + ":1");
  ASSERT_TRUE(a && b);
  std::vector<Gathered> frames;
  for (uint32_t i = 0; i < 100; ++i) frames.push_back(make(*a, 1, i, 500, 4));
  int taken = send(*a, 0, frames);
  ASSERT_EQ(taken, 64);
  // The frames not taken are still the caller's.
  for (size_t i = static_cast<size_t>(taken); i < frames.size(); ++i) a->tx_pool().free(&frames[i].frame.buf, 1);
  auto got = drain(*b, 0);
  ASSERT_EQ(got.size(), 64u);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], frames[i].bytes);
}

TEST(SwnicGather, BeforeStartIsAnError) {
  std::string link = unique_link("gather-stop");
  auto a = Port::open(link + ":0");
  ASSERT_TRUE(a);
  ASSERT_EQ(a->drv()->stop(a->dev()), 0);
  Gathered g = make(*a, 1, 0, 200, 2);
  EXPECT_EQ(a->drv()->tx_burst_gather(a->dev(), 0, &g.frame, 1), -ENETDOWN);
  EXPECT_NE(a->host().last_error().find("tx_burst_gather before start()"), std::string::npos);
  a->tx_pool().free(&g.frame.buf, 1);
}

}  // namespace
}  // namespace ufab::swnic_test
