// The provider registry (core/provider/providers.h): which provider serves a
// device name, what it refuses to register, and completed tables.
#include "core/provider/providers.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <vector>

namespace ufab::provider {
namespace {

int open_ok(const ufab_rdma_host*, const char*, const ufab_device_opts*, ufab_rdma_dev**) { return 0; }
int poll_one(ufab_rdma_cq*, ufab_wc*, uint32_t) { return 1; }

const char* const kShm[] = {"shm", nullptr};
const char* const kTwo[] = {"a", "b", nullptr};

ufab_rdma_provider table(const char* name, const char* const* prefixes) {
  ufab_rdma_provider t{};
  t.abi_major = UFAB_RDMA_ABI_MAJOR;
  t.abi_minor = UFAB_RDMA_ABI_MINOR;
  t.size = sizeof t;
  t.name = name;
  t.prefixes = prefixes;
  t.open_device = open_ok;
  return t;
}

TEST(ProviderRegistry, PicksByPrefixAndFallsBackForOtherNames) {
  ProviderRegistry r;
  auto fallback = table("soft-roce", nullptr);
  auto shm = table("shm", kShm);
  ASSERT_TRUE(r.add(&fallback, "built-in"));
  ASSERT_TRUE(r.add(&shm, "/lib/ufab-plugins/libufab_shm.so"));
  EXPECT_EQ((*r.for_device("shm:lab"))->name, "shm");
  EXPECT_EQ((*r.for_device("swnic:lab:0"))->name, "soft-roce");
  EXPECT_EQ((*r.for_device("0000:00:02.0"))->name, "soft-roce");
  EXPECT_EQ((*r.for_device("shm"))->name, "soft-roce");  // no colon: not a prefix
  EXPECT_EQ((*r.for_device("shm:lab"))->origin, "/lib/ufab-plugins/libufab_shm.so");
}

TEST(ProviderRegistry, WithoutAFallbackAnUnservedNameNamesTheProviders) {
  ProviderRegistry r;
  auto shm = table("shm", kShm);
  ASSERT_TRUE(r.add(&shm, "built-in"));
  auto p = r.for_device("swnic:lab:0");
  ASSERT_FALSE(p);
  EXPECT_EQ(p.error().code(), ENODEV);
  EXPECT_NE(p.error().message().find("providers: shm"), std::string::npos) << p.error().message();
}

TEST(ProviderRegistry, RefusesWhatCannotBeRegistered) {
  ProviderRegistry r;
  auto ok = table("shm", kShm);
  ASSERT_TRUE(r.add(&ok, "built-in"));

  auto major = table("future", kTwo);
  major.abi_major = UFAB_RDMA_ABI_MAJOR + 1;
  auto s = r.add(&major, "x.so");
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code(), ENOEXEC);
  EXPECT_NE(s.error().message().find("this ufab speaks 1."), std::string::npos) << s.error().message();

  auto nameless = table("", kTwo);
  EXPECT_FALSE(r.add(&nameless, "x.so"));
  auto same_name = table("shm", kTwo);
  EXPECT_EQ(r.add(&same_name, "x.so").error().code(), EEXIST);
  auto same_prefix = table("other", kShm);
  s = r.add(&same_prefix, "x.so");
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message().find("\"shm\" is already served by shm"), std::string::npos) << s.error().message();
  auto short_table = table("short", kTwo);
  short_table.size = 8;
  EXPECT_EQ(r.add(&short_table, "x.so").error().code(), ENOEXEC);
  EXPECT_FALSE(r.add(nullptr, "x.so"));

  auto fallback1 = table("soft-roce", nullptr);
  auto fallback2 = table("another", nullptr);
  ASSERT_TRUE(r.add(&fallback1, "built-in"));
  EXPECT_EQ(r.add(&fallback2, "x.so").error().code(), EEXIST);
  EXPECT_EQ(r.providers().size(), 2u);  // nothing refused was added
}

TEST(ProviderRegistry, MissingOperationsBecomeEopnotsuppStubs) {
  // An older, shorter table: ops beyond its size are not read, even if the
  // memory after it holds something.
  struct Short {
    ufab_rdma_provider t;
  } s{table("old", kTwo)};
  s.t.poll_cq = poll_one;
  s.t.size = offsetof(ufab_rdma_provider, poll_cq);  // built before poll_cq existed
  std::vector<std::string> stubbed;
  ufab_rdma_provider full = complete_provider_ops(s.t, &stubbed);
  EXPECT_EQ(full.size, sizeof(ufab_rdma_provider));
  EXPECT_EQ(full.open_device, open_ok);
  ASSERT_NE(full.poll_cq, nullptr);
  EXPECT_EQ(full.poll_cq(nullptr, nullptr, 1), -EOPNOTSUPP);
  EXPECT_EQ(full.create_qp(nullptr, nullptr, nullptr, nullptr), -EOPNOTSUPP);
  EXPECT_EQ(full.wc_detail(nullptr, 1), nullptr);
  full.close_device(nullptr);  // a no-op stub
  EXPECT_NE(std::find(stubbed.begin(), stubbed.end(), "poll_cq"), stubbed.end());
  EXPECT_NE(std::find(stubbed.begin(), stubbed.end(), "destroy_ah"), stubbed.end());
  EXPECT_EQ(std::find(stubbed.begin(), stubbed.end(), "open_device"), stubbed.end());

  // A full table keeps what it has.
  auto t = table("full", kTwo);
  t.poll_cq = poll_one;
  stubbed.clear();
  EXPECT_EQ(complete_provider_ops(t, &stubbed).poll_cq, poll_one);
}

}  // namespace
}  // namespace ufab::provider
