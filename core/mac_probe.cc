#include "core/mac_probe.h"

#include <cstdio>
#include <span>

namespace ufab::core {
namespace {

enum class MacLocation {
  // Intel receive address 0: RAL0 (MAC bytes 0-3, LE) and RAH0 (bytes 4-5,
  // bit 31 Address Valid) in BAR0 (82574L datasheet 10.2.5.8; same offsets
  // on the 82540 and 82576).
  kIntelRal0,
  // virtio 1.x: the `mac` field at offset 0 of the device-specific config
  // structure, found through the vendor capability with cfg_type 4
  // (virtio spec 1.1 4.1.4.6 and 5.1.4).
  kVirtioDeviceConfig,
};

struct ModelEntry {
  uint16_t vendor;
  uint16_t device;
  MacLocation where;
};

constexpr ModelEntry kModels[] = {
    {0x8086, 0x10d3, MacLocation::kIntelRal0},  // 82574L (e1000e)
    {0x8086, 0x10c9, MacLocation::kIntelRal0},  // 82576 (igb)
    {0x8086, 0x100e, MacLocation::kIntelRal0},  // 82540EM (e1000)
    {0x1af4, 0x1041, MacLocation::kVirtioDeviceConfig},
};

constexpr uint32_t kRal0 = 0x5400;
constexpr uint32_t kRah0 = 0x5404;
constexpr uint32_t kRahAddressValid = 1u << 31;

constexpr uint8_t kVirtioPciCapDeviceCfg = 4;

Result<MacReading> read_intel(vfio::Device& device) {
  auto bar = device.map_region(vfio::kBar0Region);
  if (!bar) return std::unexpected(bar.error().context("mapping BAR0"));
  auto low = (*bar)->read32(kRal0);
  auto high = (*bar)->read32(kRah0);
  if (!low) return std::unexpected(low.error());
  if (!high) return std::unexpected(high.error());
  if (!(*high & kRahAddressValid)) {
    return fail(ENODATA, "RAH0 Address Valid is clear: the NIC holds no MAC in receive address 0");
  }
  MacReading r;
  for (int i = 0; i < 4; ++i) r.mac[i] = static_cast<uint8_t>(*low >> (8 * i));
  r.mac[4] = static_cast<uint8_t>(*high);
  r.mac[5] = static_cast<uint8_t>(*high >> 8);
  r.source = "BAR0 RAL0/RAH0 (0x5400)";
  return r;
}

Result<MacReading> read_virtio(vfio::Device& device) {
  auto config = device.config_snapshot();
  if (!config) return std::unexpected(config.error());
  auto caps = vfio::pci::capabilities(std::span<const uint8_t>(*config));
  if (!caps) return std::unexpected(caps.error());
  for (const auto& cap : *caps) {
    if (cap.id != vfio::pci::kCapVendorSpecific || cap.offset + 16u > config->size()) continue;
    const uint8_t* c = config->data() + cap.offset;
    if (c[3] != kVirtioPciCapDeviceCfg) continue;
    uint8_t bar = c[4];
    uint32_t offset = c[8] | c[9] << 8 | c[10] << 16 | static_cast<uint32_t>(c[11]) << 24;
    auto region = device.map_region(bar);
    if (!region) return std::unexpected(region.error().context("mapping the virtio device config BAR"));
    MacReading r;
    for (uint32_t i = 0; i < 6; ++i) {
      auto reg = (*region)->reg8(offset + i);
      if (!reg) return std::unexpected(reg.error());
      r.mac[i] = reg->read();
    }
    char buf[64];
    std::snprintf(buf, sizeof buf, "virtio device config (BAR%u+0x%x)", bar, offset);
    r.source = buf;
    return r;
  }
  return fail(ENODATA, "no virtio device-config capability (cfg_type 4): not a modern virtio-net device");
}

}  // namespace

std::string format_mac(const MacAddress& mac) {
  char buf[18];
  std::snprintf(buf, sizeof buf, "%02x:%02x:%02x:%02x:%02x:%02x", mac[0], mac[1], mac[2], mac[3], mac[4], mac[5]);
  return buf;
}

Result<std::optional<MacReading>> read_mac(vfio::Device& device, uint16_t vendor_id, uint16_t device_id) {
  for (const auto& m : kModels) {
    if (m.vendor != vendor_id || m.device != device_id) continue;
    auto r = m.where == MacLocation::kIntelRal0 ? read_intel(device) : read_virtio(device);
    if (!r) return std::unexpected(r.error().context("reading the MAC of " + device.address().str()));
    return std::optional<MacReading>(*r);
  }
  return std::optional<MacReading>();
}

}  // namespace ufab::core
