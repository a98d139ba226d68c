// The connection manager in C++ (header-only over <ufab/cm.h>): RAII
// owners for the manager, listeners and connection ids, events as values,
// errors as ufab::Result. docs/cm.md describes the protocol and the C API.
//
//   auto cm = ufab::cm::ConnectionManager::open(*dev);
//   auto listener = (*cm)->listen(7174);
//   auto ev = (*cm)->next_event(std::chrono::seconds(5));
//   if (ev && ev->type == ufab::cm::EventType::kConnectRequest) {
//     ufab::cm::Id id = ev->take_id();          // the application's now
//     id.accept(*qp, {});
//   }
//
// Listeners and ids go before their ConnectionManager (closing it destroys
// what is left of them on the C side).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ufab/cm.h"
#include "ufab/rdma.hpp"

namespace ufab::cm {

enum class EventType : uint32_t {
  kConnectRequest = UFAB_CM_EVENT_CONNECT_REQUEST,
  kEstablished = UFAB_CM_EVENT_ESTABLISHED,
  kRejected = UFAB_CM_EVENT_REJECTED,
  kUnreachable = UFAB_CM_EVENT_UNREACHABLE,
  kConnectError = UFAB_CM_EVENT_CONNECT_ERROR,
  kDisconnected = UFAB_CM_EVENT_DISCONNECTED,
};

struct ConnParam {
  std::span<const uint8_t> private_data{};
  uint8_t responder_resources = 0;  // 0: 16
  uint8_t initiator_depth = 0;      // 0: 16
  uint8_t retry_count = 0;          // 0: 7
  uint8_t rnr_retry_count = 0;      // 0: 7

  ufab_cm_conn_param to_c() const {
    ufab_cm_conn_param p{};
    p.private_data = private_data.data();
    p.private_data_len = static_cast<uint8_t>(private_data.size() > 255 ? 255 : private_data.size());
    p.responder_resources = responder_resources;
    p.initiator_depth = initiator_depth;
    p.retry_count = retry_count;
    p.rnr_retry_count = rnr_retry_count;
    return p;
  }
};

// One connection (or UD resolution). Destroying it disconnects a connected
// one (ufab_cm_id_destroy); the QP stays the caller's.
class Id {
 public:
  Id() = default;
  explicit Id(ufab_cm_id* id) : id_(id) {}
  Id(Id&& o) noexcept : id_(std::exchange(o.id_, nullptr)) {}
  Id& operator=(Id&& o) noexcept {
    if (this != &o) reset(std::exchange(o.id_, nullptr));
    return *this;
  }
  ~Id() { reset(); }

  Status accept(rdma::QueuePair& qp, const ConnParam& param = {}) {
    auto p = param.to_c();
    return rdma::detail::status(ufab_cm_accept(id_, qp.c(), &p));
  }
  Status reject(std::span<const uint8_t> private_data = {}) {
    // Over 255 bytes: 255, which the C call refuses (EMSGSIZE), rather than the length modulo 256.
    return rdma::detail::status(
        ufab_cm_reject(id_, private_data.data(), static_cast<uint8_t>(std::min<size_t>(private_data.size(), 255))));
  }
  Status disconnect() { return rdma::detail::status(ufab_cm_disconnect(id_)); }
  ufab_cm_id* c() const { return id_; }
  explicit operator bool() const { return id_ != nullptr; }

 private:
  void reset(ufab_cm_id* id = nullptr) {
    if (id_ != nullptr) (void)ufab_cm_id_destroy(id_);
    id_ = id;
  }
  ufab_cm_id* id_ = nullptr;
};

class Listener {
 public:
  explicit Listener(ufab_cm_listener* l) : l_(l) {}
  ufab_cm_listener* c() const { return l_.get(); }

