// An shm device: its segment, its socket, its peers, progress and sleeping.
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "drivers/shm/shm_impl.h"

namespace ufab::shm {

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

int futex_wait(std::atomic<uint32_t>* word, uint32_t expected, int timeout_us) {
  struct timespec ts;
  ts.tv_sec = timeout_us / 1000000;
  ts.tv_nsec = static_cast<long>(timeout_us % 1000000) * 1000;
  // Not FUTEX_PRIVATE: peers wake it through their own mapping.
  return static_cast<int>(::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0));
}

void futex_wake(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, 0x7fffffff, nullptr, nullptr, 0);
}

void Device::wake(Segment* s) {
  s->hdr.epoch.fetch_add(1, std::memory_order_seq_cst);
  futex_wake(&s->hdr.epoch);
}

void Device::wake_self() { wake(seg); }

void peer_ref(Peer* p) { p->refs.fetch_add(1, std::memory_order_relaxed); }

void peer_unref(Peer* p) {
  if (p->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  if (p->sock >= 0) ::close(p->sock);
  if (p->seg) ::munmap(p->seg, p->seg_size);
  delete p;
}

namespace {

struct Hello {
  uint32_t magic;
  uint32_t version;
  uint32_t addr;
  uint32_t reserved;
  uint64_t seg_size;
  char domain[96];
};

std::string errno_str(int e) { return std::string(std::strerror(e)) + " (errno " + std::to_string(e) + ")"; }

void send_hello(int sock, const Hello& h, int fd) {
  struct iovec iov = {const_cast<Hello*>(&h), sizeof h};
  char cbuf[CMSG_SPACE(sizeof(int))] = {};
  struct msghdr m = {};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = cbuf;
  m.msg_controllen = sizeof cbuf;
  struct cmsghdr* c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  if (::sendmsg(sock, &m, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof h)) {
    throw Error(errno ? errno : EIO, "sending the segment to the peer failed: " + errno_str(errno));
  }
}

// Receives a Hello and its memfd; returns the fd (the caller closes it).
int recv_hello(int sock, Hello* h) {
  struct iovec iov = {h, sizeof *h};
  char cbuf[CMSG_SPACE(sizeof(int))] = {};
  struct msghdr m = {};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = cbuf;
  m.msg_controllen = sizeof cbuf;
  ssize_t n = ::recvmsg(sock, &m, MSG_CMSG_CLOEXEC | MSG_WAITALL);
  int fd = -1;
  for (struct cmsghdr* c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
  }
  if (n != static_cast<ssize_t>(sizeof *h) || fd < 0) {
    int e = n < 0 ? errno : EPROTO;
    if (fd >= 0) ::close(fd);
    throw Error(e, n < 0 ? "no answer from the peer: " + errno_str(e)
                         : "the peer's handshake was " + std::to_string(n) + " bytes without a segment");
  }
  if (h->magic != kSegMagic || h->version != kSegVersion) {
    ::close(fd);
    throw Error(EPROTO, "the peer speaks shm protocol version " + std::to_string(h->version) + ", this one " +
                            std::to_string(kSegVersion) + "; run the same ufab on both sides");
  }
  return fd;
}

Segment* map_segment(int fd, uint32_t addr, size_t* size) {
  struct stat st;
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < sizeof(Segment)) {
    throw Error(EPROTO, "the peer's segment is smaller than this version's layout");
  }
  void* p = ::mmap(nullptr, sizeof(Segment), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) throw Error(errno, "mapping the peer's segment failed: " + errno_str(errno));
  auto* s = static_cast<Segment*>(p);
  if (s->hdr.magic != kSegMagic || s->hdr.addr != addr) {
    ::munmap(p, sizeof(Segment));
    throw Error(EPROTO, "the peer's segment does not belong to address " + hex(addr));
  }
  *size = sizeof(Segment);
  return s;
}

std::atomic<uint32_t> g_device_index{0};

}  // namespace

std::string Device::socket_name(uint32_t a) const {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", a);
  return "ufab-shm/" + domain + "/" + buf;
}

static socklen_t fill_addr(struct sockaddr_un* sa, const std::string& name) {
  std::memset(sa, 0, sizeof *sa);
  sa->sun_family = AF_UNIX;
  std::memcpy(sa->sun_path + 1, name.data(), name.size());  // abstract: leading NUL
  return static_cast<socklen_t>(offsetof(struct sockaddr_un, sun_path) + 1 + name.size());
}

