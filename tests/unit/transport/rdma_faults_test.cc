// Reliability of the RDMA transport (api/rdma.h) under faults that swnic
// injects on BOTH directions, with the two ends in two processes (fork):
// loss 1 %, loss 5 %, reorder 5 %, dup 5 % and a mix with corruption, each
// seeded. In each setting kDefaultMessages messages (half each way) - SENDs
// of 1..3000 bytes carrying a sequence number and checksum, inline SENDs,
// RDMA WRITEs announced by a SEND and RDMA WRITE_WITH_IMMs - must arrive
// exactly once, in order, byte for byte. Also: retry exhaustion under
// loss=1.0 ends in RETRY_EXC_ERR.
//
// The message count: kDefaultMessages below, or UFAB_FAULT_MESSAGES in the
// environment (bazel test --test_env=UFAB_FAULT_MESSAGES=100000), or
// --fault_messages=N on the command line.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <source_location>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "api/rdma.h"

namespace ufab::rdma_faults_test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
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

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// ---------------------------------------------------------------------------
// Failures, from either process.
//
// Scenario code runs in both processes, so it does not use gtest's macros:
// TCHECK* record a failure (in the parent as a gtest failure, in the child
// as a message sent to the parent at once); TREQUIRE* also return false from
// the enclosing function, which every scenario function returns.

class Channel;
bool g_child = false;
Channel* g_child_channel = nullptr;
int g_child_failures = 0;

void record_failure(const char* file, int line, const std::string& msg);

void record_failure(const std::source_location& loc, const std::string& msg) {
  record_failure(loc.file_name(), static_cast<int>(loc.line()), msg);
}

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
    std::snprintf(buf, sizeof buf, "%lld (0x%llx)", static_cast<long long>(v),
                  static_cast<unsigned long long>(v));
    return buf;
  } else if constexpr (std::is_arithmetic_v<T>) {
    return std::to_string(v);
  } else if constexpr (std::is_convertible_v<T, std::string>) {
    return std::string(v);
  } else {
    return "?";
  }
}

