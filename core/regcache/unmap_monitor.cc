#include "core/regcache/unmap_monitor.h"

#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/hex.h"

#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif

namespace ufab::regcache {
namespace {

constexpr uint64_t kEvents = UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_EVENT_REMAP;

Result<UnmapMonitor*> start(UnmapMonitor* m, int* uffd, int* stop_fd) {
  // User-mode-only first: allowed to unprivileged processes on kernels
  // with vm.unprivileged_userfaultfd=0 (5.11 on); plain otherwise.
  int fd = static_cast<int>(::syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY));
  if (fd < 0) fd = static_cast<int>(::syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK));
  if (fd < 0) {
    return fail_errno("userfaultfd (to learn when registered memory is unmapped): not available to this process "
                      "(kernel without it, a seccomp filter, or vm.unprivileged_userfaultfd=0 on a kernel "
                      "older than 5.11); the registration cache then caches nothing");
  }
  uffdio_api api{};
  api.api = UFFD_API;
  api.features = kEvents;
  if (::ioctl(fd, UFFDIO_API, &api) != 0) {
    int e = errno;
    ::close(fd);
    return fail(e, std::string("userfaultfd: the kernel lacks the unmap/remove/remap events (") + std::strerror(e) +
                       "); the registration cache then caches nothing");
  }
  int sfd = ::eventfd(0, EFD_CLOEXEC);
  if (sfd < 0) {
    int e = errno;
    ::close(fd);
    return fail(e, "eventfd for the unmap monitor");
  }
  *uffd = fd;
  *stop_fd = sfd;
  return m;
}

}  // namespace

Result<UnmapMonitor*> UnmapMonitor::get() {
  // Started once and kept for the life of the process: caches in any
  // thread share it (a range can be watched by one userfaultfd only).
  static const Result<UnmapMonitor*> monitor = []() -> Result<UnmapMonitor*> {
    auto* m = new UnmapMonitor();
    auto r = start(m, &m->uffd_, &m->stop_fd_);
    if (!r) {
      delete m;
      return r;
    }
    m->thread_ = std::thread([m] { m->run(); });
    return m;
  }();
  return monitor;
}

UnmapMonitor::~UnmapMonitor() {
  if (thread_.joinable()) {
    uint64_t one = 1;
    (void)!::write(stop_fd_, &one, sizeof one);
    thread_.join();
  }
  if (uffd_ >= 0) ::close(uffd_);
  if (stop_fd_ >= 0) ::close(stop_fd_);
}

Status UnmapMonitor::watch(uint64_t start, uint64_t end) {
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  uint64_t s = start & ~(page - 1);
  uint64_t e = (end + page - 1) & ~(page - 1);
  uffdio_register r{};
  r.range.start = s;
  r.range.len = e - s;
  r.mode = UFFDIO_REGISTER_MODE_WP;  // never write-protected: events only
  if (::ioctl(uffd_, UFFDIO_REGISTER, &r) != 0) {
    return fail_errno("watching [" + hex(s) + ", " + hex(e) + ") for unmapping with userfaultfd");
  }
  return {};
}

uint64_t UnmapMonitor::sequence_after_reader() const {
  uint64_t w = events_.load(std::memory_order_acquire);
  for (uint32_t spins = 0; (w & 1) != 0 && spins < (1u << 20); ++spins) {
    std::this_thread::yield();
    w = events_.load(std::memory_order_acquire);
  }
  return w >> 1;
}

bool UnmapMonitor::event(uint64_t seq, Range* out) const {
  std::lock_guard lock(ring_mu_);
  uint64_t now = events_.load(std::memory_order_relaxed) >> 1;
  if (seq >= now || now - seq > kRing) return false;
  *out = ring_[seq % kRing];
  return true;
}

void UnmapMonitor::run() {
  // No allocation, no lock but ring_mu_ (held for two stores): see the
  // header.
  for (;;) {
    pollfd fds[2] = {{uffd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    int n = ::poll(fds, 2, -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 || (fds[1].revents & POLLIN)) return;
    uffd_msg msgs[16];
    uint64_t w = events_.load(std::memory_order_relaxed);  // even: only this thread writes it
    events_.store(w | 1, std::memory_order_seq_cst);       // busy, before read(): see sequence()
    ssize_t got = ::read(uffd_, msgs, sizeof msgs);
    if (got <= 0) {  // EAGAIN: another wakeup
      events_.store(w, std::memory_order_release);
      continue;
    }
    for (ssize_t i = 0; i < got / static_cast<ssize_t>(sizeof(uffd_msg)); ++i) {
      Range r;
      switch (msgs[i].event) {
        case UFFD_EVENT_UNMAP:
        case UFFD_EVENT_REMOVE:
          r = {msgs[i].arg.remove.start, msgs[i].arg.remove.end};
          break;
        case UFFD_EVENT_REMAP:
          r = {msgs[i].arg.remap.from, msgs[i].arg.remap.from + msgs[i].arg.remap.len};
          break;
        default: continue;  // page faults are never asked for
      }
      std::lock_guard lock(ring_mu_);
      const uint64_t s = w >> 1;
      ring_[s % kRing] = r;
      w = (s + 1) << 1;
      events_.store(w | 1, std::memory_order_release);  // still busy
    }
    events_.store(w, std::memory_order_release);
  }
}

}  // namespace ufab::regcache
