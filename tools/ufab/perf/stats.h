// The numbers perftest reports, computed the way perftest computes them
// (perftest_parameters.c print_report_lat / print_report_bw), so a ufab
// figure and a perftest figure from the same run mean the same thing.
#pragma once

#include <cstdint>
#include <vector>

#include "tools/ufab/perf/session.h"

namespace ufab::cli::perf {

// From the post times of one run (nanoseconds, one per operation; at least
// 5, as perftest's -n). `round_trips_per_delta` is 2 for write-lat and
// send-lat (a delta is a round trip, reported halved) and 1 for read-lat
// and atomic-lat. As perftest: the two largest deltas are dropped, t_max is
// the largest kept, the median of an even count is the integer mean of the
// middle two, the percentiles index ceil(m * 0.99) and ceil(m * 0.999), and
// the standard deviation truncates each deviation to whole microseconds
// before squaring (so sub-microsecond jitter shows as 0, in both tools).
LatencyResult latency_from_posts(const std::vector<int64_t>& posted_ns, uint64_t size, int round_trips_per_delta);

// -D: `completed` operations in `sample_ns` of the sampling window.
LatencyResult latency_from_duration(uint64_t completed, int64_t sample_ns, uint64_t size, int round_trips_per_delta);

// From the post time of every operation and the completion times
// (nanoseconds; completed_ns[j] is set for every j that ended a signaled
// batch: j = k * cq_mod - 1, and the last). As perftest's print_report_bw:
// the average is size * count over first post to last completion; the peak
// is the best (completed[j] - posted[i]) / (j - i + 1) over i and signaled
// j >= i. MB are 2^20 bytes; with `gbits`, Gb/s (10^9 bits) instead.
BandwidthResult bandwidth_from_times(const std::vector<int64_t>& posted_ns, const std::vector<int64_t>& completed_ns,
                                     uint64_t size, uint32_t cq_mod, bool peak, bool gbits);

// -D: `completed` operations of `size` bytes in `sample_ns`.
BandwidthResult bandwidth_from_duration(uint64_t completed, int64_t sample_ns, uint64_t size, bool gbits);

}  // namespace ufab::cli::perf