#define TCHECK(cond)                                                                  \
  do {                                                                                \
    if (!(cond)) ::ufab::rdma_faults_test::record_failure(__FILE__, __LINE__, "check failed: " #cond); \
  } while (0)

#define TCHECK_MSG(cond, msg)                                                                     \
  do {                                                                                            \
    if (!(cond))                                                                                  \
      ::ufab::rdma_faults_test::record_failure(__FILE__, __LINE__,                                \
                                              std::string("check failed: " #cond ": ") + (msg)); \
  } while (0)

#define TCHECK_EQ(a, b)                                                                             \
  do {                                                                                              \
    const auto& tcheck_a_ = (a);                                                                    \
    const auto& tcheck_b_ = (b);                                                                    \
    if (!(tcheck_a_ == tcheck_b_))                                                                  \
      ::ufab::rdma_faults_test::record_failure(                                                      \
          __FILE__, __LINE__,                                                                       \
          std::string(#a " == " #b ": ") + ::ufab::rdma_faults_test::show(tcheck_a_) + " vs " +      \
              ::ufab::rdma_faults_test::show(tcheck_b_));                                            \
  } while (0)

#define TREQUIRE(cond)                                                                   \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      ::ufab::rdma_faults_test::record_failure(__FILE__, __LINE__, "required: " #cond);   \
      return false;                                                                      \
    }                                                                                    \
  } while (0)

#define TREQUIRE_OK(res)                                                                          \
  do {                                                                                            \
    const auto& treq_r_ = (res);                                                                  \
    if (!treq_r_) {                                                                               \
      ::ufab::rdma_faults_test::record_failure(__FILE__, __LINE__,                                \
                                              std::string(#res " failed: ") +                     \
                                                  treq_r_.error().message() + " (errno " +        \
                                                  std::to_string(treq_r_.error().code()) + ")"); \
      return false;                                                                               \
    }                                                                                             \
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

  bool send_frame(char type, const void* data, size_t len) {
    std::string frame(5 + len, '\0');
    frame[0] = type;
    uint32_t l = static_cast<uint32_t>(len);
    std::memcpy(frame.data() + 1, &l, 4);
    if (len) std::memcpy(frame.data() + 5, data, len);
    size_t off = 0;
    while (off < frame.size()) {
      ssize_t n = ::send(fd_, frame.data() + off, frame.size() - off, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        last_error_ = std::string("send: ") + std::strerror(errno);
        return false;
      }
      off += static_cast<size_t>(n);
    }
    return true;
  }
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
  bool recv(std::string* out, Clock::time_point deadline, Device* drive) {
    for (;;) {
      char type = 0;
      std::string payload;
      if (!next_frame(&type, &payload, deadline, drive)) return false;
      if (type == 'M') {
        *out = std::move(payload);
        return true;
      }
      if (type == 'A') {
        last_error_ = "the peer gave up";
        return false;
      }
    }
  }
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
  bool wait_eof(Clock::time_point deadline, Device* drive) {
    char type;
    std::string payload;
    while (!eof_) {
      if (!next_frame(&type, &payload, deadline, drive) && !eof_) return false;
    }
    return true;
  }

 private:
  bool next_frame(char* type, std::string* payload, Clock::time_point deadline, Device* drive) {
    for (;;) {
      if (buf_.size() >= 5) {
        uint32_t len;
        std::memcpy(&len, buf_.data() + 1, 4);
        if (buf_.size() >= 5 + static_cast<size_t>(len)) {
          *type = buf_[0];
          payload->assign(buf_, 5, len);
          buf_.erase(0, 5 + static_cast<size_t>(len));
          if (*type == 'F') {
            ++child_failures_;
            ADD_FAILURE() << "[child process] " << *payload;
            continue;
          }
          return true;
        }
      }
      if (eof_) {
        last_error_ = "the peer closed the channel";
        return false;
      }
      if (Clock::now() > deadline) {
        last_error_ = "deadline passed";
        return false;
      }
      struct pollfd pfd = {fd_, POLLIN, 0};
      int r = ::poll(&pfd, 1, drive ? 0 : 20);
      if (r < 0 && errno != EINTR) {
        last_error_ = std::string("poll: ") + std::strerror(errno);
        return false;
      }
      if (r <= 0) {
        if (drive) drive->progress();
        continue;
      }
      char tmp[65536];
      ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        last_error_ = std::string("recv: ") + std::strerror(errno);
        return false;
      }
      if (n == 0) {
        eof_ = true;
        continue;
      }
      buf_.append(tmp, static_cast<size_t>(n));
    }
  }

  int fd_ = -1;
  std::string buf_;
  bool eof_ = false;
  int child_failures_ = 0;
  std::string last_error_;
};

void record_failure(const char* file, int line, const std::string& msg) {
  if (g_child) {
    ++g_child_failures;
    std::string text = std::string(file) + ":" + std::to_string(line) + ": " + msg;
    std::fprintf(stderr, "[child %d] %s\n", static_cast<int>(::getpid()), text.c_str());
    if (g_child_channel) g_child_channel->send_frame('F', text.data(), text.size());
  } else {
    ADD_FAILURE_AT(file, line) << msg;
  }
}


// ---------------------------------------------------------------------------
// One end: which process, its port, the channel to the peer.

struct Side {
  int role = 0;  // 0: the test process, port 0, 10.0.0.1; 1: the child, port 1, 10.0.0.2
  std::string link;
  Channel ch;
  std::unique_ptr<Device> dev;
  std::optional<rdma::ProtectionDomain> pd;

  bool parent() const { return role == 0; }

  // A barrier: both ends call it with the same tag. Drives progress while
  // it waits (drive = false leaves this end silent, for queue-full tests).
  bool sync(const std::string& tag, milliseconds limit = 30s, bool drive = true,
            std::source_location loc = std::source_location::current()) {
    if (!ch.send(tag)) {
      record_failure(loc, "sync '" + tag + "': " + ch.last_error());
      return false;
    }
    std::string got;
    if (!ch.recv(&got, Clock::now() + limit, drive ? dev.get() : nullptr)) {
      record_failure(loc, "sync '" + tag + "': " + ch.last_error());
      return false;
    }
    if (got != tag) {
      record_failure(loc, "sync: this end is at '" + tag + "', the peer at '" + got + "'");
      return false;
    }
    return true;
  }

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
  std::map<std::string, std::string> params[2];
  bool progress_thread[2] = {false, false};
  std::chrono::seconds limit{120};  // the whole scenario
  bool child_may_die = false;       // the scenario kills the child on purpose
};

std::string sanitized_test_name() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string n = info ? std::string(info->test_suite_name()) + "." + info->name() : "test";
  for (char& c : n)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') c = '_';
  if (n.size() > 120) n.resize(120);
  return n;
}

Result<std::unique_ptr<Device>> open_port(const std::string& link, int port,
                                          const std::map<std::string, std::string>& params,
                                          bool progress_thread) {
  rdma::DeviceOptions o;
  o.ip = port == 0 ? "10.0.0.1" : "10.0.0.2";
  o.params = params;
  o.progress_thread = progress_thread;
  return Device::open("swnic:" + link + ":" + std::to_string(port), o);
}

bool shm_exists(const std::string& link) {
  struct stat st;
  return ::stat(("/dev/shm/ufab-swnic-" + link).c_str(), &st) == 0;
}

int child_main(const PairOptions& opt, const std::string& link, int fd, pid_t parent,
               const std::function<bool(Side&)>& body) {
  g_child = true;
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) return 90;
  ::alarm(static_cast<unsigned>(opt.limit.count()) + 30);  // last resort
  Side s;
  s.role = 1;
  s.link = link;
  s.ch.reset(fd);
  g_child_channel = &s.ch;
  std::string token;
  if (!s.ch.recv(&token, Clock::now() + 30s, nullptr)) return 91;  // parent never opened port 0
  auto dev = open_port(link, 1, opt.params[1], opt.progress_thread[1]);
  if (!dev) {
    record_failure(__FILE__, __LINE__, "opening port 1: " + dev.error().message());
    s.ch.send_frame('A', nullptr, 0);
    return 92;
  }
  s.dev = std::move(*dev);
  auto pd = s.dev->alloc_pd();
  if (!pd) {
    record_failure(__FILE__, __LINE__, "alloc_pd: " + pd.error().message());
    s.ch.send_frame('A', nullptr, 0);
    return 93;
  }
  s.pd.emplace(std::move(*pd));
  if (!s.ch.send("ready")) return 94;
  bool ok = body(s);
  if (!ok || g_child_failures) s.ch.send_frame('A', nullptr, 0);
  auto t0 = Clock::now();
  s.pd.reset();
  s.dev.reset();  // closes port 1 before the channel closes (at exit)
  if (ms_since(t0) > 500) std::fprintf(stderr, "[child] closing the device took %.0f ms\n", ms_since(t0));
  return g_child_failures ? 1 : (ok ? 0 : 2);
}

