// GPU memory registration through the C API (docs/gpu.md), over the
// soft-RoCE provider on the software NIC. Tests that need a GPU skip with
// "no GPU: <why>" where there is none (the README test command); tests/gpu/
// runs this binary on a GPU machine, where none skips.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/gpu/cuda.h"
#include "core/gpu/region.h"
#include "ufab/rdma.h"

namespace {

using ufab::gpu::Allocation;
using ufab::gpu::Driver;

#define NEED_GPU()                                                                  \
  do {                                                                              \
    if (std::string why = ufab::gpu::unavailable_reason(); !why.empty()) {          \
      GTEST_SKIP() << "no GPU: " << why;                                            \
    }                                                                               \
  } while (0)

// Two soft-RoCE ports on one software NIC link, an RC QP on each, connected.
struct Pair {
  ufab_device* dev[2] = {};
  ufab_pd* pd[2] = {};
  ufab_cq* cq[2] = {};
  ufab_qp* qp[2] = {};

  void open(const std::string& link) {
    const char* ips[2] = {"10.77.0.1", "10.77.0.2"};
    for (int i = 0; i < 2; ++i) {
      ufab_device_opts o{};
      o.size = sizeof o;
      o.ip = ips[i];
      o.progress_thread = 1;
      std::string name = "swnic:" + link + ":" + std::to_string(i);
      ASSERT_EQ(ufab_device_open(name.c_str(), &o, &dev[i]), 0) << ufab_last_error();
      ASSERT_EQ(ufab_pd_alloc(dev[i], &pd[i]), 0) << ufab_last_error();
      ASSERT_EQ(ufab_cq_create(dev[i], 64, &cq[i]), 0) << ufab_last_error();
      ufab_qp_init_attr init{};
      init.qp_type = UFAB_QPT_RC;
      init.send_cq = cq[i];
      init.recv_cq = cq[i];
      init.cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 2, .max_recv_sge = 2, .max_inline_data = 64};
      ASSERT_EQ(ufab_qp_create(pd[i], &init, &qp[i]), 0) << ufab_last_error();
    }
    ufab_conn c[2];
    for (int i = 0; i < 2; ++i) ASSERT_EQ(ufab_qp_local(qp[i], &c[i]), 0) << ufab_last_error();
    for (int i = 0; i < 2; ++i) ASSERT_EQ(ufab_qp_connect(qp[i], &c[1 - i], nullptr), 0) << ufab_last_error();
  }
  ~Pair() {
    for (int i = 0; i < 2; ++i) {
      if (qp[i]) ufab_qp_destroy(qp[i]);
      if (cq[i]) ufab_cq_destroy(cq[i]);
      if (pd[i]) ufab_pd_free(pd[i]);
      if (dev[i]) ufab_device_close(dev[i]);
    }
  }
};

std::string link_name(const char* tag) { return "gpu" + std::to_string(getpid()) + tag; }

// Waits (bounded) for one completion on `cq`.
bool wait_wc(ufab_cq* cq, ufab_wc* wc) { return ufab_cq_wait(cq, wc, 1, 5000) == 1; }

// ------------------------------------------------------------ without a GPU

TEST(GpuNoDriver, HostRegistrationLoadsNoDriver) {
  void* before = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (before != nullptr) {
    dlclose(before);
    GTEST_SKIP() << "libcuda.so.1 is already loaded in this process";
  }
  Pair p;
  ASSERT_NO_FATAL_FAILURE(p.open(link_name("a")));
  std::vector<char> buf(4096);
  ufab_mr* mr = nullptr;
  ASSERT_EQ(ufab_mr_reg(p.pd[0], buf.data(), buf.size(), UFAB_ACCESS_LOCAL_WRITE, &mr), 0) << ufab_last_error();
  EXPECT_EQ(dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD), nullptr) << "registering host memory loaded libcuda";
  EXPECT_EQ(Driver::if_loaded(), nullptr);
  EXPECT_EQ(ufab_mr_dereg(mr), 0);
}