 private:
  struct Close {
    void operator()(ufab_cm_listener* l) const { (void)ufab_cm_listener_close(l); }
  };
  std::unique_ptr<ufab_cm_listener, Close> l_;
};

struct Event {
  EventType type{};
  int status = 0;
  ufab_cm_id* id = nullptr;  // owned by whoever holds its Id
  ufab_cm_listener* listener = nullptr;
  uint32_t peer_ip = 0;
  uint16_t peer_port = 0, local_port = 0;
  uint16_t reject_reason = 0;
  uint32_t peer_qpn = 0, qkey = 0;
  uint32_t qp_type = UFAB_QPT_RC;
  uint8_t responder_resources = 0, initiator_depth = 0;
  std::vector<uint8_t> private_data;

  // A CONNECT_REQUEST's id, for the application to own.
  Id take_id() {
    Id owned(id);
    id = nullptr;
    return owned;
  }
  std::string reject_reason_name() const { return ufab_cm_reject_reason_str(reject_reason); }
};

class ConnectionManager {
 public:
  static Result<std::unique_ptr<ConnectionManager>> open(rdma::Device& dev, const ufab_cm_opts* opts = nullptr) {
    ufab_cm* cm = nullptr;
    if (int rc = ufab_cm_open(dev.c(), opts, &cm); rc < 0) return rdma::detail::last_error(rc);
    return std::unique_ptr<ConnectionManager>(new ConnectionManager(cm));
  }

  Result<Listener> listen(uint16_t port) {
    ufab_cm_listener* l = nullptr;
    if (int rc = ufab_cm_listen(cm_.get(), port, &l); rc < 0) return rdma::detail::last_error(rc);
    return Listener(l);
  }
  Result<Listener> listen_ud(uint16_t port) {
    ufab_cm_listener* l = nullptr;
    if (int rc = ufab_cm_listen_ud(cm_.get(), port, &l); rc < 0) return rdma::detail::last_error(rc);
    return Listener(l);
  }
  Result<Id> connect(rdma::QueuePair& qp, uint32_t dest_ip, uint16_t port, const ConnParam& param = {}) {
    auto p = param.to_c();
    ufab_cm_id* id = nullptr;
    if (int rc = ufab_cm_connect(cm_.get(), qp.c(), dest_ip, port, &p, &id); rc < 0) {
      return rdma::detail::last_error(rc);
    }
    return Id(id);
  }
  Result<Id> resolve_ud(uint32_t dest_ip, uint16_t port, const ConnParam& param = {}) {
    auto p = param.to_c();
    ufab_cm_id* id = nullptr;
    if (int rc = ufab_cm_resolve_ud(cm_.get(), dest_ip, port, &p, &id); rc < 0) return rdma::detail::last_error(rc);
    return Id(id);
  }
  // The next event within `timeout` (ETIMEDOUT when none came).
  Result<Event> next_event(std::chrono::milliseconds timeout) {
    ufab_cm_event e{};
    int ms = static_cast<int>(std::min<int64_t>(timeout.count(), INT32_MAX));
    if (int rc = ufab_cm_get_event(cm_.get(), &e, ms); rc < 0) return rdma::detail::last_error(rc);
    Event ev;
    ev.type = static_cast<EventType>(e.type);
    ev.status = e.status;
    ev.id = e.id;
    ev.listener = e.listener;
    ev.peer_ip = e.peer_ip;
    ev.peer_port = e.peer_port;
    ev.local_port = e.local_port;
    ev.reject_reason = e.reject_reason;
    ev.peer_qpn = e.peer_qpn;
    ev.qkey = e.qkey;
    ev.qp_type = e.qp_type;
    ev.responder_resources = e.param.responder_resources;
    ev.initiator_depth = e.param.initiator_depth;
    ev.private_data.assign(e.private_data, e.private_data + e.private_data_len);
    return ev;
  }
  int event_fd() const { return ufab_cm_event_fd(cm_.get()); }
  ufab_cm* c() const { return cm_.get(); }

 private:
  explicit ConnectionManager(ufab_cm* cm) : cm_(cm) {}
  struct Close {
    void operator()(ufab_cm* cm) const { ufab_cm_close(cm); }
  };
  std::unique_ptr<ufab_cm, Close> cm_;
};

}  // namespace ufab::cm
