#include "core/pci/doctor.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "tests/unit/pci/fake_host.h"

namespace ufab::pci {
namespace {

using testing::FakeHost;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }
PciAddress addr(const char* text) { return *PciAddress::parse(text); }

// A host set up right: IOMMU on, vfio loaded, one NIC on vfio-pci.
class DoctorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fake_.add_vfio_support();
    fake_.add_device({.address = "0000:02:00.0", .driver = "vfio-pci", .iommu_group = 9});
  }

  Check run(const std::string& name, std::optional<PciAddress> device = std::nullopt) {
    for (const Check& c : run_doctor(fake_.host(), device)) {
      if (c.name == name) return c;
    }
    ADD_FAILURE() << "no check named '" << name << "'";
    return Check{};
  }

  void remove(const std::string& path) { ASSERT_EQ(std::system(("rm -rf '" + path + "'").c_str()), 0); }

  FakeHost fake_;
};

TEST_F(DoctorTest, AWellSetUpHostPassesEveryCheck) {
  auto checks = run_doctor(fake_.host());
  std::vector<std::string> names;
  for (const Check& c : checks) {
    names.push_back(c.name);
    EXPECT_EQ(c.status, CheckStatus::kOk) << c.name << ": " << c.detail;
    EXPECT_TRUE(c.fix.empty()) << c.name;
  }
  std::vector<std::string> expected = {"kernel-cmdline",
                                       "iommu-groups",
                                       "iommu-firmware",
                                       "module vfio",
                                       "module vfio_pci",
                                       "module vfio_iommu_type1",
                                       "vfio-container",
                                       "noiommu-mode",
                                       "interrupt-remapping",
                                       "dma-entry-limit",
                                       "memlock",
                                       "hugepages",
                                       "0000:02:00.0 on vfio-pci",
                                       "group 9 viable",
                                       fake_.dev + "/vfio/9"};
  EXPECT_EQ(names, expected);
  EXPECT_EQ(worst_status(checks), CheckStatus::kOk);
}

TEST(Doctor, IommuOffFailsWithTheBootOption) {
  FakeHost fake;  // no IOMMU groups, no IOMMU option, nothing loaded
  auto checks = run_doctor(fake.host());
  EXPECT_EQ(worst_status(checks), CheckStatus::kFail);
  for (const Check& c : checks) {
    if (c.name == "kernel-cmdline" || c.name == "iommu-groups") {
      EXPECT_EQ(c.status, CheckStatus::kFail) << c.name;
      EXPECT_TRUE(contains(c.fix, "intel_iommu=on")) << c.fix;
      EXPECT_TRUE(contains(c.fix, "amd_iommu=on")) << c.fix;
      EXPECT_TRUE(contains(c.fix, "update-grub")) << c.fix;
    }
    if (c.name == "module vfio_pci") {
      EXPECT_EQ(c.fix, "`modprobe vfio-pci`");
    }
    if (c.name == "vfio-container") {
      EXPECT_TRUE(contains(c.fix, "modprobe vfio")) << c.fix;
    }
  }
}

TEST_F(DoctorTest, CommandLineThatTurnsTheIommuOff) {
  fake_.write(fake_.proc + "/cmdline", "root=/dev/vda1 intel_iommu=off\n");
  Check c = run("kernel-cmdline");
  EXPECT_EQ(c.status, CheckStatus::kFail);
  EXPECT_TRUE(contains(c.detail, "intel_iommu=off"));
  EXPECT_TRUE(contains(c.fix, "remove intel_iommu=off")) << c.fix;
}

TEST_F(DoctorTest, NoOptionButGroupsMeansOnByDefault) {
  fake_.write(fake_.proc + "/cmdline", "root=/dev/vda1\n");
  Check c = run("kernel-cmdline");
  EXPECT_EQ(c.status, CheckStatus::kOk);
  EXPECT_TRUE(contains(c.detail, "on by default"));
}

TEST_F(DoctorTest, FirmwareTables) {
  EXPECT_TRUE(contains(run("iommu-firmware").detail, "DMAR"));
  remove(fake_.sysfs + "/firmware/acpi/tables/DMAR");
  Check missing = run("iommu-firmware");
  EXPECT_EQ(missing.status, CheckStatus::kWarn);
  EXPECT_TRUE(contains(missing.fix, "VT-d")) << missing.fix;
  EXPECT_TRUE(contains(missing.fix, "intel-iommu,intremap=on")) << missing.fix;
  fake_.write(fake_.sysfs + "/firmware/acpi/tables/IVRS", "IVRS");
  EXPECT_TRUE(contains(run("iommu-firmware").detail, "AMD-Vi"));
  remove(fake_.sysfs + "/firmware");
  EXPECT_EQ(run("iommu-firmware").status, CheckStatus::kSkip);
}

