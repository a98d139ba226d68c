#include "core/transport/link.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "vfio/iommu.h"

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
  // A NIC with a jumbo MTU (e1000e's mtu=9000, say) needs buffers that
  // hold its largest frame: the MTU plus the Ethernet header, a VLAN tag and
  // slack, in whole KiB (what e1000e's receive buffers come in), after the
  // pool's 128 bytes of headroom. At 1500 the given size stays.
  uint32_t buffer_size = options.buffer_size;
  if (info.mtu > 1500) {
    constexpr uint32_t kHeadroom = 128;  // dma::BufferPool::create's default
    buffer_size = std::max(buffer_size, kHeadroom + (info.mtu + 22 + 1023) / 1024 * 1024);
  }
  NicLinks out;
  for (uint16_t q = 0; q < queues; ++q) {
    std::unique_ptr<NicLink> link(new NicLink());
    link->nic_ = nic;
    link->queue_ = q;
    // RX: the ring full and a ring's worth being handed up. TX: the ring
    // full, frames committed but not yet taken, and the one being built.
    // Apart, so a TX buffer not free is one the NIC may still read
    // (quiesce_tx).
    auto pool = nic->create_pool(ring * 2, buffer_size);
    if (!pool) return std::unexpected(pool.error().context("frame buffers for " + nic->name()));
    auto tx_pool = nic->create_pool(ring * 2 + 1, buffer_size);
    if (!tx_pool) return std::unexpected(tx_pool.error().context("frame buffers for " + nic->name()));
    link->pool_ = *pool;
    link->tx_pool_ = *tx_pool;
    link->max_pending_ = ring;
    if (options.gather && nic->can_gather()) {
      link->gather_ = nic->iommu() ? Link::Gather::kDevice : Link::Gather::kCpu;
      link->frames_.reset(new ufab_tx_frame[ring]);  // filled as frames are committed
    } else {
      link->pending_.reserve(ring);
    }
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
  if (acquired_ != nullptr) tx_pool_->free(&acquired_, 1);
  if (!pending_.empty()) tx_pool_->free(pending_.data(), static_cast<uint32_t>(pending_.size()));
  for (uint32_t i = 0; i < frames_n_; ++i) tx_pool_->free(&frames_[i].buf, 1);
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
    if (pending_count() >= max_pending_) tx_flush();
    if (pending_count() >= max_pending_ || tx_pool_->alloc(&acquired_, 1) != 1) {
      acquired_ = nullptr;
      return {};
    }
  }
  return {acquired_->base + acquired_->offset, acquired_->capacity - acquired_->offset};
}

void NicLink::tx_commit(size_t length) {
  if (acquired_ == nullptr) return;
  acquired_->len = static_cast<uint32_t>(length);
  if (gather_ == Gather::kNone) {
    pending_.push_back(acquired_);
  } else {
    // One queue in wire order: a frame from the buffer alone is a frame of
    // one segment (filled field by field: this is every ACK's path).
    ufab_tx_frame& f = frames_[frames_n_++];
    const uint8_t* data = acquired_->base + acquired_->offset;
    f.buf = acquired_;
    f.nsegs = 1;
    f.len = acquired_->len;
    f.segs[0] = {data, gather_ == Gather::kCpu ? reinterpret_cast<uintptr_t>(data) : acquired_->base_iova + acquired_->offset,
                 acquired_->len, 0};
  }
  acquired_ = nullptr;
}

void NicLink::tx_commit_gather(std::span<const Segment> segments) {
  if (acquired_ == nullptr || gather_ == Gather::kNone || segments.empty() || segments.size() > UFAB_TX_SEGS_MAX)
    return;
  ufab_tx_frame& f = frames_[frames_n_++];
  f.buf = acquired_;
  f.nsegs = static_cast<uint32_t>(segments.size());
  f.len = 0;
  const uint8_t* base = acquired_->base;
  for (size_t i = 0; i < segments.size(); ++i) {
    const Segment& s = segments[i];
    uint64_t addr = s.device_addr;
    if (addr == 0) {
      addr = gather_ == Gather::kCpu ? reinterpret_cast<uintptr_t>(s.data)
                                     : acquired_->base_iova + static_cast<uint64_t>(s.data - base);
    }
    f.segs[i] = ufab_tx_seg{s.data, addr, s.length, 0};
    f.len += s.length;
  }
  acquired_->len = f.len;
  acquired_ = nullptr;
}

void NicLink::tx_flush() {
  if (gather_ != Gather::kNone) {
    flush_frames();
    return;
  }
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
    if (n == 0) break;  // ring full: the rest waits for the next flush
    if (n < 0) {
      tx_pool_->free(&pending_[sent], 1);  // refused: dropped, as in flush_frames
      n = 1;
    }
    sent += static_cast<size_t>(n);
  }
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<ptrdiff_t>(sent));
}

void NicLink::flush_frames() {
  if (frames_n_ == 0) {
    (void)nic_->tx_burst(queue_, nullptr, 0);  // as in tx_flush
    return;
  }
  uint32_t sent = 0;
  while (sent < frames_n_) {
    auto burst = static_cast<uint16_t>(std::min<uint32_t>(frames_n_ - sent, 64));
    int n = nic_->tx_burst_gather(queue_, frames_.get() + sent, burst);
    if (n == 0) break;  // ring full: the rest waits for the next flush
    if (n < 0) {
      // The NIC refused the first frame (stopped, or a frame it cannot
      // send): drop it rather than let it block the queue for good.
      tx_pool_->free(&frames_[sent].buf, 1);
      n = 1;
    }
    sent += static_cast<uint32_t>(n);
  }
  if (sent < frames_n_) std::memmove(frames_.get(), frames_.get() + sent, (frames_n_ - sent) * sizeof(ufab_tx_frame));
  frames_n_ -= sent;
}

namespace {

// A region pinned and mapped in the NIC's IOMMU for the NIC to read.
class IommuMapping : public Link::DeviceMapping {
 public:
  IommuMapping(vfio::DmaMapping mapping, uint64_t device_addr)
      : mapping_(std::move(mapping)), device_addr_(device_addr) {}
  uint64_t device_addr() const override { return device_addr_; }

 private:
  vfio::DmaMapping mapping_;
  uint64_t device_addr_;
};

}  // namespace

Result<std::unique_ptr<Link::DeviceMapping>> NicLink::map_for_device(void* addr, uint64_t length) {
  auto iommu = nic_->iommu();
  if (gather_ != Gather::kDevice || !iommu) return Link::map_for_device(addr, length);
  // The IOMMU maps whole pages: the pages the region touches.
  const uint64_t page = iommu->info().min_page_size();
  const uint64_t start = reinterpret_cast<uintptr_t>(addr);
  const uint64_t first = start & ~(page - 1);
  if (length > UINT64_MAX - start - page) return fail(EINVAL, "region wraps around the address space");
  const uint64_t end = (start + length + page - 1) & ~(page - 1);
  auto mapping = iommu->map_dma(reinterpret_cast<void*>(first), end - first, vfio::DmaAccess::device_reads);
  if (!mapping) return std::unexpected(mapping.error().context("mapping a memory region for " + nic_->name()));
  uint64_t device_addr = mapping->iova() + (start - first);
  return std::make_unique<IommuMapping>(std::move(*mapping), device_addr);
}

bool NicLink::quiesce_tx(std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    tx_flush();  // also lets the driver reclaim what the NIC has sent
    // Every TX buffer not free, queued or being built is on the NIC.
    uint32_t held = (acquired_ ? 1 : 0) + pending_count();
    if (tx_pool_->available() + held >= tx_pool_->capacity()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace ufab::transport
