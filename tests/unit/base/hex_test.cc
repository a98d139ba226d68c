#include "base/hex.h"

#include <gtest/gtest.h>

namespace ufab {
namespace {

TEST(Hex, PrefixedWithoutPadding) {
  EXPECT_EQ(hex(0), "0x0");
  EXPECT_EQ(hex(0x1a2b), "0x1a2b");
  EXPECT_EQ(hex(0xfee00000), "0xfee00000");
  EXPECT_EQ(hex(UINT64_MAX), "0xffffffffffffffff");
}

TEST(Hex, PrefixedAndZeroPadded) {
  EXPECT_EQ(hex(0x1a2b, 6), "0x001a2b");
  EXPECT_EQ(hex(0, 2), "0x00");
  EXPECT_EQ(hex(0x12345, 2), "0x12345");  // digits is a minimum, never a cut
  EXPECT_EQ(hex(UINT64_MAX, 16), "0xffffffffffffffff");
  EXPECT_EQ(hex(7, 0), "0x7");
}

TEST(Hex, DigitsAlone) {
  EXPECT_EQ(hex_digits(0x8086, 4), "8086");
  EXPECT_EQ(hex_digits(0x10d3, 4), "10d3");
  EXPECT_EQ(hex_digits(0x20000, 6), "020000");
  EXPECT_EQ(hex_digits(0, 1), "0");
  EXPECT_EQ(hex_digits(0, 0), "0");
  EXPECT_EQ(hex_digits(0xabc, 1), "abc");
}

}  // namespace
}  // namespace ufab
