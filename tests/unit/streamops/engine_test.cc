// The stream-ordered operations engine against a fake stream (a CPU
// thread) and a fake QP (records posts, completes on command): triggering,
// batches, ordering, completion words, errors, teardown with armed
// doorbells, slot reuse. No GPU, no provider.
#include "core/streamops/engine.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "tests/unit/streamops/fake_stream.h"

namespace ufab::streamops {
namespace {

using namespace std::chrono_literals;

// A QP that takes posts and completes them when told (or at once).
struct FakeQp {
  struct Posted {
    std::vector<ufab_send_wr> wrs;
    std::vector<uint64_t> sge_addrs;
    ufab_rdma_notify notify{};
  };
  std::mutex mu;
  std::vector<Posted> posts;
  bool auto_complete = false;
  int refuse = 0;  // negative errno for the next post
  std::atomic<int> progress_calls{0};

  Target target() {
    return {.post_send = [this](const ufab_send_wr* w, uint32_t n, uint32_t* bad, const ufab_rdma_notify* nt) {
              std::lock_guard lock(mu);
              if (refuse != 0) {
                *bad = n - 1;
                int r = refuse;
                refuse = 0;
                return r;
              }
              Posted p;
              p.wrs.assign(w, w + n);
              for (uint32_t i = 0; i < n; ++i) {
                for (uint32_t k = 0; k < w[i].num_sge; ++k) p.sge_addrs.push_back(w[i].sg_list[k].addr);
              }
              p.notify = *nt;
              posts.push_back(p);
              if (auto_complete) fire(posts.back().notify, UFAB_WC_SUCCESS);
              return 0;
            },
            .post_recv = [this](const ufab_recv_wr*, uint32_t n, uint32_t*, const ufab_rdma_notify* nt) {
              std::lock_guard lock(mu);
              Posted p;
              p.wrs.resize(n);
              p.notify = *nt;
              posts.push_back(p);
              return 0;
            },
            .progress = [this] { ++progress_calls; },
            .last_error = [] { return std::string("the fake QP refused it"); }};
  }
  static void fire(const ufab_rdma_notify& n, uint32_t status) {
    std::atomic_ref<uint32_t>(*n.status).store(status, std::memory_order_relaxed);
    std::atomic_ref<uint32_t>(*n.word).store(n.value, std::memory_order_release);
  }
  void complete(size_t k, uint32_t status = UFAB_WC_SUCCESS) {
    std::lock_guard lock(mu);
    fire(posts.at(k).notify, status);
  }
  size_t count() {
    std::lock_guard lock(mu);
    return posts.size();
  }
};

WordAllocator plain_memory() {
  return [](size_t bytes) -> Result<void*> {
    void* p = std::aligned_alloc(128, bytes);  // kept: the engine never gives words back
    if (p == nullptr) return fail(ENOMEM, "no memory");
    return p;
  };
}

bool eventually(const std::function<bool()>& f, std::chrono::milliseconds limit = 5s) {
  auto until = std::chrono::steady_clock::now() + limit;
  while (!f()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(50us);
  }
  return true;
}

ufab_send_wr write_wr(uint64_t id, ufab_sge* sge) {
  ufab_send_wr w{};
  w.wr_id = id;
  w.opcode = UFAB_WR_RDMA_WRITE;
  w.sg_list = sge;
  w.num_sge = 1;
  w.send_flags = UFAB_SEND_SIGNALED;
  return w;
}

struct EngineTest : ::testing::Test {
  void SetUp() override {
    auto e = Engine::create(plain_memory());
    ASSERT_TRUE(e) << e.error().message();
    engine = std::move(*e);
    engine->attach(&qp, qp.target());
  }
  FakeQp qp;
  std::unique_ptr<Engine> engine;
};

TEST_F(EngineTest, PostedOnlyWhenTheStreamGetsThereThenTheStreamWaitsForTheCompletion) {
  FakeStream s;
  s.gate();  // a long kernel
  ufab_sge sge{.addr = 0x1000, .length = 8, .lkey = 1};
  ufab_send_wr wr = write_wr(7, &sge);
  auto op = engine->post_send(&qp, &wr, 1, s);
  ASSERT_TRUE(op) << op.error().message();
  sge.addr = 0xdead;  // copied at enqueue
  ASSERT_TRUE(engine->wait(*op, s));
  std::atomic<bool> after{false};
  s.host([&] { after = true; });
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(qp.count(), 0u) << "posted before the stream reached it";
  EXPECT_EQ(engine->query(*op).state, OpInfo::kArmed);
  s.open();
  ASSERT_TRUE(eventually([&] { return qp.count() == 1; }));
  EXPECT_EQ(engine->query(*op).state, OpInfo::kPosted);
  EXPECT_EQ(qp.posts[0].wrs[0].wr_id, 7u);
  EXPECT_EQ(qp.posts[0].sge_addrs[0], 0x1000u);
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(after) << "the stream went past the wait before the completion";
  EXPECT_GT(qp.progress_calls.load(), 0) << "the watcher progresses the device while completions are awaited";
  qp.complete(0);
  ASSERT_TRUE(s.synchronize());
  EXPECT_TRUE(after);
  EXPECT_EQ(s.stuck(), "");
  auto info = engine->query(*op);
  EXPECT_EQ(info.state, OpInfo::kDone);
  EXPECT_EQ(info.wc_status, uint32_t{UFAB_WC_SUCCESS});
  EXPECT_EQ(info.post_error, 0);
  engine->release(*op);
  ASSERT_TRUE(eventually([&] { return engine->counts().slots_used == 0; }));
}

TEST_F(EngineTest, ABatchIsOnePostWithTheNotifyOnItsLastWorkRequest) {
  FakeStream s;
  ufab_sge sges[3] = {{.addr = 1, .length = 1, .lkey = 1}, {.addr = 2, .length = 1, .lkey = 1},
                      {.addr = 3, .length = 1, .lkey = 1}};
  ufab_send_wr wrs[3] = {write_wr(1, &sges[0]), write_wr(2, &sges[1]), write_wr(3, &sges[2])};
  wrs[1].opcode = UFAB_WR_SEND_WITH_IMM;
  wrs[2].opcode = UFAB_WR_RDMA_READ;
  auto op = engine->post_send(&qp, wrs, 3, s);
  ASSERT_TRUE(op) << op.error().message();
  ASSERT_TRUE(eventually([&] { return qp.count() == 1; }));
  ASSERT_EQ(qp.posts[0].wrs.size(), 3u);
  EXPECT_EQ(qp.posts[0].sge_addrs, (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(qp.posts[0].wrs[2].wr_id, 3u);
  qp.complete(0);
  ASSERT_TRUE(eventually([&] { return engine->query(*op).state == OpInfo::kDone; }));
  engine->release(*op);
}

TEST_F(EngineTest, OneStreamPostsInStreamOrderAndAWaitHoldsBackWhatFollowsIt) {
  FakeStream s;
  ufab_sge sge{.addr = 1, .length = 1, .lkey = 1};
  ufab_send_wr a = write_wr(1, &sge), b = write_wr(2, &sge), c = write_wr(3, &sge);
  auto op_a = engine->post_send(&qp, &a, 1, s);
  auto op_b = engine->post_send(&qp, &b, 1, s);
  ASSERT_TRUE(op_a && op_b);
  ASSERT_TRUE(engine->wait(*op_b, s));
  auto op_c = engine->post_send(&qp, &c, 1, s);  // behind the wait
  ASSERT_TRUE(op_c);
  ASSERT_TRUE(eventually([&] { return qp.count() == 2; }));
  EXPECT_EQ(qp.posts[0].wrs[0].wr_id, 1u);
  EXPECT_EQ(qp.posts[1].wrs[0].wr_id, 2u);
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(qp.count(), 2u) << "c was posted while the stream waited for b";
  qp.complete(0);
  std::this_thread::sleep_for(10ms);
  EXPECT_EQ(qp.count(), 2u) << "a's completion does not release a wait on b";
  qp.complete(1);
  ASSERT_TRUE(eventually([&] { return qp.count() == 3; }));
  EXPECT_EQ(qp.posts[2].wrs[0].wr_id, 3u);
  qp.complete(2);
  ASSERT_TRUE(s.synchronize());
  for (auto* op : {*op_a, *op_b, *op_c}) engine->release(op);
}

TEST_F(EngineTest, TwoStreamsOnOneQpPostInTheOrderTheirDoorbellsFire) {
  FakeStream s1, s2;
  s1.gate();  // s1's op is enqueued first but reached later
  ufab_sge sge{.addr = 1, .length = 1, .lkey = 1};
  ufab_send_wr a = write_wr(1, &sge), b = write_wr(2, &sge);
  auto op_a = engine->post_send(&qp, &a, 1, s1);
  auto op_b = engine->post_send(&qp, &b, 1, s2);
  ASSERT_TRUE(op_a && op_b);
  ASSERT_TRUE(eventually([&] { return qp.count() == 1; }));
  EXPECT_EQ(qp.posts[0].wrs[0].wr_id, 2u) << "s2's doorbell fired first";
  s1.open();
  ASSERT_TRUE(eventually([&] { return qp.count() == 2; }));
  EXPECT_EQ(qp.posts[1].wrs[0].wr_id, 1u);
  qp.complete(0);
  qp.complete(1);
  ASSERT_TRUE(s1.synchronize() && s2.synchronize());
  engine->release(*op_a);
  engine->release(*op_b);
}

TEST_F(EngineTest, ErrorsAtEnqueueComeBackNowAndEnqueueNothing) {
  FakeStream s;
  ufab_sge sge{.addr = 1, .length = 1, .lkey = 1};
  ufab_send_wr wr = write_wr(1, &sge);
  auto r = engine->post_send(&qp, &wr, 0, s);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), EINVAL);
  ufab_send_wr atomic = wr;
  atomic.opcode = UFAB_WR_ATOMIC_FETCH_AND_ADD;
  ufab_send_wr two[2] = {wr, atomic};
  r = engine->post_send(&qp, two, 2, s);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("work request 1"), std::string::npos) << r.error().message();
  EXPECT_NE(r.error().message().find("RDMA_READ"), std::string::npos) << r.error().message();
  ufab_send_wr no_list = wr;
  no_list.sg_list = nullptr;
  EXPECT_FALSE(engine->post_send(&qp, &no_list, 1, s));
  ufab_send_wr commit = wr;
  commit.send_flags |= UFAB_SEND_COMMIT;
  EXPECT_FALSE(engine->post_send(&qp, &commit, 1, s));
  int other = 0;
  r = engine->post_send(&other, &wr, 1, s);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ENOENT);
  s.refuse(true);
  r = engine->post_send(&qp, &wr, 1, s);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("fake stream refuses"), std::string::npos) << r.error().message();
  auto c = engine->counts();
  EXPECT_EQ(c.armed, 0u);
  EXPECT_EQ(c.slots_used, 0u);
}

