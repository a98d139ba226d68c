// Runs inside the VM (tests/vm/suites/raw_frames.sh) with NICs already bound
// to vfio-pci by `ufab bind`. Drives QEMU's e1000e and virtio-net through the
// ufab plugins: 100,000 frames per pair, interrupt mode, and frames to and
// from a NIC the kernel drives. Environment:
//   UFAB_E1000E   "BDF,BDF"  two e1000e on vfio-pci
//   UFAB_VIRTIO   "BDF,BDF"  two virtio-net on vfio-pci
//   UFAB_KERNEL_IF           a kernel-driven interface on the same hub
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "base/fd.h"
#include "base/files.h"
#include "core/nic_open.h"
#include "core/traffic.h"
#include "drivers/builtin.h"
#include "tests/vm/cases/vm_ports.h"

namespace ufab {
namespace {

using vmtest::env_list;
using vmtest::Port;

// The plugin the registry picks for the device, as the CLI would.
Port open_port(const core::PluginRegistry& registry, const std::string& bdf) {
  auto plugin = core::plugin_for(registry, bdf);
  EXPECT_TRUE(plugin) << (plugin ? "" : plugin.error().message());
  if (!plugin) return Port{};
  return vmtest::open_port((*plugin)->ops, bdf);
}

// One rx_burst: how many of the frames were valid test frames of `stream`
// from `src` (all are freed); a negative errno when the burst failed.
int take_test_frames(Port& port, const core::Mac& src, uint32_t stream) {
  ufab_buf* in[32];
  int got = port.nic->rx_burst(0, in, 32);
  if (got <= 0) return got;
  int valid = 0;
  for (int i = 0; i < got; ++i) {
    uint64_t seq;
    if (core::check_test_frame(in[i]->base + in[i]->offset, in[i]->len, src, stream, &seq) == core::FrameCheck::kOk) {
      ++valid;
    }
  }
  port.pool->free(in, static_cast<uint32_t>(got));
  return valid;
}

class RawFramesVm : public ::testing::Test {
 protected:
  core::PluginRegistry registry_ = core::default_registry(drivers::builtin_drivers());

