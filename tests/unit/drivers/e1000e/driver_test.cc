// The e1000e plugin through its C table, against a fake BAR0 (plain memory:
// registers read back what was last written) and fake host services. The
// test plays the device: it writes descriptors back and checks what the
// driver programmed.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "drivers/e1000e/e1000e.h"
#include "drivers/e1000e/regs.h"
#include "drivers/e1000e/ring.h"

namespace ufab::e1000e {
namespace {

struct FakePool {
  uint32_t buffer_size;
  uint32_t headroom;
  std::vector<ufab_buf> bufs;
  std::vector<uint8_t*> memory;
  std::vector<ufab_buf*> free_list;
  std::set<ufab_buf*> out;  // handed out, not yet returned

  FakePool(uint32_t count, uint32_t size, uint32_t head) : buffer_size(size), headroom(head), bufs(count) {
    for (auto& b : bufs) {
      // Page-aligned like dma::BufferPool's region, so a 2 KiB buffer
      // never crosses a 4 KiB page (a jumbo one does).
      uint8_t* m = static_cast<uint8_t*>(std::aligned_alloc(4096, (size + 4095) / 4096 * 4096));
      memory.push_back(m);
      b = ufab_buf{m, reinterpret_cast<uint64_t>(m), size, head, 0, 0, 0, handle()};
      free_list.push_back(&b);
    }
  }
  ~FakePool() {
    for (auto* m : memory) std::free(m);
  }
  ufab_pool* handle() { return reinterpret_cast<ufab_pool*>(this); }
  uint32_t available() const { return static_cast<uint32_t>(free_list.size()); }
};

struct FakeHost {
  alignas(4096) static inline uint8_t bar[kBar0MinSize];
  std::string error;
  std::vector<std::string> logs;
  std::map<uint64_t, void*> dma;  // cookie -> memory
  uint64_t next_cookie = 1;
  bool bus_master = false;
  int irq_fd = -1;   // vector 0 (RX queue 0)
  int irq_fd1 = -1;  // vector 1 (RX queue 1)
  uint32_t irq_enables = 0, irq_disables = 0;
  uint32_t buf_alloc_calls = 0, buf_free_calls = 0;
  int fail_map = 0;
  std::map<std::string, std::string> params;  // ops->param answers from here

  ufab_host* handle() { return reinterpret_cast<ufab_host*>(this); }
  static FakeHost& from(ufab_host* h) { return *reinterpret_cast<FakeHost*>(h); }

  uint32_t reg(uint32_t off) const {
    uint32_t v;
    std::memcpy(&v, bar + off, 4);
    return v;
  }
  void set(uint32_t off, uint32_t v) { std::memcpy(bar + off, &v, 4); }

  // What QEMU's e1000e shows after reset.
  void reset_bar() {
    std::memset(bar, 0, sizeof bar);
    set(kStatus, kStatusLu | kStatusFd | (2u << kStatusSpeedShift));
    set(kEecd, kEecdAutoRd);
    set(kRal0, 0x00005452);
    set(kRah0, 0x80000100);  // 52:54:00:00:00:01, AV
    set(kTarc0, 0x3);        // bit 10 clear: the driver must set it
    set(kRdh0, 0x11);        // stale ring state from a "previous user"
    set(kMta + 8, 0xffffffff);
    set(kRah0 + 8 * 3, 0x80001234);
    set(kRfctl, kRfctlExten);
  }
};

const ufab_host_ops kOps = {
    .size = sizeof(ufab_host_ops),
    .log = [](ufab_host* h, int, const char* m) { FakeHost::from(h).logs.push_back(m); },
    .set_error = [](ufab_host* h, const char* m) { FakeHost::from(h).error = m; },
    .name = [](ufab_host*) { return "fake0"; },
    .param = [](ufab_host* h, const char* key) -> const char* {
      const auto& p = FakeHost::from(h).params;
      auto it = p.find(key);
      return it == p.end() ? nullptr : it->second.c_str();
    },
    .map_bar =
        [](ufab_host* h, uint32_t index, volatile void** base, uint64_t* size) {
          FakeHost& f = FakeHost::from(h);
          if (f.fail_map) {
            f.error = "map failed for a reason the host explains";
            return -f.fail_map;
          }
          if (index != 0) return -EINVAL;
          *base = FakeHost::bar;
          *size = sizeof FakeHost::bar;
          return 0;
        },
    .config_read = [](ufab_host*, uint32_t, uint32_t, uint32_t*) { return -ENOTSUP; },
    .config_write = [](ufab_host*, uint32_t, uint32_t, uint32_t) { return -ENOTSUP; },
    .enable_bus_master =
        [](ufab_host* h) {
          FakeHost::from(h).bus_master = true;
          return 0;
        },
    .dma_alloc =
        [](ufab_host* h, size_t size, size_t align, ufab_dma_mem* out) {
          FakeHost& f = FakeHost::from(h);
          size_t rounded = (size + align - 1) / align * align;
          void* m = std::aligned_alloc(align, rounded);
          std::memset(m, 0, rounded);
          uint64_t cookie = f.next_cookie++;
          f.dma[cookie] = m;
          *out = ufab_dma_mem{m, reinterpret_cast<uint64_t>(m), size, cookie};
          return 0;
        },
    .dma_free =
        [](ufab_host* h, ufab_dma_mem* mem) {
          FakeHost& f = FakeHost::from(h);
          auto it = f.dma.find(mem->cookie);
          ASSERT_NE(it, f.dma.end()) << "dma_free of an unknown block";
          std::free(it->second);
          f.dma.erase(it);
        },
    .irq_enable =
        [](ufab_host* h, uint32_t count, int* fds) {
          FakeHost& f = FakeHost::from(h);
          EXPECT_EQ(count, 2u) << "one vector per RX queue, both in one call";
          f.irq_fd = eventfd(0, EFD_NONBLOCK);
          f.irq_fd1 = eventfd(0, EFD_NONBLOCK);
          fds[0] = f.irq_fd;
          fds[1] = f.irq_fd1;
          ++f.irq_enables;
          return 0;
        },
    .irq_disable =
        [](ufab_host* h) {
          FakeHost& f = FakeHost::from(h);
          if (f.irq_fd >= 0) close(f.irq_fd);
          if (f.irq_fd1 >= 0) close(f.irq_fd1);
          f.irq_fd = f.irq_fd1 = -1;
          ++f.irq_disables;
          return 0;
        },
    .buf_alloc =
        [](ufab_host* h, ufab_pool* p, ufab_buf** bufs, uint32_t n) {
          ++FakeHost::from(h).buf_alloc_calls;
          auto* pool = reinterpret_cast<FakePool*>(p);
          uint32_t k = 0;
          while (k < n && !pool->free_list.empty()) {
            ufab_buf* b = pool->free_list.back();
            pool->free_list.pop_back();
            b->offset = pool->headroom;
            b->len = 0;
            pool->out.insert(b);
            bufs[k++] = b;
          }
          return static_cast<int>(k);
        },
    .buf_free =
        [](ufab_host* h, ufab_buf** bufs, uint32_t n) {
          ++FakeHost::from(h).buf_free_calls;
          for (uint32_t i = 0; i < n; ++i) {
            auto* pool = reinterpret_cast<FakePool*>(bufs[i]->pool);
            ASSERT_EQ(pool->out.erase(bufs[i]), 1u) << "buffer freed twice or never allocated";
            pool->free_list.push_back(bufs[i]);
          }
        },
};

class E1000eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    host_.reset_bar();
    drv_ = ufab_e1000e_driver();
  }
  void TearDown() override {
    if (dev_) drv_->close(dev_);
    EXPECT_TRUE(host_.dma.empty()) << "DMA memory leaked";
    EXPECT_EQ(rx_pool_.out.size(), 0u) << "RX buffers leaked";
    EXPECT_EQ(tx_pool_.out.size(), 0u) << "TX buffers leaked";
  }
  void open() { ASSERT_EQ(drv_->open(&kOps, host_.handle(), &dev_), 0) << host_.error; }
  void setup(uint32_t rx = 64, uint32_t tx = 64) {
    open();
    ufab_queue_conf r{rx, rx_pool_.handle()};
    ASSERT_EQ(drv_->rx_queue_setup(dev_, 0, &r), 0) << host_.error;
    ufab_queue_conf t{tx, nullptr};
    ASSERT_EQ(drv_->tx_queue_setup(dev_, 0, &t), 0) << host_.error;
    ASSERT_EQ(drv_->start(dev_), 0) << host_.error;
  }
  RxDesc* rx_ring(uint16_t q = 0) const {
    return reinterpret_cast<RxDesc*>(uint64_t{host_.reg(queue_reg(kRdbah0, q))} << 32 |
                                     host_.reg(queue_reg(kRdbal0, q)));
  }
  TxDesc* tx_ring(uint16_t q = 0) const {
    return reinterpret_cast<TxDesc*>(uint64_t{host_.reg(queue_reg(kTdbah, q))} << 32 |
                                     host_.reg(queue_reg(kTdbal, q)));
  }
  // The "device" receives a frame into the descriptor at RDH of queue q.
  void device_receive(const std::vector<uint8_t>& frame, uint8_t errors = 0, uint8_t status = kRxStaDd | kRxStaEop,
                      uint16_t q = 0) {
    uint32_t head = host_.reg(queue_reg(kRdh0, q));
    ASSERT_NE(head, host_.reg(queue_reg(kRdt0, q))) << "no receive buffer posted";
    RxDesc* d = &rx_ring(q)[head];
    std::memcpy(reinterpret_cast<void*>(d->addr), frame.data(), frame.size());
    d->length = static_cast<uint16_t>(frame.size());
    d->errors = errors;
    d->status = status;
    host_.set(queue_reg(kRdh0, q), (head + 1) % (host_.reg(queue_reg(kRdlen0, q)) / 16));
  }
  // The "device" transmits up to `max_desc` descriptors from TDH (all up to
  // TDT by default) of queue q, as the datasheet's 7.2 says: a frame is the
  // buffers of its descriptors up to the one with EOP; DD is written back
  // only where RS is set. Returns the frames whose EOP it reached.
  std::vector<std::vector<uint8_t>> device_transmit(uint16_t q = 0, uint32_t max_desc = ~0u) {
    std::vector<std::vector<uint8_t>> sent;
    std::vector<uint8_t> frame;
    uint32_t n = host_.reg(queue_reg(kTdlen, q)) / 16;
    for (uint32_t h = host_.reg(queue_reg(kTdh, q)); h != host_.reg(queue_reg(kTdt, q)) && max_desc;
         h = (h + 1) % n, --max_desc) {
      TxDesc* d = &tx_ring(q)[h];
      auto* p = reinterpret_cast<uint8_t*>(d->addr);
      frame.insert(frame.end(), p, p + (d->lower & 0xffff));
      uint32_t cmd = d->lower >> 24;
      EXPECT_TRUE(cmd == 0 || cmd == uint32_t{kTxCmdEop | kTxCmdIfcs | kTxCmdRs}) << "CMD " << cmd << " at " << h;
      if (cmd & kTxCmdRs) d->upper |= kTxStaDd;
      if (cmd & kTxCmdEop) sent.push_back(std::move(frame)), frame.clear();
      host_.set(queue_reg(kTdh, q), (h + 1) % n);
    }
    return sent;
  }
  ufab_buf* tx_frame(uint32_t len, uint8_t fill) {
    ufab_buf* b = nullptr;
    EXPECT_EQ(kOps.buf_alloc(host_.handle(), tx_pool_.handle(), &b, 1), 1);
    std::memset(b->base + b->offset, fill, len);
    b->len = len;
    return b;
  }

