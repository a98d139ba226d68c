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
#include <set>
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
  // Next buffer as a chain: its head id and every descriptor, following
  // VIRTQ_DESC_F_NEXT (at most `size` of them: a longer chain would loop).
  std::optional<std::pair<uint16_t, std::vector<Desc>>> pop_chain() {
    auto first = pop();
    if (!first) return std::nullopt;
    std::vector<Desc> chain{first->second};
    while ((chain.back().flags & kDescFlagNext) && chain.size() <= l_.size) chain.push_back(desc(chain.back().next));
    return std::make_pair(first->first, chain);
  }
  Desc desc(uint16_t id) const {
    Desc d;
    std::memcpy(&d, mem_ + l_.desc + 16 * size_t{id}, 16);
    d.addr = le64toh(d.addr);
    d.len = le32toh(d.len);
    d.flags = le16toh(d.flags);
    d.next = le16toh(d.next);
    return d;
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


// ------------------------------------------------------------- chains

TEST(SplitQueueChain, LinksItsDescriptorsInOrderBehindOneAvailSlot) {
  Block b(8);
  SplitQueue q;
  ASSERT_TRUE(q.init(8, b.mem, 0x2000, b.layout.bytes));
  FakeDevice dev(b.mem, 8);
  const Piece pieces[3] = {{0x1000, 12}, {0x20001, 33}, {0x30003, 1455}};
  ASSERT_TRUE(q.add_chain(pieces, 3, cookie(7)));
  EXPECT_EQ(q.free_count(), 5) << "a chain of 3 takes 3 descriptors";
  EXPECT_EQ(q.in_flight(), 3);
  EXPECT_EQ(q.avail_idx(), 1) << "one avail slot per chain";
  EXPECT_EQ(dev.avail_idx(), 0) << "invisible before publish()";
  q.publish();
  auto c = dev.pop_chain();
  ASSERT_TRUE(c);
  ASSERT_EQ(c->second.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(c->second[i].addr, pieces[i].addr) << i;
    EXPECT_EQ(c->second[i].len, pieces[i].len) << i;
    EXPECT_EQ(c->second[i].flags, i < 2 ? kDescFlagNext : 0) << i << ": NEXT on all but the last, never WRITE";
  }
  EXPECT_EQ(c->second[2].next, 0) << "the last descriptor links nowhere";
  EXPECT_FALSE(dev.pop()) << "one buffer announced, not three";
  dev.push_used(c->first, 0);
  Completion done[4];
  ASSERT_EQ(q.reap(done, 4), 1);
  EXPECT_EQ(value(done[0].cookie), 7u);
  EXPECT_EQ(q.free_count(), 8) << "the whole chain is free again";
}

TEST(SplitQueueChain, NeedsRoomForEveryDescriptorOrWritesNothing) {
  Block b(8);
  SplitQueue q;
  ASSERT_TRUE(q.init(8, b.mem, 0x2000, b.layout.bytes));
  FakeDevice dev(b.mem, 8);
  const Piece five[5] = {{1, 1}, {2, 2}, {3, 3}, {4, 4}, {5, 5}};
  ASSERT_TRUE(q.add(0x100, 60, false, cookie(1)));
  ASSERT_TRUE(q.add(0x200, 60, false, cookie(2)));
  ASSERT_TRUE(q.add_chain(five, 5, cookie(3)));
  EXPECT_EQ(q.free_count(), 1);
  std::vector<uint8_t> before(b.mem, b.mem + b.layout.bytes);
  EXPECT_FALSE(q.add_chain(five, 2, cookie(4))) << "two descriptors needed, one free";
  EXPECT_FALSE(q.add_chain(five, 0, cookie(5))) << "an empty chain is no buffer";
  EXPECT_EQ(q.free_count(), 1);
  EXPECT_EQ(q.avail_idx(), 3);
  EXPECT_EQ(std::vector<uint8_t>(b.mem, b.mem + b.layout.bytes), before) << "a refused chain wrote to the ring";
  ASSERT_TRUE(q.add_chain(five, 1, cookie(6))) << "a chain of one is a plain buffer";
  EXPECT_EQ(q.free_count(), 0);
  q.publish();
  std::vector<std::pair<uint16_t, std::vector<Desc>>> got;
  while (auto c = dev.pop_chain()) got.push_back(*c);
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[2].second.size(), 5u);
  EXPECT_EQ(got[3].second.size(), 1u);
  EXPECT_EQ(got[3].second[0].flags, 0);
  // Too long for the ring at all.
  Block big(4);
  SplitQueue small;
  ASSERT_TRUE(small.init(4, big.mem, 0x2000, big.layout.bytes));
  EXPECT_FALSE(small.add_chain(five, 5, cookie(9)));
  EXPECT_EQ(small.free_count(), 4);
}

