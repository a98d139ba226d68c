#include "tools/exchange/perftest_cm.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>

#include "core/roce/gid.h"

namespace ufab::exchange {
namespace {

using std::chrono::milliseconds;

constexpr uint32_t kSlot = kPerftestDestSize;  // perftest's receive: sizeof(struct pingpong_dest)
constexpr uint64_t kRecvId = 5, kSendId = 6;   // perftest's SYNC_SPEC_ID is 5 on both; ours tell them apart
constexpr milliseconds kRetryEvery{100};

std::string seconds(milliseconds t) { return std::to_string(t.count() / 1000) + " s"; }

std::string event_name(const cm::Event& ev) { return ufab_cm_event_str(static_cast<uint32_t>(ev.type)); }

}  // namespace

Result<std::unique_ptr<PerftestCm>> PerftestCm::open(rdma::Device& dev, uint16_t port, milliseconds timeout) {
  if (port == 0) return fail(EINVAL, "-R: port 0; rdma_cm needs a port both sides know (perftest's 18515 unless -p)");
  std::unique_ptr<PerftestCm> c(new PerftestCm(dev, port, timeout));
  if (auto s = c->setup(); !s) return std::unexpected(s.error());
  return c;
}

Status PerftestCm::setup() {
  auto cm = cm::ConnectionManager::open(dev_);
  if (!cm) {
    return std::unexpected(cm.error().context("-R: opening the connection manager of " + dev_.name()));
  }
  auto pd = dev_.alloc_pd();
  if (!pd) return std::unexpected(pd.error().context("-R: a PD for the rdma_cm control connection"));
  pd_.emplace(std::move(*pd));
  buffer_.assign(2 * kSlot, 0);
  auto mr = pd_->register_mr(buffer_.data(), buffer_.size(), rdma::kLocalWrite);
  if (!mr) return std::unexpected(mr.error().context("-R: registering the control connection's buffer"));
  mr_.emplace(std::move(*mr));
  auto scq = dev_.create_cq(4), rcq = dev_.create_cq(4);
  if (!scq || !rcq) {
    return std::unexpected((scq ? rcq.error() : scq.error()).context("-R: the control connection's CQs"));
  }
  send_cq_ = std::move(*scq);
  recv_cq_ = std::move(*rcq);
  auto qp = pd_->create_qp({.type = rdma::QpType::kRc,
                            .send_cq = send_cq_.get(),
                            .recv_cq = recv_cq_.get(),
                            .caps = {.max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1,
                                     .max_inline_data = 0}});
  if (!qp) return std::unexpected(qp.error().context("-R: the control connection's RC QP"));
  control_qp_ = std::move(*qp);
  // INIT with its one receive posted, as perftest posts it before
  // connecting or accepting.
  if (auto s = control_qp_->modify({.state = rdma::QpState::kInit, .access_flags = 0, .pkey_index = 0, .port = 1},
                                   rdma::kAttrState | rdma::kAttrAccessFlags | rdma::kAttrPkeyIndex | rdma::kAttrPort);
      !s) {
    return std::unexpected(s.error().context("-R: the control QP to INIT"));
  }
  rdma::Sge sge = mr_->sge(0, kSlot);
  if (auto s = control_qp_->post_recv({.wr_id = kRecvId, .sgl = {&sge, 1}}); !s) {
    return std::unexpected(s.error().context("-R: the control connection's receive"));
  }
  cm_ = std::move(*cm);
  return {};
}

PerftestCm::~PerftestCm() {
  // Ids first (a connected one sends its DREQ), then the manager and its
  // thread, and only then the QPs it was given (the members' order).
  tests_.clear();
  control_ = cm::Id();
  listener_.reset();
  pending_.clear();
  cm_.reset();
}

std::string PerftestCm::where(uint32_t ip) const {
  return roce::ipv4_to_string(ip) + " rdma_cm port " + std::to_string(port_);
}

// ------------------------------------------------------------------ events

void PerftestCm::route(cm::Event ev) {
  if (ev.type == cm::EventType::kDisconnected) {
    if (control_ && ev.id == control_.c()) {
      control_down_ = true;
      control_down_status_ = ev.status;
      return;
    }
    for (auto& t : tests_) {
      if (t.id && ev.id == t.id.c()) {
        t.disconnected = true;
        if (ev.status != 0) {
          warnings_.push_back("a test QP's disconnection ended with status " + std::to_string(ev.status) +
                              " (" + (ev.status == -ETIMEDOUT ? "the peer never answered our DREQ" : "see docs/cm.md") +
                              ")");
        }
        return;
      }
    }
    return;  // a connection we let go of
  }
  if (ev.type == cm::EventType::kConnectRequest && !accepting_) {
    // Nobody asked for it now (a second client, say): refused, as
    // perftest's server refuses one over its count.
    cm::Id id = ev.take_id();
    (void)id.reject();
    return;
  }
  pending_.push_back(std::move(ev));
}

void PerftestCm::pump() {
  for (;;) {
    auto ev = cm_->next_event(milliseconds(0));
    if (!ev) return;
    route(std::move(*ev));
  }
}

Result<cm::Event> PerftestCm::wait_event(const std::function<bool(const cm::Event&)>& want,
                                         Clock::time_point deadline, const std::string& waiting_for) {
  for (auto it = pending_.begin(); it != pending_.end(); ++it) {
    if (want(*it)) {
      cm::Event ev = std::move(*it);
      pending_.erase(it);
      return ev;
    }
  }
  for (;;) {
    auto left = std::chrono::ceil<milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      return fail(ETIMEDOUT, "-R: no rdma_cm event for " + seconds(timeout_) + " while waiting for " + waiting_for);
    }
    auto ev = cm_->next_event(left);
    if (!ev) {
      if (ev.error().code() == ETIMEDOUT) continue;
      return std::unexpected(ev.error().context("-R: waiting for " + waiting_for));
    }
    if (want(*ev)) return std::move(*ev);
    route(std::move(*ev));
  }
}

