// The two-process harness of the RDMA tests (rdma_swnic_test,
// rdma_faults_test, tests/unit/provider:conformance_test): run_pair() runs
// one scenario function at both ends, end 0 in the test process (gtest's
// assertions) and end 1 in a forked child, which dies with the parent
// (PR_SET_PDEATHSIG), has an alarm() as a last resort and reports its
// failures to the parent over a socketpair.
//
// Which provider the two devices are comes from PairOptions::provider:
//   soft-RoCE over swnic: "swnic:LINK:0" (10.0.0.1) here, "swnic:LINK:1"
//                         (10.0.0.2) in the child, a new LINK per run;
//   shm:                  "shm:DOMAIN" at both ends, a new DOMAIN per run.
// Each run checks that nothing of it is left in /dev/shm, and with
// PairOptions::leak_check that this process has as many open file
// descriptors after the run as before it.
//
// Also: TCHECK*/TREQUIRE*, failures that work in either process; Side, one
// end with its device, PD and control channel (barriers, value exchange);
// and helpers with deadlines for memory, connected RC QPs, posts and
// completions.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <source_location>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "ufab/rdma.hpp"

namespace ufab::two_process {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using rdma::CompletionQueue;
using rdma::ConnectionData;
using rdma::Device;
using rdma::MemoryRegion;
using rdma::QpAttr;
using rdma::QpState;
using rdma::QueuePair;
using rdma::RecvWr;
using rdma::SendWr;
using rdma::Sge;
using rdma::WcOpcode;
using rdma::WcStatus;
using rdma::WorkCompletion;
using rdma::WrOpcode;
using std::chrono::milliseconds;

inline double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// ---------------------------------------------------------------------------
// Failures, from either process.
//
// Scenario code runs in both processes, so it does not use gtest's macros:
// TCHECK* record a failure (in the parent as a gtest failure, in the child
// as a message sent to the parent at once); TREQUIRE* also return false from
// the enclosing function, which every scenario function returns.

void record_failure(const char* file, int line, const std::string& msg);
void record_failure(const std::source_location& loc, const std::string& msg);

template <typename T>
std::string show(const T& v) {
  if constexpr (std::is_same_v<T, WcStatus>) {
    return std::string(rdma::wc_status_name(v)) + " (" + std::to_string(static_cast<int>(v)) + ")";
  } else if constexpr (std::is_same_v<T, WcOpcode>) {
    return std::string(rdma::wc_opcode_name(v)) + " (" + std::to_string(static_cast<int>(v)) + ")";
  } else if constexpr (std::is_same_v<T, QpState>) {
    return std::string(rdma::qp_state_name(v)) + " (" + std::to_string(static_cast<int>(v)) + ")";
  } else if constexpr (std::is_same_v<T, bool>) {
    return v ? "true" : "false";
  } else if constexpr (std::is_enum_v<T>) {
    return std::to_string(static_cast<long long>(v));
  } else if constexpr (std::is_integral_v<T>) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%lld (0x%llx)", static_cast<long long>(v), static_cast<unsigned long long>(v));
    return buf;
  } else if constexpr (std::is_arithmetic_v<T>) {
    return std::to_string(v);
  } else if constexpr (std::is_convertible_v<T, std::string>) {
    return std::string(v);
  } else {
    return "?";
  }
}

