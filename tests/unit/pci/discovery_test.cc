#include "core/pci/discovery.h"

#include <gtest/gtest.h>
#include <limits.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdio>

#include "base/files.h"
#include "tests/unit/pci/fake_host.h"

namespace ufab::pci {
namespace {

using testing::FakeDevice;
using testing::FakeHost;
using testing::FakeNetdev;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

PciAddress addr(const char* text) { return *PciAddress::parse(text); }

// A host with one device in every interesting state.
class DiscoveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fake_.add_vfio_support();
    // Storage: never listed.
    fake_.add_device({.address = "0000:00:02.0",
                      .vendor = 0x1af4,
                      .device = 0x1042,
                      .class_code = 0x010000,
                      .subsystem_vendor = 0x1af4,
                      .subsystem_device = 0x0002,
                      .driver = "virtio-pci",
                      .iommu_group = 2});
    // The host's own NIC: eth0 up with an address and the default route.
    fake_.add_device({.address = "0000:00:03.0",
                      .vendor = 0x1af4,
                      .device = 0x1041,
                      .subsystem_vendor = 0x1af4,
                      .subsystem_device = 0x1100,
                      .revision = 1,
                      .driver = "virtio-pci",
                      .iommu_group = 3,
                      .netdevs = {FakeNetdev{.name = "eth0", .flags = "0x1003", .parent = "virtio2"}}});
    // Two ports of one e1000e card sharing IOMMU group 7; ens1 is down.
    fake_.add_device({.address = "0000:01:00.0",
                      .revision = 0x03,
                      .driver = "e1000e",
                      .iommu_group = 7,
                      .numa_node = 1,
                      .link_speed = "2.5 GT/s PCIe",
                      .link_width = 1,
                      .netdevs = {FakeNetdev{.name = "ens1", .operstate = "down", .flags = "0x1002"}}});
    fake_.add_device({.address = "0000:01:00.1", .driver = "e1000e", .iommu_group = 7});
    // Already handed to vfio-pci, alone in its group.
    fake_.add_device({.address = "0000:02:00.0", .driver = "vfio-pci", .iommu_group = 9});
    // No IOMMU group at all.
    fake_.add_device({.address = "0000:03:00.0", .driver = "e1000e"});

    HostNetworkState net;
    net.addresses = {{"eth0", "192.0.2.2", 24, false, false},
                     {"eth0", "fe80::fc:ff:fe00:1", 64, true, true},
                     {"ens1", "fe80::1", 64, true, true}};
    net.routes = {{"eth0", "0.0.0.0", 0, "192.0.2.1", false}, {"eth0", "192.0.2.0", 24, "", false}};
    fake_.network = net;
  }

  const DeviceInfo& find(const std::vector<DeviceInfo>& list, const char* address) {
    auto it = std::find_if(list.begin(), list.end(), [&](const DeviceInfo& d) { return d.address.str() == address; });
    EXPECT_NE(it, list.end()) << address << " not listed";
    return *it;
  }

  FakeHost fake_;
};

TEST_F(DiscoveryTest, ListsOnlyNetworkClassDevicesInAddressOrder) {
  auto list = list_network_devices(fake_.host());
  ASSERT_TRUE(list) << list.error().message();
  std::vector<std::string> addresses;
  for (const DeviceInfo& d : *list) addresses.push_back(d.address.str());
  EXPECT_EQ(addresses,
            (std::vector<std::string>{"0000:00:03.0", "0000:01:00.0", "0000:01:00.1", "0000:02:00.0", "0000:03:00.0"}));
}

TEST_F(DiscoveryTest, NamesComeFromPciIds) {
  auto list = list_network_devices(fake_.host());
  ASSERT_TRUE(list) << list.error().message();
  const DeviceInfo& intel = find(*list, "0000:01:00.0");
  EXPECT_EQ(intel.vendor_id, 0x8086);
  EXPECT_EQ(intel.device_id, 0x10d3);
  EXPECT_EQ(intel.vendor_name, "Intel Corporation");
  EXPECT_EQ(intel.device_name, "82574L Gigabit Network Connection");
  EXPECT_EQ(intel.subsystem_name, "Gigabit CT Desktop Adapter");
  EXPECT_EQ(intel.class_code, 0x020000u);
  EXPECT_EQ(intel.class_name, "Ethernet controller");
  EXPECT_EQ(intel.revision, 0x03);
  const DeviceInfo& virtio = find(*list, "0000:00:03.0");
  EXPECT_EQ(virtio.vendor_name, "Red Hat, Inc.");
  EXPECT_TRUE(contains(virtio.device_name, "Virtio")) << virtio.device_name;
  EXPECT_TRUE(contains(virtio.device_name, "network")) << virtio.device_name;
  EXPECT_EQ(virtio.subsystem_vendor_id, 0x1af4);
  EXPECT_EQ(virtio.subsystem_device_id, 0x1100);
}

