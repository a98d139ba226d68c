// The VFIO type1 (TYPE1v2) container backend: /dev/vfio/vfio plus the IOMMU
// groups that join it. One container can hold several groups; all of them
// share its IOVA space and DMA mappings.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "vfio/group.h"
#include "vfio/iommu.h"

namespace ufab::vfio {

class Container final : public IommuBackend {
 public:
  // Opens /dev/vfio/vfio and checks the API version and TYPE1v2 support.
  // The IOMMU is set when the first group joins (the kernel requires a group
  // before VFIO_SET_IOMMU).
  static Result<std::shared_ptr<Container>> open(Environment env = {});

  // Lifetime: devices and DMA mappings hold a std::shared_ptr to their
  // container, so by the time this runs none is left and there is nothing to
  // unmap. The groups are closed (detaching them) and then the container fd,
  // which makes the kernel drop whatever it still holds.
  ~Container() override;

  Container(const Container&) = delete;
  Container& operator=(const Container&) = delete;

  // Adds the IOMMU group of `device` (no-op when already in); returns its
  // number. The group must be viable.
  Result<int> add_group_of(const PciAddress& device);
  Status add_group(int number);
  std::vector<int> groups() const;
  int fd() const { return fd_.get(); }

  // IommuBackend
  std::string_view kind() const override { return "vfio-type1"; }
  const Environment& environment() const override { return env_; }
  Result<KernelFd> open_device(const PciAddress& address) override;
  Result<DmaMapping> map_dma(void* vaddr, uint64_t size, DmaAccess access) override;
  IommuInfo info() const override;
  DmaUsage usage() const override;

 protected:
  Status unmap_dma(uint64_t iova, uint64_t size) override;

 private:
  struct LiveMapping {
    uint64_t size;
    void* vaddr;
  };

  Container(Environment env, KernelFd fd) : env_(std::move(env)), fd_(std::move(fd)) {}
  Status add_group_locked(int number);
  Status refresh_info_locked();
  Status check_limits_locked(uint64_t size) const;
  std::string entry_limit_error(const std::string& what) const;
  std::string memlock_error(const std::string& what, uint64_t limit, std::optional<uint64_t> locked) const;
  uint64_t mapping_alignment(uintptr_t vaddr, uint64_t size) const;

  mutable std::mutex mutex_;
  Environment env_;
  KernelFd fd_;
  // Destroyed before fd_: groups leave the container before it closes.
  std::map<int, Group> groups_;
  bool iommu_set_ = false;
  IommuInfo info_;
  std::optional<IovaAllocator> allocator_;
  std::map<uint64_t, LiveMapping> mappings_;  // by IOVA
  uint64_t pinned_bytes_ = 0;
};

// RLIMIT_MEMLOCK counts against everything the process has locked, which the
// kernel shows as VmLck in /proc/self/status. nullopt when unreadable.
std::optional<uint64_t> locked_memory_bytes(const Environment& env);

}  // namespace ufab::vfio
