#include "tools/exchange/perftest.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <endian.h>

#include <bit>
#include <chrono>
#include <deque>
#include <memory>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <thread>

namespace ufab::exchange {
namespace {

using namespace std::chrono_literals;
constexpr auto kLong = 5000ms;

// perftest's own format string (perftest_communication.h KEY_PRINT_FMT_GID),
// verbatim, so the codec is checked against what perftest writes.
constexpr char kPerftestFmt[] =
    "%04x:%04x:%06x:%06x:%08x:%016llx:%02x:%02x:%02x:%02x:%02x:%02x:%02x:%02x:%02x:%02x:%02x:%02x:%02x:%02x:%02x:"
    "%02x:%08x:";

std::string error_of(const auto& r) { return r ? std::string("(no error)") : r.error().message(); }

PerftestKeys sample() {
  PerftestKeys k;
  k.out_reads = 16;
  k.qpn = 0x11;
  k.psn = 0xabcdef;
  k.rkey = 0x1234abcd;
  k.vaddr = 0x00007f12345678c0;
  k.gid = roce::gid_from_ipv4(0x0a000001);
  return k;
}

PerftestKeyBytes as_perftest_writes(const PerftestKeys& k) {
  char msg[kPerftestKeysSize];
  const uint8_t* g = k.gid.data();
  std::snprintf(msg, sizeof msg, kPerftestFmt, k.lid, k.out_reads, k.qpn, k.psn, k.rkey,
                static_cast<unsigned long long>(k.vaddr), g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8], g[9],
                g[10], g[11], g[12], g[13], g[14], g[15], k.srqn);
  PerftestKeyBytes b;
  std::memcpy(b.data(), msg, b.size());
  return b;
}

TEST(PerftestKeys, EncodesExactlyAsPerftest) {
  PerftestKeys k = sample();
  k.srqn = 0x42;
  auto ours = encode_perftest_keys(k);
  ASSERT_TRUE(ours) << error_of(ours);
  EXPECT_EQ(*ours, as_perftest_writes(k));
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(ours->data())),
            "0000:0010:000011:abcdef:1234abcd:00007f12345678c0:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:01:"
            "00000042:");
}

TEST(PerftestKeys, DecodesWhatPerftestWrites) {
  PerftestKeys k = sample();
  k.lid = 0xffff;
  k.vaddr = ~0ull;
  auto d = decode_perftest_keys(as_perftest_writes(k));
  ASSERT_TRUE(d) << error_of(d);
  EXPECT_EQ(d->lid, k.lid);
  EXPECT_EQ(d->out_reads, k.out_reads);
  EXPECT_EQ(d->qpn, k.qpn);
  EXPECT_EQ(d->psn, k.psn);
  EXPECT_EQ(d->rkey, k.rkey);
  EXPECT_EQ(d->vaddr, k.vaddr);
  EXPECT_EQ(d->gid, k.gid);
  EXPECT_EQ(d->srqn, k.srqn);
}

TEST(PerftestKeys, AcceptsUpperCaseHex) {
  auto b = as_perftest_writes(sample());
  for (auto& c : b) c = uint8_t(std::toupper(c));
  auto d = decode_perftest_keys(b);
  ASSERT_TRUE(d) << error_of(d);
  EXPECT_EQ(d->rkey, 0x1234abcdu);
}

TEST(PerftestKeys, RejectsMalformed) {
  const PerftestKeyBytes good = as_perftest_writes(sample());
  struct Case {
    size_t at;
    char c;
    const char* says;
  } cases[] = {{4, '-', "after field lid"},     {2, 'g', "field lid"},      {12, 'x', "field qpn"},
               {49, ' ', "after field vaddr"},  {52, '.', "field gid"},     {60, 'z', "field gid"},
               {99, 'q', "field srqn"},         {106, 'x', "field srqn"},   {107, 'x', "terminating NUL"}};
  for (const Case& c : cases) {
    PerftestKeyBytes b = good;
    b[c.at] = uint8_t(c.c);
    auto d = decode_perftest_keys(b);
    ASSERT_FALSE(d) << "byte " << c.at;
    EXPECT_EQ(d.error().code(), EPROTO);
    EXPECT_NE(d.error().message().find(c.says), std::string::npos) << d.error().message();
  }
  auto short_one = decode_perftest_keys(std::span<const uint8_t>(good.data(), 59));  // the IB (no GID) format's size
  ASSERT_FALSE(short_one);
  EXPECT_NE(short_one.error().message().find("expected 108 bytes, got 59"), std::string::npos);
}

