#include "core/pci/discovery.h"

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <map>
#include <sstream>

#include "base/files.h"
#include "base/hex.h"
#include "core/pci/libpci_scan.h"
#include "core/pci/sysfs_layout.h"

namespace ufab::pci {
namespace {

constexpr unsigned kIffUp = 0x1;  // <linux/if.h>

std::string join(const std::vector<std::string>& parts, const std::string& separator) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? separator : "") + parts[i];
  return out;
}

bool interface_admin_up(const std::string& netdev_dir, const std::string& operstate) {
  if (auto flags = read_attr(netdev_dir + "/flags")) {
    if (auto value = parse_uint(*flags, 16)) return (*value & kIffUp) != 0;
  }
  // Without `flags`, take any state but "down"/"notpresent" as up: erring
  // towards "up" only makes the safety check stricter.
  return operstate == "up" || operstate == "unknown" || operstate == "dormant" || operstate == "testing" ||
         operstate == "lowerlayerdown";
}

NetInterface read_interface(const std::string& netdev_dir, const std::string& name,
                            const Result<HostNetworkState>& network) {
  NetInterface nic;
  nic.name = name;
  nic.operstate = read_attr(netdev_dir + "/operstate").value_or("");
  nic.mac = read_attr(netdev_dir + "/address").value_or("");
  nic.admin_up = interface_admin_up(netdev_dir, nic.operstate);
  if (!network) {
    nic.carries_host_connection = nic.admin_up;
    if (nic.admin_up) {
      nic.connection_reason =
          name + " is up and the host's addresses could not be read (" + network.error().message() + ")";
    }
    return nic;
  }
  std::vector<std::string> evidence;
  for (const InterfaceAddress& a : network->addresses) {
    if (a.interface != name) continue;
    nic.addresses.push_back(a);
    if (!a.link_local) evidence.push_back(a.str());
  }
  for (const Route& r : network->routes) {
    if (r.interface != name) continue;
    nic.routes.push_back(r);
    evidence.push_back("route " + r.str());
  }
  if (nic.admin_up && !evidence.empty()) {
    nic.carries_host_connection = true;
    nic.connection_reason = name + " is up with " + join(evidence, ", ");
  }
  return nic;
}

std::string real_path(const std::string& path) {
  char buf[PATH_MAX];
  if (!::realpath(path.c_str(), buf)) return "";
  return buf;
}

// A NIC's netdevs are not always at <device>/net: virtio-net hangs them off
// its virtio child (<device>/virtio2/net/eth0). <sysfs>/class/net lists
// every netdev as a link into its device's directory, so any netdev whose
// real path lies under the device's real directory belongs to it.
std::vector<NetInterface> read_interfaces(const HostPaths& paths, const std::string& device_dir,
                                          const Result<HostNetworkState>& network) {
  std::map<std::string, std::string> netdev_dirs;  // name -> directory
  for (const std::string& name : list_dir(device_dir + "/net")) netdev_dirs[name] = device_dir + "/net/" + name;
  std::string device_real = real_path(device_dir);
  std::string class_net = paths.sysfs + "/class/net";
  if (!device_real.empty()) {
    for (const std::string& name : list_dir(class_net)) {
      std::string netdev_real = real_path(class_net + "/" + name);
      if (!netdev_real.starts_with(device_real + "/")) continue;
      // Below a bridge the path runs through the child's own directory
      // (.../0000:00:1c.0/0000:02:00.0/net/eth0): that netdev is the child's.
      bool through_other_device = false;
      std::istringstream rest(netdev_real.substr(device_real.size() + 1));
      for (std::string part; std::getline(rest, part, '/');) {
        through_other_device = through_other_device || PciAddress::parse(part).has_value();
      }
      if (!through_other_device) netdev_dirs.emplace(name, netdev_real);
    }
  }
  std::vector<NetInterface> interfaces;
  for (const auto& [name, dir] : netdev_dirs) interfaces.push_back(read_interface(dir, name, network));
  return interfaces;
}

