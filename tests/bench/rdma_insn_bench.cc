// Soft-RoCE's cost per message, counted in instructions: one thread drives
// both ends (two ports of one software NIC in this process, through the
// public C++ API), so the count does not depend on scheduling. Meant to run
// under `valgrind --tool=callgrind --instr-atstart=no
// --toggle-collect=insn_measured`;
// tests/bench/rdma_insn.sh does that and prints the table.
//
//   rdma_insn_bench --op write|send [--batch B] [--n N] [--warmup W]
//
// write: N 64-byte RDMA WRITEs from side A into side B's region.
// send:  N 8-byte inline SENDs from A; B posts one receive per message and
//        polls its completion.
// Work goes in batches of B messages (each its own post_send, the batch's
// last one signaled), then both sides are driven until the batch completes.
// Every call a side makes goes through one of the insn_a_* / insn_b_*
// functions below, so callgrind's inclusive cost of those is that side's
// cost. Without valgrind it just runs (and prints the transport counters,
// which must show no retransmission for a count to be meaningful).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ufab/rdma.hpp"

// Callgrind's client requests, where valgrind's headers are installed:
// instrumentation (instructions and call counts) only around the measured
// part. Without them the script's --toggle-collect still limits the
// instruction count, but call counts would include the warm-up.
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define INSN_START() CALLGRIND_START_INSTRUMENTATION
#define INSN_STOP() CALLGRIND_STOP_INSTRUMENTATION
#else
#define INSN_START() ((void)0)
#define INSN_STOP() ((void)0)
#endif

using namespace ufab;
using namespace ufab::rdma;

namespace {

struct End {
  std::unique_ptr<Device> dev;
  std::optional<ProtectionDomain> pd;
  std::unique_ptr<CompletionQueue> cq;
  std::unique_ptr<QueuePair> qp;
  std::vector<uint8_t> buf;
  std::optional<MemoryRegion> mr;
};

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "rdma_insn_bench: %s\n", what.c_str());
  std::exit(1);
}

template <typename T>
T must(Result<T> r, const char* what) {
  if (!r) die(std::string(what) + ": " + r.error().message());
  return std::move(*r);
}

void open_end(End& e, const std::string& spec, const std::string& ip, std::map<std::string, std::string> params) {
  e.dev = must(Device::open(spec, {.ip = ip, .params = params}), "open");
  e.pd.emplace(must(e.dev->alloc_pd(), "pd"));
  e.cq = must(e.dev->create_cq(1024), "cq");
  e.qp = must(e.pd->create_qp({.type = QpType::kRc, .send_cq = e.cq.get(), .recv_cq = e.cq.get(),
                               .caps = {.max_send_wr = 256, .max_recv_wr = 256, .max_inline_data = 64}}),
              "qp");
  e.buf.assign(1 << 16, 1);
  e.mr.emplace(must(e.pd->register_mr(e.buf.data(), e.buf.size(), kLocalWrite | kRemoteAccess), "mr"));
}

struct Bench {
  End a, b;
  bool send = false;
  uint32_t batch = 16;
  Sge src{};
  Sge dst{};
  uint64_t remote = 0;
  uint64_t posted = 0;
};

Bench* g = nullptr;

}  // namespace

// The two sides' entry points (extern "C", never inlined: callgrind names
// them as they are here).
#define NOINLINE __attribute__((noinline))
extern "C" {

NOINLINE void insn_a_post(uint64_t i, bool signaled) {
  SendWr wr{.wr_id = i, .opcode = g->send ? WrOpcode::kSend : WrOpcode::kRdmaWrite,
            .flags = (signaled ? kSendSignaled : 0u) | (g->send ? kSendInline : 0u), .sgl = {&g->src, 1}};
  if (!g->send) {
    wr.remote_addr = g->remote;
    wr.rkey = g->b.mr->rkey();
  }
  if (auto s = g->a.qp->post_send(wr); !s) die("post_send: " + s.error().message());
}

// Polls A's CQ (which drives A's progress when empty); true when the
// batch's signaled completion arrived.
NOINLINE bool insn_a_poll() {
  WorkCompletion wc[16];
  size_t n = must(g->a.cq->poll(wc), "poll A");
  bool done = false;
  for (size_t i = 0; i < n; ++i) {
    if (wc[i].status != WcStatus::kSuccess) die("A: completion failed: " + wc[i].error);
    done = true;
  }
  return done;
}

NOINLINE void insn_b_post_recv(uint64_t i) {
  Sge r = g->dst;
  if (auto s = g->b.qp->post_recv({.wr_id = i, .sgl = {&r, 1}}); !s) die("post_recv: " + s.error().message());
}

// B's side of a round: its progress, and for SENDs its receive completions.
NOINLINE size_t insn_b_round() {
  if (!g->send) {
    g->b.dev->progress();
    return 0;
  }
  WorkCompletion wc[16];
  size_t n = must(g->b.cq->poll(wc), "poll B");
  for (size_t i = 0; i < n; ++i) {
    if (wc[i].status != WcStatus::kSuccess || wc[i].byte_len != 8) die("B: receive failed: " + wc[i].error);
  }
  return n;
}

NOINLINE void insn_run(uint64_t messages) {
  for (uint64_t done = 0; done < messages; done += g->batch) {
    if (g->send) {
      for (uint32_t k = 0; k < g->batch; ++k) insn_b_post_recv(g->posted + k);
    }
    for (uint32_t k = 0; k < g->batch; ++k) insn_a_post(g->posted + k, k + 1 == g->batch);
    g->posted += g->batch;
    size_t received = 0;
    bool completed = false;
    for (uint64_t rounds = 0; !completed || (g->send && received < g->batch); ++rounds) {
      if (rounds > 1000000) die("a batch did not complete in 10^6 rounds");
      received += insn_b_round();
      if (!completed) completed = insn_a_poll();
    }
  }
}

// The measured part: callgrind collects only inside this function.
NOINLINE void insn_measured(uint64_t messages) { insn_run(messages); }

}  // extern "C"

