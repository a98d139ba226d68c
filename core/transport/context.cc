#include "core/transport/context.h"

#include <poll.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <bit>

#include "core/gpu/cuda.h"
#include "core/transport/queue_pair.h"

namespace ufab::transport {

namespace {

uint32_t random24() {
  uint32_t v = 0;
  if (::getrandom(&v, sizeof v, 0) != sizeof v) v = static_cast<uint32_t>(Clock::now().time_since_epoch().count());
  return v & roce::kPsnMask;
}

constexpr uint32_t kGsiQpn = 1;  // IBA 3.5.1: QP 1 is the general services QP

// Waiting: how long to keep polling before sleeping. A completion that
// comes within the spin costs no wake-up; past it, the waiter sleeps and
// leaves the core to whoever shares it (the peer process on the same
// core, a second vCPU's worth of work in one VM).
constexpr Clock::duration kSpin = std::chrono::microseconds(30);
// Longest sleep while nobody else drives progress, so timers
// (retransmission, RNR back-off, ARP retries) fire close to on time.
constexpr int kMaxSleepMs = 1;
// Longest sleep while another thread polls the lanes (it runs their
// timers; another waiter does not count): then the waiter sleeps on its
// CQ's eventfd alone, without
// arming the NIC's interrupt, and looks again this often whether the
// other thread still polls. A connection manager's thread waiting for
// MADs beside an application that polls its data CQ takes no interrupt
// and no core per frame that way.
constexpr int kPassiveSleepMs = 10;

template <typename F>
void for_each_lane(uint64_t mask, F&& f) {
  while (mask != 0) {
    f(static_cast<uint16_t>(std::countr_zero(mask)));
    mask &= mask - 1;
  }
}

}  // namespace

Result<std::unique_ptr<Context>> Context::create(std::vector<std::unique_ptr<Link>> links, net::Ipv4Address ip,
                                                 bool steered, const staging::Params& staging) {
  if (links.empty() || links.size() > 64) return fail(EINVAL, "a device needs 1..64 links (one per NIC queue)");
  if (!ip.is_unicast()) {
    return fail(EINVAL, "device address " + ip.str() + " is not a unicast IPv4 address; give the port's own "
                        "address, e.g. 10.0.0.1");
  }
  std::unique_ptr<Context> ctx(new Context());
  Link& first = *links[0];
  ctx->ip_ = ip;
  ctx->staging_params_ = staging;
  ctx->active_mtu_ = roce::rxe_active_mtu(first.mtu());
  ctx->steered_ = steered || links.size() == 1;
  auto responder = net::ArpResponder::create(first.mac(), {ip});
  if (!responder) return std::unexpected(responder.error().context("ARP for " + first.name()));
  auto resolver = net::ArpResolver::create(first.mac(), {ip});
  if (!resolver) return std::unexpected(resolver.error().context("ARP for " + first.name()));
  ctx->arp_responder_.emplace(std::move(*responder));
  ctx->arp_resolver_.emplace(std::move(*resolver));
  // GPU regions are checked against the allocation CUDA has at their
  // address now (a freed buffer is a protection error, never a silent
  // write); only asked for GPU regions, which need the driver loaded.
  verbs::MemoryTableOptions table_options;
  // (Fake GPU memory is host memory CUDA knows nothing of: its registered
  // id is trusted.)
  if (!staging.fake) table_options.gpu_buffer_id = [](uint64_t addr) -> uint64_t {
    const gpu::Driver* driver = gpu::Driver::if_loaded();
    if (driver == nullptr) return 0;
    auto id = driver->buffer_id(reinterpret_cast<const void*>(static_cast<uintptr_t>(addr)));
    return id ? *id : 0;
  };
  auto table = verbs::MemoryRegionTable::create(std::move(table_options));
  if (!table) return std::unexpected(table.error());
  ctx->memory_ = std::move(*table);
  for (size_t i = 0; i < links.size(); ++i) {
    ctx->lanes_.push_back(std::make_unique<Lane>(*ctx, static_cast<uint16_t>(i), std::move(links[i])));
  }
  // QP numbers start at a random place, so a restarted process does not
  // reuse the numbers a peer may still send to; 0 and 1 are special (IBA).
  ctx->next_qpn_ = std::max<uint32_t>(2, random24() & 0x7FFFFF);
  return ctx;
}

Context::~Context() {
  for (auto& lane : lanes_) lane->stop_thread();
  lanes_.clear();  // QPs first: they point at CQs (and hold staging slots)
  cqs_.clear();
  pool_ptr_.store(nullptr);
  pool_.reset();
}

Result<staging::Pool*> Context::staging_for(int ordinal) {
  std::lock_guard lock(pool_mu_);
  if (pool_) {
    if (pool_->ordinal() != ordinal) {
      return fail(EOPNOTSUPP, "GPU memory on GPU " + std::to_string(ordinal) + ": this device stages through GPU " +
                                  std::to_string(pool_->ordinal()) + " already (one GPU per device for now); open "
                                  "another device for the other GPU");
    }
    return pool_.get();
  }
  auto pool = staging::Pool::create(staging_params_, ordinal);
  if (!pool) return std::unexpected(pool.error().context("GPU staging pipeline"));
  pool_ = std::move(*pool);
  pool_ptr_.store(pool_.get(), std::memory_order_release);
  return pool_.get();
}

verbs::DeviceStats Context::stats() {
  verbs::DeviceStats sum{};
  static_assert(sizeof(verbs::DeviceStats) % sizeof(uint64_t) == 0);
  constexpr size_t kFields = sizeof(verbs::DeviceStats) / sizeof(uint64_t);
  for (auto& lane : lanes_) {
    std::lock_guard lock(lane->mutex());
    const auto* from = reinterpret_cast<const uint64_t*>(&lane->stats());
    auto* to = reinterpret_cast<uint64_t*>(&sum);
    for (size_t i = 0; i < kFields; ++i) to[i] += from[i];
  }
  return sum;
}

Result<CompletionQueueImpl*> Context::create_cq(uint32_t depth) {
  auto cq = CompletionQueueImpl::create(depth);
  if (!cq) return std::unexpected(cq.error());
  std::lock_guard lock(control_mu_);
  cqs_.push_back(std::move(*cq));
  return cqs_.back().get();
}

Status Context::destroy_cq(CompletionQueueImpl* cq) {
  std::lock_guard lock(control_mu_);
  for (auto& lane : lanes_) {
    std::lock_guard lane_lock(lane->mutex());
    if (lane->any_qp_uses_locked(cq)) return fail(EBUSY, "the completion queue is still used by a QP; destroy the QP first");
  }
  std::erase_if(cqs_, [cq](const auto& p) { return p.get() == cq; });
  return {};
}

Result<QueuePairImpl*> Context::create_qp(verbs::PdId pd, verbs::QpType type, CompletionQueueImpl* send_cq,
                                          CompletionQueueImpl* recv_cq, const verbs::QpCaps& caps, bool sq_sig_all) {
  if (send_cq == nullptr || recv_cq == nullptr) {
    return fail(EINVAL, "creating a QP: a send CQ and a receive CQ are required (they may be the same)");
  }
  if (type != verbs::QpType::kRc && type != verbs::QpType::kUd && type != verbs::QpType::kGsi) {
    return fail(EINVAL, "creating a QP: only RC, UD and GSI QPs are supported");
  }
  auto limit = [](uint32_t v, uint32_t lo, uint32_t hi) { return v >= lo && v <= hi; };
  if (!limit(caps.max_send_wr, 1, 1u << 16) || !limit(caps.max_recv_wr, 1, 1u << 16)) {
    return fail(EINVAL, "creating a QP: max_send_wr and max_recv_wr must be 1..65536");
  }
  if (caps.max_send_sge > verbs::kMaxSge || caps.max_recv_sge > verbs::kMaxSge) {
    return fail(EINVAL, "creating a QP: at most " + std::to_string(verbs::kMaxSge) + " SGEs per work request");
  }
  if (caps.max_inline_data > 4096) return fail(EINVAL, "creating a QP: max_inline_data is at most 4096");
  std::lock_guard lock(control_mu_);
  if (type == verbs::QpType::kGsi) {
    // QP 1 on its lane (the NIC steers dest QP 1 there): UD that takes MADs.
    Lane& lane = lane_of(kGsiQpn);
    std::lock_guard lane_lock(lane.mutex());
    if (lane.has_qp_locked(kGsiQpn)) {
      return fail(EBUSY, "creating the GSI QP: this device's QP 1 exists already (one connection manager per device)");
    }
    auto qp = std::make_unique<QueuePairImpl>(lane, kGsiQpn, pd, verbs::QpType::kUd, send_cq, recv_cq, caps, sq_sig_all,
                                              random24());
    QueuePairImpl* raw = qp.get();
    lane.add_qp_locked(std::move(qp));
    send_cq->add_lane(lane.index());
    recv_cq->add_lane(lane.index());
    return raw;
  }
  // The lane with the fewest QPs; the QP number is one that maps to it.
  size_t total = 0;
  uint16_t best = 0;
  size_t best_count = SIZE_MAX;
  for (auto& lane : lanes_) {
    std::lock_guard lane_lock(lane->mutex());
    size_t n = lane->qp_count_locked();
    total += n;
    if (n < best_count) best_count = n, best = lane->index();
  }
  if (total >= (1u << 20)) return fail(ENOSPC, "creating a QP: the device has 2^20 QPs already");
  Lane& lane = *lanes_[best];
  std::lock_guard lane_lock(lane.mutex());
  const uint32_t n = lane_count();
  uint32_t qpn = next_qpn_;
  for (;;) {
    if (qpn > roce::kPsnMask || qpn < 2) qpn = 2;
    qpn += (best + n - qpn % n) % n;  // the next number on lane `best`
    if (qpn <= roce::kPsnMask && !lane.has_qp_locked(qpn)) break;
    qpn += n;
  }
  next_qpn_ = qpn + 1;
  auto qp = std::make_unique<QueuePairImpl>(lane, qpn, pd, type, send_cq, recv_cq, caps, sq_sig_all, random24());
  QueuePairImpl* raw = qp.get();
  lane.add_qp_locked(std::move(qp));
  send_cq->add_lane(best);
  recv_cq->add_lane(best);
  return raw;
}

void Context::destroy_qp(QueuePairImpl* qp) {
  std::lock_guard lock(control_mu_);
  Lane& lane = lane_of(qp->qpn());
  std::lock_guard lane_lock(lane.mutex());
  lane.remove_qp_locked(qp);
}

void Context::on_arp_frame(Lane& via, std::span<const uint8_t> frame) {
  std::optional<net::ArpFrame> reply;
  {
    std::lock_guard lock(arp_mu_);
    auto events = arp_resolver_->on_frame(frame, via.now());
    if (!events.resolved.empty() || !events.changed.empty()) arp_pending_.store(false, std::memory_order_relaxed);
    reply = arp_responder_->on_frame(frame);
  }
  if (reply) via.send_raw_locked(*reply);
}

Result<std::optional<net::MacAddress>> Context::resolve(Lane& via, net::Ipv4Address ip) {
  std::optional<net::ArpFrame> request;
  std::optional<net::MacAddress> mac;
  {
    std::lock_guard lock(arp_mu_);
    auto r = arp_resolver_->resolve(ip, via.now());
    if (!r) return std::unexpected(r.error());
    request = r->request;
    mac = r->mac;
  }
  // Replies land in queue 0 (the NIC steers only RoCE): while one is
  // awaited, waiters on other lanes progress lane 0 too.
  if (!mac) arp_pending_.store(true, std::memory_order_relaxed);
  if (request) via.send_raw_locked(*request);
  return mac;
}

uint64_t Context::feeding(const CompletionQueueImpl& cq) const {
  // A NIC that does not steer by QP puts a frame in whichever queue its
  // own rule picks (queue 0 on e1000e; a flow hash on a multi-queue
  // virtio-net tap): any lane may receive for this CQ's QPs.
  if (!steered_) return lanes_.size() >= 64 ? ~uint64_t{0} : (uint64_t{1} << lanes_.size()) - 1;
  uint64_t mask = cq.lanes();
  // When it steers, lane 0's queue still receives ARP: replies we wait
  // for, and the peer's requests, which must be answered even when no QP
  // of lane 0 is polled (every 64th round of each thread: a peer's ARP
  // retry is a second).
  thread_local uint32_t rounds = 0;
  if (arp_pending_.load(std::memory_order_relaxed) || (++rounds & 63) == 0) mask |= 1;
  return mask;
}

int Context::progress() {
  int work = 0;
  for (auto& lane : lanes_) {
    std::lock_guard lock(lane->mutex());
    work += lane->progress_locked();
  }
  return work;
}

int Context::progress_for(const CompletionQueueImpl& cq, bool waiter) {
  int work = 0;
  for_each_lane(feeding(cq), [&](uint16_t i) {
    Lane& lane = *lanes_[i];
    std::unique_lock lock(lane.mutex(), std::try_to_lock);
    if (!lock.owns_lock()) return;
    work += lane.progress_locked();
    if (waiter) lane.note_waiter_round();
  });
  return work;
}

uint64_t Context::rounds_of(uint64_t lanes) const {
  uint64_t sum = 0;
  for_each_lane(lanes, [&](uint16_t i) { sum += lanes_[i]->rounds(); });
  return sum;
}

void Context::wait_for_completion(CompletionQueueImpl& cq, Clock::time_point deadline) {
  const bool threads = has_progress_threads();
  // Another thread polled these lanes while this CQ's waiter last slept:
  // no spin, no interrupt, until a sleep finds that it stopped.
  bool others = !threads && cq.others_poll();
  // Spin: poll for up to kSpin, reading the clock every 16 rounds.
  const auto spin_end = std::min(deadline, Clock::now() + (others ? Clock::duration{} : kSpin));
  for (uint32_t i = 1;; ++i) {
    if (!threads) progress_for(cq, /*waiter=*/true);
    if (!cq.empty()) return;
    if (i % 16 == 0 && Clock::now() >= spin_end) break;
  }
  // Sleep on the CQ's eventfd (any lane's QP, on any thread, completing
  // into it) and, when we are the progress, on the NIC interrupts and
  // inboxes of the lanes that feed it; bounded so timers run.
  for (;;) {
    pollfd fds[2 * 64 + 1];
    nfds_t n = 0;
    cq.arm();
    fds[n++] = {cq.event_fd(), POLLIN, 0};
    const uint64_t fed = threads ? 0 : feeding(cq);
    uint64_t slept = others ? 0 : fed;
    bool ready = false;
    for_each_lane(slept, [&](uint16_t i) {
      Lane& lane = *lanes_[i];
      int lane_fds[2];
      int k;
      {
        std::lock_guard lock(lane.mutex());
        k = lane.prepare_sleep_locked(lane_fds);
      }
      for (int j = 0; j < k; ++j) fds[n++] = {lane_fds[j], POLLIN, 0};
      ready = ready || lane.inbox_waiting();
    });
    // Checked after arming: a completion or frame from before the arm is
    // seen here, one after it writes an eventfd.
    ready = ready || !cq.empty();
    const uint64_t rounds_before = rounds_of(fed);
    auto now = Clock::now();
    if (!ready && now < deadline) {
      auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
      int cap = threads ? INT32_MAX : others ? kPassiveSleepMs : kMaxSleepMs;
      int ms = static_cast<int>(std::min<int64_t>(left, cap));
      if (::poll(fds, n, ms) > 0) {
        for (nfds_t j = 0; j < n; ++j) {
          if (fds[j].revents & POLLIN) {
            uint64_t v;
            [[maybe_unused]] ssize_t r = ::read(fds[j].fd, &v, sizeof v);
          }
        }
      }
    }
    for_each_lane(slept, [&](uint16_t i) { lanes_[i]->woke(); });
    if (!threads) {
      others = rounds_of(fed) != rounds_before;
      cq.set_others_poll(others);
      progress_for(cq, /*waiter=*/true);
    }
    if (!cq.empty() || Clock::now() >= deadline) return;
  }
}

Status Context::start_progress_threads() {
  for (auto& lane : lanes_) lane->start_thread();
  return {};
}

void Context::stop_progress_threads() {
  for (auto& lane : lanes_) lane->stop_thread();
}

}  // namespace ufab::transport
