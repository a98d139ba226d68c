// Smoke test of the e1000e plugin inside the VM test bed: two QEMU e1000e
// NICs on one hub, both bound to vfio-pci, driven from user space. Binding is
// not this program's job. Run from the repository root:
//
//   bazel build //tools/ufab //tests/vm/cases:e1000e_vm_test
//   tests/vm/run-vm --nic e1000e --nic e1000e --timeout 300 -- sh -c
//     'modprobe vfio-pci && bazel-bin/tools/ufab/ufab bind 0000:00:02.0 &&
//      bazel-bin/tools/ufab/ufab bind 0000:00:03.0 &&
//      bazel-bin/tests/vm/cases/e1000e_vm_test'
//   (one line)
//
// Environment: UFAB_E1000E "BDF,BDF" (default 0000:00:02.0,0000:00:03.0),
// UFAB_E1000E_FRAMES (default 10000), UFAB_E1000E_PLUGIN (path of
// libufab_e1000e.so; default bazel-bin/drivers/e1000e/libufab_e1000e.so).
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/pci_address.h"
#include "core/nic.h"
#include "core/traffic.h"
#include "dma/buffer_pool.h"
#include "drivers/e1000e/e1000e.h"
#include "tests/vm/cases/gather_traffic.h"
#include "tests/vm/cases/vm_ports.h"

