#include "core/plugin_registry.h"

#include <elf.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <vector>

#include "base/files.h"
#include "core/plugin_ops.h"
#include "tests/unit/core/good_plugin.h"

namespace ufab::core {
namespace {

// A fixture plugin built by Bazel and handed to the test through `data`.
std::string fixture(const std::string& name) {
  std::string rel = "tests/unit/core/" + name;
  if (const char* srcdir = std::getenv("TEST_SRCDIR")) {
    std::string p = std::string(srcdir) + "/ufab/" + rel;
    if (path_exists(p)) return p;
  }
  return rel;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TEST_TMPDIR");
    std::string tmpl = std::string(base != nullptr ? base : "/tmp") + "/ufab_plugins_XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (mkdtemp(buf.data()) != nullptr) path_ = buf.data();
    chmod(path_.c_str(), 0755);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

void copy_file(const std::string& from, const std::string& to, mode_t mode = 0755) {
  std::ifstream in(from, std::ios::binary);
  std::ofstream out(to, std::ios::binary);
  out << in.rdbuf();
  out.close();
  chmod(to.c_str(), mode);
}

// Defined (exported) dynamic symbols of a 64-bit ELF shared library, read
// from .dynsym directly so the test needs no binutils.
std::set<std::string> exported_symbols(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::set<std::string> out;
  if (data.size() < sizeof(Elf64_Ehdr)) return out;
  Elf64_Ehdr eh;
  std::memcpy(&eh, data.data(), sizeof(eh));
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64) return out;
  auto section = [&](size_t i) {
    Elf64_Shdr sh;
    std::memcpy(&sh, data.data() + eh.e_shoff + i * eh.e_shentsize, sizeof(sh));
    return sh;
  };
  for (size_t i = 0; i < eh.e_shnum; ++i) {
    Elf64_Shdr sh = section(i);
    if (sh.sh_type != SHT_DYNSYM) continue;
    Elf64_Shdr strtab = section(sh.sh_link);
    for (size_t off = 0; off + sizeof(Elf64_Sym) <= sh.sh_size; off += sizeof(Elf64_Sym)) {
      Elf64_Sym sym;
      std::memcpy(&sym, data.data() + sh.sh_offset + off, sizeof(sym));
      int bind = ELF64_ST_BIND(sym.st_info);
      if (sym.st_shndx == SHN_UNDEF || (bind != STB_GLOBAL && bind != STB_WEAK)) continue;
      out.insert(std::string(data.data() + strtab.sh_offset + sym.st_name));
    }
  }
  return out;
}

// ------------------------------------------------------------- loading files

TEST(PluginLoad, GoodPluginLoadsWithItsTableAndStubs) {
  PluginRegistry reg;
  std::string path = fixture("libgood_plugin.so");
  auto st = reg.load_file(path);
  ASSERT_TRUE(st) << st.error().message();
  ASSERT_EQ(reg.plugins().size(), 1u);
  const Plugin& p = *reg.plugins()[0];
  EXPECT_EQ(p.name, "good");
  EXPECT_EQ(p.description, "test plugin that loads cleanly");
  EXPECT_EQ(p.origin, path);
  EXPECT_EQ(p.abi_major, UFAB_ABI_MAJOR);
  EXPECT_EQ(p.abi_minor, UFAB_ABI_MINOR);
  EXPECT_FALSE(p.software);
  ASSERT_EQ(p.matches.size(), 2u);
  EXPECT_EQ(p.matches[0].vendor_id, 0x8086);
  EXPECT_EQ(p.matches[0].device_id, 0x10d3);
  EXPECT_STREQ(p.matches[0].model, "82574L");
  EXPECT_STREQ(p.matches[1].model, "Intel Ethernet");
  EXPECT_EQ(p.stubbed_ops, (std::vector<std::string>{"link", "rx_queue_setup", "tx_queue_setup", "tx_burst", "rx_irq",
                                                     "set_promiscuous", "rx_irq_arm", "rx_steer", "tx_burst_gather"}));
  EXPECT_TRUE(reg.warnings().empty());

  // The table points into the loaded library and works.
  ufab_dev* dev = nullptr;
  ASSERT_EQ(p.ops.open(nullptr, nullptr, &dev), 0);
  ufab_dev_info info{};
  EXPECT_EQ(p.ops.info(dev, &info), 0);
  EXPECT_STREQ(info.model, "good test device");
  EXPECT_EQ(p.ops.start(dev), 0);
  EXPECT_EQ(p.ops.link(dev, nullptr), -EOPNOTSUPP);
  p.ops.close(dev);
}

TEST(PluginLoad, GoodPluginExportsOnlyTheEntrySymbol) {
  std::set<std::string> syms = exported_symbols(fixture("libgood_plugin.so"));
  EXPECT_EQ(syms, std::set<std::string>{UFAB_DRIVER_ENTRY_SYMBOL});
}

TEST(PluginLoad, AbiMajorMismatchNamesBothVersions) {
  PluginRegistry reg;
  std::string path = fixture("libabi2_plugin.so");
  auto st = reg.load_file(path);
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code(), ENOEXEC);
  EXPECT_EQ(st.error().message(), "loading plugin " + path +
                                      ": built for ABI 2.0, this ufab speaks 1." + std::to_string(UFAB_ABI_MINOR) + ": rebuild the plugin against "
                                      "abi/raw_frame.h of this ufab");
  EXPECT_TRUE(reg.plugins().empty());
}

TEST(PluginLoad, ShortTableFromOlderMinorGetsStubsForTheRest) {
  PluginRegistry reg;
  auto st = reg.load_file(fixture("libold_plugin.so"));
  ASSERT_TRUE(st) << st.error().message();
  const Plugin* p = reg.by_name("old");
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(p->software);
  EXPECT_TRUE(p->matches.empty());
  // Everything from `link` on lies beyond its size.
  std::vector<std::string> expected(driver_op_names().begin() + 3, driver_op_names().end());
  EXPECT_EQ(p->stubbed_ops, expected);
  ufab_dev* dev = nullptr;
  ASSERT_EQ(p->ops.open(nullptr, nullptr, &dev), 0);
  ufab_dev_info info{};
  EXPECT_EQ(p->ops.info(dev, &info), 0);
  EXPECT_STREQ(info.model, "old");
  // The plugin's table has start = a function returning 42 past `size`.
  EXPECT_EQ(p->ops.start(dev), -EOPNOTSUPP);
  EXPECT_EQ(p->ops.set_promiscuous(dev, 1), -EOPNOTSUPP);
  p->ops.close(dev);
}

TEST(PluginLoad, LibraryWithoutEntrySymbolIsNotAPlugin) {
  PluginRegistry reg;
  std::string path = fixture("libnosym_plugin.so");
  auto st = reg.load_file(path);
  ASSERT_FALSE(st);
  EXPECT_PRED2(contains, st.error().message(),
               "loading plugin " + path + ": not a ufab plugin: no symbol ufab_driver_entry_v1");
}

TEST(PluginLoad, EntrySymbolOfAnotherMajorIsNamed) {
  PluginRegistry reg;
  auto st = reg.load_file(fixture("libv2entry_plugin.so"));
  ASSERT_FALSE(st);
  EXPECT_PRED2(contains, st.error().message(), "no symbol ufab_driver_entry_v1, but it exports ufab_driver_entry_v2");
  EXPECT_PRED2(contains, st.error().message(), "rebuild the plugin against abi/raw_frame.h");
}

TEST(PluginLoad, EntryReturningNullIsRefused) {
  PluginRegistry reg;
  auto st = reg.load_file(fixture("libnull_plugin.so"));
  ASSERT_FALSE(st);
  EXPECT_PRED2(contains, st.error().message(), "ufab_driver_entry_v1() returned NULL");
  EXPECT_TRUE(reg.plugins().empty());
}

TEST(PluginLoad, MissingFileAndNonLibrary) {
  TempDir dir;
  PluginRegistry reg;
  auto st = reg.load_file(dir / "libnone.so");
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code(), ENOENT);
  EXPECT_PRED2(contains, st.error().message(), dir / "libnone.so");