TEST_F(EngineTest, APostRefusedWhenTheStreamGetsThereStillReleasesTheStream) {
  FakeStream s;
  ufab_sge sge{.addr = 1, .length = 1, .lkey = 1};
  ufab_send_wr wr = write_wr(1, &sge);
  qp.refuse = -EINVAL;
  auto op = engine->post_send(&qp, &wr, 1, s);
  ASSERT_TRUE(op);
  ASSERT_TRUE(engine->wait(*op, s));
  ASSERT_TRUE(s.synchronize());
  EXPECT_EQ(s.stuck(), "");
  auto info = engine->query(*op);
  EXPECT_EQ(info.state, OpInfo::kDone);
  EXPECT_EQ(info.post_error, -EINVAL);
  EXPECT_EQ(info.wc_status, uint32_t{UFAB_WC_GENERAL_ERR});
  EXPECT_NE(info.error.find("the fake QP refused it"), std::string::npos) << info.error;
  engine->release(*op);
}

TEST_F(EngineTest, AFailedCompletionReleasesTheStreamWithItsStatus) {
  FakeStream s;
  ufab_sge sge{.addr = 1, .length = 1, .lkey = 1};
  ufab_send_wr wr = write_wr(1, &sge);
  auto op = engine->post_send(&qp, &wr, 1, s);
  ASSERT_TRUE(op);
  ASSERT_TRUE(engine->wait(*op, s));
  ASSERT_TRUE(eventually([&] { return qp.count() == 1; }));
  qp.complete(0, UFAB_WC_REM_ACCESS_ERR);
  ASSERT_TRUE(s.synchronize());
  EXPECT_EQ(engine->query(*op).wc_status, uint32_t{UFAB_WC_REM_ACCESS_ERR});
  engine->release(*op);
}

