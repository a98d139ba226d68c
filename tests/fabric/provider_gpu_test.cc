// FI_HMEM with real GPU memory: the libfabric provider moving cuMemAlloc'd
// buffers registered with fi_mr_regattr (iface FI_HMEM_CUDA) over
// fi_write, fi_read and fi_send between two soft-RoCE ports of a software
// NIC in one process, and again between two endpoints of one shm domain;
// every byte is written to and checked on the GPU
// through device copies (cuMemcpyHtoD / cuMemcpyDtoH), never touched by
// the CPU in place. Each test skips with "no GPU: <why>" where there is
// none (the README test command); tests/gpu/run.sh runs this binary on a
// GPU machine, where a skip fails the suite. provider_test.cc covers the
// same paths without a GPU (gpu_copy=fake).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/gpu/cuda.h"

namespace {

using ufab::gpu::Allocation;
using ufab::gpu::Driver;

std::string g_link, g_shm;
// The devices of the test running: "swnic" (two ports of g_link) or "shm".
std::string g_kind = "swnic";

// Before libfabric's first call: where the provider is (the runfiles'
// fabric/, or UFAB_FI_PROVIDER_DIR: tests/gpu/run.sh's staging directory)
// and two ports of a software NIC link. No gpu_copy parameter: the CUDA
// copy engine.
struct Env {
  Env() {
    g_link = "fig" + std::to_string(getpid());
    g_shm = "fig" + std::to_string(getpid());
    std::string dir = std::filesystem::absolute("fabric").string();
    if (const char* d = std::getenv("UFAB_FI_PROVIDER_DIR")) dir = d;
    setenv("FI_PROVIDER_PATH", dir.c_str(), 1);
    std::string devs = "swnic:" + g_link + ":0@10.0.9.1,swnic:" + g_link + ":1@10.0.9.2,shm:" + g_shm;
    setenv("FI_UFAB_DEVICES", devs.c_str(), 1);
    setenv("FI_PROVIDER", "ufab", 1);
    unsetenv("FI_UFAB_PARAMS");
  }
  ~Env() { std::filesystem::remove("/dev/shm/ufab-swnic-" + g_link); }
} g_env;

#define NEED_GPU()                                                         \
  do {                                                                     \
    if (std::string why = ufab::gpu::unavailable_reason(); !why.empty()) { \
      GTEST_SKIP() << "no GPU: " << why;                                   \
    }                                                                      \
  } while (0)

std::string dev(int port) { return g_kind == "shm" ? "shm:" + g_shm : "swnic:" + g_link + ":" + std::to_string(port); }

fi_info* getinfo(int port) {
  fi_info* h = fi_allocinfo();
  h->ep_attr->type = FI_EP_MSG;
  h->caps = FI_MSG | FI_RMA | FI_HMEM;
  h->mode = FI_CONTEXT | FI_RX_CQ_DATA;
  h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_HMEM;
  h->domain_attr->name = strdup(dev(port).c_str());
  h->fabric_attr->prov_name = strdup("ufab");
  fi_info* info = nullptr;
  int rc = fi_getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0, h, &info);
  fi_freeinfo(h);
  EXPECT_EQ(rc, 0) << fi_strerror(-rc);
  return info;
}

// One completion within 10 s (errors: -FI_EAVAIL, with the entry printed).
ssize_t one_completion(fid_cq* cq) {
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  fi_cq_data_entry e{};
  for (;;) {
    ssize_t r = fi_cq_sread(cq, &e, 1, nullptr, 100);
    if (r == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      if (fi_cq_readerr(cq, &err, 0) == 1) {
        char text[256];
        ADD_FAILURE() << "error completion: " << fi_strerror(err.err) << ": "
                      << fi_cq_strerror(cq, err.prov_errno, err.err_data, text, sizeof text);
      }
      return r;
    }
    if (r != -FI_EAGAIN) return r;
    if (std::chrono::steady_clock::now() > end) return -FI_ETIMEDOUT;
  }
}

