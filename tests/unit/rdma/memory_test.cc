#include "core/rdma/memory.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <set>
#include <thread>
#include <unordered_set>
#include <vector>

namespace ufab::verbs {
namespace {

constexpr uint64_t kMax64 = std::numeric_limits<uint64_t>::max();

std::unique_ptr<MemoryRegionTable> make_table(MemoryTableOptions options = {}) {
  auto t = MemoryRegionTable::create(std::move(options));
  EXPECT_TRUE(t) << (t ? "" : t.error().message());
  return std::move(*t);
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A table, a PD and one 4 KiB buffer registered with all access.
struct Fixture : ::testing::Test {
  void SetUp() override {
    table = make_table();
    pd = *table->alloc_pd();
    other_pd = *table->alloc_pd();
    buf.assign(4096, 0);
    auto keys = table->register_mr(pd, buf.data(), buf.size(), kLocalWrite | kRemoteAccess);
    ASSERT_TRUE(keys) << keys.error().message();
    k = *keys;
    start = reinterpret_cast<uintptr_t>(buf.data());
  }

  KeyError remote_kind(uint32_t rkey, PdId p, uint64_t va, uint64_t len, AccessFlags needed) {
    auto r = table->check_remote(rkey, p, va, len, needed);
    EXPECT_FALSE(r) << "expected a failure for va " << va << " len " << len;
    return r ? KeyError::kUnknownKey : r.error().kind;
  }

  std::unique_ptr<MemoryRegionTable> table;
  PdId pd, other_pd;
  std::vector<uint8_t> buf;
  MemoryKeys k;
  uint64_t start = 0;
};

// ---------------------------------------------------------------- permutation

TEST(KeyPermutation, IsABijectionOfAll24BitValues) {
  KeyPermutation p({0x0123456789abcdefull, 0xfedcba9876543210ull, 0x1111222233334444ull, 0x5555666677778888ull,
                    0x9999aaaabbbbccccull, 0xddddeeeeffff0000ull, 0x0f0f0f0f0f0f0f0full, 0xf0f0f0f0f0f0f0f0ull});
  std::vector<bool> seen(1u << 24, false);
  for (uint32_t x = 0; x < (1u << 24); ++x) {
    uint32_t y = p.forward(x);
    ASSERT_LT(y, 1u << 24);
    ASSERT_FALSE(seen[y]) << "collision at " << x;
    seen[y] = true;
    ASSERT_EQ(p.inverse(y), x);
  }
}

TEST(KeyPermutation, DifferentRoundKeysGiveDifferentMappings) {
  // Keys as getrandom would give them (large, all bits busy).
  KeyPermutation::Keys ka{}, kb{};
  uint64_t x = 0x243F6A8885A308D3ull;  // digits of pi as a seed
  for (auto* keys : {&ka, &kb}) {
    for (auto& k : *keys) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      k = x ^ (x >> 29);
    }
  }
  KeyPermutation a(ka), b(kb);
  int same = 0;
  for (uint32_t x = 0; x < 4096; ++x) same += a.forward(x) == b.forward(x);
  EXPECT_LT(same, 10);
}

// --------------------------------------------------------------- registration

TEST_F(Fixture, RegisterHandsOutEqualLkeyAndRkeyForRemoteRegions) {
  EXPECT_NE(k.lkey, 0u);
  EXPECT_EQ(k.lkey, k.rkey);
  auto info = table->query(k.lkey);
  ASSERT_TRUE(info) << info.error().message();
  EXPECT_EQ(info->pd, pd);
  EXPECT_EQ(info->addr, buf.data());
  EXPECT_EQ(info->iova, start);
  EXPECT_EQ(info->length, 4096u);
  EXPECT_EQ(info->access, kLocalWrite | kRemoteAccess);
  EXPECT_EQ(info->bound, 0u);
  EXPECT_EQ(table->live_regions(), 1u);
}

// A caller's bug, survived: the table goes first, the Access later. No
// abort; the late release writes into slot memory the table left allocated.
TEST_F(Fixture, AnAccessOutlivingItsTableIsReleasedSafely) {
  auto a = table->check_remote(k.rkey, pd, start, 8, kRemoteRead);
  ASSERT_TRUE(a);
  Access held = std::move(*a);
  table.reset();
  held.release();
  EXPECT_EQ(held.data(), nullptr);
}

TEST_F(Fixture, LocalOnlyRegionHasRkeyZeroAndZeroNeverValidates) {
  auto keys = table->register_mr(pd, buf.data(), 64, kLocalWrite);
  ASSERT_TRUE(keys);
  EXPECT_NE(keys->lkey, 0u);
  EXPECT_EQ(keys->rkey, 0u);
  EXPECT_EQ(remote_kind(0, pd, start, 8, kRemoteRead), KeyError::kUnknownKey);
  // Its lkey, sent as an rkey by a confused (or guessing) peer, is refused.
  auto r = table->check_remote(keys->lkey, pd, start, 8, kRemoteRead);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().kind, KeyError::kAccessDenied);
  EXPECT_TRUE(contains(r.error().message(), "without remote access")) << r.error().message();
  EXPECT_TRUE(table->check_local(keys->lkey, pd, start, 64, true));
}

TEST(MemoryRegionTable, RemoteWriteOrAtomicWithoutLocalWriteIsRefused) {
  auto t = make_table();
  PdId pd = *t->alloc_pd();
  uint8_t b[64];
  for (AccessFlags bad : {kRemoteWrite, kRemoteAtomic, kRemoteWrite | kRemoteRead, kRemoteAtomic | kRemoteRead,
                          kRemoteWrite | kRemoteAtomic}) {
    auto r = t->register_mr(pd, b, sizeof(b), bad);
    ASSERT_FALSE(r) << access_string(bad);
    EXPECT_EQ(r.error().code(), EINVAL);
    EXPECT_TRUE(contains(r.error().message(), "REMOTE_WRITE and REMOTE_ATOMIC require LOCAL_WRITE"))
        << r.error().message();
  }
  for (AccessFlags good : {AccessFlags{0}, kLocalWrite, kRemoteRead, kLocalWrite | kRemoteWrite,
                           kLocalWrite | kRemoteAtomic, kLocalWrite | kRemoteAccess}) {
    auto r = t->register_mr(pd, b, sizeof(b), good);
    EXPECT_TRUE(r) << access_string(good) << ": " << r.error().message();
  }
}

TEST(MemoryRegionTable, RegisterRejectsBadArguments) {
  auto t = make_table();
  PdId pd = *t->alloc_pd();
  uint8_t b[64];
  auto code = [](const Result<MemoryKeys>& r) { return r ? 0 : r.error().code(); };
  EXPECT_EQ(code(t->register_mr(pd, b, 0, kLocalWrite)), EINVAL);
  EXPECT_EQ(code(t->register_mr(pd, nullptr, 64, kLocalWrite)), EINVAL);
  EXPECT_EQ(code(t->register_mr(pd, b, sizeof(b), 1u << 4)), EINVAL);  // MW_BIND: not supported
  EXPECT_EQ(code(t->register_mr(pd, b, kMax64, kLocalWrite)), EINVAL);  // host range wraps
  EXPECT_EQ(code(t->register_mr(pd, b, 64, kLocalWrite, kMax64 - 10)), EINVAL);  // iova range wraps
  EXPECT_EQ(code(t->register_mr(PdId{999}, b, 64, kLocalWrite)), ENOENT);
  EXPECT_EQ(code(t->register_mr(PdId{0}, b, 64, kLocalWrite)), ENOENT);
  // The last representable byte: [max - 64, max) is fine for the iova.
  EXPECT_EQ(code(t->register_mr(pd, b, 64, kLocalWrite, kMax64 - 64)), 0);
  EXPECT_EQ(t->live_regions(), 1u);
}

TEST(MemoryRegionTable, CreateRejectsImpossibleSizes) {
  MemoryTableOptions o;
  o.max_regions = 0;
  EXPECT_FALSE(MemoryRegionTable::create(o));
  o.max_regions = (1u << 24) + 1;
  auto r = MemoryRegionTable::create(o);
  ASSERT_FALSE(r);
  EXPECT_TRUE(contains(r.error().message(), "24-bit index"));
  o.max_regions = 1u << 24;
  EXPECT_TRUE(MemoryRegionTable::create(o));  // slots come in chunks on demand: cheap
  o.max_pds = 0;
  EXPECT_FALSE(MemoryRegionTable::create(o));
}

TEST(MemoryRegionTable, FullTableSaysSoAndFreedSlotsComeBack) {
  MemoryTableOptions o;
  o.max_regions = 4;
  auto t = make_table(o);
  PdId pd = *t->alloc_pd();
  uint8_t b[64];
  std::vector<uint32_t> keys;
  for (int i = 0; i < 4; ++i) keys.push_back(t->register_mr(pd, b, 64, kLocalWrite)->lkey);
  auto r = t->register_mr(pd, b, 64, kLocalWrite);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ENOSPC);
  EXPECT_TRUE(contains(r.error().message(), "raise max_regions"));
  ASSERT_TRUE(t->deregister_mr(keys[2]));
  EXPECT_TRUE(t->register_mr(pd, b, 64, kLocalWrite));
}

