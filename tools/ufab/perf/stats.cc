#include "tools/ufab/perf/stats.h"

#include <algorithm>
#include <cmath>

namespace ufab::cli::perf {

LatencyResult latency_from_posts(const std::vector<int64_t>& posted_ns, uint64_t size, int rtt) {
  LatencyResult r;
  r.size = size;
  r.iters = posted_ns.size();
  if (posted_ns.size() < 5) return r;
  std::vector<int64_t> delta(posted_ns.size() - 1);
  for (size_t i = 0; i + 1 < posted_ns.size(); ++i) delta[i] = posted_ns[i + 1] - posted_ns[i];
  std::sort(delta.begin(), delta.end());
  const size_t m = delta.size() - 2;  // perftest's LAT_MEASURE_TAIL
  const double q = 1000.0 * rtt;      // ns per reported usec
  const int64_t median = m % 2 == 0 ? (delta[m / 2] + delta[m / 2 - 1]) / 2 : delta[m / 2];
  r.t_min = double(delta[0]) / q;
  r.t_max = double(delta[m]) / q;
  r.t_typical = double(median) / q;
  double sum = 0;
  for (size_t i = 0; i < m; ++i) sum += double(delta[i]) / q;
  r.t_avg = sum / double(m);
  double squares = 0;
  for (size_t i = 0; i < m; ++i) {
    int dev = int(r.t_avg - double(delta[i]) / q);
    squares += double(dev) * dev;
  }
  r.t_stdev = std::sqrt(squares / double(m));
  r.p99 = double(delta[size_t(std::ceil(double(m) * 0.99))]) / q;
  r.p999 = double(delta[size_t(std::ceil(double(m) * 0.999))]) / q;
  return r;
}

LatencyResult latency_from_duration(uint64_t completed, int64_t sample_ns, uint64_t size, int rtt) {
  LatencyResult r;
  r.size = size;
  r.iters = completed;
  if (completed == 0 || sample_ns <= 0) return r;
  r.t_avg = double(sample_ns) / 1000.0 / rtt / double(completed);
  r.tps = double(completed) / (double(sample_ns) / 1e9);
  return r;
}

namespace {
double rate_unit(bool gbits) { return gbits ? 125000000.0 : 1048576.0; }  // bytes per reported unit
}  // namespace

BandwidthResult bandwidth_from_times(const std::vector<int64_t>& posted, const std::vector<int64_t>& completed,
                                     uint64_t size, uint32_t cq_mod, bool peak, bool gbits) {
  BandwidthResult r;
  r.size = size;
  const size_t n = posted.size();
  r.iters = n;
  if (n == 0 || completed.size() != n || cq_mod == 0) return r;
  const double seconds = double(completed[n - 1] - posted[0]) / 1e9;
  if (seconds <= 0) return r;
  r.bw_avg_mb = double(size) * double(n) / seconds / rate_unit(gbits);
  r.msg_rate_mpps = double(n) / seconds / 1e6;
  r.peak_valid = peak;
  if (!peak) return r;
  double best = double(completed[n - 1] - posted[0]);
  // perftest's search is quadratic; beyond ~10^8 steps start only every
  // `stride`-th interval (long runs with cq_mod 1).
  const double steps = double(n) * double(n) / 2 / cq_mod;
  const size_t stride = steps > 1e8 ? size_t(steps / 1e8) + 1 : 1;
  for (size_t i = 0; i < n; i += stride) {
    // Signaled batches end at k * cq_mod - 1; the last operation is always
    // signaled.
    for (size_t j = (i / cq_mod + 1) * cq_mod - 1; j < n; j += cq_mod) {
      best = std::min(best, double(completed[j] - posted[i]) / double(j - i + 1));
    }
    if (n % cq_mod) best = std::min(best, double(completed[n - 1] - posted[i]) / double(n - i));
  }
  // perftest divides integer cycles; in nanoseconds the difference is noise.
  r.bw_peak_mb = best > 0 ? double(size) / (best / 1e9) / rate_unit(gbits) : 0;
  return r;
}

BandwidthResult bandwidth_from_duration(uint64_t completed, int64_t sample_ns, uint64_t size, bool gbits) {
  BandwidthResult r;
  r.size = size;
  r.iters = completed;
  r.peak_valid = false;
  if (sample_ns <= 0) return r;
  const double seconds = double(sample_ns) / 1e9;
  r.bw_avg_mb = double(size) * double(completed) / seconds / rate_unit(gbits);
  r.msg_rate_mpps = double(completed) / seconds / 1e6;
  return r;
}

}  // namespace ufab::cli::perf
