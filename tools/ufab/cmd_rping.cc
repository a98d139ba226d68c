// ufab rping DEVICE --ip A.B.C.D -s|-c [-a ADDR] [-p PORT] [-C N] [-S N] [-v] [-V]:
// rdma-core's rping (librdmacm/examples/rping.c) over ufab's connection
// manager, so either side can be the kernel's rping (rdmacm-utils) and the
// other ufab.
//
// What is the same as rping, and must stay so for the two to meet:
//   - rdma_cm's TCP port space, port 7174; the client offers responder
//     resources 1, initiator depth 1, retry and RNR retry 7, no private
//     data; the server accepts with what the client offered (rdma_accept
//     with no parameters);
//   - one RC QP a side, a receive posted before connecting or accepting,
//     each message a 16-byte rping_rdma_info {buf (64 bits), rkey, size},
//     big-endian;
//   - per ping: the client advertises its source buffer by SEND, the server
//     RDMA READs it (the advertised size) and SENDs a "go ahead" (16
//     bytes; rping's server sends its never-written info, zeros); the
//     client advertises its sink, the server RDMA WRITEs what it read, up
//     to and including its first NUL, and SENDs "go ahead" again; the
//     client compares its whole buffer with -V;
//   - the payload: "rdma-ping-N: " then 'A'..'z' cycling from 'A' + N mod
//     58, the last byte NUL; -v prints each buffer as a string ("ping
//     data: ..." on the client, "server ping data: ..." on the server);
//   - the client disconnects after -C pings (0: until interrupted); the
//     server serves one connection and ends, successfully, when its client
//     disconnects; -S from 23 to 65535, default 64.
// What ufab adds: every wait is bounded (--timeout), every completion's
// status and every message's length is checked, the server checks the
// client's advertisements against its own -S and (with -V) what it READ
// against rping's payload, and errors say what happened (rejected and why,
// unreachable, timed out, the peer disconnected).
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <endian.h>

#include "base/json.h"
#include "core/net/addresses.h"
#include "tools/ufab/cli.h"
#include "ufab/cm.h"
#include "ufab/rdma.hpp"

namespace ufab::cli {
namespace {

namespace rdma = ufab::rdma;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// rping's limits and defaults. Its smallest size is sizeof("INT_MAX") +
// sizeof("rdma-ping-%d: "): INT_MAX is not defined where rping stringifies
// it, so 8 + 15.
constexpr uint32_t kMinSize = 23;
constexpr uint32_t kMaxSize = 65535;
constexpr uint16_t kDefaultPort = 7174;
constexpr uint32_t kDefaultSize = 64;
constexpr uint32_t kSqDepth = 16;  // RPING_SQ_DEPTH
constexpr uint32_t kRecvSlots = 2;

// rping_rdma_info: every field big-endian.
struct RdmaInfo {
  uint64_t buf;
  uint32_t rkey;
  uint32_t size;
};
static_assert(sizeof(RdmaInfo) == 16);

// What a work request is, as its wr_id.
enum Wr : uint64_t { kRecv0 = 1, kSendInfo = kRecv0 + kRecvSlots, kRead, kWrite };

const char* wr_name(uint64_t wr_id) {
  if (wr_id >= kRecv0 && wr_id < kRecv0 + kRecvSlots) return "receive";
  switch (wr_id) {
    case kSendInfo: return "SEND";
    case kRead: return "RDMA READ";
    case kWrite: return "RDMA WRITE";
    default: return "work request";
  }
}

// SIGINT/SIGTERM so far. A client without -C finishes the ping under way
// at the first and stops at once at the second; anything else stops at once.
std::atomic<int> g_stops{0};
extern "C" void on_stop_signal(int) { g_stops.fetch_add(1); }

struct Config {
  std::string device, ip;
  bool server = false;
  std::optional<net::Ipv4Address> addr;  // -a: the server's address (client), ours (server)
  uint16_t port = kDefaultPort;
  uint32_t count = 0;  // 0: until interrupted (client); any number (server)
  bool count_given = false;
  uint32_t size = kDefaultSize;
  bool verbose = false, validate = false, debug = false, quiet = false, json = false;
  milliseconds timeout{30000};
  std::map<std::string, std::string> params;
};

// rping_test_client's buffer for ping number `ping`.
void fill_ping(std::span<uint8_t> buf, uint32_t ping) {
  const size_t size = buf.size();
  int n = std::snprintf(reinterpret_cast<char*>(buf.data()), size, "rdma-ping-%d: ", static_cast<int>(ping));
  auto c = static_cast<uint8_t>('A' + ping % 58);
  for (size_t i = n < 0 ? size : static_cast<size_t>(n); i < size; ++i) {
    buf[i] = c;
    c = c == 'z' ? 'A' : static_cast<uint8_t>(c + 1);
  }
  buf[size - 1] = 0;
}

// A buffer as rping prints it with %s (bounded by its size).
std::string as_string(std::span<const uint8_t> buf) {
  const auto* p = reinterpret_cast<const char*>(buf.data());
  return std::string(p, strnlen(p, buf.size()));
}

// "at byte 14: 0x41, want 0x42" for the first difference.
std::string first_difference(std::span<const uint8_t> got, std::span<const uint8_t> want) {
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    if (got[i] != want[i]) {
      char b[96];
      std::snprintf(b, sizeof b, "first difference at byte %zu: 0x%02x, want 0x%02x", i, got[i], want[i]);
      return b;
    }
  }
  return "lengths " + std::to_string(got.size()) + " and " + std::to_string(want.size());
}

class Rping {
 public:
  explicit Rping(const Config& cfg) : cfg_(cfg) {}
  ~Rping() {
    ufab_cm_id_destroy(id_);
    ufab_cm_listener_close(listener_);
    ufab_cm_close(cm_);
  }