// Kills and reaps the child unless it was reaped already.
struct ChildGuard {
  pid_t pid = -1;
  ~ChildGuard() { kill(); }
  void kill() {
    if (pid <= 0) return;
    ::kill(pid, SIGKILL);
    int st;
    ::waitpid(pid, &st, 0);
    pid = -1;
  }
  // Exit status, -1 for a timeout (the child is then killed), 128+signal
  // for a signal.
  int wait(milliseconds limit) {
    auto deadline = Clock::now() + limit;
    for (;;) {
      int st = 0;
      pid_t r = ::waitpid(pid, &st, WNOHANG);
      if (r == pid) {
        pid = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      if (r < 0) {
        pid = -1;
        return -2;
      }
      if (Clock::now() > deadline) {
        kill();
        return -1;
      }
      std::this_thread::sleep_for(1ms);
    }
  }
};

// Runs `body` in both processes: here as port 0 (opened first, with
// stale=reset), in a forked child as port 1.
void run_pair(const PairOptions& opt, const std::function<bool(Side&)>& body) {
  static int counter = 0;
  std::string link = "rs" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-" +
                     sanitized_test_name();
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0) << std::strerror(errno);
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0) << std::strerror(errno);
  if (pid == 0) {
    ::close(sv[0]);
    int rc = 99;
    try {
      rc = child_main(opt, link, sv[1], parent, body);
    } catch (...) {
      rc = 98;
    }
    std::fflush(stdout);
    std::fflush(stderr);
    ::_exit(rc);
  }
  ::close(sv[1]);
  // Declared before the guard: on an early return the guard kills the child
  // first, then port 0 closes as the last user and removes the segment.
  Side s;
  s.role = 0;
  s.link = link;
  s.ch.reset(sv[0]);
  ChildGuard guard{pid};

  auto params = opt.params[0];
  params["stale"] = "reset";
  auto dev = open_port(link, 0, params, opt.progress_thread[0]);
  ASSERT_TRUE(dev) << "opening port 0: " << dev.error().message();
  s.dev = std::move(*dev);
  auto pd = s.dev->alloc_pd();
  ASSERT_TRUE(pd) << pd.error().message();
  s.pd.emplace(std::move(*pd));
  ASSERT_TRUE(s.ch.send("opened")) << s.ch.last_error();
  std::string ready;
  ASSERT_TRUE(s.ch.recv(&ready, Clock::now() + 30s, s.dev.get())) << "child: " << s.ch.last_error();
  ASSERT_EQ(ready, "ready");

  auto start = Clock::now();
  bool ok = body(s);
  bool failed = !ok || ::testing::Test::HasFailure();
  if (failed) {
    // Collect what the child already reported, then stop it.
    s.ch.send_frame('A', nullptr, 0);
    s.ch.wait_eof(Clock::now() + 2s, s.dev.get());
    guard.kill();
  } else {
    auto deadline = start + opt.limit + 10s;
    if (!s.ch.wait_eof(deadline, s.dev.get())) ADD_FAILURE() << "the child did not finish: " << s.ch.last_error();
    int st = guard.wait(10s);
    if (!opt.child_may_die && st != 0 && s.ch.child_failures_seen() == 0)
      ADD_FAILURE() << "the child exited with status " << st;
  }
  s.pd.reset();
  s.dev.reset();
  if (shm_exists(link)) {
    // swnic's close leaves the segment when the other port is still marked
    // present, which is the case when the child was killed: clean up then.
    if (failed || opt.child_may_die)
      std::fprintf(stderr, "note: removing /dev/shm/ufab-swnic-%s left by the killed child\n", link.c_str());
    else
      ADD_FAILURE() << "/dev/shm/ufab-swnic-" << link << " left behind";
    ::unlink(("/dev/shm/ufab-swnic-" + link).c_str());
  }
}

// ---------------------------------------------------------------------------
// Memory, patterns, completions.

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

// Polls until `n` completions arrived; a failure when fewer came in `limit`.
std::vector<WorkCompletion> poll_n(CompletionQueue& cq, size_t n, milliseconds limit = 20s,
                                   std::source_location loc = std::source_location::current()) {
  std::vector<WorkCompletion> got;
  got.reserve(n);
  std::vector<WorkCompletion> buf(std::max<size_t>(n, 1));
  auto deadline = Clock::now() + limit;
  while (got.size() < n) {
    auto r = cq.poll(std::span<WorkCompletion>(buf.data(), n - got.size()));
    if (!r) {
      record_failure(loc, "poll: " + r.error().message());
      return got;
    }
    for (size_t i = 0; i < *r; ++i) got.push_back(std::move(buf[i]));
    if (got.size() >= n) break;
    if (Clock::now() > deadline) {
      record_failure(loc, "only " + std::to_string(got.size()) + " of " + std::to_string(n) +
                              " completions after " + std::to_string(limit.count()) + " ms");
      break;
    }
  }
  return got;
}

// No completion for `quiet`.
void expect_none(CompletionQueue& cq, milliseconds quiet,
                 std::source_location loc = std::source_location::current()) {
  WorkCompletion wc;
  auto deadline = Clock::now() + quiet;
  while (Clock::now() < deadline) {
    auto r = cq.poll(std::span<WorkCompletion>(&wc, 1));
    if (!r) {
      record_failure(loc, "poll: " + r.error().message());
      return;
    }
    if (*r) {
      record_failure(loc, "unexpected completion: wr_id " + show(wc.wr_id) + " status " + show(wc.status) +
                              " opcode " + show(wc.opcode) + " " + wc.error);
      return;
    }
    std::this_thread::sleep_for(100us);
  }
}