namespace ufab {
namespace {

using Clock = std::chrono::steady_clock;

using vmtest::mac_of;
using vmtest::mac_text;
using vmtest::Port;

// e1000e receivers do not show the hub's reordering, so equal rings are fine.
Port open_port(const std::string& bdf, uint32_t ring = 512, uint32_t pool_buffers = 2048) {
  return vmtest::open_port(*ufab_e1000e_driver(), bdf, ring, ring, pool_buffers);
}

class E1000eSmoke : public ::testing::Test {
 protected:
  void SetUp() override {
    nics_ = vmtest::env_list("UFAB_E1000E", "0000:00:02.0,0000:00:03.0");
    ASSERT_EQ(nics_.size(), 2u) << "UFAB_E1000E must name two e1000e functions bound to vfio-pci";
  }
  std::vector<std::string> nics_;
};

// Sends `frames` test frames (sizes cycling through 60..1514, sequence number
// and checksum in each) from a to b in bursts, polling b between bursts, and
// checks every frame arrives intact and in order.
struct PollResult {
  uint64_t sent = 0, received = 0, corrupt = 0, out_of_order = 0, foreign = 0;
  double seconds = 0;
};

PollResult poll_transfer(Port& a, Port& b, uint64_t frames, uint16_t burst = 32) {
  PollResult r;
  const core::Mac dst = mac_of(*b.nic), src = mac_of(*a.nic);
  ufab_buf* bufs[256];
  ufab_buf* pending[256];
  uint32_t pending_count = 0;
  uint64_t expect = 0;
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::seconds(240);
  while (r.received < frames && Clock::now() < deadline) {
    // Fill a burst (reuse buffers a full TX ring refused last time).
    if (r.sent < frames) {
      uint32_t want = static_cast<uint32_t>(std::min<uint64_t>(burst, frames - r.sent));
      while (pending_count < want) {
        ufab_buf* buf = nullptr;
        if (a.pool->alloc(&buf, 1) != 1) break;
        uint64_t seq = r.sent + pending_count;
        uint32_t len = core::kMinTestFrame + static_cast<uint32_t>((seq * 997) % (core::kMaxTestFrame - 59));
        core::build_test_frame(buf->base + buf->offset, len, dst, src, 7, seq);
        buf->len = len;
        pending[pending_count++] = buf;
      }
      int sent = a.nic->tx_burst(0, pending, static_cast<uint16_t>(pending_count));
      EXPECT_GE(sent, 0) << a.nic->last_error();
      if (sent < 0) break;
      r.sent += static_cast<uint64_t>(sent);
      std::memmove(pending, pending + sent, (pending_count - sent) * sizeof(ufab_buf*));
      pending_count -= static_cast<uint32_t>(sent);
    }
    int n = b.nic->rx_burst(0, bufs, 64);
    EXPECT_GE(n, 0);
    if (n < 0) break;
    for (int i = 0; i < n; ++i) {
      uint64_t seq = 0;
      switch (core::check_test_frame(bufs[i]->base + bufs[i]->offset, bufs[i]->len, src, 7, &seq)) {
        case core::FrameCheck::kOk:
          if (seq != expect) ++r.out_of_order;
          expect = seq + 1;
          ++r.received;
          break;
        case core::FrameCheck::kCorrupt:
          ++r.corrupt;
          break;
        case core::FrameCheck::kNotOurs:
          ++r.foreign;
          break;
      }
    }
    if (n > 0) b.pool->free(bufs, static_cast<uint32_t>(n));
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (pending_count) a.pool->free(pending, pending_count);
  return r;
}

void expect_intact(const PollResult& r, uint64_t frames, const char* label) {
  std::printf("  %s: %llu/%llu frames of 60..1514 B in %.2f s: %.0f frames/s\n", label,
              static_cast<unsigned long long>(r.received), static_cast<unsigned long long>(r.sent), r.seconds,
              r.seconds > 0 ? r.received / r.seconds : 0.0);
  EXPECT_EQ(r.sent, frames);
  EXPECT_EQ(r.received, frames) << "lost " << r.sent - r.received;
  EXPECT_EQ(r.corrupt, 0u);
  EXPECT_EQ(r.out_of_order, 0u);
}

TEST_F(E1000eSmoke, PluginLibraryExportsOnlyTheEntry) {
  const char* env = std::getenv("UFAB_E1000E_PLUGIN");
  std::string path = env ? env : "bazel-bin/drivers/e1000e/libufab_e1000e.so";
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(h, nullptr) << dlerror();
  auto entry = reinterpret_cast<ufab_driver_entry_fn>(dlsym(h, UFAB_DRIVER_ENTRY_SYMBOL));
  ASSERT_NE(entry, nullptr);
  const ufab_driver* d = entry();
  ASSERT_NE(d, nullptr);
  EXPECT_STREQ(d->name, "e1000e");
  EXPECT_EQ(d->pci_match[0].device_id, 0x10D3);
  EXPECT_EQ(dlsym(h, "ufab_e1000e_driver"), nullptr) << "only the entry point is exported";
  dlclose(h);
}

TEST_F(E1000eSmoke, OpensBothAndReportsIdentityAndLink) {
  for (const auto& bdf : nics_) {
    Port p = open_port(bdf);
    ASSERT_TRUE(p.nic);
    const ufab_dev_info& info = p.nic->info();
    auto link = p.nic->link();
    ASSERT_TRUE(link) << link.error().message();
    std::printf("  %s: %s, MAC %s, rings %u..%u, link %s %u Mb/s\n", bdf.c_str(), info.model,
                mac_text(info.mac).c_str(), info.min_ring_size, info.max_ring_size, link->up ? "up" : "down",
                link->speed_mbps);
    EXPECT_EQ(info.mac[0], 0x52);  // run-vm gives 52:54:00:00:00:0N
    EXPECT_EQ(info.mac[1], 0x54);
    EXPECT_TRUE(info.caps & UFAB_DEV_CAP_RX_IRQ);
    EXPECT_EQ(info.max_rx_queues, 2u);
    EXPECT_EQ(info.max_tx_queues, 2u);
    EXPECT_EQ(link->up, 1u);
    EXPECT_EQ(link->speed_mbps, 1000u);
  }
}

TEST_F(E1000eSmoke, FramesArriveIntactAndInOrder) {
  const uint64_t frames = vmtest::env_count("UFAB_E1000E_FRAMES", 10000);
  std::shared_ptr<vfio::IommuBackend> iommu;
  {
    Port a = open_port(nics_[0]);
    Port b = open_port(nics_[1]);
    ASSERT_TRUE(a.nic && b.nic);
    iommu = a.nic->iommu();
    expect_intact(poll_transfer(a, b, frames), frames, "A -> B");
    expect_intact(poll_transfer(b, a, frames / 10), frames / 10, "B -> A");
    auto sa = a.nic->stats();
    auto sb = b.nic->stats();
    ASSERT_TRUE(sa && sb);
    std::printf("  stats A: tx %llu frames %llu B, rx %llu; B: rx %llu frames %llu B, tx %llu, dropped %llu\n",
                static_cast<unsigned long long>(sa->tx_packets), static_cast<unsigned long long>(sa->tx_bytes),
                static_cast<unsigned long long>(sa->rx_packets), static_cast<unsigned long long>(sb->rx_packets),
                static_cast<unsigned long long>(sb->rx_bytes), static_cast<unsigned long long>(sb->tx_packets),
                static_cast<unsigned long long>(sb->rx_dropped));
    EXPECT_EQ(sa->tx_packets, frames);
    EXPECT_EQ(sb->rx_packets, frames);
    EXPECT_EQ(sb->tx_packets, frames / 10);
    EXPECT_EQ(sa->rx_packets, frames / 10);
    EXPECT_EQ(sb->rx_bytes, sa->tx_bytes);
    EXPECT_EQ(sa->rx_bytes, sb->tx_bytes);
    EXPECT_EQ(sa->rx_errors + sb->rx_errors + sa->tx_errors + sb->tx_errors, 0u);
    EXPECT_EQ(sb->rx_dropped, 0u);
  }
  // Closing gave back every mapping: rings, buffers, nothing left pinned.
  EXPECT_EQ(iommu->usage().mappings, 0u);
  EXPECT_EQ(iommu->usage().pinned_bytes, 0u);
}

TEST_F(E1000eSmoke, SmallRingsAndAShortPool) {
  // 64-entry rings wrap every 64 frames; B's pool barely covers its ring so
  // refills come up short while the test holds frames.
  Port a = open_port(nics_[0], 64, 256);
  Port b = open_port(nics_[1], 64, 80);
  ASSERT_TRUE(a.nic && b.nic);
  expect_intact(poll_transfer(a, b, 3000, 16), 3000, "A -> B, 64-entry rings");
  ufab_buf* held[60];
  // Hold most of B's spare buffers, send, and check frames still arrive as
  // buffers come back.
  uint32_t got = b.pool->alloc(held, 10);
  expect_intact(poll_transfer(a, b, 1000, 8), 1000, "A -> B, pool short");
  b.pool->free(held, got);
}

TEST_F(E1000eSmoke, StopAndStartAgain) {
  Port a = open_port(nics_[0]);
  Port b = open_port(nics_[1]);
  ASSERT_TRUE(a.nic && b.nic);
  expect_intact(poll_transfer(a, b, 500), 500, "before stop");
  ASSERT_TRUE(b.nic->stop());
  ASSERT_TRUE(a.nic->stop());
  ufab_buf* buf = nullptr;
  ASSERT_EQ(a.pool->alloc(&buf, 1), 1u);
  buf->len = 60;
  EXPECT_EQ(a.nic->tx_burst(0, &buf, 1), -ENETDOWN);  // stopped: an error, not a hang
  a.pool->free(&buf, 1);
  EXPECT_EQ(a.pool->available(), a.pool->capacity() - 511) << "only the posted RX buffers are out";
  auto s = a.nic->start();
  ASSERT_TRUE(s) << s.error().message();
  s = b.nic->start();
  ASSERT_TRUE(s) << s.error().message();
  expect_intact(poll_transfer(a, b, 500), 500, "after restart");
}

TEST_F(E1000eSmoke, BadRequestsFailWithAReason) {
  Port a = open_port(nics_[0]);
  ASSERT_TRUE(a.nic);
  ufab_buf* b = nullptr;
  ASSERT_EQ(a.pool->alloc(&b, 1), 1u);
  b->len = 1600;  // over 1522: no jumbo frames at the default MTU
  EXPECT_EQ(a.nic->tx_burst(0, &b, 1), -EINVAL);
  a.pool->free(&b, 1);
  auto bad = a.nic->setup_rx_queue(2, 256, *a.pool);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message().find("RX queue 2 does not exist"), std::string::npos) << bad.error().message();
  bad = a.nic->setup_tx_queue(2, 256);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message().find("TX queue 2 does not exist"), std::string::npos) << bad.error().message();
  ufab_buf* none[1];
  EXPECT_EQ(a.nic->rx_burst(2, none, 1), -EINVAL);
  EXPECT_NE(a.nic->last_error().find("queues 0 and 1"), std::string::npos) << a.nic->last_error();
  EXPECT_FALSE(a.nic->setup_tx_queue(0, 256)) << "reconfiguring while started";
  ASSERT_TRUE(a.nic->stop());
  EXPECT_FALSE(a.nic->setup_tx_queue(0, 100));
  EXPECT_NE(a.nic->last_error().find("power of two"), std::string::npos) << a.nic->last_error();
}

// ---------------------------------------------------------- jumbo frames

// A port opened with driver parameters (mtu=...) and a pool of
// `buffer_size`-byte buffers (128 bytes of headroom), queue 0 started.
Port open_with_params(const std::string& bdf, core::NicParams params, uint32_t buffer_size, uint32_t ring = 256,
                      uint32_t pool_buffers = 1024) {
  Port p;
  auto addr = PciAddress::parse(bdf);
  EXPECT_TRUE(addr) << bdf;
  if (!addr) return p;
  auto nic = core::Nic::open_pci(*ufab_e1000e_driver(), *addr, std::move(params));
  EXPECT_TRUE(nic) << (nic ? "" : nic.error().message());
  if (!nic) return p;
  p.nic = std::move(*nic);
  auto pool = p.nic->create_pool(pool_buffers, buffer_size);
  EXPECT_TRUE(pool) << (pool ? "" : pool.error().message());
  if (!pool) return Port{};
  p.pool = *pool;
  auto ok = p.nic->setup_rx_queue(0, ring, *p.pool);
  if (ok) ok = p.nic->setup_tx_queue(0, ring);
  if (ok) ok = p.nic->start();
  EXPECT_TRUE(ok) << (ok ? "" : ok.error().message());
  if (!ok) return Port{};
  return p;
}

// Sends `frames` test frames of sizes cycling through [min_len, max_len]
// (FNV checksum over every byte) from a to b; counts what arrives intact.
struct JumboResult {
  uint64_t sent = 0, received = 0, corrupt = 0, out_of_order = 0, over_1522 = 0, rx_bytes = 0;
};
JumboResult jumbo_transfer(Port& a, Port& b, uint64_t frames, uint32_t min_len, uint32_t max_len) {
  JumboResult r;
  const core::Mac dst = mac_of(*b.nic), src = mac_of(*a.nic);
  ufab_buf* bufs[64];
  uint64_t expect = 0;
  const uint32_t span = max_len - min_len + 1;
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  // Once everything is sent, what has not arrived within 2 s never will
  // (QEMU delivers inside the TDT write, or when a refilled ring has room).
  std::optional<Clock::time_point> drain;
  while (r.received < frames && Clock::now() < deadline && (!drain || Clock::now() < *drain)) {
    if (!drain && r.sent == frames) drain = Clock::now() + std::chrono::seconds(2);
    if (r.sent < frames) {
      ufab_buf* buf = nullptr;
      if (a.pool->alloc(&buf, 1) == 1) {
        // The largest size first, then sizes stepping by a prime.
        uint32_t len = r.sent == 0 ? max_len : min_len + static_cast<uint32_t>((r.sent * 997) % span);
        core::build_test_frame(buf->base + buf->offset, len, dst, src, 9, r.sent);
        buf->len = len;
        int sent = a.nic->tx_burst(0, &buf, 1);
        EXPECT_GE(sent, 0) << a.nic->last_error();
        if (sent < 0) {
          a.pool->free(&buf, 1);
          break;
        }
        if (sent == 0) a.pool->free(&buf, 1);
        r.sent += static_cast<uint64_t>(sent);
      }
    }
    int n = b.nic->rx_burst(0, bufs, 64);
    EXPECT_GE(n, 0);
    if (n < 0) break;
    for (int i = 0; i < n; ++i) {
      uint64_t seq = 0;
      switch (core::check_test_frame(bufs[i]->base + bufs[i]->offset, bufs[i]->len, src, 9, &seq)) {
        case core::FrameCheck::kOk:
          if (seq != expect) ++r.out_of_order;
          expect = seq + 1;
          ++r.received;
          r.rx_bytes += bufs[i]->len;
          if (bufs[i]->len > 1522) ++r.over_1522;
          break;
        case core::FrameCheck::kCorrupt:
          ++r.corrupt;
          break;
        case core::FrameCheck::kNotOurs:
          break;
      }
    }
    if (n > 0) b.pool->free(bufs, static_cast<uint32_t>(n));
  }
  return r;
}

// mtu=9000 on both ends (docs/drivers/e1000e.md "Jumbo frames"): the
// device reports it, frames up to 9014 bytes (the MTU plus the Ethernet
// header) go out and come back byte for byte, in order; both directions.
TEST_F(E1000eSmoke, JumboFramesAtMtu9000) {
  constexpr uint32_t kBuffer = 128 + 9 * 1024;  // headroom + FLXBUF of 9 KiB
  Port a = open_with_params(nics_[0], {{"mtu", "9000"}}, kBuffer);
  Port b = open_with_params(nics_[1], {{"mtu", "9000"}}, kBuffer);
  ASSERT_TRUE(a.nic && b.nic);
  EXPECT_EQ(a.nic->info().mtu, 9000u);
  EXPECT_EQ(a.nic->info().max_mtu, 9000u);
  const uint64_t frames = 2000;
  for (int dir = 0; dir < 2; ++dir) {
    Port& from = dir == 0 ? a : b;
    Port& to = dir == 0 ? b : a;
    auto before_tx = from.nic->stats();
    auto before_rx = to.nic->stats();
    ASSERT_TRUE(before_tx && before_rx);
    JumboResult r = jumbo_transfer(from, to, frames, core::kMinTestFrame, 9014);
    std::printf("  %s: %llu/%llu frames of 60..9014 B intact, %llu of them over 1522 B, %llu bytes\n",
                dir == 0 ? "A -> B" : "B -> A", static_cast<unsigned long long>(r.received),
                static_cast<unsigned long long>(r.sent), static_cast<unsigned long long>(r.over_1522),
                static_cast<unsigned long long>(r.rx_bytes));
    EXPECT_EQ(r.sent, frames);
    EXPECT_EQ(r.received, frames);
    EXPECT_EQ(r.corrupt, 0u);
    EXPECT_EQ(r.out_of_order, 0u);
    EXPECT_GT(r.over_1522, frames / 2) << "most sizes lie above the standard frame";
    auto after_tx = from.nic->stats();
    auto after_rx = to.nic->stats();
    ASSERT_TRUE(after_tx && after_rx);
    // The device's own counters (GPTC/GPRC, octets without CRC) agree.
    EXPECT_EQ(after_tx->tx_packets - before_tx->tx_packets, frames);
    EXPECT_EQ(after_rx->rx_packets - before_rx->rx_packets, frames);
    EXPECT_EQ(after_rx->rx_bytes - before_rx->rx_bytes, r.rx_bytes);
    EXPECT_EQ(after_rx->rx_errors, 0u);
  }
  // The largest frame the driver takes is the MTU + 22; one byte more is
  // refused with the limit in the message.
  ufab_buf* buf = nullptr;
  ASSERT_EQ(a.pool->alloc(&buf, 1), 1u);
  buf->len = 9023;
  EXPECT_EQ(a.nic->tx_burst(0, &buf, 1), -EINVAL);
  EXPECT_NE(a.nic->last_error().find("14..9022"), std::string::npos) << a.nic->last_error();
  a.pool->free(&buf, 1);
}

// A station at the default MTU keeps long packets off: a jumbo frame from
// a mtu=9000 neighbour is dropped by its device (never written past a
// buffer), and standard frames still arrive after it.
TEST_F(E1000eSmoke, DefaultMtuStationDropsJumboFrames) {
  Port a = open_with_params(nics_[0], {{"mtu", "9000"}}, 128 + 9 * 1024);
  Port b = open_port(nics_[1]);
  ASSERT_TRUE(a.nic && b.nic);
  EXPECT_EQ(b.nic->info().mtu, 1500u);
  JumboResult big = jumbo_transfer(a, b, 20, 4000, 4000);
  EXPECT_EQ(big.sent, 20u);
  EXPECT_EQ(big.received, 0u) << "a 1500-MTU e1000e received a 4000-byte frame";
  JumboResult small = jumbo_transfer(a, b, 200, core::kMinTestFrame, 1514);
  EXPECT_EQ(small.received, 200u);
  EXPECT_EQ(small.corrupt, 0u);
}

TEST_F(E1000eSmoke, MtuParameterIsChecked) {
  auto addr = PciAddress::parse(nics_[0]);
  ASSERT_TRUE(addr);
  for (const char* bad : {"9001", "1499", "abc", "-1", ""}) {
    auto nic = core::Nic::open_pci(*ufab_e1000e_driver(), *addr, {{"mtu", bad}});
    ASSERT_FALSE(nic) << "mtu=" << bad << " was accepted";
    EXPECT_NE(nic.error().message().find("parameter mtu="), std::string::npos) << nic.error().message();
  }
  // RX buffers too small for the MTU's receive buffers are refused at setup.
  auto nic = core::Nic::open_pci(*ufab_e1000e_driver(), *addr, {{"mtu", "4200"}});
  ASSERT_TRUE(nic) << nic.error().message();
  auto pool = (*nic)->create_pool(512, 2048);
  ASSERT_TRUE(pool);
  auto rx = (*nic)->setup_rx_queue(0, 256, **pool);
  ASSERT_FALSE(rx);
  EXPECT_NE(rx.error().message().find("5120 bytes the 82574L may write per buffer at MTU 4200"), std::string::npos)
      << rx.error().message();
}

// Gather transmit (ABI 1.3): frames of 1 to 4 segments, the header in the
// frame's buffer and the rest read by the device straight from another DMA
// region through the vIOMMU, arrive byte for byte and in order. A's TX ring
// has 64 descriptors (63 usable): the first call offers more than that and
// must take whole frames only (QEMU transmits inside the TDT write, so the
// ring is empty at every call and each call can fill it).
TEST_F(E1000eSmoke, GatheredFramesArriveByteForByte) {
  Port a = vmtest::open_port(*ufab_e1000e_driver(), nics_[0], 256, 64);
  Port b = open_port(nics_[1]);
  ASSERT_TRUE(a.nic && b.nic);
  vmtest::GatherSpec spec;
  spec.frames = vmtest::env_count("UFAB_E1000E_FRAMES", 10000) / 2;
  spec.burst = 32;
  spec.ring_room = 63;
  spec.page_split = true;
  auto r = vmtest::gather_transfer(a, b, spec, "A -> B gathered, 64-entry TX ring");
  EXPECT_EQ(r.segments[1] + r.segments[2] + r.segments[3] + r.segments[4], r.sent);
  for (int s = 1; s <= 4; ++s) EXPECT_GT(r.segments[s], 0u) << s << " segments";
  auto sa = a.nic->stats();
  ASSERT_TRUE(sa);
  EXPECT_EQ(sa->tx_packets, spec.frames) << "GPTC: the device sent each gathered frame once";
  EXPECT_EQ(sa->tx_errors, 0u);
  // Every frame's buffer came back once the device was done with it.
  ufab_buf* none[1];
  ASSERT_EQ(a.nic->tx_burst_gather(0, nullptr, 0), 0);
  EXPECT_EQ(a.nic->tx_burst(0, none, 0), 0);
  EXPECT_EQ(a.pool->available(), a.pool->capacity() - 255) << "only the posted RX buffers are out";
}

// Interrupt mode: B sleeps in poll() on the RX eventfd; a sender thread
// sends bursts with pauses. Every burst must wake B (the driver re-arms in
// rx_burst when it finds the ring empty) and every frame must arrive.
TEST_F(E1000eSmoke, InterruptModeWakesForEachBurst) {
  Port a = open_port(nics_[0]);
  Port b = open_port(nics_[1]);
  ASSERT_TRUE(a.nic && b.nic);
  auto fd = b.nic->enable_rx_irq(0);
  ASSERT_TRUE(fd) << fd.error().message();
  ASSERT_GE(*fd, 0);

  const core::Mac dst = mac_of(*b.nic), src = mac_of(*a.nic);
  constexpr int kBursts = 200;
  constexpr int kPerBurst = 16;
  std::atomic<int> bursts_sent{0};
  std::atomic<bool> sender_failed{false};
  std::thread sender([&] {
    uint64_t seq = 0;
    for (int k = 0; k < kBursts; ++k) {
      ufab_buf* bufs[kPerBurst];
      if (a.pool->alloc(bufs, kPerBurst) != kPerBurst) {
        sender_failed = true;
        return;
      }
      for (int i = 0; i < kPerBurst; ++i, ++seq) {
        uint32_t len = 60 + static_cast<uint32_t>((seq * 331) % 1455);
        core::build_test_frame(bufs[i]->base + bufs[i]->offset, len, dst, src, 9, seq);
        bufs[i]->len = len;
      }
      int done = 0;
      while (done < kPerBurst) {
        int n = a.nic->tx_burst(0, bufs + done, static_cast<uint16_t>(kPerBurst - done));
        if (n < 0) {
          sender_failed = true;
          return;
        }
        done += n;
      }
      ++bursts_sent;
      // Let the receiver go back to sleep between bursts.
      std::this_thread::sleep_for(std::chrono::milliseconds(3));
    }
  });

  uint64_t received = 0, expect = 0, bad = 0, wakeups = 0, empty_wakeups = 0, timeouts = 0;
  const uint64_t total = uint64_t{kBursts} * kPerBurst;
  const auto start = Clock::now();
  ufab_buf* bufs[64];
  while (received < total && timeouts < 5) {
    // Drain first (frames may be waiting), then sleep.
    int n;
    bool any = false;
    while ((n = b.nic->rx_burst(0, bufs, 64)) > 0) {
      any = true;
      for (int i = 0; i < n; ++i) {
        uint64_t seq = 0;
        if (core::check_test_frame(bufs[i]->base + bufs[i]->offset, bufs[i]->len, src, 9, &seq) !=
                core::FrameCheck::kOk ||
            seq != expect) {
          ++bad;
        }
        expect = seq + 1;
        ++received;
      }
      b.pool->free(bufs, static_cast<uint32_t>(n));
    }
    ASSERT_GE(n, 0);
    if (wakeups && !any) ++empty_wakeups;
    if (received >= total) break;
    pollfd p{*fd, POLLIN, 0};
    int r = ::poll(&p, 1, 1000);
    if (r == 0) {
      ++timeouts;  // a lost wake-up: the sender is done or the interrupt never came
      continue;
    }
    ASSERT_GT(r, 0);
    uint64_t count;
    ASSERT_EQ(::read(*fd, &count, sizeof count), static_cast<ssize_t>(sizeof count));
    ++wakeups;
  }
  sender.join();
  double secs = std::chrono::duration<double>(Clock::now() - start).count();
  auto st = b.nic->stats();
  ASSERT_TRUE(st);
  std::printf(
      "  irq mode: %llu/%llu frames in %d bursts, %.2f s; %llu wake-ups (%llu found nothing), "
      "%llu device interrupts, %llu poll timeouts\n",
      static_cast<unsigned long long>(received), static_cast<unsigned long long>(total), bursts_sent.load(), secs,
      static_cast<unsigned long long>(wakeups), static_cast<unsigned long long>(empty_wakeups),
      static_cast<unsigned long long>(st->irqs), static_cast<unsigned long long>(timeouts));
  EXPECT_FALSE(sender_failed.load());
  EXPECT_EQ(received, total);
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(timeouts, 0u) << "a burst did not wake the receiver within 1 s";
  EXPECT_GE(wakeups, uint64_t{kBursts} / 4) << "the receiver should sleep between most bursts";
  EXPECT_GT(st->irqs, 0u);

  // Idle: after at most a couple of late wake-ups the eventfd stays quiet.
  int idle_wakeups = 0;
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(b.nic->rx_burst(0, bufs, 64), 0);
    pollfd p{*fd, POLLIN, 0};
    if (::poll(&p, 1, 200) == 0) break;
    uint64_t count;
    (void)!::read(*fd, &count, sizeof count);
    ++idle_wakeups;
  }
  EXPECT_LE(idle_wakeups, 2) << "interrupts kept firing with no traffic";