// -------------------------------------------------------- the control QP

Result<std::unique_ptr<PerftestLink>> PerftestCm::accept_control() {
  auto l = cm_->listen(port_);
  if (!l) return std::unexpected(l.error().context("-R: listening on rdma_cm port " + std::to_string(port_)));
  listener_.emplace(std::move(*l));
  accepting_ = true;
  const auto deadline = Clock::now() + timeout_;
  auto req = wait_event([](const cm::Event& e) { return e.type == cm::EventType::kConnectRequest; }, deadline,
                        "a client to connect to rdma_cm port " + std::to_string(port_) +
                            " (start the client, with this host's --ip as its server)");
  if (!req) return std::unexpected(req.error());
  peer_ = where(req->peer_ip);
  control_ = req->take_id();
  // perftest's control connection: responder resources and initiator
  // depth 0 (SEND only; ufab asks for 1, its least), retry count 7, RNR
  // retry 7.
  if (auto s = control_.accept(*control_qp_, {.responder_resources = 1, .initiator_depth = 1, .retry_count = 7,
                                              .rnr_retry_count = 7});
      !s) {
    return std::unexpected(s.error().context("-R: accepting the control connection from " + peer_));
  }
  auto ev = wait_event([&](const cm::Event& e) { return e.id == control_.c(); }, deadline,
                       "the control connection from " + peer_ + " to be established (its RTU)");
  if (!ev) return std::unexpected(ev.error());
  if (ev->type != cm::EventType::kEstablished) {
    return fail(ECONNABORTED, "-R: the control connection from " + peer_ + " failed after our REP: " +
                                  event_name(*ev) + " (status " + std::to_string(ev->status) +
                                  (ev->reject_reason ? ", REJ reason " + std::to_string(ev->reject_reason) + " (" +
                                                           ev->reject_reason_name() + ")"
                                                     : std::string()) +
                                  ")");
  }
  return std::make_unique<CmPerftestLink>(*this);
}

