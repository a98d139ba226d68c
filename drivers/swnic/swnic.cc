// swnic: two Ethernet ports joined over POSIX shared memory. See swnic.h,
// segment.h and docs/drivers/swnic.md.
#include "drivers/swnic/swnic.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "drivers/sdk/adapter.h"
#include "drivers/swnic/inject.h"
#include "drivers/swnic/segment.h"

namespace ufab::swnic {
namespace {

using Clock = std::chrono::steady_clock;

// How long open and close wait for the segment's lock, and for a creator
// to finish initialising, before giving up.
constexpr auto kLockTimeout = std::chrono::seconds(3);
// A segment that exists but has no magic while its lock is free has lost its
// creator (it takes the lock right after creating the object) once this long
// has passed; the opener then initialises it itself.
constexpr auto kInitGrace = std::chrono::milliseconds(250);
// The interrupt helper re-checks its stop flag at least this often.
constexpr long kHelperPollNs = 200'000'000;

constexpr int kRetry = 1;

std::string errno_text(int err) {
  char buf[128];
  // GNU strerror_r returns the message (possibly not in buf).
  return std::string(strerror_r(err, buf, sizeof buf));
}

// Relaxed counter bump for a counter with one writer and any readers.
inline void bump(std::atomic<uint64_t>& c, uint64_t v = 1) {
  c.store(c.load(std::memory_order_relaxed) + v, std::memory_order_relaxed);
}

long futex(std::atomic<uint32_t>* word, int op, uint32_t val, const struct timespec* timeout) {
  // Shared (not FUTEX_PRIVATE_FLAG) futexes key on the page, so waiters and
  // wakers in different processes mapping the same object meet.
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, val, timeout, nullptr, 0);
}

// Start time of a process in clock ticks since boot (/proc/PID/stat field
// 22), 0 when unknown. *zombie is set when the process has exited but not
// yet been reaped.
uint64_t proc_start_time(int32_t pid, bool* zombie = nullptr) {
  if (zombie) *zombie = false;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[1024];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  // The command name (field 2) may hold spaces and parentheses: fields
  // after it start past the last ')'.
  char* p = std::strrchr(buf, ')');
  if (!p) return 0;
  ++p;
  // Field 3 is the state; field 22 is the 20th token after ')'.
  char* save = nullptr;
  char* tok = strtok_r(p, " ", &save);
  for (int field = 3; tok; ++field, tok = strtok_r(nullptr, " ", &save)) {
    if (field == 3 && zombie) *zombie = (tok[0] == 'Z' || tok[0] == 'X');
    if (field == 22) return std::strtoull(tok, nullptr, 10);
  }
  return 0;
}

// Whether the process that recorded (pid, start_time) still runs. Both ends
// must share a PID namespace for this to mean anything (see the docs).
bool process_alive(int32_t pid, uint64_t start_time) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  bool zombie = false;
  uint64_t now_start = proc_start_time(pid, &zombie);
  if (zombie) return false;
  // A different start time: the PID was reused by another process.
  if (start_time != 0 && now_start != 0 && now_start != start_time) return false;
  return true;
}

#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
// ThreadSanitizer tracks memory by virtual address, but the two ports of a
// link opened in one process map the segment twice, at two addresses: it
// cannot see that a head or tail stored through one mapping is the one
// loaded through the other, and would report the (synchronised) reuse of a
// slot by two TX queues as a race. Under TSan only, each ring gets a key
// address that every mapping of it in the process shares, released where a
// head or tail is published and acquired where one is read.
char g_tsan_keys[4096];
void* tsan_ring_key(dev_t dev, ino_t ino, int dir, uint32_t queue) {
  uint64_t h = (static_cast<uint64_t>(ino) * 0x9e3779b97f4a7c15ull) ^ static_cast<uint64_t>(dev);
  return &g_tsan_keys[(h * 2 * kMaxQueues + static_cast<uint64_t>(dir) * kMaxQueues + queue) % sizeof g_tsan_keys];
}
inline void tsan_acquire(void* key) { __tsan_acquire(key); }
inline void tsan_release(void* key) { __tsan_release(key); }
#else
void* tsan_ring_key(dev_t, ino_t, int, uint32_t) { return nullptr; }
inline void tsan_acquire(void*) {}
inline void tsan_release(void*) {}
#endif

uint32_t fnv1a32(const std::string& s) {
  uint32_t h = 2166136261u;
  for (unsigned char c : s) {
    h ^= c;
    h *= 16777619u;
  }
  return h;
}

// Receive steering (abi/raw_frame.h, UFAB_STEER_ROCE_QPN): the RX queue a
// frame lands in among `nqueues`. RoCEv2 is IPv4 / UDP destination port
// 4791 / BTH, the destination QP the 24 bits at BTH offset 5; one 802.1Q
// tag is looked through. Everything else, including a frame too short to
// hold the whole BTH or a non-first IPv4 fragment, goes to queue 0.
uint32_t roce_qpn_queue(const uint8_t* f, uint32_t len, uint32_t nqueues) {
  constexpr uint32_t kBth = 12;
  uint32_t l3 = 14;
  if (len < l3 + 20) return 0;
  uint16_t type = static_cast<uint16_t>(f[12] << 8 | f[13]);
  if (type == 0x8100) {
    l3 += 4;
    if (len < l3 + 20) return 0;
    type = static_cast<uint16_t>(f[16] << 8 | f[17]);
  }
  if (type != 0x0800) return 0;
  const uint8_t* ip = f + l3;
  if ((ip[0] >> 4) != 4 || ip[9] != 17) return 0;                   // IPv4, UDP
  if (((ip[6] & 0x1f) << 8 | ip[7]) != 0) return 0;                 // a later fragment: no UDP header
  uint32_t ihl = (ip[0] & 0x0fu) * 4;
  if (ihl < 20 || uint64_t{l3} + ihl + 8 + kBth > len) return 0;    // too short for UDP + BTH
  const uint8_t* udp = ip + ihl;
  if ((udp[2] << 8 | udp[3]) != 4791) return 0;                      // not RoCEv2
  const uint8_t* bth = udp + 8;
  uint32_t qpn = uint32_t{bth[5]} << 16 | uint32_t{bth[6]} << 8 | bth[7];
  return qpn % nqueues;
}

// Queue state. Each RX and each TX queue is driven by one thread at a time
// (the threading contract, docs/drivers/swnic.md); different queues by
// different threads at once, with no lock: every queue's state is its own,
// on cache lines of its own (alignas), and the segment gives every RX queue
// its own ring and control block.

// One TX queue (touched only by the thread calling tx_burst on it, except
// the counters, which stats() reads).
struct alignas(kCacheLine) TxQueue {
  bool ready = false;          // tx_queue_setup done
  uint64_t frame_index = 0;    // frames taken since open (fault injection)
  std::vector<uint8_t> held;   // a frame held back by reorder injection
  uint32_t held_len = 0;
  uint32_t held_copies = 0;    // 0: nothing held
  uint32_t held_queue = 0;     // the peer's RX queue it is steered to
  uint64_t tail_cache[kMaxQueues] = {};  // each peer RX ring's tail, last read
  std::atomic<uint64_t> packets{0}, bytes{0}, errors{0};
  std::atomic<uint64_t> loss{0}, dup{0}, reorder{0}, corrupt{0};
};

// One RX queue: the consumer of one ring, and its interrupt.
struct alignas(kCacheLine) RxQueue {
  ufab_pool* pool = nullptr;  // set by rx_queue_setup
  RingCtl* ctl = nullptr;
  uint8_t* slots = nullptr;
  uint64_t tail = 0;        // our copy of the ring's tail
  uint64_t head_cache = 0;  // the producers' head, last read
  uint64_t loss_base = 0;   // the ring's injected-loss counter at open
  void* tsan_key = nullptr;  // under ThreadSanitizer only, see tsan_ring_key
  std::atomic<uint64_t> packets{0}, bytes{0}, errors{0};
  // Interrupt mode.
  std::atomic<bool> irq_on{false};
  // The caller arms before it sleeps (rx_irq_arm), so an empty rx_burst no
  // longer does: a busy-polling receiver then costs its peer no futex wake
  // per frame.
  std::atomic<bool> arm_on_request{false};
  std::atomic<bool> irq_stop{false};
  std::atomic<uint64_t> irqs{0};
  int irq_fd = -1;
  std::thread irq_thread;
};

