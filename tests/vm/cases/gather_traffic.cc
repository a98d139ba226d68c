#include "tests/vm/cases/gather_traffic.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <vector>

#include "dma/buffer_pool.h"
#include "dma/dma.h"

namespace ufab::vmtest {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint8_t kTag[4] = {'G', 'A', 'T', 'H'};
constexpr uint32_t kHeader = 28;  // dst 6, src 6, ethertype 2, tag 4, seq 8, length 2
constexpr uint32_t kMinFrame = 60, kMaxFrame = 1514;
constexpr size_t kRegion = 64 * 1024;

// Where frame `seq`'s bytes come from.
struct Layout {
  uint32_t len = 0, nsegs = 0;
  uint32_t shift = 0;  // segment 0's start past the buffer's headroom
  uint32_t head = 0;   // segment 0's length (header + filler)
  uint32_t off[UFAB_TX_SEGS_MAX] = {}, piece[UFAB_TX_SEGS_MAX] = {};  // segments 1.. in the region
};

Layout layout_of(uint64_t seq) {
  Layout l;
  l.len = kMinFrame + static_cast<uint32_t>((seq * 997) % (kMaxFrame - kMinFrame + 1));
  l.nsegs = 1 + static_cast<uint32_t>(seq % UFAB_TX_SEGS_MAX);
  l.shift = 1 + 2 * static_cast<uint32_t>(seq % 3);  // 1, 3, 5: odd
  l.head = l.nsegs == 1 ? l.len : kHeader + static_cast<uint32_t>((seq * 5) % 23);
  uint32_t left = l.len - l.head;  // >= 10 >= nsegs - 1
  uint32_t m = l.nsegs - 1;
  for (uint32_t s = 1; s <= m; ++s) {
    uint32_t most = left - (m - s);  // leave a byte for each later segment
    l.piece[s] = s == m ? left : 1 + 2 * static_cast<uint32_t>((seq * 37 + s * 101) % ((most + 1) / 2));
    left -= l.piece[s];
    l.off[s] = static_cast<uint32_t>(((seq * 7919 + s * 613) % (kRegion - 2 * kMaxFrame)) | 1);
  }
  return l;
}

uint8_t filler(uint64_t seq, uint32_t i) { return static_cast<uint8_t>(seq * 31 + i * 13); }

class Gatherer {
 public:
  Gatherer(Port& a, const core::Mac& dst, const core::Mac& src) : pool_(*a.pool), dst_(dst), src_(src) {
    auto r = a.nic->dma().allocate(kRegion, 4096);
    EXPECT_TRUE(r) << (r ? "" : r.error().message());
    if (!r) return;
    region_ = std::move(*r);
    auto* p = static_cast<uint8_t*>(region_.va());
    for (size_t i = 0; i < kRegion; ++i) p[i] = static_cast<uint8_t>(i * 131 + (i >> 8));
  }
  bool ok() const { return region_.valid(); }

  // Frame `seq` into *f, a buffer from the pool holding segment 0; false
  // when the pool is empty. Keeps the bytes the device should send.
  bool build(uint64_t seq, ufab_tx_frame* f) {
    ufab_buf* b = nullptr;
    if (pool_.alloc(&b, 1) != 1) return false;
    Layout l = layout_of(seq);
    uint8_t* h = b->base + b->offset + l.shift;
    std::memcpy(h, dst_.data(), 6);
    std::memcpy(h + 6, src_.data(), 6);
    h[12] = core::kTestEthertype >> 8;
    h[13] = core::kTestEthertype & 0xff;
    std::memcpy(h + 14, kTag, 4);
    std::memcpy(h + 18, &seq, 8);
    h[26] = static_cast<uint8_t>(l.len);
    h[27] = static_cast<uint8_t>(l.len >> 8);
    for (uint32_t i = kHeader; i < l.head; ++i) h[i] = filler(seq, i);
    *f = ufab_tx_frame{};
    f->buf = b;
    f->nsegs = l.nsegs;
    f->len = l.len;
    f->segs[0] = ufab_tx_seg{h, b->base_iova + (h - b->base), l.head, 0};
    auto* region = static_cast<const uint8_t*>(region_.va());
    for (uint32_t s = 1; s < l.nsegs; ++s)
      f->segs[s] = ufab_tx_seg{region + l.off[s], region_.iova() + l.off[s], l.piece[s], 0};
    std::vector<uint8_t>& want = expected_[seq];
    want.clear();
    for (uint32_t s = 0; s < f->nsegs; ++s) want.insert(want.end(), f->segs[s].va, f->segs[s].va + f->segs[s].len);
    return true;
  }

  enum class Check { kOk, kNotOurs, kMismatch };
  Check check(const uint8_t* frame, uint32_t len, uint64_t* seq) {
    if (len < kHeader || frame[12] != (core::kTestEthertype >> 8) || frame[13] != (core::kTestEthertype & 0xff) ||
        std::memcmp(frame + 6, src_.data(), 6) != 0 || std::memcmp(frame + 14, kTag, 4) != 0)
      return Check::kNotOurs;
    std::memcpy(seq, frame + 18, 8);
    auto it = expected_.find(*seq);
    if (it == expected_.end()) return Check::kMismatch;  // a sequence number never sent, or twice
    bool same = it->second.size() == len && std::memcmp(it->second.data(), frame, len) == 0;
    if (same) expected_.erase(it);
    return same ? Check::kOk : Check::kMismatch;
  }

