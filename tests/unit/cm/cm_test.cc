// The connection manager (ufab/cm.h) between two ufab devices on the two
// ports of one software NIC: connect, accept, reject, private data,
// disconnect from either side, a listener that goes away, many connects at
// once, lost and duplicated MADs, and a hand-driven peer on a bare GSI QP
// sending the duplicates and odd messages a CM must answer.
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <variant>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/cm/mad.h"
#include "core/cm/rdma_cm.h"
#include "ufab/cm.h"
#include "ufab/rdma.h"

namespace {

using namespace std::chrono_literals;

constexpr uint32_t kIpA = 0x0A000001, kIpB = 0x0A000002;

struct Dev {
  ufab_device* dev = nullptr;
  ufab_pd* pd = nullptr;
  ufab_cq* cq = nullptr;
  ufab_cm* cm = nullptr;
  std::vector<uint8_t> buf = std::vector<uint8_t>(1 << 16);
  ufab_mr* mr = nullptr;

  ~Dev() {
    ufab_cm_close(cm);
    if (mr) ufab_mr_dereg(mr);
    if (cq) ufab_cq_destroy(cq);
    if (pd) ufab_pd_free(pd);
    ufab_device_close(dev);
  }
  ufab_qp* qp() {
    ufab_qp_init_attr init{.qp_type = UFAB_QPT_RC, .sq_sig_all = 0, .send_cq = cq, .recv_cq = cq,
                           .cap = {.max_send_wr = 64, .max_recv_wr = 64, .max_send_sge = 1, .max_recv_sge = 1,
                                   .max_inline_data = 0}};
    ufab_qp* q = nullptr;
    EXPECT_EQ(ufab_qp_create(pd, &init, &q), 0) << ufab_last_error();
    return q;
  }
};

class Cm : public ::testing::Test {
 protected:
  // `params`: swnic's, for both ports ("loss=0.2,seed=3" style pairs).
  void open(std::vector<std::string> params = {}, ufab_cm_opts opts = {}, bool cm_on_b = true) {
    std::string name = "cm" + std::to_string(::getpid()) + "_" + std::to_string(counter_++);
    auto pa = params;
    pa.insert(pa.begin(), "stale=reset");  // the first port to open makes the segment afresh
    open_one(a_, "swnic:" + name + ":0", "10.0.0.1", pa, opts, true);
    open_one(b_, "swnic:" + name + ":1", "10.0.0.2", params, opts, cm_on_b);
  }
  void open_one(Dev& d, const std::string& spec, const char* ip, std::vector<std::string> params,
                ufab_cm_opts opts, bool with_cm) {
    std::vector<const char*> p;
    for (auto& s : params) p.push_back(s.c_str());
    p.push_back(nullptr);
    ufab_device_opts o{.size = sizeof o, .ip = ip, .params = p.data(), .progress_thread = 1, .ring_size = 0};
    ASSERT_EQ(ufab_device_open(spec.c_str(), &o, &d.dev), 0) << ufab_last_error();
    ASSERT_EQ(ufab_pd_alloc(d.dev, &d.pd), 0);
    ASSERT_EQ(ufab_cq_create(d.dev, 256, &d.cq), 0);
    ASSERT_EQ(ufab_mr_reg(d.pd, d.buf.data(), d.buf.size(), UFAB_ACCESS_LOCAL_WRITE | UFAB_ACCESS_REMOTE_WRITE |
                                                                  UFAB_ACCESS_REMOTE_READ,
                          &d.mr),
              0);
    if (with_cm) {
      opts.size = sizeof opts;
      ASSERT_EQ(ufab_cm_open(d.dev, &opts, &d.cm), 0) << ufab_last_error();
    }
  }

 public:
  // The next event of `d` (bounded); also for helpers outside the fixture.
  static ufab_cm_event next(Dev& d, int timeout_ms = 5000) {
    ufab_cm_event ev{};
    int rc = ufab_cm_get_event(d.cm, &ev, timeout_ms);
    EXPECT_EQ(rc, 0) << ufab_last_error();
    return ev;
  }

 protected:
  static ufab_cm_conn_param with_data(const std::string& s) {
    ufab_cm_conn_param p{};
    p.private_data = s.data();
    p.private_data_len = static_cast<uint8_t>(s.size());
    return p;
  }

  static ufab_qp_attr query(ufab_qp* qp) {
    ufab_qp_attr a{};
    EXPECT_EQ(ufab_qp_query(qp, &a), 0);
    return a;
  }

  // A SEND from `from` to `to` over connected QPs arrives intact.
  void send_works(Dev& from, ufab_qp* fq, Dev& to, ufab_qp* tq, uint8_t tag) {
    ufab_sge r{.addr = reinterpret_cast<uint64_t>(to.buf.data()), .length = 64, .lkey = ufab_mr_lkey(to.mr)};
    ufab_recv_wr rw{.wr_id = 1, .sg_list = &r, .num_sge = 1, .reserved = 0};
    ASSERT_EQ(ufab_post_recv(tq, &rw, 1, nullptr), 0) << ufab_last_error();
    std::memset(from.buf.data(), tag, 64);
    ufab_sge s{.addr = reinterpret_cast<uint64_t>(from.buf.data()), .length = 64, .lkey = ufab_mr_lkey(from.mr)};
    ufab_send_wr sw{};
    sw.wr_id = 2;
    sw.sg_list = &s;
    sw.num_sge = 1;
    sw.opcode = UFAB_WR_SEND;
    sw.send_flags = UFAB_SEND_SIGNALED;
    ASSERT_EQ(ufab_post_send(fq, &sw, 1, nullptr), 0) << ufab_last_error();
    ufab_wc wc{};
    ASSERT_EQ(ufab_cq_wait(from.cq, &wc, 1, 5000), 1);
    EXPECT_EQ(wc.status, UFAB_WC_SUCCESS) << ufab_cq_wc_detail(from.cq, &wc);
    ASSERT_EQ(ufab_cq_wait(to.cq, &wc, 1, 5000), 1);
    EXPECT_EQ(wc.status, UFAB_WC_SUCCESS) << ufab_cq_wc_detail(to.cq, &wc);
    EXPECT_EQ(to.buf[0], tag);
    EXPECT_EQ(to.buf[63], tag);
  }

  // A connects to B's `port`; B accepts. Returns both ids and QPs.
  struct Pair {
    ufab_cm_id* a = nullptr;
    ufab_cm_id* b = nullptr;
    ufab_qp* qa = nullptr;
    ufab_qp* qb = nullptr;
  };
  Pair connect_pair(uint16_t port) {
    Pair p;
    p.qa = a_.qp();
    p.qb = b_.qp();
    EXPECT_EQ(ufab_cm_connect(a_.cm, p.qa, kIpB, port, nullptr, &p.a), 0) << ufab_last_error();
    ufab_cm_event req = next(b_);
    EXPECT_EQ(req.type, UFAB_CM_EVENT_CONNECT_REQUEST) << ufab_cm_event_str(req.type);
    p.b = req.id;
    EXPECT_EQ(ufab_cm_accept(p.b, p.qb, nullptr), 0) << ufab_last_error();
    EXPECT_EQ(next(a_).type, UFAB_CM_EVENT_ESTABLISHED);
    EXPECT_EQ(next(b_).type, UFAB_CM_EVENT_ESTABLISHED);
    return p;
  }

  // Takes events on both sides for up to `limit`, accepting every request
  // on a new QP, until each side counted `want` events of `type` (any other
  // event fails the test). Returns the counts.
  std::pair<int, int> serve(uint32_t type, int want, std::chrono::seconds limit) {
    int na = 0, nb = 0;
    auto deadline = std::chrono::steady_clock::now() + limit;
    while ((na < want || nb < want) && std::chrono::steady_clock::now() < deadline) {
      for (Dev* d : {&a_, &b_}) {
        ufab_cm_event ev{};
        if (ufab_cm_get_event(d->cm, &ev, 10) != 0) continue;
        if (ev.type == UFAB_CM_EVENT_CONNECT_REQUEST) {
          EXPECT_EQ(ufab_cm_accept(ev.id, d->qp(), nullptr), 0) << ufab_last_error();
          continue;
        }
        EXPECT_EQ(ev.type, type) << ufab_cm_event_str(ev.type) << " status " << ev.status;
        if (ev.type == UFAB_CM_EVENT_ESTABLISHED) {
          ufab_qp* mine = ufab_cm_id_qp(ev.id);  // paired with the right peer QP
          EXPECT_TRUE(mine != nullptr && query(mine).dest_qpn == ev.peer_qpn);
        }
        ++(d == &a_ ? na : nb);
      }
    }
    return {na, nb};
  }

