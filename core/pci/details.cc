#include "core/pci/details.h"

#include <set>
#include <sstream>

#include "base/files.h"
#include "base/hex.h"
#include "core/pci/sysfs_layout.h"

namespace ufab::pci {
namespace {

// Kernel IORESOURCE_* bits (include/linux/ioport.h).
constexpr uint64_t kResourceIo = 0x100;
constexpr uint64_t kResourceMem = 0x200;
constexpr uint64_t kResourcePrefetch = 0x2000;
constexpr uint64_t kResourceMem64 = 0x100000;

constexpr unsigned kBarCount = 6;
constexpr unsigned kRomIndex = 6;
constexpr unsigned kVfBarFirst = 7;
constexpr unsigned kBridgeWindowFirst = 13;
constexpr size_t kBridgeLinesWithoutSriov = 11;

// Config space offsets (PCI Local Bus spec / PCIe base spec).
constexpr size_t kStatus = 0x06;
constexpr uint16_t kStatusCapList = 0x10;
constexpr size_t kHeaderType = 0x0e;
constexpr size_t kCapPointer = 0x34;
constexpr size_t kCardbusCapPointer = 0x14;
constexpr size_t kStandardHeaderEnd = 0x40;
constexpr size_t kExtendedStart = 0x100;
constexpr size_t kExtendedConfigSize = 4096;
constexpr int kMaxCapabilities = 256;  // far above any real list; stops loops

class ConfigReader {
 public:
  explicit ConfigReader(const std::string& bytes) : bytes_(bytes) {}
  size_t size() const { return bytes_.size(); }
  bool has(size_t offset, size_t len) const { return offset + len <= bytes_.size(); }
  uint8_t u8(size_t o) const { return static_cast<uint8_t>(bytes_[o]); }
  uint16_t u16(size_t o) const { return static_cast<uint16_t>(u8(o) | u8(o + 1) << 8); }
  uint32_t u32(size_t o) const { return static_cast<uint32_t>(u16(o)) | static_cast<uint32_t>(u16(o + 2)) << 16; }
  uint64_t u64(size_t o) const { return static_cast<uint64_t>(u32(o)) | static_cast<uint64_t>(u32(o + 4)) << 32; }

