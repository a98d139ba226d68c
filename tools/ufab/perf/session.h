// `ufab perf`: perftest's eight RC tests (ib_write_lat, ib_write_bw,
// ib_read_lat, ib_read_bw, ib_send_lat, ib_send_bw, ib_atomic_lat,
// ib_atomic_bw from linux-rdma/perftest 6.06) over a ufab port, speaking
// perftest's TCP exchange (tools/exchange/perftest.h) so either
// side can be perftest on rdma_rxe or any RoCE NIC.
//
// A Session owns what one run needs: the device, one registered buffer laid
// out as perftest lays out its own, the CQ, the QPs, and the TCP channel.
// The tests (latency.cc, bandwidth.cc) drive it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/gpu/cuda.h"
#include "tools/exchange/perftest.h"
#include "tools/exchange/perftest_cm.h"
#include "ufab/rdma.hpp"

namespace ufab::cli::perf {

// perftest's verb numbering (perftest_parameters.h VerbType): it picks the
// address line's fields. kFlush is ufab's own (flush-lat; perftest has no
// FLUSH test).
enum class Verb { kSend = 0, kWrite = 1, kRead = 2, kAtomic = 3, kFlush = 100 };
enum class Kind { kLatency, kBandwidth };

struct Config {
  std::string test;  // "write-lat", ...
  Verb verb = Verb::kWrite;
  Kind kind = Kind::kLatency;
  std::string device;
  std::string ip;
  std::string server_host;  // empty: server
  uint16_t port = exchange::kPerftestPort;
  uint64_t size = 0;        // bytes per message (-s); the largest with -a
  bool all_sizes = false;   // -a: 2, 4, ... 8 MiB
  uint64_t iters = 0;       // -n
  uint32_t duration_s = 0;  // -D: 0 means by iterations
  uint32_t qps = 1;         // -q
  uint32_t tx_depth = 0;    // -t
  uint32_t cq_mod = 0;      // -Q
  uint32_t mtu = 0;         // -m: 0 means the port's active MTU
  bool cmp_and_swap = false;  // -A CMP_AND_SWAP
  uint32_t inline_size = 0;
  uint32_t rx_depth = 0;
  bool report_gbits = false;
  std::chrono::milliseconds timeout{30000};
  std::map<std::string, std::string> params;
  bool json = false;
  // --flush: rdma::kFlushTypeGlobal or kFlushTypePersistent, 0 for none. A
  // FLUSH of that type behind every WRITE (write-lat, write-bw), or what
  // flush-lat's FLUSHes ask for.
  uint8_t flush_type = 0;
  // --pmem PATH: the buffer is PATH mapped MAP_SHARED (a regular file,
  // created or extended to the buffer's size, a block device, or a
  // /dev/daxN.M), registered as MemoryType::kPersistent.
  std::string pmem;
  // -R (--rdma_cm): the exchange over an rdma_cm control connection and
  // the test QPs connected by ufab's connection manager, as perftest's -R
  // (tools/exchange/perftest_cm.h); server_host is then the server's RoCE
  // address.
  bool rdma_cm = false;
  // --use_cuda[=DEV]: the buffer is device memory on GPU DEV (cuMemAlloc,
  // as perftest allocates it), registered as MemoryType::kCuda; -1: host.
  int cuda_device = -1;
  // --data_validation (write-bw, read-bw, send-bw): the source's messages
  // carry a known pattern and the side they land on checks every byte of
  // every message slot after the run (bandwidth.cc).
  bool data_validation = false;
  bool server() const { return server_host.empty(); }
  // Whether the peer writes and flushes this side's buffer: both sides of
  // write-lat, the server of the others.
  bool flush_target() const { return flush_type != 0 && (server() || (verb == Verb::kWrite && kind == Kind::kLatency)); }
  const char* role() const { return server() ? "server" : "client"; }
};

// perftest's MAX_SIZE (8 MiB) is the last -a size; the first is 2.
inline constexpr uint64_t kAllSizesMax = 8u << 20;
inline constexpr uint32_t kCycleBuffer = 4096;  // perftest: the page size
inline constexpr uint32_t kCacheLine = 64;

// "global", "persistent" (or "none") for --flush's value.
const char* flush_type_name(uint8_t type);
// What ufab perf writes after the version text's NUL in perftest's
// exchange: "ufab:" and this side's --flush type as a digit. perftest
// ignores it; a `ufab perf` peer with --flush insists on it, so a FLUSH
// never goes to a peer that cannot take it.
std::string ufab_mark(uint8_t flush_type);

// The sizes a run measures: -s, or with -a 2, 4, ... 8 MiB.
std::vector<uint64_t> test_sizes(const Config& cfg);

// One line of a latency report, in microseconds, computed as perftest's
// print_report_lat does (stats.h).
struct LatencyResult {
  uint64_t size = 0, iters = 0;
  double t_min = 0, t_max = 0, t_typical = 0, t_avg = 0, t_stdev = 0, p99 = 0, p999 = 0;
  // -D: the average and transactions per second.
  double tps = 0;
};

struct BandwidthResult {
  uint64_t size = 0, iters = 0;
  double bw_peak_mb = 0, bw_avg_mb = 0, msg_rate_mpps = 0;  // MB = 2^20 bytes per second
  bool peak_valid = true;
};

// Called about once a second while a test runs: what to print on the
// progress line.
using Progress = std::function<void(const std::string& line)>;

class Session {
 public:
  explicit Session(const Config& cfg) : cfg_(cfg) {}

