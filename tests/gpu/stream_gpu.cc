// Stream-ordered operations on a GPU (issue 12; <ufab/stream.h>,
// docs/gpu.md), two soft-RoCE ports of one swnic link in this process, the
// buffers in pinned host memory that the kernels write and read:
//
//   test:    a kernel fills a buffer -> a stream-ordered WRITE_WITH_IMM ->
//            on the other side a stream-ordered wait for its receive -> a
//            kernel verifies every byte (1 B, 4 KiB, 1 MiB - 3).
//            Once with each wait mode (UFAB_STREAM_WAIT_MEMOP, the
//            default, and UFAB_STREAM_WAIT_KERNEL), and once
//            device-initiated (the filling kernel rings the doorbell, the
//            verifying kernel waits for the receive).
//   --bench: a ping-pong of such rounds (kernel, WRITE_WITH_IMM, the peer's
//            stream waits, verifies, fills and answers) against the
//            CPU-driven loop (launch, cuStreamSynchronize, post, poll,
//            launch) at 8 B and 4 KiB (--sizes): round-trip time each way, a
//            table, and JSON with --json FILE. The stream-ordered loop runs
//            with the engine's default waits (cuStreamWaitValue32) and
//            again with the polling kernel's (a third column).
//            And device-initiated (a fourth column): the kernels ring the
//            WRITE's doorbell and wait for the receive themselves
//            (<ufab/stream_device.cuh>), no stream memory operation
//            between them; the same fill and verify work.
//   --release-test: destroying the engine releases a stream whose wait
//            kernel polls for a ticket never completed (the GPU suite runs
//            it; a separate run, since a failure leaves a kernel spinning).
//
// Exit 0 when every check passed. Without a GPU: "no GPU: ..." and exit 1
// (this is the GPU suite's program; tests/unit/stream tests the engine
// without one).
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ufab/rdma.hpp"
#include "ufab/stream.h"

#if UFAB_HAVE_CUDA_TOOLKIT
#include <cuda.h>

#include "tests/gpu/kernels/stream_kernels_ptx.h"

