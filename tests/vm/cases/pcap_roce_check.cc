// pcap_roce_check: runs ufab's RoCEv2 parser over frames that Linux soft-RoCE
// (rdma_rxe) put on the wire, recorded by run-vm --pcap (see
// tests/vm/suites/rxe_wire.sh and tests/vm/rxe_capture_guest.sh). Runs on
// the host.
//
// Usage: pcap_roce_check PCAP TTL RUN...
//   TTL = the guest's net.ipv4.ip_default_ttl: ib_core replaces the AV's
//   hop limit (rc_pingpong asks for 1) with the route's for routable RoCE v2
//   GIDs (ib_resolve_eth_dmac -> rdma_addr_find_l2_eth_by_grh), so that is
//   the IPv4 TTL rxe sends.
//   RUN = SIZE:RQPN:CLIENT_QPN:CLIENT_PSN (numbers with 0x for hex): one
//   ibv_rc_pingpong client whose QP (CLIENT_QPN, send PSN CLIENT_PSN) was
//   connected to the made-up remote QP RQPN and sent SIZE-byte SENDs.
//
// Every frame to UDP port 4791 must parse (ICRC verified). For each run the
// frames to RQPN are checked against what rxe and rc_pingpong do (rxe_req.c,
// rxe_net.c, rxe_icrc.c, rdma_get_udp_sport; rc_pingpong.c: MTU 1024,
// hop limit replaced by the route's): RC SEND opcodes by position in the message, PSNs from
// CLIENT_PSN, payload and pad lengths, AckReq on the last packet, P_Key, UDP
// source port after modify_qp, IPv4 DF, TTL, UDP checksum 0, addresses.
// Prints "PASS name" / "FAIL name: why" per check, then a summary line
// "rxe_wire: ...", and exits 0 only if every check passed.
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "core/roce/headers.h"
#include "core/roce/opcodes.h"
#include "core/roce/parser.h"
#include "core/roce/udp_port.h"

namespace {

namespace roce = ufab::roce;

constexpr size_t kMaxPcapBytes = 256u << 20;   // refuse anything bigger
constexpr uint32_t kMaxRecord = 262144;        // pcap's usual snaplen limit
constexpr uint32_t kPathMtu = 1024;            // rc_pingpong's default MTU
constexpr uint32_t kLocalIp = 0x0A630001;      // 10.99.0.1
constexpr uint32_t kPeerIp = 0x0A630002;       // 10.99.0.2
constexpr roce::MacAddr kLocalMac{0x52, 0x54, 0x00, 0x00, 0x00, 0x01};
constexpr roce::MacAddr kPeerMac{0x52, 0x54, 0x00, 0x00, 0x00, 0x02};

uint32_t g_ttl = 64;
int g_passed = 0;
int g_failed = 0;

void check(bool ok, const std::string& name, const std::string& why = {}) {
  if (ok) {
    ++g_passed;
    std::printf("PASS %s\n", name.c_str());
  } else {
    ++g_failed;
    std::printf("FAIL %s: %s\n", name.c_str(), why.c_str());
  }
}

std::string hex(const uint8_t* p, size_t n) {
  std::string s;
  char b[4];
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(b, sizeof b, "%02x", p[i]);
    s += b;
  }
  return s;
}

std::string fmt(const char* f, auto... args) {
  char b[512];
  std::snprintf(b, sizeof b, f, args...);
  return b;
}

struct Frame {
  std::vector<uint8_t> bytes;
  size_t index;  // record number in the file, from 1
};