  FakeHost host_;
  FakePool rx_pool_{300, 2048, 128};
  FakePool tx_pool_{300, 2048, 64};
  const ufab_driver* drv_ = nullptr;
  ufab_dev* dev_ = nullptr;
};

TEST_F(E1000eTest, TableHeaderAndMatch) {
  EXPECT_EQ(drv_->abi_major, UFAB_ABI_MAJOR);
  EXPECT_EQ(drv_->size, sizeof(ufab_driver));
  EXPECT_STREQ(drv_->name, "e1000e");
  ASSERT_NE(drv_->pci_match, nullptr);
  EXPECT_EQ(drv_->pci_match[0].vendor_id, 0x8086);
  EXPECT_EQ(drv_->pci_match[0].device_id, 0x10D3);
  EXPECT_EQ(drv_->pci_match[0].subsystem_vendor_id, UFAB_PCI_ANY);
  EXPECT_EQ(drv_->pci_match[1].vendor_id, 0);
  EXPECT_EQ(drv_->flags & UFAB_DRIVER_F_SOFTWARE, 0u);
  EXPECT_NE(drv_->tx_burst_gather, nullptr) << "ABI 1.3 gather transmit";
}

TEST_F(E1000eTest, OpenResetsAndZeroesWhatItUses) {
  open();
  EXPECT_TRUE(host_.bus_master);
  EXPECT_EQ(host_.reg(kImc), ~0u);
  EXPECT_EQ(host_.reg(kRctl), 0u);
  EXPECT_EQ(host_.reg(kTctl) & kTctlEn, 0u);
  uint32_t ctrl = host_.reg(kCtrl);
  EXPECT_TRUE(ctrl & kCtrlSlu);
  EXPECT_TRUE(ctrl & kCtrlAsde);
  EXPECT_FALSE(ctrl & (kCtrlRst | kCtrlPhyRst | kCtrlGioMasterDisable));
  EXPECT_EQ(host_.reg(kRdh0), 0u);
  EXPECT_EQ(host_.reg(kMta + 8), 0u);
  EXPECT_EQ(host_.reg(kRah0 + 8 * 3), 0u);
  EXPECT_EQ(host_.reg(kRfctl), 0u);
  EXPECT_EQ(host_.reg(kTipg), kTipgDefault);
  EXPECT_EQ(host_.reg(kRah0), 0x80000100u) << "RA0 keeps the station address";
}

TEST_F(E1000eTest, InfoReportsMacAndLimits) {
  open();
  ufab_dev_info info{};
  ASSERT_EQ(drv_->info(dev_, &info), 0);
  const uint8_t mac[6] = {0x52, 0x54, 0, 0, 0, 1};
  EXPECT_EQ(std::memcmp(info.mac, mac, 6), 0);
  EXPECT_EQ(info.max_rx_queues, 2);
  EXPECT_EQ(info.max_tx_queues, 2);
  EXPECT_EQ(info.min_ring_size, 64);
  EXPECT_EQ(info.max_ring_size, 4096);
  EXPECT_EQ(info.mtu, 1500u);
  EXPECT_TRUE(info.caps & UFAB_DEV_CAP_RX_IRQ);
  EXPECT_STREQ(info.model, "82574L (e1000e)");
}

