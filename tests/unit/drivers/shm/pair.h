// Two processes over one shm domain, driving the provider's ops table
// directly: a fork, a socketpair for syncs and exchanges (every wait
// bounded), and small helpers for QPs, CQs and checks that work in both
// processes (the child has no GoogleTest: it reports through its exit code).
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "drivers/shm/shm.h"

namespace ufab::shm_test {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

inline thread_local std::string g_last_error;
inline int g_failures = 0;
inline const char* g_who = "parent";

inline void host_set_error(const char* m) { g_last_error = m ? m : ""; }
inline void host_log(int level, const char* m) {
  if (level <= 1) std::fprintf(stderr, "[%s] shm log %d: %s\n", g_who, level, m);
}
inline const ufab_rdma_host kHost = {sizeof(ufab_rdma_host), 0, host_set_error, host_log};
// Device parameters and a progress thread for the devices run_pair opens
// (shm_gpu_test: gpu_copy=fake, gpu_frag=...); none by default.
inline const char* const* g_open_params = nullptr;
inline bool g_open_progress_thread = false;
inline ufab_device_opts* open_opts() {
  static ufab_device_opts o;
  if (!g_open_params && !g_open_progress_thread) return nullptr;
  o = ufab_device_opts{};
  o.size = sizeof o;
  o.params = g_open_params;
  o.progress_thread = g_open_progress_thread ? 1 : 0;
  return &o;
}
inline const ufab_rdma_provider* P() { return ufab_shm_provider(); }

inline void fail_at(const char* file, int line, const std::string& what) {
  ++g_failures;
  std::fprintf(stderr, "[%s] %s:%d: FAILED: %s\n", g_who, file, line, what.c_str());
}

#define TCHECK(c)                                               \
  do {                                                          \
    if (!(c)) ::ufab::shm_test::fail_at(__FILE__, __LINE__, #c); \
  } while (0)
#define TCHECK_MSG(c, m)                                                                   \
  do {                                                                                     \
    if (!(c)) ::ufab::shm_test::fail_at(__FILE__, __LINE__, std::string(#c) + ": " + (m)); \
  } while (0)
#define TCHECK_EQ(a, b)                                                                                           \
  do {                                                                                                            \
    auto _a = (a);                                                                                                \
    auto _b = (b);                                                                                                \
    if (!(_a == _b))                                                                                              \
      ::ufab::shm_test::fail_at(__FILE__, __LINE__,                                                               \
                                std::string(#a " == " #b ": ") + std::to_string(_a) + " vs " + std::to_string(_b)); \
  } while (0)
#define TREQUIRE(c)                                                \
  do {                                                             \
    if (!(c)) {                                                    \
      ::ufab::shm_test::fail_at(__FILE__, __LINE__, #c);           \
      return false;                                                \
    }                                                              \
  } while (0)
#define TREQUIRE_OK(expr)                                                                                    \
  do {                                                                                                       \
    int _rc = (expr);                                                                                        \
    if (_rc < 0) {                                                                                           \
      ::ufab::shm_test::fail_at(__FILE__, __LINE__,                                                          \
                                std::string(#expr) + " = " + std::to_string(_rc) + ": " + g_last_error);     \
      return false;                                                                                          \
    }                                                                                                        \
  } while (0)

// Host memory for a test, page-aligned and zeroed.
struct Arena {
  size_t size;
  uint8_t* p;
  explicit Arena(size_t n) : size(n), p(static_cast<uint8_t*>(std::aligned_alloc(4096, n))) { std::memset(p, 0, n); }
  ~Arena() { std::free(p); }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  uint64_t addr(uint64_t off = 0) const { return reinterpret_cast<uint64_t>(p) + off; }
};

inline constexpr uint32_t kAll =
    UFAB_ACCESS_LOCAL_WRITE | UFAB_ACCESS_REMOTE_WRITE | UFAB_ACCESS_REMOTE_READ | UFAB_ACCESS_REMOTE_ATOMIC;

// A host memory region.
struct Reg {
  ufab_rdma_mr* mr = nullptr;
  uint32_t lkey = 0, rkey = 0;
};

inline bool reg(ufab_rdma_pd* pd, void* p, uint64_t len, uint32_t access, Reg* r) {
  ufab_mr_attr a = {sizeof a, access, p, len, UFAB_MEM_HOST, 0};
  TREQUIRE_OK(P()->reg_mr(pd, &a, &r->mr, &r->lkey, &r->rkey));
  return true;
}

// The socketpair between the two processes.
struct Chan {
  int fd = -1;
  bool send(const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      ssize_t w = ::send(fd, c, n, MSG_NOSIGNAL);
      if (w <= 0) return false;
      c += w;
      n -= static_cast<size_t>(w);
    }
    return true;
  }
  bool recv(void* p, size_t n, std::chrono::milliseconds limit) {
    char* c = static_cast<char*>(p);
    auto deadline = Clock::now() + limit;
    while (n > 0) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return false;
      struct pollfd pfd = {fd, POLLIN, 0};
      if (::poll(&pfd, 1, static_cast<int>(left)) <= 0) continue;
      ssize_t r = ::recv(fd, c, n, 0);
      if (r <= 0) return false;
      c += r;
      n -= static_cast<size_t>(r);
    }
    return true;
  }
  // Both sides reach the same point.
  bool sync(const char* tag, std::chrono::milliseconds limit = 10s) {
    char mine[32] = {}, theirs[32] = {};
    std::snprintf(mine, sizeof mine, "%s", tag);
    if (!send(mine, sizeof mine) || !recv(theirs, sizeof theirs, limit)) {
      std::fprintf(stderr, "[%s] sync \"%s\": the other side did not come\n", g_who, tag);
      return false;
    }
    if (std::strcmp(mine, theirs) != 0) {
      std::fprintf(stderr, "[%s] sync \"%s\" met \"%s\"\n", g_who, tag, theirs);
      return false;
    }
    return true;
  }
  template <class T>
  bool exchange(const T& mine, T* theirs) {
    return send(&mine, sizeof mine) && recv(theirs, sizeof *theirs, 10s);
  }
  // The other side closed (exited or died).
  bool wait_eof(std::chrono::milliseconds limit) {
    auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
      struct pollfd pfd = {fd, POLLIN, 0};
      if (::poll(&pfd, 1, 10) > 0) {
        char c;
        if (::recv(fd, &c, 1, 0) <= 0) return true;
      }
    }
    return false;
  }
};

// What a peer needs: the QP's address and number, a buffer and its key.
struct Info {
  uint32_t addr = 0, qpn = 0, psn = 0, rkey = 0;
  uint64_t vaddr = 0, len = 0;
};

struct Side {
  bool is_parent = true;
  Chan ch;
  std::string domain;
  ufab_rdma_dev* dev = nullptr;
  ufab_rdma_pd* pd = nullptr;
  bool parent() const { return is_parent; }
};

struct Conn {
  ufab_rdma_qp* qp = nullptr;
  ufab_rdma_cq* scq = nullptr;
  ufab_rdma_cq* rcq = nullptr;
  uint32_t qpn = 0;
  Info peer;
};

struct ConnOptions {
  uint32_t access = UFAB_ACCESS_LOCAL_WRITE | UFAB_ACCESS_REMOTE_WRITE | UFAB_ACCESS_REMOTE_READ |
                    UFAB_ACCESS_REMOTE_ATOMIC;
  uint8_t min_rnr_timer = 1;  // 0.01 ms
  uint8_t rnr_retry = 7;
  uint32_t cq_depth = 256;
  ufab_qp_cap cap = {64, 64, 4, 4, 128};
  Info advertise;  // rkey, vaddr, len for the peer
  bool connect = true;
};

inline uint32_t qp_state(ufab_rdma_qp* qp) {
  ufab_qp_attr a = {};
  P()->query_qp(qp, &a);
  return a.state;
}

inline int connect_qp(ufab_rdma_qp* qp, const Info& peer, const ConnOptions& o) {
  ufab_qp_attr a = {};
  a.state = UFAB_QPS_INIT;
  a.port = 1;
  a.access_flags = o.access;
  int rc = P()->modify_qp(qp, &a, UFAB_QP_STATE | UFAB_QP_PKEY_INDEX | UFAB_QP_PORT | UFAB_QP_ACCESS_FLAGS);
  if (rc) return rc;
  a.state = UFAB_QPS_RTR;
  a.av.dest_ip = peer.addr;
  a.path_mtu = 4096;
  a.dest_qpn = peer.qpn;
  a.rq_psn = peer.psn;
  a.max_dest_rd_atomic = 16;
  a.min_rnr_timer = o.min_rnr_timer;
  rc = P()->modify_qp(qp, &a,
                      UFAB_QP_STATE | UFAB_QP_AV | UFAB_QP_PATH_MTU | UFAB_QP_DEST_QPN | UFAB_QP_RQ_PSN |
                          UFAB_QP_MAX_DEST_RD_ATOMIC | UFAB_QP_MIN_RNR_TIMER);
  if (rc) return rc;
  uint32_t psn = 0;
  P()->qp_initial_psn(qp, &psn);
  a.state = UFAB_QPS_RTS;
  a.sq_psn = psn;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = o.rnr_retry;
  a.max_rd_atomic = 16;
  return P()->modify_qp(qp, &a,
                        UFAB_QP_STATE | UFAB_QP_TIMEOUT | UFAB_QP_RETRY_CNT | UFAB_QP_RNR_RETRY | UFAB_QP_SQ_PSN |
                            UFAB_QP_MAX_QP_RD_ATOMIC);
}

inline bool make_conn(Side& s, Conn& c, const ConnOptions& o = {}) {
  TREQUIRE_OK(P()->create_cq(s.dev, o.cq_depth, &c.scq));
  TREQUIRE_OK(P()->create_cq(s.dev, o.cq_depth, &c.rcq));
  ufab_rdma_qp_init init = {UFAB_QPT_RC, 0, c.scq, c.rcq, o.cap};
  TREQUIRE_OK(P()->create_qp(s.pd, &init, &c.qp, &c.qpn));
  ufab_device_attr da = {};
  TREQUIRE_OK(P()->query_device(s.dev, &da));
  Info mine = o.advertise;
  mine.addr = da.ip;
  mine.qpn = c.qpn;
  P()->qp_initial_psn(c.qp, &mine.psn);
  TREQUIRE(s.ch.exchange(mine, &c.peer));
  if (o.connect) TREQUIRE_OK(connect_qp(c.qp, c.peer, o));
  return true;
}

inline void drop_conn(Conn& c) {
  if (c.qp) P()->destroy_qp(c.qp);
  if (c.scq) P()->destroy_cq(c.scq);
  if (c.rcq) P()->destroy_cq(c.rcq);
  c = Conn{};
}

// One completion within `limit`, through wait_cq and poll_cq.
inline std::optional<ufab_wc> next_wc(ufab_rdma_cq* cq, std::chrono::milliseconds limit = 10s) {
  auto deadline = Clock::now() + limit;
  for (;;) {
    ufab_wc wc;
    int n = P()->poll_cq(cq, &wc, 1);
    if (n == 1) return wc;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return std::nullopt;
    P()->wait_cq(cq, static_cast<int>(left < 100 ? left : 100));
  }
}

inline std::string wc_str(const ufab_wc& wc) {
  char b[160];
  std::snprintf(b, sizeof b, "wr_id 0x%llx status %u opcode %u byte_len %u imm 0x%x qp 0x%x flags %u",
                static_cast<unsigned long long>(wc.wr_id), wc.status, wc.opcode, wc.byte_len, wc.imm_data, wc.qp_num,
                wc.wc_flags);
  return b;
}

// The next completion must be (wr_id, status[, opcode]).
inline bool expect_wc(ufab_rdma_cq* cq, uint64_t wr_id, uint32_t status, int opcode = -1,
                      std::chrono::milliseconds limit = 10s, ufab_wc* out = nullptr) {
  auto wc = next_wc(cq, limit);
  if (!wc) {
    std::fprintf(stderr, "[%s] no completion for wr_id 0x%llx\n", g_who, static_cast<unsigned long long>(wr_id));
    return false;
  }
  if (out) *out = *wc;
  bool ok = wc->wr_id == wr_id && wc->status == status && (opcode < 0 || wc->opcode == static_cast<uint32_t>(opcode));
  if (!ok) {
    std::fprintf(stderr, "[%s] expected wr_id 0x%llx status %u opcode %d, got %s\n", g_who,
                 static_cast<unsigned long long>(wr_id), status, opcode, wc_str(*wc).c_str());
  }
  if (wc->status != UFAB_WC_SUCCESS) {
    const char* d = P()->wc_detail(cq, wc->detail);
    std::fprintf(stderr, "[%s] detail of %s: %s\n", g_who, wc_str(*wc).c_str(), d ? d : "(none)");
    if (!d) return false;  // every error completion explains itself
  }
  return ok;
}

inline bool expect_none(ufab_rdma_cq* cq, std::chrono::milliseconds for_how_long) {
  auto wc = next_wc(cq, for_how_long);
  if (wc) std::fprintf(stderr, "[%s] unexpected completion: %s\n", g_who, wc_str(*wc).c_str());
  return !wc;
}

inline bool wait_state(Side& s, ufab_rdma_qp* qp, uint32_t state, std::chrono::milliseconds limit = 5s) {
  auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    P()->progress(s.dev);
    if (qp_state(qp) == state) return true;
    std::this_thread::sleep_for(200us);
  }
  return false;
}

// Keeps the device progressing for a while (answering the peer).
inline void drive_for(Side& s, std::chrono::milliseconds d) {
  auto until = Clock::now() + d;
  while (Clock::now() < until) {
    P()->progress(s.dev);
    std::this_thread::sleep_for(50us);
  }
}

inline int post1(ufab_rdma_qp* qp, uint64_t wr_id, uint32_t op, const ufab_sge* sge, uint32_t nsge,
                 uint32_t flags = UFAB_SEND_SIGNALED, uint64_t raddr = 0, uint32_t rkey = 0, uint32_t imm = 0) {
  ufab_send_wr wr = {};
  wr.wr_id = wr_id;
  wr.sg_list = sge;
  wr.num_sge = nsge;
  wr.opcode = op;
  wr.send_flags = flags;
  wr.imm_data = imm;
  wr.remote_addr = raddr;
  wr.rkey = rkey;
  uint32_t bad = 0;
  return P()->post_send(qp, &wr, 1, &bad);
}

inline int post_atomic(ufab_rdma_qp* qp, uint64_t wr_id, uint32_t op, const ufab_sge& res, uint64_t raddr,
                       uint32_t rkey, uint64_t compare_add, uint64_t swap) {
  ufab_send_wr wr = {};
  wr.wr_id = wr_id;
  wr.sg_list = &res;
  wr.num_sge = 1;
  wr.opcode = op;
  wr.send_flags = UFAB_SEND_SIGNALED;
  wr.remote_addr = raddr;
  wr.rkey = rkey;
  wr.compare_add = compare_add;
  wr.swap = swap;
  uint32_t bad = 0;
  return P()->post_send(qp, &wr, 1, &bad);
}

inline int recv1(ufab_rdma_qp* qp, uint64_t wr_id, const ufab_sge* sge, uint32_t nsge) {
  ufab_recv_wr wr = {wr_id, sge, nsge, 0};
  uint32_t bad = 0;
  return P()->post_recv(qp, &wr, 1, &bad);
}

inline void fill_pattern(void* p, size_t n, uint32_t seed) {
  auto* b = static_cast<uint8_t*>(p);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1103515245u + 12345u;
    b[i] = static_cast<uint8_t>(x >> 16);
  }
}

inline bool check_pattern(const void* p, size_t n, uint32_t seed) {
  std::vector<uint8_t> want(n);
  fill_pattern(want.data(), n, seed);
  return n == 0 || std::memcmp(p, want.data(), n) == 0;
}

inline std::string unique_domain(const char* test) {
  return std::string(test) + "-" + std::to_string(::getpid()) + "-" +
         std::to_string(Clock::now().time_since_epoch().count() % 1000000);
}

// Runs fn in both processes, each with its own device on one domain; the
// parent's result and the child's exit status must both be success.
inline bool run_pair(const char* test, const std::function<bool(Side&)>& fn, bool child_may_die = false,
                     std::chrono::milliseconds limit = 20s) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return false;
  std::string domain = unique_domain(test);
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(sv[0]);
    g_who = "child";
    g_failures = 0;
    Side s;
    s.is_parent = false;
    s.ch.fd = sv[1];
    s.domain = domain;
    bool ok = false;
    std::string name = "shm:" + domain;
    if (P()->open_device(&kHost, name.c_str(), open_opts(), &s.dev) == 0 && P()->alloc_pd(s.dev, &s.pd) == 0) {
      ok = fn(s);
      P()->dealloc_pd(s.pd);
      P()->close_device(s.dev);
    } else {
      std::fprintf(stderr, "[child] open: %s\n", g_last_error.c_str());
    }
    std::fflush(nullptr);
    ::_exit(ok && g_failures == 0 ? 0 : 1);
  }
  ::close(sv[1]);
  Side s;
  s.ch.fd = sv[0];
  s.domain = domain;
  g_failures = 0;
  bool ok = false;
  std::string name = "shm:" + domain;
  if (P()->open_device(&kHost, name.c_str(), open_opts(), &s.dev) == 0 && P()->alloc_pd(s.dev, &s.pd) == 0) {
    ok = fn(s);
    P()->dealloc_pd(s.pd);
    P()->close_device(s.dev);
  } else {
    std::fprintf(stderr, "[parent] open: %s\n", g_last_error.c_str());
  }
  // Bounded wait for the child; killed if it hangs.
  auto deadline = Clock::now() + limit;
  int status = 0;
  bool child_ok = false;
  for (;;) {
    pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      child_ok = (WIFEXITED(status) && WEXITSTATUS(status) == 0) || (child_may_die && WIFSIGNALED(status));
      break;
    }
    if (Clock::now() > deadline) {
      std::fprintf(stderr, "[parent] the child hung; killing it\n");
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(1ms);
  }
  ::close(sv[0]);
  if (!child_ok) std::fprintf(stderr, "[parent] the child failed (status 0x%x)\n", status);
  return ok && g_failures == 0 && child_ok;
}

}  // namespace ufab::shm_test
