#include "core/pci/bind.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>

#include "core/pci/discovery.h"
#include "tests/unit/pci/fake_host.h"

namespace ufab::pci {
namespace {

using testing::FakeDevice;
using testing::FakeHost;
using testing::FakeNetdev;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }
PciAddress addr(const char* text) { return *PciAddress::parse(text); }

class BindTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fake_.add_vfio_support();
    // Two e1000e ports sharing group 7; ens1 is down.
    fake_.add_device({.address = "0000:01:00.0",
                      .driver = "e1000e",
                      .iommu_group = 7,
                      .netdevs = {FakeNetdev{.name = "ens1", .operstate = "down", .flags = "0x1002"}}});
    fake_.add_device({.address = "0000:01:00.1", .driver = "e1000e", .iommu_group = 7});
    // A NIC with no driver; igb would take it on a probe.
    fake_.add_device({.address = "0000:02:00.0", .driver = "", .natural_driver = "igb", .iommu_group = 9});
    fake_.add_driver("igb");
    // The host's own connection.
    fake_.add_device({.address = "0000:00:03.0",
                      .vendor = 0x1af4,
                      .device = 0x1041,
                      .driver = "virtio-pci",
                      .iommu_group = 3,
                      .netdevs = {FakeNetdev{.name = "eth0", .flags = "0x1003", .parent = "virtio2"}}});
    // Storage, not a NIC.
    fake_.add_device({.address = "0000:00:02.0",
                      .vendor = 0x1af4,
                      .device = 0x1042,
                      .class_code = 0x010000,
                      .driver = "virtio-pci",
                      .iommu_group = 2});
    // A NIC without an IOMMU group.
    fake_.add_device({.address = "0000:03:00.0", .driver = "e1000e"});
    // Already on vfio-pci (bound by someone else: no record); e1000e's by nature.
    fake_.add_device({.address = "0000:04:00.0", .driver = "vfio-pci", .natural_driver = "e1000e", .iommu_group = 10});

    HostNetworkState net;
    net.addresses = {{"eth0", "192.0.2.2", 24, false, false}};
    net.routes = {{"eth0", "0.0.0.0", 0, "192.0.2.1", false}};
    fake_.network = net;
  }

  std::string sysfs_dev(const std::string& address) { return fake_.sysfs + "/bus/pci/devices/" + address; }
  std::string state_file(const std::string& address) { return fake_.state_dir + "/" + address; }

  // Runs a request that must be refused: checks the errno, that the message
  // has every key word, that nothing was written and that the whole fake
  // tree (sysfs, dev, state dir) is byte-for-byte what it was.
  template <typename Attempt>
  void expect_refused(Attempt attempt, int code, const std::vector<std::string>& key_words) {
    auto before = fake_.snapshot();
    auto result = attempt();
    ASSERT_FALSE(result) << "the request was not refused";
    EXPECT_EQ(result.error().code(), code) << result.error().message();
    for (const std::string& word : key_words) {
      EXPECT_TRUE(contains(result.error().message(), word))
          << "'" << word << "' missing in: " << result.error().message();
    }
    EXPECT_TRUE(fake_.writes.empty()) << "first write: " << fake_.writes[0].first;
    EXPECT_EQ(FakeHost::diff(before, fake_.snapshot()), "");
  }

  FakeHost fake_;
};

