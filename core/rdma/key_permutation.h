// A secret permutation of the 24-bit index field of memory keys.
//
// Slots of the region table are handed out in a predictable order (fresh
// slots count up, freed slots come back in FIFO order). Putting the slot
// number itself into the key would let a peer that holds one rkey guess the
// index of the next region exactly, leaving only the 8-bit key byte to
// guess. The table therefore publishes P(generation:slot) instead, where P
// is a bijection of [0, 2^24) chosen at random per table and the
// generation (the index bits the slot number does not need) is drawn anew
// each time a slot is reused.
//
// P is a 4-round balanced Feistel network on two 12-bit halves whose round
// function is a keyed multiply-shift hash with random keys. Any round
// function gives a bijection (that is the point of the Feistel shape), so
// lookups stay exact; the keyed hashing only makes P hard to predict from
// a few observed outputs. It is not a cipher with a security proof: a
// 24-bit block is far too small for that, and docs/memory-keys.md says how
// much it is worth.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace ufab::verbs {

class KeyPermutation {
 public:
  static constexpr uint32_t kBits = 24;
  static constexpr uint32_t kMask = (1u << kBits) - 1;
  static constexpr size_t kRounds = 4;
  // Two random words per round: an addend and a multiplier.
  using Keys = std::array<uint64_t, 2 * kRounds>;

  KeyPermutation() = default;  // all-zero keys: still a bijection, for tests
  explicit KeyPermutation(const Keys& keys) : keys_(keys) {
    for (size_t i = 1; i < keys_.size(); i += 2) keys_[i] |= 1;  // odd multipliers
  }

  // Slot number -> published index. Bits above 24 of `x` are ignored.
  uint32_t forward(uint32_t x) const {
    uint32_t l = (x >> 12) & 0xFFF;
    uint32_t r = x & 0xFFF;
    for (size_t i = 0; i < kRounds; ++i) {
      uint32_t t = l ^ round(r, i);
      l = r;
      r = t;
    }
    return (l << 12) | r;
  }

  // Published index -> slot number; inverse(forward(x)) == x for x < 2^24.
  uint32_t inverse(uint32_t y) const {
    uint32_t l = (y >> 12) & 0xFFF;
    uint32_t r = y & 0xFFF;
    for (size_t i = kRounds; i-- > 0;) {
      uint32_t t = r ^ round(l, i);
      r = l;
      l = t;
    }
    return (l << 12) | r;
  }

 private:
  // 12 bits of a keyed multiply-shift hash of the 12-bit half: one
  // multiply per round keeps a lookup at a few nanoseconds, and the top
  // bits of (half + a) * m with random a and odd m depend on every input
  // bit.
  uint32_t round(uint32_t half, size_t i) const {
    uint64_t z = (uint64_t{half} + keys_[2 * i]) * keys_[2 * i + 1];
    return static_cast<uint32_t>(z >> 52);
  }

  Keys keys_{};
};

}  // namespace ufab::verbs
