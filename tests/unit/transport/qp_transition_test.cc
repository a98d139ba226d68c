// check_modify (core/transport/qp_transition.h): the verbs QP state machine
// of IBA 10.3.1 for RC and UD, attribute values, and the words of refusals.
#include "core/transport/qp_transition.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ufab::verbs {
namespace {

constexpr QpAttrMask kInitRc = kAttrPkeyIndex | kAttrPort | kAttrAccessFlags;
constexpr QpAttrMask kInitUd = kAttrPkeyIndex | kAttrPort | kAttrQkey;
constexpr QpAttrMask kRtrRc =
    kAttrAv | kAttrPathMtu | kAttrDestQpn | kAttrRqPsn | kAttrMaxDestRdAtomic | kAttrMinRnrTimer;
constexpr QpAttrMask kRtsRc = kAttrSqPsn | kAttrTimeout | kAttrRetryCnt | kAttrRnrRetry | kAttrMaxQpRdAtomic;
constexpr QpAttrMask kAllAttrs = kAttrAccessFlags | kAttrPkeyIndex | kAttrPort | kAttrQkey | kAttrAv | kAttrPathMtu |
                                 kAttrTimeout | kAttrRetryCnt | kAttrRnrRetry | kAttrRqPsn | kAttrMaxQpRdAtomic |
                                 kAttrMinRnrTimer | kAttrSqPsn | kAttrMaxDestRdAtomic | kAttrDestQpn;

constexpr QpState kStates[] = {QpState::kReset, QpState::kInit, QpState::kRtr, QpState::kRts, QpState::kError};

// Attributes that pass every value check.
QpAttr good_attr(QpState to) {
  QpAttr a;
  a.state = to;
  a.av.dest_ip = 0x0A000002;  // 10.0.0.2
  a.dest_qpn = 0x11;
  a.qkey = 0x1234;
  return a;
}

QpAttr at(QpState s) {
  QpAttr a;
  a.state = s;
  return a;
}

std::string message(const Status& s) { return s ? std::string("(accepted)") : s.error().message(); }

bool has(const Status& s, const std::string& words) { return !s && s.error().message().find(words) != std::string::npos; }

// One transition's rule for one QP type.
struct Rule {
  QpType type;
  QpState from, to;
  QpAttrMask required, optional;
};

const std::vector<Rule>& rules() {
  static const std::vector<Rule> r = {
      {QpType::kRc, QpState::kReset, QpState::kInit, kInitRc, 0},
      {QpType::kRc, QpState::kInit, QpState::kInit, 0, kInitRc},
      {QpType::kRc, QpState::kInit, QpState::kRtr, kRtrRc, kAttrPkeyIndex | kAttrAccessFlags},
      {QpType::kRc, QpState::kRtr, QpState::kRts, kRtsRc, kAttrAccessFlags | kAttrMinRnrTimer},
      {QpType::kRc, QpState::kRts, QpState::kRts, 0, kAttrAccessFlags | kAttrMinRnrTimer},
      {QpType::kUd, QpState::kReset, QpState::kInit, kInitUd, 0},
      {QpType::kUd, QpState::kInit, QpState::kInit, 0, kInitUd},
      {QpType::kUd, QpState::kInit, QpState::kRtr, 0, kAttrPkeyIndex | kAttrQkey},
      {QpType::kUd, QpState::kRtr, QpState::kRts, kAttrSqPsn, kAttrQkey},
      {QpType::kUd, QpState::kRts, QpState::kRts, 0, kAttrQkey},
  };
  return r;
}

TEST(QpTransition, EveryTransitionTakesItsRequiredAndAllowedAttributes) {
  for (const Rule& r : rules()) {
    SCOPED_TRACE(std::string(qp_state_name(r.from)) + " -> " + qp_state_name(r.to) +
                 (r.type == QpType::kRc ? " RC" : " UD"));
    const QpAttr cur = at(r.from);
    const QpAttr req = good_attr(r.to);
    Status s = check_modify(r.type, cur, req, kAttrState | r.required);
    EXPECT_TRUE(s) << message(s);
    EXPECT_TRUE(check_modify(r.type, cur, req, kAttrState | r.required | r.optional));
    // Each optional attribute alone is allowed.
    for (QpAttrMask bit = 1; bit != 0; bit <<= 1) {
      if (r.optional & bit) {
        EXPECT_TRUE(check_modify(r.type, cur, req, kAttrState | r.required | bit)) << qp_attr_name(bit);
      }
    }
    // Without kAttrState the target is the current state.
    if (r.from == r.to) {
      EXPECT_TRUE(check_modify(r.type, cur, req, r.required | r.optional));
    }
  }
}

TEST(QpTransition, EachMissingRequiredAttributeIsNamed) {
  for (const Rule& r : rules()) {
    const QpAttr cur = at(r.from);
    const QpAttr req = good_attr(r.to);
    for (QpAttrMask bit = 1; bit != 0; bit <<= 1) {
      if (!(r.required & bit)) continue;
      Status s = check_modify(r.type, cur, req, kAttrState | (r.required & ~bit) | r.optional);
      ASSERT_FALSE(s) << qp_attr_name(bit);
      EXPECT_EQ(s.error().code(), EINVAL);
      EXPECT_EQ(s.error().message(), std::string(qp_state_name(r.from)) + " -> " + qp_state_name(r.to) +
                                         ": missing " + qp_attr_name(bit));
    }
  }
}

TEST(QpTransition, EachAttributeOutsideTheTransitionIsNamed) {
  for (const Rule& r : rules()) {
    const QpAttr cur = at(r.from);
    const QpAttr req = good_attr(r.to);
    for (QpAttrMask bit = 1; bit != 0; bit <<= 1) {
      if (!(kAllAttrs & bit) || ((r.required | r.optional) & bit)) continue;
      Status s = check_modify(r.type, cur, req, kAttrState | r.required | bit);
      ASSERT_FALSE(s) << qp_attr_name(bit);
      EXPECT_EQ(s.error().message(), std::string(qp_state_name(r.from)) + " -> " + qp_state_name(r.to) + ": " +
                                         qp_attr_name(bit) + " cannot be set in this transition");
    }
  }
}

TEST(QpTransition, MissingAttributesAreListedTogether) {
  Status s = check_modify(QpType::kRc, at(QpState::kReset), good_attr(QpState::kInit), kAttrState | kAttrPort);
  EXPECT_EQ(message(s), "RESET -> INIT: missing access_flags, pkey_index");
  s = check_modify(QpType::kRc, at(QpState::kInit), good_attr(QpState::kRtr),
                   kAttrState | kAttrAv | kAttrPathMtu | kAttrMaxDestRdAtomic | kAttrMinRnrTimer);
  EXPECT_EQ(message(s), "INIT -> RTR: missing rq_psn, dest_qpn");
  // An unknown mask bit is refused, not ignored.
  s = check_modify(QpType::kRc, at(QpState::kRts), good_attr(QpState::kRts), 1u << 14);
  EXPECT_EQ(message(s), "RTS -> RTS: unknown attribute cannot be set in this transition");
}

TEST(QpTransition, OnlyTheListedTransitionsExist) {
  for (QpType type : {QpType::kRc, QpType::kUd}) {
    for (QpState from : kStates) {
      for (QpState to : kStates) {
        bool listed = to == QpState::kReset || to == QpState::kError;
        for (const Rule& r : rules()) listed |= r.type == type && r.from == from && r.to == to;
        QpAttrMask required = 0;
        for (const Rule& r : rules()) {
          if (r.type == type && r.from == from && r.to == to) required = r.required;
        }
        Status s = check_modify(type, at(from), good_attr(to), kAttrState | required);
        if (listed) {
          EXPECT_TRUE(s) << message(s);
        } else {
          EXPECT_EQ(message(s), std::string(qp_state_name(from)) + " -> " + qp_state_name(to) +
                                    " is not a valid transition (RESET -> INIT -> RTR -> RTS; any -> ERROR or RESET)");
        }
      }
    }
  }
  // A state verbs has and ufab does not (SQD = 4).
  Status s = check_modify(QpType::kRc, at(QpState::kRts), good_attr(static_cast<QpState>(4)), kAttrState);
  EXPECT_TRUE(has(s, "is not a valid transition")) << message(s);
}

TEST(QpTransition, ResetAndErrorTakeTheStateAlone) {
  for (QpState from : kStates) {
    for (QpState to : {QpState::kReset, QpState::kError}) {
      EXPECT_TRUE(check_modify(QpType::kRc, at(from), good_attr(to), kAttrState));
      Status s = check_modify(QpType::kUd, at(from), good_attr(to), kAttrState | kAttrQkey | kAttrPort);
      EXPECT_EQ(message(s), std::string(qp_state_name(from)) + " -> " + qp_state_name(to) +
                                ": only the state may be given, not port, qkey");
    }
  }
}

// A transition that allows the attribute, for the value checks.
struct Where {
  QpType type;
  QpState from, to;
  QpAttrMask others;  // the transition's other required attributes
};

Status check_value(QpAttrMask attr, const QpAttr& req, const PortLimits* port = nullptr) {
  Where w = (attr & kRtsRc)   ? Where{QpType::kRc, QpState::kRtr, QpState::kRts, kRtsRc}
            : (attr & kRtrRc) ? Where{QpType::kRc, QpState::kInit, QpState::kRtr, kRtrRc}
                              : Where{QpType::kRc, QpState::kReset, QpState::kInit, kInitRc};
  QpAttr r = req;
  r.state = w.to;
  return check_modify(w.type, at(w.from), r, kAttrState | w.others | attr, port);
}

TEST(QpTransition, BadValuesAreRefusedWithTheAttributeNamed) {
  struct Case {
    QpAttrMask attr;
    void (*set)(QpAttr&);
    const char* words;
  };
  const Case cases[] = {
      {kAttrPkeyIndex, [](QpAttr& a) { a.pkey_index = 1; }, "RESET -> INIT: pkey_index 1 does not exist"},
      {kAttrPort, [](QpAttr& a) { a.port = 2; }, "RESET -> INIT: port 2 does not exist (a ufab device has port 1)"},
      {kAttrPort, [](QpAttr& a) { a.port = 0; }, "port 0 does not exist"},
      {kAttrAccessFlags, [](QpAttr& a) { a.access_flags = 1u << 20; }, "has unsupported bits"},
      {kAttrPathMtu, [](QpAttr& a) { a.path_mtu = 1500; },
       "INIT -> RTR: path_mtu 1500 is not 256, 512, 1024, 2048 or 4096"},
      {kAttrPathMtu, [](QpAttr& a) { a.path_mtu = 0; }, "path_mtu 0 is not"},
      {kAttrAv, [](QpAttr& a) { a.av.dest_ip = 0; }, "destination 0.0.0.0 is not a unicast IPv4 address"},
      {kAttrAv, [](QpAttr& a) { a.av.dest_ip = 0xE0000001; }, "destination 224.0.0.1 is not a unicast"},
      {kAttrAv, [](QpAttr& a) { a.av.dest_ip = 0x7F000001; }, "destination 127.0.0.1 is not a unicast"},
      {kAttrAv, [](QpAttr& a) { a.av.dest_ip = 0xFFFFFFFF; }, "destination 255.255.255.255 is not a unicast"},
      {kAttrDestQpn, [](QpAttr& a) { a.dest_qpn = 1; }, "dest_qpn 0x1 is not a QP number (2 .. 0xffffff)"},
      {kAttrDestQpn, [](QpAttr& a) { a.dest_qpn = 0x1000000; }, "dest_qpn 0x1000000 is not a QP number"},
      {kAttrRqPsn, [](QpAttr& a) { a.rq_psn = 0x1000000; }, "INIT -> RTR: PSNs are 24 bits (at most 0xffffff)"},
      {kAttrSqPsn, [](QpAttr& a) { a.sq_psn = 0x1000000; }, "RTR -> RTS: PSNs are 24 bits"},
      {kAttrTimeout, [](QpAttr& a) { a.timeout = 32; }, "RTR -> RTS: timeout must be 0..31"},
      {kAttrRetryCnt, [](QpAttr& a) { a.retry_cnt = 8; }, "retry_cnt must be 0..7"},
      {kAttrRnrRetry, [](QpAttr& a) { a.rnr_retry = 8; }, "rnr_retry must be 0..7"},
      {kAttrMinRnrTimer, [](QpAttr& a) { a.min_rnr_timer = 32; }, "INIT -> RTR: min_rnr_timer must be 0..31"},
      {kAttrMaxDestRdAtomic, [](QpAttr& a) { a.max_dest_rd_atomic = 0; }, "max_dest_rd_atomic must be 1..128"},
      {kAttrMaxDestRdAtomic, [](QpAttr& a) { a.max_dest_rd_atomic = 129; }, "max_dest_rd_atomic must be 1..128"},
      {kAttrMaxQpRdAtomic, [](QpAttr& a) { a.max_rd_atomic = 0; }, "max_rd_atomic must be 1..128"},
      {kAttrMaxQpRdAtomic, [](QpAttr& a) { a.max_rd_atomic = 200; }, "max_rd_atomic must be 1..128"},
  };
  for (const Case& c : cases) {
    QpAttr req = good_attr(QpState::kInit);
    c.set(req);
    Status s = check_value(c.attr, req);
    EXPECT_TRUE(has(s, c.words)) << c.words << " / " << message(s);
    if (!s) {
      EXPECT_EQ(s.error().code(), EINVAL);
    }
  }
}

TEST(QpTransition, ValuesOutsideTheMaskAreNotChecked) {
  QpAttr req = good_attr(QpState::kInit);
  req.path_mtu = 1500;
  req.timeout = 99;
  req.dest_qpn = 0;
  req.av.dest_ip = 0;
  req.max_rd_atomic = 0;
  EXPECT_TRUE(check_modify(QpType::kRc, at(QpState::kReset), req, kAttrState | kInitRc));
}

TEST(QpTransition, GoodValuesAtTheirLimitsPass) {
  for (uint32_t mtu : {256u, 512u, 1024u, 2048u, 4096u}) {
    QpAttr req = good_attr(QpState::kRtr);
    req.path_mtu = mtu;
    EXPECT_TRUE(check_value(kAttrPathMtu, req)) << mtu;
  }
  QpAttr req = good_attr(QpState::kRtr);
  req.dest_qpn = 0xFFFFFF;
  req.rq_psn = 0xFFFFFF;
  req.min_rnr_timer = 31;
  req.max_dest_rd_atomic = 128;
  EXPECT_TRUE(check_value(kAttrDestQpn | kAttrRqPsn | kAttrMinRnrTimer | kAttrMaxDestRdAtomic, req));
  req = good_attr(QpState::kRts);
  req.sq_psn = 0xFFFFFF;
  req.timeout = 0;
  req.retry_cnt = 7;
  req.rnr_retry = 7;
  req.max_rd_atomic = 1;
  EXPECT_TRUE(check_value(kRtsRc, req));
  req.timeout = 31;
  req.max_rd_atomic = 128;
  EXPECT_TRUE(check_value(kRtsRc, req));
}

TEST(QpTransition, PortLimitsWhenTheProviderGivesThem) {
  const PortLimits port{.active_mtu = 1024, .link_mtu = 1500, .own_ip = 0x0A000001};
  QpAttr req = good_attr(QpState::kRtr);
  req.path_mtu = 2048;
  EXPECT_TRUE(check_value(kAttrPathMtu, req));  // no limits: any IBA MTU
  EXPECT_EQ(message(check_value(kAttrPathMtu, req, &port)),
            "INIT -> RTR: path_mtu 2048 exceeds the port's active MTU 1024 (link MTU 1500); use at most 1024");
  req.path_mtu = 1024;
  EXPECT_TRUE(check_value(kAttrPathMtu, req, &port));
  req.av.dest_ip = 0x0A000001;
  EXPECT_TRUE(check_value(kAttrAv, req));
  EXPECT_EQ(message(check_value(kAttrAv, req, &port)),
            "INIT -> RTR: destination 10.0.0.1 is this device's own address; loopback is not supported");
}

TEST(QpTransition, TheFirstProblemIsReported) {
  // Mask errors before values, and values in a fixed order.
  QpAttr req = good_attr(QpState::kRtr);
  req.path_mtu = 1500;
  req.dest_qpn = 1;
  Status s = check_modify(QpType::kRc, at(QpState::kInit), req, kAttrState | (kRtrRc & ~kAttrRqPsn));
  EXPECT_EQ(message(s), "INIT -> RTR: missing rq_psn");
  s = check_modify(QpType::kRc, at(QpState::kInit), req, kAttrState | kRtrRc);
  EXPECT_TRUE(has(s, "path_mtu 1500")) << message(s);
  req.path_mtu = 1024;
  s = check_modify(QpType::kRc, at(QpState::kInit), req, kAttrState | kRtrRc);
  EXPECT_TRUE(has(s, "dest_qpn 0x1")) << message(s);
}

TEST(QpTransition, UdTakesQkeyAndNoConnection) {
  QpAttr req = good_attr(QpState::kRtr);
  EXPECT_TRUE(check_modify(QpType::kUd, at(QpState::kInit), req, kAttrState));
  EXPECT_EQ(message(check_modify(QpType::kUd, at(QpState::kInit), req, kAttrState | kAttrAv)),
            "INIT -> RTR: av (destination address) cannot be set in this transition");
  EXPECT_EQ(message(check_modify(QpType::kRc, at(QpState::kReset), good_attr(QpState::kInit),
                                 kAttrState | kInitRc | kAttrQkey)),
            "RESET -> INIT: qkey cannot be set in this transition");
}

TEST(QpTransition, AttributeNames) {
  EXPECT_EQ(qp_attr_names(kAttrDestQpn | kAttrRqPsn), "rq_psn, dest_qpn");
  EXPECT_STREQ(qp_attr_name(kAttrAv), "av (destination address)");
  EXPECT_STREQ(qp_attr_name(kAttrMaxQpRdAtomic), "max_rd_atomic");
  EXPECT_STREQ(qp_attr_name(1u << 1), "unknown attribute");
  EXPECT_EQ(qp_attr_names(0), "");
}

}  // namespace
}  // namespace ufab::verbs
