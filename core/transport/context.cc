#include "core/transport/context.h"

#include <poll.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>

#include "core/transport/queue_pair.h"

namespace ufab::transport {

namespace {

uint32_t random24() {
  uint32_t v = 0;
  if (::getrandom(&v, sizeof v, 0) != sizeof v) v = static_cast<uint32_t>(Clock::now().time_since_epoch().count());
  return v & roce::kPsnMask;
}

// Longest sleep between progress rounds while a caller waits, so timers
// (retransmission, RNR back-off, ARP retries) fire close to on time.
constexpr std::chrono::microseconds kMaxSleep{1000};

}  // namespace

Result<std::unique_ptr<Context>> Context::create(std::unique_ptr<Link> link, net::Ipv4Address ip) {
  if (!ip.is_unicast()) {
    return fail(EINVAL, "device address " + ip.str() + " is not a unicast IPv4 address; give the port's own "
                        "address, e.g. 10.0.0.1");
  }
  std::unique_ptr<Context> ctx(new Context());
  ctx->ip_ = ip;
  ctx->active_mtu_ = roce::rxe_active_mtu(link->mtu());
  auto responder = net::ArpResponder::create(link->mac(), {ip});
  if (!responder) return std::unexpected(responder.error().context("ARP for " + link->name()));
  auto resolver = net::ArpResolver::create(link->mac(), {ip});
  if (!resolver) return std::unexpected(resolver.error().context("ARP for " + link->name()));
  ctx->arp_responder_.emplace(std::move(*responder));
  ctx->arp_resolver_.emplace(std::move(*resolver));
  auto table = verbs::MemoryRegionTable::create();
  if (!table) return std::unexpected(table.error());
  ctx->memory_ = std::move(*table);
  ctx->link_mac_ = link->mac();
  ctx->link_ = std::move(link);
  // QP numbers start at a random place, so a restarted process does not
  // reuse the numbers a peer may still send to; 0 and 1 are special (IBA).
  ctx->next_qpn_ = std::max<uint32_t>(2, random24() & 0x7FFFFF);
  return ctx;
}

Context::~Context() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  qps_.clear();
  cqs_.clear();
}

Result<CompletionQueueImpl*> Context::create_cq_locked(uint32_t depth) {
  auto cq = CompletionQueueImpl::create(depth);
  if (!cq) return std::unexpected(cq.error());
  cqs_.push_back(std::move(*cq));
  return cqs_.back().get();
}

Status Context::destroy_cq_locked(CompletionQueueImpl* cq) {
  for (const auto& [qpn, qp] : qps_) {
    if (qp->uses(cq)) {
      return fail(EBUSY, "the completion queue is still used by QP " + std::to_string(qpn) + "; destroy the QP first");
    }
  }
  std::erase_if(cqs_, [cq](const auto& p) { return p.get() == cq; });
  return {};
}

Result<QueuePairImpl*> Context::create_qp_locked(verbs::PdId pd, verbs::QpType type, CompletionQueueImpl* send_cq,
                                                 CompletionQueueImpl* recv_cq, const verbs::QpCaps& caps,
                                                 bool sq_sig_all) {
  if (send_cq == nullptr || recv_cq == nullptr) {
    return fail(EINVAL, "creating a QP: a send CQ and a receive CQ are required (they may be the same)");
  }
  if (type != verbs::QpType::kRc && type != verbs::QpType::kUd) {
    return fail(EINVAL, "creating a QP: only RC and UD QPs are supported");
  }
  auto limit = [](uint32_t v, uint32_t lo, uint32_t hi) { return v >= lo && v <= hi; };
  if (!limit(caps.max_send_wr, 1, 1u << 16) || !limit(caps.max_recv_wr, 1, 1u << 16)) {
    return fail(EINVAL, "creating a QP: max_send_wr and max_recv_wr must be 1..65536");
  }
  if (caps.max_send_sge > verbs::kMaxSge || caps.max_recv_sge > verbs::kMaxSge) {
    return fail(EINVAL, "creating a QP: at most " + std::to_string(verbs::kMaxSge) + " SGEs per work request");
  }
  if (caps.max_inline_data > 4096) return fail(EINVAL, "creating a QP: max_inline_data is at most 4096");
  if (qps_.size() >= (1u << 20)) return fail(ENOSPC, "creating a QP: the device has 2^20 QPs already");
  uint32_t qpn;
  do {
    qpn = next_qpn_;
    next_qpn_ = next_qpn_ >= roce::kPsnMask ? 2 : next_qpn_ + 1;
  } while (qps_.contains(qpn));
  auto qp = std::make_unique<QueuePairImpl>(*this, qpn, pd, type, send_cq, recv_cq, caps, sq_sig_all, random24());
  QueuePairImpl* raw = qp.get();
  qps_.emplace(qpn, std::move(qp));
  qp_list_.push_back(raw);
  return raw;
}