// mtu= (docs/drivers/e1000e.md "Jumbo frames"): LPE and FLXBUF in RCTL,
// receive buffers that hold FLXBUF KiB, TX frames up to the MTU + 22, a
// jumbo buffer crossing pages split into one descriptor per page piece.
TEST_F(E1000eTest, MtuParameterEnablesJumboFrames) {
  host_.params["mtu"] = "9000";
  open();
  ufab_dev_info info{};
  ASSERT_EQ(drv_->info(dev_, &info), 0);
  EXPECT_EQ(info.mtu, 9000u);
  EXPECT_EQ(info.max_mtu, 9000u);
  // 2 KiB buffers cannot take 9 KiB receive buffers.
  ufab_queue_conf r{64, rx_pool_.handle()};
  EXPECT_EQ(drv_->rx_queue_setup(dev_, 0, &r), -EINVAL);
  EXPECT_NE(host_.error.find("9216 bytes the 82574L may write per buffer at MTU 9000"), std::string::npos)
      << host_.error;
  FakePool big(100, 128 + 9216, 128);
  FakePool big_tx(10, 128 + 9216, 128);
  r.pool = big.handle();
  ASSERT_EQ(drv_->rx_queue_setup(dev_, 0, &r), 0) << host_.error;
  ufab_queue_conf t{64, nullptr};
  ASSERT_EQ(drv_->tx_queue_setup(dev_, 0, &t), 0) << host_.error;
  ASSERT_EQ(drv_->start(dev_), 0) << host_.error;
  EXPECT_EQ(host_.reg(kRctl), kRctlEn | kRctlBam | kRctlSecrc | kRctlLpe | 9u << kRctlFlxbufShift);

  // A 9014-byte frame 128 bytes into a page-aligned buffer: 3968 + 4096 +
  // 950 bytes, three descriptors, the command on the last only.
  ufab_buf* b = nullptr;
  ASSERT_EQ(kOps.buf_alloc(host_.handle(), big_tx.handle(), &b, 1), 1);
  for (uint32_t i = 0; i < 9014; ++i) b->base[b->offset + i] = static_cast<uint8_t>(i * 7);
  b->len = 9014;
  ASSERT_EQ(drv_->tx_burst(dev_, 0, &b, 1), 1) << host_.error;
  EXPECT_EQ(host_.reg(kTdt), 3u);
  TxDesc* d = tx_ring();
  EXPECT_EQ(d[0].addr, b->base_iova + 128);
  EXPECT_EQ(d[0].lower, 3968u);
  EXPECT_EQ(d[1].addr, b->base_iova + 4096);
  EXPECT_EQ(d[1].lower, 4096u);
  EXPECT_EQ(d[2].addr, b->base_iova + 8192);
  EXPECT_EQ(d[2].lower, tx_lower(950));
  auto sent = device_transmit();
  ASSERT_EQ(sent.size(), 1u);
  ASSERT_EQ(sent[0].size(), 9014u);
  for (uint32_t i = 0; i < 9014; ++i) ASSERT_EQ(sent[0][i], static_cast<uint8_t>(i * 7)) << i;
  ASSERT_EQ(drv_->tx_burst(dev_, 0, &b, 0), 0);  // reclaims
  EXPECT_EQ(big_tx.out.size(), 0u);
  // MTU + 22 is the limit.
  ASSERT_EQ(kOps.buf_alloc(host_.handle(), big_tx.handle(), &b, 1), 1);
  b->len = 9023;
  EXPECT_EQ(drv_->tx_burst(dev_, 0, &b, 1), -EINVAL);
  EXPECT_NE(host_.error.find("14..9022"), std::string::npos) << host_.error;
  kOps.buf_free(host_.handle(), &b, 1);
  // A received jumbo frame comes up whole.
  std::vector<uint8_t> frame(9000, 0x5A);
  device_receive(frame);
  ufab_buf* got[4];
  ASSERT_EQ(drv_->rx_burst(dev_, 0, got, 4), 1);
  EXPECT_EQ(got[0]->len, 9000u);
  kOps.buf_free(host_.handle(), got, 1);
  drv_->close(dev_);
  dev_ = nullptr;
}

TEST_F(E1000eTest, MtuParameterOutOfRangeFailsOpen) {
  for (const char* bad : {"9001", "1499", "0", "9000x", "-9000", ""}) {
    host_.params["mtu"] = bad;
    host_.error.clear();
    EXPECT_EQ(drv_->open(&kOps, host_.handle(), &dev_), -EINVAL) << "mtu=" << bad;
    EXPECT_NE(host_.error.find("parameter mtu="), std::string::npos) << host_.error;
    EXPECT_NE(host_.error.find("1500"), std::string::npos) << host_.error;
  }
  dev_ = nullptr;
  host_.params["mtu"] = "1500";
  setup();
  EXPECT_EQ(host_.reg(kRctl), kRctlEn | kRctlBam | kRctlSecrc) << "1500: long packets stay off";
}

TEST_F(E1000eTest, NoValidMacFailsOpenWithAnExplanation) {
  host_.set(kRah0, 0);  // AV clear
  // The fake EERD reads back what was written: START set, DONE clear...
  // so emulate a device whose EERD answers at once with DONE and data.
  host_.set(kEerd, kEerdDone | (0x5452u << kEerdDataShift));
  // With a memory BAR the driver's write of the request replaces DONE, so
  // the read times out and open fails with an explanation.
  EXPECT_EQ(drv_->open(&kOps, host_.handle(), &dev_), -EIO);
  EXPECT_NE(host_.error.find("EERD"), std::string::npos) << host_.error;
  EXPECT_TRUE(host_.dma.empty());
}

TEST_F(E1000eTest, LinkFromStatus) {
  open();
  ufab_link l{};
  ASSERT_EQ(drv_->link(dev_, &l), 0);
  EXPECT_EQ(l.up, 1u);
  EXPECT_EQ(l.speed_mbps, 1000u);
  EXPECT_EQ(l.full_duplex, 1u);
  host_.set(kStatus, 0);
  ASSERT_EQ(drv_->link(dev_, &l), 0);
  EXPECT_EQ(l.up, 0u);
}

TEST_F(E1000eTest, HostFailureKeepsTheHostsExplanation) {
  host_.fail_map = EACCES;
  EXPECT_EQ(drv_->open(&kOps, host_.handle(), &dev_), -EACCES);
  EXPECT_EQ(host_.error, "map failed for a reason the host explains");
  EXPECT_EQ(dev_, nullptr);
}

TEST_F(E1000eTest, QueueSetupRejectsBadSizesAndQueues) {
  open();
  for (uint32_t n : {0u, 32u, 100u, 8192u}) {
    ufab_queue_conf c{n, rx_pool_.handle()};
    EXPECT_EQ(drv_->rx_queue_setup(dev_, 0, &c), -EINVAL) << n;
    EXPECT_NE(host_.error.find("power of two"), std::string::npos) << host_.error;
    EXPECT_EQ(drv_->tx_queue_setup(dev_, 0, &c), -EINVAL) << n;
  }
  ufab_queue_conf c{64, rx_pool_.handle()};
  EXPECT_EQ(drv_->rx_queue_setup(dev_, 2, &c), -EINVAL);
  EXPECT_NE(host_.error.find("RX queues 0 and 1"), std::string::npos) << host_.error;
  EXPECT_EQ(drv_->tx_queue_setup(dev_, 2, &c), -EINVAL);
  EXPECT_NE(host_.error.find("TX queues 0 and 1"), std::string::npos) << host_.error;
  ufab_queue_conf nopool{64, nullptr};
  EXPECT_EQ(drv_->rx_queue_setup(dev_, 0, &nopool), -EINVAL);
}

TEST_F(E1000eTest, RxBuffersMustHoldAFullFrame) {
  open();
  FakePool small(100, 1536, 128);  // 1408 bytes after headroom < 1522
  ufab_queue_conf c{64, small.handle()};
  EXPECT_EQ(drv_->rx_queue_setup(dev_, 0, &c), -EINVAL);
  EXPECT_NE(host_.error.find("1522"), std::string::npos) << host_.error;
  EXPECT_EQ(small.available(), 100u);
}

TEST_F(E1000eTest, StartNeedsAQueue) {
  open();
  EXPECT_EQ(drv_->start(dev_), -EINVAL);
  EXPECT_NE(host_.error.find("queue"), std::string::npos);
}

TEST_F(E1000eTest, StartProgramsRingsAndControl) {
  setup(128, 256);
  EXPECT_NE(rx_ring(), nullptr);
  EXPECT_EQ(reinterpret_cast<uint64_t>(rx_ring()) % 16, 0u);
  EXPECT_EQ(host_.reg(kRdlen0), 128u * 16);
  EXPECT_EQ(host_.reg(kRdh0), 0u);
  EXPECT_EQ(host_.reg(kRdt0), 127u);  // all but one slot posted
  EXPECT_EQ(host_.reg(kRctl), kRctlEn | kRctlBam | kRctlSecrc);
  EXPECT_EQ(host_.reg(kRfctl) & kRfctlExten, 0u);
  EXPECT_EQ(host_.reg(kTdlen), 256u * 16);
  EXPECT_EQ(host_.reg(kTdh), 0u);
  EXPECT_EQ(host_.reg(kTdt), 0u);
  EXPECT_EQ(host_.reg(kTctl), kTctlEn | kTctlPsp | kTctlCt | kTctlCold | kTctlRtlc);
  EXPECT_TRUE(host_.reg(kTarc0) & kTarcEnable);
  EXPECT_EQ(host_.reg(kTarc0) & 0x3, 0x3u) << "TARC0 is read-modify-written";
  EXPECT_EQ(rx_pool_.available(), 300u - 127);
  // Posted descriptors point at buffer + headroom.
  RxDesc* d = rx_ring();
  std::set<uint64_t> starts;
  for (auto* m : rx_pool_.memory) starts.insert(reinterpret_cast<uint64_t>(m) + 128);
  for (uint32_t i = 0; i < 127; ++i) {
    EXPECT_EQ(starts.count(d[i].addr), 1u) << i;
    EXPECT_EQ(d[i].status, 0);
  }
}