  // Back to polling: no more interrupts, frames still flow.
  ASSERT_TRUE(b.nic->disable_rx_irq(0));
  expect_intact(poll_transfer(a, b, 300), 300, "polling again");
  pollfd p{*fd, POLLIN, 0};
  if (::poll(&p, 1, 0) > 0) {
    uint64_t count;
    (void)!::read(*fd, &count, sizeof count);
  }
  expect_intact(poll_transfer(a, b, 100), 100, "polling, irq disabled");
  EXPECT_EQ(::poll(&p, 1, 100), 0) << "an interrupt arrived while disabled";
}

// ------------------------------------------------------------- two queues

// A NIC with RX queues 0 and 1 and TX queues 0 and 1, one buffer pool per
// queue (pools are single-threaded), started. rx_steer is asked for
// RoCE-QP steering first and must refuse it.
struct MultiPort {
  std::unique_ptr<core::Nic> nic;
  std::shared_ptr<dma::BufferPool> rx_pool[2], tx_pool[2];
};

MultiPort open_multi(const std::string& bdf) {
  MultiPort p;
  auto addr = PciAddress::parse(bdf);
  EXPECT_TRUE(addr) << bdf;
  if (!addr) return p;
  auto nic = core::Nic::open_pci(*ufab_e1000e_driver(), *addr);
  EXPECT_TRUE(nic) << (nic ? "" : nic.error().message());
  if (!nic) return p;
  p.nic = std::move(*nic);
  for (int q = 0; q < 2; ++q) {
    auto rp = p.nic->create_pool(1024);
    auto tp = p.nic->create_pool(1024);
    EXPECT_TRUE(rp && tp);
    if (!rp || !tp) return MultiPort{};
    p.rx_pool[q] = *rp;
    p.tx_pool[q] = *tp;
    auto ok = p.nic->setup_rx_queue(static_cast<uint16_t>(q), 512, *p.rx_pool[q]);
    if (ok) ok = p.nic->setup_tx_queue(static_cast<uint16_t>(q), 256);
    EXPECT_TRUE(ok) << (ok ? "" : ok.error().message());
    if (!ok) return MultiPort{};
  }
  // The 82574L cannot steer RoCEv2 by QP (its RSS hashes no UDP ports):
  // the answer is EOPNOTSUPP with the reason, and the caller steers in
  // software. "No steering" is accepted.
  auto steer = p.nic->set_rx_steering(UFAB_STEER_ROCE_QPN, 2);
  EXPECT_FALSE(steer);
  if (!steer) {
    EXPECT_EQ(steer.error().code(), EOPNOTSUPP) << steer.error().message();
    EXPECT_NE(steer.error().message().find("UDP"), std::string::npos) << steer.error().message();
  }
  auto none = p.nic->set_rx_steering(UFAB_STEER_NONE, 2);
  EXPECT_TRUE(none) << (none ? "" : none.error().message());
  auto ok = p.nic->start();
  EXPECT_TRUE(ok) << (ok ? "" : ok.error().message());
  if (!ok) return MultiPort{};
  return p;
}