// Classic libpcap format: 24-byte global header, then 16-byte record
// headers. Either byte order, microsecond or nanosecond magic, Ethernet only.
bool read_pcap(const char* path, std::vector<Frame>& frames, std::string& err) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    err = "cannot open";
    return false;
  }
  std::vector<uint8_t> data;
  data.reserve(1 << 20);
  char buf[65536];
  while (in) {  // bounded by kMaxPcapBytes
    in.read(buf, sizeof buf);
    data.insert(data.end(), buf, buf + in.gcount());
    if (data.size() > kMaxPcapBytes) {
      err = "file larger than 256 MiB";
      return false;
    }
  }
  if (data.size() < 24) {
    err = fmt("%zu bytes: no pcap global header", data.size());
    return false;
  }
  auto le32 = [&](size_t o) {
    return uint32_t(data[o]) | uint32_t(data[o + 1]) << 8 | uint32_t(data[o + 2]) << 16 |
           uint32_t(data[o + 3]) << 24;
  };
  const uint32_t magic = le32(0);
  bool swap;
  if (magic == 0xa1b2c3d4 || magic == 0xa1b23c4d) {
    swap = false;
  } else if (magic == 0xd4c3b2a1 || magic == 0x4d3cb2a1) {
    swap = true;
  } else {
    err = fmt("bad magic 0x%08x", magic);
    return false;
  }
  auto u32 = [&](size_t o) {
    uint32_t v = le32(o);
    return swap ? __builtin_bswap32(v) : v;
  };
  const uint32_t linktype = u32(20) & 0x0FFFFFFF;
  if (linktype != 1) {
    err = fmt("link type %u, not Ethernet (1)", linktype);
    return false;
  }
  size_t off = 24;
  size_t n = 0;
  while (off < data.size()) {  // each pass consumes >= 16 bytes
    if (data.size() - off < 16) {
      err = fmt("record %zu: truncated record header", n + 1);
      return false;
    }
    const uint32_t incl = u32(off + 8);
    if (incl > kMaxRecord || incl > data.size() - off - 16) {
      err = fmt("record %zu: captured length %u runs past the file or the limit", n + 1, incl);
      return false;
    }
    ++n;
    frames.push_back({std::vector<uint8_t>(data.begin() + off + 16, data.begin() + off + 16 + incl), n});
    off += 16 + incl;
  }
  return true;
}

bool is_roce_candidate(const std::vector<uint8_t>& f) {
  // Ethernet, IPv4, UDP, destination port 4791: read only what is there.
  if (f.size() < 14 + 20 + 8) return false;
  if (f[12] != 0x08 || f[13] != 0x00) return false;
  const size_t ihl = (f[14] & 0x0F) * 4u;
  if (ihl < 20 || f.size() < 14 + ihl + 8) return false;
  if (f[14 + 9] != 17) return false;
  const uint16_t dport = uint16_t(f[14 + ihl + 2] << 8 | f[14 + ihl + 3]);
  return dport == roce::kRoceV2Port;
}

struct Run {
  uint32_t size, rqpn, client_qpn, client_psn;
};

bool parse_num(const std::string& s, uint32_t& out) {
  if (s.empty()) return false;
  char* end = nullptr;
  unsigned long v = std::strtoul(s.c_str(), &end, 0);
  if (*end != 0 || v > 0xFFFFFFFFul) return false;
  out = uint32_t(v);
  return true;
}

bool parse_run(const char* arg, Run& r) {
  std::string s(arg);
  std::vector<std::string> parts;
  size_t start = 0;
  for (int i = 0; i < 4; ++i) {  // at most 4 fields
    size_t c = s.find(':', start);
    parts.push_back(s.substr(start, c == std::string::npos ? std::string::npos : c - start));
    if (c == std::string::npos) break;
    start = c + 1;
    if (i == 3) return false;  // a fifth field
  }
  return parts.size() == 4 && parse_num(parts[0], r.size) && parse_num(parts[1], r.rqpn) &&
         parse_num(parts[2], r.client_qpn) && parse_num(parts[3], r.client_psn) && r.size > 0 &&
         r.size <= (1u << 20) && r.rqpn <= 0xFFFFFF && r.client_qpn <= 0xFFFFFF && r.client_psn <= 0xFFFFFF;
}

uint8_t expected_opcode(uint32_t i, uint32_t npkts) {
  if (npkts == 1) return roce::op::kRcSendOnly;
  if (i == 0) return roce::op::kRcSendFirst;
  if (i == npkts - 1) return roce::op::kRcSendLast;
  return roce::op::kRcSendMiddle;
}

struct Parsed {
  const Frame* frame;
  roce::Packet pkt;
};