struct WcExpect {
  uint64_t wr_id = 0;
  WcStatus status = WcStatus::kSuccess;
  std::optional<WcOpcode> opcode = std::nullopt;  // unchecked when empty (undefined for errors in verbs)
  std::optional<uint32_t> byte_len = std::nullopt;
  std::optional<uint32_t> imm = std::nullopt;  // with_imm flag and value
  bool no_imm = false;          // the with_imm flag must be clear
  uint32_t qp_num = 0;          // checked when not 0
};

void expect_wc(const WorkCompletion& wc, const WcExpect& e,
               std::source_location loc = std::source_location::current()) {
  std::string where = " (wr_id " + show(e.wr_id) + ")";
  if (wc.wr_id != e.wr_id) record_failure(loc, "wr_id " + show(wc.wr_id) + ", expected " + show(e.wr_id));
  if (wc.status != e.status)
    record_failure(loc, "status " + show(wc.status) + ", expected " + show(e.status) + where + ": " + wc.error);
  if (e.status == WcStatus::kSuccess && !wc.error.empty())
    record_failure(loc, "a successful completion carries an error text: " + wc.error);
  if (e.status != WcStatus::kSuccess && wc.status == e.status && wc.error.empty())
    record_failure(loc, "an error completion without a text" + where);
  if (e.opcode && wc.opcode != *e.opcode)
    record_failure(loc, "opcode " + show(wc.opcode) + ", expected " + show(*e.opcode) + where);
  if (e.byte_len && wc.byte_len != *e.byte_len)
    record_failure(loc, "byte_len " + show(wc.byte_len) + ", expected " + show(*e.byte_len) + where);
  if (e.imm) {
    if (!(wc.wc_flags & rdma::kWcWithImm)) record_failure(loc, "WITH_IMM flag missing" + where);
    if (wc.imm_data != *e.imm)
      record_failure(loc, "imm_data " + show(wc.imm_data) + ", expected " + show(*e.imm) + where);
  }
  if (e.no_imm && (wc.wc_flags & rdma::kWcWithImm)) record_failure(loc, "unexpected WITH_IMM flag" + where);
  if (e.qp_num && wc.qp_num != e.qp_num)
    record_failure(loc, "qp_num " + show(wc.qp_num) + ", expected " + show(e.qp_num) + where);
}

// Waits (driving progress) until the QP is in `want`.
bool wait_state(Device& dev, QueuePair& qp, QpState want, milliseconds limit = 10s,
                std::source_location loc = std::source_location::current()) {
  auto deadline = Clock::now() + limit;
  while (qp.state() != want) {
    if (Clock::now() > deadline) {
      record_failure(loc, "QP state " + show(qp.state()) + " after " + std::to_string(limit.count()) +
                              " ms, expected " + show(want));
      return false;
    }
    dev.progress();
    std::this_thread::sleep_for(50us);
  }
  return true;
}

// Drives progress for a while (the peer's requests are answered).
void drive_for(Device& dev, milliseconds d) {
  auto deadline = Clock::now() + d;
  while (Clock::now() < deadline) {
    dev.progress();
    std::this_thread::sleep_for(20us);
  }
}

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
bool make_conn(Side& s, Conn& c, const ConnOptions& o = {}) {
  auto scq = s.dev->create_cq(o.cq_depth);
  TREQUIRE_OK(scq);
  c.scq = std::move(*scq);
  auto rcq = s.dev->create_cq(o.cq_depth);
  TREQUIRE_OK(rcq);
  c.rcq = std::move(*rcq);
  auto qp = s.pd->create_qp(
      {.type = rdma::QpType::kRc, .send_cq = c.scq.get(), .recv_cq = c.rcq.get(), .caps = o.caps, .sq_sig_all = o.sq_sig_all});
  TREQUIRE_OK(qp);
  c.qp = std::move(*qp);
  TCHECK_EQ(c.qp->state(), QpState::kReset);
  ConnectionData mine = c.qp->local();
  TCHECK_EQ(mine.ip, s.dev->ip());
  TCHECK_EQ(mine.qpn, c.qp->qp_num());
  mine.rkey = o.advertise.rkey;
  mine.addr = o.advertise.addr;
  mine.length = o.advertise.length;
  if (o.psn) mine.psn = *o.psn;
  TREQUIRE(s.exchange(mine, &c.peer));
  if (o.psn) {
    QpAttr a = o.tuning;
    a.state = QpState::kInit;
    a.pkey_index = 0;
    a.port = 1;
    TREQUIRE_OK(c.qp->modify(a, rdma::kAttrState | rdma::kAttrPkeyIndex | rdma::kAttrPort | rdma::kAttrAccessFlags));
    a.state = QpState::kRtr;
    a.av.dest_ip = c.peer.ip;
    a.dest_qpn = c.peer.qpn;
    a.rq_psn = c.peer.psn;
    TREQUIRE_OK(c.qp->modify(a, rdma::kAttrState | rdma::kAttrAv | rdma::kAttrPathMtu | rdma::kAttrDestQpn |
                                    rdma::kAttrRqPsn | rdma::kAttrMaxDestRdAtomic | rdma::kAttrMinRnrTimer));
    a.state = QpState::kRts;
    a.sq_psn = *o.psn;
    TREQUIRE_OK(c.qp->modify(a, rdma::kAttrState | rdma::kAttrSqPsn | rdma::kAttrTimeout | rdma::kAttrRetryCnt |
                                    rdma::kAttrRnrRetry | rdma::kAttrMaxQpRdAtomic));
  } else {
    TREQUIRE_OK(c.qp->connect(c.peer, o.tuning));
  }
  TCHECK_EQ(c.qp->state(), QpState::kRts);
  TREQUIRE(s.sync("connected"));
  return true;
}