struct Side {
  fi_info* info = nullptr;
  fid_fabric* fabric = nullptr;
  fid_domain* domain = nullptr;
  fid_eq* eq = nullptr;
  fid_cq* cq = nullptr;
  fid_ep* ep = nullptr;
  std::vector<uint8_t> host = std::vector<uint8_t>(8 << 20);
  fid_mr* host_mr = nullptr;

  void open(int port) {
    info = getinfo(port);
    ASSERT_NE(info, nullptr);
    ASSERT_NE(info->caps & FI_HMEM, 0u) << "FI_HMEM on a soft-RoCE domain of a CUDA build";
    ASSERT_EQ(fi_fabric(info->fabric_attr, &fabric, nullptr), 0);
    fi_eq_attr ea{};
    ea.wait_obj = FI_WAIT_UNSPEC;
    ASSERT_EQ(fi_eq_open(fabric, &ea, &eq, nullptr), 0);
    ASSERT_EQ(fi_domain(fabric, info, &domain, nullptr), 0);
    ASSERT_EQ(fi_mr_reg(domain, host.data(), host.size(),
                        FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE, 0, 0, 0, &host_mr,
                        nullptr),
              0);
  }
  void open_ep(fi_info* epinfo) {
    fi_cq_attr ca{};
    ca.format = FI_CQ_FORMAT_DATA;
    ca.wait_obj = FI_WAIT_FD;
    ca.size = 256;
    ASSERT_EQ(fi_cq_open(domain, &ca, &cq, nullptr), 0);
    ASSERT_EQ(fi_endpoint(domain, epinfo, &ep, nullptr), 0);
    ASSERT_EQ(fi_ep_bind(ep, &eq->fid, 0), 0);
    ASSERT_EQ(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV), 0);
    ASSERT_EQ(fi_enable(ep), 0);
  }
  void close() {
    if (ep != nullptr) {
      EXPECT_EQ(fi_close(&ep->fid), 0);
    }
    if (cq != nullptr) {
      EXPECT_EQ(fi_close(&cq->fid), 0);
    }
    if (host_mr != nullptr) {
      EXPECT_EQ(fi_close(&host_mr->fid), 0);
    }
    if (domain != nullptr) {
      EXPECT_EQ(fi_close(&domain->fid), 0);
    }
    if (eq != nullptr) {
      EXPECT_EQ(fi_close(&eq->fid), 0);
    }
    if (fabric != nullptr) {
      EXPECT_EQ(fi_close(&fabric->fid), 0);
    }
    fi_freeinfo(info);
    ep = nullptr, cq = nullptr, host_mr = nullptr, domain = nullptr, eq = nullptr, fabric = nullptr, info = nullptr;
  }
};

// Device memory registered with fi_mr_regattr (FI_HMEM_CUDA, GPU 0).
struct GpuBuf {
  std::optional<Allocation> mem;
  fid_mr* mr = nullptr;
  ~GpuBuf() {
    if (mr != nullptr) {
      EXPECT_EQ(fi_close(&mr->fid), 0);
    }
  }
  void make(fid_domain* domain, size_t n) {
    auto a = Allocation::allocate(**Driver::get(), 0, Allocation::Kind::kDevice, n);
    ASSERT_TRUE(a) << a.error().message();
    mem.emplace(std::move(*a));
    iovec v{mem->data(), n};
    fi_mr_attr attr{};
    attr.mr_iov = &v;
    attr.iov_count = 1;
    attr.access = FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
    attr.iface = FI_HMEM_CUDA;
    attr.device.cuda = 0;
    ASSERT_EQ(fi_mr_regattr(domain, &attr, 0, &mr), 0) << "fi_mr_regattr(FI_HMEM_CUDA) of cuMemAlloc'd memory";
  }
  uint8_t* data() const { return static_cast<uint8_t*>(mem->data()); }
  void* desc() const { return fi_mr_desc(mr); }
  // Device copies in and out.
  void put(size_t off, const std::vector<uint8_t>& b) const {
    auto s = mem->write(off, b.data(), b.size());
    ASSERT_TRUE(s) << s.error().message();
  }
  std::vector<uint8_t> get(size_t off, size_t n) const {
    std::vector<uint8_t> b(n);
    auto s = mem->read(off, b.data(), n);
    EXPECT_TRUE(s) << s.error().message();
    return b;
  }
};

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> b(n);
  for (size_t i = 0; i < n; i++) b[i] = static_cast<uint8_t>((i * 2654435761u + seed) >> 9);
  return b;
}
long first_diff(const std::vector<uint8_t>& a, const uint8_t* b) {
  for (size_t i = 0; i < a.size(); i++)
    if (a[i] != b[i]) return static_cast<long>(i);
  return -1;
}