TEST_F(DiscoveryTest, UnknownIdsGiveEmptyNamesNotNumbers) {
  fake_.add_device({.address = "0000:04:00.0", .vendor = 0x1234, .device = 0xfedc, .iommu_group = 11});
  auto info = describe(fake_.host(), addr("0000:04:00.0"));
  ASSERT_TRUE(info) << info.error().message();
  EXPECT_EQ(info->device_name, "");
  EXPECT_EQ(info->class_name, "Ethernet controller");
}

TEST_F(DiscoveryTest, SysfsAttributesDriverNumaAndLink) {
  auto info = describe(fake_.host(), addr("0000:01:00.0"));
  ASSERT_TRUE(info) << info.error().message();
  EXPECT_EQ(info->driver, "e1000e");
  EXPECT_EQ(info->driver_override, "");
  EXPECT_EQ(info->numa_node, 1);
  EXPECT_EQ(info->current_link_speed, "2.5 GT/s PCIe");
  EXPECT_EQ(info->max_link_width, 1u);
  auto other = describe(fake_.host(), addr("0000:01:00.1"));
  ASSERT_TRUE(other);
  EXPECT_EQ(other->numa_node, -1);
  EXPECT_EQ(other->current_link_speed, std::nullopt);
  EXPECT_EQ(other->current_link_width, std::nullopt);
}

TEST_F(DiscoveryTest, IommuGroupMembersAndTheirDrivers) {
  auto info = describe(fake_.host(), addr("0000:01:00.0"));
  ASSERT_TRUE(info);
  EXPECT_EQ(info->iommu_group, 7u);
  ASSERT_EQ(info->group_members.size(), 2u);
  EXPECT_EQ(info->group_members[0].name, "0000:01:00.0");
  EXPECT_EQ(info->group_members[1].name, "0000:01:00.1");
  EXPECT_EQ(info->group_members[1].driver, "e1000e");
  EXPECT_FALSE(info->group_viable);
  auto blockers = info->group_blockers();
  ASSERT_EQ(blockers.size(), 1u);
  EXPECT_EQ(blockers[0].name, "0000:01:00.1");
}

TEST_F(DiscoveryTest, BridgesAndUnboundMembersKeepAGroupViable) {
  fake_.add_device({.address = "0000:05:00.0", .class_code = 0x060400, .driver = "pcieport", .iommu_group = 12});
  fake_.add_device({.address = "0000:06:00.0", .iommu_group = 12});  // no driver
  fake_.add_device({.address = "0000:06:00.1", .driver = "vfio-pci", .iommu_group = 12});
  auto info = describe(fake_.host(), addr("0000:06:00.1"));
  ASSERT_TRUE(info);
  EXPECT_EQ(info->group_members.size(), 3u);
  EXPECT_TRUE(info->group_viable);
  EXPECT_EQ(info->readiness, Readiness::kReady) << info->readiness_reason;
}