TEST(GpuNoDriver, CacheOnHostMemoryThroughTheCApiFromSeveralThreads) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(p.open(link_name("g")));
  ufab_mr_cache* cache = nullptr;
  ASSERT_EQ(ufab_mr_cache_create(p.pd[0], nullptr, &cache), 0) << ufab_last_error();
  if (std::string(ufab_mr_cache_host_watch(cache)) != "userfaultfd") {
    std::string why = ufab_mr_cache_host_watch(cache);
    ufab_mr_cache_destroy(cache);
    GTEST_SKIP() << "no userfaultfd here: " << why;
  }
  const size_t n = 1 << 16;
  void* buf = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(buf, MAP_FAILED);
  ufab_mr* a = nullptr;
  ufab_mr* b = nullptr;
  ASSERT_EQ(ufab_mr_cache_reg(cache, buf, n, UFAB_ACCESS_LOCAL_WRITE, &a), 0) << ufab_last_error();
  EXPECT_EQ(ufab_mr_dereg(a), -EINVAL);  // a cached region goes back through the cache
  // A release checks the cache and the region with one compare: a null
  // cache, a region of no cache and one of another cache are refused.
  {
    EXPECT_EQ(ufab_mr_cache_release(nullptr, a), -EINVAL);
    EXPECT_NE(std::string(ufab_last_error()).find("required"), std::string::npos) << ufab_last_error();
    EXPECT_EQ(ufab_mr_cache_release(cache, nullptr), -EINVAL);
    EXPECT_EQ(ufab_mr_cache_reg(nullptr, buf, n, UFAB_ACCESS_LOCAL_WRITE, &b), -EINVAL);
    EXPECT_EQ(ufab_mr_cache_reg(cache, buf, n, UFAB_ACCESS_LOCAL_WRITE, nullptr), -EINVAL);
    ufab_mr* plain = nullptr;
    ASSERT_EQ(ufab_mr_reg(p.pd[0], buf, n, UFAB_ACCESS_LOCAL_WRITE, &plain), 0) << ufab_last_error();
    EXPECT_EQ(ufab_mr_cache_release(cache, plain), -EINVAL);
    EXPECT_NE(std::string(ufab_last_error()).find("not from this registration cache"), std::string::npos)
        << ufab_last_error();
    EXPECT_EQ(ufab_mr_cache_release(nullptr, plain), -EINVAL);
    EXPECT_EQ(ufab_mr_dereg(plain), 0);
    ufab_mr_cache* other = nullptr;
    ASSERT_EQ(ufab_mr_cache_create(p.pd[0], nullptr, &other), 0) << ufab_last_error();
    EXPECT_EQ(ufab_mr_cache_release(other, a), -EINVAL);
    EXPECT_EQ(ufab_mr_cache_destroy(other), 0);
  }
  ASSERT_EQ(ufab_mr_cache_release(cache, a), 0);
  ASSERT_EQ(ufab_mr_cache_reg(cache, buf, n, UFAB_ACCESS_LOCAL_WRITE, &b), 0) << ufab_last_error();
  EXPECT_EQ(a, b);
  EXPECT_EQ(ufab_mr_cache_destroy(cache), -EBUSY);  // b is held
  // Hits and releases from four threads (each releases what it got).
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 20000; ++i) {
        ufab_mr* m = nullptr;
        if (ufab_mr_cache_reg(cache, buf, n, UFAB_ACCESS_LOCAL_WRITE, &m) != 0 || m != a ||
            ufab_mr_lkey(m) != ufab_mr_lkey(a)) {
          wrong++;
          continue;
        }
        if (ufab_mr_cache_release(cache, m) != 0) wrong++;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  ASSERT_EQ(ufab_mr_cache_release(cache, b), 0);
  ufab_mr_cache_stats st{};
  ASSERT_EQ(ufab_mr_cache_query_stats(cache, &st), 0);
  EXPECT_EQ(st.hits, 1u + 4 * 20000);
  EXPECT_EQ(st.misses, 1u);
  EXPECT_EQ(st.held, 0u);
  EXPECT_EQ(st.entries, 1u);
  // The memory goes away and comes back at the same address: a miss.
  ASSERT_EQ(munmap(buf, n), 0);
  void* again = mmap(buf, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  ASSERT_EQ(again, buf);
  ASSERT_EQ(ufab_mr_cache_reg(cache, buf, n, UFAB_ACCESS_LOCAL_WRITE, &b), 0) << ufab_last_error();
  ASSERT_EQ(ufab_mr_cache_query_stats(cache, &st), 0);
  EXPECT_EQ(st.misses, 2u);
  EXPECT_EQ(st.invalidations, 1u);
  EXPECT_EQ(st.entries, 1u);
  ASSERT_EQ(ufab_mr_cache_release(cache, b), 0);
  EXPECT_EQ(ufab_mr_cache_destroy(cache), 0);
  munmap(buf, n);
}

// The cache's attributes: the size before `flags` is still taken, an
// unknown flag is refused, and the GPU watch says what it is.
TEST(GpuNoDriver, CacheAttributesAndTheGpuWatchWords) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(p.open(link_name("h")));
  ufab_mr_cache* cache = nullptr;
  ASSERT_EQ(ufab_mr_cache_create(p.pd[0], nullptr, &cache), 0) << ufab_last_error();
  EXPECT_EQ(std::string(ufab_mr_cache_gpu_watch(cache)).rfind("not asked", 0), 0u) << ufab_mr_cache_gpu_watch(cache);
  EXPECT_EQ(ufab_mr_cache_destroy(cache), 0);
  ufab_mr_cache_attr attr{};
  attr.size = 16;  // a caller built before API 1.6
  attr.max_entries = 8;
  attr.flags = 0xdead;  // not read: outside the size given
  ASSERT_EQ(ufab_mr_cache_create(p.pd[0], &attr, &cache), 0) << ufab_last_error();
  EXPECT_EQ(ufab_mr_cache_destroy(cache), 0);
  attr.size = sizeof attr;
  attr.flags = 0x80;
  EXPECT_EQ(ufab_mr_cache_create(p.pd[0], &attr, &cache), -EINVAL);
  EXPECT_NE(std::string(ufab_last_error()).find("flag"), std::string::npos) << ufab_last_error();
  attr.size = 8;
  EXPECT_EQ(ufab_mr_cache_create(p.pd[0], &attr, &cache), -EINVAL);
  // Asked for: "cupti", or why not (no libcupti, another subscriber); the
  // cache works either way.
  attr.size = sizeof attr;
  attr.flags = UFAB_MR_CACHE_WATCH_GPU_FREES;
  ASSERT_EQ(ufab_mr_cache_create(p.pd[0], &attr, &cache), 0) << ufab_last_error();
  std::string watch = ufab_mr_cache_gpu_watch(cache);
  EXPECT_TRUE(watch == "cupti" || watch.find("CUPTI") != std::string::npos || watch.find("cupti") != std::string::npos)
      << watch;
  std::printf("GPU free watch here: %s\n", watch.c_str());
  EXPECT_EQ(ufab_mr_cache_destroy(cache), 0);
}

