#include "core/roce/headers.h"

#include <algorithm>

#include "core/roce/bytes.h"

namespace ufab::roce {

EthHeader read_eth(std::span<const uint8_t, kEthBytes> in) {
  EthHeader h;
  std::copy_n(in.data(), 6, h.dst.begin());
  std::copy_n(in.data() + 6, 6, h.src.begin());
  h.ethertype = load_be16(in.data() + 12);
  return h;
}

void write_eth(std::span<uint8_t, kEthBytes> out, const EthHeader& h) {
  std::copy(h.dst.begin(), h.dst.end(), out.data());
  std::copy(h.src.begin(), h.src.end(), out.data() + 6);
  store_be16(out.data() + 12, h.ethertype);
}

Ipv4Header read_ipv4(std::span<const uint8_t, kIpv4Bytes> in) {
  const uint8_t* p = in.data();
  Ipv4Header h;
  h.version = p[0] >> 4;
  h.ihl = p[0] & 0xF;
  h.tos = p[1];
  h.total_length = load_be16(p + 2);
  h.id = load_be16(p + 4);
  uint16_t ff = load_be16(p + 6);
  h.flags = static_cast<uint8_t>(ff >> 13);
  h.fragment_offset = ff & 0x1FFF;
  h.ttl = p[8];
  h.protocol = p[9];
  h.checksum = load_be16(p + 10);
  h.src = load_be32(p + 12);
  h.dst = load_be32(p + 16);
  return h;
}

void write_ipv4(std::span<uint8_t, kIpv4Bytes> out, const Ipv4Header& h) {
  uint8_t* p = out.data();
  p[0] = static_cast<uint8_t>(((h.version & 0xF) << 4) | 5);
  p[1] = h.tos;
  store_be16(p + 2, h.total_length);
  store_be16(p + 4, h.id);
  store_be16(p + 6, static_cast<uint16_t>(((h.flags & 0x7) << 13) | (h.fragment_offset & 0x1FFF)));
  p[8] = h.ttl;
  p[9] = h.protocol;
  store_be16(p + 10, h.checksum);
  store_be32(p + 12, h.src);
  store_be32(p + 16, h.dst);
}

UdpHeader read_udp(std::span<const uint8_t, kUdpBytes> in) {
  const uint8_t* p = in.data();
  return UdpHeader{load_be16(p), load_be16(p + 2), load_be16(p + 4), load_be16(p + 6)};
}

void write_udp(std::span<uint8_t, kUdpBytes> out, const UdpHeader& h) {
  uint8_t* p = out.data();
  store_be16(p, h.sport);
  store_be16(p + 2, h.dport);
  store_be16(p + 4, h.length);
  store_be16(p + 6, h.checksum);
}

Bth read_bth(std::span<const uint8_t, kBthBytes> in) {
  const uint8_t* p = in.data();
  Bth h;
  h.opcode = p[0];
  h.se = (p[1] & 0x80) != 0;
  h.migreq = (p[1] & 0x40) != 0;
  h.pad = (p[1] >> 4) & 0x3;
  h.tver = p[1] & 0xF;
  h.pkey = load_be16(p + 2);
  h.fecn = (p[4] & 0x80) != 0;
  h.becn = (p[4] & 0x40) != 0;
  h.dest_qp = load_be24(p + 5);
  h.ack_req = (p[8] & 0x80) != 0;
  h.psn = load_be24(p + 9);
  return h;
}

void write_bth(std::span<uint8_t, kBthBytes> out, const Bth& h) {
  uint8_t* p = out.data();
  p[0] = h.opcode;
  p[1] = static_cast<uint8_t>((h.se ? 0x80 : 0) | (h.migreq ? 0x40 : 0) | ((h.pad & 0x3) << 4) |
                              (h.tver & 0xF));
  store_be16(p + 2, h.pkey);
  p[4] = static_cast<uint8_t>((h.fecn ? 0x80 : 0) | (h.becn ? 0x40 : 0));
  store_be24(p + 5, h.dest_qp & 0xFFFFFF);
  p[8] = h.ack_req ? 0x80 : 0;
  store_be24(p + 9, h.psn & 0xFFFFFF);
}

Reth read_reth(std::span<const uint8_t, kRethBytes> in) {
  const uint8_t* p = in.data();
  return Reth{load_be64(p), load_be32(p + 8), load_be32(p + 12)};
}

void write_reth(std::span<uint8_t, kRethBytes> out, const Reth& h) {
  store_be64(out.data(), h.va);
  store_be32(out.data() + 8, h.rkey);
  store_be32(out.data() + 12, h.dma_length);
}

Aeth read_aeth(std::span<const uint8_t, kAethBytes> in) {
  return Aeth{in[0], load_be24(in.data() + 1)};
}

void write_aeth(std::span<uint8_t, kAethBytes> out, const Aeth& h) {
  out[0] = h.syndrome;
  store_be24(out.data() + 1, h.msn & 0xFFFFFF);
}

AtomicEth read_atomic_eth(std::span<const uint8_t, kAtomicEthBytes> in) {
  const uint8_t* p = in.data();
  return AtomicEth{load_be64(p), load_be32(p + 8), load_be64(p + 12), load_be64(p + 20)};
}

void write_atomic_eth(std::span<uint8_t, kAtomicEthBytes> out, const AtomicEth& h) {
  uint8_t* p = out.data();
  store_be64(p, h.va);
  store_be32(p + 8, h.rkey);
  store_be64(p + 12, h.swap_add);
  store_be64(p + 20, h.compare);
}

AtomicAckEth read_atomic_ack_eth(std::span<const uint8_t, kAtomicAckEthBytes> in) {
  return AtomicAckEth{load_be64(in.data())};
}

void write_atomic_ack_eth(std::span<uint8_t, kAtomicAckEthBytes> out, const AtomicAckEth& h) {
  store_be64(out.data(), h.original);
}

ImmDt read_immdt(std::span<const uint8_t, kImmDtBytes> in) { return ImmDt{load_be32(in.data())}; }
void write_immdt(std::span<uint8_t, kImmDtBytes> out, const ImmDt& h) { store_be32(out.data(), h.imm); }

Deth read_deth(std::span<const uint8_t, kDethBytes> in) {
  return Deth{load_be32(in.data()), load_be24(in.data() + 5)};
}

void write_deth(std::span<uint8_t, kDethBytes> out, const Deth& h) {
  store_be32(out.data(), h.qkey);
  out[4] = 0;
  store_be24(out.data() + 5, h.src_qp & 0xFFFFFF);
}

Ieth read_ieth(std::span<const uint8_t, kIethBytes> in) { return Ieth{load_be32(in.data())}; }
void write_ieth(std::span<uint8_t, kIethBytes> out, const Ieth& h) { store_be32(out.data(), h.rkey); }

// Reserved bits 31:6 are ignored on read and written as zero.
Feth read_feth(std::span<const uint8_t, kFethBytes> in) {
  const uint32_t v = load_be32(in.data());
  return Feth{static_cast<uint8_t>(v & feth::kPlacementMask), static_cast<uint8_t>((v >> 4) & feth::kSelectivityMask)};
}
void write_feth(std::span<uint8_t, kFethBytes> out, const Feth& h) {
  store_be32(out.data(), uint32_t(h.placement_type & feth::kPlacementMask) |
                             (uint32_t(h.selectivity_level & feth::kSelectivityMask) << 4));
}

namespace feth {

const char* placement_name(uint8_t t) {
  switch (t) {
    case kGlobal: return "GLOBAL";
    case kPersistent: return "PERSISTENT";
    case kGlobal | kPersistent: return "GLOBAL|PERSISTENT";
    case 0: return "none (type 0)";
    default: return "undefined type bits";
  }
}

const char* selectivity_name(uint8_t s) {
  switch (s) {
    case kRange: return "RANGE";
    case kWholeRegion: return "whole region (MR)";
    default: return "undefined selectivity";
  }
}

}  // namespace feth

bool read_ext_headers(uint16_t mask, std::span<const uint8_t> in, ExtHeaders& out) {
  if (in.size() < ext_headers_size(mask)) return false;
  const uint8_t* p = in.data();
  // Wire order is the ExtHeader declaration order (see opcodes.h).
  if (mask & kDeth) out.deth = read_deth(std::span<const uint8_t, kDethBytes>(p, kDethBytes)), p += kDethBytes;
  if (mask & kFeth) out.feth = read_feth(std::span<const uint8_t, kFethBytes>(p, kFethBytes)), p += kFethBytes;
  if (mask & kReth) out.reth = read_reth(std::span<const uint8_t, kRethBytes>(p, kRethBytes)), p += kRethBytes;
  if (mask & kAtomicEth) {
    out.atomic_eth = read_atomic_eth(std::span<const uint8_t, kAtomicEthBytes>(p, kAtomicEthBytes));
    p += kAtomicEthBytes;
  }
  if (mask & kAeth) out.aeth = read_aeth(std::span<const uint8_t, kAethBytes>(p, kAethBytes)), p += kAethBytes;
  if (mask & kAtomicAckEth) {
    out.atomic_ack = read_atomic_ack_eth(std::span<const uint8_t, kAtomicAckEthBytes>(p, kAtomicAckEthBytes));
    p += kAtomicAckEthBytes;
  }
  if (mask & kImmDt) out.immdt = read_immdt(std::span<const uint8_t, kImmDtBytes>(p, kImmDtBytes)), p += kImmDtBytes;
  if (mask & kIeth) out.ieth = read_ieth(std::span<const uint8_t, kIethBytes>(p, kIethBytes));
  return true;
}

bool write_ext_headers(uint16_t mask, std::span<uint8_t> out, const ExtHeaders& h) {
  if (out.size() < ext_headers_size(mask)) return false;
  uint8_t* p = out.data();
  if (mask & kDeth) write_deth(std::span<uint8_t, kDethBytes>(p, kDethBytes), h.deth), p += kDethBytes;
  if (mask & kFeth) write_feth(std::span<uint8_t, kFethBytes>(p, kFethBytes), h.feth), p += kFethBytes;
  if (mask & kReth) write_reth(std::span<uint8_t, kRethBytes>(p, kRethBytes), h.reth), p += kRethBytes;
  if (mask & kAtomicEth) {
    write_atomic_eth(std::span<uint8_t, kAtomicEthBytes>(p, kAtomicEthBytes), h.atomic_eth);
    p += kAtomicEthBytes;
  }
  if (mask & kAeth) write_aeth(std::span<uint8_t, kAethBytes>(p, kAethBytes), h.aeth), p += kAethBytes;
  if (mask & kAtomicAckEth) {
    write_atomic_ack_eth(std::span<uint8_t, kAtomicAckEthBytes>(p, kAtomicAckEthBytes), h.atomic_ack);
    p += kAtomicAckEthBytes;
  }
  if (mask & kImmDt) write_immdt(std::span<uint8_t, kImmDtBytes>(p, kImmDtBytes), h.immdt), p += kImmDtBytes;
  if (mask & kIeth) write_ieth(std::span<uint8_t, kIethBytes>(p, kIethBytes), h.ieth);
  return true;
}

namespace {

// One's complement sum of big-endian 16-bit words, not yet folded. A
// 64-bit accumulator cannot overflow for anything shorter than 2^48 bytes.
uint64_t sum16(const uint8_t* p, size_t n, uint64_t acc) {
  while (n >= 2) {
    acc += load_be16(p);
    p += 2;
    n -= 2;
  }
  if (n) acc += uint64_t{p[0]} << 8;  // odd byte: pad with a zero byte
  return acc;
}

uint16_t fold(uint64_t acc) {
  while (acc >> 16) acc = (acc & 0xFFFF) + (acc >> 16);
  return static_cast<uint16_t>(acc);
}

}  // namespace

uint16_t ipv4_header_checksum(std::span<const uint8_t, kIpv4Bytes> hdr) {
  uint64_t acc = sum16(hdr.data(), 10, 0);
  acc = sum16(hdr.data() + 12, 8, acc);
  return static_cast<uint16_t>(~fold(acc));
}

bool ipv4_header_checksum_ok(std::span<const uint8_t, kIpv4Bytes> hdr) {
  return fold(sum16(hdr.data(), kIpv4Bytes, 0)) == 0xFFFF;
}

bool udp_checksum_ok(uint32_t src_ip, uint32_t dst_ip, std::span<const uint8_t> udp) {
  if (udp.size() < kUdpBytes) return false;
  if (load_be16(udp.data() + 6) == 0) return true;  // no checksum
  uint64_t acc = (src_ip >> 16) + (src_ip & 0xFFFF) + (dst_ip >> 16) + (dst_ip & 0xFFFF);
  acc += kIpProtoUdp;
  acc += udp.size();
  acc = sum16(udp.data(), udp.size(), acc);
  return fold(acc) == 0xFFFF;
}

namespace aeth {

uint32_t rnr_timer_usec(uint8_t timer) {
  // IBA vol. 1 table 45, "RNR NAK timer field encodings", in microseconds.
  static constexpr uint32_t kUsec[32] = {
      655360, 10,    20,    30,    40,    60,    80,     120,    160,    240,    320,
      480,    640,   960,   1280,  1920,  2560,  3840,   5120,   7680,   10240,  15360,
      20480,  30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520,
  };
  return kUsec[timer & 0x1F];
}

const char* nak_code_name(uint8_t code) {
  switch (code & 0x1F) {
    case 0: return "PSN sequence error";
    case 1: return "invalid request";
    case 2: return "remote access error";
    case 3: return "remote operational error";
    case 4: return "invalid RD request";
    default: return "reserved NAK code";
  }
}

}  // namespace aeth

uint32_t rxe_active_mtu(uint32_t netdev_mtu) {
  // rxe.c rxe_set_mtu -> eth_mtu_int_to_enum: subtract RXE_MAX_HDR_LENGTH
  // (80) and round down to an IB MTU; below 256 it falls back to 256.
  constexpr uint32_t kRxeMaxHdr = 80;
  if (netdev_mtu < kRxeMaxHdr + 256) return 256;
  uint32_t room = netdev_mtu - kRxeMaxHdr;
  uint32_t mtu = 4096;
  while (mtu > room) mtu >>= 1;
  return mtu;
}

}  // namespace ufab::roce
