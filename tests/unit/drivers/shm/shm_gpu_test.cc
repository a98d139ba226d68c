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

#include "core/gpu/cuda.h"
#include "core/staging/fake_engine.h"
#include "tests/unit/drivers/shm/pair.h"

namespace ufab::shm_test {
namespace {

constexpr size_t kFrag = 8192;
constexpr size_t kBuf = (4u << 20) + 8 * kFrag;
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
    r.mem[g] = std::make_unique<Mem>(g == 1, kBuf);
    TREQUIRE(r.mem[g]->ok());
    ufab_mr_attr a = {sizeof a, acc, reinterpret_cast<void*>(r.mem[g]->addr()), kBuf,
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
};

// An SGE list over [off, off + len) of a region: two SGEs when long enough.
uint32_t split(const Regions& r, int g, uint64_t off, uint64_t len, ufab_sge* out) {
  const uint64_t cut = len > 2 ? len / 3 : len;
  out[0] = {r.mem[g]->addr() + off, static_cast<uint32_t>(cut), r.lkey[g]};
  if (cut == len) return 1;
  out[1] = {r.mem[g]->addr() + off + cut, static_cast<uint32_t>(len - cut), r.lkey[g]};
  return 2;
}

bool fill_source(Regions& r, int g, uint32_t salt) {
  std::vector<uint8_t> b(kBuf);
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
    if (read) {
      TREQUIRE(fill_source(r, k.src_gpu, k.salt));
    } else {
      TREQUIRE(r.mem[k.dst_gpu]->store(std::vector<uint8_t>(kBuf, kGuard)));
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
    Result res{ok ? 1u : 0u, copies() - before};
    TREQUIRE(s.ch.send(&res, sizeof res));
  }
}

// The parent: one transfer (READ: the child's memory into the parent's).
bool one(Side& s, Regions& r, Conn& c, const Remote& peer, const Case& k) {
  TREQUIRE(s.ch.send(&k, sizeof k));
  const bool read = k.op == UFAB_WR_RDMA_READ;
  const uint64_t before = copies();
  if (read) {
    TREQUIRE(r.mem[k.dst_gpu]->store(std::vector<uint8_t>(kBuf, kGuard)));
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
  EXPECT_TRUE(in_runner([] {
    g_backend = Backend::kCuda;
    return run_cases("gpucuda", matrix(true), {"gpu_frag=8192", "gpu_depth=3"});
  }));
  EXPECT_TRUE(in_runner([] {
    g_backend = Backend::kCuda;
    return run_cases("gpucuda256k", matrix(true), {});
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