TEST_F(EngineTest, TeardownWithArmedDoorbellsReleasesWaitersAndQuarantinesTheSlots) {
  FakeStream s;
  s.gate();
  ufab_sge sge{.addr = 1, .length = 1, .lkey = 1};
  ufab_send_wr a = write_wr(1, &sge), b = write_wr(2, &sge);
  auto op_a = engine->post_send(&qp, &a, 1, s);
  auto op_b = engine->post_send(&qp, &b, 1, s);
  ASSERT_TRUE(op_a && op_b);
  FakeStream other;  // another stream waits on b
  ASSERT_TRUE(engine->wait(*op_b, other));
  engine->release(*op_a);  // the application is done with a's handle
  engine->cancel(&qp);
  engine->finish(&qp);
  ASSERT_TRUE(other.synchronize()) << "a waiter on a cancelled op was left waiting";
  auto info = engine->query(*op_b);
  EXPECT_EQ(info.state, OpInfo::kDone);
  EXPECT_EQ(info.post_error, -ECANCELED);
  EXPECT_EQ(info.wc_status, uint32_t{UFAB_WC_WR_FLUSH_ERR});
  auto c = engine->counts();
  EXPECT_EQ(c.armed, 0u);
  EXPECT_EQ(c.quarantined, 2u) << "the stream still holds the doorbell writes";
  EXPECT_EQ(c.slots_used, 2u);
  s.open();  // the stream now writes the doorbells: nothing is posted
  ASSERT_TRUE(s.synchronize());
  ASSERT_TRUE(eventually([&] { return engine->counts().quarantined == 0; }));
  EXPECT_EQ(qp.count(), 0u);
  engine->release(*op_b);
  EXPECT_EQ(engine->counts().slots_used, 0u);
  ufab_send_wr wr = write_wr(3, &sge);
  EXPECT_FALSE(engine->post_send(&qp, &wr, 1, s)) << "posting on a destroyed QP";
}

