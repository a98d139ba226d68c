// The GPU staging pipeline end to end, through the public C++ API: two
// soft-RoCE devices over swnic, RC SEND/RECV, WRITE, WRITE_WITH_IMM and
// READ between host and GPU memory both ways and GPU to GPU, at fragment
// boundaries (1 B, frag-1, frag, frag+1, many fragments) and unaligned
// offsets, staging depths 1..N, copies completing out of order, 2% loss
// with retransmissions while copies are in flight, and completions only
// after placement (the fake engine holds every copy: nothing completes,
// nothing is acknowledged, until it lets go). Every byte is checked, and
// the bytes around each target are checked untouched.
//
// Backends: "fake" (gpu_copy=fake: host memory registered as
// UFAB_MEM_CUDA, moved by the fake copy engine's thread) and "cuda"
// (cuMemAlloc'd memory, the real copy engine; skipped with "no GPU: ..."
// without one).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/gpu/cuda.h"
#include "core/staging/fake_engine.h"
#include "ufab/rdma.hpp"

namespace ufab::staging_test {
namespace {

using namespace ::ufab::rdma;
using Params = std::map<std::string, std::string>;

constexpr size_t kFrag = 8192;  // gpu_frag in most tests: 8 packets at the 1024-byte path MTU
constexpr uint8_t kGuard = 0xEE;

enum class Backend { kFake, kCuda };

// Why the CUDA backend cannot run here, empty when it can.
std::string no_gpu_reason() {
  auto d = gpu::Driver::get();
  if (!d) return d.error().message();
  auto n = (*d)->device_count();
  if (!n) return n.error().message();
  if (*n == 0) return "the driver sees no GPU";
  return {};
}

// A buffer on one end: host memory, or "GPU" memory (real device memory
// for the CUDA backend, host memory registered as UFAB_MEM_CUDA for the
// fake one). Filled and read back whole.
class Buf {
 public:
  Buf(Backend backend, bool gpu, size_t size) : gpu_(gpu), real_(backend == Backend::kCuda && gpu), size_(size) {
    if (real_) {
      auto d = gpu::Driver::get();
      auto a = gpu::Allocation::allocate(**d, 0, gpu::Allocation::Kind::kDevice, size);
      EXPECT_TRUE(a) << a.error().message();
      if (a) dev_.emplace(std::move(*a));
    } else {
      host_.assign(size, 0);
    }
  }
  void* data() { return real_ ? (dev_ ? dev_->data() : nullptr) : host_.data(); }
  size_t size() const { return size_; }
  bool gpu() const { return gpu_; }
  void store(const std::vector<uint8_t>& bytes) {
    if (real_) {
      auto s = dev_->write(0, bytes.data(), bytes.size());
      ASSERT_TRUE(s) << s.error().message();
    } else {
      std::memcpy(host_.data(), bytes.data(), bytes.size());
    }
  }
  std::vector<uint8_t> load() {
    std::vector<uint8_t> out(size_);
    if (real_) {
      auto s = dev_->read(0, out.data(), out.size());
      EXPECT_TRUE(s) << s.error().message();
    } else {
      std::memcpy(out.data(), host_.data(), size_);
    }
    return out;
  }