TEST_F(DiscoveryTest, ReadinessVerdicts) {
  auto list = list_network_devices(fake_.host());
  ASSERT_TRUE(list) << list.error().message();

  const DeviceInfo& host_nic = find(*list, "0000:00:03.0");
  EXPECT_EQ(host_nic.readiness, Readiness::kInUse);
  EXPECT_TRUE(contains(host_nic.readiness_reason, "eth0")) << host_nic.readiness_reason;
  EXPECT_TRUE(contains(host_nic.readiness_reason, "192.0.2.2/24")) << host_nic.readiness_reason;

  const DeviceInfo& port0 = find(*list, "0000:01:00.0");
  EXPECT_EQ(port0.readiness, Readiness::kBindable);
  EXPECT_TRUE(contains(port0.readiness_reason, "e1000e"));
  EXPECT_TRUE(contains(port0.readiness_reason, "0000:01:00.1 (e1000e)")) << port0.readiness_reason;

  const DeviceInfo& ready = find(*list, "0000:02:00.0");
  EXPECT_EQ(ready.readiness, Readiness::kReady) << ready.readiness_reason;
  ASSERT_TRUE(ready.vfio_node);
  EXPECT_TRUE(ready.vfio_node->exists);
  EXPECT_EQ(ready.vfio_node->mode, 0600u);
  EXPECT_EQ(ready.vfio_node->path, fake_.dev + "/vfio/9");

  const DeviceInfo& no_iommu = find(*list, "0000:03:00.0");
  EXPECT_EQ(no_iommu.readiness, Readiness::kNoIommu);
  EXPECT_TRUE(contains(no_iommu.readiness_reason, "intel_iommu=on"));
  EXPECT_FALSE(no_iommu.vfio_node);
  EXPECT_EQ(std::string(readiness_name(no_iommu.readiness)), "no-iommu");
}

TEST_F(DiscoveryTest, VfioBoundButGroupNotViableOrNodeMissingIsNotReady) {
  fake_.add_device({.address = "0000:07:00.0", .driver = "vfio-pci", .iommu_group = 20});
  fake_.add_device({.address = "0000:07:00.1", .driver = "igb", .iommu_group = 20});
  auto info = describe(fake_.host(), addr("0000:07:00.0"));
  ASSERT_TRUE(info);
  EXPECT_EQ(info->readiness, Readiness::kNotReady);
  EXPECT_TRUE(contains(info->readiness_reason, "not viable")) << info->readiness_reason;
  EXPECT_TRUE(contains(info->readiness_reason, "0000:07:00.1 (igb)")) << info->readiness_reason;

  ::unlink((fake_.dev + "/vfio/9").c_str());
  auto missing = describe(fake_.host(), addr("0000:02:00.0"));
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->readiness, Readiness::kNotReady);
  EXPECT_TRUE(contains(missing->readiness_reason, fake_.dev + "/vfio/9 is missing")) << missing->readiness_reason;
}

TEST_F(DiscoveryTest, InterfaceDetailsAndConnectionEvidence) {
  auto info = describe(fake_.host(), addr("0000:00:03.0"));
  ASSERT_TRUE(info);
  ASSERT_EQ(info->interfaces.size(), 1u);
  const NetInterface& eth0 = info->interfaces[0];
  EXPECT_EQ(eth0.name, "eth0");
  EXPECT_EQ(eth0.operstate, "up");
  EXPECT_EQ(eth0.mac, "52:54:00:12:34:56");
  EXPECT_TRUE(eth0.admin_up);
  EXPECT_EQ(eth0.addresses.size(), 2u);
  EXPECT_EQ(eth0.routes.size(), 2u);
  EXPECT_TRUE(eth0.carries_host_connection);
  EXPECT_TRUE(contains(eth0.connection_reason, "route default via 192.0.2.1")) << eth0.connection_reason;
}

TEST_F(DiscoveryTest, LinkLocalOnlyOrDownInterfacesDoNotCarryTheConnection) {
  // ens1 is down and has only a link-local address.
  auto down = describe(fake_.host(), addr("0000:01:00.0"));
  ASSERT_TRUE(down);
  ASSERT_EQ(down->interfaces.size(), 1u);
  EXPECT_FALSE(down->interfaces[0].admin_up);
  EXPECT_FALSE(down->carries_host_connection());

  // Up, but still only link-local: not the host's connection.
  fake_.write(fake_.device_dir("0000:01:00.0") + "/net/ens1/flags", "0x1003\n");
  auto up = describe(fake_.host(), addr("0000:01:00.0"));
  ASSERT_TRUE(up);
  EXPECT_TRUE(up->interfaces[0].admin_up);
  EXPECT_FALSE(up->carries_host_connection());

  // A route alone is enough.
  fake_.network->routes.push_back({"ens1", "198.51.100.0", 24, "", false});
  auto routed = describe(fake_.host(), addr("0000:01:00.0"));
  ASSERT_TRUE(routed);
  EXPECT_TRUE(routed->carries_host_connection());
  EXPECT_EQ(routed->readiness, Readiness::kInUse);
  EXPECT_TRUE(contains(routed->readiness_reason, "198.51.100.0/24")) << routed->readiness_reason;
}