  Dev a_, b_;
  static inline int counter_ = 0;
};

TEST_F(Cm, ConnectAcceptCarryPrivateDataAndTheQpsWork) {
  open();
  ufab_cm_listener* l = nullptr;
  ASSERT_EQ(ufab_cm_listen(b_.cm, 7174, &l), 0) << ufab_last_error();
  ufab_cm_listener* again = nullptr;
  EXPECT_EQ(ufab_cm_listen(b_.cm, 7174, &again), -EADDRINUSE);
  ufab_qp* qa = a_.qp();
  ufab_qp* qb = b_.qp();
  std::string hello(UFAB_CM_REQ_PRIVATE_DATA, 'h');  // the most a REQ carries for the application
  auto pa = with_data(hello);
  pa.responder_resources = 4;
  pa.initiator_depth = 2;
  ufab_cm_id* ida = nullptr;
  ASSERT_EQ(ufab_cm_connect(a_.cm, qa, kIpB, 7174, &pa, &ida), 0) << ufab_last_error();

  ufab_cm_event req = next(b_);
  ASSERT_EQ(req.type, UFAB_CM_EVENT_CONNECT_REQUEST);
  EXPECT_EQ(req.listener, l);
  EXPECT_EQ(req.peer_ip, kIpA);
  EXPECT_EQ(req.local_port, 7174);
  EXPECT_NE(req.peer_port, 0);
  EXPECT_EQ(req.peer_qpn, ufab_qp_num(qa));
  EXPECT_EQ(req.param.responder_resources, 4);
  EXPECT_EQ(req.param.initiator_depth, 2);
  ASSERT_EQ(req.private_data_len, UFAB_CM_REQ_PRIVATE_DATA);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(req.private_data), req.private_data_len), hello);

  std::string world(UFAB_CM_REP_PRIVATE_DATA, 'w');
  auto pb = with_data(world);
  ASSERT_EQ(ufab_cm_accept(req.id, qb, &pb), 0) << ufab_last_error();
  ufab_cm_event est = next(a_);
  ASSERT_EQ(est.type, UFAB_CM_EVENT_ESTABLISHED) << ufab_cm_event_str(est.type);
  EXPECT_EQ(est.id, ida);
  EXPECT_EQ(est.peer_qpn, ufab_qp_num(qb));
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(est.private_data), est.private_data_len), world);
  // What each side may have outstanding follows what the other takes.
  EXPECT_EQ(est.param.initiator_depth, 2);      // what A asked for: B takes up to 16
  EXPECT_EQ(est.param.responder_resources, 4);  // B may send 4 (min of A's 4 and B's 16)
  ufab_cm_event estb = next(b_);
  ASSERT_EQ(estb.type, UFAB_CM_EVENT_ESTABLISHED);
  EXPECT_EQ(estb.id, req.id);

  ufab_qp_attr aa = query(qa), ab = query(qb);
  EXPECT_EQ(aa.state, UFAB_QPS_RTS);
  EXPECT_EQ(ab.state, UFAB_QPS_RTS);
  EXPECT_EQ(aa.dest_qpn, ufab_qp_num(qb));
  EXPECT_EQ(ab.dest_qpn, ufab_qp_num(qa));
  EXPECT_EQ(aa.max_rd_atomic, 2);       // A asked to send at most 2
  EXPECT_EQ(ab.max_dest_rd_atomic, 2);  // so B takes 2
  EXPECT_EQ(ab.max_rd_atomic, 4);       // A takes 4, B sends up to 4
  EXPECT_EQ(aa.max_dest_rd_atomic, 4);
  send_works(a_, qa, b_, qb, 0x5a);
  send_works(b_, qb, a_, qa, 0xa5);

  // A disconnects: both hear it, both QPs are in ERROR.
  ASSERT_EQ(ufab_cm_disconnect(ida), 0) << ufab_last_error();
  ufab_cm_event da = next(a_), db = next(b_);
  EXPECT_EQ(da.type, UFAB_CM_EVENT_DISCONNECTED);
  EXPECT_EQ(da.status, 0);
  EXPECT_EQ(db.type, UFAB_CM_EVENT_DISCONNECTED);
  EXPECT_EQ(query(qa).state, UFAB_QPS_ERR);
  EXPECT_EQ(query(qb).state, UFAB_QPS_ERR);
  EXPECT_EQ(ufab_cm_disconnect(ida), -EINVAL);  // once is enough
  ufab_cm_id_destroy(ida);
  ufab_cm_id_destroy(req.id);
  ufab_qp_destroy(qa);
  ufab_qp_destroy(qb);
}

TEST_F(Cm, RejectCarriesReasonAndPrivateData) {
  open();
  ufab_cm_listener* l = nullptr;
  ASSERT_EQ(ufab_cm_listen(b_.cm, 9000, &l), 0);
  ufab_qp* qa = a_.qp();
  ufab_cm_id* ida = nullptr;
  ASSERT_EQ(ufab_cm_connect(a_.cm, qa, kIpB, 9000, nullptr, &ida), 0);
  ufab_cm_event req = next(b_);
  ASSERT_EQ(req.type, UFAB_CM_EVENT_CONNECT_REQUEST);
  std::string no(UFAB_CM_REJ_PRIVATE_DATA + 1, 'n');
  EXPECT_EQ(ufab_cm_reject(req.id, no.data(), static_cast<uint8_t>(no.size())), -EMSGSIZE);
  no.pop_back();
  ASSERT_EQ(ufab_cm_reject(req.id, no.data(), static_cast<uint8_t>(no.size())), 0) << ufab_last_error();
  ufab_cm_event rej = next(a_);
  ASSERT_EQ(rej.type, UFAB_CM_EVENT_REJECTED);
  EXPECT_EQ(rej.id, ida);
  EXPECT_EQ(rej.reject_reason, UFAB_CM_REJ_CONSUMER_REJECTED);
  EXPECT_STREQ(ufab_cm_reject_reason_str(rej.reject_reason), "consumer defined");
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(rej.private_data), rej.private_data_len), no);
  EXPECT_EQ(query(qa).state, UFAB_QPS_RESET);  // never connected
  EXPECT_EQ(ufab_cm_accept(req.id, b_.qp(), nullptr), -EINVAL);  // answered already
  ufab_cm_id_destroy(ida);
  ufab_cm_id_destroy(req.id);
}

TEST_F(Cm, NobodyListeningIsRejectedInvalidServiceId) {
  open();
  ufab_cm_id* id = nullptr;
  ASSERT_EQ(ufab_cm_connect(a_.cm, a_.qp(), kIpB, 4242, nullptr, &id), 0);
  ufab_cm_event ev = next(a_);
  ASSERT_EQ(ev.type, UFAB_CM_EVENT_REJECTED) << ufab_cm_event_str(ev.type);
  EXPECT_EQ(ev.reject_reason, UFAB_CM_REJ_INVALID_SERVICE_ID);
  EXPECT_EQ(ev.status, -ECONNREFUSED);

  // A device without a CM answers nothing: the REQ goes unanswered.
}

TEST_F(Cm, ArgumentsAreCheckedBeforeAnythingIsSent) {
  open();
  ufab_qp* qa = a_.qp();
  ufab_cm_id* id = nullptr;
  std::string big(UFAB_CM_REQ_PRIVATE_DATA + 1, 'x');
  auto p = with_data(big);
  EXPECT_EQ(ufab_cm_connect(a_.cm, qa, kIpB, 1, &p, &id), -EMSGSIZE);
  EXPECT_NE(std::string(ufab_last_error()).find("at most 56"), std::string::npos) << ufab_last_error();
  EXPECT_EQ(ufab_cm_connect(a_.cm, qa, kIpA, 1, nullptr, &id), -EINVAL);        // ourselves
  EXPECT_EQ(ufab_cm_connect(a_.cm, qa, 0xE0000001, 1, nullptr, &id), -EINVAL);  // multicast
  EXPECT_EQ(ufab_cm_connect(a_.cm, qa, kIpB, 0, nullptr, &id), -EINVAL);
  EXPECT_EQ(ufab_cm_connect(a_.cm, b_.qp(), kIpB, 1, nullptr, &id), -EINVAL);   // another device's QP
  EXPECT_NE(std::string(ufab_last_error()).find("another device"), std::string::npos);
  ufab_cm* second = nullptr;
  EXPECT_EQ(ufab_cm_open(a_.dev, nullptr, &second), -EBUSY);  // QP 1 is taken
  EXPECT_NE(std::string(ufab_last_error()).find("QP 1"), std::string::npos) << ufab_last_error();
  ufab_cm_event ev{};
  EXPECT_EQ(ufab_cm_get_event(a_.cm, &ev, 0), -ETIMEDOUT);  // nothing was sent, nothing came back
}

