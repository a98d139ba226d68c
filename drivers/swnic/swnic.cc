// swnic: two Ethernet ports joined over POSIX shared memory. See swnic.h,
// segment.h and docs/drivers/swnic.md.
#include "drivers/swnic/swnic.h"

#include <fcntl.h>
#include <linux/futex.h>
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

uint32_t fnv1a32(const std::string& s) {
  uint32_t h = 2166136261u;
  for (unsigned char c : s) {
    h ^= c;
    h *= 16777619u;
  }
  return h;
}

class SwNic {
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
  int stats(ufab_stats* out);
  int rx_irq(uint16_t queue, int enable, int* eventfd);
  int rx_irq_arm(uint16_t queue);
  int set_promiscuous(int enable);

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
  void log(int level, const std::string& msg);
  bool param_u64(const char* key, uint64_t* value, bool* given, int* rc);
  bool param_prob(const char* key, double* value, int* rc);

  uint8_t* tx_slot(uint64_t index) { return tx_slots_ + (index & mask_) * stride_; }
  uint8_t* rx_slot(uint64_t index) { return rx_slots_ + (index & mask_) * stride_; }
  void write_slot(uint64_t index, const uint8_t* data, uint32_t len, bool flip, uint64_t bit_draw);
  int refresh_tx_free(uint64_t* free_slots);
  void wake_peer_if_waiting();
  int tx_drop_link_down(ufab_buf** bufs, uint16_t n);
  int tx_burst_faults(ufab_buf** bufs, uint16_t n, uint64_t* free_slots, bool* wrote, int* err);
  void stop_irq();
  void signal_irq();
  void irq_helper(uint32_t last_seq);

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
  bool ring_given_ = false;
  bool slot_given_ = false;
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
  RingCtl* tx_ctl_ = nullptr;
  RingCtl* rx_ctl_ = nullptr;
  uint8_t* tx_slots_ = nullptr;
  uint8_t* rx_slots_ = nullptr;
  uint32_t ring_ = 0;
  uint64_t mask_ = 0;
  uint32_t slot_size_ = 0;
  uint32_t stride_ = 0;
  uint8_t mac_[6] = {};

  std::atomic<bool> started_{false};
  bool tx_ready_ = false;
  ufab_pool* rx_pool_ = nullptr;

  // State of the TX path (touched only by the thread calling tx_burst).
  struct alignas(kCacheLine) TxState {
    uint64_t head = 0;          // our copy of the ring's head
    uint64_t tail_cache = 0;    // the consumer's tail, last read
    uint64_t frame_index = 0;   // frames taken since open (fault injection)
    std::vector<uint8_t> held;  // a frame held back by reorder injection
    uint32_t held_len = 0;
    uint32_t held_copies = 0;  // 0: nothing held
    std::atomic<uint64_t> packets{0}, bytes{0}, errors{0};
    std::atomic<uint64_t> loss{0}, dup{0}, reorder{0}, corrupt{0};
  } tx_;

  // State of the RX path (touched only by the thread calling rx_burst).
  struct alignas(kCacheLine) RxState {
    uint64_t tail = 0;        // our copy of the ring's tail
    uint64_t head_cache = 0;  // the producer's head, last read
    uint64_t loss_base = 0;   // the peer's injected-loss counter at open
    std::atomic<uint64_t> packets{0}, bytes{0}, errors{0};
  } rx_;

  // Interrupt mode.
  std::atomic<bool> irq_on_{false};
  // The caller arms before it sleeps (rx_irq_arm), so an empty rx_burst no
  // longer does: a busy-polling receiver then costs its peer no futex wake
  // per frame.
  std::atomic<bool> arm_on_request_{false};
  std::atomic<bool> irq_stop_{false};
  std::atomic<uint64_t> irqs_{0};
  int irq_fd_ = -1;
  std::thread irq_thread_;
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

  if (inject_) tx_.held.resize(slot_size_);