TEST_F(E1000eTest, PromiscuousSetsUpeMpe) {
  setup();
  ASSERT_EQ(drv_->set_promiscuous(dev_, 1), 0);
  EXPECT_EQ(host_.reg(kRctl), kRctlEn | kRctlBam | kRctlSecrc | kRctlUpe | kRctlMpe);
  ASSERT_EQ(drv_->set_promiscuous(dev_, 0), 0);
  EXPECT_EQ(host_.reg(kRctl), kRctlEn | kRctlBam | kRctlSecrc);
}

TEST_F(E1000eTest, TxBurstOneDescriptorPerFrameOneDoorbell) {
  setup();
  ufab_buf* bufs[5];
  for (int i = 0; i < 5; ++i) bufs[i] = tx_frame(60 + 100 * i, static_cast<uint8_t>(i));
  ASSERT_EQ(drv_->tx_burst(dev_, 0, bufs, 5), 5) << host_.error;
  EXPECT_EQ(host_.reg(kTdt), 5u);
  TxDesc* d = tx_ring();
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(d[i].addr, bufs[i]->base_iova + bufs[i]->offset);
    EXPECT_EQ(d[i].lower & 0xffff, 60u + 100 * i);
    EXPECT_EQ(d[i].upper, 0u);
  }
  auto sent = device_transmit();
  ASSERT_EQ(sent.size(), 5u);
  EXPECT_EQ(sent[4].size(), 460u);
  EXPECT_EQ(sent[4][0], 4);
  // Completed buffers go back at the next burst, in one call.
  EXPECT_EQ(tx_pool_.out.size(), 5u);
  uint32_t frees = host_.buf_free_calls;
  ASSERT_EQ(drv_->tx_burst(dev_, 0, bufs, 0), 0);
  EXPECT_EQ(tx_pool_.out.size(), 0u);
  EXPECT_EQ(host_.buf_free_calls, frees + 1);
}

TEST_F(E1000eTest, TxRingFullTakesWhatFits) {
  setup(64, 64);
  std::vector<ufab_buf*> bufs;
  for (int i = 0; i < 70; ++i) bufs.push_back(tx_frame(60, 0));
  EXPECT_EQ(drv_->tx_burst(dev_, 0, bufs.data(), 70), 63);
  EXPECT_EQ(drv_->tx_burst(dev_, 0, bufs.data() + 63, 7), 0);  // full, nothing completed
  device_transmit();
  EXPECT_EQ(drv_->tx_burst(dev_, 0, bufs.data() + 63, 7), 7);  // reclaimed, wraps
  EXPECT_EQ(host_.reg(kTdt), 6u);
  device_transmit();
}

TEST_F(E1000eTest, TxRejectsBadFrames) {
  setup();
  ufab_buf* b = tx_frame(60, 0);
  b->len = 2000;
  EXPECT_EQ(drv_->tx_burst(dev_, 0, &b, 1), -EINVAL);
  EXPECT_NE(host_.error.find("2000"), std::string::npos) << host_.error;
  ufab_buf* two[2] = {tx_frame(60, 0), b};
  EXPECT_EQ(drv_->tx_burst(dev_, 0, two, 2), 1);  // takes the good one, stops
  kOps.buf_free(host_.handle(), &b, 1);
  device_transmit();
}

TEST_F(E1000eTest, TxWhileStoppedFails) {
  setup();
  ASSERT_EQ(drv_->stop(dev_), 0);
  ufab_buf* b = tx_frame(60, 0);
  EXPECT_EQ(drv_->tx_burst(dev_, 0, &b, 1), -ENETDOWN);
  kOps.buf_free(host_.handle(), &b, 1);
}

TEST_F(E1000eTest, RxBurstHandsOutFramesAndRefills) {
  setup(64, 64);
  for (int i = 0; i < 3; ++i) device_receive(std::vector<uint8_t>(60 + i, static_cast<uint8_t>(0xa0 + i)));
  uint32_t allocs = host_.buf_alloc_calls;
  ufab_buf* got[8];
  ASSERT_EQ(drv_->rx_burst(dev_, 0, got, 8), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(got[i]->len, 60u + i);
    EXPECT_EQ(got[i]->offset, 128u) << "headroom unchanged";
    EXPECT_EQ(got[i]->base[got[i]->offset], 0xa0 + i);
    EXPECT_EQ(got[i]->flags, 0u);
  }
  EXPECT_EQ(host_.buf_alloc_calls, allocs + 1) << "one allocation per burst";
  EXPECT_EQ(host_.reg(kRdt0), 2u) << "3 slots refilled: RDT 63 -> 2";
  EXPECT_EQ(drv_->rx_burst(dev_, 0, got + 3, 8), 0);
  kOps.buf_free(host_.handle(), got, 3);
}

TEST_F(E1000eTest, RxBurstStopsAtN) {
  setup(64, 64);
  for (int i = 0; i < 5; ++i) device_receive(std::vector<uint8_t>(100, 1));
  ufab_buf* got[5];
  ASSERT_EQ(drv_->rx_burst(dev_, 0, got, 2), 2);
  ASSERT_EQ(drv_->rx_burst(dev_, 0, got + 2, 8), 3);
  kOps.buf_free(host_.handle(), got, 5);
}

TEST_F(E1000eTest, RxErrorsAreDroppedChecksumIsFlagged) {
  setup(64, 64);
  device_receive(std::vector<uint8_t>(80, 1), 0x01);  // CRC error
  device_receive(std::vector<uint8_t>(80, 2), 0x40);  // IP checksum error
  ufab_buf* got[4];
  ASSERT_EQ(drv_->rx_burst(dev_, 0, got, 4), 1);
  EXPECT_EQ(got[0]->base[got[0]->offset], 2);
  EXPECT_EQ(got[0]->flags, UFAB_BUF_F_RX_CSUM_BAD);
  ufab_stats st{};
  ASSERT_EQ(drv_->stats(dev_, &st), 0);
  EXPECT_EQ(st.rx_errors, 1u);
  kOps.buf_free(host_.handle(), got, 1);
}

TEST_F(E1000eTest, MultiDescriptorFrameIsDroppedWhole) {
  setup(64, 64);
  device_receive(std::vector<uint8_t>(100, 1), 0, kRxStaDd);              // first part, no EOP
  device_receive(std::vector<uint8_t>(100, 2), 0, kRxStaDd | kRxStaEop);  // last part
  device_receive(std::vector<uint8_t>(100, 3));
  ufab_buf* got[4];
  ASSERT_EQ(drv_->rx_burst(dev_, 0, got, 4), 1);
  EXPECT_EQ(got[0]->base[got[0]->offset], 3);
  kOps.buf_free(host_.handle(), got, 1);
}

TEST_F(E1000eTest, EmptyPoolLeavesSlotsUnfilledAndCountsThem) {
  open();
  FakePool pool(70, 2048, 0);
  ufab_queue_conf c{64, pool.handle()};
  ASSERT_EQ(drv_->rx_queue_setup(dev_, 0, &c), 0);
  ASSERT_EQ(drv_->start(dev_), 0);
  EXPECT_EQ(pool.available(), 7u);
  std::vector<ufab_buf*> held;
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 5; ++i) device_receive(std::vector<uint8_t>(64, 1));
    ufab_buf* got[8];
    int n = drv_->rx_burst(dev_, 0, got, 8);
    ASSERT_EQ(n, 5);
    held.insert(held.end(), got, got + n);
  }
  // 15 taken, 7 spare: 8 slots could not be refilled.
  ufab_stats st{};
  ASSERT_EQ(drv_->stats(dev_, &st), 0);
  EXPECT_EQ(st.rx_dropped, 8u);
  EXPECT_EQ(pool.available(), 0u);
  // Buffers come back: the next burst refills the ring.
  kOps.buf_free(host_.handle(), held.data(), static_cast<uint32_t>(held.size()));
  ufab_buf* none[1];
  EXPECT_EQ(drv_->rx_burst(dev_, 0, none, 1), 0);
  EXPECT_EQ(host_.reg(kRdt0), (host_.reg(kRdh0) + 63) % 64);
  ASSERT_EQ(drv_->stats(dev_, &st), 0);
  EXPECT_EQ(st.rx_dropped, 8u) << "each empty slot counted once";
  drv_->close(dev_);
  dev_ = nullptr;
  EXPECT_EQ(pool.available(), 70u);
}