TEST_F(Cm, PassiveSideDisconnects) {
  open();
  ufab_cm_listener* l = nullptr;
  ASSERT_EQ(ufab_cm_listen(b_.cm, 5000, &l), 0);
  Pair p = connect_pair(5000);
  send_works(a_, p.qa, b_, p.qb, 1);
  ASSERT_EQ(ufab_cm_disconnect(p.b), 0);
  EXPECT_EQ(next(b_).type, UFAB_CM_EVENT_DISCONNECTED);
  EXPECT_EQ(next(a_).type, UFAB_CM_EVENT_DISCONNECTED);
  EXPECT_EQ(query(p.qa).state, UFAB_QPS_ERR);
  // Destroying a connected id disconnects it (no event on that side).
  Pair q = connect_pair(5000);
  ufab_cm_id_destroy(q.a);
  EXPECT_EQ(next(b_).type, UFAB_CM_EVENT_DISCONNECTED);
  EXPECT_EQ(query(q.qa).state, UFAB_QPS_ERR);
  ufab_cm_event none{};
  EXPECT_EQ(ufab_cm_get_event(a_.cm, &none, 200), -ETIMEDOUT);
}

TEST_F(Cm, AListenerThatGoesAwayRejectsWhatItHasNotAccepted) {
  open();
  ufab_cm_listener* l = nullptr;
  ASSERT_EQ(ufab_cm_listen(b_.cm, 6000, &l), 0);
  ufab_cm_id* id = nullptr;
  ASSERT_EQ(ufab_cm_connect(a_.cm, a_.qp(), kIpB, 6000, nullptr, &id), 0);
  ufab_cm_event req = next(b_);
  ASSERT_EQ(req.type, UFAB_CM_EVENT_CONNECT_REQUEST);
  ufab_cm_listener_close(l);
  ufab_cm_event rej = next(a_);
  ASSERT_EQ(rej.type, UFAB_CM_EVENT_REJECTED);
  EXPECT_EQ(rej.reject_reason, UFAB_CM_REJ_INVALID_SERVICE_ID);
  EXPECT_EQ(ufab_cm_accept(req.id, b_.qp(), nullptr), -ENOTCONN);
  ufab_cm_id_destroy(req.id);
  ufab_cm_id* id2 = nullptr;
  ASSERT_EQ(ufab_cm_connect(a_.cm, a_.qp(), kIpB, 6000, nullptr, &id2), 0);
  EXPECT_EQ(next(a_).reject_reason, UFAB_CM_REJ_INVALID_SERVICE_ID);
  // The port is free again.
  ASSERT_EQ(ufab_cm_listen(b_.cm, 6000, &l), 0);
}

// Each side connects to the other while eight more connects run from A:
// every one is established, each QP paired with the right peer QP.
TEST_F(Cm, ManyConnectsAtOnceInBothDirections) {
  open();
  ufab_cm_listener *la = nullptr, *lb = nullptr;
  ASSERT_EQ(ufab_cm_listen(a_.cm, 100, &la), 0);
  ASSERT_EQ(ufab_cm_listen(b_.cm, 100, &lb), 0);
  constexpr int kN = 8;
  std::vector<ufab_qp*> qa;
  for (int i = 0; i < kN; ++i) {
    qa.push_back(a_.qp());
    ufab_cm_id* id = nullptr;
    ASSERT_EQ(ufab_cm_connect(a_.cm, qa.back(), kIpB, 100, nullptr, &id), 0);
  }
  ufab_qp* qb_active = b_.qp();
  ufab_cm_id* idb = nullptr;
  ASSERT_EQ(ufab_cm_connect(b_.cm, qb_active, kIpA, 100, nullptr, &idb), 0);
  // Answer requests on both sides until every connection is established.
  EXPECT_EQ(serve(UFAB_CM_EVENT_ESTABLISHED, kN + 1, 10s), std::make_pair(kN + 1, kN + 1));
}

// 20% of frames lost and 10% duplicated, both ways: every connect still
// ends established on both sides, through the CM's retransmissions.
TEST_F(Cm, LostAndDuplicatedMadsStillConnect) {
  open({"loss=0.2", "dup=0.1", "seed=11"}, ufab_cm_opts{.size = 0, .response_timeout = 12, .max_retries = 15,
                                                         .reserved = 0});
  ufab_cm_listener* l = nullptr;
  ASSERT_EQ(ufab_cm_listen(b_.cm, 300, &l), 0);
  constexpr int kN = 20;
  std::vector<ufab_cm_id*> ids;
  for (int i = 0; i < kN; ++i) {
    ufab_cm_id* id = nullptr;
    ASSERT_EQ(ufab_cm_connect(a_.cm, a_.qp(), kIpB, 300, nullptr, &id), 0);
    ids.push_back(id);
  }
  EXPECT_EQ(serve(UFAB_CM_EVENT_ESTABLISHED, kN, 30s), std::make_pair(kN, kN));
  // And every one disconnects, from A, heard on both sides.
  for (auto* id : ids) ASSERT_EQ(ufab_cm_disconnect(id), 0) << ufab_last_error();
  EXPECT_EQ(serve(UFAB_CM_EVENT_DISCONNECTED, kN, 30s), std::make_pair(kN, kN));
}

TEST_F(Cm, AnUnansweredRequestEndsUnreachable) {
  // B has no CM: nothing answers on its QP 1.
  open({}, ufab_cm_opts{.size = 0, .response_timeout = 10, .max_retries = 2, .reserved = 0}, false);
  ufab_cm_id* id = nullptr;
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(ufab_cm_connect(a_.cm, a_.qp(), kIpB, 7174, nullptr, &id), 0);
  ufab_cm_event ev = next(a_, 5000);
  EXPECT_EQ(ev.type, UFAB_CM_EVENT_UNREACHABLE) << ufab_cm_event_str(ev.type);
  EXPECT_EQ(ev.status, -ETIMEDOUT);
  // Three REQs, each waiting ~4 ms + 2 x 67 ms.
  EXPECT_GT(std::chrono::steady_clock::now() - t0, 300ms);
}


// A QP handed over in INIT keeps the access flags its application chose
// (and the receives it posted); one handed over in RESET gets remote
// WRITE, READ and atomics.
TEST_F(Cm, AQpInInitKeepsItsAccessFlagsAndReceives) {
  open();
  ufab_cm_listener* l = nullptr;
  ASSERT_EQ(ufab_cm_listen(b_.cm, 7100, &l), 0);
  ufab_qp* qa = a_.qp();
  ufab_qp* qb = b_.qp();
  ufab_qp_attr init{};
  init.state = UFAB_QPS_INIT;
  init.port = 1;
  init.access_flags = UFAB_ACCESS_REMOTE_WRITE | UFAB_ACCESS_FLUSH_GLOBAL;
  ASSERT_EQ(ufab_qp_modify(qb, &init, UFAB_QP_STATE | UFAB_QP_PKEY_INDEX | UFAB_QP_PORT | UFAB_QP_ACCESS_FLAGS), 0)
      << ufab_last_error();
  ufab_sge r{.addr = reinterpret_cast<uint64_t>(b_.buf.data()), .length = 64, .lkey = ufab_mr_lkey(b_.mr)};
  ufab_recv_wr rw{.wr_id = 1, .sg_list = &r, .num_sge = 1, .reserved = 0};
  ASSERT_EQ(ufab_post_recv(qb, &rw, 1, nullptr), 0);
  ufab_cm_id* ida = nullptr;
  ASSERT_EQ(ufab_cm_connect(a_.cm, qa, kIpB, 7100, nullptr, &ida), 0);
  ufab_cm_event req = next(b_);
  ASSERT_EQ(req.type, UFAB_CM_EVENT_CONNECT_REQUEST);
  ASSERT_EQ(ufab_cm_accept(req.id, qb, nullptr), 0) << ufab_last_error();
  ASSERT_EQ(next(a_).type, UFAB_CM_EVENT_ESTABLISHED);
  ASSERT_EQ(next(b_).type, UFAB_CM_EVENT_ESTABLISHED);
  EXPECT_EQ(query(qb).access_flags, uint32_t{UFAB_ACCESS_REMOTE_WRITE | UFAB_ACCESS_FLUSH_GLOBAL});
  EXPECT_EQ(query(qa).access_flags,
            uint32_t{UFAB_ACCESS_REMOTE_WRITE | UFAB_ACCESS_REMOTE_READ | UFAB_ACCESS_REMOTE_ATOMIC});
  // The receive posted in INIT takes the first SEND.
  std::memset(a_.buf.data(), 0x77, 64);
  ufab_sge s{.addr = reinterpret_cast<uint64_t>(a_.buf.data()), .length = 64, .lkey = ufab_mr_lkey(a_.mr)};
  ufab_send_wr sw{};
  sw.wr_id = 2;
  sw.sg_list = &s;
  sw.num_sge = 1;
  sw.opcode = UFAB_WR_SEND;
  ASSERT_EQ(ufab_post_send(qa, &sw, 1, nullptr), 0);
  ufab_wc wc{};
  ASSERT_EQ(ufab_cq_wait(b_.cq, &wc, 1, 5000), 1);
  EXPECT_EQ(wc.status, UFAB_WC_SUCCESS);
  EXPECT_EQ(wc.wr_id, 1u);
  EXPECT_EQ(b_.buf[0], 0x77);
}

