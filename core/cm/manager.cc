#include "core/cm/manager.h"

#include <sys/eventfd.h>
#include <sys/random.h>

#include <algorithm>
#include <cstring>

#include "core/cm/rdma_cm.h"
#include "core/net/addresses.h"

namespace ufab::cm {
namespace {

// Receive slots: a peer's burst (one DREQ per connection when it closes
// many) is taken without loss up to this many (the kernel's MAD layer
// posts 512). Send slots: what is in flight; more waits in the backlog.
constexpr uint32_t kRecvSlots = 256;
constexpr uint32_t kSendSlots = 64;
constexpr size_t kBacklog = 1024;            // MADs waiting for a send slot, at most
constexpr uint32_t kGrh = 40;                // a UD receive starts with the GRH area
constexpr uint32_t kRecvSlot = kGrh + kMadSize;
constexpr uint64_t kSendBit = 1ull << 32;    // wr_id: a send slot
constexpr uint8_t kPacketLifetime = 14;      // ~67 ms each way, on top of the response timeout
constexpr uint8_t kMaxRdAtomic = 16;         // soft-RoCE's max_qp_rd_atom
constexpr uint8_t kLocalAckTimeout = 14;     // ufab_qp_attr_defaults' timeout
constexpr uint8_t kTargetAckDelay = 15;      // what rxe sends in REP

uint64_t random64() {
  uint64_t v = 0;
  if (::getrandom(&v, sizeof v, 0) != sizeof v) v = static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  return v;
}

std::string ip_str(uint32_t ip) { return net::Ipv4Address{ip}.str(); }

Gid ipv4_gid(uint32_t ip) {
  Gid g{};
  g[10] = g[11] = 0xFF;
  for (int i = 0; i < 4; ++i) g[12 + i] = static_cast<uint8_t>(ip >> (24 - 8 * i));
  return g;
}

// IB MTU enum (1 = 256 .. 5 = 4096) and back.
uint8_t mtu_code(uint32_t bytes) {
  uint8_t code = 1;
  while (code < 5 && (256u << code) <= bytes) ++code;
  return code;
}
uint32_t mtu_bytes(uint8_t code) { return code >= 1 && code <= 5 ? 128u << code : 0; }

uint8_t or_default(uint8_t v, uint8_t d) { return v != 0 ? v : d; }

}  // namespace

const char* Manager::state_name(State s) {
  switch (s) {
    case State::kReqSent: return "REQ sent";
    case State::kMraReceived: return "MRA received";
    case State::kReqReceived: return "REQ received";
    case State::kMraSent: return "MRA sent";
    case State::kRepSent: return "REP sent";
    case State::kEstablished: return "established";
    case State::kDreqSent: return "DREQ sent";
    case State::kTimewait: return "timewait";
  }
  return "?";
}

// ------------------------------------------------------------------ set-up

Result<std::unique_ptr<Manager>> Manager::open(ufab_device* dev, const ufab_cm_opts& opts) {
  std::unique_ptr<Manager> m(new Manager());
  if (auto s = m->start(dev, opts); !s) {
    return std::unexpected(s.error());
  }
  return m;
}

Status Manager::start(ufab_device* dev, const ufab_cm_opts& opts) {
  dev_ = dev;
  if (opts.max_retries > 15) return fail(EINVAL, "max_retries is at most 15 (the REQ's 4-bit field)");
  if (opts.response_timeout > 31) return fail(EINVAL, "response_timeout is an IBA code, 0..31");
  response_timeout_ = or_default(opts.response_timeout, 18);
  max_retries_ = or_default(opts.max_retries, 7);
  ufab_device_attr attr{};
  if (int rc = ufab_device_query(dev, &attr); rc < 0) return fail(-rc, std::string("querying the device: ") + ufab_last_error());
  ip_ = attr.ip;
  mtu_ = attr.active_mtu != 0 ? attr.active_mtu : 1024;
  if ((attr.caps & UFAB_DEVICE_CAP_WIRE_ROCEV2) == 0) {
    return fail(EOPNOTSUPP, std::string("device ") + attr.name + " (" + attr.provider +
                                ") is not RoCEv2 on an Ethernet NIC: the connection manager needs a soft-RoCE device");
  }
  tid_high_ = random64() << 32;
  event_fd_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!event_fd_.valid()) return fail_errno("creating the CM's event fd");

  auto check = [](int rc, const char* what) -> Status {
    if (rc < 0) return fail(-rc, std::string(what) + ": " + ufab_last_error());
    return {};
  };
  if (auto s = check(ufab_pd_alloc(dev, &pd_), "allocating the CM's PD"); !s) return s;
  if (auto s = check(ufab_cq_create(dev, kRecvSlots + kSendSlots, &cq_), "creating the CM's CQ"); !s) return s;
  ufab_qp_init_attr init{.qp_type = UFAB_QPT_GSI,
                         .sq_sig_all = 1,
                         .send_cq = cq_,
                         .recv_cq = cq_,
                         .cap = {.max_send_wr = kSendSlots, .max_recv_wr = kRecvSlots, .max_send_sge = 1, .max_recv_sge = 1,
                                 .max_inline_data = 0}};
  if (int rc = ufab_qp_create(pd_, &init, &gsi_); rc < 0) {
    return fail(-rc, std::string("creating the GSI QP (QP 1) for the connection manager: ") + ufab_last_error());
  }
  ufab_qp_attr a;
  ufab_qp_attr_defaults(&a);
  a.qkey = kGsiQKey;
  ufab_conn none{};
  if (auto s = check(ufab_qp_connect(gsi_, &none, &a), "bringing the GSI QP to RTS"); !s) return s;
  buffers_.assign(kRecvSlots * kRecvSlot + kSendSlots * kMadSize, 0);
  if (auto s = check(ufab_mr_reg(pd_, buffers_.data(), buffers_.size(), UFAB_ACCESS_LOCAL_WRITE, &mr_),
                     "registering the CM's buffers");
      !s) {
    return s;
  }
  for (uint32_t i = 0; i < kSendSlots; ++i) free_sends_.push_back(static_cast<uint16_t>(kSendSlots - 1 - i));
  send_peer_.assign(kSendSlots, 0);
  post_receives();
  thread_ = std::thread([this] { run(); });
  return {};
}