  std::ofstream(dir / "libtext.so") << "not an ELF file\n";
  chmod((dir / "libtext.so").c_str(), 0644);
  st = reg.load_file(dir / "libtext.so");
  ASSERT_FALSE(st);
  EXPECT_PRED2(contains, st.error().message(), "dlopen failed");
  EXPECT_PRED2(contains, st.error().message(), "ldd -r " + (dir / "libtext.so"));
}

TEST(PluginLoad, SamePathTwiceIsADuplicateAndLeavesTheFirstWorking) {
  PluginRegistry reg;
  std::string path = fixture("libgood_plugin.so");
  ASSERT_TRUE(reg.load_file(path));
  auto st = reg.load_file(path);
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code(), EEXIST);
  EXPECT_PRED2(contains, st.error().message(), "plugin name \"good\" is already registered, from " + path);
  ASSERT_EQ(reg.plugins().size(), 1u);
  // The refused load's dlclose must not have unmapped the first one.
  ufab_dev* dev = nullptr;
  ASSERT_EQ(reg.plugins()[0]->ops.open(nullptr, nullptr, &dev), 0);
  reg.plugins()[0]->ops.close(dev);
}

// ---------------------------------------------------------------- permissions

TEST(PluginPermissions, WorldWritableDirectoryIsRefusedWithTheFix) {
  TempDir dir;
  copy_file(fixture("libgood_plugin.so"), dir / "libgood.so");
  ASSERT_EQ(chmod(dir.path().c_str(), 0777), 0);
  PluginRegistry reg;
  auto st = reg.load_directory(dir.path());
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code(), EPERM);
  EXPECT_PRED2(contains, st.error().message(), "plugin directory " + dir.path() + " is writable by every user");
  EXPECT_PRED2(contains, st.error().message(), "chmod o-w " + dir.path());
  // The same directory reached through load_file.
  st = reg.load_file(dir / "libgood.so");
  ASSERT_FALSE(st);
  EXPECT_PRED2(contains, st.error().message(), "chmod o-w " + dir.path());
  EXPECT_TRUE(reg.plugins().empty());
}