TEST_F(BindTest, BindMovesTheDeviceToVfioPciAndRecordsItsDriver) {
  auto report = bind_to_vfio(fake_.host(), addr("0000:01:00.0"));
  ASSERT_TRUE(report) << report.error().message();
  EXPECT_EQ(report->previous_driver, "e1000e");
  EXPECT_EQ(report->driver_now, "vfio-pci");
  EXPECT_EQ(report->iommu_group, 7u);
  EXPECT_EQ(fake_.driver_of("0000:01:00.0"), "vfio-pci");
  EXPECT_EQ(fake_.driver_of("0000:01:00.1"), "e1000e");  // the other port is untouched

  std::string dev = sysfs_dev("0000:01:00.0");
  std::vector<std::pair<std::string, std::string>> expected = {
      {dev + "/driver_override", "vfio-pci"},
      {dev + "/driver/unbind", "0000:01:00.0"},
      {fake_.sysfs + "/bus/pci/drivers_probe", "0000:01:00.0"},
  };
  EXPECT_EQ(fake_.writes, expected);
  ASSERT_EQ(report->actions.size(), 3u);
  EXPECT_EQ(report->actions[0], "echo vfio-pci > " + dev + "/driver_override");
  EXPECT_EQ(fake_.read(fake_.device_dir("0000:01:00.0") + "/driver_override"), "vfio-pci\n");

  EXPECT_TRUE(contains(fake_.read(state_file("0000:01:00.0")), "previous_driver=e1000e\n"));
  auto record = read_bind_record(fake_.host().paths, addr("0000:01:00.0"));
  ASSERT_TRUE(record && *record);
  EXPECT_EQ((*record)->previous_driver, "e1000e");
  EXPECT_TRUE(fake_.exists(fake_.dev + "/vfio/7"));

  // The other port still holds group 7 hostage.
  ASSERT_EQ(report->warnings.size(), 1u);
  EXPECT_TRUE(contains(report->warnings[0], "group 7 is not viable")) << report->warnings[0];
  EXPECT_TRUE(contains(report->warnings[0], "0000:01:00.1 (e1000e)")) << report->warnings[0];
  EXPECT_TRUE(contains(report->warnings[0], "ufab bind 0000:01:00.1")) << report->warnings[0];
}

TEST_F(BindTest, BindingTheWholeGroupLeavesNoWarning) {
  ASSERT_TRUE(bind_to_vfio(fake_.host(), addr("0000:01:00.1")));
  auto report = bind_to_vfio(fake_.host(), std::string("01:00.0"));
  ASSERT_TRUE(report) << report.error().message();
  EXPECT_TRUE(report->warnings.empty()) << report->warnings[0];
}

TEST_F(BindTest, BindADeviceWithoutDriverSkipsTheUnbind) {
  auto report = bind_to_vfio(fake_.host(), addr("0000:02:00.0"));
  ASSERT_TRUE(report) << report.error().message();
  EXPECT_EQ(report->previous_driver, "");
  EXPECT_EQ(fake_.writes.size(), 2u);
  EXPECT_EQ(fake_.driver_of("0000:02:00.0"), "vfio-pci");
  EXPECT_TRUE(contains(fake_.read(state_file("0000:02:00.0")), "previous_driver=\n"));
}

TEST_F(BindTest, UnbindRestoresTheRecordedDriver) {
  ASSERT_TRUE(bind_to_vfio(fake_.host(), addr("0000:01:00.0")));
  fake_.writes.clear();
  auto report = unbind_from_vfio(fake_.host(), addr("0000:01:00.0"));
  ASSERT_TRUE(report) << report.error().message();
  EXPECT_EQ(report->recorded_driver, "e1000e");
  EXPECT_EQ(report->driver_now, "e1000e");
  EXPECT_TRUE(report->warnings.empty()) << report->warnings[0];
  EXPECT_EQ(fake_.driver_of("0000:01:00.0"), "e1000e");
  std::vector<std::pair<std::string, std::string>> expected = {
      {fake_.sysfs + "/bus/pci/drivers/vfio-pci/unbind", "0000:01:00.0"},
      {sysfs_dev("0000:01:00.0") + "/driver_override", "\n"},
      {fake_.sysfs + "/bus/pci/drivers/e1000e/bind", "0000:01:00.0"},
  };
  EXPECT_EQ(fake_.writes, expected);
  EXPECT_EQ(fake_.read(fake_.device_dir("0000:01:00.0") + "/driver_override"), "(null)\n");
  EXPECT_FALSE(fake_.exists(state_file("0000:01:00.0")));
  EXPECT_FALSE(fake_.exists(fake_.dev + "/vfio/7"));
}

TEST_F(BindTest, BindUnbindRoundTripRestoresTheTreeExactly) {
  auto before = fake_.snapshot();
  ASSERT_TRUE(bind_to_vfio(fake_.host(), addr("0000:01:00.0")));
  ASSERT_TRUE(unbind_from_vfio(fake_.host(), addr("0000:01:00.0")));
  auto after = fake_.snapshot();
  // Only the state directory bind created stays behind (empty).
  EXPECT_EQ(after.erase("/run/ufab"), 1u);
  EXPECT_EQ(after.erase("/run"), 1u);
  EXPECT_EQ(FakeHost::diff(before, after), "");
}