std::vector<GroupMember> read_group_members(const HostPaths& paths, unsigned group) {
  std::vector<GroupMember> members;
  std::string dir = layout::group_devices_dir(paths, group);
  for (const std::string& name : list_dir(dir)) {
    GroupMember m;
    m.name = name;
    m.driver = layout::current_driver(dir + "/" + name);
    m.class_code = layout::class_code_of(dir + "/" + name).value_or(0);
    m.keeps_group_viable = layout::keeps_group_viable(m.driver, m.class_code);
    members.push_back(m);
  }
  return members;
}

VfioGroupNode inspect_vfio_node(const Host& host, unsigned group) {
  VfioGroupNode node;
  node.path = layout::vfio_group_node(host.paths, group);
  struct stat st;
  if (::stat(node.path.c_str(), &st) == 0) {
    node.exists = true;
    node.is_char_device = S_ISCHR(st.st_mode);
    node.mode = st.st_mode & 07777;
    node.accessible = host.can_access(node.path, R_OK | W_OK);
  }
  return node;
}

std::optional<unsigned> read_unsigned(const std::string& path) {
  auto text = read_attr(path);
  if (!text) return std::nullopt;
  auto value = parse_uint(*text, 10);
  if (!value) return std::nullopt;
  return static_cast<unsigned>(*value);
}

std::string describe_members(const std::vector<GroupMember>& members) {
  std::vector<std::string> parts;
  for (const GroupMember& m : members) parts.push_back(m.name + " (" + m.driver + ")");
  return join(parts, ", ");
}

void judge_readiness(DeviceInfo& info) {
  std::string group_text = info.iommu_group ? "IOMMU group " + std::to_string(*info.iommu_group) : "";
  if (!info.is_network()) {
    info.readiness = Readiness::kNotNetwork;
    info.readiness_reason = "class " + hex(info.class_code, 6) +
                            (info.class_name.empty() ? "" : " (" + info.class_name + ")") +
                            " is not a network device; ufab leaves it alone";
    return;
  }
  if (info.driver == layout::kVfioDriver) {
    info.readiness = Readiness::kNotReady;
    if (!info.iommu_group) {
      info.readiness_reason = "bound to vfio-pci but has no IOMMU group (is the IOMMU on?)";
    } else if (!info.group_viable) {
      info.readiness_reason = "bound to vfio-pci, but " + group_text +
                              " is not viable: " + describe_members(info.group_blockers()) +
                              " must be unbound from their drivers (or bound to vfio-pci) too";
    } else if (!info.vfio_node || !info.vfio_node->exists) {
      info.readiness_reason = "bound to vfio-pci, but " + (info.vfio_node ? info.vfio_node->path : "/dev/vfio/N") +
                              " is missing (is the vfio module loaded? see `ufab doctor`)";
    } else {
      info.readiness = Readiness::kReady;
      info.readiness_reason = "bound to vfio-pci; " + group_text + " is viable; " + info.vfio_node->path +
                              " is present" + (info.vfio_node->accessible ? "" : " (but not accessible to this user)");
    }
    return;
  }
  if (info.carries_host_connection()) {
    info.readiness = Readiness::kInUse;
    for (const NetInterface& nic : info.interfaces) {
      if (nic.carries_host_connection) {
        info.readiness_reason = nic.connection_reason +
                                ": it likely carries the host's own connection, so ufab will not take it "
                                "(`ufab bind --force` overrides)";
        break;
      }
    }
    return;
  }
  if (!info.iommu_group) {
    info.readiness = Readiness::kNoIommu;
    info.readiness_reason =
        "no IOMMU group: the IOMMU is off; enable VT-d/AMD-Vi in firmware and boot with intel_iommu=on or "
        "amd_iommu=on";
    return;
  }
  info.readiness = Readiness::kBindable;
  info.readiness_reason = (info.driver.empty() ? std::string("no driver") : "driver " + info.driver) + "; `ufab bind " +
                          info.address.str() + "` hands it to vfio-pci";
  auto blockers = info.group_blockers();
  if (!blockers.empty()) {
    info.readiness_reason += "; " + group_text + " also needs " + describe_members(blockers) + " unbound";
  }
}

