// Helpers shared by the RoCE wire unit tests.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "core/roce/bytes.h"
#include "core/roce/wire.h"
#include "tests/unit/roce/vectors.h"

namespace ufab::roce::testing {

// The FrameSpec a Python vector was built from.
inline FrameSpec spec_from_vector(const testdata::IcrcVector& v) {
  FrameSpec s;
  s.dst_mac = v.dst_mac;
  s.src_mac = v.src_mac;
  s.src_ip = v.src_ip;
  s.dst_ip = v.dst_ip;
  s.traffic_class = v.tos;
  s.hop_limit = v.ttl;
  s.ip_id = v.ip_id;
  s.udp_sport = v.sport;
  s.bth.opcode = v.opcode;
  s.bth.se = v.se;
  s.bth.migreq = v.migreq;
  s.bth.pkey = v.pkey;
  s.bth.fecn = v.fecn;
  s.bth.becn = v.becn;
  s.bth.dest_qp = v.dest_qp;
  s.bth.ack_req = v.ack_req;
  s.bth.psn = v.psn;
  s.ext.reth = Reth{v.va, v.rkey, v.dma_len};
  s.ext.atomic_eth = AtomicEth{v.va, v.rkey, v.swap_add, v.compare};
  s.ext.aeth = Aeth{v.syndrome, v.msn};
  s.ext.atomic_ack = AtomicAckEth{v.orig};
  s.ext.immdt = ImmDt{v.imm};
  s.ext.deth = Deth{v.qkey, v.src_qp};
  s.ext.ieth = Ieth{v.inv_rkey};
  s.ext.feth = Feth::make(v.feth & 0xF, (v.feth >> 4) & 0x3);
  return s;
}

inline std::span<const uint8_t> vector_frame(const testdata::IcrcVector& v) { return {v.frame, v.frame_len}; }

inline std::span<const uint8_t> vector_payload(const testdata::IcrcVector& v) {
  return vector_frame(v).subspan(header_length(v.opcode), v.payload_len);
}

// A spec with every field set to something non-trivial and random.
inline FrameSpec random_spec(std::mt19937_64& rng, uint8_t opcode) {
  auto u32 = [&] { return static_cast<uint32_t>(rng()); };
  FrameSpec s;
  for (auto& b : s.dst_mac) b = static_cast<uint8_t>(rng());
  for (auto& b : s.src_mac) b = static_cast<uint8_t>(rng());
  s.src_ip = u32();
  s.dst_ip = u32();
  s.traffic_class = static_cast<uint8_t>(rng());
  s.hop_limit = static_cast<uint8_t>(rng());
  s.ip_id = static_cast<uint16_t>(rng());
  s.ip_flags = (rng() & 1) ? kIpFlagDontFragment : 0;
  s.udp_sport = static_cast<uint16_t>(rng());
  s.bth.opcode = opcode;
  s.bth.se = rng() & 1;
  s.bth.migreq = rng() & 1;
  s.bth.pkey = static_cast<uint16_t>(rng());
  s.bth.fecn = rng() & 1;
  s.bth.becn = rng() & 1;
  s.bth.dest_qp = u32() & 0xFFFFFF;
  s.bth.ack_req = rng() & 1;
  s.bth.psn = u32() & 0xFFFFFF;
  s.ext.deth = Deth{u32(), u32() & 0xFFFFFF};
  s.ext.feth = Feth::make(u32() & feth::kPlacementMask, u32() & feth::kSelectivityMask);
  s.ext.reth = Reth{rng(), u32(), u32()};
  s.ext.atomic_eth = AtomicEth{rng(), u32(), rng(), rng()};
  s.ext.aeth = Aeth{static_cast<uint8_t>(rng()), u32() & 0xFFFFFF};
  s.ext.atomic_ack = AtomicAckEth{rng()};
  s.ext.immdt = ImmDt{u32()};
  s.ext.ieth = Ieth{u32()};
  return s;
}

inline std::vector<uint8_t> build(const FrameSpec& s, std::span<const uint8_t> payload) {
  std::vector<uint8_t> out(frame_length(s.bth.opcode, payload.size()) + 16);
  BuildResult r = build_frame(s, payload, out);
  out.resize(r ? r.length : 0);
  return out;
}

// After a test edits a frame: recompute the IPv4 header checksum and, when
// the IPv4 total length allows, the ICRC in its last four bytes.
inline void fix_checksums(std::vector<uint8_t>& f) {
  if (f.size() < kEthBytes + kIpv4Bytes) return;
  auto iph = std::span<uint8_t, kIpv4Bytes>(f.data() + kEthBytes, kIpv4Bytes);
  store_be16(iph.data() + 10, ipv4_header_checksum(iph));
  size_t total = load_be16(iph.data() + 2);
  if (total >= kIcrcHeaderBytes + kIcrcBytes && kEthBytes + total <= f.size()) {
    uint32_t crc = icrc_ipv4(std::span<const uint8_t>(f.data() + kEthBytes, total - kIcrcBytes));
    store_le32(f.data() + kEthBytes + total - kIcrcBytes, crc);
  }
}

}  // namespace ufab::roce::testing