  Status run();
  uint32_t pings() const { return pings_; }
  bool validated() const { return cfg_.validate && pings_ > 0 && !unvalidated_; }
  double seconds() const { return seconds_; }
  std::string peer() const { return peer_; }

 private:
  void progress(const std::string& line) const {
    if (!cfg_.quiet) std::fprintf(stderr, "rping: %s\n", line.c_str());
  }
  void debug(const std::string& line) const {
    if (cfg_.debug) std::fprintf(stderr, "rping: debug: %s\n", line.c_str());
  }
  // -v lines: stdout, or stderr under --json (stdout holds the object).
  void data_line(const char* prefix, std::span<const uint8_t> buf) const {
    std::FILE* f = cfg_.json ? stderr : stdout;
    std::string s = as_string(buf);
    std::fprintf(f, "%s%s\n", prefix, s.c_str());
  }

  Status setup_qp();
  Status post_recv(uint32_t slot);
  Status post_send_info(std::span<uint8_t> buf, const rdma::MemoryRegion& mr, uint32_t slot);
  Status post_go_ahead();
  // Runs completions and connection events until done() holds; fails on
  // an error, at the timeout, on a disconnection (unless
  // disconnect_ends), or when interrupted.
  Status wait(const std::function<bool()>& done, const std::string& what, bool disconnect_ends = false,
              milliseconds limit = milliseconds(0));  // 0: --timeout
  Status on_event(const ufab_cm_event& ev);
  Status on_completion(const rdma::WorkCompletion& wc);
  Status server();
  Status client();
  Status serve_pings();
  Status ping(uint32_t n);
  void disconnect_after_failure();

  const Config& cfg_;
  std::unique_ptr<rdma::Device> dev_;
  std::optional<rdma::ProtectionDomain> pd_;
  std::unique_ptr<rdma::CompletionQueue> cq_;
  std::unique_ptr<rdma::QueuePair> qp_;
  ufab_cm* cm_ = nullptr;
  ufab_cm_listener* listener_ = nullptr;
  ufab_cm_id* id_ = nullptr;

  // recv slots, then the two send slots (source and sink advertisements;
  // the server's "go ahead" is slot 0, never written: zeros).
  std::array<RdmaInfo, kRecvSlots + 2> msgs_{};
  std::optional<rdma::MemoryRegion> msgs_mr_;
  std::vector<uint8_t> rdma_buf_, start_buf_;  // rping's sink (and the server's READ target), the client's source
  std::optional<rdma::MemoryRegion> rdma_mr_, start_mr_;