TEST(GpuNoDriver, CudaRegistrationSaysWhatIsMissing) {
  if (ufab::gpu::unavailable_reason().empty()) GTEST_SKIP() << "a GPU is present: nothing is missing";
  Pair p;
  ASSERT_NO_FATAL_FAILURE(p.open(link_name("b")));
  std::vector<char> buf(4096);
  ufab_mr_attr a{.size = sizeof a, .access = UFAB_ACCESS_LOCAL_WRITE, .addr = buf.data(), .length = buf.size(),
                 .mem_type = UFAB_MEM_CUDA, .reserved = 0};
  ufab_mr* mr = nullptr;
  int rc = ufab_mr_reg_attr(p.pd[0], &a, &mr);
  EXPECT_LT(rc, 0);
  std::string msg = ufab_last_error();
  EXPECT_NE(msg.find("CUDA memory (UFAB_MEM_CUDA)"), std::string::npos) << msg;
  if (ufab::gpu::built_with_cuda()) {
    // On a machine without the driver library (this one when it has no GPU).
    if (void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD); h == nullptr) {
      EXPECT_NE(msg.find("no GPU driver (libcuda.so.1 not found"), std::string::npos) << msg;
      EXPECT_NE(msg.find("install the NVIDIA driver"), std::string::npos) << msg;
    } else {
      dlclose(h);
    }
  } else {
    EXPECT_EQ(rc, -ENOTSUP);
    EXPECT_NE(msg.find("built without the CUDA Toolkit"), std::string::npos) << msg;
  }
}