TEST_F(DiscoveryTest, NetdevsAreFoundWhereverTheyHangBelowTheDevice) {
  // The host NIC's eth0 lives at <device>/virtio2/net/eth0, as virtio-net has it.
  auto virtio = describe(fake_.host(), addr("0000:00:03.0"));
  ASSERT_TRUE(virtio);
  ASSERT_EQ(virtio->interfaces.size(), 1u);
  EXPECT_EQ(virtio->interfaces[0].name, "eth0");

  // A bridge's directory holds its children; their netdevs are not the bridge's.
  fake_.add_device({.address = "0000:00:1c.0", .class_code = 0x060400, .driver = "pcieport", .iommu_group = 30});
  std::string child_netdev = fake_.device_dir("0000:00:1c.0") + "/0000:0c:00.0/net/eth5";
  fake_.write(child_netdev + "/operstate", "up\n");
  fake_.link(child_netdev, fake_.sysfs + "/class/net/eth5");
  // And virtual interfaces belong to no device.
  fake_.write(fake_.sysfs + "/devices/virtual/net/lo/operstate", "unknown\n");
  fake_.link("../../devices/virtual/net/lo", fake_.sysfs + "/class/net/lo");
  auto bridge = describe(fake_.host(), addr("0000:00:1c.0"));
  ASSERT_TRUE(bridge);
  EXPECT_TRUE(bridge->interfaces.empty()) << bridge->interfaces[0].name;
  auto again = describe(fake_.host(), addr("0000:00:03.0"));
  ASSERT_TRUE(again);
  EXPECT_EQ(again->interfaces.size(), 1u);
}

TEST_F(DiscoveryTest, OperstateDecidesWhenThereIsNoFlagsFile) {
  fake_.add_device({.address = "0000:08:00.0",
                    .iommu_group = 21,
                    .netdevs = {FakeNetdev{.name = "enp8s0", .operstate = "unknown"}}});
  fake_.network->addresses.push_back({"enp8s0", "10.1.1.1", 8, false, false});
  auto info = describe(fake_.host(), addr("0000:08:00.0"));
  ASSERT_TRUE(info);
  EXPECT_TRUE(info->interfaces[0].admin_up);
  EXPECT_EQ(info->readiness, Readiness::kInUse);
}

TEST_F(DiscoveryTest, UnreadableNetworkStateCountsUpInterfacesAsInUse) {
  fake_.network = std::unexpected(Error(EACCES, "cannot read /proc/net/route"));
  auto info = describe(fake_.host(), addr("0000:00:03.0"));
  ASSERT_TRUE(info);
  EXPECT_EQ(info->readiness, Readiness::kInUse);
  EXPECT_TRUE(contains(info->network_error, "/proc/net/route"));
  EXPECT_TRUE(contains(info->readiness_reason, "could not be read")) << info->readiness_reason;
}

TEST_F(DiscoveryTest, DescribeTellsNonNicsApart) {
  auto storage = describe(fake_.host(), addr("0000:00:02.0"));
  ASSERT_TRUE(storage) << storage.error().message();
  EXPECT_FALSE(storage->is_network());
  EXPECT_EQ(storage->readiness, Readiness::kNotNetwork);
  EXPECT_EQ(storage->class_name, "SCSI storage controller");
  EXPECT_TRUE(contains(storage->readiness_reason, "not a network device"));
  EXPECT_TRUE(contains(storage->readiness_reason, "0x010000"));
}

TEST_F(DiscoveryTest, MissingDeviceAndMalformedAddress) {
  auto missing = describe(fake_.host(), addr("0000:0a:00.0"));
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code(), ENODEV);
  EXPECT_TRUE(contains(missing.error().message(), "0000:0a:00.0"));
  EXPECT_TRUE(contains(missing.error().message(), "ufab list"));

  auto malformed = describe(fake_.host(), std::string("01:00"));
  ASSERT_FALSE(malformed);
  EXPECT_EQ(malformed.error().code(), EINVAL);
  EXPECT_TRUE(contains(malformed.error().message(), "not a PCI address"));
}

