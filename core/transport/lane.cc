#include "core/transport/lane.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "core/transport/context.h"
#include "core/transport/queue_pair.h"

namespace ufab::transport {

Lane::Lane(Context& device, uint16_t index, std::unique_ptr<Link> link)
    : device_(device), index_(index), link_(std::move(link)) {
  link_mac_ = link_->mac();
  gather_ = link_->gather();
  inbox_slot_bytes_ = link_->mtu() + 64;  // Ethernet, VLAN and slack around the IP MTU
  inbox_.resize(size_t{kInboxSlots} * inbox_slot_bytes_);
  inbox_length_.resize(kInboxSlots);
  // Without the eventfd a sleeper still wakes within a millisecond (the
  // waits are bounded), so a failure here only costs latency.
  inbox_fd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
}

Lane::~Lane() {
  stop_thread();
  qp_list_.clear();
  qps_.clear();
}

verbs::MemoryRegionTable& Lane::memory() { return device_.memory(); }
staging::Pool* Lane::staging() const { return device_.staging(); }
net::Ipv4Address Lane::ip() const { return device_.ip(); }
uint32_t Lane::active_mtu() const { return device_.active_mtu(); }

Result<std::optional<net::MacAddress>> Lane::resolve_locked(net::Ipv4Address ip) { return device_.resolve(*this, ip); }

void Lane::send_raw_locked(std::span<const uint8_t> frame) {
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

bool Lane::send_frame_locked(const roce::FrameSpec& spec, std::span<const std::span<const uint8_t>> payload,
                             const uint64_t* device) {
  auto buf = link_->tx_acquire();
  if (buf.empty()) {
    ++stats_.tx_stalls;
    return false;
  }
  if (gather_ != Link::Gather::kNone && device != nullptr && !payload.empty() &&
      payload[0].size() + (payload.size() > 1 ? payload[1].size() : 0) >= kGatherMinPayload &&
      send_gathered_locked(spec, payload, device, buf)) {
    ++stats_.tx_frames;
    ++stats_.tx_gather_frames;
    return true;
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

// Headers and trailer (pad, ICRC) go into the frame buffer, the payload
// pieces stay where they are: headers | pieces | trailer, at most
// Link::kMaxSegments segments.
bool Lane::send_gathered_locked(const roce::FrameSpec& spec, std::span<const std::span<const uint8_t>> payload,
                                const uint64_t* device, std::span<uint8_t> buf) {
  if (payload.empty() || payload.size() > Link::kMaxSegments - 2) return false;
  size_t bytes = 0;
  for (size_t i = 0; i < payload.size(); ++i) {
    if (payload[i].empty() || (gather_ == Link::Gather::kDevice && device[i] == 0)) return false;
    bytes += payload[i].size();
  }
  if (bytes < kGatherMinPayload) return false;
  const size_t header = roce::header_length(spec.bth.opcode);
  if (header == 0 || buf.size() < header + roce::kMaxTrailerBytes) return false;
  std::span<uint8_t, roce::kMaxTrailerBytes> trailer(buf.data() + header, roce::kMaxTrailerBytes);
  auto built = roce::build_frame_split(spec, payload, buf.first(header), trailer);
  if (!built) return false;
  std::array<Link::Segment, Link::kMaxSegments> segs;
  size_t n = 0;
  segs[n++] = {buf.data(), static_cast<uint32_t>(built.header_length), 0};
  for (size_t i = 0; i < payload.size(); ++i) {
    // A software NIC reads by address (the link fills it in from data).
    uint64_t addr = gather_ == Link::Gather::kDevice ? device[i] : reinterpret_cast<uintptr_t>(payload[i].data());
    segs[n++] = {payload[i].data(), static_cast<uint32_t>(payload[i].size()), addr};
  }
  segs[n++] = {trailer.data(), static_cast<uint32_t>(built.trailer_length), 0};
  link_->tx_commit_gather(std::span(segs.data(), n));
  return true;
}

void Lane::add_qp_locked(std::unique_ptr<QueuePairImpl> qp) {
  QueuePairImpl* raw = qp.get();
  qps_.emplace(raw->qpn(), std::move(qp));
  qp_list_.push_back(raw);
}

void Lane::remove_qp_locked(QueuePairImpl* qp) {
  std::erase(qp_list_, qp);
  qps_.erase(qp->qpn());
}

bool Lane::any_qp_uses_locked(const void* cq) const {
  return std::any_of(qp_list_.begin(), qp_list_.end(),
                     [cq](const QueuePairImpl* qp) { return qp->uses(static_cast<const CompletionQueueImpl*>(cq)); });
}

void Lane::on_frame_locked(std::span<const uint8_t> frame) {
  ++stats_.rx_frames;
  if (frame.size() >= 14 && frame[12] == 0x08 && frame[13] == 0x06) {
    ++stats_.rx_arp;
    device_.on_arp_frame(*this, frame);
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
  // The owner of the destination QP: this lane, or another one whose RX
  // queue the NIC did not steer the frame to. The frame is checked (ICRC,
  // lengths) before it is handed over, so a lane's inbox holds only RoCE.
  Lane& owner = device_.lane_of(packet_.bth.dest_qp);
  if (&owner != this) {
    --stats_.rx_frames;  // counted by the owner when it takes the frame
    // The owner's lock if it is free (a try: a lane never waits for
    // another, so two lanes handing frames to each other cannot deadlock),
    // else its inbox.
    if (std::unique_lock lock(owner.mu_, std::try_to_lock); lock.owns_lock()) {
      owner.deliver_locked(frame);
    } else if (!owner.hand_over(frame)) {
      ++stats_.rx_dropped;
    }
    return;
  }
  ++stats_.rx_roce;
  // rxe's check_keys: the default partition only (full or limited member).
  if (packet_.ip.dst != device_.ip().value || (packet_.bth.pkey & 0x7FFF) != 0x7FFF) {
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

bool Lane::hand_over(std::span<const uint8_t> frame) {
  if (frame.size() > inbox_slot_bytes_) return false;
  {
    std::lock_guard lock(inbox_mu_);
    if (inbox_tail_ - inbox_head_.load(std::memory_order_acquire) >= kInboxSlots) return false;
    size_t slot = inbox_tail_ % kInboxSlots;
    std::memcpy(&inbox_[slot * inbox_slot_bytes_], frame.data(), frame.size());
    inbox_length_[slot] = static_cast<uint32_t>(frame.size());
    ++inbox_tail_;
    inbox_ready_.store(inbox_tail_);  // seq_cst, against the sleeper's check (prepare_sleep_locked)
  }
  if (sleepers_.load() > 0 && inbox_fd_.valid()) {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(inbox_fd_.get(), &one, sizeof one);
  }
  return true;
}

void Lane::deliver_locked(std::span<const uint8_t> frame) {
  now_fresh_ = false;  // the lane may have been idle: timers armed now need the time now
  on_frame_locked(frame);
  link_->tx_flush();  // what the frame caused (an ACK, a READ response)
}

int Lane::drain_inbox_locked() {
  // inbox_head_ only moves here, under mu_.
  uint64_t head = inbox_head_.load(std::memory_order_relaxed);
  uint64_t end = inbox_ready_.load(std::memory_order_acquire);
  if (end == head) return 0;
  // Producers write only slots at or past `end` until the head moves, so
  // the slots in [head, end) are read without the inbox lock.
  for (uint64_t i = head; i < end; ++i) {
    size_t slot = i % kInboxSlots;
    on_frame_locked({&inbox_[slot * inbox_slot_bytes_], inbox_length_[slot]});
  }
  inbox_head_.store(end, std::memory_order_release);
  return static_cast<int>(end - head);
}

void Lane::transmit_locked(QueuePairImpl& qp) {
  now_fresh_ = false;  // a new round: the first timer armed reads the clock
  qp.transmit();
  link_->tx_flush();
}

int Lane::progress_locked() {
  // The clock is read lazily (now()): only when a frame arms a timer, a QP
  // has a timer armed, or ARP needs the time. Its value is at most one
  // receive burst old when a timer is checked.
  now_fresh_ = false;
  rounds_.store(rounds_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  int work = drain_inbox_locked();
  work += static_cast<int>(link_->receive(256, [this](std::span<const uint8_t> f) { on_frame_locked(f); }));
  for (QueuePairImpl* qp : qp_list_) {
    work += qp->on_timer();
    work += qp->transmit();
    if (qp->has_staging()) work += qp->stage_progress();  // copies in flight: keep polling
    if (qp->lost_completion() && qp->state() != verbs::QpState::kError) {
      qp->enter_error("its completion queue overflowed");
    }
  }
  link_->tx_flush();
  return work;
}

int Lane::prepare_sleep_locked(int* fds) {
  int n = 0;
  if (int fd = link_->rx_event_fd(); fd >= 0) {
    link_->arm_rx_irq();
    fds[n++] = fd;
  }
  sleepers_.fetch_add(1);  // seq_cst: hand_over sees it, or we see its frame (inbox_waiting)
  if (inbox_fd_.valid()) fds[n++] = inbox_fd_.get();
  return n;
}

void Lane::woke() { sleepers_.fetch_sub(1); }

bool Lane::inbox_waiting() const { return inbox_ready_.load() != inbox_head_.load(std::memory_order_acquire); }

void Lane::start_thread() {
  if (thread_.joinable()) return;
  stop_ = false;
  thread_ = std::thread([this] { thread_main(); });
}

void Lane::stop_thread() {
  if (!thread_.joinable()) return;
  stop_ = true;
  thread_.join();
  stop_ = false;
}

void Lane::thread_main() {
  while (!stop_.load(std::memory_order_relaxed)) {
    int work;
    int fds[2];
    int nfds = 0;
    {
      std::lock_guard lock(mu_);
      work = progress_locked();
      if (work == 0) nfds = prepare_sleep_locked(fds);  // about to sleep on the NIC and the inbox
    }
    if (work > 0) continue;
    // Frames that came in after the round and before arming wake the
    // interrupt at once (rx_irq_arm), and the inbox is checked below.
    if (!inbox_waiting() && nfds > 0) {
      pollfd p[2] = {{fds[0], POLLIN, 0}, {nfds > 1 ? fds[1] : -1, POLLIN, 0}};
      if (::poll(p, static_cast<nfds_t>(nfds), 1) > 0) {
        for (int i = 0; i < nfds; ++i) {
          if (p[i].revents & POLLIN) {
            uint64_t v;
            [[maybe_unused]] ssize_t r = ::read(p[i].fd, &v, sizeof v);
          }
        }
      }
    } else if (nfds == 0) {
      ::usleep(50);
    }
    if (work == 0) woke();
  }
}

}  // namespace ufab::transport
