// ufab cmatose DEVICE --ip A.B.C.D [-s SERVER] [-p PORT] [-c N] [-C N] [-S N]:
// rdma-core's ucmatose (librdmacm/examples/cmatose.c) over ufab's
// connection manager, so either side can be the kernel's ucmatose and the
// other ufab.
//
// What is the same as ucmatose, and must stay so for the two to meet:
//   - roles: a client with -s SERVER, else a server; port 7471; rdma_cm's
//     TCP port space; no private data; the client offers responder
//     resources and initiator depth 1;
//   - per connection an RC QP with `count` receives of `size` bytes posted
//     before connecting (client) or accepting (server);
//   - once every connection is established the server sends `count`
//     messages on each and waits for their completions, then for the
//     client's `count` messages; the client waits for the server's, then
//     sends its own;
//   - the server disconnects every connection once it has every message;
//     the client answers (it does not wait for its own send completions).
// What ufab adds: every wait is bounded (--timeout), every completion's
// status is checked, and the messages carry a pattern the receiver checks
// when the peer is ufab too (a kernel peer sends uninitialised memory:
// counted, not failed).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

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

struct Config {
  std::string device, ip, server;  // server empty: be the server
  uint16_t port = 7471;
  uint32_t connections = 1, count = 10, size = 100;
  milliseconds timeout{30000};
  std::map<std::string, std::string> params;
  bool json = false;
};

// The message pattern: byte i of message m on connection c.
uint8_t pattern(uint32_t c, uint32_t m, uint32_t i) { return static_cast<uint8_t>(0x5A ^ (c * 31 + m * 7 + i)); }

struct Conn {
  ufab_cm_id* id = nullptr;
  std::unique_ptr<rdma::CompletionQueue> cq;
  std::unique_ptr<rdma::QueuePair> qp;
  std::vector<uint8_t> buf;  // count receive slots, then count send slots
  std::optional<rdma::MemoryRegion> mr;
  bool established = false, disconnected = false;
  uint32_t sends_done = 0, recvs_done = 0;
};

class Cmatose {
 public:
  explicit Cmatose(const Config& cfg) : cfg_(cfg) {}
  ~Cmatose() {
    for (auto& c : conns_) ufab_cm_id_destroy(c->id);
    ufab_cm_listener_close(listener_);
    ufab_cm_close(cm_);
  }

  Status run();
  uint32_t checked() const { return checked_; }
  uint32_t unchecked() const { return unchecked_; }
  double seconds() const { return seconds_; }

 private:
  void say(const char* what) const {
    if (!cfg_.json) std::printf("cmatose: %s\n", what), std::fflush(stdout);
  }
  Result<std::unique_ptr<Conn>> make_conn();
  Result<ufab_cm_event> event(const char* waiting_for);
  Status handle(const ufab_cm_event& ev);
  Status poll(Conn& c, uint32_t sends, uint32_t recvs, uint32_t index);
  Status send_all(Conn& c, uint32_t index);
  Clock::time_point deadline() const { return Clock::now() + cfg_.timeout; }

  const Config& cfg_;
  std::unique_ptr<rdma::Device> dev_;
  std::optional<rdma::ProtectionDomain> pd_;
  ufab_cm* cm_ = nullptr;
  ufab_cm_listener* listener_ = nullptr;
  std::vector<std::unique_ptr<Conn>> conns_;
  uint32_t checked_ = 0, unchecked_ = 0;
  double seconds_ = 0;
};

