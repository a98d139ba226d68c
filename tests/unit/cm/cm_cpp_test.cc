// The C++ layer over the connection manager (ufab/cm.hpp): owners close
// what they hold, events arrive as values, errors as Results.
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "ufab/cm.hpp"

namespace {

using namespace std::chrono_literals;
namespace rdma = ufab::rdma;
namespace cm = ufab::cm;

TEST(CmCpp, ConnectAcceptTransferDisconnect) {
  std::string link = "cmcpp" + std::to_string(::getpid());
  auto a = rdma::Device::open("swnic:" + link + ":0", {.ip = "10.0.0.1", .params = {{"stale", "reset"}}, .progress_thread = true});
  ASSERT_TRUE(a) << a.error().message();
  auto b = rdma::Device::open("swnic:" + link + ":1", {.ip = "10.0.0.2", .progress_thread = true});
  ASSERT_TRUE(b) << b.error().message();
  auto cma = cm::ConnectionManager::open(**a);
  auto cmb = cm::ConnectionManager::open(**b);
  ASSERT_TRUE(cma && cmb);
  auto again = cm::ConnectionManager::open(**a);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code(), EBUSY);

  auto pda = (*a)->alloc_pd();
  auto pdb = (*b)->alloc_pd();
  auto cqa = (*a)->create_cq(16);
  auto cqb = (*b)->create_cq(16);
  ASSERT_TRUE(pda && pdb && cqa && cqb);
  auto qa = pda->create_qp({.type = rdma::QpType::kRc, .send_cq = cqa->get(), .recv_cq = cqa->get()});
  auto qb = pdb->create_qp({.type = rdma::QpType::kRc, .send_cq = cqb->get(), .recv_cq = cqb->get()});
  ASSERT_TRUE(qa && qb);

  {
    auto l = (*cmb)->listen(7000);
    ASSERT_TRUE(l) << l.error().message();
    EXPECT_FALSE((*cmb)->listen(7000));  // taken
    const uint8_t hi[] = {'h', 'i'};
    auto ida = (*cma)->connect(**qa, (*b)->ip(), 7000, {.private_data = hi});
    ASSERT_TRUE(ida) << ida.error().message();
    auto req = (*cmb)->next_event(5s);
    ASSERT_TRUE(req) << req.error().message();
    ASSERT_EQ(req->type, cm::EventType::kConnectRequest);
    EXPECT_EQ(req->peer_ip, (*a)->ip());
    ASSERT_GE(req->private_data.size(), 2u);
    EXPECT_EQ(0, std::memcmp(req->private_data.data(), hi, 2));
    cm::Id idb = req->take_id();
    ASSERT_TRUE(idb.accept(**qb));
    auto ea = (*cma)->next_event(5s);
    auto eb = (*cmb)->next_event(5s);
    ASSERT_TRUE(ea && eb);
    EXPECT_EQ(ea->type, cm::EventType::kEstablished);
    EXPECT_EQ(eb->type, cm::EventType::kEstablished);
    EXPECT_EQ(ea->peer_qpn, (*qb)->qp_num());

    std::vector<uint8_t> buf(64, 0x33), got(64, 0);
    auto mra = pda->register_mr(buf.data(), buf.size(), rdma::kLocalWrite);
    auto mrb = pdb->register_mr(got.data(), got.size(), rdma::kLocalWrite);
    ASSERT_TRUE(mra && mrb);
    rdma::Sge r = mrb->sge(0, 64), s = mra->sge(0, 64);
    ASSERT_TRUE((*qb)->post_recv({.wr_id = 1, .sgl = {&r, 1}}));
    ASSERT_TRUE((*qa)->post_send({.wr_id = 2, .opcode = rdma::WrOpcode::kSend, .flags = rdma::kSendSignaled, .sgl = {&s, 1}}));
    rdma::WorkCompletion wc[1];
    auto n = (*cqb)->wait(wc, 5000ms);
    ASSERT_TRUE(n && *n == 1);
    EXPECT_EQ(wc[0].status, rdma::WcStatus::kSuccess);
    EXPECT_EQ(got[63], 0x33);

    // The active id let go while connected: a DREQ, heard on B.
    cm::Id active = std::move(*ida);
    active = cm::Id();
    auto gone = (*cmb)->next_event(5s);
    ASSERT_TRUE(gone) << gone.error().message();
    EXPECT_EQ(gone->type, cm::EventType::kDisconnected);
    auto none = (*cma)->next_event(100ms);
    ASSERT_FALSE(none);
    EXPECT_EQ(none.error().code(), ETIMEDOUT);

    // A reject with more private data than a REJ carries is refused whole,
    // not cut to its length modulo 256 (300 bytes would have sent 44).
    auto qa2 = pda->create_qp({.type = rdma::QpType::kRc, .send_cq = cqa->get(), .recv_cq = cqa->get()});
    ASSERT_TRUE(qa2);
    auto id2 = (*cma)->connect(**qa2, (*b)->ip(), 7000);
    ASSERT_TRUE(id2) << id2.error().message();
    auto req2 = (*cmb)->next_event(5s);
    ASSERT_TRUE(req2 && req2->type == cm::EventType::kConnectRequest);
    cm::Id idb2 = req2->take_id();
    std::vector<uint8_t> big(300, 'x');
    auto refused = idb2.reject(big);
    ASSERT_FALSE(refused);
    EXPECT_EQ(refused.error().code(), EMSGSIZE);
    ASSERT_TRUE(idb2.reject(std::span<const uint8_t>(big.data(), 2)));
    auto rej = (*cma)->next_event(5s);
    ASSERT_TRUE(rej && rej->type == cm::EventType::kRejected);
  }
}

}  // namespace
