// The two-process harness of the RDMA tests (two_process.h).
#include "tests/unit/transport/two_process.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <dirent.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>
#include <thread>

namespace ufab::two_process {

namespace {
bool g_child = false;
Channel* g_child_channel = nullptr;
int g_child_failures = 0;
}  // namespace

// ---------------------------------------------------------------------------
// Failures.

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

void record_failure(const std::source_location& loc, const std::string& msg) {
  record_failure(loc.file_name(), static_cast<int>(loc.line()), msg);
}

// ---------------------------------------------------------------------------
// The control channel.

bool Channel::send_frame(char type, const void* data, size_t len) {
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

bool Channel::recv(std::string* out, Clock::time_point deadline, Device* drive) {
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

bool Channel::wait_eof(Clock::time_point deadline, Device* drive) {
  char type;
  std::string payload;
  while (!eof_) {
    if (!next_frame(&type, &payload, deadline, drive) && !eof_) return false;
  }
  return true;
}

bool Channel::next_frame(char* type, std::string* payload, Clock::time_point deadline, Device* drive) {
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

// ---------------------------------------------------------------------------
// The two ends.

bool Side::sync(const std::string& tag, milliseconds limit, bool drive, std::source_location loc) {
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

namespace {

std::string sanitized_test_name() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string n = info ? std::string(info->test_suite_name()) + "." + info->name() : "test";
  for (char& c : n)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') c = '_';
  if (n.size() > 120) n.resize(120);
  return n;
}

// The name of end `role`'s device for this run.
std::string device_name(Provider p, const std::string& link, int role) {
  if (p == Provider::kShm) return "shm:" + link;
  return "swnic:" + link + ":" + std::to_string(role);
}

Result<std::unique_ptr<Device>> open_end(Provider p, const std::string& link, int role,
                                         const std::map<std::string, std::string>& params, bool progress_thread) {
  rdma::DeviceOptions o;
  // shm needs no ip: its device address is an endpoint of the domain.
  if (p == Provider::kSoftRoceSwnic) o.ip = role == 0 ? "10.0.0.1" : "10.0.0.2";
  o.params = params;
  o.progress_thread = progress_thread;
  return Device::open(device_name(p, link, role), o);
}

std::set<std::string> dev_shm_entries() {
  std::set<std::string> out;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (struct dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") out.insert(n);
    }
    ::closedir(d);
  }
  return out;
}

// Open file descriptors of this process (the directory's own fd counted
// every time alike).
int count_fds() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (struct dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') ++n;
    ::closedir(d);
  }
  return n;
}

std::string list_fds() {
  std::string out;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (struct dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      char target[256] = {};
      std::string path = std::string("/proc/self/fd/") + e->d_name;
      ssize_t n = ::readlink(path.c_str(), target, sizeof target - 1);
      out += std::string(" ") + e->d_name + "->" + (n > 0 ? std::string(target, static_cast<size_t>(n)) : "?");
    }
    ::closedir(d);
  }
  return out;
}

int child_main(const PairOptions& opt, const std::string& link, int fd, pid_t parent,
               const std::function<bool(Side&)>& body) {
  g_child = true;
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) return 90;
  ::alarm(static_cast<unsigned>(opt.limit.count()) + 30);  // last resort
  Side s;
  s.role = 1;
  s.provider = opt.provider;
  s.link = link;
  s.device = device_name(opt.provider, link, 1);
  s.ch.reset(fd);
  g_child_channel = &s.ch;
  std::string token;
  if (!s.ch.recv(&token, Clock::now() + 30s, nullptr)) return 91;  // parent never opened port 0
  auto dev = open_end(opt.provider, link, 1, opt.params[1], opt.progress_thread[1]);
  if (!dev) {
    record_failure(__FILE__, __LINE__, "opening " + s.device + ": " + dev.error().message());
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

}  // namespace

const char* provider_name(Provider p) {
  return p == Provider::kShm ? "shm" : "soft-RoCE over swnic";
}

// Runs `body` in both processes: here as end 0 (opened first; swnic port 0
// with stale=reset), in a forked child as end 1.
void run_pair(const PairOptions& opt, const std::function<bool(Side&)>& body) {
  static int counter = 0;
  const int fds_before = opt.leak_check ? count_fds() : 0;
  const std::string fd_list_before = opt.leak_check ? list_fds() : "";
  const std::set<std::string> shm_before = dev_shm_entries();
  // The run's name: unique per process and run; it also names the test for
  // people (shm domains are at most 64 bytes, so they get a short one).
  const std::string tag = "rs" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  std::string link = opt.provider == Provider::kShm ? tag : tag + "-" + sanitized_test_name();
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
  bool failed = false;
  {
    // Declared before the guard: on an early return the guard kills the
    // child first, then end 0 closes as the last user and removes the segment.
    Side s;
    s.role = 0;
    s.provider = opt.provider;
    s.link = link;
    s.device = device_name(opt.provider, link, 0);
    s.ch.reset(sv[0]);
    ChildGuard guard{pid};

    auto params = opt.params[0];
    if (opt.provider == Provider::kSoftRoceSwnic) params["stale"] = "reset";
    auto dev = open_end(opt.provider, link, 0, params, opt.progress_thread[0]);
    ASSERT_TRUE(dev) << "opening " << s.device << ": " << dev.error().message();
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
    failed = !ok || ::testing::Test::HasFailure();
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
  }
  // What the run left in /dev/shm: entries that carry its name. (Other
  // processes may create entries meanwhile; only ours count. shm itself
  // keeps nothing there: its segments are memfds.)
  for (const std::string& n : dev_shm_entries()) {
    bool ours = n.find(tag + "-") != std::string::npos ||
                (n.size() >= tag.size() && n.compare(n.size() - tag.size(), tag.size(), tag) == 0);
    if (shm_before.count(n) || !ours) continue;
    // swnic's close leaves the segment when the other port is still marked
    // present and alive, which can happen when a failed run killed the child.
    if (failed || (opt.child_may_die && !opt.leak_check))
      std::fprintf(stderr, "note: removing /dev/shm/%s left by the killed child\n", n.c_str());
    else
      ADD_FAILURE() << "/dev/shm/" << n << " left behind by the run (" << provider_name(opt.provider) << ")";
    ::unlink(("/dev/shm/" + n).c_str());
  }
  if (opt.leak_check) {
    int fds_after = count_fds();
    EXPECT_EQ(fds_after, fds_before) << "open file descriptors before the run:" << fd_list_before
                                     << "\nafter the run, the device closed:" << list_fds();
  }
}

// ---------------------------------------------------------------------------
// Memory and completions.

std::optional<MemoryRegion> register_arena(Side& s, const Arena& arena, rdma::AccessFlags access,
                                           std::source_location loc) {
  if (!arena.p) {
    record_failure(loc, "mmap of " + std::to_string(arena.size) + " bytes failed");
    return std::nullopt;
  }
  auto mr = s.pd->register_mr(arena.p, arena.size, access);
  if (!mr) {
    record_failure(loc, "register_mr failed: " + mr.error().message() + " (errno " +
                            std::to_string(mr.error().code()) + ")");
    return std::nullopt;
  }
  return std::move(*mr);
}

// Polls until `n` completions arrived; a failure when fewer came in `limit`.
std::vector<WorkCompletion> poll_n(CompletionQueue& cq, size_t n, milliseconds limit, std::source_location loc) {
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
      record_failure(loc, "only " + std::to_string(got.size()) + " of " + std::to_string(n) + " completions after " +
                              std::to_string(limit.count()) + " ms");
      break;
    }
  }
  return got;
}