Manager::~Manager() {
  {
    std::lock_guard lock(mu_);
    // Connected ones get a DREQ (not waited for); their QPs go to ERROR.
    for (auto& [id, c] : conns_) {
      if (c->state == State::kEstablished || c->state == State::kRepSent) {
        send_dreq(*c);
      } else if (c->ud && c->state == State::kReqReceived) {
        send_message(c->peer_ip, c->tid,
                     SidrRep{.request_id = c->remote_id, .status = static_cast<uint8_t>(SidrStatus::kReject),
                             .vendor_id = 0, .qpn = 0, .service_id = c->sidr.service_id, .qkey = 0,
                             .additional_info = {}, .private_data = {}});
      } else if (c->state == State::kReqReceived || c->state == State::kMraSent) {
        send_rej(c->peer_ip, c->tid, c->local_id, c->req.local_comm_id, MessageCode::kReq,
                 RejectReason::kConsumerDefined);
      }
    }
  }
  if (thread_.joinable()) {
    // Let the DREQs and REJs leave before the QP goes (the thread sends
    // what waits for a slot as slots come back).
    auto until = Clock::now() + std::chrono::milliseconds(500);
    while (Clock::now() < until) {
      {
        std::lock_guard lock(mu_);
        if (free_sends_.size() == kSendSlots && backlog_.empty()) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    stop_ = true;
    thread_.join();
  }
  if (gsi_ != nullptr) ufab_qp_destroy(gsi_);
  if (mr_ != nullptr) ufab_mr_dereg(mr_);
  if (cq_ != nullptr) ufab_cq_destroy(cq_);
  if (pd_ != nullptr) ufab_pd_free(pd_);
}

// ------------------------------------------------------------------- wire

void Manager::post_receives() {
  for (uint32_t i = 0; i < kRecvSlots; ++i) {
    ufab_sge sge{.addr = reinterpret_cast<uint64_t>(&buffers_[i * kRecvSlot]), .length = kRecvSlot,
                 .lkey = ufab_mr_lkey(mr_)};
    ufab_recv_wr wr{.wr_id = i, .sg_list = &sge, .num_sge = 1, .reserved = 0};
    (void)ufab_post_recv(gsi_, &wr, 1, nullptr);
  }
}

void Manager::run() {
  ufab_wc wc[16];
  while (!stop_) {
    int wait_ms = 20;
    {
      std::lock_guard lock(mu_);
      if (auto d = next_deadline()) {
        auto left = std::chrono::ceil<std::chrono::milliseconds>(*d - Clock::now()).count();
        wait_ms = static_cast<int>(std::clamp<int64_t>(left, 0, 20));
      }
    }
    int n = ufab_cq_wait(cq_, wc, 16, wait_ms);
    std::lock_guard lock(mu_);
    for (int i = 0; i < n; ++i) on_completion(wc[i]);
    run_timers(Clock::now());
    drain_backlog();
  }
}

void Manager::on_completion(const ufab_wc& wc) {
  if (wc.wr_id & kSendBit) {
    auto slot = static_cast<uint16_t>(wc.wr_id & 0xFFFF);
    free_sends_.push_back(slot);
    drain_backlog();
    if (wc.status != UFAB_WC_SUCCESS) {
      // The one way a datagram fails here: no ARP answer. Active
      // connections to that peer cannot get anywhere.
      uint32_t peer = send_peer_[slot];
      std::vector<Conn*> gone;
      for (auto& [id, c] : conns_) {
        if (c->peer_ip == peer && c->active && (c->state == State::kReqSent || c->state == State::kMraReceived)) {
          gone.push_back(c.get());
        }
      }
      for (Conn* c : gone) {
        push(*c, UFAB_CM_EVENT_UNREACHABLE, -EHOSTUNREACH);
        forget(*c);
      }
    }
    return;
  }
  uint32_t slot = static_cast<uint32_t>(wc.wr_id);
  if (slot >= kRecvSlots) return;
  uint8_t* buf = &buffers_[slot * kRecvSlot];
  if (wc.status == UFAB_WC_SUCCESS && wc.byte_len >= kGrh) {
    uint32_t peer = (uint32_t{buf[32]} << 24) | (uint32_t{buf[33]} << 16) | (uint32_t{buf[34]} << 8) | buf[35];
    on_mad(peer, std::span<const uint8_t>(buf + kGrh, wc.byte_len - kGrh));
  }
  ufab_sge sge{.addr = reinterpret_cast<uint64_t>(buf), .length = kRecvSlot, .lkey = ufab_mr_lkey(mr_)};
  ufab_recv_wr wr{.wr_id = slot, .sg_list = &sge, .num_sge = 1, .reserved = 0};
  (void)ufab_post_recv(gsi_, &wr, 1, nullptr);
}

void Manager::send(uint32_t peer_ip, const std::array<uint8_t, kMadSize>& mad) {
  if (free_sends_.empty() || !backlog_.empty()) {
    // All slots in flight: it waits its turn (in order) for one to come
    // back; beyond the bound it is lost, as on the wire (timers resend).
    if (backlog_.size() < kBacklog) {
      backlog_.emplace_back(peer_ip, mad);
    } else {
      ++dropped_;
    }
    return;
  }
  post_send(peer_ip, mad);
}

void Manager::drain_backlog() {
  while (!backlog_.empty() && !free_sends_.empty()) {
    auto [peer, mad] = backlog_.front();
    backlog_.pop_front();
    post_send(peer, mad);
  }
}

void Manager::post_send(uint32_t peer_ip, const std::array<uint8_t, kMadSize>& mad) {
  uint16_t slot = free_sends_.back();
  free_sends_.pop_back();
  send_peer_[slot] = peer_ip;
  uint8_t* buf = &buffers_[kRecvSlots * kRecvSlot + slot * kMadSize];
  std::memcpy(buf, mad.data(), kMadSize);
  ufab_sge sge{.addr = reinterpret_cast<uint64_t>(buf), .length = kMadSize, .lkey = ufab_mr_lkey(mr_)};
  ufab_send_wr wr{};
  wr.wr_id = kSendBit | slot;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = UFAB_WR_SEND;
  wr.send_flags = UFAB_SEND_SIGNALED;
  wr.ud = ufab_ud_dest{.ip = peer_ip, .qpn = kGsiQpn, .qkey = kGsiQKey, .traffic_class = 0, .hop_limit = 64,
                       .reserved = 0};
  if (ufab_post_send(gsi_, &wr, 1, nullptr) < 0) {
    free_sends_.push_back(slot);
    ++dropped_;
  }
}

std::optional<std::array<uint8_t, kMadSize>> Manager::build(uint64_t tid, Message message) {
  auto bytes = build_mad(Mad{.header = cm_header(tid), .message = std::move(message)});
  if (!bytes) {
    ++dropped_;  // a field we filled does not fit: a bug here, not the peer's
    return std::nullopt;
  }
  return *bytes;
}

std::optional<std::array<uint8_t, kMadSize>> Manager::send_message(uint32_t peer_ip, uint64_t tid, Message message) {
  auto mad = build(tid, std::move(message));
  if (mad) send(peer_ip, *mad);
  return mad;
}

std::optional<std::array<uint8_t, kMadSize>> Manager::send_rej(uint32_t peer_ip, uint64_t tid, uint32_t local_id,
                                                              uint32_t remote_id, MessageCode what,
                                                              RejectReason reason,
                                                              std::span<const uint8_t> private_data) {
  return send_message(peer_ip, tid,
               Rej{.local_comm_id = local_id, .remote_comm_id = remote_id, .message_rejected = what,
                   .reason = static_cast<uint16_t>(reason), .ari = {},
                   .private_data = PrivateData(private_data.begin(), private_data.end())});
}

void Manager::reject_timeout(Conn& c) {
  // As ib_cm does when it gives up on a REQ: REJ "timeout" with our CA GUID
  // as the additional information, so a peer that heard the REQ forgets it.
  std::vector<uint8_t> guid(8);
  for (int i = 0; i < 8; ++i) guid[i] = static_cast<uint8_t>(c.req.local_ca_guid >> (56 - 8 * i));
  send_message(c.peer_ip, c.tid,
               Rej{.local_comm_id = c.local_id, .remote_comm_id = c.remote_id, .message_rejected = MessageCode::kReq,
                   .reason = static_cast<uint16_t>(RejectReason::kTimeout), .ari = std::move(guid),
                   .private_data = {}});
}

void Manager::on_mad(uint32_t peer_ip, std::span<const uint8_t> bytes) {
  auto mad = parse_mad(bytes);
  if (!mad) {
    // A REQ of another CM class version gets REJ "invalid class version"
    // (IBA 12.6.7.1) naming ours; anything else malformed is dropped.
    auto h = parse_mad_header(bytes);
    if (mad.error().code() == EPROTONOSUPPORT && h && h->mgmt_class == kMgmtClassCm &&
        h->attribute_id == static_cast<uint16_t>(AttributeId::kReq) && bytes.size() >= kMadHeaderSize + 4) {
      uint32_t their_id = (uint32_t{bytes[24]} << 24) | (uint32_t{bytes[25]} << 16) | (uint32_t{bytes[26]} << 8) |
                          bytes[27];
      send_message(peer_ip, h->transaction_id,
                   Rej{.local_comm_id = 0, .remote_comm_id = their_id, .message_rejected = MessageCode::kReq,
                       .reason = static_cast<uint16_t>(RejectReason::kInvalidClassVersion),
                       .ari = {kCmClassVersion}, .private_data = {}});
    }
    ++dropped_;
    return;
  }
  const MadHeader& h = mad->header;
  std::visit(
      [&](const auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, Req>) {
          on_req(peer_ip, h, m);
        } else if constexpr (std::is_same_v<T, Rep>) {
          on_rep(h, m);
        } else if constexpr (std::is_same_v<T, Rtu>) {
          on_rtu(m);
        } else if constexpr (std::is_same_v<T, Rej>) {
          on_rej(peer_ip, m);
        } else if constexpr (std::is_same_v<T, Mra>) {
          on_mra(m);
        } else if constexpr (std::is_same_v<T, Dreq>) {
          on_dreq(peer_ip, h, m);
        } else if constexpr (std::is_same_v<T, Drep>) {
          on_drep(m);
        } else if constexpr (std::is_same_v<T, Lap>) {
          // Alternate paths are not supported: APR "unsupported" (IBA 12.8.2).
          send_message(peer_ip, h.transaction_id,
                       Apr{.local_comm_id = m.remote_comm_id, .remote_comm_id = m.local_comm_id,
                           .status = static_cast<uint8_t>(AprStatus::kUnsupported), .additional_info = {},
                           .private_data = {}});
        } else if constexpr (std::is_same_v<T, SidrReq>) {
          on_sidr_req(peer_ip, h, m);
        } else if constexpr (std::is_same_v<T, SidrRep>) {
          on_sidr_rep(m);
        } else {
          ++dropped_;  // APR: an answer to what we never send
        }
      },
      mad->message);
}

// --------------------------------------------------------------- handlers

void Manager::on_req(uint32_t peer_ip, const MadHeader& h, const Req& m) {
  if (auto it = by_remote_.find({peer_ip, m.local_comm_id}); it != by_remote_.end()) {
    // A REQ again: the peer did not hear us yet (IBA 12.9.6.1).
    Conn* c = find_rc(it->second);
    if (c == nullptr) return;
    switch (c->state) {
      case State::kReqReceived:
      case State::kMraSent: {
        // The application is still deciding: ask for more time.
        send_message(peer_ip, c->tid,
                                Mra{.local_comm_id = c->local_id, .remote_comm_id = m.local_comm_id,
                                    .message_mraed = MessageCode::kReq,
                                    .service_timeout = static_cast<uint8_t>(std::min(31, response_timeout_ + 3)),
                                    .private_data = {}});
        c->state = State::kMraSent;
        break;
      }
      case State::kRepSent:
        if (c->resend) send(peer_ip, *c->resend);
        break;
      case State::kTimewait:
        if (c->rejected && c->answer) {
          send(peer_ip, *c->answer);  // our REJ was lost: the same REJ (reason, private data) again
        } else {
          send_rej(peer_ip, h.transaction_id, c->local_id, m.local_comm_id, MessageCode::kReq,
                   RejectReason::kStaleConnection);
        }
        break;
      default:
        break;  // established: the RTU is on its way or the REQ is stale
    }
    return;
  }
  auto reject = [&](RejectReason r) {
    send_rej(peer_ip, h.transaction_id, 0, m.local_comm_id, MessageCode::kReq, r);
  };
  auto service = parse_rdma_cm_service_id(m.service_id);
  if (!service || service->port_space != kRdmaPsTcp) return reject(RejectReason::kInvalidServiceId);
  auto cma = parse_cma_header(m.private_data);
  if (!cma || cma->port == 0) return reject(RejectReason::kInvalidServiceId);
  if (cma->dst_ipv4() != ip_) return reject(RejectReason::kInvalidServiceId);  // not our address
  auto l = listeners_.find({kRdmaPsTcp, service->port});
  if (l == listeners_.end()) return reject(RejectReason::kInvalidServiceId);
  if (m.transport_service_type != TransportType::kRc || m.extended_transport_type != 0) {
    return reject(RejectReason::kInvalidTransportType);
  }
  if (mtu_bytes(m.path_mtu) == 0) return reject(RejectReason::kInvalidMtu);
  if (pending_requests() >= UFAB_CM_MAX_PENDING_REQUESTS) return reject(RejectReason::kNoResources);

  auto c = passive_conn(peer_ip, h.transaction_id, m.local_comm_id, cma->port, service->port, l->second);
  c->req = m;
  Conn& conn = file(std::move(c));
  push(conn, UFAB_CM_EVENT_CONNECT_REQUEST, 0, rdma_cm_req_user_data(m.private_data));
}

std::unique_ptr<Manager::Conn> Manager::passive_conn(uint32_t peer_ip, uint64_t tid, uint32_t remote_id,
                                                     uint16_t peer_port, uint16_t local_port,
                                                     ufab_cm_listener* listener) {
  auto c = std::make_unique<Conn>();
  c->state = State::kReqReceived;
  c->active = false;
  c->local_id = new_local_id();
  c->remote_id = remote_id;
  c->tid = tid;
  c->peer_ip = peer_ip;
  c->peer_port = peer_port;
  c->local_port = local_port;
  c->listener = listener;
  return c;
}

void Manager::on_rep(const MadHeader& h, const Rep& m) {
  Conn* c = find_rc(m.remote_comm_id);
  if (c == nullptr || !c->active) {
    ++dropped_;
    return;
  }
  if (c->state == State::kEstablished || c->state == State::kTimewait || c->state == State::kDreqSent) {
    if (c->remote_id == m.local_comm_id && c->answer && c->state == State::kEstablished) {
      send(c->peer_ip, *c->answer);  // our RTU was lost: the peer sends its REP again
    }
    return;
  }
  if (c->state != State::kReqSent && c->state != State::kMraReceived) return;
  c->remote_id = m.local_comm_id;
  c->rep = m;
  uint8_t depth = std::min(c->req.initiator_depth, m.responder_resources);
  uint8_t resources = std::min(c->req.responder_resources, m.initiator_depth);
  auto connected = connect_qp(*c, c->qp, m.local_qpn, m.starting_psn, resources, depth, c->req.retry_count,
                              m.rnr_retry_count);
  if (!connected) {
    send_rej(c->peer_ip, h.transaction_id, c->local_id, c->remote_id, MessageCode::kRep, RejectReason::kNoQp);
    push(*c, UFAB_CM_EVENT_UNREACHABLE, -connected.error().code());
    forget(*c);
    return;
  }
  c->answer = send_message(c->peer_ip, c->tid,
                           Rtu{.local_comm_id = c->local_id, .remote_comm_id = c->remote_id, .private_data = {}});
  c->state = State::kEstablished;
  c->deadline.reset();
  c->resend.reset();
  push(*c, UFAB_CM_EVENT_ESTABLISHED, 0, m.private_data);
}

void Manager::on_rtu(const Rtu& m) {
  Conn* c = find_rc(m.remote_comm_id);
  if (c == nullptr || c->active || c->remote_id != m.local_comm_id || c->state != State::kRepSent) return;
  c->state = State::kEstablished;
  c->deadline.reset();
  c->resend.reset();
  push(*c, UFAB_CM_EVENT_ESTABLISHED, 0);
}

void Manager::on_rej(uint32_t peer_ip, const Rej& m) {
  Conn* c = find_rc(m.remote_comm_id);
  if (c == nullptr && m.message_rejected == MessageCode::kReq) {
    // The peer gave up on a REQ it never heard us answer (REJ timeout).
    if (auto it = by_remote_.find({peer_ip, m.local_comm_id}); it != by_remote_.end()) c = find_rc(it->second);
  }
  if (c == nullptr) {
    ++dropped_;
    return;
  }
  if (!c->active && (c->state == State::kReqReceived || c->state == State::kMraSent) &&
      c->remote_id == m.local_comm_id) {
    push(*c, UFAB_CM_EVENT_CONNECT_ERROR, -ECONNABORTED, m.private_data, m.reason);
    forget(*c);
    return;
  }
  if (c->active && (c->state == State::kReqSent || c->state == State::kMraReceived)) {
    push(*c, UFAB_CM_EVENT_REJECTED, -ECONNREFUSED, m.private_data, m.reason);
    forget(*c);
  } else if (!c->active && c->state == State::kRepSent && c->remote_id == m.local_comm_id) {
    qp_to_error(*c);
    push(*c, UFAB_CM_EVENT_CONNECT_ERROR, -ECONNREFUSED, m.private_data, m.reason);
    forget(*c);
  }
}

void Manager::on_mra(const Mra& m) {
  Conn* c = find_rc(m.remote_comm_id);
  if (c == nullptr || !c->deadline) return;
  bool for_req = m.message_mraed == MessageCode::kReq && c->active &&
                 (c->state == State::kReqSent || c->state == State::kMraReceived);
  bool for_rep = m.message_mraed == MessageCode::kRep && !c->active && c->state == State::kRepSent;
  if (!for_req && !for_rep) return;
  if (for_req) c->state = State::kMraReceived;
  // Wait as long as the peer asked before sending again (IBA 12.6.6).
  c->deadline = Clock::now() + iba_time(m.service_timeout) + 2 * iba_time(kPacketLifetime);
}

void Manager::on_dreq(uint32_t peer_ip, const MadHeader& h, const Dreq& m) {
  Conn* c = find_rc(m.remote_comm_id);
  auto drep = Drep{.local_comm_id = m.remote_comm_id, .remote_comm_id = m.local_comm_id, .private_data = {}};
  if (c == nullptr || c->remote_id != m.local_comm_id) {
    send_message(peer_ip, h.transaction_id, drep);  // gone already: it is over either way
    return;
  }
  // The DREQ names the QP it ends (IBA 12.6.10, "remote QPN"): one that is
  // not this connection's is dropped, as ib_cm drops it.
  if (m.remote_qpn_eecn != (c->active ? c->req.local_qpn : c->rep.local_qpn)) {
    ++dropped_;
    return;
  }
  switch (c->state) {
    case State::kEstablished:
    case State::kRepSent:  // the RTU was lost; the peer is done anyway
    case State::kDreqSent: {  // both sides disconnected at once
      qp_to_error(*c);
      c->answer = send_message(peer_ip, h.transaction_id, drep);
      push(*c, UFAB_CM_EVENT_DISCONNECTED, 0, m.private_data);
      enter_timewait(*c);
      break;
    }
    case State::kTimewait:
      if (c->answer) {
        send(peer_ip, *c->answer);
      } else {
        send_message(peer_ip, h.transaction_id, drep);
      }
      break;
    default:
      break;
  }
}

void Manager::on_drep(const Drep& m) {
  Conn* c = find_rc(m.remote_comm_id);
  if (c == nullptr || c->state != State::kDreqSent || c->remote_id != m.local_comm_id) return;
  push(*c, UFAB_CM_EVENT_DISCONNECTED, 0, m.private_data);
  enter_timewait(*c);
}

// UD service resolution (IBA 12.11): one question, one answer. The passive
// side keeps its answer a while (timewait) for a SIDR_REQ sent again.
void Manager::on_sidr_req(uint32_t peer_ip, const MadHeader& h, const SidrReq& m) {
  if (auto it = by_remote_.find({peer_ip, m.request_id}); it != by_remote_.end()) {
    Conn* c = find(it->second);
    if (c != nullptr && c->ud && c->state == State::kTimewait && c->answer) send(peer_ip, *c->answer);
    return;  // still with the application: it answers once
  }
  auto unsupported = [&] {
    send_message(peer_ip, h.transaction_id,
                 SidrRep{.request_id = m.request_id, .status = static_cast<uint8_t>(SidrStatus::kUnsupported),
                         .vendor_id = 0, .qpn = 0, .service_id = m.service_id, .qkey = 0, .additional_info = {},
                         .private_data = {}});
  };
  auto service = parse_rdma_cm_service_id(m.service_id);
  if (!service || service->port_space != kRdmaPsUdp) return unsupported();
  auto cma = parse_cma_header(m.private_data);
  if (!cma || cma->dst_ipv4() != ip_) return unsupported();
  auto l = listeners_.find({kRdmaPsUdp, service->port});
  if (l == listeners_.end()) return unsupported();
  if (pending_requests() >= UFAB_CM_MAX_PENDING_REQUESTS) {
    send_message(peer_ip, h.transaction_id,
                 SidrRep{.request_id = m.request_id, .status = static_cast<uint8_t>(SidrStatus::kReject),
                         .vendor_id = 0, .qpn = 0, .service_id = m.service_id, .qkey = 0, .additional_info = {},
                         .private_data = {}});
    return;
  }
  auto c = passive_conn(peer_ip, h.transaction_id, m.request_id, cma->port, service->port, l->second);
  c->ud = true;
  c->sidr = m;
  Conn& conn = file(std::move(c));
  push(conn, UFAB_CM_EVENT_CONNECT_REQUEST, 0, rdma_cm_req_user_data(m.private_data));
}

void Manager::on_sidr_rep(const SidrRep& m) {
  Conn* c = find(m.request_id);
  if (c == nullptr || !c->ud || !c->active || c->state != State::kReqSent) {
    ++dropped_;
    return;
  }
  if (m.status == static_cast<uint8_t>(SidrStatus::kSuccess)) {
    c->rep.local_qpn = m.qpn;  // the answer, for the event
    c->rep.local_qkey = m.qkey;
    push(*c, UFAB_CM_EVENT_ESTABLISHED, 0, m.private_data);
  } else {
    push(*c, UFAB_CM_EVENT_REJECTED, -ECONNREFUSED, m.private_data, m.status);
  }
  forget(*c);
}

void Manager::answer_sidr(Conn& c, SidrStatus status, uint32_t qpn, uint32_t qkey,
                          std::span<const uint8_t> private_data) {
  c.answer = send_message(c.peer_ip, c.tid,
                          SidrRep{.request_id = c.remote_id, .status = static_cast<uint8_t>(status), .vendor_id = 0,
                                  .qpn = qpn, .service_id = c.sidr.service_id, .qkey = qkey,
                                  .additional_info = {},
                                  .private_data = PrivateData(private_data.begin(), private_data.end())});
  enter_timewait(c);
}

Status Manager::accept_ud(Conn& c, ufab_cm_id* id, ufab_qp* qp, const ufab_cm_conn_param& param) {
  if (ufab_qp_type(qp) != UFAB_QPT_UD) return fail(EINVAL, "accepting a UD request: a UD QP is required");
  if (param.private_data_len > UFAB_CM_SIDR_REP_PRIVATE_DATA) {
    return fail(EMSGSIZE, "accepting: " + std::to_string(param.private_data_len) + " bytes of private data; a " +
                              "SIDR_REP carries at most " + std::to_string(UFAB_CM_SIDR_REP_PRIVATE_DATA));
  }
  ufab_qp_attr now{};
  if (int rc = ufab_qp_query(qp, &now); rc < 0) return fail(-rc, std::string("accepting: ") + ufab_last_error());
  if (now.state == UFAB_QPS_RESET || now.state == UFAB_QPS_INIT) {
    ufab_qp_attr a;
    ufab_qp_attr_defaults(&a);
    a.qkey = UFAB_CM_UDP_QKEY;
    ufab_conn none{};
    if (int rc = ufab_qp_connect(qp, &none, &a); rc < 0) {
      return fail(-rc, std::string("accepting: bringing the UD QP to RTS: ") + ufab_last_error());
    }
    now.qkey = UFAB_CM_UDP_QKEY;
  } else if (now.state != UFAB_QPS_RTS) {
    return fail(EINVAL, std::string("accepting: the UD QP is in state ") + ufab_qp_state_str(now.state));
  }
  id->qp = qp;
  const auto* p = static_cast<const uint8_t*>(param.private_data);
  answer_sidr(c, SidrStatus::kSuccess, ufab_qp_num(qp), now.qkey,
              std::span<const uint8_t>(p, param.private_data_len));
  return {};
}

// ------------------------------------------------------------ connections

Manager::Conn& Manager::file(std::unique_ptr<Conn> c) {
  auto handle = std::make_unique<ufab_cm_id>();
  handle->manager = this;
  handle->local_id = c->local_id;
  handle->qp = c->qp;
  c->handle = handle.get();
  handles_.push_back(std::move(handle));
  if (!c->active) by_remote_[{c->peer_ip, c->remote_id}] = c->local_id;
  Conn& conn = *c;
  conns_[c->local_id] = std::move(c);
  return conn;
}

size_t Manager::pending_requests() const {
  return static_cast<size_t>(std::count_if(conns_.begin(), conns_.end(), [](const auto& e) {
    return !e.second->active && (e.second->state == State::kReqReceived || e.second->state == State::kMraSent);
  }));
}

Manager::Conn* Manager::find(uint32_t local_id) {
  auto it = conns_.find(local_id);
  return it == conns_.end() ? nullptr : it->second.get();
}

Manager::Conn* Manager::find_rc(uint32_t local_id) {
  Conn* c = find(local_id);
  return c != nullptr && !c->ud ? c : nullptr;
}

Manager::Conn* Manager::find_handle(ufab_cm_id* id) {
  if (id == nullptr || id->manager != this) return nullptr;
  Conn* c = find(id->local_id);
  return c != nullptr && c->handle == id ? c : nullptr;
}

uint32_t Manager::new_local_id() {
  for (;;) {
    auto id = static_cast<uint32_t>(random64());
    if (id != 0 && !conns_.contains(id)) return id;
  }
}

void Manager::arm(Conn& c, Clock::duration interval, uint8_t retries) {
  c.interval = interval;
  c.retries_left = retries;
  c.deadline = Clock::now() + interval;
}

std::optional<Clock::time_point> Manager::next_deadline() const {
  std::optional<Clock::time_point> next;
  for (auto& [id, c] : conns_) {
    if (c->deadline && (!next || *c->deadline < *next)) next = c->deadline;
  }
  return next;
}

void Manager::run_timers(Clock::time_point now) {
  std::vector<Conn*> due;
  for (auto& [id, c] : conns_) {
    if (c->deadline && *c->deadline <= now) due.push_back(c.get());
  }
  for (Conn* c : due) {
    if (c->state == State::kTimewait) {
      forget(*c);
      continue;
    }
    if (c->retries_left > 0 && c->resend) {
      --c->retries_left;
      send(c->peer_ip, *c->resend);
      c->deadline = now + c->interval;
      continue;
    }
    // Out of retries.
    switch (c->state) {
      case State::kReqSent:
      case State::kMraReceived:
        if (!c->ud) reject_timeout(*c);
        push(*c, UFAB_CM_EVENT_UNREACHABLE, -ETIMEDOUT);
        forget(*c);
        break;
      case State::kRepSent:
        qp_to_error(*c);
        push(*c, UFAB_CM_EVENT_CONNECT_ERROR, -ETIMEDOUT);
        forget(*c);
        break;
      case State::kDreqSent:
        push(*c, UFAB_CM_EVENT_DISCONNECTED, -ETIMEDOUT);
        enter_timewait(*c);
        break;
      default:
        c->deadline.reset();
        break;
    }
  }
}

void Manager::enter_timewait(Conn& c) {
  c.state = State::kTimewait;
  c.resend.reset();
  c.retries_left = 0;
  // Long enough for the peer's last retransmissions to arrive and be answered.
  c.deadline = Clock::now() + iba_time(response_timeout_) + 2 * iba_time(kPacketLifetime);
}

void Manager::forget(Conn& c) {
  // Only its own filing: an active connection is not filed there, and
  // another connection (or SIDR) from that peer may carry the same id.
  if (auto it = by_remote_.find({c.peer_ip, c.remote_id}); it != by_remote_.end() && it->second == c.local_id) {
    by_remote_.erase(it);
  }
  conns_.erase(c.local_id);
}

void Manager::send_dreq(Conn& c) {
  qp_to_error(c);
  c.state = State::kDreqSent;
  // A transaction of its own (the REQ's id with the top bit flipped).
  c.resend = send_message(c.peer_ip, tid_high_ | (c.local_id ^ 0x80000000u),
                          Dreq{.local_comm_id = c.local_id, .remote_comm_id = c.remote_id,
                               .remote_qpn_eecn = c.active ? c.rep.local_qpn : c.req.local_qpn, .private_data = {}});
  arm(c, iba_time(response_timeout_) + 2 * iba_time(kPacketLifetime), max_retries_);
}

void Manager::qp_to_error(Conn& c) {
  if (c.qp == nullptr) return;
  ufab_qp_attr a{};
  a.state = UFAB_QPS_ERR;
  (void)ufab_qp_modify(c.qp, &a, UFAB_QP_STATE);
}

// PSNs as rdma_cm and ib_cm use them (seen on the wire against the
// kernel): the Starting PSN a REQ or REP carries is the PSN its sender
// expects to receive first; the other side sends from it. So our RQ PSN is
// the PSN we advertised (the QP's initial PSN) and our SQ PSN the peer's.
Status Manager::connect_qp(Conn& c, ufab_qp* qp, uint32_t remote_qpn, uint32_t remote_psn,
                           uint8_t responder_resources, uint8_t initiator_depth, uint8_t retry, uint8_t rnr_retry) {
  auto failed = [&](int rc, const char* step) {
    return fail(-rc, std::string("connecting QP ") + std::to_string(ufab_qp_num(qp)) + " (" + step +
                         "): " + ufab_last_error());
  };
  ufab_qp_attr now{};
  if (int rc = ufab_qp_query(qp, &now); rc < 0) return failed(rc, "query");
  // From INIT the receives already posted stay.
  if (now.state != UFAB_QPS_RESET && now.state != UFAB_QPS_INIT) {
    return fail(EINVAL, std::string("QP ") + std::to_string(ufab_qp_num(qp)) + " is in state " +
                            ufab_qp_state_str(now.state) + ": the connection manager takes a QP in RESET or INIT");
  }
  ufab_conn local{};
  if (int rc = ufab_qp_local(qp, &local); rc < 0) return failed(rc, "its initial PSN");
  ufab_qp_attr a;
  ufab_qp_attr_defaults(&a);
  // A QP the application brought to INIT keeps its access flags (FLUSH
  // rights, say); from RESET it gets remote WRITE, READ and atomics.
  a.state = UFAB_QPS_INIT;
  if (now.state == UFAB_QPS_RESET) {
    if (int rc = ufab_qp_modify(qp, &a, UFAB_QP_STATE | UFAB_QP_PKEY_INDEX | UFAB_QP_PORT | UFAB_QP_ACCESS_FLAGS);
        rc < 0) {
      return failed(rc, "INIT");
    }
  }
  a.state = UFAB_QPS_RTR;
  a.av.dest_ip = c.peer_ip;
  a.path_mtu = std::min(mtu_, mtu_bytes(c.req.path_mtu));
  a.dest_qpn = remote_qpn;
  a.rq_psn = local.psn;
  a.max_dest_rd_atomic = std::max<uint8_t>(responder_resources, 1);
  if (int rc = ufab_qp_modify(qp, &a,
                              UFAB_QP_STATE | UFAB_QP_AV | UFAB_QP_PATH_MTU | UFAB_QP_DEST_QPN | UFAB_QP_RQ_PSN |
                                  UFAB_QP_MAX_DEST_RD_ATOMIC | UFAB_QP_MIN_RNR_TIMER);
      rc < 0) {
    return failed(rc, "RTR");
  }
  a.state = UFAB_QPS_RTS;
  a.sq_psn = remote_psn;
  a.max_rd_atomic = std::max<uint8_t>(initiator_depth, 1);
  a.retry_cnt = retry;
  a.rnr_retry = rnr_retry;
  if (int rc = ufab_qp_modify(qp, &a,
                              UFAB_QP_STATE | UFAB_QP_SQ_PSN | UFAB_QP_TIMEOUT | UFAB_QP_RETRY_CNT |
                                  UFAB_QP_RNR_RETRY | UFAB_QP_MAX_QP_RD_ATOMIC);
      rc < 0) {
    return failed(rc, "RTS");
  }
  c.qp = qp;
  return {};
}

// ------------------------------------------------------------------ events

void Manager::push(Conn& c, uint32_t type, int status, std::span<const uint8_t> private_data, uint16_t reason) {
  if (c.handle == nullptr) return;  // the application let go of it
  ufab_cm_event ev{};
  ev.type = type;
  ev.status = status;
  ev.id = c.handle;
  ev.listener = type == UFAB_CM_EVENT_CONNECT_REQUEST ? c.listener : nullptr;
  ev.peer_ip = c.peer_ip;
  ev.peer_port = c.peer_port;
  ev.local_port = c.local_port;
  ev.reject_reason = reason;
  ev.qp_type = c.ud ? UFAB_QPT_UD : UFAB_QPT_RC;
  size_t n = std::min(private_data.size(), sizeof ev.private_data);
  std::memcpy(ev.private_data, private_data.data(), n);
  ev.private_data_len = static_cast<uint8_t>(n);
  ev.param.private_data_len = ev.private_data_len;
  if (type == UFAB_CM_EVENT_CONNECT_REQUEST) {
    ev.param.responder_resources = c.req.responder_resources;
    ev.param.initiator_depth = c.req.initiator_depth;
    ev.param.retry_count = c.req.retry_count;
    ev.param.rnr_retry_count = c.req.rnr_retry_count;
    ev.peer_qpn = c.req.local_qpn;
  } else if (type == UFAB_CM_EVENT_ESTABLISHED && c.ud) {
    ev.peer_qpn = c.rep.local_qpn;
    ev.qkey = c.rep.local_qkey;
  } else if (type == UFAB_CM_EVENT_ESTABLISHED && c.qp != nullptr) {
    ufab_qp_attr a{};
    (void)ufab_qp_query(c.qp, &a);
    ev.param.responder_resources = a.max_dest_rd_atomic;
    ev.param.initiator_depth = a.max_rd_atomic;
    ev.param.retry_count = a.retry_cnt;
    ev.param.rnr_retry_count = a.rnr_retry;
    ev.peer_qpn = a.dest_qpn;
  }
  push(ev);
}

void Manager::push(ufab_cm_event event) {
  events_.push_back(event);
  uint64_t one = 1;
  (void)!::write(event_fd_.get(), &one, sizeof one);
  events_cv_.notify_all();
}

void Manager::drop_events(const std::function<bool(const ufab_cm_event&)>& which) {
  std::erase_if(events_, which);
  // The fd is readable while events wait, and only then.
  if (events_.empty()) {
    uint64_t v;
    (void)!::read(event_fd_.get(), &v, sizeof v);
  }
}

Status Manager::get_event(ufab_cm_event& out, int timeout_ms) {
  std::unique_lock lock(mu_);
  auto ready = [&] { return !events_.empty(); };
  if (timeout_ms < 0) {
    events_cv_.wait(lock, ready);
  } else if (!events_cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), ready)) {
    return fail(ETIMEDOUT, "no connection event within " + std::to_string(timeout_ms) + " ms");
  }
  out = events_.front();
  events_.pop_front();
  out.param.private_data = out.private_data_len != 0 ? out.private_data : nullptr;
  if (events_.empty()) {
    uint64_t v;
    (void)!::read(event_fd_.get(), &v, sizeof v);
  }
  return {};
}