ConnectionData advertise(const MemoryRegion& mr) {
  ConnectionData d;
  d.rkey = mr.rkey();
  d.addr = reinterpret_cast<uint64_t>(mr.addr());
  d.length = static_cast<uint32_t>(mr.length());
  return d;
}

Status post_send(QueuePair& qp, uint64_t wr_id, WrOpcode op, std::span<const Sge> sgl,
                 rdma::SendFlags flags = rdma::kSendSignaled, uint64_t remote_addr = 0, uint32_t rkey = 0,
                 uint32_t imm = 0) {
  SendWr wr;
  wr.wr_id = wr_id;
  wr.opcode = op;
  wr.flags = flags;
  wr.sgl = sgl;
  wr.imm_data = imm;
  wr.remote_addr = remote_addr;
  wr.rkey = rkey;
  return qp.post_send(wr);
}

Status post_recv(QueuePair& qp, uint64_t wr_id, std::span<const Sge> sgl) {
  RecvWr wr;
  wr.wr_id = wr_id;
  wr.sgl = sgl;
  return qp.post_recv(wr);
}

std::span<const Sge> one(const Sge& s) { return std::span<const Sge>(&s, 1); }


// ===========================================================================
// The stream.

constexpr uint64_t kDefaultMessages = 1'000'000;  // per setting, half each way

uint64_t message_count() {
  uint64_t n = kDefaultMessages;
  if (const char* e = std::getenv("UFAB_FAULT_MESSAGES"); e && *e) n = std::strtoull(e, nullptr, 0);
  // --fault_messages=N (gtest leaves flags it does not know alone).
  if (FILE* f = std::fopen("/proc/self/cmdline", "r")) {
    std::string all;
    char buf[4096];
    size_t got;
    while ((got = std::fread(buf, 1, sizeof buf, f)) > 0) all.append(buf, got);
    std::fclose(f);
    size_t pos = 0;
    while (pos < all.size()) {
      std::string arg = all.c_str() + pos;
      pos += arg.size() + 1;
      const std::string flag = "--fault_messages=";
      if (arg.rfind(flag, 0) == 0) n = std::strtoull(arg.c_str() + flag.size(), nullptr, 0);
    }
  }
  return std::max<uint64_t>(n, 2);
}

constexpr uint32_t kRecvDepth = 256;     // receives posted at each end
constexpr uint32_t kWriteSlots = 1024;   // WRITE targets; > 2 x kRecvDepth (see below)
constexpr uint32_t kStageSlots = 512;    // send staging, one per WR in flight
constexpr uint32_t kWindow = 256;        // WRs in flight per end (< kStageSlots)
constexpr uint32_t kSignalEvery = 16;
constexpr uint32_t kSlot = 4096;
constexpr uint32_t kMaxLen = 3000;
constexpr uint32_t kInlineMax = 128;
constexpr uint64_t kRecvArea = 0;
constexpr uint64_t kWriteArea = uint64_t{kRecvDepth} * kSlot;
constexpr uint64_t kStageArea = kWriteArea + uint64_t{kWriteSlots} * kSlot;
constexpr uint64_t kStreamArena = kStageArea + uint64_t{kStageSlots} * kSlot;
// Why a WRITE's slot (seq % kWriteSlots) is never overwritten before the
// receiver checked it: every message consumes one receive, the receiver
// reposts a receive only after checking a message, and the responder runs
// messages in order; so when message seq + kWriteSlots lands, at least
// seq + kWriteSlots - kRecvDepth > seq messages have been checked.
static_assert(kWriteSlots > 2 * kRecvDepth && kWindow + 2 <= kStageSlots);

inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

enum class Kind : uint8_t { kSend, kInlineSend, kWriteNotify, kWriteImm };

struct Msg {
  Kind kind;
  uint32_t len;
};

// Message `seq` sent by port `dir`.
Msg message(uint64_t seq, int dir) {
  uint64_t h = mix64(seq * 2 + static_cast<uint64_t>(dir));
  uint32_t len = 1 + static_cast<uint32_t>(h % kMaxLen);
  uint32_t k = static_cast<uint32_t>(h >> 40) % 16;
  Kind kind = k == 0 ? Kind::kWriteNotify : k == 1 ? Kind::kWriteImm : len <= kInlineMax ? Kind::kInlineSend : Kind::kSend;
  return {kind, len};
}

// The bytes of message `seq` from port `dir`.
void gen(uint8_t* out, uint32_t len, uint64_t seq, int dir) {
  uint64_t base = mix64(seq ^ (uint64_t{static_cast<uint32_t>(dir)} << 62));
  uint32_t i = 0;
  for (; i + 8 <= len; i += 8) {
    uint64_t w = mix64(base + i);
    std::memcpy(out + i, &w, 8);
  }
  if (i < len) {
    uint64_t w = mix64(base + i);
    std::memcpy(out + i, &w, len - i);
  }
}

uint32_t checksum(const uint8_t* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 29;
  }
  for (; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return static_cast<uint32_t>(h ^ (h >> 32));
}

// In every SEND of 16 bytes or more, and in the notice after a WRITE.
struct Header {
  uint64_t seq;
  uint32_t len;
  uint32_t sum;  // SEND: of bytes [16, len); notice: of the WRITE's bytes
};
static_assert(sizeof(Header) == 16);

struct StreamResult {
  uint64_t sent = 0, received = 0;
  double seconds = 0;
};

struct Stream {
  Side& s;
  Arena& arena;
  MemoryRegion& mr;
  Conn& c;
  uint64_t n_send, n_recv;
  Clock::time_point deadline;

  uint64_t sent = 0, wr_posted = 0, wr_done = 0, received = 0;
  std::vector<uint8_t> expect = std::vector<uint8_t>(kSlot);

