// What `ufab info` shows beyond discovery, from sysfs alone (no VFIO):
// the BARs from <device>/resource and the capability lists in <device>/config.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/pci_address.h"
#include "core/pci/host.h"

namespace ufab::pci {

enum class ResourceKind { kBar, kRom, kVfBar, kBridgeWindow };

// One line of <device>/resource that describes an assigned region.
struct Resource {
  ResourceKind kind = ResourceKind::kBar;
  unsigned index = 0;  // BAR/VF BAR number (0..5), 0 for the ROM
  uint64_t start = 0;
  uint64_t end = 0;
  uint64_t size = 0;
  uint64_t flags = 0;  // kernel IORESOURCE_* bits, as printed
  bool io = false;
  bool memory = false;
  bool is_64bit = false;
  bool prefetchable = false;

  std::string name() const;  // "BAR0", "ROM", "VF BAR2", "window 3"
};

// Parses the text of <device>/resource: lines "start end flags" in hex, in
// the kernel's order: BAR0..5, ROM, SR-IOV VF BAR0..5, then a bridge's
// windows (right after the ROM on kernels without SR-IOV support, which
// print 11 lines for a bridge). Unused (all-zero) lines are skipped. A
// malformed line is an error naming it.
Result<std::vector<Resource>> parse_resource_table(const std::string& text);

struct Capability {
  uint16_t id = 0;
  bool extended = false;  // PCIe extended capability (offset >= 0x100)
  uint16_t offset = 0;
  uint8_t version = 0;  // extended capabilities only
  std::string name;     // "MSI-X", "PCI Express", "Vendor Specific", ...
  std::string detail;   // decoded fields, e.g. "table size 3, table BAR0+0x8000, PBA BAR0+0x48000"
};

struct MsixInfo {
  unsigned vectors = 0;
  unsigned table_bar = 0;
  uint32_t table_offset = 0;
  unsigned pba_bar = 0;
  uint32_t pba_offset = 0;
};

struct CapabilityList {
  std::vector<Capability> capabilities;
  std::optional<MsixInfo> msix;
  std::optional<unsigned> msi_vectors;  // vectors the MSI capability can request
  bool extended_visible = false;        // config space was 4096 bytes
  // Problems found while walking (loops, pointers out of range, a short
  // config space), each a sentence.
  std::vector<std::string> notes;
};

// Walks the standard list (from 0x34) and, with 4096 bytes, the extended
// list (from 0x100). Never reads outside `config`.
CapabilityList parse_capabilities(const std::string& config);

const char* capability_name(uint16_t id);           // standard ids
const char* extended_capability_name(uint16_t id);  // extended ids

struct DeviceDetails {
  std::vector<Resource> resources;
  CapabilityList capabilities;
  size_t config_size = 0;
  // What could not be read (e.g. config space as non-root), as sentences.
  std::vector<std::string> notes;
};

Result<DeviceDetails> read_details(const Host& host, const PciAddress& address);

}  // namespace ufab::pci
