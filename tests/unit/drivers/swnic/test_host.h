// A small ufab_host for driving the swnic plugin through its driver table
// without the framework: parameters from a map, DMA memory from
// aligned_alloc, frame buffers from a heap pool, errors and logs captured.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "abi/raw_frame.h"
#include "drivers/swnic/segment.h"

namespace ufab::swnic_test {

// Fixed-size frame buffers on the heap. Thread-safe (a mutex per call).
class TestPool {
 public:
  TestPool(uint32_t count, uint32_t capacity, uint32_t headroom = 64);
  ~TestPool();
  TestPool(const TestPool&) = delete;
  TestPool& operator=(const TestPool&) = delete;

  int alloc(ufab_buf** bufs, uint32_t n);
  void free(ufab_buf** bufs, uint32_t n);
  size_t available();
  uint32_t count() const { return count_; }
  ufab_pool* handle() { return reinterpret_cast<ufab_pool*>(this); }
  static TestPool* from(ufab_pool* p) { return reinterpret_cast<TestPool*>(p); }

 private:
  std::mutex mu_;
  uint32_t count_;
  uint32_t headroom_;
  std::vector<ufab_buf> bufs_;
  std::vector<uint8_t*> memory_;
  std::vector<ufab_buf*> free_;
};

class TestHost {
 public:
  TestHost(std::string name, std::map<std::string, std::string> params = {});
  const ufab_host_ops* ops() const { return &ops_; }
  ufab_host* host() { return reinterpret_cast<ufab_host*>(this); }

  std::string last_error();
  std::vector<std::string> logs();
  bool logged(const std::string& needle);

 private:
  static TestHost* self(ufab_host* h) { return reinterpret_cast<TestHost*>(h); }
  std::string name_;
  std::map<std::string, std::string> params_;
  ufab_host_ops ops_{};
  std::mutex mu_;
  std::string last_error_;
  std::vector<std::string> logs_;
};

// One opened swnic port with its host and pools, started, with every queue
// the link has (the "queues" parameter) set up: RX and TX queue q each get
// their own pool, so threads driving different queues share no test lock.
class Port {
 public:
  // Opens `name` ("LINK:PORT"); on failure returns nullptr and sets *rc
  // (negative errno) and *error.
  static std::unique_ptr<Port> open(const std::string& name, std::map<std::string, std::string> params = {},
                                    int* rc = nullptr, std::string* error = nullptr, uint32_t rx_buf_capacity = 0);
  ~Port();
  void close();

  const ufab_driver* drv() const { return drv_; }
  ufab_dev* dev() const { return dev_; }
  TestHost& host() { return *host_; }
  TestPool& tx_pool(uint16_t queue = 0) { return *tx_pools_.at(queue); }
  TestPool& rx_pool(uint16_t queue = 0) { return *rx_pools_.at(queue); }
  uint16_t queues() const { return static_cast<uint16_t>(rx_pools_.size()); }
  // stop(), rx_steer(mode, nqueues), start(): rx_steer's return value.
  int steer(uint32_t mode, uint16_t nqueues);

  ufab_stats stats();
  bool link_up();

 private:
  Port() = default;
  const ufab_driver* drv_ = nullptr;
  std::unique_ptr<TestHost> host_;
  std::vector<std::unique_ptr<TestPool>> tx_pools_;
  std::vector<std::unique_ptr<TestPool>> rx_pools_;
  ufab_dev* dev_ = nullptr;
};

// Test frames: Ethernet header, then a 64-bit sequence number and the
// frame length, then bytes derived from both. verify() recomputes them, so
// any single flipped bit is detected.
void fill_frame(uint8_t* p, uint32_t len, uint64_t seq);
// Returns true and the sequence number when the frame is intact.
bool verify_frame(const uint8_t* p, uint32_t len, uint64_t* seq);
// FNV-1a 64 over a frame (for comparing runs).
uint64_t frame_hash(const uint8_t* p, uint32_t len);

// RoCEv2-shaped test frames for steering: Ethernet / IPv4 / UDP destination
// port 4791 / BTH with destination QP `qp` (offset 54 with no VLAN tag),
// then a 64-bit sequence number and a 32-bit tag (len >= kRoceMinLen).
// vlan: one 802.1Q tag after the MAC addresses.
inline constexpr uint32_t kRoceMinLen = 54 + 12;
void fill_roce_frame(uint8_t* p, uint32_t len, uint32_t qp, uint64_t seq, uint32_t tag = 0, bool vlan = false);
// The QP, sequence number and tag of a frame fill_roce_frame wrote.
bool parse_roce_frame(const uint8_t* p, uint32_t len, uint32_t* qp, uint64_t* seq, uint32_t* tag = nullptr);
// Sends frames seq, seq+1, ... for `qp` on TX queue `queue`; returns tx_burst's result.
int send_roce(Port& port, uint16_t queue, uint32_t qp, uint64_t first_seq, uint32_t n, uint32_t len = 128,
              uint32_t tag = 0);
// Sends one frame exactly as given (bytes copied into a TX buffer).
int send_raw(Port& port, uint16_t queue, const std::vector<uint8_t>& frame);
// Receives everything waiting on RX queue `queue` (rx_burst until empty):
// the frames' bytes, in order.
std::vector<std::vector<uint8_t>> drain(Port& port, uint16_t queue);

// Sends frames seq, seq+1, ... of lengths len_of(seq) in one tx_burst; the
// frames not taken go back to the pool. Returns tx_burst's result.
template <typename LenFn>
int send_burst(Port& port, uint64_t first_seq, uint32_t n, LenFn len_of, uint16_t queue = 0);

struct Received {
  uint64_t seq;
  uint32_t len;
  bool intact;
  uint64_t hash;
};
// One rx_burst of up to n frames, appended to out. Returns rx_burst's result.
int recv_burst(Port& port, std::vector<Received>* out, uint16_t n, uint16_t queue = 0);

// A link name unique to this process and call.
std::string unique_link(const std::string& tag);
// Whether /dev/shm holds the link's segment.
bool segment_exists(const std::string& link);

// The link's segment mapped directly, as a (hostile) peer would see it.
class SegmentView {
 public:
  explicit SegmentView(const std::string& link);
  ~SegmentView();
  SegmentView(const SegmentView&) = delete;
  SegmentView& operator=(const SegmentView&) = delete;
  bool ok() const { return base_ != nullptr; }
  swnic::SegHeader* hdr() { return swnic::header_of(base_); }
  // Direction `dir` (0: port 0 -> port 1), the peer's RX queue `queue`.
  swnic::RingCtl* ctl(int dir, uint32_t queue = 0) { return swnic::ring_ctl_of(base_, dir, queue); }
  uint8_t* slot(int dir, uint64_t index, uint32_t queue = 0);

 private:
  void* base_ = nullptr;
  size_t size_ = 0;
};

}  // namespace ufab::swnic_test

#include "tests/unit/drivers/swnic/test_host_inl.h"