void Context::destroy_qp_locked(QueuePairImpl* qp) {
  std::erase(qp_list_, qp);
  qps_.erase(qp->qpn());
}

Result<std::optional<net::MacAddress>> Context::resolve_locked(net::Ipv4Address ip) {
  auto r = arp_resolver_->resolve(ip, now());
  if (!r) return std::unexpected(r.error());
  if (r->request) send_arp_locked(*r->request);
  return r->mac;
}

void Context::send_arp_locked(const net::ArpFrame& frame) {
  // ARP is rare and a lost one costs a second (the retry interval), so it
  // gets a flush to free a buffer rather than a drop when the NIC is busy.
  auto buf = link_->tx_acquire();
  if (buf.empty()) {
    link_->tx_flush();
    buf = link_->tx_acquire();
  }
  if (buf.size() < frame.size()) {
    ++stats_.tx_stalls;
    return;
  }
  std::copy(frame.begin(), frame.end(), buf.begin());
  link_->tx_commit(frame.size());
  ++stats_.tx_frames;
}

bool Context::send_frame_locked(const roce::FrameSpec& spec, std::span<const std::span<const uint8_t>> payload) {
  auto buf = link_->tx_acquire();
  if (buf.empty()) {
    ++stats_.tx_stalls;
    return false;
  }
  auto built = roce::build_frame_gather(spec, payload, buf);
  if (!built) {
    // Our own bug (a frame larger than a buffer): never put a broken frame
    // on the wire.
    ++stats_.tx_stalls;
    return false;
  }
  link_->tx_commit(std::max(built.length, roce::kEthMinFrame));
  ++stats_.tx_frames;
  return true;
}

void Context::on_frame_locked(std::span<const uint8_t> frame) {
  ++stats_.rx_frames;
  if (frame.size() >= 14 && frame[12] == 0x08 && frame[13] == 0x06) {
    ++stats_.rx_arp;
    arp_resolver_->on_frame(frame, now());
    if (auto reply = arp_responder_->on_frame(frame)) send_arp_locked(*reply);
    return;
  }
  // Unicast RoCE to our MAC only: a NIC in promiscuous mode (or the
  // software NIC) hands us other hosts' frames too.
  if (frame.size() >= 6 && !std::equal(frame.begin(), frame.begin() + 6, link_mac_.begin())) {
    ++stats_.rx_other;
    return;
  }
  if (roce::parse_frame(frame, packet_) != roce::ParseError::kOk) {
    // Most of what is not RoCE is other traffic on the link (IPv6, LLDP,
    // ...); count it apart from broken RoCE frames, judging by the raw
    // bytes (packet_ may hold an earlier frame's fields).
    bool roce_port = frame.size() >= roce::kBthOffset && frame[12] == 0x08 && frame[13] == 0x00 &&
                     frame[23] == roce::kIpProtoUdp && frame[36] == (roce::kRoceV2Port >> 8) &&
                     frame[37] == (roce::kRoceV2Port & 0xFF);
    ++(roce_port ? stats_.rx_parse_errors : stats_.rx_other);
    return;
  }
  ++stats_.rx_roce;
  // rxe's check_keys: the default partition only (full or limited member).
  if (packet_.ip.dst != ip_.value || (packet_.bth.pkey & 0x7FFF) != 0x7FFF) {
    ++stats_.rx_dropped;
    return;
  }
  auto it = qps_.find(packet_.bth.dest_qp);
  if (it == qps_.end()) {
    ++stats_.rx_unknown_qp;
    return;
  }
  QueuePairImpl& qp = *it->second;
  bool ud_packet = packet_.op->transport == roce::Transport::kUd;
  if (ud_packet != (qp.type() == verbs::QpType::kUd) || packet_.op->transport == roce::Transport::kUc) {
    ++stats_.rx_dropped;
    return;
  }
  qp.on_packet(packet_);
}

