// Stream-ordered ping-pong against the CPU-driven loop (issue 12's
// benchmark; docs/gpu.md). One GPU, two RC QPs A and B (soft-RoCE over the
// software NIC, or shm), pinned host buffers a kernel writes. One round trip:
//
//   stream-ordered: stream A: kernel fill(A) -> ufab_stream_post_send(WRITE_WITH_IMM A->B)
//                   -> ufab_stream_wait(receive on A); stream B: ufab_stream_wait(receive
//                   on B) -> kernel fill(B) -> ufab_stream_post_send(WRITE_WITH_IMM B->A).
//                   A chunk of rounds is enqueued behind a gate (a stream wait on a host
//                   word), then the gate opens and the chunk is timed until both streams
//                   are idle: the time is the GPU's and the transport's, not the host's
//                   enqueueing.
//   CPU-driven:     launch fill(A); cuStreamSynchronize; ufab_post_send A->B; poll B's CQ
//                   for the receive; launch fill(B); cuStreamSynchronize; ufab_post_send
//                   B->A; poll A's CQ. One thread, busy polling.
//
// Prints a table (microseconds per round trip, median of --runs runs of
// --iters rounds) and writes JSON (--json FILE). Without a GPU it says why
// and exits 2. swnic devices run without progress threads unless
// --progress-thread (the CPU loop's CQ polling and ufab's stream watcher
// drive them); shm has none either way.
//
//   stream_pingpong_bench [--iters N] [--runs R] [--provider swnic|shm|both] [--progress-thread] [--json FILE]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "base/json.h"
#include "tests/gpu/stream_common.h"