namespace {

using Clock = std::chrono::steady_clock;

#define CU_FN(name) decltype(&::name) name##_ = nullptr
struct Cu {
  CU_FN(cuInit);
  CU_FN(cuDeviceGet);
  CU_FN(cuDevicePrimaryCtxRetain);
  CU_FN(cuCtxSetCurrent);
  CU_FN(cuModuleLoadData);
  CU_FN(cuModuleGetFunction);
  CU_FN(cuLaunchKernel);
  CU_FN(cuStreamCreate);
  CU_FN(cuStreamSynchronize);
  CU_FN(cuStreamQuery);
  CU_FN(cuMemHostAlloc);
  CU_FN(cuMemHostGetDevicePointer);
  CU_FN(cuMemAlloc);
  CU_FN(cuMemsetD32);
  CU_FN(cuGetErrorString);
};
Cu cu;

bool load_cuda(std::string& why) {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (h == nullptr) {
    why = dlerror();
    return false;
  }
  using GetProc = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
  auto get = reinterpret_cast<GetProc>(dlsym(h, "cuGetProcAddress_v2"));
  if (get == nullptr) {
    why = "libcuda.so.1 has no cuGetProcAddress_v2 (a driver older than CUDA 12)";
    return false;
  }
  bool ok = true;
  auto one = [&](const char* name, void** fn) {
    CUdriverProcAddressQueryResult st{};
    if (get(name, fn, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &st) != CUDA_SUCCESS || *fn == nullptr) {
      why = std::string("no ") + name;
      ok = false;
    }
  };
#define CU_LOAD(name) one(#name, reinterpret_cast<void**>(&cu.name##_))
  CU_LOAD(cuInit);
  CU_LOAD(cuDeviceGet);
  CU_LOAD(cuDevicePrimaryCtxRetain);
  CU_LOAD(cuCtxSetCurrent);
  CU_LOAD(cuModuleLoadData);
  CU_LOAD(cuModuleGetFunction);
  CU_LOAD(cuLaunchKernel);
  CU_LOAD(cuStreamCreate);
  CU_LOAD(cuStreamSynchronize);
  CU_LOAD(cuStreamQuery);
  CU_LOAD(cuMemHostAlloc);
  CU_LOAD(cuMemHostGetDevicePointer);
  CU_LOAD(cuMemAlloc);
  CU_LOAD(cuMemsetD32);
  CU_LOAD(cuGetErrorString);
  return ok;
}

int failures = 0;
#define CHECK(cond, ...)                         \
  do {                                           \
    if (!(cond)) {                               \
      std::printf("FAIL %s: ", #cond);           \
      std::printf(__VA_ARGS__);                  \
      std::printf("\n");                         \
      ++failures;                                \
    }                                            \
  } while (0)
#define CU_OK(call)                                                                 \
  do {                                                                              \
    CUresult r_ = (call);                                                           \
    if (r_ != CUDA_SUCCESS) {                                                       \
      const char* s_ = nullptr;                                                     \
      cu.cuGetErrorString_(r_, &s_);                                                \
      std::printf("FAIL %s: %s\n", #call, s_ ? s_ : "?");                           \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

constexpr uint32_t kBuf = 1 << 20;

struct Side {
  std::unique_ptr<ufab::rdma::Device> dev;
  std::optional<ufab::rdma::ProtectionDomain> pd;
  std::unique_ptr<ufab::rdma::CompletionQueue> cq;
  std::unique_ptr<ufab::rdma::QueuePair> qp;
  uint8_t* buf = nullptr;  // pinned host memory: [0, kBuf) sent from, [kBuf, 2 kBuf) written into
  CUdeviceptr dbuf = 0;
  uint32_t* bad = nullptr;  // the verifier's count, pinned
  CUdeviceptr dbad = 0;
  std::optional<ufab::rdma::MemoryRegion> mr;
  CUstream stream = nullptr;
  ufab_stream_engine* engine = nullptr;
  CUdeviceptr arrived = 0;  // ufab_fill_ring's counter of blocks done (device memory, zeroed)
  CUdeviceptr seen = 0;     // ufab_verify_after's word for its blocks (device memory, zeroed)
};

CUfunction k_fill, k_verify, k_fill_ring, k_verify_after;

unsigned grid_for(uint32_t n) { return std::min<unsigned>((n + 255) / 256, 1024); }

void launch_fill(Side& s, uint64_t offset, uint32_t n, uint32_t seed) {
  CUdeviceptr p = s.dbuf + offset;
  void* args[] = {&p, &n, &seed};
  CU_OK(cu.cuLaunchKernel_(k_fill, grid_for(n), 1, 1, 256, 1, 1, 0, s.stream, args, nullptr));
}
void launch_verify(Side& s, uint64_t offset, uint32_t n, uint32_t seed) {
  CUdeviceptr p = s.dbuf + offset;
  void* args[] = {&p, &n, &seed, &s.dbad};
  CU_OK(cu.cuLaunchKernel_(k_verify, grid_for(n), 1, 1, 256, 1, 1, 0, s.stream, args, nullptr));
}
// Device-initiated: the filling kernel rings the doorbell of `send` (a
// ticket of ufab_stream_post_send_device) once every block has written.
void launch_fill_ring(Side& s, uint64_t offset, uint32_t n, uint32_t seed, uint64_t doorbell, uint32_t value) {
  CUdeviceptr p = s.dbuf + offset;
  unsigned long long db = doorbell;
  void* args[] = {&p, &n, &seed, &s.arrived, &db, &value};
  CU_OK(cu.cuLaunchKernel_(k_fill_ring, grid_for(n), 1, 1, 256, 1, 1, 0, s.stream, args, nullptr));
}
// ... and the verifying kernel waits for a ticket's completion word itself.
void launch_verify_after(Side& s, uint64_t offset, uint32_t n, uint32_t seed, uint64_t ticket) {
  uint64_t word = 0;
  uint32_t value = 0;
  if (ufab_stream_wait_word(s.engine, ticket, &word, &value) != 0) {
    std::printf("FAIL ufab_stream_wait_word: %s\n", ufab_last_error());
    std::exit(1);
  }
  CUdeviceptr p = s.dbuf + offset;
  unsigned long long w = word;
  void* args[] = {&p, &n, &seed, &s.dbad, &w, &value, &s.seen};
  CU_OK(cu.cuLaunchKernel_(k_verify_after, grid_for(n), 1, 1, 256, 1, 1, 0, s.stream, args, nullptr));
}

void open_side(Side& s, const std::string& spec, const std::string& ip, uint32_t recv_depth, bool first) {
  std::map<std::string, std::string> params;
  if (first) params["stale"] = "reset";  // a leftover segment of an earlier run; never the peer's
  // No progress thread: the pollers drive progress (the engines' proxies,
  // or the CPU-driven loop's threads), as a latency-minded application does.
  auto dev = ufab::rdma::Device::open(spec, {.ip = ip, .params = params, .progress_thread = false});
  if (!dev) {
    std::printf("FAIL opening %s: %s\n", spec.c_str(), dev.error().message().c_str());
    std::exit(1);
  }
  s.dev = std::move(*dev);
  s.pd.emplace(std::move(*s.dev->alloc_pd()));
  s.cq = std::move(*s.dev->create_cq(2 * recv_depth + 64));
  auto qp = s.pd->create_qp({.type = ufab::rdma::QpType::kRc, .send_cq = s.cq.get(), .recv_cq = s.cq.get(),
                             .caps = {.max_send_wr = 256, .max_recv_wr = recv_depth, .max_send_sge = 1,
                                      .max_recv_sge = 1, .max_inline_data = 0}});
  if (!qp) {
    std::printf("FAIL creating a QP: %s\n", qp.error().message().c_str());
    std::exit(1);
  }
  s.qp = std::move(*qp);
  void* p = nullptr;
  CU_OK(cu.cuMemHostAlloc_(&p, 2 * kBuf + 64, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
  s.buf = static_cast<uint8_t*>(p);
  std::memset(s.buf, 0, 2 * kBuf + 64);
  CU_OK(cu.cuMemHostGetDevicePointer_(&s.dbuf, p, 0));
  s.bad = reinterpret_cast<uint32_t*>(s.buf + 2 * kBuf);
  s.dbad = s.dbuf + 2 * kBuf;
  auto mr = s.pd->register_mr(s.buf, 2 * kBuf, ufab::rdma::kLocalWrite | ufab::rdma::kRemoteAccess);
  if (!mr) {
    std::printf("FAIL registering pinned memory: %s\n", mr.error().message().c_str());
    std::exit(1);
  }
  s.mr.emplace(std::move(*mr));
  CU_OK(cu.cuStreamCreate_(&s.stream, CU_STREAM_NON_BLOCKING));
  CU_OK(cu.cuMemAlloc_(&s.arrived, 2 * sizeof(uint32_t)));
  CU_OK(cu.cuMemsetD32_(s.arrived, 0, 2));
  s.seen = s.arrived + sizeof(uint32_t);
}

ufab_send_wr write_imm(Side& from, Side& to, ufab_sge* g, uint32_t n, uint32_t imm) {
  *g = {.addr = reinterpret_cast<uintptr_t>(from.buf), .length = n, .lkey = from.mr->lkey()};
  ufab_send_wr w{};
  w.wr_id = imm;
  w.sg_list = g;
  w.num_sge = 1;
  w.opcode = UFAB_WR_RDMA_WRITE_WITH_IMM;
  w.imm_data = imm;
  w.remote_addr = reinterpret_cast<uintptr_t>(to.buf) + kBuf;
  w.rkey = to.mr->rkey();
  return w;
}

uint64_t stream_recv(Side& s) {
  ufab_recv_wr r{.wr_id = 0, .sg_list = nullptr, .num_sge = 0, .reserved = 0};
  uint64_t t = 0;
  if (int rc = ufab_stream_post_recv(s.engine, s.qp->c(), &r, &t); rc != 0) {
    std::printf("FAIL ufab_stream_post_recv: %s\n", ufab_last_error());
    std::exit(1);
  }
  return t;
}
uint64_t stream_send(Side& s, const ufab_send_wr& w) {
  uint64_t t = 0;
  if (int rc = ufab_stream_post_send(s.engine, s.qp->c(), &w, 1, s.stream, &t); rc != 0) {
    std::printf("FAIL ufab_stream_post_send: %s\n", ufab_last_error());
    std::exit(1);
  }
  return t;
}
// A WRITE whose doorbell a kernel rings: its ticket, doorbell and value.
struct DeviceSend {
  uint64_t ticket, doorbell;
  uint32_t value;
};
DeviceSend device_send(Side& s, const ufab_send_wr& w) {
  DeviceSend d{};
  if (ufab_stream_post_send_device(s.engine, s.qp->c(), &w, 1, &d.ticket, &d.doorbell, &d.value) != 0) {
    std::printf("FAIL ufab_stream_post_send_device: %s\n", ufab_last_error());
    std::exit(1);
  }
  return d;
}
void stream_wait(Side& s, uint64_t t) {
  if (int rc = ufab_stream_wait(s.engine, t, s.stream); rc != 0) {
    std::printf("FAIL ufab_stream_wait: %s\n", ufab_last_error());
    std::exit(1);
  }
}

// One round trip, stream-ordered: A fills and writes to B; B's stream waits
// for it, verifies, fills its answer and writes back; A's stream waits.
void stream_round(Side& a, Side& b, uint32_t n, uint32_t i, ufab_sge* ga, ufab_sge* gb) {
  uint64_t tb = stream_recv(b);
  uint64_t ta = stream_recv(a);
  launch_fill(a, 0, n, i);
  stream_send(a, write_imm(a, b, ga, n, i));
  stream_wait(b, tb);
  launch_verify(b, kBuf, n, i);
  launch_fill(b, 0, n, i + 1);
  stream_send(b, write_imm(b, a, gb, n, i));
  stream_wait(a, ta);
  launch_verify(a, kBuf, n, i + 1);
}

// The same round, device-initiated: the kernels ring and wait themselves.
void device_round(Side& a, Side& b, uint32_t n, uint32_t i, ufab_sge* ga, ufab_sge* gb) {
  uint64_t tb = stream_recv(b);
  uint64_t ta = stream_recv(a);
  DeviceSend sa = device_send(a, write_imm(a, b, ga, n, i));
  launch_fill_ring(a, 0, n, i, sa.doorbell, sa.value);
  launch_verify_after(b, kBuf, n, i, tb);
  DeviceSend sb = device_send(b, write_imm(b, a, gb, n, i));
  launch_fill_ring(b, 0, n, i + 1, sb.doorbell, sb.value);
  launch_verify_after(a, kBuf, n, i + 1, ta);
}

// The CPU-driven loop: each side's thread launches, synchronizes, posts,
// polls.
void cpu_side(Side& me, Side& peer, uint32_t n, uint32_t rounds, bool first) {
  ufab_sge g{};
  auto wait_recv = [&] {
    auto deadline = Clock::now() + std::chrono::seconds(10);
    ufab_wc wc[4];
    for (;;) {
      int k = ufab_cq_poll(me.cq->get_c(), wc, 4);
      for (int j = 0; j < k; ++j) {
        if (wc[j].status != UFAB_WC_SUCCESS) ++failures;
        if (wc[j].opcode == UFAB_WC_RECV_RDMA_WITH_IMM) return;
      }
      if (Clock::now() > deadline) {
        std::printf("FAIL CPU-driven loop: no message within 10 s\n");
        std::exit(1);
      }
    }
  };
  auto post_recv = [&] {
    ufab_recv_wr r{.wr_id = 0, .sg_list = nullptr, .num_sge = 0, .reserved = 0};
    ufab_post_recv(me.qp->c(), &r, 1, nullptr);
  };
  for (uint32_t i = 0; i < rounds; ++i) {
    post_recv();
    if (!first) {
      wait_recv();
      launch_verify(me, kBuf, n, i);
    }
    launch_fill(me, 0, n, first ? i : i + 1);
    CU_OK(cu.cuStreamSynchronize_(me.stream));
    ufab_send_wr w = write_imm(me, peer, &g, n, i);
    w.send_flags = UFAB_SEND_SIGNALED;
    if (ufab_post_send(me.qp->c(), &w, 1, nullptr) != 0) {
      std::printf("FAIL CPU-driven post: %s\n", ufab_last_error());
      std::exit(1);
    }
    if (first) {
      wait_recv();
      launch_verify(me, kBuf, n, i + 1);
    }
  }
  CU_OK(cu.cuStreamSynchronize_(me.stream));
}

}  // namespace

int main(int argc, char** argv) {
  // Line by line, so a run cut off by a timeout still shows how far it got.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  bool bench = false, release_test = false;
  const char* json = nullptr;
  uint32_t rounds = 1000;
  std::vector<uint32_t> sizes = {8, 4096};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--bench") bench = true;
    else if (a == "--release-test") release_test = true;
    else if (a == "--json" && i + 1 < argc) json = argv[++i];
    else if (a == "--rounds" && i + 1 < argc) rounds = uint32_t(std::stoul(argv[++i]));
    else if (a == "--sizes" && i + 1 < argc) {
      sizes.clear();
      for (std::string v = argv[++i]; !v.empty();) {
        size_t c = v.find(',');
        sizes.push_back(uint32_t(std::stoul(v.substr(0, c))));
        v = c == std::string::npos ? "" : v.substr(c + 1);
      }
      if (std::any_of(sizes.begin(), sizes.end(), [](uint32_t n) { return n == 0 || n > kBuf; })) {
        std::fprintf(stderr, "stream_gpu: --sizes takes sizes from 1 to %u bytes\n", kBuf);
        return 2;
      }
    }
    else {
      std::fprintf(stderr, "usage: stream_gpu [--bench [--rounds N] [--sizes N,N,...] [--json FILE]] [--release-test]\n");
      return 2;
    }
  }
  std::string why;
  if (!load_cuda(why)) {
    std::printf("no GPU: %s\n", why.c_str());
    return 1;
  }
  if (cu.cuInit_(0) != CUDA_SUCCESS) {
    std::printf("no GPU: cuInit failed\n");
    return 1;
  }
  CUdevice dev;
  CUcontext ctx;
  CU_OK(cu.cuDeviceGet_(&dev, 0));
  CU_OK(cu.cuDevicePrimaryCtxRetain_(&ctx, dev));
  CU_OK(cu.cuCtxSetCurrent_(ctx));
  CUmodule mod;
  CU_OK(cu.cuModuleLoadData_(&mod, kStreamKernelsPtx));
  CU_OK(cu.cuModuleGetFunction_(&k_fill, mod, "ufab_fill"));
  CU_OK(cu.cuModuleGetFunction_(&k_verify, mod, "ufab_verify"));
  CU_OK(cu.cuModuleGetFunction_(&k_fill_ring, mod, "ufab_fill_ring"));
  CU_OK(cu.cuModuleGetFunction_(&k_verify_after, mod, "ufab_verify_after"));

  Side a, b;
  std::string link = "sg" + std::to_string(::getpid());
  const uint32_t depth = 2 * rounds + 64;
  open_side(a, "swnic:" + link + ":0", "10.0.0.1", depth, true);
  open_side(b, "swnic:" + link + ":1", "10.0.0.2", depth, false);
  if (!a.qp->connect(b.qp->local()) || !b.qp->connect(a.qp->local())) {
    std::printf("FAIL connecting the QPs\n");
    return 1;
  }
  struct Row {
    uint32_t size;
    double stream_us, cpu_us, kernel_us, device_us;
  };
  std::vector<Row> rows;
  if (bench) {
    // The CPU-driven loop first (the engines own the CQs once created).
    for (uint32_t n : sizes) {
      *a.bad = *b.bad = 0;
      auto t0 = Clock::now();
      std::thread tb([&] { cpu_side(b, a, n, rounds, false); });
      cpu_side(a, b, n, rounds, true);
      tb.join();
      double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / rounds;
      CHECK(*a.bad == 0 && *b.bad == 0, "CPU-driven %u B: %u / %u bytes differ", n, *a.bad, *b.bad);
      rows.push_back({n, 0, us, 0, 0});
    }
  }
  if (ufab_stream_engine_create(a.cq->get_c(), 0, 4 * rounds + 64, &a.engine) != 0 ||
      ufab_stream_engine_create(b.cq->get_c(), 0, 4 * rounds + 64, &b.engine) != 0) {
    std::printf("FAIL ufab_stream_engine_create: %s\n", ufab_last_error());
    return 1;
  }
  // Waits are cuStreamWaitValue32 by default; the polling kernel loads
  // on every GPU this runs on (sm_70 on); no other mode exists.
  CHECK(ufab_stream_engine_wait_mode(a.engine) == UFAB_STREAM_WAIT_MEMOP,
        "the default wait mode is %d, not the memory operation", ufab_stream_engine_wait_mode(a.engine));
  CHECK(ufab_stream_engine_set_wait(a.engine, 7) == -EINVAL, "wait mode 7 was not refused");
  auto set_wait = [&](int mode) {
    if (ufab_stream_engine_set_wait(a.engine, mode) != 0 || ufab_stream_engine_set_wait(b.engine, mode) != 0) {
      std::printf("FAIL ufab_stream_engine_set_wait(%d): %s\n", mode, ufab_last_error());
      std::exit(1);
    }
  };
  const char* const kModeName[] = {"kernel", "memop"};
  static_assert(UFAB_STREAM_WAIT_KERNEL == 0 && UFAB_STREAM_WAIT_MEMOP == 1);
  ufab_sge ga{}, gb{};
  // The test: a kernel's bytes, a stream-ordered WRITE_WITH_IMM, a stream-
  // ordered wait for it on the other side, a kernel verifying every byte;
  // with each wait mode.
  for (int mode : {UFAB_STREAM_WAIT_MEMOP, UFAB_STREAM_WAIT_KERNEL}) {
    set_wait(mode);
    for (uint32_t n : {1u, 4096u, kBuf - 3}) {
      *b.bad = 0;
      std::memset(b.buf + kBuf, 0, kBuf);
      uint64_t tb = stream_recv(b);
      launch_fill(a, 0, n, n);
      uint64_t ta = stream_send(a, write_imm(a, b, &ga, n, n));
      stream_wait(b, tb);
      launch_verify(b, kBuf, n, n);
      CU_OK(cu.cuStreamSynchronize_(b.stream));
      CU_OK(cu.cuStreamSynchronize_(a.stream));
      CHECK(*b.bad == 0, "%u B: the verifying kernel found %u bytes that differ", n, *b.bad);
      CHECK(b.buf[kBuf + n - 1] == uint8_t((n - 1) * 13 + n), "%u B: the last byte did not land before the wait", n);
      CHECK(ufab_stream_ticket_status(b.engine, tb) == 1, "%u B: the receive ticket is not complete", n);
      auto deadline = Clock::now() + std::chrono::seconds(5);
      while (ufab_stream_ticket_status(a.engine, ta) == 0 && Clock::now() < deadline) std::this_thread::yield();
      CHECK(ufab_stream_ticket_status(a.engine, ta) == 1, "%u B: the WRITE's ticket is not complete", n);
      if (*b.bad == 0) {
        std::printf("PASS kernel -> stream-ordered WRITE_WITH_IMM -> stream wait (%s) -> kernel verify, %u B\n",
                    kModeName[mode], n);
      }
    }
  }
  // Device-initiated: the filling kernel rings the WRITE's doorbell, the
  // verifying kernel on the other side waits for the receive itself.
  for (uint32_t n : {1u, 4096u, kBuf - 3}) {
    *b.bad = 0;
    std::memset(b.buf + kBuf, 0, kBuf);
    uint64_t tb = stream_recv(b);
    DeviceSend sa = device_send(a, write_imm(a, b, &ga, n, n + 7));
    launch_verify_after(b, kBuf, n, n + 7, tb);  // enqueued first: it waits on the GPU
    launch_fill_ring(a, 0, n, n + 7, sa.doorbell, sa.value);
    CU_OK(cu.cuStreamSynchronize_(b.stream));
    CU_OK(cu.cuStreamSynchronize_(a.stream));
    CHECK(*b.bad == 0, "device-initiated %u B: the verifying kernel found %u bytes that differ", n, *b.bad);
    CHECK(b.buf[kBuf + n - 1] == uint8_t((n - 1) * 13 + n + 7), "device-initiated %u B: the last byte did not land", n);
    CHECK(ufab_stream_ticket_status(b.engine, tb) == 1, "device-initiated %u B: the receive ticket is not complete", n);
    auto deadline = Clock::now() + std::chrono::seconds(5);
    while (ufab_stream_ticket_status(a.engine, sa.ticket) == 0 && Clock::now() < deadline) std::this_thread::yield();
    CHECK(ufab_stream_ticket_status(a.engine, sa.ticket) == 1, "device-initiated %u B: the WRITE's ticket is not complete", n);
    if (*b.bad == 0) std::printf("PASS kernel rings -> WRITE_WITH_IMM -> kernel waits, verifies, %u B\n", n);
  }
  if (bench) {
    for (int mode : {UFAB_STREAM_WAIT_MEMOP, UFAB_STREAM_WAIT_KERNEL}) {
      set_wait(mode);
      for (auto& row : rows) {
        *a.bad = *b.bad = 0;
        auto t0 = Clock::now();
        for (uint32_t i = 0; i < rounds; ++i) stream_round(a, b, row.size, i, &ga, &gb);
        CU_OK(cu.cuStreamSynchronize_(a.stream));
        CU_OK(cu.cuStreamSynchronize_(b.stream));
        double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / rounds;
        (mode == UFAB_STREAM_WAIT_MEMOP ? row.stream_us : row.kernel_us) = us;
        CHECK(*a.bad == 0 && *b.bad == 0, "stream-ordered (%s waits) %u B: %u / %u bytes differ", kModeName[mode],
              row.size, *a.bad, *b.bad);
        // Drain the engines' completions (the application's view).
        ufab_wc wc[64];
        while (ufab_stream_engine_poll(a.engine, wc, 64) > 0 || ufab_stream_engine_poll(b.engine, wc, 64) > 0) {
        }
      }
    }
    for (auto& row : rows) {
      *a.bad = *b.bad = 0;
      auto t0 = Clock::now();
      for (uint32_t i = 0; i < rounds; ++i) device_round(a, b, row.size, i, &ga, &gb);
      CU_OK(cu.cuStreamSynchronize_(a.stream));
      CU_OK(cu.cuStreamSynchronize_(b.stream));
      row.device_us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / rounds;
      CHECK(*a.bad == 0 && *b.bad == 0, "device-initiated %u B: %u / %u bytes differ", row.size, *a.bad, *b.bad);
      ufab_wc wc[64];
      while (ufab_stream_engine_poll(a.engine, wc, 64) > 0 || ufab_stream_engine_poll(b.engine, wc, 64) > 0) {
      }
    }
    std::printf("stream-ordered ping-pong vs CPU-driven loop, %u rounds, round trip [us]\n", rounds);
    std::printf("%8s %16s %16s %10s %16s %10s %16s %10s\n", "bytes", "stream-ordered", "CPU-driven", "ratio",
                "kernel waits", "ratio", "device-initiated", "ratio");
    for (const auto& r : rows) {
      std::printf("%8u %16.2f %16.2f %10.3f %16.2f %10.3f %16.2f %10.3f\n", r.size, r.stream_us, r.cpu_us,
                  r.stream_us / r.cpu_us, r.kernel_us, r.kernel_us / r.cpu_us, r.device_us, r.device_us / r.cpu_us);
    }
    if (json != nullptr) {
      FILE* f = std::fopen(json, "w");
      if (f != nullptr) {
        std::fprintf(f, "{\"benchmark\":\"stream_ordered_pingpong\",\"rounds\":%u,\"unit\":\"round trip us\","
                        "\"goal\":\"stream-ordered below CPU-driven at 8 B and 4 KiB\",\"results\":[", rounds);
        for (size_t k = 0; k < rows.size(); ++k) {
          std::fprintf(f,
                       "%s{\"size\":%u,\"stream_ordered_us\":%.3f,\"cpu_driven_us\":%.3f,"
                       "\"stream_ordered_kernel_wait_us\":%.3f,\"device_initiated_us\":%.3f}",
                       k ? "," : "", rows[k].size, rows[k].stream_us, rows[k].cpu_us, rows[k].kernel_us,
                       rows[k].device_us);
        }
        std::fprintf(f, "]}\n");
        std::fclose(f);
      }
    }
  }
  // --release-test: destroying the engine releases a stream whose wait
  // kernel polls for a ticket that never completes (a receive no one sends
  // to).
  if (!release_test) {
    ufab_stream_engine_destroy(a.engine);
    ufab_stream_engine_destroy(b.engine);
    std::printf("stream_gpu: %s\n", failures == 0 ? "PASSED" : "FAILED");
    return failures == 0 ? 0 : 1;
  }
  std::fflush(stdout);
  set_wait(UFAB_STREAM_WAIT_KERNEL);
  uint64_t never = stream_recv(b);
  stream_wait(b, never);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(cu.cuStreamQuery_(b.stream) == CUDA_ERROR_NOT_READY, "the stream did not wait for a ticket never completed");
  // b first: destroying a (no ticket pending) frees its pinned words, and
  // CUDA frees pinned memory only once the device is idle, which it is not
  // while b's stream waits (docs/gpu.md, "The deadlock to avoid").
  ufab_stream_engine_destroy(b.engine);
  ufab_stream_engine_destroy(a.engine);
  {
    auto deadline = Clock::now() + std::chrono::seconds(5);
    CUresult q;
    while ((q = cu.cuStreamQuery_(b.stream)) == CUDA_ERROR_NOT_READY && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    CHECK(q == CUDA_SUCCESS, "the wait kernel was not released by destroying the engine within 5 s (cuStreamQuery %d)",
          int(q));
    if (q == CUDA_SUCCESS) std::printf("PASS destroying the engine releases a wait kernel\n");
    if (q == CUDA_ERROR_NOT_READY) {
      std::printf("stream_gpu: FAILED (a stream still spins)\n");
      std::fflush(stdout);
      std::_Exit(1);
    }
  }
  std::printf("stream_gpu: %s\n", failures == 0 ? "PASSED" : "FAILED");
  return failures == 0 ? 0 : 1;
}

#else  // no CUDA Toolkit at build time

int main() {
  std::printf("no GPU: this ufab was built without the CUDA Toolkit's headers (cuda.h)\n");
  return 1;
}

#endif
