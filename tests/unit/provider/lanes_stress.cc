#include "tests/unit/provider/lanes_stress.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>

namespace ufab::lanes_stress {
namespace {

using namespace ::ufab::rdma;

constexpr uint32_t kWindow = 32;  // SENDs in flight per thread

uint8_t pattern(uint32_t thread, size_t i) { return static_cast<uint8_t>(thread * 31 + i * 7); }

struct Msg {
  uint32_t thread;
  uint32_t pad;
  uint64_t seq;
};

// One thread's objects: a QP on each device, a CQ each, a buffer each.
struct Pair {
  uint32_t k = 0;
  std::unique_ptr<CompletionQueue> cq_a, cq_b;
  std::unique_ptr<QueuePair> qp_a, qp_b;
  std::vector<uint8_t> buf_a, buf_b;  // a: SEND source + READ target; b: RECV targets + READ source
  std::optional<MemoryRegion> mr_a, mr_b;
  std::string error;
  uint64_t received = 0, reads = 0;
};

// Sets up pair p (in its own thread: QP creation runs concurrently too).
bool setup(Device& a, ProtectionDomain& pd_a, Device& b, ProtectionDomain& pd_b, Pair& p) {
  auto fail = [&](const std::string& what, const Error& e) {
    p.error = what + ": " + e.message();
    return false;
  };
  auto cq_a = a.create_cq(4 * kWindow);
  if (!cq_a) return fail("create_cq a", cq_a.error());
  auto cq_b = b.create_cq(4 * kWindow);
  if (!cq_b) return fail("create_cq b", cq_b.error());
  p.cq_a = std::move(*cq_a);
  p.cq_b = std::move(*cq_b);
  QpCaps caps{.max_send_wr = 2 * kWindow, .max_recv_wr = 2 * kWindow};
  auto qa = pd_a.create_qp({.type = QpType::kRc, .send_cq = p.cq_a.get(), .recv_cq = p.cq_a.get(), .caps = caps});
  if (!qa) return fail("create_qp a", qa.error());
  auto qb = pd_b.create_qp({.type = QpType::kRc, .send_cq = p.cq_b.get(), .recv_cq = p.cq_b.get(), .caps = caps});
  if (!qb) return fail("create_qp b", qb.error());
  p.qp_a = std::move(*qa);
  p.qp_b = std::move(*qb);
  p.buf_a.assign(kWindow * sizeof(Msg) + kReadBytes, 0);
  p.buf_b.assign(2 * kWindow * sizeof(Msg) + kReadBytes, 0);
  for (size_t i = 0; i < kReadBytes; ++i) p.buf_b[2 * kWindow * sizeof(Msg) + i] = pattern(p.k, i);
  auto ma = pd_a.register_mr(p.buf_a.data(), p.buf_a.size(), kLocalWrite);
  if (!ma) return fail("register_mr a", ma.error());
  auto mb = pd_b.register_mr(p.buf_b.data(), p.buf_b.size(), kLocalWrite | kRemoteRead);
  if (!mb) return fail("register_mr b", mb.error());
  p.mr_a.emplace(std::move(*ma));
  p.mr_b.emplace(std::move(*mb));
  if (auto s = p.qp_a->connect(p.qp_b->local()); !s) return fail("connect a", s.error());
  if (auto s = p.qp_b->connect(p.qp_a->local()); !s) return fail("connect b", s.error());
  for (uint32_t i = 0; i < 2 * kWindow; ++i) {
    Sge sge = p.mr_b->sge(i * sizeof(Msg), sizeof(Msg));
    if (auto s = p.qp_b->post_recv({.wr_id = i, .sgl = {&sge, 1}}); !s) return fail("post_recv", s.error());
  }
  return true;
}

// The thread's whole run: SENDs a -> b in order, a READ every kReadEvery.
void drive(Pair& p, uint64_t total, Clock::time_point deadline) {
  uint64_t posted = 0, completed = 0, next_expected = 0;
  bool read_outstanding = false;
  WorkCompletion wc[32];
  const uint64_t read_src = reinterpret_cast<uint64_t>(p.buf_b.data()) + 2 * kWindow * sizeof(Msg);
  for (uint64_t iter = 0; completed < total || next_expected < total || read_outstanding; ++iter) {
    while (posted < total && posted - completed < kWindow) {
      auto* m = reinterpret_cast<Msg*>(p.buf_a.data() + (posted % kWindow) * sizeof(Msg));
      *m = {p.k, 0, posted};
      Sge sge = p.mr_a->sge((posted % kWindow) * sizeof(Msg), sizeof(Msg));
      auto s = p.qp_a->post_send({.wr_id = posted, .opcode = WrOpcode::kSend, .flags = kSendSignaled,
                                  .sgl = {&sge, 1}});
      if (!s) {
        p.error = "post_send " + std::to_string(posted) + ": " + s.error().message();
        return;
      }
      ++posted;
      if (posted % kReadEvery == 0 && !read_outstanding) {
        std::memset(p.buf_a.data() + kWindow * sizeof(Msg), 0, kReadBytes);
        Sge rs = p.mr_a->sge(kWindow * sizeof(Msg), kReadBytes);
        auto r = p.qp_a->post_send({.wr_id = UINT64_MAX, .opcode = WrOpcode::kRdmaRead, .flags = kSendSignaled,
                                    .sgl = {&rs, 1}, .remote_addr = read_src, .rkey = p.mr_b->rkey()});
        if (!r) {
          p.error = "post READ: " + r.error().message();
          return;
        }
        read_outstanding = true;
      }
    }
    auto na = p.cq_a->poll(wc);
    if (!na) {
      p.error = "poll a: " + na.error().message();
      return;
    }
    for (size_t i = 0; i < *na; ++i) {
      if (wc[i].status != WcStatus::kSuccess) {
        p.error = "send-side completion failed: " + wc[i].error;
        return;
      }
      if (wc[i].wr_id == UINT64_MAX) {
        for (size_t j = 0; j < kReadBytes; ++j) {
          if (p.buf_a[kWindow * sizeof(Msg) + j] != pattern(p.k, j)) {
            p.error = "READ " + std::to_string(p.reads) + ": byte " + std::to_string(j) + " differs";
            return;
          }
        }
        read_outstanding = false;
        ++p.reads;
      } else {
        ++completed;
      }
    }
    auto nb = p.cq_b->poll(wc);
    if (!nb) {
      p.error = "poll b: " + nb.error().message();
      return;
    }
    for (size_t i = 0; i < *nb; ++i) {
      if (wc[i].status != WcStatus::kSuccess || wc[i].opcode != WcOpcode::kRecv || wc[i].byte_len != sizeof(Msg)) {
        p.error = "receive completion " + std::to_string(next_expected) + " wrong: " + wc[i].error;
        return;
      }
      Msg m;
      std::memcpy(&m, p.buf_b.data() + wc[i].wr_id * sizeof(Msg), sizeof m);
      if (m.thread != p.k || m.seq != next_expected) {
        p.error = "message " + std::to_string(next_expected) + " arrived as thread " + std::to_string(m.thread) +
                  " seq " + std::to_string(m.seq);
        return;
      }
      ++next_expected;
      Sge sge = p.mr_b->sge(wc[i].wr_id * sizeof(Msg), sizeof(Msg));
      if (auto s = p.qp_b->post_recv({.wr_id = wc[i].wr_id, .sgl = {&sge, 1}}); !s) {
        p.error = "post_recv: " + s.error().message();
        return;
      }
    }
    if ((iter & 1023) == 0 && Clock::now() > deadline) {
      p.error = "deadline: " + std::to_string(completed) + " of " + std::to_string(total) + " sent, " +
                std::to_string(next_expected) + " received";
      return;
    }
  }
  p.received = next_expected;
}

}  // namespace

uint64_t messages_per_thread(uint64_t fallback) {
  const char* env = std::getenv("UFAB_STRESS_MESSAGES");
  return env != nullptr ? std::strtoull(env, nullptr, 10) : fallback;
}

Result run(Device& a, ProtectionDomain& pd_a, Device& b, ProtectionDomain& pd_b, int threads, uint64_t total,
           Clock::duration limit) {
  std::vector<Pair> pairs(threads);
  std::atomic<int> ready{0};
  std::vector<std::thread> ts;
  auto t0 = Clock::now();
  const auto deadline = t0 + limit;
  for (int k = 0; k < threads; ++k) {
    pairs[k].k = static_cast<uint32_t>(k);
    ts.emplace_back([&, k] {
      bool ok = setup(a, pd_a, b, pd_b, pairs[k]);
      ready.fetch_add(1);
      // Every QP exists before traffic starts; every thread counts itself in,
      // set up or not, so this ends.
      while (ready.load() < threads) std::this_thread::yield();
      if (ok) drive(pairs[k], total, deadline);
    });
  }
  for (auto& t : ts) t.join();
  Result r;
  r.total = total;
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  uint64_t sum = 0;
  for (auto& p : pairs) {
    ThreadResult t{.k = p.k, .received = p.received, .reads = p.reads, .error = p.error};
    if (p.qp_a) t.qpn_a = p.qp_a->local().qpn;
    if (p.qp_b) t.qpn_b = p.qp_b->local().qpn;
    r.threads.push_back(t);
    sum += p.received;
  }
  r.a = a.stats();
  r.b = b.stats();
  std::printf("%d threads, %llu SENDs each: %.2f s, %.0f msgs/s; a: %s\nb: %s\n", threads,
              static_cast<unsigned long long>(total), r.seconds, sum / r.seconds, to_string(r.a).c_str(),
              to_string(r.b).c_str());
  std::fflush(stdout);
  for (auto& p : pairs) {  // QPs before their CQs
    p.qp_a.reset();
    p.qp_b.reset();
  }
  return r;
}

void expect_complete(const Result& r) {
  for (const auto& t : r.threads) {
    EXPECT_EQ(t.error, "") << "thread " << t.k;
    EXPECT_EQ(t.received, r.total) << "thread " << t.k;
    EXPECT_GE(t.reads, r.total / kReadEvery / 2) << "thread " << t.k;
  }
}

}  // namespace ufab::lanes_stress