TEST(PluginPermissions, StickyScratchDirectoryIsRefusedWithoutAChmodFix) {
  TempDir dir;
  copy_file(fixture("libgood_plugin.so"), dir / "libgood.so");
  ASSERT_EQ(chmod(dir.path().c_str(), 01777), 0);
  PluginRegistry reg;
  auto st = reg.load_directory(dir.path());
  ASSERT_FALSE(st);
  EXPECT_PRED2(contains, st.error().message(), "is a shared scratch directory (mode 1777");
  EXPECT_PRED2(contains, st.error().message(), "put plugins in a directory of their own");
  EXPECT_FALSE(contains(st.error().message(), "chmod o-w"));
}

TEST(PluginPermissions, WorldWritableFileIsRefused) {
  TempDir dir;
  copy_file(fixture("libgood_plugin.so"), dir / "libgood.so", 0757);
  PluginRegistry reg;
  auto st = reg.load_file(dir / "libgood.so");
  ASSERT_FALSE(st);
  EXPECT_PRED2(contains, st.error().message(), "plugin file " + (dir / "libgood.so") + " is writable by every user");
  EXPECT_PRED2(contains, st.error().message(), "chmod o-w " + (dir / "libgood.so"));
  // In a directory scan it is one skipped file, not a failed scan.
  ASSERT_TRUE(reg.load_directory(dir.path()));
  ASSERT_EQ(reg.warnings().size(), 1u);
  EXPECT_PRED2(contains, reg.warnings()[0], "skipped " + (dir / "libgood.so") + ": plugin file");
}

TEST(PluginPermissions, SymlinkIntoAnUnsafeDirectoryIsRefused) {
  TempDir safe, unsafe;
  copy_file(fixture("libgood_plugin.so"), unsafe / "libgood.so");
  ASSERT_EQ(chmod(unsafe.path().c_str(), 0777), 0);
  ASSERT_EQ(symlink((unsafe / "libgood.so").c_str(), (safe / "libgood.so").c_str()), 0);
  PluginRegistry reg;
  auto st = reg.load_file(safe / "libgood.so");
  ASSERT_FALSE(st);
  EXPECT_PRED2(contains, st.error().message(), "directory of the plugin's real file");
}

TEST(PluginPermissions, GroupWritableIsFineForOurGroupOnly) {
  TempDir dir;
  copy_file(fixture("libgood_plugin.so"), dir / "libgood.so", 0775);
  ASSERT_EQ(chmod(dir.path().c_str(), 0775), 0);
  {
    PluginRegistry reg;
    auto st = reg.load_directory(dir.path());
    ASSERT_TRUE(st) << st.error().message();
    EXPECT_EQ(reg.plugins().size(), 1u) << ::testing::PrintToString(reg.warnings());
  }
  if (geteuid() != 0) GTEST_SKIP() << "changing a file's group to a foreign one needs root";
  ASSERT_EQ(chown((dir / "libgood.so").c_str(), static_cast<uid_t>(-1), 4242), 0);
  PluginRegistry reg;
  auto st = reg.load_file(dir / "libgood.so");
  ASSERT_FALSE(st);
  EXPECT_PRED2(contains, st.error().message(), "writable by group 4242");
  EXPECT_PRED2(contains, st.error().message(), "chmod g-w " + (dir / "libgood.so"));
}