TEST(PerftestKeys, RefusesQpnOver24Bits) {
  PerftestKeys k = sample();
  k.qpn = 0x1000000;
  auto e = encode_perftest_keys(k);
  ASSERT_FALSE(e);
  EXPECT_EQ(e.error().code(), EINVAL);
}

// The server side of a perftest run as perftest writes it: read(), then
// write() of fixed blocks; what it read is kept for the test to check.
struct FakePerftestServer {
  explicit FakePerftestServer(const char* version, int peer_mtu = 3) {
    auto l = TcpChannel::listen(0, "127.0.0.1");
    EXPECT_TRUE(l) << error_of(l);
    listener.emplace(std::move(*l));
    thread = std::thread([this, version, peer_mtu] {
      auto ch = listener->accept(kLong);
      if (!ch) return;
      auto block = [&](std::span<const uint8_t> out, size_t in_size) {
        std::vector<uint8_t> in(in_size);
        auto n = ch->recv_exact(in, kLong);
        if (!n || *n == 0) return std::vector<uint8_t>{};
        (void)ch->send_all(out, kLong);
        return in;
      };
      char v[16] = {};
      std::memcpy(v, version, std::strlen(version));
      got_version = block({reinterpret_cast<uint8_t*>(v), 16}, 16);
      uint32_t cycle = htonl(8192), cache = htonl(32);
      got_cycle = block({reinterpret_cast<uint8_t*>(&cycle), 4}, 4);
      got_cache = block({reinterpret_cast<uint8_t*>(&cache), 4}, 4);
      char mtu[2] = {char('0' + peer_mtu), 0};
      got_mtu = block({reinterpret_cast<uint8_t*>(mtu), 2}, 2);
      PerftestKeys k = sample();
      k.qpn = 0x77;
      auto keys = as_perftest_writes(k);
      got_keys = block(keys, kPerftestKeysSize);
      for (int i = 0; i < 5; ++i) {
        uint64_t v64 = i == 0 ? 65536 : i == 1 ? 5000 : std::bit_cast<uint64_t>(1234.5 * i);
        uint8_t be[8];
        for (int j = 0; j < 8; ++j) be[j] = uint8_t(v64 >> (56 - 8 * j));
        auto r = block(be, 8);
        uint64_t got = 0;
        for (uint8_t x : r) got = got << 8 | x;
        report.push_back(got);
      }
    });
  }
  ~FakePerftestServer() {
    if (thread.joinable()) thread.join();
  }
  std::optional<TcpListener> listener;
  std::thread thread;
  std::vector<uint8_t> got_version, got_cycle, got_cache, got_mtu, got_keys;
  std::vector<uint64_t> report;
};