// ---------------------------------------------------------------- on a GPU

TEST(Gpu, DriverDevicesAndStreamMemops) {
  NEED_GPU();
  const Driver* d = *Driver::get();
  auto n = d->device_count();
  ASSERT_TRUE(n) << n.error().message();
  ASSERT_GE(*n, 1);
  auto info = d->device(0);
  ASSERT_TRUE(info) << info.error().message();
  std::printf("driver CUDA %s (%s), %d GPU(s); GPU 0: %s, %s, %.1f GiB, sm_%d%d\n",
              ufab::gpu::cuda_version_string(d->version()).c_str(), d->library_path().c_str(), *n,
              info->name.c_str(), info->pci_address.c_str(), double(info->memory_bytes) / (1u << 30),
              info->compute_major, info->compute_minor);
  auto probe = d->probe_stream_memops(0);
  EXPECT_TRUE(probe) << probe.error().message();
}

TEST(Gpu, DeviceMemoryIsDetectedWithItsOrdinalAndBufferId) {
  NEED_GPU();
  const Driver* d = *Driver::get();
  auto mem = Allocation::allocate(*d, 0, Allocation::Kind::kDevice, 1 << 20);
  ASSERT_TRUE(mem) << mem.error().message();
  char* base = static_cast<char*>(mem->data());
  auto pi = d->pointer_info(base);
  ASSERT_TRUE(pi) << pi.error().message();
  EXPECT_EQ(pi->type, ufab::gpu::MemoryType::kDevice);
  EXPECT_FALSE(pi->managed);
  EXPECT_EQ(pi->device, 0);
  EXPECT_NE(pi->buffer_id, 0u);
  auto r = ufab::gpu::detect_region(base + 4096, 8192, false);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_TRUE(r->device);
  EXPECT_EQ(r->ordinal, 0);
  EXPECT_EQ(r->buffer_id, pi->buffer_id);
  // Past the allocation's end: refused.
  auto past = ufab::gpu::detect_region(base + (1 << 20) - 16, 64, false);
  EXPECT_FALSE(past);

  Pair p;
  ASSERT_NO_FATAL_FAILURE(p.open(link_name("c")));
  ufab_mr* mr = nullptr;  // registered as host memory: detected as GPU memory
  ASSERT_EQ(ufab_mr_reg(p.pd[0], base, 1 << 20, UFAB_ACCESS_LOCAL_WRITE | UFAB_ACCESS_REMOTE_WRITE, &mr), 0)
      << ufab_last_error();
  ufab_sge sge{.addr = reinterpret_cast<uint64_t>(base), .length = 4096, .lkey = ufab_mr_lkey(mr)};
  ufab_recv_wr rwr{};
  rwr.wr_id = 1;
  rwr.sg_list = &sge;
  rwr.num_sge = 1;
  uint32_t bad = 0;
  // Transfers on it go through the staging pipeline (docs/gpu.md).
  EXPECT_EQ(ufab_post_recv(p.qp[0], &rwr, 1, &bad), 0) << ufab_last_error();

  // A peer's WRITE into it: staged, copied into GPU memory before the ACK.
  std::vector<char> src(256, 'x');
  ufab_mr* smr = nullptr;
  ASSERT_EQ(ufab_mr_reg(p.pd[1], src.data(), src.size(), UFAB_ACCESS_LOCAL_WRITE, &smr), 0) << ufab_last_error();
  ufab_sge s2{.addr = reinterpret_cast<uint64_t>(src.data()), .length = 256, .lkey = ufab_mr_lkey(smr)};
  ufab_send_wr w{};
  w.wr_id = 3;
  w.sg_list = &s2;
  w.num_sge = 1;
  w.opcode = UFAB_WR_RDMA_WRITE;
  w.send_flags = UFAB_SEND_SIGNALED;
  w.remote_addr = reinterpret_cast<uint64_t>(base) + 8192;
  w.rkey = ufab_mr_rkey(mr);
  ASSERT_EQ(ufab_post_send(p.qp[1], &w, 1, &bad), 0) << ufab_last_error();
  ufab_wc wc{};
  ASSERT_TRUE(wait_wc(p.cq[1], &wc));
  EXPECT_EQ(wc.status, UFAB_WC_SUCCESS) << ufab_cq_wc_detail(p.cq[1], &wc);
  std::vector<char> back(256);
  ASSERT_TRUE(mem->read(8192, back.data(), back.size()));
  EXPECT_EQ(back, src);
  EXPECT_EQ(ufab_mr_dereg(smr), 0);
  EXPECT_EQ(ufab_mr_dereg(mr), 0) << ufab_last_error();

  // Explicit UFAB_MEM_CUDA: taken on device memory, refused on host memory.
  ufab_mr_attr a{.size = sizeof a, .access = UFAB_ACCESS_LOCAL_WRITE, .addr = base, .length = 4096,
                 .mem_type = UFAB_MEM_CUDA, .reserved = 0};
  ASSERT_EQ(ufab_mr_reg_attr(p.pd[0], &a, &mr), 0) << ufab_last_error();
  EXPECT_EQ(ufab_mr_dereg(mr), 0);
  a.addr = src.data();
  EXPECT_EQ(ufab_mr_reg_attr(p.pd[0], &a, &mr), -EINVAL);
  EXPECT_NE(std::string(ufab_last_error()).find("not CUDA memory"), std::string::npos) << ufab_last_error();
}