TEST(SplitQueueChain, UsedHeadFreesTheChainWholeAndMembersAreNotBuffers) {
  Block b(8);
  SplitQueue q;
  ASSERT_TRUE(q.init(8, b.mem, 0x2000, b.layout.bytes));
  FakeDevice dev(b.mem, 8);
  const Piece four[4] = {{0x10, 12}, {0x20, 20}, {0x30, 30}, {0x40, 40}};
  ASSERT_TRUE(q.add_chain(four, 4, cookie(1)));
  ASSERT_TRUE(q.add(0x500, 60, false, cookie(2)));
  q.publish();
  auto chain = dev.pop_chain();
  auto single = dev.pop_chain();
  ASSERT_TRUE(chain && single);
  // The device names a chain member instead of the head: a device bug,
  // counted, and nothing freed.
  dev.push_used(chain->second[0].next, 0);
  Completion done[4];
  EXPECT_EQ(q.reap(done, 4), 0);
  EXPECT_EQ(q.bad_used(), 1u);
  EXPECT_EQ(q.free_count(), 3);
  // The single completes first, then the chain.
  dev.push_used(single->first, 0);
  dev.push_used(chain->first, 0);
  ASSERT_EQ(q.reap(done, 4), 2);
  EXPECT_EQ(value(done[0].cookie), 2u);
  EXPECT_EQ(value(done[1].cookie), 1u);
  EXPECT_EQ(q.free_count(), 8);
  // Naming the head a second time: not in flight any more.
  dev.push_used(chain->first, 0);
  EXPECT_EQ(q.reap(done, 4), 0);
  EXPECT_EQ(q.bad_used(), 2u);
  // Every descriptor is usable again: two chains of four fill the ring.
  ASSERT_TRUE(q.add_chain(four, 4, cookie(3)));
  ASSERT_TRUE(q.add_chain(four, 4, cookie(4)));
  EXPECT_FALSE(q.add(0x600, 60, false, cookie(5)));
  q.publish();
  std::set<uint16_t> ids;
  while (auto c = dev.pop_chain()) {
    ids.insert(c->first);
    for (const Desc& d : c->second)
      if (d.flags & kDescFlagNext) ids.insert(d.next);
  }
  EXPECT_EQ(ids.size(), 8u) << "the two chains share no descriptor";
}

TEST(SplitQueueChain, ChainsAndSinglesAcrossTheIndexWrap) {
  // 70,000 buffers of 1 to 5 pieces through a 16-entry ring: the device
  // completes random prefixes, the driver reaps random amounts; every
  // descriptor the device reads is the right piece of the right buffer and
  // free_count always equals size minus the descriptors in flight.
  constexpr uint32_t kSize = 16;
  Block b(kSize);
  SplitQueue q;
  ASSERT_TRUE(q.init(kSize, b.mem, 0x2000, b.layout.bytes));
  FakeDevice dev(b.mem, kSize);
  std::mt19937 rng(11);
  uint64_t next_post = 0, next_expect = 0, device_seen = 0;
  uint32_t descs_in_flight = 0;
  std::deque<std::pair<uint16_t, std::vector<Desc>>> device_holds;
  std::deque<uint32_t> lengths;  // chain length of each buffer not yet reaped
  Completion c[kSize];
  auto pieces_of = [](uint64_t seq) { return static_cast<uint16_t>(1 + seq % 5); };
  while (next_expect < 70000) {
    for (uint32_t tries = rng() % 4; tries > 0; --tries) {
      uint16_t n = pieces_of(next_post);
      Piece p[5];
      for (uint16_t k = 0; k < n; ++k) p[k] = Piece{next_post << 8 | k, static_cast<uint32_t>(1 + k)};
      bool fits = n <= q.free_count();
      ASSERT_EQ(q.add_chain(p, n, cookie(next_post + 1)), fits);
      if (!fits) break;
      descs_in_flight += n;
      lengths.push_back(n);
      ++next_post;
    }
    ASSERT_EQ(q.free_count() + descs_in_flight, kSize);
    q.publish();
    while (auto e = dev.pop_chain()) {
      ASSERT_EQ(e->second.size(), pieces_of(device_seen));
      for (uint16_t k = 0; k < e->second.size(); ++k) {
        ASSERT_EQ(e->second[k].addr, device_seen << 8 | k) << "device read a stale descriptor";
        ASSERT_EQ(e->second[k].len, uint32_t{1} + k);
      }
      ++device_seen;
      device_holds.push_back(*e);
    }
    for (uint32_t k = device_holds.empty() ? 0 : rng() % (device_holds.size() + 1); k > 0; --k) {
      dev.push_used(device_holds.front().first, 0);
      device_holds.pop_front();
    }
    uint16_t got = q.reap(c, static_cast<uint16_t>(1 + rng() % kSize));
    for (uint16_t i = 0; i < got; ++i, ++next_expect) {
      ASSERT_EQ(value(c[i].cookie), next_expect + 1);
      descs_in_flight -= lengths.front();
      lengths.pop_front();
    }
    ASSERT_EQ(q.free_count() + descs_in_flight, kSize);
  }
  EXPECT_EQ(q.bad_used(), 0u);
  EXPECT_GT(next_post, 65536u) << "the 16-bit avail index wrapped";
  EXPECT_EQ(q.avail_idx(), static_cast<uint16_t>(next_post));
  EXPECT_EQ(q.last_used(), static_cast<uint16_t>(70000));
}

TEST(SplitQueueChain, ResetReturnsEachChainOnce) {
  Block b(8);
  SplitQueue q;
  ASSERT_TRUE(q.init(8, b.mem, 0x2000, b.layout.bytes));
  const Piece three[3] = {{1, 1}, {2, 2}, {3, 3}};
  ASSERT_TRUE(q.add_chain(three, 3, cookie(1)));
  ASSERT_TRUE(q.add_chain(three, 3, cookie(2)));
  ASSERT_TRUE(q.add(0x10, 1, false, cookie(3)));
  q.publish();
  std::vector<uintptr_t> back;
  q.reset([&](void* ck) { back.push_back(value(ck)); });
  std::sort(back.begin(), back.end());
  EXPECT_EQ(back, (std::vector<uintptr_t>{1, 2, 3}));
  EXPECT_EQ(q.free_count(), 8);
  ASSERT_TRUE(q.add_chain(three, 3, cookie(4)));
  EXPECT_EQ(q.free_count(), 5);
}

}  // namespace
}  // namespace ufab::virtio