TEST(PerftestChannel, ClientSpeaksPerftestsSequence) {
  FakePerftestServer server("6.06");
  auto ch = PerftestChannel::connect("127.0.0.1", server.listener->port(), kLong);
  ASSERT_TRUE(ch) << error_of(ch);
  EXPECT_TRUE(ch->client());
  auto agreed = ch->hello(4096, 64, 5, kLong);
  ASSERT_TRUE(agreed) << error_of(agreed);
  EXPECT_EQ(ch->peer_version(), "6.06");
  EXPECT_EQ(ch->peer_tail(), "");  // perftest pads with NULs
  EXPECT_EQ(agreed->cycle_buffer, 8192u);  // the larger
  EXPECT_EQ(agreed->cache_line, 64u);
  EXPECT_EQ(agreed->mtu_enum, 3u);  // the smaller
  auto keys = ch->swap_keys(sample(), kLong);
  ASSERT_TRUE(keys) << error_of(keys);
  EXPECT_EQ(keys->qpn, 0x77u);
  auto rep = ch->swap_bw_report({.size = 8, .iters = 1000, .bw_peak = 1.5, .bw_avg = 2.5, .msg_rate_avg = 0.25}, kLong);
  ASSERT_TRUE(rep) << error_of(rep);
  EXPECT_EQ(rep->size, 65536u);
  EXPECT_EQ(rep->iters, 5000u);
  EXPECT_EQ(rep->bw_avg, 1234.5 * 3);
  server.thread.join();
  char version[17] = {};
  std::memcpy(version, server.got_version.data(), 16);
  EXPECT_STREQ(version, "6.06");
  EXPECT_EQ(server.got_version, std::vector<uint8_t>({'6', '.', '0', '6', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(server.got_cycle, std::vector<uint8_t>({0, 0, 0x10, 0}));
  EXPECT_EQ(server.got_cache, std::vector<uint8_t>({0, 0, 0, 64}));
  EXPECT_EQ(server.got_mtu, std::vector<uint8_t>({'5', 0}));
  auto sent = as_perftest_writes(sample());
  EXPECT_EQ(server.got_keys, std::vector<uint8_t>(sent.begin(), sent.end()));
  ASSERT_EQ(server.report.size(), 5u);
  EXPECT_EQ(server.report[0], 8u);
  EXPECT_EQ(server.report[1], 1000u);
  EXPECT_EQ(std::bit_cast<double>(server.report[2]), 1.5);
  EXPECT_EQ(std::bit_cast<double>(server.report[4]), 0.25);
}

TEST(PerftestChannel, RefusesOldPeers) {
  FakePerftestServer server("5.60");
  auto ch = PerftestChannel::connect("127.0.0.1", server.listener->port(), kLong);
  ASSERT_TRUE(ch) << error_of(ch);
  auto agreed = ch->hello(4096, 64, 3, kLong);
  ASSERT_FALSE(agreed);
  EXPECT_NE(agreed.error().message().find("perftest 5.60"), std::string::npos) << agreed.error().message();
  EXPECT_NE(agreed.error().message().find("5.70 or later"), std::string::npos);
}

TEST(PerftestChannel, RefusesAPeerThatIsNotPerftest) {
  auto l = TcpChannel::listen(0, "127.0.0.1");
  ASSERT_TRUE(l);
  std::thread peer([&] {
    auto ch = l->accept(kLong);
    if (!ch) return;
    std::vector<uint8_t> in(16);
    (void)ch->recv_exact(in, kLong);
    (void)ch->send_all(std::string_view("UFAB1 10.0.0.1 0"), kLong);
  });
  auto ch = PerftestChannel::connect("127.0.0.1", l->port(), kLong);
  ASSERT_TRUE(ch);
  auto agreed = ch->hello(4096, 64, 3, kLong);
  peer.join();
  ASSERT_FALSE(agreed);
  EXPECT_NE(agreed.error().message().find("not a NUL-terminated version"), std::string::npos)
      << agreed.error().message();
}

TEST(PerftestChannel, ServerAndClientMeet) {
  auto l = TcpChannel::listen(0, "127.0.0.1");
  ASSERT_TRUE(l);
  std::optional<Result<PerftestKeys>> server_saw;
  std::thread server([&] {
    auto ch = PerftestChannel::accept(*l, kLong);
    ASSERT_TRUE(ch) << error_of(ch);
    EXPECT_FALSE(ch->client());
    auto a = ch->hello(4096, 64, 3, kLong);
    ASSERT_TRUE(a) << error_of(a);
    PerftestKeys k = sample();
    k.qpn = 0x99;
    server_saw = ch->swap_keys(k, kLong);
    EXPECT_TRUE(ch->close(k, kLong));
  });
  auto ch = PerftestChannel::connect("127.0.0.1", l->port(), kLong);
  ASSERT_TRUE(ch) << error_of(ch);
  auto a = ch->hello(4096, 64, 3, kLong);
  ASSERT_TRUE(a) << error_of(a);
  auto k = ch->swap_keys(sample(), kLong);
  ASSERT_TRUE(k) << error_of(k);
  EXPECT_EQ(k->qpn, 0x99u);
  EXPECT_TRUE(ch->close(sample(), kLong));
  server.join();
  ASSERT_TRUE(server_saw && *server_saw);
  EXPECT_EQ((*server_saw)->qpn, 0x11u);
}

// The version block's padding carries a tail (ufab perf's mark) that
// perftest ignores: the text up to the NUL is still "6.06", byte for byte
// what perftest's atof reads.
TEST(PerftestChannel, VersionTailTravelsInThePadding) {
  auto l = TcpChannel::listen(0, "127.0.0.1");
  ASSERT_TRUE(l);
  std::string server_saw;
  std::thread server([&] {
    auto ch = PerftestChannel::accept(*l, kLong);
    ASSERT_TRUE(ch) << error_of(ch);
    auto a = ch->hello(4096, 64, 3, kLong, "srv:2");
    ASSERT_TRUE(a) << error_of(a);
    EXPECT_EQ(ch->peer_version(), "6.06");
    server_saw = ch->peer_tail();
  });
  auto ch = PerftestChannel::connect("127.0.0.1", l->port(), kLong);
  ASSERT_TRUE(ch) << error_of(ch);
  auto a = ch->hello(4096, 64, 3, kLong, "ufab:1abcde");  // the most that fits: 16 - "6.06" and its NUL
  ASSERT_TRUE(a) << error_of(a);
  EXPECT_EQ(ch->peer_version(), "6.06");
  EXPECT_EQ(ch->peer_tail(), "srv:2");
  server.join();
  EXPECT_EQ(server_saw, "ufab:1abcde");
}

TEST(PerftestChannel, VersionTailMustFit) {
  FakePerftestServer server("6.06");
  auto ch = PerftestChannel::connect("127.0.0.1", server.listener->port(), kLong);
  ASSERT_TRUE(ch) << error_of(ch);
  auto too_long = ch->hello(4096, 64, 3, kLong, "ufab:1abcdef");
  ASSERT_FALSE(too_long);
  EXPECT_EQ(too_long.error().code(), EINVAL);
  EXPECT_NE(too_long.error().message().find("at most 11 bytes"), std::string::npos) << too_long.error().message();
  auto nul = ch->hello(4096, 64, 3, kLong, std::string_view("a\0b", 3));
  ASSERT_FALSE(nul);
  EXPECT_EQ(nul.error().code(), EINVAL);
  // Nothing was sent: the exchange still works.
  auto ok = ch->hello(4096, 64, 3, kLong, "ufab:0");
  ASSERT_TRUE(ok) << error_of(ok);
  server.thread.join();
  EXPECT_EQ(server.got_version, std::vector<uint8_t>({'6', '.', '0', '6', 0, 'u', 'f', 'a', 'b', ':', '0', 0, 0, 0, 0, 0}));
}

TEST(PerftestChannel, PeerClosingIsAnError) {
  auto l = TcpChannel::listen(0, "127.0.0.1");
  ASSERT_TRUE(l);
  std::thread peer([&] {
    auto ch = l->accept(kLong);  // accepts, then closes without a byte
  });
  auto ch = PerftestChannel::connect("127.0.0.1", l->port(), kLong);
  ASSERT_TRUE(ch);
  peer.join();
  auto agreed = ch->hello(4096, 64, 3, kLong);
  ASSERT_FALSE(agreed);
  EXPECT_NE(agreed.error().message().find("closed the connection"), std::string::npos) << agreed.error().message();
}

TEST(PerftestChannel, SilentPeerTimesOut) {
  auto l = TcpChannel::listen(0, "127.0.0.1");
  ASSERT_TRUE(l);
  std::optional<TcpChannel> held;
  std::thread peer([&] {
    auto ch = l->accept(kLong);
    if (ch) held.emplace(std::move(*ch));
  });
  auto ch = PerftestChannel::connect("127.0.0.1", l->port(), kLong);
  ASSERT_TRUE(ch);
  peer.join();
  auto t0 = std::chrono::steady_clock::now();
  auto agreed = ch->hello(4096, 64, 3, 200ms);
  ASSERT_FALSE(agreed);
  EXPECT_EQ(agreed.error().code(), ETIMEDOUT);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
}

// ------------------------------------------------------------ -R (rdma_cm)

// perftest's struct pingpong_dest (perftest_resources.h), as the compiler
// lays it out on x86-64: the GID is a union with a 64-bit member, so it
// and everything after it sit on 8-byte boundaries.
struct PingpongDest {
  int lid;
  int out_reads;
  int qpn;
  int psn;
  unsigned rkey;
  unsigned long long vaddr;
  union {
    uint8_t raw[16];
    struct {
      uint64_t subnet_prefix, interface_id;
    } global;
  } gid;
  unsigned srqn;
  int gid_index;
};
static_assert(sizeof(PingpongDest) == kPerftestDestSize);

// What rdma_write_keys puts in its send buffer (the HAVE_ENDIAN branch),
// with `pad` in the 4 bytes the compiler leaves after rkey.
PerftestDestBytes as_perftest_sends(const PerftestKeys& k, int gid_index, uint8_t pad) {
  PingpongDest d;
  std::memset(&d, pad, sizeof d);
  d.lid = int(htobe32(k.lid));
  d.out_reads = int(htobe32(k.out_reads));
  d.qpn = int(htobe32(k.qpn));
  d.psn = int(htobe32(k.psn));
  d.rkey = htobe32(k.rkey);
  d.srqn = htobe32(k.srqn);
  d.gid_index = int(htobe32(uint32_t(gid_index)));
  d.vaddr = htobe64(k.vaddr);
  std::memcpy(d.gid.raw, k.gid.data(), 16);
  PerftestDestBytes b;
  std::memcpy(b.data(), &d, sizeof d);
  return b;
}

TEST(PerftestDest, EncodesAsPerftestSendsIt) {
  PerftestKeys k = sample();
  k.srqn = 0x42;
  auto ours = encode_perftest_dest(k, 3);
  ASSERT_TRUE(ours) << error_of(ours);
  EXPECT_EQ(*ours, as_perftest_sends(k, 3, 0));  // our padding is zero
  // The offsets, spelled out.
  const PerftestDestBytes& b = *ours;
  EXPECT_EQ(std::vector<uint8_t>(b.begin(), b.begin() + 24),
            std::vector<uint8_t>({0, 0, 0, 0, 0, 0, 0, 16, 0, 0, 0, 0x11, 0, 0xab, 0xcd, 0xef, 0x12, 0x34, 0xab, 0xcd,
                                  0, 0, 0, 0}));
  EXPECT_EQ(std::vector<uint8_t>(b.begin() + 24, b.begin() + 32),
            std::vector<uint8_t>({0, 0, 0x7f, 0x12, 0x34, 0x56, 0x78, 0xc0}));
  EXPECT_EQ(b[42], 0xff);
  EXPECT_EQ(b[43], 0xff);
  EXPECT_EQ(b[44], 10);
  EXPECT_EQ(b[47], 1);
  EXPECT_EQ(std::vector<uint8_t>(b.begin() + 48, b.end()), std::vector<uint8_t>({0, 0, 0, 0x42, 0, 0, 0, 3}));
}

TEST(PerftestDest, DecodesWhatPerftestSends) {
  PerftestKeys k = sample();
  k.lid = 0xffff;
  k.srqn = 7;
  // perftest leaves its padding as the stack had it, and sends its GID
  // index (-1 without -x): neither is read.
  auto got = decode_perftest_dest(as_perftest_sends(k, -1, 0xa5));
  ASSERT_TRUE(got) << error_of(got);
  EXPECT_EQ(got->lid, 0xffff);
  EXPECT_EQ(got->out_reads, 16);
  EXPECT_EQ(got->qpn, 0x11u);
  EXPECT_EQ(got->psn, 0xabcdefu);
  EXPECT_EQ(got->rkey, 0x1234abcdu);
  EXPECT_EQ(got->vaddr, 0x00007f12345678c0ull);
  EXPECT_EQ(got->gid, k.gid);
  EXPECT_EQ(got->srqn, 7u);
  // The keys perftest sends before its test QPs exist: all zeros.
  PerftestDestBytes zeros{};
  auto z = decode_perftest_dest(zeros);
  ASSERT_TRUE(z) << error_of(z);
  EXPECT_EQ(z->qpn, 0u);
  EXPECT_EQ(z->vaddr, 0u);
}

TEST(PerftestDest, RejectsWhatPerftestDoesNotSend) {
  // A struct copied without byte-swapping (little-endian fields).
  PerftestKeys k = sample();
  PingpongDest d{};
  d.lid = 0;
  d.out_reads = 16;
  d.qpn = 0x11;
  d.psn = 0xabcdef;
  PerftestDestBytes raw;
  std::memcpy(raw.data(), &d, sizeof d);
  auto got = decode_perftest_dest(raw);
  ASSERT_FALSE(got);
  EXPECT_EQ(got.error().code(), EPROTO);
  EXPECT_NE(got.error().message().find("big-endian"), std::string::npos) << got.error().message();
  // Not 56 bytes.
  std::vector<uint8_t> short_one(52, 0);
  auto s = decode_perftest_dest(short_one);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message().find("56-byte struct pingpong_dest, got 52 bytes"), std::string::npos)
      << s.error().message();
  // A QPN over 24 bits does not go out.
  k.qpn = 1u << 24;
  EXPECT_FALSE(encode_perftest_dest(k));
}

// A link whose peer's messages are given in advance and whose own are
// kept: what the exchange sends over rdma_cm, message by message.
class ScriptedLink final : public PerftestLink {
 public:
  ScriptedLink(std::deque<std::vector<uint8_t>> in, std::vector<std::vector<uint8_t>>* out)
      : in_(std::move(in)), out_(out) {}
  Status send_block(std::span<const uint8_t> block, std::chrono::milliseconds) override {
    out_->emplace_back(block.begin(), block.end());
    return {};
  }
  Status recv_block(std::span<uint8_t> block, std::chrono::milliseconds) override {
    if (in_.empty()) return fail(ETIMEDOUT, "nothing more from the script");
    std::vector<uint8_t> m = std::move(in_.front());
    in_.pop_front();
    if (m.size() != block.size()) {
      return fail(EPROTO, "a " + std::to_string(m.size()) + "-byte message where " + std::to_string(block.size()) +
                              " were expected");
    }
    std::memcpy(block.data(), m.data(), m.size());
    return {};
  }
  const std::string& peer() const override { return peer_; }
  bool rdma_cm() const override { return true; }

 private:
  std::deque<std::vector<uint8_t>> in_;
  std::vector<std::vector<uint8_t>>* out_;
  std::string peer_ = "scripted";
};

TEST(PerftestChannel, OverRdmaCmKeysAreBinaryAndNoDone) {
  PerftestKeys theirs = sample();
  theirs.qpn = 0x77;
  auto dest = as_perftest_sends(theirs, 1, 0);
  std::vector<uint8_t> version(16, 0);
  std::memcpy(version.data(), "6.06", 4);
  std::deque<std::vector<uint8_t>> in = {version,
                                         {0, 0, 0x10, 0},
                                         {0, 0, 0, 64},
                                         {'3', 0},
                                         std::vector<uint8_t>(dest.begin(), dest.end()),
                                         std::vector<uint8_t>(dest.begin(), dest.end())};
  std::vector<std::vector<uint8_t>> out;
  PerftestChannel ch(std::make_unique<ScriptedLink>(std::move(in), &out), true);
  EXPECT_TRUE(ch.rdma_cm());
  auto agreed = ch.hello(4096, 64, 3, kLong);
  ASSERT_TRUE(agreed) << error_of(agreed);
  auto keys = ch.swap_keys(sample(), kLong);
  ASSERT_TRUE(keys) << error_of(keys);
  EXPECT_EQ(keys->qpn, 0x77u);
  ASSERT_TRUE(ch.close(sample(), kLong));
  // What went out: one message per block, the keys as pingpong_dest, and
  // nothing after the closing keys.
  ASSERT_EQ(out.size(), 6u);
  EXPECT_EQ(out[0].size(), 16u);
  EXPECT_EQ(out[1], std::vector<uint8_t>({0, 0, 0x10, 0}));
  EXPECT_EQ(out[2], std::vector<uint8_t>({0, 0, 0, 64}));
  EXPECT_EQ(out[3], std::vector<uint8_t>({'3', 0}));
  auto mine = *encode_perftest_dest(sample());
  EXPECT_EQ(out[4], std::vector<uint8_t>(mine.begin(), mine.end()));
  EXPECT_EQ(out[5], out[4]);
}

TEST(PerftestChannel, OverRdmaCmAMessageOfTheWrongSizeFails) {
  // The peer sends text keys (108 bytes) where pingpong_dest (56) belongs.
  auto text = as_perftest_writes(sample());
  std::deque<std::vector<uint8_t>> in = {std::vector<uint8_t>(text.begin(), text.end())};
  std::vector<std::vector<uint8_t>> out;
  PerftestChannel ch(std::make_unique<ScriptedLink>(std::move(in), &out), false);
  auto keys = ch.swap_keys(sample(), kLong);
  ASSERT_FALSE(keys);
  EXPECT_NE(keys.error().message().find("108-byte message where 56"), std::string::npos) << keys.error().message();
  EXPECT_TRUE(out.empty());  // the server reads first
}

}  // namespace
}  // namespace ufab::exchange