void Device::open(const ufab_rdma_host* h, const char* dev_name, const ufab_device_opts* opts) {
  host = h;
  name = dev_name ? dev_name : "";
  if (name.rfind("shm:", 0) != 0 || name.size() == 4) {
    throw Error(EINVAL, "opening \"" + name + "\": shm devices are named \"shm:DOMAIN\" (processes that open the "
                        "same DOMAIN reach each other)");
  }
  domain = name.substr(4);
  if (domain.size() > 64 || domain.find('\0') != std::string::npos) {
    throw Error(ENAMETOOLONG, "opening \"" + name + "\": the domain name is longer than 64 bytes; choose a shorter one");
  }
  take_gpu_params(opts);  // gpu_copy, gpu_frag, ... (docs/gpu.md, "shm"); other parameters are ignored
  pid = ::getpid();
  uid = ::getuid();
  seg_size = sizeof(Segment);
  memfd = static_cast<int>(::syscall(SYS_memfd_create, "ufab-shm", MFD_CLOEXEC));
  if (memfd < 0) throw Error(errno, "opening \"" + name + "\": memfd_create failed: " + errno_str(errno));
  if (::ftruncate(memfd, static_cast<off_t>(seg_size)) != 0) {
    throw Error(errno, "opening \"" + name + "\": sizing the " + std::to_string(seg_size) +
                           "-byte segment failed: " + errno_str(errno));
  }
  void* p = ::mmap(nullptr, seg_size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  if (p == MAP_FAILED) throw Error(errno, "opening \"" + name + "\": mapping the segment failed: " + errno_str(errno));
  seg = static_cast<Segment*>(p);

  listen_fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd < 0) throw Error(errno, "opening \"" + name + "\": socket failed: " + errno_str(errno));
  int last = 0;
  for (int tries = 0; tries < 256; ++tries) {
    uint32_t idx = g_device_index.fetch_add(1) & 0xff;
    uint32_t a = (static_cast<uint32_t>(pid) << 8) | idx;
    struct sockaddr_un sa;
    socklen_t len = fill_addr(&sa, socket_name(a));
    if (::bind(listen_fd, reinterpret_cast<struct sockaddr*>(&sa), len) == 0) {
      addr = a;
      last = 0;
      break;
    }
    last = errno;
    if (last != EADDRINUSE) break;
  }
  if (last != 0) {
    throw Error(last, "opening \"" + name + "\": binding the device's socket failed: " + errno_str(last) +
                          (last == EADDRINUSE ? "; this process has 256 shm devices open" : ""));
  }
  if (::listen(listen_fd, 64) != 0) throw Error(errno, "opening \"" + name + "\": listen failed: " + errno_str(errno));
  ctl_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (ctl_fd < 0) throw Error(errno, "opening \"" + name + "\": eventfd failed: " + errno_str(errno));

  seg->hdr.magic = kSegMagic;
  seg->hdr.version = kSegVersion;
  seg->hdr.addr = addr;
  seg->hdr.pid = static_cast<uint32_t>(pid);
  seg->hdr.size = seg_size;
  seg->hdr.max_qp = kMaxQp;
  seg->hdr.max_mr = kMaxMr;
  seg->hdr.ring_slots = kRingSlots;
  seg->hdr.slot_size = kSlotSize;
  for (uint32_t i = 0; i < kMaxMr; ++i) key_gen[i] = 1;
  control = std::thread([this] { control_loop(); });
}

void Device::close() {
  if (progress_running) {
    progress_stop = true;
    wake_self();
    progress_thread.join();
    progress_running = false;
  }
  if (control.joinable()) {
    stopping = true;
    uint64_t one = 1;
    ssize_t w = ::write(ctl_fd, &one, sizeof one);
    (void)w;
    control.join();
  }
  reap_quarantine(true);
  ipc_forget(nullptr);
  for (Peer* p : peers) {
    p->dead = true;
    peer_unref(p);
  }
  peers.clear();
  for (auto& q : qps) {
    if (q && q->peer) {
      peer_unref(q->peer);
      q->peer = nullptr;
    }
    if (q) q->ud_release_dests(false);
  }
  if (listen_fd >= 0) ::close(listen_fd);
  if (ctl_fd >= 0) ::close(ctl_fd);
  if (seg) ::munmap(seg, seg_size);
  if (memfd >= 0) ::close(memfd);
  listen_fd = ctl_fd = memfd = -1;
  seg = nullptr;
}

// ------------------------------------------------------------------ peers

