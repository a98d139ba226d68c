// The shm provider moving GPU memory (docs/gpu.md, "shm"): two processes
// (fork) on one domain, RC SEND/RECV, WRITE, WRITE_WITH_IMM and READ,
// host->GPU, GPU->host, GPU->GPU (and host->host beside them), sizes 1 B
// to 4 MiB + 3 across fragment boundaries (gpu_frag=8192), aligned and
// unaligned offsets, sources and targets split over two SGEs; every byte
// of the target checked and the bytes around it checked untouched; at
// least one copy-engine copy in each process that owns GPU memory of the
// transfer. Completions only after placement (the fake engine holds every
// copy: no WRITE completion, no receive completion, no READ completion
// until it lets go, and the GPU buffer untouched meanwhile), a SEND from
// GPU memory behind an RNR NAK, random copy order with a delay.
//
// Backends: "fake" (gpu_copy=fake: host memory registered as
// UFAB_MEM_CUDA, moved only by the fake copy engine) runs everywhere;
// "cuda" runs the transfers on cuMemAlloc'd memory with the real engine,
// plus a buffer freed under a live region, and skips with "no GPU: <why>"
// without one (tests/gpu/run.sh runs it on the GPU machine). CUDA is
// never initialised in the test's own process: each cuda case runs in a
// forked runner, whose two processes initialise it after their fork.
#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <csignal>

#include "core/gpu/cuda.h"
#include "core/staging/fake_engine.h"
#include "drivers/shm/shm.h"
#include "tests/unit/drivers/shm/pair.h"

namespace ufab::shm_test {
namespace {

constexpr size_t kFrag = 8192;
constexpr size_t kBuf = (4u << 20) + 8 * kFrag;
// The size of each region of run_cases (the CUDA IPC cases go to 64 MiB).
size_t g_buf = kBuf;
constexpr uint8_t kGuard = 0xEE;
enum class Backend { kFake, kCuda };
Backend g_backend = Backend::kFake;

uint8_t pattern(size_t i, uint32_t salt) { return static_cast<uint8_t>(i * 131 + salt * 7 + (i >> 11)); }

// Host memory, or "GPU" memory: cuMemAlloc'd (cuda) or host memory
// registered as UFAB_MEM_CUDA (fake).
class Mem {
 public:
  Mem(bool gpu, size_t size) : gpu_(gpu), real_(gpu && g_backend == Backend::kCuda), size_(size) {
    if (real_) {
      auto d = gpu::Driver::get();
      if (d) {
        auto a = gpu::Allocation::allocate(**d, 0, gpu::Allocation::Kind::kDevice, size);
        if (a) dev_.emplace(std::move(*a));
      }
    } else {
      host_.assign(size, 0);
    }
  }
  bool ok() const { return !real_ || dev_.has_value(); }
  uint64_t addr() const { return reinterpret_cast<uint64_t>(real_ ? dev_->data() : host_.data()); }
  bool store(const std::vector<uint8_t>& b) {
    if (real_) return static_cast<bool>(dev_->write(0, b.data(), b.size()));
    std::memcpy(host_.data(), b.data(), b.size());
    return true;
  }
  std::vector<uint8_t> load() const {
    std::vector<uint8_t> out(size_);
    if (real_) {
      if (!dev_->read(0, out.data(), out.size())) out.assign(size_, 0x5A);
    } else {
      std::memcpy(out.data(), host_.data(), size_);
    }
    return out;
  }
  void free_device() { dev_.reset(); }