TEST_F(BindTest, UnbindWithoutRecordAsksTheKernelToProbe) {
  auto report = unbind_from_vfio(fake_.host(), addr("0000:04:00.0"));
  ASSERT_TRUE(report) << report.error().message();
  EXPECT_EQ(report->recorded_driver, std::nullopt);
  EXPECT_EQ(fake_.writes.back(), std::make_pair(fake_.sysfs + "/bus/pci/drivers_probe", std::string("0000:04:00.0")));
  EXPECT_EQ(report->driver_now, "e1000e");
  ASSERT_FALSE(report->warnings.empty());
  EXPECT_TRUE(contains(report->warnings[0], "no record"));
}

TEST_F(BindTest, UnbindLeavesADeviceThatHadNoDriverWithoutOne) {
  ASSERT_TRUE(bind_to_vfio(fake_.host(), addr("0000:02:00.0")));
  fake_.writes.clear();
  auto report = unbind_from_vfio(fake_.host(), addr("0000:02:00.0"));
  ASSERT_TRUE(report) << report.error().message();
  EXPECT_EQ(report->recorded_driver, "");
  EXPECT_EQ(report->driver_now, "");
  EXPECT_EQ(fake_.writes.size(), 2u);  // no bind, no probe: igb would have grabbed it
  EXPECT_EQ(fake_.driver_of("0000:02:00.0"), "");
}

TEST_F(BindTest, UnbindWithRecordedDriverNotLoadedProbesAndSaysWhatToLoad) {
  fake_.write(state_file("0000:04:00.0"), "previous_driver=ixgbe\n");
  auto report = unbind_from_vfio(fake_.host(), addr("0000:04:00.0"));
  ASSERT_TRUE(report) << report.error().message();
  EXPECT_EQ(fake_.writes.back().first, fake_.sysfs + "/bus/pci/drivers_probe");
  bool says_modprobe = false;
  for (const std::string& w : report->warnings) says_modprobe = says_modprobe || contains(w, "modprobe ixgbe");
  EXPECT_TRUE(says_modprobe);
  // The probe found e1000e, which is not what was recorded: say so.
  EXPECT_EQ(report->driver_now, "e1000e");
  EXPECT_TRUE(contains(report->warnings.back(), "it was on ixgbe before")) << report->warnings.back();
}

TEST_F(BindTest, AFailedBindIsRolledBack) {
  fake_.refuse.insert({"0000:01:00.0", "vfio-pci"});
  auto result = bind_to_vfio(fake_.host(), addr("0000:01:00.0"));
  ASSERT_FALSE(result);
  EXPECT_EQ(result.error().code(), EIO);
  EXPECT_TRUE(contains(result.error().message(), "vfio-pci did not take it")) << result.error().message();
  EXPECT_TRUE(contains(result.error().message(), "rolled back")) << result.error().message();
  EXPECT_TRUE(contains(result.error().message(), "now has e1000e")) << result.error().message();
  EXPECT_EQ(fake_.driver_of("0000:01:00.0"), "e1000e");
  EXPECT_EQ(fake_.read(fake_.device_dir("0000:01:00.0") + "/driver_override"), "(null)\n");
  EXPECT_FALSE(fake_.exists(state_file("0000:01:00.0")));
}

TEST_F(BindTest, SafetyRefusesTheHostsOwnConnection) {
  expect_refused([&] { return bind_to_vfio(fake_.host(), addr("0000:00:03.0")); }, EBUSY,
                 {"refusing", "eth0", "192.0.2.2/24", "default via 192.0.2.1", "--force"});
}

TEST_F(BindTest, SafetyIsReportedBeforeOtherRefusals) {
  // Like this test machine's own NIC: no IOMMU group and the connection on it.
  fake_.add_device({.address = "0000:00:04.0",
                    .vendor = 0x1af4,
                    .device = 0x1041,
                    .driver = "virtio-pci",
                    .netdevs = {FakeNetdev{.name = "eth1", .flags = "0x1003", .parent = "virtio3"}}});
  fake_.network->addresses.push_back({"eth1", "fd00::2", 64, true, false});
  expect_refused([&] { return bind_to_vfio(fake_.host(), addr("0000:00:04.0")); }, EBUSY, {"eth1", "fd00::2/64"});
}

