#include "core/pci/details.h"

#include <gtest/gtest.h>

#include <cctype>

#include "tests/unit/pci/fake_host.h"

namespace ufab::pci {
namespace {

using testing::ConfigBuilder;
using testing::FakeHost;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::string bytes_from_hex(const char* hex) {
  std::string out;
  std::string digits;
  for (const char* p = hex; *p; ++p) {
    if (std::isxdigit(static_cast<unsigned char>(*p))) digits += *p;
  }
  for (size_t i = 0; i + 1 < digits.size(); i += 2)
    out += static_cast<char>(std::stoi(digits.substr(i, 2), nullptr, 16));
  return out;
}

// <resource> of a virtio-net device (one 64-bit BAR) and of an e1000e with
// an I/O BAR, a ROM and an SR-IOV VF BAR.
const char* kVirtioResource =
    "0x0000004000100000 0x000000400017ffff 0x0000000000140204\n"
    "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
    "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
    "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
    "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
    "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
    "0x0000000000000000 0x0000000000000000 0x0000000000000000\n";

std::string e1000e_resource() {
  std::string text =
      "0x00000000fe800000 0x00000000fe81ffff 0x0000000000040200\n"  // BAR0 128K mem32
      "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
      "0x000000000000c000 0x000000000000c01f 0x0000000000040101\n"  // BAR2 I/O 32 bytes
      "0x00000000fc000000 0x00000000fc3fffff 0x000000000014220c\n"  // BAR3 64-bit prefetchable 4M
      "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
      "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
      "0x00000000fe840000 0x00000000fe87ffff 0x0000000000046200\n"   // ROM 256K
      "0x00000000fd000000 0x00000000fd00ffff 0x0000000000140204\n";  // VF BAR0
  for (int i = 8; i < 13; ++i) text += "0x0000000000000000 0x0000000000000000 0x0000000000000000\n";
  return text;
}

TEST(ResourceTable, SixtyFourBitMemoryBar) {
  auto resources = parse_resource_table(kVirtioResource);
  ASSERT_TRUE(resources) << resources.error().message();
  ASSERT_EQ(resources->size(), 1u);
  const Resource& bar = (*resources)[0];
  EXPECT_EQ(bar.name(), "BAR0");
  EXPECT_EQ(bar.start, 0x4000100000ull);
  EXPECT_EQ(bar.size, 512u * 1024);
  EXPECT_TRUE(bar.memory);
  EXPECT_FALSE(bar.io);
  EXPECT_TRUE(bar.is_64bit);
  EXPECT_FALSE(bar.prefetchable);
}

TEST(ResourceTable, IoPrefetchableRomAndVfBars) {
  auto resources = parse_resource_table(e1000e_resource());
  ASSERT_TRUE(resources) << resources.error().message();
  ASSERT_EQ(resources->size(), 5u);
  EXPECT_EQ((*resources)[0].name(), "BAR0");
  EXPECT_EQ((*resources)[0].size, 128u * 1024);
  EXPECT_FALSE((*resources)[0].is_64bit);
  EXPECT_EQ((*resources)[1].name(), "BAR2");
  EXPECT_TRUE((*resources)[1].io);
  EXPECT_FALSE((*resources)[1].memory);
  EXPECT_EQ((*resources)[1].size, 32u);
  EXPECT_EQ((*resources)[2].name(), "BAR3");
  EXPECT_TRUE((*resources)[2].prefetchable);
  EXPECT_TRUE((*resources)[2].is_64bit);
  EXPECT_EQ((*resources)[2].size, 4u << 20);
  EXPECT_EQ((*resources)[3].kind, ResourceKind::kRom);
  EXPECT_EQ((*resources)[3].name(), "ROM");
  EXPECT_EQ((*resources)[4].name(), "VF BAR0");
}

TEST(ResourceTable, BridgeWindowsFollowTheVfBars) {
  std::string text;
  for (int i = 0; i < 13; ++i) text += "0x0 0x0 0x0\n";
  text += "0x0000000000001000 0x0000000000001fff 0x0000000000000101\n";  // window 0: I/O
  auto resources = parse_resource_table(text);
  ASSERT_TRUE(resources);
  ASSERT_EQ(resources->size(), 1u);
  EXPECT_EQ((*resources)[0].kind, ResourceKind::kBridgeWindow);
  EXPECT_EQ((*resources)[0].name(), "window 0");
}

TEST(ResourceTable, MalformedLineIsAnErrorNamingIt) {
  auto resources = parse_resource_table("0x0 0x0 0x0\n0x1000 nonsense 0x200\n");
  ASSERT_FALSE(resources);
  EXPECT_EQ(resources.error().code(), EINVAL);
  EXPECT_TRUE(contains(resources.error().message(), "line 2"));
  EXPECT_TRUE(contains(resources.error().message(), "nonsense"));
}

TEST(Capabilities, StandardChainWithMsix) {
  std::string config = ConfigBuilder(0x8086, 0x10d3, 0x020000)
                           .power_management()
                           .msi(2, true)
                           .pcie(0, 1, 1, 1, 1)
                           .msix(5, 3, 0x0, 3, 0x2000)
                           .vendor_specific(8)
                           .bytes();
  CapabilityList caps = parse_capabilities(config);
  ASSERT_EQ(caps.capabilities.size(), 5u);
  EXPECT_TRUE(caps.notes.empty());
  EXPECT_EQ(caps.capabilities[0].name, "Power Management");
  EXPECT_EQ(caps.capabilities[0].offset, 0x40);
  EXPECT_EQ(caps.capabilities[1].name, "MSI");
  EXPECT_TRUE(contains(caps.capabilities[1].detail, "4 vectors, 64-bit")) << caps.capabilities[1].detail;
  EXPECT_EQ(caps.msi_vectors, 4u);
  EXPECT_EQ(caps.capabilities[2].name, "PCI Express");
  EXPECT_TRUE(contains(caps.capabilities[2].detail, "Endpoint")) << caps.capabilities[2].detail;
  EXPECT_TRUE(contains(caps.capabilities[2].detail, "x1 at 2.5 GT/s")) << caps.capabilities[2].detail;
  EXPECT_EQ(caps.capabilities[3].name, "MSI-X");
  ASSERT_TRUE(caps.msix);
  EXPECT_EQ(caps.msix->vectors, 5u);
  EXPECT_EQ(caps.msix->table_bar, 3u);
  EXPECT_EQ(caps.msix->pba_offset, 0x2000u);
  EXPECT_TRUE(contains(caps.capabilities[3].detail, "table size 5")) << caps.capabilities[3].detail;
  EXPECT_EQ(caps.capabilities[4].name, "Vendor Specific");
  EXPECT_FALSE(caps.extended_visible);
}

TEST(Capabilities, ExtendedListNeedsFullConfigSpace) {
  std::vector<uint8_t> sriov(0x3c, 0);
  sriov[0x08] = 4;  // InitialVFs at cap+0x0c (the body starts at cap+4)
  sriov[0x0a] = 7;  // TotalVFs at cap+0x0e
  std::vector<uint8_t> serial = {0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88};
  std::string full = ConfigBuilder(0x8086, 0x10c9, 0x020000, 4096)
                         .pcie(0, 2, 4, 2, 4)
                         .msix(10, 3, 0, 3, 0x2000)
                         .extended(0x0001, 1, std::vector<uint8_t>(0x44, 0))
                         .extended(0x0003, 1, serial)
                         .extended(0x0010, 1, sriov)
                         .bytes();
  CapabilityList caps = parse_capabilities(full);
  EXPECT_TRUE(caps.extended_visible);
  ASSERT_EQ(caps.capabilities.size(), 5u);
  EXPECT_EQ(caps.capabilities[2].name, "Advanced Error Reporting");
  EXPECT_TRUE(caps.capabilities[2].extended);
  EXPECT_EQ(caps.capabilities[2].offset, 0x100);
  EXPECT_EQ(caps.capabilities[3].name, "Device Serial Number");
  EXPECT_TRUE(contains(caps.capabilities[3].detail, "0x8877665544332211")) << caps.capabilities[3].detail;
  EXPECT_EQ(caps.capabilities[4].name, "SR-IOV");
  EXPECT_TRUE(contains(caps.capabilities[4].detail, "total VFs 7, initial VFs 4")) << caps.capabilities[4].detail;

  // The same bytes cut at 256: only the standard list is visible.
  CapabilityList short_caps = parse_capabilities(full.substr(0, 256));
  EXPECT_FALSE(short_caps.extended_visible);
  EXPECT_EQ(short_caps.capabilities.size(), 2u);
}

TEST(Capabilities, LoopsAndWildPointersStopTheWalk) {
  // MSI-X at 0x40 whose next pointer points back to itself.
  std::string looping = ConfigBuilder(0x8086, 0x10d3, 0x020000).msix(4, 0, 0, 0, 0x800).raw(0x41, 0x40).bytes();
  CapabilityList caps = parse_capabilities(looping);
  EXPECT_EQ(caps.capabilities.size(), 1u);
  ASSERT_EQ(caps.notes.size(), 1u);
  EXPECT_TRUE(contains(caps.notes[0], "loops")) << caps.notes[0];

  std::string wild = ConfigBuilder(0x8086, 0x10d3, 0x020000).power_management().raw(0x41, 0x10).bytes();
  CapabilityList wild_caps = parse_capabilities(wild);
  EXPECT_EQ(wild_caps.capabilities.size(), 1u);
  ASSERT_EQ(wild_caps.notes.size(), 1u);
  EXPECT_TRUE(contains(wild_caps.notes[0], "outside")) << wild_caps.notes[0];
}

TEST(Capabilities, NoCapabilityListBit) {
  std::string config = ConfigBuilder(0x8086, 0x10d3, 0x020000).power_management().raw(0x06, 0).bytes();
  EXPECT_TRUE(parse_capabilities(config).capabilities.empty());
}

TEST(Capabilities, UnprivilegedSixtyFourBytes) {
  std::string config = ConfigBuilder(0x8086, 0x10d3, 0x020000).msix(4, 0, 0, 0, 0x800).bytes().substr(0, 64);
  CapabilityList caps = parse_capabilities(config);
  EXPECT_TRUE(caps.capabilities.empty());
  ASSERT_EQ(caps.notes.size(), 1u);
  EXPECT_TRUE(contains(caps.notes[0], "root"));
}

// Config space of a QEMU virtio-net-pci (1af4:1041) as the kernel exports it;
// lspci -vv decodes it as five VirtIO vendor capabilities and
// "MSI-X: Count=3, Vector table: BAR=0 offset=00008000, PBA: BAR=0 offset=00048000".
const char* kVirtioNetConfig =
    "f41a 4110 0604 1000 0100 0002 0000 0000 0400 1000 4000 0000 0000 0000 0000 0000"
    "0000 0000 0000 0000 0000 0000 f41a 4110 0000 0000 4000 0000 0000 0000 0000 0000"
    "0950 1001 0000 0000 0000 0000 3800 0000 0960 1003 0000 0000 0020 0000 0100 0000"
    "0970 1004 0000 0000 0040 0000 0010 0000 0984 1402 0000 0000 0060 0000 0010 0000"
    "0400 0000 0998 1405 0000 0000 0000 0000 0000 0000 0000 0000 1100 0280 0080 0000"
    "0080 0400 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000"
    "0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000"
    "0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000 0000";

TEST(Capabilities, RealVirtioNetConfigMatchesLspci) {
  std::string config = bytes_from_hex(kVirtioNetConfig);
  ASSERT_EQ(config.size(), 256u);
  CapabilityList caps = parse_capabilities(config);
  ASSERT_EQ(caps.capabilities.size(), 6u);
  EXPECT_TRUE(contains(caps.capabilities[0].detail, "virtio common config at BAR0+0x0")) << caps.capabilities[0].detail;
  EXPECT_TRUE(contains(caps.capabilities[3].detail, "virtio notify at BAR0+0x6000")) << caps.capabilities[3].detail;
  EXPECT_EQ(caps.capabilities[5].offset, 0x98);
  ASSERT_TRUE(caps.msix);
  EXPECT_EQ(caps.msix->vectors, 3u);
  EXPECT_EQ(caps.msix->table_bar, 0u);
  EXPECT_EQ(caps.msix->table_offset, 0x8000u);
  EXPECT_EQ(caps.msix->pba_offset, 0x48000u);
  EXPECT_TRUE(contains(caps.capabilities[5].detail, "enabled"));
}

TEST(Details, ReadFromTheDeviceDirectory) {
  FakeHost fake;
  fake.add_device(
      {.address = "0000:01:00.0",
       .resource = e1000e_resource(),
       .config = ConfigBuilder(0x8086, 0x10d3, 0x020000).pcie(0, 1, 1, 1, 1).msix(5, 3, 0, 3, 0x2000).bytes()});
  auto details = read_details(fake.host(), *PciAddress::parse("0000:01:00.0"));
  ASSERT_TRUE(details) << details.error().message();
  EXPECT_EQ(details->resources.size(), 5u);
  EXPECT_EQ(details->config_size, 256u);
  ASSERT_TRUE(details->capabilities.msix);
  EXPECT_EQ(details->capabilities.msix->vectors, 5u);
  EXPECT_TRUE(details->notes.empty());
}

TEST(Details, MissingFilesBecomeNotesAndMissingDevicesErrors) {
  FakeHost fake;
  fake.add_device({.address = "0000:01:00.0"});
  auto details = read_details(fake.host(), *PciAddress::parse("0000:01:00.0"));
  ASSERT_TRUE(details);
  EXPECT_EQ(details->notes.size(), 2u);
  auto missing = read_details(fake.host(), *PciAddress::parse("0000:09:00.0"));
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code(), ENODEV);
}

}  // namespace
}  // namespace ufab::pci
