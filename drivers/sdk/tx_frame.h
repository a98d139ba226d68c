// Driver SDK: the checks every plugin makes on a gather-transmit frame
// (abi/raw_frame.h, ABI 1.3 tx_burst_gather) before it writes a descriptor,
// so that all plugins refuse the same frames with the same words.
//
//   sdk::TxFrameCheck c = sdk::check_tx_frame(frames[i], kMinFrame, kMaxFrame);
//   if (c.fault != sdk::TxFrameFault::kNone)
//     return fail(EINVAL, "tx_burst_gather: frame " + std::to_string(i) + " " +
//                             sdk::describe(c, frames[i], kMinFrame, kMaxFrame));
//
// check_tx_frame neither allocates nor throws (it runs per frame on the hot
// path); describe builds the explanation, for the error path only.
#pragma once

#include <cstdint>
#include <string>

#include "abi/raw_frame.h"

namespace ufab::sdk {

enum class TxFrameFault : uint8_t {
  kNone,
  kNoBuffer,        // frame.buf is NULL: nothing to free at completion
  kSegmentCount,    // nsegs outside 1..UFAB_TX_SEGS_MAX
  kEmptySegment,    // a segment of 0 bytes
  kLengthMismatch,  // the segments' lengths do not add up to frame.len
  kFrameLength,     // frame.len outside the device's [min, max]
};

struct TxFrameCheck {
  TxFrameFault fault = TxFrameFault::kNone;
  uint32_t segment = 0;  // kEmptySegment: which one
  uint64_t sum = 0;      // kLengthMismatch: what the segments add up to
};

inline TxFrameCheck check_tx_frame(const ufab_tx_frame& f, uint32_t min_len, uint32_t max_len) {
  if (!f.buf) return {TxFrameFault::kNoBuffer};
  if (f.nsegs < 1 || f.nsegs > UFAB_TX_SEGS_MAX) return {TxFrameFault::kSegmentCount};
  uint64_t sum = 0;
  for (uint32_t s = 0; s < f.nsegs; ++s) {
    if (f.segs[s].len == 0) return {TxFrameFault::kEmptySegment, s};
    sum += f.segs[s].len;
  }
  if (sum != f.len) return {TxFrameFault::kLengthMismatch, 0, sum};
  if (f.len < min_len || f.len > max_len) return {TxFrameFault::kFrameLength};
  return {};
}

// What is wrong with `f` and what the caller should send instead, e.g.
// "has 5 segments; a frame has 1..4 (UFAB_TX_SEGS_MAX)".
inline std::string describe(const TxFrameCheck& c, const ufab_tx_frame& f, uint32_t min_len, uint32_t max_len) {
  switch (c.fault) {
    case TxFrameFault::kNone:
      return "is valid";
    case TxFrameFault::kNoBuffer:
      return "has no buffer (ufab_tx_frame.buf is NULL); every frame passes its own buffer, which the driver frees "
             "once the device has read the frame";
    case TxFrameFault::kSegmentCount:
      return "has " + std::to_string(f.nsegs) + " segments; a frame has 1.." + std::to_string(UFAB_TX_SEGS_MAX) +
             " (UFAB_TX_SEGS_MAX): merge segments or copy the frame into one buffer and use tx_burst";
    case TxFrameFault::kEmptySegment:
      return "has an empty segment (segment " + std::to_string(c.segment) + " of " + std::to_string(f.nsegs) +
             " is 0 bytes); leave empty segments out";
    case TxFrameFault::kLengthMismatch:
      return "says it is " + std::to_string(f.len) + " bytes but its " + std::to_string(f.nsegs) +
             " segments add up to " + std::to_string(c.sum) + "; set len to the sum of the segments' lengths";
    case TxFrameFault::kFrameLength:
      return "is " + std::to_string(f.len) + " bytes; this device sends frames of " + std::to_string(min_len) +
             ".." + std::to_string(max_len) + " bytes at its MTU";
  }
  return "is invalid";
}

}  // namespace ufab::sdk