// The active side gives up before the accept (its id destroyed): REJ
// "timeout" tells the listener, whose request ends in CONNECT_ERROR.
TEST_F(Cm, AnActiveSideThatGivesUpEndsThePassiveRequest) {
  open();
  ufab_cm_listener* l = nullptr;
  ASSERT_EQ(ufab_cm_listen(b_.cm, 8000, &l), 0);
  ufab_cm_id* id = nullptr;
  ASSERT_EQ(ufab_cm_connect(a_.cm, a_.qp(), kIpB, 8000, nullptr, &id), 0);
  ufab_cm_event req = next(b_);
  ASSERT_EQ(req.type, UFAB_CM_EVENT_CONNECT_REQUEST);
  ufab_cm_id_destroy(id);
  ufab_cm_event gone = next(b_);
  ASSERT_EQ(gone.type, UFAB_CM_EVENT_CONNECT_ERROR) << ufab_cm_event_str(gone.type);
  EXPECT_EQ(gone.id, req.id);
  EXPECT_EQ(gone.reject_reason, UFAB_CM_REJ_TIMEOUT);
  EXPECT_EQ(ufab_cm_accept(req.id, b_.qp(), nullptr), -ENOTCONN);
  ufab_cm_id_destroy(req.id);
}

// UD service resolution (SIDR): the answer names the listener's UD QP and
// its Q_Key, and a datagram to it arrives; a port nobody serves, a reject
// and a repeated SIDR_REQ get their answers.
TEST_F(Cm, UdServiceResolutionNamesTheQpAndItsQkey) {
  open();
  ufab_cm_listener* l = nullptr;
  ASSERT_EQ(ufab_cm_listen_ud(b_.cm, 7174, &l), 0) << ufab_last_error();
  ufab_cm_listener* tcp = nullptr;
  ASSERT_EQ(ufab_cm_listen(b_.cm, 7174, &tcp), 0);  // another port space: no clash
  std::string hello(UFAB_CM_SIDR_REQ_PRIVATE_DATA, 'u');
  auto p = with_data(hello);
  ufab_cm_id* id = nullptr;
  ASSERT_EQ(ufab_cm_resolve_ud(a_.cm, kIpB, 7174, &p, &id), 0) << ufab_last_error();
  ufab_cm_event req = next(b_);
  ASSERT_EQ(req.type, UFAB_CM_EVENT_CONNECT_REQUEST);
  EXPECT_EQ(req.qp_type, uint32_t{UFAB_QPT_UD});
  EXPECT_EQ(req.listener, l);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(req.private_data), hello.size()), hello);
  ufab_qp_init_attr init{.qp_type = UFAB_QPT_UD, .sq_sig_all = 1, .send_cq = b_.cq, .recv_cq = b_.cq,
                         .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1,
                                 .max_inline_data = 0}};
  ufab_qp* udb = nullptr;
  ASSERT_EQ(ufab_qp_create(b_.pd, &init, &udb), 0);
  EXPECT_EQ(ufab_cm_accept(req.id, b_.qp(), nullptr), -EINVAL);  // an RC QP for a UD request
  ASSERT_EQ(ufab_cm_accept(req.id, udb, nullptr), 0) << ufab_last_error();
  EXPECT_EQ(query(udb).state, UFAB_QPS_RTS);
  EXPECT_EQ(query(udb).qkey, UFAB_CM_UDP_QKEY);
  ufab_cm_event ok = next(a_);
  ASSERT_EQ(ok.type, UFAB_CM_EVENT_ESTABLISHED) << ufab_cm_event_str(ok.type);
  EXPECT_EQ(ok.id, id);
  EXPECT_EQ(ok.qp_type, uint32_t{UFAB_QPT_UD});
  EXPECT_EQ(ok.peer_qpn, ufab_qp_num(udb));
  EXPECT_EQ(ok.qkey, UFAB_CM_UDP_QKEY);
  ufab_cm_id_destroy(id);

  // A datagram to what the answer named arrives.
  init.send_cq = init.recv_cq = a_.cq;
  ufab_qp* uda = nullptr;
  ASSERT_EQ(ufab_qp_create(a_.pd, &init, &uda), 0);
  ufab_qp_attr qa;
  ufab_qp_attr_defaults(&qa);
  qa.qkey = UFAB_CM_UDP_QKEY;
  ufab_conn none{};
  ASSERT_EQ(ufab_qp_connect(uda, &none, &qa), 0);
  ufab_sge r{.addr = reinterpret_cast<uint64_t>(b_.buf.data()), .length = 40 + 32, .lkey = ufab_mr_lkey(b_.mr)};
  ufab_recv_wr rw{.wr_id = 9, .sg_list = &r, .num_sge = 1, .reserved = 0};
  ASSERT_EQ(ufab_post_recv(udb, &rw, 1, nullptr), 0);
  std::memset(a_.buf.data(), 0x42, 32);
  ufab_sge s{.addr = reinterpret_cast<uint64_t>(a_.buf.data()), .length = 32, .lkey = ufab_mr_lkey(a_.mr)};
  ufab_send_wr sw{};
  sw.wr_id = 10;
  sw.sg_list = &s;
  sw.num_sge = 1;
  sw.opcode = UFAB_WR_SEND;
  sw.ud = ufab_ud_dest{.ip = kIpB, .qpn = ok.peer_qpn, .qkey = ok.qkey, .traffic_class = 0, .hop_limit = 64,
                       .reserved = 0};
  ASSERT_EQ(ufab_post_send(uda, &sw, 1, nullptr), 0) << ufab_last_error();
  ufab_wc wc{};
  ASSERT_EQ(ufab_cq_wait(b_.cq, &wc, 1, 5000), 1);
  EXPECT_EQ(wc.status, UFAB_WC_SUCCESS);
  EXPECT_EQ(wc.byte_len, 40u + 32u);
  EXPECT_EQ(b_.buf[40], 0x42);

  // Nobody on the port: SIDR_REP "unsupported" (1); a reject: 2.
  ASSERT_EQ(ufab_cm_resolve_ud(a_.cm, kIpB, 7175, nullptr, &id), 0);
  ufab_cm_event no = next(a_);
  ASSERT_EQ(no.type, UFAB_CM_EVENT_REJECTED);
  EXPECT_EQ(no.reject_reason, 1);
  ASSERT_EQ(ufab_cm_resolve_ud(a_.cm, kIpB, 7174, nullptr, &id), 0);
  req = next(b_);
  ASSERT_EQ(req.type, UFAB_CM_EVENT_CONNECT_REQUEST);
  ASSERT_EQ(ufab_cm_reject(req.id, "no", 2), 0);
  no = next(a_);
  ASSERT_EQ(no.type, UFAB_CM_EVENT_REJECTED);
  EXPECT_EQ(no.reject_reason, 2);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(no.private_data), 2), "no");
  ufab_qp_destroy(uda);
  ufab_qp_destroy(udb);
}