 private:
  bool gpu_, real_;
  size_t size_;
  std::vector<uint8_t> host_;
  std::optional<gpu::Allocation> dev_;
};

struct Side {
  std::unique_ptr<Device> dev;
  std::optional<ProtectionDomain> pd;
  std::unique_ptr<CompletionQueue> cq;
  std::unique_ptr<QueuePair> qp;
  std::unique_ptr<Buf> host, gpu;
  std::optional<MemoryRegion> mr_host, mr_gpu;
  Buf& buf(bool g) { return g ? *gpu : *host; }
  MemoryRegion& mr(bool g) { return g ? *mr_gpu : *mr_host; }
};

struct Pair {
  Backend backend = Backend::kFake;
  size_t frag = 256 * 1024;  // gpu_frag
  Side a, b;
};

void open_side(Side& s, Backend backend, const std::string& name, const std::string& ip, const Params& params,
               size_t size) {
  auto d = Device::open(name, {.ip = ip, .params = params, .progress_thread = true});
  ASSERT_TRUE(d) << d.error().message();
  s.dev = std::move(*d);
  s.pd.emplace(*s.dev->alloc_pd());
  s.cq = std::move(*s.dev->create_cq(1024));
  auto q = s.pd->create_qp({.type = QpType::kRc, .send_cq = s.cq.get(), .recv_cq = s.cq.get(),
                            .caps = {.max_send_wr = 64, .max_recv_wr = 64}});
  ASSERT_TRUE(q) << q.error().message();
  s.qp = std::move(*q);
  s.host = std::make_unique<Buf>(backend, false, size);
  s.gpu = std::make_unique<Buf>(backend, true, size);
  const AccessFlags acc = kLocalWrite | kRemoteWrite | kRemoteRead;
  auto mh = s.pd->register_mr(s.host->data(), size, acc);
  ASSERT_TRUE(mh) << mh.error().message();
  auto mg = s.pd->register_mr(s.gpu->data(), size, acc, MemoryType::kCuda);
  ASSERT_TRUE(mg) << mg.error().message();
  s.mr_host.emplace(std::move(*mh));
  s.mr_gpu.emplace(std::move(*mg));
}

// Two devices on one swnic link, one RC QP each, connected; `size` bytes
// of host and of GPU memory on each end.
void open_pair(Pair& p, Backend backend, Params params, size_t size) {
  static int run = 0;
  p.backend = backend;
  if (auto it = params.find("gpu_frag"); it != params.end()) p.frag = std::stoul(it->second);
  if (backend == Backend::kFake) params["gpu_copy"] = "fake";
  std::string link = "swnic:st" + std::to_string(::getpid()) + "r" + std::to_string(run++);
  auto pa = params;
  pa["stale"] = "reset";
  open_side(p.a, backend, link + ":0", "10.9.0.1", pa, size);
  open_side(p.b, backend, link + ":1", "10.9.0.2", params, size);
  if (!p.a.qp || !p.b.qp) return;
  ASSERT_TRUE(p.a.qp->connect(p.b.qp->local()));
  ASSERT_TRUE(p.b.qp->connect(p.a.qp->local()));
}

std::optional<WorkCompletion> wait_one(CompletionQueue& cq, std::chrono::milliseconds t = std::chrono::seconds(20)) {
  WorkCompletion wc[1];
  auto n = cq.wait(wc, t);
  if (!n || *n != 1) return std::nullopt;
  return wc[0];
}

uint8_t pattern(size_t i, unsigned salt) { return static_cast<uint8_t>(i * 131 + salt * 7 + (i >> 11)); }

enum class Op { kSend, kWrite, kWriteImm, kRead };
const char* op_name(Op op) {
  switch (op) {
    case Op::kSend: return "SEND";
    case Op::kWrite: return "WRITE";
    case Op::kWriteImm: return "WRITE_WITH_IMM";
    case Op::kRead: return "READ";
  }
  return "?";
}

// One transfer of `len` bytes from the source buffer (at `src_off`) to the
// destination buffer (at `dst_off`): a -> b for SEND and WRITEs, b -> a
// for READ (a reads b's memory). Every byte of the target checked, and the
// bytes around it untouched. The source is split over two SGEs when it
// is long enough, so fragments span SGEs.
void transfer(Pair& p, Op op, bool src_gpu, bool dst_gpu, size_t len, size_t src_off, size_t dst_off,
              unsigned salt) {
  SCOPED_TRACE(std::string(op_name(op)) + (src_gpu ? " gpu" : " host") + "->" + (dst_gpu ? "gpu" : "host") + " len " +
               std::to_string(len) + " offsets " + std::to_string(src_off) + "/" + std::to_string(dst_off));
  const bool read = op == Op::kRead;
  Side& from = read ? p.b : p.a;
  Side& to = read ? p.a : p.b;
  Buf& sbuf = from.buf(src_gpu);
  Buf& dbuf = to.buf(dst_gpu);
  std::vector<uint8_t> src(sbuf.size());
  for (size_t i = 0; i < src.size(); ++i) src[i] = pattern(i, salt);
  sbuf.store(src);
  dbuf.store(std::vector<uint8_t>(dbuf.size(), kGuard));
  const uint64_t copies_before = staging::fake_completed();
  auto daddr = reinterpret_cast<uintptr_t>(dbuf.data()) + dst_off;
  auto saddr = reinterpret_cast<uintptr_t>(sbuf.data()) + src_off;
  Sge sgl[2];
  size_t nsge = 0;
  if (read) {
    const size_t cut = len > 2 ? len / 3 : len;
    sgl[nsge++] = to.mr(dst_gpu).sge(dst_off, cut);
    if (cut < len) sgl[nsge++] = to.mr(dst_gpu).sge(dst_off + cut, len - cut);
    ASSERT_TRUE(p.a.qp->post_send({.wr_id = salt, .opcode = WrOpcode::kRdmaRead, .flags = kSendSignaled,
                                   .sgl = {sgl, nsge}, .remote_addr = saddr, .rkey = from.mr(src_gpu).rkey()}));
  } else {
    const size_t cut = len > 2 ? len / 3 : len;
    sgl[nsge++] = from.mr(src_gpu).sge(src_off, cut);
    if (cut < len) sgl[nsge++] = from.mr(src_gpu).sge(src_off + cut, len - cut);
    Sge rsge = to.mr(dst_gpu).sge(dst_off, len + 17);  // room beyond: byte_len says what arrived
    if (op == Op::kSend) {
      ASSERT_TRUE(p.b.qp->post_recv({.wr_id = 1000 + salt, .sgl = {&rsge, 1}}));
    } else if (op == Op::kWriteImm) {
      ASSERT_TRUE(p.b.qp->post_recv({.wr_id = 1000 + salt, .sgl = {}}));
    }
    const WrOpcode wop = op == Op::kSend ? WrOpcode::kSend
                         : op == Op::kWrite ? WrOpcode::kRdmaWrite
                                            : WrOpcode::kRdmaWriteWithImm;
    ASSERT_TRUE(p.a.qp->post_send({.wr_id = salt, .opcode = wop, .flags = kSendSignaled, .sgl = {sgl, nsge},
                                   .imm_data = 0xC0DE0000u + salt, .remote_addr = daddr,
                                   .rkey = to.mr(dst_gpu).rkey()}));
  }
  auto wc = wait_one(*p.a.cq);
  ASSERT_TRUE(wc) << "no completion at the requester; a: " << to_string(p.a.dev->stats())
                  << "; b: " << to_string(p.b.dev->stats());
  ASSERT_EQ(wc->status, WcStatus::kSuccess) << wc->error;
  EXPECT_EQ(wc->wr_id, salt);
  if (op == Op::kSend || op == Op::kWriteImm) {
    auto r = wait_one(*p.b.cq);
    ASSERT_TRUE(r) << "no receive completion";
    ASSERT_EQ(r->status, WcStatus::kSuccess) << r->error;
    EXPECT_EQ(r->wr_id, 1000 + salt);
    EXPECT_EQ(r->byte_len, len);
    if (op == Op::kWriteImm) {
      EXPECT_EQ(r->imm_data, 0xC0DE0000u + salt);
    }
  }
  if (p.backend == Backend::kFake) {
    // At least a copy per fragment of each GPU end went through the engine.
    const uint64_t frags = (len + p.frag - 1) / p.frag;
    EXPECT_GE(staging::fake_completed() - copies_before, frags * ((src_gpu ? 1 : 0) + (dst_gpu ? 1 : 0)) / 2)
        << "the GPU ends were not staged";
    EXPECT_GT(staging::fake_completed(), copies_before) << "the GPU ends were not staged";
  }
  // Read right at the completion: the data must be in place by now.
  std::vector<uint8_t> got = dbuf.load();
  for (size_t i = 0; i < got.size(); ++i) {
    const bool inside = i >= dst_off && i < dst_off + len;
    const uint8_t want = inside ? src[src_off + (i - dst_off)] : kGuard;
    ASSERT_EQ(got[i], want) << (inside ? "byte " + std::to_string(i - dst_off) + " of the transfer"
                                       : "byte " + std::to_string(i) + " outside the target was touched");
  }
}

const std::vector<std::pair<bool, bool>> kDirections = {{true, false}, {false, true}, {true, true}};
const std::vector<Op> kOps = {Op::kSend, Op::kWrite, Op::kWriteImm, Op::kRead};

class Pipeline : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (GetParam() == Backend::kCuda) {
      if (auto why = no_gpu_reason(); !why.empty()) GTEST_SKIP() << "no GPU: " << why;
    }
  }
};

