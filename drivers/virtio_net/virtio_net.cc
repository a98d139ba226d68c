// virtio-net over modern virtio-pci (virtio 1.1 sections 3.1, 4.1, 5.1), as a
// ufab driver plugin. As many RX/TX queue pairs as the device has (up to 8;
// VIRTIO_NET_F_MQ with the control virtqueue, 5.1.6.5.5), one descriptor per
// frame (tx_burst) or a descriptor chain per gathered frame (tx_burst_gather),
// no offloads. QEMU's device has one pair on the test bed's hub
// backend and N with a tap backend of N queues. Each queue's state is its
// own, so one thread per queue needs no lock. See docs/drivers/virtio_net.md.
#include "drivers/virtio_net/virtio_net.h"

#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>

#include "drivers/sdk/adapter.h"
#include "drivers/sdk/tx_frame.h"
#include "drivers/virtio_net/virtio_pci.h"
#include "drivers/virtio_net/virtqueue.h"
#include "vfio/mmio.h"

namespace ufab::virtio {
namespace {

using vfio::Mmio;
using vfio::Reg16;
using vfio::Reg32;
using vfio::Reg8;

constexpr uint64_t kRequiredFeatures = feature_bit(kFeatureVersion1) | feature_bit(kFeatureAccessPlatform);
constexpr uint64_t kWantedFeatures =
    kRequiredFeatures | feature_bit(kFeatureNetMac) | feature_bit(kFeatureNetStatus);

// Largest frame accepted for TX and guaranteed to fit an RX buffer: 1514 plus
// one VLAN tag. 5.1.6.3.1: without MRG_RXBUF or GSO, RX buffers must hold at
// least 1526 bytes (header + 1514).
constexpr uint32_t kMaxFrame = 1518;
constexpr uint32_t kMinFrame = 14;  // an Ethernet header
constexpr uint32_t kMinRxBuffer = kNetHeaderSize + 1514;
constexpr uint32_t kMinRing = 8;
constexpr uint32_t kBatch = 64;  // completions handled per reap call
// Queue pairs driven at most; interrupt mode asks for one MSI-X vector per
// RX queue (QEMU's virtio-net-pci has 2 * backend queues + 2 by default).
constexpr uint16_t kMaxPairs = 8;

std::string hex(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

std::string mac_text(const uint8_t* m) {
  char b[24];
  std::snprintf(b, sizeof b, "%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4], m[5]);
  return b;
}

const ufab_pci_match kMatch[] = {
    {kVendorRedHat, kDeviceNetModern, UFAB_PCI_ANY, UFAB_PCI_ANY, 0, 0, "virtio-net (modern)"},
    {0, 0, 0, 0, 0, 0, nullptr},
};

// Registers of the common configuration structure, validated once.
struct CommonRegs {
  Reg32 dfselect, dfeature, gfselect, gfeature;
  Reg16 msix_config, num_queues;
  Reg8 status, generation;
  Reg16 q_select, q_size, q_msix, q_enable, q_notify_off;
  Reg32 q_desc_lo, q_desc_hi, q_driver_lo, q_driver_hi, q_device_lo, q_device_hi;
};

// A queue's DMA block: the ring (RingLayout), then at header_offset() a
// 12-byte virtio-net header that stays all zero (5.1.6.2: no checksum
// offload, no GSO), the first descriptor of every gathered frame's chain.
size_t header_offset(const RingLayout& l) { return (l.bytes + 63) & ~size_t{63}; }
size_t block_bytes(const RingLayout& l) { return header_offset(l) + 64; }

struct Queue {
  SplitQueue ring;
  uint64_t header_iova = 0;  // the zero header in this queue's block (TX)
  ufab_dma_mem mem{};
  bool allocated = false;
  uint32_t size = 0;       // configured (0: not set up)
  uint16_t max_size = 0;   // device maximum
  uint16_t vq = 0;         // virtqueue index (receiveqN / transmitqN)
  Reg16 notify;            // this queue's doorbell
  ufab_pool* pool = nullptr;
  // Interrupt mode (RX) and counters: per queue, so threads on different
  // queues never write the same memory.
  bool irq_mode = false;
  bool rx_was_empty = true;
  uint64_t packets = 0, bytes = 0, errors = 0, irqs = 0;
};

// The control virtqueue (5.1.6.5), used only for VQ_PAIRS_SET: one command
// at a time, always descriptors 0 (class, command, data; the device reads)
// and 1 (the ack byte; the device writes), so it needs no free list. The
// command buffer sits in the same DMA block, after the ring.
struct ControlQueue {
  ufab_dma_mem mem{};
  bool allocated = false;
  uint16_t vq = 0;
  uint16_t size = 0;
  RingLayout layout;
  size_t cmd_offset = 0;  // in the block: 16 bytes of command, then the ack
  uint16_t avail_idx = 0, used_idx = 0;
  Reg16 notify;
};

class VirtioNet {
 public:
  static int open(const ufab_host_ops* ops, ufab_host* host, VirtioNet** out);
  ~VirtioNet();

  int info(ufab_dev_info* out);
  int link(ufab_link* out);
  int rx_queue_setup(uint16_t queue, const ufab_queue_conf* conf);
  int tx_queue_setup(uint16_t queue, const ufab_queue_conf* conf);
  int start();
  int stop();
  int rx_burst(uint16_t queue, ufab_buf** bufs, uint16_t n);
  int tx_burst(uint16_t queue, ufab_buf** bufs, uint16_t n);
  int tx_burst_gather(uint16_t queue, const ufab_tx_frame* frames, uint16_t n);
  int stats(ufab_stats* out);
  int rx_irq(uint16_t queue, int enable, int* eventfd);
  int rx_irq_arm(uint16_t queue);
  int set_promiscuous(int enable);
  int rx_steer(uint32_t mode, uint16_t nqueues);

 private:
  bool mq() const { return (features_ & feature_bit(kFeatureNetMq)) != 0; }
  // The queue, or nullptr after set_error.
  Queue* rx_queue(uint16_t queue, const char* what);
  Queue* tx_queue(uint16_t queue, const char* what);
  std::string no_such_queue(const char* kind, uint16_t queue) const;
  VirtioNet(const ufab_host_ops* ops, ufab_host* host) : ops_(ops), host_(host) {
    for (int& fd : irq_fd_) fd = -1;
  }

  int error(int err, const std::string& message) {
    ops_->set_error(host_, (name_ + ": " + message).c_str());
    return -err;
  }
  void log(int level, const std::string& message) { ops_->log(host_, level, (name_ + ": " + message).c_str()); }

  int init();
  int map_region(const Region& r, const char* what, uint32_t min_length, Mmio* out);
  int reset_device();
  int negotiate();
  int read_device_config();
  int setup_queue(Queue& q, uint32_t size, const char* what);
  int program_vq(uint16_t index, uint16_t size, uint64_t desc, uint64_t avail, uint64_t used, uint16_t vector,
                 Reg16* notify);
  int program_queue(Queue& q, uint16_t vector) {
    return program_vq(q.vq, static_cast<uint16_t>(q.size), q.ring.desc_iova(), q.ring.avail_iova(),
                      q.ring.used_iova(), vector, &q.notify);
  }
  int program_control();
  int set_queue_pairs(uint16_t pairs);
  int set_rx_vector(Queue& q, uint16_t vector);
  void release_buffers();
  void free_ring(Queue& q);
  int refill_rx(Queue& q);
  void reclaim_tx(Queue& q);
  int running_tx(uint16_t queue, const char* what, Queue** out);
  void post_tx(Queue& q, uint16_t frames, uint64_t bytes);
  void kick(Queue& q) {
    vfio::barrier::descriptors_before_doorbell();
    q.notify.write(q.vq);
  }

  const ufab_host_ops* ops_;
  ufab_host* host_;
  std::string name_ = "virtio-net";
  Capabilities caps_;
  std::map<uint32_t, Mmio> bars_;
  Mmio common_win_, device_win_, notify_win_;
  CommonRegs c_;
  uint64_t features_ = 0;
  uint64_t offered_ = 0;  // what the device offered (MQ and RSS are not taken)
  uint16_t num_queues_ = 0;
  uint16_t device_pairs_ = 1;  // max_virtqueue_pairs (1 without MQ)
  uint16_t pairs_ = 1;         // pairs offered to callers: min(device_pairs_, kMaxPairs)
  uint16_t active_pairs_ = 0;  // pairs started (0 while stopped)
  uint8_t mac_[6]{};
  Queue rx_[kMaxPairs], tx_[kMaxPairs];
  ControlQueue ctrl_;
  bool started_ = false;
  bool initialized_ = false;  // features negotiated since the last reset
  bool promiscuous_ = false;
  bool irq_vectors_ = false;  // MSI-X vectors 0..pairs_-1 enabled (RX queue q -> vector q)
  int irq_fd_[kMaxPairs];
};

// ------------------------------------------------------------------ open

int VirtioNet::open(const ufab_host_ops* ops, ufab_host* host, VirtioNet** out) {
  if (!ops || !out) return -EINVAL;
  if (ops->size < offsetof(ufab_host_ops, buf_free) + sizeof(ops->buf_free)) {
    if (ops->size >= offsetof(ufab_host_ops, set_error) + sizeof(ops->set_error) && ops->set_error)
      ops->set_error(host, "virtio-net: the host's service table is older than this plugin (no buffer services); "
                           "use a ufab build at least as new as the plugin");
    return -ENOTSUP;
  }
  std::unique_ptr<VirtioNet> dev(new VirtioNet(ops, host));
  if (const char* n = ops->name(host)) dev->name_ = std::string("virtio-net ") + n;
  if (int rc = dev->init(); rc < 0) return rc;  // ~VirtioNet resets the device
  *out = dev.release();
  return 0;
}

int VirtioNet::map_region(const Region& r, const char* what, uint32_t min_length, Mmio* out) {
  if (!r.present)
    return error(ENODEV, std::string("the device has no virtio ") + what +
                             " capability; it is not a modern (virtio 1.x) device. Start QEMU's virtio-net-pci "
                             "with disable-legacy=on (or use a PCIe slot), or use a legacy driver");
  if (r.length < min_length)
    return error(EPROTO, std::string("the virtio ") + what + " structure is " + std::to_string(r.length) +
                             " bytes, shorter than the " + std::to_string(min_length) + " the spec defines");
  auto it = bars_.find(r.bar);
  if (it == bars_.end()) {
    volatile void* base = nullptr;
    uint64_t size = 0;
    if (int rc = ops_->map_bar(host_, r.bar, &base, &size); rc < 0)
      return error(-rc, "mapping BAR" + std::to_string(r.bar) + " (which holds the virtio " + what +
                            " structure) failed: " + std::strerror(-rc));
    it = bars_.emplace(r.bar, Mmio(const_cast<void*>(base), size)).first;
  }
  auto win = it->second.subwindow(r.offset, r.length);
  if (!win)
    return error(EPROTO, std::string("the virtio ") + what + " structure (BAR" + std::to_string(r.bar) + " " +
                             hex(r.offset) + "+" + hex(r.length) + ") lies outside the BAR: " +
                             win.error().message());
  *out = *win;
  return 0;
}

int VirtioNet::init() {
  std::string why;
  ConfigRead read = [this](uint32_t off, uint32_t len, uint32_t* v) { return ops_->config_read(host_, off, len, v); };
  if (int rc = find_capabilities(read, &caps_, &why); rc < 0)
    return error(-rc, "walking the PCI capabilities failed: " + why);
  if (int rc = map_region(caps_.common, "common configuration", common::kMinLength, &common_win_); rc < 0) return rc;
  if (int rc = map_region(caps_.notify, "notification", 2, &notify_win_); rc < 0) return rc;
  if (int rc = map_region(caps_.device, "device-specific configuration", 0, &device_win_); rc < 0) return rc;
  // The ISR structure only matters for INTx, which this driver never uses.

  // Validate every common register once; the hot path never touches them.
  const uint64_t b = caps_.common.offset;
  bool ok = true;
  auto r32 = [&](uint32_t off, Reg32& reg) { auto x = common_win_.reg32(b + off); ok = ok && x; if (x) reg = *x; };
  auto r16 = [&](uint32_t off, Reg16& reg) { auto x = common_win_.reg16(b + off); ok = ok && x; if (x) reg = *x; };
  auto r8 = [&](uint32_t off, Reg8& reg) { auto x = common_win_.reg8(b + off); ok = ok && x; if (x) reg = *x; };
  r32(common::kDeviceFeatureSelect, c_.dfselect);
  r32(common::kDeviceFeature, c_.dfeature);
  r32(common::kDriverFeatureSelect, c_.gfselect);
  r32(common::kDriverFeature, c_.gfeature);
  r16(common::kMsixConfig, c_.msix_config);
  r16(common::kNumQueues, c_.num_queues);
  r8(common::kDeviceStatus, c_.status);
  r8(common::kConfigGeneration, c_.generation);
  r16(common::kQueueSelect, c_.q_select);
  r16(common::kQueueSize, c_.q_size);
  r16(common::kQueueMsixVector, c_.q_msix);
  r16(common::kQueueEnable, c_.q_enable);
  r16(common::kQueueNotifyOff, c_.q_notify_off);
  r32(common::kQueueDescLo, c_.q_desc_lo);
  r32(common::kQueueDescHi, c_.q_desc_hi);
  r32(common::kQueueDriverLo, c_.q_driver_lo);
  r32(common::kQueueDriverHi, c_.q_driver_hi);
  r32(common::kQueueDeviceLo, c_.q_device_lo);
  r32(common::kQueueDeviceHi, c_.q_device_hi);
  if (!ok) return error(EPROTO, "the virtio common configuration structure is misaligned in its BAR");

  if (int rc = ops_->enable_bus_master(host_); rc < 0)
    return error(-rc, std::string("enabling PCI bus mastering failed: ") + std::strerror(-rc) +
                          "; without it the device cannot reach its rings");
  if (int rc = negotiate(); rc < 0) return rc;

  num_queues_ = c_.num_queues.read();
  if (num_queues_ < 2)
    return error(ENODEV, "the device has " + std::to_string(num_queues_) +
                             " virtqueues; virtio-net needs at least receiveq1 and transmitq1");
  if (int rc = read_device_config(); rc < 0) return rc;
  device_pairs_ = 1;
  if (mq()) {
    // 5.1.4: max_virtqueue_pairs exists with MQ; 1..0x8000.
    if (!device_win_.contains(caps_.device.offset, netcfg::kMqLength))
      return error(EPROTO, "the device offers VIRTIO_NET_F_MQ but its configuration is " +
                               std::to_string(caps_.device.length) + " bytes, too short for max_virtqueue_pairs");
    for (int tries = 0; tries < 100; ++tries) {
      uint8_t gen = c_.generation.read();
      device_pairs_ = *device_win_.read16(caps_.device.offset + netcfg::kMaxVirtqueuePairs);
      if (c_.generation.read() == gen) break;
    }
    if (device_pairs_ < ctrl::kMinPairs || device_pairs_ > ctrl::kMaxPairs || 2u * device_pairs_ + 1 > num_queues_)
      return error(EPROTO, "the device reports " + std::to_string(device_pairs_) + " queue pairs but has " +
                               std::to_string(num_queues_) + " virtqueues (2 per pair plus the control queue)");
  }
  pairs_ = std::min(device_pairs_, kMaxPairs);
  for (uint16_t p = 0; p < pairs_; ++p) {
    for (Queue* q : {&rx_[p], &tx_[p]}) {
      q->vq = q == &rx_[p] ? rx_vq(p) : tx_vq(p);
      c_.q_select.write(q->vq);
      q->max_size = c_.q_size.read();
      if (q->max_size == 0) return error(ENODEV, "virtqueue " + std::to_string(q->vq) + " is unavailable (size 0)");
    }
  }
  if (mq()) {
    ctrl_.vq = static_cast<uint16_t>(2 * device_pairs_);
    c_.q_select.write(ctrl_.vq);
    ctrl_.size = c_.q_size.read();
    if (ctrl_.size < 2 || (ctrl_.size & (ctrl_.size - 1)))
      return error(ENODEV, "the control virtqueue (" + std::to_string(ctrl_.vq) + ") has size " +
                               std::to_string(ctrl_.size) + "; VQ_PAIRS_SET needs a power of two of at least 2");
  }
  log(UFAB_LOG_INFO, "MAC " + mac_text(mac_) + ", features " + hex(features_) + ", queue sizes rx " +
                         std::to_string(rx_[0].max_size) + " tx " + std::to_string(tx_[0].max_size) + ", " +
                         std::to_string(num_queues_) + " virtqueues, " + std::to_string(device_pairs_) +
                         " queue pair(s)" + (device_pairs_ > pairs_ ? " (using " + std::to_string(pairs_) + ")" : ""));
  return 0;
}

int VirtioNet::reset_device() {
  // 4.1.4.3.2: write 0, then wait until status reads back 0 before
  // reinitializing; the device has stopped using the rings at that point.
  c_.status.write(0);
  for (int i = 0; i < 2000; ++i) {
    if (c_.status.read() == 0) return 0;
    struct timespec ts{0, 500 * 1000};
    nanosleep(&ts, nullptr);
  }
  return error(ETIMEDOUT, "the device did not finish its reset within 1 s (status still " +
                              hex(c_.status.read()) + "); the device or the VM is stuck, try a fresh bind");
}

// 3.1.1: reset, ACKNOWLEDGE, DRIVER, features, FEATURES_OK (read back).
int VirtioNet::negotiate() {
  initialized_ = false;
  if (int rc = reset_device(); rc < 0) return rc;
  c_.status.write(kStatusAcknowledge);
  c_.status.write(kStatusAcknowledge | kStatusDriver);

  c_.dfselect.write(0);
  uint64_t offered = c_.dfeature.read();
  c_.dfselect.write(1);
  offered |= uint64_t{c_.dfeature.read()} << 32;

  auto give_up = [&](int err, const std::string& msg) {
    c_.status.write(c_.status.read() | kStatusFailed);
    return error(err, msg);
  };
  if (!(offered & feature_bit(kFeatureVersion1)))
    return give_up(ENOTSUP, "the device does not offer VIRTIO_F_VERSION_1 (offered " + hex(offered) +
                                "); this driver speaks only modern virtio 1.x: use a virtio 1.x device "
                                "(QEMU: virtio-net-pci,disable-legacy=on)");
  if (!(offered & feature_bit(kFeatureAccessPlatform)))
    return give_up(ENOTSUP, "the device does not offer VIRTIO_F_ACCESS_PLATFORM: device bypasses the IOMMU and "
                            "would DMA to physical addresses, not to our IOVAs; start QEMU with "
                            "iommu_platform=on (virtio-net-pci,disable-legacy=on,iommu_platform=on)");
  uint64_t accepted = offered & kWantedFeatures;
  // Multiqueue needs the control virtqueue to switch pairs on (5.1.3.1).
  constexpr uint64_t kMq = feature_bit(kFeatureNetMq) | feature_bit(kFeatureNetCtrlVq);
  if ((offered & kMq) == kMq) accepted |= kMq;
  c_.gfselect.write(0);
  c_.gfeature.write(static_cast<uint32_t>(accepted));
  c_.gfselect.write(1);
  c_.gfeature.write(static_cast<uint32_t>(accepted >> 32));
  c_.status.write(kStatusAcknowledge | kStatusDriver | kStatusFeaturesOk);
  if (!(c_.status.read() & kStatusFeaturesOk))
    return give_up(ENOTSUP, "the device refused our feature set " + hex(accepted) + " (offered " + hex(offered) +
                                "): FEATURES_OK did not stick; it needs a feature this driver does not implement");
  features_ = accepted;
  offered_ = offered;
  initialized_ = true;
  return 0;
}

int VirtioNet::read_device_config() {
  bool have_mac = features_ & feature_bit(kFeatureNetMac);
  if (have_mac || (features_ & feature_bit(kFeatureNetStatus))) {
    if (!device_win_.contains(caps_.device.offset, netcfg::kMinLength))
      return error(EPROTO, "the virtio-net device configuration is " + std::to_string(caps_.device.length) +
                               " bytes; the MAC and status fields need 8");
  }
  if (have_mac) {
    // 4.1.4.3.1 / 2.4: re-read until config_generation is stable.
    for (int tries = 0; tries < 100; ++tries) {
      uint8_t gen = c_.generation.read();
      for (uint32_t i = 0; i < 6; ++i) mac_[i] = *device_win_.read8(caps_.device.offset + netcfg::kMac + i);
      if (c_.generation.read() == gen) break;
    }
  } else {
    // 5.1.5: without VIRTIO_NET_F_MAC the driver picks its own address.
    std::random_device rd;
    for (auto& m : mac_) m = static_cast<uint8_t>(rd());
    mac_[0] = static_cast<uint8_t>((mac_[0] & 0xfe) | 0x02);  // unicast, locally administered
    log(UFAB_LOG_WARN, "the device has no MAC address (no VIRTIO_NET_F_MAC); using random " + mac_text(mac_));
  }
  return 0;
}

VirtioNet::~VirtioNet() {
  // The device must stop DMA before its rings and buffers go away.
  if (c_.status.address() != nullptr) {
    c_.status.write(0);
    for (int i = 0; i < 2000 && c_.status.read() != 0; ++i) {
      struct timespec ts{0, 500 * 1000};
      nanosleep(&ts, nullptr);
    }
  }
  release_buffers();
  if (irq_vectors_) ops_->irq_disable(host_);
  for (uint16_t p = 0; p < kMaxPairs; ++p) {
    free_ring(rx_[p]);
    free_ring(tx_[p]);
  }
  if (ctrl_.allocated) ops_->dma_free(host_, &ctrl_.mem);
}

// ------------------------------------------------------------ info, link

int VirtioNet::info(ufab_dev_info* out) {
  *out = ufab_dev_info{};
  std::memcpy(out->mac, mac_, 6);
  out->max_rx_queues = pairs_;
  out->max_tx_queues = pairs_;
  out->min_ring_size = kMinRing;
  out->max_ring_size = std::min(rx_[0].max_size, tx_[0].max_size);
  out->mtu = 1500;
  out->max_mtu = 1500;
  out->caps = caps_.has_msix ? UFAB_DEV_CAP_RX_IRQ : 0;
  std::snprintf(out->model, sizeof out->model, "virtio-net (virtio 1.x, modern PCI)");
  return 0;
}

int VirtioNet::link(ufab_link* out) {
  *out = ufab_link{1, 0, 1};
  // 5.1.4: status is only meaningful when VIRTIO_NET_F_STATUS was negotiated;
  // otherwise the link is assumed up.
  if (features_ & feature_bit(kFeatureNetStatus)) {
    uint16_t st = 0;
    for (int tries = 0; tries < 100; ++tries) {
      uint8_t gen = c_.generation.read();
      st = *device_win_.read16(caps_.device.offset + netcfg::kStatus);
      if (c_.generation.read() == gen) break;
    }
    out->up = (st & netcfg::kStatusLinkUp) ? 1 : 0;
  }
  uint8_t status = c_.status.read();
  if (status & kStatusNeedsReset) out->up = 0;
  return 0;
}

// ----------------------------------------------------------------- queues

std::string VirtioNet::no_such_queue(const char* kind, uint16_t queue) const {
  std::string m = std::string(kind) + " queue " + std::to_string(queue) + " does not exist; ";
  if (pairs_ == 1) {
    return m +
           "this device has one queue pair, queue 0 (QEMU gives virtio-net as many pairs as its backend has queues "
           "and offers them only with mq=on; docs/drivers/virtio_net.md)";
  }
  return m + "this device has " + std::to_string(pairs_) + " queue pairs, queues 0.." + std::to_string(pairs_ - 1);
}

Queue* VirtioNet::rx_queue(uint16_t queue, const char* what) {
  if (queue < pairs_) return &rx_[queue];
  error(EINVAL, std::string(what) + ": " + no_such_queue("RX", queue));
  return nullptr;
}

Queue* VirtioNet::tx_queue(uint16_t queue, const char* what) {
  if (queue < pairs_) return &tx_[queue];
  error(EINVAL, std::string(what) + ": " + no_such_queue("TX", queue));
  return nullptr;
}

int VirtioNet::setup_queue(Queue& q, uint32_t size, const char* what) {
  if (started_) return error(EBUSY, std::string("cannot set up the ") + what + " queue while started; stop() first");
  if (size < kMinRing || size > q.max_size || (size & (size - 1)) != 0)
    return error(EINVAL, std::string(what) + " ring size " + std::to_string(size) + " is not a power of two in " +
                             std::to_string(kMinRing) + ".." + std::to_string(q.max_size) +
                             " (the device's maximum for virtqueue " + std::to_string(q.vq) + ")");
  RingLayout layout = RingLayout::for_size(size);
  const size_t bytes = block_bytes(layout);
  if (q.allocated && q.mem.size < bytes) free_ring(q);
  if (!q.allocated) {
    if (int rc = ops_->dma_alloc(host_, bytes, kRingBlockAlign, &q.mem); rc < 0)
      return error(-rc, std::string("allocating ") + std::to_string(bytes) + " bytes of DMA memory for the " +
                            what + " virtqueue failed: " + std::strerror(-rc));
    q.allocated = true;
  }
  if (auto st = q.ring.init(size, q.mem.va, q.mem.iova, q.mem.size); !st)
    return error(st.error().code(), st.error().message());
  // A reused block may hold an old ring where the header now goes.
  std::memset(static_cast<uint8_t*>(q.mem.va) + header_offset(layout), 0, kNetHeaderSize);
  q.header_iova = q.mem.iova + header_offset(layout);
  q.size = size;
  return 0;
}

int VirtioNet::rx_queue_setup(uint16_t queue, const ufab_queue_conf* conf) {
  Queue* q = rx_queue(queue, "rx_queue_setup");
  if (!q) return -EINVAL;
  if (!conf || !conf->pool) return error(EINVAL, "the RX queue needs a buffer pool (ufab_queue_conf.pool)");
  if (int rc = setup_queue(*q, conf->size, "RX"); rc < 0) return rc;
  q->pool = conf->pool;
  return 0;
}

int VirtioNet::tx_queue_setup(uint16_t queue, const ufab_queue_conf* conf) {
  Queue* q = tx_queue(queue, "tx_queue_setup");
  if (!q) return -EINVAL;
  if (!conf) return error(EINVAL, "no TX queue configuration given");
  return setup_queue(*q, conf->size, "TX");
}

// 4.1.5.1.3: select, size, vector, addresses, notify offset, enable.
int VirtioNet::program_vq(uint16_t index, uint16_t size, uint64_t desc, uint64_t avail, uint64_t used,
                          uint16_t vector, Reg16* notify) {
  c_.q_select.write(index);
  if (c_.q_enable.read() != 0)
    return error(EBUSY, "virtqueue " + std::to_string(index) + " is already enabled after a reset");
  c_.q_size.write(size);
  c_.q_msix.write(vector);
  if (vector != kNoVector && c_.q_msix.read() != vector)
    return error(EIO, "the device refused MSI-X vector " + std::to_string(vector) + " for virtqueue " +
                          std::to_string(index) + " (read back " + hex(c_.q_msix.read()) + ")");
  auto split = [](Reg32 lo, Reg32 hi, uint64_t v) {
    lo.write(static_cast<uint32_t>(v));
    hi.write(static_cast<uint32_t>(v >> 32));
  };
  split(c_.q_desc_lo, c_.q_desc_hi, desc);
  split(c_.q_driver_lo, c_.q_driver_hi, avail);
  split(c_.q_device_lo, c_.q_device_hi, used);
  // 4.1.4.4: the doorbell is at cap.offset + queue_notify_off * multiplier.
  uint64_t off = caps_.notify.offset + uint64_t{c_.q_notify_off.read()} * caps_.notify_multiplier;
  auto reg = notify_win_.reg16(off);
  if (!reg)
    return error(EPROTO, "virtqueue " + std::to_string(index) + "'s doorbell at " + hex(off) +
                             " lies outside the notification structure: " + reg.error().message());
  *notify = *reg;
  c_.q_enable.write(1);
  return 0;
}

// The control virtqueue: its block is allocated once, zeroed and programmed
// at every start (a reset forgets queues and restarts the indices at 0).
int VirtioNet::program_control() {
  ctrl_.layout = RingLayout::for_size(ctrl_.size);
  ctrl_.cmd_offset = (ctrl_.layout.bytes + 63) & ~size_t{63};
  if (!ctrl_.allocated) {
    if (int rc = ops_->dma_alloc(host_, ctrl_.cmd_offset + 64, kRingBlockAlign, &ctrl_.mem); rc < 0)
      return error(-rc, std::string("allocating DMA memory for the control virtqueue failed: ") + std::strerror(-rc));
    ctrl_.allocated = true;
  }
  std::memset(ctrl_.mem.va, 0, ctrl_.mem.size);
  ctrl_.avail_idx = ctrl_.used_idx = 0;
  // No interrupts from it: completions are polled (2.6.7 NO_INTERRUPT).
  auto* avail = static_cast<uint8_t*>(ctrl_.mem.va) + ctrl_.layout.avail;
  *reinterpret_cast<volatile uint16_t*>(avail) = htole16(kAvailFlagNoInterrupt);
  const uint64_t iova = ctrl_.mem.iova;
  return program_vq(ctrl_.vq, ctrl_.size, iova + ctrl_.layout.desc, iova + ctrl_.layout.avail,
                    iova + ctrl_.layout.used, kNoVector, &ctrl_.notify);
}

// 5.1.6.5.5: VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET after DRIVER_OK. Waits for the
// device's ack (QEMU answers inside the doorbell write; 1 s at most).
int VirtioNet::set_queue_pairs(uint16_t pairs) {
  auto* block = static_cast<uint8_t*>(ctrl_.mem.va);
  volatile uint8_t* cmd = block + ctrl_.cmd_offset;
  volatile uint8_t* ack = cmd + 32;
  cmd[0] = ctrl::kClassMq;
  cmd[1] = ctrl::kMqVqPairsSet;
  cmd[2] = static_cast<uint8_t>(pairs);
  cmd[3] = static_cast<uint8_t>(pairs >> 8);
  *ack = 0xff;
  const uint64_t cmd_iova = ctrl_.mem.iova + ctrl_.cmd_offset;
  auto desc = [&](uint16_t i, uint64_t addr, uint32_t len, uint16_t flags, uint16_t next) {
    volatile uint8_t* d = block + ctrl_.layout.desc + size_t{i} * 16;
    *reinterpret_cast<volatile uint64_t*>(d) = htole64(addr);
    *reinterpret_cast<volatile uint32_t*>(d + 8) = htole32(len);
    *reinterpret_cast<volatile uint16_t*>(d + 12) = htole16(flags);
    *reinterpret_cast<volatile uint16_t*>(d + 14) = htole16(next);
  };
  desc(0, cmd_iova, 4, kDescFlagNext, 1);           // class, command, le16 pairs
  desc(1, cmd_iova + 32, 1, kDescFlagWrite, 0);     // ack
  volatile uint8_t* avail = block + ctrl_.layout.avail;
  *reinterpret_cast<volatile uint16_t*>(avail + 4 + 2 * (ctrl_.avail_idx % ctrl_.size)) = htole16(0);
  vfio::barrier::descriptors_before_index_publish();
  *reinterpret_cast<volatile uint16_t*>(avail + 2) = htole16(++ctrl_.avail_idx);
  vfio::barrier::descriptors_before_doorbell();
  ctrl_.notify.write(ctrl_.vq);
  const volatile uint8_t* used = block + ctrl_.layout.used;
  for (int i = 0; i < 20000; ++i) {
    if (le16toh(*reinterpret_cast<const volatile uint16_t*>(used + 2)) != ctrl_.used_idx) {
      vfio::barrier::device_status_before_descriptor_reads();
      ++ctrl_.used_idx;
      if (*ack != ctrl::kAckOk)
        return error(EIO, "the device refused VQ_PAIRS_SET " + std::to_string(pairs) + " (ack " +
                              std::to_string(*ack) + "); it reports " + std::to_string(device_pairs_) +
                              " queue pairs");
      return 0;
    }
    struct timespec ts{0, 50 * 1000};
    nanosleep(&ts, nullptr);
  }
  return error(ETIMEDOUT, "the device did not answer VQ_PAIRS_SET " + std::to_string(pairs) +
                              " on the control virtqueue within 1 s");
}

int VirtioNet::start() {
  if (started_) return 0;
  // Pairs 0..n-1 must each have both queues set up, and nothing beyond:
  // the device feeds RX queue i whenever pair i is on (5.1.6.5.5).
  uint16_t n = 0;
  while (n < pairs_ && rx_[n].size && tx_[n].size) ++n;
  if (n == 0) return error(EINVAL, "set up RX queue 0 and TX queue 0 before start()");
  for (uint16_t p = n; p < pairs_; ++p) {
    if (rx_[p].size || tx_[p].size)
      return error(EINVAL, "queue pair " + std::to_string(p) + " has only its " + (rx_[p].size ? "RX" : "TX") +
                               " queue set up" + (p > n ? " (or pair " + std::to_string(n) + " is missing)" : "") +
                               "; virtio-net runs pairs 0..n-1, each with RX and TX queue set up");
  }
  if (!initialized_)
    if (int rc = negotiate(); rc < 0) return rc;  // after stop(): the device was reset
  initialized_ = false;                          // whatever happens next needs a fresh negotiation
  // Polling by default: the device is told not to interrupt (2.6.7). TX
  // completions are reaped lazily, so TX queues never interrupt. RX queue
  // p interrupts on vector p in interrupt mode.
  c_.msix_config.write(kNoVector);
  for (uint16_t p = 0; p < n; ++p) {
    rx_[p].ring.set_interrupts(rx_[p].irq_mode);
    tx_[p].ring.set_interrupts(false);
    if (int rc = program_queue(rx_[p], rx_[p].irq_mode ? p : kNoVector); rc < 0) return rc;
    if (int rc = program_queue(tx_[p], kNoVector); rc < 0) return rc;
  }
  if (mq())
    if (int rc = program_control(); rc < 0) return rc;
  c_.status.write(kStatusAcknowledge | kStatusDriver | kStatusFeaturesOk | kStatusDriverOk);
  uint8_t st = c_.status.read();
  if (st & (kStatusNeedsReset | kStatusFailed) || !(st & kStatusDriverOk)) {
    reset_device();
    return error(EIO, "the device did not accept DRIVER_OK (status " + hex(st) + ")");
  }
  started_ = true;
  active_pairs_ = n;
  if (n > 1) {
    if (int rc = set_queue_pairs(n); rc < 0) {
      stop();
      return rc;
    }
  }
  for (uint16_t p = 0; p < n; ++p) {
    rx_[p].rx_was_empty = true;
    if (int rc = refill_rx(rx_[p]); rc < 0) {
      stop();
      return rc;
    }
    if (rx_[p].ring.in_flight() == 0) {
      stop();
      return error(ENOBUFS, "RX queue " + std::to_string(p) +
                                ": the buffer pool gave no buffers; create the pool with more buffers than the RX ring");
    }
  }
  return 0;
}

int VirtioNet::stop() {
  if (!started_ && !initialized_) return 0;
  int rc = reset_device();  // stops all DMA; queues and vectors are forgotten
  started_ = false;
  initialized_ = false;
  active_pairs_ = 0;
  release_buffers();
  return rc;
}

void VirtioNet::release_buffers() {
  std::vector<ufab_buf*> bufs;
  auto collect = [&](void* cookie) { bufs.push_back(static_cast<ufab_buf*>(cookie)); };
  for (uint16_t p = 0; p < kMaxPairs; ++p) {
    if (rx_[p].size) rx_[p].ring.reset(collect);
    if (tx_[p].size) tx_[p].ring.reset(collect);
  }
  if (!bufs.empty()) ops_->buf_free(host_, bufs.data(), static_cast<uint32_t>(bufs.size()));
}

void VirtioNet::free_ring(Queue& q) {
  if (q.allocated) ops_->dma_free(host_, &q.mem);
  q.allocated = false;
  q.mem = ufab_dma_mem{};
  q.size = 0;
}

// --------------------------------------------------------------------- RX

// Posts pool buffers into every free RX descriptor. The device writes the
// 12-byte header right before the frame, so the descriptor starts 12 bytes
// into the headroom and the frame lands at buf->offset.
int VirtioNet::refill_rx(Queue& q) {
  uint32_t want = q.ring.free_count();
  if (want == 0) return 0;
  ufab_buf* bufs[kBatch];
  ufab_buf* bad[kBatch];
  uint32_t nbad = 0;
  uint32_t posted = 0;
  while (want > 0) {
    uint32_t ask = std::min(want, kBatch);
    int got = ops_->buf_alloc(host_, q.pool, bufs, ask);
    if (got <= 0) break;
    for (int i = 0; i < got; ++i) {
      ufab_buf* b = bufs[i];
      if (b->offset < kNetHeaderSize || b->capacity < b->offset || b->capacity - b->offset + kNetHeaderSize < kMinRxBuffer) {
        bad[nbad++] = b;
        continue;
      }
      q.ring.add(b->base_iova + b->offset - kNetHeaderSize, b->capacity - b->offset + kNetHeaderSize, true, b);
      ++posted;
    }
    want -= static_cast<uint32_t>(got);
    if (static_cast<uint32_t>(got) < ask || nbad) break;
  }
  if (posted) {
    q.ring.publish();
    // QEMU re-enables RX notifications only when it ran out of buffers and
    // delivers frames it queued meanwhile only when kicked: after a refill,
    // honour its request even though we poll.
    if (q.ring.device_wants_notify()) kick(q);
  }
  if (nbad) {
    ufab_buf* first = bad[0];
    std::string msg = "RX pool buffer has offset " + std::to_string(first->offset) + " and capacity " +
                      std::to_string(first->capacity) + "; virtio-net needs at least " +
                      std::to_string(kNetHeaderSize) + " bytes of headroom and " + std::to_string(kMinRxBuffer) +
                      " bytes from header to end: create the pool with larger buffers";
    ops_->buf_free(host_, bad, nbad);
    return error(EINVAL, msg);
  }
  return 0;
}

int VirtioNet::rx_burst(uint16_t queue, ufab_buf** out, uint16_t n) {
  Queue* qp = rx_queue(queue, "rx_burst");
  if (!qp) return -EINVAL;
  Queue& q = *qp;
  if (!started_) return error(ENETDOWN, "rx_burst on a device that is not started; call start() first");
  if (queue >= active_pairs_)
    return error(EINVAL, "rx_burst on RX queue " + std::to_string(queue) +
                             ", which is not running: set up RX and TX queue " + std::to_string(queue) +
                             " before start()");
  Completion done[kBatch];
  ufab_buf* drop[kBatch];
  uint16_t taken = 0;
  uint64_t bytes = 0;
  while (taken < n) {
    uint16_t got = q.ring.reap(done, static_cast<uint16_t>(std::min<uint32_t>(kBatch, n - taken)));
    if (got == 0) break;
    uint32_t ndrop = 0;
    for (uint16_t i = 0; i < got; ++i) {
      auto* b = static_cast<ufab_buf*>(done[i].cookie);
      uint32_t len = done[i].len;
      uint32_t room = b->capacity - b->offset;
      if (len < kNetHeaderSize + 14 || len - kNetHeaderSize > room) {
        ++q.errors;  // the device wrote a length that cannot be right
        drop[ndrop++] = b;
        continue;
      }
      b->len = len - kNetHeaderSize;
      b->flags = 0;
      const uint8_t* dst = b->base + b->offset;
      // Without CTRL_RX the device is promiscuous (5.1.6.5); filter
      // unicast frames for other stations here so the NIC behaves like others.
      if (!promiscuous_ && !(dst[0] & 1) && std::memcmp(dst, mac_, 6) != 0) {
        drop[ndrop++] = b;
        continue;
      }
      bytes += b->len;
      out[taken++] = b;
    }
    if (ndrop) ops_->buf_free(host_, drop, ndrop);
  }
  q.packets += taken;
  q.bytes += bytes;
  if (q.irq_mode) {
    if (taken && q.rx_was_empty) ++q.irqs;
    q.rx_was_empty = taken == 0;
  }
  if (q.ring.free_count()) {
    int rc = refill_rx(q);
    if (rc < 0 && taken == 0) return rc;
  }
  return taken;
}

// --------------------------------------------------------------------- TX

void VirtioNet::reclaim_tx(Queue& q) {
  Completion done[kBatch];
  ufab_buf* bufs[kBatch];
  for (;;) {
    uint16_t got = q.ring.reap(done, kBatch);
    if (got == 0) return;
    for (uint16_t i = 0; i < got; ++i) bufs[i] = static_cast<ufab_buf*>(done[i].cookie);
    ops_->buf_free(host_, bufs, got);
    if (got < kBatch) return;
  }
}

// The checks tx_burst and tx_burst_gather share: the queue exists and its
// pair is running. 0, or -errno after set_error.
int VirtioNet::running_tx(uint16_t queue, const char* what, Queue** out) {
  Queue* qp = tx_queue(queue, what);
  if (!qp) return -EINVAL;
  if (!started_) return error(ENETDOWN, std::string(what) + " on a device that is not started; call start() first");
  if (queue >= active_pairs_)
    return error(EINVAL, std::string(what) + " on TX queue " + std::to_string(queue) +
                             ", which is not running: set up RX and TX queue " + std::to_string(queue) +
                             " before start()");
  *out = qp;
  return 0;
}

// Hands what was added to the device: one avail.idx store, and one doorbell
// unless the device said it needs none (2.6.13.3, 2.6.13.4).
void VirtioNet::post_tx(Queue& q, uint16_t frames, uint64_t bytes) {
  if (frames == 0) return;
  q.ring.publish();
  if (q.ring.device_wants_notify()) kick(q);
  q.packets += frames;
  q.bytes += bytes;
}

int VirtioNet::tx_burst(uint16_t queue, ufab_buf** bufs, uint16_t n) {
  Queue* qp = nullptr;
  if (int rc = running_tx(queue, "tx_burst", &qp); rc < 0) return rc;
  Queue& q = *qp;
  if (q.ring.used_pending()) reclaim_tx(q);
  uint16_t room = std::min<uint16_t>(n, q.ring.free_count());
  uint16_t i = 0;
  int rc = 0;
  uint64_t bytes = 0;
  for (; i < room; ++i) {
    ufab_buf* b = bufs[i];
    if (b->offset < kNetHeaderSize || b->len < kMinFrame || b->len > kMaxFrame || b->offset > b->capacity ||
        b->len > b->capacity - b->offset) {
      rc = error(EINVAL, "TX frame " + std::to_string(i) + " has offset " + std::to_string(b->offset) + ", length " +
                             std::to_string(b->len) + ", capacity " + std::to_string(b->capacity) +
                             "; virtio-net needs 12 bytes of headroom for its header and a frame of 14.." +
                             std::to_string(kMaxFrame) + " bytes inside the buffer");
      break;
    }
    // 5.1.6.2: an all-zero virtio_net_hdr_v1 means no checksum offload, no GSO.
    std::memset(b->base + b->offset - kNetHeaderSize, 0, kNetHeaderSize);
    q.ring.add(b->base_iova + b->offset - kNetHeaderSize, b->len + kNetHeaderSize, false, b);
    bytes += b->len;
  }
  post_tx(q, i, bytes);
  if (i == 0 && rc < 0) {
    ++q.errors;
    return rc;
  }
  return i;
}

// Gather transmit (ABI 1.3). Each frame goes out as one descriptor chain
// (2.6.5, VIRTQ_DESC_F_NEXT): the queue's zero virtio-net header first
// (5.1.6.2), in a descriptor of its own, a layout every device accepts
// (2.6.4 "Message Framing"; legacy devices without ANY_LAYOUT even require
// it), then one descriptor per segment at its IOVA (the device reads it
// through the IOMMU: VIRTIO_F_ACCESS_PLATFORM). A frame is taken whole or
// not at all: the call stops at the first frame the ring has no room for
// (0 when that is the first) or that is invalid (an error when that is the
// first; the next call reports a later one). The frame's buf is the
// chain's cookie, freed when the device returns the chain.
int VirtioNet::tx_burst_gather(uint16_t queue, const ufab_tx_frame* frames, uint16_t n) {
  Queue* qp = nullptr;
  if (int rc = running_tx(queue, "tx_burst_gather", &qp); rc < 0) return rc;
  Queue& q = *qp;
  if (q.ring.used_pending()) reclaim_tx(q);
  uint16_t i = 0;
  uint64_t bytes = 0;
  sdk::TxFrameCheck check;
  for (; i < n; ++i) {
    const ufab_tx_frame& f = frames[i];
    check = sdk::check_tx_frame(f, kMinFrame, kMaxFrame);
    if (check.fault != sdk::TxFrameFault::kNone) break;
    Piece chain[1 + UFAB_TX_SEGS_MAX];
    chain[0] = Piece{q.header_iova, kNetHeaderSize};
    for (uint32_t s = 0; s < f.nsegs; ++s) chain[1 + s] = Piece{f.segs[s].iova, f.segs[s].len};
    if (!q.ring.add_chain(chain, static_cast<uint16_t>(1 + f.nsegs), f.buf)) break;  // no room
    bytes += f.len;
  }
  post_tx(q, i, bytes);
  if (i == 0 && n > 0 && check.fault != sdk::TxFrameFault::kNone) {
    ++q.errors;
    return error(EINVAL, "tx_burst_gather: frame 0 " + sdk::describe(check, frames[0], kMinFrame, kMaxFrame));
  }
  return i;
}

// ------------------------------------------------------- stats, IRQ, promisc

int VirtioNet::stats(ufab_stats* out) {
  *out = ufab_stats{};
  for (uint16_t p = 0; p < pairs_; ++p) {
    const Queue &r = rx_[p], &t = tx_[p];
    out->rx_packets += r.packets;
    out->rx_bytes += r.bytes;
    out->rx_errors += r.errors + r.ring.bad_used();
    out->irqs += r.irqs;
    out->tx_packets += t.packets;
    out->tx_bytes += t.bytes;
    out->tx_errors += t.errors + t.ring.bad_used();
  }
  return 0;
}

int VirtioNet::set_rx_vector(Queue& q, uint16_t vector) {
  c_.q_select.write(q.vq);
  c_.q_msix.write(vector);
  uint16_t back = c_.q_msix.read();
  if (back != vector)
    return error(EIO, "the device refused MSI-X vector " + std::to_string(vector) + " for RX virtqueue " +
                          std::to_string(q.vq) + " (read back " + hex(back) +
                          "); check that the device has an MSI-X vector per RX queue");
  return 0;
}

// Interrupts stay enabled in interrupt mode (no per-poll toggling), so
// there is nothing to arm: only frames still in the ring, which announced
// themselves already, wake the caller at once.
int VirtioNet::rx_irq_arm(uint16_t queue) {
  Queue* q = rx_queue(queue, "rx_irq_arm");
  if (!q) return -EINVAL;
  if (!q->irq_mode) return error(EINVAL, "rx_irq_arm without the interrupt enabled: call rx_irq(queue, 1) first");
  if (started_ && queue < active_pairs_ && q->ring.arm_interrupts()) eventfd_write(irq_fd_[queue], 1);
  return 0;
}

int VirtioNet::rx_irq(uint16_t queue, int enable, int* eventfd) {
  Queue* qp = rx_queue(queue, "rx_irq");
  if (!qp) return -EINVAL;
  Queue& q = *qp;
  bool running = started_ && queue < active_pairs_;
  if (!enable) {
    q.irq_mode = false;
    if (running) q.ring.set_interrupts(false);
    if (eventfd) *eventfd = irq_fd_[queue];
    return 0;
  }
  if (!caps_.has_msix)
    return error(ENOTSUP, "the device has no MSI-X capability; interrupt mode needs it, poll instead");
  if (!irq_vectors_) {
    // One vector per RX queue, all in one call: Linux 6.1's VFIO cannot add
    // MSI-X vectors to an enabled set later.
    int fds[kMaxPairs];
    if (int rc = ops_->irq_enable(host_, pairs_, fds); rc < 0)
      return error(-rc, "enabling " + std::to_string(pairs_) + " MSI-X vector(s) failed: " + std::strerror(-rc));
    for (uint16_t p = 0; p < pairs_; ++p) irq_fd_[p] = fds[p];
    irq_vectors_ = true;
  }
  if (running && !q.irq_mode) {
    c_.msix_config.write(kNoVector);
    if (int rc = set_rx_vector(q, queue); rc < 0) return rc;
  }
  q.irq_mode = true;
  if (running && q.ring.arm_interrupts()) {
    // Frames arrived while interrupts were off: no interrupt will announce
    // them, so wake the caller ourselves instead of letting it sleep.
    eventfd_write(irq_fd_[queue], 1);
  }
  q.rx_was_empty = true;
  *eventfd = irq_fd_[queue];
  return 0;
}

// Receive steering (ABI 1.2). With one queue pair everything lands in RX
// queue 0, which is UFAB_STEER_NONE. With several pairs running, the
// device's backend picks each frame's RX queue (QEMU: backend queue i feeds
// RX queue i; a tap spreads flows by the kernel's hash), and virtio-net has
// nothing that pins them all to queue 0. Steering RoCEv2 by destination QP
// is beyond virtio-net: VIRTIO_NET_F_RSS (virtio 1.2 5.1.6.5.7) hashes IP
// addresses and TCP/UDP ports through an indirection table, which cannot
// express "BTH dest QP mod n".
int VirtioNet::rx_steer(uint32_t mode, uint16_t nqueues) {
  if (started_) return error(EBUSY, "rx_steer while the device is started; call stop() first");
  if (nqueues < 1 || nqueues > pairs_) {
    return error(EINVAL, "rx_steer over " + std::to_string(nqueues) + " RX queues; this device has " +
                             std::to_string(pairs_) + " queue pair(s) (docs/drivers/virtio_net.md)");
  }
  switch (mode) {
    case UFAB_STEER_NONE:
      if (nqueues == 1) return 0;
      return error(EOPNOTSUPP,
                   "with " + std::to_string(nqueues) +
                       " queue pairs running, virtio-net's backend chooses each frame's RX queue (QEMU: backend "
                       "queue i feeds RX queue i; a tap spreads flows by the host kernel's hash); nothing pins "
                       "every frame to queue 0: poll every RX queue and steer in software");
    case UFAB_STEER_ROCE_QPN:
      return error(EOPNOTSUPP,
                   std::string("virtio-net cannot steer RoCEv2 frames by destination QP: its only receive steering "
                               "(VIRTIO_NET_F_RSS, ") +
                       ((offered_ & feature_bit(kFeatureNetRss)) ? "offered" : "not offered") +
                       " by this device, not used) hashes IP addresses and TCP/UDP ports, never the BTH; " +
                       (pairs_ == 1 ? std::string("every frame stays in RX queue 0")
                                    : "with several pairs the backend spreads frames by its own hash") +
                       ", steer in software");
    default:
      return error(EOPNOTSUPP, "steering mode " + std::to_string(mode) + " is unknown to this virtio_net plugin");
  }
}

int VirtioNet::set_promiscuous(int enable) {
  // Without the control virtqueue the device itself is always promiscuous;
  // the driver's unicast filter is what this switches.
  promiscuous_ = enable != 0;
  return 0;
}

}  // namespace
}  // namespace ufab::virtio

const ufab_driver* ufab_virtio_net_driver() {
  static const ufab_driver d = ufab::sdk::make_driver<ufab::virtio::VirtioNet>(
      "virtio_net", "virtio-net, modern virtio-pci 1.x (split ring, polling or MSI-X)", ufab::virtio::kMatch);
  return &d;
}
