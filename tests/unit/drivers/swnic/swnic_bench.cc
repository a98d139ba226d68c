// swnic throughput: one port sends, the other receives, between two threads
// or two processes, through the driver table with the test host's pools.
//
//   bazel run -c opt //tests/unit/drivers/swnic:swnic_bench -- [--frames N]
//       [--burst K] [--ring R] [--sizes 64,512,1514] [--mode threads|processes|both|queues]
//       [--queues 1,2,4]
//
// Prints one line per (mode, size): frames/s and payload Gbit/s, measured
// at the receiver from its first to its last frame. Every frame's sequence
// number is checked. A figure for comparing changes on one machine, not a
// pass/fail test.
//
// --mode loop: one thread sends a burst on port 0 and receives it on port 1,
// over and over; also reports CPU time per frame (CLOCK_THREAD_CPUTIME_ID),
// which other load on a shared machine disturbs far less than wall time.
//
// --mode queues: for each count Q in --queues, a link with queues=Q whose
// port 1 steers by RoCE QPN over Q queues, and Q threads: thread i sends
// RoCEv2-shaped frames for QP i on port 0's TX queue i and receives them on
// port 1's RX queue i, --frames frames each. Prints the total rate, from the
// first thread's start to the last one's end. Sizes of at least 64 bytes
// (the headers and sequence number take 62).
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "drivers/swnic/swnic.h"
#include "tests/unit/drivers/swnic/test_host.h"

using namespace ufab::swnic_test;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  uint64_t frames = 5'000'000;
  uint32_t burst = 32;
  uint32_t ring = 1024;
  std::vector<uint32_t> sizes = {64, 512, 1514};
  std::string mode = "both";
  std::vector<uint32_t> queues = {1, 2};
};

struct RxResult {
  uint64_t frames = 0;
  uint64_t errors = 0;
  double seconds = 0;
};

bool wait_link(Port& p) {
  auto deadline = Clock::now() + std::chrono::seconds(10);
  while (Clock::now() < deadline) {
    if (p.link_up()) return true;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return false;
}

RxResult receive(const std::string& name, const Options& o) {
  RxResult r;
  auto p = Port::open(name, {{"ring", std::to_string(o.ring)}});
  if (!p) return r;
  std::vector<ufab_buf*> bufs(o.burst);
  auto deadline = Clock::now() + std::chrono::seconds(120);
  Clock::time_point first{};
  uint64_t spins = 0;
  while (r.frames < o.frames) {
    int n = p->drv()->rx_burst(p->dev(), 0, bufs.data(), static_cast<uint16_t>(o.burst));
    if (n <= 0) {
      if ((++spins & 0xffff) == 0 && Clock::now() > deadline) break;
      continue;
    }
    if (r.frames == 0) first = Clock::now();
    for (int i = 0; i < n; ++i) {
      uint64_t seq;
      std::memcpy(&seq, bufs[i]->base + bufs[i]->offset + 14, 8);
      if (seq != r.frames + static_cast<uint64_t>(i)) ++r.errors;
    }
    r.frames += static_cast<uint64_t>(n);
    p->rx_pool().free(bufs.data(), static_cast<uint32_t>(n));
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - first).count();
  // Stay until the sender has seen us (it closes first).
  return r;
}

bool send(Port& p, const Options& o, uint32_t size) {
  std::vector<ufab_buf*> bufs(o.burst);
  uint64_t sent = 0;
  auto deadline = Clock::now() + std::chrono::seconds(120);
  uint64_t spins = 0;
  while (sent < o.frames) {
    uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(o.burst, o.frames - sent));
    int got = p.tx_pool().alloc(bufs.data(), n);
    for (int i = 0; i < got; ++i) {
      ufab_buf* b = bufs[i];
      uint64_t seq = sent + static_cast<uint64_t>(i);
      std::memset(b->base + b->offset, 0xab, 14);
      std::memcpy(b->base + b->offset + 14, &seq, 8);
      b->len = size;
    }
    int r = p.drv()->tx_burst(p.dev(), 0, bufs.data(), static_cast<uint16_t>(got));
    if (r < 0) return false;
    if (r < got) p.tx_pool().free(bufs.data() + r, static_cast<uint32_t>(got - r));
    sent += static_cast<uint64_t>(r);
    if (r == 0 && (++spins & 0xffff) == 0 && Clock::now() > deadline) return false;
  }
  return true;
}

void report(const char* mode, uint32_t size, const RxResult& r, const Options& o) {
  double fps = r.frames / r.seconds;
  std::printf("%-10s %6u B  %10llu frames  %7.3f s  %7.2f Mframes/s  %7.2f Gbit/s  %s\n", mode, size,
              static_cast<unsigned long long>(r.frames), r.seconds, fps / 1e6, fps * size * 8 / 1e9,
              r.frames == o.frames && r.errors == 0 ? "ok" : "ERRORS");
}