// ----------------------------------------------------------------------- keys

TEST(MemoryRegionTable, TenThousandLiveKeysAreDistinctAndNotInSequence) {
  auto t = make_table();
  PdId pd = *t->alloc_pd();
  uint8_t b[64];
  std::vector<uint32_t> keys;
  std::unordered_set<uint32_t> seen, indices;
  for (int i = 0; i < 10000; ++i) {
    auto r = t->register_mr(pd, b, sizeof(b), kLocalWrite | kRemoteRead);
    ASSERT_TRUE(r) << r.error().message();
    ASSERT_NE(r->lkey, 0u);
    ASSERT_TRUE(seen.insert(r->lkey).second) << "duplicate live key " << r->lkey;
    ASSERT_TRUE(indices.insert(r->lkey >> 8).second) << "two live regions share an index";
    keys.push_back(r->lkey);
  }
  // Successive keys must not form an arithmetic sequence (as slot << 8 | k
  // would: a constant step of 256 in the index). Count the steps: a
  // predictable allocator repeats a few; a random mapping almost never.
  std::unordered_set<uint32_t> key_steps;
  int index_plus_one = 0;
  int byte_repeats = 0;
  for (size_t i = 1; i < keys.size(); ++i) {
    key_steps.insert(keys[i] - keys[i - 1]);
    index_plus_one += (keys[i] >> 8) == (keys[i - 1] >> 8) + 1;
    byte_repeats += (keys[i] & 0xFF) == (keys[i - 1] & 0xFF);
  }
  EXPECT_GT(key_steps.size(), 9900u);
  EXPECT_LT(index_plus_one, 10);   // expected ~0.006 for random 24-bit indices
  EXPECT_LT(byte_repeats, 100);    // expected ~39 for random key bytes
  // The key bytes use the whole 8-bit range.
  std::set<uint32_t> bytes;
  for (uint32_t key : keys) bytes.insert(key & 0xFF);
  EXPECT_GT(bytes.size(), 250u);
  // And every one still validates.
  for (uint32_t key : keys) ASSERT_TRUE(t->check_remote(key, pd, reinterpret_cast<uintptr_t>(b), 1, kRemoteRead));
}

