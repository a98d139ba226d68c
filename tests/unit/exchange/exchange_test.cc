#include "tools/exchange/exchange.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace ufab::exchange {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using rdma::ConnectionData;

constexpr auto kLong = 5000ms;  // for waits that must succeed

std::string error_of(const auto& result) { return result ? std::string("(no error)") : result.error().message(); }

bool same(const ConnectionData& a, const ConnectionData& b) {
  return a.ip == b.ip && a.qpn == b.qpn && a.psn == b.psn && a.rkey == b.rkey && a.addr == b.addr &&
         a.length == b.length;
}

ConnectionData sample() { return {0x0A000001, 0x11, 0xa1b2c3, 0x100, 0x7f0000001000, 4096}; }

std::span<const uint8_t> bytes_of(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// A listener on an ephemeral loopback port whose single client `peer`
// handles on its own thread; join() before looking at what it recorded.
class LoopbackPeer {
 public:
  explicit LoopbackPeer(std::function<void(TcpChannel&)> peer) {
    auto l = TcpChannel::listen(0, "127.0.0.1");
    EXPECT_TRUE(l) << error_of(l);
    listener_.emplace(std::move(*l));
    thread_ = std::thread([this, peer = std::move(peer)] {
      auto ch = listener_->accept(kLong);
      if (!ch) {
        accept_error_ = ch.error().message();
        return;
      }
      peer(*ch);
    });
  }
  ~LoopbackPeer() { join(); }
  uint16_t port() const { return listener_->port(); }
  void join() {
    if (thread_.joinable()) thread_.join();
  }
  const std::string& accept_error() const { return accept_error_; }

 private:
  std::optional<TcpListener> listener_;
  std::thread thread_;
  std::string accept_error_;
};

Result<TcpChannel> connect_to(const LoopbackPeer& peer) { return TcpChannel::connect("127.0.0.1", peer.port(), kLong); }

// A port with nothing listening: bound once by the kernel's choice, then freed.
uint16_t closed_port() {
  auto l = TcpChannel::listen(0, "127.0.0.1");
  EXPECT_TRUE(l) << error_of(l);
  return l->port();
}

// ---- ufab's line codec ----

TEST(ConnectionLine, ExactText) {
  auto line = encode_connection_line(sample());
  ASSERT_TRUE(line) << error_of(line);
  EXPECT_EQ(*line, "UFAB1 10.0.0.1 000011 a1b2c3 00000100 00007f0000001000 4096\n");
}

TEST(ConnectionLine, RoundTrips) {
  for (const ConnectionData& d : {ConnectionData{}, sample(),
                                  ConnectionData{0xffffffff, 0xffffff, 0xffffff, 0xffffffff, ~0ull, 0xffffffff}}) {
    auto line = encode_connection_line(d);
    ASSERT_TRUE(line) << error_of(line);
    EXPECT_LE(line->size(), kConnectionLineMax);
    auto back = decode_connection_line(*line);
    ASSERT_TRUE(back) << error_of(back);
    EXPECT_TRUE(same(*back, d)) << *line;
  }
}

TEST(ConnectionLine, AcceptsUppercaseHexAndNoNewline) {
  auto d = decode_connection_line("UFAB1 192.168.1.20 ABCDEF 00000A DEADBEEF 0000000000001000 1");
  ASSERT_TRUE(d) << error_of(d);
  EXPECT_EQ(d->ip, 0xC0A80114u);
  EXPECT_EQ(d->qpn, 0xabcdefu);
  EXPECT_EQ(d->psn, 0xau);
  EXPECT_EQ(d->rkey, 0xdeadbeefu);
  EXPECT_EQ(d->addr, 0x1000u);
  EXPECT_EQ(d->length, 1u);
}

TEST(ConnectionLine, EncodeRejectsMoreThan24Bits) {
  ConnectionData d = sample();
  d.qpn = 0x1000000;
  auto line = encode_connection_line(d);
  ASSERT_FALSE(line);
  EXPECT_EQ(line.error().code(), EINVAL);
  EXPECT_NE(line.error().message().find("qpn"), std::string::npos) << line.error().message();
  d = sample();
  d.psn = 0x1000000;
  line = encode_connection_line(d);
  ASSERT_FALSE(line);
  EXPECT_NE(line.error().message().find("psn"), std::string::npos) << line.error().message();
}

void expect_decode_error(std::string_view line, const std::vector<std::string>& parts) {
  auto d = decode_connection_line(line);
  ASSERT_FALSE(d) << "accepted: " << line;
  EXPECT_EQ(d.error().code(), EPROTO);
  for (const auto& part : parts) {
    EXPECT_NE(d.error().message().find(part), std::string::npos) << "'" << part << "' not in: " << d.error().message();
  }
}

TEST(ConnectionLine, WrongMagic) {
  expect_decode_error("HELLO 10.0.0.1 000011 a1b2c3 00000100 00007f0000001000 4096\n",
                      {"'HELLO'", "not a ufab exchange"});
  expect_decode_error("UFAB2 10.0.0.1 000011 a1b2c3 00000100 00007f0000001000 4096", {"'UFAB2'", "version"});
  expect_decode_error("", {"''", "UFAB1"});
}

TEST(ConnectionLine, WrongFieldCount) {
  expect_decode_error("UFAB1 10.0.0.1 000011 a1b2c3 00000100 00007f0000001000", {"expected 7 fields", "saw 6"});
  expect_decode_error("UFAB1 10.0.0.1 000011 a1b2c3 00000100 00007f0000001000 4096 9", {"saw 8"});
  expect_decode_error("UFAB1 10.0.0.1  000011 a1b2c3 00000100 00007f0000001000 4096", {"saw 8"});
}

TEST(ConnectionLine, BadFields) {
  expect_decode_error("UFAB1 10.0.0.256 000011 a1b2c3 00000100 00007f0000001000 4096", {"field ip", "'10.0.0.256'"});
  expect_decode_error("UFAB1 10.0.0 000011 a1b2c3 00000100 00007f0000001000 4096", {"field ip", "'10.0.0'"});
  expect_decode_error("UFAB1 10.0.0.1 00001g a1b2c3 00000100 00007f0000001000 4096", {"field qpn", "6 hex", "'00001g'"});
  expect_decode_error("UFAB1 10.0.0.1 000011 a1b2c 00000100 00007f0000001000 4096", {"field psn", "'a1b2c'"});
  expect_decode_error("UFAB1 10.0.0.1 000011 a1b2c3 000000100 00007f0000001000 4096", {"field rkey", "8 hex"});
  expect_decode_error("UFAB1 10.0.0.1 000011 a1b2c3 00000100 0x007f0000001000 4096", {"field addr", "16 hex"});
  expect_decode_error("UFAB1 10.0.0.1 000011 a1b2c3 00000100 00007f0000001000 4294967296", {"field length"});
  expect_decode_error("UFAB1 10.0.0.1 000011 a1b2c3 00000100 00007f0000001000 -1", {"field length", "'-1'"});
  expect_decode_error("UFAB1 10.0.0.1 000011 a1b2c3 00000100 00007f0000001000 ", {"field length", "''"});
  expect_decode_error("UFAB1 10.0.0.1 000011 a1b2c3 00000100 00007f0000001000 4096\r\n", {"field length", "\\x0d"});
}

// ---- ibv_rc_pingpong's message ----

TEST(Pingpong, ExactBytes) {
  PingpongMessage m{0, 0x11, 0xa1b2c3, roce::gid_from_ipv4(0x0A000001)};
  auto bytes = encode_pingpong(m);
  ASSERT_TRUE(bytes) << error_of(bytes);
  std::string expected = "0000:000011:a1b2c3:00000000000000000000ffff0a000001";
  expected.push_back('\0');
  ASSERT_EQ(expected.size(), kPingpongMessageSize);
  EXPECT_EQ(std::string(bytes->begin(), bytes->end()), expected);
  EXPECT_EQ(kPingpongMessageSize, sizeof "0000:000000:000000:00000000000000000000000000000000");
}

TEST(Pingpong, RoundTrips) {
  roce::Gid gid;
  for (size_t i = 0; i < gid.size(); ++i) gid[i] = uint8_t(0xf0 + i);
  for (const PingpongMessage& m : {PingpongMessage{}, PingpongMessage{0xffff, 0xffffff, 0xffffff, gid},
                                   PingpongMessage{0x12, 0x345, 0x6789a, roce::gid_from_ipv4(0xC0A80001)}}) {
    auto bytes = encode_pingpong(m);
    ASSERT_TRUE(bytes) << error_of(bytes);
    auto back = decode_pingpong(*bytes);
    ASSERT_TRUE(back) << error_of(back);
    EXPECT_EQ(back->lid, m.lid);
    EXPECT_EQ(back->qpn, m.qpn);
    EXPECT_EQ(back->psn, m.psn);
    EXPECT_EQ(back->gid, m.gid);
  }
}

TEST(Pingpong, EncodeRejectsMoreThan24Bits) {
  auto bytes = encode_pingpong({0, 0x1000000, 0, {}});
  ASSERT_FALSE(bytes);
  EXPECT_EQ(bytes.error().code(), EINVAL);
}

TEST(Pingpong, DecodeAcceptsUppercase) {
  std::string text = "00AB:0000FF:ABCDEF:00000000000000000000FFFF0A000001";
  text.push_back('\0');
  auto m = decode_pingpong(bytes_of(text));
  ASSERT_TRUE(m) << error_of(m);
  EXPECT_EQ(m->lid, 0xab);
  EXPECT_EQ(m->qpn, 0xffu);
  EXPECT_EQ(m->psn, 0xabcdefu);
  EXPECT_EQ(roce::ipv4_from_gid(m->gid), std::optional<uint32_t>(0x0A000001));
}

void expect_pingpong_error(std::string text, const std::string& part) {
  auto m = decode_pingpong(bytes_of(text));
  ASSERT_FALSE(m) << "accepted: " << text;
  EXPECT_EQ(m.error().code(), EPROTO);
  EXPECT_NE(m.error().message().find(part), std::string::npos) << "'" << part << "' not in: " << m.error().message();
}

TEST(Pingpong, DecodeErrors) {
  const std::string good = std::string("0000:000011:a1b2c3:00000000000000000000ffff0a000001") + '\0';
  ASSERT_TRUE(decode_pingpong(bytes_of(good)));
  expect_pingpong_error(good.substr(0, 51), "expected 52 bytes, got 51");
  expect_pingpong_error(good + "x", "got 53");
  std::string t = good;
  t[51] = '\n';
  expect_pingpong_error(t, "NUL at offset 51");
  t = good;
  t[11] = '-';
  expect_pingpong_error(t, "':' at offset 11");
  t = good;
  t[2] = 'g';
  expect_pingpong_error(t, "field lid");
  t = good;
  t[6] = ' ';
  expect_pingpong_error(t, "field qpn");
  t = good;
  t[17] = 'x';
  expect_pingpong_error(t, "field psn");
  t = good;
  t[40] = 'z';
  expect_pingpong_error(t, "field gid");
}

TEST(Pingpong, DoneIsFiveBytesWithNul) {
  EXPECT_EQ(kPingpongDone.size(), sizeof "done");
  EXPECT_EQ(std::memcmp(kPingpongDone.data(), "done", sizeof "done"), 0);
}

// ---- TcpChannel ----

TEST(TcpChannel, LinesAndBytesOverLoopback) {
  std::string server_got;
  LoopbackPeer peer([&](TcpChannel& ch) {
    auto line = ch.recv_line(64, kLong);
    server_got = line ? *line : error_of(line);
    // A line and raw bytes in one send: recv_exact must see what recv_line buffered.
    std::string reply = "first\nsecond\nRAW";
    EXPECT_TRUE(ch.send_all(reply, kLong));
  });
  EXPECT_NE(peer.port(), 0);
  auto ch = connect_to(peer);
  ASSERT_TRUE(ch) << error_of(ch);
  EXPECT_EQ(ch->peer(), "127.0.0.1:" + std::to_string(peer.port()));
  ASSERT_TRUE(ch->send_all(std::string_view("hello there\n"), kLong));
  auto first = ch->recv_line(64, kLong);
  ASSERT_TRUE(first) << error_of(first);
  EXPECT_EQ(*first, "first");
  auto second = ch->recv_line(6, kLong);  // exactly max_len bytes is fine
  ASSERT_TRUE(second) << error_of(second);
  EXPECT_EQ(*second, "second");
  std::array<uint8_t, 3> raw{};
  auto n = ch->recv_exact(raw, kLong);
  ASSERT_TRUE(n) << error_of(n);
  EXPECT_EQ(*n, 3u);
  EXPECT_EQ(std::string(raw.begin(), raw.end()), "RAW");
  // Then the server closed: an orderly end between messages reads as 0.
  n = ch->recv_exact(raw, kLong);
  ASSERT_TRUE(n) << error_of(n);
  EXPECT_EQ(*n, 0u);
  peer.join();
  EXPECT_EQ(server_got, "hello there");
  EXPECT_EQ(peer.accept_error(), "");
}

TEST(TcpChannel, ListenAnyAcceptsLocalhostByName) {
  auto l = TcpChannel::listen(0);
  ASSERT_TRUE(l) << error_of(l);
  ASSERT_NE(l->port(), 0);
  for (const char* host : {"localhost", "127.0.0.1"}) {
    auto client = TcpChannel::connect(host, l->port(), kLong);
    ASSERT_TRUE(client) << error_of(client);
    auto server = l->accept(kLong);
    ASSERT_TRUE(server) << error_of(server);
    ASSERT_TRUE(client->send_all(std::string_view("x\n"), kLong));
    auto line = server->recv_line(8, kLong);
    ASSERT_TRUE(line) << error_of(line);
    EXPECT_EQ(*line, "x");
  }
}

TEST(TcpChannel, Ipv6Loopback) {
  auto l = TcpChannel::listen(0, "::1");
  if (!l) GTEST_SKIP() << "no IPv6 loopback here: " << l.error().message();
  auto client = TcpChannel::connect("::1", l->port(), kLong);
  ASSERT_TRUE(client) << error_of(client);
  EXPECT_EQ(client->peer(), "[::1]:" + std::to_string(l->port()));
  auto server = l->accept(kLong);
  ASSERT_TRUE(server) << error_of(server);
  EXPECT_EQ(server->peer().rfind("[::1]:", 0), 0u) << server->peer();
}

TEST(TcpChannel, ConnectToClosedPortGivesUpAtTheTimeout) {
  uint16_t port = closed_port();
  auto start = Clock::now();
  auto ch = TcpChannel::connect("127.0.0.1", port, 300ms);
  auto elapsed = Clock::now() - start;
  ASSERT_FALSE(ch);
  EXPECT_EQ(ch.error().code(), ECONNREFUSED);
  EXPECT_GE(elapsed, 300ms);
  EXPECT_LT(elapsed, 2000ms);
  const std::string& msg = ch.error().message();
  EXPECT_NE(msg.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << msg;
  EXPECT_NE(msg.find("refused for 300 ms"), std::string::npos) << msg;
  EXPECT_NE(msg.find("start the server"), std::string::npos) << msg;
}

TEST(TcpChannel, ConnectWaitsForAServerThatStartsLater) {
  uint16_t port = closed_port();
  std::string server_error;
  std::thread server([&] {
    std::this_thread::sleep_for(350ms);
    auto l = TcpChannel::listen(port, "127.0.0.1");
    if (!l) {
      server_error = l.error().message();
      return;
    }
    auto ch = l->accept(kLong);
    if (!ch) server_error = ch.error().message();
  });
  auto start = Clock::now();
  auto ch = TcpChannel::connect("127.0.0.1", port, kLong);
  auto elapsed = Clock::now() - start;
  server.join();
  ASSERT_EQ(server_error, "");
  ASSERT_TRUE(ch) << error_of(ch);
  EXPECT_GE(elapsed, 300ms);  // it really was refused at first
}

TEST(TcpChannel, AcceptTimesOut) {
  auto l = TcpChannel::listen(0, "127.0.0.1");
  ASSERT_TRUE(l) << error_of(l);
  auto start = Clock::now();
  auto ch = l->accept(200ms);
  auto elapsed = Clock::now() - start;
  ASSERT_FALSE(ch);
  EXPECT_EQ(ch.error().code(), ETIMEDOUT);
  EXPECT_GE(elapsed, 200ms);
  EXPECT_LT(elapsed, 2000ms);
  EXPECT_NE(ch.error().message().find("port " + std::to_string(l->port())), std::string::npos);
}

TEST(TcpChannel, ListenOnPortInUse) {
  auto l = TcpChannel::listen(0, "127.0.0.1");
  ASSERT_TRUE(l) << error_of(l);
  auto again = TcpChannel::listen(l->port(), "127.0.0.1");
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code(), EADDRINUSE);
  EXPECT_NE(again.error().message().find("in use"), std::string::npos) << again.error().message();
}

TEST(TcpChannel, RecvLineTimesOut) {
  LoopbackPeer peer([](TcpChannel& ch) {
    EXPECT_TRUE(ch.send_all(std::string_view("partial"), kLong));
    std::array<uint8_t, 1> b{};
    (void)ch.recv_exact(b, kLong);  // until the client closes
  });
  auto ch = connect_to(peer);
  ASSERT_TRUE(ch) << error_of(ch);
  auto start = Clock::now();
  auto line = ch->recv_line(64, 150ms);
  EXPECT_GE(Clock::now() - start, 150ms);
  ASSERT_FALSE(line);
  EXPECT_EQ(line.error().code(), ETIMEDOUT);
  EXPECT_NE(line.error().message().find("7 bytes without a newline"), std::string::npos) << line.error().message();
}

TEST(TcpChannel, RecvExactTimesOut) {
  LoopbackPeer peer([](TcpChannel& ch) {
    EXPECT_TRUE(ch.send_all(std::string_view("ab"), kLong));
    std::array<uint8_t, 1> b{};
    (void)ch.recv_exact(b, kLong);
  });
  auto ch = connect_to(peer);
  ASSERT_TRUE(ch) << error_of(ch);
  std::array<uint8_t, 4> buf{};
  auto n = ch->recv_exact(buf, 150ms);
  ASSERT_FALSE(n);
  EXPECT_EQ(n.error().code(), ETIMEDOUT);
  EXPECT_NE(n.error().message().find("after 2 of 4 bytes"), std::string::npos) << n.error().message();
}

TEST(TcpChannel, RecvExactPeerClosesMidMessage) {
  LoopbackPeer peer([](TcpChannel& ch) { EXPECT_TRUE(ch.send_all(std::string_view("abc"), kLong)); });
  auto ch = connect_to(peer);
  ASSERT_TRUE(ch) << error_of(ch);
  std::array<uint8_t, 8> buf{};
  auto n = ch->recv_exact(buf, kLong);
  ASSERT_FALSE(n);
  EXPECT_EQ(n.error().code(), ECONNRESET);
  EXPECT_NE(n.error().message().find("peer closed the connection after 3 of 8 bytes"), std::string::npos)
      << n.error().message();
}

TEST(TcpChannel, RecvLinePeerClosesMidLine) {
  LoopbackPeer peer([](TcpChannel& ch) { EXPECT_TRUE(ch.send_all(std::string_view("UFAB1 10."), kLong)); });
  auto ch = connect_to(peer);
  ASSERT_TRUE(ch) << error_of(ch);
  auto line = ch->recv_line(64, kLong);
  ASSERT_FALSE(line);
  EXPECT_EQ(line.error().code(), ECONNRESET);
  EXPECT_NE(line.error().message().find("after 9 bytes of a line"), std::string::npos) << line.error().message();
  EXPECT_NE(line.error().message().find("'UFAB1 10.'"), std::string::npos) << line.error().message();
}

TEST(TcpChannel, RecvLinePeerClosesBeforeALine) {
  LoopbackPeer peer([](TcpChannel&) {});
  auto ch = connect_to(peer);
  ASSERT_TRUE(ch) << error_of(ch);
  auto line = ch->recv_line(64, kLong);
  ASSERT_FALSE(line);
  EXPECT_EQ(line.error().code(), ECONNRESET);
  EXPECT_NE(line.error().message().find("before sending a line"), std::string::npos) << line.error().message();
}

TEST(TcpChannel, RecvLineTooLong) {
  LoopbackPeer peer([](TcpChannel& ch) {
    EXPECT_TRUE(ch.send_all(std::string(200, 'a'), kLong));
    std::array<uint8_t, 1> b{};
    (void)ch.recv_exact(b, kLong);
  });
  auto ch = connect_to(peer);
  ASSERT_TRUE(ch) << error_of(ch);
  auto line = ch->recv_line(128, kLong);  // fails as soon as 129 bytes lack a newline, not at the timeout
  ASSERT_FALSE(line);
  EXPECT_EQ(line.error().code(), EMSGSIZE);
  EXPECT_NE(line.error().message().find("longer than 128 bytes"), std::string::npos) << line.error().message();
}

TEST(TcpChannel, RecvLineOneByteOverMaxWithNewline) {
  LoopbackPeer peer([](TcpChannel& ch) { EXPECT_TRUE(ch.send_all(std::string_view("1234567\n"), kLong)); });
  auto ch = connect_to(peer);
  ASSERT_TRUE(ch) << error_of(ch);
  auto line = ch->recv_line(6, kLong);
  ASSERT_FALSE(line);
  EXPECT_EQ(line.error().code(), EMSGSIZE);
}

TEST(TcpChannel, RecvLineRejectsBinary) {
  LoopbackPeer peer([](TcpChannel& ch) {
    auto m = encode_pingpong({0, 0x11, 0x22, roce::gid_from_ipv4(0x0A000001)});
    ASSERT_TRUE(m);
    EXPECT_TRUE(ch.send_all(*m, kLong));
    std::array<uint8_t, 1> b{};
    (void)ch.recv_exact(b, kLong);
  });
  auto ch = connect_to(peer);
  ASSERT_TRUE(ch) << error_of(ch);
  auto start = Clock::now();
  auto line = ch->recv_line(128, kLong);
  EXPECT_LT(Clock::now() - start, 2000ms);
  ASSERT_FALSE(line);
  EXPECT_EQ(line.error().code(), EPROTO);
  EXPECT_NE(line.error().message().find("NUL byte at offset 51"), std::string::npos) << line.error().message();
}

TEST(TcpChannel, SendToClosedPeerFailsWithoutSigpipe) {
  LoopbackPeer peer([](TcpChannel&) {});
  auto ch = connect_to(peer);
  ASSERT_TRUE(ch) << error_of(ch);
  peer.join();
  // The first send may still be accepted; the peer's RST fails a later one.
  Status sent;
  for (int i = 0; i < 50 && sent; ++i) {
    sent = ch->send_all(std::string(4096, 'x'), kLong);
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_FALSE(sent);
  EXPECT_TRUE(sent.error().code() == EPIPE || sent.error().code() == ECONNRESET) << sent.error().message();
  EXPECT_NE(sent.error().message().find("peer closed the connection"), std::string::npos) << sent.error().message();
}

TEST(TcpChannel, SendTimesOutWhenThePeerDoesNotRead) {
  LoopbackPeer peer([](TcpChannel& ch) {
    std::this_thread::sleep_for(600ms);
    (void)ch;
  });
  auto ch = connect_to(peer);
  ASSERT_TRUE(ch) << error_of(ch);
  std::string big(64 << 20, 'x');
  auto start = Clock::now();
  auto sent = ch->send_all(big, 150ms);
  EXPECT_GE(Clock::now() - start, 150ms);
  ASSERT_FALSE(sent);
  EXPECT_EQ(sent.error().code(), ETIMEDOUT);
  EXPECT_NE(sent.error().message().find("not reading"), std::string::npos) << sent.error().message();
}

// ---- the exchange ----

TEST(Exchange, RoundTripOverLoopback) {
  auto l = TcpChannel::listen(0, "127.0.0.1");
  ASSERT_TRUE(l) << error_of(l);
  ConnectionData server_side{0x0A000002, 0x12, 0x345678, 0xcafe0001, 0x1000, 65536};
  ConnectionData client_side = sample();
  Result<ConnectionData> server_got = fail(0, "not run");
  std::thread server([&] { server_got = exchange_as_server(*l, server_side, kLong); });
  auto client_got = exchange_as_client("127.0.0.1", l->port(), client_side, kLong);
  server.join();
  ASSERT_TRUE(server_got) << error_of(server_got);
  ASSERT_TRUE(client_got) << error_of(client_got);
  EXPECT_TRUE(same(*server_got, client_side));
  EXPECT_TRUE(same(*client_got, server_side));
}

TEST(Exchange, ServerTimesOutWithoutClient) {
  auto l = TcpChannel::listen(0, "127.0.0.1");
  ASSERT_TRUE(l) << error_of(l);
  auto got = exchange_as_server(*l, sample(), 100ms);
  ASSERT_FALSE(got);
  EXPECT_EQ(got.error().code(), ETIMEDOUT);
  EXPECT_NE(got.error().message().find("timeout 100 ms"), std::string::npos) << got.error().message();
}

TEST(Exchange, ClientTimesOutWithoutServer) {
  uint16_t port = closed_port();
  auto got = exchange_as_client("127.0.0.1", port, sample(), 200ms);
  ASSERT_FALSE(got);
  EXPECT_EQ(got.error().code(), ECONNREFUSED);
  EXPECT_NE(got.error().message().find("as client of 127.0.0.1:" + std::to_string(port)), std::string::npos)
      << got.error().message();
}

TEST(Exchange, ServerRejectsWrongMagicAndClientSeesTheClose) {
  auto l = TcpChannel::listen(0, "127.0.0.1");
  ASSERT_TRUE(l) << error_of(l);
  Result<ConnectionData> server_got = fail(0, "not run");
  std::thread server([&] { server_got = exchange_as_server(*l, sample(), kLong); });
  auto ch = TcpChannel::connect("127.0.0.1", l->port(), kLong);
  ASSERT_TRUE(ch) << error_of(ch);
  ASSERT_TRUE(ch->send_all(std::string_view("HELLO 10.0.0.1\n"), kLong));
  auto answer = ch->recv_line(kConnectionLineMax, kLong);
  server.join();
  ASSERT_FALSE(server_got);
  EXPECT_EQ(server_got.error().code(), EPROTO);
  EXPECT_NE(server_got.error().message().find("'HELLO'"), std::string::npos) << server_got.error().message();
  ASSERT_FALSE(answer);  // the server does not answer a line it cannot read
  EXPECT_EQ(answer.error().code(), ECONNRESET);
}

TEST(Exchange, ServerSeesClientCloseEarly) {
  auto l = TcpChannel::listen(0, "127.0.0.1");
  ASSERT_TRUE(l) << error_of(l);
  Result<ConnectionData> server_got = fail(0, "not run");
  std::thread server([&] { server_got = exchange_as_server(*l, sample(), kLong); });
  {
    auto ch = TcpChannel::connect("127.0.0.1", l->port(), kLong);
    ASSERT_TRUE(ch) << error_of(ch);
    ASSERT_TRUE(ch->send_all(std::string_view("UFAB1 10.0.0.1 0000"), kLong));
  }
  server.join();
  ASSERT_FALSE(server_got);
  EXPECT_EQ(server_got.error().code(), ECONNRESET);
  EXPECT_NE(server_got.error().message().find("reading the client's line"), std::string::npos)
      << server_got.error().message();
  EXPECT_NE(server_got.error().message().find("after 19 bytes of a line"), std::string::npos)
      << server_got.error().message();
}

TEST(Exchange, ServerRejectsRcPingpongClientQuickly) {
  auto l = TcpChannel::listen(0, "127.0.0.1");
  ASSERT_TRUE(l) << error_of(l);
  Result<ConnectionData> server_got = fail(0, "not run");
  std::thread server([&] { server_got = exchange_as_server(*l, sample(), kLong); });
  auto ch = TcpChannel::connect("127.0.0.1", l->port(), kLong);
  ASSERT_TRUE(ch) << error_of(ch);
  auto m = encode_pingpong({0, 0x11, 0x22, roce::gid_from_ipv4(0x0A000001)});
  ASSERT_TRUE(m);
  ASSERT_TRUE(ch->send_all(*m, kLong));
  auto start = Clock::now();
  server.join();
  EXPECT_LT(Clock::now() - start, 2000ms);
  ASSERT_FALSE(server_got);
  EXPECT_EQ(server_got.error().code(), EPROTO);
}

TEST(Exchange, ClientRejectsMalformedAnswer) {
  LoopbackPeer peer([](TcpChannel& ch) {
    auto line = ch.recv_line(kConnectionLineMax, kLong);
    EXPECT_TRUE(line) << error_of(line);
    EXPECT_TRUE(ch.send_all(std::string_view("UFAB1 10.0.0.2 0000zz 000001 00000002 0000000000000000 8\n"), kLong));
  });
  auto got = exchange_as_client("127.0.0.1", peer.port(), sample(), kLong);
  ASSERT_FALSE(got);
  EXPECT_EQ(got.error().code(), EPROTO);
  EXPECT_NE(got.error().message().find("field qpn"), std::string::npos) << got.error().message();
  EXPECT_NE(got.error().message().find("'0000zz'"), std::string::npos) << got.error().message();
}

TEST(Exchange, ClientSeesServerCloseWithoutAnswer) {
  LoopbackPeer peer([](TcpChannel& ch) {
    auto line = ch.recv_line(kConnectionLineMax, kLong);
    EXPECT_TRUE(line) << error_of(line);
  });
  auto got = exchange_as_client("127.0.0.1", peer.port(), sample(), kLong);
  ASSERT_FALSE(got);
  EXPECT_EQ(got.error().code(), ECONNRESET);
  EXPECT_NE(got.error().message().find("reading the server's line"), std::string::npos) << got.error().message();
  EXPECT_NE(got.error().message().find("before sending a line"), std::string::npos) << got.error().message();
}

TEST(Exchange, ClientRefusesToEncodeWideQpn) {
  ConnectionData d = sample();
  d.qpn = 0x1000000;
  auto got = exchange_as_client("127.0.0.1", closed_port(), d, kLong);
  ASSERT_FALSE(got);
  EXPECT_EQ(got.error().code(), EINVAL);  // before any connect attempt, so no 5 s wait
}

}  // namespace
}  // namespace ufab::exchange
