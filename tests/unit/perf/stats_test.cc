#include "tools/ufab/perf/stats.h"

#include <gtest/gtest.h>

#include <vector>

namespace ufab::cli::perf {
namespace {

// Post times whose consecutive deltas are `deltas` (nanoseconds).
std::vector<int64_t> posts(const std::vector<int64_t>& deltas) {
  std::vector<int64_t> p{1000};
  for (int64_t d : deltas) p.push_back(p.back() + d);
  return p;
}

TEST(LatencyStats, AsPerftestComputesThem) {
  // 9 deltas: 2..10 us in some order; perftest drops the two largest (10, 9),
  // so m = 7 and the kept ones are 2..8 us.
  auto r = latency_from_posts(posts({5000, 2000, 10000, 3000, 9000, 4000, 8000, 6000, 7000}), 64, 1);
  EXPECT_EQ(r.size, 64u);
  EXPECT_EQ(r.iters, 10u);
  EXPECT_DOUBLE_EQ(r.t_min, 2.0);
  EXPECT_DOUBLE_EQ(r.t_max, 9.0);      // delta[m]: the second largest of all
  EXPECT_DOUBLE_EQ(r.t_typical, 5.0);  // m = 7 odd: delta[3]
  EXPECT_DOUBLE_EQ(r.t_avg, 5.0);      // (2+...+8) / 7
  EXPECT_DOUBLE_EQ(r.p99, 9.0);        // delta[ceil(7 * 0.99)] = delta[7]
  EXPECT_DOUBLE_EQ(r.p999, 9.0);
  // Deviations truncated to whole usec: 3,2,1,0,1,2,3 -> sqrt(28/7).
  EXPECT_DOUBLE_EQ(r.t_stdev, 2.0);
}

TEST(LatencyStats, RoundTripsAreHalvedAndEvenMediansAveraged) {
  // 8 deltas, m = 6: kept 1000..6000 ns; median (3000 + 4000) / 2.
  auto r = latency_from_posts(posts({1000, 2000, 3000, 4000, 5000, 6000, 70000, 80000}), 2, 2);
  EXPECT_DOUBLE_EQ(r.t_typical, 1.75);  // 3.5 us round trip / 2
  EXPECT_DOUBLE_EQ(r.t_min, 0.5);
  EXPECT_DOUBLE_EQ(r.t_max, 35.0);
}

TEST(LatencyStats, SubMicrosecondJitterGivesZeroStdevAsInPerftest) {
  auto r = latency_from_posts(posts({1100, 1200, 1300, 1400, 1500, 1600, 1700}), 2, 1);
  EXPECT_DOUBLE_EQ(r.t_stdev, 0.0);
}

TEST(LatencyStats, TooFewPostsGiveNoFigures) {
  auto r = latency_from_posts({1, 2, 3}, 2, 1);
  EXPECT_EQ(r.iters, 3u);
  EXPECT_EQ(r.t_avg, 0.0);
}

TEST(LatencyStats, Duration) {
  auto r = latency_from_duration(1000, 2'000'000'000, 8, 2);  // 1000 round trips in 2 s
  EXPECT_DOUBLE_EQ(r.t_avg, 1000.0);                        // 2 ms each, 1 ms one way
  EXPECT_DOUBLE_EQ(r.tps, 500.0);
}

TEST(BandwidthStats, AverageAndPeakAsPerftest) {
  // 4 messages of 1 MiB, every one signaled: posted at 0,0,0,0 (ns),
  // completed at 1, 2, 3, 4 ms.
  std::vector<int64_t> posted = {0, 0, 0, 0};
  std::vector<int64_t> completed = {1'000'000, 2'000'000, 3'000'000, 4'000'000};
  auto r = bandwidth_from_times(posted, completed, 1 << 20, 1, true, false);
  EXPECT_EQ(r.iters, 4u);
  EXPECT_DOUBLE_EQ(r.bw_avg_mb, 1000.0);  // 4 MiB in 4 ms
  EXPECT_DOUBLE_EQ(r.msg_rate_mpps, 0.001);
  EXPECT_DOUBLE_EQ(r.bw_peak_mb, 1000.0);  // best window: 1 ms per message
  auto g = bandwidth_from_times(posted, completed, 1 << 20, 1, true, true);
  EXPECT_NEAR(g.bw_avg_mb, 8.388608, 1e-9);  // Gb/s: 10^9 bits
}

TEST(BandwidthStats, PeakUsesOnlySignaledCompletions) {
  // cq_mod 2: completions recorded at indices 1 and 3 only.
  std::vector<int64_t> posted = {0, 100, 200, 300};
  std::vector<int64_t> completed = {0, 1000, 0, 1300};
  auto r = bandwidth_from_times(posted, completed, 1000, 2, true, false);
  // Windows: (0..1) 1000/2, (0..3) 1300/4, (1..1) 900, (1..3) 1200/3,
  // (2..3) 1100/2, (3..3) 1000: the best is 325 ns per message.
  EXPECT_NEAR(r.bw_peak_mb, 1000.0 / 325e-9 / 1048576.0, 1e-6);
  auto none = bandwidth_from_times(posted, completed, 1000, 2, false, false);
  EXPECT_FALSE(none.peak_valid);
  EXPECT_EQ(none.bw_peak_mb, 0.0);
}

}  // namespace
}  // namespace ufab::cli::perf