TEST(DiscoveryLibpci, WorksWithOnlyVendorDeviceAndClassFiles) {
  FakeHost fake;
  fake.add_device({.address = "0000:01:00.0", .minimal = true});
  auto list = list_network_devices(fake.host());
  ASSERT_TRUE(list) << list.error().message();
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].device_name, "82574L Gigabit Network Connection");
  EXPECT_EQ((*list)[0].readiness, Readiness::kNoIommu);
}

TEST(DiscoveryLibpci, AnIncompleteDeviceEntryIsAnErrorNotAnExit) {
  FakeHost fake;
  fake.add_device({.address = "0000:01:00.0"});
  // As mid hot-plug: the directory is there, its `device` file is not yet.
  ::unlink((fake.device_dir("0000:01:00.0") + "/device").c_str());
  auto list = list_network_devices(fake.host());
  ASSERT_FALSE(list);
  EXPECT_EQ(list.error().code(), EIO);
  EXPECT_TRUE(contains(list.error().message(), "0000:01:00.0/device")) << list.error().message();
  // And libpci still works afterwards in this process.
  fake.write(fake.device_dir("0000:01:00.0") + "/device", "0x10d3\n");
  EXPECT_TRUE(list_network_devices(fake.host()));
}

TEST(DiscoveryLibpci, NamesComeFromTheConfiguredIdFile) {
  FakeHost fake;
  fake.add_device({.address = "0000:01:00.0", .iommu_group = 1});
  fake.write(fake.root + "/pci.ids",
             "8086  Test Vendor\n\t10d3  Test NIC\nC 02  Network controller\n\t00  Test Ethernet\n");
  Host host = fake.host();
  host.paths.pci_ids = fake.root + "/pci.ids";
  auto info = describe(host, addr("0000:01:00.0"));
  ASSERT_TRUE(info) << info.error().message();
  EXPECT_EQ(info->vendor_name, "Test Vendor");
  EXPECT_EQ(info->device_name, "Test NIC");
  EXPECT_EQ(info->class_name, "Test Ethernet");
  host.paths.pci_ids = fake.root + "/missing.ids";
  auto missing = describe(host, addr("0000:01:00.0"));
  ASSERT_FALSE(missing);
  EXPECT_TRUE(contains(missing.error().message(), "missing.ids")) << missing.error().message();
}

TEST(DiscoveryLibpci, NoSysfsIsAClearError) {
  Host host;
  host.paths.sysfs = "/nonexistent-ufab-sysfs";
  auto list = list_network_devices(host);
  ASSERT_FALSE(list);
  EXPECT_TRUE(contains(list.error().message(), "is sysfs mounted"));
}

// Reads only: the real machine's PCI bus through the same code path. Every
// netdev in /sys/class/net that sits on a PCI NIC must show up on that NIC,
// or the safety rule could miss the machine's own connection.
TEST(DiscoveryRealHost, EveryPciNetdevOfThisMachineIsAttributedToItsNic) {
  if (!path_exists("/sys/bus/pci/devices")) GTEST_SKIP() << "no /sys/bus/pci on this machine";
  auto list = list_network_devices(Host{});
  ASSERT_TRUE(list) << list.error().message();
  for (const DeviceInfo& d : *list) {
    EXPECT_TRUE(d.is_network());
    EXPECT_FALSE(d.readiness_reason.empty());
  }
  int checked = 0;
  for (const std::string& name : list_dir("/sys/class/net")) {
    char real[PATH_MAX];
    if (!::realpath(("/sys/class/net/" + name + "/device").c_str(), real)) continue;  // virtual
    // The PCI function is the last path component that is a PCI address.
    std::optional<PciAddress> owner;
    std::string path = real;
    for (size_t start = 0; start < path.size();) {
      size_t end = path.find('/', start);
      if (end == std::string::npos) end = path.size();
      if (auto a = PciAddress::parse(path.substr(start, end - start))) owner = *a;
      start = end + 1;
    }
    if (!owner) continue;
    auto it = std::find_if(list->begin(), list->end(), [&](const DeviceInfo& d) { return d.address == *owner; });
    if (it == list->end()) continue;  // not a class 02 device
    bool found = std::any_of(it->interfaces.begin(), it->interfaces.end(),
                             [&](const NetInterface& n) { return n.name == name; });
    EXPECT_TRUE(found) << name << " of " << owner->str() << " not found";
    ++checked;
  }
  std::printf("checked %d PCI netdevs of this machine\n", checked);
}

}  // namespace
}  // namespace ufab::pci
