#include "vfio/mmio.h"

#include <gtest/gtest.h>

#include <cstring>

namespace ufab::vfio {
namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

class MmioTest : public ::testing::Test {
 protected:
  alignas(64) uint8_t memory_[256] = {};
  Mmio mmio_{memory_, sizeof memory_};
};

TEST_F(MmioTest, WritesAreLittleEndianInMemory) {
  ASSERT_TRUE(mmio_.write32(0x10, 0x11223344));
  EXPECT_EQ(memory_[0x10], 0x44);
  EXPECT_EQ(memory_[0x11], 0x33);
  EXPECT_EQ(memory_[0x12], 0x22);
  EXPECT_EQ(memory_[0x13], 0x11);
  ASSERT_TRUE(mmio_.write16(0x20, 0xa1b2));
  EXPECT_EQ(memory_[0x20], 0xb2);
  EXPECT_EQ(memory_[0x21], 0xa1);
  ASSERT_TRUE(mmio_.write64(0x40, 0x0102030405060708ull));
  for (int i = 0; i < 8; ++i) EXPECT_EQ(memory_[0x40 + i], 8 - i) << i;
  ASSERT_TRUE(mmio_.write8(0x50, 0x5a));
  EXPECT_EQ(memory_[0x50], 0x5a);
}

TEST_F(MmioTest, ReadsDecodeLittleEndian) {
  const uint8_t bytes[8] = {0xef, 0xcd, 0xab, 0x89, 0x67, 0x45, 0x23, 0x01};
  std::memcpy(memory_ + 0x80, bytes, sizeof bytes);
  EXPECT_EQ(*mmio_.read8(0x80), 0xef);
  EXPECT_EQ(*mmio_.read16(0x80), 0xcdef);
  EXPECT_EQ(*mmio_.read32(0x80), 0x89abcdefu);
  EXPECT_EQ(*mmio_.read64(0x80), 0x0123456789abcdefull);
}

TEST_F(MmioTest, ValidatedRegisterAccessesTheSameBytes) {
  auto tail = mmio_.reg32(0x18);
  ASSERT_TRUE(tail) << tail.error().message();
  tail->write(0xdeadbeef);
  EXPECT_EQ(memory_[0x18], 0xef);
  EXPECT_EQ(memory_[0x1b], 0xde);
  EXPECT_EQ(tail->read(), 0xdeadbeefu);
  EXPECT_EQ(tail->address(), reinterpret_cast<volatile uint32_t*>(memory_ + 0x18));
  auto wide = mmio_.reg64(0xf8);  // the last 8 bytes
  ASSERT_TRUE(wide);
  wide->write(~0ull);
  EXPECT_EQ(memory_[0xff], 0xff);
}

TEST_F(MmioTest, OutOfBoundsIsAnErrorThatShowsTheWindow) {
  auto r = mmio_.read32(0xfe);  // crosses the end
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ERANGE);
  EXPECT_TRUE(contains(r.error().message(), "0xfe")) << r.error().message();
  EXPECT_TRUE(contains(r.error().message(), "0x0-0xff (256 bytes)")) << r.error().message();
  EXPECT_FALSE(mmio_.reg64(0x100));
  EXPECT_FALSE(mmio_.write8(0x100, 1));
  // An offset near 2^64 must not wrap around into the window.
  EXPECT_FALSE(mmio_.read32(UINT64_MAX - 1));
}

TEST_F(MmioTest, MisalignedAccessIsAnError) {
  auto r = mmio_.reg32(0x13);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), EINVAL);
  EXPECT_TRUE(contains(r.error().message(), "not 4-byte aligned")) << r.error().message();
  EXPECT_FALSE(mmio_.read16(0x11));
  EXPECT_FALSE(mmio_.write64(0x44, 0));
  EXPECT_TRUE(mmio_.read8(0x13));  // bytes are always aligned
}

TEST_F(MmioTest, MisalignedBasePointerIsCaught) {
  Mmio shifted(memory_ + 1, 64);
  auto r = shifted.read32(0);  // offset 0 is aligned, the address is not
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), EINVAL);
}

TEST_F(MmioTest, WindowsKeepRegionOffsets) {
  // A sparse area 0x40-0x7f of a region whose offset 0 is memory_.
  Mmio area = Mmio::window(memory_, 0x40, 0x80);
  EXPECT_EQ(area.size(), 0x40u);
  ASSERT_TRUE(area.write32(0x40, 7));
  EXPECT_EQ(memory_[0x40], 7);
  EXPECT_FALSE(area.read32(0x3c));  // just before the area
  EXPECT_FALSE(area.read32(0x80));  // just after
  auto sub = mmio_.subwindow(0x20, 0x10);
  ASSERT_TRUE(sub);
  EXPECT_TRUE(sub->read32(0x2c));
  EXPECT_FALSE(sub->read32(0x30));
  EXPECT_FALSE(mmio_.subwindow(0xf0, 0x20));
}

TEST(Mmio, EmptyViewRefusesAccess) {
  Mmio none;
  auto r = none.read32(0);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), EFAULT);
  EXPECT_TRUE(contains(r.error().message(), "map the region first"));
}

}  // namespace
}  // namespace ufab::vfio