int run_threads(const Options& o, uint32_t size) {
  std::string link = unique_link("bench-thr");
  auto a = Port::open(link + ":0", {{"ring", std::to_string(o.ring)}});
  if (!a) return 1;
  RxResult r;
  std::thread rx([&] { r = receive(link + ":1", o); });
  if (!wait_link(*a) || !send(*a, o, size)) {
    rx.join();
    return 1;
  }
  rx.join();
  report("threads", size, r, o);
  return r.frames == o.frames && r.errors == 0 ? 0 : 1;
}

int run_processes(const Options& o, uint32_t size) {
  std::string link = unique_link("bench-proc");
  int fds[2];
  if (::pipe(fds) != 0) return 1;
  auto a = Port::open(link + ":0", {{"ring", std::to_string(o.ring)}});
  if (!a) return 1;
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    RxResult r = receive(link + ":1", o);
    ssize_t w = ::write(fds[1], &r, sizeof r);
    ::_exit(w == sizeof r ? 0 : 1);
  }
  ::close(fds[1]);
  bool ok = wait_link(*a) && send(*a, o, size);
  RxResult r;
  ssize_t got = ::read(fds[0], &r, sizeof r);
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!ok || got != sizeof r) return 1;
  report("processes", size, r, o);
  return r.frames == o.frames && r.errors == 0 ? 0 : 1;
}

int run_loop(const Options& o, uint32_t size) {
  std::string link = unique_link("bench-loop");
  auto a = Port::open(link + ":0", {{"ring", std::to_string(o.ring)}});
  auto b = Port::open(link + ":1");
  if (!a || !b) return 1;
  std::vector<ufab_buf*> bufs(o.burst);
  uint64_t sent = 0, got = 0, errors = 0;
  struct timespec c0, c1;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
  auto t0 = Clock::now();
  while (got < o.frames) {
    uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(o.burst, o.frames - sent));
    int k = a->tx_pool().alloc(bufs.data(), n);
    for (int i = 0; i < k; ++i) {
      uint64_t seq = sent + static_cast<uint64_t>(i);
      std::memset(bufs[i]->base + bufs[i]->offset, 0xab, 14);
      std::memcpy(bufs[i]->base + bufs[i]->offset + 14, &seq, 8);
      bufs[i]->len = size;
    }
    int r = a->drv()->tx_burst(a->dev(), 0, bufs.data(), static_cast<uint16_t>(k));
    if (r < 0) return 1;
    if (r < k) a->tx_pool().free(bufs.data() + r, static_cast<uint32_t>(k - r));
    sent += static_cast<uint64_t>(r);
    int m = b->drv()->rx_burst(b->dev(), 0, bufs.data(), static_cast<uint16_t>(o.burst));
    if (m < 0) return 1;
    for (int i = 0; i < m; ++i) {
      uint64_t seq;
      std::memcpy(&seq, bufs[i]->base + bufs[i]->offset + 14, 8);
      if (seq != got + static_cast<uint64_t>(i)) ++errors;
    }
    if (m > 0) b->rx_pool().free(bufs.data(), static_cast<uint32_t>(m));
    got += static_cast<uint64_t>(m);
  }
  double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
  double cpu = (c1.tv_sec - c0.tv_sec) + (c1.tv_nsec - c0.tv_nsec) / 1e9;
  std::printf("loop       %6u B  %10llu frames  %7.3f s  %7.2f Mframes/s  %7.1f ns CPU/frame  %s\n", size,
              static_cast<unsigned long long>(got), seconds, got / seconds / 1e6, cpu * 1e9 / got,
              errors == 0 ? "ok" : "ERRORS");
  return errors == 0 ? 0 : 1;
}

// Eth / IPv4 / UDP dport 4791 / BTH with destination QP `qp`, then the
// sequence number at kQueueSeqOffset.
constexpr uint32_t kQueueSeqOffset = 54;

void fill_roce(uint8_t* p, uint32_t len, uint32_t qp, uint64_t seq) {
  std::memset(p, 0, kQueueSeqOffset);
  std::memset(p, 0x02, 12);
  p[12] = 0x08;  // IPv4
  uint8_t* ip = p + 14;
  ip[0] = 0x45;
  uint16_t ip_len = static_cast<uint16_t>(len - 14);
  ip[2] = static_cast<uint8_t>(ip_len >> 8);
  ip[3] = static_cast<uint8_t>(ip_len);
  ip[8] = 64;
  ip[9] = 17;  // UDP
  uint8_t* udp = ip + 20;
  udp[2] = 4791 >> 8;
  udp[3] = 4791 & 0xff;
  uint8_t* bth = udp + 8;
  bth[5] = static_cast<uint8_t>(qp >> 16);
  bth[6] = static_cast<uint8_t>(qp >> 8);
  bth[7] = static_cast<uint8_t>(qp);
  std::memcpy(p + kQueueSeqOffset, &seq, 8);
}