TEST_P(Pipeline, FragmentBoundariesAndOffsets) {
  Pair p;
  open_pair(p, GetParam(), {{"gpu_frag", std::to_string(kFrag)}, {"gpu_depth", "4"}}, 4 * kFrag + 64);
  ASSERT_TRUE(p.a.qp && p.b.qp);
  unsigned salt = 1;
  for (size_t len : {size_t{1}, kFrag - 1, kFrag, kFrag + 1, 3 * kFrag + 5}) {
    for (auto [so, dof] : {std::pair<size_t, size_t>{0, 0}, {1, 3}, {4093, 7}}) {
      for (auto [sg, dg] : kDirections) {
        for (Op op : kOps) transfer(p, op, sg, dg, len, so, dof, salt++);
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST_P(Pipeline, Depths) {
  for (const char* depth : {"1", "2", "3", "8"}) {
    SCOPED_TRACE(std::string("gpu_depth=") + depth);
    Pair p;
    open_pair(p, GetParam(), {{"gpu_frag", std::to_string(kFrag)}, {"gpu_depth", depth}}, 6 * kFrag);
    ASSERT_TRUE(p.a.qp && p.b.qp);
    unsigned salt = 1;
    for (auto [sg, dg] : kDirections) {
      for (Op op : kOps) transfer(p, op, sg, dg, 5 * kFrag + 7, 5, 1, salt++);
      if (HasFatalFailure()) return;
    }
  }
}

// Loss and retransmission while copies are in flight: go-back-N resends
// from held slots, duplicates arrive while copies in run, READ holes are
// asked for again; every byte still right.
TEST_P(Pipeline, LossWhileCopiesInFlight) {
  Params params{{"gpu_frag", std::to_string(kFrag)}, {"gpu_depth", "3"}, {"loss", "0.02"}};
  if (GetParam() == Backend::kFake) {
    params["gpu_fake_delay_us"] = "40";
    params["gpu_fake_order"] = "random";
  }
  Pair p;
  open_pair(p, GetParam(), params, 8 * kFrag);
  ASSERT_TRUE(p.a.qp && p.b.qp);
  unsigned salt = 1;
  for (int round = 0; round < 3; ++round) {
    for (auto [sg, dg] : kDirections) {
      for (Op op : kOps) transfer(p, op, sg, dg, 7 * kFrag + 11 * round + 1, round, 2 * round, salt++);
      if (HasFatalFailure()) return;
    }
  }
  auto sa = p.a.dev->stats(), sb = p.b.dev->stats();
  EXPECT_GT(sa.retransmits + sb.retransmits, 0u) << "2% loss over this many packets must have resent some";
}

// Many work requests in flight at once, each over several fragments: the
// staging of one overlaps the wire of the one before.
TEST_P(Pipeline, ManyRequestsInFlight) {
  Params params{{"gpu_frag", std::to_string(kFrag)}, {"gpu_depth", "4"}};
  if (GetParam() == Backend::kFake) {
    params["gpu_fake_delay_us"] = "20";
    params["gpu_fake_order"] = "random";
  }
  Pair p;
  constexpr size_t kEach = 2 * kFrag + 300;
  constexpr int kCount = 12;
  open_pair(p, GetParam(), params, kCount * kEach);
  ASSERT_TRUE(p.a.qp && p.b.qp);
  std::vector<uint8_t> src(p.a.gpu->size());
  for (size_t i = 0; i < src.size(); ++i) src[i] = pattern(i, 77);
  p.a.gpu->store(src);
  p.b.gpu->store(std::vector<uint8_t>(src.size(), kGuard));
  for (int i = 0; i < kCount; ++i) {
    Sge s = p.a.mr_gpu->sge(i * kEach, kEach);
    ASSERT_TRUE(p.a.qp->post_send({.wr_id = static_cast<uint64_t>(i), .opcode = WrOpcode::kRdmaWrite,
                                   .flags = kSendSignaled, .sgl = {&s, 1},
                                   .remote_addr = reinterpret_cast<uintptr_t>(p.b.gpu->data()) + i * kEach,
                                   .rkey = p.b.mr_gpu->rkey()}));
  }
  for (int i = 0; i < kCount; ++i) {
    auto wc = wait_one(*p.a.cq);
    ASSERT_TRUE(wc);
    ASSERT_EQ(wc->status, WcStatus::kSuccess) << wc->error;
    EXPECT_EQ(wc->wr_id, static_cast<uint64_t>(i)) << "completions in order";
  }
  EXPECT_EQ(p.b.gpu->load(), src);
}

// Default parameters (256 KiB fragments, depth 8), messages of several MiB.
TEST_P(Pipeline, DefaultParametersLargeMessages) {
  Pair p;
  open_pair(p, GetParam(), {}, (4u << 20) + 4096);
  ASSERT_TRUE(p.a.qp && p.b.qp);
  unsigned salt = 1;
  for (auto [sg, dg] : kDirections) {
    for (Op op : kOps) transfer(p, op, sg, dg, (4u << 20) + 1, 3, 1, salt++);
    if (HasFatalFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Pipeline, ::testing::Values(Backend::kFake, Backend::kCuda),
                         [](const auto& info) { return info.param == Backend::kFake ? "fake" : "cuda"; });

// ---------------------------------------------------------------- fake only

// Completion only after placement: with every fake copy held, a WRITE
// into GPU memory is not acknowledged (no send completion), a
// WRITE_WITH_IMM's receive does not complete, a SEND's receive does not
// complete, a READ into GPU memory does not complete; once the copies go,
// all complete with every byte in place.
TEST(PipelineFake, NothingCompletesBeforePlacement) {
  Pair p;
  open_pair(p, Backend::kFake, {{"gpu_frag", std::to_string(kFrag)}}, 4 * kFrag);
  ASSERT_TRUE(p.a.qp && p.b.qp);
  struct Case {
    Op op;
    bool src_gpu, dst_gpu;
  };
  unsigned salt = 50;
  for (Case c : {Case{Op::kWrite, false, true}, Case{Op::kWriteImm, false, true}, Case{Op::kSend, false, true},
                 Case{Op::kRead, false, true}, Case{Op::kWrite, true, false}, Case{Op::kRead, true, false}}) {
    SCOPED_TRACE(std::string(op_name(c.op)) + (c.src_gpu ? " from GPU" : " into GPU"));
    const bool read = c.op == Op::kRead;
    Side& from = read ? p.b : p.a;
    Side& to = read ? p.a : p.b;
    const size_t len = 3 * kFrag + 9;
    std::vector<uint8_t> src(from.buf(c.src_gpu).size());
    for (size_t i = 0; i < src.size(); ++i) src[i] = pattern(i, salt);
    from.buf(c.src_gpu).store(src);
    to.buf(c.dst_gpu).store(std::vector<uint8_t>(src.size(), kGuard));
    staging::fake_hold(true);
    Sge s = read ? to.mr(c.dst_gpu).sge(0, len) : from.mr(c.src_gpu).sge(0, len);
    Sge r = to.mr(c.dst_gpu).sge(0, len);
    if (c.op == Op::kSend) {
      ASSERT_TRUE(p.b.qp->post_recv({.wr_id = 9, .sgl = {&r, 1}}));
    }
    if (c.op == Op::kWriteImm) {
      ASSERT_TRUE(p.b.qp->post_recv({.wr_id = 9, .sgl = {}}));
    }
    const WrOpcode wop = c.op == Op::kSend ? WrOpcode::kSend
                         : c.op == Op::kWrite ? WrOpcode::kRdmaWrite
                         : c.op == Op::kWriteImm ? WrOpcode::kRdmaWriteWithImm
                                                 : WrOpcode::kRdmaRead;
    ASSERT_TRUE(p.a.qp->post_send({.wr_id = salt, .opcode = wop, .flags = kSendSignaled, .sgl = {&s, 1},
                                   .imm_data = 5, .remote_addr = reinterpret_cast<uintptr_t>(read ? from.buf(c.src_gpu).data()
                                                                                                    : to.buf(c.dst_gpu).data()),
                                   .rkey = read ? from.mr(c.src_gpu).rkey() : to.mr(c.dst_gpu).rkey()}));
    // Held for 40 ms (the retransmission timeout is 67 ms): nothing completes.
    EXPECT_FALSE(wait_one(*p.a.cq, std::chrono::milliseconds(40))) << "the requester completed before placement";
    if (c.op == Op::kSend || c.op == Op::kWriteImm) {
      EXPECT_FALSE(wait_one(*p.b.cq, std::chrono::milliseconds(1))) << "the receive completed before placement";
    }
    EXPECT_GT(staging::fake_queued(), 0u) << "copies wait in the fake engine";
    staging::fake_hold(false);
    auto wc = wait_one(*p.a.cq);
    ASSERT_TRUE(wc);
    ASSERT_EQ(wc->status, WcStatus::kSuccess) << wc->error;
    if (c.op == Op::kSend || c.op == Op::kWriteImm) {
      auto rc = wait_one(*p.b.cq);
      ASSERT_TRUE(rc);
      ASSERT_EQ(rc->status, WcStatus::kSuccess) << rc->error;
    }
    std::vector<uint8_t> got = to.buf(c.dst_gpu).load();
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], i < len ? src[i] : kGuard) << "byte " << i;
    ++salt;
  }
}

// What the pipeline refuses, with words that say why.
TEST(PipelineFake, RefusalsAreClear) {
  Pair p;
  open_pair(p, Backend::kFake, {{"gpu_frag", "4096"}, {"gpu_slots", "16"}, {"gpu_depth", "2"}}, 128 * 1024);
  ASSERT_TRUE(p.a.qp && p.b.qp);
  EXPECT_TRUE(p.a.dev->attr().mem_types & (1u << UFAB_MEM_CUDA)) << "soft-RoCE lists UFAB_MEM_CUDA";
  // An atomic's result into GPU memory.
  Sge s8 = p.a.mr_gpu->sge(0, 8);
  auto st = p.a.qp->post_send({.wr_id = 1, .opcode = WrOpcode::kAtomicFetchAndAdd, .flags = kSendSignaled,
                               .sgl = {&s8, 1}, .remote_addr = reinterpret_cast<uintptr_t>(p.b.host->data()),
                               .rkey = p.b.mr_host->rkey()});
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code(), EOPNOTSUPP);
  EXPECT_NE(st.error().message().find("atomics, FLUSH and ATOMIC_WRITE on GPU memory are not supported"),
            std::string::npos)
      << st.error().message();
  // A READ into GPU memory larger than the pool (16 x 4 KiB).
  Sge big = p.a.mr_gpu->sge(0, 100 * 1024);
  st = p.a.qp->post_send({.wr_id = 2, .opcode = WrOpcode::kRdmaRead, .flags = kSendSignaled, .sgl = {&big, 1},
                          .remote_addr = reinterpret_cast<uintptr_t>(p.b.host->data()), .rkey = p.b.mr_host->rkey()});
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code(), EINVAL);
  EXPECT_NE(st.error().message().find("split the READ or raise gpu_slots"), std::string::npos) << st.error().message();
  // Inline from GPU memory.
  Sge s16 = p.a.mr_gpu->sge(0, 16);
  st = p.a.qp->post_send({.wr_id = 3, .opcode = WrOpcode::kSend, .flags = kSendSignaled | kSendInline,
                          .sgl = {&s16, 1}});
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message().find("inline"), std::string::npos) << st.error().message();
  // REMOTE_ATOMIC on GPU memory, at registration.
  std::vector<uint8_t> mem(4096);
  auto mr = p.a.pd->register_mr(mem.data(), mem.size(), kLocalWrite | kRemoteAtomic, MemoryType::kCuda);
  ASSERT_FALSE(mr);
  EXPECT_EQ(mr.error().code(), EOPNOTSUPP);
  // The QP still works: a small WRITE with small slots, many fragments.
  transfer(p, Op::kWrite, true, true, 40000, 1, 2, 9);
  transfer(p, Op::kRead, true, true, 60000, 3, 0, 10);
  // A peer's ATOMIC_WRITE into GPU memory: remote operational error (last:
  // it ends the connection), and the GPU memory is untouched.
  std::vector<uint8_t> before = p.b.gpu->load();
  ASSERT_TRUE(p.a.qp->post_send({.wr_id = 11, .opcode = WrOpcode::kAtomicWrite, .flags = kSendSignaled,
                                 .remote_addr = reinterpret_cast<uintptr_t>(p.b.gpu->data()) + 64,
                                 .rkey = p.b.mr_gpu->rkey(), .atomic_value = 0x1122334455667788ull}));
  auto wc = wait_one(*p.a.cq);
  ASSERT_TRUE(wc);
  EXPECT_EQ(wc->status, WcStatus::kRemOpErr) << wc->error;
  EXPECT_EQ(p.b.gpu->load(), before);
}

TEST(PipelineFake, BadParametersSayWhy) {
  for (auto [k, v, words] : {std::tuple{"gpu_frag", "5000", "multiple of 4096"},
                             std::tuple{"gpu_copy", "dma", "gpu_copy=cuda"},
                             std::tuple{"gpu_depth", "0", "1..1024"},
                             std::tuple{"gpu_slots", "3", "2 * gpu_depth"}}) {
    auto d = Device::open("swnic:bad" + std::to_string(::getpid()) + ":0",
                          {.ip = "10.9.1.1", .params = {{k, v}}});
    ASSERT_FALSE(d) << k << "=" << v;
    EXPECT_NE(d.error().message().find(words), std::string::npos) << d.error().message();
  }
}

}  // namespace
}  // namespace ufab::staging_test