TEST(MemoryRegionTable, TwoTablesMapIndicesDifferently) {
  auto a = make_table(), b = make_table();
  PdId pa = *a->alloc_pd(), pb = *b->alloc_pd();
  uint8_t buf[8];
  int same = 0;
  for (int i = 0; i < 100; ++i) {
    same += (a->register_mr(pa, buf, 8, 0)->lkey >> 8) == (b->register_mr(pb, buf, 8, 0)->lkey >> 8);
  }
  EXPECT_LT(same, 3);
}

TEST(MemoryRegionTable, StaleKeyOfAReusedSlotNeverValidates) {
  MemoryTableOptions o;
  o.max_regions = 1;  // every registration lands in the same slot; all 24 index bits are generation
  o.reuse_delay = 0;
  auto t = make_table(o);
  PdId pd = *t->alloc_pd();
  uint8_t b[64];
  uint64_t va = reinterpret_cast<uintptr_t>(b);
  uint32_t old = t->register_mr(pd, b, 64, kLocalWrite | kRemoteAccess)->lkey;
  for (int cycle = 0; cycle < 2000; ++cycle) {
    ASSERT_TRUE(t->deregister_mr(old));
    // Freed and not yet reused: unknown.
    auto gone = t->check_remote(old, pd, va, 8, kRemoteRead);
    ASSERT_FALSE(gone);
    ASSERT_EQ(gone.error().kind, KeyError::kUnknownKey);
    uint32_t now = t->register_mr(pd, b, 64, kLocalWrite | kRemoteAccess)->lkey;
    ASSERT_NE(now >> 8, old >> 8) << "a new generation moves the index";
    ASSERT_NE(now & 0xFF, old & 0xFF) << "the key byte must change on reuse";
    auto stale = t->check_remote(old, pd, va, 8, kRemoteRead);
    ASSERT_FALSE(stale);
    ASSERT_EQ(stale.error().kind, KeyError::kStaleKey);
    ASSERT_EQ(stale.error().nak_syndrome(), kNakRemoteAccessError);
    auto stale_local = t->check_local(old, pd, va, 8, false);
    ASSERT_FALSE(stale_local);
    ASSERT_EQ(stale_local.error().kind, KeyError::kStaleKey);
    ASSERT_FALSE(t->deregister_mr(old));  // an old key cannot remove the new region
    ASSERT_FALSE(t->bind(old));
    ASSERT_TRUE(t->check_remote(now, pd, va, 8, kRemoteRead));
    old = now;
  }
}

TEST(MemoryRegionTable, WithoutGenerationBitsTheKeyByteAloneRetiresStaleKeys) {
  MemoryTableOptions o;
  o.max_regions = 1u << 24;  // the slot needs all 24 index bits: the index of a slot never changes
  o.reuse_delay = 0;
  auto t = make_table(o);
  PdId pd = *t->alloc_pd();
  uint8_t b[64];
  uint64_t va = reinterpret_cast<uintptr_t>(b);
  uint32_t old = t->register_mr(pd, b, 64, kLocalWrite | kRemoteRead)->lkey;
  for (int cycle = 0; cycle < 2000; ++cycle) {
    ASSERT_TRUE(t->deregister_mr(old));
    uint32_t now = t->register_mr(pd, b, 64, kLocalWrite | kRemoteRead)->lkey;
    ASSERT_EQ(now >> 8, old >> 8) << "same slot, same index";
    ASSERT_NE(now & 0xFF, old & 0xFF) << "the key byte must change on reuse";
    auto stale = t->check_remote(old, pd, va, 8, kRemoteRead);
    ASSERT_FALSE(stale);
    ASSERT_EQ(stale.error().kind, KeyError::kStaleKey);
    old = now;
  }
}

TEST(MemoryRegionTable, FreedSlotsWaitBeforeReuse) {
  auto t = make_table();  // reuse_delay 1024
  PdId pd = *t->alloc_pd();
  uint8_t b[8];
  std::unordered_set<uint32_t> indices;
  for (int i = 0; i < 500; ++i) {
    uint32_t key = t->register_mr(pd, b, 8, 0)->lkey;
    ASSERT_TRUE(indices.insert(key >> 8).second) << "slot reused after " << i << " cycles";
    ASSERT_TRUE(t->deregister_mr(key));
  }
}