TEST_F(E1000eTest, StatsAccumulateClearOnReadCounters) {
  setup();
  host_.set(kGprc, 3);
  host_.set(kGorcl, 3 * 104);
  host_.set(kGptc, 2);
  host_.set(kGotcl, 2 * 64);
  ufab_stats st{};
  ASSERT_EQ(drv_->stats(dev_, &st), 0);
  EXPECT_EQ(st.rx_packets, 3u);
  EXPECT_EQ(st.rx_bytes, 300u);
  EXPECT_EQ(st.tx_packets, 2u);
  EXPECT_EQ(st.tx_bytes, 120u);
  // The device cleared them on read; new counts add up.
  host_.set(kGprc, 1);
  host_.set(kGorcl, 0);
  host_.set(kGorch, 1);  // 2^32 octets
  host_.set(kGptc, 0);
  host_.set(kGotcl, 0);
  ASSERT_EQ(drv_->stats(dev_, &st), 0);
  EXPECT_EQ(st.rx_packets, 4u);
  EXPECT_EQ(st.rx_bytes, 3u * 104 + (1ull << 32) - 16);
  EXPECT_EQ(st.tx_packets, 2u);
}

TEST_F(E1000eTest, OpenStartsCountsAtZero) {
  host_.set(kGprc, 99);  // left by a previous user (QEMU 7.2 keeps them)
  open();
  // The real register clears on read; the memory BAR does not, so reset it
  // here as the device would have.
  host_.set(kGprc, 0);
  ufab_stats st{};
  ASSERT_EQ(drv_->stats(dev_, &st), 0);
  EXPECT_EQ(st.rx_packets, 0u);
}

TEST_F(E1000eTest, RxIrqRoutesRxq0ToVector0AndRearms) {
  setup();
  int fd = -1;
  ASSERT_EQ(drv_->rx_irq(dev_, 0, 1, &fd), 0) << host_.error;
  EXPECT_EQ(fd, host_.irq_fd);
  EXPECT_GE(fd, 0);
  // RXQ0 -> vector 0, RXQ1 -> vector 1, both valid.
  EXPECT_EQ(host_.reg(kIvar), kIvarValid | (kIvarValid | 1u) << kIvarRxq1Shift);
  EXPECT_EQ(host_.reg(kEiac), kIntRxq0 | kIntRxq1);
  EXPECT_EQ(host_.reg(kIam), 0u);
  EXPECT_TRUE(host_.reg(kCtrlExt) & kCtrlExtPbaSupport);
  EXPECT_FALSE(host_.reg(kCtrlExt) & (kCtrlExtIame | kCtrlExtEiame));
  EXPECT_EQ(host_.reg(kIms), kIntRxq0);

  // Nothing fired yet: an empty poll leaves IMS alone and counts nothing.
  ufab_buf* got[4];
  host_.set(kIcr, 0);
  EXPECT_EQ(drv_->rx_burst(dev_, 0, got, 4), 0);
  EXPECT_EQ(host_.reg(kIcr), 0u) << "no re-arm while still armed";

  // The device raises the interrupt and auto-masks RXQ0 (EIAC).
  device_receive(std::vector<uint8_t>(64, 7));
  host_.set(kIms, 0);
  ASSERT_EQ(drv_->rx_burst(dev_, 0, got, 4), 1);
  EXPECT_EQ(host_.reg(kIms), 0u) << "frames found: the caller polls again before sleeping";
  EXPECT_EQ(drv_->rx_burst(dev_, 0, got + 1, 4), 0);
  EXPECT_EQ(host_.reg(kIms), kIntRxq0) << "empty: re-armed";
  EXPECT_EQ(host_.reg(kIcr), kIntRxq0) << "stale cause cleared (write-1)";
  ufab_stats st{};
  ASSERT_EQ(drv_->stats(dev_, &st), 0);
  EXPECT_EQ(st.irqs, 1u);

  // Disable: IMC, back to polling; a second enable reuses the vector.
  host_.set(kImc, 0);
  ASSERT_EQ(drv_->rx_irq(dev_, 0, 0, &fd), 0);
  EXPECT_EQ(host_.reg(kImc), kIntRxq0);
  ASSERT_EQ(drv_->rx_irq(dev_, 0, 1, &fd), 0);
  EXPECT_EQ(host_.irq_enables, 1u);
  kOps.buf_free(host_.handle(), got, 1);
  drv_->close(dev_);
  dev_ = nullptr;
  EXPECT_EQ(host_.irq_disables, 1u);
}

TEST_F(E1000eTest, ArmingWithFramesWaitingRaisesTheInterrupt) {
  setup();
  device_receive(std::vector<uint8_t>(64, 7));
  int fd = -1;
  host_.set(kIcs, 0);
  ASSERT_EQ(drv_->rx_irq(dev_, 0, 1, &fd), 0);
  EXPECT_EQ(host_.reg(kIcs), kIntRxq0);
  ufab_buf* got[2];
  ASSERT_EQ(drv_->rx_burst(dev_, 0, got, 2), 1);
  kOps.buf_free(host_.handle(), got, 1);
}

TEST_F(E1000eTest, StopStartKeepsRxBuffersAndDropsUnharvestedFrames) {
  setup(64, 64);
  device_receive(std::vector<uint8_t>(64, 1));
  ASSERT_EQ(drv_->stop(dev_), 0);
  EXPECT_EQ(host_.reg(kRctl), 0u);
  EXPECT_EQ(host_.reg(kTctl) & kTctlEn, 0u);
  ASSERT_EQ(drv_->start(dev_), 0);
  ufab_buf* got[2];
  EXPECT_EQ(drv_->rx_burst(dev_, 0, got, 2), 0);
  EXPECT_EQ(host_.reg(kRdh0), 0u);
  EXPECT_EQ(host_.reg(kRdt0), 63u);
}

TEST_F(E1000eTest, SetupWhileStartedIsRefused) {
  setup();
  ufab_queue_conf c{64, rx_pool_.handle()};
  EXPECT_EQ(drv_->rx_queue_setup(dev_, 0, &c), -EBUSY);
  EXPECT_NE(host_.error.find("stop()"), std::string::npos);
}

TEST_F(E1000eTest, ReconfigureReturnsOldBuffers) {
  setup(64, 64);
  ASSERT_EQ(drv_->stop(dev_), 0);
  ufab_queue_conf c{256, rx_pool_.handle()};
  ASSERT_EQ(drv_->rx_queue_setup(dev_, 0, &c), 0);
  EXPECT_EQ(rx_pool_.available(), 300u - 255);
  EXPECT_EQ(host_.dma.size(), 2u);
}

TEST_F(E1000eTest, CloseQuiescesAndFreesEverything) {
  setup();
  ufab_buf* b[3] = {tx_frame(60, 0), tx_frame(60, 0), tx_frame(60, 0)};
  ASSERT_EQ(drv_->tx_burst(dev_, 0, b, 3), 3);  // never completed
  drv_->close(dev_);
  dev_ = nullptr;
  EXPECT_EQ(host_.reg(kRctl), 0u);
  EXPECT_EQ(host_.reg(kImc), ~0u);
  EXPECT_TRUE(host_.reg(kCtrl) & kCtrlGioMasterDisable);
  EXPECT_EQ(rx_pool_.available(), 300u);
  EXPECT_EQ(tx_pool_.available(), 300u);
}

// ------------------------------------------------------------- two queues

