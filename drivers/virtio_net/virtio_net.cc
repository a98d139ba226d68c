// virtio-net over modern virtio-pci (virtio 1.1 sections 3.1, 4.1, 5.1), as a
// ufab driver plugin. One RX/TX queue pair, one descriptor per frame, no
// offloads. See docs/drivers/virtio_net.md.
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
constexpr uint32_t kMinRxBuffer = kNetHeaderSize + 1514;
constexpr uint32_t kMinRing = 8;
constexpr uint32_t kBatch = 64;  // completions handled per reap call

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

struct Queue {
  SplitQueue ring;
  ufab_dma_mem mem{};
  bool allocated = false;
  uint32_t size = 0;       // configured (0: not set up)
  uint16_t max_size = 0;   // device maximum
  Reg16 notify;            // this queue's doorbell
  ufab_pool* pool = nullptr;
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
  int stats(ufab_stats* out);
  int rx_irq(uint16_t queue, int enable, int* eventfd);
  int rx_irq_arm(uint16_t queue);
  int set_promiscuous(int enable);

 private:
  VirtioNet(const ufab_host_ops* ops, ufab_host* host) : ops_(ops), host_(host) {}

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
  int setup_queue(Queue& q, uint16_t index, uint32_t size, const char* what);
  int program_queue(Queue& q, uint16_t index, uint16_t vector);
  int set_rx_vector(uint16_t vector);
  void release_buffers();
  void free_ring(Queue& q);
  int refill_rx();
  void reclaim_tx();
  void kick(Queue& q, uint16_t index) {
    vfio::barrier::descriptors_before_doorbell();
    q.notify.write(index);
  }

  const ufab_host_ops* ops_;
  ufab_host* host_;
  std::string name_ = "virtio-net";
  Capabilities caps_;
  std::map<uint32_t, Mmio> bars_;
  Mmio common_win_, device_win_, notify_win_;
  CommonRegs c_;
  uint64_t features_ = 0;
  uint16_t num_queues_ = 0;
  uint8_t mac_[6]{};
  Queue rx_, tx_;
  bool started_ = false;
  bool initialized_ = false;  // features negotiated since the last reset
  bool promiscuous_ = false;
  bool irq_mode_ = false;
  int irq_fd_ = -1;
  bool rx_was_empty_ = true;
  ufab_stats stats_{};
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
  for (uint16_t q : {kRxQueue, kTxQueue}) {
    c_.q_select.write(q);
    uint16_t max = c_.q_size.read();
    if (max == 0) return error(ENODEV, "virtqueue " + std::to_string(q) + " is unavailable (size 0)");
    (q == kRxQueue ? rx_ : tx_).max_size = max;
  }
  if (int rc = read_device_config(); rc < 0) return rc;
  log(UFAB_LOG_INFO, "MAC " + mac_text(mac_) + ", features " + hex(features_) + ", queue sizes rx " +
                         std::to_string(rx_.max_size) + " tx " + std::to_string(tx_.max_size) + ", " +
                         std::to_string(num_queues_) + " virtqueues");
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
  c_.gfselect.write(0);
  c_.gfeature.write(static_cast<uint32_t>(accepted));
  c_.gfselect.write(1);
  c_.gfeature.write(static_cast<uint32_t>(accepted >> 32));
  c_.status.write(kStatusAcknowledge | kStatusDriver | kStatusFeaturesOk);
  if (!(c_.status.read() & kStatusFeaturesOk))
    return give_up(ENOTSUP, "the device refused our feature set " + hex(accepted) + " (offered " + hex(offered) +
                                "): FEATURES_OK did not stick; it needs a feature this driver does not implement");
  features_ = accepted;
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
  if (irq_fd_ >= 0) ops_->irq_disable(host_);
  free_ring(rx_);
  free_ring(tx_);
}

// ------------------------------------------------------------ info, link

