// swnic as the framework uses it: libufab_swnic.so loaded by the plugin
// registry (dlopen), both ports opened with core::Nic::open_software, DMA
// buffer pools from core, frames sent and received, interrupt mode.
#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

#include <cstring>

#include "core/nic.h"
#include "core/plugin_registry.h"

namespace ufab {
namespace {

std::string link_name(const char* tag) { return std::string("nic") + std::to_string(::getpid()) + "-" + tag; }

class SwnicNic : public ::testing::Test {
 protected:
  void SetUp() override {
    auto st = registry_.load_file("drivers/swnic/libufab_swnic.so");
    ASSERT_TRUE(st) << st.error().message();
    plugin_ = registry_.by_name("swnic");
    ASSERT_NE(plugin_, nullptr);
  }
  core::PluginRegistry registry_;
  const core::Plugin* plugin_ = nullptr;
};

TEST_F(SwnicNic, LoadsAsASoftwarePluginWithEveryOperation) {
  EXPECT_TRUE(plugin_->software);
  EXPECT_TRUE(plugin_->matches.empty());
  EXPECT_TRUE(plugin_->stubbed_ops.empty());
}

TEST_F(SwnicNic, TwoNicsExchangeFramesThroughTheFramework) {
  std::string link = link_name("pair");
  auto a = core::Nic::open_software(plugin_->ops, link + ":0", {{"ring", "256"}});
  ASSERT_TRUE(a) << a.error().message();
  auto b = core::Nic::open_software(plugin_->ops, link + ":1");
  ASSERT_TRUE(b) << b.error().message();
  EXPECT_EQ((*a)->info().mac[5], 0);
  EXPECT_EQ((*b)->info().mac[5], 1);
  EXPECT_EQ((*b)->info().max_ring_size, 256);

  auto pa = (*a)->create_pool(512);
  auto pb = (*b)->create_pool(512);
  ASSERT_TRUE(pa && pb);
  for (auto* n : {a->get(), b->get()}) {
    ASSERT_TRUE(n->setup_tx_queue(0, 256));
  }
  ASSERT_TRUE((*a)->setup_rx_queue(0, 256, **pa));
  ASSERT_TRUE((*b)->setup_rx_queue(0, 256, **pb));
  ASSERT_TRUE((*a)->start());
  ASSERT_TRUE((*b)->start());
  auto l = (*a)->link();
  ASSERT_TRUE(l);
  EXPECT_EQ(l->up, 1u);

  auto irq = (*b)->enable_rx_irq(0);
  ASSERT_TRUE(irq) << irq.error().message();

  ufab_buf* bufs[32];
  uint64_t sent = 0, received = 0;
  for (int round = 0; round < 100; ++round) {
    uint32_t n = (*pa)->alloc(bufs, 32);
    ASSERT_EQ(n, 32u);
    for (uint32_t i = 0; i < n; ++i) {
      uint64_t seq = sent + i;
      std::memset(bufs[i]->base + bufs[i]->offset, 0x5a, 60);
      std::memcpy(bufs[i]->base + bufs[i]->offset + 14, &seq, 8);
      bufs[i]->len = 60 + static_cast<uint32_t>(seq % 1400);
    }
    int r = (*a)->tx_burst(0, bufs, static_cast<uint16_t>(n));
    ASSERT_EQ(r, 32);
    sent += 32;
    struct pollfd p = {*irq, POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, 2000), 1);
    uint64_t v;
    ASSERT_EQ(::read(*irq, &v, sizeof v), static_cast<ssize_t>(sizeof v));
    for (int guard = 0; guard < 100; ++guard) {
      int got = (*b)->rx_burst(0, bufs, 32);
      ASSERT_GE(got, 0);
      if (got == 0) break;  // empty: re-armed
      for (int i = 0; i < got; ++i) {
        uint64_t seq;
        std::memcpy(&seq, bufs[i]->base + bufs[i]->offset + 14, 8);
        EXPECT_EQ(seq, received + i);
        EXPECT_EQ(bufs[i]->len, 60 + seq % 1400);
      }
      received += static_cast<uint64_t>(got);
      (*pb)->free(bufs, static_cast<uint32_t>(got));
    }
  }
  EXPECT_EQ(received, sent);
  EXPECT_EQ((*pa)->available(), (*pa)->capacity());
  EXPECT_EQ((*pb)->available(), (*pb)->capacity());
  EXPECT_EQ((*pa)->misuse_count() + (*pb)->misuse_count(), 0u);
  auto sa = (*a)->stats();
  auto sb = (*b)->stats();
  ASSERT_TRUE(sa && sb);
  EXPECT_EQ(sa->tx_packets, sent);
  EXPECT_EQ(sb->rx_packets, sent);
  EXPECT_GE(sb->irqs, 100u);
  ASSERT_TRUE((*b)->disable_rx_irq(0));
}

TEST_F(SwnicNic, ErrorsReachTheCallerInWords) {
  auto bad = core::Nic::open_software(plugin_->ops, "nocolon");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message().find("NAME:PORT"), std::string::npos) << bad.error().message();
  std::string link = link_name("busy");
  auto a = core::Nic::open_software(plugin_->ops, link + ":0");
  ASSERT_TRUE(a);
  auto again = core::Nic::open_software(plugin_->ops, link + ":0");
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code(), EBUSY);
  EXPECT_NE(again.error().message().find("already open"), std::string::npos) << again.error().message();
}

}  // namespace
}  // namespace ufab
