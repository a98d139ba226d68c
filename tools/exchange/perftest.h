// perftest's out-of-band exchange (linux-rdma/perftest, src/
// perftest_communication.c, as of perftest 6.06 = Debian's 4.5-0.17), so
// `ufab perf` meets ib_write_bw, ib_read_lat and the rest over TCP.
//
// Every exchange is symmetric: the client (the side given a server name)
// writes its bytes and then reads the peer's; the server reads first, then
// writes. Each message is one fixed-size block. On a TCP socket, in order:
//   1. versions: 16 bytes each, the version text NUL-padded ("6.06");
//      perftest reads the text up to its NUL (atof), so what follows the
//      NUL is free: `ufab perf` puts its own mark there (hello's `tail`);
//   2. system data: cycle buffer then cache-line size, each a 4-byte
//      big-endian int; both sides then use the larger;
//   3. MTU: 2 bytes, the ibv_mtu enum (1..5) as one decimal digit and a NUL;
//      both use the smaller;
//   4. keys (PerftestKeys below), several times: the test decides how often;
//   5. for the bandwidth tests, the reports (PerftestBwReport);
//   6. closing: one more key exchange, then each side writes "done" with its
//      NUL (nobody reads it) and closes.
// perftest reads each block with one read() and fails on a short one, so we
// write each block with one send().
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "base/error.h"
#include "core/roce/gid.h"
#include "tools/exchange/exchange.h"

namespace ufab::exchange {

inline constexpr uint16_t kPerftestPort = 18515;
// The version we announce; perftest refuses peers older than 5.70 and sends
// 8-byte iteration counts to peers of 5.33 and later.
inline constexpr char kPerftestVersion[] = "6.06";
inline constexpr size_t kPerftestVersionSize = 16;
inline constexpr double kPerftestOldestPeer = 5.70;
// Room after "6.06" and its NUL in the version block.
inline constexpr size_t kPerftestVersionTail = kPerftestVersionSize - sizeof kPerftestVersion;

// One QP's data, KEY_PRINT_FMT_GID:
//   "%04x:%04x:%06x:%06x:%08x:%016llx:" lid, out_reads, qpn, psn, rkey, vaddr
//   16 x "%02x:"                        the GID
//   "%08x:"                             srqn
// 107 characters and the NUL: 108 bytes.
struct PerftestKeys {
  uint16_t lid = 0;        // 0 on Ethernet
  uint16_t out_reads = 0;  // the sender's max_rd_atomic
  uint32_t qpn = 0;
  uint32_t psn = 0;
  uint32_t rkey = 0;
  uint64_t vaddr = 0;  // where the peer may write/read: the remote half of the sender's buffer
  roce::Gid gid{};
  uint32_t srqn = 0;  // XRC/DC only
};
inline constexpr size_t kPerftestKeysSize = 108;
using PerftestKeyBytes = std::array<uint8_t, kPerftestKeysSize>;
Result<PerftestKeyBytes> encode_perftest_keys(const PerftestKeys& keys);
Result<PerftestKeys> decode_perftest_keys(std::span<const uint8_t> bytes);

// The bandwidth report each side sends after the run (xchg_bw_reports): five
// blocks, each exchanged on its own, all big-endian; the doubles byte-swapped
// as 64-bit integers. MB/sec values are 2^20 bytes per second; msg_rate in
// millions per second.
struct PerftestBwReport {
  uint64_t size = 0;
  uint64_t iters = 0;
  double bw_peak = 0;
  double bw_avg = 0;
  double msg_rate_avg = 0;
};

// The TCP side of one perftest run, in either role.
class PerftestChannel {
 public:
  // Server: waits at most `timeout` for one client on `listener`.
  static Result<PerftestChannel> accept(TcpListener& listener, std::chrono::milliseconds timeout);
  // Client: connects, retrying while refused, for at most `timeout`.
  static Result<PerftestChannel> connect(const std::string& host, uint16_t port, std::chrono::milliseconds timeout);

  bool client() const { return client_; }
  const std::string& peer() const { return channel_.peer(); }
  // The peer's version text ("6.06"), known after hello().
  const std::string& peer_version() const { return peer_version_; }
  // What the peer's version block holds after its text's NUL, trailing NULs
  // removed: empty from perftest (strncpy pads with NULs); `ufab perf`'s
  // mark from ufab.
  const std::string& peer_tail() const { return peer_tail_; }

  // Steps 1-3. `cycle_buffer` and `cache_line` are ours; the larger of each
  // side's is returned. `mtu_enum` is our ibv_mtu (1..5); the smaller is
  // returned. Fails with what to do when the peer is too old or sends junk.
  // `tail` goes into our version block after the text's NUL (at most
  // kPerftestVersionTail bytes, no NUL inside; perftest ignores it).
  struct Agreed {
    uint32_t cycle_buffer = 0;
    uint32_t cache_line = 0;
    uint32_t mtu_enum = 0;
  };
  Result<Agreed> hello(uint32_t cycle_buffer, uint32_t cache_line, uint32_t mtu_enum, std::chrono::milliseconds timeout,
                       std::string_view tail = {});

  // One ctx_hand_shake: our keys out, the peer's in.
  Result<PerftestKeys> swap_keys(const PerftestKeys& mine, std::chrono::milliseconds timeout);
  Result<PerftestBwReport> swap_bw_report(const PerftestBwReport& mine, std::chrono::milliseconds timeout);
  // ctx_close_connection: a last key swap, then "done". The peer may already
  // have closed after its own "done"; that is not an error.
  Status close(const PerftestKeys& mine, std::chrono::milliseconds timeout);

  // One symmetric exchange of a fixed-size block (ctx_xchg_data).
  Status swap(std::span<const uint8_t> mine, std::span<uint8_t> theirs, std::chrono::milliseconds timeout);

 private:
  PerftestChannel(TcpChannel channel, bool client) : channel_(std::move(channel)), client_(client) {}

  TcpChannel channel_;
  bool client_;
  std::string peer_version_;
  std::string peer_tail_;
};

}  // namespace ufab::exchange