DeviceInfo build_info(const Host& host, const libpci::Identity& id, const Result<HostNetworkState>& network) {
  DeviceInfo info;
  info.address = id.address;
  info.vendor_id = id.vendor_id;
  info.device_id = id.device_id;
  info.subsystem_vendor_id = id.subsystem_vendor_id;
  info.subsystem_device_id = id.subsystem_device_id;
  info.revision = id.revision;
  info.class_code = id.class_code;
  info.vendor_name = id.vendor_name;
  info.device_name = id.device_name;
  info.subsystem_name = id.subsystem_name;
  info.class_name = id.class_name;

  std::string dir = layout::device_dir(host.paths, id.address);
  info.driver = layout::current_driver(dir);
  std::string override_text = read_attr(dir + "/driver_override").value_or("");
  info.driver_override = override_text == "(null)" ? "" : override_text;
  info.iommu_group = layout::iommu_group_of(dir);
  if (info.iommu_group) {
    info.group_members = read_group_members(host.paths, *info.iommu_group);
    info.group_viable = true;
    for (const GroupMember& m : info.group_members) info.group_viable = info.group_viable && m.keeps_group_viable;
    info.vfio_node = inspect_vfio_node(host, *info.iommu_group);
  }
  if (auto numa = read_attr(dir + "/numa_node")) {
    char* end = nullptr;
    long value = std::strtol(numa->c_str(), &end, 10);
    if (end && *end == '\0' && !numa->empty()) info.numa_node = static_cast<int>(value);
  }
  info.current_link_speed = read_attr(dir + "/current_link_speed");
  info.max_link_speed = read_attr(dir + "/max_link_speed");
  info.current_link_width = read_unsigned(dir + "/current_link_width");
  info.max_link_width = read_unsigned(dir + "/max_link_width");

  info.interfaces = read_interfaces(host.paths, dir, network);
  if (!network && !info.interfaces.empty()) info.network_error = network.error().message();
  judge_readiness(info);
  return info;
}

}  // namespace

const char* readiness_name(Readiness readiness) {
  switch (readiness) {
    case Readiness::kReady:
      return "ready";
    case Readiness::kNotReady:
      return "not-ready";
    case Readiness::kBindable:
      return "bindable";
    case Readiness::kInUse:
      return "in-use";
    case Readiness::kNoIommu:
      return "no-iommu";
    case Readiness::kNotNetwork:
      return "not-network";
  }
  return "unknown";
}

bool DeviceInfo::carries_host_connection() const {
  for (const NetInterface& nic : interfaces) {
    if (nic.carries_host_connection) return true;
  }
  return false;
}

std::vector<GroupMember> DeviceInfo::group_blockers() const {
  std::vector<GroupMember> blockers;
  for (const GroupMember& m : group_members) {
    if (m.name != address.str() && !m.keeps_group_viable) blockers.push_back(m);
  }
  return blockers;
}

Result<std::vector<DeviceInfo>> list_network_devices(const Host& host) {
  auto identities = libpci::scan(host.paths);
  if (!identities) return std::unexpected(identities.error().context("listing PCI devices"));
  auto network = host.network_state(host.paths);
  std::vector<DeviceInfo> devices;
  for (const libpci::Identity& id : *identities) {
    if (layout::is_network_class(id.class_code)) devices.push_back(build_info(host, id, network));
  }
  return devices;
}

Result<DeviceInfo> describe(const Host& host, const PciAddress& address) {
  if (!path_exists(layout::device_dir(host.paths, address))) {
    return fail(ENODEV, "no PCI device " + address.str() + " on this host (`ufab list` shows the network devices)");
  }
  auto identities = libpci::scan(host.paths);
  if (!identities) return std::unexpected(identities.error().context("describing " + address.str()));
  for (const libpci::Identity& id : *identities) {
    if (id.address == address) return build_info(host, id, host.network_state(host.paths));
  }
  return fail(ENODEV, "libpci does not list " + address.str() + " although " + layout::device_dir(host.paths, address) +
                          " exists; it may be being removed");
}

Result<DeviceInfo> describe(const Host& host, const std::string& address) {
  auto parsed = PciAddress::parse(address);
  if (!parsed) return std::unexpected(parsed.error());
  return describe(host, *parsed);
}

}  // namespace ufab::pci
