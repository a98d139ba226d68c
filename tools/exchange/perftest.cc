#include "tools/exchange/perftest.h"

#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ufab::exchange {
namespace {

using std::chrono::milliseconds;

// perftest's hton_64 / hton_double on a little-endian host.
void put_be64(uint8_t* p, uint64_t v) {
  for (int i = 7; i >= 0; --i, v >>= 8) p[i] = uint8_t(v);
}
uint64_t get_be64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = v << 8 | p[i];
  return v;
}
void put_be32(uint8_t* p, uint32_t v) {
  for (int i = 3; i >= 0; --i, v >>= 8) p[i] = uint8_t(v);
}
uint32_t get_be32(const uint8_t* p) {
  return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3];
}

// The peer's version block: printable text then NUL padding, as strncpy
// leaves it. Returns the text.
Result<std::string> version_text(std::span<const uint8_t> block) {
  std::string_view all(reinterpret_cast<const char*>(block.data()), block.size());
  size_t nul = all.find('\0');
  if (nul == std::string_view::npos || nul == 0) {
    return fail(EPROTO, "perftest exchange: the peer's version block " + shown(all) +
                            " is not a NUL-terminated version text; is the peer a perftest tool (ib_write_bw, "
                            "ib_send_lat, ...) or `ufab perf` using the same TCP port?");
  }
  std::string text(all.substr(0, nul));
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str()) {
    return fail(EPROTO, "perftest exchange: the peer's version " + shown(text) + " is not a number");
  }
  if (v < kPerftestOldestPeer) {
    return fail(EPROTO, "perftest exchange: the peer runs perftest " + text +
                            "; perftest 6.06 and ufab need 5.70 or later: upgrade the peer's perftest");
  }
  return text;
}

}  // namespace

Result<PerftestKeyBytes> encode_perftest_keys(const PerftestKeys& k) {
  if (k.qpn > 0xffffff || k.psn > 0xffffff) {
    return fail(EINVAL, "encoding perftest keys: qpn " + std::to_string(k.qpn) + " or psn " + std::to_string(k.psn) +
                            " does not fit 24 bits");
  }
  char text[kPerftestKeysSize];
  int n = std::snprintf(text, sizeof text, "%04x:%04x:%06x:%06x:%08x:%016llx:%s:%08x:", unsigned(k.lid),
                        unsigned(k.out_reads), k.qpn, k.psn, k.rkey, static_cast<unsigned long long>(k.vaddr),
                        roce::gid_to_colon_hex(k.gid).c_str(), k.srqn);
  if (n != int(kPerftestKeysSize) - 1) {
    return fail(EINVAL, "encoding perftest keys: " + std::to_string(n) + " characters, expected 107");
  }
  PerftestKeyBytes bytes;
  std::memcpy(bytes.data(), text, bytes.size());
  return bytes;
}

Result<PerftestKeys> decode_perftest_keys(std::span<const uint8_t> bytes) {
  std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  if (bytes.size() != kPerftestKeysSize) {
    return fail(EPROTO, "perftest keys: expected " + std::to_string(kPerftestKeysSize) + " bytes, got " +
                            std::to_string(bytes.size()) + ": " + shown(text));
  }
  auto bad = [&](const std::string& what) {
    return fail(EPROTO, "perftest keys: " + what + " in " + shown(text) +
                            "; expected lid:out_reads:qpn:psn:rkey:vaddr:gid:srqn: as %04x:%04x:%06x:%06x:%08x:"
                            "%016llx:, 16 x %02x:, %08x: and a NUL (perftest over RoCE)");
  };
  struct Field {
    const char* name;
    size_t at, digits;
  };
  constexpr Field fields[] = {{"lid", 0, 4},   {"out_reads", 5, 4}, {"qpn", 10, 6},
                              {"psn", 17, 6},  {"rkey", 24, 8},     {"vaddr", 33, 16}};
  uint64_t v[6];
  for (size_t i = 0; i < 6; ++i) {
    const Field& f = fields[i];
    if (text[f.at + f.digits] != ':') {
      return bad("expected ':' after field " + std::string(f.name) + " at offset " + std::to_string(f.at + f.digits));
    }
    auto value = parse_hex(text.substr(f.at, f.digits), f.digits);
    if (!value) {
      return bad("field " + std::string(f.name) + ": expected " + std::to_string(f.digits) + " hex digits, saw " +
                 shown(text.substr(f.at, f.digits)));
    }
    v[i] = *value;
  }
  auto gid = roce::gid_from_colon_hex(text.substr(50, 47));
  if (!gid || text[97] != ':') return bad("field gid: expected 16 two-digit hex groups each followed by ':'");
  auto srqn = parse_hex(text.substr(98, 8), 8);
  if (!srqn || text[106] != ':') return bad("field srqn: expected 8 hex digits and ':'");
  if (text[107] != '\0') return bad("expected the terminating NUL at offset 107");
  PerftestKeys k;
  k.lid = uint16_t(v[0]);
  k.out_reads = uint16_t(v[1]);
  k.qpn = uint32_t(v[2]);
  k.psn = uint32_t(v[3]);
  k.rkey = uint32_t(v[4]);
  k.vaddr = v[5];
  k.gid = *gid;
  k.srqn = uint32_t(*srqn);
  return k;
}