// A peer without a CM: MADs built by hand on B's bare GSI QP, to A's CM.
class RawPeer {
 public:
  explicit RawPeer(Dev& d) : d_(d) {
    ufab_qp_init_attr init{.qp_type = UFAB_QPT_GSI, .sq_sig_all = 1, .send_cq = d.cq, .recv_cq = d.cq,
                           .cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1,
                                   .max_inline_data = 0}};
    EXPECT_EQ(ufab_qp_create(d.pd, &init, &qp_), 0) << ufab_last_error();
    ufab_qp_attr a;
    ufab_qp_attr_defaults(&a);
    a.qkey = ufab::cm::kGsiQKey;
    ufab_conn none{};
    EXPECT_EQ(ufab_qp_connect(qp_, &none, &a), 0) << ufab_last_error();
    for (uint32_t i = 0; i < 8; ++i) repost(i);
  }
  ~RawPeer() { ufab_qp_destroy(qp_); }

  void send(const ufab::cm::Mad& mad) {
    auto bytes = ufab::cm::build_mad(mad);
    ASSERT_TRUE(bytes) << bytes.error().message();
    std::memcpy(&d_.buf[kSendAt], bytes->data(), bytes->size());
    ufab_sge s{.addr = reinterpret_cast<uint64_t>(&d_.buf[kSendAt]), .length = 256, .lkey = ufab_mr_lkey(d_.mr)};
    ufab_send_wr wr{};
    wr.wr_id = 100;
    wr.sg_list = &s;
    wr.num_sge = 1;
    wr.opcode = UFAB_WR_SEND;
    wr.send_flags = UFAB_SEND_SIGNALED;
    wr.ud = ufab_ud_dest{.ip = kIpA, .qpn = 1, .qkey = ufab::cm::kGsiQKey, .traffic_class = 0, .hop_limit = 64,
                         .reserved = 0};
    ASSERT_EQ(ufab_post_send(qp_, &wr, 1, nullptr), 0) << ufab_last_error();
    // Wait for it to leave (its buffer is reused), keeping what arrives.
    auto deadline = std::chrono::steady_clock::now() + 3s;
    while (std::chrono::steady_clock::now() < deadline) {
      if (poll_one() == 100) return;
    }
    ADD_FAILURE() << "the send did not complete within 3 s";
  }
  // The next MAD A sends us (nullopt after `ms`).
  std::optional<ufab::cm::Mad> receive(int ms = 3000) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (received_.empty() && std::chrono::steady_clock::now() < deadline) poll_one();
    if (received_.empty()) return std::nullopt;
    ufab::cm::Mad m = std::move(received_.front());
    received_.pop_front();
    return m;
  }
  template <typename T>
  T expect(int ms = 3000) {
    auto m = receive(ms);
    EXPECT_TRUE(m.has_value()) << "no MAD within " << ms << " ms";
    if (!m) return T{};
    EXPECT_TRUE(std::holds_alternative<T>(m->message))
        << "got " << ufab::cm::attribute_name(m->header.attribute_id);
    last_tid_ = m->header.transaction_id;
    return std::holds_alternative<T>(m->message) ? std::get<T>(m->message) : T{};
  }
  uint64_t last_tid() const { return last_tid_; }

 private:
  static constexpr size_t kSendAt = 8 * 296;
  // One completion within 10 ms: a received MAD is kept. Returns its wr_id
  // (0xFFFF for none).
  uint64_t poll_one() {
    ufab_wc wc{};
    if (ufab_cq_wait(d_.cq, &wc, 1, 10) != 1) return 0xFFFF;
    if (wc.wr_id == 100) return 100;
    uint32_t slot = static_cast<uint32_t>(wc.wr_id);
    auto mad = ufab::cm::parse_mad(std::span<const uint8_t>(&d_.buf[slot * 296 + 40], wc.byte_len - 40));
    repost(slot);
    EXPECT_TRUE(mad) << mad.error().message();
    if (mad) received_.push_back(std::move(*mad));
    return wc.wr_id;
  }
  void repost(uint32_t slot) {
    ufab_sge r{.addr = reinterpret_cast<uint64_t>(&d_.buf[slot * 296]), .length = 296, .lkey = ufab_mr_lkey(d_.mr)};
    ufab_recv_wr wr{.wr_id = slot, .sg_list = &r, .num_sge = 1, .reserved = 0};
    EXPECT_EQ(ufab_post_recv(qp_, &wr, 1, nullptr), 0);
  }
  Dev& d_;
  ufab_qp* qp_ = nullptr;
  uint64_t last_tid_ = 0;
  std::deque<ufab::cm::Mad> received_;
};

ufab::cm::Req raw_req(uint32_t comm_id, uint16_t port, uint32_t qpn) {
  using namespace ufab::cm;
  Req r;
  r.local_comm_id = comm_id;
  r.service_id = rdma_cm_service_id(kRdmaPsTcp, port);
  r.local_qpn = qpn;
  r.responder_resources = 1;
  r.initiator_depth = 1;
  r.remote_cm_response_timeout = 20;
  r.starting_psn = 0x123456;
  r.local_cm_response_timeout = 20;  // long: A's own REP retries stay out of the way
  r.retry_count = 7;
  r.path_mtu = 3;
  r.rnr_retry_count = 7;
  r.max_cm_retries = 15;
  auto pd = build_rdma_cm_req_private_data(
      CmaHeader{.ip_version = 4, .port = 40000, .src_addr = cma_ipv4(kIpB), .dst_addr = cma_ipv4(kIpA)}, {});
  r.private_data = *pd;
  return r;
}

// A hand-driven peer connected to `d`'s listener on port 7174: its REQ,
// `d` accepts with `q`, the REP, the peer's RTU, ESTABLISHED on `d`.
struct RawConnection {
  ufab::cm::Req req;
  ufab::cm::Rep rep;
  ufab_cm_id* id = nullptr;
};
RawConnection connect_raw(RawPeer& peer, Dev& d, ufab_qp* q, uint32_t comm_id, uint64_t tid, uint32_t qpn) {
  using namespace ufab::cm;
  RawConnection c;
  c.req = raw_req(comm_id, 7174, qpn);
  peer.send(Mad{.header = cm_header(tid), .message = c.req});
  ufab_cm_event ev = Cm::next(d);
  EXPECT_EQ(ev.type, UFAB_CM_EVENT_CONNECT_REQUEST);
  c.id = ev.id;
  EXPECT_EQ(ufab_cm_accept(ev.id, q, nullptr), 0) << ufab_last_error();
  c.rep = peer.expect<Rep>();
  peer.send(Mad{.header = cm_header(tid), .message = Rtu{.local_comm_id = c.req.local_comm_id,
                                                           .remote_comm_id = c.rep.local_comm_id, .private_data = {}}});
  EXPECT_EQ(Cm::next(d).type, UFAB_CM_EVENT_ESTABLISHED);
  return c;
}

