// ufab pingpong DEVICE --ip A.B.C.D [SERVER_HOST]: the RC ping-pong of
// rdma-core's ibv_rc_pingpong (libibverbs/examples/rc_pingpong.c) over a ufab
// port, so either side can be the real ibv_rc_pingpong on rdma_rxe (or any
// RoCE NIC) and the other ufab.
//
// What is the same as ibv_rc_pingpong, and must stay so for the two to meet:
//   - the TCP exchange (tools/exchange/exchange.h describes it): port 18515,
//     one 52-byte "%04x:%06x:%06x:%s" message each way, the client's
//     5-byte "done"; the server moves its QP to RTR and RTS before it
//     answers, the client after the exchange;
//   - the QP: RC, rx_depth receives posted before the exchange, all into the
//     one buffer; send queue depth 1; CQ depth rx_depth + 1; RTR with
//     max_dest_rd_atomic 1 and min_rnr_timer 12; RTS with timeout 14,
//     retry_cnt 7, rnr_retry 7, max_rd_atomic 1; no remote access;
//   - the loop: the client posts the first SEND; after every completion the
//     pending bits (RECV 1, SEND 2) are cleared and, while fewer than
//     `iters` SENDs completed and nothing is pending, the next SEND is
//     posted; receives are topped up to rx_depth when at most one is left;
//   - the output: the "local address:" / "remote address:" lines and the two
//     summary lines, with the same numbers (bytes = size * iters * 2, the
//     clock starting after the first SEND is posted).
// What ufab adds: every wait is bounded (--timeout); every completion's
// status, opcode and length is checked, and the data too: the client sends
// a pattern and checks each echo against it, the server checks that every
// message equals the first (ibv_rc_pingpong's server echoes its buffer, so
// its -c check is weaker: one byte per page); ARP is answered while the
// exchange blocks (BackgroundProgress says why); the transport's counters
// are reported at the end.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "base/hex.h"

#include "ufab/rdma.hpp"
#include "base/json.h"
#include "core/roce/gid.h"
#include "tools/exchange/exchange.h"
#include "tools/ufab/cli.h"
#include "tools/ufab/render.h"