Result<PerftestDestBytes> encode_perftest_dest(const PerftestKeys& k, uint32_t gid_index) {
  if (k.qpn > 0xffffff || k.psn > 0xffffff) {
    return fail(EINVAL, "encoding perftest keys (pingpong_dest): qpn " + std::to_string(k.qpn) + " or psn " +
                            std::to_string(k.psn) + " does not fit 24 bits");
  }
  PerftestDestBytes b{};
  put_be32(&b[0], k.lid);
  put_be32(&b[4], k.out_reads);
  put_be32(&b[8], k.qpn);
  put_be32(&b[12], k.psn);
  put_be32(&b[16], k.rkey);
  put_be64(&b[24], k.vaddr);
  std::memcpy(&b[32], k.gid.data(), 16);
  put_be32(&b[48], k.srqn);
  put_be32(&b[52], gid_index);
  return b;
}

Result<PerftestKeys> decode_perftest_dest(std::span<const uint8_t> b) {
  if (b.size() != kPerftestDestSize) {
    return fail(EPROTO, "perftest keys over rdma_cm: expected the " + std::to_string(kPerftestDestSize) +
                            "-byte struct pingpong_dest, got " + std::to_string(b.size()) + " bytes");
  }
  PerftestKeys k;
  const uint32_t lid = get_be32(&b[0]), out_reads = get_be32(&b[4]);
  k.qpn = get_be32(&b[8]);
  k.psn = get_be32(&b[12]);
  if (lid > 0xffff || out_reads > 0xffff || k.qpn > 0xffffff || k.psn > 0xffffff) {
    return fail(EPROTO, "perftest keys over rdma_cm: lid " + std::to_string(lid) + ", out_reads " +
                            std::to_string(out_reads) + ", qpn " + std::to_string(k.qpn) + ", psn " +
                            std::to_string(k.psn) + " are not what perftest sends (LID and out_reads fit 16 bits, "
                            "QPN and PSN 24): is the peer's pingpong_dest big-endian (perftest built with "
                            "HAVE_ENDIAN)?");
  }
  k.lid = uint16_t(lid);
  k.out_reads = uint16_t(out_reads);
  k.rkey = get_be32(&b[16]);
  k.vaddr = get_be64(&b[24]);
  std::memcpy(k.gid.data(), &b[32], 16);
  k.srqn = get_be32(&b[48]);
  return k;
}

Status TcpPerftestLink::send_block(std::span<const uint8_t> block, milliseconds timeout) {
  if (auto s = channel_.send_all(block, timeout); !s) return std::unexpected(s.error().context("writing to " + peer()));
  return {};
}

Status TcpPerftestLink::recv_block(std::span<uint8_t> block, milliseconds timeout) {
  auto n = channel_.recv_exact(block, timeout);
  if (!n) return std::unexpected(n.error().context("reading " + std::to_string(block.size()) + " bytes from " + peer()));
  if (*n == 0) {
    return fail(ECONNRESET, "the peer " + peer() +
                                " closed the connection; its own output says why (options the two sides "
                                "disagree on, a device or GID it cannot use, ...)");
  }
  return {};
}

Result<PerftestChannel> PerftestChannel::accept(TcpListener& listener, milliseconds timeout) {
  auto channel = listener.accept(timeout);
  if (!channel) return std::unexpected(channel.error());
  return PerftestChannel(std::make_unique<TcpPerftestLink>(std::move(*channel)), false);
}

Result<PerftestChannel> PerftestChannel::connect(const std::string& host, uint16_t port, milliseconds timeout) {
  auto channel = TcpChannel::connect(host, port, timeout);
  if (!channel) return std::unexpected(channel.error());
  return PerftestChannel(std::make_unique<TcpPerftestLink>(std::move(*channel)), true);
}

Status PerftestChannel::swap(std::span<const uint8_t> mine, std::span<uint8_t> theirs, milliseconds timeout) {
  if (!client_) {
    if (auto s = link_->recv_block(theirs, timeout); !s) return s;
  }
  if (auto s = link_->send_block(mine, timeout); !s) return s;
  if (client_) return link_->recv_block(theirs, timeout);
  return {};
}

