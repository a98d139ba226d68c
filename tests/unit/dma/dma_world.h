// Test fixture shared by the dma/ unit tests: the fake VFIO kernel of
// tests/unit/vfio, extended to account for anonymous memory (so a test can
// prove that nothing stays mmapped) and to emulate a pool of 2 MiB huge
// pages (the machines that run the tests usually have none).
#pragma once

#include <sys/mman.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "tests/unit/vfio/fake_kernel.h"
#include "vfio/container.h"

namespace ufab::dma::testing {

inline constexpr uint64_t KiB = 1024, MiB = 1024 * KiB;

class AccountingKernel : public vfio::testing::FakeKernel {
 public:
  using FakeKernel::FakeKernel;

  // Free 2 MiB pages of the emulated hugetlb pool.
  uint64_t free_hugepages = 0;
  int hugetlb_attempts = 0;
  int anonymous_mmaps = 0;

  // Bytes of anonymous memory mapped through this kernel and not unmapped.
  uint64_t live_anonymous_bytes() const {
    uint64_t total = 0;
    for (const auto& [start, length] : live_) total += length;
    return total;
  }

  void* mmap(void* addr, size_t length, int prot, int flags, int fd, off_t offset) override {
    if (fd >= 0 || !(flags & MAP_ANONYMOUS)) return FakeKernel::mmap(addr, length, prot, flags, fd, offset);
    if (flags & MAP_HUGETLB) {
      ++hugetlb_attempts;
      constexpr uint64_t huge = 2 * MiB;
      if (length % huge != 0 || length / huge > free_hugepages) {
        errno = ENOMEM;  // what hugetlb answers when the pool is short
        return MAP_FAILED;
      }
      // Ordinary pages at a 2 MiB boundary stand in for huge pages.
      void* span = ::mmap(nullptr, length + huge, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (span == MAP_FAILED) return MAP_FAILED;
      auto base = reinterpret_cast<uintptr_t>(span);
      uintptr_t at = (base + huge - 1) & ~(huge - 1);
      if (at > base) ::munmap(span, at - base);
      ::munmap(reinterpret_cast<void*>(at + length), base + length + huge - (at + length));
      free_hugepages -= length / huge;
      huge_[at] = length;
      ++anonymous_mmaps;
      live_[at] = length;
      return reinterpret_cast<void*>(at);
    }
    void* p = ::mmap(addr, length, prot, flags, fd, offset);
    if (p != MAP_FAILED) {
      ++anonymous_mmaps;
      live_[reinterpret_cast<uintptr_t>(p)] = length;
    }
    return p;
  }

  int munmap(void* addr, size_t length) override {
    const auto begin = reinterpret_cast<uintptr_t>(addr), end = begin + length;
    if (auto it = huge_.find(begin); it != huge_.end() && it->second == length) {
      free_hugepages += length / (2 * MiB);
      huge_.erase(it);
    }
    // Remove [begin, end) from the live set, splitting what it cuts.
    auto it = live_.lower_bound(begin);
    if (it != live_.begin()) --it;
    while (it != live_.end() && it->first < end) {
      const uintptr_t s = it->first, e = it->first + it->second;
      if (e <= begin) {
        ++it;
        continue;
      }
      it = live_.erase(it);
      if (s < begin) live_[s] = begin - s;
      if (e > end) live_[end] = e - end;
    }
    return FakeKernel::munmap(addr, length);
  }

 private:
  std::map<uintptr_t, size_t> live_;
  std::map<uintptr_t, size_t> huge_;
};

// A fake sysfs and kernel with one device (0000:00:03.0, group 5) bound to
// vfio-pci, and a container with its group.
struct DmaWorld {
  vfio::testing::FakeSysfs sysfs;
  AccountingKernel kernel{sysfs.dev()};

  DmaWorld() {
    sysfs.create_vfio_node();
    sysfs.add_device("0000:00:03.0", 5, "vfio-pci");
    kernel.add_device(5, "0000:00:03.0");
  }

  vfio::Environment env() {
    vfio::Environment e;
    e.kernel = &kernel;
    e.sysfs_root = sysfs.sysfs();
    e.dev_root = sysfs.dev();
    e.proc_root = sysfs.proc();
    return e;
  }

  // nullptr (and a failed expectation in the caller's test) on failure.
  std::shared_ptr<vfio::Container> container(std::string* error) {
    auto c = vfio::Container::open(env());
    if (!c) {
      *error = c.error().message();
      return nullptr;
    }
    auto group = (*c)->add_group_of(PciAddress{0, 0, 3, 0});
    if (!group) {
      *error = group.error().message();
      return nullptr;
    }
    return *c;
  }
};

}  // namespace ufab::dma::testing
