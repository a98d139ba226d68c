#include "core/plugin_ops.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "drivers/sdk/adapter.h"

namespace ufab::core {
namespace {

int fake_info(ufab_dev*, ufab_dev_info* out) {
  out->mtu = 1500;
  return 0;
}
int fake_start(ufab_dev*) { return 7; }
int fake_open(const ufab_host_ops*, ufab_host*, ufab_dev**) { return 0; }

const ufab_pci_match kRows[] = {{0x1af4, 0x1041, UFAB_PCI_ANY, UFAB_PCI_ANY, 0, 0, "virtio"}, {}};

ufab_driver full_table() {
  ufab_driver d{};
  d.abi_major = UFAB_ABI_MAJOR;
  d.abi_minor = UFAB_ABI_MINOR;
  d.size = sizeof(ufab_driver);
  d.name = "fake";
  d.description = "fake driver";
  d.pci_match = kRows;
  d.flags = UFAB_DRIVER_F_SOFTWARE;
  d.open = fake_open;
  d.info = fake_info;
  d.start = fake_start;
  return d;
}

// Every operation of a completed table can be called with NULL-ish
// arguments: stubs never look at them.
void expect_all_stubbed_except(const ufab_driver& d, const std::vector<std::string>& present) {
  auto is_present = [&](const char* n) { return std::find(present.begin(), present.end(), n) != present.end(); };
  if (!is_present("open")) {
    EXPECT_EQ(d.open(nullptr, nullptr, nullptr), -EOPNOTSUPP);
  }
  d.close(nullptr);  // stub: no-op, must not crash
  if (!is_present("info")) {
    EXPECT_EQ(d.info(nullptr, nullptr), -EOPNOTSUPP);
  }
  if (!is_present("link")) {
    EXPECT_EQ(d.link(nullptr, nullptr), -EOPNOTSUPP);
  }
  if (!is_present("rx_queue_setup")) {
    EXPECT_EQ(d.rx_queue_setup(nullptr, 0, nullptr), -EOPNOTSUPP);
  }
  if (!is_present("tx_queue_setup")) {
    EXPECT_EQ(d.tx_queue_setup(nullptr, 0, nullptr), -EOPNOTSUPP);
  }
  if (!is_present("start")) {
    EXPECT_EQ(d.start(nullptr), -EOPNOTSUPP);
  }
  if (!is_present("stop")) {
    EXPECT_EQ(d.stop(nullptr), -EOPNOTSUPP);
  }
  if (!is_present("rx_burst")) {
    EXPECT_EQ(d.rx_burst(nullptr, 0, nullptr, 0), -EOPNOTSUPP);
  }
  if (!is_present("tx_burst")) {
    EXPECT_EQ(d.tx_burst(nullptr, 0, nullptr, 0), -EOPNOTSUPP);
  }
  if (!is_present("stats")) {
    EXPECT_EQ(d.stats(nullptr, nullptr), -EOPNOTSUPP);
  }
  if (!is_present("rx_irq")) {
    EXPECT_EQ(d.rx_irq(nullptr, 0, 0, nullptr), -EOPNOTSUPP);
  }
  if (!is_present("set_promiscuous")) {
    EXPECT_EQ(d.set_promiscuous(nullptr, 1), -EOPNOTSUPP);
  }
}

TEST(DriverOpNames, ListsEveryOperationInTableOrder) {
  const auto& names = driver_op_names();
  ASSERT_EQ(names.size(), (sizeof(ufab_driver) - kDriverHeaderSize) / sizeof(void*));
  EXPECT_EQ(names.front(), "open");
  EXPECT_EQ(names[1], "close");
  EXPECT_EQ(names.back(), "tx_burst_gather");
}

TEST(CompleteDriverOps, EmptyTableGetsAStubForEveryOperation) {
  ufab_driver d{};
  d.abi_major = UFAB_ABI_MAJOR;
  d.size = sizeof(ufab_driver);
  d.name = "empty";
  ufab_driver c = complete_driver_ops(d);
  expect_all_stubbed_except(c, {});
  EXPECT_EQ(stubbed_driver_ops(d), driver_op_names());
}

TEST(CompleteDriverOps, KeepsHeaderAndPresentOperations) {
  ufab_driver d = full_table();
  ufab_driver c = complete_driver_ops(d);
  EXPECT_EQ(c.abi_major, UFAB_ABI_MAJOR);
  EXPECT_EQ(c.abi_minor, UFAB_ABI_MINOR);
  EXPECT_EQ(c.size, sizeof(ufab_driver));
  EXPECT_STREQ(c.name, "fake");
  EXPECT_STREQ(c.description, "fake driver");
  EXPECT_EQ(c.pci_match, kRows);
  EXPECT_EQ(c.flags, UFAB_DRIVER_F_SOFTWARE);
  EXPECT_EQ(c.open, &fake_open);
  EXPECT_EQ(c.info, &fake_info);
  EXPECT_EQ(c.start(nullptr), 7);
  expect_all_stubbed_except(c, {"open", "info", "start"});
  std::vector<std::string> expected;
  for (const auto& n : driver_op_names()) {
    if (n != "open" && n != "info" && n != "start") expected.push_back(n);
  }
  EXPECT_EQ(stubbed_driver_ops(d), expected);
}

// A table placed so that its last byte is the last byte of a readable page;
// the next page is PROT_NONE, so reading one byte past `size` crashes.
class GuardedTable {
 public:
  explicit GuardedTable(const ufab_driver& src, uint32_t size) {
    page_ = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    mem_ = mmap(nullptr, 2 * page_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem_ == MAP_FAILED) return;
    mprotect(static_cast<char*>(mem_) + page_, page_, PROT_NONE);
    table_ = static_cast<char*>(mem_) + page_ - size;
    std::memcpy(table_, &src, size);
    ufab_driver* t = reinterpret_cast<ufab_driver*>(table_);
    t->size = size;
  }
  ~GuardedTable() {
    if (mem_ != MAP_FAILED) munmap(mem_, 2 * page_);
  }
  bool ok() const { return mem_ != MAP_FAILED; }
  const ufab_driver& table() const { return *reinterpret_cast<const ufab_driver*>(table_); }

