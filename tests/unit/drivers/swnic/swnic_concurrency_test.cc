// swnic's queues driven by several threads at once, with no lock: each
// thread owns its queues (one TX and one RX queue per port), frames steered
// by QPN; and several TX queues feeding one RX ring. Counts and order are
// checked exactly. Also meant to run under ThreadSanitizer:
//   bazel test --copt=-fsanitize=thread --linkopt=-fsanitize=thread
//       //tests/unit/drivers/swnic:swnic_concurrency_test
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "drivers/swnic/swnic.h"
#include "tests/unit/drivers/swnic/test_host.h"

namespace ufab::swnic_test {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kFramesPerThread = 100'000;
constexpr uint32_t kBurst = 32;

struct Tally {
  uint64_t sent = 0;
  uint64_t received = 0;
  uint64_t bad = 0;  // wrong queue, tag or order
  bool error = false;
};

// One step of a stream of kFramesPerThread frames from `from`'s TX queue q,
// for QPs q, q + n, q + 2n, ... (all steered to the peer's RX queue q), to
// `to`'s RX queue q: a burst sent, a burst received.
void step(Port& from, Port& to, uint16_t q, uint32_t n, Tally* t) {
  ufab_buf* bufs[kBurst];
  {
    if (t->sent < kFramesPerThread) {
      uint32_t want = static_cast<uint32_t>(std::min<uint64_t>(kBurst, kFramesPerThread - t->sent));
      int k = from.tx_pool(q).alloc(bufs, want);
      for (int i = 0; i < k; ++i) {
        uint64_t seq = t->sent + static_cast<uint64_t>(i);
        uint32_t len = 80 + static_cast<uint32_t>(seq % 7) * 100;
        fill_roce_frame(bufs[i]->base + bufs[i]->offset, len, q + n * static_cast<uint32_t>(seq % 5), seq, q);
        bufs[i]->len = len;
      }
      int r = from.drv()->tx_burst(from.dev(), q, bufs, static_cast<uint16_t>(k));
      if (r < 0) {
        t->error = true;
        return;
      }
      if (r < k) from.tx_pool(q).free(bufs + r, static_cast<uint32_t>(k - r));
      t->sent += static_cast<uint64_t>(r);
    }
    int got = to.drv()->rx_burst(to.dev(), q, bufs, kBurst);
    if (got < 0) {
      t->error = true;
      return;
    }
    for (int i = 0; i < got; ++i) {
      uint32_t qp = 0, tag = 0;
      uint64_t seq = 0;
      if (!parse_roce_frame(bufs[i]->base + bufs[i]->offset, bufs[i]->len, &qp, &seq, &tag) || qp % n != q ||
          tag != q || seq != t->received + static_cast<uint64_t>(i) || bufs[i]->len != 80 + (seq % 7) * 100)
        ++t->bad;
    }
    if (got > 0) to.rx_pool(q).free(bufs, static_cast<uint32_t>(got));
    t->received += static_cast<uint64_t>(got);
  }
}

class SwnicConcurrency : public ::testing::TestWithParam<uint32_t> {};

TEST_P(SwnicConcurrency, ThreadPerQueuePairBothDirections) {
  const uint32_t n = GetParam();
  std::string link = unique_link("conc");
  auto a = Port::open(link + ":0", {{"queues", "4"}, {"ring", "256"}});
  auto b = Port::open(link + ":1");
  ASSERT_TRUE(a && b);
  ASSERT_EQ(a->steer(UFAB_STEER_ROCE_QPN, static_cast<uint16_t>(n)), 0);
  ASSERT_EQ(b->steer(UFAB_STEER_ROCE_QPN, static_cast<uint16_t>(n)), 0);
  // Thread q owns queue q of both ports: a -> b and b -> a at once.
  std::vector<Tally> ab(n), ba(n);
  std::vector<std::thread> threads;
  for (uint32_t q = 0; q < n; ++q) {
    threads.emplace_back([&, q] {
      Tally& x = ab[q];
      Tally& y = ba[q];
      auto deadline = Clock::now() + std::chrono::seconds(120);
      auto done = [](const Tally& t) { return t.error || t.received == kFramesPerThread; };
      while (!(done(x) && done(y))) {
        if (Clock::now() > deadline) {
          x.error = y.error = true;
          return;
        }
        if (!done(x)) step(*a, *b, static_cast<uint16_t>(q), n, &x);
        if (!done(y)) step(*b, *a, static_cast<uint16_t>(q), n, &y);
      }
    });
  }
  for (auto& t : threads) t.join();
  uint64_t total = 0;
  for (uint32_t q = 0; q < n; ++q) {
    for (const Tally* t : {&ab[q], &ba[q]}) {
      EXPECT_FALSE(t->error) << "queue " << q;
      EXPECT_EQ(t->sent, kFramesPerThread) << "queue " << q;
      EXPECT_EQ(t->received, kFramesPerThread) << "queue " << q;
      EXPECT_EQ(t->bad, 0u) << "queue " << q;
      total += t->received;
    }
  }
  ufab_stats as = a->stats(), bs = b->stats();
  EXPECT_EQ(as.tx_packets + bs.tx_packets, total);
  EXPECT_EQ(as.rx_packets + bs.rx_packets, total);
  EXPECT_EQ(as.rx_errors + bs.rx_errors + as.tx_errors + bs.tx_errors, 0u);
  // Nothing left over anywhere.
  for (uint16_t q = 0; q < 4; ++q) {
    EXPECT_TRUE(drain(*a, q).empty());
    EXPECT_TRUE(drain(*b, q).empty());
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, SwnicConcurrency, ::testing::Values(2u, 3u, 4u),
                         [](const ::testing::TestParamInfo<uint32_t>& i) { return std::to_string(i.param); });

// Several TX queues (a thread each) feed one RX ring: the ring is
// multi-producer. Per sender, frames arrive complete and in order.
TEST(SwnicConcurrencyShared, ManyTxQueuesOneRxRing) {
  const uint32_t n = 3;
  std::string link = unique_link("conc-mpsc");
  auto a = Port::open(link + ":0", {{"queues", "4"}, {"ring", "64"}});  // a small ring: full often
  auto b = Port::open(link + ":1");
  ASSERT_TRUE(a && b);
  std::vector<Tally> tx(n);
  std::vector<std::thread> senders;
  for (uint32_t q = 0; q < n; ++q) {
    senders.emplace_back([&, q] {
      Tally& t = tx[q];
      auto deadline = Clock::now() + std::chrono::seconds(120);
      while (t.sent < kFramesPerThread && Clock::now() < deadline) {
        uint32_t want = static_cast<uint32_t>(std::min<uint64_t>(1 + t.sent % kBurst, kFramesPerThread - t.sent));
        int r = send_roce(*a, static_cast<uint16_t>(q), q, t.sent, want, 80 + q * 50, q);
        if (r < 0) {
          t.error = true;
          return;
        }
        t.sent += static_cast<uint64_t>(r);
        if (r == 0) std::this_thread::yield();
      }
    });
  }
  // No steering at b: everything lands in its RX queue 0, drained here.
  std::vector<uint64_t> next(n, 0);
  uint64_t bad = 0, received = 0;
  ufab_buf* bufs[kBurst];
  auto deadline = Clock::now() + std::chrono::seconds(120);
  while (received < n * kFramesPerThread && Clock::now() < deadline) {
    int got = b->drv()->rx_burst(b->dev(), 0, bufs, kBurst);
    ASSERT_GE(got, 0);
    for (int i = 0; i < got; ++i) {
      uint32_t qp = 0, tag = 0;
      uint64_t seq = 0;
      if (!parse_roce_frame(bufs[i]->base + bufs[i]->offset, bufs[i]->len, &qp, &seq, &tag) || tag >= n ||
          qp != tag || bufs[i]->len != 80 + tag * 50 || seq != next[tag]) {
        ++bad;
        continue;
      }
      ++next[tag];
    }
    if (got > 0) b->rx_pool().free(bufs, static_cast<uint32_t>(got));
    received += static_cast<uint64_t>(got);
    if (got == 0) std::this_thread::yield();
  }
  for (auto& t : senders) t.join();
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(received, n * kFramesPerThread);
  for (uint32_t q = 0; q < n; ++q) {
    EXPECT_FALSE(tx[q].error);
    EXPECT_EQ(next[q], kFramesPerThread) << "sender " << q;
  }
  EXPECT_EQ(b->stats().rx_packets, n * kFramesPerThread);
  EXPECT_EQ(b->stats().rx_errors, 0u);
}

}  // namespace
}  // namespace ufab::swnic_test
