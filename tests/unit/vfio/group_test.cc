#include "vfio/group.h"

#include <gtest/gtest.h>

#include "tests/unit/vfio/fake_kernel.h"

namespace ufab::vfio {
namespace {

using testing::FakeWorld;

const PciAddress kNic{0, 0, 3, 0};

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

class GroupTest : public ::testing::Test {
 protected:
  void SetUp() override { world_.sysfs.create_vfio_node(); }
  void TearDown() override { EXPECT_EQ(world_.kernel.open_fds(), 0u); }
  FakeWorld world_;
};

TEST_F(GroupTest, FindsTheGroupThroughSysfs) {
  world_.add_vfio_device("0000:00:03.0", 17);
  auto group = iommu_group_of(world_.env(), kNic);
  ASSERT_TRUE(group) << group.error().message();
  EXPECT_EQ(*group, 17);
}

TEST_F(GroupTest, UnknownDeviceIsNamed) {
  auto group = iommu_group_of(world_.env(), kNic);
  ASSERT_FALSE(group);
  EXPECT_EQ(group.error().code(), ENODEV);
  EXPECT_TRUE(contains(group.error().message(), "no PCI device 0000:00:03.0")) << group.error().message();
}

TEST_F(GroupTest, DeviceWithoutGroupMeansNoIommu) {
  world_.sysfs.add_device_without_group("0000:00:03.0");
  auto group = iommu_group_of(world_.env(), kNic);
  ASSERT_FALSE(group);
  EXPECT_TRUE(contains(group.error().message(), "has no IOMMU group")) << group.error().message();
  EXPECT_TRUE(contains(group.error().message(), "intel_iommu=on")) << group.error().message();
}

TEST_F(GroupTest, MembersCarryTheirDrivers) {
  world_.sysfs.add_device("0000:00:03.0", 5, "vfio-pci");
  world_.sysfs.add_device("0000:00:03.1", 5, "e1000e");
  world_.sysfs.add_device("0000:00:03.2", 5, "");
  world_.sysfs.add_device("0000:00:09.0", 6, "virtio-pci");
  auto members = iommu_group_members(world_.env(), 5);
  ASSERT_EQ(members.size(), 3u);
  EXPECT_EQ(members[0].device, "0000:00:03.0");
  EXPECT_EQ(members[0].driver, "vfio-pci");
  EXPECT_EQ(members[1].driver, "e1000e");
  EXPECT_EQ(members[2].driver, std::nullopt);
}

TEST(GroupViability, DriversThatKeepAGroupViable) {
  EXPECT_TRUE(driver_keeps_group_viable(std::nullopt));
  EXPECT_TRUE(driver_keeps_group_viable("vfio-pci"));
  EXPECT_TRUE(driver_keeps_group_viable("mlx5_vfio-pci"));
  EXPECT_TRUE(driver_keeps_group_viable("pci-stub"));
  EXPECT_TRUE(driver_keeps_group_viable("pcieport"));
  EXPECT_FALSE(driver_keeps_group_viable("e1000e"));
  EXPECT_FALSE(driver_keeps_group_viable("vfio-pci-not"));
  EXPECT_FALSE(driver_keeps_group_viable("virtio-pci"));
}

TEST_F(GroupTest, ViableGroupOpensAndReportsStatus) {
  world_.add_vfio_device("0000:00:03.0", 5);
  auto group = Group::open(world_.env(), 5);
  ASSERT_TRUE(group) << group.error().message();
  EXPECT_EQ(group->number(), 5);
  auto flags = group->status_flags();
  ASSERT_TRUE(flags);
  EXPECT_EQ(*flags, uint32_t{VFIO_GROUP_FLAGS_VIABLE});
  EXPECT_TRUE(group->require_viable());
}

TEST_F(GroupTest, NonViableGroupNamesTheOffendingDevicesAndTheFix) {
  world_.add_vfio_device("0000:00:03.0", 5);
  world_.sysfs.add_device("0000:00:03.1", 5, "e1000e");
  world_.sysfs.add_device("0000:00:03.2", 5, "");          // unbound: fine
  world_.sysfs.add_device("0000:00:1c.0", 5, "pcieport");  // bridge: fine
  world_.kernel.set_group_viable(5, false);
  auto group = Group::open(world_.env(), 5);
  ASSERT_TRUE(group);
  auto status = group->require_viable();
  ASSERT_FALSE(status);
  const std::string& m = status.error().message();
  EXPECT_TRUE(contains(m, "IOMMU group 5 is not viable")) << m;
  EXPECT_TRUE(contains(m, "0000:00:03.1 is bound to e1000e")) << m;
  EXPECT_TRUE(contains(m, "`ufab bind 0000:00:03.1`")) << m;
  EXPECT_TRUE(contains(m, "unbind it")) << m;
  EXPECT_FALSE(contains(m, "0000:00:03.0 is bound")) << m;
  EXPECT_FALSE(contains(m, "0000:00:03.2")) << m;
  EXPECT_FALSE(contains(m, "pcieport")) << m;
}

TEST_F(GroupTest, SeveralOffendersAreAllNamed) {
  world_.add_vfio_device("0000:00:03.0", 5);
  world_.sysfs.add_device("0000:00:03.1", 5, "e1000e");
  world_.sysfs.add_device("0000:00:03.3", 5, "snd_hda_intel");
  world_.kernel.set_group_viable(5, false);
  auto group = Group::open(world_.env(), 5);
  ASSERT_TRUE(group);
  auto status = group->require_viable();
  ASSERT_FALSE(status);
  const std::string& m = status.error().message();
  EXPECT_TRUE(contains(m, "0000:00:03.1 is bound to e1000e, 0000:00:03.3 is bound to snd_hda_intel")) << m;
  EXPECT_TRUE(contains(m, "unbind them")) << m;
}

TEST_F(GroupTest, NonViableWithoutVisibleCulpritSaysSo) {
  world_.add_vfio_device("0000:00:03.0", 5);
  world_.kernel.set_group_viable(5, false);
  auto group = Group::open(world_.env(), 5);
  ASSERT_TRUE(group);
  auto status = group->require_viable();
  ASSERT_FALSE(status);
  EXPECT_TRUE(contains(status.error().message(), "retry")) << status.error().message();
}

TEST_F(GroupTest, MissingGroupNodeMeansNotBoundToVfio) {
  world_.sysfs.add_device("0000:00:03.0", 5, "e1000e");  // known to sysfs, not to VFIO
  auto group = Group::open(world_.env(), 5);
  ASSERT_FALSE(group);
  EXPECT_EQ(group.error().code(), ENOENT);
  const std::string& m = group.error().message();
  EXPECT_TRUE(contains(m, "no device of IOMMU group 5 is bound to vfio-pci")) << m;
  EXPECT_TRUE(contains(m, "0000:00:03.0 (e1000e)")) << m;
  EXPECT_TRUE(contains(m, "`ufab bind 0000:00:03.0`")) << m;
}

TEST(GroupOpen, MissingVfioEntirelySaysToLoadTheModule) {
  FakeWorld world;  // no /dev/vfio/vfio
  auto group = Group::open(world.env(), 5);
  ASSERT_FALSE(group);
  EXPECT_TRUE(contains(group.error().message(), "modprobe vfio-pci")) << group.error().message();
}

TEST_F(GroupTest, PermissionDeniedSaysHowToGetAccess) {
  world_.add_vfio_device("0000:00:03.0", 5);
  world_.kernel.open_errors[world_.sysfs.dev() + "/vfio/5"] = EACCES;
  auto group = Group::open(world_.env(), 5);
  ASSERT_FALSE(group);
  EXPECT_EQ(group.error().code(), EACCES);
  EXPECT_TRUE(contains(group.error().message(), "run as root")) << group.error().message();
  EXPECT_TRUE(contains(group.error().message(), "chown")) << group.error().message();
}

TEST_F(GroupTest, SecondOpenIsBusy) {
  world_.add_vfio_device("0000:00:03.0", 5);
  auto first = Group::open(world_.env(), 5);
  ASSERT_TRUE(first);
  auto second = Group::open(world_.env(), 5);
  ASSERT_FALSE(second);
  EXPECT_EQ(second.error().code(), EBUSY);
  EXPECT_TRUE(contains(second.error().message(), "already in use")) << second.error().message();
}

TEST_F(GroupTest, DeviceFdNeedsAContainerAndMembership) {
  world_.add_vfio_device("0000:00:03.0", 5);
  auto group = Group::open(world_.env(), 5);
  ASSERT_TRUE(group);
  auto early = group->open_device(kNic);
  ASSERT_FALSE(early);
  EXPECT_TRUE(contains(early.error().message(), "no container")) << early.error().message();
}

TEST_F(GroupTest, ClosingTheGroupReleasesIt) {
  world_.add_vfio_device("0000:00:03.0", 5);
  { auto group = Group::open(world_.env(), 5); ASSERT_TRUE(group); }
  EXPECT_TRUE(Group::open(world_.env(), 5));
}

}  // namespace
}  // namespace ufab::vfio