// Sends `frames` test frames of stream `stream` from TX queue `queue` of
// `a` to `dst`; returns how many were taken (stops at the first error).
// Stays at most `window` frames ahead of `delivered` (what the receiver
// counted): QEMU's hub holds a frame for a full receiver and delivers later
// ones first once there is room (docs/drivers/virtio_net.md), so an
// unpaced sender shows reordering that is the hub's, not the driver's.
uint64_t send_on_queue(core::Nic& a, dma::BufferPool& pool, uint16_t queue, const core::Mac& dst,
                       const core::Mac& src, uint32_t stream, uint64_t frames, std::atomic<bool>* failed,
                       const std::atomic<uint64_t>* delivered, uint64_t window = 192) {
  uint64_t sent = 0;
  ufab_buf* pending[32];
  uint32_t pending_count = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(200);
  while (sent < frames && Clock::now() < deadline && !(failed && *failed)) {
    if (sent + pending_count > delivered->load() + window) {
      std::this_thread::yield();
      continue;
    }
    uint32_t want = static_cast<uint32_t>(std::min<uint64_t>(32, frames - sent));
    while (pending_count < want) {
      ufab_buf* buf = nullptr;
      if (pool.alloc(&buf, 1) != 1) break;
      uint64_t seq = sent + pending_count;
      uint32_t len = core::kMinTestFrame + static_cast<uint32_t>((seq * 613) % (core::kMaxTestFrame - 59));
      core::build_test_frame(buf->base + buf->offset, len, dst, src, stream, seq);
      buf->len = len;
      pending[pending_count++] = buf;
    }
    int n = a.tx_burst(queue, pending, static_cast<uint16_t>(pending_count));
    if (n < 0) {
      ADD_FAILURE() << "tx_burst on queue " << queue << ": " << a.last_error();
      if (failed) *failed = true;
      break;
    }
    sent += static_cast<uint64_t>(n);
    std::memmove(pending, pending + n, (pending_count - n) * sizeof(ufab_buf*));
    pending_count -= static_cast<uint32_t>(n);
    if (n == 0) std::this_thread::yield();  // ring full: the device catches up
  }
  if (pending_count) pool.free(pending, pending_count);
  return sent;
}

