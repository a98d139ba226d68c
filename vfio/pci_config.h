// PCI configuration space layout (PCI Local Bus 3.0 ch. 6, PCIe Base 4.0
// ch. 7) and the walk of its capability lists, over a snapshot of the bytes.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/error.h"

namespace ufab::vfio::pci {

inline constexpr uint32_t kVendorId = 0x00;
inline constexpr uint32_t kDeviceId = 0x02;
inline constexpr uint32_t kCommand = 0x04;
inline constexpr uint16_t kCommandIoSpace = 1u << 0;
inline constexpr uint16_t kCommandMemorySpace = 1u << 1;
inline constexpr uint16_t kCommandBusMaster = 1u << 2;
inline constexpr uint16_t kCommandIntxDisable = 1u << 10;
inline constexpr uint32_t kStatus = 0x06;
inline constexpr uint16_t kStatusCapabilityList = 1u << 4;
inline constexpr uint32_t kRevisionId = 0x08;
inline constexpr uint32_t kClassCode = 0x09;  // 3 bytes: prog-if, subclass, class
inline constexpr uint32_t kHeaderType = 0x0e;
inline constexpr uint32_t kCapabilityPointer = 0x34;
inline constexpr uint32_t kExtendedCapabilitiesStart = 0x100;
inline constexpr uint32_t kConventionalConfigSize = 0x100;
inline constexpr uint32_t kExpressConfigSize = 0x1000;

// Standard capability IDs.
inline constexpr uint8_t kCapPowerManagement = 0x01;
inline constexpr uint8_t kCapMsi = 0x05;
inline constexpr uint8_t kCapVendorSpecific = 0x09;
inline constexpr uint8_t kCapPciExpress = 0x10;
inline constexpr uint8_t kCapMsix = 0x11;

struct Capability {
  uint8_t id = 0;
  uint8_t offset = 0;
  bool operator==(const Capability&) const = default;
};

struct ExtendedCapability {
  uint16_t id = 0;
  uint8_t version = 0;
  uint16_t offset = 0;
  bool operator==(const ExtendedCapability&) const = default;
};

// From the MSI-X capability (PCI 3.0 6.8.2): where the vector table and the
// pending-bit array live.
struct MsixCapability {
  uint8_t offset = 0;        // of the capability in config space
  uint16_t table_size = 0;   // number of vectors
  bool enabled = false;
  bool function_masked = false;
  uint8_t table_bar = 0;
  uint32_t table_offset = 0;
  uint8_t pba_bar = 0;
  uint32_t pba_offset = 0;
};

// Standard capabilities in list order. Empty when the status register says
// there is no list. A pointer into the header, outside the 256 bytes, or a
// loop makes the list malformed: EPROTO, naming the offset.
Result<std::vector<Capability>> capabilities(std::span<const uint8_t> config);
// PCIe extended capabilities from 0x100; empty when config space is only 256
// bytes or the first header is 0 / all ones.
Result<std::vector<ExtendedCapability>> extended_capabilities(std::span<const uint8_t> config);
// nullopt when the function has no MSI-X capability.
Result<std::optional<MsixCapability>> msix_capability(std::span<const uint8_t> config);

// "MSI-X", "PCI Express", ... or "0x42" for IDs without a name here.
std::string capability_name(uint8_t id);
std::string extended_capability_name(uint16_t id);

}  // namespace ufab::vfio::pci
