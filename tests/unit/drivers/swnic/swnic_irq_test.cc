// swnic interrupt mode in one process: the receiver sleeps in poll() on the
// fd rx_irq hands back and wakes when the sender sends; the sender signals
// only when the receiver has armed.
#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "drivers/swnic/swnic.h"
#include "tests/unit/drivers/swnic/test_host.h"

namespace ufab::swnic_test {
namespace {

using Clock = std::chrono::steady_clock;

auto len64 = [](uint64_t) { return 64u; };

int poll_fd(int fd, int timeout_ms) {
  struct pollfd p = {fd, POLLIN, 0};
  return ::poll(&p, 1, timeout_ms);
}

bool read_event(int fd) {
  uint64_t v = 0;
  return ::read(fd, &v, sizeof v) == sizeof v && v > 0;
}

TEST(SwnicIrq, ReceiverSleepsInPollAndWakesOnSend) {
  std::string link = unique_link("irq");
  auto a = Port::open(link + ":0");
  auto b = Port::open(link + ":1");
  ASSERT_TRUE(a && b);
  int efd = -1;
  ASSERT_EQ(b->drv()->rx_irq(b->dev(), 0, 1, &efd), 0);
  ASSERT_GE(efd, 0);
  // Nothing pending: not readable.
  EXPECT_EQ(poll_fd(efd, 0), 0);

  const int rounds = 50;
  std::atomic<int> received{0};
  std::atomic<int> failures{0};
  int wakeups = 0;
  std::thread rx([&] {
    std::vector<Received> got;
    while (received.load() < rounds) {
      // Drain to empty (the empty rx_burst arms), then sleep until the
      // sender sends. A wake-up may find nothing when the frame that caused
      // it was already taken by the drain: that is allowed.
      int n;
      while ((n = recv_burst(*b, &got, 32)) > 0) received += n;
      if (received.load() >= rounds) break;
      if (poll_fd(efd, 5000) != 1) {
        ++failures;
        return;
      }
      read_event(efd);
      ++wakeups;
    }
  });
  for (int r = 0; r < rounds; ++r) {
    // Give the receiver time to go to sleep, then send one frame.
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    ASSERT_EQ(send_burst(*a, static_cast<uint64_t>(r), 1, len64), 1);
    // Wait (bounded) for it to be taken before the next round.
    auto deadline = Clock::now() + std::chrono::seconds(5);
    while (received.load() < r + 1 && failures.load() == 0 && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  rx.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(received.load(), rounds);
  // It slept in poll() and the sender woke it (most rounds, on a quiet machine).
  EXPECT_GE(wakeups, 1);
  EXPECT_GE(b->stats().irqs, static_cast<uint64_t>(wakeups));
  EXPECT_EQ(b->drv()->rx_irq(b->dev(), 0, 0, nullptr), 0);
}

TEST(SwnicIrq, FramesAlreadyQueuedMakeTheFdReadableAtOnce) {
  std::string link = unique_link("irq-pending");
  auto a = Port::open(link + ":0");
  auto b = Port::open(link + ":1");
  ASSERT_TRUE(a && b);
  ASSERT_EQ(send_burst(*a, 0, 3, len64), 3);
  int efd = -1;
  ASSERT_EQ(b->drv()->rx_irq(b->dev(), 0, 1, &efd), 0);
  EXPECT_EQ(poll_fd(efd, 1000), 1);
  // Enabling twice hands back the same fd.
  int again = -1;
  ASSERT_EQ(b->drv()->rx_irq(b->dev(), 0, 1, &again), 0);
  EXPECT_EQ(again, efd);
  EXPECT_EQ(b->drv()->rx_irq(b->dev(), 1, 1, &again), -EINVAL);
}

TEST(SwnicIrq, SenderSignalsOnlyWhenTheReceiverArmed) {
  std::string link = unique_link("irq-arm");
  auto a = Port::open(link + ":0");
  auto b = Port::open(link + ":1");
  ASSERT_TRUE(a && b);
  SegmentView v(link);
  ASSERT_TRUE(v.ok());
  swnic::RingCtl* ring = v.ctl(0);  // port 0 -> port 1

  // Polling mode: sending never touches the futex word.
  for (int i = 0; i < 20; ++i) ASSERT_EQ(send_burst(*a, i, 4, len64), 4);
  EXPECT_EQ(ring->waiting.load(), 0u);
  EXPECT_EQ(ring->wake_seq.load(), 0u);
  std::vector<Received> got;
  while (recv_burst(*b, &got, 32) > 0) {
  }

  int efd = -1;
  ASSERT_EQ(b->drv()->rx_irq(b->dev(), 0, 1, &efd), 0);
  EXPECT_EQ(ring->waiting.load(), 1u);  // armed: the ring is empty
  // Ten bursts while the receiver does not drain: one wake-up only, the
  // first burst disarms.
  for (int i = 0; i < 10; ++i) ASSERT_EQ(send_burst(*a, 100 + i, 2, len64), 2);
  EXPECT_EQ(ring->wake_seq.load(), 1u);
  EXPECT_EQ(ring->waiting.load(), 0u);
  ASSERT_EQ(poll_fd(efd, 2000), 1);
  EXPECT_TRUE(read_event(efd));
  // Draining until empty re-arms; the next burst wakes again.
  while (recv_burst(*b, &got, 32) > 0) {
  }
  EXPECT_EQ(ring->waiting.load(), 1u);
  ASSERT_EQ(send_burst(*a, 200, 1, len64), 1);
  EXPECT_EQ(ring->wake_seq.load(), 2u);
  ASSERT_EQ(poll_fd(efd, 2000), 1);

  // Back to polling: disarmed, and sends do not signal.
  ASSERT_EQ(b->drv()->rx_irq(b->dev(), 0, 0, nullptr), 0);
  while (recv_burst(*b, &got, 32) > 0) {
  }
  EXPECT_EQ(ring->waiting.load(), 0u);
  ASSERT_EQ(send_burst(*a, 300, 1, len64), 1);
  EXPECT_EQ(ring->wake_seq.load(), 2u);
}

TEST(SwnicIrq, NoReceiveBuffersKeepsTheFdReadable) {
  std::string link = unique_link("irq-nobuf");
  auto a = Port::open(link + ":0");
  auto b = Port::open(link + ":1");
  ASSERT_TRUE(a && b);
  int efd = -1;
  ASSERT_EQ(b->drv()->rx_irq(b->dev(), 0, 1, &efd), 0);
  ASSERT_EQ(send_burst(*a, 0, 4, len64), 4);
  ASSERT_EQ(poll_fd(efd, 2000), 1);
  read_event(efd);
  std::vector<ufab_buf*> hold(b->rx_pool().count());
  ASSERT_EQ(b->rx_pool().alloc(hold.data(), b->rx_pool().count()), static_cast<int>(b->rx_pool().count()));
  std::vector<Received> got;
  EXPECT_EQ(recv_burst(*b, &got, 32), 0);
  // Frames wait and nothing could take them: the fd says so.
  EXPECT_EQ(poll_fd(efd, 0), 1);
  read_event(efd);
  b->rx_pool().free(hold.data(), b->rx_pool().count());
  EXPECT_EQ(recv_burst(*b, &got, 32), 4);
}

TEST(SwnicIrq, CloseWithInterruptsEnabledStopsTheHelper) {
  std::string link = unique_link("irq-close");
  auto a = Port::open(link + ":0");
  auto b = Port::open(link + ":1");
  ASSERT_TRUE(a && b);
  int efd = -1;
  ASSERT_EQ(b->drv()->rx_irq(b->dev(), 0, 1, &efd), 0);
  auto start = Clock::now();
  b->close();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(1));
  a->close();
  EXPECT_FALSE(segment_exists(link));
}

// rx_irq_arm (ABI 1.1): once the receiver arms before it sleeps, an empty
// rx_burst no longer arms, so frames sent while it busy-polls wake nobody
// (no futex wake, no eventfd write); arming again announces what waits.
TEST(SwnicIrq, ArmOnRequestStopsArmingOnEmptyPolls) {
  std::string link = unique_link("arm");
  auto a = Port::open(link + ":0");
  auto b = Port::open(link + ":1");
  ASSERT_TRUE(a && b);
  EXPECT_EQ(b->drv()->rx_irq_arm(b->dev(), 0), -EINVAL);  // not enabled yet
  int efd = -1;
  ASSERT_EQ(b->drv()->rx_irq(b->dev(), 0, 1, &efd), 0);
  ASSERT_EQ(b->drv()->rx_irq_arm(b->dev(), 0), 0);
  EXPECT_EQ(poll_fd(efd, 0), 0);  // nothing waits

  // Armed: a frame wakes the sleeper.
  ASSERT_EQ(send_burst(*a, 1, 1, len64), 1);
  ASSERT_EQ(poll_fd(efd, 5000), 1);
  ASSERT_TRUE(read_event(efd));
  std::vector<Received> got;
  ASSERT_EQ(recv_burst(*b, &got, 32), 1);
  uint64_t irqs = b->stats().irqs;

  // Busy-polling: empty polls, then frames, and no wake-up for them.
  for (int i = 0; i < 10; ++i) EXPECT_EQ(recv_burst(*b, &got, 32), 0);
  ASSERT_EQ(send_burst(*a, 2, 3, len64), 3);
  EXPECT_EQ(poll_fd(efd, 100), 0);
  EXPECT_EQ(b->stats().irqs, irqs);

  // Arming with frames waiting makes the fd readable at once.
  ASSERT_EQ(b->drv()->rx_irq_arm(b->dev(), 0), 0);
  EXPECT_EQ(poll_fd(efd, 0), 1);
  EXPECT_TRUE(read_event(efd));
  EXPECT_EQ(recv_burst(*b, &got, 32), 3);

  // Disabling ends arm-on-request: enabled again, empty polls arm as before.
  ASSERT_EQ(b->drv()->rx_irq(b->dev(), 0, 0, nullptr), 0);
  ASSERT_EQ(b->drv()->rx_irq(b->dev(), 0, 1, &efd), 0);
  EXPECT_EQ(recv_burst(*b, &got, 32), 0);  // arms
  ASSERT_EQ(send_burst(*a, 5, 1, len64), 1);
  EXPECT_EQ(poll_fd(efd, 5000), 1);
  EXPECT_EQ(b->drv()->rx_irq(b->dev(), 0, 0, nullptr), 0);
}

// With several RX queues each has its own eventfd, futex word and arming:
// a frame steered to queue 1 wakes queue 1 only.
TEST(SwnicIrq, EachRxQueueHasItsOwnInterrupt) {
  std::string link = unique_link("irq-queues");
  auto a = Port::open(link + ":0", {{"queues", "3"}});
  auto b = Port::open(link + ":1");
  ASSERT_TRUE(a && b);
  ASSERT_EQ(b->steer(UFAB_STEER_ROCE_QPN, 3), 0);
  SegmentView v(link);
  ASSERT_TRUE(v.ok());
  int fd[3] = {-1, -1, -1};
  for (uint16_t q = 0; q < 3; ++q) ASSERT_EQ(b->drv()->rx_irq(b->dev(), q, 1, &fd[q]), 0);
  EXPECT_NE(fd[0], fd[1]);
  EXPECT_NE(fd[1], fd[2]);
  for (uint16_t q = 0; q < 3; ++q) {
    EXPECT_EQ(poll_fd(fd[q], 0), 0);
    EXPECT_EQ(v.ctl(0, q)->waiting.load(), 1u);  // armed: every ring is empty
  }

  // QP 4 -> queue 1: only its word moves, only its fd becomes readable.
  ASSERT_EQ(send_roce(*a, 0, 4, 0, 2), 2);
  ASSERT_EQ(poll_fd(fd[1], 5000), 1);
  EXPECT_EQ(v.ctl(0, 1)->wake_seq.load(), 1u);
  EXPECT_EQ(v.ctl(0, 0)->wake_seq.load(), 0u);
  EXPECT_EQ(v.ctl(0, 2)->wake_seq.load(), 0u);
  EXPECT_EQ(poll_fd(fd[0], 50), 0);
  EXPECT_EQ(poll_fd(fd[2], 0), 0);
  EXPECT_TRUE(read_event(fd[1]));
  EXPECT_EQ(drain(*b, 1).size(), 2u);  // the empty poll at the end re-arms queue 1
  EXPECT_EQ(v.ctl(0, 1)->waiting.load(), 1u);

  // One burst for queues 0 and 2 (from another TX queue): both wake.
  std::vector<ufab_buf*> bufs(2);
  ASSERT_EQ(a->tx_pool(2).alloc(bufs.data(), 2), 2);
  fill_roce_frame(bufs[0]->base + bufs[0]->offset, 100, 3, 0);
  fill_roce_frame(bufs[1]->base + bufs[1]->offset, 100, 5, 1);
  bufs[0]->len = bufs[1]->len = 100;
  ASSERT_EQ(a->drv()->tx_burst(a->dev(), 2, bufs.data(), 2), 2);
  EXPECT_EQ(poll_fd(fd[0], 5000), 1);
  EXPECT_EQ(poll_fd(fd[2], 5000), 1);
  EXPECT_EQ(poll_fd(fd[1], 50), 0);

  // rx_irq_arm is per queue too: queue 2 asks to be woken; queue 0 busy-polls.
  EXPECT_TRUE(read_event(fd[0]));
  EXPECT_TRUE(read_event(fd[2]));
  ASSERT_EQ(b->drv()->rx_irq_arm(b->dev(), 2), 0);  // a frame waits: readable at once
  EXPECT_EQ(poll_fd(fd[2], 0), 1);
  EXPECT_TRUE(read_event(fd[2]));
  EXPECT_EQ(drain(*b, 2).size(), 1u);
  // Still armed (nobody sent since): the next frame wakes and disarms.
  ASSERT_EQ(send_roce(*a, 1, 2, 0, 1), 1);
  EXPECT_EQ(poll_fd(fd[2], 5000), 1);
  EXPECT_TRUE(read_event(fd[2]));
  EXPECT_EQ(v.ctl(0, 2)->waiting.load(), 0u);
  EXPECT_EQ(drain(*b, 2).size(), 1u);  // arm-on-request: the empty poll does not arm
  EXPECT_EQ(v.ctl(0, 2)->waiting.load(), 0u);
  EXPECT_EQ(drain(*b, 0).size(), 1u);               // queue 0 still arms on an empty poll
  EXPECT_EQ(v.ctl(0, 0)->waiting.load(), 1u);
  ASSERT_EQ(b->drv()->rx_irq_arm(b->dev(), 2), 0);
  EXPECT_EQ(poll_fd(fd[2], 0), 0);
  ASSERT_EQ(send_roce(*a, 1, 2, 0, 1), 1);
  EXPECT_EQ(poll_fd(fd[2], 5000), 1);

  // Turning one queue's interrupt off leaves the others on.
  ASSERT_EQ(b->drv()->rx_irq(b->dev(), 1, 0, nullptr), 0);
  EXPECT_EQ(v.ctl(0, 1)->waiting.load(), 0u);
  uint32_t before = v.ctl(0, 1)->wake_seq.load();
  ASSERT_EQ(send_roce(*a, 0, 1, 10, 1), 1);
  EXPECT_EQ(v.ctl(0, 1)->wake_seq.load(), before);
  ASSERT_EQ(send_roce(*a, 0, 0, 10, 1), 1);
  EXPECT_EQ(poll_fd(fd[0], 5000), 1);
  EXPECT_GE(b->stats().irqs, 5u);
}

// A receiver thread per queue sleeping in poll(), a sender spreading frames
// over the queues: every frame arrives, nobody sleeps through one.
TEST(SwnicIrq, ThreadPerQueueSleepsAndWakes) {
  std::string link = unique_link("irq-threads");
  auto a = Port::open(link + ":0", {{"queues", "2"}});
  auto b = Port::open(link + ":1");
  ASSERT_TRUE(a && b);
  ASSERT_EQ(b->steer(UFAB_STEER_ROCE_QPN, 2), 0);
  const int kPerQueue = 300;
  std::atomic<int> failures{0};
  std::vector<std::thread> rx;
  for (uint16_t q = 0; q < 2; ++q) {
    rx.emplace_back([&, q] {
      int fd = -1;
      if (b->drv()->rx_irq(b->dev(), q, 1, &fd) != 0) {
        ++failures;
        return;
      }
      int got = 0;
      auto deadline = Clock::now() + std::chrono::seconds(20);
      ufab_buf* bufs[32];
      while (got < kPerQueue && Clock::now() < deadline) {
        int n = b->drv()->rx_burst(b->dev(), q, bufs, 32);
        if (n > 0) {
          for (int i = 0; i < n; ++i) {
            uint32_t qp = 0;
            uint64_t seq = 0;
            if (!parse_roce_frame(bufs[i]->base + bufs[i]->offset, bufs[i]->len, &qp, &seq) || qp % 2 != q ||
                seq != static_cast<uint64_t>(got + i))
              ++failures;
          }
          got += n;
          b->rx_pool(q).free(bufs, static_cast<uint32_t>(n));
          continue;
        }
        ASSERT_EQ(b->drv()->rx_irq_arm(b->dev(), q), 0);
        if (poll_fd(fd, 2000) == 1) read_event(fd);
      }
      if (got != kPerQueue) ++failures;
    });
  }
  for (int i = 0; i < kPerQueue; ++i) {
    for (uint32_t qp = 0; qp < 2; ++qp) {
      while (send_roce(*a, 0, qp, static_cast<uint64_t>(i), 1) != 1) std::this_thread::yield();
    }
    if (i % 50 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // let them sleep
  }
  for (auto& t : rx) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(b->stats().rx_packets, 2u * kPerQueue);
}

}  // namespace
}  // namespace ufab::swnic_test