// Frames sent only on TX queue 1 of A (queue 0 never used) arrive at B: the
// device transmitted them from ring 1. B's RX queue 1 stays empty (no RSS).
TEST_F(E1000eSmoke, TxQueueOneReachesThePeer) {
  MultiPort a = open_multi(nics_[0]);
  Port b = open_port(nics_[1]);
  ASSERT_TRUE(a.nic && b.nic);
  const uint64_t frames = vmtest::env_count("UFAB_E1000E_FRAMES", 10000) / 5;
  const core::Mac dst = mac_of(*b.nic), src = mac_of(*a.nic);
  std::atomic<bool> failed{false};
  std::atomic<uint64_t> delivered{0};
  uint64_t received = 0, expect = 0, bad = 0;
  std::thread sender([&] { send_on_queue(*a.nic, *a.tx_pool[1], 1, dst, src, 21, frames, &failed, &delivered); });
  ufab_buf* bufs[64];
  const auto deadline = Clock::now() + std::chrono::seconds(240);
  while (received < frames && Clock::now() < deadline && !failed) {
    int n = b.nic->rx_burst(0, bufs, 64);
    ASSERT_GE(n, 0) << b.nic->last_error();
    for (int i = 0; i < n; ++i) {
      uint64_t seq = 0;
      auto c = core::check_test_frame(bufs[i]->base + bufs[i]->offset, bufs[i]->len, src, 21, &seq);
      if (c == core::FrameCheck::kNotOurs) continue;
      if (c != core::FrameCheck::kOk || seq != expect) ++bad;
      expect = seq + 1;
      ++received;
    }
    delivered = received;
    if (n > 0) b.pool->free(bufs, static_cast<uint32_t>(n));
  }
  failed = failed || received < frames;  // stop the sender if we gave up
  sender.join();
  EXPECT_EQ(received, frames);
  EXPECT_EQ(bad, 0u);
  // A's RX queue 1 got nothing: without RSS the 82574L fills only queue 0.
  EXPECT_EQ(a.nic->rx_burst(1, bufs, 64), 0);
  auto sa = a.nic->stats();
  ASSERT_TRUE(sa);
  EXPECT_EQ(sa->tx_packets, frames) << "GPTC counts what the device sent, all from ring 1";
  std::printf("  TX queue 1 -> peer: %llu/%llu frames intact and in order\n",
              static_cast<unsigned long long>(received), static_cast<unsigned long long>(frames));
}

