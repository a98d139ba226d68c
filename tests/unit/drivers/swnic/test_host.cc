#include "tests/unit/drivers/swnic/test_host.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "drivers/swnic/swnic.h"

namespace ufab::swnic_test {

TestPool::TestPool(uint32_t count, uint32_t capacity, uint32_t headroom)
    : count_(count), headroom_(headroom), bufs_(count), memory_(count) {
  free_.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    memory_[i] = static_cast<uint8_t*>(std::aligned_alloc(64, (capacity + 63) / 64 * 64));
    ufab_buf& b = bufs_[i];
    b = ufab_buf{};
    b.base = memory_[i];
    b.base_iova = reinterpret_cast<uintptr_t>(memory_[i]);
    b.capacity = capacity;
    b.pool = handle();
    free_.push_back(&b);
  }
}

TestPool::~TestPool() {
  for (uint8_t* m : memory_) std::free(m);
}

int TestPool::alloc(ufab_buf** bufs, uint32_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  uint32_t k = std::min<uint32_t>(n, static_cast<uint32_t>(free_.size()));
  for (uint32_t i = 0; i < k; ++i) {
    ufab_buf* b = free_.back();
    free_.pop_back();
    b->offset = headroom_;
    b->len = 0;
    b->flags = 0;
    bufs[i] = b;
  }
  return static_cast<int>(k);
}

void TestPool::free(ufab_buf** bufs, uint32_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  for (uint32_t i = 0; i < n; ++i) free_.push_back(bufs[i]);
}

size_t TestPool::available() {
  std::lock_guard<std::mutex> lock(mu_);
  return free_.size();
}

TestHost::TestHost(std::string name, std::map<std::string, std::string> params)
    : name_(std::move(name)), params_(std::move(params)) {
  ops_.size = sizeof(ufab_host_ops);
  ops_.log = [](ufab_host* h, int, const char* msg) {
    std::lock_guard<std::mutex> lock(self(h)->mu_);
    self(h)->logs_.push_back(msg);
  };
  ops_.set_error = [](ufab_host* h, const char* msg) {
    std::lock_guard<std::mutex> lock(self(h)->mu_);
    self(h)->last_error_ = msg;
  };
  ops_.name = [](ufab_host* h) { return self(h)->name_.c_str(); };
  ops_.param = [](ufab_host* h, const char* key) -> const char* {
    auto it = self(h)->params_.find(key);
    return it == self(h)->params_.end() ? nullptr : it->second.c_str();
  };
  ops_.map_bar = [](ufab_host*, uint32_t, volatile void**, uint64_t*) { return -EOPNOTSUPP; };
  ops_.config_read = [](ufab_host*, uint32_t, uint32_t, uint32_t*) { return -EOPNOTSUPP; };
  ops_.config_write = [](ufab_host*, uint32_t, uint32_t, uint32_t) { return -EOPNOTSUPP; };
  ops_.enable_bus_master = [](ufab_host*) { return -EOPNOTSUPP; };
  ops_.dma_alloc = [](ufab_host*, size_t size, size_t align, ufab_dma_mem* out) {
    size_t a = std::max<size_t>(align, 64);
    void* p = std::aligned_alloc(a, (size + a - 1) / a * a);
    if (!p) return -ENOMEM;
    std::memset(p, 0, size);
    *out = ufab_dma_mem{p, reinterpret_cast<uintptr_t>(p), size, 0};
    return 0;
  };
  ops_.dma_free = [](ufab_host*, ufab_dma_mem* m) { std::free(m->va); };
  ops_.irq_enable = [](ufab_host*, uint32_t, int*) { return -EOPNOTSUPP; };
  ops_.irq_disable = [](ufab_host*) { return -EOPNOTSUPP; };
  ops_.buf_alloc = [](ufab_host*, ufab_pool* pool, ufab_buf** bufs, uint32_t n) {
    return TestPool::from(pool)->alloc(bufs, n);
  };
  ops_.buf_free = [](ufab_host*, ufab_buf** bufs, uint32_t n) {
    // Buffers may come from several pools; return each to its own.
    for (uint32_t i = 0; i < n; ++i) TestPool::from(bufs[i]->pool)->free(&bufs[i], 1);
  };
}

std::string TestHost::last_error() {
  std::lock_guard<std::mutex> lock(mu_);
  return last_error_;
}

std::vector<std::string> TestHost::logs() {
  std::lock_guard<std::mutex> lock(mu_);
  return logs_;
}

bool TestHost::logged(const std::string& needle) {
  for (const std::string& l : logs())
    if (l.find(needle) != std::string::npos) return true;
  return false;
}

