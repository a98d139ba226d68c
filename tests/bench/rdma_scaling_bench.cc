// Multi-core scaling: N independent RC QP pairs, each driven by its own
// sender thread and its own receiver thread, streaming 64 B RDMA WRITEs.
// Reports the aggregate message rate for each N, and per-pair figures
// (messages/s, CPU seconds of each thread, involuntary context switches).
//
//   rdma_scaling_bench [--provider swnic|swnic-shared|shm] [--threads 1,2,4,8,16]
//                      [--seconds S] [--size B] [--window W] [--json FILE]
//
// swnic: pair K is two Devices on the two ports of its own link
//   "swnic:scale<pid>x<K>:0/1" (its own shared-memory segment and its own
//   soft-RoCE Context each side): nothing of the transport is shared
//   between pairs; only the process (allocator, registries, the kernel).
// swnic-shared: every pair on ONE device pair, "swnic:scale<pid>:0/1" with
//   queues=N, so pair K's QPs sit on lane K of each device
//   (core/transport/lane.h): what a multi-threaded application with one NIC
//   does. The receiver thread polls its own CQ (which progresses its lane)
//   instead of the whole device.
// shm: every device opens one domain, "shm:scale<pid>", as MPI ranks of one
//   node would: pair K is the K-th pair of devices in that domain.
//
// The sender posts WRITEs with `window` outstanding, every 16th signaled,
// and polls its CQ (which runs its progress). The receiver loops on its
// device's progress(): soft-RoCE needs it to acknowledge; the shm provider's
// WRITEs are one-sided and need nothing from it, but the thread is kept so
// that both providers run 2N threads. Buffers are memfd MAP_SHARED mappings
// (as `ufab perf` allocates), so shm WRITEs are a memcpy, not CMA.
//
// Threads, not processes: one process is what a multi-threaded application
// does, and anything process-wide (malloc, the provider registries, a global
// lock) shows up in the curve; separate processes would hide it.
//
// Every wait is bounded: setup, the start barrier, and the stream (a pair
// with no completion for 5 s is reported as stalled and the run fails).
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/json.h"
#include "ufab/rdma.hpp"

using namespace ufab;
using namespace ufab::rdma;
using Clock = std::chrono::steady_clock;

namespace {

constexpr uint32_t kSignalEvery = 16;
constexpr size_t kBufBytes = 1 << 20;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "rdma_scaling_bench: %s\n", what.c_str());
  std::exit(1);
}

template <typename T>
T must(Result<T> r, const std::string& what) {
  if (!r) die(what + ": " + r.error().message());
  return std::move(*r);
}

// A memfd-backed MAP_SHARED buffer.
struct Buffer {
  uint8_t* p = nullptr;
  size_t n = 0;
  int fd = -1;
  explicit Buffer(size_t bytes) : n(bytes) {
    fd = ::memfd_create("ufab-scaling", MFD_CLOEXEC);
    if (fd < 0) die(std::string("memfd_create: ") + std::strerror(errno));
    if (::ftruncate(fd, static_cast<off_t>(n)) != 0) die(std::string("ftruncate: ") + std::strerror(errno));
    void* m = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) die(std::string("mmap: ") + std::strerror(errno));
    p = static_cast<uint8_t*>(m);
    std::memset(p, 1, n);
  }
  ~Buffer() {
    if (p) ::munmap(p, n);
    if (fd >= 0) ::close(fd);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

struct End {
  std::shared_ptr<Device> dev;
  std::optional<ProtectionDomain> pd;
  std::unique_ptr<CompletionQueue> cq;
  std::unique_ptr<QueuePair> qp;
  std::unique_ptr<Buffer> buf;
  std::optional<MemoryRegion> mr;
};

void open_end(End& e, const std::string& spec, const std::string& ip, std::map<std::string, std::string> params,
              uint32_t window, std::shared_ptr<Device> shared = nullptr) {
  e.dev = shared ? shared : std::shared_ptr<Device>(must(Device::open(spec, {.ip = ip, .params = params}), "open " + spec));
  e.pd.emplace(must(e.dev->alloc_pd(), "alloc_pd on " + spec));
  e.cq = must(e.dev->create_cq(4096), "create_cq on " + spec);
  e.qp = must(e.pd->create_qp({.type = QpType::kRc, .send_cq = e.cq.get(), .recv_cq = e.cq.get(),
                               .caps = {.max_send_wr = std::max(1024u, window * 2), .max_recv_wr = 64}}),
              "create_qp on " + spec);
  e.buf = std::make_unique<Buffer>(kBufBytes);
  e.mr.emplace(must(e.pd->register_mr(e.buf->p, e.buf->n, kLocalWrite | kRemoteAccess), "register_mr on " + spec));
}

double thread_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}
double process_cpu_seconds() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}
int process_threads() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("Threads:", 0) == 0) return std::atoi(line.c_str() + 8);
  return -1;
}
long thread_nivcsw() {
  rusage ru{};
  ::getrusage(RUSAGE_THREAD, &ru);
  return ru.ru_nivcsw;
}

