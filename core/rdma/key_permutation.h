// A secret permutation of the 24-bit index field of memory keys.
//
// Slots of the region table are handed out in a predictable order (fresh
// slots count up, freed slots come back in FIFO order). Putting the slot
// number itself into the key would let a peer that holds one rkey guess the
// index of the next region exactly, leaving only the 8-bit key byte to
// guess. The table therefore publishes P(slot) instead of slot, where P is a
// bijection of [0, 2^24) chosen at random per table.
//
// P is a 4-round balanced Feistel network on two 12-bit halves whose round
// function is a 64-bit mixer keyed with random round keys. Any round
// function gives a bijection (that is the point of the Feistel shape), so
// lookups stay exact; the mixing only makes P hard to predict from a few
// observed outputs. It is not a cipher with a security proof: a 24-bit
// block is far too small for that, and docs/memory-keys.md says how much it
// is worth.
#pragma once

#include <array>
#include <cstdint>

namespace ufab::rdma {

class KeyPermutation {
 public:
  static constexpr uint32_t kBits = 24;
  static constexpr uint32_t kMask = (1u << kBits) - 1;

  KeyPermutation() = default;  // all-zero round keys: still a bijection, for tests
  explicit KeyPermutation(const std::array<uint64_t, 4>& round_keys) : keys_(round_keys) {}

  // Slot number -> published index. Bits above 24 of `x` are ignored.
  uint32_t forward(uint32_t x) const {
    uint32_t l = (x >> 12) & 0xFFF;
    uint32_t r = x & 0xFFF;
    for (uint64_t k : keys_) {
      uint32_t t = l ^ round(r, k);
      l = r;
      r = t;
    }
    return (l << 12) | r;
  }

  // Published index -> slot number; inverse(forward(x)) == x for x < 2^24.
  uint32_t inverse(uint32_t y) const {
    uint32_t l = (y >> 12) & 0xFFF;
    uint32_t r = y & 0xFFF;
    for (int i = static_cast<int>(keys_.size()) - 1; i >= 0; --i) {
      uint32_t t = r ^ round(l, keys_[static_cast<size_t>(i)]);
      r = l;
      l = t;
    }
    return (l << 12) | r;
  }

 private:
  // 12 well-mixed bits of (half, key): the SplitMix64 finalizer (a public
  // multiply-xorshift mixer), top bits taken because they mix best.
  static uint32_t round(uint32_t half, uint64_t key) {
    uint64_t z = key ^ (uint64_t{half} * 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return static_cast<uint32_t>(z >> 52);
  }

  std::array<uint64_t, 4> keys_{};
};

}  // namespace ufab::rdma
