#include "vfio/group.h"

#include <fcntl.h>
#include <linux/vfio.h>

#include <cerrno>

#include "base/files.h"

namespace ufab::vfio {
namespace {

std::string device_dir(const Environment& env, const std::string& device) {
  return env.sysfs_root + "/bus/pci/devices/" + device;
}

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (const auto& p : parts) {
    if (!out.empty()) out += sep;
    out += p;
  }
  return out;
}

std::string describe_members(const std::vector<GroupMember>& members) {
  std::vector<std::string> parts;
  for (const auto& m : members) parts.push_back(m.device + " (" + (m.driver ? *m.driver : "no driver") + ")");
  return parts.empty() ? "none listed in sysfs" : join(parts, ", ");
}

}  // namespace

bool driver_keeps_group_viable(const std::optional<std::string>& driver) {
  if (!driver) return true;
  const std::string& d = *driver;
  static const std::string kVfioPci = "vfio-pci";
  if (d.size() >= kVfioPci.size() && d.compare(d.size() - kVfioPci.size(), kVfioPci.size(), kVfioPci) == 0)
    return true;
  return d == "pci-stub" || d == "pcieport";
}

std::optional<std::string> bound_driver(const Environment& env, const std::string& device) {
  return link_basename(device_dir(env, device) + "/driver");
}

Result<int> iommu_group_of(const Environment& env, const PciAddress& device) {
  const std::string dir = device_dir(env, device.str());
  if (!path_exists(dir))
    return fail(ENODEV, "no PCI device " + device.str() + " (" + dir +
                            " does not exist); `ufab list` shows the devices present");
  auto group = link_basename(dir + "/iommu_group");
  if (!group)
    return fail(ENODEV, "PCI device " + device.str() +
                            " has no IOMMU group: the IOMMU is off or absent. Enable it on the kernel "
                            "command line (`intel_iommu=on` or `amd_iommu=on`; in QEMU add "
                            "`-device intel-iommu,intremap=on`) and reboot");
  auto number = parse_uint(*group, 10);
  if (!number || *number > 1000000)
    return fail(EPROTO, "cannot parse the IOMMU group of " + device.str() + " ('" + *group + "' in " + dir +
                            "/iommu_group); no-IOMMU mode groups are not supported");
  return static_cast<int>(*number);
}

std::vector<GroupMember> iommu_group_members(const Environment& env, int group) {
  std::vector<GroupMember> members;
  for (const auto& name :
       list_dir(env.sysfs_root + "/kernel/iommu_groups/" + std::to_string(group) + "/devices")) {
    members.push_back({name, bound_driver(env, name)});
  }
  return members;
}

Result<Group> Group::open(const Environment& env, int number) {
  const std::string path = env.dev_root + "/vfio/" + std::to_string(number);
  int fd = env.kernel->open(path.c_str(), O_RDWR);
  if (fd < 0) {
    int err = errno;
    switch (err) {
      case ENOENT: {
        if (!path_exists(env.dev_root + "/vfio/vfio"))
          return fail(err, "cannot open " + path + ": VFIO is not loaded (no " + env.dev_root +
                               "/vfio/vfio); run `modprobe vfio-pci`, then bind the device with `ufab bind`");
        std::vector<std::string> hints;
        for (const auto& m : iommu_group_members(env, number))
          if (!m.driver || *m.driver != "vfio-pci") hints.push_back("`ufab bind " + m.device + "`");
        return fail(err, "cannot open " + path + ": no device of IOMMU group " + std::to_string(number) +
                             " is bound to vfio-pci (members: " +
                             describe_members(iommu_group_members(env, number)) + "); bind it" +
                             (hints.empty() ? std::string() : " with " + join(hints, ", ")));
      }
      case EACCES:
      case EPERM:
        return fail(err, "cannot open " + path + ": permission denied; run as root, or give this user the "
                             "group file (`chown $USER " + path + "` or a udev rule) and raise its "
                             "memlock limit");
      case EBUSY:
        return fail(err, "cannot open " + path + ": IOMMU group " + std::to_string(number) +
                             " is already in use by another process (another ufab, QEMU or DPDK); VFIO "
                             "allows one user per group");
      default:
        return fail_errno(err, "cannot open " + path);
    }
  }
  return Group(env, number, KernelFd(*env.kernel, fd));
}