std::unique_ptr<Port> Port::open(const std::string& name, std::map<std::string, std::string> params, int* rc,
                                 std::string* error, uint32_t rx_buf_capacity) {
  std::unique_ptr<Port> p(new Port());
  p->drv_ = ufab_swnic_driver();
  p->host_ = std::make_unique<TestHost>(name, std::move(params));
  uint32_t cap = rx_buf_capacity ? rx_buf_capacity : 64 + 4096;
  auto failed = [&](int r) -> std::unique_ptr<Port> {
    if (rc) *rc = r;
    if (error) *error = p->host_->last_error();
    return nullptr;
  };
  int r = p->drv_->open(p->host_->ops(), p->host_->host(), &p->dev_);
  if (r < 0) {
    p->dev_ = nullptr;
    return failed(r);
  }
  ufab_dev_info info{};
  if ((r = p->drv_->info(p->dev_, &info)) < 0) return failed(r);
  for (uint16_t q = 0; q < info.max_rx_queues; ++q) {
    p->tx_pools_.push_back(std::make_unique<TestPool>(1024, 64 + 4096 + 64));
    p->rx_pools_.push_back(std::make_unique<TestPool>(1024, cap));
    ufab_queue_conf rxc{1024, p->rx_pools_.back()->handle()};
    ufab_queue_conf txc{1024, nullptr};
    if ((r = p->drv_->rx_queue_setup(p->dev_, q, &rxc)) < 0) return failed(r);
    if ((r = p->drv_->tx_queue_setup(p->dev_, q, &txc)) < 0) return failed(r);
  }
  if ((r = p->drv_->start(p->dev_)) < 0) return failed(r);
  if (rc) *rc = 0;
  return p;
}

Port::~Port() { close(); }

int Port::steer(uint32_t mode, uint16_t nqueues) {
  drv_->stop(dev_);
  int rc = drv_->rx_steer(dev_, mode, nqueues);
  drv_->start(dev_);
  return rc;
}

void Port::close() {
  if (dev_) {
    drv_->stop(dev_);
    drv_->close(dev_);
  }
  dev_ = nullptr;
}

ufab_stats Port::stats() {
  ufab_stats s{};
  drv_->stats(dev_, &s);
  return s;
}

bool Port::link_up() {
  ufab_link l{};
  drv_->link(dev_, &l);
  return l.up != 0;
}

namespace {
uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}
}  // namespace

void fill_frame(uint8_t* p, uint32_t len, uint64_t seq) {
  static const uint8_t hdr[14] = {0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 0, 0x88, 0xb5};
  uint8_t tmp[26];
  std::memcpy(tmp, hdr, 14);
  std::memcpy(tmp + 14, &seq, 8);
  std::memcpy(tmp + 22, &len, 4);
  std::memcpy(p, tmp, std::min<uint32_t>(len, 26));
  uint64_t x = mix(seq * 0x9e3779b97f4a7c15ull + len);
  for (uint32_t i = 26; i < len; ++i) {
    if ((i & 7) == 2) x = mix(x + i);
    p[i] = static_cast<uint8_t>(x >> (8 * (i & 7)));
  }
}

bool verify_frame(const uint8_t* p, uint32_t len, uint64_t* seq) {
  if (len < 26) return false;
  uint64_t s;
  uint32_t l;
  std::memcpy(&s, p + 14, 8);
  std::memcpy(&l, p + 22, 4);
  if (seq) *seq = s;
  if (l != len) return false;
  std::vector<uint8_t> expect(len);
  fill_frame(expect.data(), len, s);
  return std::memcmp(expect.data(), p, len) == 0;
}

