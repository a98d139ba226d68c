// RDMA over the software NIC, two threads (one device each, each driving its
// own progress): RDMA WRITE bandwidth and message rate by size, and SEND
// ping-pong latency. What the transport costs without any NIC in the way.
//
//   bazel-bin/tests/bench/rdma_swnic_bench [--seconds S] [--json FILE] [--param K=V]...
//
// --param passes a device parameter to both ends (zerocopy=off: every
// payload copied into a frame buffer, for comparing with the zero-copy
// transmit that is the default).
// Prints a table; --json writes the same figures. UFAB_BENCH_STATS=1 also
// prints both devices' transport counters after each WRITE run.
#include <optional>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "ufab/rdma.hpp"
#include "base/json.h"

using namespace ufab;
using namespace ufab::rdma;
using Clock = std::chrono::steady_clock;

namespace {

struct End {
  std::unique_ptr<Device> dev;
  std::optional<ProtectionDomain> pd;
  std::unique_ptr<CompletionQueue> cq;
  std::unique_ptr<QueuePair> qp;
  std::vector<uint8_t> buf;
  std::optional<MemoryRegion> mr;
};

void die(const std::string& what) {
  std::fprintf(stderr, "rdma_swnic_bench: %s\n", what.c_str());
  std::exit(1);
}

template <typename T>
T must(Result<T> r, const char* what) {
  if (!r) die(std::string(what) + ": " + r.error().message());
  return std::move(*r);
}

std::map<std::string, std::string> g_params;  // --param, for both ends

void open_end(End& e, const std::string& spec, const std::string& ip, std::map<std::string, std::string> params) {
  params.insert(g_params.begin(), g_params.end());
  e.dev = must(Device::open(spec, {.ip = ip, .params = params}), "open");
  e.pd.emplace(must(e.dev->alloc_pd(), "pd"));
  e.cq = must(e.dev->create_cq(4096), "cq");
  e.qp = must(e.pd->create_qp({.type = QpType::kRc, .send_cq = e.cq.get(), .recv_cq = e.cq.get(),
                               .caps = {.max_send_wr = 1024, .max_recv_wr = 1024}}),
              "qp");
  e.buf.assign(8 << 20, 1);
  e.mr.emplace(must(e.pd->register_mr(e.buf.data(), e.buf.size(), kLocalWrite | kRemoteAccess), "mr"));
}

struct Pair {
  End a, b;
  Pair() {
    std::string name = "bench" + std::to_string(::getpid());
    open_end(a, "swnic:" + name + ":0", "10.0.0.1", {{"stale", "reset"}, {"ring", "4096"}});
    open_end(b, "swnic:" + name + ":1", "10.0.0.2", {});
    if (!a.qp->connect(b.qp->local()) || !b.qp->connect(a.qp->local())) die("connect");
  }
};

// Data packets sent per packet needed by the last write_bw run's sender
// (api/ufab/rdma.h ufab_sent_per_needed; 1.0 without resends).
double last_sent_per_needed = 1.0;

// Bytes/s and messages/s of RDMA WRITEs of `size`, 128 outstanding, every
// 16th signaled; the peer thread only runs its transport.
std::pair<double, double> write_bw(uint32_t size, double seconds) {
  Pair p;
  std::atomic<bool> stop{false};
  std::thread responder([&] {
    while (!stop.load(std::memory_order_relaxed)) p.b.dev->progress();
  });
  constexpr uint32_t kWindow = 128, kSignalEvery = 16;
  uint64_t posted = 0, completed = 0;
  WorkCompletion wc[64];
  Sge sge = p.a.mr->sge(0, size);
  uint64_t remote = reinterpret_cast<uint64_t>(p.b.buf.data());
  auto start = Clock::now();
  auto end = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  while (Clock::now() < end) {
    while (posted - completed < kWindow) {
      bool signaled = (posted + 1) % kSignalEvery == 0;
      auto s = p.a.qp->post_send({.wr_id = posted, .opcode = WrOpcode::kRdmaWrite,
                                  .flags = signaled ? kSendSignaled : 0u, .sgl = {&sge, 1},
                                  .remote_addr = remote, .rkey = p.b.mr->rkey()});
      if (!s) die(s.error().message());
      ++posted;
    }
    auto n = must(p.a.cq->poll(wc), "poll");
    for (size_t i = 0; i < n; ++i) {
      if (wc[i].status != WcStatus::kSuccess) die("WRITE failed: " + wc[i].error);
      completed += kSignalEvery;
    }
  }
  double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  stop = true;
  responder.join();
  const DeviceStats sender = p.a.dev->stats();
  last_sent_per_needed = ufab_sent_per_needed(&sender);
  if (getenv("UFAB_BENCH_STATS")) {
    auto st = p.a.dev->stats();
    std::fprintf(stderr, "a: tx %lu rx %lu retrans %lu timeouts %lu stalls %lu naks %lu window cuts %lu sent/needed %.3f\n",
                 st.tx_frames, st.rx_frames, st.retransmits, st.timeouts, st.tx_stalls, st.naks_received, st.window_cuts,
                 last_sent_per_needed);
    st = p.b.dev->stats();
    std::fprintf(stderr, "b: tx %lu rx %lu dup %lu naks sent %lu dropped %lu\n", st.tx_frames, st.rx_frames,
                 st.duplicates, st.naks_sent, st.rx_dropped);
  }
  return {static_cast<double>(completed) * size / elapsed, static_cast<double>(completed) / elapsed};
}

// Mean round trip / 2 of SEND ping-pong of `size` bytes, in microseconds.
double send_lat(uint32_t size, uint32_t iters) {
  Pair p;
  auto post_recv = [](End& e) {
    Sge r = e.mr->sge(1 << 20, size_t{1} << 16);
    if (!e.qp->post_recv({.sgl = {&r, 1}})) die("post_recv");
  };
  for (int i = 0; i < 16; ++i) post_recv(p.a), post_recv(p.b);
  auto run = [&](End& self, bool starts) {
    Sge s = self.mr->sge(0, size);
    WorkCompletion wc[8];
    for (uint32_t i = 0; i < iters; ++i) {
      if (!starts) {  // wait for the ping
        for (bool got = false; !got;) {
          auto n = must(self.cq->poll(wc), "poll");
          for (size_t k = 0; k < n; ++k) got |= wc[k].opcode == WcOpcode::kRecv;
        }
        post_recv(self);
      }
      if (!self.qp->post_send({.opcode = WrOpcode::kSend, .flags = kSendInline, .sgl = {&s, 1}})) die("send");
      if (starts) {
        for (bool got = false; !got;) {
          auto n = must(self.cq->poll(wc), "poll");
          for (size_t k = 0; k < n; ++k) got |= wc[k].opcode == WcOpcode::kRecv;
        }
        post_recv(self);
      }
    }
  };
  std::thread peer([&] { run(p.b, false); });
  auto start = Clock::now();
  run(p.a, true);
  double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  peer.join();
  return elapsed / iters / 2 * 1e6;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 1.0;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--seconds" && i + 1 < argc) {
      seconds = std::stod(argv[++i]);
    } else if (a == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else if (a == "--param" && i + 1 < argc && std::strchr(argv[i + 1], '=') != nullptr) {
      std::string kv = argv[++i];
      g_params[kv.substr(0, kv.find('='))] = kv.substr(kv.find('=') + 1);
    } else {
      std::fprintf(stderr, "usage: %s [--seconds S] [--json FILE] [--param K=V]...\n", argv[0]);
      return 2;
    }
  }
  JsonWriter json;
  json.begin_object().key("write_bw").begin_array();
  std::printf("%-12s %10s %14s %12s %12s\n", "test", "bytes", "MB/s", "msgs/s", "sent/needed");
  for (uint32_t size : {64u, 1024u, 4096u, 65536u, 1u << 20}) {
    auto [bps, mps] = write_bw(size, seconds);
    std::printf("%-12s %10u %14.1f %12.0f %12.3f\n", "write_bw", size, bps / 1e6, mps, last_sent_per_needed);
    json.begin_object().field("bytes", size).field("mb_per_s", bps / 1e6).field("msgs_per_s", mps);
    json.field("sent_per_needed", last_sent_per_needed).end_object();
  }
  json.end_array().key("send_lat").begin_array();
  std::printf("%-12s %10s %14s\n", "test", "bytes", "usec (one way)");
  for (uint32_t size : {8u, 256u}) {
    double us = send_lat(size, 20000);
    std::printf("%-12s %10u %14.2f\n", "send_lat", size, us);
    json.begin_object().field("bytes", size).field("usec", us).end_object();
  }
  json.end_array().end_object();
  if (!json_path.empty()) std::ofstream(json_path) << json.str() << "\n";
  return 0;
}
