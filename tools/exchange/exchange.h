// Out-of-band connection exchange over TCP: how two RDMA tools swap the
// queue-pair data (QPN, PSN, address, rkey) they need before their QPs can
// talk, as ibv_rc_pingpong and perftest do.
//
// Every call that waits takes a timeout that bounds the whole call, so a
// silent or vanished peer turns into an error instead of a hang.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "base/error.h"
#include "base/fd.h"
#include "core/roce/gid.h"
#include "ufab/rdma.hpp"

namespace ufab::exchange {

class TcpListener;

// What a peer sent, fit for an error message: quoted, non-printable bytes as
// \xNN, cut after 64 bytes.
std::string shown(std::string_view bytes);
// Exactly `digits` hex digits, either case; nothing else.
std::optional<uint64_t> parse_hex(std::string_view text, size_t digits);

// A connected TCP stream. Sockets are non-blocking underneath; every wait is
// a poll() against the call's deadline, EINTR restarts the wait, and sends
// use MSG_NOSIGNAL so a vanished peer is an error, not a SIGPIPE.
class TcpChannel {
 public:
  // Resolves `host` (name, IPv4 or IPv6 literal) and connects to the first
  // address that accepts. While every refusal is ECONNREFUSED it retries
  // every 100 ms until `timeout`, so a client may start before its server.
  // getaddrinfo itself is not bounded by `timeout`.
  static Result<TcpChannel> connect(const std::string& host, uint16_t port, std::chrono::milliseconds timeout);

  // Listens on `port` (0: an ephemeral port, see TcpListener::port()) with
  // SO_REUSEADDR so a restarted server does not trip over TIME_WAIT. An empty
  // `bind_address` means any address, IPv6 and IPv4 alike where the host
  // has IPv6.
  static Result<TcpListener> listen(uint16_t port, const std::string& bind_address = {});

  Status send_all(std::span<const uint8_t> data, std::chrono::milliseconds timeout);
  Status send_all(std::string_view text, std::chrono::milliseconds timeout);

  // Fills `buf` completely and returns buf.size(). Returns 0 when the peer
  // closed the connection before sending any byte of it (an orderly end
  // between messages); closing part way through is an error.
  Result<size_t> recv_exact(std::span<uint8_t> buf, std::chrono::milliseconds timeout);

  // One '\n'-terminated line of at most `max_len` bytes before the '\n',
  // returned without it. A NUL byte, a longer line, or EOF before the '\n'
  // are errors. Bytes after the '\n' stay buffered for the next receive.
  Result<std::string> recv_line(size_t max_len, std::chrono::milliseconds timeout);

  // "host:port" of the peer, for messages.
  const std::string& peer() const { return peer_; }

 private:
  friend class TcpListener;
  TcpChannel(UniqueFd fd, std::string peer) : fd_(std::move(fd)), peer_(std::move(peer)) {}

  UniqueFd fd_;
  std::string peer_;
  std::string buffered_;  // received past the end of a line
};

class TcpListener {
 public:
  // Waits for one client for at most `timeout`.
  Result<TcpChannel> accept(std::chrono::milliseconds timeout);
  // The bound port; the one the kernel picked when listen() was given 0.
  uint16_t port() const { return port_; }

 private:
  friend class TcpChannel;
  TcpListener(UniqueFd fd, uint16_t port) : fd_(std::move(fd)), port_(port) {}

  UniqueFd fd_;
  uint16_t port_;
};

// ufab's own exchange message, one text line:
//   "UFAB1 <ip dotted> <qpn hex6> <psn hex6> <rkey hex8> <addr hex16> <length dec>\n"
// e.g. "UFAB1 10.0.0.1 000011 a1b2c3 00000100 00007f0000001000 4096\n".
// Hex is written lowercase and read in either case; fields are separated by
// exactly one space.
inline constexpr size_t kConnectionLineMax = 128;
// Fails when qpn or psn do not fit their 24 bits.
Result<std::string> encode_connection_line(const rdma::ConnectionData& data);
// Takes the line with or without its '\n'.
Result<rdma::ConnectionData> decode_connection_line(std::string_view line);

// ibv_rc_pingpong's message (rdma-core libibverbs/examples/rc_pingpong.c):
// sprintf("%04x:%06x:%06x:%s", lid, qpn, psn, gid) with the GID as 32 hex
// digits (roce::gid_to_wire_hex), sent as sizeof its buffer: 51 characters
// and the terminating NUL, 52 bytes.
//
// The choreography (a later issue implements it):
//   client: connect to the server (port 18515 unless -p); write its 52 bytes;
//           read the server's 52 bytes; write "done" with its NUL (5 bytes);
//           close; only then move its QP to RTR/RTS and post the first send.
//   server: accept one client; read 52 bytes in a single read() (a short
//           read fails it); move its QP to RTR and RTS before answering;
//           write its 52 bytes; read() expecting exactly 5 bytes, whose
//           contents it never looks at; close.
// Both post their receives before the exchange. Neither checks sscanf's
// result. Without -g the GID is all zeros and the QP gets no GRH, which
// cannot work on RoCE: run rc_pingpong with -g <index of ::ffff:a.b.c.d>.
// The LID is 0 on Ethernet ports.
struct PingpongMessage {
  uint16_t lid = 0;
  uint32_t qpn = 0;
  uint32_t psn = 0;
  roce::Gid gid{};
};
inline constexpr size_t kPingpongMessageSize = 52;
using PingpongBytes = std::array<uint8_t, kPingpongMessageSize>;
inline constexpr std::array<uint8_t, 5> kPingpongDone = {'d', 'o', 'n', 'e', '\0'};

// Fails when qpn or psn do not fit their 24 bits.
Result<PingpongBytes> encode_pingpong(const PingpongMessage& message);
// Exactly 52 bytes in rc_pingpong's layout, ending in NUL; hex in either case.
Result<PingpongMessage> decode_pingpong(std::span<const uint8_t> bytes);

// Accepts one client, reads its line, answers with ours. The server reads
// first (as rc_pingpong's) so it can set up its QP before the client can
// send. `timeout` bounds the whole exchange, the wait for the client included.
Result<rdma::ConnectionData> exchange_as_server(TcpListener& listener, const rdma::ConnectionData& local,
                                                std::chrono::milliseconds timeout);
// Connects (retrying while refused), sends our line, reads the server's.
Result<rdma::ConnectionData> exchange_as_client(const std::string& host, uint16_t port,
                                                const rdma::ConnectionData& local,
                                                std::chrono::milliseconds timeout);

}  // namespace ufab::exchange
