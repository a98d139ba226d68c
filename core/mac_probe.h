// Reads a NIC's factory MAC address through the VFIO layer alone, without a
// driver plugin: `ufab info` shows it for models no plugin drives (the
// 82540 "e1000") and as a second opinion when a plugin fails to open the
// device. Which register holds it is per model, kept as data in the .cc.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "base/error.h"
#include "vfio/device.h"

namespace ufab::core {

using MacAddress = std::array<uint8_t, 6>;
std::string format_mac(const MacAddress& mac);  // "52:54:00:00:00:01"

struct MacReading {
  MacAddress mac{};
  std::string source;  // where it was read, e.g. "BAR0 RAL0/RAH0 (0x5400)"
};

// nullopt when ufab does not know where this model keeps its MAC.
Result<std::optional<MacReading>> read_mac(vfio::Device& device, uint16_t vendor_id, uint16_t device_id);

}  // namespace ufab::core