  std::string peer_;
  bool established_ = false, disconnected_ = false, disconnecting_ = false;
  int disconnect_status_ = 0;
  uint32_t recvs_ = 0;  // receive completions so far
  std::vector<RdmaInfo> adverts_;  // the server's, in host order, not yet used
  bool read_done_ = false, write_done_ = false;
  std::string flushed_;  // a flushed completion's story, before DISCONNECTED came
  uint32_t pings_ = 0;
  bool unvalidated_ = false;
  Clock::time_point connected_at_{};
  double seconds_ = 0;
};

Status Rping::setup_qp() {
  auto cq = dev_->create_cq(2 * kSqDepth);
  if (!cq) return std::unexpected(cq.error());
  cq_ = std::move(*cq);
  auto qp = pd_->create_qp({.type = rdma::QpType::kRc,
                            .send_cq = cq_.get(),
                            .recv_cq = cq_.get(),
                            .caps = {.max_send_wr = kSqDepth, .max_recv_wr = kRecvSlots, .max_send_sge = 1,
                                     .max_recv_sge = 1},
                            .sq_sig_all = true});
  if (!qp) return std::unexpected(qp.error());
  qp_ = std::move(*qp);
  // INIT, so that the receive goes in before the connection exists, with
  // the access rdma_cm gives an rping QP: the server READs the client's
  // source and WRITEs its sink.
  if (auto s = qp_->modify({.state = rdma::QpState::kInit,
                            .access_flags = rdma::kRemoteRead | rdma::kRemoteWrite,
                            .pkey_index = 0,
                            .port = 1},
                           rdma::kAttrState | rdma::kAttrAccessFlags | rdma::kAttrPkeyIndex | rdma::kAttrPort);
      !s) {
    return s;
  }
  auto mr = pd_->register_mr(msgs_.data(), sizeof msgs_, rdma::kLocalWrite);
  if (!mr) return std::unexpected(mr.error());
  msgs_mr_.emplace(std::move(*mr));
  const rdma::AccessFlags remote = rdma::kLocalWrite | rdma::kRemoteRead | rdma::kRemoteWrite;
  rdma_buf_.assign(cfg_.size, 0);
  auto rmr = pd_->register_mr(rdma_buf_.data(), rdma_buf_.size(), remote);
  if (!rmr) return std::unexpected(rmr.error());
  rdma_mr_.emplace(std::move(*rmr));
  if (!cfg_.server) {
    start_buf_.assign(cfg_.size, 0);
    auto smr = pd_->register_mr(start_buf_.data(), start_buf_.size(), remote);
    if (!smr) return std::unexpected(smr.error());
    start_mr_.emplace(std::move(*smr));
  }
  // rping posts one receive; a second one spares an RNR round when the
  // peer's next message is quicker than the repost.
  for (uint32_t slot = 0; slot < kRecvSlots; ++slot) {
    if (auto s = post_recv(slot); !s) return s;
  }
  return {};
}

Status Rping::post_recv(uint32_t slot) {
  rdma::Sge sge = msgs_mr_->sge(slot * sizeof(RdmaInfo), sizeof(RdmaInfo));
  if (auto s = qp_->post_recv({.wr_id = kRecv0 + slot, .sgl = {&sge, 1}}); !s) {
    return std::unexpected(s.error().context("posting a receive"));
  }
  return {};
}

// rping_format_send and the SEND: `buf` advertised from send slot `slot`.
Status Rping::post_send_info(std::span<uint8_t> buf, const rdma::MemoryRegion& mr, uint32_t slot) {
  RdmaInfo& info = msgs_[kRecvSlots + slot];
  info.buf = htobe64(reinterpret_cast<uint64_t>(buf.data()));
  info.rkey = htobe32(mr.rkey());
  info.size = htobe32(static_cast<uint32_t>(buf.size()));
  char b[128];
  std::snprintf(b, sizeof b, "advertising addr 0x%llx rkey 0x%x len %zu",
                static_cast<unsigned long long>(reinterpret_cast<uint64_t>(buf.data())), mr.rkey(), buf.size());
  debug(b);
  rdma::Sge sge = msgs_mr_->sge((kRecvSlots + slot) * sizeof(RdmaInfo), sizeof(RdmaInfo));
  if (auto s = qp_->post_send({.wr_id = kSendInfo, .opcode = rdma::WrOpcode::kSend, .sgl = {&sge, 1}}); !s) {
    return std::unexpected(s.error().context("posting a SEND"));
  }
  return {};
}

// The server's "go ahead": its send slot 0, never written (as rping's).
Status Rping::post_go_ahead() {
  rdma::Sge sge = msgs_mr_->sge(kRecvSlots * sizeof(RdmaInfo), sizeof(RdmaInfo));
  if (auto s = qp_->post_send({.wr_id = kSendInfo, .opcode = rdma::WrOpcode::kSend, .sgl = {&sge, 1}}); !s) {
    return std::unexpected(s.error().context("posting the \"go ahead\" SEND"));
  }
  return {};
}

Status Rping::on_event(const ufab_cm_event& ev) {
  std::string from = net::Ipv4Address{ev.peer_ip}.str() + ":" + std::to_string(ev.peer_port);
  debug(std::string("connection event ") + ufab_cm_event_str(ev.type) + " from " + from + " (status " +
        std::to_string(ev.status) + ")");
  if (ev.id != id_) {
    // Another client while we serve one: rping without -P serves one.
    if (ev.type == UFAB_CM_EVENT_CONNECT_REQUEST) {
      progress("rejecting a connection from " + from + ": serving " + peer_ + " (one connection at a time)");
      (void)ufab_cm_reject(ev.id, nullptr, 0);
      ufab_cm_id_destroy(ev.id);
    }
    return {};
  }
  switch (ev.type) {
    case UFAB_CM_EVENT_ESTABLISHED:
      established_ = true;
      return {};
    case UFAB_CM_EVENT_DISCONNECTED:
      disconnected_ = true;
      disconnect_status_ = ev.status;
      return {};
    case UFAB_CM_EVENT_REJECTED:
      return fail(ECONNREFUSED, peer_ + " rejected the connection: reason " + std::to_string(ev.reject_reason) +
                                    " (" + ufab_cm_reject_reason_str(ev.reject_reason) + ")" +
                                    (ev.reject_reason == UFAB_CM_REJ_INVALID_SERVICE_ID
                                         ? ": nothing listens on port " + std::to_string(cfg_.port) + " there"
                                         : std::string()));
    case UFAB_CM_EVENT_UNREACHABLE:
      return fail(ev.status == -EHOSTUNREACH ? EHOSTUNREACH : ETIMEDOUT,
                  peer_ + " is unreachable: " +
                      (ev.status == -EHOSTUNREACH ? std::string("no ARP answer")
                                                  : std::string("no answer to the connect request (REQ)")));
    case UFAB_CM_EVENT_CONNECT_ERROR:
      return fail(ECONNABORTED, "the connection from " + peer_ +
                                    " failed before it was established (the client gave up, rejected our reply "
                                    "or never confirmed it; status " +
                                    std::to_string(ev.status) + ")");
    default:
      return fail(ECONNABORTED, std::string("unexpected connection event '") + ufab_cm_event_str(ev.type) +
                                    "' from " + from);
  }
}

Status Rping::on_completion(const rdma::WorkCompletion& wc) {
  if (wc.status != rdma::WcStatus::kSuccess) {
    // After a disconnection the QP is in ERROR: what was outstanding is
    // flushed (rping ignores those too).
    if (wc.status == rdma::WcStatus::kWrFlushErr && (disconnected_ || disconnecting_)) return {};
    // The peer's DREQ puts the QP in ERROR before its DISCONNECTED event
    // is queued: a flush is an error only if that event does not follow.
    if (wc.status == rdma::WcStatus::kWrFlushErr) {
      if (flushed_.empty()) {
        flushed_ = std::string("the ") + wr_name(wc.wr_id) + " was flushed" +
                   (wc.error.empty() ? "" : " (" + wc.error + ")");
      }
      return {};
    }
    return fail(EIO, std::string("ping ") + std::to_string(pings_) + ": the " + wr_name(wc.wr_id) +
                         " failed: " + rdma::wc_status_name(wc.status) + (wc.error.empty() ? "" : " (" + wc.error + ")"));
  }
  if (wc.wr_id >= kRecv0 && wc.wr_id < kRecv0 + kRecvSlots) {
    auto slot = static_cast<uint32_t>(wc.wr_id - kRecv0);
    if (wc.byte_len != sizeof(RdmaInfo)) {
      return fail(EBADMSG, "ping " + std::to_string(pings_) + ": received a message of " +
                               std::to_string(wc.byte_len) + " bytes from " + peer_ +
                               "; rping's messages are 16 (an rping_rdma_info)");
    }
    const RdmaInfo& m = msgs_[slot];
    RdmaInfo info{be64toh(m.buf), be32toh(m.rkey), be32toh(m.size)};
    ++recvs_;
    if (cfg_.server) {
      adverts_.push_back(info);
      char b[128];
      std::snprintf(b, sizeof b, "received rkey 0x%x addr 0x%llx len %u from the client", info.rkey,
                    static_cast<unsigned long long>(info.buf), info.size);
      debug(b);
    } else {
      debug("received \"go ahead\"");
    }
    if (!disconnected_ && !disconnecting_) return post_recv(slot);
    return {};
  }
  switch (wc.wr_id) {
    case kRead: read_done_ = true; break;
    case kWrite: write_done_ = true; break;
    default: break;  // SENDs: rping does not wait for them either
  }
  return {};
}

Status Rping::wait(const std::function<bool()>& done, const std::string& what, bool disconnect_ends,
                   milliseconds limit) {
  const auto until = Clock::now() + (limit.count() > 0 ? limit : cfg_.timeout);
  for (;;) {
    if (done()) return {};
    if (disconnected_) {
      if (disconnect_ends) return {};
      return fail(ECONNRESET, peer_ + " disconnected during ping " + std::to_string(pings_) +
                                  " (while waiting for " + what + ")");
    }
    if (g_stops.load() >= (!cfg_.server && cfg_.count == 0 ? 2 : 1)) {
      return fail(EINTR, "interrupted while waiting for " + what);
    }
    if (Clock::now() > until) {
      return fail(ETIMEDOUT, "nothing from " + (peer_.empty() ? std::string("a client") : peer_) + " within " +
                                 std::to_string(cfg_.timeout.count() / 1000) + " s while waiting for " + what +
                                 " (--timeout)");
    }
    ufab_cm_event ev{};
    while (ufab_cm_get_event(cm_, &ev, 0) == 0) {
      if (auto s = on_event(ev); !s) return s;
    }
    if (!flushed_.empty() && !disconnected_) {
      // The QP is in ERROR: a DISCONNECTED event should be on its way.
      const auto grace = Clock::now() + std::min(cfg_.timeout, milliseconds(5000));
      while (!disconnected_ && Clock::now() < grace) {
        if (ufab_cm_get_event(cm_, &ev, 50) == 0) {
          if (auto s = on_event(ev); !s) return s;
        }
      }
      if (!disconnected_) {
        return fail(EIO, "ping " + std::to_string(pings_) + ": " + flushed_ +
                             ": the QP went to ERROR without a disconnection");
      }
      continue;
    }
    rdma::WorkCompletion wc[8];
    auto n = cq_->wait(wc, milliseconds(5));
    if (!n) return std::unexpected(n.error().context("waiting for completions"));
    for (size_t i = 0; i < *n; ++i) {
      if (auto s = on_completion(wc[i]); !s) return s;
    }
  }
}

// After a failure on a connection: tell the peer (DREQ) and give it a
// moment to answer, so that it does not wait for its own timeout.
void Rping::disconnect_after_failure() {
  if (id_ == nullptr || !established_ || disconnected_ || disconnecting_) return;
  disconnecting_ = true;
  if (ufab_cm_disconnect(id_) < 0) return;
  const auto until = Clock::now() + std::min(cfg_.timeout, milliseconds(3000));
  ufab_cm_event ev{};
  while (!disconnected_ && Clock::now() < until) {
    if (ufab_cm_get_event(cm_, &ev, 50) == 0 && ev.id == id_ && ev.type == UFAB_CM_EVENT_DISCONNECTED) {
      disconnected_ = true;
    }
  }
}

Status Rping::run() {
  auto dev = rdma::Device::open(cfg_.device, {.ip = cfg_.ip, .params = cfg_.params, .progress_thread = true});
  if (!dev) return std::unexpected(dev.error());
  dev_ = std::move(*dev);
  auto pd = dev_->alloc_pd();
  if (!pd) return std::unexpected(pd.error());
  pd_.emplace(std::move(*pd));
  ufab_cm_opts o{.size = sizeof o, .response_timeout = 0, .max_retries = 0, .reserved = 0};
  if (int rc = ufab_cm_open(dev_->c(), &o, &cm_); rc < 0) {
    return fail(-rc, std::string("opening the connection manager: ") + ufab_last_error());
  }
  Status s = cfg_.server ? server() : client();
  if (!s) disconnect_after_failure();
  return s;
}

// ------------------------------------------------------------------ server

Status Rping::server() {
  if (int rc = ufab_cm_listen(cm_, cfg_.port, &listener_); rc < 0) {
    return fail(-rc, "listening on port " + std::to_string(cfg_.port) + ": " + ufab_last_error());
  }
  progress("listening on " + cfg_.ip + " port " + std::to_string(cfg_.port));
  ufab_cm_event req{};
  {
    const auto until = Clock::now() + cfg_.timeout;
    for (;;) {
      if (g_stops.load() > 0) return fail(EINTR, "interrupted while waiting for a client");
      if (Clock::now() > until) {
        return fail(ETIMEDOUT, "no client connected to port " + std::to_string(cfg_.port) + " within " +
                                   std::to_string(cfg_.timeout.count() / 1000) + " s (--timeout)");
      }
      if (ufab_cm_get_event(cm_, &req, 50) != 0) continue;
      debug(std::string("connection event ") + ufab_cm_event_str(req.type));
      if (req.type == UFAB_CM_EVENT_CONNECT_REQUEST) break;
    }
  }
  id_ = req.id;
  peer_ = net::Ipv4Address{req.peer_ip}.str() + ":" + std::to_string(req.peer_port);
  progress("connection request from " + peer_);
  if (auto s = setup_qp(); !s) {
    (void)ufab_cm_reject(id_, nullptr, 0);
    return std::unexpected(s.error().context("setting up the QP for " + peer_));
  }
  // rdma_accept without parameters: what the client offered.
  ufab_cm_conn_param p{};
  p.responder_resources = req.param.initiator_depth;
  p.initiator_depth = req.param.responder_resources;
  p.retry_count = 7;
  p.rnr_retry_count = 7;
  if (int rc = ufab_cm_accept(id_, qp_->c(), &p); rc < 0) {
    return fail(-rc, "accepting " + peer_ + ": " + ufab_last_error());
  }
  if (auto s = wait([&] { return established_; }, "the connection to be established (RTU)"); !s) return s;
  connected_at_ = Clock::now();
  progress("connected to " + peer_);
  auto s = serve_pings();
  seconds_ = std::chrono::duration<double>(Clock::now() - connected_at_).count();
  if (!s) return s;
  progress(peer_ + " disconnected after " + std::to_string(pings_) + " ping(s)");
  if (cfg_.count_given && pings_ != cfg_.count) {
    return fail(EPROTO, peer_ + " disconnected after " + std::to_string(pings_) + " ping(s); -C asked for " +
                            std::to_string(cfg_.count));
  }
  return {};
}

// rping_test_server: until the client disconnects.
Status Rping::serve_pings() {
  std::vector<uint8_t> want;
  for (;;) {
    // The client's source: a DISCONNECTED instead is the end.
    if (cfg_.count_given && pings_ == cfg_.count) {
      // Every ping -C asked for: the client's DREQ comes next. rping exits
      // right after rdma_disconnect, and its exit cancels the DREQ's
      // retransmissions, so a lost DREQ is never sent again: after a while
      // this side ends the connection itself.
      const auto grace = std::min(cfg_.timeout, milliseconds(10000));
      auto s = wait([&] { return !adverts_.empty(); }, "the client's disconnection", /*disconnect_ends=*/true, grace);
      if (!s && s.error().code() == ETIMEDOUT) {
        progress("no disconnection from " + peer_ + " within " + std::to_string(grace.count() / 1000) + " s after ping " +
                 std::to_string(pings_) + " of " + std::to_string(cfg_.count) + ": disconnecting");
        disconnect_after_failure();
        return {};
      }
      if (!s) return s;
      // Disconnected; or a ping beyond -C, served below (and reported by
      // the count check at the end).
    } else {
      auto s = wait([&] { return !adverts_.empty(); }, "ping " + std::to_string(pings_) + "'s source advertisement",
                    /*disconnect_ends=*/true);
      if (!s) return s;
    }
    if (adverts_.empty()) return {};  // disconnected
    RdmaInfo src = adverts_.front();
    adverts_.erase(adverts_.begin());
    if (src.size == 0 || src.size > cfg_.size) {
      return fail(EMSGSIZE, "ping " + std::to_string(pings_) + ": the client advertised a " +
                                std::to_string(src.size) + "-byte buffer; this server's -S is " +
                                std::to_string(cfg_.size) + " (give both sides the same -S)");
    }
    read_done_ = false;
    rdma::Sge sge = rdma_mr_->sge(0, src.size);
    if (auto r = qp_->post_send({.wr_id = kRead, .opcode = rdma::WrOpcode::kRdmaRead, .sgl = {&sge, 1},
                                 .remote_addr = src.buf, .rkey = src.rkey});
        !r) {
      return std::unexpected(r.error().context("ping " + std::to_string(pings_) + ": posting the RDMA READ"));
    }
    if (auto r = wait([&] { return read_done_; }, "ping " + std::to_string(pings_) + "'s RDMA READ"); !r) return r;
    std::span<const uint8_t> got(rdma_buf_.data(), src.size);
    if (cfg_.verbose) data_line("server ping data: ", got);
    if (cfg_.validate) {
      want.assign(src.size, 0);
      fill_ping(want, pings_);
      if (!std::equal(got.begin(), got.end(), want.begin())) {
        return fail(EBADMSG, "ping " + std::to_string(pings_) + ": data mismatch: what the RDMA READ brought from " +
                                 peer_ + " is not rping's payload (" + first_difference(got, want) + ")");
      }
    }
    if (auto r = post_go_ahead(); !r) return r;
    // The client's sink.
    if (auto r = wait([&] { return !adverts_.empty(); }, "ping " + std::to_string(pings_) + "'s sink advertisement");
        !r) {
      return r;
    }
    RdmaInfo sink = adverts_.front();
    adverts_.erase(adverts_.begin());
    // What rping writes back: the string read, with its NUL.
    uint32_t len = static_cast<uint32_t>(std::min<size_t>(got.size(), as_string(got).size() + 1));
    if (sink.size < len) {
      return fail(EMSGSIZE, "ping " + std::to_string(pings_) + ": the client's sink is " + std::to_string(sink.size) +
                                " bytes, smaller than the " + std::to_string(len) + " to write back");
    }
    write_done_ = false;
    sge = rdma_mr_->sge(0, len);
    if (auto r = qp_->post_send({.wr_id = kWrite, .opcode = rdma::WrOpcode::kRdmaWrite, .sgl = {&sge, 1},
                                 .remote_addr = sink.buf, .rkey = sink.rkey});
        !r) {
      return std::unexpected(r.error().context("ping " + std::to_string(pings_) + ": posting the RDMA WRITE"));
    }
    if (auto r = wait([&] { return write_done_; }, "ping " + std::to_string(pings_) + "'s RDMA WRITE"); !r) return r;
    if (auto r = post_go_ahead(); !r) return r;
    ++pings_;
  }
}

// ------------------------------------------------------------------ client

Status Rping::client() {
  peer_ = cfg_.addr->str() + ":" + std::to_string(cfg_.port);
  if (auto s = setup_qp(); !s) return s;
  ufab_cm_conn_param p{};  // rping_init_conn_param
  p.responder_resources = 1;
  p.initiator_depth = 1;
  p.retry_count = 7;
  p.rnr_retry_count = 7;
  progress("connecting to " + peer_);
  if (int rc = ufab_cm_connect(cm_, qp_->c(), cfg_.addr->value, cfg_.port, &p, &id_); rc < 0) {
    return fail(-rc, "connecting to " + peer_ + ": " + ufab_last_error());
  }
  if (auto s = wait([&] { return established_; }, "the connection to be established"); !s) return s;
  connected_at_ = Clock::now();
  progress("connected to " + peer_);
  for (uint32_t n = 0; cfg_.count == 0 || n < cfg_.count; ++n) {
    if (g_stops.load() > 0) {
      // Without -C, rping pings until it is stopped: that is its end.
      if (cfg_.count == 0) break;
      return fail(EINTR, "interrupted after " + std::to_string(n) + " of " + std::to_string(cfg_.count) + " pings");
    }
    if (auto s = ping(n); !s) return s;
    ++pings_;
  }
  seconds_ = std::chrono::duration<double>(Clock::now() - connected_at_).count();
  // As rping: disconnect; then wait (bounded) for the DREP.
  disconnecting_ = true;
  if (int rc = ufab_cm_disconnect(id_); rc < 0) return fail(-rc, std::string("disconnecting: ") + ufab_last_error());
  const auto until = Clock::now() + cfg_.timeout;
  while (!disconnected_ && Clock::now() < until) {
    ufab_cm_event ev{};
    if (ufab_cm_get_event(cm_, &ev, 50) == 0) {
      if (auto s = on_event(ev); !s) return s;
    }
  }
  if (!disconnected_) {
    progress("warning: no DISCONNECTED event within " + std::to_string(cfg_.timeout.count() / 1000) + " s");
  } else if (disconnect_status_ == -ETIMEDOUT) {
    progress("warning: " + peer_ + " did not answer the disconnect request (DREQ)");
  } else {
    progress("disconnected");
  }
  return {};
}

// rping_test_client's loop body.
Status Rping::ping(uint32_t n) {
  const std::string which = "ping " + std::to_string(n);
  fill_ping(start_buf_, n);
  uint32_t before = recvs_;
  if (auto s = post_send_info(start_buf_, *start_mr_, 0); !s) return s;
  if (auto s = wait([&] { return recvs_ > before; }, which + "'s first \"go ahead\" (after the server's RDMA READ)");
      !s) {
    return s;
  }
  // The sink starts empty each ping, so that -V sees what this ping wrote.
  std::fill(rdma_buf_.begin(), rdma_buf_.end(), 0);
  before = recvs_;
  if (auto s = post_send_info(rdma_buf_, *rdma_mr_, 1); !s) return s;
  if (auto s = wait([&] { return recvs_ > before; }, which + "'s second \"go ahead\" (after the server's RDMA WRITE)");
      !s) {
    return s;
  }
  if (cfg_.validate && rdma_buf_ != start_buf_) {
    return fail(EBADMSG, which + ": data mismatch: what " + peer_ + " wrote back differs from what it read (" +
                             first_difference(rdma_buf_, start_buf_) + ")");
  }
  if (cfg_.verbose) data_line("ping data: ", rdma_buf_);
  return {};
}

int usage_failure(const Options& opts, const std::string& msg) {
  report_error(opts, "rping", Error(EINVAL, msg));
  std::fprintf(stderr, "(run `ufab --help` for usage)\n");
  return kExitUsage;
}

}  // namespace