class FabricGpu : public ::testing::TestWithParam<std::string> {
 protected:
  Side server, client;
  fid_pep* pep = nullptr;

  void SetUp() override {
    NEED_GPU();
    g_kind = GetParam();
    server.open(0);
    client.open(1);
    ASSERT_EQ(fi_passive_ep(server.fabric, server.info, &pep, nullptr), 0);
    ASSERT_EQ(fi_pep_bind(pep, &server.eq->fid, 0), 0);
    ASSERT_EQ(fi_listen(pep), 0);
    sockaddr_in addr{};
    size_t len = sizeof addr;
    ASSERT_EQ(fi_getname(&pep->fid, &addr, &len), 0);
    client.open_ep(client.info);
    ASSERT_EQ(fi_connect(client.ep, &addr, nullptr, 0), 0);
    uint32_t event = 0;
    alignas(fi_eq_cm_entry) uint8_t ebuf[sizeof(fi_eq_cm_entry) + 256];
    auto* entry = reinterpret_cast<fi_eq_cm_entry*>(ebuf);
    ASSERT_GE(fi_eq_sread(server.eq, &event, entry, sizeof ebuf, 10000, 0), static_cast<ssize_t>(sizeof *entry));
    ASSERT_EQ(event, static_cast<uint32_t>(FI_CONNREQ));
    fi_info* req = entry->info;
    server.open_ep(req);
    fi_freeinfo(req);
    ASSERT_EQ(fi_accept(server.ep, nullptr, 0), 0);
    ASSERT_GE(fi_eq_sread(client.eq, &event, entry, sizeof ebuf, 10000, 0), static_cast<ssize_t>(sizeof *entry));
    ASSERT_EQ(event, static_cast<uint32_t>(FI_CONNECTED));
    ASSERT_GE(fi_eq_sread(server.eq, &event, entry, sizeof ebuf, 10000, 0), static_cast<ssize_t>(sizeof *entry));
    ASSERT_EQ(event, static_cast<uint32_t>(FI_CONNECTED));
  }
  void TearDown() override {
    if (pep != nullptr) {
      EXPECT_EQ(fi_close(&pep->fid), 0);
    }
    server.close();
    client.close();
  }
};

constexpr size_t kBuf = 8 << 20;