int main(int argc, char** argv) {
  std::string op = "write";
  uint64_t n = 20000, warmup = 2000;
  uint32_t batch = 16;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) die("missing value after " + a);
      return argv[++i];
    };
    if (a == "--op") {
      op = next();
    } else if (a == "--n") {
      n = std::stoull(next());
    } else if (a == "--warmup") {
      warmup = std::stoull(next());
    } else if (a == "--batch") {
      batch = static_cast<uint32_t>(std::stoul(next()));
    } else {
      std::fprintf(stderr, "usage: %s --op write|send [--batch B] [--n N] [--warmup W]\n", argv[0]);
      return 2;
    }
  }
  if (op != "write" && op != "send") die("--op is write or send");
  if (batch == 0 || batch > 16) die("--batch is 1..16");
  if (n % batch != 0 || warmup % batch != 0) die("--n and --warmup must be multiples of --batch");

  Bench bench;
  g = &bench;
  bench.send = op == "send";
  bench.batch = batch;
  std::string name = "insn" + std::to_string(::getpid());
  open_end(bench.a, "swnic:" + name + ":0", "10.0.0.1", {{"stale", "reset"}});
  open_end(bench.b, "swnic:" + name + ":1", "10.0.0.2", {});
  // A long ACK timeout (timeout 20: about 4 s): under valgrind a batch takes
  // far longer than natively, and a retransmission would distort the count.
  QpAttr tuning;
  tuning.timeout = 20;
  if (!bench.a.qp->connect(bench.b.qp->local(), tuning) || !bench.b.qp->connect(bench.a.qp->local(), tuning)) {
    die("connect");
  }
  bench.src = bench.a.mr->sge(0, bench.send ? 8 : 64);
  bench.dst = bench.b.mr->sge(4096, 64);
  bench.remote = reinterpret_cast<uint64_t>(bench.b.buf.data());

  insn_run(warmup);
  INSN_START();  // before the call, so callgrind sees insn_measured entered
  insn_measured(n);
  INSN_STOP();

  auto sa = bench.a.dev->stats();
  auto sb = bench.b.dev->stats();
  std::printf("op %s batch %u messages %lu (+%lu warm-up)\n", op.c_str(), batch, static_cast<unsigned long>(n),
              static_cast<unsigned long>(warmup));
  std::printf("A: tx %lu rx %lu retransmits %lu timeouts %lu naks %lu\n", static_cast<unsigned long>(sa.tx_frames),
              static_cast<unsigned long>(sa.rx_frames), static_cast<unsigned long>(sa.retransmits),
              static_cast<unsigned long>(sa.timeouts), static_cast<unsigned long>(sa.naks_received));
  std::printf("B: tx %lu rx %lu duplicates %lu naks %lu rnr %lu\n", static_cast<unsigned long>(sb.tx_frames),
              static_cast<unsigned long>(sb.rx_frames), static_cast<unsigned long>(sb.duplicates),
              static_cast<unsigned long>(sb.naks_sent), static_cast<unsigned long>(sb.rnr_naks_sent));
  if (sa.retransmits || sa.timeouts || sa.naks_received || sb.naks_sent || sb.rnr_naks_sent) {
    std::printf("WARNING: retransmissions or NAKs: the count is not of the clean path\n");
    return 3;
  }
  return 0;
}