// Cache-line aligned: the fields every burst reads (started_, the queue
// arrays, the ring geometry) must not share a line with whatever the heap
// puts next to the object.
class alignas(kCacheLine) SwNic {
 public:
  static int open(const ufab_host_ops* ops, ufab_host* host, SwNic** out) {
    auto dev = std::unique_ptr<SwNic>(new SwNic(ops, host));
    int rc = dev->init();
    if (rc < 0) return rc;
    *out = dev.release();
    return 0;
  }
  ~SwNic();

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
  SwNic(const ufab_host_ops* ops, ufab_host* host) : ops_(ops), host_(host) {}

  int init();
  int parse_params();
  int attach();
  int join(bool created, Clock::time_point deadline, bool& uninit_seen, Clock::time_point& uninit_since);
  int initialise_segment();
  int register_port();
  void detach();

  bool lock_segment(Clock::time_point deadline);
  void unlock_segment();
  int map_segment(size_t size);
  void unmap_segment();
  void unlink_if_ours();

  int fail(int err, const std::string& msg);
  int no_queue(const char* dir, uint16_t queue);
  void log(int level, const std::string& msg);
  bool param_u64(const char* key, uint64_t* value, bool* given, int* rc);
  bool param_prob(const char* key, double* value, int* rc);

  uint8_t* tx_slot(uint32_t q, uint64_t index) { return tx_slots_[q] + (index & mask_) * stride_; }
  uint8_t* rx_slot(const RxQueue& r, uint64_t index) { return r.slots + (index & mask_) * stride_; }
  template <typename Frames>
  void write_slot(uint32_t q, uint64_t index, const Frames& f, int i, bool flip, uint64_t bit_draw);
  uint32_t peer_steering() const;
  template <typename Frames>
  uint32_t target_queue(uint32_t steer, const Frames& f, int i) const {
    return steer_mode(steer) == UFAB_STEER_ROCE_QPN ? roce_qpn_queue(f.head(i), f.head_len(i), steer_nqueues(steer))
                                                    : 0;
  }
  template <typename Frames>
  bool frame_fits(const Frames& f, int i) const {
    return f.valid(i) && f.len(i) <= slot_size_;
  }
  int reserve(TxQueue& t, uint32_t q, uint32_t want, uint64_t* first, uint32_t at_least);
  void commit(uint32_t q, uint64_t first, uint64_t end);
  template <typename Frames>
  int tx_frames(uint16_t queue, const Frames& f, uint16_t n, const char* what);
  template <typename Frames>
  int tx_drop_link_down(TxQueue& t, const Frames& f, uint16_t n);
  template <typename Frames>
  int tx_burst_faults(TxQueue& t, uint32_t steer, const Frames& f, uint16_t n, int* err);
  template <typename Frames>
  int tx_burst_single(TxQueue& t, const Frames& f, uint16_t n, int* err);
  void stop_irq(RxQueue& r);
  void signal_irq(RxQueue& r);
  void irq_helper(RxQueue& r, uint32_t last_seq);

  const ufab_host_ops* ops_;
  ufab_host* host_;

  std::string dev_name_;   // "NAME:PORT"
  std::string link_name_;  // "NAME"
  std::string shm_name_;   // "/ufab-swnic-NAME"
  int port_ = 0;
  int peer_ = 1;

  // Parameters.
  uint32_t ring_param_ = kDefaultRing;
  uint32_t slot_param_ = kDefaultSlotSize;
  uint32_t queues_param_ = kDefaultQueues;
  bool ring_given_ = false;
  bool slot_given_ = false;
  bool queues_given_ = false;
  bool stale_reset_ = false;
  bool check_pids_ = true;  // stale=off: trust the present flags, never look at PIDs
  FaultConfig faults_;
  bool inject_ = false;

  // Segment.
  int fd_ = -1;
  bool locked_ = false;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  bool registered_ = false;
  bool created_ = false;
  SegHeader* hdr_ = nullptr;
  // Read-only after open; shared by the queues' threads.
  RingCtl* tx_ctl_[kMaxQueues] = {};  // the peer's RX rings, which our TX queues feed
  uint8_t* tx_slots_[kMaxQueues] = {};
  void* tsan_tx_key_[kMaxQueues] = {};  // under ThreadSanitizer only, see tsan_ring_key
  uint32_t queues_ = 0;
  uint32_t ring_ = 0;
  uint64_t mask_ = 0;
  uint32_t slot_size_ = 0;
  uint32_t stride_ = 0;
  uint8_t mac_[6] = {};

  std::atomic<bool> started_{false};
  uint32_t steer_mode_ = UFAB_STEER_NONE;  // our rx_steer, also in hdr_->steer[port_]
  uint32_t steer_n_ = 1;

  std::unique_ptr<TxQueue[]> txq_;  // queues_ of each
  std::unique_ptr<RxQueue[]> rxq_;

  // Our TX queues' agreement on each peer RX ring they feed (see "TX").
  struct alignas(kCacheLine) Producers {
    std::atomic<uint64_t> reserved{0};                       // slots handed out
    alignas(kCacheLine) std::atomic<uint64_t> committed{0};  // slots published (= the ring's head)
  };
  std::unique_ptr<Producers[]> prod_;
  // Only TX queue 0 is set up (decided at start()): it alone feeds every
  // peer ring, and needs neither compare-and-swap nor a turn to publish.
  std::atomic<bool> single_producer_{true};
};

int SwNic::fail(int err, const std::string& msg) {
  std::string full = "swnic " + (dev_name_.empty() ? std::string("?") : dev_name_) + ": " + msg;
  if (ops_ && ops_->set_error) ops_->set_error(host_, full.c_str());
  return -err;
}

void SwNic::log(int level, const std::string& msg) {
  std::string full = "swnic " + dev_name_ + ": " + msg;
  if (ops_ && ops_->log) ops_->log(host_, level, full.c_str());
}

bool SwNic::param_u64(const char* key, uint64_t* value, bool* given, int* rc) {
  const char* s = ops_->param ? ops_->param(host_, key) : nullptr;
  if (given) *given = s != nullptr;
  if (!s) return true;
  errno = 0;
  char* end = nullptr;
  unsigned long long v = std::strtoull(s, &end, 0);
  if (*s == '\0' || *s == '-' || errno != 0 || *end != '\0') {
    *rc = fail(EINVAL, std::string("parameter ") + key + "=\"" + s + "\" is not an unsigned integer");
    return false;
  }
  *value = v;
  return true;
}

bool SwNic::param_prob(const char* key, double* value, int* rc) {
  const char* s = ops_->param ? ops_->param(host_, key) : nullptr;
  if (!s) return true;
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(s, &end);
  if (*s == '\0' || errno != 0 || *end != '\0' || !(v >= 0.0 && v <= 1.0)) {
    *rc = fail(EINVAL, std::string("parameter ") + key + "=\"" + s + "\" must be a probability between 0 and 1");
    return false;
  }
  *value = v;
  return true;
}

int SwNic::parse_params() {
  int rc = 0;
  uint64_t v = 0;
  bool given = false;
  if (!param_u64("ring", &v, &given, &rc)) return rc;
  if (given) {
    if (!is_pow2(v) || v < kMinRing || v > kMaxRing)
      return fail(EINVAL, "ring=" + std::to_string(v) + " must be a power of two between " + std::to_string(kMinRing) +
                              " and " + std::to_string(kMaxRing));
    ring_param_ = static_cast<uint32_t>(v);
    ring_given_ = true;
  }
  if (!param_u64("slot_size", &v, &given, &rc)) return rc;
  if (given) {
    if (v < kMinSlotSize || v > kMaxSlotSize)
      return fail(EINVAL, "slot_size=" + std::to_string(v) + " must be between " + std::to_string(kMinSlotSize) +
                              " (a full Ethernet frame) and " + std::to_string(kMaxSlotSize));
    slot_param_ = static_cast<uint32_t>(v);
    slot_given_ = true;
  }
  if (!param_u64("queues", &v, &given, &rc)) return rc;
  if (given) {
    if (v < 1 || v > kMaxQueues)
      return fail(EINVAL, "queues=" + std::to_string(v) + " must be between 1 and " + std::to_string(kMaxQueues) +
                              " (RX and TX queues per port)");
    queues_param_ = static_cast<uint32_t>(v);
    queues_given_ = true;
  }
  if (!param_prob("loss", &faults_.loss, &rc)) return rc;
  if (!param_prob("dup", &faults_.dup, &rc)) return rc;
  if (!param_prob("reorder", &faults_.reorder, &rc)) return rc;
  if (!param_prob("corrupt", &faults_.corrupt, &rc)) return rc;
  if (!param_u64("seed", &faults_.seed, nullptr, &rc)) return rc;
  inject_ = faults_.enabled();
  const char* stale = ops_->param ? ops_->param(host_, "stale") : nullptr;
  if (stale) {
    std::string s = stale;
    if (s == "reset")
      stale_reset_ = true;
    else if (s == "off")
      check_pids_ = false;
    else if (s != "auto")
      return fail(EINVAL, "stale=\"" + s +
                              "\": expected \"auto\" (reclaim ports of dead processes), \"off\" "
                              "(never; for peers in another PID namespace) or \"reset\" (remove the "
                              "existing segment first)");
  }
  return 0;
}