Result<cm::Id> PerftestCm::connect_one(rdma::QueuePair& qp, uint32_t ip, uint8_t depth, const std::string& what) {
  const auto deadline = Clock::now() + timeout_;
  uint32_t rejected = 0;
  for (;;) {
    auto id = cm_->connect(qp, ip, port_,
                           {.responder_resources = depth, .initiator_depth = depth, .retry_count = 7,
                            .rnr_retry_count = 7});
    if (!id) return std::unexpected(id.error().context("-R: connecting " + what + " to " + where(ip)));
    ufab_cm_id* raw = id->c();
    auto ev = wait_event([&](const cm::Event& e) { return e.id == raw; }, deadline,
                         "the answer to " + what + "'s connection request to " + where(ip));
    if (!ev) return std::unexpected(ev.error());
    switch (ev->type) {
      case cm::EventType::kEstablished:
        return std::move(*id);
      case cm::EventType::kRejected:
        ++rejected;
        if (ev->reject_reason == UFAB_CM_REJ_INVALID_SERVICE_ID && Clock::now() + kRetryEvery < deadline) {
          // Nobody listens yet (the server starts later, or perftest's
          // listens again only after the key exchange): again shortly.
          std::this_thread::sleep_for(kRetryEvery);
          continue;
        }
        return fail(ECONNREFUSED,
                    "-R: " + where(ip) + " rejected the rdma_cm connection (" + what + "): reason " +
                        std::to_string(ev->reject_reason) + " (" +
                        (ev->reject_reason == UFAB_CM_REJ_INVALID_SERVICE_ID
                             ? "nobody listening on port " + std::to_string(port_)
                             : ev->reject_reason_name()) +
                        ")" +
                        (rejected > 1 ? ", " + std::to_string(rejected) + " times in " + seconds(timeout_) : "") +
                        (ev->reject_reason == UFAB_CM_REJ_INVALID_SERVICE_ID
                             ? "; start the server first (ib_*_bw/lat -R or `ufab perf -R`), check -p and the "
                               "server's address, or allow a longer --timeout"
                             : ""));
      case cm::EventType::kUnreachable:
        return fail(ev->status == -EHOSTUNREACH ? EHOSTUNREACH : ETIMEDOUT,
                    "-R: " + where(ip) + " is unreachable for " + what + ": " +
                        (ev->status == -EHOSTUNREACH
                             ? "no ARP answer (is the server's RoCE address right, in --ip's subnet?)"
                             : "nothing answered our connection requests (REQ); is the peer running with -R?"));
      default:
        return fail(ECONNABORTED, "-R: connecting " + what + " to " + where(ip) + ": unexpected " +
                                      event_name(*ev) + " (status " + std::to_string(ev->status) + ")");
    }
  }
}

Result<std::unique_ptr<PerftestLink>> PerftestCm::connect_control(uint32_t server_ip) {
  peer_ = where(server_ip);
  auto id = connect_one(*control_qp_, server_ip, 1, "the control connection");
  if (!id) return std::unexpected(id.error());
  control_ = std::move(*id);
  return std::make_unique<CmPerftestLink>(*this);
}

Status PerftestCm::wait_control(rdma::CompletionQueue& cq, rdma::WorkCompletion& wc, milliseconds timeout,
                                const std::string& what) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    auto n = cq.wait({&wc, 1}, milliseconds(5));
    if (!n) return std::unexpected(n.error().context("-R: " + what));
    if (*n == 1) break;
    pump();
    if (control_down_) {
      return fail(ECONNRESET, "-R: " + peer_ + " disconnected the rdma_cm control connection (its DREQ" +
                                  (control_down_status_ ? ", status " + std::to_string(control_down_status_) : "") +
                                  ") while we were " + what + "; its own output says why");
    }
    if (Clock::now() > deadline) {
      return fail(ETIMEDOUT, "-R: nothing for " + seconds(timeout) + " while " + what + " on the rdma_cm control " +
                                 "connection to " + peer_ + "; is the peer still running the same test?");
    }
  }
  if (wc.status == rdma::WcStatus::kWrFlushErr) {
    // The QP went to ERROR: the peer's DREQ, most likely (its process
    // ended); say so rather than "flushed". Its event follows the QP's
    // move to ERROR closely.
    for (auto until = Clock::now() + milliseconds(200); !control_down_ && Clock::now() < until;) {
      pump();
      if (!control_down_) std::this_thread::sleep_for(milliseconds(5));
    }
    if (control_down_) {
      return fail(ECONNRESET, "-R: " + peer_ + " disconnected the rdma_cm control connection (its DREQ) while we were " +
                                  what + "; its own output says why");
    }
  }
  if (wc.status != rdma::WcStatus::kSuccess) {
    return fail(EIO, "-R: " + what + " on the rdma_cm control connection to " + peer_ + ": completion " +
                         rdma::wc_status_name(wc.status) + (wc.error.empty() ? "" : ": " + wc.error));
  }
  return {};
}

Status PerftestCm::send_control(std::span<const uint8_t> block, milliseconds timeout) {
  if (block.size() > kSlot) {
    return fail(EMSGSIZE, "-R: a " + std::to_string(block.size()) + "-byte message; perftest's control connection " +
                              "takes at most " + std::to_string(kSlot));
  }
  std::memcpy(&buffer_[kSlot], block.data(), block.size());
  rdma::Sge sge = mr_->sge(kSlot, uint32_t(block.size()));
  if (auto s = control_qp_->post_send({.wr_id = kSendId, .opcode = rdma::WrOpcode::kSend,
                                       .flags = rdma::kSendSignaled, .sgl = {&sge, 1}});
      !s) {
    return std::unexpected(s.error().context("-R: sending on the control connection"));
  }
  rdma::WorkCompletion wc;
  return wait_control(*send_cq_, wc, timeout, "sending " + std::to_string(block.size()) + " bytes");
}

