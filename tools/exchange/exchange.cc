#include "tools/exchange/exchange.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

namespace ufab::exchange {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

Clock::time_point deadline_after(milliseconds timeout) { return Clock::now() + std::max(timeout, milliseconds(0)); }

milliseconds time_left(Clock::time_point deadline) {
  auto left = deadline - Clock::now();
  return left <= Clock::duration::zero() ? milliseconds(0) : std::chrono::ceil<milliseconds>(left);
}

// Waits until `fd` reports one of `events` (or an error/hangup, which the
// next system call reports properly). false: the deadline passed.
Result<bool> wait_for(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    // Rounded up: rounding down would spin on poll(0) for the last fraction.
    int ms = int(std::min<milliseconds::rep>(time_left(deadline).count(), INT_MAX));
    int r = ::poll(&p, 1, ms);
    if (r > 0) return true;
    if (r == 0 && Clock::now() >= deadline) return false;
    if (r < 0 && errno != EINTR) return fail_errno("poll");
  }
}

std::string host_port(const std::string& host, uint16_t port) {
  bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

std::string sockaddr_text(const sockaddr_storage& ss) {
  char text[INET6_ADDRSTRLEN] = "?";
  if (ss.ss_family == AF_INET) {
    auto& sin = reinterpret_cast<const sockaddr_in&>(ss);
    inet_ntop(AF_INET, &sin.sin_addr, text, sizeof text);
    return host_port(text, ntohs(sin.sin_port));
  }
  auto& sin6 = reinterpret_cast<const sockaddr_in6&>(ss);
  if (IN6_IS_ADDR_V4MAPPED(&sin6.sin6_addr)) {
    inet_ntop(AF_INET, &sin6.sin6_addr.s6_addr[12], text, sizeof text);
  } else {
    inet_ntop(AF_INET6, &sin6.sin6_addr, text, sizeof text);
  }
  return host_port(text, ntohs(sin6.sin6_port));
}

using AddrInfoPtr = std::unique_ptr<addrinfo, decltype(&freeaddrinfo)>;

Result<AddrInfoPtr> resolve(const std::string& host, uint16_t port, int flags, const std::string& where) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = flags | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) {
    return fail(rc == EAI_SYSTEM ? errno : ENXIO,
                "resolving " + where + ": " + gai_strerror(rc) + "; check the host name or use an IP address");
  }
  return AddrInfoPtr(res, &freeaddrinfo);
}

// One non-blocking connect attempt; errors carry the connect errno.
Result<UniqueFd> try_connect(const addrinfo& ai, Clock::time_point deadline) {
  UniqueFd fd(::socket(ai.ai_family, ai.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai.ai_protocol));
  if (!fd.valid()) return fail_errno("socket");
  // EINTR leaves a non-blocking connect running, like EINPROGRESS.
  if (::connect(fd.get(), ai.ai_addr, ai.ai_addrlen) == 0) return fd;
  if (errno != EINPROGRESS && errno != EINTR) return fail_errno("connect");
  auto ready = wait_for(fd.get(), POLLOUT, deadline);
  if (!ready) return std::unexpected(ready.error());
  if (!*ready) return fail(ETIMEDOUT, "connect: no answer");
  int err = 0;
  socklen_t len = sizeof err;
  if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) < 0) return fail_errno("getsockopt(SO_ERROR)");
  if (err != 0) return fail_errno(err, "connect");
  return fd;
}

// Some bytes into `buf`; 0 at EOF. Errors keep recv's errno, ETIMEDOUT at
// the deadline; callers word the message.
Result<size_t> recv_some(int fd, std::span<uint8_t> buf, Clock::time_point deadline) {
  for (;;) {
    ssize_t n = ::recv(fd, buf.data(), buf.size(), MSG_DONTWAIT);
    if (n >= 0) return size_t(n);
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return fail_errno("recv");
    auto ready = wait_for(fd, POLLIN, deadline);
    if (!ready) return std::unexpected(ready.error());
    if (!*ready) return fail(ETIMEDOUT, "timed out");
  }
}

std::optional<uint32_t> parse_u32(std::string_view text) {
  if (text.empty() || text.size() > 10) return std::nullopt;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + uint64_t(c - '0');
  }
  if (v > UINT32_MAX) return std::nullopt;
  return uint32_t(v);
}

