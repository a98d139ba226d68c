// swnic fault injection: what happens to the Nth frame a port transmits.
//
// Decisions are a pure function of (seed, frame index), the index counting
// frames tx_burst has taken since open. A frame that does not fit in the
// ring is not taken, and its decision is drawn again, identically, on the
// next call: the faults a run sees depend on the seed and on the frames
// sent, never on timing.
#pragma once

#include <cstdint>

namespace ufab::swnic {

struct FaultConfig {
  double loss = 0;     // probability a frame is dropped
  double dup = 0;      // probability a frame is sent twice
  double reorder = 0;  // probability a frame is held back and sent after the next one
  double corrupt = 0;  // probability one bit of the frame (past the Ethernet header) flips
  uint64_t seed = 0;

  bool enabled() const { return loss > 0 || dup > 0 || reorder > 0 || corrupt > 0; }
};

struct FaultDecision {
  bool lose = false;
  bool dup = false;
  bool hold = false;
  bool corrupt = false;
  uint64_t bit_draw = 0;  // picks the bit to flip
};

constexpr uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Uniform in [0, 1) from the top 53 bits.
constexpr double unit_interval(uint64_t r) { return static_cast<double>(r >> 11) * 0x1.0p-53; }

constexpr FaultDecision decide_fault(const FaultConfig& c, uint64_t index) {
  uint64_t state = c.seed ^ (index * 0xd1b54a32d192ed03ull);
  // Mix once so nearby indices do not start from nearby states.
  splitmix64(state);
  FaultDecision d;
  d.lose = unit_interval(splitmix64(state)) < c.loss;
  d.dup = unit_interval(splitmix64(state)) < c.dup;
  d.hold = unit_interval(splitmix64(state)) < c.reorder;
  d.corrupt = unit_interval(splitmix64(state)) < c.corrupt;
  d.bit_draw = splitmix64(state);
  return d;
}

// Which bit of a frame of `len` bytes to flip: uniform over the bytes past
// the 14-byte Ethernet header (over the whole frame when it is that short),
// so corruption lands where a checksum such as RoCEv2's ICRC must catch it
// rather than in the addresses that decide who receives the frame.
constexpr uint32_t corrupt_bit(uint32_t len, uint64_t draw) {
  uint32_t first = len > 14 ? 14 : 0;
  uint64_t bits = uint64_t{len - first} * 8;
  return static_cast<uint32_t>(first * 8 + draw % bits);
}

}  // namespace ufab::swnic