TEST_F(E1000eTest, QueueOneHasItsOwnRingsAndRegisters) {
  open();
  for (uint16_t q = 0; q < 2; ++q) {
    ufab_queue_conf r{64, rx_pool_.handle()};
    ASSERT_EQ(drv_->rx_queue_setup(dev_, q, &r), 0) << host_.error;
    ufab_queue_conf t{128, nullptr};
    ASSERT_EQ(drv_->tx_queue_setup(dev_, q, &t), 0) << host_.error;
  }
  host_.set(kTarc1, 0x3);  // bit 10 clear: the driver must set it
  ASSERT_EQ(drv_->start(dev_), 0) << host_.error;
  EXPECT_NE(tx_ring(0), tx_ring(1));
  // RX queue 1 is not given to the device (no RSS, and QEMU would take
  // frames while ring 0 is full if an idle ring 1 had room): RDLEN1 = 0.
  EXPECT_EQ(host_.reg(queue_reg(kRdlen0, 1)), 0u);
  EXPECT_EQ(host_.reg(kRdbal1), 0u);
  EXPECT_EQ(host_.reg(kRdt1), 0u);
  EXPECT_EQ(host_.reg(kRdlen0), 64u * 16);
  EXPECT_EQ(host_.reg(queue_reg(kTdlen, 1)), 128u * 16);
  EXPECT_TRUE(host_.reg(kTarc1) & kTarcEnable);
  EXPECT_EQ(host_.reg(kTarc1) & 0x3, 0x3u) << "TARC1 is read-modify-written";
  EXPECT_EQ(host_.reg(kMrqc), 0u) << "no RSS: every frame lands in queue 0";
  EXPECT_EQ(rx_pool_.available(), 300u - 2 * 63) << "both RX rings hold their buffers";

  // A burst on TX queue 1 goes to ring 1 and rings TDT1 only.
  ufab_buf* b[3] = {tx_frame(60, 0xa1), tx_frame(61, 0xa2), tx_frame(62, 0xa3)};
  ASSERT_EQ(drv_->tx_burst(dev_, 1, b, 3), 3) << host_.error;
  EXPECT_EQ(host_.reg(queue_reg(kTdt, 1)), 3u);
  EXPECT_EQ(host_.reg(kTdt), 0u) << "TX queue 0 untouched";
  auto sent = device_transmit(1);
  ASSERT_EQ(sent.size(), 3u);
  EXPECT_EQ(sent[1].size(), 61u);
  EXPECT_EQ(sent[2][0], 0xa3);
  EXPECT_TRUE(device_transmit(0).empty());
  // Queue 0 still works on its own ring.
  ufab_buf* c = tx_frame(70, 0xb0);
  ASSERT_EQ(drv_->tx_burst(dev_, 0, &c, 1), 1);
  sent = device_transmit(0);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].size(), 70u);
  // Completed buffers come back on each queue's next burst.
  ufab_buf* d = tx_frame(60, 0);
  ASSERT_EQ(drv_->tx_burst(dev_, 1, &d, 1), 1);
  EXPECT_EQ(tx_pool_.out.size(), 2u) << "queue 1 reclaimed its 3; queue 0's 1 and queue 1's new 1 are out";
  device_transmit(1);

  // RX queue 1 is set up and polled, and stays empty.
  ufab_buf* got[4];
  EXPECT_EQ(drv_->rx_burst(dev_, 1, got, 4), 0);
  device_receive(std::vector<uint8_t>(80, 0x11));
  EXPECT_EQ(drv_->rx_burst(dev_, 1, got, 4), 0);
  ASSERT_EQ(drv_->rx_burst(dev_, 0, got, 4), 1);
  EXPECT_EQ(got[0]->len, 80u);
  kOps.buf_free(host_.handle(), got, 1);
  ASSERT_EQ(drv_->stop(dev_), 0);
  EXPECT_EQ(tx_pool_.out.size(), 0u) << "stop() returns what both TX queues held";
}

TEST_F(E1000eTest, QueueTwoIsAClearError) {
  setup();
  ufab_buf* got[2];
  EXPECT_EQ(drv_->rx_burst(dev_, 2, got, 2), -EINVAL);
  EXPECT_NE(host_.error.find("RX queue 2 does not exist"), std::string::npos) << host_.error;
  ufab_buf* b = tx_frame(60, 0);
  EXPECT_EQ(drv_->tx_burst(dev_, 2, &b, 1), -EINVAL);
  EXPECT_NE(host_.error.find("TX queue 2 does not exist"), std::string::npos) << host_.error;
  kOps.buf_free(host_.handle(), &b, 1);
  int fd = 0;
  EXPECT_EQ(drv_->rx_irq(dev_, 2, 1, &fd), -EINVAL);
  EXPECT_EQ(drv_->rx_irq_arm(dev_, 2), -EINVAL);
  // Queue 1 exists but was not set up.
  EXPECT_EQ(drv_->rx_burst(dev_, 1, got, 2), -EINVAL);
  EXPECT_NE(host_.error.find("before rx_queue_setup"), std::string::npos) << host_.error;
  b = tx_frame(60, 0);
  EXPECT_EQ(drv_->tx_burst(dev_, 1, &b, 1), -EINVAL);
  kOps.buf_free(host_.handle(), &b, 1);
}

TEST_F(E1000eTest, RxSteerByQpnIsNotSupportedAndSaysWhy) {
  open();
  ASSERT_NE(drv_->rx_steer, nullptr);
  EXPECT_EQ(drv_->rx_steer(dev_, UFAB_STEER_ROCE_QPN, 2), -EOPNOTSUPP);
  EXPECT_NE(host_.error.find("UDP"), std::string::npos) << host_.error;
  EXPECT_NE(host_.error.find("software"), std::string::npos) << host_.error;
  EXPECT_EQ(drv_->rx_steer(dev_, UFAB_STEER_NONE, 1), 0);
  EXPECT_EQ(drv_->rx_steer(dev_, UFAB_STEER_NONE, 2), 0);
  EXPECT_EQ(host_.reg(kMrqc), 0u);
  EXPECT_EQ(drv_->rx_steer(dev_, UFAB_STEER_NONE, 3), -EINVAL);
  EXPECT_EQ(drv_->rx_steer(dev_, 77, 2), -EOPNOTSUPP);
  ufab_queue_conf r{64, rx_pool_.handle()};
  ASSERT_EQ(drv_->rx_queue_setup(dev_, 0, &r), 0);
  ASSERT_EQ(drv_->start(dev_), 0);
  EXPECT_EQ(drv_->rx_steer(dev_, UFAB_STEER_NONE, 1), -EBUSY);
}

TEST_F(E1000eTest, EachRxQueueHasItsOwnVector) {
  open();
  for (uint16_t q = 0; q < 2; ++q) {
    ufab_queue_conf r{64, rx_pool_.handle()};
    ASSERT_EQ(drv_->rx_queue_setup(dev_, q, &r), 0) << host_.error;
  }
  ASSERT_EQ(drv_->start(dev_), 0);
  int fd1 = -1, fd0 = -1;
  host_.set(kIms, 0);
  ASSERT_EQ(drv_->rx_irq(dev_, 1, 1, &fd1), 0) << host_.error;
  EXPECT_EQ(fd1, host_.irq_fd1);
  EXPECT_EQ(host_.reg(kIms), kIntRxq1) << "only queue 1's cause armed";
  ASSERT_EQ(drv_->rx_irq(dev_, 0, 1, &fd0), 0) << host_.error;
  EXPECT_EQ(fd0, host_.irq_fd);
  EXPECT_NE(fd0, fd1);
  EXPECT_EQ(host_.irq_enables, 1u) << "both vectors in one call";

  // Queue 1's vector fired (EIAC auto-masked RXQ1): its empty poll re-arms
  // RXQ1 only; queue 0's cause is not touched.
  host_.set(kIms, kIntRxq0);
  host_.set(kIcr, 0);
  ufab_buf* got[2];
  EXPECT_EQ(drv_->rx_burst(dev_, 1, got, 2), 0);
  // (IMS and ICR are write-1-to-set/clear on the device; the fake BAR keeps
  // the last value written, which shows exactly which bits were written.)
  EXPECT_EQ(host_.reg(kIms), kIntRxq1);
  EXPECT_EQ(host_.reg(kIcr), kIntRxq1);
  host_.set(kIms, kIntRxq0 | kIntRxq1);
  EXPECT_EQ(drv_->rx_burst(dev_, 0, got, 2), 0);
  EXPECT_EQ(host_.reg(kIcr), kIntRxq1) << "queue 0 still armed: nothing written";
  ufab_stats st{};
  ASSERT_EQ(drv_->stats(dev_, &st), 0);
  EXPECT_EQ(st.irqs, 1u);

  // Disabling queue 1 masks RXQ1 only.
  host_.set(kImc, 0);
  ASSERT_EQ(drv_->rx_irq(dev_, 1, 0, &fd1), 0);
  EXPECT_EQ(host_.reg(kImc), kIntRxq1);
  EXPECT_EQ(fd1, -1);
}


// ------------------------------------------------------- gather transmit