TEST(Gpu, ManagedMemoryIsRefused) {
  NEED_GPU();
  const Driver* d = *Driver::get();
  auto mem = Allocation::allocate(*d, 0, Allocation::Kind::kManaged, 1 << 20);
  ASSERT_TRUE(mem) << mem.error().message();
  Pair p;
  ASSERT_NO_FATAL_FAILURE(p.open(link_name("d")));
  ufab_mr* mr = nullptr;
  EXPECT_EQ(ufab_mr_reg(p.pd[0], mem->data(), 1 << 20, UFAB_ACCESS_LOCAL_WRITE, &mr), -EOPNOTSUPP);
  std::string msg = ufab_last_error();
  EXPECT_NE(msg.find("managed (unified) memory"), std::string::npos) << msg;
  std::printf("managed memory: %s\n", msg.c_str());
}

TEST(Gpu, FreedAndReallocatedBufferIsAProtectionError) {
  NEED_GPU();
  const Driver* d = *Driver::get();
  auto mem = Allocation::allocate(*d, 0, Allocation::Kind::kDevice, 1 << 20);
  ASSERT_TRUE(mem) << mem.error().message();
  void* old_addr = mem->data();
  Pair p;
  ASSERT_NO_FATAL_FAILURE(p.open(link_name("e")));
  ufab_mr* mr = nullptr;
  ASSERT_EQ(ufab_mr_reg(p.pd[0], old_addr, 1 << 20, UFAB_ACCESS_LOCAL_WRITE | UFAB_ACCESS_REMOTE_WRITE, &mr), 0)
      << ufab_last_error();
  ASSERT_TRUE(mem->free());
  auto again = Allocation::allocate(*d, 0, Allocation::Kind::kDevice, 1 << 20);
  ASSERT_TRUE(again) << again.error().message();
  std::printf("reallocated at the same address: %s\n", again->data() == old_addr ? "yes" : "no");
  ufab_sge sge{.addr = reinterpret_cast<uint64_t>(old_addr), .length = 4096, .lkey = ufab_mr_lkey(mr)};
  ufab_send_wr swr{};
  swr.wr_id = 1;
  swr.sg_list = &sge;
  swr.num_sge = 1;
  swr.opcode = UFAB_WR_SEND;
  uint32_t bad = 0;
  EXPECT_EQ(ufab_post_send(p.qp[0], &swr, 1, &bad), -EACCES);
  std::string msg = ufab_last_error();
  EXPECT_NE(msg.find("was freed"), std::string::npos) << msg;
  std::printf("post on the freed buffer: %s\n", msg.c_str());
  // The responder: a peer's WRITE to the stale rkey is a remote access error.
  std::vector<char> src(256, 'y');
  ufab_mr* smr = nullptr;
  ASSERT_EQ(ufab_mr_reg(p.pd[1], src.data(), src.size(), UFAB_ACCESS_LOCAL_WRITE, &smr), 0);
  ufab_sge s2{.addr = reinterpret_cast<uint64_t>(src.data()), .length = 256, .lkey = ufab_mr_lkey(smr)};
  ufab_send_wr w{};
  w.wr_id = 2;
  w.sg_list = &s2;
  w.num_sge = 1;
  w.opcode = UFAB_WR_RDMA_WRITE;
  w.send_flags = UFAB_SEND_SIGNALED;
  w.remote_addr = reinterpret_cast<uint64_t>(old_addr);
  w.rkey = ufab_mr_rkey(mr);
  ASSERT_EQ(ufab_post_send(p.qp[1], &w, 1, &bad), 0) << ufab_last_error();
  ufab_wc wc{};
  ASSERT_TRUE(wait_wc(p.cq[1], &wc));
  EXPECT_EQ(wc.status, UFAB_WC_REM_ACCESS_ERR) << ufab_cq_wc_detail(p.cq[1], &wc);
  EXPECT_EQ(ufab_mr_dereg(smr), 0);
  EXPECT_EQ(ufab_mr_dereg(mr), 0);
}

