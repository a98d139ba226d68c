// The virtio capability walk over a config space laid out like QEMU's
// virtio-net-pci (disable-legacy=on): MSI-X, then vendor capabilities.
#include "drivers/virtio_net/virtio_pci.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace ufab::virtio {
namespace {

class Config {
 public:
  Config() : bytes_(256, 0) {
    put16(0x06, kPciStatusCapList);
    bytes_[kPciCapPointer] = 0;
  }
  // Appends a capability at `at`, linked after the previous one.
  void cap(uint8_t at, uint8_t id) {
    if (last_ == 0) bytes_[kPciCapPointer] = at;
    else bytes_[last_ + 1] = at;
    bytes_[at] = id;
    bytes_[at + 1] = 0;
    last_ = at;
  }
  void vendor(uint8_t at, uint8_t type, uint8_t bar, uint32_t offset, uint32_t length, uint32_t mult = 0) {
    cap(at, kPciCapVendor);
    bytes_[at + 2] = type == kCapNotifyCfg ? 20 : 16;
    bytes_[at + 3] = type;
    bytes_[at + 4] = bar;
    put32(at + 8, offset);
    put32(at + 12, length);
    if (type == kCapNotifyCfg) put32(at + 16, mult);
  }
  void put16(uint32_t at, uint16_t v) { std::memcpy(&bytes_[at], &v, 2); }
  void put32(uint32_t at, uint32_t v) { std::memcpy(&bytes_[at], &v, 4); }
  uint8_t& at(uint32_t i) { return bytes_[i]; }
  ConfigRead reader() {
    return [this](uint32_t off, uint32_t len, uint32_t* v) {
      if (off + len > bytes_.size() || off % len) return -EINVAL;
      *v = 0;
      std::memcpy(v, &bytes_[off], len);
      ++reads;
      return 0;
    };
  }
  int reads = 0;

 private:
  std::vector<uint8_t> bytes_;
  uint8_t last_ = 0;
};

Config qemu_like() {
  Config c;
  c.cap(0x98, kPciCapMsix);
  c.vendor(0x84, kCapPciCfg, 0, 0, 0);
  c.vendor(0x70, kCapNotifyCfg, 4, 0x3000, 0x1000, 4);
  c.vendor(0x60, kCapDeviceCfg, 4, 0x2000, 0x1000);
  c.vendor(0x50, kCapIsrCfg, 4, 0x1000, 0x1000);
  c.vendor(0x40, kCapCommonCfg, 4, 0x0000, 0x1000);
  return c;
}

TEST(FindCapabilities, FindsEveryStructureOfAQemuDevice) {
  Config c = qemu_like();
  Capabilities caps;
  std::string why;
  ASSERT_EQ(find_capabilities(c.reader(), &caps, &why), 0) << why;
  EXPECT_TRUE(caps.has_msix);
  ASSERT_TRUE(caps.common.present);
  EXPECT_EQ(caps.common.bar, 4);
  EXPECT_EQ(caps.common.offset, 0u);
  EXPECT_EQ(caps.common.length, 0x1000u);
  ASSERT_TRUE(caps.isr.present);
  EXPECT_EQ(caps.isr.offset, 0x1000u);
  ASSERT_TRUE(caps.device.present);
  EXPECT_EQ(caps.device.offset, 0x2000u);
  ASSERT_TRUE(caps.notify.present);
  EXPECT_EQ(caps.notify.offset, 0x3000u);
  EXPECT_EQ(caps.notify_multiplier, 4u);
}

TEST(FindCapabilities, KeepsTheFirstInstanceAndSkipsReservedBars) {
  Config c;
  c.vendor(0x40, kCapCommonCfg, 7, 0x100, 0x38);  // reserved BAR: ignored
  c.vendor(0x54, kCapCommonCfg, 2, 0x200, 0x38);  // first usable one
  c.vendor(0x68, kCapCommonCfg, 4, 0x300, 0x38);  // later duplicate
  Capabilities caps;
  std::string why;
  ASSERT_EQ(find_capabilities(c.reader(), &caps, &why), 0) << why;
  ASSERT_TRUE(caps.common.present);
  EXPECT_EQ(caps.common.bar, 2);
  EXPECT_EQ(caps.common.offset, 0x200u);
  EXPECT_FALSE(caps.notify.present);
  EXPECT_FALSE(caps.has_msix);
}

TEST(FindCapabilities, NoCapabilityList) {
  Config c;
  c.put16(0x06, 0);
  Capabilities caps;
  std::string why;
  EXPECT_EQ(find_capabilities(c.reader(), &caps, &why), -ENODEV);
  EXPECT_NE(why.find("no PCI capability list"), std::string::npos) << why;
}

TEST(FindCapabilities, LoopsAndBadPointersAreMalformed) {
  Config c;
  c.vendor(0x40, kCapCommonCfg, 4, 0, 0x38);
  c.at(0x41) = 0x40;  // points to itself
  Capabilities caps;
  std::string why;
  EXPECT_EQ(find_capabilities(c.reader(), &caps, &why), -EPROTO);
  EXPECT_NE(why.find("malformed"), std::string::npos) << why;

  Config d;
  d.at(kPciCapPointer) = 0x10;  // inside the header
  EXPECT_EQ(find_capabilities(d.reader(), &caps, &why), -EPROTO);
}

TEST(FindCapabilities, ReadErrorsPropagate) {
  Config c = qemu_like();
  auto inner = c.reader();
  int budget = 5;
  ConfigRead failing = [&](uint32_t off, uint32_t len, uint32_t* v) { return budget-- > 0 ? inner(off, len, v) : -EIO; };
  Capabilities caps;
  std::string why;
  EXPECT_EQ(find_capabilities(failing, &caps, &why), -EIO);
  EXPECT_FALSE(why.empty());
}

}  // namespace
}  // namespace ufab::virtio
