// The verbs queue-pair state machine as a pure check (IBA vol. 1 10.3.1,
// table 91, as libibverbs' ibv_modify_qp documents it): which transitions
// exist, which attributes each one requires and allows for RC and UD, and
// which values are acceptable. Nothing here changes a QP: a provider calls
// check_modify first and applies the attributes only when it succeeds, so
// a refused modify changes nothing. Every provider calls it, so they refuse
// the same requests with the same words.
#pragma once

#include <cstdint>

#include "base/error.h"
#include "core/transport/verbs.h"

namespace ufab::verbs {

// What the port allows, for the checks that depend on the device. A
// provider without such limits passes nullptr and those checks are skipped.
struct PortLimits {
  uint32_t active_mtu = 0;  // largest path_mtu the port takes, in bytes
  uint32_t link_mtu = 0;    // the link's MTU, for the message only
  uint32_t own_ip = 0;      // the port's IPv4 address (host order); an AV may not name it
};

// Checks a modify_qp request of a QP of `type` whose attributes are now
// `current` (its state is the transition's start): the target state is
// requested.state when `mask` has kAttrState, else the current state. EINVAL
// with a sentence naming the transition and the attribute, e.g. "INIT -> RTR:
// missing dest_qpn, rq_psn" or "INIT -> RTR: path_mtu 9000 is not 256, 512,
// 1024, 2048 or 4096". Callers put their own subject in front ("modifying QP
// 0x11 ").
Status check_modify(QpType type, const QpAttr& current, const QpAttr& requested, QpAttrMask mask,
                    const PortLimits* port = nullptr);

// "access_flags", "av (destination address)", ...; "unknown attribute" for
// a bit that is not one attribute.
const char* qp_attr_name(QpAttrMask bit);
// The names of every bit in `mask`, comma separated: "dest_qpn, rq_psn".
std::string qp_attr_names(QpAttrMask mask);

}  // namespace ufab::verbs