#define TCHECK(cond)                                                                              \
  do {                                                                                            \
    if (!(cond)) ::ufab::two_process::record_failure(__FILE__, __LINE__, "check failed: " #cond); \
  } while (0)

#define TCHECK_MSG(cond, msg)                                                                                    \
  do {                                                                                                           \
    if (!(cond))                                                                                                 \
      ::ufab::two_process::record_failure(__FILE__, __LINE__, std::string("check failed: " #cond ": ") + (msg)); \
  } while (0)

#define TCHECK_EQ(a, b)                                                                                           \
  do {                                                                                                            \
    const auto& tcheck_a_ = (a);                                                                                  \
    const auto& tcheck_b_ = (b);                                                                                  \
    if (!(tcheck_a_ == tcheck_b_))                                                                                \
      ::ufab::two_process::record_failure(__FILE__, __LINE__,                                                     \
                                          std::string(#a " == " #b ": ") + ::ufab::two_process::show(tcheck_a_) + \
                                              " vs " + ::ufab::two_process::show(tcheck_b_));                     \
  } while (0)

#define TREQUIRE(cond)                                                             \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      ::ufab::two_process::record_failure(__FILE__, __LINE__, "required: " #cond); \
      return false;                                                                \
    }                                                                              \
  } while (0)

#define TREQUIRE_OK(res)                                                                                           \
  do {                                                                                                             \
    const auto& treq_r_ = (res);                                                                                   \
    if (!treq_r_) {                                                                                                \
      ::ufab::two_process::record_failure(__FILE__, __LINE__,                                                      \
                                          std::string(#res " failed: ") + treq_r_.error().message() + " (errno " + \
                                              std::to_string(treq_r_.error().code()) + ")");                       \
      return false;                                                                                                \
    }                                                                                                              \
  } while (0)

// ---------------------------------------------------------------------------
// The control channel between the two processes: a SOCK_STREAM socketpair
// carrying frames [type u8][length u32][bytes]. 'M' is a message of the
// scenario, 'F' a failure the child reports, 'A' "I gave up" (the receiver
// of an 'A' stops waiting at once instead of running into its deadline).

class Channel {
 public:
  Channel() = default;
  explicit Channel(int fd) : fd_(fd) {}
  ~Channel() { close(); }
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  void reset(int fd) {
    close();
    fd_ = fd;
  }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  bool eof() const { return eof_; }
  const std::string& last_error() const { return last_error_; }
  int child_failures_seen() const { return child_failures_; }

  bool send_frame(char type, const void* data, size_t len);
  bool send(const std::string& s) { return send_frame('M', s.data(), s.size()); }
  template <typename T>
  bool send_value(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    return send_frame('M', &v, sizeof v);
  }
  template <typename T>
  bool send_vector(const std::vector<T>& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    return send_frame('M', v.data(), v.size() * sizeof(T));
  }

  // The next 'M' frame. While waiting, drives `drive`'s progress (so the
  // peer's RDMA traffic is answered) unless it is null. False on deadline,
  // end of file, an 'A' frame or an error (last_error() says which).
  bool recv(std::string* out, Clock::time_point deadline, Device* drive);
  template <typename T>
  bool recv_value(T* v, Clock::time_point deadline, Device* drive) {
    std::string s;
    if (!recv(&s, deadline, drive)) return false;
    if (s.size() != sizeof(T)) {
      last_error_ = "message of " + std::to_string(s.size()) + " bytes, expected " + std::to_string(sizeof(T));
      return false;
    }
    std::memcpy(v, s.data(), sizeof(T));
    return true;
  }
  template <typename T>
  bool recv_vector(std::vector<T>* v, Clock::time_point deadline, Device* drive) {
    std::string s;
    if (!recv(&s, deadline, drive)) return false;
    if (s.size() % sizeof(T)) {
      last_error_ = "message of " + std::to_string(s.size()) + " bytes";
      return false;
    }
    v->resize(s.size() / sizeof(T));
    if (!s.empty()) std::memcpy(v->data(), s.data(), s.size());
    return true;
  }

  // Reads (and handles 'F' frames) until the peer closes its end.
  bool wait_eof(Clock::time_point deadline, Device* drive);

 private:
  bool next_frame(char* type, std::string* payload, Clock::time_point deadline, Device* drive);

  int fd_ = -1;
  std::string buf_;
  bool eof_ = false;
  int child_failures_ = 0;
  std::string last_error_;
};

// ---------------------------------------------------------------------------
// One end: which process, its port, the channel to the peer.

// The provider both ends run.
enum class Provider {
  kSoftRoceSwnic,  // soft-RoCE (core/transport) over the two ports of a swnic link
  kShm,            // the shared-memory provider (drivers/shm)
};
const char* provider_name(Provider p);
// For gtest's messages about parameterized tests.
inline void PrintTo(Provider p, std::ostream* os) { *os << provider_name(p); }

struct Side {
  int role = 0;  // 0: the test process (swnic port 0, 10.0.0.1); 1: the child (port 1, 10.0.0.2)
  Provider provider = Provider::kSoftRoceSwnic;
  std::string link;    // the run's name: the swnic link, or the shm domain
  std::string device;  // the name this end opened ("swnic:LINK:0", "shm:DOMAIN")
  Channel ch;
  std::unique_ptr<Device> dev;
  std::optional<rdma::ProtectionDomain> pd;

  bool parent() const { return role == 0; }
  bool soft_roce() const { return provider == Provider::kSoftRoceSwnic; }

  // A barrier: both ends call it with the same tag. Drives progress while
  // it waits (drive = false leaves this end silent, for queue-full tests).
  bool sync(const std::string& tag, milliseconds limit = 30s, bool drive = true,
            std::source_location loc = std::source_location::current());

  template <typename T>
  bool exchange(const T& mine, T* theirs, milliseconds limit = 30s,
                std::source_location loc = std::source_location::current()) {
    if (!ch.send_value(mine) || !ch.recv_value(theirs, Clock::now() + limit, dev.get())) {
      record_failure(loc, "exchange: " + ch.last_error());
      return false;
    }
    return true;
  }

  template <typename T>
  bool exchange_vector(const std::vector<T>& mine, std::vector<T>* theirs, milliseconds limit = 30s,
                       std::source_location loc = std::source_location::current()) {
    if (!ch.send_vector(mine) || !ch.recv_vector(theirs, Clock::now() + limit, dev.get())) {
      record_failure(loc, "exchange: " + ch.last_error());
      return false;
    }
    return true;
  }
};

struct PairOptions {
  Provider provider = Provider::kSoftRoceSwnic;
  std::map<std::string, std::string> params[2];
  bool progress_thread[2] = {false, false};
  std::chrono::seconds limit{120};  // the whole scenario
  bool child_may_die = false;       // the scenario kills the child on purpose
  // After the run (the device closed, the child reaped): this process has
  // as many open fds as before it, and /dev/shm holds nothing of the run,
  // even when the child was killed.
  bool leak_check = false;
};

// Runs `body` in both processes: here as end 0 (opened first; swnic port 0
// with stale=reset), in a forked child as end 1.
void run_pair(const PairOptions& opt, const std::function<bool(Side&)>& body);

// ---------------------------------------------------------------------------
// Memory and completions.

// Anonymous memory, unmapped at the end; p is null when mmap failed.
struct Arena {
  explicit Arena(size_t n) : size(n) {
    void* m = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    p = m == MAP_FAILED ? nullptr : static_cast<uint8_t*>(m);
  }
  ~Arena() {
    if (p) ::munmap(p, size);
  }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  uint64_t addr(uint64_t off = 0) const { return reinterpret_cast<uint64_t>(p) + off; }
  uint8_t* p = nullptr;
  size_t size = 0;
};

// All of `arena` registered with `access`; empty (after a failure) when the
// arena has no memory or the registration failed.
std::optional<MemoryRegion> register_arena(Side& s, const Arena& arena, rdma::AccessFlags access,
                                           std::source_location loc = std::source_location::current());

// Polls until `n` completions arrived; a failure when fewer came in `limit`.
std::vector<WorkCompletion> poll_n(CompletionQueue& cq, size_t n, milliseconds limit = 20s,
                                   std::source_location loc = std::source_location::current());

// No completion for `quiet`.
void expect_none(CompletionQueue& cq, milliseconds quiet, std::source_location loc = std::source_location::current());

struct WcExpect {
  uint64_t wr_id = 0;
  WcStatus status = WcStatus::kSuccess;
  std::optional<WcOpcode> opcode = std::nullopt;  // unchecked when empty (undefined for errors in verbs)
  std::optional<uint32_t> byte_len = std::nullopt;
  std::optional<uint32_t> imm = std::nullopt;  // with_imm flag and value
  bool no_imm = false;                         // the with_imm flag must be clear
  uint32_t qp_num = 0;                         // checked when not 0
};

void expect_wc(const WorkCompletion& wc, const WcExpect& e, std::source_location loc = std::source_location::current());

// Polls one completion and checks it against `e`; empty (after poll_n's
// failure) when none came in `limit`.
std::optional<WorkCompletion> expect_one(CompletionQueue& cq, const WcExpect& e, milliseconds limit = 20s,
                                         std::source_location loc = std::source_location::current());

// Waits (driving progress) until the QP is in `want`.
bool wait_state(Device& dev, QueuePair& qp, QpState want, milliseconds limit = 10s,
                std::source_location loc = std::source_location::current());

// Drives progress for a while (the peer's requests are answered).
void drive_for(Device& dev, milliseconds d);

// ---------------------------------------------------------------------------
// A connected RC QP with its own CQs.

struct Conn {
  std::unique_ptr<CompletionQueue> scq, rcq;
  std::unique_ptr<QueuePair> qp;
  ConnectionData peer{};
};

struct ConnOptions {
  QpAttr tuning{};
  rdma::QpCaps caps{};
  uint32_t cq_depth = 512;
  ConnectionData advertise{};  // rkey / addr / length told to the peer
  bool sq_sig_all = false;
  // Connect by hand (modify INIT -> RTR -> RTS) with this first send PSN,
  // e.g. just below 2^24 so the PSNs wrap early.
  std::optional<uint32_t> psn = std::nullopt;
};

// Both ends call it in step: create, exchange, connect, sync.
bool make_conn(Side& s, Conn& c, const ConnOptions& o = {});

// The rkey, address and length of `mr`, to tell the peer.
ConnectionData advertise(const MemoryRegion& mr);

Status post_send(QueuePair& qp, uint64_t wr_id, WrOpcode op, std::span<const Sge> sgl,
                 rdma::SendFlags flags = rdma::kSendSignaled, uint64_t remote_addr = 0, uint32_t rkey = 0,
                 uint32_t imm = 0);
Status post_recv(QueuePair& qp, uint64_t wr_id, std::span<const Sge> sgl);
std::span<const Sge> one(const Sge& s);
Status post_atomic(QueuePair& qp, uint64_t wr_id, WrOpcode op, const Sge& result, uint64_t remote_addr, uint32_t rkey,
                   uint64_t compare_add, uint64_t swap);

// What most scenarios start from: a 64 KiB arena registered for local
// writes and one connection made with `o`; then `body`.
using ConnectedBody = std::function<bool(Side&, Arena&, MemoryRegion&, Conn&)>;
std::function<bool(Side&)> connected(ConnectedBody body, ConnOptions o = {});

// A request of `c` that completes in error on `cq` (c's send or receive CQ),
// after which the QP goes to ERROR.
bool expect_error(Side& s, Conn& c, CompletionQueue& cq, uint64_t wr_id, WcStatus status, milliseconds limit = 20s,
                  std::source_location loc = std::source_location::current());

// ---------------------------------------------------------------------------
// Patterns.

// Byte `off` of the message named by `seed`: every message (size, direction,
// tag) and every offset in it differ, so misplaced, reordered or stale data
// shows.
inline uint8_t pattern_byte(uint64_t seed, uint64_t off) {
  uint64_t x = (seed + 1) * 0x9E3779B97F4A7C15ull ^ (off * 0xD1B54A32D192ED03ull);
  x ^= x >> 31;
  return static_cast<uint8_t>(x ^ (x >> 17) ^ (x >> 40));
}

inline void fill_pattern(uint8_t* p, uint64_t len, uint64_t seed, uint64_t first_off = 0) {
  for (uint64_t i = 0; i < len; ++i) p[i] = pattern_byte(seed, first_off + i);
}

// -1 when [p, p + len) holds bytes first_off.. of message `seed`, else the
// first offset (relative to p) that does not.
inline int64_t pattern_mismatch(const uint8_t* p, uint64_t len, uint64_t seed, uint64_t first_off = 0) {
  for (uint64_t i = 0; i < len; ++i)
    if (p[i] != pattern_byte(seed, first_off + i)) return static_cast<int64_t>(i);
  return -1;
}

inline int64_t byte_mismatch(const uint8_t* p, uint64_t len, uint8_t v) {
  for (uint64_t i = 0; i < len; ++i)
    if (p[i] != v) return static_cast<int64_t>(i);
  return -1;
}

#define TCHECK_PATTERN(p, len, seed, first_off)                                                    \
  do {                                                                                             \
    int64_t tcp_bad_ = ::ufab::two_process::pattern_mismatch((p), (len), (seed), (first_off));     \
    if (tcp_bad_ >= 0)                                                                             \
      ::ufab::two_process::record_failure(__FILE__, __LINE__,                                      \
                                          std::string("data differs at byte ") +                   \
                                              std::to_string(tcp_bad_) + " of " +                  \
                                              std::to_string(static_cast<uint64_t>(len)) + " (" #p ")"); \
  } while (0)

#define TCHECK_BYTES(p, len, v)                                                                    \
  do {                                                                                             \
    int64_t tcb_bad_ = ::ufab::two_process::byte_mismatch((p), (len), (v));                        \
    if (tcb_bad_ >= 0)                                                                             \
      ::ufab::two_process::record_failure(                                                         \
          __FILE__, __LINE__, std::string("byte ") + std::to_string(tcb_bad_) + " of " #p " was overwritten"); \
  } while (0)

}  // namespace ufab::two_process