TEST(MemoryRegionTable, KeyByteIsRedrawnWhenTheRandomSourceRepeatsIt) {
  // A rigged source: `repeats` copies of `stuck`, then counting up from `next`.
  struct State {
    int repeats = 0;
    uint8_t stuck = 0;
    uint8_t next = 0;
  };
  auto state = std::make_shared<State>();
  MemoryTableOptions o;
  o.max_regions = 1u << 24;  // no generation bits: only key bytes are drawn
  o.reuse_delay = 0;         // and the one freed slot is reused at once
  o.random = [state](void* p, size_t n) -> Status {
    auto* out = static_cast<uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) {
      if (state->repeats > 0) {
        --state->repeats;
        out[i] = state->stuck;
      } else {
        out[i] = state->next++;
      }
    }
    return {};
  };
  auto t = make_table(o);
  PdId pd = *t->alloc_pd();
  uint8_t b[8];
  *state = State{0, 0, 0x40};
  uint32_t first = t->register_mr(pd, b, 8, 0)->lkey;
  ASSERT_EQ(first & 0xFF, 0x40u);
  ASSERT_TRUE(t->deregister_mr(first));

  *state = State{10, 0x40, 0x41};  // ten draws equal to the previous byte are refused
  uint32_t second = t->register_mr(pd, b, 8, 0)->lkey;
  EXPECT_EQ(second & 0xFF, 0x41u);
  EXPECT_EQ(state->repeats, 0);
  ASSERT_TRUE(t->deregister_mr(second));

  *state = State{100000, 0x41, 0};  // stuck on the previous byte: a broken source
  auto stuck = t->register_mr(pd, b, 8, 0);
  ASSERT_FALSE(stuck);
  EXPECT_EQ(stuck.error().code(), EIO);
  EXPECT_TRUE(contains(stuck.error().message(), "random source")) << stuck.error().message();

  *state = State{0, 0, 0x10};  // the slot survived the failure
  auto after = t->register_mr(pd, b, 8, 0);
  ASSERT_TRUE(after) << after.error().message();
  EXPECT_EQ(after->lkey & 0xFF, 0x10u);
}

TEST(MemoryRegionTable, RandomSourceFailureIsReported) {
  MemoryTableOptions o;
  o.random = [](void*, size_t) -> Status { return fail(EAGAIN, "no entropy"); };
  auto t = MemoryRegionTable::create(o);
  ASSERT_FALSE(t);
  EXPECT_TRUE(contains(t.error().message(), "no entropy"));
}

// --------------------------------------------------------------- remote checks

TEST_F(Fixture, RemoteCheckGrantsTheRightBytes) {
  auto a = table->check_remote(k.rkey, pd, start + 100, 50, kRemoteWrite);
  ASSERT_TRUE(a) << a.error().message();
  EXPECT_EQ(a->data(), buf.data() + 100);
  EXPECT_EQ(a->length(), 50u);
  EXPECT_EQ(a->key(), k.rkey);
  std::memset(a->data(), 0xAB, a->length());
  EXPECT_EQ(buf[100], 0xAB);
  EXPECT_EQ(buf[149], 0xAB);
  EXPECT_EQ(buf[150], 0);
}

TEST_F(Fixture, RemoteCheckHonoursARegisteredIova) {
  auto keys = table->register_mr(pd, buf.data(), 4096, kLocalWrite | kRemoteRead, 0x10000);
  ASSERT_TRUE(keys);
  auto a = table->check_remote(keys->rkey, pd, 0x10000 + 7, 9, kRemoteRead);
  ASSERT_TRUE(a) << a.error().message();
  EXPECT_EQ(a->data(), buf.data() + 7);
  EXPECT_EQ(remote_kind(keys->rkey, pd, start, 8, kRemoteRead), KeyError::kOutOfBounds);  // host address is not the iova
  EXPECT_EQ(remote_kind(keys->rkey, pd, 0x10000 - 1, 8, kRemoteRead), KeyError::kOutOfBounds);
}

TEST_F(Fixture, UnknownKeysAreUnknown) {
  EXPECT_EQ(remote_kind(0, pd, start, 8, kRemoteRead), KeyError::kUnknownKey);
  // Every other index: no live region (only one is registered).
  int unknown = 0, stale = 0, tried = 0;
  for (uint32_t i = 0; i < 5000; ++i) {
    uint32_t guess = (i * 2654435761u) ^ 0x5a5a5a00u;
    if (guess == k.rkey) continue;
    ++tried;
    auto r = table->check_remote(guess, pd, start, 8, kRemoteRead);
    ASSERT_FALSE(r);
    unknown += r.error().kind == KeyError::kUnknownKey;
    stale += r.error().kind == KeyError::kStaleKey;
  }
  EXPECT_EQ(unknown + stale, tried);
  EXPECT_GT(unknown, 4900);  // a random guess almost never even hits the live index
  // Same index, every other key byte: stale (a guess at the key byte).
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t guess = (k.rkey & ~0xFFu) | b;
    if (guess == k.rkey) continue;
    EXPECT_EQ(remote_kind(guess, pd, start, 8, kRemoteRead), KeyError::kStaleKey);
  }
}

TEST_F(Fixture, ProtectionDomainMustMatch) {
  EXPECT_EQ(remote_kind(k.rkey, other_pd, start, 8, kRemoteRead), KeyError::kPdMismatch);
  EXPECT_EQ(remote_kind(k.rkey, PdId{0}, start, 8, kRemoteRead), KeyError::kPdMismatch);
  auto r = table->check_local(k.lkey, other_pd, start, 8, false);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().kind, KeyError::kPdMismatch);
}