  void transfer(const std::string& a, const std::string& b, uint64_t frames) {
    SCOPED_TRACE(a + " -> " + b);
    std::shared_ptr<vfio::IommuBackend> iommu_a;
    {
      Port tx = open_port(registry_, a);
      Port rx = open_port(registry_, b);
      ASSERT_TRUE(tx.nic && rx.nic);
      iommu_a = tx.nic->iommu();
      core::TransferSpec spec;
      spec.frames = frames;
      spec.timeout_s = 300;
      auto rep = core::run_transfer(*tx.nic, *tx.pool, *rx.nic, *rx.pool, spec);
      ASSERT_TRUE(rep) << rep.error().message();
      std::printf("  %s -> %s: %llu frames of 60..1514 B in %.2f s: %.0f frames/s, %.1f Mbit/s\n", a.c_str(),
                  b.c_str(), static_cast<unsigned long long>(rep->received), rep->seconds, rep->frames_per_second(),
                  rep->bits_per_second() / 1e6);
      EXPECT_EQ(rep->sent, frames);
      EXPECT_EQ(rep->received, frames) << "lost " << rep->sent - rep->received;
      EXPECT_EQ(rep->out_of_order, 0u);
      EXPECT_EQ(rep->corrupt, 0u);
      EXPECT_FALSE(rep->timed_out);
      auto st = tx.nic->stats();
      ASSERT_TRUE(st);
      EXPECT_GE(st->tx_packets, frames);
      auto sr = rx.nic->stats();
      ASSERT_TRUE(sr);
      EXPECT_GE(sr->rx_packets, frames);
      EXPECT_GT(iommu_a->usage().mappings, 0u);
    }
    // Closing leaves nothing mapped in the IOMMU and nothing pinned.
    EXPECT_EQ(iommu_a->usage().mappings, 0u);
    EXPECT_EQ(iommu_a->usage().pinned_bytes, 0u);
  }
};

TEST_F(RawFramesVm, E1000eToE1000e100kFrames) {
  auto nics = env_list("UFAB_E1000E");
  ASSERT_EQ(nics.size(), 2u);
  transfer(nics[0], nics[1], 100000);
}

TEST_F(RawFramesVm, VirtioToVirtio100kFrames) {
  auto nics = env_list("UFAB_VIRTIO");
  ASSERT_EQ(nics.size(), 2u);
  transfer(nics[0], nics[1], 100000);
}

TEST_F(RawFramesVm, E1000eVirtio100kEachWayAcrossTheHub) {
  auto e = env_list("UFAB_E1000E"), v = env_list("UFAB_VIRTIO");
  ASSERT_FALSE(e.empty());
  ASSERT_FALSE(v.empty());
  transfer(e[0], v[0], 100000);
  transfer(v[0], e[0], 100000);
}

// A receiver that sleeps in poll() on the queue's eventfd wakes for every
// burst the other port sends.
void interrupt_mode(const core::PluginRegistry& registry, const std::string& a, const std::string& b) {
  SCOPED_TRACE(a + " -> " + b + " (interrupt mode)");
  Port tx = open_port(registry, a);
  Port rx = open_port(registry, b);
  ASSERT_TRUE(tx.nic && rx.nic);
  ASSERT_TRUE(rx.nic->info().caps & UFAB_DEV_CAP_RX_IRQ);
  auto fd = rx.nic->enable_rx_irq(0);
  ASSERT_TRUE(fd) << fd.error().message();
  core::Mac dst, src;
  std::memcpy(dst.data(), rx.nic->info().mac, 6);
  std::memcpy(src.data(), tx.nic->info().mac, 6);
  constexpr int kBursts = 20, kPerBurst = 16;
  uint64_t seq = 0, received = 0;
  int wakeups = 0;
  for (int burst = 0; burst < kBursts; ++burst) {
    ufab_buf* bufs[kPerBurst];
    ASSERT_EQ(tx.pool->alloc(bufs, kPerBurst), static_cast<uint32_t>(kPerBurst));
    for (auto* b : bufs) {
      core::build_test_frame(b->base + b->offset, 128, dst, src, 7, seq++);
      b->len = 128;
    }
    int sent = 0;
    for (int tries = 0; sent < kPerBurst && tries < 1000; ++tries) {
      int n = tx.nic->tx_burst(0, bufs + sent, static_cast<uint16_t>(kPerBurst - sent));
      ASSERT_GE(n, 0) << tx.nic->last_error();
      sent += n;
    }
    ASSERT_EQ(sent, kPerBurst);
    // Sleep until the interrupt; drain; re-arm. Bounded by the poll timeouts.
    uint64_t want = received + kPerBurst;
    for (int waits = 0; received < want && waits < 5; ++waits) {
      pollfd p{*fd, POLLIN, 0};
      int r = ::poll(&p, 1, 2000);
      ASSERT_GE(r, 0);
      if (r == 0) continue;
      uint64_t count;
      ASSERT_EQ(::read(*fd, &count, sizeof count), 8);
      ++wakeups;
      // Drain: a few empty polls in a row mean the burst is all in.
      for (int spins = 0, idle = 0; spins < 100000 && received < want && idle < 3; ++spins) {
        int got = take_test_frames(rx, src, 7);
        ASSERT_GE(got, 0) << rx.nic->last_error();
        received += static_cast<uint64_t>(got);
        idle = got == 0 ? idle + 1 : 0;
      }
      auto again = rx.nic->enable_rx_irq(0);  // re-arm after draining
      ASSERT_TRUE(again) << again.error().message();
    }
    ASSERT_EQ(received, want) << "burst " << burst << " did not wake the receiver";
  }
  EXPECT_GE(wakeups, kBursts);
  std::printf("  %s: %d bursts, %d wake-ups, %llu frames\n", b.c_str(), kBursts, wakeups,
              static_cast<unsigned long long>(received));
  ASSERT_TRUE(rx.nic->disable_rx_irq(0));
}

TEST_F(RawFramesVm, E1000eInterruptModeWakesPerBurst) {
  auto nics = env_list("UFAB_E1000E");
  ASSERT_EQ(nics.size(), 2u);
  interrupt_mode(registry_, nics[0], nics[1]);
}

TEST_F(RawFramesVm, VirtioInterruptModeWakesPerBurst) {
  auto nics = env_list("UFAB_VIRTIO");
  ASSERT_EQ(nics.size(), 2u);
  interrupt_mode(registry_, nics[0], nics[1]);
}

// AF_PACKET socket on the kernel's interface, for frames both ways.
UniqueFd packet_socket(const std::string& ifname, int* ifindex) {
  UniqueFd fd(::socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK, htons(ETH_P_ALL)));
  if (!fd.valid()) return fd;
  *ifindex = static_cast<int>(if_nametoindex(ifname.c_str()));
  sockaddr_ll sll{};
  sll.sll_family = AF_PACKET;
  sll.sll_protocol = htons(ETH_P_ALL);
  sll.sll_ifindex = *ifindex;
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&sll), sizeof sll) != 0) return UniqueFd();
  int bytes = 8 << 20;  // room for every frame of the test, so none is dropped at the socket
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVBUFFORCE, &bytes, sizeof bytes);
  return fd;
}

core::Mac parse_mac(const std::string& s) {
  core::Mac m{};
  unsigned v[6];
  if (std::sscanf(s.c_str(), "%x:%x:%x:%x:%x:%x", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) == 6) {
    for (int i = 0; i < 6; ++i) m[i] = static_cast<uint8_t>(v[i]);
  }
  return m;
}

