// Sleeping and waking: wait_cq sleeps (little CPU) and is woken by the
// peer; the event fd after req_notify with a progress thread; a peer killed
// mid-transfer: the survivor's QPs go to ERROR with their work completed or
// flushed, and nothing of the peer is left (fds, mappings, /dev/shm).
#include <dirent.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <time.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <string_view>

#include "tests/unit/drivers/shm/pair.h"

namespace ufab::shm_test {
namespace {

double thread_cpu_ms() {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

int count_fds() {
  int n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  if (!d) return -1;
  while (struct dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
  ::closedir(d);
  return n;
}

int count_segment_mappings() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  int n = 0;
  while (std::getline(maps, line)) n += line.find("memfd:ufab-shm") != std::string::npos;
  return n;
}

// /dev/shm as this test sees it: without the software NIC's segments, which
// tests running beside this one (Bazel runs them in parallel) create and
// remove at any moment.
std::set<std::string> dev_shm() {
  std::set<std::string> out;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (struct dirent* e = ::readdir(d)) {
      if (std::string_view(e->d_name).starts_with("ufab-swnic-")) continue;
      out.insert(e->d_name);
    }
    ::closedir(d);
  }
  return out;
}

bool setup(Side& s, Arena& a, ufab_rdma_mr** mr, uint32_t* key, Conn& c) {
  ufab_mr_attr at = {sizeof at, kAll, a.p, a.size, UFAB_MEM_HOST, 0};
  uint32_t rkey;
  TREQUIRE_OK(P()->reg_mr(s.pd, &at, mr, key, &rkey));
  ConnOptions o;
  o.advertise = {0, 0, 0, rkey, a.addr(), a.size};
  return make_conn(s, c, o);
}

// wait_cq sleeps until the peer's SEND arrives 200 ms later; with nothing
// coming it returns 0 at its timeout. Both use little CPU.
TEST(ShmWait, WaitCqSleepsAndIsWoken) {
  EXPECT_TRUE(run_pair("wait", [](Side& s) {
    Arena a(1 << 16);
    ufab_rdma_mr* mr;
    uint32_t key;
    Conn c;
    TREQUIRE(setup(s, a, &mr, &key, c));
    ufab_sge sge = {a.addr(), 64, key};
    if (s.parent()) {
      TREQUIRE(s.ch.sync("ready"));
      std::this_thread::sleep_for(200ms);
      TREQUIRE_OK(post1(c.qp, 1, UFAB_WR_SEND, &sge, 1));
      TREQUIRE(expect_wc(c.scq, 1, UFAB_WC_SUCCESS));
    } else {
      TREQUIRE_OK(recv1(c.qp, 2, &sge, 1));
      TREQUIRE(s.ch.sync("ready"));
      double cpu0 = thread_cpu_ms();
      auto t0 = Clock::now();
      int rc = P()->wait_cq(c.rcq, 5000);
      double wall = ms_since(t0), cpu = thread_cpu_ms() - cpu0;
      std::fprintf(stderr, "[child] wait_cq woke after %.1f ms with %.2f ms of CPU\n", wall, cpu);
      TCHECK_EQ(rc, 1);
      TCHECK(wall >= 150 && wall < 4000);
      TCHECK_MSG(cpu < 50, "wait_cq spun: " + std::to_string(cpu) + " ms of CPU");
      TREQUIRE(expect_wc(c.rcq, 2, UFAB_WC_SUCCESS, UFAB_WC_RECV));
      // Nothing more comes: 0 at the timeout.
      cpu0 = thread_cpu_ms();
      t0 = Clock::now();
      rc = P()->wait_cq(c.rcq, 100);
      wall = ms_since(t0);
      cpu = thread_cpu_ms() - cpu0;
      TCHECK_EQ(rc, 0);
      TCHECK(wall >= 99 && wall < 2000);
      TCHECK_MSG(cpu < 30, "an idle wait_cq spun: " + std::to_string(cpu) + " ms of CPU");
    }
    TREQUIRE(s.ch.sync("end"));
    drop_conn(c);
    P()->dereg_mr(mr);
    return true;
  }));
}

// req_notify + the event fd, with a progress thread doing the work: the fd
// becomes readable when the peer's SEND lands; the application polls only
// the fd.
TEST(ShmWait, EventFdWithProgressThread) {
  EXPECT_TRUE(run_pair("evfd", [](Side& s) {
    Arena a(1 << 16);
    ufab_rdma_mr* mr;
    uint32_t key;
    Conn c;
    TREQUIRE(setup(s, a, &mr, &key, c));
    ufab_sge sge = {a.addr(), 64, key};
    if (s.parent()) {
      TREQUIRE(s.ch.sync("ready"));
      std::this_thread::sleep_for(50ms);
      TREQUIRE_OK(post1(c.qp, 1, UFAB_WR_SEND, &sge, 1));
      TREQUIRE(expect_wc(c.scq, 1, UFAB_WC_SUCCESS));
    } else {
      TREQUIRE_OK(P()->start_progress_thread(s.dev));
      TREQUIRE_OK(recv1(c.qp, 2, &sge, 1));
      int fd = P()->cq_event_fd(c.rcq);
      TREQUIRE(fd >= 0);
      TREQUIRE_OK(P()->req_notify_cq(c.rcq));
      TREQUIRE(s.ch.sync("ready"));
      struct pollfd pfd = {fd, POLLIN, 0};
      TCHECK_EQ(::poll(&pfd, 1, 5000), 1);
      uint64_t v = 0;
      TCHECK_EQ(::read(fd, &v, 8), 8);
      ufab_wc wc;
      TCHECK_EQ(P()->poll_cq(c.rcq, &wc, 1), 1);
      TCHECK_EQ(wc.wr_id, 2ull);
      // Not armed again: the fd stays quiet.
      pfd.revents = 0;
      TCHECK_EQ(::poll(&pfd, 1, 20), 0);
      P()->stop_progress_thread(s.dev);
    }
    TREQUIRE(s.ch.sync("end"));
    drop_conn(c);
    P()->dereg_mr(mr);
    return true;
  }));
}

// The child is SIGKILLed while the parent streams 1 MiB WRITEs and SENDs to
// it (one QP busy, one idle). The parent's QPs go to ERROR; every work
// request completes (success before the death, RETRY_EXC_ERR for the one in
// flight, WR_FLUSH_ERR behind it); the peer's socket and mapping are gone.
TEST(ShmWait, PeerKilledMidTransfer) {
  const auto shm_before = dev_shm();
  EXPECT_TRUE(run_pair(
      "kill",
      [](Side& s) {
        int fds0 = count_fds();
        int maps0 = count_segment_mappings();
        Arena a(4u << 20);
        ufab_rdma_mr* mr;
        uint32_t key;
        Conn busy, idle;
        TREQUIRE(setup(s, a, &mr, &key, busy));
        ConnOptions o;
        TREQUIRE(make_conn(s, idle, o));
        if (!s.parent()) {
          for (uint64_t i = 0; i < 32; ++i) {
            ufab_sge sge = {a.addr(2u << 20), 1u << 20, key};
            TREQUIRE_OK(recv1(busy.qp, i, &sge, 1));
          }
          TREQUIRE(s.ch.sync("go"));
          drive_for(s, 30ms);
          ::kill(::getpid(), SIGKILL);
          return false;
        }
        // The child's segment (twice when both sides connected at once).
        TCHECK(count_segment_mappings() > maps0);
        TREQUIRE(s.ch.sync("go"));
        uint64_t posted = 0, completed = 0, ok = 0, retry = 0, flushed = 0, other = 0;
        auto deadline = Clock::now() + 10s;
        bool err = false;
        while (Clock::now() < deadline) {
          if (!err && posted - completed < 16) {
            ufab_sge sge = {a.addr(0), 1u << 20, key};
            uint32_t op = posted % 2 ? UFAB_WR_SEND : UFAB_WR_RDMA_WRITE;
            TREQUIRE_OK(post1(busy.qp, posted, op, &sge, 1, UFAB_SEND_SIGNALED, busy.peer.vaddr, busy.peer.rkey));
            ++posted;
          }
          ufab_wc wc[16];
          int n = P()->poll_cq(busy.scq, wc, 16);
          TREQUIRE(n >= 0);
          for (int i = 0; i < n; ++i) {
            ++completed;
            if (wc[i].status == UFAB_WC_SUCCESS) {
              TCHECK_MSG(retry + flushed == 0, "a success after an error: " + wc_str(wc[i]));
              ++ok;
            } else if (wc[i].status == UFAB_WC_RETRY_EXC_ERR) {
              ++retry;
            } else if (wc[i].status == UFAB_WC_WR_FLUSH_ERR) {
              ++flushed;
            } else {
              ++other;
              std::fprintf(stderr, "[parent] unexpected: %s\n", wc_str(wc[i]).c_str());
            }
          }
          err = qp_state(busy.qp) == UFAB_QPS_ERR;
          if (err && completed == posted) break;
          if (n == 0) P()->wait_cq(busy.scq, 1);
        }
        std::fprintf(stderr,
                     "[parent] %llu posted: %llu succeeded, %llu RETRY_EXC_ERR, %llu flushed, %llu other\n",
                     (unsigned long long)posted, (unsigned long long)ok, (unsigned long long)retry,
                     (unsigned long long)flushed, (unsigned long long)other);
        TCHECK(err);
        TCHECK_EQ(completed, posted);
        TCHECK(ok > 0);
        TCHECK(retry <= 1);
        TCHECK_EQ(other, 0ull);
        TCHECK(wait_state(s, idle.qp, UFAB_QPS_ERR));
        // Nothing of the dead peer is left once the QPs let go of it (the
        // device's control thread closes each connection as it sees its end).
        auto gone = [&](auto count, int want) {
          auto until = Clock::now() + 2s;
          while (count() != want && Clock::now() < until) std::this_thread::sleep_for(1ms);
          return count() == want;
        };
        TCHECK_MSG(gone(count_segment_mappings, maps0), std::to_string(count_segment_mappings()) + " mappings");
        drop_conn(busy);
        drop_conn(idle);
        TREQUIRE_OK(P()->dereg_mr(mr));
        TCHECK_MSG(gone(count_fds, fds0), std::to_string(count_fds()) + " fds, " + std::to_string(fds0) + " before");
        return true;
      },
      /*child_may_die=*/true));
  EXPECT_EQ(dev_shm(), shm_before);
}

}  // namespace
}  // namespace ufab::shm_test