// fi_write GPU -> GPU and host -> GPU; fi_read GPU -> GPU and GPU -> host;
// lengths that are not fragment multiples, at odd offsets; the bytes
// around each target unchanged.
TEST_P(FabricGpu, WriteAndReadEveryByteCheckedOnTheGpu) {
  GpuBuf cg, sg;
  cg.make(client.domain, kBuf);
  sg.make(server.domain, kBuf);
  if (HasFatalFailure()) return;
  const auto zeros = std::vector<uint8_t>(kBuf, 0);
  sg.put(0, zeros);
  const uint64_t saddr = reinterpret_cast<uintptr_t>(sg.data());
  const uint64_t skey = fi_mr_key(sg.mr);

  // GPU -> GPU WRITE, 3 MiB + 5 bytes to offset 4097.
  auto w = pattern((3 << 20) + 5, 1);
  cg.put(13, w);
  ASSERT_EQ(fi_write(client.ep, cg.data() + 13, w.size(), cg.desc(), FI_ADDR_UNSPEC, saddr + 4097, skey, nullptr), 0);
  ASSERT_EQ(one_completion(client.cq), 1);
  auto got = sg.get(4096, w.size() + 2);
  EXPECT_EQ(got.front(), 0);
  EXPECT_EQ(got.back(), 0);
  EXPECT_EQ(first_diff(w, got.data() + 1), -1) << "GPU -> GPU WRITE";

  // host -> GPU WRITE, 1 MiB - 3 bytes to offset 5 MiB + 1.
  auto hw = pattern((1 << 20) - 3, 2);
  std::memcpy(client.host.data() + 7, hw.data(), hw.size());
  ASSERT_EQ(fi_write(client.ep, client.host.data() + 7, hw.size(), fi_mr_desc(client.host_mr), FI_ADDR_UNSPEC,
                     saddr + (5 << 20) + 1, skey, nullptr),
            0);
  ASSERT_EQ(one_completion(client.cq), 1);
  got = sg.get((5 << 20) + 1, hw.size());
  EXPECT_EQ(first_diff(hw, got.data()), -1) << "host -> GPU WRITE";

  // GPU -> GPU READ: what the first WRITE put there, into offset 3.
  ASSERT_EQ(fi_read(client.ep, cg.data() + (4 << 20) + 3, w.size(), cg.desc(), FI_ADDR_UNSPEC, saddr + 4097, skey,
                    nullptr),
            0);
  ASSERT_EQ(one_completion(client.cq), 1);
  got = cg.get((4 << 20) + 3, w.size());
  EXPECT_EQ(first_diff(w, got.data()), -1) << "GPU -> GPU READ";

  // GPU -> host READ.
  std::memset(client.host.data(), 0xee, 3 << 20);
  ASSERT_EQ(fi_read(client.ep, client.host.data() + 1, hw.size(), fi_mr_desc(client.host_mr), FI_ADDR_UNSPEC,
                    saddr + (5 << 20) + 1, skey, nullptr),
            0);
  ASSERT_EQ(one_completion(client.cq), 1);
  EXPECT_EQ(first_diff(hw, client.host.data() + 1), -1) << "GPU -> host READ";
  EXPECT_EQ(client.host[0], 0xee);
  EXPECT_EQ(client.host[1 + hw.size()], 0xee);
}