// --------------------------------------------------------------------- API

Result<ufab_cm_listener*> Manager::listen(uint16_t port_space, uint16_t port) {
  if (port == 0) return fail(EINVAL, "listening: port 0 (rdma_cm would pick one; name the port)");
  std::lock_guard lock(mu_);
  if (listeners_.contains({port_space, port})) {
    return fail(EADDRINUSE, "listening on " + ip_str(ip_) + (port_space == kRdmaPsUdp ? " UDP" : "") + " port " +
                                std::to_string(port) + ": already listening there");
  }
  auto l = std::make_unique<ufab_cm_listener>();
  l->manager = this;
  l->port_space = port_space;
  l->port = port;
  ufab_cm_listener* raw = l.get();
  listeners_[{port_space, port}] = raw;
  listener_handles_.push_back(std::move(l));
  return raw;
}

void Manager::close_listener(ufab_cm_listener* listener) {
  std::lock_guard lock(mu_);
  listeners_.erase({listener->port_space, listener->port});
  // Requests the application has not answered are rejected.
  std::vector<Conn*> pending;
  for (auto& [id, c] : conns_) {
    if (c->listener == listener && (c->state == State::kReqReceived || c->state == State::kMraSent)) {
      pending.push_back(c.get());
    }
  }
  for (Conn* c : pending) {
    if (c->ud) {
      answer_sidr(*c, SidrStatus::kUnsupported, 0, 0, {});
      c->handle = nullptr;
      continue;
    }
    send_rej(c->peer_ip, c->tid, c->local_id, c->remote_id, MessageCode::kReq, RejectReason::kInvalidServiceId);
    forget(*c);
  }
  for (auto& [id, c] : conns_) {
    if (c->listener == listener) c->listener = nullptr;
  }
  // CONNECT_REQUESTs not yet taken: their ids were never the
  // application's, so they go with every event of theirs (a CONNECT_ERROR
  // behind one, when the peer gave up first).
  std::vector<ufab_cm_id*> unseen;
  for (const auto& e : events_) {
    if (e.listener == listener) unseen.push_back(e.id);
  }
  auto is_unseen = [&](ufab_cm_id* id) { return std::find(unseen.begin(), unseen.end(), id) != unseen.end(); };
  drop_events([&](const ufab_cm_event& e) { return e.listener == listener || is_unseen(e.id); });
  for (auto& [id, c] : conns_) {
    if (is_unseen(c->handle)) c->handle = nullptr;
  }
  std::erase_if(handles_, [&](const auto& h) { return is_unseen(h.get()); });
  std::erase_if(listener_handles_, [&](const auto& l) { return l.get() == listener; });
}