// Counts the CPU's stores to one 32-bit register of the fake BAR: its page
// is made read-only, each store into the page faults (SIGSEGV), the handler
// notes the address, opens the page and single-steps the store (x86
// EFLAGS.TF); the SIGTRAP after it closes the page again. Reads are free.
class StoreCounter {
 public:
  explicit StoreCounter(uint8_t* reg) {
    target_ = reg;
    page_ = reinterpret_cast<uint8_t*>(reinterpret_cast<uintptr_t>(reg) & ~uintptr_t{4095});
    count_ = 0;
    struct sigaction sa {};
    sa.sa_flags = SA_SIGINFO;
    sa.sa_sigaction = on_segv;
    sigaction(SIGSEGV, &sa, &old_segv_);
    sa.sa_sigaction = on_trap;
    sigaction(SIGTRAP, &sa, &old_trap_);
    mprotect(page_, 4096, PROT_READ);
  }
  ~StoreCounter() {
    mprotect(page_, 4096, PROT_READ | PROT_WRITE);
    sigaction(SIGSEGV, &old_segv_, nullptr);
    sigaction(SIGTRAP, &old_trap_, nullptr);
  }
  int stores() const { return count_; }

 private:
  static void on_segv(int, siginfo_t* si, void* ctx) {
    auto* addr = static_cast<uint8_t*>(si->si_addr);
    if (addr < page_ || addr >= page_ + 4096) std::abort();  // a real crash, not ours
    if (addr == target_) count_ = count_ + 1;
    mprotect(page_, 4096, PROT_READ | PROT_WRITE);
    static_cast<ucontext_t*>(ctx)->uc_mcontext.gregs[REG_EFL] |= 0x100;  // trap after the store
  }
  static void on_trap(int, siginfo_t*, void* ctx) {
    static_cast<ucontext_t*>(ctx)->uc_mcontext.gregs[REG_EFL] &= ~0x100;
    mprotect(page_, 4096, PROT_READ);
  }
  static inline uint8_t* target_ = nullptr;
  static inline uint8_t* page_ = nullptr;
  static inline volatile int count_ = 0;
  struct sigaction old_segv_ {}, old_trap_ {};
};

class E1000eGatherTest : public E1000eTest {
 protected:
  // Payload memory outside any frame buffer (a registered region, say);
  // the fake host's IOVA is the address itself.
  void SetUp() override {
    E1000eTest::SetUp();
    payload_ = static_cast<uint8_t*>(std::aligned_alloc(4096, kPayload));
    for (uint32_t i = 0; i < kPayload; ++i) payload_[i] = static_cast<uint8_t>(i * 7 + 3);
  }
  void TearDown() override {
    E1000eTest::TearDown();
    std::free(payload_);
  }
  // A frame of `nsegs` segments: a header of `head` bytes in its own
  // buffer, then nsegs - 1 pieces of the payload at odd offsets and lengths.
  ufab_tx_frame frame(uint32_t nsegs, uint32_t head = 31, uint8_t fill = 0x5a) {
    ufab_tx_frame f{};
    f.buf = tx_frame(head, fill);
    f.nsegs = nsegs;
    f.segs[0] = seg(f.buf->base + f.buf->offset, head);
    for (uint32_t s = 1; s < nsegs; ++s) f.segs[s] = seg(payload_ + 101 * s + nsegs, 17 + 40 * s);
    for (uint32_t s = 0; s < nsegs; ++s) f.len += f.segs[s].len;
    return f;
  }
  static ufab_tx_seg seg(const uint8_t* p, uint32_t len) {
    return ufab_tx_seg{p, reinterpret_cast<uint64_t>(p), len, 0};
  }
  static std::vector<uint8_t> bytes_of(const ufab_tx_frame& f) {
    std::vector<uint8_t> v;
    for (uint32_t s = 0; s < f.nsegs; ++s) v.insert(v.end(), f.segs[s].va, f.segs[s].va + f.segs[s].len);
    return v;
  }
  uint32_t tdt() const { return host_.reg(kTdt); }

  static constexpr uint32_t kPayload = 8192;
  uint8_t* payload_ = nullptr;
};

TEST_F(E1000eGatherTest, OneDescriptorPerSegmentEopOnlyOnTheLastOneTailWrite) {
  setup();
  ufab_tx_frame f[3] = {frame(1, 60, 0xa1), frame(3, 20, 0xa2), frame(4, 14, 0xa3)};
  int taken;
  int stores;
  {
    StoreCounter tail(FakeHost::bar + kTdt);
    taken = drv_->tx_burst_gather(dev_, 0, f, 3);
    stores = tail.stores();
  }
  ASSERT_EQ(taken, 3) << host_.error;
  EXPECT_EQ(stores, 1) << "one TDT write for the whole call";
  EXPECT_EQ(tdt(), 8u);
  TxDesc* d = tx_ring();
  uint32_t slot = 0;
  for (const auto& fr : f) {
    for (uint32_t s = 0; s < fr.nsegs; ++s, ++slot) {
      bool last = s + 1 == fr.nsegs;
      EXPECT_EQ(d[slot].addr, fr.segs[s].iova) << "slot " << slot;
      EXPECT_EQ(d[slot].lower & 0xffff, fr.segs[s].len) << "slot " << slot;
      EXPECT_EQ(d[slot].lower >> 24, last ? uint32_t{kTxCmdEop | kTxCmdIfcs | kTxCmdRs} : 0u)
          << "slot " << slot << ": EOP, IFCS and RS belong on a frame's last descriptor only";
      EXPECT_EQ(d[slot].upper, 0u);
    }
  }
  auto sent = device_transmit();
  ASSERT_EQ(sent.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(sent[i], bytes_of(f[i])) << "frame " << i;
  EXPECT_EQ(tx_pool_.out.size(), 3u) << "buffers stay with the driver until the next reclaim";
  ASSERT_EQ(drv_->tx_burst_gather(dev_, 0, f, 0), 0);
  EXPECT_EQ(tx_pool_.out.size(), 0u);
  // The counter sees every store: two calls, two TDT writes.
  ufab_tx_frame g[2] = {frame(2), frame(3)};
  {
    StoreCounter tail(FakeHost::bar + kTdt);
    ASSERT_EQ(drv_->tx_burst_gather(dev_, 0, g, 1), 1);
    ASSERT_EQ(drv_->tx_burst_gather(dev_, 0, g + 1, 1), 1);
    EXPECT_EQ(tail.stores(), 2);
  }
  EXPECT_EQ(tdt(), 13u);
  device_transmit();
}

TEST_F(E1000eGatherTest, SegmentCrossingAPageTakesADescriptorPerPage) {
  // QEMU's e1000e maps each descriptor's buffer as one piece and drops the
  // frame when the pages behind an IOVA range are not contiguous: a
  // segment is split where it crosses a 4 KiB page.
  setup();
  ufab_tx_frame f{};
  f.buf = tx_frame(40, 0x77);
  f.nsegs = 3;
  f.segs[0] = seg(f.buf->base + f.buf->offset, 40);
  f.segs[1] = seg(payload_ + 4096 - 300, 1000);  // 300 bytes before the page boundary, 700 after
  f.segs[2] = seg(payload_ + 7000, 4);
  f.len = 1044;
  ASSERT_EQ(drv_->tx_burst_gather(dev_, 0, &f, 1), 1) << host_.error;
  EXPECT_EQ(tdt(), 4u) << "4 descriptors: header, two page pieces, trailer";
  TxDesc* d = tx_ring();
  const uint64_t base = reinterpret_cast<uint64_t>(payload_);
  EXPECT_EQ(d[1].addr, base + 4096 - 300);
  EXPECT_EQ(d[1].lower & 0xffff, 300u);
  EXPECT_EQ(d[2].addr, base + 4096);
  EXPECT_EQ(d[2].lower & 0xffff, 700u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(d[i].lower >> 24, 0u) << "slot " << i;
  EXPECT_EQ(d[3].lower >> 24, uint32_t{kTxCmdEop | kTxCmdIfcs | kTxCmdRs});
  auto sent = device_transmit();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0], bytes_of(f));
}