Status check_24_bits(const char* what, uint32_t qpn, uint32_t psn) {
  if (qpn > 0xffffff) return fail(EINVAL, std::string(what) + ": qpn " + std::to_string(qpn) + " does not fit 24 bits");
  if (psn > 0xffffff) return fail(EINVAL, std::string(what) + ": psn " + std::to_string(psn) + " does not fit 24 bits");
  return {};
}

constexpr char kMagic[] = "UFAB1";

}  // namespace

std::string shown(std::string_view bytes) {
  std::string out = "'";
  for (size_t i = 0; i < bytes.size() && i < 64; ++i) {
    unsigned char c = static_cast<unsigned char>(bytes[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += char(c);
    } else {
      char esc[5];
      std::snprintf(esc, sizeof esc, "\\x%02x", c);
      out += esc;
    }
  }
  return out + (bytes.size() > 64 ? "'..." : "'");
}

std::optional<uint64_t> parse_hex(std::string_view text, size_t digits) {
  if (text.size() != digits) return std::nullopt;
  uint64_t v = 0;
  for (char c : text) {
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return std::nullopt;
    v = v << 4 | uint64_t(d);
  }
  return v;
}

Result<TcpChannel> TcpChannel::connect(const std::string& host, uint16_t port, milliseconds timeout) {
  const std::string where = host_port(host, port);
  auto addrs = resolve(host, port, 0, where);
  if (!addrs) return std::unexpected(addrs.error());
  const auto deadline = deadline_after(timeout);
  int last_err = 0;
  for (;;) {
    bool refused = false;
    for (const addrinfo* ai = addrs->get(); ai; ai = ai->ai_next) {
      auto fd = try_connect(*ai, deadline);
      if (fd) return TcpChannel(std::move(*fd), where);
      last_err = fd.error().code();
      refused |= last_err == ECONNREFUSED;
    }
    // Refused means nothing listens yet; a server started later still counts.
    if (!refused || Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::min(milliseconds(100), time_left(deadline)));
  }
  const std::string budget = std::to_string(timeout.count()) + " ms";
  if (last_err == ECONNREFUSED) {
    return fail(ECONNREFUSED, "connecting to " + where + ": connection refused for " + budget +
                                  " (nothing listens there); start the server first, check the port, "
                                  "or allow a longer timeout");
  }
  if (last_err == ETIMEDOUT) {
    return fail(ETIMEDOUT, "connecting to " + where + ": no answer within " + budget +
                               "; check that the host is up and reachable and that no firewall drops the port");
  }
  return fail_errno(last_err, "connecting to " + where);
}

Result<TcpListener> TcpChannel::listen(uint16_t port, const std::string& bind_address) {
  const std::string where = bind_address.empty() ? "port " + std::to_string(port) : host_port(bind_address, port);
  std::vector<sockaddr_storage> candidates;
  if (bind_address.empty()) {
    // IPv6 any with V6ONLY off takes IPv4 clients too; plain IPv4 any is the
    // fallback for hosts without IPv6.
    sockaddr_storage ss{};
    auto& sin6 = reinterpret_cast<sockaddr_in6&>(ss);
    sin6.sin6_family = AF_INET6;
    sin6.sin6_addr = in6addr_any;
    sin6.sin6_port = htons(port);
    candidates.push_back(ss);
    ss = {};
    auto& sin = reinterpret_cast<sockaddr_in&>(ss);
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_ANY);
    sin.sin_port = htons(port);
    candidates.push_back(ss);
  } else {
    auto addrs = resolve(bind_address, port, AI_PASSIVE, where);
    if (!addrs) return std::unexpected(addrs.error());
    for (const addrinfo* ai = addrs->get(); ai; ai = ai->ai_next) {
      sockaddr_storage ss{};
      std::memcpy(&ss, ai->ai_addr, std::min<size_t>(ai->ai_addrlen, sizeof ss));
      candidates.push_back(ss);
    }
  }

  std::optional<Error> last;
  for (const auto& ss : candidates) {
    UniqueFd fd(::socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd.valid()) {
      last = fail_errno("listening on " + where + ": socket").error();
      continue;
    }
    int one = 1, zero = 0;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (ss.ss_family == AF_INET6 && bind_address.empty()) {
      ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    }
    socklen_t len = ss.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
    if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&ss), len) < 0) {
      int err = errno;
      last = err == EADDRINUSE
                 ? Error(err, "listening on " + where +
                                  ": the port is in use; stop the process that holds it or pick another port")
                 : fail_errno(err, "listening on " + where + ": bind").error();
      if (err == EADDRINUSE) break;
      continue;
    }
    if (::listen(fd.get(), 8) < 0) {
      last = fail_errno("listening on " + where + ": listen").error();
      continue;
    }
    sockaddr_storage bound{};
    socklen_t blen = sizeof bound;
    if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &blen) < 0) {
      return fail_errno("listening on " + where + ": getsockname");
    }
    uint16_t bound_port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6&>(bound).sin6_port)
                                                     : ntohs(reinterpret_cast<sockaddr_in&>(bound).sin_port);
    return TcpListener(std::move(fd), bound_port);
  }
  return std::unexpected(last.value_or(Error(EADDRNOTAVAIL, "listening on " + where + ": no address to bind")));
}

