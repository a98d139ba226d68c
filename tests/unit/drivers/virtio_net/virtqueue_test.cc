// The driver side of the split ring against a device played by the test:
// the device reads avail/desc and writes used exactly as virtio 1.1 2.6
// lays them out, over plain memory.
#include "drivers/virtio_net/virtqueue.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <optional>
#include <random>
#include <vector>

namespace ufab::virtio {
namespace {

struct Desc {
  uint64_t addr;
  uint32_t len;
  uint16_t flags;
  uint16_t next;
};

// The device's view of one ring block.
class FakeDevice {
 public:
  FakeDevice(uint8_t* mem, uint32_t size) : mem_(mem), l_(RingLayout::for_size(size)) {}

  uint16_t avail_flags() const { return get16(l_.avail); }
  uint16_t avail_idx() const { return get16(l_.avail + 2); }
  uint16_t used_idx() const { return get16(l_.used + 2); }
  void set_used_flags(uint16_t f) { put16(l_.used, f); }

  // Next buffer the driver made available: its head id and descriptor.
  std::optional<std::pair<uint16_t, Desc>> pop() {
    if (last_avail_ == avail_idx()) return std::nullopt;
    uint16_t id = get16(l_.avail + 4 + 2 * (last_avail_ % l_.size));
    ++last_avail_;
    Desc d;
    std::memcpy(&d, mem_ + l_.desc + 16 * size_t{id}, 16);
    d.addr = le64toh(d.addr);
    d.len = le32toh(d.len);
    d.flags = le16toh(d.flags);
    d.next = le16toh(d.next);
    return std::make_pair(id, d);
  }
  // Writes one used element and publishes it (the device's own order).
  void push_used(uint32_t id, uint32_t len) {
    uint16_t idx = used_idx();
    size_t e = l_.used + 4 + 8 * size_t{static_cast<uint16_t>(idx % l_.size)};
    uint32_t lid = htole32(id), llen = htole32(len);
    std::memcpy(mem_ + e, &lid, 4);
    std::memcpy(mem_ + e + 4, &llen, 4);
    put16(l_.used + 2, static_cast<uint16_t>(idx + 1));
  }
  uint16_t last_avail() const { return last_avail_; }