Result<uint32_t> Group::status_flags() const {
  vfio_group_status status{};
  status.argsz = sizeof status;
  if (env_.kernel->ioctl(fd_.get(), VFIO_GROUP_GET_STATUS, &status) != 0)
    return fail_errno("VFIO_GROUP_GET_STATUS on IOMMU group " + std::to_string(number_));
  return status.flags;
}

Status Group::require_viable() const {
  auto flags = status_flags();
  if (!flags) return std::unexpected(flags.error());
  if (*flags & VFIO_GROUP_FLAGS_VIABLE) return {};
  return not_viable_error();
}

Status Group::not_viable_error() const {
  const std::string group = "IOMMU group " + std::to_string(number_);
  auto members = iommu_group_members(env_, number_);
  std::vector<std::string> offenders, fixes;
  for (const auto& m : members) {
    if (driver_keeps_group_viable(m.driver)) continue;
    offenders.push_back(m.device + " is bound to " + *m.driver);
    fixes.push_back("`ufab bind " + m.device + "`");
  }
  if (offenders.empty())
    return fail(EBUSY, group + " is not viable, yet every device listed in " + env_.sysfs_root +
                           "/kernel/iommu_groups/" + std::to_string(number_) + "/devices (" +
                           describe_members(members) +
                           ") is bound to vfio-pci or to no driver; a driver may be binding right "
                           "now: retry, and check `dmesg`");
  return fail(EBUSY, group + " is not viable: " + join(offenders, ", ") +
                         "; bind every device of the group to vfio-pci (" + join(fixes, ", ") +
                         ") or unbind " + (offenders.size() == 1 ? "it" : "them") +
                         " from its driver");
}

Status Group::set_container(int container_fd) {
  int fd = container_fd;
  if (env_.kernel->ioctl(fd_.get(), VFIO_GROUP_SET_CONTAINER, &fd) == 0) return {};
  int err = errno;
  const std::string what = "VFIO_GROUP_SET_CONTAINER for IOMMU group " + std::to_string(number_);
  if (err == EPERM || err == EBUSY) {
    // The kernel claims DMA ownership of the group here; that fails when a
    // kernel driver still owns one of its devices.
    auto viable = require_viable();
    if (!viable) return std::unexpected(viable.error().context(what + " failed"));
    return fail_errno(err, what + " (if the container already holds another group, this platform may "
                                  "lack interrupt remapping; see the SET_IOMMU error)");
  }
  if (err == EINVAL)
    return fail_errno(err, what + " (the group already belongs to a container, or its reserved IOVA "
                                  "regions conflict with existing DMA mappings)");
  return fail_errno(err, what);
}

Result<KernelFd> Group::open_device(const PciAddress& device) const {
  std::string name = device.str();
  int fd = env_.kernel->ioctl(fd_.get(), VFIO_GROUP_GET_DEVICE_FD, name.data());
  if (fd >= 0) return KernelFd(*env_.kernel, fd);
  int err = errno;
  const std::string what = "VFIO_GROUP_GET_DEVICE_FD(" + name + ") on IOMMU group " + std::to_string(number_);
  if (err == ENODEV)
    return fail_errno(err, what + ": the device is not in this group (members: " +
                               describe_members(iommu_group_members(env_, number_)) + ")");
  if (err == EINVAL)
    return fail_errno(err, what + ": the group has no container with an IOMMU set yet");
  if (err == EBUSY)
    return fail_errno(err, what + ": the device is already open elsewhere");
  return fail_errno(err, what);
}

}  // namespace ufab::vfio
