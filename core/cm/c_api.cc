// ufab/cm.h over the Manager: argument checks, errors to ufab_last_error().
#include <cerrno>
#include <string>

#include "core/cm/manager.h"
#include "core/cm/mad.h"
#include "core/cm/rdma_cm.h"
#include "core/provider/providers.h"

using ufab::cm::Manager;
using ufab::provider::invalid;
using ufab::provider::last_error;
using ufab::provider::report;

namespace {

ufab_cm_conn_param param_or_default(const ufab_cm_conn_param* p) { return p != nullptr ? *p : ufab_cm_conn_param{}; }

// NULL private data with a length would be read from address 0.
bool param_ok(const ufab_cm_conn_param* p, const char* who) {
  if (p == nullptr || p->private_data != nullptr || p->private_data_len == 0) return true;
  last_error() = std::string(who) + ": param->private_data is NULL but private_data_len is " +
                 std::to_string(p->private_data_len);
  return false;
}

}  // namespace

extern "C" {

int ufab_cm_open(ufab_device* dev, const ufab_cm_opts* opts, ufab_cm** out) {
  if (dev == nullptr || out == nullptr) return invalid("ufab_cm_open: dev and out are required");
  ufab_cm_opts o{.size = sizeof o, .response_timeout = 0, .max_retries = 0, .reserved = 0};
  if (opts != nullptr) {
    if (opts->size < sizeof(uint32_t) + 2) return invalid("ufab_cm_open: opts->size must be sizeof(struct ufab_cm_opts)");
    o = *opts;
  }
  auto m = Manager::open(dev, o);
  if (!m) return report(m.error());
  *out = new ufab_cm{std::move(*m)};
  return 0;
}

void ufab_cm_close(ufab_cm* cm) { delete cm; }

int ufab_cm_event_fd(ufab_cm* cm) { return cm != nullptr ? cm->manager->event_fd() : invalid("ufab_cm_event_fd: cm is NULL"); }

int ufab_cm_get_event(ufab_cm* cm, ufab_cm_event* out, int timeout_ms) {
  if (cm == nullptr || out == nullptr) return invalid("ufab_cm_get_event: cm and out are required");
  if (auto s = cm->manager->get_event(*out, timeout_ms); !s) return report(s.error());
  return 0;
}

int ufab_cm_listen(ufab_cm* cm, uint16_t port, ufab_cm_listener** out) {
  if (cm == nullptr || out == nullptr) return invalid("ufab_cm_listen: cm and out are required");
  auto l = cm->manager->listen(ufab::cm::kRdmaPsTcp, port);
  if (!l) return report(l.error());
  *out = *l;
  return 0;
}

int ufab_cm_listen_ud(ufab_cm* cm, uint16_t port, ufab_cm_listener** out) {
  if (cm == nullptr || out == nullptr) return invalid("ufab_cm_listen_ud: cm and out are required");
  auto l = cm->manager->listen(ufab::cm::kRdmaPsUdp, port);
  if (!l) return report(l.error());
  *out = *l;
  return 0;
}

int ufab_cm_resolve_ud(ufab_cm* cm, uint32_t dest_ip, uint16_t port, const ufab_cm_conn_param* param,
                       ufab_cm_id** out) {
  if (cm == nullptr || out == nullptr) return invalid("ufab_cm_resolve_ud: cm and out are required");
  if (!param_ok(param, "ufab_cm_resolve_ud")) return -EINVAL;
  auto id = cm->manager->resolve_ud(dest_ip, port, param_or_default(param));
  if (!id) return report(id.error());
  *out = *id;
  return 0;
}

int ufab_cm_listener_close(ufab_cm_listener* listener) {
  if (listener != nullptr) listener->manager->close_listener(listener);
  return 0;
}

int ufab_cm_connect(ufab_cm* cm, ufab_qp* qp, uint32_t dest_ip, uint16_t port, const ufab_cm_conn_param* param,
                    ufab_cm_id** out) {
  if (cm == nullptr || out == nullptr) return invalid("ufab_cm_connect: cm and out are required");
  if (!param_ok(param, "ufab_cm_connect")) return -EINVAL;
  auto id = cm->manager->connect(qp, dest_ip, port, param_or_default(param));
  if (!id) return report(id.error());
  *out = *id;
  return 0;
}

int ufab_cm_accept(ufab_cm_id* id, ufab_qp* qp, const ufab_cm_conn_param* param) {
  if (id == nullptr) return invalid("ufab_cm_accept: id is NULL");
  if (!param_ok(param, "ufab_cm_accept")) return -EINVAL;
  if (auto s = id->manager->accept(id, qp, param_or_default(param)); !s) return report(s.error());
  return 0;
}

int ufab_cm_reject(ufab_cm_id* id, const void* private_data, uint8_t private_data_len) {
  if (id == nullptr) return invalid("ufab_cm_reject: id is NULL");
  if (private_data == nullptr && private_data_len != 0) return invalid("ufab_cm_reject: private_data is NULL");
  auto* p = static_cast<const uint8_t*>(private_data);
  if (auto s = id->manager->reject(id, std::span<const uint8_t>(p, private_data_len)); !s) return report(s.error());
  return 0;
}

int ufab_cm_disconnect(ufab_cm_id* id) {
  if (id == nullptr) return invalid("ufab_cm_disconnect: id is NULL");
  if (auto s = id->manager->disconnect(id); !s) return report(s.error());
  return 0;
}

int ufab_cm_id_destroy(ufab_cm_id* id) {
  if (id != nullptr) id->manager->destroy(id);
  return 0;
}

ufab_qp* ufab_cm_id_qp(const ufab_cm_id* id) { return id != nullptr ? id->qp : nullptr; }
void ufab_cm_id_set_context(ufab_cm_id* id, void* context) {
  if (id != nullptr) id->context = context;
}
void* ufab_cm_id_context(const ufab_cm_id* id) { return id != nullptr ? id->context : nullptr; }

const char* ufab_cm_event_str(uint32_t type) {
  switch (type) {
    case UFAB_CM_EVENT_CONNECT_REQUEST: return "connect request";
    case UFAB_CM_EVENT_ESTABLISHED: return "established";
    case UFAB_CM_EVENT_REJECTED: return "rejected";
    case UFAB_CM_EVENT_UNREACHABLE: return "unreachable";
    case UFAB_CM_EVENT_CONNECT_ERROR: return "connect error";
    case UFAB_CM_EVENT_DISCONNECTED: return "disconnected";
    default: return "unknown event";
  }
}

const char* ufab_cm_reject_reason_str(uint16_t reason) {
  // Stable strings for every reason (reject_reason_name builds a std::string).
  static thread_local std::string name;
  name = ufab::cm::reject_reason_name(reason);
  return name.c_str();
}

}  // extern "C"
