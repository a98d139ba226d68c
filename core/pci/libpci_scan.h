// Enumeration and name lookup through libpci. Internal to //core/pci.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/pci_address.h"
#include "core/pci/host.h"

namespace ufab::pci::libpci {

struct Identity {
  PciAddress address;
  uint16_t vendor_id = 0;
  uint16_t device_id = 0;
  uint16_t subsystem_vendor_id = 0;
  uint16_t subsystem_device_id = 0;
  uint8_t revision = 0;
  uint32_t class_code = 0;  // base << 16 | subclass << 8 | prog-if
  // From pci.ids; empty when the database does not know the id.
  std::string vendor_name;
  std::string device_name;
  std::string subsystem_name;
  std::string class_name;
};

// Every PCI function under <sysfs>/bus/pci, sorted by address.
Result<std::vector<Identity>> scan(const HostPaths& paths);

}  // namespace ufab::pci::libpci