TEST(PluginPermissions, FileOwnedBySomeoneElseIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "giving a file to another user needs root";
  TempDir dir;
  copy_file(fixture("libgood_plugin.so"), dir / "libgood.so");
  ASSERT_EQ(chown((dir / "libgood.so").c_str(), 4242, static_cast<gid_t>(-1)), 0);
  PluginRegistry reg;
  auto st = reg.load_file(dir / "libgood.so");
  ASSERT_FALSE(st);
  EXPECT_PRED2(contains, st.error().message(), "is owned by uid 4242, which is neither root nor the user running");
  EXPECT_PRED2(contains, st.error().message(), "chown root " + (dir / "libgood.so"));
}

// ----------------------------------------------------------------- directories

TEST(PluginDirectory, LoadsEverySoAndTurnsFailuresIntoWarnings) {
  TempDir dir;
  copy_file(fixture("libgood_plugin.so"), dir / "libgood.so");
  copy_file(fixture("libnosym_plugin.so"), dir / "libnosym.so");
  copy_file(fixture("libabi2_plugin.so"), dir / "libabi2.so");
  copy_file(fixture("libold_plugin.so"), dir / "libold.so");
  std::ofstream(dir / "README") << "not a plugin, not a .so\n";
  PluginRegistry reg;
  auto st = reg.load_directory(dir.path());
  ASSERT_TRUE(st) << st.error().message();
  ASSERT_EQ(reg.plugins().size(), 2u);
  EXPECT_EQ(reg.plugins()[0]->name, "good");  // name order: libabi2, libgood, libnosym, libold
  EXPECT_EQ(reg.plugins()[1]->name, "old");
  ASSERT_EQ(reg.warnings().size(), 2u);
  EXPECT_EQ(reg.warnings()[0], "skipped " + (dir / "libabi2.so") +
                                   ": built for ABI 2.0, this ufab speaks 1." + std::to_string(UFAB_ABI_MINOR) + ": rebuild the plugin against "
                                   "abi/raw_frame.h of this ufab");
  EXPECT_PRED2(contains, reg.warnings()[1],
               "skipped " + (dir / "libnosym.so") + ": not a ufab plugin: no symbol ufab_driver_entry_v1");
}

TEST(PluginDirectory, MissingDirectoryIsAnError) {
  TempDir dir;
  PluginRegistry reg;
  auto st = reg.load_directory(dir / "nope");
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code(), ENOENT);
  EXPECT_PRED2(contains, st.error().message(), dir / "nope");
  std::ofstream(dir / "file") << "x";
  st = reg.load_directory(dir / "file");
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code(), ENOTDIR);
}

TEST(PluginDirectory, DuplicateNamesFirstWins) {
  TempDir dir;
  copy_file(fixture("libgood_plugin.so"), dir / "liba.so");
  copy_file(fixture("libgood_plugin.so"), dir / "libb.so");
  PluginRegistry reg;
  ASSERT_TRUE(reg.load_directory(dir.path()));
  ASSERT_EQ(reg.plugins().size(), 1u);
  EXPECT_EQ(reg.plugins()[0]->origin, dir / "liba.so");
  ASSERT_EQ(reg.warnings().size(), 1u);
  EXPECT_EQ(reg.warnings()[0], "skipped " + (dir / "libb.so") + ": plugin name \"good\" is already registered, from " +
                                   (dir / "liba.so") +
                                   "; the first one wins: remove one of the two or rename its "
                                   "driver");
}

// -------------------------------------------------------------- load_default

class PluginPathTest : public ::testing::Test {
 protected:
  void TearDown() override { unsetenv("UFAB_PLUGIN_PATH"); }
};