Result<std::unique_ptr<Conn>> Cmatose::make_conn() {
  auto c = std::make_unique<Conn>();
  auto cq = dev_->create_cq(2 * cfg_.count + 2);
  if (!cq) return std::unexpected(cq.error());
  c->cq = std::move(*cq);
  auto qp = pd_->create_qp({.type = rdma::QpType::kRc,
                            .send_cq = c->cq.get(),
                            .recv_cq = c->cq.get(),
                            .caps = {.max_send_wr = cfg_.count, .max_recv_wr = cfg_.count},
                            .sq_sig_all = true});
  if (!qp) return std::unexpected(qp.error());
  c->qp = std::move(*qp);
  // INIT, so the receives can go in before the connection exists.
  if (auto s = c->qp->modify({.state = rdma::QpState::kInit, .access_flags = 0, .pkey_index = 0, .port = 1},
                             rdma::kAttrState | rdma::kAttrAccessFlags | rdma::kAttrPkeyIndex | rdma::kAttrPort);
      !s) {
    return std::unexpected(s.error());
  }
  c->buf.assign(2 * uint64_t{cfg_.count} * cfg_.size, 0);
  auto mr = pd_->register_mr(c->buf.data(), c->buf.size(), rdma::kLocalWrite);
  if (!mr) return std::unexpected(mr.error());
  c->mr.emplace(std::move(*mr));
  for (uint32_t m = 0; m < cfg_.count; ++m) {
    rdma::Sge sge = c->mr->sge(uint64_t{m} * cfg_.size, cfg_.size);
    if (auto s = c->qp->post_recv({.wr_id = m, .sgl = {&sge, 1}}); !s) return std::unexpected(s.error());
  }
  return c;
}

Result<ufab_cm_event> Cmatose::event(const char* waiting_for) {
  ufab_cm_event ev{};
  int ms = static_cast<int>(cfg_.timeout.count());
  if (int rc = ufab_cm_get_event(cm_, &ev, ms); rc < 0) {
    return fail(-rc, std::string("no connection event within ") + std::to_string(ms / 1000) + " s while waiting for " +
                         waiting_for);
  }
  return ev;
}

// What the connection manager tells us, in either role.
Status Cmatose::handle(const ufab_cm_event& ev) {
  auto* c = static_cast<Conn*>(ufab_cm_id_context(ev.id));
  std::string peer = net::Ipv4Address{ev.peer_ip}.str() + ":" + std::to_string(ev.peer_port);
  switch (ev.type) {
    case UFAB_CM_EVENT_CONNECT_REQUEST: {
      if (conns_.size() >= cfg_.connections) {
        (void)ufab_cm_reject(ev.id, nullptr, 0);
        ufab_cm_id_destroy(ev.id);
        return {};
      }
      auto conn = make_conn();
      if (!conn) return std::unexpected(conn.error().context("a connection from " + peer));
      (*conn)->id = ev.id;
      ufab_cm_id_set_context(ev.id, conn->get());
      ufab_cm_conn_param p{};
      p.responder_resources = 1;
      p.initiator_depth = 1;
      if (int rc = ufab_cm_accept(ev.id, (*conn)->qp->c(), &p); rc < 0) {
        return fail(-rc, "accepting " + peer + ": " + ufab_last_error());
      }
      conns_.push_back(std::move(*conn));
      return {};
    }
    case UFAB_CM_EVENT_ESTABLISHED:
      if (c != nullptr) c->established = true;
      return {};
    case UFAB_CM_EVENT_DISCONNECTED:
      if (c != nullptr) c->disconnected = true;
      return {};
    case UFAB_CM_EVENT_REJECTED:
      return fail(ECONNREFUSED, peer + " rejected the connection: reason " + std::to_string(ev.reject_reason) + " (" +
                                    ufab_cm_reject_reason_str(ev.reject_reason) + ")");
    case UFAB_CM_EVENT_UNREACHABLE:
      return fail(-ev.status, peer + " is unreachable: " +
                                  (ev.status == -EHOSTUNREACH ? "no ARP answer" : "no answer to the connect request"));
    default:
      return fail(ECONNABORTED, std::string("connection event '") + ufab_cm_event_str(ev.type) + "' from " + peer +
                                    " (status " + std::to_string(ev.status) + ")");
  }
}