Result<ufab_cm_id*> Manager::connect(ufab_qp* qp, uint32_t dest_ip, uint16_t port, const ufab_cm_conn_param& param) {
  if (qp == nullptr || ufab_qp_type(qp) != UFAB_QPT_RC) return fail(EINVAL, "connecting: an RC QP is required");
  if (ufab_qp_device(qp) != dev_) return fail(EINVAL, "connecting: the QP belongs to another device than the CM");
  if (port == 0) return fail(EINVAL, "connecting: port 0");
  if (param.private_data_len > UFAB_CM_REQ_PRIVATE_DATA) {
    return fail(EMSGSIZE, "connecting: " + std::to_string(param.private_data_len) + " bytes of private data; a REQ " +
                              "carries at most " + std::to_string(UFAB_CM_REQ_PRIVATE_DATA) + " after rdma_cm's header");
  }
  if (param.retry_count > 7 || param.rnr_retry_count > 7) return fail(EINVAL, "connecting: retry counts are 0..7");
  net::Ipv4Address dest{dest_ip};
  if (!dest.is_unicast() || dest_ip == ip_) {
    return fail(EINVAL, "connecting to " + dest.str() + ": not a unicast IPv4 address of a peer");
  }
  ufab_conn local{};
  if (int rc = ufab_qp_local(qp, &local); rc < 0) return fail(-rc, std::string("connecting: ") + ufab_last_error());
  ufab_qp_attr now{};
  if (int rc = ufab_qp_query(qp, &now); rc < 0) return fail(-rc, std::string("connecting: ") + ufab_last_error());
  if (now.state != UFAB_QPS_RESET && now.state != UFAB_QPS_INIT) {
    return fail(EINVAL, std::string("connecting: QP ") + std::to_string(local.qpn) + " is in state " +
                            ufab_qp_state_str(now.state) + "; it must be in RESET or INIT");
  }

  std::lock_guard lock(mu_);
  auto c = std::make_unique<Conn>();
  c->active = true;
  c->state = State::kReqSent;
  c->local_id = new_local_id();
  c->tid = tid_high_ | c->local_id;
  c->peer_ip = dest_ip;
  c->peer_port = port;
  c->local_port = static_cast<uint16_t>(32768 + random64() % 28232);  // an ephemeral port, as rdma_cm binds one
  c->qp = qp;
  CmaHeader cma{.ip_version = 4, .port = c->local_port, .src_addr = cma_ipv4(ip_), .dst_addr = cma_ipv4(dest_ip)};
  auto pd = build_rdma_cm_req_private_data(
      cma, std::span<const uint8_t>(static_cast<const uint8_t*>(param.private_data), param.private_data_len));
  if (!pd) return std::unexpected(pd.error().context("connecting"));
  Req& r = c->req;
  r.local_comm_id = c->local_id;
  r.service_id = rdma_cm_service_id(kRdmaPsTcp, port);
  r.local_ca_guid = 0x0200000000000000ull | ip_;  // no node GUID on Ethernet: a locally administered id from our IP
  r.local_qpn = local.qpn;
  r.responder_resources = or_default(param.responder_resources, kMaxRdAtomic);
  r.initiator_depth = or_default(param.initiator_depth, kMaxRdAtomic);
  r.remote_cm_response_timeout = response_timeout_;
  r.transport_service_type = TransportType::kRc;
  r.starting_psn = local.psn;
  r.local_cm_response_timeout = response_timeout_;
  r.retry_count = or_default(param.retry_count, 7);
  r.partition_key = 0xFFFF;
  r.path_mtu = mtu_code(mtu_);
  r.rnr_retry_count = or_default(param.rnr_retry_count, 7);
  r.max_cm_retries = max_retries_;
  // The path as the kernel's rdma_cm writes it for RoCEv2 over IPv4.
  r.primary = Path{.local_lid = 0xFFFF, .remote_lid = 0xFFFF, .local_gid = ipv4_gid(ip_),
                   .remote_gid = ipv4_gid(dest_ip), .flow_label = 0, .packet_rate = 3, .traffic_class = 0,
                   .hop_limit = 64, .sl = 0, .subnet_local = false, .local_ack_timeout = kLocalAckTimeout};
  r.private_data = std::move(*pd);
  c->resend = send_message(dest_ip, c->tid, r);
  if (!c->resend) return fail(EINVAL, "connecting: the REQ could not be built");
  arm(*c, iba_time(response_timeout_) + 2 * iba_time(kPacketLifetime), max_retries_);
  return file(std::move(c)).handle;
}

