#include "vfio/text.h"

#include <gtest/gtest.h>

namespace ufab::vfio {
namespace {

TEST(Text, BytesUseExactUnitsWherePossible) {
  EXPECT_EQ(bytes(0), "0 bytes");
  EXPECT_EQ(bytes(1), "1 byte");
  EXPECT_EQ(bytes(1023), "1023 bytes");
  EXPECT_EQ(bytes(64 * 1024), "64 KiB");
  EXPECT_EQ(bytes(2 * 1024 * 1024), "2 MiB");
  EXPECT_EQ(bytes(8ull << 30), "8 GiB");
  EXPECT_EQ(bytes(1536 * 1024), "1.5 MiB");
  EXPECT_EQ(bytes(1536), "1.5 KiB");
  EXPECT_EQ(bytes(1ull << 40), "1 TiB");
  // Not shown rounded to an exact-looking number.
  EXPECT_EQ(bytes(2 * 1024 * 1024 + 20 * 1024), "2068 KiB");
  EXPECT_EQ(bytes(1024 + 1), "1025 bytes");
  EXPECT_EQ(bytes((1ull << 30) + 1), "~1.00 GiB");
}

}  // namespace
}  // namespace ufab::vfio
