// Where things live in sysfs/devfs for one PCI device, and the small reads
// every part of core/pci shares. Internal to //core/pci.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "base/pci_address.h"
#include "core/pci/host.h"

namespace ufab::pci::layout {

inline constexpr const char* kVfioDriver = "vfio-pci";

std::string pci_bus_dir(const HostPaths& paths);  // <sysfs>/bus/pci
std::string device_dir(const HostPaths& paths, const PciAddress& address);
std::string drivers_dir(const HostPaths& paths);
std::string driver_dir(const HostPaths& paths, const std::string& driver);
std::string iommu_groups_dir(const HostPaths& paths);
std::string group_devices_dir(const HostPaths& paths, unsigned group);
std::string vfio_group_node(const HostPaths& paths, unsigned group);  // <dev>/vfio/N
std::string state_file(const HostPaths& paths, const PciAddress& address);

// Name of the bound driver ("" when none), from the `driver` link.
std::string current_driver(const std::string& device_dir);
std::optional<unsigned> iommu_group_of(const std::string& device_dir);
// The 24-bit class code (base << 16 | subclass << 8 | prog-if) from `class`.
std::optional<uint32_t> class_code_of(const std::string& device_dir);

inline bool is_network_class(uint32_t class_code) { return (class_code >> 16) == 0x02; }
inline bool is_bridge_class(uint32_t class_code) { return (class_code >> 8) == 0x0604; }

// Whether a device bound to `driver` lets VFIO use its IOMMU group: no
// driver, vfio-pci (or a vfio-pci variant such as mlx5_vfio_pci), pci-stub,
// or a PCI bridge (pcieport), as the kernel's DMA-ownership rule allows.
bool keeps_group_viable(const std::string& driver, uint32_t class_code);

}  // namespace ufab::pci::layout