// Waits until `c` has completed `sends` sends and `recvs` receives in all.
Status Cmatose::poll(Conn& c, uint32_t sends, uint32_t recvs, uint32_t index) {
  auto until = deadline();
  while (c.sends_done < sends || c.recvs_done < recvs) {
    if (Clock::now() > until) {
      return fail(ETIMEDOUT, "connection " + std::to_string(index) + ": " + std::to_string(c.sends_done) +
                                 " sends and " + std::to_string(c.recvs_done) + " receives completed within the " +
                                 "timeout, waiting for " + std::to_string(sends) + " and " + std::to_string(recvs));
    }
    rdma::WorkCompletion wc[16];
    auto k = c.cq->wait(wc, milliseconds(10));
    if (!k) return std::unexpected(k.error());
    for (size_t i = 0; i < *k; ++i) {
      if (wc[i].status != rdma::WcStatus::kSuccess) {
        return fail(EIO, "connection " + std::to_string(index) + ": work completion failed: " + wc[i].error);
      }
      if (wc[i].opcode == rdma::WcOpcode::kSend) {
        ++c.sends_done;
        continue;
      }
      ++c.recvs_done;
      const uint8_t* m = &c.buf[wc[i].wr_id * cfg_.size];
      bool ok = wc[i].byte_len == cfg_.size;
      for (uint32_t b = 0; ok && b < cfg_.size; ++b) ok = m[b] == pattern(index, static_cast<uint32_t>(wc[i].wr_id), b);
      ++(ok ? checked_ : unchecked_);
    }
  }
  return {};
}

Status Cmatose::send_all(Conn& c, uint32_t index) {
  for (uint32_t m = 0; m < cfg_.count; ++m) {
    uint64_t at = (uint64_t{cfg_.count} + m) * cfg_.size;
    for (uint32_t b = 0; b < cfg_.size; ++b) c.buf[at + b] = pattern(index, m, b);
    rdma::Sge sge = c.mr->sge(at, cfg_.size);
    if (auto s = c.qp->post_send({.wr_id = m, .opcode = rdma::WrOpcode::kSend, .sgl = {&sge, 1}}); !s) {
      return std::unexpected(s.error().context("connection " + std::to_string(index)));
    }
  }
  return {};
}

Status Cmatose::run() {
  auto dev = rdma::Device::open(cfg_.device, {.ip = cfg_.ip, .params = cfg_.params, .progress_thread = true});
  if (!dev) return std::unexpected(dev.error());
  dev_ = std::move(*dev);
  auto pd = dev_->alloc_pd();
  if (!pd) return std::unexpected(pd.error());
  pd_.emplace(std::move(*pd));
  ufab_cm_opts o{.size = sizeof o, .response_timeout = 0, .max_retries = 0, .reserved = 0};
  if (int rc = ufab_cm_open(dev_->c(), &o, &cm_); rc < 0) return fail(-rc, ufab_last_error());
  const bool server = cfg_.server.empty();
  say(server ? "starting server" : "starting client");
  auto start = Clock::now();
  if (server) {
    if (int rc = ufab_cm_listen(cm_, cfg_.port, &listener_); rc < 0) return fail(-rc, ufab_last_error());
    std::fprintf(stderr, "cmatose: listening on %s port %u\n", cfg_.ip.c_str(), unsigned(cfg_.port));
  } else {
    auto to = net::Ipv4Address::parse(cfg_.server);
    if (!to) return fail(EINVAL, "-s " + cfg_.server + ": not an IPv4 address");
    say("connecting");
    for (uint32_t i = 0; i < cfg_.connections; ++i) {
      auto conn = make_conn();
      if (!conn) return std::unexpected(conn.error());
      ufab_cm_conn_param p{};
      p.responder_resources = 1;
      p.initiator_depth = 1;
      p.retry_count = 5;
      if (int rc = ufab_cm_connect(cm_, (*conn)->qp->c(), to->value, cfg_.port, &p, &(*conn)->id); rc < 0) {
        return fail(-rc, ufab_last_error());
      }
      ufab_cm_id_set_context((*conn)->id, conn->get());
      conns_.push_back(std::move(*conn));
    }
  }
  auto all = [&](bool Conn::*flag) {
    if (conns_.size() < cfg_.connections) return false;
    for (auto& c : conns_) {
      if (!(c.get()->*flag)) return false;
    }
    return true;
  };
  while (!all(&Conn::established)) {
    auto ev = event("the connections");
    if (!ev) return std::unexpected(ev.error());
    if (auto s = handle(*ev); !s) return s;
  }
  if (server) {
    say("initiating data transfers");
    for (uint32_t i = 0; i < conns_.size(); ++i) {
      if (auto s = send_all(*conns_[i], i); !s) return s;
    }
    say("completing sends");
    for (uint32_t i = 0; i < conns_.size(); ++i) {
      if (auto s = poll(*conns_[i], cfg_.count, 0, i); !s) return s;
    }
    say("receiving data transfers");
    for (uint32_t i = 0; i < conns_.size(); ++i) {
      if (auto s = poll(*conns_[i], cfg_.count, cfg_.count, i); !s) return s;
    }
    say("data transfers complete");
    say("disconnecting");
    for (auto& c : conns_) {
      if (int rc = ufab_cm_disconnect(c->id); rc < 0) return fail(-rc, ufab_last_error());
    }
  } else {
    say("receiving data transfers");
    for (uint32_t i = 0; i < conns_.size(); ++i) {
      if (auto s = poll(*conns_[i], 0, cfg_.count, i); !s) return s;
    }
    say("sending replies");
    for (uint32_t i = 0; i < conns_.size(); ++i) {
      if (auto s = send_all(*conns_[i], i); !s) return s;
    }
    // As ucmatose, the client does not wait for its sends: the server
    // disconnects once it has them all, and a send whose ACK was lost
    // completes flushed then (the server's count is the check).
    say("data transfers complete");
  }
  while (!all(&Conn::disconnected)) {
    auto ev = event("the disconnections");
    if (!ev) return std::unexpected(ev.error());
    if (auto s = handle(*ev); !s) return s;
  }
  say("disconnected");
  seconds_ = std::chrono::duration<double>(Clock::now() - start).count();
  say("test complete");
  return {};
}

}  // namespace