TEST_F(PluginPathTest, PluginPathIsHonouredAndMissingDirsWarn) {
  TempDir a, b;
  copy_file(fixture("libgood_plugin.so"), a / "libgood.so");
  copy_file(fixture("libold_plugin.so"), b / "libold.so");
  std::string missing = a / "missing";
  setenv("UFAB_PLUGIN_PATH", (a.path() + "::" + missing + ":" + b.path() + ":").c_str(), 1);
  PluginRegistry reg;
  auto st = reg.load_default();
  ASSERT_TRUE(st) << st.error().message();
  ASSERT_EQ(reg.plugins().size(), 2u);
  EXPECT_NE(reg.by_name("good"), nullptr);
  EXPECT_NE(reg.by_name("old"), nullptr);
  ASSERT_EQ(reg.warnings().size(), 1u);
  EXPECT_EQ(reg.warnings()[0], "plugin directory " + missing + " does not exist; skipped");
}

TEST_F(PluginPathTest, UnsafeDirectoryInPathIsAnErrorAfterTheOthersLoad) {
  TempDir bad, good;
  ASSERT_EQ(chmod(bad.path().c_str(), 0777), 0);
  copy_file(fixture("libgood_plugin.so"), good / "libgood.so");
  setenv("UFAB_PLUGIN_PATH", (bad.path() + ":" + good.path()).c_str(), 1);
  PluginRegistry reg;
  auto st = reg.load_default();
  ASSERT_FALSE(st);
  EXPECT_PRED2(contains, st.error().message(), "UFAB_PLUGIN_PATH: plugin directory " + bad.path());
  EXPECT_PRED2(contains, st.error().message(), "chmod o-w");
  EXPECT_NE(reg.by_name("good"), nullptr);
}

TEST_F(PluginPathTest, PluginPathIsIgnoredInSecureMode) {
  TempDir a;
  copy_file(fixture("libgood_plugin.so"), a / "libgood.so");
  setenv("UFAB_PLUGIN_PATH", a.path().c_str(), 1);
  PluginRegistry reg;
  reg.set_secure_mode_for_testing(true);
  auto st = reg.load_default();
  ASSERT_TRUE(st) << st.error().message();
  EXPECT_EQ(reg.by_name("good"), nullptr);
  ASSERT_FALSE(reg.warnings().empty());
  EXPECT_PRED2(contains, reg.warnings()[0], "UFAB_PLUGIN_PATH is ignored: this process runs setuid or setgid");
}

TEST_F(PluginPathTest, DefaultDirectoryIsBesideThisCode) {
  std::string dir = PluginRegistry::default_directory();
  ASSERT_FALSE(dir.empty());
  EXPECT_EQ(dir.front(), '/');
  EXPECT_TRUE(dir.ends_with("/ufab-plugins")) << dir;
  // Nothing there in the build tree: no plugins, and no noise about it.
  if (!path_exists(dir)) {
    PluginRegistry reg;
    ASSERT_TRUE(reg.load_default());
    EXPECT_TRUE(reg.plugins().empty());
    EXPECT_TRUE(reg.warnings().empty()) << ::testing::PrintToString(reg.warnings());
  }
}

// ------------------------------------------------------------------ built-ins

TEST(PluginBuiltin, StaticallyLinkedPluginAndNameClashWithALoadedOne) {
  PluginRegistry reg;
  ASSERT_TRUE(reg.add_builtin(ufab_good_driver()));
  EXPECT_EQ(reg.by_name("good")->origin, "built-in");
  auto st = reg.load_file(fixture("libgood_plugin.so"));
  ASSERT_FALSE(st);
  EXPECT_PRED2(contains, st.error().message(), "plugin name \"good\" is already registered, from built-in");
  EXPECT_EQ(reg.plugins().size(), 1u);
}

ufab_driver base_table(const char* name) {
  ufab_driver d{};
  d.abi_major = UFAB_ABI_MAJOR;
  d.abi_minor = UFAB_ABI_MINOR;
  d.size = sizeof(ufab_driver);
  d.name = name;
  d.open = [](const ufab_host_ops*, ufab_host*, ufab_dev**) { return 0; };
  return d;
}