int SwNic::init() {
  const char* name = ops_->name ? ops_->name(host_) : nullptr;
  if (!name) return fail(EINVAL, "no device name: open a software device as \"NAME:PORT\", e.g. \"lab:0\"");
  dev_name_ = name;
  size_t colon = dev_name_.rfind(':');
  if (colon == std::string::npos || colon == 0)
    return fail(EINVAL, "device name \"" + dev_name_ + "\" is not NAME:PORT (e.g. \"lab:0\" and \"lab:1\")");
  link_name_ = dev_name_.substr(0, colon);
  std::string port = dev_name_.substr(colon + 1);
  if (port != "0" && port != "1") return fail(EINVAL, "port \"" + port + "\" in \"" + dev_name_ + "\" must be 0 or 1");
  port_ = port[0] - '0';
  peer_ = 1 - port_;
  if (link_name_.size() > 200) return fail(ENAMETOOLONG, "link name is longer than 200 characters");
  for (unsigned char c : link_name_) {
    if (!(std::isalnum(c) || c == '_' || c == '-' || c == '.'))
      return fail(EINVAL, "link name \"" + link_name_ + "\" may only hold letters, digits, '_', '-' and '.'");
  }
  shm_name_ = std::string(kShmPrefix) + link_name_;

  int rc = parse_params();
  if (rc < 0) return rc;
  rc = attach();
  if (rc < 0) return rc;

  uint32_t h = fnv1a32(link_name_);
  mac_[0] = 0x02;  // locally administered, unicast
  mac_[1] = 0x00;
  mac_[2] = 0x00;
  mac_[3] = static_cast<uint8_t>(h >> 8);
  mac_[4] = static_cast<uint8_t>(h);
  mac_[5] = static_cast<uint8_t>(port_);

  if (inject_) {
    for (uint32_t q = 0; q < queues_; ++q) txq_[q].held.resize(slot_size_);
  }

  char msg[256];
  std::snprintf(msg, sizeof msg, "%s segment %s (%u queue(s) of %u slots x %u bytes per direction), peer %s",
                created_ ? "created" : "joined", shm_name_.c_str(), queues_, ring_, slot_size_,
                hdr_->port[peer_].present.load(std::memory_order_acquire) ? "present" : "absent");
  log(UFAB_LOG_INFO, msg);
  if (inject_) {
    std::snprintf(msg, sizeof msg, "fault injection on TX: loss=%g dup=%g reorder=%g corrupt=%g seed=%" PRIu64,
                  faults_.loss, faults_.dup, faults_.reorder, faults_.corrupt, faults_.seed);
    log(UFAB_LOG_WARN, msg);
  }
  return 0;
}

// ------------------------------------------------------------------ segment

bool SwNic::lock_segment(Clock::time_point deadline) {
  for (;;) {
    if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) {
      locked_ = true;
      return true;
    }
    if (errno != EWOULDBLOCK && errno != EINTR) return false;
    if (Clock::now() > deadline) return false;
    ::usleep(100);
  }
}

void SwNic::unlock_segment() {
  if (locked_) ::flock(fd_, LOCK_UN);
  locked_ = false;
}

int SwNic::map_segment(size_t size) {
  unmap_segment();
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd_, 0);
  if (p == MAP_FAILED)
    return fail(errno, "mmap of " + std::to_string(size) + " bytes of " + shm_name_ + " failed: " + errno_text(errno));
  map_ = p;
  map_size_ = size;
  hdr_ = header_of(p);
  return 0;
}

void SwNic::unmap_segment() {
  if (map_) ::munmap(map_, map_size_);
  map_ = nullptr;
  map_size_ = 0;
  hdr_ = nullptr;
}

int SwNic::attach() {
  const auto deadline = Clock::now() + kLockTimeout;
  if (stale_reset_) {
    if (::shm_unlink(shm_name_.c_str()) == 0)
      log(UFAB_LOG_WARN, "stale=reset: removed the existing segment " + shm_name_ +
                             " (a peer still attached to it is now disconnected)");
  }
  bool uninit_seen = false;
  Clock::time_point uninit_since{};
  for (int attempt = 0;; ++attempt) {
    if (attempt > 0) {
      if (Clock::now() > deadline)
        return fail(ETIMEDOUT, "could not attach to " + shm_name_ +
                                   " within 3 s (segment keeps changing or stays uninitialised); if no "
                                   "process uses link \"" +
                                   link_name_ + "\", open with stale=reset");
      ::usleep(200);
    }
    created_ = false;
    int fd = ::shm_open(shm_name_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd >= 0) {
      created_ = true;
    } else if (errno == EEXIST) {
      fd = ::shm_open(shm_name_.c_str(), O_RDWR | O_CLOEXEC, 0);
      if (fd < 0) {
        if (errno == ENOENT) continue;  // unlinked by its last user meanwhile
        return fail(errno, "shm_open(" + shm_name_ + ") failed: " + errno_text(errno) +
                               (errno == EACCES ? " (the segment belongs to another user)" : ""));
      }
    } else {
      return fail(errno, "shm_open(" + shm_name_ + ", O_CREAT) failed: " + errno_text(errno) +
                             "; is /dev/shm mounted and writable?");
    }
    fd_ = fd;
    int rc = join(created_, deadline, uninit_seen, uninit_since);
    unlock_segment();
    if (rc == 0) return 0;
    unmap_segment();
    ::close(fd_);
    fd_ = -1;
    if (rc < 0) return rc;
  }
}

int SwNic::join(bool created, Clock::time_point deadline, bool& uninit_seen, Clock::time_point& uninit_since) {
  if (!lock_segment(deadline))
    return fail(ETIMEDOUT, "timed out after 3 s waiting for the lock of " + shm_name_ +
                               " (another process holds it: hung in open or close?)");
  struct stat st;
  if (::fstat(fd_, &st) != 0) return fail(errno, "fstat(" + shm_name_ + ") failed: " + errno_text(errno));
  bool initialised = false;
  if (static_cast<uint64_t>(st.st_size) >= kHeaderBytes) {
    int rc = map_segment(kHeaderBytes);
    if (rc < 0) return rc;
    uint32_t magic = hdr_->magic.load(std::memory_order_acquire);
    if (magic == kDeadMagic) return kRetry;  // its last user closed it; the name is gone or going
    initialised = magic == kMagic;
  }
  if (!initialised) {
    if (!created) {
      // The creator takes the lock right after creating the object and
      // holds it until the magic is written. We hold the lock and see no
      // magic: either the creator has not reached flock yet, or it died.
      auto now = Clock::now();
      if (!uninit_seen) {
        uninit_seen = true;
        uninit_since = now;
        return kRetry;
      }
      if (now - uninit_since < kInitGrace) return kRetry;
      int32_t creator = hdr_ ? hdr_->creator_pid.load(std::memory_order_relaxed) : 0;
      log(UFAB_LOG_WARN, "segment " + shm_name_ + " was never initialised by its creator" +
                             (creator > 0 ? " (pid " + std::to_string(creator) + ")" : std::string()) +
                             ", which must have died: initialising it");
    }
    int rc = initialise_segment();
    if (rc < 0) return rc;
  }
  return register_port();
}

int SwNic::initialise_segment() {
  Layout l = make_layout(ring_param_, slot_param_, queues_param_);
  if (::ftruncate(fd_, static_cast<off_t>(l.total_size)) != 0)
    return fail(errno, "sizing " + shm_name_ + " to " + std::to_string(l.total_size) + " bytes failed: " +
                           errno_text(errno) + " (is /dev/shm full? try a smaller ring, slot_size or fewer queues)");
  int rc = map_segment(kHeaderBytes);
  if (rc < 0) return rc;
  SegHeader* h = hdr_;
  // Nobody else uses the segment while we hold the lock and there is no
  // magic: plain stores suffice; the magic's release store publishes them.
  std::memset(static_cast<void*>(h), 0, kHeaderBytes);
  h->version = kVersion;
  h->ring = l.ring;
  h->slot_size = l.slot_size;
  h->stride = l.stride;
  h->total_size = l.total_size;
  h->slots_offset[0] = l.slots_offset[0];
  h->slots_offset[1] = l.slots_offset[1];
  h->queues = l.queues;
  h->ring_bytes = l.ring_bytes;
  h->creator_pid.store(static_cast<int32_t>(::getpid()), std::memory_order_relaxed);
  h->refs.store(0, std::memory_order_relaxed);
  h->magic.store(kMagic, std::memory_order_release);
  return 0;
}

