// IOMMU groups: the unit of isolation VFIO hands out. A device can only be
// used when every device of its group is bound to vfio-pci (or to no driver):
// otherwise a kernel driver could DMA through the same IOMMU context.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/pci_address.h"
#include "vfio/kernel.h"

namespace ufab::vfio {

struct GroupMember {
  std::string device;                 // sysfs name, e.g. "0000:00:03.0"
  std::optional<std::string> driver;  // nullopt when no driver is bound
};

// Drivers that leave a group viable: VFIO's own (vfio-pci and its variant
// drivers, named "*vfio-pci"), pci-stub, and pcieport (a bridge driver that
// does no DMA; the kernel lets it share a group). No driver is fine too.
bool driver_keeps_group_viable(const std::optional<std::string>& driver);

// Group number from <sysfs>/bus/pci/devices/<bdf>/iommu_group.
Result<int> iommu_group_of(const Environment& env, const PciAddress& device);
// <sysfs>/kernel/iommu_groups/<n>/devices/* with each device's bound driver.
std::vector<GroupMember> iommu_group_members(const Environment& env, int group);
// The driver bound to a PCI device, from its sysfs `driver` link.
std::optional<std::string> bound_driver(const Environment& env, const std::string& device);

// An open /dev/vfio/<n>. Closing it detaches the group from its container.
class Group {
 public:
  static Result<Group> open(const Environment& env, int number);

  int number() const { return number_; }
  int fd() const { return fd_.get(); }

  // VFIO_GROUP_GET_STATUS flags (VFIO_GROUP_FLAGS_VIABLE, _CONTAINER_SET).
  Result<uint32_t> status_flags() const;
  // OK when viable; otherwise an error that names each device of the group
  // holding it back, its driver, and the command that fixes it.
  Status require_viable() const;
  // VFIO_GROUP_SET_CONTAINER.
  Status set_container(int container_fd);
  // VFIO_GROUP_GET_DEVICE_FD; the group must be in a container with an IOMMU
  // set.
  Result<KernelFd> open_device(const PciAddress& device) const;

 private:
  Group(Environment env, int number, KernelFd fd) : env_(std::move(env)), number_(number), fd_(std::move(fd)) {}
  Status not_viable_error() const;

  Environment env_;
  int number_ = -1;
  KernelFd fd_;
};

}  // namespace ufab::vfio