  // Device, buffer, CQs and QPs (INIT), then the TCP connection and
  // perftest's version/system/MTU exchange; ARP is answered meanwhile.
  // With -R: the rdma_cm control connection instead of TCP, the same
  // exchange over it, then perftest's create_rdma_cm_connection (a key
  // exchange, the test QPs connected by the connection manager, another
  // key exchange).
  Status open();
  // One ctx_hand_shake for every QP (or for QP 0 only: `first_only`).
  Status swap_keys(bool first_only = false);
  // RTR and RTS towards the peer's keys from the last swap (nothing with
  // -R: the connection manager connected the QPs in open()).
  Status connect();
  // The close handshake and (TCP) "done".
  Status close();
  // After a run with -R: the test QPs disconnected (DREQ/DREP), as
  // perftest ends; nothing without -R.
  Status finish();
  Result<exchange::PerftestBwReport> swap_bw_report(const exchange::PerftestBwReport& mine);

  // Where perftest's text goes: stdout, or stderr under --json.
  FILE* out() const { return cfg_.json ? stderr : stdout; }
  // Lines perftest prints: the test banner, the address lines (ours or the
  // peer's), its RESULT_LINE.
  void print_banner(const char* title) const;
  void print_addresses(bool remote) const;
  void print_rule() const;

  // The buffer, one registered region as in perftest: per QP a local area
  // that sends and READ/atomic results use, and a remote area (the vaddr
  // we advertise) that the peer writes, reads, and our receives land in.
  // Each is max(size, cycle buffer) rounded up to a cache line.
  uint8_t* local_area(uint32_t qp) const { return buffer_ + uint64_t(qp) * area_; }
  uint8_t* remote_area(uint32_t qp) const { return buffer_ + uint64_t(cfg_.qps + qp) * area_; }
  uint64_t area() const { return area_; }
  const rdma::MemoryRegion& mr() const { return *mr_; }
  // The buffer's memory: "memfd", "heap", or --pmem's kind ("file",
  // "block device", "device DAX") and whether MAP_SYNC took.
  const std::string& memory_kind() const { return memory_kind_; }
  // Host bytes into the buffer at `offset` and back (device memory through
  // a synchronous copy): what the tests use instead of touching the buffer
  // when it may be GPU memory.
  Status store(uint64_t offset, const uint8_t* src, uint64_t n);
  Status load(uint64_t offset, uint8_t* dst, uint64_t n) const;
  uint64_t offset_of(const uint8_t* p) const { return uint64_t(p - buffer_); }
  // --data_validation: the bytes the run checked (set once it has).
  std::optional<uint64_t> validated_bytes;
  rdma::QueuePair& qp(uint32_t i) { return *qps_[i]; }
  rdma::CompletionQueue& send_cq() { return *send_cq_; }
  rdma::CompletionQueue& recv_cq() { return recv_cq_ ? *recv_cq_ : *send_cq_; }
  rdma::Device& device() { return *dev_; }
  bool device_open() const { return dev_ != nullptr; }
  const exchange::PerftestKeys& remote(uint32_t qp) const { return remote_[qp]; }
  uint32_t path_mtu() const { return path_mtu_; }
  const Config& config() const { return cfg_; }
  // The transport's counters, one line, for errors and the end report.
  std::string counters() const;