namespace ufab::cli {
namespace {

namespace rdma = ufab::rdma;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// ibv_rc_pingpong's wr_ids, which double as its pending bits.
constexpr uint64_t kRecvWrid = 1;
constexpr uint64_t kSendWrid = 2;

struct Config {
  std::string device;
  std::string ip;
  std::string server_host;  // empty: be the server
  uint16_t port = 18515;
  uint32_t size = 4096;
  uint32_t iters = 1000;
  uint32_t rx_depth = 500;
  uint32_t mtu = 1024;
  milliseconds timeout{30000};
  std::map<std::string, std::string> params;
  bool json = false;
  bool server() const { return server_host.empty(); }
};

struct Summary {
  exchange::PingpongMessage local, remote;
  uint32_t path_mtu = 0;
  double seconds = 0;
  uint64_t bytes = 0;
  rdma::DeviceStats stats;
};

// rc_pingpong's two address lines.
void print_address(FILE* out, const char* label, const exchange::PingpongMessage& m) {
  std::fprintf(out, "  %s LID 0x%04x, QPN 0x%06x, PSN 0x%06x, GID %s\n", label, unsigned(m.lid), m.qpn, m.psn,
               roce::gid_to_text(m.gid).c_str());
  std::fflush(out);
}

// The payload the client sends: different at every offset of a packet so a
// misplaced or stale packet shows. The server echoes it back.
uint8_t pattern(size_t i) { return static_cast<uint8_t>((static_cast<uint32_t>(i) * 2654435761u) >> 24 ^ (i >> 12)); }

// The peer's QP address from its message, with what to do when it cannot
// work on RoCE.
Result<uint32_t> peer_ip(const exchange::PingpongMessage& m) {
  if (std::all_of(m.gid.begin(), m.gid.end(), [](uint8_t b) { return b == 0; })) {
    return fail(EPROTO,
                "the peer sent GID :: (ibv_rc_pingpong without -g): RoCE needs the peer's GID; run "
                "ibv_rc_pingpong with -g <index of ::ffff:a.b.c.d>, the index whose file in "
                "/sys/class/infiniband/<dev>/ports/1/gids/ holds its IPv4 address and whose gid_attrs/types "
                "entry is \"RoCE v2\"");
  }
  auto ip = roce::ipv4_from_gid(m.gid);
  if (!ip) {
    return fail(EPROTO, "the peer's GID " + roce::gid_to_text(m.gid) +
                            " is not an IPv4-mapped address (::ffff:a.b.c.d): ufab speaks RoCEv2 over IPv4 only; "
                            "pass ibv_rc_pingpong the -g index of its ::ffff:a.b.c.d GID (RoCE v2 type)");
  }
  return *ip;
}

// Drives the device's transport on a thread while the caller blocks
// elsewhere (the TCP exchange), so ARP requests are answered: a kernel peer
// resolves our MAC inside its modify_qp to RTR, which rxe's server does
// while our client waits for its answer, and gives up after 1 s
// (rdma_addr_find_l2_eth_by_grh) with "Failed to modify QP to RTR". Only
// Device::progress(): completions stay in the CQ for the main loop.
class BackgroundProgress {
 public:
  explicit BackgroundProgress(rdma::Device& dev)
      : thread_([&dev](std::stop_token stop) {
          while (!stop.stop_requested()) {
            dev.progress();
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
        }) {}

 private:
  std::jthread thread_;
};

class Pingpong {
 public:
  explicit Pingpong(const Config& cfg) : cfg_(cfg) {}

  Result<Summary> run();

 private:
  Status open();
  Status to_init();
  Status post_receives(uint32_t n);
  Status post_send();
  Status connect(const exchange::PingpongMessage& remote);
  Result<exchange::PingpongMessage> exchange_as_server(const exchange::PingpongMessage& local);
  Result<exchange::PingpongMessage> exchange_as_client(const exchange::PingpongMessage& local);
  Status handle(const rdma::WorkCompletion& wc);
  Status check_received(const rdma::WorkCompletion& wc);
  std::string where() const {
    return " (iteration " + std::to_string(std::min(scnt_, rcnt_) + 1) + " of " + std::to_string(cfg_.iters) +
           ": " + std::to_string(scnt_) + " sends and " + std::to_string(rcnt_) + " receives completed)";
  }