TEST_F(Fixture, AccessFlagsAreEnforcedForEveryCombination) {
  for (AccessFlags reg = 0; reg <= kSupportedAccess; ++reg) {
    if (reg & ~kSupportedAccess) continue;
    if ((reg & (kRemoteWrite | kRemoteAtomic)) && !(reg & kLocalWrite)) continue;
    // FLUSH_PERSISTENT needs memory the caller says is durable.
    auto keys = table->register_mr(pd, buf.data(), 64, reg, std::nullopt, 0,
                                   (reg & kFlushPersistent) ? Durability::kCacheFlush : Durability::kNone);
    ASSERT_TRUE(keys) << access_string(reg);
    uint32_t key = keys->lkey;  // also tests lkey-as-rkey for local-only regions
    for (AccessFlags needed : {kRemoteRead, kRemoteWrite, kRemoteAtomic, kRemoteRead | kRemoteWrite, kFlushGlobal,
                               kFlushPersistent, kFlushGlobal | kFlushPersistent}) {
      uint64_t len = needed == kRemoteAtomic ? 8 : 16;
      auto r = table->check_remote(key, pd, start, len, needed);
      bool allowed = (reg & needed) == needed;
      ASSERT_EQ(static_cast<bool>(r), allowed) << access_string(reg) << " needs " << access_string(needed);
      if (!allowed) {
        EXPECT_EQ(r.error().kind, KeyError::kAccessDenied);
      }
    }
    EXPECT_EQ(static_cast<bool>(table->check_local(key, pd, start, 16, true)), (reg & kLocalWrite) != 0)
        << access_string(reg);
    EXPECT_TRUE(table->check_local(key, pd, start, 16, false)) << "local reads are always allowed";
    ASSERT_TRUE(table->deregister_mr(key));
  }
}

// FLUSH_PERSISTENT on memory nothing makes durable is refused; the
// durability a region was registered with travels with every check.
TEST_F(Fixture, PersistentFlushNeedsDurableMemoryAndChecksCarryIt) {
  std::vector<uint8_t> b(256);
  auto no = table->register_mr(pd, b.data(), b.size(), kFlushPersistent);
  ASSERT_FALSE(no);
  EXPECT_EQ(no.error().code(), EINVAL);
  EXPECT_TRUE(contains(no.error().message(), "DRAM")) << no.error().message();
  for (Durability d : {Durability::kCacheFlush, Durability::kFileSync}) {
    auto keys = table->register_mr(pd, b.data(), b.size(), kFlushPersistent, std::nullopt, 0, d);
    ASSERT_TRUE(keys) << keys.error().message();
    auto a = table->check_remote(keys->rkey, pd, reinterpret_cast<uintptr_t>(b.data()) + 8, 16, kFlushPersistent);
    ASSERT_TRUE(a);
    EXPECT_EQ(a->durability(), d);
    auto whole = table->check_remote_region(keys->rkey, pd, kFlushPersistent);
    ASSERT_TRUE(whole);
    EXPECT_EQ(whole->durability(), d);
    auto info = table->query(keys->lkey);
    ASSERT_TRUE(info);
    EXPECT_EQ(info->durability, d);
    a->release();
    whole->release();
    ASSERT_TRUE(table->deregister_mr(keys->lkey));
  }
  auto plain = table->check_local(k.lkey, pd, start, 8, false);
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->durability(), Durability::kNone);
}

TEST_F(Fixture, NeededAccessMustBeRemoteFlags) {
  EXPECT_EQ(remote_kind(k.rkey, pd, start, 8, 0), KeyError::kAccessDenied);
  EXPECT_EQ(remote_kind(k.rkey, pd, start, 8, kLocalWrite), KeyError::kAccessDenied);
  EXPECT_EQ(remote_kind(k.rkey, pd, start, 8, kRemoteRead | (1u << 12)), KeyError::kAccessDenied);
}