TEST(PluginBuiltin, MalformedTablesAreRefusedWithTheReason) {
  PluginRegistry reg;
  auto st = reg.add_builtin(nullptr);
  ASSERT_FALSE(st);
  EXPECT_PRED2(contains, st.error().message(), "adding built-in plugin: no driver table");

  ufab_driver small = base_table("small");
  small.size = 16;
  st = reg.add_builtin(&small);
  ASSERT_FALSE(st);
  EXPECT_PRED2(contains, st.error().message(), "driver table is 16 bytes, smaller than the 40-byte header");

  ufab_driver no_open = base_table("no_open");
  no_open.open = nullptr;
  st = reg.add_builtin(&no_open);
  ASSERT_FALSE(st);
  EXPECT_PRED2(contains, st.error().message(), "plugin \"no_open\" has no open operation");

  ufab_driver bad_name = base_table("two words");
  st = reg.add_builtin(&bad_name);
  ASSERT_FALSE(st);
  EXPECT_PRED2(contains, st.error().message(), "plugin name \"two words\" is not valid");
  ufab_driver no_name = base_table(nullptr);
  EXPECT_FALSE(reg.add_builtin(&no_name));

  static std::vector<ufab_pci_match> endless(2000, ufab_pci_match{0x1234, 1, 1, 1, 0, 0, nullptr});
  ufab_driver unterminated = base_table("endless");
  unterminated.pci_match = endless.data();
  st = reg.add_builtin(&unterminated);
  ASSERT_FALSE(st);
  EXPECT_PRED2(contains, st.error().message(), "no terminating row");
  EXPECT_TRUE(reg.plugins().empty());
}

TEST(PluginBuiltin, NewerMinorLoadsWithANote) {
  struct Newer {
    ufab_driver base;
    void* later_ops[2];
  };
  static Newer newer{base_table("newer"), {}};
  newer.base.abi_minor = UFAB_ABI_MINOR + 3;
  newer.base.size = sizeof(Newer);
  PluginRegistry reg;
  auto st = reg.add_builtin(&newer.base);
  ASSERT_TRUE(st) << st.error().message();
  EXPECT_EQ(reg.by_name("newer")->abi_minor, UFAB_ABI_MINOR + 3);
  ASSERT_EQ(reg.warnings().size(), 1u);
  EXPECT_PRED2(contains, reg.warnings()[0],
               "was built for ABI 1." + std::to_string(UFAB_ABI_MINOR + 3) + ", this ufab speaks 1." +
                   std::to_string(UFAB_ABI_MINOR) + ": it is loaded");
}

// ------------------------------------------------------------------- matching

constexpr uint16_t ANY = UFAB_PCI_ANY;

const ufab_pci_match kClassRows[] = {{ANY, ANY, ANY, ANY, 0x020000, 0xff0000, "any network device"}, {}};
const ufab_pci_match kEthClassRows[] = {{ANY, ANY, ANY, ANY, 0x020000, 0xffff00, "any Ethernet"}, {}};
const ufab_pci_match kVendorRows[] = {{0x1af4, ANY, ANY, ANY, 0, 0, "any Red Hat"}, {}};
const ufab_pci_match kDeviceRows[] = {{0x1af4, 0x1041, ANY, ANY, 0, 0, "virtio-net"}, {}};
const ufab_pci_match kSubsysRows[] = {{0x1af4, 0x1041, 0x1af4, 0x1100, 0, 0, "virtio-net (QEMU)"}, {}};

class ForPciTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Registered least specific first, so order cannot explain the results.
    add("by_class", kClassRows);
    add("by_eth_class", kEthClassRows);
    add("by_vendor", kVendorRows);
    add("by_device", kDeviceRows);
    add("by_subsys", kSubsysRows);
    ufab_driver sw = base_table("software");
    sw.flags = UFAB_DRIVER_F_SOFTWARE;
    sw.pci_match = kSubsysRows;  // ignored: software plugins drive no PCI device
    tables_.push_back(sw);
    for (const ufab_driver& t : tables_) ASSERT_TRUE(reg_.add_builtin(&t));
  }
  void add(const char* name, const ufab_pci_match* rows) {
    ufab_driver d = base_table(name);
    d.pci_match = rows;
    tables_.push_back(d);
  }
  std::string pick(PciIdentity id) {
    const Plugin* p = reg_.for_pci(id);
    return p != nullptr ? p->name : "(none)";
  }
  std::deque<ufab_driver> tables_;  // stable addresses for add_builtin
  PluginRegistry reg_;
};