struct PairResult {
  uint64_t messages = 0;     // completed in the measured window
  double sender_cpu = 0;     // CPU seconds in the window
  double receiver_cpu = 0;
  long sender_nivcsw = 0;    // involuntary context switches in the window
  long receiver_nivcsw = 0;
  uint64_t retransmits = 0;  // both devices, whole run (soft-RoCE only)
  std::string error;
};

struct Pair {
  End a, b;
  PairResult r;
};

struct Config {
  std::string provider = "swnic";
  std::vector<int> threads{1, 2, 4, 8, 16};
  double seconds = 3.0;
  double warmup = 0.5;
  uint32_t size = 64;
  uint32_t window = 128;
  std::string json_path;
};

void setup_pairs(std::vector<std::unique_ptr<Pair>>& pairs, int n, const Config& c, int round) {
  std::string tag = std::to_string(::getpid()) + "r" + std::to_string(round);
  std::shared_ptr<Device> shared_a, shared_b;
  if (c.provider == "swnic-shared") {
    std::string link = "swnic:scale" + tag;
    std::map<std::string, std::string> params{{"ring", "4096"}, {"queues", std::to_string(n)}};
    auto pa = params;
    pa["stale"] = "reset";
    shared_a = must(Device::open(link + ":0", {.ip = "10.0.0.1", .params = pa}), "open " + link + ":0");
    shared_b = must(Device::open(link + ":1", {.ip = "10.0.0.2", .params = params}), "open " + link + ":1");
  }
  for (int k = 0; k < n; ++k) {
    auto p = std::make_unique<Pair>();
    if (shared_a) {
      open_end(p->a, "", "", {}, c.window, shared_a);
      open_end(p->b, "", "", {}, c.window, shared_b);
    } else if (c.provider == "swnic") {
      std::string link = "swnic:scale" + tag + "x" + std::to_string(k);
      // Each link its own subnet: addresses never matter across links, but
      // this keeps captures readable.
      std::string net = "10." + std::to_string(k / 250) + "." + std::to_string(k % 250) + ".";
      open_end(p->a, link + ":0", net + "1", {{"stale", "reset"}, {"ring", "4096"}}, c.window);
      open_end(p->b, link + ":1", net + "2", {}, c.window);
    } else {
      std::string dom = "shm:scale" + tag;
      open_end(p->a, dom, "", {}, c.window);
      open_end(p->b, dom, "", {}, c.window);
    }
    auto s1 = p->a.qp->connect(p->b.qp->local());
    if (!s1) die("pair " + std::to_string(k) + ": connect a->b: " + s1.error().message());
    auto s2 = p->b.qp->connect(p->a.qp->local());
    if (!s2) die("pair " + std::to_string(k) + ": connect b->a: " + s2.error().message());
    pairs.push_back(std::move(p));
  }
}

// One point of the curve: n pairs for c.seconds after c.warmup.
struct PointExtra {
  double elapsed = 0;
  double process_cpu = 0;  // CPU seconds of the whole process in the window
  int threads_in_process = 0;
};