  const Config& cfg_;
  std::unique_ptr<rdma::Device> dev_;
  std::optional<rdma::ProtectionDomain> pd_;
  std::vector<uint8_t> buf_;      // rc_pingpong's ctx->buf: receives land here; the server sends it back
  std::vector<uint8_t> pattern_;  // the client sends this
  std::vector<uint8_t> first_;    // server: the first message, which every later one must equal
  std::optional<rdma::MemoryRegion> buf_mr_, pattern_mr_;
  std::unique_ptr<rdma::CompletionQueue> cq_;
  std::unique_ptr<rdma::QueuePair> qp_;
  uint32_t routs_ = 0;
  uint32_t rcnt_ = 0, scnt_ = 0;
  uint64_t pending_ = 0;
};

Status Pingpong::open() {
  auto dev = rdma::Device::open(cfg_.device, {.ip = cfg_.ip, .params = cfg_.params});
  if (!dev) return std::unexpected(dev.error());
  dev_ = std::move(*dev);
  if (cfg_.mtu > dev_->active_mtu()) {
    return fail(EINVAL, "-m " + std::to_string(cfg_.mtu) + " exceeds the active MTU " +
                            std::to_string(dev_->active_mtu()) + " of " + cfg_.device +
                            "; use -m " + std::to_string(dev_->active_mtu()) + " or less on both sides");
  }
  auto pd = dev_->alloc_pd();
  if (!pd) return std::unexpected(pd.error().context("allocating a PD"));
  pd_.emplace(std::move(*pd));
  buf_.assign(cfg_.size, 0x7b);  // what rc_pingpong fills its buffer with
  auto mr = pd_->register_mr(buf_.data(), buf_.size(), rdma::kLocalWrite);
  if (!mr) return std::unexpected(mr.error().context("registering the " + std::to_string(cfg_.size) + "-byte buffer"));
  buf_mr_.emplace(std::move(*mr));
  if (!cfg_.server()) {
    pattern_.resize(cfg_.size);
    for (size_t i = 0; i < pattern_.size(); ++i) pattern_[i] = pattern(i);
    auto pmr = pd_->register_mr(pattern_.data(), pattern_.size(), 0);
    if (!pmr) return std::unexpected(pmr.error().context("registering the send buffer"));
    pattern_mr_.emplace(std::move(*pmr));
  }
  auto cq = dev_->create_cq(cfg_.rx_depth + 1);
  if (!cq) return std::unexpected(cq.error().context("creating a CQ of " + std::to_string(cfg_.rx_depth + 1)));
  cq_ = std::move(*cq);
  auto qp = pd_->create_qp({.type = rdma::QpType::kRc,
                            .send_cq = cq_.get(),
                            .recv_cq = cq_.get(),
                            .caps = {.max_send_wr = 1,
                                     .max_recv_wr = cfg_.rx_depth,
                                     .max_send_sge = 1,
                                     .max_recv_sge = 1,
                                     .max_inline_data = 0}});
  if (!qp) return std::unexpected(qp.error().context("creating the RC QP"));
  qp_ = std::move(*qp);
  return {};
}

// pp_init_ctx's INIT: pkey index 0, port 1, no remote access.
Status Pingpong::to_init() {
  rdma::QpAttr a;
  a.state = rdma::QpState::kInit;
  a.pkey_index = 0;
  a.port = 1;
  a.access_flags = 0;
  return qp_->modify(a, rdma::kAttrState | rdma::kAttrPkeyIndex | rdma::kAttrPort | rdma::kAttrAccessFlags);
}

Status Pingpong::post_receives(uint32_t n) {
  rdma::Sge sge = buf_mr_->sge(0, cfg_.size);
  for (uint32_t i = 0; i < n; ++i) {
    if (auto s = qp_->post_recv({.wr_id = kRecvWrid, .sgl = {&sge, 1}}); !s) {
      return std::unexpected(s.error().context("posting receive " + std::to_string(routs_ + 1) + " of " +
                                               std::to_string(cfg_.rx_depth)));
    }
    ++routs_;
  }
  return {};
}

Status Pingpong::post_send() {
  rdma::Sge sge = cfg_.server() ? buf_mr_->sge(0, cfg_.size) : pattern_mr_->sge(0, cfg_.size);
  rdma::SendWr wr;
  wr.wr_id = kSendWrid;
  wr.opcode = rdma::WrOpcode::kSend;
  wr.flags = rdma::kSendSignaled;
  wr.sgl = {&sge, 1};
  if (auto s = qp_->post_send(wr); !s) return std::unexpected(s.error().context("posting a SEND" + where()));
  return {};
}

// pp_connect_ctx: RTR then RTS with rc_pingpong's attributes.
Status Pingpong::connect(const exchange::PingpongMessage& remote) {
  auto ip = peer_ip(remote);
  if (!ip) return std::unexpected(ip.error());
  rdma::QpAttr a;
  a.state = rdma::QpState::kRtr;
  a.path_mtu = cfg_.mtu;
  a.dest_qpn = remote.qpn;
  a.rq_psn = remote.psn;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.av.dest_ip = *ip;
  // rc_pingpong asks for hop limit 1; the kernel replaces it with the
  // route's (64), which is what rxe puts in the IPv4 TTL.
  a.av.hop_limit = 64;
  if (auto s = qp_->modify(a, rdma::kAttrState | rdma::kAttrAv | rdma::kAttrPathMtu | rdma::kAttrDestQpn |
                                  rdma::kAttrRqPsn | rdma::kAttrMaxDestRdAtomic | rdma::kAttrMinRnrTimer);
      !s) {
    return std::unexpected(s.error().context("moving the QP to RTR"));
  }
  a.state = rdma::QpState::kRts;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.sq_psn = qp_->local().psn;
  a.max_rd_atomic = 1;
  if (auto s = qp_->modify(a, rdma::kAttrState | rdma::kAttrTimeout | rdma::kAttrRetryCnt | rdma::kAttrRnrRetry |
                                  rdma::kAttrSqPsn | rdma::kAttrMaxQpRdAtomic);
      !s) {
    return std::unexpected(s.error().context("moving the QP to RTS"));
  }
  return {};
}

Result<exchange::PingpongMessage> Pingpong::exchange_as_server(const exchange::PingpongMessage& local) {
  auto listener = exchange::TcpChannel::listen(cfg_.port);
  if (!listener) return std::unexpected(listener.error().context("listening for the client"));
  // Not in rc_pingpong's output (which says nothing until a client came),
  // so on stderr: scripts wait for it, and learn the port that -p 0 got.
  std::fprintf(stderr, "pingpong: waiting for a client on TCP port %u\n", unsigned(listener->port()));
  std::fflush(stderr);
  auto channel = listener->accept(cfg_.timeout);
  if (!channel) return std::unexpected(channel.error().context("waiting for the client on TCP port " +
                                                               std::to_string(listener->port())));
  exchange::PingpongBytes msg{};
  auto n = channel->recv_exact(msg, cfg_.timeout);
  if (!n) return std::unexpected(n.error().context("reading the client's address"));
  if (*n == 0) return fail(ECONNRESET, "the client " + channel->peer() + " closed the connection before sending its address");
  auto remote = exchange::decode_pingpong(msg);
  if (!remote) return std::unexpected(remote.error().context("the client's address"));
  // As rc_pingpong's server: connected before it answers, so the client's
  // first SEND finds a QP in RTR.
  if (auto s = connect(*remote); !s) return std::unexpected(s.error());
  auto ours = exchange::encode_pingpong(local);
  if (!ours) return std::unexpected(ours.error());
  if (auto s = channel->send_all(std::span<const uint8_t>(*ours), cfg_.timeout); !s) {
    return std::unexpected(s.error().context("sending our address to the client"));
  }
  // The client's "done" (5 bytes with the NUL). rc_pingpong counts the bytes
  // and never looks at them; neither do we.
  std::array<uint8_t, exchange::kPingpongDone.size()> done{};
  auto d = channel->recv_exact(done, cfg_.timeout);
  if (!d) return std::unexpected(d.error().context("waiting for the client's \"done\""));
  if (*d == 0) return fail(ECONNRESET, "the client closed the connection instead of sending \"done\"");
  return *remote;
}

Result<exchange::PingpongMessage> Pingpong::exchange_as_client(const exchange::PingpongMessage& local) {
  auto channel = exchange::TcpChannel::connect(cfg_.server_host, cfg_.port, cfg_.timeout);
  if (!channel) return std::unexpected(channel.error());
  auto ours = exchange::encode_pingpong(local);
  if (!ours) return std::unexpected(ours.error());
  if (auto s = channel->send_all(std::span<const uint8_t>(*ours), cfg_.timeout); !s) {
    return std::unexpected(s.error().context("sending our address to the server"));
  }
  exchange::PingpongBytes msg{};
  auto n = channel->recv_exact(msg, cfg_.timeout);
  if (!n) return std::unexpected(n.error().context("reading the server's address"));
  if (*n == 0) {
    return fail(ECONNRESET, "the server " + channel->peer() +
                                " closed the connection without answering; its own output says why (a GID "
                                "it cannot use, an MTU its port does not have, ...)");
  }
  auto remote = exchange::decode_pingpong(msg);
  if (!remote) return std::unexpected(remote.error().context("the server's address"));
  if (auto s = channel->send_all(std::span<const uint8_t>(exchange::kPingpongDone), cfg_.timeout); !s) {
    return std::unexpected(s.error().context("sending \"done\" to the server"));
  }
  return *remote;
}

Status Pingpong::check_received(const rdma::WorkCompletion& wc) {
  if (wc.opcode != rdma::WcOpcode::kRecv) {
    return fail(EPROTO, std::string("receive completed with opcode ") + rdma::wc_opcode_name(wc.opcode) +
                            ", expected RECV" + where());
  }
  if (wc.byte_len != cfg_.size) {
    return fail(EPROTO, "received " + std::to_string(wc.byte_len) + " bytes, expected " + std::to_string(cfg_.size) +
                            where() + ": does the peer use the same -s?");
  }
  const std::vector<uint8_t>* expected = &pattern_;
  if (cfg_.server()) {
    if (first_.empty()) {
      first_ = buf_;
      return {};
    }
    expected = &first_;
  }
  auto mismatch = std::mismatch(buf_.begin(), buf_.end(), expected->begin());
  if (mismatch.first != buf_.end()) {
    size_t at = static_cast<size_t>(mismatch.first - buf_.begin());
    return fail(EIO, "data error in received message " + std::to_string(rcnt_ + 1) + " at byte " + std::to_string(at) +
                         ": " + hex(*mismatch.first, 2) + ", expected " + hex(*mismatch.second, 2) +
                         (cfg_.server() ? " (as in the first message)" : " (what we sent)"));
  }
  return {};
}

// parse_single_wc.
Status Pingpong::handle(const rdma::WorkCompletion& wc) {
  if (wc.status != rdma::WcStatus::kSuccess) {
    return fail(EIO, std::string("failed status ") + rdma::wc_status_name(wc.status) + " (" +
                         std::to_string(int(wc.status)) + ") for wr_id " + std::to_string(wc.wr_id) +
                         (wc.error.empty() ? "" : ": " + wc.error) + where());
  }
  if (wc.wr_id == kSendWrid) {
    if (wc.opcode != rdma::WcOpcode::kSend) {
      return fail(EPROTO, std::string("send completed with opcode ") + rdma::wc_opcode_name(wc.opcode) + where());
    }
    ++scnt_;
  } else if (wc.wr_id == kRecvWrid) {
    if (auto s = check_received(wc); !s) return s;
    if (--routs_ <= 1) {
      if (auto s = post_receives(cfg_.rx_depth - routs_); !s) return s;
    }
    ++rcnt_;
  } else {
    return fail(EPROTO, "completion for unknown wr_id " + std::to_string(wc.wr_id) + where());
  }
  pending_ &= ~wc.wr_id;
  if (scnt_ < cfg_.iters && pending_ == 0) {
    if (auto s = post_send(); !s) return s;
    pending_ = kRecvWrid | kSendWrid;
  }
  return {};
}

Result<Summary> Pingpong::run() {
  if (auto s = open(); !s) return std::unexpected(s.error());
  if (auto s = to_init(); !s) return std::unexpected(s.error().context("moving the QP to INIT"));
  if (auto s = post_receives(cfg_.rx_depth); !s) return std::unexpected(s.error());

  Summary sum;
  rdma::ConnectionData me = qp_->local();
  sum.local.lid = 0;  // Ethernet ports have no LID
  sum.local.qpn = me.qpn;
  sum.local.psn = me.psn;
  sum.local.gid = roce::gid_from_ipv4(me.ip);
  print_address(cfg_.json ? stderr : stdout, "local address: ", sum.local);

  Result<exchange::PingpongMessage> remote = std::unexpected(Error(ENOTCONN, "no exchange"));
  {
    BackgroundProgress answering(*dev_);
    remote = cfg_.server() ? exchange_as_server(sum.local) : exchange_as_client(sum.local);
  }
  if (!remote) return std::unexpected(remote.error());
  sum.remote = *remote;
  print_address(cfg_.json ? stderr : stdout, "remote address:", sum.remote);
  if (!cfg_.server()) {
    if (auto s = connect(sum.remote); !s) return std::unexpected(s.error());
  }
  sum.path_mtu = qp_->attr().path_mtu;

  pending_ = kRecvWrid;
  if (!cfg_.server()) {
    if (auto s = post_send(); !s) return std::unexpected(s.error());
    pending_ |= kSendWrid;
  }
  const auto start = Clock::now();
  auto last_progress = start;
  std::array<rdma::WorkCompletion, 16> wcs;
  // The client's last receive is the server's answer to its last SEND, so
  // that SEND arrived even when its ACK did not: waiting for the ACK could
  // outlast the server, which exits once its own last SEND is acknowledged
  // (ibv_rc_pingpong's client has the same race; the interop tests with
  // loss towards the client hit it about once in fifty runs).
  auto done = [&] {
    return rcnt_ >= cfg_.iters && (scnt_ >= cfg_.iters || (!cfg_.server() && scnt_ + 1 == cfg_.iters));
  };
  while (!done()) {
    auto now = Clock::now();
    auto quiet = std::chrono::duration_cast<milliseconds>(now - last_progress);
    if (quiet >= cfg_.timeout) {
      return fail(ETIMEDOUT, "no completion for " + std::to_string(cfg_.timeout.count() / 1000) + " s" + where() +
                                 "; is the peer still running, and can its port reach ours (same link, "
                                 "addresses in one subnet)?");
    }
    auto n = cq_->wait(wcs, std::min(milliseconds(100), cfg_.timeout - quiet));
    if (!n) return std::unexpected(n.error().context("polling the CQ" + where()));
    if (*n > 0) last_progress = Clock::now();
    for (size_t i = 0; i < *n; ++i) {
      if (auto s = handle(wcs[i]); !s) return std::unexpected(s.error());
    }
  }
  sum.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  // Linger a little, like TCP's TIME_WAIT: if our ACK of the peer's last
  // message was lost, its retransmission still gets one before we go.
  for (auto until = Clock::now() + milliseconds(250); Clock::now() < until;) {
    if (dev_->progress() == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  sum.bytes = uint64_t(cfg_.size) * cfg_.iters * 2;
  sum.stats = dev_->stats();
  return sum;
}

Result<uint32_t> whole_option(const Options& opts, const std::string& name, uint32_t fallback, uint32_t min,
                              uint32_t max) {
  auto v = number_option(opts, name, fallback, min, max);
  if (!v) return std::unexpected(v.error());
  if (*v != static_cast<double>(static_cast<uint32_t>(*v))) {
    return fail(EINVAL, "--" + name + " " + *opts.value(name) + ": expected a whole number");
  }
  return static_cast<uint32_t>(*v);
}

// A bad or missing option: the message (and the JSON error object with
// --json), status 2.
int usage_failure(const Options& opts, const Error& err) {
  report_error(opts, "pingpong", err);
  std::fprintf(stderr, "(run `ufab --help` for usage)\n");
  return kExitUsage;
}

}  // namespace

int cmd_pingpong(const Options& opts) {
  Config cfg;
  cfg.json = opts.json;
  cfg.device = opts.args[0];
  if (opts.args.size() > 1) cfg.server_host = opts.args[1];
  const std::string* ip = opts.value("ip");
  if (!ip) {
    return usage_failure(opts,
                        Error(EINVAL, "--ip A.B.C.D is required: this port's IPv4 address (its GID is "
                                      "::ffff:A.B.C.D), in the same subnet as the peer's"));
  }
  if (!roce::ipv4_from_string(*ip)) {
    return usage_failure(opts, Error(EINVAL, "--ip " + *ip + ": expected an IPv4 address, A.B.C.D"));
  }
  cfg.ip = *ip;
  auto port = whole_option(opts, "port", 18515, cfg.server() ? 0 : 1, 65535);
  auto size = whole_option(opts, "size", 4096, 1, 1u << 30);
  auto iters = whole_option(opts, "iters", 1000, 1, 1u << 31);
  auto rx_depth = whole_option(opts, "rx-depth", 500, 2, 65536);
  auto mtu = whole_option(opts, "mtu", 1024, 256, 4096);
  auto timeout = whole_option(opts, "timeout", 30, 1, 86400);
  for (const auto* r : {&port, &size, &iters, &rx_depth, &mtu, &timeout}) {
    if (!*r) return usage_failure(opts, r->error());
  }
  if (*mtu != 256 && *mtu != 512 && *mtu != 1024 && *mtu != 2048 && *mtu != 4096) {
    return usage_failure(opts, Error(EINVAL, "--mtu " + std::to_string(*mtu) + ": expected 256, 512, 1024, 2048 or 4096"));
  }
  cfg.port = static_cast<uint16_t>(*port);
  cfg.size = *size;
  cfg.iters = *iters;
  cfg.rx_depth = *rx_depth;
  cfg.mtu = *mtu;
  cfg.timeout = milliseconds(uint64_t(*timeout) * 1000);
  if (auto it = opts.values.find("param"); it != opts.values.end()) {
    for (const auto& kv : it->second) {
      auto eq = kv.find('=');
      if (eq == std::string::npos || eq == 0) {
        return usage_failure(opts, Error(EINVAL, "--param " + kv + ": expected KEY=VALUE"));
      }
      cfg.params[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
  }

  Pingpong pingpong(cfg);
  auto sum = pingpong.run();
  if (!sum) return report_error(opts, "pingpong", sum.error());

  const double usec = sum->seconds * 1e6;
  if (opts.json) {
    auto address = [](JsonWriter& w, const std::string& k, const exchange::PingpongMessage& m) {
      w.key(k).begin_object().field("lid", unsigned(m.lid)).field("qpn", m.qpn).field("psn", m.psn);
      w.field("gid", roce::gid_to_text(m.gid)).end_object();
    };
    JsonWriter w;
    w.begin_object().field("ok", true).field("command", "pingpong");
    w.field("role", cfg.server() ? "server" : "client").field("device", cfg.device);
    address(w, "local", sum->local);
    address(w, "remote", sum->remote);
    w.field("size", cfg.size).field("iters", cfg.iters).field("rx_depth", cfg.rx_depth).field("path_mtu", sum->path_mtu);
    w.field("bytes", sum->bytes).field("seconds", sum->seconds);
    w.field("mbit_per_second", usec > 0 ? double(sum->bytes) * 8.0 / usec : 0.0);
    w.field("usec_per_iter", usec / cfg.iters);
    write_transport_stats(w, sum->stats);
    w.end_object();
    std::printf("%s\n", w.str().c_str());
  } else {
    // rc_pingpong's two lines, in its formats.
    std::printf("%llu bytes in %.2f seconds = %.2f Mbit/sec\n", static_cast<unsigned long long>(sum->bytes),
                usec / 1e6, usec > 0 ? double(sum->bytes) * 8.0 / usec : 0.0);
    std::printf("%u iters in %.2f seconds = %.2f usec/iter\n", cfg.iters, usec / 1e6, usec / cfg.iters);
    // Not rc_pingpong's: what the transport went through, on stderr.
    std::fprintf(stderr, "pingpong: transport: %s\n", rdma::to_string(sum->stats).c_str());
  }
  return kExitOk;
}

}  // namespace ufab::cli
