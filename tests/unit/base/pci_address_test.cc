#include "base/pci_address.h"

#include <gtest/gtest.h>

namespace ufab {
namespace {

TEST(PciAddress, ParsesFullAndShortFormsToCanonical) {
  EXPECT_EQ(PciAddress::parse("0000:01:00.0")->str(), "0000:01:00.0");
  EXPECT_EQ(PciAddress::parse("1F:1d.7")->str(), "0000:1f:1d.7");
  EXPECT_EQ(PciAddress::parse("abcd:ef:1f.3")->domain, 0xabcd);
}

TEST(PciAddress, RejectsMalformedWithAnExample) {
  for (const char* bad : {"", "0000:01:00", "01:00.8", "01:20.0", "0000-01:00.0", "zz:00.0", "0000:01:00.0x"}) {
    auto r = PciAddress::parse(bad);
    ASSERT_FALSE(r) << bad;
    EXPECT_EQ(r.error().code(), EINVAL);
    EXPECT_NE(r.error().message().find("e.g. 0000:01:00.0"), std::string::npos);
  }
}

}  // namespace
}  // namespace ufab