  // The next completion on `cq`, which must be a success. Bounded: no
  // completion for cfg.timeout is an error that says what we waited for.
  // With `stop`: nullopt once stop() is true (-D's end) and none came.
  Result<std::optional<rdma::WorkCompletion>> wait_completion(rdma::CompletionQueue& cq, const std::string& what,
                                                              const std::function<bool()>& stop = nullptr);
  // Drives progress until *byte == value (write-lat's arrival check) or,
  // with `stop`, until stop() is true. Bounded like wait_completion.
  Status wait_byte(const uint8_t* byte, uint8_t value, const std::string& what,
                   const std::function<bool()>& stop = nullptr);
  // Keeps answering the peer for `how_long` (acknowledging its last
  // messages) before the QPs go away.
  void linger(std::chrono::milliseconds how_long);

 private:
  Status open_device();
  Status map_buffer(uint64_t total);
  Status map_pmem(uint64_t total);
  Status map_cuda(uint64_t total);
  Status check_flush_caps(bool as_target) const;
  Status check_peer_flush(const std::string& peer_version, const std::string& peer_tail) const;
  Status open_channel();
  Status open_channel_cm();
  Status hello();
  exchange::PerftestKeys my_keys(uint32_t qp) const;

  const Config& cfg_;
  std::unique_ptr<rdma::Device> dev_;
  std::optional<rdma::ProtectionDomain> pd_;
  std::unique_ptr<uint8_t, std::function<void(uint8_t*)>> memory_;
  std::optional<gpu::Allocation> gpu_memory_;  // --use_cuda: owns the buffer
  uint8_t* buffer_ = nullptr;
  uint64_t area_ = 0;
  std::string memory_kind_;
  std::optional<rdma::MemoryRegion> mr_;
  std::unique_ptr<rdma::CompletionQueue> send_cq_, recv_cq_;
  std::vector<std::unique_ptr<rdma::QueuePair>> qps_;
  std::vector<uint32_t> psns_;
  std::vector<exchange::PerftestKeys> remote_;
  // -R: goes before the QPs it connected, after the channel that uses it.
  std::unique_ptr<exchange::PerftestCm> cm_;
  std::optional<exchange::PerftestChannel> channel_;
  uint32_t path_mtu_ = 0;
};

// -D's clock, as perftest's catch_alarm: `margin` seconds of warm-up, the
// sample, `margin` seconds of tail, then the end. margin = duration / 4.
class DurationClock {
 public:
  enum class State { kWarmup, kSample, kTail, kEnd };
  explicit DurationClock(uint32_t duration_s);
  State state();  // advances with the time; records the sample's edges
  int64_t sample_ns() const { return sample_end_ - sample_start_; }

 private:
  int64_t start_, margin_ns_, duration_ns_;
  int64_t sample_start_ = 0, sample_end_ = 0;
};

int64_t now_ns();

// Calls `progress` with a status line about once a second, from the
// second second on, while a test runs.
class Ticker {
 public:
  explicit Ticker(Progress progress) : progress_(std::move(progress)), start_(now_ns()), next_(start_ + 2'000'000'000) {}
  void tick(const std::function<std::string()>& line) {
    if (!progress_ || (++calls_ & 255) != 0) return;
    int64_t t = now_ns();
    if (t < next_) return;
    next_ = t + 1'000'000'000;
    progress_(line());
  }
  double seconds() const { return double(now_ns() - start_) / 1e9; }

 private:
  Progress progress_;
  int64_t start_, next_;
  uint64_t calls_ = 0;
};

// The tests. `result` gets every line of the report as it is measured (one
// per size); the write/read/atomic-bw server gets the client's report,
// which perftest sends it.
using LatencyReport = std::function<void(const LatencyResult&)>;
using BandwidthReport = std::function<void(const BandwidthResult&)>;
Status run_latency(Session& session, const Progress& progress, const LatencyReport& result);
Status run_bandwidth(Session& session, const Progress& progress, const BandwidthReport& result);

// Runs `fn` while a thread drives the device's progress, so the peer's ARP
// requests are answered while we block on TCP: a kernel peer resolves our
// MAC inside modify_qp to RTR and gives up after 1 s.
Status with_progress(rdma::Device& dev, const std::function<Status()>& fn);

}  // namespace ufab::cli::perf
