// Moving a NIC between its kernel driver and vfio-pci, and back.
//
// Every check runs before the first write, so a refused request leaves
// sysfs exactly as it was. Bind records the driver the device had in
// <state_dir>/<address>; unbind hands the device back to that driver.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/pci_address.h"
#include "core/pci/host.h"

namespace ufab::pci {

struct BindOptions {
  // Bind even if one of the device's interfaces carries the host's
  // connection (up with an address or a route). Nothing else is forced.
  bool force = false;
};

struct BindReport {
  PciAddress address;
  std::string previous_driver;  // "" when the device had none
  std::string driver_now;       // "vfio-pci"
  std::optional<unsigned> iommu_group;
  std::string vfio_node;  // <dev>/vfio/N
  // Each sysfs write in order, as a shell command would show it:
  // "echo vfio-pci > /sys/bus/pci/devices/0000:01:00.0/driver_override".
  std::vector<std::string> actions;
  // Things the operator should know, e.g. other group members that still
  // have a kernel driver (the group is not viable until they are unbound).
  std::vector<std::string> warnings;
};

struct UnbindReport {
  PciAddress address;
  // The driver bind recorded: nullopt when there was no record, "" when the
  // device had no driver before bind.
  std::optional<std::string> recorded_driver;
  std::string driver_now;  // "" when none
  std::vector<std::string> actions;
  std::vector<std::string> warnings;
};

// Errors (code: meaning): EINVAL malformed address or not a NIC; ENODEV no
// such device; EALREADY already on vfio-pci; ENOENT vfio-pci not loaded;
// EOPNOTSUPP no IOMMU group or no driver_override; EPERM not root; EACCES a
// sysfs file is not writable; EBUSY carries the host's connection; EIO
// vfio-pci did not take the device (rolled back).
Result<BindReport> bind_to_vfio(const Host& host, const PciAddress& address, BindOptions options = {});
Result<BindReport> bind_to_vfio(const Host& host, const std::string& address, BindOptions options = {});

// Errors: EINVAL malformed address, not a NIC, or not bound to vfio-pci;
// ENODEV no such device; EPERM/EACCES as for bind; EBUSY a process has the
// device's VFIO group open (the kernel would block the unbind until it
// closes it).
Result<UnbindReport> unbind_from_vfio(const Host& host, const PciAddress& address);
Result<UnbindReport> unbind_from_vfio(const Host& host, const std::string& address);

// What bind recorded for a device: nullopt when there is no record.
struct BindRecord {
  std::string previous_driver;  // "" = the device had no driver
};
Result<std::optional<BindRecord>> read_bind_record(const HostPaths& paths, const PciAddress& address);

// Processes that hold the VFIO group or device node of `group` open, as
// "pid 1234 (qemu-system-x86)", from <proc>/<pid>/fd.
std::vector<std::string> vfio_group_users(const HostPaths& paths, unsigned group);

}  // namespace ufab::pci