// fi_send GPU -> GPU, GPU -> host and host -> GPU, and fi_writedata into
// GPU memory (its remote CQ data consumes a receive).
TEST_P(FabricGpu, SendEveryByteCheckedOnTheGpu) {
  GpuBuf cg, sg;
  cg.make(client.domain, kBuf);
  sg.make(server.domain, kBuf);
  if (HasFatalFailure()) return;
  fi_cq_data_entry e{};
  struct Case {
    const char* name;
    bool from_gpu, to_gpu;
    size_t n;
  } cases[] = {{"GPU -> GPU", true, true, (2 << 20) + 333},
               {"GPU -> host", true, false, 777777},
               {"host -> GPU", false, true, 1000001},
               {"GPU -> GPU, one byte", true, true, 1}};
  uint32_t seed = 10;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto m = pattern(c.n, seed++);
    void* sdesc = c.from_gpu ? cg.desc() : fi_mr_desc(client.host_mr);
    uint8_t* src = c.from_gpu ? cg.data() + 9 : client.host.data() + 9;
    if (c.from_gpu)
      cg.put(9, m);
    else
      std::memcpy(src, m.data(), c.n);
    void* rdesc = c.to_gpu ? sg.desc() : fi_mr_desc(server.host_mr);
    uint8_t* dst = c.to_gpu ? sg.data() + 3 : server.host.data() + 3;
    ASSERT_EQ(fi_recv(server.ep, dst, c.n + 64, rdesc, FI_ADDR_UNSPEC, nullptr), 0);
    ASSERT_EQ(fi_send(client.ep, src, c.n, sdesc, FI_ADDR_UNSPEC, nullptr), 0);
    ASSERT_EQ(one_completion(client.cq), 1);
    ASSERT_EQ(fi_cq_sread(server.cq, &e, 1, nullptr, 10000), 1);
    EXPECT_EQ(e.len, c.n);
    if (c.to_gpu) {
      auto got = sg.get(3, c.n);
      EXPECT_EQ(first_diff(m, got.data()), -1);
    } else {
      EXPECT_EQ(first_diff(m, dst), -1);
    }
  }
  // fi_writedata GPU -> GPU: the receive completes once the bytes are in.
  auto m = pattern(600000, 99);
  cg.put(0, m);
  ASSERT_EQ(fi_recv(server.ep, server.host.data(), 64, fi_mr_desc(server.host_mr), FI_ADDR_UNSPEC, nullptr), 0);
  ASSERT_EQ(fi_writedata(client.ep, cg.data(), m.size(), cg.desc(), 0x5eed, FI_ADDR_UNSPEC,
                         reinterpret_cast<uintptr_t>(sg.data()) + (6 << 20), fi_mr_key(sg.mr), nullptr),
            0);
  ASSERT_EQ(one_completion(client.cq), 1);
  ASSERT_EQ(fi_cq_sread(server.cq, &e, 1, nullptr, 10000), 1);
  EXPECT_EQ(e.data, 0x5eedu);
  auto got = sg.get(6 << 20, m.size());
  EXPECT_EQ(first_diff(m, got.data()), -1);
}

// Registration: device memory given to fi_mr_reg (no iface) is recognised
// by its pointer attributes and moves the same; host memory claimed as
// FI_HMEM_CUDA is refused.
TEST_P(FabricGpu, RegistrationChecksTheMemory) {
  GpuBuf sg;
  sg.make(server.domain, 1 << 20);
  if (HasFatalFailure()) return;
  auto a = Allocation::allocate(**Driver::get(), 0, Allocation::Kind::kDevice, 1 << 20);
  ASSERT_TRUE(a) << a.error().message();
  fid_mr* plain = nullptr;
  ASSERT_EQ(fi_mr_reg(client.domain, a->data(), 1 << 20, FI_SEND | FI_WRITE | FI_READ | FI_REMOTE_WRITE, 0, 0, 0,
                      &plain, nullptr),
            0)
      << "device memory through fi_mr_reg";
  auto m = pattern(500000, 5);
  ASSERT_TRUE(a->write(0, m.data(), m.size()));
  ASSERT_EQ(fi_write(client.ep, a->data(), m.size(), fi_mr_desc(plain), FI_ADDR_UNSPEC,
                     reinterpret_cast<uintptr_t>(sg.data()), fi_mr_key(sg.mr), nullptr),
            0);
  ASSERT_EQ(one_completion(client.cq), 1);
  auto got = sg.get(0, m.size());
  EXPECT_EQ(first_diff(m, got.data()), -1);
  // Inline data from GPU memory would be read by the CPU: refused.
  EXPECT_EQ(fi_inject(client.ep, a->data(), 8, FI_ADDR_UNSPEC), -FI_EOPNOTSUPP);
  EXPECT_EQ(fi_close(&plain->fid), 0);

  iovec v{client.host.data(), 4096};
  fi_mr_attr attr{};
  attr.mr_iov = &v;
  attr.iov_count = 1;
  attr.access = FI_SEND;
  attr.iface = FI_HMEM_CUDA;
  fid_mr* bad = nullptr;
  EXPECT_EQ(fi_mr_regattr(client.domain, &attr, 0, &bad), -FI_EINVAL) << "host memory is not CUDA memory";
}

INSTANTIATE_TEST_SUITE_P(Devices, FabricGpu, ::testing::Values("swnic", "shm"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
