// ufab driver plugin for the Intel 82574L (PCI 8086:10D3), written against
// QEMU's e1000e model. Two RX and two TX queues with legacy descriptors,
// polling or MSI-X interrupt mode (one vector per RX queue). Each queue's
// state is its own, so one thread per queue needs no lock between them.
// Transmit takes one-buffer frames (tx_burst) or frames gathered from up
// to four segments over several descriptors (tx_burst_gather).
// RX queue 1 receives only what the device's RSS sends it, and this driver
// has no steering mode the 82574L can do (rx_steer). docs/drivers/e1000e.md
// explains the choices; drivers/e1000e/regs.h has the register map.
#include "drivers/e1000e/e1000e.h"

#include <time.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>

#include "drivers/e1000e/regs.h"
#include "drivers/e1000e/ring.h"
#include "abi/raw_frame.h"
#include "drivers/sdk/adapter.h"
#include "drivers/sdk/tx_frame.h"
#include "vfio/mmio.h"

namespace ufab::e1000e {
namespace {

using vfio::Mmio;
using vfio::Reg32;
namespace barrier = vfio::barrier;

constexpr ufab_pci_match kMatch[] = {
    {kVendorIntel, kDevice82574L, UFAB_PCI_ANY, UFAB_PCI_ANY, 0, 0, "82574L"},
    {0, 0, 0, 0, 0, 0, nullptr},
};

void sleep_us(long us) {
  timespec ts{us / 1000000, (us % 1000000) * 1000};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

// One ring's DMA block: descriptors first, then one ufab_buf* per slot, then
// a second such array (RX: the refill scratch; TX: the buffers one reclaim
// frees together).
struct QueueMemory {
  ufab_dma_mem mem{};
  bool allocated = false;
};

// Counters one queue's hot path updates; summed by stats(). Per queue so
// that threads polling different queues never write the same memory.
struct QueueCounters {
  uint64_t packets = 0, bytes = 0;
  uint64_t no_buffer = 0;  // RX: receive slots left empty, the pool ran dry
  uint64_t errors = 0;     // RX: descriptors with frame errors, dropped
  uint64_t rejected = 0;   // TX: frames refused (bad length)
  uint64_t irqs = 0;       // RX: interrupts taken
};

struct RxQueue {
  bool configured = false;
  uint16_t index = 0;
  Ring ring;
  QueueMemory block;
  volatile RxDesc* desc = nullptr;
  ufab_buf** slots = nullptr;
  ufab_buf** scratch = nullptr;  // refill allocates here in one call
  ufab_pool* pool = nullptr;
  uint32_t next = 0;        // next slot to look at for DD (software's RDH)
  uint32_t tail = 0;        // first slot not handed to the device (RDT)
  uint32_t unfilled = 0;    // empty slots after the last refill
  bool discarding = false;  // inside a multi-descriptor frame being dropped
  Reg32 rdt;                // this queue's doorbell (RDT0 or RDT1)
  bool on_device = false;   // ring programmed into the device (RX queue 0 only, see start())
  uint32_t cause = 0;       // its interrupt cause bit (RXQ0 or RXQ1)
  bool irq_mode = false;    // rx_irq(enable=1) in effect
  bool arm_on_request = false;  // the caller arms before sleeping (rx_irq_arm)
  QueueCounters count;
};

struct TxQueue {
  bool configured = false;
  uint16_t index = 0;
  Ring ring;
  QueueMemory block;
  volatile TxDesc* desc = nullptr;
  // A frame's buffer sits in the slot of its last (EOP) descriptor; the
  // slots of a gathered frame's other descriptors hold nullptr.
  ufab_buf** slots = nullptr;
  ufab_buf** done = nullptr;  // reclaim collects finished buffers here
  uint32_t clean = 0;  // oldest slot not yet reclaimed
  uint32_t tail = 0;   // next slot to fill (TDT)
  Reg32 tdt;           // this queue's doorbell (TDT0 or TDT1)
  QueueCounters count;
};

class E1000e {
 public:
  static int open(const ufab_host_ops* ops, ufab_host* host, E1000e** out);
  ~E1000e();

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
  E1000e(const ufab_host_ops* ops, ufab_host* host) : ops_(ops), host_(host) {}

  // Errors: explain (what failed, why, what to do), then -errno.
  int fail(int err, const std::string& message) {
    std::string m = "e1000e: " + message;
    ops_->set_error(host_, m.c_str());
    return -err;
  }
  // A host service failed: it already explained why through set_error;
  // keep that and log the driver's context beside it.
  int host_failed(int rc, const std::string& context) {
    log(UFAB_LOG_ERROR, context + " failed: " + std::strerror(rc < 0 ? -rc : rc));
    return rc < 0 ? rc : -EIO;
  }
  void log(int level, const std::string& message) {
    std::string m = "e1000e: " + message;
    ops_->log(host_, level, m.c_str());
  }

  // Init-path register access. open() checked that BAR0 covers every
  // offset in regs.h, so reg() cannot fail; value() would throw (and the
  // SDK turn it into -EIO) if it ever did.
  Reg32 reg(uint32_t offset) const { return bar_.reg32(offset).value(); }
  uint32_t rd(uint32_t offset) const { return reg(offset).read(); }
  void wr(uint32_t offset, uint32_t value) const { reg(offset).write(value); }

  int bring_up();
  void zero_registers();
  int read_mac();
  bool eeprom_word(uint32_t word, uint16_t* value);
  CounterSnapshot read_counters() const;

  int parse_mtu();
  bool jumbo() const { return mtu_ > kDefaultMtu; }
  // Bytes the device may write into one receive buffer: the largest frame
  // without LPE, the FLXBUF size with it.
  uint32_t rx_room_needed() const { return jumbo() ? jumbo_rx_buffer_kib(mtu_) * 1024 : kMaxRxFrame; }
  uint32_t rctl_value() const {
    uint32_t v = kRctlEn | kRctlBam | kRctlSecrc;
    if (jumbo()) v |= kRctlLpe | rctl_flxbuf(jumbo_rx_buffer_kib(mtu_));
    if (promiscuous_) v |= kRctlUpe | kRctlMpe;
    return v;
  }
  // The named queue, or nullptr after set_error (what: "rx_burst" ...).
  RxQueue* rx_queue(uint16_t queue, const char* what);
  TxQueue* tx_queue(uint16_t queue, const char* what);
  bool any_rx_configured() const { return rx_[0].configured || rx_[1].configured; }
  bool any_tx_configured() const { return tx_[0].configured || tx_[1].configured; }
  bool any_irq_mode() const { return rx_[0].irq_mode || rx_[1].irq_mode; }

  void program_rx(RxQueue& q);
  void program_tx(TxQueue& q);
  void program_irq_routing();
  void arm_rx_irq_registers(RxQueue& q);
  bool rearm_if_fired(RxQueue& q);
  int alloc_queue_memory(QueueMemory& block, uint32_t size, const char* what);
  void free_queue_memory(QueueMemory& block);
  void release_rx(RxQueue& q);
  void release_tx(TxQueue& q);
  void free_slots(ufab_buf** slots, const Ring& ring, uint32_t from, uint32_t count);
  uint32_t harvest(RxQueue& q, ufab_buf** bufs, uint32_t n);
  void refill(RxQueue& q);
  void reclaim_tx(TxQueue& q);
  void free_in_flight(TxQueue& q);
  int running_tx(uint16_t queue, const char* what, TxQueue** out);
  uint32_t fill_gathered(TxQueue& q, uint32_t at, const ufab_tx_frame& f);
  void ring_tx(TxQueue& q, uint32_t tail, uint32_t frames, uint64_t bytes);
  static bool rx_pending(const RxQueue& q) {
    return q.configured && q.next != q.tail && (rx_status(&q.desc[q.next]) & kRxStaDd);
  }

  const ufab_host_ops* ops_;
  ufab_host* host_;
  Mmio bar_;
  // Hot-path registers shared by the queues, validated once in open(). Each
  // queue touches only its own bit in them (IMS write-1-to-set, ICR
  // write-1-to-clear, ICS write-1-to-set), so queues need no common lock.
  Reg32 ims_, imc_, icr_, ics_;

  uint8_t mac_[6] = {};
  std::string mac_source_;
  bool started_ = false;
  bool promiscuous_ = false;
  uint32_t mtu_ = kDefaultMtu;               // device parameter mtu=
  uint32_t max_tx_frame_ = kMaxTxFrame;      // max_tx_frame(mtu_)
  bool irq_vectors_ = false;  // MSI-X vectors 0 and 1 enabled through the host
  int irq_fd_[kQueueCount] = {-1, -1};  // vector q serves RX queue q

  RxQueue rx_[kQueueCount];
  TxQueue tx_[kQueueCount];
  StatsTotals totals_;  // device counters (stats() only)
};

// ------------------------------------------------------------------ open

int E1000e::open(const ufab_host_ops* ops, ufab_host* host, E1000e** out) {
  if (!ops || !out) return -EINVAL;
  if (ops->size < offsetof(ufab_host_ops, buf_free) + sizeof(ops->buf_free)) {
    if (ops->size >= offsetof(ufab_host_ops, set_error) + sizeof(ops->set_error) && ops->set_error) {
      ops->set_error(host,
                     "e1000e: the host's service table is older than this plugin (no buffer services); "
                     "use a ufab build at least as new as the plugin");
    }
    return -ENOTSUP;
  }
  std::unique_ptr<E1000e> dev(new E1000e(ops, host));

  volatile void* base = nullptr;
  uint64_t size = 0;
  if (int rc = ops->map_bar(host, 0, &base, &size); rc < 0) return dev->host_failed(rc, "mapping BAR0");
  if (!base || size < kBar0MinSize) {
    return dev->fail(ENODEV, "BAR0 is " + std::to_string(size) +
                                 " bytes; an 82574L has a 128 KiB register BAR0. "
                                 "Check that the device at this address really is an 82574L (8086:10d3)");
  }
  dev->bar_ = Mmio(const_cast<void*>(base), size);
  // Every register in regs.h lies below 128 KiB: checking the last dword
  // checks them all (bounds and 4-byte alignment of the mapping).
  if (auto ok = dev->bar_.check(kBar0MinSize - 4, 4); !ok) return dev->fail(ok.error().code(), ok.error().message());
  for (uint16_t q = 0; q < kQueueCount; ++q) {
    dev->rx_[q].index = q;
    dev->tx_[q].index = q;
  }
  dev->ims_ = dev->reg(kIms);
  dev->imc_ = dev->reg(kImc);
  dev->icr_ = dev->reg(kIcr);
  dev->ics_ = dev->reg(kIcs);

  if (int rc = dev->parse_mtu(); rc < 0) return rc;
  if (int rc = ops->enable_bus_master(host); rc < 0) return dev->host_failed(rc, "enabling bus mastering");
  if (int rc = dev->bring_up(); rc < 0) return rc;
  *out = dev.release();
  return 0;
}

// Device parameter mtu=N (bytes of IP packet, as a netdev's MTU): 1500 by
// default; up to kMaxMtu turns on long packets (regs.h). A larger MTU is
// the user's statement that every station on the segment takes such
// frames: soft-RoCE derives its path MTU from it (4096 from 4176 up) and
// offers that in its CM requests, as Linux rxe does from its netdev.
int E1000e::parse_mtu() {
  const char* s = ops_->param ? ops_->param(host_, "mtu") : nullptr;
  if (s == nullptr) return 0;
  char* end = nullptr;
  errno = 0;
  unsigned long v = std::strtoul(s, &end, 10);
  if (*s == '\0' || *s == '-' || *end != '\0' || errno != 0 || v < kDefaultMtu || v > kMaxMtu) {
    return fail(EINVAL, std::string("parameter mtu=") + s + ": give the link MTU in bytes, " +
                            std::to_string(kDefaultMtu) + " (the default, no jumbo frames) to " +
                            std::to_string(kMaxMtu) + " (the 82574L's 9 KB jumbo frames); e.g. mtu=9000");
  }
  mtu_ = static_cast<uint32_t>(v);
  max_tx_frame_ = max_tx_frame(mtu_);
  return 0;
}

// Reset and initialise (datasheet 4.6 "Software Initialization Sequence";
// DPDK's and Linux's 82571-family code do the same).
int E1000e::bring_up() {
  // Quiesce: no interrupts, no receive, no transmit, causes cleared.
  wr(kImc, ~0u);
  wr(kRctl, 0);
  wr(kTctl, rd(kTctl) & ~kTctlEn);
  (void)rd(kIcr);

  // Software reset. Hardware reloads from the NVM and sets EECD.AUTO_RD
  // when done; QEMU resets at once (10.x: every register; 7.2: only
  // RAL0/RAH0, which is why zero_registers() below exists).
  wr(kCtrl, rd(kCtrl) | kCtrlRst);
  sleep_us(1000);
  bool auto_read_done = false;
  for (int i = 0; i < 200 && !auto_read_done; ++i) {
    auto_read_done = rd(kEecd) & kEecdAutoRd;
    if (!auto_read_done) sleep_us(100);
  }
  if (!auto_read_done) log(UFAB_LOG_WARN, "EECD.AUTO_RD did not set within 20 ms of the reset; continuing");
  // The reset may have re-enabled causes: mask and clear again.
  wr(kImc, ~0u);
  (void)rd(kIcr);

  // Link: force it up with auto speed detection (copper PHY, no MDIO
  // needed); make sure no reset or master-disable bit is left set.
  uint32_t ctrl = rd(kCtrl);
  ctrl = (ctrl | kCtrlSlu | kCtrlAsde) & ~(kCtrlRst | kCtrlPhyRst | kCtrlGioMasterDisable);
  wr(kCtrl, ctrl);

  zero_registers();
  if (int rc = read_mac(); rc < 0) return rc;
  (void)read_counters();  // clear-on-read: start the counts at open

  LinkState l = decode_status(rd(kStatus));
  char m[96];
  std::snprintf(m, sizeof m, "up: MAC %02x:%02x:%02x:%02x:%02x:%02x (%s), link %s %u Mb/s", mac_[0], mac_[1], mac_[2],
                mac_[3], mac_[4], mac_[5], mac_source_.c_str(), l.up ? "up" : "down", l.speed_mbps);
  log(UFAB_LOG_INFO, m);
  return 0;
}

// Everything this driver relies on, set to a known value: QEMU 7.2's
// CTRL.RST keeps rings, RCTL, TCTL, IMS and the filters of the previous user.
void E1000e::zero_registers() {
  for (uint16_t q = 0; q < kQueueCount; ++q) {
    for (uint32_t r : {kRdbal0, kRdbah0, kRdlen0, kRdh0, kRdt0, kTdbal, kTdbah, kTdlen, kTdh, kTdt})
      wr(queue_reg(r, q), 0);
  }
  wr(kMrqc, 0);  // no RSS: every received frame lands in queue 0
  // No receive/transmit interrupt delays (legacy/MSI modes; MSI-X ignores them).
  for (uint32_t r : {kRdtr, kRadv, kTidv, kTadv}) wr(r, 0);
  wr(kRfctl, 0);   // EXTEN clear: legacy receive descriptors
  wr(kRxcsum, 0);  // no checksum offload: errors carry frame errors only
  // Interrupt routing and auto-clear/auto-mask: off until rx_irq().
  wr(kIvar, 0);
  wr(kEiac, 0);
  wr(kIam, 0);
  wr(kCtrlExt, rd(kCtrlExt) & ~(kCtrlExtIame | kCtrlExtEiame | kCtrlExtPbaSupport));
  wr(kTipg, kTipgDefault);
  for (uint32_t i = 0; i < kMtaCount; ++i) wr(kMta + 4 * i, 0);
  // Receive addresses 1..15 (unicast filters a previous user may have left).
  for (uint32_t i = 1; i < kRaCount; ++i) {
    wr(kRah0 + 8 * i, 0);
    wr(kRal0 + 8 * i, 0);
  }
  wr(kIcr, ~0u);
}

bool E1000e::eeprom_word(uint32_t word, uint16_t* value) {
  wr(kEerd, (word << kEerdAddrShift) | kEerdStart);
  for (int i = 0; i < 100; ++i) {
    uint32_t v = rd(kEerd);
    if (v & kEerdDone) {
      *value = static_cast<uint16_t>(v >> kEerdDataShift);
      return true;
    }
    sleep_us(100);
  }
  return false;
}

// The station address: RAL0/RAH0 as loaded from the NVM at reset; if those
// hold nothing valid, NVM words 0-2 through EERD, written back to RA0.
int E1000e::read_mac() {
  if (mac_from_ra(rd(kRal0), rd(kRah0), mac_) && mac_usable(mac_)) {
    mac_source_ = "RAL0/RAH0";
    return 0;
  }
  uint16_t w[3];
  for (uint32_t i = 0; i < 3; ++i) {
    if (!eeprom_word(i, &w[i])) {
      return fail(EIO, "no valid MAC address: RAH0 has Address Valid clear and the NVM read (EERD word " +
                           std::to_string(i) +
                           ") did not complete within 10 ms; the NIC looks unprogrammed "
                           "or hung, reset it (unbind/bind) and retry");
    }
  }
  for (int i = 0; i < 3; ++i) {
    mac_[2 * i] = static_cast<uint8_t>(w[i]);
    mac_[2 * i + 1] = static_cast<uint8_t>(w[i] >> 8);
  }
  if (!mac_usable(mac_)) {
    return fail(EADDRNOTAVAIL,
                "neither RAL0/RAH0 nor the NVM hold a usable unicast MAC address; the NIC's NVM "
                "is not programmed");
  }
  uint32_t ral, rah;
  mac_to_ra(mac_, &ral, &rah);
  wr(kRal0, ral);
  wr(kRah0, rah);
  mac_source_ = "NVM via EERD";
  return 0;
}

// Clear-on-read counters; each 64-bit octet counter low dword first.
CounterSnapshot E1000e::read_counters() const {
  CounterSnapshot s;
  s.gprc = rd(kGprc);
  s.gptc = rd(kGptc);
  s.tpr = rd(kTpr);
  s.tpt = rd(kTpt);
  uint32_t lo = rd(kGorcl);
  s.gorc = join64(lo, rd(kGorch));
  lo = rd(kGotcl);
  s.gotc = join64(lo, rd(kGotch));
  lo = rd(kTorl);
  s.tor = join64(lo, rd(kTorh));
  lo = rd(kTotl);
  s.tot = join64(lo, rd(kToth));
  s.mpc = rd(kMpc);
  s.rnbc = rd(kRnbc);
  s.crcerrs = rd(kCrcerrs);
  s.rxerrc = rd(kRxerrc);
  s.ecol = rd(kEcol);
  s.latecol = rd(kLatecol);
  return s;
}

// ----------------------------------------------------------------- close

E1000e::~E1000e() {
  if (bar_.origin()) {
    wr(kImc, ~0u);
    wr(kRctl, 0);
    wr(kTctl, rd(kTctl) & ~kTctlEn);
    // Stop all DMA before the memory goes (datasheet 5.2.3.3 "Master
    // Disable"): set GIO_MASTER_DISABLE and wait for STATUS bit 19 to clear.
    wr(kCtrl, rd(kCtrl) | kCtrlGioMasterDisable);
    for (int i = 0; i < 100 && (rd(kStatus) & (1u << 19)); ++i) sleep_us(100);
  }
  for (uint16_t q = 0; q < kQueueCount; ++q) {
    reclaim_tx(tx_[q]);
    const QueueCounters &r = rx_[q].count, &t = tx_[q].count;
    if (r.packets || t.packets) {
      char m[200];
      std::snprintf(m, sizeof m,
                    "closed queue %u: sent %llu frames, received %llu, rx no-buffer %llu, rx errors %llu, irqs %llu",
                    q, static_cast<unsigned long long>(t.packets), static_cast<unsigned long long>(r.packets),
                    static_cast<unsigned long long>(r.no_buffer), static_cast<unsigned long long>(r.errors),
                    static_cast<unsigned long long>(r.irqs));
      log(UFAB_LOG_DEBUG, m);
    }
    release_rx(rx_[q]);
    release_tx(tx_[q]);
  }
  if (irq_vectors_) ops_->irq_disable(host_);
}

// ------------------------------------------------------------- info, link

int E1000e::info(ufab_dev_info* out) {
  *out = ufab_dev_info{};
  std::memcpy(out->mac, mac_, 6);
  out->max_rx_queues = kQueueCount;  // queue 1 receives nothing without RSS (rx_steer)
  out->max_tx_queues = kQueueCount;
  out->min_ring_size = kMinRing;
  out->max_ring_size = kMaxRing;
  out->mtu = mtu_;
  out->max_mtu = kMaxMtu;
  out->caps = UFAB_DEV_CAP_RX_IRQ;
  std::snprintf(out->model, sizeof out->model, "82574L (e1000e)");
  return 0;
}

int E1000e::link(ufab_link* out) {
  LinkState l = decode_status(rd(kStatus));
  out->up = l.up;
  out->speed_mbps = l.speed_mbps;
  out->full_duplex = l.full_duplex;
  return 0;
}

// ----------------------------------------------------------- queue setup

int E1000e::alloc_queue_memory(QueueMemory& block, uint32_t size, const char* what) {
  size_t bytes = size_t{size} * kDescBytes + 2 * size_t{size} * sizeof(ufab_buf*);
  if (int rc = ops_->dma_alloc(host_, bytes, 4096, &block.mem); rc < 0) {
    return host_failed(rc, std::string("allocating DMA memory for the ") + what + " ring");
  }
  if (block.mem.iova & 0xF) {
    ops_->dma_free(host_, &block.mem);
    return fail(EINVAL, std::string("the host returned ") + what + " ring memory at IOVA " +
                            std::to_string(block.mem.iova) + ", not 16-byte aligned as descriptor rings must be");
  }
  block.allocated = true;
  return 0;
}

void E1000e::free_queue_memory(QueueMemory& block) {
  if (block.allocated) ops_->dma_free(host_, &block.mem);
  block = QueueMemory{};
}

// Returns `count` buffers held in slots [from, from + count) (wrapping).
void E1000e::free_slots(ufab_buf** slots, const Ring& ring, uint32_t from, uint32_t count) {
  uint32_t first = ring.contiguous(from, count);
  if (first) ops_->buf_free(host_, slots + from, first);
  if (count > first) ops_->buf_free(host_, slots, count - first);
}

// Gives back a queue's buffers and ring memory; keeps what is not about the
// ring (index, doorbell, interrupt mode, counters).
void E1000e::release_rx(RxQueue& q) {
  if (!q.configured) return;
  // Slots in [next, tail) hold the posted buffers.
  uint32_t posted = q.ring.distance(q.next, q.tail);
  if (posted) free_slots(q.slots, q.ring, q.next, posted);
  free_queue_memory(q.block);
  q.configured = false;
  q.desc = nullptr;
  q.slots = q.scratch = nullptr;
  q.next = q.tail = q.unfilled = 0;
}

void E1000e::release_tx(TxQueue& q) {
  if (!q.configured) return;
  free_in_flight(q);
  free_queue_memory(q.block);
  q.configured = false;
  q.desc = nullptr;
  q.slots = q.done = nullptr;
  q.clean = q.tail = 0;
}

RxQueue* E1000e::rx_queue(uint16_t queue, const char* what) {
  if (queue < kQueueCount) return &rx_[queue];
  fail(EINVAL, std::string(what) + ": RX queue " + std::to_string(queue) +
                   " does not exist; the 82574L has RX queues 0 and 1");
  return nullptr;
}

TxQueue* E1000e::tx_queue(uint16_t queue, const char* what) {
  if (queue < kQueueCount) return &tx_[queue];
  fail(EINVAL, std::string(what) + ": TX queue " + std::to_string(queue) +
                   " does not exist; the 82574L has TX queues 0 and 1");
  return nullptr;
}

int E1000e::rx_queue_setup(uint16_t queue, const ufab_queue_conf* conf) {
  RxQueue* rq = rx_queue(queue, "rx_queue_setup");
  if (!rq) return -EINVAL;
  if (started_) return fail(EBUSY, "RX queue setup while the device is started; call stop() first");
  if (!conf || !conf->pool) return fail(EINVAL, "RX queue setup needs a buffer pool (ufab_queue_conf.pool)");
  if (!valid_ring_size(conf->size)) {
    return fail(EINVAL, "RX ring size " + std::to_string(conf->size) + " is not supported; use a power of two from " +
                            std::to_string(kMinRing) + " to " + std::to_string(kMaxRing));
  }
  release_rx(*rq);
  RxQueue& q = *rq;
  q.ring.size = conf->size;
  if (int rc = alloc_queue_memory(q.block, conf->size, "RX"); rc < 0) return rc;
  q.desc = static_cast<volatile RxDesc*>(q.block.mem.va);
  q.slots = reinterpret_cast<ufab_buf**>(static_cast<uint8_t*>(q.block.mem.va) + size_t{conf->size} * kDescBytes);
  q.scratch = q.slots + conf->size;
  q.pool = conf->pool;

  uint32_t want = q.ring.capacity();
  int got = ops_->buf_alloc(host_, q.pool, q.slots, want);
  if (got <= 0) {
    free_queue_memory(q.block);
    return fail(ENOBUFS, "the RX buffer pool has no free buffers to fill the ring; create it with at least " +
                             std::to_string(want) + " buffers (ring size - 1) plus what the application holds");
  }
  for (int i = 0; i < got; ++i) {
    ufab_buf* b = q.slots[i];
    const uint32_t room = rx_room_needed();
    if (b->offset >= b->capacity || b->capacity - b->offset < room) {
      std::string m = "RX buffers have " + std::to_string(b->capacity) + " bytes with " + std::to_string(b->offset) +
                      " bytes of headroom, leaving less than the " + std::to_string(room) +
                      " bytes the 82574L may write per buffer at MTU " + std::to_string(mtu_) +
                      "; create the pool with buffer_size >= headroom + " + std::to_string(room);
      ops_->buf_free(host_, q.slots, static_cast<uint32_t>(got));
      free_queue_memory(q.block);
      return fail(EINVAL, m);
    }
    rx_post(&q.desc[i], b->base_iova + b->offset);
  }
  q.next = 0;
  q.tail = static_cast<uint32_t>(got);
  q.unfilled = want - static_cast<uint32_t>(got);
  if (q.unfilled) {
    log(UFAB_LOG_WARN, "RX ring of " + std::to_string(conf->size) + " filled with only " + std::to_string(got) +
                           " buffers: the pool is short; the rest are posted as buffers come back");
  }
  q.rdt = reg(queue_reg(kRdt0, queue));
  q.cause = kIntRxq0 << queue;
  q.configured = true;
  return 0;
}

int E1000e::tx_queue_setup(uint16_t queue, const ufab_queue_conf* conf) {
  TxQueue* tq = tx_queue(queue, "tx_queue_setup");
  if (!tq) return -EINVAL;
  if (started_) return fail(EBUSY, "TX queue setup while the device is started; call stop() first");
  if (!conf) return fail(EINVAL, "TX queue setup without a configuration");
  if (!valid_ring_size(conf->size)) {
    return fail(EINVAL, "TX ring size " + std::to_string(conf->size) + " is not supported; use a power of two from " +
                            std::to_string(kMinRing) + " to " + std::to_string(kMaxRing));
  }
  release_tx(*tq);
  TxQueue& q = *tq;
  q.ring.size = conf->size;
  if (int rc = alloc_queue_memory(q.block, conf->size, "TX"); rc < 0) return rc;
  q.desc = static_cast<volatile TxDesc*>(q.block.mem.va);
  q.slots = reinterpret_cast<ufab_buf**>(static_cast<uint8_t*>(q.block.mem.va) + size_t{conf->size} * kDescBytes);
  q.done = q.slots + conf->size;
  q.tdt = reg(queue_reg(kTdt, queue));
  q.configured = true;
  return 0;
}

// ------------------------------------------------------------ start/stop

void E1000e::program_rx(RxQueue& q) {
  // Posted slots get a fresh descriptor: frames left unharvested by a
  // previous run are dropped rather than read back as new.
  for (uint32_t i = q.next; i != q.tail; i = q.ring.next(i)) {
    rx_post(&q.desc[i], q.slots[i]->base_iova + q.slots[i]->offset);
  }
  q.discarding = false;
  uint64_t iova = q.block.mem.iova;
  wr(queue_reg(kRdbal0, q.index), static_cast<uint32_t>(iova));
  wr(queue_reg(kRdbah0, q.index), static_cast<uint32_t>(iova >> 32));
  wr(queue_reg(kRdlen0, q.index), q.ring.size * kDescBytes);
  barrier::descriptors_before_doorbell();
  wr(queue_reg(kRdh0, q.index), q.next);
  wr(queue_reg(kRdt0, q.index), q.tail);
}

void E1000e::program_tx(TxQueue& q) {
  uint64_t iova = q.block.mem.iova;
  wr(queue_reg(kTdbal, q.index), static_cast<uint32_t>(iova));
  wr(queue_reg(kTdbah, q.index), static_cast<uint32_t>(iova >> 32));
  wr(queue_reg(kTdlen, q.index), q.ring.size * kDescBytes);
  wr(queue_reg(kTdh, q.index), q.tail);
  wr(queue_reg(kTdt, q.index), q.tail);
  // TARCn bit 10 enables the queue; QEMU transmits only with it set.
  uint32_t tarc = queue_reg(kTarc0, q.index);
  wr(tarc, rd(tarc) | kTarcEnable);
}

int E1000e::start() {
  if (started_) return 0;
  if (!any_rx_configured() && !any_tx_configured()) {
    return fail(EINVAL, "start() with no queue set up; call rx_queue_setup and/or tx_queue_setup first");
  }
  if (any_tx_configured()) {
    wr(kTipg, kTipgDefault);
    for (auto& q : tx_)
      if (q.configured) program_tx(q);
    wr(kTctl, kTctlEn | kTctlPsp | kTctlCt | kTctlCold | kTctlRtlc);
  }
  if (any_rx_configured()) {
    wr(kRfctl, rd(kRfctl) & ~kRfctlExten);  // legacy descriptors
    // Only ring 0 goes to the device. Without RSS the 82574L never fills
    // ring 1; and QEMU's e1000e_can_receive() says yes when *any* enabled
    // ring has room, so an idle ring 1 full of buffers would make QEMU keep
    // offering frames while ring 0 is full, each refused by
    // e1000e_receive_iov() (RXO), instead of holding them until ring 0 is
    // refilled. RX queue 1 keeps its software ring, answers rx_burst with
    // 0, and RDLEN1 stays 0 (ring disabled).
    for (auto& q : rx_) {
      q.on_device = q.configured && q.index == 0;
      if (q.on_device) program_rx(q);
    }
    wr(queue_reg(kRdlen0, 1), 0);
    wr(kRctl, rctl_value());
  }
  started_ = true;
  if (any_irq_mode()) {
    program_irq_routing();
    for (auto& q : rx_)
      if (q.irq_mode) arm_rx_irq_registers(q);
  }
  if (!(rd(kStatus) & kStatusLu)) log(UFAB_LOG_WARN, "started with the link down (STATUS.LU clear)");
  return 0;
}

int E1000e::stop() {
  if (!started_) return 0;
  wr(kImc, ~0u);
  wr(kRctl, 0);
  wr(kTctl, rd(kTctl) & ~kTctlEn);
  started_ = false;
  // Frames still queued for transmit are abandoned; return their buffers.
  for (auto& q : tx_) free_in_flight(q);
  return 0;
}

int E1000e::set_promiscuous(int enable) {
  promiscuous_ = enable != 0;
  if (started_ && any_rx_configured()) wr(kRctl, rctl_value());
  return 0;
}

// Receive steering (ABI 1.2). The 82574L's only way to put a frame in RX
// queue 1 is RSS (datasheet 7.1.2 "Receive Queues", MRQC in regs.h): a
// Toeplitz hash over the IPv4/IPv6 addresses, plus the TCP ports for TCP;
// UDP has no hash field. RoCEv2 is UDP, so every packet between two hosts
// hashes alike whatever its destination QP: the device cannot steer by QP.
// UFAB_STEER_NONE (all frames to queue 0) is what it does without RSS.
int E1000e::rx_steer(uint32_t mode, uint16_t nqueues) {
  if (started_) return fail(EBUSY, "rx_steer while the device is started; call stop() first");
  if (nqueues < 1 || nqueues > kQueueCount) {
    return fail(EINVAL, "rx_steer over " + std::to_string(nqueues) + " RX queues; the 82574L has 1 to " +
                            std::to_string(kQueueCount));
  }
  switch (mode) {
    case UFAB_STEER_NONE:
      wr(kMrqc, 0);
      return 0;
    case UFAB_STEER_ROCE_QPN:
      return fail(EOPNOTSUPP,
                  "the 82574L cannot steer RoCEv2 frames by destination QP: its only receive steering is RSS "
                  "(MRQC), which hashes IPv4/IPv6 addresses and TCP ports, never UDP ports or the BTH, so all "
                  "RoCEv2 traffic between two hosts lands in one queue; every frame stays in RX queue 0, steer "
                  "in software");
    default:
      return fail(EOPNOTSUPP, "steering mode " + std::to_string(mode) +
                                  " is unknown to this e1000e plugin; every frame stays in RX queue 0");
  }
}

// --------------------------------------------------------------- receive

// Takes up to n completed frames from the ring. Errored descriptors are
// dropped (their buffers go back to the pool).
uint32_t E1000e::harvest(RxQueue& q, ufab_buf** bufs, uint32_t n) {
  uint32_t got = 0;
  uint64_t bytes = 0;
  uint32_t i = q.next;
  while (got < n && i != q.tail) {
    volatile RxDesc* d = &q.desc[i];
    uint8_t status = rx_status(d);
    if (!(status & kRxStaDd)) break;
    barrier::device_status_before_descriptor_reads();
    ufab_buf* b = q.slots[i];
    q.slots[i] = nullptr;
    uint8_t errors = rx_errors(d);
    uint32_t len = rx_length(d);
    bool eop = status & kRxStaEop;
    bool bad = q.discarding || !eop || (errors & kRxErrFrame) || len == 0 || len > b->capacity - b->offset;
    q.discarding = !eop;  // drop the rest of a frame that spans descriptors
    i = q.ring.next(i);
    if (bad) {
      ++q.count.errors;
      ops_->buf_free(host_, &b, 1);
      continue;
    }
    b->len = len;
    b->flags = (errors & kRxErrCsum) ? UFAB_BUF_F_RX_CSUM_BAD : 0;
    bufs[got++] = b;
    bytes += len;
  }
  q.next = i;
  q.count.packets += got;
  q.count.bytes += bytes;
  return got;
}

// Gives empty slots fresh buffers from the pool in one allocation and
// moves RDT once. QEMU delivers frames it queued while the ring was full
// inside that RDT write.
void E1000e::refill(RxQueue& q) {
  uint32_t posted = q.ring.distance(q.next, q.tail);
  uint32_t empty = q.ring.capacity() - posted;
  if (empty == 0) return;
  int got = ops_->buf_alloc(host_, q.pool, q.scratch, empty);
  uint32_t filled = got > 0 ? static_cast<uint32_t>(got) : 0;
  uint32_t at = q.tail;
  for (uint32_t k = 0; k < filled; ++k) {
    ufab_buf* b = q.scratch[k];
    q.slots[at] = b;
    rx_post(&q.desc[at], b->base_iova + b->offset);
    at = q.ring.next(at);
  }
  uint32_t unfilled = empty - filled;
  if (unfilled > q.unfilled) q.count.no_buffer += unfilled - q.unfilled;
  q.unfilled = unfilled;
  if (filled) {
    q.tail = at;
    if (q.on_device) {
      barrier::descriptors_before_doorbell();
      q.rdt.write(q.tail);
    }
  }
}

int E1000e::rx_burst(uint16_t queue, ufab_buf** bufs, uint16_t n) {
  RxQueue* qp = rx_queue(queue, "rx_burst");
  if (!qp) return -EINVAL;
  RxQueue& q = *qp;
  if (!q.configured) return fail(EINVAL, "rx_burst on RX queue " + std::to_string(queue) + " before rx_queue_setup");
  uint32_t got = harvest(q, bufs, n);
  refill(q);
  if (got == 0 && n > 0 && q.irq_mode && started_ && !q.arm_on_request) {
    // Interrupt mode and nothing to do: the caller may be about to sleep.
    if (rearm_if_fired(q)) {
      got = harvest(q, bufs, n);
      refill(q);
    }
  }
  return static_cast<int>(got);
}

// If the queue's vector fired since it was armed (EIAC auto-masked its
// cause in IMS), re-arms: drops the stale cause and unmasks. True when a
// frame landed before the unmask (it raised no interrupt) and waits in the
// ring.
bool E1000e::rearm_if_fired(RxQueue& q) {
  if (ims_.read() & q.cause) return false;  // still armed
  ++q.count.irqs;
  icr_.write(q.cause);
  ims_.write(q.cause);
  return rx_pending(q);
}

// The caller is about to sleep: from now on only here, not on every empty
// rx_burst (an IMS read each, an exit to the hypervisor under emulation).
int E1000e::rx_irq_arm(uint16_t queue) {
  RxQueue* qp = rx_queue(queue, "rx_irq_arm");
  if (!qp) return -EINVAL;
  if (!qp->irq_mode || !started_)
    return fail(EINVAL, "rx_irq_arm without the interrupt enabled on a started device");
  qp->arm_on_request = true;
  // A frame that landed before the unmask raised nothing: raise it now.
  if (rearm_if_fired(*qp)) ics_.write(qp->cause);
  return 0;
}

// -------------------------------------------------------------- transmit

// The slot of the last descriptor of the frame that starts at `first`: the
// first slot from there that holds a buffer (at most UFAB_TX_SEGS_MAX - 1
// steps; every frame in flight ends in a slot with its buffer).
uint32_t frame_end(const TxQueue& q, uint32_t first) {
  uint32_t i = first;
  while (!q.slots[i]) i = q.ring.next(i);
  return i;
}

// Returns the buffers of frames the device is done with, oldest first, in
// one buf_free. Only a frame's last descriptor has RS, so only its DD is
// written back (datasheet 7.2, ring.h tx_cmd): reclaim goes frame by frame.
void E1000e::reclaim_tx(TxQueue& q) {
  if (!q.configured) return;
  uint32_t c = q.clean, n = 0;
  while (c != q.tail) {
    uint32_t eop = frame_end(q, c);
    if (!tx_done(&q.desc[eop])) break;
    q.done[n++] = q.slots[eop];
    c = q.ring.next(eop);
  }
  if (n == 0) return;
  barrier::device_status_before_descriptor_reads();
  ops_->buf_free(host_, q.done, n);
  q.clean = c;
}

// Returns the buffers of every frame still in the ring, done or not (the
// device has stopped or is about to lose the ring).
void E1000e::free_in_flight(TxQueue& q) {
  if (!q.configured) return;
  uint32_t n = 0;
  for (uint32_t i = q.clean; i != q.tail; i = q.ring.next(i))
    if (q.slots[i]) q.done[n++] = q.slots[i];
  if (n) ops_->buf_free(host_, q.done, n);
  q.clean = q.tail;
}

// The checks tx_burst and tx_burst_gather share: the queue exists, is set
// up, and the device is started. 0, or -errno after set_error.
int E1000e::running_tx(uint16_t queue, const char* what, TxQueue** out) {
  TxQueue* qp = tx_queue(queue, what);
  if (!qp) return -EINVAL;
  if (!qp->configured)
    return fail(EINVAL, std::string(what) + " on TX queue " + std::to_string(queue) + " before tx_queue_setup");
  if (!started_) return fail(ENETDOWN, std::string(what) + " while the device is stopped; call start() first");
  *out = qp;
  return 0;
}

// Hands descriptors up to (not including) `tail` to the device: one
// barrier, one TDT write for the whole burst.
void E1000e::ring_tx(TxQueue& q, uint32_t tail, uint32_t frames, uint64_t bytes) {
  q.tail = tail;
  barrier::descriptors_before_doorbell();
  q.tdt.write(tail);  // QEMU transmits the whole burst inside this write
  q.count.packets += frames;
  q.count.bytes += bytes;
}

// A descriptor's buffer never crosses a 4 KiB page of IOVA space: the
// pages behind a mapped range need not be contiguous in memory, and QEMU's
// e1000e maps each descriptor's buffer as one piece (pci_dma_map), dropping
// the whole frame when the mapping comes back short. The 82574L itself
// takes any length (datasheet 7.2.2); the split costs a descriptor.
constexpr uint64_t kTxPage = 4096;

uint32_t descriptors_for(const ufab_tx_seg& s) {
  return static_cast<uint32_t>(((s.iova + s.len - 1) / kTxPage) - (s.iova / kTxPage) + 1);
}

uint32_t descriptors_for(const ufab_tx_frame& f) {
  uint32_t n = 0;
  for (uint32_t s = 0; s < f.nsegs; ++s) n += descriptors_for(f.segs[s]);
  return n;
}

// Writes frame `f` as legacy descriptors from slot `at` on: one per
// segment, or per page piece of it (above), each at its IOVA (the caller
// mapped the segments for this device), EOP|IFCS|RS on the last only
// (ring.h tx_cmd, datasheet 7.2); the frame's buffer goes to that last
// slot. Returns the slot after the frame.
uint32_t E1000e::fill_gathered(TxQueue& q, uint32_t at, const ufab_tx_frame& f) {
  for (uint32_t s = 0; s < f.nsegs; ++s) {
    uint64_t iova = f.segs[s].iova;
    uint32_t left = f.segs[s].len;
    while (left > 0) {
      uint32_t piece = static_cast<uint32_t>(std::min<uint64_t>(left, kTxPage - iova % kTxPage));
      bool last = s + 1 == f.nsegs && piece == left;
      tx_fill(&q.desc[at], iova, piece, last);
      q.slots[at] = last ? f.buf : nullptr;
      at = q.ring.next(at);
      iova += piece;
      left -= piece;
    }
  }
  return at;
}

int E1000e::tx_burst(uint16_t queue, ufab_buf** bufs, uint16_t n) {
  TxQueue* qp = nullptr;
  if (int rc = running_tx(queue, "tx_burst", &qp); rc < 0) return rc;
  TxQueue& q = *qp;
  reclaim_tx(q);
  uint32_t room = q.ring.free_after(q.ring.distance(q.clean, q.tail));
  uint32_t t = q.tail;
  uint64_t bytes = 0;
  uint32_t i = 0;
  bool invalid = false;
  for (; i < n; ++i) {
    ufab_buf* b = bufs[i];
    if (b->len < kMinTxFrame || b->len > max_tx_frame_ || b->offset > b->capacity ||
        b->len > b->capacity - b->offset) {
      invalid = true;
      break;
    }
    // A frame up to 1522 bytes in a pool buffer of 2 KiB never crosses a
    // page and takes one descriptor; a jumbo frame may take a few.
    ufab_tx_frame f{};
    f.buf = b;
    f.nsegs = 1;
    f.len = b->len;
    f.segs[0] = {b->base + b->offset, b->base_iova + b->offset, b->len, 0};
    uint32_t need = descriptors_for(f);
    if (need > room) break;
    t = fill_gathered(q, t, f);
    room -= need;
    bytes += b->len;
  }
  if (i == 0) {
    if (!invalid) return 0;  // nothing asked, or the ring is full
    ++q.count.rejected;
    ufab_buf* b = bufs[0];
    return fail(EINVAL, "tx_burst: frame of " + std::to_string(b->len) + " bytes at offset " +
                            std::to_string(b->offset) + " in a " + std::to_string(b->capacity) +
                            "-byte buffer; at MTU " + std::to_string(mtu_) + " the 82574L sends frames of " +
                            std::to_string(kMinTxFrame) + ".." + std::to_string(max_tx_frame_) +
                            " bytes (device parameter mtu= raises the limit, up to " + std::to_string(kMaxMtu) + ")");
  }
  ring_tx(q, t, i, bytes);
  return static_cast<int>(i);
}

// Gather transmit (ABI 1.3): a frame takes nsegs descriptors and is taken
// whole or not at all; the call stops at the first frame the ring has no
// room for (0 when that is the first) or that is invalid (an error when
// that is the first; the next call reports a later one).
int E1000e::tx_burst_gather(uint16_t queue, const ufab_tx_frame* frames, uint16_t n) {
  TxQueue* qp = nullptr;
  if (int rc = running_tx(queue, "tx_burst_gather", &qp); rc < 0) return rc;
  TxQueue& q = *qp;
  reclaim_tx(q);
  uint32_t room = q.ring.free_after(q.ring.distance(q.clean, q.tail));
  uint32_t t = q.tail;
  uint64_t bytes = 0;
  uint32_t i = 0;
  sdk::TxFrameCheck check;
  for (; i < n; ++i) {
    const ufab_tx_frame& f = frames[i];
    check = sdk::check_tx_frame(f, kMinTxFrame, max_tx_frame_);
    if (check.fault != sdk::TxFrameFault::kNone) break;
    uint32_t need = descriptors_for(f);
    if (need > room) break;
    t = fill_gathered(q, t, f);
    room -= need;
    bytes += f.len;
  }
  if (i == 0 && n > 0 && check.fault != sdk::TxFrameFault::kNone) {
    ++q.count.rejected;
    return fail(EINVAL, "tx_burst_gather: frame 0 " + sdk::describe(check, frames[0], kMinTxFrame, max_tx_frame_));
  }
  if (i == 0) return 0;  // nothing asked, or no room for the first frame's descriptors
  ring_tx(q, t, i, bytes);
  return static_cast<int>(i);
}

// ------------------------------------------------------------ statistics

int E1000e::stats(ufab_stats* out) {
  totals_.add(read_counters());
  // What the queues counted themselves. Read while other threads may be
  // polling: each sum is a snapshot of counters that only grow.
  QueueCounters rx, tx;
  for (uint16_t q = 0; q < kQueueCount; ++q) {
    rx.packets += rx_[q].count.packets;
    rx.bytes += rx_[q].count.bytes;
    rx.no_buffer += rx_[q].count.no_buffer;
    rx.errors += rx_[q].count.errors;
    rx.irqs += rx_[q].count.irqs;
    tx.packets += tx_[q].count.packets;
    tx.bytes += tx_[q].count.bytes;
  }
  *out = ufab_stats{};
  out->rx_packets = totals_.rx_good;
  out->rx_bytes = totals_.rx_bytes();
  out->tx_packets = totals_.tx_good;
  out->tx_bytes = totals_.tx_bytes();
  out->rx_dropped = totals_.rx_missed + rx.no_buffer;
  out->rx_errors = totals_.rx_crc_errors + totals_.rx_errors + rx.errors;
  out->tx_errors = totals_.tx_collisions;
  out->irqs = rx.irqs;
  char m[240];
  std::snprintf(m, sizeof m,
                "stats: device rx %llu tx %llu frames; driver rx %llu tx %llu frames (TX queue 1: %llu), %llu/%llu "
                "bytes; no-buffer %llu",
                static_cast<unsigned long long>(totals_.rx_good), static_cast<unsigned long long>(totals_.tx_good),
                static_cast<unsigned long long>(rx.packets), static_cast<unsigned long long>(tx.packets),
                static_cast<unsigned long long>(tx_[1].count.packets), static_cast<unsigned long long>(rx.bytes),
                static_cast<unsigned long long>(tx.bytes), static_cast<unsigned long long>(rx.no_buffer));
  log(UFAB_LOG_DEBUG, m);
  if (totals_.tx_good != tx.packets && started_) {
    // QEMU transmits inside the TDT write, so the two agree whenever no
    // frame was refused by the backend.
    log(UFAB_LOG_DEBUG, "stats: GPTC " + std::to_string(totals_.tx_good) + " differs from frames queued " +
                            std::to_string(tx.packets));
  }
  return 0;
}

// ------------------------------------------------------------ interrupts

// MSI-X routing, one vector per RX queue (datasheet 7.4 "Interrupts",
// 10.2.4.8 IVAR):
//   IVAR: RXQ0 -> vector 0, RXQ1 -> vector 1, both valid; TXQ0/1 and Other
//   unrouted (TX completions are reaped by polling).
//   CTRL_EXT: PBA support on (required with MSI-X), IAME/EIAME off.
//   EIAC: RXQ0 and RXQ1 auto-clear on each MSI-X message, which (IAME
//   clear) also auto-masks that cause in IMS: one message per arming per
//   queue, re-armed by rx_burst or rx_irq_arm of that queue only.
void E1000e::program_irq_routing() {
  wr(kIvar, (kIvarValid | 0u) << kIvarRxq0Shift | (kIvarValid | 1u) << kIvarRxq1Shift);
  wr(kCtrlExt, (rd(kCtrlExt) | kCtrlExtPbaSupport) & ~(kCtrlExtIame | kCtrlExtEiame));
  wr(kIam, 0);
  wr(kEiac, kIntRxq0 | kIntRxq1);
}

void E1000e::arm_rx_irq_registers(RxQueue& q) {
  icr_.write(q.cause);
  ims_.write(q.cause);
  // Frames already waiting raise no new cause: make the eventfd readable
  // so a caller that sleeps right away still wakes for them.
  if (rx_pending(q)) ics_.write(q.cause);
}

int E1000e::rx_irq(uint16_t queue, int enable, int* eventfd) {
  RxQueue* qp = rx_queue(queue, "rx_irq");
  if (!qp) return -EINVAL;
  RxQueue& q = *qp;
  if (!enable) {
    imc_.write(kIntRxq0 << queue);
    q.irq_mode = false;
    q.arm_on_request = false;
    if (eventfd) *eventfd = -1;
    return 0;
  }
  if (!irq_vectors_) {
    // Vectors for both RX queues at once (of the 82574L's 5): Linux 6.1's
    // VFIO cannot add MSI-X vectors to an enabled set later.
    int fds[kQueueCount] = {-1, -1};
    if (int rc = ops_->irq_enable(host_, kQueueCount, fds); rc < 0)
      return host_failed(rc, "enabling MSI-X vectors 0 and 1");
    irq_vectors_ = true;
    for (uint16_t i = 0; i < kQueueCount; ++i) irq_fd_[i] = fds[i];
  }
  q.cause = kIntRxq0 << queue;
  q.irq_mode = true;
  if (started_) {
    program_irq_routing();
    arm_rx_irq_registers(q);
  }
  if (eventfd) *eventfd = irq_fd_[queue];
  return 0;
}

}  // namespace
}  // namespace ufab::e1000e

extern "C" const ufab_driver* ufab_e1000e_driver(void) {
  static const ufab_driver driver = ufab::sdk::make_driver<ufab::e1000e::E1000e>(
      "e1000e",
      "Intel 82574L (QEMU e1000e): 2 RX + 2 TX queues (RX queue 1 idle: no RoCE steering), legacy descriptors, "
      "polling or MSI-X",
      ufab::e1000e::kMatch);
  return &driver;
}