// FLUSH rights are remote rights: a region with only them has an rkey, a
// FLUSH needs the flag of each placement type it asks for, and a flush of
// the whole region is checked without a range.
TEST_F(Fixture, FlushRightsAreRemoteRightsPerPlacementType) {
  std::vector<uint8_t> b(256);
  const uint64_t bstart = reinterpret_cast<uintptr_t>(b.data());
  auto g = table->register_mr(pd, b.data(), b.size(), kFlushGlobal);
  ASSERT_TRUE(g) << g.error().message();
  EXPECT_NE(g->rkey, 0u) << "a FLUSH target needs an rkey";
  EXPECT_TRUE(table->check_remote(g->rkey, pd, bstart, 256, kFlushGlobal));
  EXPECT_EQ(remote_kind(g->rkey, pd, bstart, 8, kFlushPersistent), KeyError::kAccessDenied);
  EXPECT_EQ(remote_kind(g->rkey, pd, bstart, 8, kFlushGlobal | kFlushPersistent), KeyError::kAccessDenied);
  EXPECT_EQ(remote_kind(g->rkey, pd, bstart, 8, kRemoteWrite), KeyError::kAccessDenied);
  EXPECT_EQ(remote_kind(k.rkey, pd, start, 8, kFlushGlobal), KeyError::kAccessDenied)
      << "REMOTE_WRITE|READ|ATOMIC does not grant FLUSH";
  EXPECT_EQ(remote_kind(g->rkey, pd, bstart + 200, 64, kFlushGlobal), KeyError::kOutOfBounds);

  auto whole = table->check_remote_region(g->rkey, pd, kFlushGlobal);
  ASSERT_TRUE(whole) << whole.error().message();
  EXPECT_EQ(whole->data(), b.data());
  EXPECT_EQ(whole->length(), 256u);
  auto no = table->check_remote_region(g->rkey, pd, kFlushPersistent);
  ASSERT_FALSE(no);
  EXPECT_EQ(no.error().kind, KeyError::kAccessDenied);
  EXPECT_EQ(no.error().nak_syndrome(), kNakRemoteAccessError);
  EXPECT_TRUE(contains(no.error().message(), "FLUSH_PERSISTENT")) << no.error().message();
  no = table->check_remote_region(g->rkey, other_pd, kFlushGlobal);
  ASSERT_FALSE(no);
  EXPECT_EQ(no.error().kind, KeyError::kPdMismatch);
  no = table->check_remote_region(g->rkey ^ 1, pd, kFlushGlobal);
  ASSERT_FALSE(no);
  EXPECT_EQ(no.error().kind, KeyError::kStaleKey);

  // The table takes the caller's word on the memory (the provider learns
  // it from the mapping).
  auto both = table->register_mr(pd, b.data(), b.size(), kFlushGlobal | kFlushPersistent, std::nullopt, 0,
                                 Durability::kFileSync);
  ASSERT_TRUE(both) << both.error().message();
  EXPECT_TRUE(table->check_remote(both->rkey, pd, bstart, 8, kFlushGlobal | kFlushPersistent));
  EXPECT_EQ(access_string(kFlushGlobal | kFlushPersistent), "FLUSH_GLOBAL|FLUSH_PERSISTENT");
}

TEST_F(Fixture, BoundsAtEveryEdge) {
  const uint64_t end = start + 4096;
  auto ok = [&](uint64_t va, uint64_t len) {
    auto r = table->check_remote(k.rkey, pd, va, len, kRemoteWrite);
    return r ? std::string("ok") : r.error().message();
  };
  EXPECT_EQ(ok(start, 1), "ok");            // first byte
  EXPECT_EQ(ok(end - 1, 1), "ok");          // last byte
  EXPECT_EQ(ok(start, 4096), "ok");         // whole region
  EXPECT_EQ(ok(start, 0), "ok");            // length 0 at the start
  EXPECT_EQ(ok(end, 0), "ok");              // length 0 at the end (one past the last byte)
  EXPECT_EQ(ok(start + 123, 0), "ok");      // length 0 inside
  EXPECT_EQ(remote_kind(k.rkey, pd, end, 1, kRemoteWrite), KeyError::kOutOfBounds);         // one past the end
  EXPECT_EQ(remote_kind(k.rkey, pd, end - 1, 2, kRemoteWrite), KeyError::kOutOfBounds);     // straddles the end
  EXPECT_EQ(remote_kind(k.rkey, pd, start - 1, 1, kRemoteWrite), KeyError::kOutOfBounds);   // one before
  EXPECT_EQ(remote_kind(k.rkey, pd, start - 1, 2, kRemoteWrite), KeyError::kOutOfBounds);   // straddles the start
  EXPECT_EQ(remote_kind(k.rkey, pd, start, 4097, kRemoteWrite), KeyError::kOutOfBounds);    // one too long
  EXPECT_EQ(remote_kind(k.rkey, pd, end + 1, 0, kRemoteWrite), KeyError::kOutOfBounds);     // length 0 past the end
  EXPECT_EQ(remote_kind(k.rkey, pd, start - 1, 0, kRemoteWrite), KeyError::kOutOfBounds);   // length 0 before
  EXPECT_EQ(remote_kind(k.rkey, pd, start, kMax64, kRemoteWrite), KeyError::kOutOfBounds);  // huge length
  EXPECT_EQ(remote_kind(k.rkey, pd, start + 8, kMax64 - 7, kRemoteWrite), KeyError::kOutOfBounds);
  EXPECT_EQ(remote_kind(k.rkey, pd, kMax64, 1, kRemoteWrite), KeyError::kOutOfBounds);
  EXPECT_EQ(remote_kind(k.rkey, pd, 0, 0, kRemoteWrite), KeyError::kOutOfBounds);
  // va + length wraps to land inside the region: still refused, and said so.
  uint64_t wrap_va = kMax64 - 15;
  auto r = table->check_remote(k.rkey, pd, wrap_va, start + 16 + 16, kRemoteWrite);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().kind, KeyError::kOutOfBounds);
  EXPECT_TRUE(contains(r.error().message(), "wraps around 2^64")) << r.error().message();
}

TEST_F(Fixture, LocalBoundsMatchRemoteBounds) {
  const uint64_t end = start + 4096;
  EXPECT_TRUE(table->check_local(k.lkey, pd, start, 4096, true));
  EXPECT_TRUE(table->check_local(k.lkey, pd, end, 0, true));
  for (auto [va, len] : {std::pair<uint64_t, uint64_t>{end, 1}, {start - 1, 1}, {start, kMax64}, {kMax64, 2}}) {
    auto r = table->check_local(k.lkey, pd, va, len, false);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().kind, KeyError::kOutOfBounds);
    EXPECT_EQ(r.error().path, KeyPath::kLocal);
    EXPECT_EQ(r.error().nak_syndrome(), kNakRemoteOperationalError);
  }
}

