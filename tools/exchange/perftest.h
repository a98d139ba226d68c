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
//
// With -R (--rdma_cm) perftest carries the same messages over an rdma_cm
// connection instead of TCP (perftest_communication.c, rdma_write_data /
// rdma_read_data): one RC QP, every message one SEND, the receiver with
// exactly one 56-byte receive posted; the keys travel as the binary
// struct pingpong_dest (PerftestDestBytes below), not as text; and the
// closing key exchange is not followed by "done". PerftestLink is what the
// exchange needs of either carrier (tools/exchange/perftest_cm.h has the
// rdma_cm one).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
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

// The same keys as -R sends them: perftest's struct pingpong_dest as it
// lies in memory on x86-64, every field big-endian (rdma_write_keys with
// HAVE_ENDIAN), 56 bytes:
//   0 lid (32)   4 out_reads (32)   8 qpn (32)   12 psn (32)   16 rkey (32)
//   20 padding (4 bytes: we send zeros, perftest leaves them as they were)
//   24 vaddr (64)   32 gid (16 bytes, as is)   48 srqn (32)
//   52 gid_index (32: the sender's GID index; perftest's reader ignores it)
// Decoding ignores the padding and gid_index and refuses what no perftest
// sends: a LID or out_reads above 16 bits, a QPN or PSN above 24 (a peer
// that copies the struct without byte-swapping it, say).
inline constexpr size_t kPerftestDestSize = 56;
using PerftestDestBytes = std::array<uint8_t, kPerftestDestSize>;
Result<PerftestDestBytes> encode_perftest_dest(const PerftestKeys& keys, uint32_t gid_index = 0);
Result<PerftestKeys> decode_perftest_dest(std::span<const uint8_t> bytes);

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

// What carries the exchange's messages: a TCP stream, or perftest -R's
// rdma_cm control connection. Each call sends or receives one whole
// message; `timeout` bounds it.
class PerftestLink {
 public:
  virtual ~PerftestLink() = default;
  // One message: one write() on TCP, one SEND over rdma_cm.
  virtual Status send_block(std::span<const uint8_t> block, std::chrono::milliseconds timeout) = 0;
  // The peer's next message, which must be exactly block.size() bytes.
  virtual Status recv_block(std::span<uint8_t> block, std::chrono::milliseconds timeout) = 0;
  // Who the peer is, for messages.
  virtual const std::string& peer() const = 0;
  // perftest -R's control connection: binary keys, no "done".
  virtual bool rdma_cm() const = 0;
};

// TCP, as perftest without -R.
class TcpPerftestLink final : public PerftestLink {
 public:
  explicit TcpPerftestLink(TcpChannel channel) : channel_(std::move(channel)) {}
  Status send_block(std::span<const uint8_t> block, std::chrono::milliseconds timeout) override;
  Status recv_block(std::span<uint8_t> block, std::chrono::milliseconds timeout) override;
  const std::string& peer() const override { return channel_.peer(); }
  bool rdma_cm() const override { return false; }

 private:
  TcpChannel channel_;
};

// One perftest run's exchange, in either role, over a PerftestLink.
class PerftestChannel {
 public:
  // TCP server: waits at most `timeout` for one client on `listener`.
  static Result<PerftestChannel> accept(TcpListener& listener, std::chrono::milliseconds timeout);
  // TCP client: connects, retrying while refused, for at most `timeout`.
  static Result<PerftestChannel> connect(const std::string& host, uint16_t port, std::chrono::milliseconds timeout);
  // Over a link already connected (perftest -R's rdma_cm connection).
  PerftestChannel(std::unique_ptr<PerftestLink> link, bool client) : link_(std::move(link)), client_(client) {}

  bool client() const { return client_; }
  const std::string& peer() const { return link_->peer(); }
  bool rdma_cm() const { return link_->rdma_cm(); }
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

  // One ctx_hand_shake: our keys out, the peer's in (text on TCP,
  // pingpong_dest over rdma_cm).
  Result<PerftestKeys> swap_keys(const PerftestKeys& mine, std::chrono::milliseconds timeout);
  Result<PerftestBwReport> swap_bw_report(const PerftestBwReport& mine, std::chrono::milliseconds timeout);
  // ctx_close_connection: a last key swap, then (TCP only) "done". The
  // peer may already have closed after its own "done"; that is not an
  // error.
  Status close(const PerftestKeys& mine, std::chrono::milliseconds timeout);

  // One symmetric exchange of a fixed-size block (ctx_xchg_data).
  Status swap(std::span<const uint8_t> mine, std::span<uint8_t> theirs, std::chrono::milliseconds timeout);

 private:
  std::unique_ptr<PerftestLink> link_;
  bool client_;
  std::string peer_version_;
  std::string peer_tail_;
};

}  // namespace ufab::exchange
