#include "base/files.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

namespace ufab {
namespace {

class FilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ufab_files_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }
  std::string dir_;
};

TEST_F(FilesTest, ReadAttrTrimsAndWriteRoundTrips) {
  std::string p = dir_ + "/attr";
  EXPECT_FALSE(write_file(p, "x"));  // never creates files
  FILE* f = fopen(p.c_str(), "w");
  fclose(f);
  ASSERT_TRUE(write_file(p, "  0x8086\n").has_value());
  EXPECT_EQ(read_attr(p), "0x8086");
  EXPECT_EQ(parse_uint(*read_attr(p)), 0x8086u);
}

TEST_F(FilesTest, MissingFileIsAnErrorNamingThePath) {
  auto r = read_file(dir_ + "/nope");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ENOENT);
  EXPECT_NE(r.error().message().find(dir_ + "/nope"), std::string::npos);
}

TEST_F(FilesTest, LinkBasenameAndListDir) {
  ASSERT_EQ(symlink("../../kernel/iommu_groups/7", (dir_ + "/iommu_group").c_str()), 0);
  EXPECT_EQ(link_basename(dir_ + "/iommu_group"), "7");
  EXPECT_EQ(list_dir(dir_), std::vector<std::string>{"iommu_group"});
  EXPECT_EQ(link_basename(dir_ + "/none"), std::nullopt);
}

TEST(ParseUint, RejectsGarbageAndNegatives) {
  EXPECT_EQ(parse_uint("12x"), std::nullopt);
  EXPECT_EQ(parse_uint("-1"), std::nullopt);
  EXPECT_EQ(parse_uint(""), std::nullopt);
  EXPECT_EQ(parse_uint("010", 10), 10u);
}

}  // namespace
}  // namespace ufab