TEST_F(Fixture, AtomicsNeedEightAlignedBytes) {
  uint64_t aligned = (start + 7) & ~uint64_t{7};
  EXPECT_TRUE(table->check_remote(k.rkey, pd, aligned, 8, kRemoteAtomic));
  EXPECT_TRUE(table->check_remote(k.rkey, pd, start + 4096 - 8, 8, kRemoteAtomic));  // last word
  for (uint64_t off = 1; off < 8; ++off) {
    EXPECT_EQ(remote_kind(k.rkey, pd, aligned + off, 8, kRemoteAtomic), KeyError::kMisalignedAtomic) << off;
  }
  EXPECT_EQ(remote_kind(k.rkey, pd, aligned, 4, kRemoteAtomic), KeyError::kBadAtomicLength);
  EXPECT_EQ(remote_kind(k.rkey, pd, aligned, 16, kRemoteAtomic), KeyError::kBadAtomicLength);
  EXPECT_EQ(remote_kind(k.rkey, pd, aligned, 0, kRemoteAtomic), KeyError::kBadAtomicLength);
  // Bounds come before alignment (as in rxe, where the range check runs first).
  EXPECT_EQ(remote_kind(k.rkey, pd, start + 4096, 8, kRemoteAtomic), KeyError::kOutOfBounds);
  EXPECT_EQ(remote_kind(k.rkey, pd, start + 4096 - 4, 8, kRemoteAtomic), KeyError::kOutOfBounds);
  // An iova that is aligned while the host address is not: the CPU could
  // not do the atomic, so it is refused too.
  auto keys = table->register_mr(pd, buf.data() + 3, 64, kLocalWrite | kRemoteAtomic, 0x8000);
  ASSERT_TRUE(keys);
  auto r = table->check_remote(keys->rkey, pd, 0x8000, 8, kRemoteAtomic);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().kind, KeyError::kMisalignedAtomic);
  EXPECT_EQ(r.error().nak_syndrome(), kNakInvalidRequest);
}

TEST(MemoryKeys, NakSyndromesFollowRxe) {
  EXPECT_EQ(aeth_nak_syndrome(KeyError::kUnknownKey, KeyPath::kRemote), 0x62);
  EXPECT_EQ(aeth_nak_syndrome(KeyError::kStaleKey, KeyPath::kRemote), 0x62);
  EXPECT_EQ(aeth_nak_syndrome(KeyError::kPdMismatch, KeyPath::kRemote), 0x62);
  EXPECT_EQ(aeth_nak_syndrome(KeyError::kAccessDenied, KeyPath::kRemote), 0x62);
  EXPECT_EQ(aeth_nak_syndrome(KeyError::kOutOfBounds, KeyPath::kRemote), 0x62);
  EXPECT_EQ(aeth_nak_syndrome(KeyError::kMisalignedAtomic, KeyPath::kRemote), 0x61);
  EXPECT_EQ(aeth_nak_syndrome(KeyError::kBadAtomicLength, KeyPath::kRemote), 0x61);
  for (int i = 0; i < kKeyErrorCount; ++i) {
    auto kind = static_cast<KeyError>(i);
    EXPECT_EQ(aeth_nak_syndrome(kind, KeyPath::kLocal), 0x63) << key_error_name(kind);
  }
}

TEST(MemoryKeys, EveryErrorHasANameAMessageAndAnErrno) {
  std::set<std::string> names;
  for (int i = 0; i < kKeyErrorCount; ++i) {
    KeyCheckError e;
    e.kind = static_cast<KeyError>(i);
    e.key = 0x12345678;
    e.va = 0x1000;
    e.length = 8;
    e.region_start = 0x2000;
    e.region_length = 64;
    e.region_access = kLocalWrite | kRemoteRead;
    e.needed_access = kRemoteWrite;
    names.insert(key_error_name(e.kind));
    std::string m = e.message();
    EXPECT_TRUE(contains(m, "rkey 0x12345678")) << m;
    Error err = e.to_error();
    EXPECT_EQ(err.message(), m);
    EXPECT_NE(err.code(), 0);
    e.path = KeyPath::kLocal;
    EXPECT_TRUE(contains(e.message(), "lkey 0x12345678"));
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(kKeyErrorCount));
  KeyCheckError e;
  e.kind = KeyError::kAccessDenied;
  e.region_access = kLocalWrite | kRemoteRead;
  e.needed_access = kRemoteWrite;
  EXPECT_TRUE(contains(e.message(), "needs REMOTE_WRITE but the region allows LOCAL_WRITE|REMOTE_READ")) << e.message();
  e.kind = KeyError::kOutOfBounds;
  e.va = 0x1000;
  e.length = 8;
  e.region_start = 0x2000;
  e.region_length = 64;
  EXPECT_TRUE(contains(e.message(), "[0x1000, +8) is outside the region [0x2000, +64)")) << e.message();
  EXPECT_EQ(e.to_error().code(), EFAULT);
}

TEST(MemoryKeys, AccessStringNamesFlags) {
  EXPECT_EQ(access_string(0), "none");
  EXPECT_EQ(access_string(kLocalWrite | kRemoteRead), "LOCAL_WRITE|REMOTE_READ");
  EXPECT_EQ(access_string(kRemoteAtomic | (1u << 12)), "REMOTE_ATOMIC|0x00001000");
}

