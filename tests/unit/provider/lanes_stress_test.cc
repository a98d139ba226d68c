// Many threads on one soft-RoCE device: 8 threads, each with its own QP
// pair, CQs and buffers, on one pair of swnic ports with 8 queues each, so
// each thread's QPs live on their own lane (core/transport/lane.h). Each
// thread sends 10^5 SENDs (sequence-numbered, checked in order at the
// receiver) with an RDMA READ every 64th message (checked byte for byte),
// driving both of its QPs by polling its own CQs. Run with the NIC
// steering frames to their lane and with software steering (every frame
// arrives on lane 0 and is handed over), and with one lane (every thread
// shares it). Built under ThreadSanitizer too (scripts/test.sh, --config=tsan).
//
// UFAB_STRESS_MESSAGES overrides the per-thread count (default 100000).
// Every wait has a deadline. The per-thread loop is lanes_stress.cc, shared
// with the VM test over e1000e and virtio-net (tests/vm/cases/stress_vm_test.cc).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "tests/unit/provider/lanes_stress.h"
#include "ufab/rdma.hpp"

namespace ufab::lanes_stress_test {
namespace {

using namespace ::ufab::rdma;

// Under ThreadSanitizer on 2 cores the software-steering case takes about
// 6 minutes (8 TX queues feed one swnic RX ring: docs/drivers/swnic.md).
constexpr auto kDeadline = std::chrono::seconds(900);

struct Devices {
  std::unique_ptr<Device> a, b;
  std::optional<ProtectionDomain> pd_a, pd_b;
};

Devices open_devices(const std::map<std::string, std::string>& params) {
  static int run = 0;
  std::string link = "swnic:stress" + std::to_string(::getpid()) + "r" + std::to_string(run++);
  auto pa = params;
  pa["stale"] = "reset";
  Devices d;
  auto a = Device::open(link + ":0", {.ip = "10.9.0.1", .params = pa});
  EXPECT_TRUE(a.has_value()) << (a ? "" : a.error().message());
  if (!a) return d;
  auto b = Device::open(link + ":1", {.ip = "10.9.0.2", .params = params});
  EXPECT_TRUE(b.has_value()) << (b ? "" : b.error().message());
  if (!b) return d;
  d.a = std::move(*a);
  d.b = std::move(*b);
  d.pd_a.emplace(*d.a->alloc_pd());
  d.pd_b.emplace(*d.b->alloc_pd());
  return d;
}

void stress(const std::map<std::string, std::string>& params, int threads) {
  Devices d = open_devices(params);
  ASSERT_TRUE(d.a && d.b);
  auto r = lanes_stress::run(*d.a, *d.pd_a, *d.b, *d.pd_b, threads, lanes_stress::messages_per_thread(), kDeadline);
  lanes_stress::expect_complete(r);
}

constexpr int kThreads = lanes_stress::kThreads;

TEST(LanesStress, EightThreadsEightLanesNicSteering) { stress({{"queues", "8"}}, kThreads); }

TEST(LanesStress, EightThreadsEightLanesSoftwareSteering) {
  stress({{"queues", "8"}, {"steering", "software"}}, kThreads);
}

TEST(LanesStress, EightThreadsOneLane) { stress({}, kThreads); }

}  // namespace
}  // namespace ufab::lanes_stress_test