namespace {

using namespace ufab::gpu_test;
using Clock = std::chrono::steady_clock;

constexpr int kChunk = 100;  // rounds between receive refills (queues hold 256)

#define CHECK_OK(expr)                                                                       \
  do {                                                                                       \
    if (const auto& _s = (expr); !_s) {                                                          \
      std::fprintf(stderr, "stream_pingpong_bench: %s: %s\n", #expr, _s.error().message().c_str()); \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)
#define CHECK_RC(expr)                                                                           \
  do {                                                                                           \
    if (int _rc = (expr); _rc < 0) {                                                             \
      std::fprintf(stderr, "stream_pingpong_bench: %s = %d: %s\n", #expr, _rc, ufab_last_error()); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

void post_recvs(const QpPair& p, int side, int n) {
  std::vector<ufab_recv_wr> rw(n, ufab_recv_wr{.wr_id = 0, .sg_list = nullptr, .num_sge = 0, .reserved = 0});
  CHECK_RC(ufab_post_recv(p.qp[side], rw.data(), n, nullptr));
}

// Busy-polls `cq` for one receive completion (bounded: 5 s).
void await_recv(ufab_cq* cq) {
  ufab_wc wc{};
  auto until = Clock::now() + std::chrono::seconds(5);
  while (ufab_cq_poll(cq, &wc, 1) == 0) {
    if (Clock::now() > until) {
      std::fprintf(stderr, "stream_pingpong_bench: no receive completion in 5 s\n");
      std::exit(1);
    }
  }
  if (wc.status != UFAB_WC_SUCCESS) {
    std::fprintf(stderr, "stream_pingpong_bench: completion %s\n", ufab_wc_status_str(wc.status));
    std::exit(1);
  }
}

double cpu_driven(const Gpu& g, const QpPair& p, void* sa, void* sb, size_t len, int iters) {
  double total_ns = 0;
  for (int done = 0; done < iters; done += kChunk) {
    int n = std::min(kChunk, iters - done);
    post_recvs(p, 0, n);
    post_recvs(p, 1, n);
    auto t0 = Clock::now();
    for (int r = 0; r < n; ++r) {
      ufab_sge s0 = p.sge(0, 0, len), s1 = p.sge(1, 0, len);
      ufab_send_wr w0 = p.write_imm(0, &s0, 0, r, false), w1 = p.write_imm(1, &s1, 0, r, false);
      CHECK_OK(g.launch_fill(sa, p.data(0), len, r));
      CHECK_OK(g.d->stream_synchronize(sa));
      CHECK_RC(ufab_post_send(p.qp[0], &w0, 1, nullptr));
      await_recv(p.cq[1]);
      CHECK_OK(g.launch_fill(sb, p.data(1), len, r));
      CHECK_OK(g.d->stream_synchronize(sb));
      CHECK_RC(ufab_post_send(p.qp[1], &w1, 1, nullptr));
      await_recv(p.cq[0]);
    }
    total_ns += std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
  }
  return total_ns / iters / 1000.0;
}

double stream_ordered(const Gpu& g, const QpPair& p, void* sa, void* sb, uint32_t* gate, size_t len, int iters) {
  double total_ns = 0;
  std::vector<ufab_stream_op*> ops;
  for (int done = 0; done < iters; done += kChunk) {
    int n = std::min(kChunk, iters - done);
    std::atomic_ref<uint32_t>(*gate).store(0);
    CHECK_OK(g.d->stream_wait_value32(sa, gate, 1));
    for (int r = 0; r < n; ++r) {
      ufab_recv_wr rw{.wr_id = 0, .sg_list = nullptr, .num_sge = 0, .reserved = 0};
      ufab_stream_op *ra = nullptr, *rb = nullptr, *oa = nullptr, *ob = nullptr;
      CHECK_RC(ufab_stream_post_recv(p.qp[0], &rw, 1, &ra));
      CHECK_RC(ufab_stream_post_recv(p.qp[1], &rw, 1, &rb));
      ufab_sge s0 = p.sge(0, 0, len), s1 = p.sge(1, 0, len);
      ufab_send_wr w0 = p.write_imm(0, &s0, 0, r, false), w1 = p.write_imm(1, &s1, 0, r, false);
      CHECK_OK(g.launch_fill(sa, p.data(0), len, r));
      CHECK_RC(ufab_stream_post_send(p.qp[0], &w0, 1, sa, &oa));
      CHECK_RC(ufab_stream_wait(ra, sa));
      CHECK_RC(ufab_stream_wait(rb, sb));
      CHECK_OK(g.launch_fill(sb, p.data(1), len, r));
      CHECK_RC(ufab_stream_post_send(p.qp[1], &w1, 1, sb, &ob));
      ops.insert(ops.end(), {ra, rb, oa, ob});
    }
    auto t0 = Clock::now();
    std::atomic_ref<uint32_t>(*gate).store(1);
    CHECK_OK(g.d->stream_synchronize(sa));
    CHECK_OK(g.d->stream_synchronize(sb));
    total_ns += std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
    for (auto* op : ops) {
      ufab_stream_op_info info{};
      const char* why = nullptr;
      ufab_stream_op_query(op, &info, &why);
      if (info.wc_status != UFAB_WC_SUCCESS || info.post_error != 0) {
        std::fprintf(stderr, "stream_pingpong_bench: a stream op failed: %s (%s)\n", ufab_wc_status_str(info.wc_status),
                     why);
        std::exit(1);
      }
      ufab_stream_op_free(op);
    }
    ops.clear();
  }
  return total_ns / iters / 1000.0;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Row {
  std::string provider;
  size_t bytes;
  double stream_us, cpu_us;
};

}  // namespace

int main(int argc, char** argv) {
  int iters = 2000, runs = 5;
  std::string which = "both";
  bool progress_thread = false;
  const char* json_path = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) {
      iters = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--runs") && i + 1 < argc) {
      runs = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--provider") && i + 1 < argc) {
      which = argv[++i];
    } else if (!std::strcmp(argv[i], "--progress-thread")) {
      progress_thread = true;
    } else if (!std::strcmp(argv[i], "--json") && i + 1 < argc) {
      json_path = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--iters N] [--runs R] [--provider swnic|shm|both] [--progress-thread] [--json FILE]\n", argv[0]);
      return 2;
    }
  }
  Gpu g;
  if (std::string why = g.open(); !why.empty()) {
    std::printf("stream_pingpong_bench: no GPU: %s\n", why.c_str());
    return 2;
  }
  auto gate_mem = Allocation::allocate(*g.d, 0, Allocation::Kind::kPinnedHost, 64);
  CHECK_OK(gate_mem);
  auto* gate = static_cast<uint32_t*>(gate_mem->data());
  void* sa = *g.d->stream_create();
  void* sb = *g.d->stream_create();
  std::vector<Row> rows;
  std::vector<std::string> providers = which == "both" ? std::vector<std::string>{"swnic", "shm"}
                                                       : std::vector<std::string>{which};
  int tag = 0;
  for (const auto& prov : providers) {
    for (size_t len : {size_t{8}, size_t{4096}}) {
      QpPair p;
      if (std::string why = p.open(*g.d, prov, "b" + std::to_string(++tag), 1 << 16, 256, progress_thread); !why.empty()) {
        std::fprintf(stderr, "stream_pingpong_bench: %s: %s\n", prov.c_str(), why.c_str());
        return 1;
      }
      // Warm up both paths (the watcher thread, the kernels, the links).
      (void)stream_ordered(g, p, sa, sb, gate, len, 200);
      (void)cpu_driven(g, p, sa, sb, len, 200);
      std::vector<double> st, cpu;
      for (int r = 0; r < runs; ++r) {  // interleaved, so drift hits both
        st.push_back(stream_ordered(g, p, sa, sb, gate, len, iters));
        cpu.push_back(cpu_driven(g, p, sa, sb, len, iters));
      }
      rows.push_back({prov, len, median(st), median(cpu)});
    }
  }
  auto info = g.d->device(0);
  std::string gpu_name = info ? info->name : "?";
  std::printf("stream-ordered ping-pong vs CPU-driven loop on %s; us per round trip (kernel -> WRITE_WITH_IMM -> "
              "peer kernel -> WRITE_WITH_IMM back), median of %d runs of %d; swnic progress threads: %s\n",
              gpu_name.c_str(), runs, iters, progress_thread ? "on" : "off");
  std::printf("%-8s %8s %12s %12s %10s\n", "provider", "bytes", "stream_us", "cpu_us", "ratio");
  for (const Row& r : rows) {
    std::printf("%-8s %8zu %12.2f %12.2f %10.3f\n", r.provider.c_str(), r.bytes, r.stream_us, r.cpu_us,
                r.stream_us / r.cpu_us);
  }
  if (json_path) {
    ufab::JsonWriter w;
    w.begin_object().field("bench", "stream_pingpong").field("gpu", gpu_name);
    w.field("iters", static_cast<int64_t>(iters)).field("runs", static_cast<int64_t>(runs));
    w.field("progress_thread", progress_thread).key("rows").begin_array();
    for (const Row& r : rows) {
      w.begin_object().field("provider", r.provider).field("bytes", static_cast<int64_t>(r.bytes));
      w.field("stream_us", r.stream_us).field("cpu_us", r.cpu_us).field("ratio", r.stream_us / r.cpu_us).end_object();
    }
    w.end_array().end_object();
    if (FILE* f = std::fopen(json_path, "w")) {
      std::fprintf(f, "%s\n", w.str().c_str());
      std::fclose(f);
    }
  }
  g.d->stream_destroy(sa);
  g.d->stream_destroy(sb);
  return 0;
}
