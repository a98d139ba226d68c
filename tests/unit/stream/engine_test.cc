// The stream engine (core/stream/engine.h, <ufab/stream.h>) with a test
// double of CUDA's streams: a FakeStream is a thread that runs what is
// enqueued on it in order (host functions standing for kernels, the
// doorbell writes, the waits on completion words), as a CUDA stream runs
// kernels and stream memory operations. Two soft-RoCE ports of one swnic
// link, each with a progress thread; the engine owns side A's CQ.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include "core/stream/engine.h"
#include "ufab/rdma.hpp"

namespace ufab::stream {
namespace {

using namespace std::chrono_literals;

class FakeStream {
 public:
  FakeStream() : thread_([this] { run(); }) {}
  ~FakeStream() {
    {
      std::lock_guard l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void launch(std::function<void()> f) {
    {
      std::lock_guard l(mu_);
      ops_.push_back(std::move(f));
    }
    cv_.notify_all();
  }
  // Blocks until everything enqueued so far has run (cudaStreamSynchronize).
  bool synchronize(std::chrono::milliseconds limit = 10s) {
    std::promise<void> p;
    auto f = p.get_future();
    launch([&p] { p.set_value(); });
    return f.wait_for(limit) == std::future_status::ready;
  }
  std::atomic<bool> wait_timed_out{false};

 private:
  void run() {
    for (;;) {
      std::function<void()> f;
      {
        std::unique_lock l(mu_);
        cv_.wait(l, [&] { return stop_ || !ops_.empty(); });
        if (ops_.empty()) return;
        f = std::move(ops_.front());
        ops_.pop_front();
      }
      f();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> ops_;
  bool stop_ = false;
  std::thread thread_;
};

class FakeStreams final : public Streams {
 public:
  Result<uint32_t*> allocate_words(size_t n) override {
    words_.assign(n, 0);
    return words_.data();
  }
  Status write(void* stream, uint32_t* word, uint32_t value) override {
    static_cast<FakeStream*>(stream)->launch(
        [word, value] { std::atomic_ref<uint32_t>(*word).store(value, std::memory_order_release); });
    return {};
  }
  Status wait_geq(void* stream, uint32_t* word, uint32_t value) override {
    auto* s = static_cast<FakeStream*>(stream);
    s->launch([s, word, value] {
      auto deadline = std::chrono::steady_clock::now() + 10s;
      while (std::atomic_ref<uint32_t>(*word).load(std::memory_order_acquire) < value) {
        if (std::chrono::steady_clock::now() > deadline) {
          s->wait_timed_out = true;
          return;
        }
        std::this_thread::yield();
      }
    });
    return {};
  }

 private:
  std::vector<uint32_t> words_;
};

struct Side {
  std::unique_ptr<rdma::Device> dev;
  std::optional<rdma::ProtectionDomain> pd;
  std::unique_ptr<rdma::CompletionQueue> cq;
  std::unique_ptr<rdma::QueuePair> qp;
  std::vector<uint8_t> buf;
  std::optional<rdma::MemoryRegion> mr;
};

class StreamEngine : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string name = "se" + std::to_string(::getpid());
    open(a_, "swnic:" + name + ":0", "10.0.0.1", {{"stale", "reset"}});
    open(b_, "swnic:" + name + ":1", "10.0.0.2", {});
    ASSERT_TRUE(a_.qp->connect(b_.qp->local()));
    ASSERT_TRUE(b_.qp->connect(a_.qp->local()));
    make_engine(16);
  }
  void make_engine(uint32_t slots) {
    engine_.reset();
    auto e = Engine::create(a_.cq->get_c(), std::make_unique<FakeStreams>(), slots);
    ASSERT_TRUE(e) << e.error().message();
    engine_ = std::move(*e);
  }
  void open(Side& s, const std::string& spec, const std::string& ip, std::map<std::string, std::string> params) {
    auto dev = rdma::Device::open(spec, {.ip = ip, .params = params, .progress_thread = true});
    ASSERT_TRUE(dev) << dev.error().message();
    s.dev = std::move(*dev);
    s.pd.emplace(std::move(*s.dev->alloc_pd()));
    s.cq = std::move(*s.dev->create_cq(256));
    auto qp = s.pd->create_qp({.type = rdma::QpType::kRc, .send_cq = s.cq.get(), .recv_cq = s.cq.get()});
    ASSERT_TRUE(qp) << qp.error().message();
    s.qp = std::move(*qp);
    s.buf.assign(1 << 20, 0);
    s.mr.emplace(std::move(*s.pd->register_mr(s.buf.data(), s.buf.size(), rdma::kLocalWrite | rdma::kRemoteAccess)));
  }
  ufab_sge sge(Side& s, uint64_t offset, uint32_t len) {
    return {.addr = reinterpret_cast<uintptr_t>(s.buf.data()) + offset, .length = len, .lkey = s.mr->lkey()};
  }
  ufab_send_wr write_wr(uint64_t id, const ufab_sge* g, uint64_t remote_offset) {
    ufab_send_wr w{};
    w.wr_id = id;
    w.sg_list = g;
    w.num_sge = 1;
    w.opcode = UFAB_WR_RDMA_WRITE;
    w.remote_addr = reinterpret_cast<uintptr_t>(b_.buf.data()) + remote_offset;
    w.rkey = b_.mr->rkey();
    return w;
  }
  // The engine's completions until `n` came (bounded).
  std::vector<ufab_wc> engine_completions(size_t n) {
    std::vector<ufab_wc> got;
    auto deadline = std::chrono::steady_clock::now() + 5s;
    while (got.size() < n && std::chrono::steady_clock::now() < deadline) {
      ufab_wc wc[8];
      size_t k = engine_->poll(wc);
      got.insert(got.end(), wc, wc + k);
      if (k == 0) std::this_thread::sleep_for(100us);
    }
    return got;
  }
  int status(uint64_t t) {
    auto s = engine_->status(t);
    return s ? *s : -s.error().code();
  }
  bool eventually_done(uint64_t t) {
    auto deadline = std::chrono::steady_clock::now() + 5s;
    while (status(t) == 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(100us);
    return status(t) == 1;
  }

  Side a_, b_;
  std::unique_ptr<Engine> engine_;
};

// A "kernel" fills the buffer, the stream rings the WRITE's doorbell, waits
// for its completion, and a later "kernel" sees the bytes at the peer.
TEST_F(StreamEngine, KernelThenWriteThenWaitThenKernel) {
  FakeStream s;
  const uint32_t len = 100000;
  s.launch([&] { for (uint32_t i = 0; i < len; ++i) a_.buf[i] = uint8_t(i * 13 + 5); });
  ufab_sge g = sge(a_, 0, len);
  ufab_send_wr w = write_wr(77, &g, 4096);
  auto t = engine_->post_send(a_.qp->c(), {&w, 1}, &s);
  ASSERT_TRUE(t) << t.error().message();
  ASSERT_TRUE(engine_->wait(*t, &s));
  std::atomic<bool> seen{false};
  s.launch([&] { seen = std::memcmp(a_.buf.data(), b_.buf.data() + 4096, len) == 0; });
  ASSERT_TRUE(s.synchronize());
  EXPECT_FALSE(s.wait_timed_out);
  EXPECT_TRUE(seen) << "the kernel after the wait did not see the WRITE's bytes at the peer";
  EXPECT_EQ(status(*t), 1);
  auto wcs = engine_completions(1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].wr_id, 77u);  // the application's wr_id, made signaled
  EXPECT_EQ(wcs[0].status, UFAB_WC_SUCCESS);
}

// Nothing is posted before the stream gets to the doorbell.
TEST_F(StreamEngine, NothingMovesBeforeTheStreamGetsThere) {
  FakeStream s;
  std::promise<void> gate;
  auto opened = gate.get_future().share();
  s.launch([opened] { opened.wait_for(10s); });  // a long kernel
  std::memset(a_.buf.data(), 0x3c, 512);
  ufab_sge g = sge(a_, 0, 512);
  ufab_send_wr w = write_wr(1, &g, 0);
  auto t = engine_->post_send(a_.qp->c(), {&w, 1}, &s);
  ASSERT_TRUE(t);
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(status(*t), 0);
  EXPECT_EQ(b_.buf[0], 0) << "the WRITE went before the stream rang its doorbell";
  gate.set_value();
  EXPECT_TRUE(eventually_done(*t));
  EXPECT_EQ(b_.buf[511], 0x3c);
}

// A batch: one doorbell, three work requests in order, the ticket done
// with the last; only the signaled ones (and the last) complete.
TEST_F(StreamEngine, ABatchGoesOnOneDoorbell) {
  FakeStream s;
  for (int i = 0; i < 3000; ++i) a_.buf[i] = uint8_t(i * 3 + 1);
  ufab_sge g[3] = {sge(a_, 0, 1000), sge(a_, 1000, 1000), sge(a_, 2000, 1000)};
  ufab_send_wr w[3] = {write_wr(10, &g[0], 0), write_wr(11, &g[1], 1000), write_wr(12, &g[2], 2000)};
  w[0].send_flags = UFAB_SEND_SIGNALED;
  auto t = engine_->post_send(a_.qp->c(), w, &s);
  ASSERT_TRUE(t);
  ASSERT_TRUE(engine_->wait(*t, &s));
  ASSERT_TRUE(s.synchronize());
  EXPECT_FALSE(s.wait_timed_out);
  EXPECT_EQ(status(*t), 1);
  EXPECT_EQ(std::memcmp(a_.buf.data(), b_.buf.data(), 3000), 0);
  auto wcs = engine_completions(2);
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_EQ(wcs[0].wr_id, 10u);
  EXPECT_EQ(wcs[1].wr_id, 12u);
}

// A stream waits for a receive: the peer's SEND lands, then the stream goes on.
TEST_F(StreamEngine, AStreamWaitsForAReceive) {
  FakeStream s;
  ufab_sge rg = sge(a_, 8192, 4096);
  ufab_recv_wr r{.wr_id = 55, .sg_list = &rg, .num_sge = 1, .reserved = 0};
  auto t = engine_->post_recv(a_.qp->c(), r);
  ASSERT_TRUE(t) << t.error().message();
  ASSERT_TRUE(engine_->wait(*t, &s));
  std::atomic<int> seen{-1};
  s.launch([&] { seen = a_.buf[8192 + 99]; });
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(seen.load(), -1) << "the stream went past the wait before the SEND came";
  for (int i = 0; i < 100; ++i) b_.buf[i] = uint8_t(200 + i % 50);
  rdma::Sge sg = b_.mr->sge(0, 100);
  ASSERT_TRUE(b_.qp->post_send({.wr_id = 1, .opcode = rdma::WrOpcode::kSend, .flags = rdma::kSendSignaled, .sgl = {&sg, 1}}));
  ASSERT_TRUE(s.synchronize());
  EXPECT_EQ(seen.load(), 200 + 99 % 50);
  auto wcs = engine_completions(1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].wr_id, 55u);
  EXPECT_EQ(wcs[0].byte_len, 100u);
}

// Device-initiated: nothing goes until "a kernel" writes the doorbell
// word the engine named; then the WRITE lands, and the ticket's completion
// word (ufab_stream_wait_word's) reaches its value.
TEST_F(StreamEngine, AKernelRingsTheDoorbellAndWaitsOnTheWord) {
  std::memset(a_.buf.data(), 0x6b, 3000);
  ufab_sge g = sge(a_, 0, 3000);
  ufab_send_wr w = write_wr(21, &g, 8192);
  Engine::Word db{};
  auto t = engine_->post_send_device(a_.qp->c(), {&w, 1}, &db);
  ASSERT_TRUE(t) << t.error().message();
  auto done = engine_->wait_word(*t);
  ASSERT_TRUE(done) << done.error().message();
  auto* doorbell = reinterpret_cast<uint32_t*>(db.device_address);  // no GPU: host addresses
  auto* word = reinterpret_cast<uint32_t*>(done->device_address);
  EXPECT_NE(doorbell, word);
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(status(*t), 0);
  EXPECT_EQ(b_.buf[8192], 0) << "the WRITE went before its doorbell rang";
  EXPECT_NE(std::atomic_ref<uint32_t>(*word).load(), done->value);
  std::atomic_ref<uint32_t>(*doorbell).store(db.value, std::memory_order_release);  // the kernel rings
  auto deadline = std::chrono::steady_clock::now() + 5s;
  while (int32_t(std::atomic_ref<uint32_t>(*word).load(std::memory_order_acquire) - done->value) < 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(100us);  // the kernel waits
  }
  EXPECT_EQ(std::atomic_ref<uint32_t>(*word).load(), done->value) << "the completion word never reached its value";
  EXPECT_EQ(status(*t), 1);
  EXPECT_EQ(b_.buf[8192 + 2999], 0x6b);
  auto wcs = engine_completions(1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].wr_id, 21u);
}

// A QP's device-rung tickets go in ticket order: the second's doorbell
// ringing first posts nothing until the first rings; a stream's tickets on
// the same QP are not held behind them.
TEST_F(StreamEngine, DeviceTicketsOfAQpGoInTicketOrder) {
  a_.buf[0] = 1;
  a_.buf[1] = 2;
  a_.buf[2] = 3;
  ufab_sge g1 = sge(a_, 0, 1), g2 = sge(a_, 1, 1), g3 = sge(a_, 2, 1);
  ufab_send_wr w1 = write_wr(1, &g1, 100), w2 = write_wr(2, &g2, 101), w3 = write_wr(3, &g3, 102);
  Engine::Word d1{}, d2{};
  auto t1 = engine_->post_send_device(a_.qp->c(), {&w1, 1}, &d1);
  auto t2 = engine_->post_send_device(a_.qp->c(), {&w2, 1}, &d2);
  ASSERT_TRUE(t1 && t2);
  std::atomic_ref<uint32_t>(*reinterpret_cast<uint32_t*>(d2.device_address)).store(d2.value);
  FakeStream s;
  auto t3 = engine_->post_send(a_.qp->c(), {&w3, 1}, &s);
  ASSERT_TRUE(t3);
  EXPECT_TRUE(eventually_done(*t3)) << "a stream's ticket waited behind device-rung ones";
  EXPECT_EQ(status(*t2), 0) << "the second device ticket went before the first rang";
  EXPECT_EQ(b_.buf[101], 0);
  std::atomic_ref<uint32_t>(*reinterpret_cast<uint32_t*>(d1.device_address)).store(d1.value);
  EXPECT_TRUE(eventually_done(*t1));
  EXPECT_TRUE(eventually_done(*t2));
  EXPECT_EQ(b_.buf[100], 1);
  EXPECT_EQ(b_.buf[101], 2);
  // A ticket never given, or a NULL QP, is refused with words.
  auto bad = engine_->wait_word(*t3 + 1000);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code(), EINVAL);
  EXPECT_NE(bad.error().message().find("ufab_stream_wait_word"), std::string::npos) << bad.error().message();
  Engine::Word d{};
  auto none = engine_->post_send_device(nullptr, {&w1, 1}, &d);
  ASSERT_FALSE(none);
  EXPECT_NE(none.error().message().find("ufab_stream_post_send_device"), std::string::npos) << none.error().message();
}

// Two streams: the doorbell that rings first is posted first.
TEST_F(StreamEngine, DoorbellsArePostedAsTheyRing) {
  FakeStream s1, s2;
  std::promise<void> gate;
  auto opened = gate.get_future().share();
  s1.launch([opened] { opened.wait_for(10s); });
  a_.buf[0] = 1;
  a_.buf[1] = 2;
  ufab_sge g1 = sge(a_, 0, 1), g2 = sge(a_, 1, 1);
  ufab_send_wr w1 = write_wr(1, &g1, 100), w2 = write_wr(2, &g2, 100);
  auto t1 = engine_->post_send(a_.qp->c(), {&w1, 1}, &s1);
  auto t2 = engine_->post_send(a_.qp->c(), {&w2, 1}, &s2);
  ASSERT_TRUE(t1 && t2);
  EXPECT_TRUE(eventually_done(*t2));
  EXPECT_EQ(status(*t1), 0);
  EXPECT_EQ(b_.buf[100], 2);
  gate.set_value();
  EXPECT_TRUE(eventually_done(*t1));
  EXPECT_EQ(b_.buf[100], 1);  // the later one landed last
}

// A work request that fails: the ticket says so, and the stream's wait
// is released all the same.
TEST_F(StreamEngine, AFailedTicketReleasesItsWait) {
  FakeStream s;
  ufab_sge g = sge(a_, 0, 64);
  ufab_send_wr w = write_wr(9, &g, 0);
  w.rkey ^= 0x5a5a;  // a key the peer never gave
  auto t = engine_->post_send(a_.qp->c(), {&w, 1}, &s);
  ASSERT_TRUE(t);
  ASSERT_TRUE(engine_->wait(*t, &s));
  ASSERT_TRUE(s.synchronize());
  EXPECT_FALSE(s.wait_timed_out);
  auto st = engine_->status(*t);
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code(), EIO);
  EXPECT_NE(st.error().message().find("status"), std::string::npos) << st.error().message();
  auto wcs = engine_completions(1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].wr_id, 9u);
  EXPECT_NE(wcs[0].status, UFAB_WC_SUCCESS);
}