// What a CM answers to repeated and odd messages (IBA 12.9.6, as ib_cm
// does): a REQ again while the application decides draws an MRA; after
// the accept, the REP again; RTU establishes; a DREQ gets a DREP, again
// for a repeat, and also for a connection it never knew; a REQ of another
// CM class version gets REJ 31; LAP gets APR "unsupported".
TEST_F(Cm, DuplicatesAndStrangersGetTheAnswersIbCmGives) {
  using namespace ufab::cm;
  open({}, ufab_cm_opts{}, false);
  RawPeer peer(b_);
  ufab_cm_listener* l = nullptr;
  ASSERT_EQ(ufab_cm_listen(a_.cm, 7174, &l), 0);
  const uint64_t tid = 0xABCD000000000001ull;
  Req req = raw_req(0x11112222, 7174, 0x77);
  peer.send(Mad{.header = cm_header(tid), .message = req});
  ufab_cm_event ev = next(a_);
  ASSERT_EQ(ev.type, UFAB_CM_EVENT_CONNECT_REQUEST);
  EXPECT_EQ(ev.peer_port, 40000);
  EXPECT_EQ(ev.peer_qpn, 0x77u);
  // The REQ again before the application answers: MRA for the REQ.
  peer.send(Mad{.header = cm_header(tid), .message = req});
  Mra mra = peer.expect<Mra>();
  EXPECT_EQ(peer.last_tid(), tid);
  EXPECT_EQ(mra.remote_comm_id, 0x11112222u);
  EXPECT_EQ(mra.message_mraed, MessageCode::kReq);
  EXPECT_GT(mra.service_timeout, 0);
  // No second CONNECT_REQUEST for the same request.
  ufab_cm_event none{};
  EXPECT_EQ(ufab_cm_get_event(a_.cm, &none, 100), -ETIMEDOUT);

  ufab_qp* q = a_.qp();
  std::string hi = "accepted";
  auto p = with_data(hi);
  ASSERT_EQ(ufab_cm_accept(ev.id, q, &p), 0) << ufab_last_error();
  Rep rep = peer.expect<Rep>();
  EXPECT_EQ(peer.last_tid(), tid);
  EXPECT_EQ(rep.remote_comm_id, 0x11112222u);
  EXPECT_EQ(rep.local_comm_id, mra.local_comm_id);
  EXPECT_EQ(rep.local_qpn, ufab_qp_num(q));
  EXPECT_EQ(0, std::memcmp(rep.private_data.data(), hi.data(), hi.size()));
  EXPECT_EQ(query(q).dest_qpn, 0x77u);
  // rdma_cm's PSNs: the REQ's Starting PSN is what the active side
  // expects to receive, so we send from it; we expect the REP's.
  EXPECT_EQ(query(q).sq_psn, 0x123456u);
  EXPECT_EQ(query(q).rq_psn, rep.starting_psn);
  // The REQ again now: the REP again.
  peer.send(Mad{.header = cm_header(tid), .message = req});
  Rep rep2 = peer.expect<Rep>();
  EXPECT_EQ(rep2, rep);

  peer.send(Mad{.header = cm_header(tid),
                .message = Rtu{.local_comm_id = 0x11112222, .remote_comm_id = rep.local_comm_id, .private_data = {}}});
  EXPECT_EQ(next(a_).type, UFAB_CM_EVENT_ESTABLISHED);

  const uint64_t dtid = 0xABCD000000000002ull;
  Dreq dreq{.local_comm_id = 0x11112222, .remote_comm_id = rep.local_comm_id, .remote_qpn_eecn = rep.local_qpn,
            .private_data = {}};
  peer.send(Mad{.header = cm_header(dtid), .message = dreq});
  Drep drep = peer.expect<Drep>();
  EXPECT_EQ(peer.last_tid(), dtid);
  EXPECT_EQ(drep.remote_comm_id, 0x11112222u);
  EXPECT_EQ(next(a_).type, UFAB_CM_EVENT_DISCONNECTED);
  EXPECT_EQ(query(q).state, UFAB_QPS_ERR);
  peer.send(Mad{.header = cm_header(dtid), .message = dreq});  // DREQ again: DREP again, no event
  EXPECT_EQ(peer.expect<Drep>(), drep);
  EXPECT_EQ(ufab_cm_get_event(a_.cm, &none, 100), -ETIMEDOUT);
  // The REQ once more, in timewait: REJ stale connection.
  peer.send(Mad{.header = cm_header(tid), .message = req});
  EXPECT_EQ(peer.expect<Rej>().reason, static_cast<uint16_t>(RejectReason::kStaleConnection));

  // SIDR: a SIDR_REQ sent again after the answer gets the answer again.
  ufab_cm_listener* lu = nullptr;
  ASSERT_EQ(ufab_cm_listen_ud(a_.cm, 7174, &lu), 0);
  SidrReq sidr{.request_id = 0x6666, .partition_key = 0xFFFF, .service_id = rdma_cm_service_id(kRdmaPsUdp, 7174),
               .private_data = *build_rdma_cm_req_private_data(
                   CmaHeader{.ip_version = 4, .port = 40002, .src_addr = cma_ipv4(kIpB), .dst_addr = cma_ipv4(kIpA)},
                   {})};
  peer.send(Mad{.header = cm_header(14), .message = sidr});
  ufab_cm_event ureq = next(a_);
  ASSERT_EQ(ureq.type, UFAB_CM_EVENT_CONNECT_REQUEST);
  peer.send(Mad{.header = cm_header(14), .message = sidr});  // while the application decides: nothing
  EXPECT_FALSE(peer.receive(200).has_value());
  ufab_qp_init_attr uinit{.qp_type = UFAB_QPT_UD, .sq_sig_all = 1, .send_cq = a_.cq, .recv_cq = a_.cq,
                          .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1,
                                  .max_inline_data = 0}};
  ufab_qp* ud = nullptr;
  ASSERT_EQ(ufab_qp_create(a_.pd, &uinit, &ud), 0);
  ASSERT_EQ(ufab_cm_accept(ureq.id, ud, nullptr), 0) << ufab_last_error();
  SidrRep srep = peer.expect<SidrRep>();
  EXPECT_EQ(peer.last_tid(), 14u);
  EXPECT_EQ(srep.request_id, 0x6666u);
  EXPECT_EQ(srep.status, 0);
  EXPECT_EQ(srep.qpn, ufab_qp_num(ud));
  EXPECT_EQ(srep.qkey, UFAB_CM_UDP_QKEY);
  peer.send(Mad{.header = cm_header(14), .message = sidr});
  EXPECT_EQ(peer.expect<SidrRep>(), srep);
  EXPECT_EQ(ufab_cm_get_event(a_.cm, &none, 100), -ETIMEDOUT);
  ufab_qp_destroy(ud);

  // A DREQ for a connection A never had: DREP all the same.
  peer.send(Mad{.header = cm_header(9), .message = Dreq{.local_comm_id = 5, .remote_comm_id = 6,
                                                           .remote_qpn_eecn = 7, .private_data = {}}});
  EXPECT_EQ(peer.expect<Drep>().remote_comm_id, 5u);
  // LAP: APR "unsupported".
  peer.send(Mad{.header = cm_header(10), .message = Lap{.local_comm_id = 8, .remote_comm_id = 9}});
  EXPECT_EQ(peer.expect<Apr>().status, static_cast<uint8_t>(AprStatus::kUnsupported));
  // A REQ in CM class version 1: REJ "invalid class version".
  auto h = cm_header(11);
  h.class_version = 1;
  auto odd = Mad{.header = h, .message = raw_req(0x3333, 7174, 0x78)};
  peer.send(odd);
  Rej rej = peer.expect<Rej>();
  EXPECT_EQ(rej.reason, static_cast<uint16_t>(RejectReason::kInvalidClassVersion));
  EXPECT_EQ(rej.remote_comm_id, 0x3333u);
  // A REQ to a port nobody listens on, and one for another address.
  peer.send(Mad{.header = cm_header(12), .message = raw_req(0x4444, 1, 0x79)});
  EXPECT_EQ(peer.expect<Rej>().reason, static_cast<uint16_t>(RejectReason::kInvalidServiceId));
  Req elsewhere = raw_req(0x5555, 7174, 0x7a);
  elsewhere.private_data = *build_rdma_cm_req_private_data(
      CmaHeader{.ip_version = 4, .port = 40001, .src_addr = cma_ipv4(kIpB), .dst_addr = cma_ipv4(0x0A0000FE)}, {});
  peer.send(Mad{.header = cm_header(13), .message = elsewhere});
  EXPECT_EQ(peer.expect<Rej>().reason, static_cast<uint16_t>(RejectReason::kInvalidServiceId));
  EXPECT_EQ(ufab_cm_get_event(a_.cm, &none, 100), -ETIMEDOUT);
  ufab_qp_destroy(q);
}

bool readable(int fd) {
  pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN) != 0;
}

// Waits up to 5 s for `fd` to become readable.
bool becomes_readable(int fd) {
  pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
  return ::poll(&p, 1, 5000) == 1 && (p.revents & POLLIN) != 0;
}

