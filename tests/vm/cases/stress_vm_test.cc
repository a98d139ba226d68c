// Multi-thread stress over real NIC models in the VM test bed
// (tests/vm/suites/stress.sh): the host's lanes stress
// (tests/unit/provider/lanes_stress.h) over two vfio-bound e1000e NICs on
// one QEMU hub, and over two vfio-bound virtio-net NICs with two queue
// pairs each (multi-queue taps on a bridge in a private network namespace).
// Each pair is opened as two soft-RoCE devices in this one process with
// lanes=2, so the 8 threads' QPs share 2 lanes per device (4 each). Each
// thread sends 10^5 sequence-checked SENDs with a byte-checked READ every
// 64th; every wait is bounded.
//
// That both lanes carried traffic: the API has no per-lane counters, so the
// test checks what decides it. (1) Before the run, each NIC opened through
// its plugin reports at least `lanes` RX and TX queues, so lanes=2 gives the
// device 2 lanes (core/transport/link.cc: min of the NIC's queues and
// lanes=). (2) A QP lives on lane qpn % lanes (core/transport/lane.h): the
// test groups the threads by their QP numbers and expects every lane of both
// devices to hold QPs whose threads all finished, and prints the SENDs
// each lane carried. The suite adds a check from outside the guest for
// virtio-net: both queues of each tap delivered frames (stress.sh).
//
// Environment:
//   UFAB_STRESS_E1000E    "BDF,BDF": two e1000e bound to vfio-pci on one hub
//                         (unset: that test skips)
//   UFAB_STRESS_VIRTIO    "BDF,BDF": two virtio-net bound to vfio-pci, each
//                         with 2 queue pairs (unset: that test skips)
//   UFAB_STRESS_LANES     lanes= for every device (default 2)
//   UFAB_STRESS_PARAMS    "K=V,K=V": more parameters for every device. So
//                         the program also runs on the host over swnic:
//                           UFAB_STRESS_E1000E=swnic:st:0,swnic:st:1
//                           UFAB_STRESS_PARAMS=queues=2
//                           bazel-bin/tests/vm/cases/stress_vm_test
//   UFAB_STRESS_MESSAGES  SENDs per thread (default 100000)
//   UFAB_STRESS_TIMEOUT   seconds one case may run (default 600; each took
//                         about 100 s under TCG on the 2-core build machine)
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/nic_open.h"
#include "drivers/builtin.h"
#include "tests/unit/provider/lanes_stress.h"
#include "tests/vm/cases/vm_ports.h"
#include "ufab/rdma.hpp"

namespace ufab {
namespace {

using vmtest::env_count;
using vmtest::env_list;

uint32_t lanes() { return static_cast<uint32_t>(env_count("UFAB_STRESS_LANES", 2)); }

// UFAB_STRESS_PARAMS as a map (the NIC's parameters).
std::map<std::string, std::string> extra_params() {
  std::map<std::string, std::string> out;
  for (const auto& kv : env_list("UFAB_STRESS_PARAMS")) {
    auto eq = kv.find('=');
    out[kv.substr(0, eq)] = eq == std::string::npos ? "" : kv.substr(eq + 1);
  }
  return out;
}

// The NIC, opened through the plugin the registry picks, has at least
// `want` RX and TX queues. Closed again before the RDMA device opens it.
void expect_queues(const std::string& bdf, uint32_t want) {
  auto registry = core::default_registry(drivers::builtin_drivers());
  core::OpenOptions options;
  options.params = extra_params();
  auto nic = core::open_nic(registry, bdf, options);
  ASSERT_TRUE(nic) << nic.error().message();
  const ufab_dev_info& info = (*nic)->info();
  std::printf("%s: %u RX and %u TX queues\n", bdf.c_str(), info.max_rx_queues, info.max_tx_queues);
  EXPECT_GE(info.max_rx_queues, want) << bdf;
  EXPECT_GE(info.max_tx_queues, want) << bdf;
}

// Every lane of the device holds QPs of threads that finished, and how many
// SENDs each lane carried.
void expect_every_lane_used(const char* side, const lanes_stress::Result& r, bool a) {
  const uint32_t n = lanes();
  std::vector<std::vector<uint32_t>> threads(n);
  for (const auto& t : r.threads) threads[(a ? t.qpn_a : t.qpn_b) % n].push_back(t.k);
  for (uint32_t lane = 0; lane < n; ++lane) {
    uint64_t sends = 0;
    std::string list, qpns;
    for (uint32_t k : threads[lane]) {
      sends += r.threads[k].received;
      list += " " + std::to_string(k);
      qpns += " " + std::to_string(a ? r.threads[k].qpn_a : r.threads[k].qpn_b);
    }
    std::printf("  device %s lane %u: threads%s (QPs%s), %llu SENDs %s\n", side, lane, list.c_str(), qpns.c_str(),
                static_cast<unsigned long long>(sends), a ? "sent" : "received");
    EXPECT_FALSE(threads[lane].empty()) << "device " << side << ": no QP on lane " << lane;
    EXPECT_EQ(sends, threads[lane].size() * r.total) << "device " << side << " lane " << lane;
  }
}

void stress(const std::vector<std::string>& bdfs, const std::string& ip_a, const std::string& ip_b) {
  ASSERT_EQ(bdfs.size(), 2u) << "give two NICs, BDF,BDF";
  const uint32_t n = lanes();
  for (const auto& bdf : bdfs) {
    expect_queues(bdf, n);
    if (::testing::Test::HasFailure()) return;
  }
  auto params = extra_params();
  params["lanes"] = std::to_string(n);
  auto a = rdma::Device::open(bdfs[0], {.ip = ip_a, .params = params});
  ASSERT_TRUE(a) << a.error().message();
  auto b = rdma::Device::open(bdfs[1], {.ip = ip_b, .params = params});
  ASSERT_TRUE(b) << b.error().message();
  {
    auto pd_a = (*a)->alloc_pd();
    ASSERT_TRUE(pd_a) << pd_a.error().message();
    auto pd_b = (*b)->alloc_pd();
    ASSERT_TRUE(pd_b) << pd_b.error().message();
    const auto limit = std::chrono::seconds(env_count("UFAB_STRESS_TIMEOUT", 600));
    auto r = lanes_stress::run(**a, *pd_a, **b, *pd_b, lanes_stress::kThreads, lanes_stress::messages_per_thread(),
                               limit);
    lanes_stress::expect_complete(r);
    expect_every_lane_used("a", r, true);
    expect_every_lane_used("b", r, false);
  }
}

TEST(StressVm, E1000eTwoLanesEightThreads) {
  auto nics = env_list("UFAB_STRESS_E1000E");
  if (nics.empty()) GTEST_SKIP() << "UFAB_STRESS_E1000E is not set (two vfio-bound e1000e, BDF,BDF)";
  stress(nics, "10.0.0.1", "10.0.0.2");
}

TEST(StressVm, VirtioNetTwoQueuePairsEightThreads) {
  auto nics = env_list("UFAB_STRESS_VIRTIO");
  if (nics.empty()) {
    GTEST_SKIP() << "UFAB_STRESS_VIRTIO is not set (two vfio-bound virtio-net with 2 queue pairs each; "
                    "stress.sh leaves them out where it cannot make a private network namespace with taps)";
  }
  stress(nics, "10.0.1.1", "10.0.1.2");
}

}  // namespace
}  // namespace ufab
