// swnic fault injection: each fault's rate is near its setting, the
// counters agree with what the receiver sees, and a seed gives the same
// faults on every run.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "drivers/swnic/inject.h"
#include "drivers/swnic/swnic.h"
#include "tests/unit/drivers/swnic/test_host.h"

namespace ufab::swnic_test {
namespace {

constexpr uint64_t kFrames = 40000;

uint32_t len_for(uint64_t seq) { return static_cast<uint32_t>(60 + (seq * 131) % 1455); }

struct LinkRun {
  std::vector<Received> got;
  ufab_stats tx{}, rx{};
  std::vector<std::string> tx_logs;
  // The sender's injection counters in the segment (ring 0).
  uint64_t inj_loss = 0, inj_dup = 0, inj_reorder = 0, inj_corrupt = 0;
};

// Sends kFrames from port 0 to port 1 with the given injection parameters,
// receiving as it goes; bursts vary so that the ring fills at times.
LinkRun run_link(std::map<std::string, std::string> params, uint64_t frames = kFrames) {
  LinkRun run;
  std::string link = unique_link("inject");
  params["ring"] = "256";
  auto a = Port::open(link + ":0", params);
  auto b = Port::open(link + ":1");
  EXPECT_TRUE(a && b);
  if (!a || !b) return run;
  uint64_t sent = 0, x = 99;
  run.got.reserve(frames * 2);
  for (int guard = 0; sent < frames && guard < 10000000; ++guard) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(1 + (x >> 33) % 64, frames - sent));
    int r = send_burst(*a, sent, n, len_for);
    EXPECT_GE(r, 0);
    if (r < 0) break;
    sent += static_cast<uint64_t>(r);
    recv_burst(*b, &run.got, static_cast<uint16_t>(1 + (x >> 50) % 40));
  }
  // Flush a frame held back by reorder, then drain.
  EXPECT_EQ(a->drv()->tx_burst(a->dev(), 0, nullptr, 0), 0);
  for (int empty = 0; empty < 3;) empty = recv_burst(*b, &run.got, 64) == 0 ? empty + 1 : 0;
  run.tx = a->stats();
  run.rx = b->stats();
  run.tx_logs = a->host().logs();
  SegmentView v(link);
  EXPECT_TRUE(v.ok());
  if (v.ok()) {
    run.inj_loss = v.ctl(0)->inj_loss.load();
    run.inj_dup = v.ctl(0)->inj_dup.load();
    run.inj_reorder = v.ctl(0)->inj_reorder.load();
    run.inj_corrupt = v.ctl(0)->inj_corrupt.load();
  }
  return run;
}

void expect_rate(double measured, double expected, double rel_tol, const char* what) {
  EXPECT_NEAR(measured, expected, expected * rel_tol) << what;
}

TEST(SwnicInject, DecisionsArePureFunctionsOfSeedAndIndex) {
  swnic::FaultConfig c{0.3, 0.3, 0.3, 0.3, 7};
  for (uint64_t i = 0; i < 1000; ++i) {
    auto d1 = swnic::decide_fault(c, i), d2 = swnic::decide_fault(c, i);
    EXPECT_EQ(d1.lose, d2.lose);
    EXPECT_EQ(d1.dup, d2.dup);
    EXPECT_EQ(d1.hold, d2.hold);
    EXPECT_EQ(d1.corrupt, d2.corrupt);
    EXPECT_EQ(d1.bit_draw, d2.bit_draw);
  }
  swnic::FaultConfig none{};
  swnic::FaultConfig all{1, 1, 1, 1, 3};
  for (uint64_t i = 0; i < 1000; ++i) {
    auto d = swnic::decide_fault(none, i);
    EXPECT_FALSE(d.lose || d.dup || d.hold || d.corrupt);
    d = swnic::decide_fault(all, i);
    EXPECT_TRUE(d.lose && d.dup && d.hold && d.corrupt);
  }
  // The flipped bit lies past the Ethernet header and inside the frame.
  for (uint64_t draw = 0; draw < 100000; draw += 7) {
    uint32_t bit = swnic::corrupt_bit(60, draw * 0x9e3779b97f4a7c15ull);
    EXPECT_GE(bit, 14u * 8);
    EXPECT_LT(bit, 60u * 8);
  }
  EXPECT_LT(swnic::corrupt_bit(10, 12345), 80u);
}