Result<ufab_cm_id*> Manager::resolve_ud(uint32_t dest_ip, uint16_t port, const ufab_cm_conn_param& param) {
  if (port == 0) return fail(EINVAL, "resolving a UD service: port 0");
  if (param.private_data_len > UFAB_CM_SIDR_REQ_PRIVATE_DATA) {
    return fail(EMSGSIZE, "resolving a UD service: " + std::to_string(param.private_data_len) +
                              " bytes of private data; a SIDR_REQ carries at most " +
                              std::to_string(UFAB_CM_SIDR_REQ_PRIVATE_DATA) + " after rdma_cm's header");
  }
  net::Ipv4Address dest{dest_ip};
  if (!dest.is_unicast() || dest_ip == ip_) {
    return fail(EINVAL, "resolving a UD service on " + dest.str() + ": not a unicast IPv4 address of a peer");
  }
  std::lock_guard lock(mu_);
  auto c = std::make_unique<Conn>();
  c->active = true;
  c->ud = true;
  c->state = State::kReqSent;
  c->local_id = new_local_id();
  c->tid = tid_high_ | c->local_id;
  c->peer_ip = dest_ip;
  c->peer_port = port;
  c->local_port = static_cast<uint16_t>(32768 + random64() % 28232);
  CmaHeader cma{.ip_version = 4, .port = c->local_port, .src_addr = cma_ipv4(ip_), .dst_addr = cma_ipv4(dest_ip)};
  auto hdr = build_cma_header(cma);
  if (!hdr) return std::unexpected(hdr.error().context("resolving a UD service"));
  c->sidr.request_id = c->local_id;
  c->sidr.partition_key = 0xFFFF;
  c->sidr.service_id = rdma_cm_service_id(kRdmaPsUdp, port);
  c->sidr.private_data.assign(hdr->begin(), hdr->end());
  const auto* p = static_cast<const uint8_t*>(param.private_data);
  c->sidr.private_data.insert(c->sidr.private_data.end(), p, p + param.private_data_len);
  c->resend = send_message(dest_ip, c->tid, c->sidr);
  if (!c->resend) return fail(EINVAL, "resolving a UD service: the SIDR_REQ could not be built");
  arm(*c, iba_time(response_timeout_) + 2 * iba_time(kPacketLifetime), max_retries_);
  return file(std::move(c)).handle;
}