// No completion for `quiet`.
void expect_none(CompletionQueue& cq, milliseconds quiet, std::source_location loc) {
  WorkCompletion wc;
  auto deadline = Clock::now() + quiet;
  while (Clock::now() < deadline) {
    auto r = cq.poll(std::span<WorkCompletion>(&wc, 1));
    if (!r) {
      record_failure(loc, "poll: " + r.error().message());
      return;
    }
    if (*r) {
      record_failure(loc, "unexpected completion: wr_id " + show(wc.wr_id) + " status " + show(wc.status) + " opcode " +
                              show(wc.opcode) + " " + wc.error);
      return;
    }
    std::this_thread::sleep_for(100us);
  }
}

void expect_wc(const WorkCompletion& wc, const WcExpect& e, std::source_location loc) {
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

std::optional<WorkCompletion> expect_one(CompletionQueue& cq, const WcExpect& e, milliseconds limit,
                                         std::source_location loc) {
  auto wcs = poll_n(cq, 1, limit, loc);
  if (wcs.size() != 1) return std::nullopt;
  expect_wc(wcs[0], e, loc);
  return std::move(wcs[0]);
}

// Waits (driving progress) until the QP is in `want`.
bool wait_state(Device& dev, QueuePair& qp, QpState want, milliseconds limit, std::source_location loc) {
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
// Connections and posts.

// Both ends call it in step: create, exchange, connect, sync.
bool make_conn(Side& s, Conn& c, const ConnOptions& o) {
  auto scq = s.dev->create_cq(o.cq_depth);
  TREQUIRE_OK(scq);
  c.scq = std::move(*scq);
  auto rcq = s.dev->create_cq(o.cq_depth);
  TREQUIRE_OK(rcq);
  c.rcq = std::move(*rcq);
  auto qp = s.pd->create_qp({.type = rdma::QpType::kRc,
                             .send_cq = c.scq.get(),
                             .recv_cq = c.rcq.get(),
                             .caps = o.caps,
                             .sq_sig_all = o.sq_sig_all});
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

Status post_send(QueuePair& qp, uint64_t wr_id, WrOpcode op, std::span<const Sge> sgl, rdma::SendFlags flags,
                 uint64_t remote_addr, uint32_t rkey, uint32_t imm) {
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

Status post_atomic(QueuePair& qp, uint64_t wr_id, WrOpcode op, const Sge& result, uint64_t remote_addr, uint32_t rkey,
                   uint64_t compare_add, uint64_t swap) {
  SendWr wr;
  wr.wr_id = wr_id;
  wr.opcode = op;
  wr.flags = rdma::kSendSignaled;
  wr.sgl = std::span<const Sge>(&result, 1);
  wr.remote_addr = remote_addr;
  wr.rkey = rkey;
  wr.compare_add = compare_add;
  wr.swap = swap;
  return qp.post_send(wr);
}

std::function<bool(Side&)> connected(ConnectedBody body, ConnOptions o) {
  return [body = std::move(body), o](Side& s) {
    Arena arena(1 << 16);
    auto mr = register_arena(s, arena, rdma::kLocalWrite);
    TREQUIRE(mr);
    Conn c;
    TREQUIRE(make_conn(s, c, o));
    return body(s, arena, *mr, c);
  };
}

bool expect_error(Side& s, Conn& c, CompletionQueue& cq, uint64_t wr_id, WcStatus status, milliseconds limit,
                  std::source_location loc) {
  if (!expect_one(cq, {.wr_id = wr_id, .status = status, .qp_num = c.qp->qp_num()}, limit, loc)) return false;
  if (!wait_state(*s.dev, *c.qp, QpState::kError, 10s, loc)) record_failure(loc, "check failed: the QP in ERROR");
  return true;
}

}  // namespace ufab::two_process