TEST(MemoryKeys, ZeroLengthRdmaSkipsTheKeyCheck) {
  EXPECT_FALSE(rkey_check_needed(0));
  EXPECT_TRUE(rkey_check_needed(1));
}

// -------------------------------------------------------- lifetime and binding

TEST_F(Fixture, BoundRegionsCannotBeDeregistered) {
  ASSERT_TRUE(table->bind(k.lkey));
  ASSERT_TRUE(table->bind(k.lkey));
  EXPECT_EQ(table->query(k.lkey)->bound, 2u);
  auto r = table->deregister_mr(k.lkey);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), EBUSY);
  EXPECT_TRUE(contains(r.error().message(), "bound by 2")) << r.error().message();
  EXPECT_TRUE(table->check_remote(k.rkey, pd, start, 8, kRemoteRead)) << "still usable";
  ASSERT_TRUE(table->unbind(k.lkey));
  EXPECT_FALSE(table->deregister_mr(k.lkey));
  ASSERT_TRUE(table->unbind(k.lkey));
  auto extra = table->unbind(k.lkey);
  ASSERT_FALSE(extra);
  EXPECT_EQ(extra.error().code(), EINVAL);
  ASSERT_TRUE(table->deregister_mr(k.lkey));
  auto twice = table->deregister_mr(k.lkey);
  ASSERT_FALSE(twice);
  EXPECT_EQ(twice.error().code(), ENOENT);
  EXPECT_FALSE(table->bind(k.lkey));
  EXPECT_FALSE(table->query(k.lkey));
  EXPECT_FALSE(table->deregister_mr(0));
  EXPECT_EQ(remote_kind(k.rkey, pd, start, 8, kRemoteRead), KeyError::kUnknownKey);
}

TEST_F(Fixture, ProtectionDomainsCountTheirRegions) {
  auto busy = table->dealloc_pd(pd);
  ASSERT_FALSE(busy);
  EXPECT_EQ(busy.error().code(), EBUSY);
  EXPECT_TRUE(contains(busy.error().message(), "1 memory region"));
  ASSERT_TRUE(table->deregister_mr(k.lkey));
  ASSERT_TRUE(table->dealloc_pd(pd));
  auto again = table->dealloc_pd(pd);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code(), ENOENT);
  EXPECT_FALSE(table->register_mr(pd, buf.data(), 8, 0));
  EXPECT_TRUE(table->dealloc_pd(other_pd));
  PdId fresh = *table->alloc_pd();
  EXPECT_NE(fresh.value, 0u);
  EXPECT_NE(fresh, pd);
}

TEST(MemoryRegionTable, PdLimitIsEnforced) {
  MemoryTableOptions o;
  o.max_pds = 2;
  auto t = make_table(o);
  ASSERT_TRUE(t->alloc_pd());
  ASSERT_TRUE(t->alloc_pd());
  auto r = t->alloc_pd();
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ENOSPC);
}

TEST(MemoryRegionTable, DeregisterGivesUpOnAnAccessHeldTooLong) {
  MemoryTableOptions o;
  o.drain_timeout = std::chrono::milliseconds(30);
  auto t = make_table(o);
  PdId pd = *t->alloc_pd();
  uint8_t b[64];
  auto keys = *t->register_mr(pd, b, 64, kLocalWrite | kRemoteWrite);
  uint64_t va = reinterpret_cast<uintptr_t>(b);
  {
    auto held = t->check_remote(keys.rkey, pd, va, 8, kRemoteWrite);
    ASSERT_TRUE(held);
    auto r = t->deregister_mr(keys.lkey);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code(), EBUSY);
    EXPECT_TRUE(contains(r.error().message(), "in flight")) << r.error().message();
    // Restored: the same key works again.
    EXPECT_TRUE(t->check_remote(keys.rkey, pd, va, 8, kRemoteWrite));
    Access moved = std::move(*held);
    EXPECT_EQ(held->data(), nullptr);
    EXPECT_NE(moved.data(), nullptr);
    EXPECT_FALSE(t->deregister_mr(keys.lkey)) << "the moved-to Access still pins";
  }
  EXPECT_TRUE(t->deregister_mr(keys.lkey));
}

TEST(MemoryRegionTable, DeregisterWaitsForInFlightAccess) {
  MemoryTableOptions o;
  o.drain_timeout = std::chrono::seconds(20);
  auto t = make_table(o);
  PdId pd = *t->alloc_pd();
  std::vector<uint8_t> b(64);
  auto keys = *t->register_mr(pd, b.data(), 64, kLocalWrite | kRemoteWrite);
  auto held = t->check_remote(keys.rkey, pd, reinterpret_cast<uintptr_t>(b.data()), 8, kRemoteWrite);
  ASSERT_TRUE(held);
  std::atomic<bool> released{false};
  std::thread copier([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::memset(held->data(), 1, 8);  // the "copy" still in progress
    released.store(true);
    held->release();
  });
  ASSERT_TRUE(t->deregister_mr(keys.lkey));
  EXPECT_TRUE(released.load()) << "deregister returned while the copy was still running";
  copier.join();
  EXPECT_EQ(b[0], 1);
}

}  // namespace
}  // namespace ufab::verbs