TEST_F(BindTest, ForceOverridesTheSafetyRuleAndSaysSo) {
  auto report = bind_to_vfio(fake_.host(), addr("0000:00:03.0"), BindOptions{.force = true});
  ASSERT_TRUE(report) << report.error().message();
  EXPECT_EQ(fake_.driver_of("0000:00:03.0"), "vfio-pci");
  ASSERT_FALSE(report->warnings.empty());
  EXPECT_TRUE(contains(report->warnings[0], "forced: eth0")) << report->warnings[0];
}

TEST_F(BindTest, UnreadableNetworkStateRefusesAnUpInterface) {
  fake_.network = std::unexpected(Error(EACCES, "cannot read /proc/net/route"));
  expect_refused([&] { return bind_to_vfio(fake_.host(), addr("0000:00:03.0")); }, EBUSY,
                 {"eth0", "could not be read"});
}

TEST_F(BindTest, RefusesMalformedAddress) {
  expect_refused([&] { return bind_to_vfio(fake_.host(), std::string("0000:01:00")); }, EINVAL,
                 {"not a PCI address", "0000:01:00.0"});
  expect_refused([&] { return unbind_from_vfio(fake_.host(), std::string("zz:00.0")); }, EINVAL, {"not a PCI address"});
}

TEST_F(BindTest, RefusesMissingDevice) {
  expect_refused([&] { return bind_to_vfio(fake_.host(), addr("0000:0b:00.0")); }, ENODEV,
                 {"no PCI device 0000:0b:00.0", "ufab list"});
  expect_refused([&] { return unbind_from_vfio(fake_.host(), addr("0000:0b:00.0")); }, ENODEV,
                 {"no PCI device 0000:0b:00.0"});
}

TEST_F(BindTest, RefusesNonNetworkDevices) {
  expect_refused([&] { return bind_to_vfio(fake_.host(), addr("0000:00:02.0")); }, EINVAL,
                 {"not a network device", "0x010000", "SCSI storage controller"});
}

TEST_F(BindTest, RefusesWhatIsAlreadyOnVfioPci) {
  expect_refused([&] { return bind_to_vfio(fake_.host(), addr("0000:04:00.0")); }, EALREADY,
                 {"already bound to vfio-pci"});
}

TEST_F(BindTest, UnbindRefusesWhatIsNotOnVfioPci) {
  expect_refused([&] { return unbind_from_vfio(fake_.host(), addr("0000:01:00.0")); }, EINVAL,
                 {"not bound to vfio-pci", "e1000e"});
  expect_refused([&] { return unbind_from_vfio(fake_.host(), addr("0000:02:00.0")); }, EINVAL,
                 {"not bound to vfio-pci", "no driver"});
}

TEST_F(BindTest, RefusesWhenVfioPciIsNotLoaded) {
  ASSERT_EQ(std::system(("rm -rf '" + fake_.sysfs + "/bus/pci/drivers/vfio-pci'").c_str()), 0);
  expect_refused([&] { return bind_to_vfio(fake_.host(), addr("0000:01:00.0")); }, ENOENT,
                 {"vfio-pci driver is not loaded", "modprobe vfio-pci"});
}

TEST_F(BindTest, RefusesWithoutIommuGroup) {
  expect_refused([&] { return bind_to_vfio(fake_.host(), addr("0000:03:00.0")); }, EOPNOTSUPP,
                 {"no IOMMU group", "intel_iommu=on", "amd_iommu=on"});
}

TEST_F(BindTest, RefusesKernelsWithoutDriverOverride) {
  fake_.add_device({.address = "0000:05:00.0", .driver = "e1000e", .iommu_group = 11, .has_driver_override = false});
  expect_refused([&] { return bind_to_vfio(fake_.host(), addr("0000:05:00.0")); }, EOPNOTSUPP,
                 {"driver_override", "3.16"});
}

TEST_F(BindTest, RefusesWhenNotRoot) {
  fake_.euid = 1000;
  expect_refused([&] { return bind_to_vfio(fake_.host(), addr("0000:01:00.0")); }, EPERM,
                 {"needs root", "uid 1000", "sudo ufab bind 0000:01:00.0"});
  expect_refused([&] { return unbind_from_vfio(fake_.host(), addr("0000:04:00.0")); }, EPERM,
                 {"needs root", "sudo ufab unbind 0000:04:00.0"});
}