 private:
  uint16_t get16(size_t off) const {
    uint16_t v;
    std::memcpy(&v, mem_ + off, 2);
    return le16toh(v);
  }
  void put16(size_t off, uint16_t v) {
    v = htole16(v);
    std::memcpy(mem_ + off, &v, 2);
  }
  uint8_t* mem_;
  RingLayout l_;
  uint16_t last_avail_ = 0;
};

struct Block {
  explicit Block(uint32_t size) : layout(RingLayout::for_size(size)) {
    mem = static_cast<uint8_t*>(std::aligned_alloc(kRingBlockAlign, (layout.bytes + 4095) & ~size_t{4095}));
    std::memset(mem, 0xa5, layout.bytes);  // init() must zero it
  }
  ~Block() { std::free(mem); }
  RingLayout layout;
  uint8_t* mem;
};

void* cookie(uintptr_t v) { return reinterpret_cast<void*>(v); }
uintptr_t value(void* c) { return reinterpret_cast<uintptr_t>(c); }

TEST(RingLayout, FollowsTheSpecAlignments) {
  RingLayout l = RingLayout::for_size(256);
  EXPECT_EQ(l.desc, 0u);
  EXPECT_EQ(l.avail, 16u * 256);
  EXPECT_GE(l.used, l.avail + 6 + 2 * 256);
  EXPECT_EQ(l.used % 4, 0u);
  EXPECT_EQ(l.bytes, l.used + 6 + 8 * 256);
  RingLayout one = RingLayout::for_size(1);
  EXPECT_EQ(one.avail, 16u);
  EXPECT_EQ(one.used % 4, 0u);
}

TEST(SplitQueue, RejectsBadSizesAndMemory) {
  Block b(256);
  SplitQueue q;
  EXPECT_FALSE(q.init(0, b.mem, 0x10000, b.layout.bytes));
  EXPECT_FALSE(q.init(100, b.mem, 0x10000, b.layout.bytes));
  EXPECT_FALSE(q.init(65536, b.mem, 0x10000, b.layout.bytes));
  EXPECT_FALSE(q.init(256, b.mem, 0x10000, b.layout.bytes - 1));
  EXPECT_FALSE(q.init(256, b.mem + 8, 0x10000, b.layout.bytes - 8));
  EXPECT_FALSE(q.init(256, b.mem, 0x10008, b.layout.bytes));
  auto st = q.init(256, b.mem, 0x10000, b.layout.bytes);
  ASSERT_TRUE(st) << st.error().message();
  EXPECT_EQ(q.size(), 256);
  EXPECT_EQ(q.free_count(), 256);
  EXPECT_EQ(q.desc_iova(), 0x10000u);
  EXPECT_EQ(q.avail_iova(), 0x10000u + b.layout.avail);
  EXPECT_EQ(q.used_iova(), 0x10000u + b.layout.used);
  for (size_t i = 0; i < b.layout.bytes; ++i) ASSERT_EQ(b.mem[i], 0) << "byte " << i << " not zeroed";
}

TEST(SplitQueue, AddIsInvisibleUntilPublish) {
  Block b(8);
  SplitQueue q;
  ASSERT_TRUE(q.init(8, b.mem, 0x2000, b.layout.bytes));
  FakeDevice dev(b.mem, 8);
  ASSERT_TRUE(q.add(0xabc000, 1526, true, cookie(1)));
  ASSERT_TRUE(q.add(0xdef000, 60, false, cookie(2)));
  EXPECT_EQ(dev.avail_idx(), 0) << "avail.idx moved before publish()";
  EXPECT_FALSE(dev.pop());
  q.publish();
  EXPECT_EQ(dev.avail_idx(), 2);
  auto a = dev.pop();
  ASSERT_TRUE(a);
  EXPECT_EQ(a->second.addr, 0xabc000u);
  EXPECT_EQ(a->second.len, 1526u);
  EXPECT_EQ(a->second.flags, kDescFlagWrite);
  EXPECT_EQ(a->second.next, 0);
  auto t = dev.pop();
  ASSERT_TRUE(t);
  EXPECT_NE(t->first, a->first);
  EXPECT_EQ(t->second.addr, 0xdef000u);
  EXPECT_EQ(t->second.len, 60u);
  EXPECT_EQ(t->second.flags, 0);
  EXPECT_FALSE(dev.pop());
  // Publishing again without new buffers changes nothing.
  q.publish();
  EXPECT_EQ(dev.avail_idx(), 2);
}

TEST(SplitQueue, FullRingRefusesThenRecyclesReapedDescriptors) {
  Block b(8);
  SplitQueue q;
  ASSERT_TRUE(q.init(8, b.mem, 0x2000, b.layout.bytes));
  FakeDevice dev(b.mem, 8);
  for (uintptr_t i = 0; i < 8; ++i) ASSERT_TRUE(q.add(0x1000 * i, 100, false, cookie(i + 1)));
  EXPECT_EQ(q.free_count(), 0);
  EXPECT_FALSE(q.add(0x9000, 100, false, cookie(99)));
  q.publish();
  std::vector<std::pair<uint16_t, Desc>> got;
  while (auto e = dev.pop()) got.push_back(*e);
  ASSERT_EQ(got.size(), 8u);
  for (int i = 0; i < 3; ++i) dev.push_used(got[i].first, 0);
  Completion c[8];
  EXPECT_EQ(q.used_pending(), 3);
  ASSERT_EQ(q.reap(c, 8), 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(value(c[i].cookie), uintptr_t(i + 1));
  EXPECT_EQ(q.free_count(), 3);
  for (uintptr_t i = 0; i < 3; ++i) ASSERT_TRUE(q.add(0x20000 + i, 100, false, cookie(100 + i)));
  EXPECT_FALSE(q.add(0x9000, 100, false, cookie(99)));
  q.publish();
  // The recycled descriptors are exactly the three the device returned.
  std::vector<uint16_t> reused;
  while (auto e = dev.pop()) reused.push_back(e->first);
  ASSERT_EQ(reused.size(), 3u);
  for (uint16_t id : reused)
    EXPECT_TRUE(id == got[0].first || id == got[1].first || id == got[2].first) << id;
}

TEST(SplitQueue, ReapHonoursMaxAndKeepsTheRest) {
  Block b(16);
  SplitQueue q;
  ASSERT_TRUE(q.init(16, b.mem, 0x2000, b.layout.bytes));
  FakeDevice dev(b.mem, 16);
  for (uintptr_t i = 0; i < 10; ++i) q.add(i, 1, true, cookie(i + 1));
  q.publish();
  while (auto e = dev.pop()) dev.push_used(e->first, 42);
  Completion c[16];
  ASSERT_EQ(q.reap(c, 4), 4);
  EXPECT_EQ(q.used_pending(), 6);
  ASSERT_EQ(q.reap(c, 16), 6);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(value(c[i].cookie), uintptr_t(5 + i));
    EXPECT_EQ(c[i].len, 42u);
  }
  EXPECT_EQ(q.reap(c, 16), 0);
  EXPECT_EQ(q.free_count(), 16);
}

TEST(SplitQueue, OutOfOrderCompletionsComeBackInUsedOrder) {
  Block b(8);
  SplitQueue q;
  ASSERT_TRUE(q.init(8, b.mem, 0x2000, b.layout.bytes));
  FakeDevice dev(b.mem, 8);
  for (uintptr_t i = 0; i < 5; ++i) q.add(0x100 * i, 64, false, cookie(i + 1));
  q.publish();
  std::vector<std::pair<uint16_t, Desc>> got;
  while (auto e = dev.pop()) got.push_back(*e);
  for (int i = 4; i >= 0; --i) dev.push_used(got[i].first, static_cast<uint32_t>(i));
  Completion c[8];
  ASSERT_EQ(q.reap(c, 8), 5);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(value(c[i].cookie), uintptr_t(5 - i));
    EXPECT_EQ(c[i].len, uint32_t(4 - i));
  }
}

TEST(SplitQueue, SixteenBitIndicesWrapWithoutLosingBuffers) {
  // 300,000 buffers through an 8-entry ring: avail.idx and used.idx wrap
  // 65535 -> 0 four times; the device completes in random batches, partly
  // out of order, and the driver reaps in random chunks.
  constexpr uint32_t kSize = 8;
  Block b(kSize);
  SplitQueue q;
  ASSERT_TRUE(q.init(kSize, b.mem, 0x2000, b.layout.bytes));
  FakeDevice dev(b.mem, kSize);
  std::mt19937 rng(7);
  uint64_t next_post = 0, next_expect = 0, device_seen = 0;
  std::deque<std::pair<uint16_t, Desc>> device_holds;
  Completion c[kSize];
  bool saw_wrap = false;
  uint16_t prev_avail = 0;
  while (next_expect < 300000) {
    uint32_t n = rng() % (kSize + 1);
    for (uint32_t i = 0; i < n && q.free_count(); ++i, ++next_post)
      ASSERT_TRUE(q.add(next_post * 64, static_cast<uint32_t>(next_post % 1500), false, cookie(next_post + 1)));
    q.publish();
    if (dev.avail_idx() < prev_avail) saw_wrap = true;
    prev_avail = dev.avail_idx();
    ASSERT_EQ(dev.avail_idx(), static_cast<uint16_t>(next_post));
    while (auto e = dev.pop()) {
      ASSERT_EQ(e->second.addr, device_seen * 64) << "device read a stale descriptor";
      ++device_seen;
      device_holds.push_back(*e);
    }
    // Complete a random prefix of what the device holds.
    uint32_t k = device_holds.empty() ? 0 : rng() % (device_holds.size() + 1);
    for (uint32_t i = 0; i < k; ++i) {
      auto [id, d] = device_holds.front();
      device_holds.pop_front();
      dev.push_used(id, d.len);
    }
    uint16_t got = q.reap(c, static_cast<uint16_t>(1 + rng() % kSize));
    for (uint16_t i = 0; i < got; ++i, ++next_expect) {
      ASSERT_EQ(value(c[i].cookie), next_expect + 1) << "after " << next_expect << " buffers";
      ASSERT_EQ(c[i].len, next_expect % 1500);
    }
  }
  EXPECT_TRUE(saw_wrap);
  EXPECT_EQ(q.bad_used(), 0u);
  EXPECT_GT(next_post, 4u * 65536);
}

TEST(SplitQueue, DescriptorAddressesSurviveTheWrap) {
  Block b(4);
  SplitQueue q;
  ASSERT_TRUE(q.init(4, b.mem, 0x2000, b.layout.bytes));
  FakeDevice dev(b.mem, 4);
  Completion c[4];
  for (uint32_t i = 0; i < 70000; ++i) {
    ASSERT_TRUE(q.add(0x100000000ull + i, i & 0xffff, true, cookie(i + 1)));
    q.publish();
    auto e = dev.pop();
    ASSERT_TRUE(e) << i;
    ASSERT_EQ(e->second.addr, 0x100000000ull + i);
    ASSERT_EQ(e->second.len, i & 0xffff);
    dev.push_used(e->first, 7);
    ASSERT_EQ(q.reap(c, 4), 1);
    ASSERT_EQ(value(c[0].cookie), uintptr_t(i) + 1);
  }
  EXPECT_EQ(q.avail_idx(), static_cast<uint16_t>(70000));
  EXPECT_EQ(q.last_used(), static_cast<uint16_t>(70000));
  EXPECT_EQ(dev.used_idx(), static_cast<uint16_t>(70000));
}

TEST(SplitQueue, BogusUsedEntriesAreSkippedAndCounted) {
  Block b(8);
  SplitQueue q;
  ASSERT_TRUE(q.init(8, b.mem, 0x2000, b.layout.bytes));
  FakeDevice dev(b.mem, 8);
  q.add(0x1000, 100, true, cookie(1));
  q.publish();
  auto e = dev.pop();
  ASSERT_TRUE(e);
  dev.push_used(99, 10);        // out of range
  dev.push_used(e->first, 20);  // the real one
  dev.push_used(e->first, 30);  // same id twice: no longer in flight
  Completion c[8];
  ASSERT_EQ(q.reap(c, 8), 1);
  EXPECT_EQ(value(c[0].cookie), 1u);
  EXPECT_EQ(c[0].len, 20u);
  EXPECT_EQ(q.bad_used(), 2u);
  EXPECT_EQ(q.free_count(), 8);
}

TEST(SplitQueue, NotifySuppressionFollowsUsedFlags) {
  Block b(8);
  SplitQueue q;
  ASSERT_TRUE(q.init(8, b.mem, 0x2000, b.layout.bytes));
  FakeDevice dev(b.mem, 8);
  EXPECT_TRUE(q.device_wants_notify());
  dev.set_used_flags(kUsedFlagNoNotify);
  EXPECT_FALSE(q.device_wants_notify());
  dev.set_used_flags(0);
  EXPECT_TRUE(q.device_wants_notify());
}

TEST(SplitQueue, InterruptFlagAndArmingNeverLoseAWakeUp) {
  Block b(8);
  SplitQueue q;
  ASSERT_TRUE(q.init(8, b.mem, 0x2000, b.layout.bytes));
  FakeDevice dev(b.mem, 8);
  EXPECT_EQ(dev.avail_flags(), 0);
  q.set_interrupts(false);
  EXPECT_EQ(dev.avail_flags(), kAvailFlagNoInterrupt);
  // Nothing pending: arming says "sleep".
  EXPECT_FALSE(q.arm_interrupts());
  EXPECT_EQ(dev.avail_flags(), 0);
  // The device completes while interrupts are off: arming must report it.
  q.set_interrupts(false);
  q.add(0x1000, 100, true, cookie(1));
  q.publish();
  auto e = dev.pop();
  dev.push_used(e->first, 50);
  EXPECT_TRUE(q.arm_interrupts());
  EXPECT_EQ(dev.avail_flags(), 0);
  Completion c[1];
  ASSERT_EQ(q.reap(c, 1), 1);
  EXPECT_FALSE(q.arm_interrupts());
}

TEST(SplitQueue, ResetReturnsEveryOutstandingBuffer) {
  Block b(8);
  SplitQueue q;
  ASSERT_TRUE(q.init(8, b.mem, 0x2000, b.layout.bytes));
  FakeDevice dev(b.mem, 8);
  for (uintptr_t i = 0; i < 6; ++i) q.add(i, 1, true, cookie(i + 1));
  q.publish();
  auto e = dev.pop();
  dev.push_used(e->first, 1);
  Completion c[8];
  ASSERT_EQ(q.reap(c, 8), 1);
  std::vector<uintptr_t> back;
  q.reset([&](void* ck) { back.push_back(value(ck)); });
  std::sort(back.begin(), back.end());
  EXPECT_EQ(back, (std::vector<uintptr_t>{2, 3, 4, 5, 6}));
  EXPECT_EQ(q.free_count(), 8);
  EXPECT_EQ(q.avail_idx(), 0);
  EXPECT_EQ(q.last_used(), 0);
  FakeDevice fresh(b.mem, 8);
  EXPECT_EQ(fresh.avail_idx(), 0);
  EXPECT_EQ(fresh.used_idx(), 0);
  // Usable again from index 0.
  ASSERT_TRUE(q.add(0x5000, 10, false, cookie(77)));
  q.publish();
  auto f = fresh.pop();
  ASSERT_TRUE(f);
  EXPECT_EQ(f->second.addr, 0x5000u);
}

}  // namespace
}  // namespace ufab::virtio
