#include "vfio/pci_config.h"

#include <gtest/gtest.h>

namespace ufab::vfio::pci {
namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::vector<uint8_t> config_with_list() {
  std::vector<uint8_t> c(256, 0);
  c[kStatus] = kStatusCapabilityList;
  c[kCapabilityPointer] = 0x40;
  c[0x40] = kCapPowerManagement, c[0x41] = 0x50;
  c[0x50] = kCapMsix, c[0x51] = 0x00;
  c[0x52] = 0x3f, c[0x53] = 0xc0;  // 64 vectors, enabled, function masked
  c[0x54] = 0x04, c[0x55] = 0x10;  // table: BAR 4, offset 0x1000
  c[0x58] = 0x0c, c[0x59] = 0x20;  // PBA: BAR 4 (low bits 100), offset 0x2008
  return c;
}

TEST(PciConfig, WalksTheCapabilityList) {
  auto caps = capabilities(config_with_list());
  ASSERT_TRUE(caps) << caps.error().message();
  EXPECT_EQ(*caps, (std::vector<Capability>{{kCapPowerManagement, 0x40}, {kCapMsix, 0x50}}));
}

TEST(PciConfig, NoListWhenTheStatusBitIsClear) {
  auto c = config_with_list();
  c[kStatus] = 0;
  auto caps = capabilities(c);
  ASSERT_TRUE(caps);
  EXPECT_TRUE(caps->empty());
}

TEST(PciConfig, LowBitsOfPointersAreIgnored) {
  auto c = config_with_list();
  c[kCapabilityPointer] = 0x43;  // reserved low bits set
  c[0x41] = 0x52;
  auto caps = capabilities(c);
  ASSERT_TRUE(caps);
  ASSERT_EQ(caps->size(), 2u);
  EXPECT_EQ((*caps)[1].offset, 0x50);
}

TEST(PciConfig, LoopsAndHeaderPointersAreMalformed) {
  auto loop = config_with_list();
  loop[0x51] = 0x40;
  auto caps = capabilities(loop);
  ASSERT_FALSE(caps);
  EXPECT_EQ(caps.error().code(), EPROTO);
  EXPECT_TRUE(contains(caps.error().message(), "loops back to 0x40")) << caps.error().message();
  auto header = config_with_list();
  header[0x41] = 0x10;
  caps = capabilities(header);
  ASSERT_FALSE(caps);
  EXPECT_TRUE(contains(caps.error().message(), "inside the standard header")) << caps.error().message();
  EXPECT_FALSE(capabilities(std::vector<uint8_t>(64, 0)));
}

TEST(PciConfig, DecodesMsix) {
  auto msix = msix_capability(config_with_list());
  ASSERT_TRUE(msix);
  ASSERT_TRUE(msix->has_value());
  const MsixCapability& m = **msix;
  EXPECT_EQ(m.offset, 0x50);
  EXPECT_EQ(m.table_size, 64);
  EXPECT_TRUE(m.enabled);
  EXPECT_TRUE(m.function_masked);
  EXPECT_EQ(m.table_bar, 4);
  EXPECT_EQ(m.table_offset, 0x1000u);
  EXPECT_EQ(m.pba_bar, 4);
  EXPECT_EQ(m.pba_offset, 0x2008u);
}

TEST(PciConfig, NoMsixIsNotAnError) {
  auto c = config_with_list();
  c[0x41] = 0;
  auto msix = msix_capability(c);
  ASSERT_TRUE(msix);
  EXPECT_FALSE(msix->has_value());
}

TEST(PciConfig, WalksExtendedCapabilities) {
  std::vector<uint8_t> c(4096, 0);
  auto put32 = [&](uint32_t off, uint32_t v) {
    for (int i = 0; i < 4; ++i) c[off + i] = static_cast<uint8_t>(v >> (8 * i));
  };
  put32(0x100, 0x14010001);  // AER v1, next 0x140
  put32(0x140, 0x00010003);  // DSN v1, end
  auto caps = extended_capabilities(c);
  ASSERT_TRUE(caps) << caps.error().message();
  EXPECT_EQ(*caps, (std::vector<ExtendedCapability>{{0x0001, 1, 0x100}, {0x0003, 1, 0x140}}));
  EXPECT_EQ(extended_capability_name(0x0001), "Advanced Error Reporting");
  put32(0x140, 0x10010003);  // next points back to 0x100
  auto looped = extended_capabilities(c);
  ASSERT_FALSE(looped);
  EXPECT_TRUE(contains(looped.error().message(), "loop")) << looped.error().message();
}

TEST(PciConfig, NoExtendedCapabilitiesInConventionalSpaceOrEmptyHeader) {
  auto caps = extended_capabilities(std::vector<uint8_t>(256, 0));
  ASSERT_TRUE(caps);
  EXPECT_TRUE(caps->empty());
  std::vector<uint8_t> c(4096, 0xff);
  caps = extended_capabilities(c);
  ASSERT_TRUE(caps);
  EXPECT_TRUE(caps->empty());
}

TEST(PciConfig, Names) {
  EXPECT_EQ(capability_name(kCapMsix), "MSI-X");
  EXPECT_EQ(capability_name(0x42), "0x42");
}

}  // namespace
}  // namespace ufab::vfio::pci