  int peer() const { return 1 - s.role; }
  uint64_t stage_off(uint64_t wr) const { return kStageArea + (wr % kStageSlots) * kSlot; }
  rdma::SendFlags signal(uint64_t wr, bool force) const {
    return (wr % kSignalEvery == kSignalEvery - 1 || force) ? rdma::kSendSignaled : 0;
  }

  bool post_message() {
    const uint64_t seq = sent;
    const Msg m = message(seq, s.role);
    const bool last = seq + 1 == n_send;
    const uint64_t wr = wr_posted;
    uint8_t* stage = arena.p + stage_off(wr);
    gen(stage, m.len, seq, s.role);
    const uint64_t slot = kWriteArea + (seq % kWriteSlots) * kSlot;
    switch (m.kind) {
      case Kind::kSend:
      case Kind::kInlineSend: {
        if (m.len >= sizeof(Header)) {
          Header h{seq, m.len, checksum(stage + sizeof(Header), m.len - sizeof(Header))};
          std::memcpy(stage, &h, sizeof h);
        }
        Sge sge = mr.sge(stage_off(wr), m.len);
        rdma::SendFlags f = signal(wr, last) | (m.kind == Kind::kInlineSend ? rdma::kSendInline : 0);
        TREQUIRE_OK(post_send(*c.qp, wr, WrOpcode::kSend, one(sge), f));
        wr_posted += 1;
        break;
      }
      case Kind::kWriteImm: {
        Sge sge = mr.sge(stage_off(wr), m.len);
        TREQUIRE_OK(post_send(*c.qp, wr, WrOpcode::kRdmaWriteWithImm, one(sge), signal(wr, last), c.peer.addr + slot,
                              c.peer.rkey, static_cast<uint32_t>(seq)));
        wr_posted += 1;
        break;
      }
      case Kind::kWriteNotify: {
        Sge sge = mr.sge(stage_off(wr), m.len);
        TREQUIRE_OK(post_send(*c.qp, wr, WrOpcode::kRdmaWrite, one(sge), signal(wr, false), c.peer.addr + slot,
                              c.peer.rkey));
        uint8_t* notice = arena.p + stage_off(wr + 1);
        Header h{seq, m.len, checksum(stage, m.len)};
        std::memcpy(notice, &h, sizeof h);
        Sge nsge = mr.sge(stage_off(wr + 1), sizeof h);
        TREQUIRE_OK(post_send(*c.qp, wr + 1, WrOpcode::kSend, one(nsge), signal(wr + 1, last)));
        wr_posted += 2;
        break;
      }
    }
    ++sent;
    return true;
  }

  // Checks the next message from the peer; false (with a failure) when it is
  // not exactly message `received`.
  bool check_receive(const WorkCompletion& wc) {
    const uint64_t seq = received;
    const Msg m = message(seq, peer());
    const std::string what = "message " + std::to_string(seq) + " (" + std::to_string(m.len) + " bytes, kind " +
                             std::to_string(static_cast<int>(m.kind)) + ")";
    if (wc.status != WcStatus::kSuccess) {
      record_failure(__FILE__, __LINE__, what + ": receive completion " + show(wc.status) + ": " + wc.error);
      return false;
    }
    const uint8_t* buf = arena.p + kRecvArea + wc.wr_id * kSlot;
    gen(expect.data(), m.len, seq, peer());
    if (m.kind == Kind::kWriteImm) {
      const uint8_t* slot = arena.p + kWriteArea + (seq % kWriteSlots) * kSlot;
      if (wc.opcode != WcOpcode::kRecvRdmaWithImm || !(wc.wc_flags & rdma::kWcWithImm) ||
          wc.imm_data != static_cast<uint32_t>(seq) || wc.byte_len != m.len) {
        record_failure(__FILE__, __LINE__, what + ": expected WRITE_WITH_IMM, got opcode " + show(wc.opcode) + " imm " +
                                               show(wc.imm_data) + " byte_len " + show(wc.byte_len));
        return false;
      }
      if (std::memcmp(slot, expect.data(), m.len) != 0) {
        record_failure(__FILE__, __LINE__, what + ": WRITE_WITH_IMM data differs");
        return false;
      }
      return true;
    }
    if (wc.opcode != WcOpcode::kRecv || (wc.wc_flags & rdma::kWcWithImm)) {
      record_failure(__FILE__, __LINE__, what + ": expected a SEND, got opcode " + show(wc.opcode) + " imm " + show(wc.imm_data));
      return false;
    }
    if (m.kind == Kind::kWriteNotify) {
      const uint8_t* slot = arena.p + kWriteArea + (seq % kWriteSlots) * kSlot;
      Header h{};
      if (wc.byte_len == sizeof h) std::memcpy(&h, buf, sizeof h);
      if (wc.byte_len != sizeof h || h.seq != seq || h.len != m.len || h.sum != checksum(slot, m.len) ||
          std::memcmp(slot, expect.data(), m.len) != 0) {
        record_failure(__FILE__, __LINE__, what + ": WRITE notice byte_len " + show(wc.byte_len) + " seq " + show(h.seq) +
                                               " len " + show(h.len) + ", or the WRITE's data differs");
        return false;
      }
      return true;
    }
    if (wc.byte_len != m.len) {
      std::string got;
      if (wc.byte_len >= sizeof(Header)) {
        Header h;
        std::memcpy(&h, buf, sizeof h);
        got = " (it carries seq " + std::to_string(h.seq) + ")";
      }
      record_failure(__FILE__, __LINE__, what + ": byte_len " + show(wc.byte_len) + got);
      return false;
    }
    if (m.len >= sizeof(Header)) {
      Header h;
      std::memcpy(&h, buf, sizeof h);
      if (h.seq != seq || h.len != m.len || h.sum != checksum(buf + sizeof h, m.len - sizeof h) ||
          std::memcmp(buf + sizeof h, expect.data() + sizeof h, m.len - sizeof h) != 0) {
        record_failure(__FILE__, __LINE__, what + ": header seq " + show(h.seq) + " len " + show(h.len) +
                                               ", or checksum or data wrong");
        return false;
      }
    } else if (std::memcmp(buf, expect.data(), m.len) != 0) {
      record_failure(__FILE__, __LINE__, what + ": data differs");
      return false;
    }
    return true;
  }