// A peer that floods REQs fills at most UFAB_CM_MAX_PENDING_REQUESTS
// requests waiting for the application; beyond that each REQ gets REJ "no
// resources" (3) at once, and the room comes back as the application
// answers.
TEST_F(Cm, AFloodOfRequestsIsBoundedNoResourcesBeyond) {
  using namespace ufab::cm;
  open({}, ufab_cm_opts{}, false);
  RawPeer peer(b_);
  ufab_cm_listener* l = nullptr;
  ASSERT_EQ(ufab_cm_listen(a_.cm, 7174, &l), 0);
  std::vector<ufab_cm_id*> ids;
  for (uint32_t i = 0; i < UFAB_CM_MAX_PENDING_REQUESTS; ++i) {
    peer.send(Mad{.header = cm_header(0x100000 + i), .message = raw_req(0x100000 + i, 7174, 0x1000 + i)});
    ufab_cm_event ev = next(a_);
    ASSERT_EQ(ev.type, UFAB_CM_EVENT_CONNECT_REQUEST) << "request " << i;
    ids.push_back(ev.id);
  }
  peer.send(Mad{.header = cm_header(0x200000), .message = raw_req(0x200000, 7174, 0x2000)});
  Rej full = peer.expect<Rej>(1000);
  EXPECT_EQ(full.reason, static_cast<uint16_t>(RejectReason::kNoResources));
  EXPECT_EQ(full.remote_comm_id, 0x200000u);
  EXPECT_EQ(full.message_rejected, MessageCode::kReq);
  EXPECT_EQ(peer.last_tid(), 0x200000u);
  ufab_cm_event none{};
  EXPECT_EQ(ufab_cm_get_event(a_.cm, &none, 100), -ETIMEDOUT);
  // A repeat of a request already waiting is no new request: MRA, as before.
  peer.send(Mad{.header = cm_header(0x100000), .message = raw_req(0x100000, 7174, 0x1000)});
  EXPECT_EQ(peer.expect<Mra>(1000).remote_comm_id, 0x100000u);
  // A SIDR_REQ counts too: SIDR_REP "rejected".
  ufab_cm_listener* lu = nullptr;
  ASSERT_EQ(ufab_cm_listen_ud(a_.cm, 7174, &lu), 0);
  SidrReq sidr{.request_id = 0x300000, .partition_key = 0xFFFF, .service_id = rdma_cm_service_id(kRdmaPsUdp, 7174),
               .private_data = *build_rdma_cm_req_private_data(
                   CmaHeader{.ip_version = 4, .port = 40002, .src_addr = cma_ipv4(kIpB), .dst_addr = cma_ipv4(kIpA)},
                   {})};
  peer.send(Mad{.header = cm_header(0x300000), .message = sidr});
  EXPECT_EQ(peer.expect<SidrRep>(1000).status, static_cast<uint8_t>(SidrStatus::kReject));
  EXPECT_EQ(ufab_cm_get_event(a_.cm, &none, 100), -ETIMEDOUT);
  // The application answers one: room for one more.
  ASSERT_EQ(ufab_cm_reject(ids[0], nullptr, 0), 0) << ufab_last_error();
  EXPECT_EQ(peer.expect<Rej>(1000).reason, static_cast<uint16_t>(RejectReason::kConsumerDefined));
  peer.send(Mad{.header = cm_header(0x200001), .message = raw_req(0x200001, 7174, 0x2001)});
  EXPECT_EQ(next(a_).type, UFAB_CM_EVENT_CONNECT_REQUEST);
  peer.send(Mad{.header = cm_header(0x200002), .message = raw_req(0x200002, 7174, 0x2002)});
  EXPECT_EQ(peer.expect<Rej>(1000).reason, static_cast<uint16_t>(RejectReason::kNoResources));
}

// After ufab_cm_id_destroy the QP is the application's again (cm.h): a DREQ
// from the peer that crosses ours must not touch it, even when the
// application has already reset it for another use.
TEST_F(Cm, ADestroyedIdLetsGoOfItsQp) {
  using namespace ufab::cm;
  open({}, ufab_cm_opts{}, false);
  RawPeer peer(b_);
  ufab_cm_listener* l = nullptr;
  ASSERT_EQ(ufab_cm_listen(a_.cm, 7174, &l), 0);
  ufab_qp* q = a_.qp();
  auto [req, rep, id] = connect_raw(peer, a_, q, 0x51515151, 21, 0x88);
  ASSERT_FALSE(HasFailure());

  ufab_cm_id_destroy(id);
  Dreq ours = peer.expect<Dreq>();
  EXPECT_EQ(ours.local_comm_id, rep.local_comm_id);
  EXPECT_EQ(query(q).state, UFAB_QPS_ERR);
  ufab_qp_attr reset{};
  reset.state = UFAB_QPS_RESET;
  ASSERT_EQ(ufab_qp_modify(q, &reset, UFAB_QP_STATE), 0) << ufab_last_error();
  // The peer's DREQ crosses ours: DREP, and the QP stays as the application left it.
  peer.send(Mad{.header = cm_header(22),
                .message = Dreq{.local_comm_id = req.local_comm_id, .remote_comm_id = rep.local_comm_id,
                                .remote_qpn_eecn = rep.local_qpn, .private_data = {}}});
  EXPECT_EQ(peer.expect<Drep>().remote_comm_id, req.local_comm_id);
  EXPECT_EQ(query(q).state, UFAB_QPS_RESET);
  ufab_cm_event none{};
  EXPECT_EQ(ufab_cm_get_event(a_.cm, &none, 100), -ETIMEDOUT);  // nobody to tell
  ufab_qp_destroy(q);
}

// A DREQ that names another QP than the connection's (IBA 12.6.10) is
// dropped, as ib_cm drops it: no DREP, the connection stays up; the right
// one ends it.
TEST_F(Cm, ADreqForAnotherQpIsDropped) {
  using namespace ufab::cm;
  open({}, ufab_cm_opts{}, false);
  RawPeer peer(b_);
  ufab_cm_listener* l = nullptr;
  ASSERT_EQ(ufab_cm_listen(a_.cm, 7174, &l), 0);
  ufab_qp* q = a_.qp();
  auto [req, rep, id] = connect_raw(peer, a_, q, 0x61616161, 31, 0x89);
  ASSERT_FALSE(HasFailure());
  peer.send(Mad{.header = cm_header(32),
                .message = Dreq{.local_comm_id = req.local_comm_id, .remote_comm_id = rep.local_comm_id,
                                .remote_qpn_eecn = rep.local_qpn ^ 1, .private_data = {}}});
  ufab_cm_event none{};
  EXPECT_EQ(ufab_cm_get_event(a_.cm, &none, 300), -ETIMEDOUT) << "got " << ufab_cm_event_str(none.type);
  EXPECT_EQ(query(q).state, UFAB_QPS_RTS);
  peer.send(Mad{.header = cm_header(33),
                .message = Dreq{.local_comm_id = req.local_comm_id, .remote_comm_id = rep.local_comm_id,
                                .remote_qpn_eecn = rep.local_qpn, .private_data = {}}});
  EXPECT_EQ(peer.expect<Drep>().remote_comm_id, req.local_comm_id);
  EXPECT_EQ(next(a_).type, UFAB_CM_EVENT_DISCONNECTED);
  ufab_cm_id_destroy(id);
  ufab_qp_destroy(q);
  ufab_cm_listener_close(l);
}

// The event fd is readable while events wait, and only then: events that
// go with a destroyed id or a closed listener leave it quiet.
TEST_F(Cm, TheEventFdIsQuietWhenDroppedEventsWereTheLast) {
  open();
  ufab_cm_listener* l = nullptr;
  ASSERT_EQ(ufab_cm_listen(b_.cm, 6100, &l), 0);
  ufab_cm_id* id = nullptr;
  ASSERT_EQ(ufab_cm_connect(a_.cm, a_.qp(), kIpB, 6100, nullptr, &id), 0);
  // B's CONNECT_REQUEST waits; the listener closes: no event left on B.
  ASSERT_TRUE(becomes_readable(ufab_cm_event_fd(b_.cm)));
  ufab_cm_listener_close(l);
  EXPECT_FALSE(readable(ufab_cm_event_fd(b_.cm)));
  ufab_cm_event none{};
  EXPECT_EQ(ufab_cm_get_event(b_.cm, &none, 0), -ETIMEDOUT);
  // A's REJECTED waits; the id is destroyed: no event left on A.
  ASSERT_TRUE(becomes_readable(ufab_cm_event_fd(a_.cm)));
  ufab_cm_id_destroy(id);
  EXPECT_FALSE(readable(ufab_cm_event_fd(a_.cm)));
  EXPECT_EQ(ufab_cm_get_event(a_.cm, &none, 0), -ETIMEDOUT);
}