TEST_F(DoctorTest, MissingModulesSayWhatToLoad) {
  remove(fake_.sysfs + "/module/vfio_pci");
  remove(fake_.sysfs + "/bus/pci/drivers/vfio-pci");
  Check pci = run("module vfio_pci");
  EXPECT_EQ(pci.status, CheckStatus::kFail);
  EXPECT_EQ(pci.fix, "`modprobe vfio-pci`");
  remove(fake_.sysfs + "/module/vfio_iommu_type1");
  Check type1 = run("module vfio_iommu_type1");
  EXPECT_EQ(type1.status, CheckStatus::kFail);
  EXPECT_EQ(type1.fix, "`modprobe vfio_iommu_type1`");
  EXPECT_EQ(run("dma-entry-limit").status, CheckStatus::kSkip);
  EXPECT_EQ(run("interrupt-remapping").status, CheckStatus::kSkip);
}

TEST_F(DoctorTest, VfioContainerMissingOrInaccessible) {
  fake_.unwritable.insert(fake_.dev + "/vfio/vfio");
  fake_.euid = 1000;
  Check denied = run("vfio-container");
  EXPECT_EQ(denied.status, CheckStatus::kFail);
  EXPECT_TRUE(contains(denied.detail, "uid 1000"));
  EXPECT_TRUE(contains(denied.fix, "chmod 0666 " + fake_.dev + "/vfio/vfio")) << denied.fix;
  remove(fake_.dev + "/vfio/vfio");
  Check missing = run("vfio-container");
  EXPECT_EQ(missing.status, CheckStatus::kFail);
  EXPECT_TRUE(contains(missing.fix, "modprobe vfio")) << missing.fix;
  EXPECT_TRUE(contains(missing.fix, "c 10 196")) << missing.fix;
}

TEST_F(DoctorTest, UnsafeNoIommuModeWarns) {
  fake_.write(fake_.sysfs + "/module/vfio/parameters/enable_unsafe_noiommu_mode", "Y\n");
  Check c = run("noiommu-mode");
  EXPECT_EQ(c.status, CheckStatus::kWarn);
  EXPECT_TRUE(contains(c.fix, "echo N > " + fake_.sysfs + "/module/vfio/parameters/enable_unsafe_noiommu_mode"));
}

TEST_F(DoctorTest, InterruptRemapping) {
  EXPECT_TRUE(contains(run("interrupt-remapping").detail, "1 of 1 IOMMU units remap"));
  // VT-d unit without ECAP.IR.
  fake_.write(fake_.sysfs + "/class/iommu/dmar0/intel-iommu/ecap", "f020d6\n");
  Check none = run("interrupt-remapping");
  EXPECT_EQ(none.status, CheckStatus::kFail);
  EXPECT_TRUE(contains(none.fix, "intremap=on")) << none.fix;
  EXPECT_TRUE(contains(none.fix, "allow_unsafe_interrupts=1")) << none.fix;
  fake_.write(fake_.sysfs + "/module/vfio_iommu_type1/parameters/allow_unsafe_interrupts", "Y\n");
  Check unsafe = run("interrupt-remapping");
  EXPECT_EQ(unsafe.status, CheckStatus::kWarn);
  EXPECT_TRUE(contains(unsafe.fix, "allow_unsafe_interrupts=0")) << unsafe.fix;
}

TEST_F(DoctorTest, DmaEntryLimit) {
  EXPECT_TRUE(contains(run("dma-entry-limit").detail, "65535"));
  fake_.write(fake_.sysfs + "/module/vfio_iommu_type1/parameters/dma_entry_limit", "1024\n");
  Check low = run("dma-entry-limit");
  EXPECT_EQ(low.status, CheckStatus::kWarn);
  EXPECT_TRUE(contains(low.fix, "modprobe vfio_iommu_type1 dma_entry_limit=65535")) << low.fix;
}

TEST_F(DoctorTest, MemlockLimit) {
  fake_.memlock = MemlockLimit{64 << 10, 64 << 10};
  Check hard = run("memlock");
  EXPECT_EQ(hard.status, CheckStatus::kWarn);
  EXPECT_TRUE(contains(hard.detail, "soft 64 KiB")) << hard.detail;
  EXPECT_TRUE(contains(hard.fix, "memlock  unlimited")) << hard.fix;
  EXPECT_TRUE(contains(hard.fix, "/etc/security/limits.conf")) << hard.fix;

  fake_.memlock = MemlockLimit{64 << 10, MemlockLimit::kUnlimited};
  Check soft = run("memlock");
  EXPECT_EQ(soft.status, CheckStatus::kWarn);
  EXPECT_TRUE(contains(soft.fix, "ulimit -l unlimited")) << soft.fix;

  // CAP_IPC_LOCK (bit 14) lifts the limit for VFIO's accounting.
  fake_.write(fake_.proc + "/self/status", "Name:\tufab\nCapEff:\t0000000000004000\n");
  Check capable = run("memlock");
  EXPECT_EQ(capable.status, CheckStatus::kOk);
  EXPECT_TRUE(contains(capable.detail, "CAP_IPC_LOCK"));

  fake_.memlock = std::unexpected(Error(EPERM, "getrlimit failed"));
  EXPECT_EQ(run("memlock").status, CheckStatus::kSkip);
}