uint64_t frame_hash(const uint8_t* p, uint32_t len) {
  uint64_t h = 1469598103934665603ull;
  for (uint32_t i = 0; i < len; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

void fill_roce_frame(uint8_t* p, uint32_t len, uint32_t qp, uint64_t seq, uint32_t tag, bool vlan) {
  uint32_t l3 = vlan ? 18 : 14;
  std::memset(p, 0, len);
  static const uint8_t macs[12] = {0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2};
  std::memcpy(p, macs, 12);
  if (vlan) {
    p[12] = 0x81;
    p[14] = 0x00;
    p[15] = 0x07;  // VLAN 7
  }
  p[l3 - 2] = 0x08;  // IPv4
  uint8_t* ip = p + l3;
  ip[0] = 0x45;
  uint16_t ip_len = static_cast<uint16_t>(len - l3);
  ip[2] = static_cast<uint8_t>(ip_len >> 8);
  ip[3] = static_cast<uint8_t>(ip_len);
  ip[6] = 0x40;  // DF
  ip[8] = 64;
  ip[9] = 17;  // UDP
  uint8_t* udp = ip + 20;
  udp[0] = 0xc0;
  udp[2] = 4791 >> 8;
  udp[3] = 4791 & 0xff;
  uint8_t* bth = udp + 8;
  bth[0] = 0x04;  // RC SEND only, say
  bth[5] = static_cast<uint8_t>(qp >> 16);
  bth[6] = static_cast<uint8_t>(qp >> 8);
  bth[7] = static_cast<uint8_t>(qp);
  uint8_t* rest = bth + 12;
  if (rest + 12 <= p + len) {
    std::memcpy(rest, &seq, 8);
    std::memcpy(rest + 8, &tag, 4);
  }
}

bool parse_roce_frame(const uint8_t* p, uint32_t len, uint32_t* qp, uint64_t* seq, uint32_t* tag) {
  uint32_t l3 = (p[12] == 0x81) ? 18 : 14;
  if (len < l3 + 20 + 8 + 12 + 12) return false;
  const uint8_t* bth = p + l3 + 28;
  *qp = uint32_t{bth[5]} << 16 | uint32_t{bth[6]} << 8 | bth[7];
  std::memcpy(seq, bth + 12, 8);
  if (tag) std::memcpy(tag, bth + 20, 4);
  return true;
}

int send_roce(Port& port, uint16_t queue, uint32_t qp, uint64_t first_seq, uint32_t n, uint32_t len, uint32_t tag) {
  std::vector<ufab_buf*> bufs(n);
  int got = port.tx_pool(queue).alloc(bufs.data(), n);
  if (got <= 0) return 0;
  for (int i = 0; i < got; ++i) {
    fill_roce_frame(bufs[i]->base + bufs[i]->offset, len, qp, first_seq + static_cast<uint64_t>(i), tag);
    bufs[i]->len = len;
  }
  int rc = port.drv()->tx_burst(port.dev(), queue, bufs.data(), static_cast<uint16_t>(got));
  int taken = rc < 0 ? 0 : rc;
  if (taken < got) port.tx_pool(queue).free(bufs.data() + taken, static_cast<uint32_t>(got - taken));
  return rc;
}

int send_raw(Port& port, uint16_t queue, const std::vector<uint8_t>& frame) {
  ufab_buf* b = nullptr;
  if (port.tx_pool(queue).alloc(&b, 1) != 1) return 0;
  std::memcpy(b->base + b->offset, frame.data(), frame.size());
  b->len = static_cast<uint32_t>(frame.size());
  int rc = port.drv()->tx_burst(port.dev(), queue, &b, 1);
  if (rc != 1) port.tx_pool(queue).free(&b, 1);
  return rc;
}

std::vector<std::vector<uint8_t>> drain(Port& port, uint16_t queue) {
  std::vector<std::vector<uint8_t>> out;
  ufab_buf* bufs[32];
  for (;;) {
    int got = port.drv()->rx_burst(port.dev(), queue, bufs, 32);
    if (got <= 0) break;
    for (int i = 0; i < got; ++i)
      out.emplace_back(bufs[i]->base + bufs[i]->offset, bufs[i]->base + bufs[i]->offset + bufs[i]->len);
    port.rx_pool(queue).free(bufs, static_cast<uint32_t>(got));
  }
  return out;
}

int recv_burst(Port& port, std::vector<Received>* out, uint16_t n, uint16_t queue) {
  std::vector<ufab_buf*> bufs(n);
  int got = port.drv()->rx_burst(port.dev(), queue, bufs.data(), n);
  for (int i = 0; i < got; ++i) {
    ufab_buf* b = bufs[i];
    Received r{};
    r.len = b->len;
    r.intact = verify_frame(b->base + b->offset, b->len, &r.seq);
    r.hash = frame_hash(b->base + b->offset, b->len);
    out->push_back(r);
  }
  if (got > 0) port.rx_pool(queue).free(bufs.data(), static_cast<uint32_t>(got));
  return got;
}

std::string unique_link(const std::string& tag) {
  static std::atomic<int> counter{0};
  return "t" + std::to_string(::getpid()) + "-" + tag + "-" + std::to_string(counter++);
}

bool segment_exists(const std::string& link) {
  struct stat st;
  return ::stat(("/dev/shm/ufab-swnic-" + link).c_str(), &st) == 0;
}

SegmentView::SegmentView(const std::string& link) {
  int fd = ::open(("/dev/shm/ufab-swnic-" + link).c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return;
  struct stat st;
  if (::fstat(fd, &st) == 0 && st.st_size > 0) {
    void* p = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) {
      base_ = p;
      size_ = static_cast<size_t>(st.st_size);
    }
  }
  ::close(fd);
}

SegmentView::~SegmentView() {
  if (base_) ::munmap(base_, size_);
}

uint8_t* SegmentView::slot(int dir, uint64_t index, uint32_t queue) {
  swnic::SegHeader* h = hdr();
  return static_cast<uint8_t*>(base_) + h->slots_offset[dir] + queue * h->ring_bytes + (index & (h->ring - 1)) * h->stride;
}

}  // namespace ufab::swnic_test
