#include "core/pci/sysfs_layout.h"

#include <cstdio>

#include "base/files.h"

namespace ufab::pci::layout {

std::string pci_bus_dir(const HostPaths& paths) { return paths.sysfs + "/bus/pci"; }
std::string device_dir(const HostPaths& paths, const PciAddress& address) {
  return pci_bus_dir(paths) + "/devices/" + address.str();
}
std::string drivers_dir(const HostPaths& paths) { return pci_bus_dir(paths) + "/drivers"; }
std::string driver_dir(const HostPaths& paths, const std::string& driver) { return drivers_dir(paths) + "/" + driver; }
std::string iommu_groups_dir(const HostPaths& paths) { return paths.sysfs + "/kernel/iommu_groups"; }
std::string group_devices_dir(const HostPaths& paths, unsigned group) {
  return iommu_groups_dir(paths) + "/" + std::to_string(group) + "/devices";
}
std::string vfio_group_node(const HostPaths& paths, unsigned group) {
  return paths.dev + "/vfio/" + std::to_string(group);
}
std::string state_file(const HostPaths& paths, const PciAddress& address) {
  return paths.state_dir + "/" + address.str();
}

std::string current_driver(const std::string& device_dir) { return link_basename(device_dir + "/driver").value_or(""); }

std::optional<unsigned> iommu_group_of(const std::string& device_dir) {
  auto name = link_basename(device_dir + "/iommu_group");
  if (!name) return std::nullopt;
  auto number = parse_uint(*name, 10);
  if (!number) return std::nullopt;
  return static_cast<unsigned>(*number);
}

std::optional<uint32_t> class_code_of(const std::string& device_dir) {
  auto text = read_attr(device_dir + "/class");
  if (!text) return std::nullopt;
  auto value = parse_uint(*text, 16);
  if (!value) return std::nullopt;
  return static_cast<uint32_t>(*value);
}

bool keeps_group_viable(const std::string& driver, uint32_t class_code) {
  if (driver.empty() || driver == kVfioDriver || driver == "pci-stub") return true;
  // Variant drivers built on vfio-pci-core (mlx5_vfio_pci, hisi_acc_vfio_pci).
  if (driver.size() > 8 && driver.ends_with("vfio_pci")) return true;
  return is_bridge_class(class_code);
}

}  // namespace ufab::pci::layout