 private:
  const std::string& bytes_;
};

std::string link_speed_text(unsigned code) {
  switch (code) {
    case 1:
      return "2.5 GT/s";
    case 2:
      return "5 GT/s";
    case 3:
      return "8 GT/s";
    case 4:
      return "16 GT/s";
    case 5:
      return "32 GT/s";
    case 6:
      return "64 GT/s";
  }
  return "unknown speed";
}

const char* pcie_port_type(unsigned type) {
  switch (type) {
    case 0x0:
      return "Endpoint";
    case 0x1:
      return "Legacy Endpoint";
    case 0x4:
      return "Root Port";
    case 0x5:
      return "Upstream Port";
    case 0x6:
      return "Downstream Port";
    case 0x7:
      return "PCIe to PCI Bridge";
    case 0x8:
      return "PCI to PCIe Bridge";
    case 0x9:
      return "Root Complex Integrated Endpoint";
    case 0xa:
      return "Root Complex Event Collector";
  }
  return "unknown port type";
}

const char* virtio_cfg_type(unsigned type) {
  switch (type) {
    case 1:
      return "common config";
    case 2:
      return "notify";
    case 3:
      return "ISR";
    case 4:
      return "device config";
    case 5:
      return "PCI config access";
    case 8:
      return "shared memory";
    case 9:
      return "vendor";
  }
  return "unknown";
}

std::string bar_offset(unsigned bar, uint32_t offset) {
  return "BAR" + std::to_string(bar) + "+" + hex(offset, 1);
}

void decode_standard(const ConfigReader& cfg, size_t at, Capability& cap, CapabilityList& list) {
  std::ostringstream d;
  switch (cap.id) {
    case 0x01:  // Power Management
      if (cfg.has(at, 6)) {
        d << "version " << (cfg.u16(at + 2) & 0x7) << ", state D" << (cfg.u16(at + 4) & 0x3);
      }
      break;
    case 0x05:  // MSI
      if (cfg.has(at, 4)) {
        uint16_t control = cfg.u16(at + 2);
        unsigned vectors = 1u << ((control >> 1) & 0x7);
        list.msi_vectors = vectors;
        d << vectors << (vectors == 1 ? " vector" : " vectors") << ((control & 0x80) ? ", 64-bit" : ", 32-bit")
          << ((control & 0x100) ? ", per-vector masking" : "") << ((control & 0x1) ? ", enabled" : "");
      }
      break;
    case 0x09:  // Vendor Specific
      if (cfg.has(at, 3)) {
        d << "length " << unsigned(cfg.u8(at + 2));
        // virtio-pci (vendor 0x1af4) locates its register blocks this way.
        if (cfg.u16(0) == 0x1af4 && cfg.has(at, 16)) {
          d << ", virtio " << virtio_cfg_type(cfg.u8(at + 3)) << " at " << bar_offset(cfg.u8(at + 4), cfg.u32(at + 8))
            << " length " << hex(cfg.u32(at + 12), 1);
        }
      }
      break;
    case 0x10:  // PCI Express
      if (cfg.has(at, 0x14)) {
        uint16_t caps = cfg.u16(at + 2);
        unsigned type = (caps >> 4) & 0xf;
        d << pcie_port_type(type) << ", version " << (caps & 0xf);
        if (type != 0x9 && type != 0xa) {
          uint32_t link_caps = cfg.u32(at + 0x0c);
          uint16_t link_status = cfg.u16(at + 0x12);
          d << ", link x" << ((link_status >> 4) & 0x3f) << " at " << link_speed_text(link_status & 0xf) << " (max x"
            << ((link_caps >> 4) & 0x3f) << " at " << link_speed_text(link_caps & 0xf) << ")";
        }
      }
      break;
    case 0x11:  // MSI-X
      if (cfg.has(at, 12)) {
        uint16_t control = cfg.u16(at + 2);
        uint32_t table = cfg.u32(at + 4);
        uint32_t pba = cfg.u32(at + 8);
        MsixInfo m{static_cast<unsigned>((control & 0x7ff) + 1), table & 0x7, table & ~0x7u, pba & 0x7, pba & ~0x7u};
        list.msix = m;
        d << "table size " << m.vectors << ", table " << bar_offset(m.table_bar, m.table_offset) << ", PBA "
          << bar_offset(m.pba_bar, m.pba_offset) << ((control & 0x8000) ? ", enabled" : "")
          << ((control & 0x4000) ? ", function masked" : "");
      }
      break;
    default:
      break;
  }
  cap.detail = d.str();
}

void decode_extended(const ConfigReader& cfg, size_t at, Capability& cap) {
  std::ostringstream d;
  switch (cap.id) {
    case 0x03:  // Device Serial Number
      if (cfg.has(at, 12)) d << "serial " << hex(cfg.u64(at + 4), 16);
      break;
    case 0x10:  // SR-IOV
      if (cfg.has(at, 0x12)) {
        d << "total VFs " << cfg.u16(at + 0x0e) << ", initial VFs " << cfg.u16(at + 0x0c) << ", enabled VFs "
          << cfg.u16(at + 0x10);
      }
      break;
    case 0x0b:  // Vendor Specific Extended
      if (cfg.has(at, 8)) {
        uint32_t header = cfg.u32(at + 4);
        d << "VSEC id " << hex(header & 0xffff, 4) << " rev " << ((header >> 16) & 0xf) << " length "
          << (header >> 20);
      }
      break;
    default:
      break;
  }
  cap.detail = d.str();
}

void walk_standard(const ConfigReader& cfg, CapabilityList& list) {
  if (!(cfg.u16(kStatus) & kStatusCapList)) return;
  size_t pointer_at = (cfg.u8(kHeaderType) & 0x7f) == 2 ? kCardbusCapPointer : kCapPointer;
  size_t at = cfg.u8(pointer_at) & 0xfc;
  std::set<size_t> seen;
  for (int n = 0; at != 0 && n < kMaxCapabilities; ++n) {
    if (at < kStandardHeaderEnd || !cfg.has(at, 2)) {
      list.notes.push_back("capability pointer " + hex(at, 2) + " points outside the capability area");
      return;
    }
    if (!seen.insert(at).second) {
      list.notes.push_back("capability list loops back to " + hex(at, 2));
      return;
    }
    Capability cap;
    cap.id = cfg.u8(at);
    cap.offset = static_cast<uint16_t>(at);
    cap.name = capability_name(cap.id);
    decode_standard(cfg, at, cap, list);
    list.capabilities.push_back(cap);
    at = cfg.u8(at + 1) & 0xfc;
  }
}

void walk_extended(const ConfigReader& cfg, CapabilityList& list) {
  size_t at = kExtendedStart;
  std::set<size_t> seen;
  for (int n = 0; n < kMaxCapabilities; ++n) {
    if (!cfg.has(at, 4)) {
      list.notes.push_back("extended capability pointer " + hex(at, 3) + " points outside config space");
      return;
    }
    uint32_t header = cfg.u32(at);
    // An empty or all-ones header means there is no extended list at all.
    if (header == 0 || header == 0xffffffff) return;
    if (!seen.insert(at).second) {
      list.notes.push_back("extended capability list loops back to " + hex(at, 3));
      return;
    }
    Capability cap;
    cap.id = static_cast<uint16_t>(header & 0xffff);
    cap.extended = true;
    cap.offset = static_cast<uint16_t>(at);
    cap.version = static_cast<uint8_t>((header >> 16) & 0xf);
    cap.name = extended_capability_name(cap.id);
    decode_extended(cfg, at, cap);
    list.capabilities.push_back(cap);
    size_t next = (header >> 20) & 0xffc;
    if (next == 0) return;
    if (next < kExtendedStart) {
      list.notes.push_back("extended capability pointer " + hex(next, 3) + " points below 0x100");
      return;
    }
    at = next;
  }
}

}  // namespace

std::string Resource::name() const {
  switch (kind) {
    case ResourceKind::kBar:
      return "BAR" + std::to_string(index);
    case ResourceKind::kRom:
      return "ROM";
    case ResourceKind::kVfBar:
      return "VF BAR" + std::to_string(index);
    case ResourceKind::kBridgeWindow:
      return "window " + std::to_string(index);
  }
  return "resource";
}

Result<std::vector<Resource>> parse_resource_table(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!trim(line).empty()) lines.push_back(line);
  }
  size_t window_first = lines.size() == kBridgeLinesWithoutSriov ? kVfBarFirst : kBridgeWindowFirst;
  std::vector<Resource> resources;
  for (size_t i = 0; i < lines.size(); ++i) {
    std::istringstream fields(lines[i]);
    std::string start_text, end_text, flags_text, extra;
    fields >> start_text >> end_text >> flags_text;
    auto start = parse_uint(start_text, 16);
    auto end = parse_uint(end_text, 16);
    auto flags = parse_uint(flags_text, 16);
    if (!start || !end || !flags || (fields >> extra)) {
      return fail(EINVAL, "line " + std::to_string(i + 1) + " of the resource file is not 'start end flags': '" +
                              lines[i] + "'");
    }
    if (*start == 0 && *end == 0 && *flags == 0) continue;
    Resource r;
    if (i < kBarCount) {
      r.kind = ResourceKind::kBar;
      r.index = static_cast<unsigned>(i);
    } else if (i == kRomIndex) {
      r.kind = ResourceKind::kRom;
    } else if (i < window_first) {
      r.kind = ResourceKind::kVfBar;
      r.index = static_cast<unsigned>(i - kVfBarFirst);
    } else {
      r.kind = ResourceKind::kBridgeWindow;
      r.index = static_cast<unsigned>(i - window_first);
    }
    r.start = *start;
    r.end = *end;
    r.size = *end >= *start ? *end - *start + 1 : 0;
    r.flags = *flags;
    r.io = (*flags & kResourceIo) != 0;
    r.memory = (*flags & kResourceMem) != 0;
    r.is_64bit = (*flags & kResourceMem64) != 0;
    r.prefetchable = (*flags & kResourcePrefetch) != 0;
    resources.push_back(r);
  }
  return resources;
}