 private:
  dma::BufferPool& pool_;
  core::Mac dst_, src_;
  dma::DmaRegion region_;
  std::map<uint64_t, std::vector<uint8_t>> expected_;
};

uint32_t descs(const ufab_tx_frame& f, const GatherSpec& spec) {
  uint32_t n = spec.extra_descs;
  for (uint32_t i = 0; i < f.nsegs; ++i) {
    const ufab_tx_seg& sg = f.segs[i];
    n += spec.page_split ? static_cast<uint32_t>((sg.iova + sg.len - 1) / 4096 - sg.iova / 4096 + 1) : 1;
  }
  return n;
}

}  // namespace

GatherReport gather_transfer(Port& a, Port& b, const GatherSpec& spec, const char* label) {
  GatherReport r;
  EXPECT_TRUE(a.nic->can_gather()) << a.nic->driver().name << " does not implement tx_burst_gather";
  const core::Mac dst = mac_of(*b.nic), src = mac_of(*a.nic);
  Gatherer g(a, dst, src);
  if (!g.ok()) return r;
  std::vector<ufab_tx_frame> pending;  // built, not yet taken (pending[0] goes next)
  uint64_t built = 0, expect = 0;
  auto top_up = [&](size_t want) {
    while (pending.size() < want && built < spec.frames) {
      ufab_tx_frame f;
      if (!g.build(built, &f)) break;
      pending.push_back(f);
      ++built;
    }
  };
  auto send = [&](size_t offer) -> int {
    int n = a.nic->tx_burst_gather(0, pending.data(), static_cast<uint16_t>(std::min(offer, pending.size())));
    EXPECT_GE(n, 0) << label << ": tx_burst_gather: " << a.nic->last_error();
    if (n <= 0) return n;
    for (int i = 0; i < n; ++i) ++r.segments[pending[i].nsegs];
    pending.erase(pending.begin(), pending.begin() + n);
    r.sent += static_cast<uint64_t>(n);
    return n;
  };
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration<double>(spec.timeout_s);

  if (spec.ring_room) {
    // More than the ring holds, in one call.
    uint32_t offered_descs = 0;
    size_t offer = 0;
    std::vector<uint32_t> offered;  // descriptors of each frame offered
    while (offered_descs <= spec.ring_room) {
      top_up(offer + 1);
      if (pending.size() <= offer) break;
      offered.push_back(descs(pending[offer++], spec));
      offered_descs += offered.back();
    }
    int n = send(offer);
    if (n > 0) {
      r.first_call_frames = static_cast<uint32_t>(n);
      r.first_left_descs = static_cast<size_t>(n) < offered.size() ? offered[static_cast<size_t>(n)] : 0;
      for (int i = 0; i < n; ++i) r.first_call_descs += offered[static_cast<size_t>(i)];
    }
    if (n >= 0) {
      EXPECT_LT(static_cast<size_t>(n), offer) << label << ": the ring took a burst larger than itself";
    }
    EXPECT_LE(r.first_call_descs, spec.ring_room) << label;
    EXPECT_GT(r.first_call_descs + r.first_left_descs, spec.ring_room)
        << label << ": stopped with room left for the next whole frame";
  }

  ufab_buf* in[64];
  while (r.received < spec.frames && !(r.timed_out = Clock::now() > deadline)) {
    if (r.sent < spec.frames && r.sent < r.received + spec.window) {
      top_up(spec.burst);
      if (!pending.empty() && send(spec.burst) < 0) break;
    }
    int n = b.nic->rx_burst(0, in, 64);
    EXPECT_GE(n, 0) << label << ": rx_burst: " << b.nic->last_error();
    if (n < 0) break;
    for (int i = 0; i < n; ++i) {
      uint64_t seq = 0;
      switch (g.check(in[i]->base + in[i]->offset, in[i]->len, &seq)) {
        case Gatherer::Check::kOk:
          if (seq != expect) ++r.out_of_order;
          expect = seq + 1;
          ++r.received;
          break;
        case Gatherer::Check::kMismatch:
          if (r.mismatched++ < 5) ADD_FAILURE() << label << ": frame " << seq << " (" << in[i]->len << " B) differs";
          break;
        case Gatherer::Check::kNotOurs:
          ++r.foreign;
          break;
      }
    }
    if (n > 0) b.pool->free(in, static_cast<uint32_t>(n));
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  for (auto& f : pending) a.pool->free(&f.buf, 1);
  // The device may still read segments of frames that never arrived: stop
  // it before the payload region goes back to the allocator.
  if (r.received < r.sent) {
    EXPECT_TRUE(a.nic->stop()) << label;
  }

  std::printf("  %s: %llu/%llu gathered frames of 60..1514 B (1/2/3/4 segments: %u/%u/%u/%u) in %.2f s; "
              "first call took %u frames = %u descriptors, the next needed %u\n",
              label, static_cast<unsigned long long>(r.received), static_cast<unsigned long long>(r.sent),
              r.segments[1], r.segments[2], r.segments[3], r.segments[4], r.seconds, r.first_call_frames,
              r.first_call_descs, r.first_left_descs);
  EXPECT_FALSE(r.timed_out) << label;
  EXPECT_EQ(r.sent, spec.frames) << label;
  EXPECT_EQ(r.received, spec.frames) << label << ": lost " << r.sent - r.received;
  EXPECT_EQ(r.mismatched, 0u) << label;
  EXPECT_EQ(r.out_of_order, 0u) << label;
  return r;
}

}  // namespace ufab::vmtest