// Every slot holding a ticket not complete: the next post says so; an
// unknown ticket is refused; destroying the engine releases armed waits.
TEST_F(StreamEngine, SlotsAreBoundedAndDestroyReleasesWaits) {
  make_engine(2);
  FakeStream blocked, waiter;
  std::promise<void> gate;
  auto opened = gate.get_future().share();
  blocked.launch([opened] { opened.wait_for(10s); });
  ufab_sge g = sge(a_, 0, 8);
  ufab_send_wr w = write_wr(1, &g, 0);
  auto t1 = engine_->post_send(a_.qp->c(), {&w, 1}, &blocked);
  auto t2 = engine_->post_send(a_.qp->c(), {&w, 1}, &blocked);
  ASSERT_TRUE(t1 && t2);
  auto t3 = engine_->post_send(a_.qp->c(), {&w, 1}, &blocked);
  ASSERT_FALSE(t3);
  EXPECT_EQ(t3.error().code(), EAGAIN);
  EXPECT_EQ(engine_->wait(12345, &waiter).error().code(), EINVAL);
  ASSERT_TRUE(engine_->wait(*t2, &waiter));
  std::atomic<bool> passed{false};
  waiter.launch([&] { passed = true; });
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(passed);
  engine_.reset();  // the doorbells never rang: dropped, the wait released
  EXPECT_TRUE(waiter.synchronize());
  EXPECT_TRUE(passed);
  EXPECT_FALSE(waiter.wait_timed_out);
  gate.set_value();
  EXPECT_TRUE(blocked.synchronize());
}