Status Manager::accept(ufab_cm_id* id, ufab_qp* qp, const ufab_cm_conn_param& param) {
  if (qp == nullptr) return fail(EINVAL, "accepting: a QP is required");
  if (ufab_qp_device(qp) != dev_) return fail(EINVAL, "accepting: the QP belongs to another device than the CM");
  {
    std::lock_guard lock(mu_);
    Conn* c = find_handle(id);
    if (c != nullptr && c->ud) {
      if (c->state != State::kReqReceived) return fail(EINVAL, "accepting: the UD request was answered already");
      return accept_ud(*c, id, qp, param);
    }
  }
  if (ufab_qp_type(qp) != UFAB_QPT_RC) return fail(EINVAL, "accepting: an RC QP is required");
  if (param.private_data_len > UFAB_CM_REP_PRIVATE_DATA) {
    return fail(EMSGSIZE, "accepting: " + std::to_string(param.private_data_len) + " bytes of private data; a REP " +
                              "carries at most " + std::to_string(UFAB_CM_REP_PRIVATE_DATA));
  }
  if (param.retry_count > 7 || param.rnr_retry_count > 7) return fail(EINVAL, "accepting: retry counts are 0..7");
  std::lock_guard lock(mu_);
  Conn* c = find_handle(id);
  if (c == nullptr) return fail(ENOTCONN, "accepting: the request is gone (the listener closed or the peer gave up)");
  if (c->active || (c->state != State::kReqReceived && c->state != State::kMraSent)) {
    return fail(EINVAL, std::string("accepting: the connection is ") + state_name(c->state) +
                            ", not a request waiting for an answer");
  }
  uint8_t resources = std::min(or_default(param.responder_resources, kMaxRdAtomic), c->req.initiator_depth);
  uint8_t depth = std::min(or_default(param.initiator_depth, kMaxRdAtomic), c->req.responder_resources);
  auto connected = connect_qp(*c, qp, c->req.local_qpn, c->req.starting_psn, resources, depth, c->req.retry_count,
                              c->req.rnr_retry_count);
  if (!connected) return std::unexpected(connected.error().context("accepting"));
  id->qp = qp;
  ufab_conn local{};
  (void)ufab_qp_local(qp, &local);
  Rep& rep = c->rep;
  rep.local_comm_id = c->local_id;
  rep.remote_comm_id = c->remote_id;
  rep.local_qpn = local.qpn;
  rep.starting_psn = local.psn;
  rep.responder_resources = resources;
  rep.initiator_depth = depth;
  rep.target_ack_delay = kTargetAckDelay;
  rep.rnr_retry_count = or_default(param.rnr_retry_count, 7);
  rep.local_ca_guid = 0x0200000000000000ull | ip_;
  const auto* p = static_cast<const uint8_t*>(param.private_data);
  rep.private_data.assign(p, p + param.private_data_len);
  c->resend = send_message(c->peer_ip, c->tid, rep);
  c->state = State::kRepSent;
  // The peer said how long it takes to answer (its local CM response timeout).
  arm(*c, iba_time(c->req.local_cm_response_timeout) + 2 * iba_time(kPacketLifetime),
      std::min<uint8_t>(c->req.max_cm_retries, 15));
  return {};
}