int cmd_rping(const Options& opts) {
  Config cfg;
  cfg.device = opts.args[0];
  cfg.json = opts.json;
  auto flag = [&](const char* name) { return opts.flags.count(name) != 0; };
  if (flag("server-side") == flag("client-side")) return usage_failure(opts, "give one of -s (server) and -c (client)");
  if (flag("persistent")) {
    return usage_failure(opts, "-P (persistent server) is not supported: ufab rping serves one connection");
  }
  cfg.server = flag("server-side");
  cfg.verbose = flag("verbose");
  cfg.validate = flag("validate");
  cfg.debug = flag("debug");
  cfg.quiet = flag("quiet");
  if (const std::string* ip = opts.value("ip")) cfg.ip = *ip;
  if (cfg.ip.empty()) return usage_failure(opts, "--ip A.B.C.D is required (this port's address)");
  auto own = net::Ipv4Address::parse(cfg.ip);
  if (!own) return usage_failure(opts, "--ip " + cfg.ip + ": not an IPv4 address");
  if (const std::string* a = opts.value("addr")) {
    auto addr = net::Ipv4Address::parse(*a);
    if (!addr) return usage_failure(opts, "-a " + *a + ": not an IPv4 address (ufab's CM speaks IPv4 only)");
    cfg.addr = *addr;
  }
  if (cfg.server) {
    // rping -s binds to -a (any address without it); ufab listens on the
    // port's address.
    if (cfg.addr && !cfg.addr->is_zero() && *cfg.addr != *own) {
      return usage_failure(opts, "-a " + cfg.addr->str() + ": the server listens on the port's address (--ip " +
                                     cfg.ip + ")");
    }
  } else if (!cfg.addr) {
    return usage_failure(opts, "-c needs -a ADDR, the server's address");
  }
  if (const std::string* src = opts.value("source")) {
    auto s = net::Ipv4Address::parse(*src);
    if (!s || *s != *own) return usage_failure(opts, "-I " + *src + ": ufab binds to the port's address (--ip " + cfg.ip + ")");
  }
  auto port = number_option(opts, "port", kDefaultPort, 1, 65535);
  auto count = number_option(opts, "count", 0, 0, 2147483647);
  auto timeout = number_option(opts, "timeout", 30, 1, 3600);
  for (auto* r : {&port, &count, &timeout}) {
    if (!*r) return usage_failure(opts, r->error().message());
  }
  if (const std::string* sz = opts.value("size")) {
    char* end = nullptr;
    long v = std::strtol(sz->c_str(), &end, 10);
    if (sz->empty() || *end != '\0' || v < kMinSize || v > kMaxSize) {
      return usage_failure(opts, "-S " + *sz + ": rping's sizes are " + std::to_string(kMinSize) + " to " +
                                     std::to_string(kMaxSize));
    }
    cfg.size = static_cast<uint32_t>(v);
  }
  cfg.port = static_cast<uint16_t>(*port);
  cfg.count = static_cast<uint32_t>(*count);
  cfg.count_given = opts.value("count") != nullptr;
  cfg.timeout = milliseconds(static_cast<int64_t>(*timeout * 1000));
  if (auto it = opts.values.find("param"); it != opts.values.end()) {
    for (const auto& kv : it->second) {
      auto eq = kv.find('=');
      if (eq == std::string::npos || eq == 0) return usage_failure(opts, "--param " + kv + ": expected KEY=VALUE");
      cfg.params[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
  }

  g_stops.store(0);
  struct sigaction sa{};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  struct sigaction old_int{}, old_term{};
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  int rc = kExitOk;
  {
    Rping r(cfg);
    auto s = r.run();
    if (!s) {
      rc = report_error(opts, "rping", s.error());
    } else if (opts.json) {
      JsonWriter w;
      w.begin_object().field("ok", true).field("command", "rping");
      w.field("role", cfg.server ? "server" : "client").field("peer", r.peer());
      w.field("port", uint64_t{cfg.port}).field("count", uint64_t{r.pings()}).field("size", uint64_t{cfg.size});
      w.field("validated", r.validated()).field("elapsed", r.seconds()).end_object();
      std::printf("%s\n", w.str().c_str());
    } else if (!cfg.quiet) {
      std::printf("rping: %u ping(s) of %u bytes with %s in %.3f s, %s\n", r.pings(), cfg.size, r.peer().c_str(),
                  r.seconds(),
                  !cfg.validate ? "not validated (no -V)" : (r.validated() ? "validated" : "nothing to validate"));
    }
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  return rc;
}

}  // namespace ufab::cli