TEST_F(ForPciTest, MostSpecificRowWins) {
  EXPECT_EQ(pick({0x1af4, 0x1041, 0x1af4, 0x1100, 0x020000}), "by_subsys");
  EXPECT_EQ(pick({0x1af4, 0x1041, 0x1af4, 0x0001, 0x020000}), "by_device");
  EXPECT_EQ(pick({0x1af4, 0x1000, 0x1af4, 0x0001, 0x020000}), "by_vendor");
  EXPECT_EQ(pick({0x8086, 0x10d3, 0x8086, 0x0000, 0x020000}), "by_eth_class");
  EXPECT_EQ(pick({0x8086, 0x10d3, 0x8086, 0x0000, 0x028000}), "by_class");  // other network
  EXPECT_EQ(pick({0x8086, 0x10d3, 0x8086, 0x0000, 0x010802}), "(none)");    // NVMe
  const ufab_pci_match* row = nullptr;
  ASSERT_NE(reg_.for_pci({0x1af4, 0x1041, 0x1af4, 0x1100, 0x020000}, &row), nullptr);
  ASSERT_NE(row, nullptr);
  EXPECT_STREQ(row->model, "virtio-net (QEMU)");
}

TEST(ForPci, ClassMaskSelectsBitsAndTiesGoToTheFirstRegistered) {
  static const ufab_pci_match prog_if[] = {{ANY, ANY, ANY, ANY, 0x0c0330, 0xffffff, "xHCI"}, {}};
  static const ufab_pci_match first[] = {{0x10ec, 0x8168, ANY, ANY, 0, 0, "r8168 (first)"}, {}};
  static const ufab_pci_match second[] = {{0x10ec, 0x8168, ANY, ANY, 0, 0, "r8168 (second)"}, {}};
  std::deque<ufab_driver> t;
  PluginRegistry reg;
  for (auto [name, rows] : {std::pair{"xhci", prog_if}, std::pair{"first", first}, std::pair{"second", second}}) {
    t.push_back(base_table(name));
    t.back().pci_match = rows;
    ASSERT_TRUE(reg.add_builtin(&t.back()));
  }
  ASSERT_NE(reg.for_pci({1, 2, 3, 4, 0x0c0330}), nullptr);
  EXPECT_EQ(reg.for_pci({1, 2, 3, 4, 0x0c0330})->name, "xhci");
  EXPECT_EQ(reg.for_pci({1, 2, 3, 4, 0x0c0320}), nullptr);  // EHCI: prog-if differs
  EXPECT_EQ(reg.for_pci({0x10ec, 0x8168, 0, 0, 0x020000})->name, "first");
}

TEST(ForPci, LoadedPluginMatchesAsData) {
  PluginRegistry reg;
  ASSERT_TRUE(reg.load_file(fixture("libgood_plugin.so")));
  const ufab_pci_match* row = nullptr;
  const Plugin* p = reg.for_pci({0x8086, 0x10d3, 0x8086, 0x0000, 0x020000}, &row);
  ASSERT_NE(p, nullptr);
  EXPECT_STREQ(row->model, "82574L");
  p = reg.for_pci({0x8086, 0x1533, 0x8086, 0x0000, 0x020000}, &row);
  ASSERT_NE(p, nullptr);
  EXPECT_STREQ(row->model, "Intel Ethernet");
  EXPECT_EQ(reg.for_pci({0x8086, 0x1533, 0x8086, 0x0000, 0x010802}), nullptr);
  EXPECT_EQ(reg.for_pci({0x10ec, 0x8168, 0, 0, 0x020000}), nullptr);
}

TEST(ByName, FindsRegisteredPluginsOnly) {
  PluginRegistry reg;
  ASSERT_TRUE(reg.add_builtin(ufab_good_driver()));
  ASSERT_NE(reg.by_name("good"), nullptr);
  EXPECT_EQ(reg.by_name("good")->name, "good");
  EXPECT_EQ(reg.by_name("Good"), nullptr);
  EXPECT_EQ(reg.by_name(""), nullptr);
}

TEST(PluginRegistryLifetime, MovedRegistryKeepsLibrariesLoaded) {
  PluginRegistry a;
  ASSERT_TRUE(a.load_file(fixture("libgood_plugin.so")));
  PluginRegistry b(std::move(a));
  ASSERT_NE(b.by_name("good"), nullptr);
  ufab_dev* dev = nullptr;
  ASSERT_EQ(b.by_name("good")->ops.open(nullptr, nullptr, &dev), 0);
  b.by_name("good")->ops.close(dev);
  PluginRegistry c;
  c = std::move(b);
  ASSERT_NE(c.by_name("good"), nullptr);
  ASSERT_EQ(c.by_name("good")->ops.open(nullptr, nullptr, &dev), 0);
  c.by_name("good")->ops.close(dev);
}

}  // namespace
}  // namespace ufab::core