// One connection's end must not erase what another connection is filed
// under: here A's active connection and a request from the same peer carry
// the same peer communication id; the active one fails (its QP went to
// ERROR under it) and a repeat of the request is still recognized.
TEST_F(Cm, ForgettingAConnectionKeepsAnotherFiledUnderTheSamePeerId) {
  using namespace ufab::cm;
  open({}, ufab_cm_opts{}, false);
  RawPeer peer(b_);
  ufab_cm_listener* l = nullptr;
  ASSERT_EQ(ufab_cm_listen(a_.cm, 7174, &l), 0);
  ufab_qp* qa = a_.qp();
  ufab_cm_id* active = nullptr;
  ASSERT_EQ(ufab_cm_connect(a_.cm, qa, kIpB, 5000, nullptr, &active), 0);
  Req areq = peer.expect<Req>();
  uint64_t atid = peer.last_tid();
  constexpr uint32_t kX = 0x42424242;
  Req req = raw_req(kX, 7174, 0x89);
  peer.send(Mad{.header = cm_header(31), .message = req});
  ufab_cm_event ev = next(a_);
  ASSERT_EQ(ev.type, UFAB_CM_EVENT_CONNECT_REQUEST);
  ufab_qp_attr err{};
  err.state = UFAB_QPS_ERR;
  ASSERT_EQ(ufab_qp_modify(qa, &err, UFAB_QP_STATE), 0);
  Rep rep;
  rep.local_comm_id = kX;
  rep.remote_comm_id = areq.local_comm_id;
  rep.local_qpn = 0x99;
  rep.starting_psn = 0x1234;
  rep.responder_resources = 1;
  rep.initiator_depth = 1;
  rep.rnr_retry_count = 7;
  peer.send(Mad{.header = cm_header(atid), .message = rep});
  EXPECT_EQ(peer.expect<Rej>().reason, static_cast<uint16_t>(RejectReason::kNoQp));
  EXPECT_EQ(next(a_).type, UFAB_CM_EVENT_UNREACHABLE);
  // The request again: still the one waiting (MRA), not a new request.
  peer.send(Mad{.header = cm_header(31), .message = req});
  EXPECT_EQ(peer.expect<Mra>(1000).remote_comm_id, kX);
  ufab_cm_event none{};
  EXPECT_EQ(ufab_cm_get_event(a_.cm, &none, 100), -ETIMEDOUT);
  ufab_cm_id_destroy(active);
  ufab_cm_id_destroy(ev.id);
}

// A REQ sent again after the application rejected it (our REJ was lost)
// gets that REJ again (reason 28 and its private data), not "stale".
TEST_F(Cm, ARepeatedRequestGetsTheSameReject) {
  using namespace ufab::cm;
  open({}, ufab_cm_opts{}, false);
  RawPeer peer(b_);
  ufab_cm_listener* l = nullptr;
  ASSERT_EQ(ufab_cm_listen(a_.cm, 7174, &l), 0);
  Req req = raw_req(0x61616161, 7174, 0x8a);
  peer.send(Mad{.header = cm_header(41), .message = req});
  ufab_cm_event ev = next(a_);
  ASSERT_EQ(ev.type, UFAB_CM_EVENT_CONNECT_REQUEST);
  ASSERT_EQ(ufab_cm_reject(ev.id, "busy", 4), 0);
  Rej first = peer.expect<Rej>();
  EXPECT_EQ(first.reason, static_cast<uint16_t>(RejectReason::kConsumerDefined));
  peer.send(Mad{.header = cm_header(41), .message = req});
  Rej again = peer.expect<Rej>();
  EXPECT_EQ(again.reason, static_cast<uint16_t>(RejectReason::kConsumerDefined));
  EXPECT_EQ(again, first);
  EXPECT_EQ(peer.last_tid(), 41u);
  ufab_cm_event none{};
  EXPECT_EQ(ufab_cm_get_event(a_.cm, &none, 100), -ETIMEDOUT);
  ufab_cm_id_destroy(ev.id);
}

// Private data announced without a pointer is an argument error, not a
// read of address 0.
TEST_F(Cm, PrivateDataLengthWithoutDataIsRefused) {
  open();
  ufab_cm_listener* l = nullptr;
  ASSERT_EQ(ufab_cm_listen(b_.cm, 6200, &l), 0);
  ufab_cm_conn_param bad{};
  bad.private_data_len = 8;
  ufab_cm_id* id = nullptr;
  EXPECT_EQ(ufab_cm_connect(a_.cm, a_.qp(), kIpB, 6200, &bad, &id), -EINVAL);
  EXPECT_NE(std::string(ufab_last_error()).find("private_data"), std::string::npos) << ufab_last_error();
  EXPECT_EQ(ufab_cm_resolve_ud(a_.cm, kIpB, 6200, &bad, &id), -EINVAL);
  ASSERT_EQ(ufab_cm_connect(a_.cm, a_.qp(), kIpB, 6200, nullptr, &id), 0);
  ufab_cm_event req = next(b_);
  ASSERT_EQ(req.type, UFAB_CM_EVENT_CONNECT_REQUEST);
  EXPECT_EQ(ufab_cm_accept(req.id, b_.qp(), &bad), -EINVAL);
  EXPECT_EQ(ufab_cm_accept(req.id, b_.qp(), nullptr), 0) << ufab_last_error();  // still answerable
  EXPECT_EQ(next(a_).type, UFAB_CM_EVENT_ESTABLISHED);
}

// Closing a listener takes its requests the application never saw along
// with every event of theirs: here the active side gave up first (REJ
// timeout), so A held a CONNECT_ERROR behind the CONNECT_REQUEST.
TEST_F(Cm, AClosedListenerTakesAllEventsOfRequestsNeverSeen) {
  using namespace ufab::cm;
  open({}, ufab_cm_opts{}, false);
  RawPeer peer(b_);
  ufab_cm_listener* l = nullptr;
  ASSERT_EQ(ufab_cm_listen(a_.cm, 7174, &l), 0);
  Req req = raw_req(0x71717171, 7174, 0x8b);
  peer.send(Mad{.header = cm_header(51), .message = req});
  ASSERT_TRUE(becomes_readable(ufab_cm_event_fd(a_.cm)));
  std::vector<uint8_t> guid(8, 0x11);
  peer.send(Mad{.header = cm_header(51),
                .message = Rej{.local_comm_id = req.local_comm_id, .remote_comm_id = 0,
                               .message_rejected = MessageCode::kReq,
                               .reason = static_cast<uint16_t>(RejectReason::kTimeout), .ari = guid,
                               .private_data = {}}});
  // A DREQ for nothing: its DREP says A's CM has taken the REJ before it.
  peer.send(Mad{.header = cm_header(52), .message = Dreq{.local_comm_id = 1, .remote_comm_id = 2,
                                                            .remote_qpn_eecn = 3, .private_data = {}}});
  ASSERT_EQ(peer.expect<Drep>().remote_comm_id, 1u);
  ufab_cm_listener_close(l);
  ufab_cm_event ev{};
  int rc = ufab_cm_get_event(a_.cm, &ev, 0);
  EXPECT_EQ(rc, -ETIMEDOUT) << "got " << ufab_cm_event_str(ev.type) << " for an id never handed out";
  EXPECT_FALSE(readable(ufab_cm_event_fd(a_.cm)));
}

// More messages at once than the CM has send slots (64): 150 connects in a
// burst, then closing the CM with 150 connections up. Every REQ and every
// DREQ leaves at once (none waits for a retransmission: the response
// timeout here is ~4.3 s, longer than the test allows), and the other side
// takes the burst of 150 DREQs without loss (256 receive slots).
TEST_F(Cm, MoreMessagesThanSendSlotsAllLeave) {
  open({}, ufab_cm_opts{.size = 0, .response_timeout = 20, .max_retries = 1, .reserved = 0});
  ufab_cm_listener* l = nullptr;
  ASSERT_EQ(ufab_cm_listen(b_.cm, 400, &l), 0);
  constexpr int kN = 150;
  std::vector<ufab_qp*> qps;
  for (int i = 0; i < kN; ++i) qps.push_back(a_.qp());
  for (int i = 0; i < kN; ++i) {
    ufab_cm_id* id = nullptr;
    ASSERT_EQ(ufab_cm_connect(a_.cm, qps[i], kIpB, 400, nullptr, &id), 0) << ufab_last_error();
  }
  EXPECT_EQ(serve(UFAB_CM_EVENT_ESTABLISHED, kN, 3s), std::make_pair(kN, kN));
  ufab_cm_close(a_.cm);  // a DREQ for each
  a_.cm = nullptr;
  int gone = 0;
  auto deadline = std::chrono::steady_clock::now() + 3s;
  while (gone < kN && std::chrono::steady_clock::now() < deadline) {
    ufab_cm_event ev{};
    if (ufab_cm_get_event(b_.cm, &ev, 10) != 0) continue;
    EXPECT_EQ(ev.type, UFAB_CM_EVENT_DISCONNECTED) << ufab_cm_event_str(ev.type);
    ++gone;
  }
  EXPECT_EQ(gone, kN);
}

}  // namespace
