#include "vfio/pci_config.h"

#include <cerrno>
#include <set>

#include "vfio/text.h"

namespace ufab::vfio::pci {
namespace {

uint16_t le16_at(std::span<const uint8_t> c, uint32_t off) {
  return static_cast<uint16_t>(c[off] | (c[off + 1] << 8));
}
uint32_t le32_at(std::span<const uint8_t> c, uint32_t off) {
  return uint32_t{c[off]} | (uint32_t{c[off + 1]} << 8) | (uint32_t{c[off + 2]} << 16) |
         (uint32_t{c[off + 3]} << 24);
}

}  // namespace

Result<std::vector<Capability>> capabilities(std::span<const uint8_t> config) {
  std::vector<Capability> caps;
  if (config.size() < kConventionalConfigSize)
    return fail(EINVAL, "PCI config snapshot of " + std::to_string(config.size()) +
                            " bytes is shorter than the 256-byte header + capability area");
  if (!(le16_at(config, kStatus) & kStatusCapabilityList)) return caps;
  std::set<uint8_t> seen;
  uint8_t pointer = config[kCapabilityPointer] & 0xfc;
  uint32_t from = kCapabilityPointer;
  while (pointer != 0) {
    if (pointer < 0x40)
      return fail(EPROTO, "malformed PCI capability list: pointer at " + hex(from) + " leads to " + hex(pointer) +
                              ", inside the standard header");
    if (!seen.insert(pointer).second)
      return fail(EPROTO, "malformed PCI capability list: pointer at " + hex(from) + " loops back to " +
                              hex(pointer));
    caps.push_back({config[pointer], pointer});
    from = pointer + 1u;
    pointer = config[pointer + 1u] & 0xfc;
  }
  return caps;
}

Result<std::vector<ExtendedCapability>> extended_capabilities(std::span<const uint8_t> config) {
  std::vector<ExtendedCapability> caps;
  if (config.size() < kExpressConfigSize) return caps;
  std::set<uint32_t> seen;
  uint32_t offset = kExtendedCapabilitiesStart;
  while (offset != 0) {
    if (offset < kExtendedCapabilitiesStart || offset + 4 > config.size())
      return fail(EPROTO, "malformed PCIe extended capability list: next pointer " + hex(offset) +
                              " is outside 0x100-0xffc");
    if (!seen.insert(offset).second)
      return fail(EPROTO, "malformed PCIe extended capability list: loop at " + hex(offset));
    uint32_t header = le32_at(config, offset);
    if (header == 0 || header == 0xffffffffu) {
      if (offset == kExtendedCapabilitiesStart) return caps;  // no extended capabilities
      return fail(EPROTO, "malformed PCIe extended capability list: empty header at " + hex(offset));
    }
    caps.push_back({static_cast<uint16_t>(header & 0xffff), static_cast<uint8_t>((header >> 16) & 0xf),
                    static_cast<uint16_t>(offset)});
    offset = (header >> 20) & 0xffc;
  }
  return caps;
}

Result<std::optional<MsixCapability>> msix_capability(std::span<const uint8_t> config) {
  auto caps = capabilities(config);
  if (!caps) return std::unexpected(caps.error());
  for (const auto& cap : *caps) {
    if (cap.id != kCapMsix) continue;
    if (cap.offset + 12u > config.size())
      return fail(EPROTO, "MSI-X capability at " + hex(cap.offset) + " runs past config space");
    MsixCapability m;
    m.offset = cap.offset;
    uint16_t control = le16_at(config, cap.offset + 2u);
    m.table_size = static_cast<uint16_t>((control & 0x7ff) + 1);
    m.function_masked = control & (1u << 14);
    m.enabled = control & (1u << 15);
    uint32_t table = le32_at(config, cap.offset + 4u);
    uint32_t pba = le32_at(config, cap.offset + 8u);
    m.table_bar = table & 7;
    m.table_offset = table & ~7u;
    m.pba_bar = pba & 7;
    m.pba_offset = pba & ~7u;
    return std::optional<MsixCapability>(m);
  }
  return std::optional<MsixCapability>();
}

std::string capability_name(uint8_t id) {
  switch (id) {
    case 0x01: return "Power Management";
    case 0x03: return "VPD";
    case 0x05: return "MSI";
    case 0x09: return "Vendor Specific";
    case 0x0d: return "Bridge Subsystem Vendor";
    case 0x10: return "PCI Express";
    case 0x11: return "MSI-X";
    case 0x12: return "SATA";
    case 0x13: return "Advanced Features";
    default: return hex(id);
  }
}

std::string extended_capability_name(uint16_t id) {
  switch (id) {
    case 0x0001: return "Advanced Error Reporting";
    case 0x0002: return "Virtual Channel";
    case 0x0003: return "Device Serial Number";
    case 0x000b: return "Vendor Specific";
    case 0x000d: return "Access Control Services";
    case 0x000e: return "Alternative Routing-ID";
    case 0x0010: return "SR-IOV";
    case 0x0015: return "Resizable BAR";
    case 0x0018: return "Latency Tolerance Reporting";
    case 0x001e: return "L1 PM Substates";
    default: return hex(id);
  }
}

}  // namespace ufab::vfio::pci
