#include "core/transport/qp_transition.h"

#include <cstdio>
#include <string>

#include "base/hex.h"
#include "core/net/addresses.h"

namespace ufab::verbs {
namespace {

// Which attributes each transition requires and allows (IBA 10.3.1 table
// 91, as libibverbs' ibv_modify_qp documents it), RC and UD. Moves to RESET
// and ERROR are allowed from every state and take the state alone.
struct Transition {
  QpState from, to;
  QpAttrMask rc_required, rc_optional, ud_required, ud_optional;
};

constexpr QpAttrMask kInitRc = kAttrPkeyIndex | kAttrPort | kAttrAccessFlags;
constexpr QpAttrMask kInitUd = kAttrPkeyIndex | kAttrPort | kAttrQkey;
constexpr QpAttrMask kRtrRc =
    kAttrAv | kAttrPathMtu | kAttrDestQpn | kAttrRqPsn | kAttrMaxDestRdAtomic | kAttrMinRnrTimer;
constexpr QpAttrMask kRtsRc = kAttrSqPsn | kAttrTimeout | kAttrRetryCnt | kAttrRnrRetry | kAttrMaxQpRdAtomic;

constexpr Transition kTransitions[] = {
    {QpState::kReset, QpState::kInit, kInitRc, 0, kInitUd, 0},
    {QpState::kInit, QpState::kInit, 0, kInitRc, 0, kInitUd},
    {QpState::kInit, QpState::kRtr, kRtrRc, kAttrPkeyIndex | kAttrAccessFlags, 0, kAttrPkeyIndex | kAttrQkey},
    {QpState::kRtr, QpState::kRts, kRtsRc, kAttrAccessFlags | kAttrMinRnrTimer, kAttrSqPsn, kAttrQkey},
    {QpState::kRts, QpState::kRts, 0, kAttrAccessFlags | kAttrMinRnrTimer, 0, kAttrQkey},
};

// QP numbers and PSNs are 24-bit fields of the BTH.
constexpr uint32_t k24Bits = 0xFFFFFF;

// Attributes the target state needs, and that it may take, per QP type.
Status check_mask(QpType type, QpState from, QpState to, QpAttrMask given, const std::string& where) {
  if (to == QpState::kReset || to == QpState::kError) {
    if (given) return fail(EINVAL, where + ": only the state may be given, not " + qp_attr_names(given));
    return {};
  }
  const Transition* t = nullptr;
  for (const auto& candidate : kTransitions) {
    if (candidate.from == from && candidate.to == to) t = &candidate;
  }
  if (t == nullptr) {
    return fail(EINVAL, where + " is not a valid transition (RESET -> INIT -> RTR -> RTS; any -> ERROR or RESET)");
  }
  const bool rc = type == QpType::kRc;
  QpAttrMask required = rc ? t->rc_required : t->ud_required;
  QpAttrMask optional = rc ? t->rc_optional : t->ud_optional;
  if (QpAttrMask missing = required & ~given) return fail(EINVAL, where + ": missing " + qp_attr_names(missing));
  if (QpAttrMask extra = given & ~(required | optional)) {
    return fail(EINVAL, where + ": " + qp_attr_names(extra) + " cannot be set in this transition");
  }
  return {};
}

// The port, the partition, access flags, the path MTU and the address.
Status check_port_values(const QpAttr& a, QpAttrMask given, const PortLimits* port, const std::string& where) {
  if ((given & kAttrPkeyIndex) && a.pkey_index != 0) {
    return fail(EINVAL, where + ": pkey_index " + std::to_string(a.pkey_index) + " does not exist (the port has one "
                                "P_Key, 0xFFFF, at index 0)");
  }
  if ((given & kAttrPort) && a.port != 1) {
    return fail(EINVAL, where + ": port " + std::to_string(a.port) + " does not exist (a ufab device has port 1)");
  }
  if ((given & kAttrAccessFlags) && (a.access_flags & ~kSupportedAccess)) {
    return fail(EINVAL, where + ": access_flags " + access_string(a.access_flags) + " has unsupported bits");
  }
  if (given & kAttrPathMtu) {
    uint32_t m = a.path_mtu;
    if (m != 256 && m != 512 && m != 1024 && m != 2048 && m != 4096) {
      return fail(EINVAL, where + ": path_mtu " + std::to_string(m) + " is not 256, 512, 1024, 2048 or 4096");
    }
    if (port != nullptr && m > port->active_mtu) {
      return fail(EINVAL, where + ": path_mtu " + std::to_string(m) + " exceeds the port's active MTU " +
                              std::to_string(port->active_mtu) + " (link MTU " + std::to_string(port->link_mtu) +
                              "); use at most " + std::to_string(port->active_mtu));
    }
  }
  if ((given & kAttrAv) && !net::Ipv4Address{a.av.dest_ip}.is_unicast()) {
    return fail(EINVAL, where + ": destination " + net::Ipv4Address{a.av.dest_ip}.str() +
                            " is not a unicast IPv4 address (GID ::ffff:a.b.c.d)");
  }
  if ((given & kAttrAv) && port != nullptr && a.av.dest_ip == port->own_ip) {
    return fail(EINVAL, where + ": destination " + net::Ipv4Address{a.av.dest_ip}.str() +
                            " is this device's own address; loopback is not supported");
  }
  return {};
}

// QP numbers, PSNs, timers, retry counts and READ/atomic depths.
Status check_connection_values(const QpAttr& a, QpAttrMask given, const std::string& where) {
  if ((given & kAttrDestQpn) && (a.dest_qpn > k24Bits || a.dest_qpn < 2)) {
    return fail(EINVAL, where + ": dest_qpn " + hex(a.dest_qpn) + " is not a QP number (2 .. 0xffffff)");
  }
  if (((given & kAttrRqPsn) && a.rq_psn > k24Bits) || ((given & kAttrSqPsn) && a.sq_psn > k24Bits)) {
    return fail(EINVAL, where + ": PSNs are 24 bits (at most 0xffffff)");
  }
  if ((given & kAttrTimeout) && a.timeout > 31) return fail(EINVAL, where + ": timeout must be 0..31");
  if ((given & kAttrRetryCnt) && a.retry_cnt > 7) return fail(EINVAL, where + ": retry_cnt must be 0..7");
  if ((given & kAttrRnrRetry) && a.rnr_retry > 7) return fail(EINVAL, where + ": rnr_retry must be 0..7");
  if ((given & kAttrMinRnrTimer) && a.min_rnr_timer > 31) return fail(EINVAL, where + ": min_rnr_timer must be 0..31");
  if ((given & kAttrMaxDestRdAtomic) && (a.max_dest_rd_atomic == 0 || a.max_dest_rd_atomic > 128)) {
    return fail(EINVAL, where + ": max_dest_rd_atomic must be 1..128");
  }
  if ((given & kAttrMaxQpRdAtomic) && (a.max_rd_atomic == 0 || a.max_rd_atomic > 128)) {
    return fail(EINVAL, where + ": max_rd_atomic must be 1..128");
  }
  return {};
}

}  // namespace

const char* qp_attr_name(QpAttrMask bit) {
  switch (bit) {
    case kAttrState: return "state";
    case kAttrAccessFlags: return "access_flags";
    case kAttrPkeyIndex: return "pkey_index";
    case kAttrPort: return "port";
    case kAttrQkey: return "qkey";
    case kAttrAv: return "av (destination address)";
    case kAttrPathMtu: return "path_mtu";
    case kAttrTimeout: return "timeout";
    case kAttrRetryCnt: return "retry_cnt";
    case kAttrRnrRetry: return "rnr_retry";
    case kAttrRqPsn: return "rq_psn";
    case kAttrMaxQpRdAtomic: return "max_rd_atomic";
    case kAttrMinRnrTimer: return "min_rnr_timer";
    case kAttrSqPsn: return "sq_psn";
    case kAttrMaxDestRdAtomic: return "max_dest_rd_atomic";
    case kAttrDestQpn: return "dest_qpn";
  }
  return "unknown attribute";
}

std::string qp_attr_names(QpAttrMask mask) {
  std::string out;
  for (uint32_t bit = 1; bit != 0; bit <<= 1) {
    if (!(mask & bit)) continue;
    if (!out.empty()) out += ", ";
    out += qp_attr_name(bit);
  }
  return out;
}

Status check_modify(QpType type, const QpAttr& current, const QpAttr& requested, QpAttrMask mask,
                    const PortLimits* port) {
  const QpState from = current.state;
  const QpState to = (mask & kAttrState) ? requested.state : from;
  const QpAttrMask given = mask & ~kAttrState;
  const std::string where = std::string(qp_state_name(from)) + " -> " + qp_state_name(to);
  if (auto s = check_mask(type, from, to, given, where); !s) return s;
  if (auto s = check_port_values(requested, given, port, where); !s) return s;
  return check_connection_values(requested, given, where);
}

}  // namespace ufab::verbs
