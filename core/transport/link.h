// Frames in and out for the software transport: the one thing the RoCEv2
// engine needs from a NIC. NicLink drives a ufab plugin's raw queues
// (hardware through VFIO, or the software NIC); tests and fuzzers can put
// any other frame source behind the same interface.
//
// Not thread-safe: the transport calls a link under its lane's lock.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/error.h"
#include "core/net/addresses.h"
#include "core/nic.h"

namespace ufab::transport {

class Link {
 public:
  virtual ~Link() = default;

  virtual std::string name() const = 0;
  virtual net::MacAddress mac() const = 0;
  // The link's IP MTU (1500 on standard Ethernet).
  virtual uint32_t mtu() const = 0;

  // Calls on_frame for up to `max` received frames (each valid only during
  // the call) and returns how many there were.
  virtual uint32_t receive(uint32_t max, const std::function<void(std::span<const uint8_t>)>& on_frame) = 0;

  // A buffer for the next outgoing frame, or an empty span when the NIC has
  // none free right now (the caller tries again later). The buffer stays
  // the caller's until tx_commit; acquiring again without committing hands
  // out the same buffer.
  virtual std::span<uint8_t> tx_acquire() = 0;
  // Queues the acquired buffer holding a frame of `length` bytes.
  virtual void tx_commit(size_t length) = 0;
  // Hands every queued frame to the NIC (one doorbell per burst).
  virtual void tx_flush() = 0;

  // Gather transmit (abi/raw_frame.h tx_burst_gather): a frame whose
  // payload the NIC reads where it lies instead of from a copy in the
  // frame buffer. kCpu: a software NIC, reading any memory by its address
  // during the flush; kDevice: a DMA NIC, reading by device address
  // (memory mapped for it: map_for_device) after the flush returns.
  enum class Gather : uint8_t { kNone, kCpu, kDevice };
  virtual Gather gather() const { return Gather::kNone; }
  // A piece of a gathered frame. device_addr 0: the piece lies in the
  // acquired buffer (the link knows its device address).
  struct Segment {
    const uint8_t* data;
    uint32_t length;
    uint64_t device_addr;
  };
  // Queues the acquired buffer as a frame made of `segments` (at most
  // kMaxSegments, in wire order), some of which point into that buffer.
  static constexpr size_t kMaxSegments = 4;
  virtual void tx_commit_gather(std::span<const Segment> segments) { (void)segments; }
  // Maps [addr, addr + length) for the NIC to read (kDevice links): the
  // mapping, whose device_addr() is where the NIC sees addr, lives as long
  // as the returned object. Before the object goes, quiesce_tx() on every
  // link of the NIC, so no frame still queued reads from it.
  class DeviceMapping {
   public:
    virtual ~DeviceMapping() = default;
    virtual uint64_t device_addr() const = 0;
  };
  virtual Result<std::unique_ptr<DeviceMapping>> map_for_device(void* addr, uint64_t length) {
    (void)addr;
    (void)length;
    return fail(EOPNOTSUPP, name() + " does not read frames from mapped memory");
  }
  // Flushes and waits (under the caller's lock, up to `limit`) until the
  // NIC has read every frame queued on this link; false when it has not
  // by then.
  virtual bool quiesce_tx(std::chrono::milliseconds limit) {
    (void)limit;
    tx_flush();
    return true;
  }

  // An fd that becomes readable when frames arrive (the NIC's receive
  // interrupt), or -1 when the NIC cannot interrupt. After it fires, read 8
  // bytes from it and receive until empty.
  virtual int rx_event_fd() = 0;
  // Right before sleeping on rx_event_fd(): arms the interrupt, so that
  // while the caller busy-polls the NIC need not (abi/raw_frame.h
  // rx_irq_arm). Under the caller's lock, like receive().
  virtual void arm_rx_irq() {}
};

struct NicLinkOptions {
  uint32_t ring_size = 512;     // RX and TX ring entries
  uint32_t buffer_size = 2048;  // bytes per frame buffer (RoCE frames at path MTU 1024 fit); raised for a jumbo MTU
  uint16_t max_queues = 64;     // queue pairs to use at most (the NIC's count when fewer)
  bool nic_steering = true;     // false: leave frames in queue 0 and steer in software
  bool gather = true;           // false: never use the NIC's gather transmit (copy every payload)
};

// The links of one NIC: one per queue pair the NIC has (up to
// options.max_queues), each with its own buffer pool, its receive
// interrupt when the plugin offers one, and RoCE frames steered to the
// queue of their destination QP (dest QP mod the queue count) when the
// NIC can; `steered` says whether it can (otherwise every frame lands in
// queue 0).
struct NicLinks {
  std::vector<std::unique_ptr<Link>> links;
  bool steered = false;
};
Result<NicLinks> open_nic_links(std::unique_ptr<core::Nic> nic, const NicLinkOptions& options = {});

// A Link over one queue pair of a core::Nic. The NIC stops when its last
// link goes.
class NicLink : public Link {
 public:
  ~NicLink() override;

  std::string name() const override { return nic_->name(); }
  net::MacAddress mac() const override;
  uint32_t mtu() const override { return nic_->info().mtu ? nic_->info().mtu : 1500; }
  uint32_t receive(uint32_t max, const std::function<void(std::span<const uint8_t>)>& on_frame) override;
  std::span<uint8_t> tx_acquire() override;
  void tx_commit(size_t length) override;
  void tx_flush() override;
  Gather gather() const override { return gather_; }
  void tx_commit_gather(std::span<const Segment> segments) override;
  Result<std::unique_ptr<DeviceMapping>> map_for_device(void* addr, uint64_t length) override;
  bool quiesce_tx(std::chrono::milliseconds limit) override;
  int rx_event_fd() override { return rx_fd_; }
  void arm_rx_irq() override {
    if (rx_fd_ >= 0) (void)nic_->arm_rx_irq(queue_);  // -EOPNOTSUPP: the driver re-arms by itself
  }

  core::Nic& nic() { return *nic_; }

 private:
  friend Result<NicLinks> open_nic_links(std::unique_ptr<core::Nic>, const NicLinkOptions&);
  NicLink() = default;
  void flush_frames();
  uint32_t pending_count() const { return static_cast<uint32_t>(pending_.size()) + frames_n_; }

  std::shared_ptr<core::Nic> nic_;  // stopped by its deleter, with the last link
  uint16_t queue_ = 0;
  std::shared_ptr<dma::BufferPool> pool_;     // RX buffers
  std::shared_ptr<dma::BufferPool> tx_pool_;  // TX buffers: those not free are queued or on the NIC
  ufab_buf* acquired_ = nullptr;
  // Committed, not yet taken by the NIC: buffers for tx_burst, or (a NIC
  // that gathers) frames for tx_burst_gather, in wire order either way.
  std::vector<ufab_buf*> pending_;
  std::unique_ptr<ufab_tx_frame[]> frames_;  // max_pending_ of them; [0, frames_n_) queued
  uint32_t frames_n_ = 0;
  uint32_t max_pending_ = 0;
  Gather gather_ = Gather::kNone;
  int rx_fd_ = -1;
};

}  // namespace ufab::transport