 private:
  size_t page_ = 0;
  void* mem_ = MAP_FAILED;
  char* table_ = nullptr;
};

TEST(CompleteDriverOps, ReadsOnlyTheFirstSizeBytesOfAnOlderTable) {
  ufab_driver d = full_table();
  // As if built before `link` existed: open, close, info only.
  GuardedTable g(d, offsetof(ufab_driver, link));
  ASSERT_TRUE(g.ok());
  ufab_driver c = complete_driver_ops(g.table());
  EXPECT_EQ(c.open, &fake_open);
  EXPECT_EQ(c.info, &fake_info);
  EXPECT_STREQ(c.name, "fake");
  EXPECT_EQ(c.size, sizeof(ufab_driver));
  // `start` was set in the source table but lies beyond `size`.
  EXPECT_EQ(c.start(nullptr), -EOPNOTSUPP);
  expect_all_stubbed_except(c, {"open", "info"});
  std::vector<std::string> stubbed = stubbed_driver_ops(g.table());
  EXPECT_EQ(stubbed.front(), "close");  // NULL in the table
  EXPECT_EQ(std::count(stubbed.begin(), stubbed.end(), "start"), 1);
  EXPECT_EQ(stubbed.size(), driver_op_names().size() - 2);
}

TEST(CompleteDriverOps, AnOperationCutInHalfBySizeIsAbsent) {
  ufab_driver d = full_table();
  GuardedTable g(d, offsetof(ufab_driver, info) + 4);
  ASSERT_TRUE(g.ok());
  ufab_driver c = complete_driver_ops(g.table());
  EXPECT_EQ(c.open, &fake_open);
  EXPECT_EQ(c.info(nullptr, nullptr), -EOPNOTSUPP);
}

TEST(CompleteDriverOps, HeaderFieldsBeyondAShortSizeAreZero) {
  ufab_driver d = full_table();
  GuardedTable g(d, offsetof(ufab_driver, description));
  ASSERT_TRUE(g.ok());
  ufab_driver c = complete_driver_ops(g.table());
  EXPECT_STREQ(c.name, "fake");
  EXPECT_EQ(c.description, nullptr);
  EXPECT_EQ(c.pci_match, nullptr);
  EXPECT_EQ(c.flags, 0u);
  EXPECT_EQ(stubbed_driver_ops(g.table()), driver_op_names());
}

TEST(CompleteDriverOps, LargerTableFromANewerMinorIsTruncatedToOurs) {
  struct Newer {
    ufab_driver base;
    void* later_ops[3];
  } newer{};
  newer.base = full_table();
  newer.base.abi_minor = UFAB_ABI_MINOR + 1;
  newer.base.size = sizeof(Newer);
  ufab_driver c = complete_driver_ops(newer.base);
  EXPECT_EQ(c.size, sizeof(ufab_driver));
  EXPECT_EQ(c.abi_minor, UFAB_ABI_MINOR + 1);
  EXPECT_EQ(c.start(nullptr), 7);
}

// The adapter leaves undefined operations NULL; completion makes them stubs.
class OnlyOpen {
 public:
  static int open(const ufab_host_ops*, ufab_host*, OnlyOpen** out) {
    *out = new OnlyOpen;
    return 0;
  }
};

TEST(CompleteDriverOps, AdapterTableWithOnlyOpen) {
  static const ufab_driver d = sdk::make_driver<OnlyOpen>("only_open", "", nullptr);
  ufab_driver c = complete_driver_ops(d);
  ufab_dev* dev = nullptr;
  ASSERT_EQ(c.open(nullptr, nullptr, &dev), 0);
  EXPECT_EQ(c.start(dev), -EOPNOTSUPP);
  c.close(dev);  // the adapter's close deletes the object
  std::vector<std::string> stubbed = stubbed_driver_ops(d);
  EXPECT_EQ(stubbed.size(), driver_op_names().size() - 2);  // all but open and close
}

}  // namespace
}  // namespace ufab::core
