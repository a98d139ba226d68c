// Learns when host memory goes away: one userfaultfd per process, ranges
// registered with it in write-protect mode but never write-protected (so
// no page fault is ever delivered to it and the application's accesses are
// untouched), asking only for the kernel's non-cooperative events: munmap
// (UFFD_EVENT_UNMAP), madvise(DONTNEED/REMOVE) and brk shrinking
// (UFFD_EVENT_REMOVE / UNMAP), mremap (UFFD_EVENT_REMAP). That includes
// what glibc's free() does to large blocks (munmap) and to the heap
// (madvise, brk), which an interposed munmap would miss.
//
// A thread reads the events and appends the ranges to a ring; it never
// allocates or frees memory and takes no lock a registration cache holds
// while it could unmap (the kernel blocks a munmap of a watched range until
// the event is read, so the reader must never wait on that munmapper).
// Caches drain the ring on their next call: one atomic load when nothing
// happened. docs/gpu.md ("Registration cache").
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include "base/error.h"

namespace ufab::regcache {

struct Range {
  uint64_t start = 0, end = 0;  // [start, end)
};

class UnmapMonitor {
 public:
  // The process's monitor, started on first use. Errors (no userfaultfd:
  // kernel, seccomp, vm.unprivileged_userfaultfd=0 without privilege and
  // without UFFD_USER_MODE_ONLY) say why; caches then cache nothing.
  static Result<UnmapMonitor*> get();

  // Watches [start, end) (page-aligned outward). Fails (EINVAL, EBUSY) for
  // memory userfaultfd cannot watch: file mappings on disk file systems,
  // device mappings, ranges another userfaultfd watches, unmapped ranges.
  Status watch(uint64_t start, uint64_t end);

  // Events so far (a sequence number), and the range of event `seq` when
  // it is still in the ring (false: overwritten, the reader fell behind).
  // Waits (briefly) while the reader holds events it has read but not yet
  // recorded: the kernel lets a munmap return once its event is read, so
  // after a munmap returns its range is in the ring or being put there.
  // One load when the reader is idle; the wait is out of line.
  uint64_t sequence() const {
    const uint64_t w = events_.load(std::memory_order_acquire);
    if ((w & 1) != 0) [[unlikely]] return sequence_after_reader();
    return w >> 1;
  }
  bool event(uint64_t seq, Range* out) const;
  // The word a cache hit compares with the one it saw last (one load): the
  // sequence number shifted left once, the low bit set while the reader is
  // between read() and recording what it read (so a busy reader never
  // compares equal to a cache's last, even, word).
  const std::atomic<uint64_t>& events() const { return events_; }
  static constexpr uint64_t kRing = 4096;

  ~UnmapMonitor();

 private:
  UnmapMonitor() = default;
  void run();
  uint64_t sequence_after_reader() const;  // waits (bounded) while the reader is busy

  int uffd_ = -1;
  int stop_fd_ = -1;
  std::thread thread_;
  mutable std::mutex ring_mu_;  // held for a few loads/stores only
  Range ring_[kRing];
  // (sequence << 1) | busy; written by the reader only, on its own cache
  // line (hits of every cache read it).
  alignas(64) std::atomic<uint64_t> events_{0};
  [[maybe_unused]] char pad_[64 - sizeof(std::atomic<uint64_t>)] = {};  // the line to itself
};

}  // namespace ufab::regcache