// One thread's share of --mode queues: its TX queue on a, its RX queue on b.
bool queue_pair_loop(Port& a, Port& b, uint16_t q, const Options& o, uint32_t size, uint64_t* errors) {
  std::vector<ufab_buf*> bufs(o.burst);
  uint64_t sent = 0, got = 0;
  auto deadline = Clock::now() + std::chrono::seconds(120);
  uint64_t spins = 0;
  while (got < o.frames) {
    if (sent < o.frames) {
      uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(o.burst, o.frames - sent));
      int k = a.tx_pool(q).alloc(bufs.data(), n);
      for (int i = 0; i < k; ++i) {
        fill_roce(bufs[i]->base + bufs[i]->offset, size, q, sent + static_cast<uint64_t>(i));
        bufs[i]->len = size;
      }
      int r = a.drv()->tx_burst(a.dev(), q, bufs.data(), static_cast<uint16_t>(k));
      if (r < 0) return false;
      if (r < k) a.tx_pool(q).free(bufs.data() + r, static_cast<uint32_t>(k - r));
      sent += static_cast<uint64_t>(r);
    }
    int n = b.drv()->rx_burst(b.dev(), q, bufs.data(), static_cast<uint16_t>(o.burst));
    if (n < 0) return false;
    if (n == 0) {
      if ((++spins & 0xffff) == 0 && Clock::now() > deadline) return false;
      continue;
    }
    for (int i = 0; i < n; ++i) {
      uint64_t seq;
      std::memcpy(&seq, bufs[i]->base + bufs[i]->offset + kQueueSeqOffset, 8);
      if (seq != got + static_cast<uint64_t>(i)) ++*errors;
    }
    got += static_cast<uint64_t>(n);
    b.rx_pool(q).free(bufs.data(), static_cast<uint32_t>(n));
  }
  return true;
}

int run_queues(const Options& o, uint32_t size, uint32_t nq) {
  if (size < kQueueSeqOffset + 8) {
    std::fprintf(stderr, "--mode queues needs sizes of at least %u bytes\n", kQueueSeqOffset + 8);
    return 1;
  }
  std::string link = unique_link("bench-q");
  std::map<std::string, std::string> params = {{"ring", std::to_string(o.ring)}, {"queues", std::to_string(nq)}};
  auto a = Port::open(link + ":0", params);
  auto b = Port::open(link + ":1", params);
  if (!a || !b || b->steer(UFAB_STEER_ROCE_QPN, static_cast<uint16_t>(nq)) != 0) return 1;
  std::vector<std::thread> threads;
  std::vector<uint64_t> errors(nq, 0);
  std::vector<char> ok(nq, 0);
  auto t0 = Clock::now();
  for (uint32_t q = 0; q < nq; ++q)
    threads.emplace_back([&, q] { ok[q] = queue_pair_loop(*a, *b, static_cast<uint16_t>(q), o, size, &errors[q]); });
  for (auto& t : threads) t.join();
  double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  bool good = true;
  for (uint32_t q = 0; q < nq; ++q) good = good && ok[q] && errors[q] == 0;
  double fps = static_cast<double>(o.frames) * nq / seconds;
  std::printf("queues=%-3u %6u B  %10llu frames  %7.3f s  %7.2f Mframes/s  %7.2f Gbit/s  %s\n", nq, size,
              static_cast<unsigned long long>(o.frames * nq), seconds, fps / 1e6, fps * size * 8 / 1e9,
              good ? "ok" : "ERRORS");
  return good ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--frames")
      o.frames = std::strtoull(v.c_str(), nullptr, 0);
    else if (k == "--burst")
      o.burst = static_cast<uint32_t>(std::strtoul(v.c_str(), nullptr, 0));
    else if (k == "--ring")
      o.ring = static_cast<uint32_t>(std::strtoul(v.c_str(), nullptr, 0));
    else if (k == "--mode")
      o.mode = v;
    else if (k == "--queues") {
      o.queues.clear();
      for (size_t p = 0; p < v.size();) {
        size_t q = v.find(',', p);
        o.queues.push_back(static_cast<uint32_t>(std::strtoul(v.substr(p, q - p).c_str(), nullptr, 0)));
        p = q == std::string::npos ? v.size() : q + 1;
      }
    }
    else if (k == "--sizes") {
      o.sizes.clear();
      for (size_t p = 0; p < v.size();) {
        size_t q = v.find(',', p);
        o.sizes.push_back(static_cast<uint32_t>(std::strtoul(v.substr(p, q - p).c_str(), nullptr, 0)));
        p = q == std::string::npos ? v.size() : q + 1;
      }
    } else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (o.burst == 0 || o.burst > 1024) o.burst = 32;
  std::printf("swnic bench: %llu frames per run, burst %u, ring %u, %u CPUs\n",
              static_cast<unsigned long long>(o.frames), o.burst, o.ring, std::thread::hardware_concurrency());
  int rc = 0;
  for (uint32_t size : o.sizes) {
    if (o.mode == "threads" || o.mode == "both") rc |= run_threads(o, size);
    if (o.mode == "processes" || o.mode == "both") rc |= run_processes(o, size);
    if (o.mode == "loop") rc |= run_loop(o, size);
    if (o.mode == "queues") {
      for (uint32_t nq : o.queues) rc |= run_queues(o, size, nq);
    }
  }
  return rc;
}