TEST_F(E1000eGatherTest, BufferFreedOnlyWhenTheDeviceIsPastTheEopDescriptor) {
  setup();
  ufab_tx_frame f[2] = {frame(4, 40, 1), frame(2, 40, 2)};
  ufab_buf* b0 = f[0].buf;
  ufab_buf* b1 = f[1].buf;
  ASSERT_EQ(drv_->tx_burst_gather(dev_, 0, f, 2), 2) << host_.error;
  // The device has read the first three descriptors of frame 0: no DD
  // anywhere yet (no RS on them), so nothing may be freed.
  EXPECT_TRUE(device_transmit(0, 3).empty());
  ASSERT_EQ(drv_->tx_burst_gather(dev_, 0, f, 0), 0);
  EXPECT_EQ(tx_pool_.out.count(b0), 1u) << "freed before the device read its last segment";
  EXPECT_EQ(tx_pool_.out.count(b1), 1u);
  // A stray DD on a middle descriptor does not count either.
  tx_ring()[1].upper |= kTxStaDd;
  ASSERT_EQ(drv_->tx_burst_gather(dev_, 0, f, 0), 0);
  EXPECT_EQ(tx_pool_.out.count(b0), 1u);
  // Frame 0's EOP descriptor done: its buffer comes back, frame 1's stays.
  ASSERT_EQ(device_transmit(0, 2).size(), 1u);
  ASSERT_EQ(drv_->tx_burst_gather(dev_, 0, f, 0), 0);
  EXPECT_EQ(tx_pool_.out.count(b0), 0u);
  EXPECT_EQ(tx_pool_.out.count(b1), 1u);
  ASSERT_EQ(device_transmit().size(), 1u);
  ufab_buf* none[1];
  ASSERT_EQ(drv_->tx_burst(dev_, 0, none, 0), 0);  // tx_burst reclaims gathered frames too
  EXPECT_EQ(tx_pool_.out.size(), 0u);
}

TEST_F(E1000eGatherTest, FullRingTakesWholeFramesOnly) {
  setup(64, 64);  // 63 descriptors usable
  std::vector<ufab_tx_frame> f;
  for (int i = 0; i < 16; ++i) f.push_back(frame(4, 30, static_cast<uint8_t>(i)));
  // 15 frames use 60 descriptors; the 16th needs 4 and 3 are left.
  EXPECT_EQ(drv_->tx_burst_gather(dev_, 0, f.data(), 16), 15) << host_.error;
  EXPECT_EQ(tdt(), 60u);
  uint32_t out = static_cast<uint32_t>(tx_pool_.out.size());
  EXPECT_EQ(drv_->tx_burst_gather(dev_, 0, &f[15], 1), 0) << "no room for a whole frame: nothing taken";
  EXPECT_EQ(tdt(), 60u) << "no partial frame handed to the device";
  EXPECT_EQ(tx_ring()[60].addr, 0u) << "not even written";
  EXPECT_EQ(tx_pool_.out.size(), out);
  ufab_tx_frame three = frame(3, 30, 0xee);
  EXPECT_EQ(drv_->tx_burst_gather(dev_, 0, &three, 1), 1) << "a 3-descriptor frame still fits";
  EXPECT_EQ(tdt(), 63u);
  auto sent = device_transmit();
  ASSERT_EQ(sent.size(), 16u);
  EXPECT_EQ(sent[15], bytes_of(three));
  // Room again: the frame left out goes now, its descriptors wrapping from
  // slot 63 to slots 0..2.
  ASSERT_EQ(drv_->tx_burst_gather(dev_, 0, &f[15], 1), 1) << host_.error;
  EXPECT_EQ(tdt(), 3u);
  EXPECT_EQ(tx_ring()[63].lower >> 24, 0u);
  EXPECT_EQ(tx_ring()[2].lower >> 24, uint32_t{kTxCmdEop | kTxCmdIfcs | kTxCmdRs});
  sent = device_transmit();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0], bytes_of(f[15]));
  ASSERT_EQ(drv_->tx_burst_gather(dev_, 0, f.data(), 0), 0);
  EXPECT_EQ(tx_pool_.out.size(), 0u);
}

TEST_F(E1000eGatherTest, BadFramesAreRefusedWithTheReason) {
  setup();
  struct Case {
    const char* what;
    void (*spoil)(ufab_tx_frame&);
    const char* says;
  };
  const Case cases[] = {
      {"no segments", [](ufab_tx_frame& f) { f.nsegs = 0; }, "1..4"},
      {"five segments", [](ufab_tx_frame& f) { f.nsegs = 5; }, "UFAB_TX_SEGS_MAX"},
      {"empty segment", [](ufab_tx_frame& f) { f.len -= f.segs[1].len; f.segs[1].len = 0; }, "segment 1"},
      {"len != sum", [](ufab_tx_frame& f) { f.len += 1; }, "add up to"},
      {"too long", [](ufab_tx_frame& f) { f.segs[0].len += 1500; f.len += 1500; }, "14..1522"},
      {"too short", [](ufab_tx_frame& f) { f.nsegs = 1; f.segs[0].len = 10; f.len = 10; }, "14..1522"},
      {"no buffer", [](ufab_tx_frame& f) { f.buf = nullptr; }, "no buffer"},
  };
  for (const Case& c : cases) {
    ufab_tx_frame f = frame(3, 40, 1);
    ufab_buf* b = f.buf;
    c.spoil(f);
    host_.error.clear();
    EXPECT_EQ(drv_->tx_burst_gather(dev_, 0, &f, 1), -EINVAL) << c.what;
    EXPECT_NE(host_.error.find("tx_burst_gather: frame 0"), std::string::npos) << c.what << ": " << host_.error;
    EXPECT_NE(host_.error.find(c.says), std::string::npos) << c.what << ": " << host_.error;
    EXPECT_EQ(tdt(), 0u) << c.what;
    EXPECT_EQ(tx_pool_.out.count(b), 1u) << c.what << ": a refused frame stays the caller's";
    kOps.buf_free(host_.handle(), &b, 1);
  }
  // A good frame before a bad one is taken; the bad one is reported next.
  ufab_tx_frame two[2] = {frame(2, 40, 1), frame(2, 40, 2)};
  two[1].nsegs = 9;
  EXPECT_EQ(drv_->tx_burst_gather(dev_, 0, two, 2), 1);
  EXPECT_EQ(drv_->tx_burst_gather(dev_, 0, two + 1, 1), -EINVAL);
  kOps.buf_free(host_.handle(), &two[1].buf, 1);
  device_transmit();
}

TEST_F(E1000eGatherTest, StoppedOrMissingQueueIsAnError) {
  setup();
  ufab_tx_frame f = frame(2);
  EXPECT_EQ(drv_->tx_burst_gather(dev_, 2, &f, 1), -EINVAL);
  EXPECT_NE(host_.error.find("TX queue 2 does not exist"), std::string::npos) << host_.error;
  EXPECT_EQ(drv_->tx_burst_gather(dev_, 1, &f, 1), -EINVAL);
  EXPECT_NE(host_.error.find("before tx_queue_setup"), std::string::npos) << host_.error;
  ASSERT_EQ(drv_->stop(dev_), 0);
  EXPECT_EQ(drv_->tx_burst_gather(dev_, 0, &f, 1), -ENETDOWN);
  EXPECT_NE(host_.error.find("start()"), std::string::npos) << host_.error;
  kOps.buf_free(host_.handle(), &f.buf, 1);
}

TEST_F(E1000eGatherTest, MixedWithTxBurstAndReturnedOnStopAndClose) {
  setup();
  ufab_tx_frame g[2] = {frame(4, 22, 1), frame(2, 50, 2)};
  ASSERT_EQ(drv_->tx_burst_gather(dev_, 0, g, 1), 1);
  ufab_buf* b = tx_frame(100, 0x33);
  ASSERT_EQ(drv_->tx_burst(dev_, 0, &b, 1), 1);
  ASSERT_EQ(drv_->tx_burst_gather(dev_, 0, g + 1, 1), 1);
  EXPECT_EQ(tdt(), 7u);
  auto sent = device_transmit(0, 5);  // frame 0 and the one-buffer frame
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0], bytes_of(g[0]));
  EXPECT_EQ(sent[1], std::vector<uint8_t>(100, 0x33));
  // stop() returns the buffer of the gathered frame still queued, once.
  ASSERT_EQ(drv_->stop(dev_), 0);
  EXPECT_EQ(tx_pool_.out.size(), 0u);
  ASSERT_EQ(drv_->start(dev_), 0);
  ufab_tx_frame h = frame(3);
  ASSERT_EQ(drv_->tx_burst_gather(dev_, 0, &h, 1), 1);
  // close() returns one that never completed (TearDown checks for leaks).
}

}  // namespace
}  // namespace ufab::e1000e
