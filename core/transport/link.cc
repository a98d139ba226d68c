#include "core/transport/link.h"

#include <algorithm>
#include <cstring>

namespace ufab::transport {

Result<NicLinks> open_nic_links(std::unique_ptr<core::Nic> owned, const NicLinkOptions& options) {
  // The NIC stops when the last of its links is destroyed.
  std::shared_ptr<core::Nic> nic(owned.release(), [](core::Nic* n) {
    (void)n->stop();
    delete n;
  });
  const ufab_dev_info& info = nic->info();
  uint16_t queues = std::max<uint16_t>(
      1, std::min({info.max_rx_queues, info.max_tx_queues, options.max_queues, uint16_t{64}}));
  uint32_t ring = std::clamp<uint32_t>(options.ring_size, info.min_ring_size ? info.min_ring_size : 1,
                                       info.max_ring_size ? info.max_ring_size : options.ring_size);
  NicLinks out;
  for (uint16_t q = 0; q < queues; ++q) {
    std::unique_ptr<NicLink> link(new NicLink());
    link->nic_ = nic;
    link->queue_ = q;
    // RX ring full, TX ring full, frames committed but not yet taken, and
    // the buffers the transport holds while building: four rings' worth.
    auto pool = nic->create_pool(ring * 4, options.buffer_size);
    if (!pool) return std::unexpected(pool.error().context("frame buffers for " + nic->name()));
    link->pool_ = *pool;
    link->max_pending_ = ring;
    link->pending_.reserve(ring);
    if (auto s = nic->setup_rx_queue(q, ring, *link->pool_); !s) return std::unexpected(s.error());
    if (auto s = nic->setup_tx_queue(q, ring); !s) return std::unexpected(s.error());
    out.links.push_back(std::move(link));
  }
  // A NIC that cannot steer by QP leaves every frame in queue 0; the
  // transport then hands frames to their lanes in software.
  out.steered = queues > 1 && options.nic_steering && nic->set_rx_steering(UFAB_STEER_ROCE_QPN, queues).has_value();
  if (auto s = nic->start(); !s) return std::unexpected(s.error());
  if (info.caps & UFAB_DEV_CAP_RX_IRQ) {
    for (uint16_t q = 0; q < queues; ++q) {
      // Without an interrupt the transport polls; a NIC that offers one but
      // fails to arm it is still usable that way.
      auto fd = nic->enable_rx_irq(q);
      if (!fd) continue;
      auto& link = static_cast<NicLink&>(*out.links[q]);
      link.rx_fd_ = *fd;
      // The transport arms before each sleep (Link::arm_rx_irq), so the
      // driver need not on every empty poll: one arm now switches it over.
      (void)nic->arm_rx_irq(q);
    }
  }
  return out;
}

NicLink::~NicLink() {
  if (acquired_ != nullptr) pool_->free(&acquired_, 1);
  if (!pending_.empty()) pool_->free(pending_.data(), static_cast<uint32_t>(pending_.size()));
}

net::MacAddress NicLink::mac() const {
  net::MacAddress m;
  std::memcpy(m.data(), nic_->info().mac, m.size());
  return m;
}

uint32_t NicLink::receive(uint32_t max, const std::function<void(std::span<const uint8_t>)>& on_frame) {
  ufab_buf* bufs[64];
  uint32_t total = 0;
  while (total < max) {
    int n = nic_->rx_burst(queue_, bufs, static_cast<uint16_t>(std::min<uint32_t>(64, max - total)));
    if (n <= 0) break;
    for (int i = 0; i < n; ++i) on_frame({bufs[i]->base + bufs[i]->offset, bufs[i]->len});
    pool_->free(bufs, static_cast<uint32_t>(n));
    total += static_cast<uint32_t>(n);
  }
  return total;
}

std::span<uint8_t> NicLink::tx_acquire() {
  if (acquired_ == nullptr) {
    if (pending_.size() >= max_pending_) tx_flush();
    if (pending_.size() >= max_pending_ || pool_->alloc(&acquired_, 1) != 1) {
      acquired_ = nullptr;
      return {};
    }
  }
  return {acquired_->base + acquired_->offset, acquired_->capacity - acquired_->offset};
}

void NicLink::tx_commit(size_t length) {
  if (acquired_ == nullptr) return;
  acquired_->len = static_cast<uint32_t>(length);
  pending_.push_back(acquired_);
  acquired_ = nullptr;
}

void NicLink::tx_flush() {
  if (pending_.empty()) {
    // A burst of no frames lets the NIC finish what it holds back: swnic's
    // reorder injection keeps a frame until the next burst, which a window
    // that waits for its ACKs would otherwise never send.
    (void)nic_->tx_burst(queue_, nullptr, 0);
    return;
  }
  size_t sent = 0;
  while (sent < pending_.size()) {
    auto burst = static_cast<uint16_t>(std::min<size_t>(pending_.size() - sent, 64));
    int n = nic_->tx_burst(queue_, pending_.data() + sent, burst);
    if (n <= 0) break;  // ring full: the rest waits for the next flush
    sent += static_cast<size_t>(n);
  }
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<ptrdiff_t>(sent));
}

}  // namespace ufab::transport