std::vector<PairResult> run_point(int n, const Config& c, int round, PointExtra& extra) {
  std::vector<std::unique_ptr<Pair>> pairs;
  setup_pairs(pairs, n, c, round);

  std::atomic<int> ready{0};
  std::atomic<bool> go{false}, stop_receivers{false};
  Clock::time_point t0, t1;  // written before `go`
  auto wait_go = [&] {
    ready.fetch_add(1);
    auto limit = Clock::now() + std::chrono::seconds(30);
    while (!go.load(std::memory_order_acquire)) {
      if (Clock::now() > limit) return false;
      std::this_thread::yield();
    }
    return true;
  };

  std::vector<std::thread> threads;
  for (int k = 0; k < n; ++k) {
    Pair& p = *pairs[k];
    threads.emplace_back([&, k] {  // receiver
      (void)k;
      if (!wait_go()) {
        p.r.error = "receiver: start barrier timed out";
        return;
      }
      const bool own_cq = c.provider == "swnic-shared";
      WorkCompletion none[4];
      auto drive = [&] {
        if (own_cq) (void)p.b.cq->poll(none);  // progresses the lane of p's QP
        else p.b.dev->progress();
      };
      while (Clock::now() < t0 && !stop_receivers.load(std::memory_order_relaxed)) {
        for (int i = 0; i < 64; ++i) drive();
      }
      double cpu0 = thread_cpu_seconds();
      long cs0 = thread_nivcsw();
      bool measured = false;
      while (!stop_receivers.load(std::memory_order_relaxed)) {
        for (int i = 0; i < 64; ++i) drive();
        if (!measured && Clock::now() >= t1) {
          p.r.receiver_cpu = thread_cpu_seconds() - cpu0;
          p.r.receiver_nivcsw = thread_nivcsw() - cs0;
          measured = true;
        }
      }
      if (!measured) {
        p.r.receiver_cpu = thread_cpu_seconds() - cpu0;
        p.r.receiver_nivcsw = thread_nivcsw() - cs0;
      }
    });
    threads.emplace_back([&] {  // sender
      if (!wait_go()) {
        p.r.error = "sender: start barrier timed out";
        return;
      }
      uint64_t posted = 0, completed = 0, at_t0 = 0;
      double cpu0 = 0;
      long cs0 = 0;
      bool started = false;
      WorkCompletion wc[64];
      Sge sge = p.a.mr->sge(0, c.size);
      uint64_t remote = reinterpret_cast<uint64_t>(p.b.buf->p);
      auto last_completion = Clock::now();
      bool progressed = false;  // a completion since the last clock read
      for (uint64_t iter = 0;; ++iter) {
        while (posted - completed < c.window) {
          bool signaled = (posted + 1) % kSignalEvery == 0;
          auto s = p.a.qp->post_send({.wr_id = posted, .opcode = WrOpcode::kRdmaWrite,
                                      .flags = signaled ? kSendSignaled : 0u, .sgl = {&sge, 1},
                                      .remote_addr = remote + (posted % 1024) * 64 % (kBufBytes - c.size),
                                      .rkey = p.b.mr->rkey()});
          if (!s) {
            p.r.error = "post_send: " + s.error().message();
            return;
          }
          ++posted;
        }
        auto n = p.a.cq->poll(wc);
        if (!n) {
          p.r.error = "poll: " + n.error().message();
          return;
        }
        for (size_t i = 0; i < *n; ++i) {
          if (wc[i].status != WcStatus::kSuccess) {
            p.r.error = "WRITE failed: " + wc[i].error;
            return;
          }
          completed += kSignalEvery;
        }
        progressed |= *n > 0;
        if ((iter & 63) == 0) {  // the clock, once per 64 loops
          auto now = Clock::now();
          if (progressed) last_completion = now, progressed = false;
          else if (now - last_completion > std::chrono::seconds(5)) {
            p.r.error = "stalled: no completion for 5 s (" + std::to_string(posted - completed) + " outstanding)";
            return;
          }
          if (!started && now >= t0) {
            started = true;
            at_t0 = completed;
            cpu0 = thread_cpu_seconds();
            cs0 = thread_nivcsw();
          }
          if (now >= t1) break;
        }
      }
      p.r.messages = completed - at_t0;
      p.r.sender_cpu = thread_cpu_seconds() - cpu0;
      p.r.sender_nivcsw = thread_nivcsw() - cs0;
      // Drain what is outstanding (bounded), so the QPs close quietly.
      auto limit = Clock::now() + std::chrono::seconds(5);
      while (completed < posted - posted % kSignalEvery && Clock::now() < limit) {
        auto m = p.a.cq->poll(wc);
        if (!m) break;
        completed += *m * kSignalEvery;
      }
    });
  }

  // Start barrier: every thread is up, then a common window for all.
  auto limit = Clock::now() + std::chrono::seconds(30);
  while (ready.load() < 2 * n) {
    if (Clock::now() > limit) die("threads did not start within 30 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  auto start = Clock::now();
  t0 = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(c.warmup));
  t1 = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(c.seconds));
  go.store(true, std::memory_order_release);
  // The whole process's CPU over the window: minus the bench threads' own,
  // what the providers' helper threads (swnic's interrupt bridges) burn.
  std::this_thread::sleep_until(t0);
  double pcpu0 = process_cpu_seconds();
  extra.threads_in_process = process_threads();
  std::this_thread::sleep_until(t1);
  extra.process_cpu = process_cpu_seconds() - pcpu0;
  // Senders end by themselves (at t1 or on an error); receivers run until
  // every sender has drained.
  for (int k = 0; k < n; ++k) threads[2 * k + 1].join();
  stop_receivers = true;
  for (int k = 0; k < n; ++k) threads[2 * k].join();
  extra.elapsed = std::chrono::duration<double>(t1 - t0).count();

  std::vector<PairResult> out;
  for (auto& p : pairs) {
    if (c.provider == "swnic") p->r.retransmits = p->a.dev->stats().retransmits + p->b.dev->stats().retransmits;
    if (c.provider == "swnic-shared" && &p == &pairs.front()) {  // one device pair: count once
      p->r.retransmits = p->a.dev->stats().retransmits + p->b.dev->stats().retransmits;
    }
    out.push_back(p->r);
  }
  return out;
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    long x = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end || x < 1 || x > 128) die("--threads: '" + item + "' is not a count from 1 to 128");
    v.push_back(static_cast<int>(x));
  }
  if (v.empty()) die("--threads: empty list");
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--provider") c.provider = val();
    else if (a == "--threads") c.threads = parse_list(val());
    else if (a == "--seconds") c.seconds = std::stod(val());
    else if (a == "--warmup") c.warmup = std::stod(val());
    else if (a == "--size") c.size = static_cast<uint32_t>(std::stoul(val()));
    else if (a == "--window") c.window = static_cast<uint32_t>(std::stoul(val()));
    else if (a == "--json") c.json_path = val();
    else {
      std::fprintf(stderr,
                   "usage: %s [--provider swnic|swnic-shared|shm] [--threads 1,2,4,8,16] [--seconds S] [--warmup S]\n"
                   "          [--size BYTES] [--window W] [--json FILE]\n",
                   argv[0]);
      return 2;
    }
  }
  if (c.provider != "swnic" && c.provider != "swnic-shared" && c.provider != "shm") {
    die("--provider must be swnic, swnic-shared or shm");
  }
  if (c.seconds <= 0 || c.seconds > 600) die("--seconds must be in (0, 600]");
  if (c.size == 0 || c.size > 4096) die("--size must be 1..4096");
  if (c.window < kSignalEvery || c.window % kSignalEvery) die("--window must be a multiple of 16");

  unsigned cpus = std::thread::hardware_concurrency();
  JsonWriter json;
  json.begin_object()
      .field("provider", c.provider)
      .field("bytes", c.size)
      .field("window", c.window)
      .field("signal_every", kSignalEvery)
      .field("seconds", c.seconds)
      .field("cpus", cpus)
      .key("points")
      .begin_array();
  std::printf("provider %s, %u B RDMA WRITE, window %u, every %u signaled, %.1f s per point, %u CPUs\n",
              c.provider.c_str(), c.size, c.window, kSignalEvery, c.seconds, cpus);
  std::printf("%7s %14s %14s %14s %14s %9s %9s %9s %7s %8s\n", "threads", "msgs/s", "per thread", "min thread",
              "max thread", "snd cpu", "rcv cpu", "other cpu", "tasks", "retrans");
  bool failed = false;
  int round = 0;
  for (int n : c.threads) {
    PointExtra extra;
    auto res = run_point(n, c, round++, extra);
    double elapsed = extra.elapsed;
    double total = 0, mn = 1e300, mx = 0, scpu = 0, rcpu = 0;
    uint64_t retrans = 0;
    for (size_t k = 0; k < res.size(); ++k) {
      if (!res[k].error.empty()) {
        std::fprintf(stderr, "rdma_scaling_bench: %d threads, pair %zu: %s\n", n, k, res[k].error.c_str());
        failed = true;
      }
      double r = res[k].messages / elapsed;
      total += r;
      mn = std::min(mn, r);
      mx = std::max(mx, r);
      scpu += res[k].sender_cpu / elapsed;
      rcpu += res[k].receiver_cpu / elapsed;
      retrans += res[k].retransmits;
    }
    // CPUs' worth of work outside the bench threads (helper threads).
    double other = extra.process_cpu / elapsed - scpu - rcpu;
    std::printf("%7d %14.0f %14.0f %14.0f %14.0f %9.2f %9.2f %9.2f %7d %8lu\n", n, total, total / n, mn, mx, scpu / n,
                rcpu / n, other, extra.threads_in_process, static_cast<unsigned long>(retrans));
    std::fflush(stdout);
    json.begin_object()
        .field("threads", n)
        .field("msgs_per_s", total)
        .field("elapsed_s", elapsed)
        .field("process_cpu", extra.process_cpu / elapsed)
        .field("other_cpu", other)
        .field("threads_in_process", extra.threads_in_process)
        .field("retransmits", retrans)
        .key("pairs")
        .begin_array();
    for (auto& r : res) {
      json.begin_object()
          .field("msgs_per_s", r.messages / elapsed)
          .field("sender_cpu", r.sender_cpu / elapsed)
          .field("receiver_cpu", r.receiver_cpu / elapsed)
          .field("sender_nivcsw", r.sender_nivcsw)
          .field("receiver_nivcsw", r.receiver_nivcsw)
          .field("retransmits", r.retransmits);
      if (!r.error.empty()) json.field("error", r.error);
      json.end_object();
    }
    json.end_array().end_object();
    if (failed) break;
  }
  json.end_array().field("ok", !failed).end_object();
  if (!c.json_path.empty()) {
    std::ofstream f(c.json_path);
    f << json.str() << "\n";
    if (!f) die("cannot write " + c.json_path);
  }
  return failed ? 1 : 0;
}
