// Test traffic between two raw ports: frames that carry a sequence number and
// a checksum, and a bounded send/receive loop that verifies every frame. Used
// by `ufab pktgen` and by the driver tests.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "base/error.h"
#include "core/nic.h"

namespace ufab::core {

inline constexpr uint16_t kTestEthertype = 0x88b5;  // IEEE local experimental
inline constexpr uint32_t kMinTestFrame = 60;       // Ethernet minimum without FCS
inline constexpr uint32_t kMaxTestFrame = 1514;

using Mac = std::array<uint8_t, 6>;

// How much of each frame is written and verified. kFull fills the payload
// with a pattern and checks a checksum over the whole frame; kHeader writes
// and checks only the 32-byte header (addresses, stream, sequence, length),
// as a packet generator such as DPDK's testpmd txonly does, so a rate
// measurement is not a measurement of memset and checksum loops.
enum class Verify { kFull, kHeader };

// Writes a test frame of `len` bytes (kMinTestFrame..kMaxTestFrame) at `out`.
void build_test_frame(uint8_t* out, uint32_t len, const Mac& dst, const Mac& src, uint32_t stream, uint64_t seq,
                      Verify verify = Verify::kFull);

enum class FrameCheck { kOk, kNotOurs, kCorrupt };
// kNotOurs: another ethertype, stream or source (other traffic on the wire).
FrameCheck check_test_frame(const uint8_t* frame, uint32_t len, const Mac& src, uint32_t stream, uint64_t* seq,
                            Verify verify = Verify::kFull);

struct TransferSpec {
  uint64_t frames = 100000;
  uint32_t min_size = kMinTestFrame;  // sizes cycle deterministically through [min, max]
  uint32_t max_size = kMaxTestFrame;
  uint16_t burst = 32;
  double timeout_s = 60;              // bound on the whole transfer
  double duration_s = 0;              // > 0: send for this long instead of `frames`
  uint32_t stream = 1;
  Verify verify = Verify::kFull;
};

struct TransferReport {
  uint64_t sent = 0;
  uint64_t received = 0;
  uint64_t bytes_received = 0;  // frame bytes, without FCS
  uint64_t out_of_order = 0;
  uint64_t corrupt = 0;
  uint64_t foreign = 0;  // frames that were not ours (ignored)
  double seconds = 0;    // from the first send to the last frame received
  bool timed_out = false;
  double frames_per_second() const { return seconds > 0 ? received / seconds : 0; }
  double bits_per_second() const { return seconds > 0 ? bytes_received * 8 / seconds : 0; }
  bool intact() const { return !timed_out && received == sent && out_of_order == 0 && corrupt == 0; }
};

// Sends from `tx` queue 0 to `rx` queue 0 (both started, with pools), one
// thread polling both. Stops when all sent frames arrived or the timeout hits.
Result<TransferReport> run_transfer(Nic& tx, dma::BufferPool& tx_pool, Nic& rx, dma::BufferPool& rx_pool,
                                    const TransferSpec& spec);

}  // namespace ufab::core