void Context::transmit_locked(QueuePairImpl& qp) {
  now_fresh_ = false;  // a new round: the first timer armed reads the clock
  qp.transmit();
  link_->tx_flush();
}

int Context::progress_locked() {
  // The clock is read lazily (now()): only when a frame arms a timer, a QP
  // has a timer armed, or ARP needs the time. Its value is at most one
  // receive burst old when a timer is checked.
  now_fresh_ = false;
  int work = static_cast<int>(link_->receive(256, [this](std::span<const uint8_t> f) { on_frame_locked(f); }));
  for (QueuePairImpl* qp : qp_list_) {
    work += qp->on_timer();
    work += qp->transmit();
    if (qp->lost_completion() && qp->state() != verbs::QpState::kError) {
      qp->enter_error("its completion queue overflowed");
    }
  }
  link_->tx_flush();
  return work;
}

void Context::wait_for_completion(CompletionQueueImpl& cq, Clock::time_point deadline) {
  std::unique_lock lock(mu_);
  for (;;) {
    if (!thread_.joinable()) progress_locked();
    if (!cq.empty()) return;
    auto now = Clock::now();
    if (now >= deadline) return;
    // Sleep on the CQ's eventfd (a progress thread fills the CQ) or on the
    // NIC's receive interrupt (we are the progress), bounded so timers run.
    int fd;
    if (thread_.joinable()) {
      cq.arm();
      fd = cq.event_fd();
    } else {
      fd = link_->rx_event_fd();
      link_->arm_rx_irq();
    }
    auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - now);
    auto nap = std::min(left, thread_.joinable() ? std::chrono::microseconds(left) : kMaxSleep);
    lock.unlock();
    if (fd >= 0) {
      pollfd p{fd, POLLIN, 0};
      int ms = static_cast<int>((nap.count() + 999) / 1000);
      if (::poll(&p, 1, ms) > 0) {
        uint64_t v;
        [[maybe_unused]] ssize_t n = ::read(fd, &v, sizeof v);
      }
    } else {
      ::usleep(static_cast<useconds_t>(std::min<int64_t>(nap.count(), 50)));
    }
    lock.lock();
  }
}

Status Context::start_progress_thread() {
  std::lock_guard lock(mu_);
  if (thread_.joinable()) return {};
  thread_ = std::thread([this] { progress_thread_main(); });
  return {};
}

void Context::stop_progress_thread() {
  if (!thread_.joinable()) return;
  stop_ = true;
  thread_.join();
  stop_ = false;
}

void Context::progress_thread_main() {
  int fd = link_->rx_event_fd();
  while (!stop_.load(std::memory_order_relaxed)) {
    int work;
    {
      std::lock_guard lock(mu_);
      work = progress_locked();
      if (work == 0) link_->arm_rx_irq();  // about to sleep on the NIC
    }
    if (work > 0) continue;
    if (fd >= 0) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 1) > 0) {
        uint64_t v;
        [[maybe_unused]] ssize_t n = ::read(fd, &v, sizeof v);
      }
    } else {
      ::usleep(50);
    }
  }
}

}  // namespace ufab::transport