int SwNic::register_port() {
  SegHeader* h = hdr_;
  // Read the geometry once and check it: the segment may have been written
  // by a buggy or hostile process.
  uint32_t version = h->version;
  uint32_t ring = h->ring;
  uint32_t slot_size = h->slot_size;
  uint32_t queues = h->queues;
  if (version != kVersion)
    return fail(EPROTO, shm_name_ + " has layout version " + std::to_string(version) + ", this swnic speaks " +
                            std::to_string(kVersion) + "; both ends must run the same swnic, or open with stale=reset");
  std::string fix = "; remove it (rm /dev/shm" + shm_name_ + ") or open with stale=reset";
  if (!layout_params_valid(ring, slot_size, queues))
    return fail(EPROTO, shm_name_ + " is corrupt (ring=" + std::to_string(ring) + ", slot_size=" +
                            std::to_string(slot_size) + ", queues=" + std::to_string(queues) + ")" + fix);
  Layout l = make_layout(ring, slot_size, queues);
  if (h->stride != l.stride || h->total_size != l.total_size || h->slots_offset[0] != l.slots_offset[0] ||
      h->slots_offset[1] != l.slots_offset[1] || h->ring_bytes != l.ring_bytes)
    return fail(EPROTO, shm_name_ + " is corrupt (its layout does not follow from ring, slot_size and queues)" + fix);
  struct stat st;
  if (::fstat(fd_, &st) != 0) return fail(errno, "fstat(" + shm_name_ + ") failed: " + errno_text(errno));
  if (static_cast<uint64_t>(st.st_size) < l.total_size)
    return fail(EPROTO, shm_name_ + " is " + std::to_string(st.st_size) + " bytes, its header says " +
                            std::to_string(l.total_size) + fix);
  if (ring_given_ && ring != ring_param_)
    return fail(EINVAL, "link \"" + link_name_ + "\" exists with ring=" + std::to_string(ring) + ", but ring=" +
                            std::to_string(ring_param_) + " was asked: both ends must agree (or leave ring unset)");
  if (slot_given_ && slot_size != slot_param_)
    return fail(EINVAL, "link \"" + link_name_ + "\" exists with slot_size=" + std::to_string(slot_size) +
                            ", but slot_size=" + std::to_string(slot_param_) +
                            " was asked: both ends must agree (or leave slot_size unset)");
  if (queues_given_ && queues != queues_param_)
    return fail(EINVAL, "link \"" + link_name_ + "\" exists with queues=" + std::to_string(queues) +
                            ", but queues=" + std::to_string(queues_param_) +
                            " was asked: both ends must agree (the first port to open sets it; give the same "
                            "queues= to both, or leave it unset on the second)");
  int rc = map_segment(l.total_size);
  if (rc < 0) return rc;
  h = hdr_;

  // Reclaim ports whose process died without closing.
  for (int p = 0; p < 2; ++p) {
    PortState& ps = h->port[p];
    if (!check_pids_ || !ps.present.load(std::memory_order_acquire)) continue;
    int32_t pid = ps.pid.load(std::memory_order_relaxed);
    if (process_alive(pid, ps.start_time.load(std::memory_order_relaxed))) continue;
    log(UFAB_LOG_WARN, "port " + link_name_ + ":" + std::to_string(p) + " was held by pid " + std::to_string(pid) +
                           ", which is gone: reclaiming it");
    ps.present.store(0, std::memory_order_release);
    ps.pid.store(0, std::memory_order_relaxed);
  }
  PortState& me = h->port[port_];
  if (me.present.load(std::memory_order_acquire))
    return fail(EBUSY, dev_name_ + " is already open (pid " + std::to_string(me.pid.load()) +
                           "); each port may be opened once; the other end is " + link_name_ + ":" +
                           std::to_string(peer_));

  bool peer_present = h->port[peer_].present.load(std::memory_order_acquire) != 0;
  uint32_t refs = h->refs.load(std::memory_order_relaxed);
  uint32_t expected = peer_present ? 1 : 0;
  if (refs != expected)
    log(UFAB_LOG_WARN,
        "segment " + shm_name_ + " counted " + std::to_string(refs) + " users but " + std::to_string(expected) +
            " live port(s) remain: " + (expected == 0 ? "reinitialising its rings" : "fixing the count"));

  queues_ = queues;
  ring_ = ring;
  mask_ = ring - 1;
  slot_size_ = slot_size;
  stride_ = l.stride;
  txq_.reset(new TxQueue[queues]);
  rxq_.reset(new RxQueue[queues]);
  prod_.reset(new Producers[queues]);
  uint8_t* base = static_cast<uint8_t*>(map_);
  for (uint32_t q = 0; q < queues; ++q) {
    tsan_tx_key_[q] = tsan_ring_key(st.st_dev, st.st_ino, port_, q);
    rxq_[q].tsan_key = tsan_ring_key(st.st_dev, st.st_ino, peer_, q);
    tx_ctl_[q] = ring_ctl_of(map_, port_, q);
    tx_slots_[q] = base + l.slots_offset[port_] + q * l.ring_bytes;
    rxq_[q].ctl = ring_ctl_of(map_, peer_, q);
    rxq_[q].slots = base + l.slots_offset[peer_] + q * l.ring_bytes;
  }

  if (!peer_present) {
    // Nobody else is attached: start every ring from a clean state,
    // whatever a crashed predecessor left behind.
    for (int dir = 0; dir < 2; ++dir) {
      for (uint32_t q = 0; q < queues; ++q) {
        RingCtl* c = ring_ctl_of(map_, dir, q);
        c->head.store(0, std::memory_order_relaxed);
        c->tail.store(0, std::memory_order_relaxed);
        c->waiting.store(0, std::memory_order_relaxed);
        c->wake_seq.store(0, std::memory_order_relaxed);
        c->inj_loss.store(0, std::memory_order_relaxed);
        c->inj_dup.store(0, std::memory_order_relaxed);
        c->inj_reorder.store(0, std::memory_order_relaxed);
        c->inj_corrupt.store(0, std::memory_order_relaxed);
      }
    }
    h->steer[peer_].store(0, std::memory_order_relaxed);
  }
  // Our receive steering starts as UFAB_STEER_NONE, whatever an earlier
  // holder of this port asked for.
  h->steer[port_].store(0, std::memory_order_release);
  // We are the only consumer of our RX rings: drop what was queued for an
  // earlier holder of this port, and start from the producers' position.
  for (uint32_t q = 0; q < queues; ++q) {
    RxQueue& r = rxq_[q];
    uint64_t head = r.ctl->head.load(std::memory_order_acquire);
    r.ctl->tail.store(head, std::memory_order_release);
    r.ctl->waiting.store(0, std::memory_order_relaxed);
    r.tail = head;
    r.head_cache = head;
    r.loss_base = r.ctl->inj_loss.load(std::memory_order_relaxed);
    // And the only producer of the peer's rings: continue where they stand.
    uint64_t out = tx_ctl_[q]->head.load(std::memory_order_relaxed);
    prod_[q].reserved.store(out, std::memory_order_relaxed);
    prod_[q].committed.store(out, std::memory_order_relaxed);
    uint64_t tail = tx_ctl_[q]->tail.load(std::memory_order_acquire);
    if (out - tail > ring_) tail = out - ring_;  // checked again on use
    for (uint32_t t = 0; t < queues; ++t) txq_[t].tail_cache[q] = tail;
  }

  me.pid.store(static_cast<int32_t>(::getpid()), std::memory_order_relaxed);
  me.start_time.store(proc_start_time(::getpid()), std::memory_order_relaxed);
  me.present.store(1, std::memory_order_release);
  h->refs.store(expected + 1, std::memory_order_release);
  registered_ = true;
  return 0;
}