  bool run() {
    std::vector<WorkCompletion> wcs(64);
    while (sent < n_send || wr_done < wr_posted || received < n_recv) {
      if (Clock::now() > deadline) {
        record_failure(__FILE__, __LINE__, "deadline: sent " + std::to_string(sent) + "/" + std::to_string(n_send) +
                                               ", completed " + std::to_string(wr_done) + "/" + std::to_string(wr_posted) +
                                               " WRs, received " + std::to_string(received) + "/" + std::to_string(n_recv));
        return false;
      }
      while (sent < n_send && wr_posted - wr_done + 2 <= kWindow) TREQUIRE(post_message());
      auto n = c.scq->poll(wcs);
      TREQUIRE_OK(n);
      for (size_t i = 0; i < *n; ++i) {
        const auto& wc = wcs[i];
        if (wc.status != WcStatus::kSuccess || wc.wr_id < wr_done || wc.wr_id >= wr_posted) {
          record_failure(__FILE__, __LINE__, "send completion wr_id " + show(wc.wr_id) + " (done " + show(wr_done) +
                                                 ") " + show(wc.status) + ": " + wc.error);
          return false;
        }
        wr_done = wc.wr_id + 1;
      }
      size_t got = *n;
      n = c.rcq->poll(wcs);
      TREQUIRE_OK(n);
      for (size_t i = 0; i < *n; ++i) {
        if (received >= n_recv) {
          record_failure(__FILE__, __LINE__, "a receive beyond the last message: wr_id " + show(wcs[i].wr_id) + " " +
                                                 show(wcs[i].status));
          return false;
        }
        if (!check_receive(wcs[i])) return false;
        ++received;
        Sge sge = mr.sge(kRecvArea + wcs[i].wr_id * kSlot, kSlot);
        TREQUIRE_OK(post_recv(*c.qp, wcs[i].wr_id, one(sge)));
      }
      got += *n;
      if (got == 0) s.dev->progress();
    }
    return true;
  }
};

struct Setting {
  const char* name;
  std::map<std::string, std::string> faults;
};

void PrintTo(const Setting& s, std::ostream* os) { *os << s.name; }

class RdmaFaults : public ::testing::TestWithParam<Setting> {};

void print_stats(int role, const char* setting, const rdma::DeviceStats& st) {
  std::fprintf(stderr,
               "[port %d] %s: tx %llu rx %llu frames; retransmits %llu, timeouts %llu, NAKs sent %llu received %llu, "
               "RNR NAKs sent %llu received %llu, duplicates %llu, parse errors %llu, dropped %llu, tx stalls %llu\n",
               role, setting, static_cast<unsigned long long>(st.tx_frames), static_cast<unsigned long long>(st.rx_frames),
               static_cast<unsigned long long>(st.retransmits), static_cast<unsigned long long>(st.timeouts),
               static_cast<unsigned long long>(st.naks_sent), static_cast<unsigned long long>(st.naks_received),
               static_cast<unsigned long long>(st.rnr_naks_sent), static_cast<unsigned long long>(st.rnr_naks_received),
               static_cast<unsigned long long>(st.duplicates), static_cast<unsigned long long>(st.rx_parse_errors),
               static_cast<unsigned long long>(st.rx_dropped), static_cast<unsigned long long>(st.tx_stalls));
}