void kernel_interop(const core::PluginRegistry& registry, const std::string& spec) {
  SCOPED_TRACE(spec + " <-> kernel");
  const char* ifname = std::getenv("UFAB_KERNEL_IF");
  ASSERT_NE(ifname, nullptr);
  ASSERT_EQ(std::system((std::string("ip link set ") + ifname + " up promisc on").c_str()), 0);
  core::Mac kmac = parse_mac(read_attr(std::string("/sys/class/net/") + ifname + "/address").value_or(""));
  int ifindex = 0;
  UniqueFd sock = packet_socket(ifname, &ifindex);
  ASSERT_TRUE(sock.valid()) << std::strerror(errno);
  Port port = open_port(registry, spec);
  ASSERT_TRUE(port.nic);
  core::Mac umac;
  std::memcpy(umac.data(), port.nic->info().mac, 6);
  constexpr int kFrames = 1000;

  // ufab -> kernel: the kernel's socket sees every frame, intact. Sent in
  // bursts of 8, each burst awaited (bounded), so the check is about
  // delivery, not about how fast a TCG-emulated kernel drains its socket.
  int kernel_got = 0;
  uint8_t frame[2048];
  for (uint64_t seq = 0; seq < kFrames;) {
    ufab_buf* b[8];
    uint32_t n = port.pool->alloc(b, static_cast<uint32_t>(std::min<uint64_t>(8, kFrames - seq)));
    ASSERT_GT(n, 0u);
    for (uint32_t i = 0; i < n; ++i) {
      uint32_t len = 60 + static_cast<uint32_t>(((seq + i) * 131) % 1455);
      core::build_test_frame(b[i]->base + b[i]->offset, len, kmac, umac, 9, seq + i);
      b[i]->len = len;
    }
    uint32_t sent = 0;
    for (int tries = 0; sent < n && tries < 10000; ++tries) {
      int r = port.nic->tx_burst(0, b + sent, static_cast<uint16_t>(n - sent));
      ASSERT_GE(r, 0) << port.nic->last_error();
      sent += static_cast<uint32_t>(r);
    }
    ASSERT_EQ(sent, n);
    seq += n;
    for (int waits = 0; waits < 2000 && kernel_got < static_cast<int>(seq); ++waits) {
      ssize_t r = ::recv(sock.get(), frame, sizeof frame, 0);
      if (r <= 0) {
        ::usleep(500);
        continue;
      }
      uint64_t s;
      if (core::check_test_frame(frame, static_cast<uint32_t>(r), umac, 9, &s) == core::FrameCheck::kOk) ++kernel_got;
    }
  }
  EXPECT_EQ(kernel_got, kFrames) << "frames from the ufab port seen by the kernel's AF_PACKET socket";

  // kernel -> ufab: frames the kernel sends arrive at the ufab port.
  int ufab_got = 0;
  for (int i = 0; i < kFrames; ++i) {
    uint8_t frame[256];
    core::build_test_frame(frame, 200, umac, kmac, 10, static_cast<uint64_t>(i));
    sockaddr_ll to{};
    to.sll_family = AF_PACKET;
    to.sll_ifindex = ifindex;
    to.sll_halen = 6;
    std::memcpy(to.sll_addr, umac.data(), 6);
    for (int tries = 0; tries < 1000; ++tries) {
      if (::sendto(sock.get(), frame, 200, 0, reinterpret_cast<sockaddr*>(&to), sizeof to) == 200) break;
      ::usleep(100);
    }
    int got = take_test_frames(port, kmac, 10);
    ASSERT_GE(got, 0) << port.nic->last_error();
    ufab_got += got;
  }
  for (int spins = 0; spins < 20000 && ufab_got < kFrames; ++spins) {
    int got = take_test_frames(port, kmac, 10);
    ASSERT_GE(got, 0) << port.nic->last_error();
    ufab_got += got;
    if (got == 0) ::usleep(50);
  }
  EXPECT_EQ(ufab_got, kFrames) << "frames sent by the kernel, received by the ufab port";
  std::printf("  %s <-> %s: kernel saw %d/%d, ufab saw %d/%d\n", spec.c_str(), ifname, kernel_got, kFrames, ufab_got,
              kFrames);
}

TEST_F(RawFramesVm, E1000eAndKernelExchangeFrames) {
  auto nics = env_list("UFAB_E1000E");
  ASSERT_FALSE(nics.empty());
  kernel_interop(registry_, nics[0]);
}

TEST_F(RawFramesVm, VirtioAndKernelExchangeFrames) {
  auto nics = env_list("UFAB_VIRTIO");
  ASSERT_FALSE(nics.empty());
  kernel_interop(registry_, nics[0]);
}

}  // namespace
}  // namespace ufab