Peer* Device::connect_peer(uint32_t a) {
  {
    std::lock_guard<std::mutex> g(peers_mu);
    for (Peer* p : peers) {
      if (p->addr == a && !p->dead.load()) {
        peer_ref(p);
        return p;
      }
    }
  }
  std::string where = "connecting to shm address " + hex(a) + " in domain \"" + domain + "\": ";
  int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) throw Error(errno, where + "socket failed: " + errno_str(errno));
  auto* p = new Peer;
  p->addr = a;
  p->sock = s;
  try {
    struct sockaddr_un sa;
    socklen_t len = fill_addr(&sa, socket_name(a));
    if (::connect(s, reinterpret_cast<struct sockaddr*>(&sa), len) != 0) {
      int e = errno;
      if (e == ECONNREFUSED || e == ENOENT) {
        throw Error(ECONNREFUSED, where + "no device has that address (is the peer's device open, in the same domain "
                                          "and network namespace? the address comes from the peer's ufab_qp_local)");
      }
      throw Error(e, where + "connect failed: " + errno_str(e));
    }
    struct ucred cred;
    socklen_t cl = sizeof cred;
    if (::getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0) throw Error(errno, where + "SO_PEERCRED failed");
    if (cred.uid != uid) {
      throw Error(EPERM, where + "the peer runs as uid " + std::to_string(cred.uid) + ", this process as uid " +
                             std::to_string(uid) + "; a shm domain is one user's (use soft-RoCE between users)");
    }
    p->pid = cred.pid;
    struct timeval tv = {5, 0};
    ::setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    Hello h = {};
    h.magic = kSegMagic;
    h.version = kSegVersion;
    h.addr = addr;
    h.seg_size = seg_size;
    std::snprintf(h.domain, sizeof h.domain, "%s", domain.c_str());
    send_hello(s, h, memfd);
    Hello r;
    int fd = recv_hello(s, &r);
    try {
      p->seg = map_segment(fd, a, &p->seg_size);
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);
  } catch (Error& e) {
    if (e.msg.rfind(where, 0) != 0) e.msg = where + e.msg;
    peer_unref(p);
    throw;
  }
  {
    std::lock_guard<std::mutex> g(peers_mu);
    peers.push_back(p);
    peer_ref(p);  // the caller's
  }
  uint64_t one = 1;
  ssize_t w = ::write(ctl_fd, &one, sizeof one);
  (void)w;
  return p;
}

void Device::accept_one() {
  int s = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (s < 0) return;
  auto* p = new Peer;
  p->sock = s;
  try {
    struct ucred cred;
    socklen_t cl = sizeof cred;
    if (::getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0) throw Error(errno, "SO_PEERCRED failed");
    if (cred.uid != uid) throw Error(EPERM, "refused a peer of uid " + std::to_string(cred.uid));
    p->pid = cred.pid;
    struct timeval tv = {2, 0};
    ::setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    Hello h;
    int fd = recv_hello(s, &h);
    p->addr = h.addr;
    try {
      p->seg = map_segment(fd, h.addr, &p->seg_size);
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);
    Hello r = {};
    r.magic = kSegMagic;
    r.version = kSegVersion;
    r.addr = addr;
    r.seg_size = seg_size;
    std::snprintf(r.domain, sizeof r.domain, "%s", domain.c_str());
    send_hello(s, r, memfd);
  } catch (const Error& e) {
    log(1, "shm device " + name + ": a peer's connection failed: " + e.msg);
    peer_unref(p);
    return;
  }
  std::lock_guard<std::mutex> g(peers_mu);
  peers.push_back(p);
}

void Device::control_loop() {
  std::vector<struct pollfd> fds;
  std::vector<Peer*> who;
  while (!stopping.load()) {
    fds.clear();
    who.clear();
    fds.push_back({listen_fd, POLLIN, 0});
    fds.push_back({ctl_fd, POLLIN, 0});
    {
      std::lock_guard<std::mutex> g(peers_mu);
      for (Peer* p : peers) {
        fds.push_back({p->sock, POLLIN | POLLRDHUP, 0});
        who.push_back(p);
      }
    }
    int n = ::poll(fds.data(), fds.size(), -1);
    if (n < 0) continue;
    if (fds[1].revents) {
      uint64_t v;
      ssize_t r = ::read(ctl_fd, &v, sizeof v);
      (void)r;
    }
    if (stopping.load()) break;
    if (fds[0].revents & POLLIN) accept_one();
    for (size_t i = 2; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      char c;
      // Peers never write after the handshake: anything readable is its end.
      ssize_t r = ::recv(fds[i].fd, &c, 1, MSG_DONTWAIT);
      if (r > 0 || (r < 0 && (errno == EAGAIN || errno == EINTR) && !(fds[i].revents & (POLLHUP | POLLERR | POLLRDHUP))))
        continue;
      Peer* p = who[i - 2];
      {
        std::lock_guard<std::mutex> g(peers_mu);
        for (size_t k = 0; k < peers.size(); ++k) {
          if (peers[k] == p) {
            peers.erase(peers.begin() + static_cast<long>(k));
            break;
          }
        }
      }
      log(2, "shm device " + name + ": peer " + hex(p->addr) + " (pid " + std::to_string(p->pid) + ") is gone");
      p->dead.store(true);
      dead_gen.fetch_add(1);
      ipc_forget(p);  // its GPU allocations opened here: closed after the copies queued before
      peer_unref(p);  // the table's; QPs keep theirs until they let go
      wake_self();
    }
  }
}