TEST_P(RdmaFaults, EveryMessageExactlyOnceInOrder) {
  const Setting& setting = GetParam();
  const uint64_t total = message_count();
  PairOptions o;
  for (int p = 0; p < 2; ++p) {
    o.params[p] = setting.faults;
    o.params[p]["seed"] = std::to_string(1000 * (p + 1) + std::hash<std::string>{}(setting.name) % 1000);
  }
  o.limit = std::chrono::seconds(200);
  auto t0 = Clock::now();
  run_pair(o, [&](Side& s) {
    Arena arena(kStreamArena);
    TREQUIRE(arena.p);
    auto mr = s.pd->register_mr(arena.p, arena.size, rdma::kLocalWrite | rdma::kRemoteWrite);
    TREQUIRE_OK(mr);
    Conn c;
    ConnOptions co;
    co.tuning.timeout = 8;      // 1 ms: quick recovery
    co.tuning.retry_cnt = 7;    // infinite: faults must never fail a request
    co.tuning.rnr_retry = 7;
    co.tuning.min_rnr_timer = 1;
    co.caps = {.max_send_wr = kStageSlots, .max_recv_wr = kRecvDepth, .max_send_sge = 1, .max_recv_sge = 1,
               .max_inline_data = kInlineMax};
    co.cq_depth = 4096;
    co.advertise = advertise(*mr);
    // PSNs start a few thousand below 2^24, so they wrap early in the stream.
    co.psn = 0xFFFFFFu - 3000 - 1000 * static_cast<uint32_t>(s.role);
    TREQUIRE(make_conn(s, c, co));
    for (uint32_t b = 0; b < kRecvDepth; ++b) {
      Sge sge = mr->sge(kRecvArea + uint64_t{b} * kSlot, kSlot);
      TREQUIRE_OK(post_recv(*c.qp, b, one(sge)));
    }
    TREQUIRE(s.sync("receives posted"));
    const uint64_t mine = s.parent() ? total - total / 2 : total / 2;
    const uint64_t theirs = total - mine;
    Stream st{s, arena, *mr, c, mine, theirs, Clock::now() + std::chrono::seconds(180)};
    auto start = Clock::now();
    bool ok = st.run();
    double secs = std::chrono::duration<double>(Clock::now() - start).count();
    std::fprintf(stderr, "[port %d] %s: sent %llu, received %llu messages in %.2f s (%.0f messages/s both ways)\n",
                 s.role, setting.name, static_cast<unsigned long long>(st.sent),
                 static_cast<unsigned long long>(st.received), secs, (st.sent + st.received) / secs);
    print_stats(s.role, setting.name, s.dev->stats());
    TREQUIRE(ok);
    TREQUIRE(s.sync("stream done", 60s));
    // Exactly once: nothing more arrives.
    expect_none(*c.rcq, 100ms);
    expect_none(*c.scq, 10ms);
    TCHECK_EQ(c.qp->state(), QpState::kRts);
    TREQUIRE(s.sync("end"));
    return true;
  });
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  std::fprintf(stderr, "%s: %llu messages in %.2f s: %.0f messages/s\n", setting.name,
               static_cast<unsigned long long>(total), secs, total / secs);
}

INSTANTIATE_TEST_SUITE_P(
    Seeded, RdmaFaults,
    ::testing::Values(Setting{"loss1", {{"loss", "0.01"}}}, Setting{"loss5", {{"loss", "0.05"}}},
                      Setting{"reorder5", {{"reorder", "0.05"}}}, Setting{"dup5", {{"dup", "0.05"}}},
                      Setting{"mix", {{"loss", "0.01"}, {"dup", "0.01"}, {"reorder", "0.02"}, {"corrupt", "0.005"}}}),
    [](const ::testing::TestParamInfo<Setting>& info) { return std::string(info.param.name); });

// ===========================================================================
// Retry exhaustion under loss=1.0: RETRY_EXC_ERR, the QP in ERROR.
//   peer_drops: the peer's port drops everything it sends (our ARP requests
//     are never answered either: the failure comes from ARP giving up);
//   own_drops: our port drops everything; the peer's MAC is known from an
//     ARP request it sent, so the transport's retries run out (timeout 8,
//     retry_cnt 3: 4 timeouts).
void total_loss(bool own_port) {
  PairOptions o;
  o.params[own_port ? 0 : 1] = {{"loss", "1.0"}, {"seed", "5"}};
  run_pair(o, [own_port](Side& s) {
    Arena arena(1 << 16);
    TREQUIRE(arena.p);
    auto mr = s.pd->register_mr(arena.p, arena.size, rdma::kLocalWrite | rdma::kRemoteWrite);
    TREQUIRE_OK(mr);
    Conn c, arp;
    ConnOptions co;
    co.tuning.timeout = 8;
    co.tuning.retry_cnt = 3;
    co.advertise = advertise(*mr);
    TREQUIRE(make_conn(s, c, co));
    TREQUIRE(make_conn(s, arp, co));
    if (s.parent()) {
      TREQUIRE(s.sync("ready"));
      Sge sge = mr->sge(0, 5000);
      auto before = s.dev->stats();
      auto t0 = Clock::now();
      // A WRITE of 5 packets and a SEND behind it: both fail, the SEND flushed.
      TREQUIRE_OK(post_send(*c.qp, 1, WrOpcode::kRdmaWrite, one(sge), rdma::kSendSignaled, c.peer.addr, c.peer.rkey));
      Sge small = mr->sge(8192, 10);
      TREQUIRE_OK(post_send(*c.qp, 2, WrOpcode::kSend, one(small)));
      auto wcs = poll_n(*c.scq, 2, 10s);
      double ms = ms_since(t0);
      TREQUIRE(wcs.size() == 2);
      expect_wc(wcs[0], {.wr_id = 1, .status = WcStatus::kRetryExcErr});
      expect_wc(wcs[1], {.wr_id = 2, .status = WcStatus::kWrFlushErr});
      TCHECK(wait_state(*s.dev, *c.qp, QpState::kError));
      auto st = s.dev->stats();
      std::fprintf(stderr, "loss=1.0 on %s: RETRY_EXC_ERR after %.1f ms, %llu timeouts: %s\n",
                   own_port ? "our port" : "the peer's port", ms,
                   static_cast<unsigned long long>(st.timeouts - before.timeouts), wcs[0].error.c_str());
      if (own_port) TCHECK_EQ(st.timeouts - before.timeouts, 4ull);
      TREQUIRE(s.sync("done"));
    } else {
      if (own_port) {
        // Make the parent learn our MAC from our ARP request.
        Sge a = mr->sge(0, 8);
        TREQUIRE_OK(post_send(*arp.qp, 3, WrOpcode::kSend, one(a)));
        drive_for(*s.dev, 20ms);
      }
      TREQUIRE(s.sync("ready"));
      TREQUIRE(s.sync("done", 30s));
    }
    return true;
  });
}

TEST(RdmaFaultsTotalLoss, PeerPortDropsEverything) { total_loss(false); }
TEST(RdmaFaultsTotalLoss, OwnPortDropsEverything) { total_loss(true); }

}  // namespace
}  // namespace ufab::rdma_faults_test