Result<PerftestChannel::Agreed> PerftestChannel::hello(uint32_t cycle_buffer, uint32_t cache_line, uint32_t mtu_enum,
                                                       milliseconds timeout, std::string_view tail) {
  if (tail.size() > kPerftestVersionTail || tail.find('\0') != std::string_view::npos) {
    return fail(EINVAL, "perftest exchange: a version block's tail holds at most " +
                            std::to_string(kPerftestVersionTail) + " bytes without a NUL; got " + shown(tail));
  }
  std::array<uint8_t, kPerftestVersionSize> mine{}, theirs{};
  std::memcpy(mine.data(), kPerftestVersion, sizeof kPerftestVersion - 1);
  std::memcpy(mine.data() + sizeof kPerftestVersion, tail.data(), tail.size());
  if (auto s = swap(mine, theirs, timeout); !s) return std::unexpected(s.error().context("exchanging versions"));
  auto version = version_text(theirs);
  if (!version) return std::unexpected(version.error());
  peer_version_ = *version;
  {
    std::string_view rest(reinterpret_cast<const char*>(theirs.data()) + version->size() + 1,
                          theirs.size() - version->size() - 1);
    while (!rest.empty() && rest.back() == '\0') rest.remove_suffix(1);
    peer_tail_ = std::string(rest);
  }

  Agreed agreed;
  uint8_t out[4], in[4];
  put_be32(out, cycle_buffer);
  if (auto s = swap(out, in, timeout); !s) return std::unexpected(s.error().context("exchanging the cycle buffer"));
  agreed.cycle_buffer = std::max(cycle_buffer, get_be32(in));
  put_be32(out, cache_line);
  if (auto s = swap(out, in, timeout); !s) return std::unexpected(s.error().context("exchanging the cache line size"));
  agreed.cache_line = std::max(cache_line, get_be32(in));

  // "%d" of the ibv_mtu enum in a 2-byte block.
  uint8_t mtu_out[2] = {uint8_t('0' + mtu_enum), 0}, mtu_in[2];
  if (mtu_enum < 1 || mtu_enum > 5) return fail(EINVAL, "perftest exchange: MTU enum " + std::to_string(mtu_enum));
  if (auto s = swap(mtu_out, mtu_in, timeout); !s) return std::unexpected(s.error().context("exchanging the MTU"));
  uint32_t peer_mtu = uint32_t(mtu_in[0] - '0');
  // perftest ignores an MTU it cannot parse; so do we, but not silently.
  if (mtu_in[0] < '1' || mtu_in[0] > '5') {
    return fail(EPROTO, "perftest exchange: the peer's MTU block " +
                            shown(std::string_view(reinterpret_cast<const char*>(mtu_in), 2)) +
                            " is not an ibv_mtu value 1..5");
  }
  agreed.mtu_enum = std::min(mtu_enum, peer_mtu);
  return agreed;
}

Result<PerftestKeys> PerftestChannel::swap_keys(const PerftestKeys& mine, milliseconds timeout) {
  if (link_->rdma_cm()) {
    auto ours = encode_perftest_dest(mine);
    if (!ours) return std::unexpected(ours.error());
    PerftestDestBytes theirs{};
    if (auto s = swap(*ours, theirs, timeout); !s) return std::unexpected(s.error().context("exchanging QP keys"));
    return decode_perftest_dest(theirs);
  }
  auto ours = encode_perftest_keys(mine);
  if (!ours) return std::unexpected(ours.error());
  PerftestKeyBytes theirs{};
  if (auto s = swap(*ours, theirs, timeout); !s) return std::unexpected(s.error().context("exchanging QP keys"));
  return decode_perftest_keys(theirs);
}

Result<PerftestBwReport> PerftestChannel::swap_bw_report(const PerftestBwReport& mine, milliseconds timeout) {
  const uint64_t out[5] = {mine.size, mine.iters, std::bit_cast<uint64_t>(mine.bw_peak),
                           std::bit_cast<uint64_t>(mine.bw_avg), std::bit_cast<uint64_t>(mine.msg_rate_avg)};
  uint64_t in[5];
  for (size_t i = 0; i < 5; ++i) {
    uint8_t o[8], r[8];
    put_be64(o, out[i]);
    if (auto s = swap(o, r, timeout); !s) return std::unexpected(s.error().context("exchanging bandwidth reports"));
    in[i] = get_be64(r);
  }
  return PerftestBwReport{.size = in[0],
                          .iters = in[1],
                          .bw_peak = std::bit_cast<double>(in[2]),
                          .bw_avg = std::bit_cast<double>(in[3]),
                          .msg_rate_avg = std::bit_cast<double>(in[4])};
}

Status PerftestChannel::close(const PerftestKeys& mine, milliseconds timeout) {
  if (auto k = swap_keys(mine, timeout); !k) return std::unexpected(k.error().context("closing"));
  if (link_->rdma_cm()) return {};  // perftest -R writes no "done"
  static constexpr uint8_t kDone[] = {'d', 'o', 'n', 'e', '\0'};
  // The peer may be gone once its own "done" is out; a failed write then
  // changes nothing.
  (void)link_->send_block(kDone, timeout);
  return {};
}

}  // namespace ufab::exchange