 private:
  bool gpu_, real_;
  size_t size_;
  std::vector<uint8_t> host_;
  std::optional<gpu::Allocation> dev_;
};

struct Regions {
  std::unique_ptr<Mem> mem[2];  // [0] host, [1] GPU
  ufab_rdma_mr* mr[2] = {};
  uint32_t lkey[2] = {}, rkey[2] = {};
};
struct Remote {
  uint64_t base[2];
  uint32_t rkey[2];
};

bool reg(Side& s, Regions& r) {
  const uint32_t acc = UFAB_ACCESS_LOCAL_WRITE | UFAB_ACCESS_REMOTE_WRITE | UFAB_ACCESS_REMOTE_READ;
  for (int g = 0; g < 2; ++g) {
    r.mem[g] = std::make_unique<Mem>(g == 1, g_buf);
    TREQUIRE(r.mem[g]->ok());
    ufab_mr_attr a = {sizeof a, acc, reinterpret_cast<void*>(r.mem[g]->addr()), g_buf,
                      g ? static_cast<uint32_t>(UFAB_MEM_CUDA) : static_cast<uint32_t>(UFAB_MEM_HOST), 0};
    TREQUIRE_OK(P()->reg_mr(s.pd, &a, &r.mr[g], &r.lkey[g], &r.rkey[g]));
  }
  return true;
}

void dereg(Regions& r) {
  for (auto* m : r.mr) {
    if (m) P()->dereg_mr(m);
  }
}

struct Case {
  uint32_t op = 0;  // UFAB_WR_*; 0xFFFF: the end
  uint32_t src_gpu = 0, dst_gpu = 0;
  uint64_t len = 0, src_off = 0, dst_off = 0;
  uint32_t salt = 0;
  uint32_t hold = 0;  // the child holds its copies until told (completion-after-placement)
  uint32_t late_recv_ms = 0;
};
struct Result {
  uint32_t ok = 0;
  uint64_t copies = 0;
  shm::GpuPathStats path{};  // the child's, over the case
};

shm::GpuPathStats path_delta(const shm::GpuPathStats& a, const shm::GpuPathStats& b) {
  return shm::GpuPathStats{b.ipc_wrs - a.ipc_wrs,
                           b.staged_wrs - a.staged_wrs,
                           b.ipc_copies - a.ipc_copies,
                           b.staged_pieces - a.staged_pieces,
                           b.ipc_opens - a.ipc_opens,
                           b.ipc_closes - a.ipc_closes,
                           b.ipc_open_failures - a.ipc_open_failures,
                           b.ipc_exports - a.ipc_exports,
                           b.ipc_export_refused - a.ipc_export_refused};
}

// The path a case must take (g_expect_ipc): CUDA IPC for GPU memory on
// both sides of a WRITE, WRITE_WITH_IMM or READ with the CUDA engine and
// gpu_ipc on; the staging slots otherwise.
bool g_expect_ipc = false;
bool ipc_case(uint32_t op, bool src_gpu, bool dst_gpu) {
  return g_expect_ipc && src_gpu && dst_gpu &&
         (op == UFAB_WR_RDMA_WRITE || op == UFAB_WR_RDMA_WRITE_WITH_IMM || op == UFAB_WR_RDMA_READ);
}

// An SGE list over [off, off + len) of a region: two SGEs when long enough.
uint32_t split(const Regions& r, int g, uint64_t off, uint64_t len, ufab_sge* out) {
  const uint64_t cut = len > 2 ? len / 3 : len;
  out[0] = {r.mem[g]->addr() + off, static_cast<uint32_t>(cut), r.lkey[g]};
  if (cut == len) return 1;
  out[1] = {r.mem[g]->addr() + off + cut, static_cast<uint32_t>(len - cut), r.lkey[g]};
  return 2;
}

bool fill_source(Regions& r, int g, uint32_t salt) {
  std::vector<uint8_t> b(g_buf);
  for (size_t i = 0; i < b.size(); ++i) b[i] = pattern(i, salt);
  return r.mem[g]->store(b);
}

bool check_target(const Regions& r, int g, const Case& c, const char* who) {
  auto b = r.mem[g]->load();
  for (size_t i = 0; i < b.size(); ++i) {
    const bool in = i >= c.dst_off && i < c.dst_off + c.len;
    const uint8_t want = in ? pattern(c.src_off + (i - c.dst_off), c.salt) : kGuard;
    if (b[i] != want) {
      std::fprintf(stderr, "[%s] op %u %s->%s len %llu offsets %llu/%llu: byte %zu is 0x%02x, want 0x%02x (%s)\n", who,
                   c.op, c.src_gpu ? "gpu" : "host", c.dst_gpu ? "gpu" : "host",
                   static_cast<unsigned long long>(c.len), static_cast<unsigned long long>(c.src_off),
                   static_cast<unsigned long long>(c.dst_off), i, b[i], want, in ? "target" : "guard");
      return false;
    }
  }
  return true;
}

uint64_t copies() { return staging::fake_completed(); }

// The child: prepares each case the parent sends, checks what landed.
bool child_loop(Side& s, Regions& r, Conn& c) {
  for (;;) {
    Case k;
    TREQUIRE(s.ch.recv(&k, sizeof k, 60s));
    if (k.op == 0xFFFF) return true;
    const bool read = k.op == UFAB_WR_RDMA_READ;
    const bool recv = k.op == UFAB_WR_SEND || k.op == UFAB_WR_SEND_WITH_IMM || k.op == UFAB_WR_RDMA_WRITE_WITH_IMM;
    const uint64_t before = copies();
    const shm::GpuPathStats path_before = shm::gpu_path_stats();
    if (read) {
      TREQUIRE(fill_source(r, k.src_gpu, k.salt));
    } else {
      TREQUIRE(r.mem[k.dst_gpu]->store(std::vector<uint8_t>(g_buf, kGuard)));
    }
    ufab_sge sg[2];
    uint32_t n = 0;
    if (recv && k.op != UFAB_WR_RDMA_WRITE_WITH_IMM) n = split(r, k.dst_gpu, k.dst_off, k.len, sg);
    if (recv && !k.late_recv_ms) TREQUIRE_OK(recv1(c.qp, 77, sg, n));
    if (k.hold) staging::fake_hold(true);
    uint32_t ready = 1;
    TREQUIRE(s.ch.send(&ready, sizeof ready));
    if (k.late_recv_ms) {
      std::this_thread::sleep_for(std::chrono::milliseconds(k.late_recv_ms));
      TREQUIRE_OK(recv1(c.qp, 77, sg, n));
    }
    bool ok = true;
    if (k.hold) {
      // Nothing may complete or be placed while the copies are held.
      if (recv) ok &= expect_none(c.rcq, 300ms);
      else std::this_thread::sleep_for(300ms);
      auto b = r.mem[k.dst_gpu]->load();
      for (size_t i = 0; i < b.size() && ok; ++i) ok &= b[i] == kGuard;
      TCHECK_MSG(ok, "bytes landed or a completion came while every copy was held");
      uint32_t go = 0;
      TREQUIRE(s.ch.recv(&go, sizeof go, 10s));
      staging::fake_hold(false);
    }
    if (recv) {
      ufab_wc wc{};
      ok &= expect_wc(c.rcq, 77, UFAB_WC_SUCCESS, -1, 20s, &wc);
      ok &= wc.byte_len == k.len;
      if (k.op != UFAB_WR_SEND) ok &= (wc.wc_flags & UFAB_WC_WITH_IMM) && wc.imm_data == k.salt;
      TCHECK_MSG(ok, wc_str(wc));
    }
    uint32_t posted = 0;
    TREQUIRE(s.ch.recv(&posted, sizeof posted, 60s));
    if (!read) ok &= check_target(r, k.dst_gpu, k, "child");
    Result res{ok ? 1u : 0u, copies() - before, path_delta(path_before, shm::gpu_path_stats())};
    TREQUIRE(s.ch.send(&res, sizeof res));
  }
}

// The parent: one transfer (READ: the child's memory into the parent's).
bool one(Side& s, Regions& r, Conn& c, const Remote& peer, const Case& k) {
  TREQUIRE(s.ch.send(&k, sizeof k));
  const bool read = k.op == UFAB_WR_RDMA_READ;
  const uint64_t before = copies();
  const shm::GpuPathStats path_before = shm::gpu_path_stats();
  if (read) {
    TREQUIRE(r.mem[k.dst_gpu]->store(std::vector<uint8_t>(g_buf, kGuard)));
  } else {
    TREQUIRE(fill_source(r, k.src_gpu, k.salt));
  }
  uint32_t ready = 0;
  TREQUIRE(s.ch.recv(&ready, sizeof ready, 20s));
  ufab_sge sg[2];
  uint32_t n = read ? split(r, k.dst_gpu, k.dst_off, k.len, sg) : split(r, k.src_gpu, k.src_off, k.len, sg);
  uint64_t raddr = 0;
  uint32_t rkey = 0;
  if (read) {
    raddr = peer.base[k.src_gpu] + k.src_off;
    rkey = peer.rkey[k.src_gpu];
  } else if (k.op == UFAB_WR_RDMA_WRITE || k.op == UFAB_WR_RDMA_WRITE_WITH_IMM) {
    raddr = peer.base[k.dst_gpu] + k.dst_off;
    rkey = peer.rkey[k.dst_gpu];
  }
  TREQUIRE_OK(post1(c.qp, 9, k.op, sg, n, UFAB_SEND_SIGNALED, raddr, rkey, k.salt));
  bool ok = true;
  if (k.hold) {
    ok &= expect_none(c.scq, 300ms);  // not acknowledged before placement
    TCHECK_MSG(ok, "the work request completed while the target's copies were held");
    uint32_t go = 1;
    TREQUIRE(s.ch.send(&go, sizeof go));
  }
  ok &= expect_wc(c.scq, 9, UFAB_WC_SUCCESS, -1, 30s);
  uint32_t posted = 1;
  TREQUIRE(s.ch.send(&posted, sizeof posted));
  if (read) ok &= check_target(r, k.dst_gpu, k, "parent");
  Result res;
  TREQUIRE(s.ch.recv(&res, sizeof res, 60s));
  ok &= res.ok == 1;
  // GPU memory moved through the engine of the process that owns it.
  const uint64_t mine = copies() - before;
  const bool parent_gpu = read ? k.dst_gpu : k.src_gpu;
  const bool child_gpu = read ? k.src_gpu : k.dst_gpu;
  if (g_backend == Backend::kFake) {
    if (parent_gpu) TCHECK_MSG(mine > 0, "no engine copy in the parent");
    if (child_gpu) TCHECK_MSG(res.copies > 0, "no engine copy in the child");
  }
  // The path it took: the requester (the parent) counts its WR as CUDA
  // IPC or staged, the responder (the child) its copies.
  const shm::GpuPathStats pp = path_delta(path_before, shm::gpu_path_stats());
  const std::string where = "op " + std::to_string(k.op) + (k.src_gpu ? " gpu" : " host") + "->" +
                            (k.dst_gpu ? "gpu" : "host") + " len " + std::to_string(k.len);
  if (ipc_case(k.op, k.src_gpu, k.dst_gpu)) {
    ok &= pp.ipc_wrs == 1 && pp.staged_wrs == 0 && res.path.ipc_copies >= 1 && res.path.staged_pieces == 0;
    TCHECK_MSG(pp.ipc_wrs == 1 && pp.staged_wrs == 0,
               where + ": the requester did not take CUDA IPC (ipc_wrs " + std::to_string(pp.ipc_wrs) +
                   ", staged_wrs " + std::to_string(pp.staged_wrs) + ")");
    TCHECK_MSG(res.path.ipc_copies >= 1 && res.path.staged_pieces == 0,
               where + ": the responder did not copy through CUDA IPC (ipc_copies " +
                   std::to_string(res.path.ipc_copies) + ", staged pieces " + std::to_string(res.path.staged_pieces) +
                   ")");
  } else {
    ok &= pp.ipc_wrs == 0 && res.path.ipc_copies == 0;
    TCHECK_MSG(pp.ipc_wrs == 0 && res.path.ipc_copies == 0, where + ": took CUDA IPC, which it must not");
  }
  TCHECK_MSG(ok, "op " + std::to_string(k.op) + (k.src_gpu ? " gpu" : " host") + "->" + (k.dst_gpu ? "gpu" : "host") +
                     " len " + std::to_string(k.len) + " offsets " + std::to_string(k.src_off) + "/" +
                     std::to_string(k.dst_off));
  return ok;
}

// Runs `cases` between the two processes (the parent initiates).
bool run_cases(const char* name, const std::vector<Case>& cases, std::vector<const char*> params) {
  params.push_back(nullptr);
  g_open_params = params.data();
  g_open_progress_thread = true;  // both sides answer while the other waits
  bool ok = run_pair(
      name,
      [&](Side& s) {
        Regions r;
        if (!reg(s, r)) return false;
        Remote mine{}, theirs{};
        for (int g = 0; g < 2; ++g) {
          mine.base[g] = r.mem[g]->addr();
          mine.rkey[g] = r.rkey[g];
        }
        TREQUIRE(s.ch.exchange(mine, &theirs));
        Conn c;
        ConnOptions o;
        o.access = UFAB_ACCESS_LOCAL_WRITE | UFAB_ACCESS_REMOTE_WRITE | UFAB_ACCESS_REMOTE_READ;
        o.cq_depth = 1024;
        if (!make_conn(s, c, o)) return false;
        bool good = true;
        if (s.parent()) {
          for (const Case& k : cases) {
            if (!one(s, r, c, theirs, k)) {
              good = false;
              break;
            }
          }
          Case end;
          end.op = 0xFFFF;
          s.ch.send(&end, sizeof end);
        } else {
          good = child_loop(s, r, c);
        }
        s.ch.sync("end");
        drop_conn(c);
        dereg(r);
        return good;
      },
      false, 240s);
  g_open_params = nullptr;
  g_open_progress_thread = false;
  return ok;
}

std::vector<Case> matrix(bool large) {
  std::vector<Case> out;
  const uint32_t ops[] = {UFAB_WR_SEND, UFAB_WR_SEND_WITH_IMM, UFAB_WR_RDMA_WRITE, UFAB_WR_RDMA_WRITE_WITH_IMM,
                          UFAB_WR_RDMA_READ};
  std::vector<uint64_t> sizes = {1, kFrag - 1, kFrag, kFrag + 1, 5 * kFrag + 7};
  if (large) sizes.push_back((4u << 20) + 3);
  const std::pair<uint64_t, uint64_t> offsets[] = {{0, 0}, {4093, 17}};
  uint32_t salt = 1;
  for (uint32_t op : ops) {
    for (int dir = 0; dir < 4; ++dir) {
      for (uint64_t len : sizes) {
        for (auto [so, d] : offsets) {
          Case k;
          k.op = op;
          k.src_gpu = dir & 1;
          k.dst_gpu = (dir >> 1) & 1;
          k.len = len;
          k.src_off = so;
          k.dst_off = d;
          k.salt = salt++;
          out.push_back(k);
        }
      }
    }
  }
  return out;
}

TEST(ShmGpu, FakeEngineEveryOpDirectionSizeOffset) {
  g_backend = Backend::kFake;
  EXPECT_TRUE(run_cases("gpufake", matrix(true), {"gpu_copy=fake", "gpu_frag=8192", "gpu_depth=3"}));
}

TEST(ShmGpu, FakeEngineRandomOrderDelayDepthOne) {
  g_backend = Backend::kFake;
  auto cases = matrix(false);
  EXPECT_TRUE(run_cases("gpurand", cases,
                        {"gpu_copy=fake", "gpu_frag=8192", "gpu_depth=1", "gpu_fake_order=random",
                         "gpu_fake_delay_us=50"}));
  EXPECT_TRUE(run_cases("gpudeep", cases,
                        {"gpu_copy=fake", "gpu_frag=8192", "gpu_depth=8", "gpu_fake_order=random",
                         "gpu_fake_delay_us=20"}));
}

TEST(ShmGpu, FakeEngineCompletionOnlyAfterPlacement) {
  g_backend = Backend::kFake;
  std::vector<Case> cases;
  uint32_t salt = 500;
  for (uint32_t op : {UFAB_WR_RDMA_WRITE, UFAB_WR_SEND, UFAB_WR_RDMA_WRITE_WITH_IMM}) {
    for (uint32_t src_gpu : {0u, 1u}) {
      Case k;
      k.op = op;
      k.src_gpu = src_gpu;
      k.dst_gpu = 1;
      k.len = 3 * kFrag + 5;
      k.src_off = 3;
      k.dst_off = 1;
      k.salt = salt++;
      k.hold = 1;
      cases.push_back(k);
    }
  }
  EXPECT_TRUE(run_cases("gpuhold", cases, {"gpu_copy=fake", "gpu_frag=8192"}));
}

TEST(ShmGpu, FakeEngineSendFromGpuBehindRnr) {
  g_backend = Backend::kFake;
  std::vector<Case> cases;
  for (uint32_t dst_gpu : {0u, 1u}) {
    Case k;
    k.op = UFAB_WR_SEND;
    k.src_gpu = 1;
    k.dst_gpu = dst_gpu;
    k.len = 5 * kFrag + 7;
    k.salt = 900 + dst_gpu;
    k.late_recv_ms = 50;
    cases.push_back(k);
  }
  EXPECT_TRUE(run_cases("gpurnr", cases, {"gpu_copy=fake", "gpu_frag=8192"}));
}

// ------------------------------------------------------- streams of WRs
//
// Many work requests posted back to back on one QP (several GPU work
// requests in flight: docs/gpu.md, "shm"): mixed operations, directions
// and sizes (1 B .. 4 MiB + 3), unaligned offsets, sources and targets
// over two SGEs, each into its own range of the target; every completion
// checked in order, every byte of both processes' buffers checked (the
// targets' ranges, the guard bytes between them, the sources unchanged).

constexpr size_t kSBuf = 24u << 20;     // each region of a stream test
constexpr size_t kSrcArea = 5u << 20;   // [0, kSrcArea): sources, a pattern
constexpr uint32_t kSaltParent = 41, kSaltChild = 42;

struct SWr {
  uint32_t op = 0, src_gpu = 0, dst_gpu = 0;
  uint64_t len = 0, src_off = 0, dst_off = 0;
  bool recv() const {
    return op == UFAB_WR_SEND || op == UFAB_WR_SEND_WITH_IMM || op == UFAB_WR_RDMA_WRITE_WITH_IMM;
  }
};

// The stream both processes compute from one seed. READs place into the
// parent's buffers, everything else into the child's.
std::vector<SWr> stream_plan(uint32_t seed, size_t n, bool large, bool with_read = true) {
  std::mt19937 rng(seed);
  std::vector<uint32_t> ops = {UFAB_WR_RDMA_WRITE, UFAB_WR_RDMA_WRITE, UFAB_WR_RDMA_WRITE_WITH_IMM, UFAB_WR_SEND,
                               UFAB_WR_SEND_WITH_IMM};
  if (with_read) ops.push_back(UFAB_WR_RDMA_READ);
  const uint64_t sizes[] = {1, 3, kFrag - 1, kFrag, kFrag + 1, 2 * kFrag + 3, 5 * kFrag + 7, 65536 + 5, 100003, 250001};
  uint64_t cursor[2][2] = {{kSrcArea, kSrcArea}, {kSrcArea, kSrcArea}};  // [parent is target][gpu]
  std::vector<SWr> out;
  for (size_t i = 0; i < n; ++i) {
    SWr w;
    w.op = ops[rng() % ops.size()];
    w.src_gpu = rng() % 4 != 0;  // mostly GPU memory
    w.dst_gpu = rng() % 4 != 0;
    w.len = sizes[rng() % std::size(sizes)];
    if (large && (i == n / 3 || i == 2 * n / 3)) {
      w.op = i == n / 3 ? UFAB_WR_RDMA_WRITE : UFAB_WR_SEND;
      w.src_gpu = w.dst_gpu = 1;
      w.len = (4u << 20) + 3;
    }
    w.src_off = rng() % (kSrcArea - w.len);
    uint64_t& c = cursor[w.op == UFAB_WR_RDMA_READ][w.dst_gpu];
    w.dst_off = c + rng() % 61;
    c = w.dst_off + w.len;
    out.push_back(w);
  }
  return out;
}

// What one process's region `g` must hold after the WRs in [0, upto) of
// the plan: its source pattern, the guard, the targets placed here.
std::vector<uint8_t> stream_image(const std::vector<SWr>& plan, size_t upto, bool parent, int g) {
  std::vector<uint8_t> want(kSBuf, kGuard);
  const uint32_t mine = parent ? kSaltParent : kSaltChild, theirs = parent ? kSaltChild : kSaltParent;
  for (size_t i = 0; i < kSrcArea; ++i) want[i] = pattern(i, mine);
  for (size_t k = 0; k < upto; ++k) {
    const SWr& w = plan[k];
    if ((w.op == UFAB_WR_RDMA_READ) != parent || static_cast<int>(w.dst_gpu) != g) continue;
    for (uint64_t j = 0; j < w.len; ++j) want[w.dst_off + j] = pattern(w.src_off + j, theirs);
  }
  return want;
}

bool check_image(const Mem& m, const std::vector<uint8_t>& want, const char* what) {
  auto b = m.load();
  for (size_t i = 0; i < b.size(); ++i) {
    if (b[i] != want[i]) {
      std::fprintf(stderr, "[%s] %s: byte %zu is 0x%02x, want 0x%02x\n", g_who, what, i, b[i], want[i]);
      return false;
    }
  }
  return true;
}

struct StreamRegions {
  std::unique_ptr<Mem> mem[2];
  ufab_rdma_mr* mr[2] = {};
  uint32_t lkey[2] = {}, rkey[2] = {};
  ~StreamRegions() {
    for (auto* m : mr) {
      if (m) P()->dereg_mr(m);
    }
  }
};

bool stream_regions(Side& s, StreamRegions& r, uint32_t salt, Remote* mine) {
  const uint32_t acc = UFAB_ACCESS_LOCAL_WRITE | UFAB_ACCESS_REMOTE_WRITE | UFAB_ACCESS_REMOTE_READ;
  std::vector<uint8_t> b(kSBuf, kGuard);
  for (size_t i = 0; i < kSrcArea; ++i) b[i] = pattern(i, salt);
  for (int g = 0; g < 2; ++g) {
    r.mem[g] = std::make_unique<Mem>(g == 1, kSBuf);
    TREQUIRE(r.mem[g]->ok());
    TREQUIRE(r.mem[g]->store(b));
    ufab_mr_attr a = {sizeof a, acc, reinterpret_cast<void*>(r.mem[g]->addr()), kSBuf,
                      g ? static_cast<uint32_t>(UFAB_MEM_CUDA) : static_cast<uint32_t>(UFAB_MEM_HOST), 0};
    TREQUIRE_OK(P()->reg_mr(s.pd, &a, &r.mr[g], &r.lkey[g], &r.rkey[g]));
    mine->base[g] = r.mem[g]->addr();
    mine->rkey[g] = r.rkey[g];
  }
  return true;
}

// Two SGEs over [off, off + len) of region g (one when len < 3).
uint32_t ssplit(const StreamRegions& r, int g, uint64_t off, uint64_t len, ufab_sge* out) {
  const uint64_t cut = len > 2 ? len / 3 : len;
  out[0] = {r.mem[g]->addr() + off, static_cast<uint32_t>(cut), r.lkey[g]};
  if (cut == len) return 1;
  out[1] = {r.mem[g]->addr() + off + cut, static_cast<uint32_t>(len - cut), r.lkey[g]};
  return 2;
}

int post_plan_wr(ufab_rdma_qp* qp, const StreamRegions& r, const Remote& peer, const SWr& w, uint64_t id) {
  ufab_sge sg[2];
  const bool read = w.op == UFAB_WR_RDMA_READ;
  uint32_t n = read ? ssplit(r, w.dst_gpu, w.dst_off, w.len, sg) : ssplit(r, w.src_gpu, w.src_off, w.len, sg);
  uint64_t raddr = 0;
  uint32_t rkey = 0;
  if (read) {
    raddr = peer.base[w.src_gpu] + w.src_off;
    rkey = peer.rkey[w.src_gpu];
  } else if (w.op == UFAB_WR_RDMA_WRITE || w.op == UFAB_WR_RDMA_WRITE_WITH_IMM) {
    raddr = peer.base[w.dst_gpu] + w.dst_off;
    rkey = peer.rkey[w.dst_gpu];
  }
  return post1(qp, id, w.op, sg, n, UFAB_SEND_SIGNALED, raddr, rkey, 0x1000 + static_cast<uint32_t>(id));
}

// The child's receives for the plan's SENDs and WRITE_WITH_IMMs, in order.
bool post_plan_recvs(ufab_rdma_qp* qp, const StreamRegions& r, const std::vector<SWr>& plan) {
  for (size_t k = 0; k < plan.size(); ++k) {
    const SWr& w = plan[k];
    if (!w.recv()) continue;
    ufab_sge sg[2];
    uint32_t n = w.op == UFAB_WR_RDMA_WRITE_WITH_IMM ? 0 : ssplit(r, w.dst_gpu, w.dst_off, w.len, sg);
    TREQUIRE_OK(recv1(qp, k, sg, n));
  }
  return true;
}

bool expect_recv(ufab_rdma_cq* cq, const SWr& w, uint64_t k) {
  ufab_wc wc{};
  const bool imm = w.op != UFAB_WR_SEND;
  const int opcode = w.op == UFAB_WR_RDMA_WRITE_WITH_IMM ? UFAB_WC_RECV_RDMA_WITH_IMM : UFAB_WC_RECV;
  bool ok = expect_wc(cq, k, UFAB_WC_SUCCESS, opcode, 60s, &wc);
  ok &= wc.byte_len == w.len;
  if (imm) ok &= (wc.wc_flags & UFAB_WC_WITH_IMM) && wc.imm_data == 0x1000 + k;
  TCHECK_MSG(ok, "receive " + std::to_string(k) + ": " + wc_str(wc));
  return ok;
}

ConnOptions stream_conn() {
  ConnOptions o;
  o.access = UFAB_ACCESS_LOCAL_WRITE | UFAB_ACCESS_REMOTE_WRITE | UFAB_ACCESS_REMOTE_READ;
  o.cq_depth = 1024;
  o.cap = {256, 256, 4, 4, 0};
  return o;
}

// Every WR of the plan posted back to back; every completion in order and
// successful; both processes' buffers byte for byte.
bool run_stream(const char* name, uint32_t seed, size_t n, bool large, std::vector<const char*> params,
                bool read_runs = false) {
  params.push_back(nullptr);
  g_open_params = params.data();
  g_open_progress_thread = true;
  auto plan = stream_plan(seed, n, large);
  if (read_runs) {
    // Runs of 8 READs, then 4 WRITEs, ...: laid out again for the new targets.
    uint64_t cursor[2][2] = {{kSrcArea, kSrcArea}, {kSrcArea, kSrcArea}};
    for (size_t k = 0; k < plan.size(); ++k) {
      SWr& w = plan[k];
      w.op = k % 12 < 8 ? UFAB_WR_RDMA_READ : UFAB_WR_RDMA_WRITE;
      uint64_t& c = cursor[w.op == UFAB_WR_RDMA_READ][w.dst_gpu];
      w.dst_off = c + k % 61;
      c = w.dst_off + w.len;
    }
  }
  for (const SWr& w : plan) {
    if (w.dst_off + w.len > kSBuf) {
      std::fprintf(stderr, "the plan does not fit its buffers\n");
      return false;
    }
  }
  bool ok = run_pair(
      name,
      [&](Side& s) {
        StreamRegions r;
        Remote mine{}, theirs{};
        if (!stream_regions(s, r, s.parent() ? kSaltParent : kSaltChild, &mine)) return false;
        TREQUIRE(s.ch.exchange(mine, &theirs));
        Conn c;
        if (!make_conn(s, c, stream_conn())) return false;
        bool good = true;
        const uint64_t before = copies();
        if (s.parent()) {
          TREQUIRE(s.ch.sync("posted receives", 30s));
          for (size_t k = 0; k < plan.size(); ++k) TREQUIRE_OK(post_plan_wr(c.qp, r, theirs, plan[k], k));
          for (size_t k = 0; k < plan.size() && good; ++k) {
            good &= expect_wc(c.scq, k, UFAB_WC_SUCCESS, -1, 60s);
          }
          TCHECK_MSG(good, "the stream's completions: in order and successful");
          uint32_t done = good;
          TREQUIRE(s.ch.send(&done, sizeof done));
          for (int g = 0; g < 2 && good; ++g) {
            good &= check_image(*r.mem[g], stream_image(plan, plan.size(), true, g), g ? "parent GPU" : "parent host");
          }
        } else {
          TREQUIRE(post_plan_recvs(c.qp, r, plan));
          TREQUIRE(s.ch.sync("posted receives", 30s));
          for (size_t k = 0; k < plan.size() && good; ++k) {
            if (plan[k].recv()) good &= expect_recv(c.rcq, plan[k], k);
          }
          uint32_t done = 0;
          TREQUIRE(s.ch.recv(&done, sizeof done, 120s));
          good &= done == 1;
          for (int g = 0; g < 2 && good; ++g) {
            good &= check_image(*r.mem[g], stream_image(plan, plan.size(), false, g), g ? "child GPU" : "child host");
          }
        }
        if (g_backend == Backend::kFake) TCHECK_MSG(copies() > before, "no engine copy");
        s.ch.sync("end", 60s);
        drop_conn(c);
        return good;
      },
      false, 240s);
  g_open_params = nullptr;
  g_open_progress_thread = false;
  return ok;
}

TEST(ShmGpu, FakeEngineStreamOfWorkRequests) {
  g_backend = Backend::kFake;
  EXPECT_TRUE(run_stream("gpustream", 7, 60, true, {"gpu_copy=fake", "gpu_frag=8192", "gpu_depth=8"}));
}

TEST(ShmGpu, FakeEngineStreamRandomOrderSmallPool) {
  g_backend = Backend::kFake;
  // Copies complete out of order after a delay; a pool of 2 * gpu_depth
  // slots, so both sides run out of slots and wait for each other.
  EXPECT_TRUE(run_stream("gpustrrand", 11, 48, false,
                         {"gpu_copy=fake", "gpu_frag=8192", "gpu_depth=4", "gpu_slots=8", "gpu_fake_order=random",
                          "gpu_fake_delay_us=30"}));
  EXPECT_TRUE(run_stream("gpustrone", 13, 32, false, {"gpu_copy=fake", "gpu_frag=8192", "gpu_depth=1"}));
}

// READs back to back (several in flight), then WRITEs behind them and
// READs behind those: every byte, every completion in order.
TEST(ShmGpu, FakeEngineStreamOfReads) {
  g_backend = Backend::kFake;
  EXPECT_TRUE(run_stream("gpustrread", 17, 48, false, {"gpu_copy=fake", "gpu_frag=8192", "gpu_depth=8"},
                         /*read_runs=*/true));
  EXPECT_TRUE(run_stream("gpustrreadr", 19, 48, false,
                         {"gpu_copy=fake", "gpu_frag=8192", "gpu_depth=4", "gpu_slots=8", "gpu_fake_order=random",
                          "gpu_fake_delay_us=30"},
                         /*read_runs=*/true));
}

// A GPU buffer freed in the middle of a stream (staging::fake_free stands
// for cuMemFree under a live region): at the poster, post_send refuses a
// WR whose source was freed (-EACCES) and the stream goes on; at the
// target, WR `bad` (a WRITE into its freed range) fails with
// REM_ACCESS_ERR after every WR before it completed successfully, the
// ones after it are flushed, and only the WRs before it placed bytes.
TEST(ShmGpu, FakeEngineStreamFreedBufferMidway) {
  g_backend = Backend::kFake;
  const char* params[] = {"gpu_copy=fake", "gpu_frag=8192", "gpu_depth=8", nullptr};
  g_open_params = params;
  g_open_progress_thread = true;
  auto plan = stream_plan(23, 30, false, false);
  const size_t bad = 17;
  plan[bad].op = UFAB_WR_RDMA_WRITE;
  plan[bad].src_gpu = 1;
  plan[bad].dst_gpu = 1;
  for (size_t k = 0; k < plan.size(); ++k) {
    if (k != bad && plan[k].dst_gpu == 1 && plan[k].dst_off == plan[bad].dst_off) FAIL() << "overlapping plan";
  }
  bool ok = run_pair(
      "gpustrfree",
      [&](Side& s) {
        StreamRegions r;
        Remote mine{}, theirs{};
        if (!stream_regions(s, r, s.parent() ? kSaltParent : kSaltChild, &mine)) return false;
        TREQUIRE(s.ch.exchange(mine, &theirs));
        Conn c;
        if (!make_conn(s, c, stream_conn())) return false;
        bool good = true;
        if (s.parent()) {
          TREQUIRE(s.ch.sync("posted receives", 30s));
          for (size_t k = 0; k < plan.size(); ++k) {
            if (k == bad / 2) {
              // A source freed here: refused at post, nothing else changes.
              SWr w = plan[k];
              w.src_gpu = 1;
              w.src_off = 4 * kFrag;
              staging::fake_free(reinterpret_cast<void*>(r.mem[1]->addr() + w.src_off), w.len);
              TCHECK_EQ(post_plan_wr(c.qp, r, theirs, w, 999), -EACCES);
              TCHECK_MSG(g_last_error.find("was freed") != std::string::npos, g_last_error);
              staging::fake_unfree_all();
            }
            TREQUIRE_OK(post_plan_wr(c.qp, r, theirs, plan[k], k));
          }
          for (size_t k = 0; k < plan.size(); ++k) {
            const uint32_t want = k < bad ? UFAB_WC_SUCCESS : k == bad ? UFAB_WC_REM_ACCESS_ERR : UFAB_WC_WR_FLUSH_ERR;
            good &= expect_wc(c.scq, k, want, -1, 60s);
          }
          TCHECK_MSG(good, "completions: successes before the freed buffer's WR, its REM_ACCESS_ERR, then flushes");
          uint32_t done = good;
          TREQUIRE(s.ch.send(&done, sizeof done));
        } else {
          // The target's GPU range of WR `bad` freed under its live region.
          staging::fake_free(reinterpret_cast<void*>(r.mem[1]->addr() + plan[bad].dst_off), plan[bad].len);
          TREQUIRE(post_plan_recvs(c.qp, r, plan));
          TREQUIRE(s.ch.sync("posted receives", 30s));
          for (size_t k = 0; k < plan.size() && good; ++k) {
            if (!plan[k].recv()) continue;
            if (k < bad) {
              good &= expect_recv(c.rcq, plan[k], k);
            } else {
              good &= expect_wc(c.rcq, k, UFAB_WC_WR_FLUSH_ERR, -1, 30s);
            }
          }
          uint32_t done = 0;
          TREQUIRE(s.ch.recv(&done, sizeof done, 120s));
          good &= done == 1;
          for (int g = 0; g < 2 && good; ++g) {
            good &= check_image(*r.mem[g], stream_image(plan, bad, false, g), g ? "child GPU" : "child host");
          }
          staging::fake_unfree_all();
        }
        s.ch.sync("end", 60s);
        drop_conn(c);
        return good;
      },
      false, 240s);
  g_open_params = nullptr;
  g_open_progress_thread = false;
  EXPECT_TRUE(ok);
}

// The peer process dies in the middle of a stream of GPU WRITEs and SENDs
// (SIGKILL, its copies held so pieces are in flight both ways): every WR
// completes within bounds, in order, successes first, then one error,
// then flushes; the device's pool is whole afterwards (a 4 MiB + 3 WRITE
// into GPU memory on a new loopback QP pair goes through every slot).
TEST(ShmGpu, FakeEnginePeerDiesMidStream) {
  g_backend = Backend::kFake;
  const char* params[] = {"gpu_copy=fake", "gpu_frag=8192", "gpu_depth=8", "gpu_slots=16", nullptr};
  g_open_params = params;
  g_open_progress_thread = true;
  auto plan = stream_plan(31, 40, false, false);
  size_t sends = 0, kill_after = 0;
  for (size_t k = 0; k < plan.size(); ++k) {
    plan[k].src_gpu = plan[k].dst_gpu = 1;
    plan[k].len = std::max<uint64_t>(plan[k].len, 5 * kFrag + 7);
    if (plan[k].recv() && ++sends == 3) kill_after = k;
  }
  // The plan's ranges were laid out for the old lengths: again, in order.
  uint64_t cursor = kSrcArea;
  for (SWr& w : plan) {
    w.src_off %= kSrcArea - w.len;
    w.dst_off = cursor + 7;
    cursor = w.dst_off + w.len;
  }
  ASSERT_GT(kill_after, 0u);
  bool ok = run_pair(
      "gpustrdie",
      [&](Side& s) {
        StreamRegions r;
        Remote mine{}, theirs{};
        if (!stream_regions(s, r, s.parent() ? kSaltParent : kSaltChild, &mine)) return false;
        TREQUIRE(s.ch.exchange(mine, &theirs));
        Conn c;
        if (!make_conn(s, c, stream_conn())) return false;
        if (!s.parent()) {
          TREQUIRE(post_plan_recvs(c.qp, r, plan));
          staging::fake_hold(true);
          TREQUIRE(s.ch.sync("posted receives", 30s));
          std::this_thread::sleep_for(100ms);  // pieces pile up in flight
          staging::fake_hold(false);
          for (size_t k = 0; k <= kill_after; ++k) {
            if (plan[k].recv()) TREQUIRE(expect_recv(c.rcq, plan[k], k));
          }
          staging::fake_hold(true);  // nothing more lands
          ::kill(::getpid(), SIGKILL);
          return false;  // not reached
        }
        TREQUIRE(s.ch.sync("posted receives", 30s));
        for (size_t k = 0; k < plan.size(); ++k) TREQUIRE_OK(post_plan_wr(c.qp, r, theirs, plan[k], k));
        bool good = true;
        int phase = 0;  // 0: successes, 1: after the one error (flushes only)
        size_t successes = 0;
        for (size_t k = 0; k < plan.size() && good; ++k) {
          auto wc = next_wc(c.scq, 30s);
          TCHECK_MSG(wc.has_value(), "no completion for WR " + std::to_string(k) + " after the peer died");
          if (!wc) return false;
          good &= wc->wr_id == k;
          if (phase == 0 && wc->status == UFAB_WC_SUCCESS) {
            ++successes;
          } else if (phase == 0) {
            good &= wc->status != UFAB_WC_WR_FLUSH_ERR;
            const char* d = P()->wc_detail(c.scq, wc->detail);
            std::fprintf(stderr, "[parent] the first error: %s: %s\n", wc_str(*wc).c_str(), d ? d : "(none)");
            good &= d != nullptr;
            phase = 1;
          } else {
            good &= wc->status == UFAB_WC_WR_FLUSH_ERR;
          }
          TCHECK_MSG(good, "WR " + std::to_string(k) + ": " + wc_str(*wc));
        }
        TCHECK_MSG(phase == 1, "every WR succeeded although the peer died at WR " + std::to_string(kill_after));
        std::fprintf(stderr, "[parent] %zu of %zu WRs succeeded before the peer died\n", successes, plan.size());
        drop_conn(c);
        // The pool is whole again: a loopback WRITE through all of it.
        ConnOptions o = stream_conn();
        ufab_rdma_cq* cq = nullptr;
        TREQUIRE_OK(P()->create_cq(s.dev, 64, &cq));
        ufab_rdma_qp_init init = {UFAB_QPT_RC, 0, cq, cq, o.cap};
        ufab_rdma_qp *q1 = nullptr, *q2 = nullptr;
        uint32_t n1 = 0, n2 = 0;
        TREQUIRE_OK(P()->create_qp(s.pd, &init, &q1, &n1));
        TREQUIRE_OK(P()->create_qp(s.pd, &init, &q2, &n2));
        ufab_device_attr da = {};
        TREQUIRE_OK(P()->query_device(s.dev, &da));
        TREQUIRE_OK(connect_qp(q1, Info{da.ip, n2, 0, 0, 0, 0}, o));
        TREQUIRE_OK(connect_qp(q2, Info{da.ip, n1, 0, 0, 0, 0}, o));
        SWr w;
        w.op = UFAB_WR_RDMA_WRITE;
        w.src_gpu = 0;
        w.dst_gpu = 1;
        w.len = (4u << 20) + 3;
        w.src_off = 5;
        w.dst_off = kSrcArea + 11;
        TREQUIRE(r.mem[1]->store(stream_image(plan, 0, true, 1)));
        TREQUIRE_OK(post_plan_wr(q1, r, mine, w, 77));
        good &= expect_wc(cq, 77, UFAB_WC_SUCCESS, -1, 60s);
        std::vector<SWr> self = {w};
        auto want = stream_image(self, 0, true, 1);
        for (uint64_t j = 0; j < w.len; ++j) want[w.dst_off + j] = pattern(w.src_off + j, kSaltParent);
        good &= check_image(*r.mem[1], want, "parent GPU after the loopback WRITE");
        P()->destroy_qp(q1);
        P()->destroy_qp(q2);
        P()->destroy_cq(cq);
        return good;
      },
      true, 120s);
  g_open_params = nullptr;
  g_open_progress_thread = false;
  EXPECT_TRUE(ok);
}

// A requester's slot goes back once the responder has read it
// (QpCtl::pulled), before the ACK: with the target's copies held, a
// GPU->GPU WRITE of 6 pieces from a requester with gpu_depth=2 still gets
// more than 2 pieces to the target (as many as its 4 slots take), and the
// WRITE completes only after the copies are let go.
TEST(ShmGpu, FakeEngineSlotsBackWhenPulled) {
  g_backend = Backend::kFake;
  const char* params[] = {"gpu_copy=fake", "gpu_frag=8192", "gpu_depth=2", "gpu_slots=4", nullptr};
  g_open_params = params;
  g_open_progress_thread = true;
  const uint64_t len = 6 * kFrag;
  bool ok = run_pair(
      "gpupulled",
      [&](Side& s) {
        Regions r;
        if (!reg(s, r)) return false;
        Remote mine{}, theirs{};
        for (int g = 0; g < 2; ++g) {
          mine.base[g] = r.mem[g]->addr();
          mine.rkey[g] = r.rkey[g];
        }
        TREQUIRE(s.ch.exchange(mine, &theirs));
        Conn c;
        ConnOptions o;
        o.access = UFAB_ACCESS_LOCAL_WRITE | UFAB_ACCESS_REMOTE_WRITE | UFAB_ACCESS_REMOTE_READ;
        if (!make_conn(s, c, o)) return false;
        bool good = true;
        if (!s.parent()) {
          TREQUIRE(r.mem[1]->store(std::vector<uint8_t>(kBuf, kGuard)));
          staging::fake_hold(true);
          TREQUIRE(s.ch.sync("held", 10s));
          uint64_t most = 0;
          // Held for 400 ms at least (the parent checks for no completion
          // meanwhile), at most 5 s while fewer than 4 copies came.
          const auto start = Clock::now();
          for (;;) {
            most = std::max(most, staging::fake_queued());
            const auto t = Clock::now() - start;
            if (t > 5s || (t > 400ms && most >= 4)) break;
            std::this_thread::sleep_for(1ms);
          }
          staging::fake_hold(false);
          TREQUIRE(s.ch.send(&most, sizeof most));
          uint32_t done = 0;
          TREQUIRE(s.ch.recv(&done, sizeof done, 30s));
          Case k;
          k.op = UFAB_WR_RDMA_WRITE;
          k.len = len;
          k.salt = 61;
          good &= check_target(r, 1, k, "child");
        } else {
          TREQUIRE(fill_source(r, 1, 61));
          TREQUIRE(s.ch.sync("held", 10s));
          ufab_sge sg = {r.mem[1]->addr(), static_cast<uint32_t>(len), r.lkey[1]};
          TREQUIRE_OK(post1(c.qp, 5, UFAB_WR_RDMA_WRITE, &sg, 1, UFAB_SEND_SIGNALED, theirs.base[1], theirs.rkey[1]));
          good &= expect_none(c.scq, 200ms);  // held: not placed, not acknowledged
          uint64_t most = 0;
          TREQUIRE(s.ch.recv(&most, sizeof most, 30s));
          TCHECK_MSG(most > 2, "the target held " + std::to_string(most) +
                                   " copies at most: the requester's slots did not come back before the ACK");
          good &= most > 2;
          good &= expect_wc(c.scq, 5, UFAB_WC_SUCCESS, -1, 30s);
          uint32_t done = 1;
          TREQUIRE(s.ch.send(&done, sizeof done));
        }
        s.ch.sync("end", 30s);
        drop_conn(c);
        dereg(r);
        return good;
      },
      false, 60s);
  g_open_params = nullptr;
  g_open_progress_thread = false;
  EXPECT_TRUE(ok);
}

TEST(ShmGpu, FakeEngineRefusals) {
  const char* params[] = {"gpu_copy=fake", nullptr};
  ufab_device_opts o = {};
  o.size = sizeof o;
  o.params = params;
  ufab_rdma_dev* dev = nullptr;
  std::string name = "shm:" + unique_domain("gpuref");
  ASSERT_EQ(P()->open_device(&kHost, name.c_str(), &o, &dev), 0) << g_last_error;
  ufab_device_attr da = {};
  ASSERT_EQ(P()->query_device(dev, &da), 0);
  EXPECT_TRUE(da.mem_types & (1u << UFAB_MEM_CUDA));
  ufab_rdma_pd* pd = nullptr;
  ASSERT_EQ(P()->alloc_pd(dev, &pd), 0);
  std::vector<uint8_t> g(1 << 16), h(1 << 16);
  ufab_mr_attr a = {sizeof a, UFAB_ACCESS_LOCAL_WRITE | UFAB_ACCESS_REMOTE_ATOMIC, g.data(), g.size(), UFAB_MEM_CUDA,
                    0};
  ufab_rdma_mr *mg, *mh;
  uint32_t lg, rg, lh, rh;
  EXPECT_EQ(P()->reg_mr(pd, &a, &mg, &lg, &rg), -EOPNOTSUPP);
  EXPECT_NE(g_last_error.find("atomics on GPU memory are not supported"), std::string::npos) << g_last_error;
  a.access = UFAB_ACCESS_LOCAL_WRITE | UFAB_ACCESS_REMOTE_WRITE | UFAB_ACCESS_REMOTE_READ;
  ASSERT_EQ(P()->reg_mr(pd, &a, &mg, &lg, &rg), 0) << g_last_error;
  ufab_mr_attr b = {sizeof b, a.access | UFAB_ACCESS_REMOTE_ATOMIC, h.data(), h.size(), UFAB_MEM_HOST, 0};
  ASSERT_EQ(P()->reg_mr(pd, &b, &mh, &lh, &rh), 0) << g_last_error;
  ufab_rdma_cq* cq;
  ASSERT_EQ(P()->create_cq(dev, 64, &cq), 0);
  ufab_rdma_qp_init init = {UFAB_QPT_RC, 1, cq, cq, {16, 16, 2, 2, 64}};
  ufab_rdma_qp *q1, *q2;
  uint32_t n1, n2;
  ASSERT_EQ(P()->create_qp(pd, &init, &q1, &n1), 0);
  ASSERT_EQ(P()->create_qp(pd, &init, &q2, &n2), 0);
  ConnOptions co;
  ASSERT_EQ(connect_qp(q1, Info{da.ip, n2, 0, 0, 0, 0}, co), 0) << g_last_error;
  ASSERT_EQ(connect_qp(q2, Info{da.ip, n1, 0, 0, 0, 0}, co), 0) << g_last_error;
  // Inline data from GPU memory: the CPU would read it.
  ufab_sge sg = {reinterpret_cast<uint64_t>(g.data()), 16, lg};
  EXPECT_EQ(post1(q1, 1, UFAB_WR_SEND, &sg, 1, UFAB_SEND_SIGNALED | UFAB_SEND_INLINE), -EINVAL);
  EXPECT_NE(g_last_error.find("inline data from GPU memory"), std::string::npos) << g_last_error;
  // An atomic's result into GPU memory.
  ufab_sge res = {reinterpret_cast<uint64_t>(g.data()), 8, lg};
  EXPECT_EQ(post_atomic(q1, 2, UFAB_WR_ATOMIC_FETCH_AND_ADD, res, reinterpret_cast<uint64_t>(h.data()), rh, 1, 0),
            -EOPNOTSUPP);
  EXPECT_NE(g_last_error.find("result SGE is GPU memory"), std::string::npos) << g_last_error;
  // Loopback in one device: a WRITE and a READ through the pool.
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<uint8_t>(i * 7);
  ufab_sge hs = {reinterpret_cast<uint64_t>(h.data()), 40000, lh};
  ASSERT_EQ(post1(q1, 3, UFAB_WR_RDMA_WRITE, &hs, 1, UFAB_SEND_SIGNALED, reinterpret_cast<uint64_t>(g.data()) + 5, rg),
            0);
  EXPECT_TRUE(expect_wc(cq, 3, UFAB_WC_SUCCESS));
  for (size_t i = 0; i < 40000; ++i) ASSERT_EQ(g[5 + i], static_cast<uint8_t>(i * 7)) << i;
  for (auto* q : {q1, q2}) EXPECT_EQ(P()->destroy_qp(q), 0);
  EXPECT_EQ(P()->destroy_cq(cq), 0);
  EXPECT_EQ(P()->dereg_mr(mg), 0);
  EXPECT_EQ(P()->dereg_mr(mh), 0);
  P()->dealloc_pd(pd);
  P()->close_device(dev);
}

TEST(ShmGpu, BadGpuParameterSaysSo) {
  const char* params[] = {"gpu_frag=1000", nullptr};
  ufab_device_opts o = {};
  o.size = sizeof o;
  o.params = params;
  ufab_rdma_dev* dev = nullptr;
  std::string name = "shm:" + unique_domain("gpubad");
  EXPECT_EQ(P()->open_device(&kHost, name.c_str(), &o, &dev), -EINVAL);
  EXPECT_NE(g_last_error.find("multiple of 4096"), std::string::npos) << g_last_error;
}

// ------------------------------------------------------------------ CUDA

// Why the CUDA backend cannot run here (asked in a forked process, so
// this one never initialises CUDA), empty when it can.
std::string no_gpu_reason() {
  int p[2];
  if (::pipe(p) != 0) return "pipe failed";
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(p[0]);
    std::string why;
    auto d = gpu::Driver::get();
    if (!d) {
      why = d.error().message();
    } else if (auto n = (*d)->device_count(); !n) {
      why = n.error().message();
    } else if (*n == 0) {
      why = "the driver sees no GPU";
    }
    ssize_t w = ::write(p[1], why.data(), why.size());
    (void)w;
    ::_exit(0);
  }
  ::close(p[1]);
  std::string why;
  char buf[512];
  ssize_t n;
  while ((n = ::read(p[0], buf, sizeof buf)) > 0) why.append(buf, static_cast<size_t>(n));
  ::close(p[0]);
  int st = 0;
  ::waitpid(pid, &st, 0);
  return why;
}

// fn in a forked runner (which forks again in run_pair); its verdict.
bool in_runner(const std::function<bool()>& fn) {
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(fn() ? 0 : 1);
  int st = 0;
  auto deadline = Clock::now() + 300s;
  while (::waitpid(pid, &st, WNOHANG) != pid) {
    if (Clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &st, 0);
      return false;
    }
    std::this_thread::sleep_for(5ms);
  }
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

#define SKIP_WITHOUT_GPU()                                   \
  do {                                                       \
    std::string why = no_gpu_reason();                       \
    if (!why.empty()) GTEST_SKIP() << "no GPU: " << why;     \
  } while (0)

TEST(ShmGpu, CudaEngineEveryOpDirectionSizeOffset) {
  SKIP_WITHOUT_GPU();
  // One runner per pair of processes: a process that initialised CUDA
  // does not fork again.
  // gpu_ipc=0: everything through the staging slots (the fallback path).
  EXPECT_TRUE(in_runner([] {
    g_backend = Backend::kCuda;
    g_expect_ipc = false;
    return run_cases("gpucuda", matrix(true), {"gpu_frag=8192", "gpu_depth=3", "gpu_ipc=0"});
  }));
  // The defaults: GPU<->GPU WRITE, WRITE_WITH_IMM and READ through CUDA
  // IPC (checked per case by the path counters), the rest staged.
  EXPECT_TRUE(in_runner([] {
    g_backend = Backend::kCuda;
    g_expect_ipc = true;
    return run_cases("gpucuda256k", matrix(true), {});
  }));
}

// GPU<->GPU through CUDA IPC from 1 B to 64 MiB, aligned and unaligned,
// over two SGEs, every byte of the 64 MiB target region checked (and
// SEND beside them, which stages).
TEST(ShmGpu, CudaIpcGpuToGpuUpTo64MiB) {
  SKIP_WITHOUT_GPU();
  EXPECT_TRUE(in_runner([] {
    g_backend = Backend::kCuda;
    g_expect_ipc = true;
    g_buf = (64u << 20) + (64u << 10);
    std::vector<Case> cases;
    uint32_t salt = 3000;
    for (uint32_t op : {UFAB_WR_RDMA_WRITE, UFAB_WR_RDMA_WRITE_WITH_IMM, UFAB_WR_RDMA_READ, UFAB_WR_SEND}) {
      for (uint64_t len : {uint64_t{1}, uint64_t{4093}, uint64_t{65536 + 5}, uint64_t{(1u << 20) + 3},
                           uint64_t{(16u << 20) + 1}, uint64_t{64u << 20}}) {
        for (auto [so, d] : {std::pair<uint64_t, uint64_t>{0, 0}, {4093, 17}}) {
          Case k;
          k.op = op;
          k.src_gpu = k.dst_gpu = 1;
          k.len = len;
          k.src_off = so;
          k.dst_off = d;
          k.salt = salt++;
          cases.push_back(k);
        }
      }
    }
    return run_cases("gpuipc64m", cases, {});
  }));
}

// A GPU buffer freed under its live region with CUDA IPC on: the
// responder's (a WRITE and a READ GPU<->GPU refused with
// REM_ACCESS_ERR, its buffer id checked before the copy) and the
// requester's (refused at post with EACCES).
TEST(ShmGpu, CudaIpcFreedBufferUnderLiveRegion) {
  SKIP_WITHOUT_GPU();
  for (int scenario = 0; scenario < 3; ++scenario) {
    EXPECT_TRUE(in_runner([scenario] {
      g_backend = Backend::kCuda;
      g_open_progress_thread = true;
      return run_pair(
          "gpuipcfreed",
          [scenario](Side& s) {
            Regions r;
            if (!reg(s, r)) return false;
            Remote mine{}, theirs{};
            for (int g = 0; g < 2; ++g) {
              mine.base[g] = r.mem[g]->addr();
              mine.rkey[g] = r.rkey[g];
            }
            TREQUIRE(s.ch.exchange(mine, &theirs));
            Conn c;
            ConnOptions o;
            o.access = UFAB_ACCESS_LOCAL_WRITE | UFAB_ACCESS_REMOTE_WRITE | UFAB_ACCESS_REMOTE_READ;
            if (!make_conn(s, c, o)) return false;
            bool good = true;
            // One good GPU->GPU WRITE first: the handle is open and cached.
            if (s.parent()) {
              const auto before = shm::gpu_path_stats();
              ufab_sge sg = {r.mem[1]->addr(), 65536, r.lkey[1]};
              TREQUIRE_OK(post1(c.qp, 1, UFAB_WR_RDMA_WRITE, &sg, 1, UFAB_SEND_SIGNALED, theirs.base[1], theirs.rkey[1]));
              good &= expect_wc(c.scq, 1, UFAB_WC_SUCCESS, -1, 20s);
              TCHECK_MSG(shm::gpu_path_stats().ipc_wrs == before.ipc_wrs + 1, "the first WRITE did not take CUDA IPC");
              good &= shm::gpu_path_stats().ipc_wrs == before.ipc_wrs + 1;
            }
            TREQUIRE(s.ch.sync("warm"));
            if (scenario < 2 && !s.parent()) r.mem[1]->free_device();  // the responder's, under its live region
            if (scenario == 2 && s.parent()) r.mem[1]->free_device();  // the requester's
            TREQUIRE(s.ch.sync("freed"));
            if (s.parent()) {
              ufab_sge sg = {mine.base[1], 4096, r.lkey[1]};
              const uint32_t op = scenario == 1 ? UFAB_WR_RDMA_READ : UFAB_WR_RDMA_WRITE;
              if (scenario == 2) {
                TCHECK_EQ(post1(c.qp, 2, op, &sg, 1, UFAB_SEND_SIGNALED, theirs.base[1], theirs.rkey[1]), -EACCES);
                TCHECK_MSG(g_last_error.find("was freed") != std::string::npos, g_last_error);
                good &= g_last_error.find("was freed") != std::string::npos;
              } else {
                TREQUIRE_OK(post1(c.qp, 2, op, &sg, 1, UFAB_SEND_SIGNALED, theirs.base[1], theirs.rkey[1]));
                ufab_wc wc{};
                good &= expect_wc(c.scq, 2, UFAB_WC_REM_ACCESS_ERR, -1, 20s, &wc);
                const char* d = P()->wc_detail(c.scq, wc.detail);
                std::fprintf(stderr, "[parent] scenario %d: %s: %s\n", scenario, wc_str(wc).c_str(), d ? d : "(none)");
              }
            }
            s.ch.sync("end");
            drop_conn(c);
            dereg(r);
            return good;
          },
          false, 60s);
    }));
  }
}

// The requester killed while the responder's copies through CUDA IPC
// read its GPU memory (many 8 MiB WRITEs GPU->GPU in flight): the
// responder's QP fails its receives cleanly (flushed, nothing hangs), the
// dead peer's mapping is closed, and the device still moves GPU memory
// (a loopback WRITE in the same process, staged, every byte checked).
TEST(ShmGpu, CudaIpcPeerKilledMidStream) {
  SKIP_WITHOUT_GPU();
  EXPECT_TRUE(in_runner([] {
    g_backend = Backend::kCuda;
    g_open_progress_thread = true;
    g_buf = 16u << 20;
    return run_pair(
        "gpuipckill",
        [](Side& s) {
          Regions r;
          if (!reg(s, r)) return false;
          Remote mine{}, theirs{};
          for (int g = 0; g < 2; ++g) {
            mine.base[g] = r.mem[g]->addr();
            mine.rkey[g] = r.rkey[g];
          }
          TREQUIRE(s.ch.exchange(mine, &theirs));
          Conn c;
          ConnOptions o;
          o.access = UFAB_ACCESS_LOCAL_WRITE | UFAB_ACCESS_REMOTE_WRITE | UFAB_ACCESS_REMOTE_READ;
          o.cq_depth = 1024;
          if (!make_conn(s, c, o)) return false;
          constexpr int kWrs = 200, kRecvs = 40;
          if (!s.parent()) {
            // The requester: WRITE_WITH_IMM every 5th, all GPU->GPU, 8 MiB.
            TREQUIRE(fill_source(r, 1, 77));
            TREQUIRE(s.ch.sync("posted receives", 30s));
            for (int k = 0; k < kWrs; ++k) {
              ufab_sge sg = {r.mem[1]->addr() + (k % 3) * 4096, 8u << 20, r.lkey[1]};
              const uint32_t op = k % 5 == 4 ? UFAB_WR_RDMA_WRITE_WITH_IMM : UFAB_WR_RDMA_WRITE;
              int rc = post1(c.qp, static_cast<uint64_t>(k), op, &sg, 1, UFAB_SEND_SIGNALED, theirs.base[1] + (k % 7),
                             theirs.rkey[1], static_cast<uint32_t>(k));
              if (rc != 0) break;  // the send queue is full: enough in flight
            }
            TCHECK(expect_wc(c.scq, 0, UFAB_WC_SUCCESS, -1, 30s));
            ::kill(::getpid(), SIGKILL);
            return false;  // not reached
          }
          for (int k = 0; k < kRecvs; ++k) TREQUIRE_OK(recv1(c.qp, static_cast<uint64_t>(1000 + k), nullptr, 0));
          const auto before = shm::gpu_path_stats();
          TREQUIRE(s.ch.sync("posted receives", 30s));
          // Every receive completes: some with the immediate, then the
          // rest flushed once the peer is gone; bounded.
          bool good = true;
          int ok = 0, flushed = 0;
          for (int k = 0; k < kRecvs && good; ++k) {
            auto wc = next_wc(c.rcq, 30s);
            TCHECK_MSG(wc.has_value(), "receive " + std::to_string(k) + " never completed after the peer died");
            if (!wc) return false;
            if (wc->status == UFAB_WC_SUCCESS) {
              ++ok;
              good &= flushed == 0;
            } else {
              ++flushed;
              good &= wc->status == UFAB_WC_WR_FLUSH_ERR;
            }
            TCHECK_MSG(good, "receive " + std::to_string(k) + ": " + wc_str(*wc));
          }
          std::fprintf(stderr, "[parent] %d receives completed, %d flushed after the peer died\n", ok, flushed);
          TCHECK_MSG(flushed > 0, "every receive completed although the requester died");
          good &= flushed > 0;
          const auto mid = shm::gpu_path_stats();
          TCHECK_MSG(mid.ipc_copies > before.ipc_copies, "no copy through CUDA IPC before the peer died");
          good &= mid.ipc_copies > before.ipc_copies;
          // The dead peer's mapping is closed (after its copies).
          bool closed = false;
          for (int i = 0; i < 500 && !closed; ++i) {
            auto now = shm::gpu_path_stats();
            closed = now.ipc_closes >= now.ipc_opens && now.ipc_opens > 0;
            if (!closed) std::this_thread::sleep_for(10ms);
          }
          TCHECK_MSG(closed, "the dead peer's CUDA IPC mapping was not closed");
          good &= closed;
          drop_conn(c);
          // The device still works: a loopback GPU->GPU WRITE (one
          // process: staged), every byte checked.
          ufab_rdma_cq* cq = nullptr;
          TREQUIRE_OK(P()->create_cq(s.dev, 64, &cq));
          ufab_rdma_qp_init init = {UFAB_QPT_RC, 0, cq, cq, o.cap};
          ufab_rdma_qp *q1 = nullptr, *q2 = nullptr;
          uint32_t n1 = 0, n2 = 0;
          TREQUIRE_OK(P()->create_qp(s.pd, &init, &q1, &n1));
          TREQUIRE_OK(P()->create_qp(s.pd, &init, &q2, &n2));
          ufab_device_attr da = {};
          TREQUIRE_OK(P()->query_device(s.dev, &da));
          TREQUIRE_OK(connect_qp(q1, Info{da.ip, n2, 0, 0, 0, 0}, o));
          TREQUIRE_OK(connect_qp(q2, Info{da.ip, n1, 0, 0, 0, 0}, o));
          TREQUIRE(fill_source(r, 0, 91));
          TREQUIRE(r.mem[1]->store(std::vector<uint8_t>(g_buf, kGuard)));
          Case k;
          k.op = UFAB_WR_RDMA_WRITE;
          k.len = (4u << 20) + 3;
          k.src_off = 5;
          k.dst_off = 11;
          k.salt = 91;
          ufab_sge sg = {r.mem[0]->addr() + 5, static_cast<uint32_t>(k.len), r.lkey[0]};
          TREQUIRE_OK(post1(q1, 77, UFAB_WR_RDMA_WRITE, &sg, 1, UFAB_SEND_SIGNALED, r.mem[1]->addr() + 11, r.rkey[1]));
          good &= expect_wc(cq, 77, UFAB_WC_SUCCESS, -1, 60s);
          good &= check_target(r, 1, k, "parent after the peer died");
          P()->destroy_qp(q1);
          P()->destroy_qp(q2);
          P()->destroy_cq(cq);
          dereg(r);
          return good;
        },
        true, 120s);
  }));
}

TEST(ShmGpu, CudaFreedBufferUnderLiveRegion) {
  SKIP_WITHOUT_GPU();
  EXPECT_TRUE(in_runner([] {
    g_backend = Backend::kCuda;
    g_open_progress_thread = true;
    return run_pair(
        "gpufreed",
        [](Side& s) {
          Regions r;
          if (!reg(s, r)) return false;
          Remote mine{}, theirs{};
          for (int g = 0; g < 2; ++g) {
            mine.base[g] = r.mem[g]->addr();
            mine.rkey[g] = r.rkey[g];
          }
          TREQUIRE(s.ch.exchange(mine, &theirs));
          Conn c;
          if (!make_conn(s, c)) return false;
          if (!s.parent()) {
            r.mem[1]->free_device();  // freed under its live region
            ufab_sge sg = {mine.base[1], 64, r.lkey[1]};
            TCHECK_EQ(recv1(c.qp, 1, &sg, 1), -EACCES);
            TCHECK_MSG(g_last_error.find("was freed") != std::string::npos, g_last_error);
          }
          TREQUIRE(s.ch.sync("freed"));
          if (s.parent()) {
            ufab_sge sg = {r.mem[0]->addr(), 4096, r.lkey[0]};
            TREQUIRE_OK(post1(c.qp, 2, UFAB_WR_RDMA_WRITE, &sg, 1, UFAB_SEND_SIGNALED, theirs.base[1], theirs.rkey[1]));
            TCHECK(expect_wc(c.scq, 2, UFAB_WC_REM_ACCESS_ERR));
          }
          s.ch.sync("end");
          drop_conn(c);
          dereg(r);
          return true;
        },
        false, 60s);
  }));
}

}  // namespace
}  // namespace ufab::shm_test