Status Manager::reject(ufab_cm_id* id, std::span<const uint8_t> private_data) {
  if (private_data.size() > UFAB_CM_REJ_PRIVATE_DATA) {
    return fail(EMSGSIZE, "rejecting: " + std::to_string(private_data.size()) + " bytes of private data; a REJ " +
                              "carries at most " + std::to_string(UFAB_CM_REJ_PRIVATE_DATA));
  }
  std::lock_guard lock(mu_);
  Conn* c = find_handle(id);
  if (c == nullptr) return fail(ENOTCONN, "rejecting: the request is gone (the listener closed or the peer gave up)");
  if (c->active || (c->state != State::kReqReceived && c->state != State::kMraSent)) {
    return fail(EINVAL, std::string("rejecting: the connection is ") + state_name(c->state) +
                            ", not a request waiting for an answer");
  }
  if (c->ud) {
    if (private_data.size() > UFAB_CM_SIDR_REP_PRIVATE_DATA) {
      return fail(EMSGSIZE, "rejecting: a SIDR_REP carries at most " + std::to_string(UFAB_CM_SIDR_REP_PRIVATE_DATA) +
                                " bytes of private data");
    }
    answer_sidr(*c, SidrStatus::kReject, 0, 0, private_data);
    return {};
  }
  c->answer = send_rej(c->peer_ip, c->tid, c->local_id, c->remote_id, MessageCode::kReq,
                       RejectReason::kConsumerDefined, private_data);
  c->rejected = true;
  // Kept a while: a REQ sent again before our REJ arrived gets it again.
  enter_timewait(*c);
  return {};
}