TEST_F(EngineTest, InFlightOpsOfADestroyedQpAreFlushed) {
  FakeStream s;
  ufab_sge sge{.addr = 1, .length = 1, .lkey = 1};
  ufab_send_wr wr = write_wr(1, &sge);
  auto op = engine->post_send(&qp, &wr, 1, s);
  ASSERT_TRUE(op);
  ASSERT_TRUE(eventually([&] { return qp.count() == 1; }));
  ASSERT_TRUE(engine->wait(*op, s));
  engine->cancel(&qp);
  engine->finish(&qp);  // the provider dropped the request without a word
  ASSERT_TRUE(s.synchronize());
  EXPECT_EQ(s.stuck(), "");
  EXPECT_EQ(engine->query(*op).wc_status, uint32_t{UFAB_WC_WR_FLUSH_ERR});
  engine->release(*op);
  EXPECT_EQ(engine->counts().slots_used, 0u);
}

TEST_F(EngineTest, SlotsAreReusedAndALateWaitOnAnEarlierUseIsSatisfied) {
  qp.auto_complete = true;
  FakeStream s;
  ufab_sge sge{.addr = 1, .length = 1, .lkey = 1};
  Op* first = nullptr;
  for (int i = 0; i < 3000; ++i) {
    ufab_send_wr wr = write_wr(static_cast<uint64_t>(i), &sge);
    auto op = engine->post_send(&qp, &wr, 1, s);
    ASSERT_TRUE(op) << op.error().message();
    ASSERT_TRUE(engine->wait(*op, s));
    if (i == 0) {
      first = *op;
    } else {
      engine->release(*op);
    }
    // Ops in flight at once each hold a slot: keep them under one chunk.
    if (i % 500 == 499) {
      ASSERT_TRUE(s.synchronize());
    }
  }
  ASSERT_TRUE(s.synchronize());
  EXPECT_EQ(s.stuck(), "");
  EXPECT_EQ(qp.count(), 3000u);
  for (size_t i = 0; i < 3000; ++i) ASSERT_EQ(qp.posts[i].wrs[0].wr_id, i) << "out of order";
  auto c = engine->counts();
  EXPECT_EQ(c.slots_total, 1024u) << "slots are reused";
  ASSERT_TRUE(eventually([&] { return engine->counts().slots_used == 1; })) << "only the first op's handle is held";
  ASSERT_TRUE(engine->wait(first, s));
  ASSERT_TRUE(s.synchronize());
  EXPECT_EQ(s.stuck(), "");
  engine->release(first);
}

TEST_F(EngineTest, ReceivesArePostedAtOnceAndCompleteTheirWord) {
  FakeStream s;
  ufab_sge sge{.addr = 1, .length = 64, .lkey = 1};
  ufab_recv_wr rw{.wr_id = 9, .sg_list = &sge, .num_sge = 1, .reserved = 0};
  auto op = engine->post_recv(&qp, &rw, 1);
  ASSERT_TRUE(op);
  EXPECT_EQ(qp.count(), 1u);
  ASSERT_TRUE(engine->wait(*op, s));
  std::atomic<bool> after{false};
  s.host([&] { after = true; });
  std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(after);
  qp.complete(0);
  ASSERT_TRUE(s.synchronize());
  EXPECT_TRUE(after);
  engine->release(*op);
}

}  // namespace
}  // namespace ufab::streamops