CapabilityList parse_capabilities(const std::string& config) {
  CapabilityList list;
  ConfigReader cfg(config);
  if (cfg.size() < kStandardHeaderEnd) {
    list.notes.push_back("config space is only " + std::to_string(cfg.size()) +
                         " bytes, too short for a PCI header; capabilities unknown");
    return list;
  }
  if (cfg.size() == kStandardHeaderEnd) {
    // sysfs gives unprivileged readers only the first 64 bytes.
    list.notes.push_back("only the first 64 bytes of config space are readable (run as root to see capabilities)");
    return list;
  }
  walk_standard(cfg, list);
  list.extended_visible = cfg.size() >= kExtendedConfigSize;
  if (list.extended_visible) walk_extended(cfg, list);
  return list;
}

const char* capability_name(uint16_t id) {
  switch (id) {
    case 0x01:
      return "Power Management";
    case 0x02:
      return "AGP";
    case 0x03:
      return "VPD";
    case 0x04:
      return "Slot Identification";
    case 0x05:
      return "MSI";
    case 0x06:
      return "CompactPCI Hot Swap";
    case 0x07:
      return "PCI-X";
    case 0x08:
      return "HyperTransport";
    case 0x09:
      return "Vendor Specific";
    case 0x0a:
      return "Debug Port";
    case 0x0b:
      return "CompactPCI Central Resource Control";
    case 0x0c:
      return "PCI Hot-Plug";
    case 0x0d:
      return "Bridge Subsystem Vendor ID";
    case 0x0e:
      return "AGP 8x";
    case 0x0f:
      return "Secure Device";
    case 0x10:
      return "PCI Express";
    case 0x11:
      return "MSI-X";
    case 0x12:
      return "SATA";
    case 0x13:
      return "Advanced Features";
    case 0x14:
      return "Enhanced Allocation";
    case 0x15:
      return "Flattening Portal Bridge";
  }
  return "unknown capability";
}