int cmd_cmatose(const Options& opts) {
  Config cfg;
  cfg.device = opts.args[0];
  cfg.json = opts.json;
  if (const std::string* ip = opts.value("ip")) cfg.ip = *ip;
  if (cfg.ip.empty()) return report_error(opts, "cmatose", Error(EINVAL, "--ip A.B.C.D is required (this port's address)"));
  if (const std::string* s = opts.value("server")) cfg.server = *s;
  if (const std::string* b = opts.value("bind"); b != nullptr && *b != cfg.ip) {
    return report_error(opts, "cmatose", Error(EINVAL, "-b " + *b + ": ufab binds to the port's address (--ip " + cfg.ip + ")"));
  }
  auto port = number_option(opts, "port", 7471, 1, 65535);
  auto connections = number_option(opts, "connections", 1, 1, 1024);
  auto count = number_option(opts, "count", 10, 1, 4096);
  auto size = number_option(opts, "size", 100, 1, 65536);
  auto timeout = number_option(opts, "timeout", 30, 1, 3600);
  for (auto* r : {&port, &connections, &count, &size, &timeout}) {
    if (!*r) return report_error(opts, "cmatose", r->error());
  }
  cfg.port = static_cast<uint16_t>(*port);
  cfg.connections = static_cast<uint32_t>(*connections);
  cfg.count = static_cast<uint32_t>(*count);
  cfg.size = static_cast<uint32_t>(*size);
  cfg.timeout = milliseconds(static_cast<int64_t>(*timeout * 1000));
  if (auto it = opts.values.find("param"); it != opts.values.end()) {
    for (const auto& kv : it->second) {
      auto eq = kv.find('=');
      if (eq == std::string::npos || eq == 0) return report_error(opts, "cmatose", Error(EINVAL, "--param " + kv + ": expected KEY=VALUE"));
      cfg.params[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
  }
  Cmatose run(cfg);
  auto s = run.run();
  if (!s) return report_error(opts, "cmatose", s.error());
  if (opts.json) {
    JsonWriter w;
    w.begin_object().field("ok", true).field("command", "cmatose");
    w.field("role", cfg.server.empty() ? "server" : "client").field("connections", uint64_t{cfg.connections});
    w.field("count", uint64_t{cfg.count}).field("size", uint64_t{cfg.size});
    w.field("messages_checked", uint64_t{run.checked()}).field("messages_unchecked", uint64_t{run.unchecked()});
    w.field("seconds", run.seconds()).end_object();
    std::printf("%s\n", w.str().c_str());
  } else {
    std::printf("cmatose: %u connection(s), %u messages of %u bytes each way; %u received messages carried ufab's "
                "pattern\n",
                cfg.connections, cfg.count, cfg.size, run.checked());
  }
  return kExitOk;
}

}  // namespace ufab::cli