  char msg[256];
  std::snprintf(msg, sizeof msg, "%s segment %s (%u slots x %u bytes per direction), peer %s",
                created_ ? "created" : "joined", shm_name_.c_str(), ring_, slot_size_,
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
  Layout l = make_layout(ring_param_, slot_param_);
  if (::ftruncate(fd_, static_cast<off_t>(l.total_size)) != 0)
    return fail(errno, "sizing " + shm_name_ + " to " + std::to_string(l.total_size) + " bytes failed: " +
                           errno_text(errno) + " (is /dev/shm full? try a smaller ring or slot_size)");
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
  if (version != kVersion)
    return fail(EPROTO, shm_name_ + " has layout version " + std::to_string(version) + ", this swnic speaks " +
                            std::to_string(kVersion) + "; both ends must run the same swnic, or open with stale=reset");
  std::string fix = "; remove it (rm /dev/shm" + shm_name_ + ") or open with stale=reset";
  if (!layout_params_valid(ring, slot_size))
    return fail(EPROTO, shm_name_ + " is corrupt (ring=" + std::to_string(ring) +
                            ", slot_size=" + std::to_string(slot_size) + ")" + fix);
  Layout l = make_layout(ring, slot_size);
  if (h->stride != l.stride || h->total_size != l.total_size || h->slots_offset[0] != l.slots_offset[0] ||
      h->slots_offset[1] != l.slots_offset[1])
    return fail(EPROTO, shm_name_ + " is corrupt (its layout does not follow from ring and slot_size)" + fix);
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

  ring_ = ring;
  mask_ = ring - 1;
  slot_size_ = slot_size;
  stride_ = l.stride;
  uint8_t* base = static_cast<uint8_t*>(map_);
  tx_ctl_ = ring_ctl_of(map_, port_);
  rx_ctl_ = ring_ctl_of(map_, peer_);
  tx_slots_ = base + l.slots_offset[port_];
  rx_slots_ = base + l.slots_offset[peer_];

  if (!peer_present) {
    // Nobody else is attached: start both rings from a clean state,
    // whatever a crashed predecessor left behind.
    for (RingCtl* c : {tx_ctl_, rx_ctl_}) {
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
  // We are the only consumer of the RX ring: drop what was queued for an
  // earlier holder of this port, and start from the producer's position.
  uint64_t head = rx_ctl_->head.load(std::memory_order_acquire);
  rx_ctl_->tail.store(head, std::memory_order_release);
  rx_ctl_->waiting.store(0, std::memory_order_relaxed);
  rx_.tail = head;
  rx_.head_cache = head;
  rx_.loss_base = rx_ctl_->inj_loss.load(std::memory_order_relaxed);
  // And the only producer of the TX ring: continue where it stands.
  tx_.head = tx_ctl_->head.load(std::memory_order_relaxed);
  tx_.tail_cache = tx_ctl_->tail.load(std::memory_order_acquire);
  if (tx_.head - tx_.tail_cache > ring_) tx_.tail_cache = tx_.head - ring_;  // checked again on use

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
  stop_irq();
  if (registered_ && inject_) {
    char msg[256];
    std::snprintf(msg, sizeof msg,
                  "fault injection summary: %" PRIu64 " lost, %" PRIu64 " duplicated, %" PRIu64 " reordered, %" PRIu64
                  " corrupted",
                  tx_.loss.load(), tx_.dup.load(), tx_.reorder.load(), tx_.corrupt.load());
    log(UFAB_LOG_INFO, msg);
  }
  detach();
}

// --------------------------------------------------------------- control

int SwNic::info(ufab_dev_info* out) {
  *out = ufab_dev_info{};
  std::memcpy(out->mac, mac_, 6);
  out->max_rx_queues = 1;
  out->max_tx_queues = 1;
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
  if (queue != 0) return fail(EINVAL, "RX queue " + std::to_string(queue) + " does not exist (swnic has queue 0)");
  if (started_.load()) return fail(EBUSY, "set up queues before start() or after stop()");
  if (!conf || !conf->pool) return fail(EINVAL, "RX queue 0 needs a buffer pool");
  rx_pool_ = conf->pool;
  return 0;
}

int SwNic::tx_queue_setup(uint16_t queue, const ufab_queue_conf* conf) {
  if (queue != 0) return fail(EINVAL, "TX queue " + std::to_string(queue) + " does not exist (swnic has queue 0)");
  (void)conf;  // the ring is the segment's ("ring" parameter), shared by both ends
  if (started_.load()) return fail(EBUSY, "set up queues before start() or after stop()");
  tx_ready_ = true;
  return 0;
}

int SwNic::start() {
  if (!rx_pool_) return fail(EINVAL, "start() before rx_queue_setup(0): RX needs a buffer pool");
  if (!tx_ready_) return fail(EINVAL, "start() before tx_queue_setup(0)");
  started_.store(true);
  return 0;
}

int SwNic::stop() {
  started_.store(false);
  return 0;
}

int SwNic::set_promiscuous(int) { return 0; }  // swnic delivers every frame anyway

int SwNic::stats(ufab_stats* out) {
  *out = ufab_stats{};
  out->rx_packets = rx_.packets.load(std::memory_order_relaxed);
  out->rx_bytes = rx_.bytes.load(std::memory_order_relaxed);
  out->tx_packets = tx_.packets.load(std::memory_order_relaxed);
  out->tx_bytes = tx_.bytes.load(std::memory_order_relaxed);
  // Frames the peer's fault injection dropped on their way to us.
  uint64_t injected = rx_ctl_->inj_loss.load(std::memory_order_relaxed) - rx_.loss_base;
  out->rx_dropped = injected;  // swnic itself never drops: a full ring or an empty pool holds the sender back
  out->rx_errors = rx_.errors.load(std::memory_order_relaxed);
  out->tx_errors = tx_.errors.load(std::memory_order_relaxed);
  out->irqs = irqs_.load(std::memory_order_relaxed);
  return 0;
}

// ------------------------------------------------------------------- TX

void SwNic::write_slot(uint64_t index, const uint8_t* data, uint32_t len, bool flip, uint64_t bit_draw) {
  uint8_t* s = tx_slot(index);
  std::memcpy(s + kSlotHeader, data, len);
  if (flip) {
    uint32_t bit = corrupt_bit(len, bit_draw);
    s[kSlotHeader + bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
  }
  __atomic_store_n(reinterpret_cast<uint32_t*>(s), len, __ATOMIC_RELAXED);
}

// Free slots after re-reading the consumer's tail. A tail that is ahead of
// our head, or more than a ring behind it, comes from a corrupt segment.
int SwNic::refresh_tx_free(uint64_t* free_slots) {
  uint64_t tail = tx_ctl_->tail.load(std::memory_order_acquire);
  uint64_t used = tx_.head - tail;
  if (used > ring_) {
    bump(tx_.errors);
    return fail(EIO, "the peer's consumer index (" + std::to_string(tail) + ") is inconsistent with ours (" +
                         std::to_string(tx_.head) + "): segment " + shm_name_ + " is corrupt; reopen both ends");
  }
  tx_.tail_cache = tail;
  *free_slots = ring_ - used;
  return 0;
}

void SwNic::wake_peer_if_waiting() {
  // Pairs with the consumer's seq_cst store of `waiting` and load of `head`
  // (store-buffer pattern): either it sees our new head, or we see its flag.
  if (tx_ctl_->waiting.load(std::memory_order_seq_cst) && tx_ctl_->waiting.exchange(0, std::memory_order_acq_rel)) {
    tx_ctl_->wake_seq.fetch_add(1, std::memory_order_release);
    futex(&tx_ctl_->wake_seq, FUTEX_WAKE, 1, nullptr);
  }
}

int SwNic::tx_drop_link_down(ufab_buf** bufs, uint16_t n) {
  // No receiver: frames go nowhere, as on a cable with no far end.
  bump(tx_.errors, n + (tx_.held_copies ? 1 : 0));
  tx_.held_copies = 0;
  if (n) ops_->buf_free(host_, bufs, n);
  return n;
}

int SwNic::tx_burst(uint16_t queue, ufab_buf** bufs, uint16_t n) {
  if (queue != 0) return fail(EINVAL, "TX queue " + std::to_string(queue) + " does not exist");
  if (!started_.load(std::memory_order_relaxed)) return fail(ENETDOWN, "tx_burst before start()");
  if (!hdr_->port[peer_].present.load(std::memory_order_relaxed)) return tx_drop_link_down(bufs, n);

  uint64_t free_slots = ring_ - (tx_.head - tx_.tail_cache);
  bool wrote = false;
  int taken = 0;
  int err = 0;  // a corrupt consumer index seen mid-burst
  if (inject_) {
    taken = tx_burst_faults(bufs, n, &free_slots, &wrote, &err);
  } else {
    uint64_t bytes = 0, sent = 0, errors = 0;
    for (; taken < n; ++taken) {
      ufab_buf* b = bufs[taken];
      if (b->len == 0 || b->len > slot_size_ || b->offset > b->capacity || b->len > b->capacity - b->offset) {
        ++errors;  // cannot go on this wire: dropped, counted
        continue;
      }
      if (free_slots == 0) {
        int rc = refresh_tx_free(&free_slots);
        if (rc < 0) {
          err = rc;
          break;
        }
        if (free_slots == 0) break;  // ring full: the caller keeps the rest
      }
      write_slot(tx_.head++, b->base + b->offset, b->len, false, 0);
      --free_slots;
      ++sent;
      bytes += b->len;
    }
    wrote = sent != 0;
    if (sent) {
      bump(tx_.packets, sent);
      bump(tx_.bytes, bytes);
    }
    if (errors) bump(tx_.errors, errors);
  }
  if (wrote) {
    // One publication per burst; seq_cst also orders it before the load of
    // `waiting` in wake_peer_if_waiting().
    tx_ctl_->head.store(tx_.head, std::memory_order_seq_cst);
    wake_peer_if_waiting();
  }
  if (taken) ops_->buf_free(host_, bufs, static_cast<uint32_t>(taken));
  // Frames written before the error are published and reported as taken.
  return taken == 0 && err < 0 ? err : taken;
}

int SwNic::tx_burst_faults(ufab_buf** bufs, uint16_t n, uint64_t* free_slots, bool* wrote, int* err) {
  uint64_t bytes = 0, sent = 0, errors = 0;
  uint64_t loss = 0, dup = 0, reorder = 0, corrupt = 0;
  int taken = 0;
  auto ensure = [&](uint64_t need) -> int {
    if (*free_slots >= need) return 1;
    int rc = refresh_tx_free(free_slots);
    if (rc < 0) return rc;
    return *free_slots >= need ? 1 : 0;
  };
  auto emit = [&](const uint8_t* data, uint32_t len, uint32_t copies, bool flip, uint64_t draw) {
    for (uint32_t c = 0; c < copies; ++c) {
      write_slot(tx_.head++, data, len, flip, draw);
      --*free_slots;
      ++sent;
      bytes += len;
    }
  };
  auto emit_held = [&] {
    // The held copy is already corrupted if it was chosen to be.
    emit(tx_.held.data(), tx_.held_len, tx_.held_copies, false, 0);
    tx_.held_copies = 0;
  };

  if (n == 0 && tx_.held_copies) {
    // tx_burst with no frames flushes a frame held back by reorder.
    int ok = ensure(tx_.held_copies);
    if (ok < 0) *err = ok;
    if (ok > 0) emit_held();
  }
  for (; taken < n; ++taken) {
    ufab_buf* b = bufs[taken];
    if (b->len == 0 || b->len > slot_size_ || b->offset > b->capacity || b->len > b->capacity - b->offset) {
      ++errors;
      ++tx_.frame_index;
      continue;
    }
    FaultDecision d = decide_fault(faults_, tx_.frame_index);
    if (d.lose) {
      ++loss;
      ++tx_.frame_index;
      continue;
    }
    uint32_t copies = d.dup ? 2 : 1;
    bool hold = d.hold && tx_.held_copies == 0;
    uint64_t need = hold ? 0 : copies + tx_.held_copies;
    int ok = ensure(need);
    if (ok < 0) *err = ok;
    if (ok <= 0) break;  // not taken: the same decision is drawn again next time
    const uint8_t* data = b->base + b->offset;
    if (d.corrupt) ++corrupt;
    if (d.dup) ++dup;
    if (hold) {
      std::memcpy(tx_.held.data(), data, b->len);
      if (d.corrupt) {
        uint32_t bit = corrupt_bit(b->len, d.bit_draw);
        tx_.held[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
      }
      tx_.held_len = b->len;
      tx_.held_copies = copies;
      ++reorder;
    } else {
      emit(data, b->len, copies, d.corrupt, d.bit_draw);
      if (tx_.held_copies) emit_held();
    }
    ++tx_.frame_index;
  }
  *wrote = sent != 0;
  if (sent) {
    bump(tx_.packets, sent);
    bump(tx_.bytes, bytes);
  }
  if (errors) bump(tx_.errors, errors);
  if (loss | dup | reorder | corrupt) {
    bump(tx_.loss, loss);
    bump(tx_.dup, dup);
    bump(tx_.reorder, reorder);
    bump(tx_.corrupt, corrupt);
    // Shared so the receiver can report injected loss as rx_dropped.
    bump(tx_ctl_->inj_loss, loss);
    bump(tx_ctl_->inj_dup, dup);
    bump(tx_ctl_->inj_reorder, reorder);
    bump(tx_ctl_->inj_corrupt, corrupt);
  }
  return taken;
}

// ------------------------------------------------------------------- RX

int SwNic::rx_burst(uint16_t queue, ufab_buf** bufs, uint16_t n) {
  if (queue != 0) return fail(EINVAL, "RX queue " + std::to_string(queue) + " does not exist");
  if (!started_.load(std::memory_order_relaxed)) return fail(ENETDOWN, "rx_burst before start()");
  if (n == 0) return 0;

  uint64_t avail = rx_.head_cache - rx_.tail;
  if (avail == 0) {
    rx_.head_cache = rx_ctl_->head.load(std::memory_order_acquire);
    avail = rx_.head_cache - rx_.tail;
    if (avail == 0 && irq_on_.load(std::memory_order_relaxed) && !arm_on_request_.load(std::memory_order_relaxed)) {
      // Empty: arm before the caller sleeps, then look once more (the
      // producer may have published between the two loads).
      rx_ctl_->waiting.store(1, std::memory_order_seq_cst);
      rx_.head_cache = rx_ctl_->head.load(std::memory_order_seq_cst);
      avail = rx_.head_cache - rx_.tail;
    }
    if (avail == 0) return 0;
    if (avail > ring_) {
      bump(rx_.errors);
      uint64_t head = rx_.head_cache;
      rx_.head_cache = rx_.tail;
      return fail(EIO, "the peer's producer index (" + std::to_string(head) + ") is more than a ring ahead of ours (" +
                           std::to_string(rx_.tail) + "): segment " + shm_name_ + " is corrupt; reopen both ends");
    }
  }
  uint32_t want = static_cast<uint32_t>(std::min<uint64_t>(avail, n));
  int got = ops_->buf_alloc(host_, rx_pool_, bufs, want);
  if (got <= 0) {
    // No buffers: the frames wait in the ring. In interrupt mode keep the
    // fd readable, or a caller that sleeps now would never be woken for them.
    if (got == 0 && irq_on_.load(std::memory_order_relaxed)) {
      signal_irq();
    }
    return got;
  }

  int delivered = 0;
  uint64_t consumed = 0, bytes = 0, errors = 0;
  while (delivered < got && consumed < avail) {
    const uint8_t* s = rx_slot(rx_.tail + consumed);
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
  rx_.tail += consumed;
  rx_ctl_->tail.store(rx_.tail, std::memory_order_release);
  if (delivered < got) ops_->buf_free(host_, bufs + delivered, static_cast<uint32_t>(got - delivered));
  if (delivered) {
    bump(rx_.packets, static_cast<uint64_t>(delivered));
    bump(rx_.bytes, bytes);
  }
  if (errors) bump(rx_.errors, errors);
  return delivered;
}

// ------------------------------------------------------------- interrupts

void SwNic::signal_irq() {
  // Counted first, so a caller woken by the write already sees it counted.
  irqs_.fetch_add(1, std::memory_order_relaxed);
  uint64_t one = 1;
  // Fails only when the counter is about to overflow: readable anyway.
  [[maybe_unused]] ssize_t r = ::write(irq_fd_, &one, sizeof one);
}

// Bridges the futex word in shared memory to an eventfd: the producer (in
// any process) bumps the word and FUTEX_WAKEs; this thread, in the
// receiver's process, turns each change into an eventfd write.
void SwNic::irq_helper(uint32_t last_seq) {
  const struct timespec timeout = {0, kHelperPollNs};
  while (!irq_stop_.load(std::memory_order_acquire)) {
    futex(&rx_ctl_->wake_seq, FUTEX_WAIT, last_seq, &timeout);
    uint32_t seq = rx_ctl_->wake_seq.load(std::memory_order_acquire);
    if (seq == last_seq) continue;  // timeout, spurious, or our own stop wake-up
    last_seq = seq;
    signal_irq();
  }
}

int SwNic::rx_irq(uint16_t queue, int enable, int* eventfd) {
  if (queue != 0) return fail(EINVAL, "RX queue " + std::to_string(queue) + " does not exist");
  if (!enable) {
    stop_irq();
    return 0;
  }
  if (irq_on_.load()) {
    if (eventfd) *eventfd = irq_fd_;
    return 0;
  }
  int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) return fail(errno, "eventfd failed: " + errno_text(errno));
  irq_fd_ = fd;
  irq_stop_.store(false);
  // Take the word's value before arming, so a wake-up that follows the
  // arming changes it from what the helper waits on.
  uint32_t seq = rx_ctl_->wake_seq.load(std::memory_order_acquire);
  try {
    irq_thread_ = std::thread([this, seq] { irq_helper(seq); });
  } catch (const std::system_error& e) {
    ::close(irq_fd_);
    irq_fd_ = -1;
    return fail(EAGAIN, std::string("cannot start the interrupt helper thread: ") + e.what());
  }
  irq_on_.store(true);
  rx_ctl_->waiting.store(1, std::memory_order_seq_cst);
  if (rx_ctl_->head.load(std::memory_order_seq_cst) != rx_ctl_->tail.load(std::memory_order_relaxed)) {
    signal_irq();  // frames already wait: readable at once
  }
  if (eventfd) *eventfd = irq_fd_;
  return 0;
}

int SwNic::rx_irq_arm(uint16_t queue) {
  if (queue != 0) return fail(EINVAL, "RX queue " + std::to_string(queue) + " does not exist");
  if (!irq_on_.load()) return fail(EINVAL, "rx_irq_arm without the interrupt enabled: call rx_irq(queue, 1) first");
  arm_on_request_.store(true, std::memory_order_relaxed);
  // As an empty rx_burst arms: the flag first, then one more look, since
  // the producer may have published between the caller's last poll and now.
  rx_ctl_->waiting.store(1, std::memory_order_seq_cst);
  if (rx_ctl_->head.load(std::memory_order_seq_cst) != rx_.tail) signal_irq();
  return 0;
}

void SwNic::stop_irq() {
  if (!irq_thread_.joinable()) return;
  irq_on_.store(false);
  arm_on_request_.store(false, std::memory_order_relaxed);
  if (rx_ctl_) rx_ctl_->waiting.store(0, std::memory_order_seq_cst);
  irq_stop_.store(true, std::memory_order_release);
  futex(&rx_ctl_->wake_seq, FUTEX_WAKE, INT32_MAX, nullptr);
  irq_thread_.join();
  ::close(irq_fd_);
  irq_fd_ = -1;
}

}  // namespace
}  // namespace ufab::swnic

const ufab_driver* ufab_swnic_driver() {
  static const ufab_driver d = ufab::sdk::make_driver<ufab::swnic::SwNic>(
      "swnic", "software NIC: two Ethernet ports joined over shared memory", nullptr, UFAB_DRIVER_F_SOFTWARE);
  return &d;
}
