// libFuzzer target for the RoCEv2 parser (core/roce/parser.h).
//
// Properties checked on every input:
//   1. parse_frame never crashes, reads nothing outside the input (ASan) and
//      does nothing undefined (UBSan);
//   2. an accepted packet is self-consistent: offsets and the payload view
//      lie inside the frame and add up;
//   3. round trip: a packet that parses (with all checks, and again with the
//      checksum checks off so mutated frames get deep) is rebuilt from its
//      parsed fields; the rebuilt frame must parse with every check on to
//      the same fields, and rebuilding that gives the same bytes;
//   4. the three CRC implementations agree on the input.
// A violated property aborts with a message, which libFuzzer reports as a
// crash and saves the input.
//
// Build and run: tests/fuzz/run.sh [seconds]. The same file also builds
// with gcc into //tests/fuzz:roce_parse_corpus_test, which replays the seed
// corpus.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "core/roce/builder.h"
#include "core/roce/icrc.h"
#include "core/roce/parser.h"

namespace {

using namespace ufab::roce;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "roce_parse_fuzzer: property violated: %s\n", what);
  std::abort();
}

void check(bool ok, const char* what) {
  if (!ok) fail(what);
}

void check_consistent(std::span<const uint8_t> in, const Packet& p) {
  check(p.op != nullptr && p.op->opcode == p.bth.opcode, "accepted packet has its opcode's table entry");
  check(p.frame_length <= in.size(), "frame_length within the input");
  check(p.frame_length == kEthBytes + p.ip.total_length, "frame_length is Ethernet + IPv4 total length");
  check(p.payload_offset == kBthOffset + kBthBytes + p.op->ext_bytes(), "payload offset after the headers");
  check(p.payload.data() == in.data() + p.payload_offset, "payload view starts at payload_offset");
  check(p.payload_offset + p.payload.size() + p.bth.pad == p.icrc_offset, "payload + pad end at the ICRC");
  check(p.icrc_offset + kIcrcBytes == p.frame_length, "ICRC ends the datagram");
  check(p.bth.pad == pad_for(p.payload.size()), "pad is the payload's pad");
  check(p.bth.tver == 0, "TVer 0");
  check(p.udp.dport == kRoceV2Port, "RoCEv2 port");
}

FrameSpec spec_of(const Packet& p) {
  FrameSpec s;
  s.dst_mac = p.eth.dst;
  s.src_mac = p.eth.src;
  s.src_ip = p.ip.src;
  s.dst_ip = p.ip.dst;
  s.traffic_class = p.ip.tos;
  s.hop_limit = p.ip.ttl;
  s.ip_id = p.ip.id;
  s.ip_flags = p.ip.flags;
  s.udp_sport = p.udp.sport;
  s.bth = p.bth;
  s.ext = p.ext;
  return s;
}

bool same_ext(uint16_t mask, const ExtHeaders& a, const ExtHeaders& b) {
  return (!(mask & kDeth) || a.deth == b.deth) && (!(mask & kFeth) || a.feth == b.feth) &&
         (!(mask & kReth) || a.reth == b.reth) && (!(mask & kAtomicEth) || a.atomic_eth == b.atomic_eth) &&
         (!(mask & kAeth) || a.aeth == b.aeth) && (!(mask & kAtomicAckEth) || a.atomic_ack == b.atomic_ack) &&
         (!(mask & kImmDt) || a.immdt == b.immdt) && (!(mask & kIeth) || a.ieth == b.ieth);
}

void round_trip(const Packet& p) {
  FrameSpec s = spec_of(p);
  std::vector<uint8_t> a(frame_length(p.bth.opcode, p.payload.size()));
  BuildResult b = build_frame(s, p.payload, a);
  if (!b) {
    std::fprintf(stderr, "build_frame: %s\n", build_error_name(b.error));
    fail("a parsed packet can be rebuilt");
  }
  check(b.length == a.size() && b.length == p.frame_length, "rebuilt frame has the original length");

  Packet q;
  ParseError e = parse_frame(a, q);
  if (e != ParseError::kOk) {
    std::fprintf(stderr, "rebuilt frame rejected: %s\n", parse_error_name(e));
    fail("a rebuilt frame parses with every check");
  }
  // Checksums are recomputed by the builder (UDP goes to 0, as rxe sends);
  // every other field must survive.
  Ipv4Header ip0 = p.ip, ip1 = q.ip;
  ip0.checksum = ip1.checksum = 0;
  check(q.eth == p.eth, "Ethernet header survives");
  check(ip1 == ip0, "IPv4 fields survive");
  check(q.udp.sport == p.udp.sport && q.udp.dport == p.udp.dport && q.udp.length == p.udp.length,
        "UDP fields survive");
  check(q.udp.checksum == 0, "rebuilt UDP checksum is 0");
  check(q.bth == p.bth, "BTH survives");
  check(q.op == p.op, "opcode entry survives");
  check(same_ext(p.op->headers, p.ext, q.ext), "extension headers survive");
  check(q.payload.size() == p.payload.size() &&
            (p.payload.empty() || std::memcmp(q.payload.data(), p.payload.data(), p.payload.size()) == 0),
        "payload survives");

  std::vector<uint8_t> c(a.size());
  BuildResult b2 = build_frame(spec_of(q), q.payload, c);
  check(b2 && c == a, "rebuilding a rebuilt frame is idempotent");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> in(data, size);

  Packet p;
  if (parse_frame(in, p) == ParseError::kOk) {
    check_consistent(in, p);
    round_trip(p);
  }

  ParseOptions lax;
  lax.verify_ipv4_checksum = false;
  lax.verify_udp_checksum = false;
  lax.verify_icrc = false;
  Packet l;
  if (parse_frame(in, l, lax) == ParseError::kOk) {
    check_consistent(in, l);
    round_trip(l);
  }

  uint32_t want = crc32_update(0x12345678, in, CrcImpl::kBytewise);
  check(crc32_update(0x12345678, in, CrcImpl::kSlice8) == want, "slice8 CRC equals bytewise");
  check(crc32_update(0x12345678, in, CrcImpl::kPclmul) == want, "pclmul CRC equals bytewise");
  return 0;
}