void SwNic::unlink_if_ours() {
  // glibc keeps shm objects in /dev/shm. Unlink the name only while it
  // still names our object, not a newer segment created after a reset.
  struct stat mine, named;
  std::string path = "/dev/shm" + shm_name_;
  if (::fstat(fd_, &mine) == 0 && ::stat(path.c_str(), &named) == 0 &&
      (mine.st_ino != named.st_ino || mine.st_dev != named.st_dev))
    return;
  ::shm_unlink(shm_name_.c_str());
}

void SwNic::detach() {
  if (fd_ < 0) return;
  if (registered_ && hdr_) {
    bool locked = lock_segment(Clock::now() + kLockTimeout);
    if (!locked) log(UFAB_LOG_WARN, "closing without the segment's lock (held by a hung process?)");
    SegHeader* h = hdr_;
    PortState& me = h->port[port_];
    me.present.store(0, std::memory_order_release);
    me.pid.store(0, std::memory_order_relaxed);
    me.start_time.store(0, std::memory_order_relaxed);
    // A peer that was killed never cleared its mark: count it as gone, so
    // the segment does not outlive both processes.
    PortState& peer = h->port[peer_];
    uint32_t left = peer.present.load(std::memory_order_acquire) &&
                            process_alive(peer.pid.load(std::memory_order_relaxed),
                                          peer.start_time.load(std::memory_order_relaxed))
                        ? 1
                        : 0;
    h->refs.store(left, std::memory_order_release);
    if (left == 0) {
      h->magic.store(kDeadMagic, std::memory_order_release);
      unlink_if_ours();
    }
    registered_ = false;
    unlock_segment();
  }
  unmap_segment();
  ::close(fd_);
  fd_ = -1;
}

SwNic::~SwNic() {
  for (uint32_t q = 0; rxq_ && q < queues_; ++q) stop_irq(rxq_[q]);
  if (registered_ && inject_) {
    uint64_t loss = 0, dup = 0, reorder = 0, corrupt = 0;
    for (uint32_t q = 0; q < queues_; ++q) {
      loss += txq_[q].loss.load();
      dup += txq_[q].dup.load();
      reorder += txq_[q].reorder.load();
      corrupt += txq_[q].corrupt.load();
    }
    char msg[256];
    std::snprintf(msg, sizeof msg,
                  "fault injection summary: %" PRIu64 " lost, %" PRIu64 " duplicated, %" PRIu64 " reordered, %" PRIu64
                  " corrupted",
                  loss, dup, reorder, corrupt);
    log(UFAB_LOG_INFO, msg);
  }
  detach();
}

// --------------------------------------------------------------- control

int SwNic::no_queue(const char* dir, uint16_t queue) {
  return fail(EINVAL, std::string(dir) + " queue " + std::to_string(queue) + " does not exist: link \"" + link_name_ +
                          "\" has queues=" + std::to_string(queues_) + " (queues 0.." + std::to_string(queues_ - 1) +
                          "); for more, open both ends with queues=N (up to " + std::to_string(kMaxQueues) + ")");
}

int SwNic::info(ufab_dev_info* out) {
  *out = ufab_dev_info{};
  std::memcpy(out->mac, mac_, 6);
  out->max_rx_queues = static_cast<uint16_t>(queues_);
  out->max_tx_queues = static_cast<uint16_t>(queues_);
  uint16_t r = static_cast<uint16_t>(std::min<uint32_t>(ring_, 32768));
  out->min_ring_size = r;
  out->max_ring_size = r;
  out->mtu = 1500;
  out->max_mtu = slot_size_ - 18;  // Ethernet header and one VLAN tag; no FCS on this wire
  out->caps = UFAB_DEV_CAP_RX_IRQ | UFAB_DEV_CAP_LOOPBACK;
  std::snprintf(out->model, sizeof out->model, "shared-memory pair (swnic)");
  return 0;
}

int SwNic::link(ufab_link* out) {
  *out = ufab_link{};
  const PortState& p = hdr_->port[peer_];
  bool up = p.present.load(std::memory_order_acquire) &&
            (!check_pids_ ||
             process_alive(p.pid.load(std::memory_order_relaxed), p.start_time.load(std::memory_order_relaxed)));
  out->up = up ? 1 : 0;
  out->speed_mbps = 0;  // a memory copy has no line rate
  out->full_duplex = 1;
  return 0;
}

int SwNic::rx_queue_setup(uint16_t queue, const ufab_queue_conf* conf) {
  if (queue >= queues_) return no_queue("RX", queue);
  if (started_.load()) return fail(EBUSY, "set up queues before start() or after stop()");
  if (!conf || !conf->pool) return fail(EINVAL, "RX queue " + std::to_string(queue) + " needs a buffer pool");
  rxq_[queue].pool = conf->pool;
  return 0;
}

int SwNic::tx_queue_setup(uint16_t queue, const ufab_queue_conf* conf) {
  if (queue >= queues_) return no_queue("TX", queue);
  (void)conf;  // the ring is the segment's ("ring" parameter), shared by both ends
  if (started_.load()) return fail(EBUSY, "set up queues before start() or after stop()");
  txq_[queue].ready = true;
  return 0;
}

int SwNic::start() {
  if (!rxq_[0].pool) return fail(EINVAL, "start() before rx_queue_setup(0): RX needs a buffer pool");
  if (!txq_[0].ready) return fail(EINVAL, "start() before tx_queue_setup(0)");
  if (steer_mode_ != UFAB_STEER_NONE) {
    for (uint32_t q = 0; q < steer_n_; ++q) {
      if (!rxq_[q].pool)
        return fail(EINVAL, "rx_steer spreads frames over " + std::to_string(steer_n_) + " RX queues, but RX queue " +
                                std::to_string(q) + " is not set up: call rx_queue_setup(" + std::to_string(q) +
                                ") before start(), or steer over fewer queues");
    }
  }
  bool single = true;
  for (uint32_t q = 1; q < queues_; ++q) single = single && !txq_[q].ready;
  single_producer_.store(single, std::memory_order_relaxed);
  started_.store(true);
  return 0;
}

int SwNic::stop() {
  started_.store(false);
  return 0;
}

int SwNic::set_promiscuous(int) { return 0; }  // swnic delivers every frame anyway

// Steering is the receiver's choice but the sender's work: the sender
// writes each frame straight into the RX ring it belongs to. The rule goes
// into the segment, where the peer's tx_burst reads it once per burst.
int SwNic::rx_steer(uint32_t mode, uint16_t nqueues) {
  if (started_.load()) return fail(EBUSY, "rx_steer before start() or after stop()");
  if (mode != UFAB_STEER_NONE && mode != UFAB_STEER_ROCE_QPN)
    return fail(EINVAL, "unknown steering mode " + std::to_string(mode) +
                            " (swnic knows UFAB_STEER_NONE=0 and UFAB_STEER_ROCE_QPN=1)");
  if (mode == UFAB_STEER_NONE) {
    nqueues = 1;
  } else if (nqueues < 1 || nqueues > queues_) {
    return fail(EINVAL, "rx_steer over " + std::to_string(nqueues) + " RX queues, but link \"" + link_name_ +
                            "\" has queues=" + std::to_string(queues_) + ": steer over 1.." + std::to_string(queues_) +
                            ", or open both ends with queues=" + std::to_string(std::max<uint32_t>(nqueues, 1)) +
                            " (up to " + std::to_string(kMaxQueues) + ")");
  }
  steer_mode_ = mode;
  steer_n_ = nqueues;
  hdr_->steer[port_].store(steer_word(mode, nqueues), std::memory_order_release);
  return 0;
}

// The peer's steering rule, checked (the peer is not trusted): 0, send
// everything to queue 0, unless it names a known rule over 2..queues_.
uint32_t SwNic::peer_steering() const {
  uint32_t w = hdr_->steer[peer_].load(std::memory_order_relaxed);
  uint32_t n = steer_nqueues(w);
  return steer_mode(w) == UFAB_STEER_ROCE_QPN && n >= 2 && n <= queues_ ? w : 0;
}

int SwNic::stats(ufab_stats* out) {
  *out = ufab_stats{};
  for (uint32_t q = 0; q < queues_; ++q) {
    const RxQueue& r = rxq_[q];
    const TxQueue& t = txq_[q];
    out->rx_packets += r.packets.load(std::memory_order_relaxed);
    out->rx_bytes += r.bytes.load(std::memory_order_relaxed);
    out->rx_errors += r.errors.load(std::memory_order_relaxed);
    out->irqs += r.irqs.load(std::memory_order_relaxed);
    // Frames the peer's fault injection dropped on their way to us. swnic
    // itself never drops: a full ring or an empty pool holds the sender back.
    out->rx_dropped += r.ctl->inj_loss.load(std::memory_order_relaxed) - r.loss_base;
    out->tx_packets += t.packets.load(std::memory_order_relaxed);
    out->tx_bytes += t.bytes.load(std::memory_order_relaxed);
    out->tx_errors += t.errors.load(std::memory_order_relaxed);
  }
  return 0;
}