Status PerftestCm::recv_control(std::span<uint8_t> block, milliseconds timeout) {
  rdma::WorkCompletion wc;
  if (auto s = wait_control(*recv_cq_, wc, timeout, "waiting for a " + std::to_string(block.size()) + "-byte message");
      !s) {
    return s;
  }
  if (wc.byte_len != block.size()) {
    return fail(EPROTO, "-R: " + peer_ + " sent a " + std::to_string(wc.byte_len) + "-byte message where the " +
                            "exchange expects " + std::to_string(block.size()) + " bytes (" +
                            shown(std::string_view(reinterpret_cast<const char*>(buffer_.data()),
                                                   std::min<size_t>(wc.byte_len, kSlot))) +
                            "); do both sides run the same test with the same options?");
  }
  std::memcpy(block.data(), buffer_.data(), block.size());
  rdma::Sge sge = mr_->sge(0, kSlot);
  if (auto s = control_qp_->post_recv({.wr_id = kRecvId, .sgl = {&sge, 1}}); !s) {
    return std::unexpected(s.error().context("-R: posting the control connection's next receive"));
  }
  return {};
}

// ---------------------------------------------------------- the test QPs

Status PerftestCm::connect_qps(std::span<rdma::QueuePair* const> qps, uint32_t server_ip, uint8_t depth) {
  for (size_t i = 0; i < qps.size(); ++i) {
    auto id = connect_one(*qps[i], server_ip, depth, "test QP " + std::to_string(i));
    if (!id) return std::unexpected(id.error());
    tests_.push_back({std::move(*id), false});
  }
  return {};
}

Status PerftestCm::accept_qps(std::span<rdma::QueuePair* const> qps, uint8_t depth) {
  const auto deadline = Clock::now() + timeout_;
  for (size_t i = 0; i < qps.size(); ++i) {
    auto req = wait_event([](const cm::Event& e) { return e.type == cm::EventType::kConnectRequest; }, deadline,
                          "the connection request of test QP " + std::to_string(i) + " of " +
                              std::to_string(qps.size()) + " from " + peer_ + " (same -q on both sides?)");
    if (!req) return std::unexpected(req.error());
    cm::Id id = req->take_id();
    if (auto s = id.accept(*qps[i], {.responder_resources = depth, .initiator_depth = depth, .retry_count = 7,
                                     .rnr_retry_count = 7});
        !s) {
      return std::unexpected(s.error().context("-R: accepting test QP " + std::to_string(i)));
    }
    tests_.push_back({std::move(id), false});
  }
  accepting_ = false;
  listener_.reset();  // later requests: REJ 8, as after perftest's listener is gone
  for (size_t i = 0; i < tests_.size(); ++i) {
    ufab_cm_id* raw = tests_[i].id.c();
    auto ev = wait_event([&](const cm::Event& e) { return e.id == raw; }, deadline,
                         "test QP " + std::to_string(i) + "'s connection to be established (the RTU from " + peer_ +
                             ")");
    if (!ev) return std::unexpected(ev.error());
    if (ev->type != cm::EventType::kEstablished) {
      return fail(ECONNABORTED, "-R: test QP " + std::to_string(i) + "'s connection failed after our REP: " +
                                    event_name(*ev) + " (status " + std::to_string(ev->status) + ")");
    }
  }
  return {};
}

Status PerftestCm::disconnect_qps() {
  pump();
  for (auto& t : tests_) {
    // One the peer disconnected already (its DREQ crossed ours or came
    // first) ends by itself.
    if (!t.disconnected) (void)t.id.disconnect();
  }
  const auto deadline = Clock::now() + timeout_;
  for (size_t i = 0; i < tests_.size(); ++i) {
    while (!tests_[i].disconnected) {
      auto left = std::chrono::ceil<milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) {
        return fail(ETIMEDOUT, "-R: test QP " + std::to_string(i) + " still connected " + seconds(timeout_) +
                                   " after our DREQ: " + peer_ + " neither answered (DREP) nor gave up");
      }
      auto ev = cm_->next_event(left);
      if (ev) route(std::move(*ev));
    }
  }
  return {};
}

}  // namespace ufab::exchange