Result<TcpChannel> TcpListener::accept(milliseconds timeout) {
  const auto deadline = deadline_after(timeout);
  const std::string where = "port " + std::to_string(port_);
  for (;;) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    int fd = ::accept4(fd_.get(), reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) return TcpChannel(UniqueFd(fd), sockaddr_text(ss));
    // A client that gave up between poll and accept is not our failure.
    if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return fail_errno("accepting on " + where);
    auto ready = wait_for(fd_.get(), POLLIN, deadline);
    if (!ready) return std::unexpected(ready.error().context("accepting on " + where));
    if (!*ready) {
      return fail(ETIMEDOUT, "no client connected to " + where + " within " + std::to_string(timeout.count()) +
                                 " ms; start the client and check that it targets this host and port");
    }
  }
}

Status TcpChannel::send_all(std::span<const uint8_t> data, milliseconds timeout) {
  const auto deadline = deadline_after(timeout);
  size_t sent = 0;
  auto progress = [&] { return std::to_string(sent) + " of " + std::to_string(data.size()) + " bytes"; };
  while (sent < data.size()) {
    ssize_t n = ::send(fd_.get(), data.data() + sent, data.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      sent += size_t(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) {
      return fail(errno, "sending to " + peer_ + ": peer closed the connection after " + progress() +
                             "; its own log says why");
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return fail_errno("sending to " + peer_);
    auto ready = wait_for(fd_.get(), POLLOUT, deadline);
    if (!ready) return std::unexpected(ready.error().context("sending to " + peer_));
    if (!*ready) {
      return fail(ETIMEDOUT, "sending to " + peer_ + ": timed out after " + progress() + "; the peer is not reading");
    }
  }
  return {};
}

Status TcpChannel::send_all(std::string_view text, milliseconds timeout) {
  return send_all(std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()), timeout);
}

Result<size_t> TcpChannel::recv_exact(std::span<uint8_t> buf, milliseconds timeout) {
  size_t got = std::min(buffered_.size(), buf.size());
  std::memcpy(buf.data(), buffered_.data(), got);
  buffered_.erase(0, got);
  const auto deadline = deadline_after(timeout);
  auto progress = [&] { return std::to_string(got) + " of " + std::to_string(buf.size()) + " bytes"; };
  while (got < buf.size()) {
    auto n = recv_some(fd_.get(), buf.subspan(got), deadline);
    if (!n && n.error().code() == ETIMEDOUT) {
      return fail(ETIMEDOUT, "receiving from " + peer_ + ": timed out after " + progress() +
                                 "; the peer is stuck or waits for us to send first");
    }
    if (!n) return std::unexpected(n.error().context("receiving from " + peer_ + " after " + progress()));
    if (*n == 0) {
      if (got == 0) return 0;
      return fail(ECONNRESET, "receiving from " + peer_ + ": peer closed the connection after " + progress() +
                                  "; its own log says why");
    }
    got += *n;
  }
  return got;
}

Result<std::string> TcpChannel::recv_line(size_t max_len, milliseconds timeout) {
  const auto deadline = deadline_after(timeout);
  size_t scanned = 0;
  for (;;) {
    size_t nl = buffered_.find('\n', scanned);
    size_t end = std::min(nl, buffered_.size());
    if (size_t nul = buffered_.find('\0', scanned); nul < end) {
      return fail(EPROTO, "line from " + peer_ + " has a NUL byte at offset " + std::to_string(nul) +
                              ": binary data, not a text line; is the peer speaking another protocol? It sent " +
                              shown(buffered_));
    }
    if (end > max_len) {
      return fail(EMSGSIZE, "line from " + peer_ + " is longer than " + std::to_string(max_len) +
                                " bytes; is the peer speaking another protocol? It sent " + shown(buffered_));
    }
    if (nl != std::string::npos) {
      std::string line = buffered_.substr(0, nl);
      buffered_.erase(0, nl + 1);
      return line;
    }
    scanned = buffered_.size();

    uint8_t chunk[512];
    auto n = recv_some(fd_.get(), chunk, deadline);
    if (!n && n.error().code() == ETIMEDOUT) {
      return fail(ETIMEDOUT, "timed out waiting for a line from " + peer_ + " (" + std::to_string(buffered_.size()) +
                                 " bytes without a newline so far); the peer is stuck or waits for us to send first");
    }
    if (!n) return std::unexpected(n.error().context("receiving a line from " + peer_));
    if (*n == 0) {
      if (buffered_.empty()) {
        return fail(ECONNRESET, "peer " + peer_ + " closed the connection before sending a line; its own log says why");
      }
      return fail(ECONNRESET, "peer " + peer_ + " closed the connection after " + std::to_string(buffered_.size()) +
                                  " bytes of a line, before its newline: " + shown(buffered_));
    }
    buffered_.append(reinterpret_cast<const char*>(chunk), *n);
  }
}

Result<std::string> encode_connection_line(const rdma::ConnectionData& d) {
  if (auto ok = check_24_bits("encoding connection data", d.qpn, d.psn); !ok) return std::unexpected(ok.error());
  char line[kConnectionLineMax];
  int n = std::snprintf(line, sizeof line, "%s %s %06x %06x %08x %016llx %u\n", kMagic,
                        roce::ipv4_to_string(d.ip).c_str(), d.qpn, d.psn, d.rkey,
                        static_cast<unsigned long long>(d.addr), d.length);
  return std::string(line, size_t(n));
}

Result<rdma::ConnectionData> decode_connection_line(std::string_view line) {
  if (!line.empty() && line.back() == '\n') line.remove_suffix(1);
  std::vector<std::string_view> fields;
  for (size_t start = 0;;) {
    size_t sp = line.find(' ', start);
    fields.push_back(line.substr(start, sp - start));
    if (sp == std::string_view::npos) break;
    start = sp + 1;
  }
  const std::string seen = " in " + shown(line);
  if (fields[0] != kMagic) {
    bool other_version = fields[0].starts_with("UFAB");
    return fail(EPROTO, "connection line starts with " + shown(fields[0]) + ", not '" + kMagic + "'" +
                            (other_version ? ": the peer runs another ufab version; run the same version on both sides"
                                           : ": the peer is not a ufab exchange"));
  }
  if (fields.size() != 7) {
    return fail(EPROTO, "connection line: expected 7 fields separated by single spaces "
                        "(UFAB1 ip qpn psn rkey addr length), saw " +
                            std::to_string(fields.size()) + seen);
  }
  auto bad = [&](const char* field, const char* expected, std::string_view value) {
    return fail(EPROTO, std::string("connection line field ") + field + ": expected " + expected + ", saw " +
                            shown(value) + seen);
  };
  rdma::ConnectionData d;
  auto ip = roce::ipv4_from_string(fields[1]);
  if (!ip) return bad("ip", "a dotted IPv4 address", fields[1]);
  d.ip = *ip;
  struct HexField {
    const char* name;
    const char* expected;
    size_t digits;
  };
  const HexField hex[] = {{"qpn", "6 hex digits", 6},
                          {"psn", "6 hex digits", 6},
                          {"rkey", "8 hex digits", 8},
                          {"addr", "16 hex digits", 16}};
  uint64_t values[4];
  for (size_t i = 0; i < 4; ++i) {
    auto v = parse_hex(fields[2 + i], hex[i].digits);
    if (!v) return bad(hex[i].name, hex[i].expected, fields[2 + i]);
    values[i] = *v;
  }
  d.qpn = uint32_t(values[0]);
  d.psn = uint32_t(values[1]);
  d.rkey = uint32_t(values[2]);
  d.addr = values[3];
  auto length = parse_u32(fields[6]);
  if (!length) return bad("length", "a decimal number up to 4294967295", fields[6]);
  d.length = *length;
  return d;
}

Result<PingpongBytes> encode_pingpong(const PingpongMessage& m) {
  if (auto ok = check_24_bits("encoding rc_pingpong message", m.qpn, m.psn); !ok) return std::unexpected(ok.error());
  char text[kPingpongMessageSize];  // 51 characters and the NUL, like rc_pingpong's msg[]
  std::snprintf(text, sizeof text, "%04x:%06x:%06x:%s", unsigned(m.lid), m.qpn, m.psn,
                roce::gid_to_wire_hex(m.gid).c_str());
  PingpongBytes bytes;
  std::memcpy(bytes.data(), text, bytes.size());
  return bytes;
}

Result<PingpongMessage> decode_pingpong(std::span<const uint8_t> bytes) {
  std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  if (bytes.size() != kPingpongMessageSize) {
    return fail(EPROTO, "rc_pingpong message: expected " + std::to_string(kPingpongMessageSize) + " bytes, got " +
                            std::to_string(bytes.size()) + ": " + shown(text));
  }
  auto bad = [&](const std::string& what) {
    return fail(EPROTO, "rc_pingpong message: " + what + " in " + shown(text) +
                            "; expected lid:qpn:psn:gid as %04x:%06x:%06x:<32 hex digits> and a NUL");
  };
  for (size_t at : {size_t(4), size_t(11), size_t(18)}) {
    if (text[at] != ':') return bad("expected ':' at offset " + std::to_string(at) + ", saw " + shown(text.substr(at, 1)));
  }
  if (text[51] != '\0') return bad("expected the terminating NUL at offset 51, saw " + shown(text.substr(51, 1)));
  PingpongMessage m;
  auto lid = parse_hex(text.substr(0, 4), 4);
  if (!lid) return bad("field lid: expected 4 hex digits, saw " + shown(text.substr(0, 4)));
  auto qpn = parse_hex(text.substr(5, 6), 6);
  if (!qpn) return bad("field qpn: expected 6 hex digits, saw " + shown(text.substr(5, 6)));
  auto psn = parse_hex(text.substr(12, 6), 6);
  if (!psn) return bad("field psn: expected 6 hex digits, saw " + shown(text.substr(12, 6)));
  auto gid = roce::gid_from_wire_hex(text.substr(19, 32));
  if (!gid) return bad("field gid: expected 32 hex digits, saw " + shown(text.substr(19, 32)));
  m.lid = uint16_t(*lid);
  m.qpn = uint32_t(*qpn);
  m.psn = uint32_t(*psn);
  m.gid = *gid;
  return m;
}

Result<rdma::ConnectionData> exchange_as_server(TcpListener& listener, const rdma::ConnectionData& local,
                                                milliseconds timeout) {
  const std::string what = "connection exchange as server on port " + std::to_string(listener.port()) +
                           " (timeout " + std::to_string(timeout.count()) + " ms)";
  auto ours = encode_connection_line(local);
  if (!ours) return std::unexpected(ours.error().context(what));
  const auto deadline = deadline_after(timeout);
  auto channel = listener.accept(timeout);
  if (!channel) return std::unexpected(channel.error().context(what));
  auto line = channel->recv_line(kConnectionLineMax, time_left(deadline));
  if (!line) return std::unexpected(line.error().context(what + ": reading the client's line"));
  auto remote = decode_connection_line(*line);
  if (!remote) return std::unexpected(remote.error().context(what + ": from client " + channel->peer()));
  if (auto sent = channel->send_all(*ours, time_left(deadline)); !sent) {
    return std::unexpected(sent.error().context(what + ": answering"));
  }
  return remote;
}

Result<rdma::ConnectionData> exchange_as_client(const std::string& host, uint16_t port,
                                                const rdma::ConnectionData& local, milliseconds timeout) {
  const std::string what = "connection exchange as client of " + host_port(host, port) + " (timeout " +
                           std::to_string(timeout.count()) + " ms)";
  auto ours = encode_connection_line(local);
  if (!ours) return std::unexpected(ours.error().context(what));
  const auto deadline = deadline_after(timeout);
  auto channel = TcpChannel::connect(host, port, timeout);
  if (!channel) return std::unexpected(channel.error().context(what));
  if (auto sent = channel->send_all(*ours, time_left(deadline)); !sent) {
    return std::unexpected(sent.error().context(what + ": sending our line"));
  }
  // A server that cannot parse our line closes without answering.
  auto line = channel->recv_line(kConnectionLineMax, time_left(deadline));
  if (!line) return std::unexpected(line.error().context(what + ": reading the server's line"));
  auto remote = decode_connection_line(*line);
  if (!remote) return std::unexpected(remote.error().context(what));
  return remote;
}

}  // namespace ufab::exchange
