// PCI discovery: what NICs this host has, who drives them, their IOMMU
// groups, their network interfaces, and whether ufab can take them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/pci_address.h"
#include "core/pci/host.h"

namespace ufab::pci {

// How far a device is from being usable by ufab.
enum class Readiness {
  kReady,       // bound to vfio-pci, IOMMU group viable, /dev/vfio/N present
  kNotReady,    // bound to vfio-pci, but the group is not viable or the node is missing
  kBindable,    // has an IOMMU group and carries no host connection: `ufab bind` can take it
  kInUse,       // one of its interfaces carries the host's connection
  kNoIommu,     // no IOMMU group: VFIO cannot use it until the IOMMU is on
  kNotNetwork,  // not a network device (class 0x02); ufab leaves it alone
};
// "ready", "not-ready", "bindable", "in-use", "no-iommu", "not-network".
const char* readiness_name(Readiness readiness);

// A kernel network interface of the device: <device>/net/<name>, or any
// <sysfs>/class/net/<name> that leads into the device (virtio-net puts it
// under <device>/virtioN/net/<name>).
struct NetInterface {
  std::string name;
  std::string operstate;  // "up", "down", "unknown", ... ("" when unreadable)
  std::string mac;
  bool admin_up = false;  // IFF_UP in `flags` (operstate when `flags` is absent)
  std::vector<InterfaceAddress> addresses;
  std::vector<Route> routes;
  // Up with a non-link-local address or a route: most likely how the host
  // itself is reached, so binding would cut the connection.
  bool carries_host_connection = false;
  // Why carries_host_connection is set, e.g. "eth0 is up with 192.0.2.2/24".
  std::string connection_reason;
};

// One member of an IOMMU group (the device itself included).
struct GroupMember {
  std::string name;  // PCI address as sysfs names it
  std::string driver;
  uint32_t class_code = 0;
  bool keeps_group_viable = false;  // no driver, vfio-pci, pci-stub or a bridge
};

struct VfioGroupNode {
  std::string path;  // <dev>/vfio/N
  bool exists = false;
  bool is_char_device = false;
  unsigned mode = 0;        // permission bits, e.g. 0600
  bool accessible = false;  // read+write for this process
};

struct DeviceInfo {
  PciAddress address;
  uint16_t vendor_id = 0;
  uint16_t device_id = 0;
  uint16_t subsystem_vendor_id = 0;
  uint16_t subsystem_device_id = 0;
  uint8_t revision = 0;
  uint32_t class_code = 0;  // 24 bits: base << 16 | subclass << 8 | prog-if
  // Names from pci.ids; empty when unknown (print the ids then).
  std::string vendor_name;
  std::string device_name;
  std::string subsystem_name;
  std::string class_name;

  std::string driver;           // bound driver, "" when none
  std::string driver_override;  // "" when unset
  std::optional<unsigned> iommu_group;
  std::vector<GroupMember> group_members;
  bool group_viable = false;
  int numa_node = -1;  // -1 = unknown / single node

  std::optional<std::string> current_link_speed;  // "8.0 GT/s PCIe"
  std::optional<unsigned> current_link_width;
  std::optional<std::string> max_link_speed;
  std::optional<unsigned> max_link_width;

  std::vector<NetInterface> interfaces;
  // Set when the host's addresses/routes could not be read; interfaces that
  // are up are then treated as carrying the host's connection.
  std::string network_error;

  std::optional<VfioGroupNode> vfio_node;  // when there is an IOMMU group

  Readiness readiness = Readiness::kNotNetwork;
  std::string readiness_reason;  // one line

  bool is_network() const { return (class_code >> 16) == 0x02; }
  bool carries_host_connection() const;
  // Group members other than this device that keep the group from being viable.
  std::vector<GroupMember> group_blockers() const;
};

// Every PCI function of class 0x02 (network controller), sorted by address.
Result<std::vector<DeviceInfo>> list_network_devices(const Host& host);
// One device of any class (so `ufab info` can say "not a NIC"). A missing
// device is ENODEV with a pointer to `ufab list`.
Result<DeviceInfo> describe(const Host& host, const PciAddress& address);
// Same, parsing the address first (a malformed one is EINVAL).
Result<DeviceInfo> describe(const Host& host, const std::string& address);

}  // namespace ufab::pci