// Stream-ordered ping-pong between two engines, one per side: each side's
// stream waits for the peer's WRITE_WITH_IMM (a receive ticket), then
// answers with its own; 200 rounds, every byte checked by the "kernels".
TEST_F(StreamEngine, PingPongBetweenTwoEngines) {
  auto eb = Engine::create(b_.cq->get_c(), std::make_unique<FakeStreams>(), 64);
  ASSERT_TRUE(eb);
  FakeStream sa, sb;
  std::atomic<int> bad{0};
  const int rounds = 200;
  for (int i = 0; i < rounds; ++i) {
    // B: wait for A's i-th message, check it, answer.
    ufab_sge rb = sge(b_, 65536, 0);
    ufab_recv_wr r{.wr_id = uint64_t(i), .sg_list = &rb, .num_sge = 0, .reserved = 0};
    auto tb = (*eb)->post_recv(b_.qp->c(), r);
    ufab_sge ra = sge(a_, 65536, 0);
    ufab_recv_wr r2{.wr_id = uint64_t(i), .sg_list = &ra, .num_sge = 0, .reserved = 0};
    auto ta = engine_->post_recv(a_.qp->c(), r2);
    ASSERT_TRUE(tb && ta);
    sa.launch([&, i] { std::memset(a_.buf.data(), i & 0xff, 64); });
    ufab_sge ga = sge(a_, 0, 64);
    ufab_send_wr wa = write_wr(i, &ga, 0);
    wa.opcode = UFAB_WR_RDMA_WRITE_WITH_IMM;
    wa.imm_data = i;
    ASSERT_TRUE(engine_->post_send(a_.qp->c(), {&wa, 1}, &sa));
    ASSERT_TRUE(engine_->wait(*ta, &sa));
    sa.launch([&, i] { bad += a_.buf[64] != uint8_t(i + 1); });
    ASSERT_TRUE((*eb)->wait(*tb, &sb));
    sb.launch([&, i] {
      bad += b_.buf[63] != uint8_t(i);
      std::memset(b_.buf.data() + 64, uint8_t(i + 1), 64);
    });
    ufab_sge gb = sge(b_, 64, 64);
    ufab_send_wr wb{};
    wb.wr_id = i;
    wb.sg_list = &gb;
    wb.num_sge = 1;
    wb.opcode = UFAB_WR_RDMA_WRITE_WITH_IMM;
    wb.remote_addr = reinterpret_cast<uintptr_t>(a_.buf.data()) + 64;
    wb.rkey = a_.mr->rkey();
    ASSERT_TRUE((*eb)->post_send(b_.qp->c(), {&wb, 1}, &sb));
    // Keep the slots bounded: let this round finish before the next is armed.
    ASSERT_TRUE(sa.synchronize());
    ASSERT_TRUE(sb.synchronize());
  }
  EXPECT_EQ(bad.load(), 0);
  EXPECT_FALSE(sa.wait_timed_out);
  EXPECT_FALSE(sb.wait_timed_out);
}

}  // namespace
}  // namespace ufab::stream