// ------------------------------------------------------------------- TX
//
// Several TX queues of one port may feed one RX ring of the peer (steering
// decides per frame). Of the two ways to allow it, one SPSC ring per (TX
// queue, RX queue) pair would need queues^2 rings per direction (256 at 16
// queues: over a GiB of /dev/shm at the default ring and slot size) and an
// rx_burst that polls up to 16 rings. So each RX queue has one ring, and
// the TX queues that feed it agree in this process's memory (Producers):
// a TX queue takes a run of slots with one compare-and-swap on `reserved`,
// writes them, waits for its turn (`committed` reaching its first slot:
// runs taken earlier are published), then publishes by storing the ring's
// head. In the segment every ring stays single-producer/single-consumer:
// the receiver reads one head and the frames below it are complete, and a
// hostile peer writing to the segment cannot make our TX queues wait on
// each other. A TX queue waits only while another is between taking and
// publishing a run (a memcpy of at most a burst), and holds at most one
// run while it waits, so the waits end.
//
// With TX queue 0 alone set up (single_producer_, the one-queue case) the
// compare-and-swap and the turn are skipped: the path is the one-producer
// ring it always was.

// The frames of one TX call, as the TX paths below see them: a frame's
// length, its first bytes (the headers steering reads), whether it is well
// formed, a copy of it, and the release of the frames taken. tx_burst
// brings buffers, tx_burst_gather segment lists (the payload read where it
// lies: one copy, into the peer's ring), a held-back frame its bytes.
struct BufFrames {
  ufab_buf** bufs;
  uint32_t len(int i) const { return bufs[i]->len; }
  const uint8_t* head(int i) const { return bufs[i]->base + bufs[i]->offset; }
  uint32_t head_len(int i) const { return bufs[i]->len; }
  bool valid(int i) const {
    const ufab_buf* b = bufs[i];
    return b->len != 0 && b->offset <= b->capacity && b->len <= b->capacity - b->offset;
  }
  void copy(int i, uint8_t* to) const { std::memcpy(to, head(i), len(i)); }
  void release(const ufab_host_ops* ops, ufab_host* host, int n) const {
    if (n) ops->buf_free(host, bufs, static_cast<uint32_t>(n));
  }
};

struct SegFrames {
  const ufab_tx_frame* frames;
  uint32_t len(int i) const { return frames[i].len; }
  const uint8_t* head(int i) const { return frames[i].segs[0].va; }
  uint32_t head_len(int i) const { return frames[i].segs[0].len; }
  bool valid(int i) const {
    const ufab_tx_frame& f = frames[i];
    if (f.nsegs == 1) return f.buf != nullptr && f.len != 0 && f.segs[0].len == f.len && f.segs[0].va != nullptr;
    if (f.nsegs < 1 || f.nsegs > UFAB_TX_SEGS_MAX || f.buf == nullptr) return false;
    uint64_t sum = 0;
    for (uint32_t k = 0; k < f.nsegs; ++k) {
      if (f.segs[k].len == 0 || f.segs[k].va == nullptr) return false;
      sum += f.segs[k].len;
    }
    return sum == f.len;
  }
  void copy(int i, uint8_t* to) const {
    const ufab_tx_frame& f = frames[i];
    if (f.nsegs == 1) {
      std::memcpy(to, f.segs[0].va, f.len);  // a frame built in its buffer (every ACK)
      return;
    }
    for (uint32_t k = 0; k < f.nsegs; ++k) {
      std::memcpy(to, f.segs[k].va, f.segs[k].len);
      to += f.segs[k].len;
    }
  }
  void release(const ufab_host_ops* ops, ufab_host* host, int n) const {
    ufab_buf* bufs[64];
    for (int i = 0; i < n;) {
      uint32_t k = 0;
      while (k < 64 && i < n) bufs[k++] = frames[i++].buf;
      ops->buf_free(host, bufs, k);
    }
  }
};

struct RawFrame {
  const uint8_t* data;
  uint32_t length;
  uint32_t len(int) const { return length; }
  void copy(int, uint8_t* to) const { std::memcpy(to, data, length); }
};