// --------------------------------------------------------------- progress

int Device::progress() {
  uint32_t gen = dead_gen.load(std::memory_order_acquire);
  int work = 0;
  uint32_t n = qp_high.load(std::memory_order_acquire);
  // An idle QP is skipped without its lock unless its rings have input or
  // its fatal word is set. Every 64th round (per thread), and after a peer
  // died, every QP is visited (a destroyed peer QP is noticed there).
  static thread_local uint32_t rounds = 0;
  const bool full = (++rounds & 63) == 0 || gen != dead_handled.load(std::memory_order_relaxed);
  for (uint32_t i = 0; i < n; ++i) {
    Qp* q = qps[i].get();
    if (!q || !q->active.load(std::memory_order_relaxed)) continue;
    if (!full && q->idle.load(std::memory_order_relaxed)) {
      const QpCtl& c = seg->ctl[i];
      if (q->ud_in) {
        if (!ud_input(*q->ud_in, c.req.head.load(std::memory_order_relaxed))) continue;
      } else if (!q->in_req.ready(c.req.head.load(std::memory_order_relaxed)) &&
          !q->in_resp.ready(c.resp.head.load(std::memory_order_relaxed)) && !c.fatal.load(std::memory_order_relaxed)) {
        continue;
      }
    }
    if (!q->mu.try_lock()) continue;  // another thread is driving it
    if (q->active.load(std::memory_order_relaxed)) work += q->progress_locked();
    q->mu.unlock();
  }
  dead_handled.store(gen, std::memory_order_release);
  if (quarantined.load(std::memory_order_relaxed) != 0) reap_quarantine(false);
  return work;
}

bool Device::pending_input() const {
  if (dead_gen.load(std::memory_order_acquire) != dead_handled.load(std::memory_order_acquire)) return true;
  uint32_t n = qp_high.load(std::memory_order_acquire);
  for (uint32_t i = 0; i < n; ++i) {
    const QpCtl& c = seg->ctl[i];
    uint32_t st = c.state.load(std::memory_order_relaxed);
    if (st != UFAB_QPS_RTR && st != UFAB_QPS_RTS && st != UFAB_QPS_ERR) continue;
    if (c.type.load(std::memory_order_relaxed) == UFAB_QPT_UD) {
      if (ud_ready(seg->ud[i], c.req.head.load(std::memory_order_relaxed))) return true;
      continue;
    }
    const RingPair& r = seg->rings[i];
    if (RingView{nullptr, const_cast<unsigned char*>(r.req)}.ready(c.req.head.load(std::memory_order_relaxed))) return true;
    if (RingView{nullptr, const_cast<unsigned char*>(r.resp)}.ready(c.resp.head.load(std::memory_order_relaxed))) return true;
    if (c.fatal.load(std::memory_order_relaxed)) return true;
  }
  return false;
}

bool Device::any_gpu_wait() const {
  uint32_t n = qp_high.load(std::memory_order_acquire);
  for (uint32_t i = 0; i < n; ++i) {
    Qp* q = qps[i].get();
    if (q && q->active.load(std::memory_order_relaxed) && q->gpu_wait.load(std::memory_order_relaxed)) return true;
  }
  return false;
}

bool Device::any_timer() const {
  uint32_t n = qp_high.load(std::memory_order_acquire);
  for (uint32_t i = 0; i < n; ++i) {
    Qp* q = qps[i].get();
    if (q && q->active.load(std::memory_order_relaxed) && q->timer.load(std::memory_order_relaxed)) return true;
  }
  return false;
}

}  // namespace ufab::shm