TEST(Gpu, CacheHitsAndBufferIdInvalidation) {
  NEED_GPU();
  const Driver* d = *Driver::get();
  auto mem = Allocation::allocate(*d, 0, Allocation::Kind::kDevice, 1 << 20);
  ASSERT_TRUE(mem) << mem.error().message();
  Pair p;
  ASSERT_NO_FATAL_FAILURE(p.open(link_name("f")));
  ufab_mr_cache* cache = nullptr;
  ASSERT_EQ(ufab_mr_cache_create(p.pd[0], nullptr, &cache), 0) << ufab_last_error();
  ufab_mr* a = nullptr;
  ufab_mr* b = nullptr;
  ASSERT_EQ(ufab_mr_cache_reg(cache, mem->data(), 1 << 20, UFAB_ACCESS_LOCAL_WRITE, &a), 0) << ufab_last_error();
  ASSERT_EQ(ufab_mr_cache_release(cache, a), 0);
  ASSERT_EQ(ufab_mr_cache_reg(cache, mem->data(), 1 << 20, UFAB_ACCESS_LOCAL_WRITE, &b), 0) << ufab_last_error();
  EXPECT_EQ(a, b);
  ASSERT_EQ(ufab_mr_cache_release(cache, b), 0);
  ufab_mr_cache_stats st{};
  ufab_mr_cache_query_stats(cache, &st);
  EXPECT_EQ(st.hits, 1u);
  EXPECT_EQ(st.misses, 1u);
  // Freed and allocated again: the entry's buffer id no longer matches.
  void* old_addr = mem->data();
  ASSERT_TRUE(mem->free());
  auto again = Allocation::allocate(*d, 0, Allocation::Kind::kDevice, 1 << 20);
  ASSERT_TRUE(again);
  ASSERT_EQ(ufab_mr_cache_reg(cache, again->data(), 1 << 20, UFAB_ACCESS_LOCAL_WRITE, &b), 0) << ufab_last_error();
  ufab_mr_cache_query_stats(cache, &st);
  EXPECT_EQ(st.misses, 2u);
  if (again->data() == old_addr) {
    EXPECT_EQ(st.invalidations, 1u);
  }
  std::printf("cache: hits %llu misses %llu invalidations %llu (same address: %s)\n",
              (unsigned long long)st.hits, (unsigned long long)st.misses, (unsigned long long)st.invalidations,
              again->data() == old_addr ? "yes" : "no");
  ASSERT_EQ(ufab_mr_cache_release(cache, b), 0);
  EXPECT_EQ(ufab_mr_cache_destroy(cache), 0);
}