TEST_F(BindTest, RefusesWithoutWritePermissionOnDriverOverride) {
  fake_.unwritable.insert(sysfs_dev("0000:01:00.0") + "/driver_override");
  expect_refused([&] { return bind_to_vfio(fake_.host(), addr("0000:01:00.0")); }, EACCES,
                 {"cannot write", "0000:01:00.0/driver_override", "root"});
}

TEST_F(BindTest, RefusesWhenTheStateCannotBeRecorded) {
  // A file where the state directory's parent should be: mkdir fails.
  fake_.write(fake_.root + "/run", "not a directory");
  expect_refused([&] { return bind_to_vfio(fake_.host(), addr("0000:01:00.0")); }, ENOTDIR,
                 {"recording the previous driver", "/run"});
}

TEST_F(BindTest, UnbindRefusesWhileAProcessHoldsTheGroup) {
  fake_.write(fake_.proc + "/1234/comm", "qemu-system-x86\n");
  fake_.link(fake_.dev + "/vfio/10", fake_.proc + "/1234/fd/7");
  fake_.link("/dev/null", fake_.proc + "/1234/fd/0");
  expect_refused([&] { return unbind_from_vfio(fake_.host(), addr("0000:04:00.0")); }, EBUSY,
                 {"group 10", "pid 1234 (qemu-system-x86)", "stop that first"});
}

TEST_F(BindTest, UnbindRefusesNonNetworkDevices) {
  fake_.add_device({.address = "0000:06:00.0", .class_code = 0x030000, .driver = "vfio-pci", .iommu_group = 12});
  expect_refused([&] { return unbind_from_vfio(fake_.host(), addr("0000:06:00.0")); }, EINVAL,
                 {"not a network device", "0x030000"});
}

TEST_F(BindTest, AMalformedRecordIsAnErrorBeforeAnyWrite) {
  fake_.write(state_file("0000:04:00.0"), "previous_driver=../../../../etc\n");
  expect_refused([&] { return unbind_from_vfio(fake_.host(), addr("0000:04:00.0")); }, EINVAL,
                 {"not a ufab bind record", state_file("0000:04:00.0")});
}

// On the real machine, with a sysfs writer that fails every write (so /sys
// cannot be touched whatever happens) and the state dir in a temp dir: the
// NIC that carries this machine's connection must be refused.
TEST(BindRealHost, RefusesThisMachinesOwnConnection) {
  Host host;
  FakeHost scratch;  // only for its temp dir
  host.paths.state_dir = scratch.state_dir;
  int attempted_writes = 0;
  host.write_sysfs = [&](const std::string& path, const std::string&) -> Status {
    ++attempted_writes;
    return fail(EPERM, "this test never writes to the real " + path);
  };
  auto list = list_network_devices(host);
  if (!list) GTEST_SKIP() << list.error().message();
  auto own = std::find_if(list->begin(), list->end(), [](const DeviceInfo& d) { return d.carries_host_connection(); });
  if (own == list->end()) GTEST_SKIP() << "no PCI NIC carries this machine's connection";
  auto result = bind_to_vfio(host, own->address);
  ASSERT_FALSE(result);
  EXPECT_EQ(result.error().code(), EBUSY) << result.error().message();
  EXPECT_EQ(attempted_writes, 0);
  EXPECT_FALSE(scratch.exists(scratch.state_dir));
  std::printf("%s\n", result.error().message().c_str());
}

TEST(VfioGroupUsers, MatchesOnlyLinksToTheGroupNode) {
  FakeHost fake;
  fake.link(fake.dev + "/vfio/3", fake.proc + "/77/fd/4");
  fake.write(fake.proc + "/77/comm", "ufab\n");
  fake.link(fake.dev + "/vfio/30", fake.proc + "/88/fd/4");
  fake.link(fake.dev + "/vfio/3", fake.proc + "/self/fd/4");  // not a pid
  auto users = vfio_group_users(fake.host().paths, 3);
  EXPECT_EQ(users, std::vector<std::string>{"pid 77 (ufab)"});
}

}  // namespace
}  // namespace ufab::pci