TEST_F(DoctorTest, Hugepages) {
  EXPECT_TRUE(contains(run("hugepages").detail, "hugepages-2048kB: 512 (512 free)"));
  fake_.write(fake_.sysfs + "/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages", "0\n");
  Check none = run("hugepages");
  EXPECT_EQ(none.status, CheckStatus::kWarn);
  EXPECT_EQ(none.fix, "`echo 512 > " + fake_.sysfs + "/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages`");
}

TEST_F(DoctorTest, DeviceNotOnVfioAndItsGroupNotViable) {
  fake_.add_device({.address = "0000:01:00.0", .driver = "e1000e", .iommu_group = 7});
  fake_.add_device({.address = "0000:01:00.1", .driver = "e1000e", .iommu_group = 7});
  Check bound = run("0000:01:00.0 on vfio-pci", addr("0000:01:00.0"));
  EXPECT_EQ(bound.status, CheckStatus::kFail);
  EXPECT_TRUE(contains(bound.detail, "bound to e1000e"));
  EXPECT_EQ(bound.fix, "`ufab bind 0000:01:00.0`");
  Check group = run("group 7 viable", addr("0000:01:00.0"));
  EXPECT_EQ(group.status, CheckStatus::kFail);
  EXPECT_TRUE(contains(group.detail, "0000:01:00.1 (e1000e)")) << group.detail;
  EXPECT_EQ(group.fix, "`ufab bind 0000:01:00.1`");
  Check node = run(fake_.dev + "/vfio/7", addr("0000:01:00.0"));
  EXPECT_EQ(node.status, CheckStatus::kFail);
  EXPECT_TRUE(contains(node.fix, "ufab bind 0000:01:00.0")) << node.fix;
}

TEST_F(DoctorTest, NonNicGroupMemberIsUnboundByHand) {
  fake_.add_device({.address = "0000:02:00.1", .class_code = 0x0c0330, .driver = "xhci_hcd", .iommu_group = 9});
  Check group = run("group 9 viable");
  EXPECT_EQ(group.status, CheckStatus::kFail);
  EXPECT_EQ(group.fix, "`echo 0000:02:00.1 > " + fake_.sysfs + "/bus/pci/devices/0000:02:00.1/driver/unbind`");
}

TEST_F(DoctorTest, GroupNodeNotAccessible) {
  fake_.unwritable.insert(fake_.dev + "/vfio/9");
  fake_.euid = 1000;
  Check node = run(fake_.dev + "/vfio/9", addr("0000:02:00.0"));
  EXPECT_EQ(node.status, CheckStatus::kFail);
  EXPECT_TRUE(contains(node.detail, "mode 0600")) << node.detail;
  EXPECT_TRUE(contains(node.fix, "chown $USER " + fake_.dev + "/vfio/9")) << node.fix;
}

TEST_F(DoctorTest, UnknownOrNonNetworkDevice) {
  Check missing = run("device 0000:0b:00.0", addr("0000:0b:00.0"));
  EXPECT_EQ(missing.status, CheckStatus::kFail);
  EXPECT_TRUE(contains(missing.detail, "no PCI device"));
  EXPECT_TRUE(contains(missing.fix, "ufab list"));
  fake_.add_device({.address = "0000:00:02.0", .class_code = 0x010000, .iommu_group = 2});
  EXPECT_EQ(run("device 0000:00:02.0", addr("0000:00:02.0")).status, CheckStatus::kFail);
}

TEST(Doctor, NoVfioBoundNicIsASkipThatSaysHowToBindOne) {
  FakeHost fake;
  fake.add_vfio_support();
  fake.add_device({.address = "0000:01:00.0", .driver = "e1000e", .iommu_group = 7});
  auto checks = run_doctor(fake.host());
  ASSERT_FALSE(checks.empty());
  EXPECT_EQ(checks.back().name, "vfio devices");
  EXPECT_EQ(checks.back().status, CheckStatus::kSkip);
  EXPECT_TRUE(contains(checks.back().detail, "ufab bind"));
}

TEST(Doctor, WorstStatusOrdersFailWarnOkSkip) {
  EXPECT_EQ(worst_status({}), CheckStatus::kSkip);
  EXPECT_EQ(worst_status({Check{"a", CheckStatus::kOk, "", ""}, Check{"b", CheckStatus::kSkip, "", ""}}),
            CheckStatus::kOk);
  EXPECT_EQ(worst_status({Check{"a", CheckStatus::kWarn, "", ""}, Check{"b", CheckStatus::kOk, "", ""}}),
            CheckStatus::kWarn);
  EXPECT_EQ(worst_status({Check{"a", CheckStatus::kWarn, "", ""}, Check{"b", CheckStatus::kFail, "", ""}}),
            CheckStatus::kFail);
  EXPECT_STREQ(check_status_name(CheckStatus::kWarn), "warn");
}

}  // namespace
}  // namespace ufab::pci