// One thread per TX queue, no lock between them (the soft-RoCE transport's
// lanes): both streams arrive complete and each in its own order.
TEST_F(E1000eSmoke, TwoThreadsTwoTxQueuesNoLock) {
  MultiPort a = open_multi(nics_[0]);
  MultiPort b = open_multi(nics_[1]);
  ASSERT_TRUE(a.nic && b.nic);
  const uint64_t frames = vmtest::env_count("UFAB_E1000E_FRAMES", 10000) / 5;
  const core::Mac dst = mac_of(*b.nic), src = mac_of(*a.nic);
  std::atomic<bool> failed{false};
  std::atomic<uint64_t> delivered[2] = {0, 0};
  std::thread t0([&] { send_on_queue(*a.nic, *a.tx_pool[0], 0, dst, src, 30, frames, &failed, &delivered[0]); });
  std::thread t1([&] { send_on_queue(*a.nic, *a.tx_pool[1], 1, dst, src, 31, frames, &failed, &delivered[1]); });
  uint64_t received[2] = {0, 0}, expect[2] = {0, 0}, bad = 0, on_queue1 = 0;
  ufab_buf* bufs[64];
  const auto deadline = Clock::now() + std::chrono::seconds(240);
  while (received[0] + received[1] < 2 * frames && Clock::now() < deadline && !failed) {
    int n = b.nic->rx_burst(0, bufs, 64);
    ASSERT_GE(n, 0) << b.nic->last_error();
    for (int i = 0; i < n; ++i) {
      const uint8_t* f = bufs[i]->base + bufs[i]->offset;
      for (uint32_t s = 0; s < 2; ++s) {
        uint64_t seq = 0;
        auto c = core::check_test_frame(f, bufs[i]->len, src, 30 + s, &seq);
        if (c == core::FrameCheck::kNotOurs) continue;
        if (c != core::FrameCheck::kOk || seq != expect[s]) ++bad;
        expect[s] = seq + 1;
        ++received[s];
      }
    }
    delivered[0] = received[0];
    delivered[1] = received[1];
    if (n > 0) b.rx_pool[0]->free(bufs, static_cast<uint32_t>(n));
    int m = b.nic->rx_burst(1, bufs, 64);
    ASSERT_GE(m, 0) << b.nic->last_error();
    on_queue1 += static_cast<uint64_t>(m);
    if (m > 0) b.rx_pool[1]->free(bufs, static_cast<uint32_t>(m));
  }
  bool gave_up = received[0] + received[1] < 2 * frames;
  if (gave_up) failed = true;  // stop the senders
  t0.join();
  t1.join();
  std::printf("  2 threads, TX queues 0 and 1: %llu + %llu of %llu frames each; B's RX queue 1 got %llu\n",
              static_cast<unsigned long long>(received[0]), static_cast<unsigned long long>(received[1]),
              static_cast<unsigned long long>(frames), static_cast<unsigned long long>(on_queue1));
  EXPECT_FALSE(gave_up);
  EXPECT_EQ(received[0], frames);
  EXPECT_EQ(received[1], frames);
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(on_queue1, 0u) << "the 82574L fills RX queue 1 only under RSS, which this driver leaves off";
  auto sa = a.nic->stats();
  ASSERT_TRUE(sa);
  EXPECT_EQ(sa->tx_packets, 2 * frames);
}

}  // namespace
}  // namespace ufab