// A cache that watches GPU frees (CUPTI): hits ask CUDA nothing while no
// freeing call ran, and a free and a new allocation at the same address
// still make the next registration a miss with the old entry dropped.
TEST(Gpu, CacheWatchingGpuFreesSeesAFreeAndANewAllocation) {
  NEED_GPU();
  const Driver* d = *Driver::get();
  Pair p;
  ASSERT_NO_FATAL_FAILURE(p.open(link_name("w")));
  ufab_mr_cache_attr attr{};
  attr.size = sizeof attr;
  attr.flags = UFAB_MR_CACHE_WATCH_GPU_FREES;
  ufab_mr_cache* cache = nullptr;
  ASSERT_EQ(ufab_mr_cache_create(p.pd[0], &attr, &cache), 0) << ufab_last_error();
  ASSERT_STREQ(ufab_mr_cache_gpu_watch(cache), "cupti") << "the watch did not start (libcupti on the library path?)";
  attr.flags = 0x80;
  ufab_mr_cache* bad = nullptr;
  EXPECT_EQ(ufab_mr_cache_create(p.pd[0], &attr, &bad), -EINVAL) << "an unknown flag was taken";
  constexpr uint64_t kLen = 1 << 20;
  void* last = nullptr;
  int same_address = 0;
  for (int round = 0; round < 20; ++round) {
    auto mem = Allocation::allocate(*d, 0, Allocation::Kind::kDevice, kLen);
    ASSERT_TRUE(mem) << mem.error().message();
    ufab_mr* a = nullptr;
    ufab_mr* b = nullptr;
    ufab_mr_cache_stats before{}, st{};
    ufab_mr_cache_query_stats(cache, &before);
    ASSERT_EQ(ufab_mr_cache_reg(cache, mem->data(), kLen, UFAB_ACCESS_LOCAL_WRITE, &a), 0) << ufab_last_error();
    ASSERT_EQ(ufab_mr_cache_release(cache, a), 0);
    for (int i = 0; i < 100; ++i) {
      ASSERT_EQ(ufab_mr_cache_reg(cache, mem->data(), kLen, UFAB_ACCESS_LOCAL_WRITE, &b), 0) << ufab_last_error();
      ASSERT_EQ(b, a) << "round " << round << ": a hit gave another region";
      ASSERT_EQ(ufab_mr_cache_release(cache, b), 0);
    }
    ufab_mr_cache_query_stats(cache, &st);
    EXPECT_EQ(st.misses - before.misses, 1u) << "round " << round;
    EXPECT_EQ(st.hits - before.hits, 100u) << "round " << round;
    // Freed at the end of the round: the next round's allocation often
    // gets the same address, under a new buffer id.
    if (mem->data() == last) ++same_address;
    last = mem->data();
  }
  ufab_mr_cache_stats st{};
  ufab_mr_cache_query_stats(cache, &st);
  std::printf("watched cache: hits %llu misses %llu invalidations %llu; %d of 19 allocations at the address freed "
              "just before\n",
              (unsigned long long)st.hits, (unsigned long long)st.misses, (unsigned long long)st.invalidations,
              same_address);
  EXPECT_EQ(st.misses, 20u) << "a freed and reallocated buffer was answered from the cache";
  EXPECT_EQ(ufab_mr_cache_destroy(cache), 0);
}

}  // namespace