Status Manager::disconnect(ufab_cm_id* id) {
  std::lock_guard lock(mu_);
  Conn* c = find_handle(id);
  if (c == nullptr) return fail(ENOTCONN, "disconnecting: not connected");
  if (c->state != State::kEstablished && c->state != State::kRepSent) {
    return fail(EINVAL, std::string("disconnecting: the connection is ") + state_name(c->state));
  }
  send_dreq(*c);
  return {};
}

void Manager::destroy(ufab_cm_id* id) {
  std::lock_guard lock(mu_);
  if (Conn* c = find_handle(id)) {
    switch (c->state) {
      case State::kEstablished:
      case State::kRepSent:
        send_dreq(*c);
        break;
      case State::kReqReceived:
      case State::kMraSent:
        if (c->ud) {
          answer_sidr(*c, SidrStatus::kReject, 0, 0, {});
        } else {
          c->answer = send_rej(c->peer_ip, c->tid, c->local_id, c->remote_id, MessageCode::kReq,
                               RejectReason::kConsumerDefined);
          c->rejected = true;
          enter_timewait(*c);
        }
        break;
      case State::kReqSent:
      case State::kMraReceived:
        if (!c->ud) reject_timeout(*c);
        forget(*c);
        c = nullptr;
        break;
      default:
        break;
    }
    if (c != nullptr) {
      // The QP is the application's again (it may destroy it now): what
      // comes later (the peer's DREQ or DREP) touches neither.
      c->handle = nullptr;
      c->qp = nullptr;
    }
  }
  drop_events([&](const ufab_cm_event& e) { return e.id == id; });
  std::erase_if(handles_, [&](const auto& h) { return h.get() == id; });
}

}  // namespace ufab::cm