void check_run(const Run& run, const std::vector<Parsed>& all) {
  const std::string tag = fmt("run(size=%u,rqpn=0x%06x)", run.size, run.rqpn);
  std::vector<const Parsed*> mine;
  for (const auto& p : all)
    if (p.pkt.bth.dest_qp == run.rqpn) mine.push_back(&p);
  const uint32_t npkts = (run.size + kPathMtu - 1) / kPathMtu;
  const uint16_t sport_mod = roce::rxe_sport_after_modify(0, run.client_qpn, run.rqpn);
  const uint16_t sport_create = roce::rxe_sport_at_create(run.client_qpn);
  std::printf("%s: client QPN 0x%06x PSN 0x%06x, %zu frames, %u packet(s) per message, "
              "expected UDP sport 0x%04x (at create it would be 0x%04x)\n",
              tag.c_str(), run.client_qpn, run.client_psn, mine.size(), npkts, sport_mod, sport_create);

  check(!mine.empty(), tag + " frames captured", "no frames to this QP in the pcap");
  if (mine.empty()) return;
  check(mine.size() >= npkts, tag + " at least one whole message",
        fmt("%zu frames, a message is %u", mine.size(), npkts));

  std::map<uint32_t, int> per_psn;
  std::string e_op, e_psn, e_len, e_ack, e_sport, e_ip, e_misc, e_first;
  const uint32_t first_psn = mine.front()->pkt.bth.psn;
  if (first_psn != run.client_psn)
    e_first = fmt("first frame (record %zu) has PSN 0x%06x", mine.front()->frame->index, first_psn);
  for (const Parsed* p : mine) {
    const roce::Packet& k = p->pkt;
    const size_t rec = p->frame->index;
    const uint32_t i = (k.bth.psn - run.client_psn) & 0xFFFFFF;
    ++per_psn[k.bth.psn];
    if (i >= npkts) {
      if (e_psn.empty()) e_psn = fmt("record %zu: PSN 0x%06x outside the message", rec, k.bth.psn);
      continue;
    }
    const uint8_t want_op = expected_opcode(i, npkts);
    if (k.bth.opcode != want_op && e_op.empty())
      e_op = fmt("record %zu: PSN 0x%06x has opcode 0x%02x (%s), want 0x%02x", rec, k.bth.psn, k.bth.opcode,
                 k.op->name, want_op);
    if (k.op->transport != roce::Transport::kRc || k.op->kind != roce::OpKind::kSend) {
      if (e_op.empty()) e_op = fmt("record %zu: opcode 0x%02x is not an RC SEND", rec, k.bth.opcode);
    }
    const uint32_t want_len = (i + 1 < npkts) ? kPathMtu : run.size - kPathMtu * (npkts - 1);
    const uint8_t want_pad = uint8_t((0u - want_len) & 3);
    if ((k.payload.size() != want_len || k.bth.pad != want_pad) && e_len.empty())
      e_len = fmt("record %zu: payload %zu pad %u, want %u pad %u", rec, k.payload.size(), k.bth.pad, want_len,
                  want_pad);
    if (k.bth.ack_req != (i == npkts - 1) && e_ack.empty())
      e_ack = fmt("record %zu: AckReq %d on packet %u of %u", rec, int(k.bth.ack_req), i + 1, npkts);
    if (k.udp.sport != sport_mod && e_sport.empty())
      e_sport = fmt("record %zu: sport 0x%04x, want 0x%04x", rec, k.udp.sport, sport_mod);
    if (((k.ip.flags & roce::kIpFlagDontFragment) == 0 || k.ip.ttl != g_ttl || k.ip.src != kLocalIp ||
         k.ip.dst != kPeerIp || k.udp.checksum != 0) &&
        e_ip.empty())
      e_ip = fmt("record %zu: flags %u ttl %u src 0x%08x dst 0x%08x udp csum 0x%04x", rec, k.ip.flags, k.ip.ttl,
                 k.ip.src, k.ip.dst, k.udp.checksum);
    if ((k.bth.pkey != roce::kDefaultPkey || k.bth.tver != 0 || k.bth.migreq || k.eth.src != kLocalMac ||
         k.eth.dst != kPeerMac) &&
        e_misc.empty())
      e_misc = fmt("record %zu: pkey 0x%04x tver %u migreq %d or MACs differ", rec, k.bth.pkey, k.bth.tver,
                   int(k.bth.migreq));
  }
  check(e_first.empty(), tag + fmt(" first PSN = client's PSN 0x%06x", run.client_psn), e_first);
  check(e_psn.empty(), tag + " PSNs within the message", e_psn);
  check(e_op.empty(), tag + " RC SEND opcodes by position", e_op);
  check(e_len.empty(), tag + " payload and pad lengths (MTU 1024)", e_len);
  check(e_ack.empty(), tag + " AckReq on the last packet only", e_ack);
  check(e_sport.empty(), tag + fmt(" UDP sport = rxe rule after modify_qp (0x%04x)", sport_mod), e_sport);
  check(e_ip.empty(), tag + fmt(" IPv4 DF, TTL %u (route, not rc_pingpong's 1), 10.99.0.1 -> 10.99.0.2, UDP csum 0", g_ttl), e_ip);
  check(e_misc.empty(), tag + " P_Key 0xffff, TVer 0, MigReq 0, MACs", e_misc);

  std::string seen;
  for (const auto& [psn, cnt] : per_psn) seen += fmt(" 0x%06x x%d", psn, cnt);
  const roce::Packet& f = mine.front()->pkt;
  std::printf("%s: PSNs seen:%s; TOS 0x%02x, IP id of first 0x%04x, first payload bytes %s\n", tag.c_str(),
              seen.c_str(), f.ip.tos, f.ip.id, hex(f.payload.data(), f.payload.size() < 8 ? f.payload.size() : 8).c_str());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4 || !parse_num(argv[2], g_ttl) || g_ttl == 0 || g_ttl > 255) {
    std::fprintf(stderr, "usage: %s PCAP TTL SIZE:RQPN:CLIENT_QPN:CLIENT_PSN...\n", argv[0]);
    return 2;
  }
  std::vector<Run> runs;
  for (int a = 3; a < argc; ++a) {
    Run r{};
    if (!parse_run(argv[a], r)) {
      std::fprintf(stderr, "pcap_roce_check: bad run '%s' (SIZE:RQPN:CLIENT_QPN:CLIENT_PSN)\n", argv[a]);
      return 2;
    }
    runs.push_back(r);
  }
  std::vector<Frame> frames;
  std::string err;
  if (!read_pcap(argv[1], frames, err)) {
    check(false, "read pcap", std::string(argv[1]) + ": " + err);
    std::printf("rxe_wire: pcap unreadable\n");
    return 1;
  }
  std::printf("pcap: %zu frames\n", frames.size());

  std::vector<Parsed> parsed;
  size_t candidates = 0, bad = 0;
  for (const Frame& fr : frames) {
    if (!is_roce_candidate(fr.bytes)) continue;
    ++candidates;
    roce::ParseResult r = roce::parse_frame(fr.bytes);
    if (!r) {
      ++bad;
      if (bad <= 5)
        std::printf("record %zu: parse error %s (%s)\n  frame %s\n", fr.index, roce::parse_error_name(r.error),
                    roce::parse_error_text(r.error), hex(fr.bytes.data(), fr.bytes.size()).c_str());
      continue;
    }
    parsed.push_back({&fr, r.packet});
  }
  check(candidates > 0, "RoCEv2 frames (UDP 4791) in the pcap", "none found");
  check(bad == 0, fmt("all %zu RoCEv2 frames parse with ICRC verified", candidates),
        fmt("%zu of %zu rejected (first ones above)", bad, candidates));

  // The ICRC check is live: the same frames with one payload byte flipped
  // must be rejected as bad_icrc, and with only the ICRC check off, accepted.
  size_t flip_ok = 0;
  for (const Parsed& p : parsed) {
    std::vector<uint8_t> copy = p.frame->bytes;
    copy[p.pkt.bth_offset + 11] ^= 0x01;  // last PSN byte: covered by the ICRC only
    roce::ParseOptions no_icrc;
    no_icrc.verify_icrc = false;
    if (roce::parse_frame(copy).error == roce::ParseError::kBadIcrc && roce::parse_frame(copy, no_icrc))
      ++flip_ok;
  }
  check(!parsed.empty() && flip_ok == parsed.size(), "ICRC is what the parser checked (flipped PSN bit -> bad_icrc)",
        fmt("%zu of %zu", flip_ok, parsed.size()));

  std::map<std::string, int> ops;
  for (const Parsed& p : parsed) ++ops[p.pkt.op->name];
  std::string opsum;
  for (const auto& [name, cnt] : ops) opsum += fmt("%s%s x%d", opsum.empty() ? "" : ", ", name.c_str(), cnt);

  for (const Run& r : runs) check_run(r, parsed);
  size_t claimed = 0;
  for (const Parsed& p : parsed)
    for (const Run& r : runs)
      if (p.pkt.bth.dest_qp == r.rqpn) ++claimed;
  check(claimed == parsed.size(), "every RoCEv2 frame belongs to a run",
        fmt("%zu of %zu frames go to other QPs", parsed.size() - claimed, parsed.size()));

  std::printf("rxe_wire: %zu frames from rxe parsed (%zu rejected), ICRC %s, opcodes: %s; %d checks passed, %d failed\n",
              parsed.size(), bad, bad == 0 && flip_ok == parsed.size() ? "ok" : "NOT ok", opsum.c_str(), g_passed,
              g_failed);
  return g_failed == 0 ? 0 : 1;
}