template <typename Frames>
void SwNic::write_slot(uint32_t q, uint64_t index, const Frames& f, int i, bool flip, uint64_t bit_draw) {
  uint8_t* s = tx_slot(q, index);
  const uint32_t len = f.len(i);
  f.copy(i, s + kSlotHeader);
  if (flip) {
    uint32_t bit = corrupt_bit(len, bit_draw);
    s[kSlotHeader + bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
  }
  __atomic_store_n(reinterpret_cast<uint32_t*>(s), len, __ATOMIC_RELAXED);
}

// Takes between `at_least` and `want` consecutive slots of the peer's RX
// ring q; returns how many (0: not enough room), or a negative errno when
// the consumer's index is inconsistent. *first is the first slot's index.
int SwNic::reserve(TxQueue& t, uint32_t q, uint32_t want, uint64_t* first, uint32_t at_least) {
  Producers& p = prod_[q];
  uint64_t head = p.reserved.load(std::memory_order_relaxed);
  for (;;) {
    uint64_t used = head - t.tail_cache[q];  // an old tail only overstates it
    if (used > ring_ || ring_ - used < want) {
      uint64_t tail = tx_ctl_[q]->tail.load(std::memory_order_acquire);
      tsan_acquire(tsan_tx_key_[q]);
      // Read after the tail, `reserved` is never behind it: the consumer
      // published that tail after seeing a head we had reserved past.
      head = p.reserved.load(std::memory_order_relaxed);
      used = head - tail;
      if (used > ring_) {
        bump(t.errors);
        return fail(EIO, "the peer's consumer index (" + std::to_string(tail) + ") of RX ring " + std::to_string(q) +
                             " is inconsistent with ours (" + std::to_string(head) + "): segment " + shm_name_ +
                             " is corrupt; reopen both ends");
      }
      t.tail_cache[q] = tail;
    }
    uint64_t room = ring_ - used;
    if (room < at_least || room == 0) return 0;
    uint64_t take = std::min<uint64_t>(want, room);
    if (single_producer_.load(std::memory_order_relaxed)) {
      p.reserved.store(head + take, std::memory_order_relaxed);
    } else if (!p.reserved.compare_exchange_weak(head, head + take, std::memory_order_relaxed,
                                                 std::memory_order_relaxed)) {
      continue;  // another TX queue took slots: `head` is reloaded
    }
    *first = head;
    return static_cast<int>(take);
  }
}

// Publishes slots [first, end) of the peer's RX ring q, written by the
// caller, once every run taken before them is published; then wakes the
// receiver if it armed its interrupt.
void SwNic::commit(uint32_t q, uint64_t first, uint64_t end) {
  Producers& p = prod_[q];
  if (!single_producer_.load(std::memory_order_relaxed)) {
    for (uint32_t spins = 0; p.committed.load(std::memory_order_acquire) != first; ++spins) {
      if (spins >= 128) {
        sched_yield();  // the TX queue before us may have lost its CPU
      } else {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
      }
    }
  }
  RingCtl* c = tx_ctl_[q];
  tsan_release(tsan_tx_key_[q]);
  // seq_cst also orders the store before the load of `waiting` below.
  c->head.store(end, std::memory_order_seq_cst);
  // After the head store, so the next TX queue's store of head follows ours.
  p.committed.store(end, std::memory_order_release);
  // Pairs with the consumer's seq_cst store of `waiting` and load of `head`
  // (store-buffer pattern): either it sees our new head, or we see its flag.
  if (c->waiting.load(std::memory_order_seq_cst) && c->waiting.exchange(0, std::memory_order_acq_rel)) {
    c->wake_seq.fetch_add(1, std::memory_order_release);
    futex(&c->wake_seq, FUTEX_WAKE, 1, nullptr);
  }
}

template <typename Frames>
int SwNic::tx_drop_link_down(TxQueue& t, const Frames& f, uint16_t n) {
  // No receiver: frames go nowhere, as on a cable with no far end.
  bump(t.errors, n + (t.held_copies ? 1 : 0));
  t.held_copies = 0;
  f.release(ops_, host_, n);
  return n;
}

int SwNic::tx_burst(uint16_t queue, ufab_buf** bufs, uint16_t n) {
  return tx_frames(queue, BufFrames{bufs}, n, "tx_burst");
}

// Gather transmit (abi/raw_frame.h, ABI 1.3): the segments are copied
// straight into the peer's ring slot, so a payload is copied once on its
// way from the sender's memory region to the receiver's RX buffer.
int SwNic::tx_burst_gather(uint16_t queue, const ufab_tx_frame* frames, uint16_t n) {
  return tx_frames(queue, SegFrames{frames}, n, "tx_burst_gather");
}

template <typename Frames>
int SwNic::tx_frames(uint16_t queue, const Frames& f, uint16_t n, const char* what) {
  if (queue >= queues_) return no_queue("TX", queue);
  TxQueue& t = txq_[queue];
  if (!started_.load(std::memory_order_relaxed)) return fail(ENETDOWN, std::string(what) + " before start()");
  if (!t.ready) return fail(EINVAL, "TX queue " + std::to_string(queue) + " is not set up: call tx_queue_setup first");
  if (!hdr_->port[peer_].present.load(std::memory_order_relaxed)) return tx_drop_link_down(t, f, n);

  const uint32_t steer = peer_steering();  // 0: every frame to the peer's RX queue 0
  int taken = 0;
  int err = 0;  // a corrupt consumer index seen mid-burst
  if (inject_) {
    taken = tx_burst_faults(t, steer, f, n, &err);
  } else if (steer == 0 && single_producer_.load(std::memory_order_relaxed)) {
    taken = tx_burst_single(t, f, n, &err);
  } else {
    uint64_t bytes = 0, sent = 0, errors = 0;
    while (taken < n) {
      if (!frame_fits(f, taken)) {
        ++errors;  // cannot go on this wire: dropped, counted
        ++taken;
        continue;
      }
      // A run of frames bound for one RX queue: one reservation, one
      // publication (the whole burst when nothing steers).
      uint32_t q = steer ? target_queue(steer, f, taken) : 0;
      int end = taken + 1;
      while (end < n && frame_fits(f, end) && (steer == 0 || target_queue(steer, f, end) == q)) ++end;
      uint64_t first = 0;
      int got = reserve(t, q, static_cast<uint32_t>(end - taken), &first, 1);
      if (got < 0) {
        err = got;
        break;
      }
      for (int k = 0; k < got; ++k) {
        write_slot(q, first + static_cast<uint64_t>(k), f, taken + k, false, 0);
        bytes += f.len(taken + k);
      }
      if (got) commit(q, first, first + static_cast<uint64_t>(got));
      sent += static_cast<uint64_t>(got);
      taken += got;
      if (taken < end) break;  // ring q full: the caller keeps the rest
    }
    if (sent) {
      bump(t.packets, sent);
      bump(t.bytes, bytes);
    }
    if (errors) bump(t.errors, errors);
  }
  f.release(ops_, host_, taken);
  // Frames written before the error are published and reported as taken.
  return taken == 0 && err < 0 ? err : taken;
}

// The one-queue case (nothing steers, TX queue 0 alone): every frame to
// the peer's RX ring 0 in one pass, checked and written as it comes, one
// publication per burst.
template <typename Frames>
int SwNic::tx_burst_single(TxQueue& t, const Frames& f, uint16_t n, int* err) {
  Producers& p = prod_[0];
  const uint64_t first = p.reserved.load(std::memory_order_relaxed);
  uint64_t head = first;
  uint64_t used = head - t.tail_cache[0];
  uint64_t free_slots = used > ring_ ? 0 : ring_ - used;  // 0: look at the tail first
  uint64_t bytes = 0, errors = 0;
  int taken = 0;
  for (; taken < n; ++taken) {
    if (!frame_fits(f, taken)) {
      ++errors;  // cannot go on this wire: dropped, counted
      continue;
    }
    if (free_slots == 0) {
      uint64_t tail = tx_ctl_[0]->tail.load(std::memory_order_acquire);
      tsan_acquire(tsan_tx_key_[0]);
      used = head - tail;
      if (used > ring_) {
        bump(t.errors);
        *err = fail(EIO, "the peer's consumer index (" + std::to_string(tail) +
                             ") of RX ring 0 is inconsistent with ours (" + std::to_string(head) + "): segment " +
                             shm_name_ + " is corrupt; reopen both ends");
        break;
      }
      t.tail_cache[0] = tail;
      free_slots = ring_ - used;
      if (free_slots == 0) break;  // ring full: the caller keeps the rest
    }
    write_slot(0, head++, f, taken, false, 0);
    --free_slots;
    bytes += f.len(taken);
  }
  if (head != first) {
    p.reserved.store(head, std::memory_order_relaxed);
    commit(0, first, head);
    bump(t.packets, head - first);
    bump(t.bytes, bytes);
  }
  if (errors) bump(t.errors, errors);
  return taken;
}

template <typename Frames>
int SwNic::tx_burst_faults(TxQueue& t, uint32_t steer, const Frames& f, uint16_t n, int* err) {
  uint64_t bytes = 0, sent = 0, errors = 0;
  uint64_t loss = 0, dup = 0, reorder = 0, corrupt = 0;
  int taken = 0;
  // All `copies` copies of a frame into RX ring q, or none: 1 done, 0 no
  // room, negative errno.
  auto emit = [&](uint32_t q, const auto& frames, int i, uint32_t copies, bool flip, uint64_t draw) -> int {
    uint64_t first = 0;
    int got = reserve(t, q, copies, &first, copies);
    if (got <= 0) return got;
    for (uint32_t c = 0; c < copies; ++c) write_slot(q, first + c, frames, i, flip, draw);
    commit(q, first, first + copies);
    sent += copies;
    bytes += uint64_t{frames.len(i)} * copies;
    return 1;
  };
  // The held copy is already corrupted if it was chosen to be. Without
  // room it stays held for a later burst.
  auto emit_held = [&]() -> int {
    int ok = emit(t.held_queue, RawFrame{t.held.data(), t.held_len}, 0, t.held_copies, false, 0);
    if (ok > 0) t.held_copies = 0;
    return ok;
  };
  // Shared per ring, so the receiver can report injected loss as rx_dropped.
  auto count = [&](std::atomic<uint64_t> RingCtl::*counter, uint32_t q) {
    (tx_ctl_[q]->*counter).fetch_add(1, std::memory_order_relaxed);
  };

  if (n == 0 && t.held_copies) {
    // tx_burst with no frames flushes a frame held back by reorder.
    int ok = emit_held();
    if (ok < 0) *err = ok;
  }
  for (; taken < n; ++taken) {
    if (!frame_fits(f, taken)) {
      ++errors;
      ++t.frame_index;
      continue;
    }
    const uint32_t len = f.len(taken);
    // Steered by the frame as sent (before any injected bit flip).
    uint32_t q = steer ? target_queue(steer, f, taken) : 0;
    FaultDecision d = decide_fault(faults_, t.frame_index);
    if (d.lose) {
      ++loss;
      count(&RingCtl::inj_loss, q);
      ++t.frame_index;
      continue;
    }
    uint32_t copies = d.dup ? 2 : 1;
    bool hold = d.hold && t.held_copies == 0;
    bool stop = false;
    if (hold) {
      f.copy(taken, t.held.data());
      if (d.corrupt) {
        uint32_t bit = corrupt_bit(len, d.bit_draw);
        t.held[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
      }
      t.held_len = len;
      t.held_copies = copies;
      t.held_queue = q;
      ++reorder;
      count(&RingCtl::inj_reorder, q);
    } else if (t.held_copies && t.held_queue == q) {
      // The frame, then the one held back behind it, in one run: both or
      // neither, so the held frame is exactly one place late.
      uint64_t first = 0;
      uint32_t all = copies + t.held_copies;
      int got = reserve(t, q, all, &first, all);
      if (got < 0) *err = got;
      if (got <= 0) break;  // not taken: the same decision is drawn again next time
      const RawFrame held{t.held.data(), t.held_len};
      for (uint32_t c = 0; c < copies; ++c) write_slot(q, first + c, f, taken, d.corrupt, d.bit_draw);
      for (uint32_t c = 0; c < t.held_copies; ++c) write_slot(q, first + copies + c, held, 0, false, 0);
      commit(q, first, first + all);
      sent += all;
      bytes += uint64_t{len} * copies + uint64_t{t.held_len} * t.held_copies;
      t.held_copies = 0;
    } else {
      // Held for another RX queue, if at all: order across queues means
      // nothing, so the held frame goes when its ring has room.
      int ok = emit(q, f, taken, copies, d.corrupt, d.bit_draw);
      if (ok < 0) *err = ok;
      if (ok <= 0) break;  // not taken: the same decision is drawn again next time
      if (t.held_copies) {
        int h = emit_held();
        if (h < 0) {
          *err = h;
          stop = true;  // this frame is taken; the held one waits
        }
      }
    }
    if (d.corrupt) {
      ++corrupt;
      count(&RingCtl::inj_corrupt, q);
    }
    if (d.dup) {
      ++dup;
      count(&RingCtl::inj_dup, q);
    }
    ++t.frame_index;
    if (stop) {
      ++taken;
      break;
    }
  }
  if (sent) {
    bump(t.packets, sent);
    bump(t.bytes, bytes);
  }
  if (errors) bump(t.errors, errors);
  if (loss | dup | reorder | corrupt) {
    bump(t.loss, loss);
    bump(t.dup, dup);
    bump(t.reorder, reorder);
    bump(t.corrupt, corrupt);
  }
  return taken;
}

// ------------------------------------------------------------------- RX

int SwNic::rx_burst(uint16_t queue, ufab_buf** bufs, uint16_t n) {
  if (queue >= queues_) return no_queue("RX", queue);
  RxQueue& r = rxq_[queue];
  if (!started_.load(std::memory_order_relaxed)) return fail(ENETDOWN, "rx_burst before start()");
  if (!r.pool) return fail(EINVAL, "RX queue " + std::to_string(queue) + " is not set up: call rx_queue_setup first");
  if (n == 0) return 0;

  uint64_t avail = r.head_cache - r.tail;
  if (avail == 0) {
    r.head_cache = r.ctl->head.load(std::memory_order_acquire);
    avail = r.head_cache - r.tail;
    if (avail == 0 && r.irq_on.load(std::memory_order_relaxed) && !r.arm_on_request.load(std::memory_order_relaxed)) {
      // Empty: arm before the caller sleeps, then look once more (the
      // producer may have published between the two loads).
      r.ctl->waiting.store(1, std::memory_order_seq_cst);
      r.head_cache = r.ctl->head.load(std::memory_order_seq_cst);
      avail = r.head_cache - r.tail;
    }
    if (avail == 0) return 0;
    if (avail > ring_) {
      bump(r.errors);
      uint64_t head = r.head_cache;
      r.head_cache = r.tail;
      return fail(EIO, "the peer's producer index (" + std::to_string(head) + ") is more than a ring ahead of ours (" +
                           std::to_string(r.tail) + "): segment " + shm_name_ + " is corrupt; reopen both ends");
    }
    tsan_acquire(r.tsan_key);
  }
  uint32_t want = static_cast<uint32_t>(std::min<uint64_t>(avail, n));
  int got = ops_->buf_alloc(host_, r.pool, bufs, want);
  if (got <= 0) {
    // No buffers: the frames wait in the ring. In interrupt mode keep the
    // fd readable, or a caller that sleeps now would never be woken for them.
    if (got == 0 && r.irq_on.load(std::memory_order_relaxed)) signal_irq(r);
    return got;
  }

  int delivered = 0;
  uint64_t consumed = 0, bytes = 0, errors = 0;
  while (delivered < got && consumed < avail) {
    const uint8_t* s = rx_slot(r, r.tail + consumed);
    ++consumed;
    // Read the length once, then only use the copy: the peer may rewrite it.
    uint32_t len = __atomic_load_n(reinterpret_cast<const uint32_t*>(s), __ATOMIC_RELAXED);
    ufab_buf* b = bufs[delivered];
    uint32_t room = b->capacity > b->offset ? b->capacity - b->offset : 0;
    if (len == 0 || len > slot_size_ || len > room) {
      ++errors;  // impossible length (peer bug or tamper) or larger than our buffer: dropped
      continue;
    }
    std::memcpy(b->base + b->offset, s + kSlotHeader, len);
    b->len = len;
    b->flags = 0;
    bytes += len;
    ++delivered;
  }
  r.tail += consumed;
  tsan_release(r.tsan_key);
  r.ctl->tail.store(r.tail, std::memory_order_release);
  if (delivered < got) ops_->buf_free(host_, bufs + delivered, static_cast<uint32_t>(got - delivered));
  if (delivered) {
    bump(r.packets, static_cast<uint64_t>(delivered));
    bump(r.bytes, bytes);
  }
  if (errors) bump(r.errors, errors);
  return delivered;
}

// ------------------------------------------------------------- interrupts
//
// Per RX queue: its own eventfd, futex word (in its ring's control block)
// and helper thread.

void SwNic::signal_irq(RxQueue& r) {
  // Counted first, so a caller woken by the write already sees it counted.
  r.irqs.fetch_add(1, std::memory_order_relaxed);
  uint64_t one = 1;
  // Fails only when the counter is about to overflow: readable anyway.
  [[maybe_unused]] ssize_t w = ::write(r.irq_fd, &one, sizeof one);
}

// Bridges the futex word in shared memory to an eventfd: a producer (in
// any process) bumps the word and FUTEX_WAKEs; this thread, in the
// receiver's process, turns each change into an eventfd write.
void SwNic::irq_helper(RxQueue& r, uint32_t last_seq) {
  const struct timespec timeout = {0, kHelperPollNs};
  while (!r.irq_stop.load(std::memory_order_acquire)) {
    futex(&r.ctl->wake_seq, FUTEX_WAIT, last_seq, &timeout);
    uint32_t seq = r.ctl->wake_seq.load(std::memory_order_acquire);
    if (seq == last_seq) continue;  // timeout, spurious, or our own stop wake-up
    last_seq = seq;
    signal_irq(r);
  }
}

int SwNic::rx_irq(uint16_t queue, int enable, int* eventfd) {
  if (queue >= queues_) return no_queue("RX", queue);
  RxQueue& r = rxq_[queue];
  if (!enable) {
    stop_irq(r);
    return 0;
  }
  if (r.irq_on.load()) {
    if (eventfd) *eventfd = r.irq_fd;
    return 0;
  }
  int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) return fail(errno, "eventfd failed: " + errno_text(errno));
  r.irq_fd = fd;
  r.irq_stop.store(false);
  // Take the word's value before arming, so a wake-up that follows the
  // arming changes it from what the helper waits on.
  uint32_t seq = r.ctl->wake_seq.load(std::memory_order_acquire);
  try {
    r.irq_thread = std::thread([this, &r, seq] { irq_helper(r, seq); });
  } catch (const std::system_error& e) {
    ::close(r.irq_fd);
    r.irq_fd = -1;
    return fail(EAGAIN, std::string("cannot start the interrupt helper thread: ") + e.what());
  }
  r.irq_on.store(true);
  r.ctl->waiting.store(1, std::memory_order_seq_cst);
  if (r.ctl->head.load(std::memory_order_seq_cst) != r.tail) signal_irq(r);  // frames already wait: readable at once
  if (eventfd) *eventfd = r.irq_fd;
  return 0;
}

int SwNic::rx_irq_arm(uint16_t queue) {
  if (queue >= queues_) return no_queue("RX", queue);
  RxQueue& r = rxq_[queue];
  if (!r.irq_on.load())
    return fail(EINVAL, "rx_irq_arm without the interrupt enabled: call rx_irq(" + std::to_string(queue) +
                            ", 1) first");
  r.arm_on_request.store(true, std::memory_order_relaxed);
  // As an empty rx_burst arms: the flag first, then one more look, since
  // a producer may have published between the caller's last poll and now.
  r.ctl->waiting.store(1, std::memory_order_seq_cst);
  if (r.ctl->head.load(std::memory_order_seq_cst) != r.tail) signal_irq(r);
  return 0;
}

void SwNic::stop_irq(RxQueue& r) {
  if (!r.irq_thread.joinable()) return;
  r.irq_on.store(false);
  r.arm_on_request.store(false, std::memory_order_relaxed);
  if (r.ctl) r.ctl->waiting.store(0, std::memory_order_seq_cst);
  r.irq_stop.store(true, std::memory_order_release);
  futex(&r.ctl->wake_seq, FUTEX_WAKE, INT32_MAX, nullptr);
  r.irq_thread.join();
  ::close(r.irq_fd);
  r.irq_fd = -1;
}

}  // namespace
}  // namespace ufab::swnic

const ufab_driver* ufab_swnic_driver() {
  static const ufab_driver d = ufab::sdk::make_driver<ufab::swnic::SwNic>(
      "swnic", "software NIC: two Ethernet ports joined over shared memory", nullptr, UFAB_DRIVER_F_SOFTWARE);
  return &d;
}