TEST(SwnicInject, LossRateAndCounters) {
  LinkRun r = run_link({{"loss", "0.1"}, {"seed", "1"}});
  std::set<uint64_t> seen;
  for (const Received& f : r.got) {
    EXPECT_TRUE(f.intact);
    seen.insert(f.seq);
  }
  EXPECT_EQ(seen.size(), r.got.size());  // no duplicates
  // In order: loss alone never reorders.
  EXPECT_TRUE(std::is_sorted(r.got.begin(), r.got.end(), [](auto& x, auto& y) { return x.seq < y.seq; }));
  uint64_t lost = kFrames - seen.size();
  expect_rate(static_cast<double>(lost) / kFrames, 0.1, 0.1, "loss");
  // The receiver reports injected loss as rx_dropped; the sender counts
  // only frames that went on the wire.
  EXPECT_EQ(r.rx.rx_dropped, lost);
  EXPECT_EQ(r.inj_loss, lost);
  EXPECT_EQ(r.inj_dup + r.inj_reorder + r.inj_corrupt, 0u);
  EXPECT_EQ(r.tx.tx_packets, seen.size());
  EXPECT_EQ(r.rx.rx_packets, seen.size());
  bool logged = false;
  for (auto& l : r.tx_logs)
    logged |= l.find("fault injection on TX: loss=0.1 dup=0 reorder=0 corrupt=0 seed=1") != std::string::npos;
  EXPECT_TRUE(logged);
}

TEST(SwnicInject, DuplicateRate) {
  LinkRun r = run_link({{"dup", "0.1"}, {"seed", "2"}});
  uint64_t dups = 0;
  for (size_t i = 0; i < r.got.size(); ++i) {
    EXPECT_TRUE(r.got[i].intact);
    if (i > 0 && r.got[i].seq == r.got[i - 1].seq) ++dups;  // the copy follows the original
  }
  EXPECT_EQ(r.got.size(), kFrames + dups);
  expect_rate(static_cast<double>(dups) / kFrames, 0.1, 0.1, "dup");
  EXPECT_EQ(r.tx.tx_packets, kFrames + dups);
  EXPECT_EQ(r.inj_dup, dups);
  EXPECT_EQ(r.rx.rx_dropped, 0u);
}

TEST(SwnicInject, ReorderRate) {
  const double p = 0.1;
  LinkRun r = run_link({{"reorder", "0.1"}, {"seed", "3"}});
  ASSERT_EQ(r.got.size(), kFrames);
  // A held frame arrives right after its successor: a swap of neighbours.
  uint64_t swaps = 0;
  std::set<uint64_t> seen;
  for (size_t i = 0; i < r.got.size(); ++i) {
    EXPECT_TRUE(r.got[i].intact);
    seen.insert(r.got[i].seq);
    if (i > 0 && r.got[i].seq < r.got[i - 1].seq) {
      ++swaps;
      EXPECT_EQ(r.got[i].seq + 1, r.got[i - 1].seq);
    }
  }
  EXPECT_EQ(seen.size(), kFrames);
  // Every hold is a swap, except a frame still held at the end, which the
  // final flush sends in order.
  EXPECT_TRUE(r.inj_reorder == swaps || r.inj_reorder == swaps + 1) << r.inj_reorder << " vs " << swaps;
  // A frame that releases a held one cannot be held itself, so about
  // p / (1 + p) of all frames arrive late.
  expect_rate(static_cast<double>(swaps) / kFrames, p / (1 + p), 0.1, "reorder");
}

TEST(SwnicInject, CorruptRate) {
  LinkRun r = run_link({{"corrupt", "0.1"}, {"seed", "4"}});
  ASSERT_EQ(r.got.size(), kFrames);
  uint64_t bad = 0;
  for (const Received& f : r.got) bad += f.intact ? 0 : 1;
  expect_rate(static_cast<double>(bad) / kFrames, 0.1, 0.1, "corrupt");
  EXPECT_EQ(r.inj_corrupt, bad);
  // Corruption never changes the length.
  for (size_t i = 0; i < r.got.size(); ++i) EXPECT_EQ(r.got[i].len, len_for(i));
}

TEST(SwnicInject, SameSeedSameFaultsOtherSeedOtherFaults) {
  std::map<std::string, std::string> p = {
      {"loss", "0.05"}, {"dup", "0.05"}, {"reorder", "0.05"}, {"corrupt", "0.05"}, {"seed", "42"}};
  LinkRun r1 = run_link(p, 20000);
  LinkRun r2 = run_link(p, 20000);
  ASSERT_EQ(r1.got.size(), r2.got.size());
  for (size_t i = 0; i < r1.got.size(); ++i) {
    ASSERT_EQ(r1.got[i].hash, r2.got[i].hash) << i;
  }
  EXPECT_EQ(r1.rx.rx_dropped, r2.rx.rx_dropped);
  EXPECT_GT(r1.rx.rx_dropped, 0u);
  p["seed"] = "0x2b";
  LinkRun r3 = run_link(p, 20000);
  bool differs = r3.got.size() != r1.got.size();
  for (size_t i = 0; !differs && i < r1.got.size(); ++i) differs = r1.got[i].hash != r3.got[i].hash;
  EXPECT_TRUE(differs);
}

TEST(SwnicInject, NoInjectionNoLogLine) {
  LinkRun r = run_link({}, 1000);
  EXPECT_EQ(r.got.size(), 1000u);
  EXPECT_EQ(r.inj_loss + r.inj_dup + r.inj_reorder + r.inj_corrupt, 0u);
  for (auto& l : r.tx_logs) EXPECT_EQ(l.find("fault injection"), std::string::npos) << l;
}

}  // namespace
}  // namespace ufab::swnic_test
