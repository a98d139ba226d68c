#include "core/traffic.h"

#include <chrono>
#include <cstring>

namespace ufab::core {
namespace {

constexpr uint32_t kMagic = 0x55464142;  // "UFAB"
// Header: dst 6, src 6, ethertype 2, magic 4, stream 4, seq 8, len 2 = 32;
// checksum (FNV-1a over everything before it) in the last 4 bytes.
constexpr uint32_t kHeader = 32;

uint32_t fnv1a(const uint8_t* p, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 16777619u;
  return h;
}

void put32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }
uint32_t get32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

using Clock = std::chrono::steady_clock;

}  // namespace

void build_test_frame(uint8_t* out, uint32_t len, const Mac& dst, const Mac& src, uint32_t stream, uint64_t seq,
                      Verify verify) {
  std::memcpy(out, dst.data(), 6);
  std::memcpy(out + 6, src.data(), 6);
  out[12] = kTestEthertype >> 8;
  out[13] = kTestEthertype & 0xff;
  put32(out + 14, kMagic);
  put32(out + 18, stream);
  std::memcpy(out + 22, &seq, 8);
  out[30] = static_cast<uint8_t>(len);
  out[31] = static_cast<uint8_t>(len >> 8);
  if (verify == Verify::kHeader) return;
  for (uint32_t i = kHeader; i < len - 4; ++i) out[i] = static_cast<uint8_t>(seq * 31 + i);
  put32(out + len - 4, fnv1a(out, len - 4));
}

FrameCheck check_test_frame(const uint8_t* frame, uint32_t len, const Mac& src, uint32_t stream, uint64_t* seq,
                            Verify verify) {
  if (len < kMinTestFrame || frame[12] != (kTestEthertype >> 8) || frame[13] != (kTestEthertype & 0xff) ||
      std::memcmp(frame + 6, src.data(), 6) != 0 || get32(frame + 14) != kMagic || get32(frame + 18) != stream) {
    return FrameCheck::kNotOurs;
  }
  uint32_t declared = frame[30] | frame[31] << 8;
  if (declared != len) return FrameCheck::kCorrupt;
  if (verify == Verify::kFull && get32(frame + len - 4) != fnv1a(frame, len - 4)) return FrameCheck::kCorrupt;
  std::memcpy(seq, frame + 22, 8);
  return FrameCheck::kOk;
}

Result<TransferReport> run_transfer(Nic& tx, dma::BufferPool& tx_pool, Nic& rx, dma::BufferPool& rx_pool,
                                    const TransferSpec& spec) {
  if (spec.min_size < kMinTestFrame || spec.max_size > kMaxTestFrame || spec.min_size > spec.max_size) {
    return fail(EINVAL, "frame sizes must lie within " + std::to_string(kMinTestFrame) + ".." +
                            std::to_string(kMaxTestFrame) + " bytes");
  }
  if (spec.burst == 0 || spec.burst > 256) return fail(EINVAL, "burst must be 1..256");
  Mac dst, src;
  std::memcpy(dst.data(), rx.info().mac, 6);
  std::memcpy(src.data(), tx.info().mac, 6);

  TransferReport rep;
  const uint32_t span = spec.max_size - spec.min_size + 1;
  // Sizes step by a prime so a run covers the whole range in every order.
  auto size_of = [&](uint64_t seq) { return spec.min_size + static_cast<uint32_t>((seq * 997) % span); };
  uint64_t next_expected = 0;
  ufab_buf* bufs[256];
  ufab_buf* pending[256];
  uint32_t pending_count = 0;

  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration<double>(spec.timeout_s);
  const auto send_until = start + std::chrono::duration<double>(spec.duration_s);
  auto last_rx = start;
  bool sending = true;
  for (uint64_t iter = 0;; ++iter) {
    if ((iter & 63) == 0) {  // reading the clock every iteration would cost more than a burst
      auto now = Clock::now();
      if (now > deadline) {
        rep.timed_out = true;
        break;
      }
      if (spec.duration_s > 0 && now > send_until) sending = false;
    }
    if (spec.duration_s <= 0 && rep.sent >= spec.frames) sending = false;
    if (!sending && pending_count > 0) {  // a timed run ended with frames not yet taken
      tx_pool.free(pending, pending_count);
      pending_count = 0;
    }
    if (sending && pending_count == 0) {
      uint32_t want = spec.burst;
      if (spec.duration_s <= 0) want = static_cast<uint32_t>(std::min<uint64_t>(want, spec.frames - rep.sent));
      pending_count = tx_pool.alloc(pending, want);
      for (uint32_t i = 0; i < pending_count; ++i) {
        uint64_t seq = rep.sent + i;
        uint32_t len = size_of(seq);
        build_test_frame(pending[i]->base + pending[i]->offset, len, dst, src, spec.stream, seq, spec.verify);
        pending[i]->len = len;
      }
    }
    if (pending_count > 0) {
      int n = tx.tx_burst(0, pending, static_cast<uint16_t>(pending_count));
      if (n < 0) return fail(-n, "transmit on " + tx.name() + " failed: " + tx.last_error());
      rep.sent += static_cast<uint64_t>(n);
      std::memmove(pending, pending + n, (pending_count - n) * sizeof(ufab_buf*));
      pending_count -= static_cast<uint32_t>(n);
    }
    // Drain the receiver each round (bounded): a full RX ring makes QEMU hold
    // frames back and deliver them out of order when the ring is refilled.
    int got = 0;
    for (int round = 0; round < 64; ++round) {
      int n = rx.rx_burst(0, bufs, spec.burst);
      if (n < 0) return fail(-n, "receive on " + rx.name() + " failed: " + rx.last_error());
      for (int i = 0; i < n; ++i) {
        uint64_t seq = 0;
        switch (check_test_frame(bufs[i]->base + bufs[i]->offset, bufs[i]->len, src, spec.stream, &seq, spec.verify)) {
          case FrameCheck::kNotOurs:
            ++rep.foreign;
            break;
          case FrameCheck::kCorrupt:
            ++rep.corrupt;
            ++rep.received;
            break;
          case FrameCheck::kOk:
            if (seq != next_expected) ++rep.out_of_order;
            next_expected = seq + 1;
            ++rep.received;
            rep.bytes_received += bufs[i]->len;
            break;
        }
      }
      if (n > 0) rx_pool.free(bufs, static_cast<uint32_t>(n));
      got += n;
      if (n < spec.burst) break;
    }
    if (got > 0) last_rx = Clock::now();
    if (!sending && pending_count == 0) {
      if (rep.received >= rep.sent) break;
      // Frames still in flight get a bounded grace period; lost ones never come.
      if (got == 0 && Clock::now() - last_rx > std::chrono::milliseconds(500)) break;
    }
  }
  if (pending_count > 0) tx_pool.free(pending, pending_count);  // timed out
  rep.seconds = std::chrono::duration<double>(last_rx - start).count();
  return rep;
}

}  // namespace ufab::core