const char* extended_capability_name(uint16_t id) {
  switch (id) {
    case 0x01:
      return "Advanced Error Reporting";
    case 0x02:
      return "Virtual Channel";
    case 0x03:
      return "Device Serial Number";
    case 0x04:
      return "Power Budgeting";
    case 0x05:
      return "Root Complex Link Declaration";
    case 0x06:
      return "Root Complex Internal Link Control";
    case 0x07:
      return "Root Complex Event Collector Endpoint Association";
    case 0x08:
      return "Multi-Function Virtual Channel";
    case 0x09:
      return "Virtual Channel (MFVC)";
    case 0x0a:
      return "Root Complex Register Block";
    case 0x0b:
      return "Vendor Specific Extended";
    case 0x0c:
      return "Configuration Access Correlation";
    case 0x0d:
      return "Access Control Services";
    case 0x0e:
      return "Alternative Routing-ID Interpretation";
    case 0x0f:
      return "Address Translation Services";
    case 0x10:
      return "SR-IOV";
    case 0x11:
      return "MR-IOV";
    case 0x12:
      return "Multicast";
    case 0x13:
      return "Page Request";
    case 0x15:
      return "Resizable BAR";
    case 0x16:
      return "Dynamic Power Allocation";
    case 0x17:
      return "TPH Requester";
    case 0x18:
      return "Latency Tolerance Reporting";
    case 0x19:
      return "Secondary PCI Express";
    case 0x1a:
      return "Protocol Multiplexing";
    case 0x1b:
      return "PASID";
    case 0x1c:
      return "LN Requester";
    case 0x1d:
      return "Downstream Port Containment";
    case 0x1e:
      return "L1 PM Substates";
    case 0x1f:
      return "Precision Time Measurement";
    case 0x20:
      return "M-PCIe";
    case 0x21:
      return "FRS Queueing";
    case 0x22:
      return "Readiness Time Reporting";
    case 0x23:
      return "Designated Vendor-Specific";
    case 0x24:
      return "VF Resizable BAR";
    case 0x25:
      return "Data Link Feature";
    case 0x26:
      return "Physical Layer 16.0 GT/s";
    case 0x27:
      return "Lane Margining at the Receiver";
    case 0x28:
      return "Hierarchy ID";
    case 0x29:
      return "Native PCIe Enclosure Management";
    case 0x2a:
      return "Physical Layer 32.0 GT/s";
    case 0x2b:
      return "Alternate Protocol";
    case 0x2c:
      return "System Firmware Intermediary";
  }
  return "unknown extended capability";
}

Result<DeviceDetails> read_details(const Host& host, const PciAddress& address) {
  std::string dir = layout::device_dir(host.paths, address);
  if (!path_exists(dir)) {
    return fail(ENODEV, "no PCI device " + address.str() + " on this host (`ufab list` shows the network devices)");
  }
  DeviceDetails details;
  auto resource_text = read_file(dir + "/resource");
  if (resource_text) {
    auto resources = parse_resource_table(*resource_text);
    if (!resources) return std::unexpected(resources.error().context(dir + "/resource"));
    details.resources = *resources;
  } else {
    details.notes.push_back("BARs unknown: " + resource_text.error().message());
  }
  auto config = read_file(dir + "/config");
  if (config) {
    details.config_size = config->size();
    details.capabilities = parse_capabilities(*config);
  } else {
    details.notes.push_back("capabilities unknown: " + config.error().message());
  }
  return details;
}

}  // namespace ufab::pci