int VirtioNet::info(ufab_dev_info* out) {
  *out = ufab_dev_info{};
  std::memcpy(out->mac, mac_, 6);
  out->max_rx_queues = 1;
  out->max_tx_queues = 1;
  out->min_ring_size = kMinRing;
  out->max_ring_size = std::min(rx_.max_size, tx_.max_size);
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

int VirtioNet::setup_queue(Queue& q, uint16_t index, uint32_t size, const char* what) {
  if (started_) return error(EBUSY, std::string("cannot set up the ") + what + " queue while started; stop() first");
  if (size < kMinRing || size > q.max_size || (size & (size - 1)) != 0)
    return error(EINVAL, std::string(what) + " ring size " + std::to_string(size) + " is not a power of two in " +
                             std::to_string(kMinRing) + ".." + std::to_string(q.max_size) +
                             " (the device's maximum for virtqueue " + std::to_string(index) + ")");
  RingLayout layout = RingLayout::for_size(size);
  if (q.allocated && q.mem.size < layout.bytes) free_ring(q);
  if (!q.allocated) {
    if (int rc = ops_->dma_alloc(host_, layout.bytes, kRingBlockAlign, &q.mem); rc < 0)
      return error(-rc, std::string("allocating ") + std::to_string(layout.bytes) + " bytes of DMA memory for the " +
                            what + " virtqueue failed: " + std::strerror(-rc));
    q.allocated = true;
  }
  if (auto st = q.ring.init(size, q.mem.va, q.mem.iova, q.mem.size); !st)
    return error(st.error().code(), st.error().message());
  q.size = size;
  return 0;
}

int VirtioNet::rx_queue_setup(uint16_t queue, const ufab_queue_conf* conf) {
  if (queue != 0) return error(EINVAL, "RX queue " + std::to_string(queue) + " does not exist; this driver has queue 0");
  if (!conf || !conf->pool) return error(EINVAL, "the RX queue needs a buffer pool (ufab_queue_conf.pool)");
  if (int rc = setup_queue(rx_, kRxQueue, conf->size, "RX"); rc < 0) return rc;
  rx_.pool = conf->pool;
  return 0;
}

int VirtioNet::tx_queue_setup(uint16_t queue, const ufab_queue_conf* conf) {
  if (queue != 0) return error(EINVAL, "TX queue " + std::to_string(queue) + " does not exist; this driver has queue 0");
  if (!conf) return error(EINVAL, "no TX queue configuration given");
  return setup_queue(tx_, kTxQueue, conf->size, "TX");
}

// 4.1.5.1.3: select, size, vector, addresses, notify offset, enable.
int VirtioNet::program_queue(Queue& q, uint16_t index, uint16_t vector) {
  c_.q_select.write(index);
  if (c_.q_enable.read() != 0)
    return error(EBUSY, "virtqueue " + std::to_string(index) + " is already enabled after a reset");
  c_.q_size.write(static_cast<uint16_t>(q.size));
  c_.q_msix.write(vector);
  if (vector != kNoVector && c_.q_msix.read() != vector)
    return error(EIO, "the device refused MSI-X vector " + std::to_string(vector) + " for virtqueue " +
                          std::to_string(index) + " (read back " + hex(c_.q_msix.read()) + ")");
  auto split = [](Reg32 lo, Reg32 hi, uint64_t v) {
    lo.write(static_cast<uint32_t>(v));
    hi.write(static_cast<uint32_t>(v >> 32));
  };
  split(c_.q_desc_lo, c_.q_desc_hi, q.ring.desc_iova());
  split(c_.q_driver_lo, c_.q_driver_hi, q.ring.avail_iova());
  split(c_.q_device_lo, c_.q_device_hi, q.ring.used_iova());
  // 4.1.4.4: the doorbell is at cap.offset + queue_notify_off * multiplier.
  uint64_t off = caps_.notify.offset + uint64_t{c_.q_notify_off.read()} * caps_.notify_multiplier;
  auto reg = notify_win_.reg16(off);
  if (!reg)
    return error(EPROTO, "virtqueue " + std::to_string(index) + "'s doorbell at " + hex(off) +
                             " lies outside the notification structure: " + reg.error().message());
  q.notify = *reg;
  c_.q_enable.write(1);
  return 0;
}

int VirtioNet::start() {
  if (started_) return 0;
  if (rx_.size == 0 || tx_.size == 0)
    return error(EINVAL, "set up RX queue 0 and TX queue 0 before start()");
  if (!initialized_)
    if (int rc = negotiate(); rc < 0) return rc;  // after stop(): the device was reset
  initialized_ = false;                          // whatever happens next needs a fresh negotiation
  // Polling by default: the device is told not to interrupt (2.6.7). TX
  // completions are reaped lazily, so the TX queue never interrupts.
  rx_.ring.set_interrupts(irq_mode_);
  tx_.ring.set_interrupts(false);
  c_.msix_config.write(kNoVector);
  if (int rc = program_queue(rx_, kRxQueue, irq_mode_ ? 0 : kNoVector); rc < 0) return rc;
  if (int rc = program_queue(tx_, kTxQueue, kNoVector); rc < 0) return rc;
  c_.status.write(kStatusAcknowledge | kStatusDriver | kStatusFeaturesOk | kStatusDriverOk);
  uint8_t st = c_.status.read();
  if (st & (kStatusNeedsReset | kStatusFailed) || !(st & kStatusDriverOk)) {
    reset_device();
    return error(EIO, "the device did not accept DRIVER_OK (status " + hex(st) + ")");
  }
  started_ = true;
  rx_was_empty_ = true;
  if (int rc = refill_rx(); rc < 0) {
    stop();
    return rc;
  }
  if (rx_.ring.in_flight() == 0) {
    stop();
    return error(ENOBUFS, "the RX buffer pool gave no buffers; create the pool with more buffers than the RX ring");
  }
  return 0;
}

int VirtioNet::stop() {
  if (!started_ && !initialized_) return 0;
  int rc = reset_device();  // stops all DMA; queues and vectors are forgotten
  started_ = false;
  initialized_ = false;
  release_buffers();
  return rc;
}

void VirtioNet::release_buffers() {
  std::vector<ufab_buf*> bufs;
  auto collect = [&](void* cookie) { bufs.push_back(static_cast<ufab_buf*>(cookie)); };
  if (rx_.size) rx_.ring.reset(collect);
  if (tx_.size) tx_.ring.reset(collect);
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
int VirtioNet::refill_rx() {
  uint32_t want = rx_.ring.free_count();
  if (want == 0) return 0;
  ufab_buf* bufs[kBatch];
  ufab_buf* bad[kBatch];
  uint32_t nbad = 0;
  uint32_t posted = 0;
  while (want > 0) {
    uint32_t ask = std::min(want, kBatch);
    int got = ops_->buf_alloc(host_, rx_.pool, bufs, ask);
    if (got <= 0) break;
    for (int i = 0; i < got; ++i) {
      ufab_buf* b = bufs[i];
      if (b->offset < kNetHeaderSize || b->capacity < b->offset || b->capacity - b->offset + kNetHeaderSize < kMinRxBuffer) {
        bad[nbad++] = b;
        continue;
      }
      rx_.ring.add(b->base_iova + b->offset - kNetHeaderSize, b->capacity - b->offset + kNetHeaderSize, true, b);
      ++posted;
    }
    want -= static_cast<uint32_t>(got);
    if (static_cast<uint32_t>(got) < ask || nbad) break;
  }
  if (posted) {
    rx_.ring.publish();
    // QEMU re-enables RX notifications only when it ran out of buffers and
    // delivers frames it queued meanwhile only when kicked: after a refill,
    // honour its request even though we poll.
    if (rx_.ring.device_wants_notify()) kick(rx_, kRxQueue);
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
  if (queue != 0) return error(EINVAL, "RX queue " + std::to_string(queue) + " does not exist; use queue 0");
  if (!started_) return error(ENETDOWN, "rx_burst on a device that is not started; call start() first");
  Completion done[kBatch];
  ufab_buf* drop[kBatch];
  uint16_t taken = 0;
  while (taken < n) {
    uint16_t got = rx_.ring.reap(done, static_cast<uint16_t>(std::min<uint32_t>(kBatch, n - taken)));
    if (got == 0) break;
    uint32_t ndrop = 0;
    for (uint16_t i = 0; i < got; ++i) {
      auto* b = static_cast<ufab_buf*>(done[i].cookie);
      uint32_t len = done[i].len;
      uint32_t room = b->capacity - b->offset;
      if (len < kNetHeaderSize + 14 || len - kNetHeaderSize > room) {
        ++stats_.rx_errors;  // the device wrote a length that cannot be right
        drop[ndrop++] = b;
        continue;
      }
      b->len = len - kNetHeaderSize;
      b->flags = 0;
      const uint8_t* dst = b->base + b->offset;
      // Without CTRL_VQ the device is promiscuous (5.1.6.5); filter
      // unicast frames for other stations here so the NIC behaves like others.
      if (!promiscuous_ && !(dst[0] & 1) && std::memcmp(dst, mac_, 6) != 0) {
        drop[ndrop++] = b;
        continue;
      }
      ++stats_.rx_packets;
      stats_.rx_bytes += b->len;
      out[taken++] = b;
    }
    if (ndrop) ops_->buf_free(host_, drop, ndrop);
  }
  if (irq_mode_) {
    if (taken && rx_was_empty_) ++stats_.irqs;
    rx_was_empty_ = taken == 0;
  }
  if (rx_.ring.free_count()) {
    int rc = refill_rx();
    if (rc < 0 && taken == 0) return rc;
  }
  return taken;
}

// --------------------------------------------------------------------- TX

void VirtioNet::reclaim_tx() {
  Completion done[kBatch];
  ufab_buf* bufs[kBatch];
  for (;;) {
    uint16_t got = tx_.ring.reap(done, kBatch);
    if (got == 0) return;
    for (uint16_t i = 0; i < got; ++i) bufs[i] = static_cast<ufab_buf*>(done[i].cookie);
    ops_->buf_free(host_, bufs, got);
    if (got < kBatch) return;
  }
}

int VirtioNet::tx_burst(uint16_t queue, ufab_buf** bufs, uint16_t n) {
  if (queue != 0) return error(EINVAL, "TX queue " + std::to_string(queue) + " does not exist; use queue 0");
  if (!started_) return error(ENETDOWN, "tx_burst on a device that is not started; call start() first");
  if (tx_.ring.used_pending()) reclaim_tx();
  uint16_t room = std::min<uint16_t>(n, tx_.ring.free_count());
  uint16_t i = 0;
  int rc = 0;
  for (; i < room; ++i) {
    ufab_buf* b = bufs[i];
    if (b->offset < kNetHeaderSize || b->len < 14 || b->len > kMaxFrame || b->offset > b->capacity ||
        b->len > b->capacity - b->offset) {
      rc = error(EINVAL, "TX frame " + std::to_string(i) + " has offset " + std::to_string(b->offset) + ", length " +
                             std::to_string(b->len) + ", capacity " + std::to_string(b->capacity) +
                             "; virtio-net needs 12 bytes of headroom for its header and a frame of 14.." +
                             std::to_string(kMaxFrame) + " bytes inside the buffer");
      break;
    }
    // 5.1.6.2: an all-zero virtio_net_hdr_v1 means no checksum offload, no GSO.
    std::memset(b->base + b->offset - kNetHeaderSize, 0, kNetHeaderSize);
    tx_.ring.add(b->base_iova + b->offset - kNetHeaderSize, b->len + kNetHeaderSize, false, b);
    ++stats_.tx_packets;
    stats_.tx_bytes += b->len;
  }
  if (i) {
    tx_.ring.publish();
    if (tx_.ring.device_wants_notify()) kick(tx_, kTxQueue);
  }
  if (i == 0 && rc < 0) {
    ++stats_.tx_errors;
    return rc;
  }
  return i;
}

// ------------------------------------------------------- stats, IRQ, promisc

int VirtioNet::stats(ufab_stats* out) {
  *out = stats_;
  out->rx_errors += rx_.ring.bad_used();
  out->tx_errors += tx_.ring.bad_used();
  return 0;
}

int VirtioNet::set_rx_vector(uint16_t vector) {
  c_.q_select.write(kRxQueue);
  c_.q_msix.write(vector);
  uint16_t back = c_.q_msix.read();
  if (back != vector)
    return error(EIO, "the device refused MSI-X vector " + std::to_string(vector) + " for the RX virtqueue (read back " +
                          hex(back) + "); check that the device has MSI-X vectors");
  return 0;
}

// Interrupts stay enabled in interrupt mode (no per-poll toggling), so
// there is nothing to arm: only frames still in the ring, which announced
// themselves already, wake the caller at once.
int VirtioNet::rx_irq_arm(uint16_t queue) {
  if (queue != 0) return error(EINVAL, "RX queue " + std::to_string(queue) + " does not exist; use queue 0");
  if (!irq_mode_) return error(EINVAL, "rx_irq_arm without the interrupt enabled: call rx_irq(queue, 1) first");
  if (started_ && rx_.ring.arm_interrupts()) eventfd_write(irq_fd_, 1);
  return 0;
}

int VirtioNet::rx_irq(uint16_t queue, int enable, int* eventfd) {
  if (queue != 0) return error(EINVAL, "RX queue " + std::to_string(queue) + " does not exist; use queue 0");
  if (!enable) {
    irq_mode_ = false;
    if (started_) rx_.ring.set_interrupts(false);
    if (eventfd) *eventfd = irq_fd_;
    return 0;
  }
  if (!caps_.has_msix)
    return error(ENOTSUP, "the device has no MSI-X capability; interrupt mode needs it, poll instead");
  if (irq_fd_ < 0) {
    int fds[1] = {-1};
    if (int rc = ops_->irq_enable(host_, 1, fds); rc < 0)
      return error(-rc, std::string("enabling MSI-X vector 0 failed: ") + std::strerror(-rc));
    irq_fd_ = fds[0];
  }
  if (started_ && !irq_mode_) {
    c_.msix_config.write(kNoVector);
    if (int rc = set_rx_vector(0); rc < 0) return rc;
  }
  irq_mode_ = true;
  if (started_ && rx_.ring.arm_interrupts()) {
    // Frames arrived while interrupts were off: no interrupt will announce
    // them, so wake the caller ourselves instead of letting it sleep.
    eventfd_write(irq_fd_, 1);
  }
  rx_was_empty_ = true;
  *eventfd = irq_fd_;
  return 0;
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
