#include "vfio/device.h"

#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "tests/unit/vfio/fake_kernel.h"
#include "vfio/container.h"

namespace ufab::vfio {
namespace {

using testing::FakeKernel;
using testing::FakeWorld;

constexpr uint64_t KiB = 1024;
const PciAddress kNic{0, 0, 3, 0};
const std::string kNicName = "0000:00:03.0";

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

class DeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    world_.sysfs.create_vfio_node();
    world_.add_vfio_device(kNicName, 5);
  }
  void TearDown() override {
    EXPECT_EQ(world_.kernel.open_fds(), 0u) << "the VFIO layer leaked fds";
    EXPECT_EQ(world_.kernel.device_mmaps(), 0u) << "the VFIO layer leaked BAR mappings";
    EXPECT_EQ(world_.kernel.devices_closed_with_irqs_enabled, 0) << "IRQs were left to the kernel to disable";
  }
  FakeKernel::Device& nic() { return world_.kernel.device(kNicName); }

  Result<Device> open() {
    auto c = Container::open(world_.env());
    if (!c) return std::unexpected(c.error());
    return Device::open(*c, kNic);
  }

  FakeWorld world_;
};

TEST_F(DeviceTest, OpensAndReadsDeviceInfo) {
  auto d = open();
  ASSERT_TRUE(d) << d.error().message();
  EXPECT_EQ(d->address(), kNic);
  EXPECT_TRUE(d->info().is_pci());
  EXPECT_TRUE(d->info().reset_supported());
  EXPECT_EQ(d->info().num_regions, uint32_t{VFIO_PCI_NUM_REGIONS});
  EXPECT_EQ(d->info().num_irqs, 5u);
  EXPECT_EQ(d->iommu()->kind(), "vfio-type1");
}

TEST_F(DeviceTest, RegionInfoOfPlainRegions) {
  auto d = open();
  ASSERT_TRUE(d);
  auto bar0 = d->region_info(0);
  ASSERT_TRUE(bar0) << bar0.error().message();
  EXPECT_EQ(bar0->size, 128 * KiB);
  EXPECT_EQ(bar0->offset, 0u);
  EXPECT_TRUE(bar0->mappable());
  EXPECT_TRUE(bar0->readable() && bar0->writable());
  EXPECT_FALSE(bar0->sparse_areas);
  EXPECT_EQ(bar0->mappable_areas(), (std::vector<MmapArea>{{0, 128 * KiB}}));
  auto config = d->region_info(kConfigRegion);
  ASSERT_TRUE(config);
  EXPECT_EQ(config->offset, uint64_t{7} << 40);
  EXPECT_FALSE(config->mappable());
  // Without capabilities one GET_REGION_INFO per region is enough.
  EXPECT_EQ(world_.kernel.region_info_argsz[0].size(), 1u);
  // The VGA region does not exist on this device; asking says why.
  auto vga = d->region_info(VFIO_PCI_VGA_REGION_INDEX);
  ASSERT_FALSE(vga);
  EXPECT_TRUE(contains(vga.error().message(), "GET_REGION_INFO(8)")) << vga.error().message();
  auto beyond = d->region_info(40);
  ASSERT_FALSE(beyond);
  EXPECT_TRUE(contains(beyond.error().message(), "has 9 regions")) << beyond.error().message();
}

TEST_F(DeviceTest, RegionCapabilitiesAreParsedAfterGrowingArgsz) {
  // BAR 3 holds the MSI-X table at 0x2000-0x2fff: only around it is mmap-able.
  nic().regions[3] = FakeKernel::Region::with(
      VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE | VFIO_REGION_INFO_FLAG_MMAP, 16 * KiB);
  nic().regions[3].sparse_areas = std::vector<std::pair<uint64_t, uint64_t>>{{0, 8 * KiB}, {12 * KiB, 4 * KiB}};
  nic().regions[3].type = std::make_pair(0x80008086u, 1u);
  nic().regions[3].msix_mappable = true;
  auto d = open();
  ASSERT_TRUE(d) << d.error().message();
  auto& argsz = world_.kernel.region_info_argsz[3];
  ASSERT_EQ(argsz.size(), 2u);
  EXPECT_EQ(argsz[0], sizeof(vfio_region_info));
  EXPECT_GT(argsz[1], sizeof(vfio_region_info));
  auto bar3 = d->region_info(3);
  ASSERT_TRUE(bar3) << bar3.error().message();
  ASSERT_TRUE(bar3->sparse_areas);
  EXPECT_EQ(*bar3->sparse_areas, (std::vector<MmapArea>{{0, 8 * KiB}, {12 * KiB, 4 * KiB}}));
  EXPECT_EQ(bar3->type, 0x80008086u);
  EXPECT_EQ(bar3->subtype, 1u);
  EXPECT_TRUE(bar3->msix_mappable);
  EXPECT_EQ(bar3->mappable_areas().size(), 2u);
}

TEST_F(DeviceTest, MapRegionGivesAnMmioViewOfTheBar) {
  auto d = open();
  ASSERT_TRUE(d);
  world_.kernel.bar_write32(kNicName, 0, 0x5400, 0x00563412);  // RAL0 as the device holds it
  auto bar = d->map_region(0);
  ASSERT_TRUE(bar) << bar.error().message();
  EXPECT_EQ((*bar)->size(), 128 * KiB);
  EXPECT_EQ(world_.kernel.device_mmaps(), 1u);
  auto ral = (*bar)->read32(0x5400);
  ASSERT_TRUE(ral) << ral.error().message();
  EXPECT_EQ(*ral, 0x00563412u);
  auto tdt = (*bar)->reg32(0x3818);
  ASSERT_TRUE(tdt);
  tdt->write(42);
  EXPECT_EQ(world_.kernel.bar_read32(kNicName, 0, 0x3818), 42u);  // MAP_SHARED reaches the device
  auto whole = (*bar)->mmio();
  ASSERT_TRUE(whole);
  EXPECT_EQ(whole->size(), 128 * KiB);
  EXPECT_FALSE((*bar)->read32(128 * KiB));
  // Mapping again returns the same mapping rather than a second one.
  auto again = d->map_region(0);
  ASSERT_TRUE(again);
  EXPECT_EQ(*again, *bar);
  EXPECT_EQ(world_.kernel.device_mmaps(), 1u);
  ASSERT_TRUE(d->unmap_region(0));
  EXPECT_EQ(world_.kernel.device_mmaps(), 0u);
  EXPECT_FALSE(d->unmap_region(0));
}

TEST_F(DeviceTest, SparseMmapMapsOnlyTheListedAreas) {
  nic().regions[3] = FakeKernel::Region::with(
      VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE | VFIO_REGION_INFO_FLAG_MMAP, 16 * KiB);
  nic().regions[3].sparse_areas = std::vector<std::pair<uint64_t, uint64_t>>{{0, 8 * KiB}, {12 * KiB, 4 * KiB}};
  auto d = open();
  ASSERT_TRUE(d);
  auto bar = d->map_region(3);
  ASSERT_TRUE(bar) << bar.error().message();  // the fake refuses mmaps outside the areas
  ASSERT_EQ((*bar)->areas().size(), 2u);
  EXPECT_EQ((*bar)->areas()[1].begin(), 12 * KiB);
  EXPECT_EQ(world_.kernel.device_mmaps(), 2u);
  // Offsets stay BAR offsets in both areas.
  ASSERT_TRUE((*bar)->write32(0x10, 1));
  ASSERT_TRUE((*bar)->write32(12 * KiB + 0x10, 2));
  EXPECT_EQ(world_.kernel.bar_read32(kNicName, 3, 0x10), 1u);
  EXPECT_EQ(world_.kernel.bar_read32(kNicName, 3, 12 * KiB + 0x10), 2u);
  // The hole (the MSI-X table) is not accessible through the mapping.
  auto hole = (*bar)->read32(8 * KiB + 4);
  ASSERT_FALSE(hole);
  EXPECT_EQ(hole.error().code(), ERANGE);
  EXPECT_TRUE(contains(hole.error().message(), "outside its mmapped areas")) << hole.error().message();
  EXPECT_TRUE(contains(hole.error().message(), "0x0-0x1fff (8 KiB), 0x3000-0x3fff (4 KiB)"))
      << hole.error().message();
  EXPECT_FALSE((*bar)->mmio());  // not contiguous
  // ...but pread/pwrite through the region works there.
  ASSERT_TRUE(d->region_write<uint32_t>(3, 8 * KiB + 4, 0xabcd));
  EXPECT_EQ(world_.kernel.bar_read32(kNicName, 3, 8 * KiB + 4), 0xabcdu);
}

TEST_F(DeviceTest, RegionWithoutMmapFlagIsRefused) {
  auto d = open();
  ASSERT_TRUE(d);
  auto io = d->map_region(1);
  ASSERT_FALSE(io);
  EXPECT_TRUE(contains(io.error().message(), "BAR 1 of 0000:00:03.0 cannot be mmapped")) << io.error().message();
  EXPECT_TRUE(contains(io.error().message(), "region_read")) << io.error().message();
  auto config = d->map_region(kConfigRegion);
  ASSERT_FALSE(config);
  EXPECT_TRUE(contains(config.error().message(), "config space")) << config.error().message();
  auto empty = d->map_region(2);
  ASSERT_FALSE(empty);
  EXPECT_TRUE(contains(empty.error().message(), "not implemented")) << empty.error().message();
  EXPECT_EQ(world_.kernel.device_mmaps(), 0u);
}

TEST_F(DeviceTest, ConfigSpaceReadsAndWritesLittleEndian) {
  auto d = open();
  ASSERT_TRUE(d);
  auto vendor = d->config_read16(pci::kVendorId);
  ASSERT_TRUE(vendor) << vendor.error().message();
  EXPECT_EQ(*vendor, 0x8086);
  auto ids = d->config_read32(0);
  ASSERT_TRUE(ids);
  EXPECT_EQ(*ids, 0x10d38086u);
  EXPECT_EQ(*d->config_read8(pci::kCapabilityPointer), 0xc8);
  ASSERT_TRUE(d->config_write32(0x40, 0x11223344));
  EXPECT_EQ(nic().config[0x40], 0x44);
  EXPECT_EQ(nic().config[0x43], 0x11);
  ASSERT_TRUE(d->config_write8(0x44, 0x99));
  EXPECT_EQ(nic().config[0x44], 0x99);
  EXPECT_EQ(*d->config_read16(0x42), 0x1122);
}

TEST_F(DeviceTest, ConfigAccessIsBoundsAndAlignmentChecked) {
  auto d = open();
  ASSERT_TRUE(d);
  auto past = d->config_read32(0x100);
  ASSERT_FALSE(past);
  EXPECT_EQ(past.error().code(), ERANGE);
  EXPECT_TRUE(contains(past.error().message(), "outside config space of 0000:00:03.0 (256 bytes)"))
      << past.error().message();
  auto odd = d->config_read16(0x41);
  ASSERT_FALSE(odd);
  EXPECT_TRUE(contains(odd.error().message(), "not 2-byte aligned")) << odd.error().message();
  EXPECT_FALSE(d->config_write32(0xfe, 0));
}

TEST_F(DeviceTest, EnableBusMasterSetsCommandBit2) {
  nic().config[4] = 0x02;  // memory space on, bus master off (as after open)
  auto d = open();
  ASSERT_TRUE(d);
  ASSERT_TRUE(d->enable_bus_master());
  EXPECT_EQ(nic().config[4], 0x06);  // memory space kept
}

TEST_F(DeviceTest, BusMasterThatDoesNotStickIsAnError) {
  nic().bus_master_sticks = false;
  auto d = open();
  ASSERT_TRUE(d);
  auto status = d->enable_bus_master();
  ASSERT_FALSE(status);
  EXPECT_TRUE(contains(status.error().message(), "did not stick")) << status.error().message();
}

TEST_F(DeviceTest, CapabilityWalkFindsMsix) {
  auto d = open();
  ASSERT_TRUE(d);
  auto caps = d->pci_capabilities();
  ASSERT_TRUE(caps) << caps.error().message();
  EXPECT_EQ(*caps, (std::vector<pci::Capability>{{pci::kCapPowerManagement, 0xc8},
                                                 {pci::kCapMsi, 0xd0},
                                                 {pci::kCapPciExpress, 0xe0},
                                                 {pci::kCapMsix, 0xa0}}));
  auto msix = d->msix_capability();
  ASSERT_TRUE(msix);
  ASSERT_TRUE(msix->has_value());
  EXPECT_EQ((*msix)->table_size, 5);
  EXPECT_EQ((*msix)->table_bar, 3);
  EXPECT_EQ((*msix)->pba_offset, 0x2000u);
  auto ext = d->pci_extended_capabilities();
  ASSERT_TRUE(ext);
  EXPECT_TRUE(ext->empty());  // 256-byte config space
}

TEST_F(DeviceTest, IrqInfoPerIndex) {
  auto d = open();
  ASSERT_TRUE(d);
  auto msix = d->irq_info(IrqKind::msix);
  ASSERT_TRUE(msix);
  EXPECT_EQ(msix->count, 5u);
  EXPECT_TRUE(msix->eventfd());
  EXPECT_TRUE(msix->noresize());
  auto intx = d->irq_info(IrqKind::intx);
  ASSERT_TRUE(intx);
  EXPECT_TRUE(intx->automasked());
  EXPECT_TRUE(intx->maskable());
}

TEST_F(DeviceTest, MsixEnablesAllVectorsInOneCallAndDisablesOnDestruction) {
  std::vector<int> fds;
  {
    auto d = open();
    ASSERT_TRUE(d);
    auto vectors = d->enable_irqs(IrqKind::msix, 3);
    ASSERT_TRUE(vectors) << vectors.error().message();
    ASSERT_EQ(vectors->size(), 3u);
    ASSERT_EQ(world_.kernel.irq_set_calls.size(), 1u);
    const auto& call = world_.kernel.irq_set_calls[0];
    EXPECT_EQ(call.index, uint32_t{VFIO_PCI_MSIX_IRQ_INDEX});
    EXPECT_EQ(call.flags, uint32_t{VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER});
    EXPECT_EQ(call.start, 0u);
    EXPECT_EQ(call.count, 3u);
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(call.fds[i], (*vectors)[i].get());
    EXPECT_EQ(d->enabled_irqs(IrqKind::msix), 3u);
    EXPECT_EQ(nic().enabled.at(VFIO_PCI_MSIX_IRQ_INDEX).size(), 3u);

    // The loopback trigger reaches the right eventfd.
    ASSERT_TRUE(d->trigger_irq(IrqKind::msix, 1));
    uint64_t count = 0;
    EXPECT_EQ(::read((*vectors)[1].get(), &count, sizeof count), 8);
    EXPECT_EQ(count, 1u);
    EXPECT_EQ(::read((*vectors)[0].get(), &count, sizeof count), -1);  // non-blocking, nothing pending
    EXPECT_EQ(errno, EAGAIN);
    EXPECT_FALSE(d->trigger_irq(IrqKind::msix, 3));
  }
  // Destroying the device disabled MSI-X before closing the fd.
  const auto& last = world_.kernel.irq_set_calls.back();
  EXPECT_EQ(last.index, uint32_t{VFIO_PCI_MSIX_IRQ_INDEX});
  EXPECT_EQ(last.flags, uint32_t{VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER});
  EXPECT_EQ(last.count, 0u);
  EXPECT_TRUE(nic().enabled.empty());
}

TEST_F(DeviceTest, EnablingMoreVectorsLaterIsRefusedWithTheReason) {
  auto d = open();
  ASSERT_TRUE(d);
  auto first = d->enable_irqs(IrqKind::msix, 2);
  ASSERT_TRUE(first);
  auto more = d->enable_irqs(IrqKind::msix, 4);
  ASSERT_FALSE(more);
  EXPECT_EQ(more.error().code(), EBUSY);
  EXPECT_TRUE(contains(more.error().message(), "disable_irqs() first")) << more.error().message();
  ASSERT_TRUE(d->disable_irqs(IrqKind::msix));
  EXPECT_EQ(d->enabled_irqs(IrqKind::msix), 0u);
  auto all = d->enable_irqs(IrqKind::msix, 4);
  ASSERT_TRUE(all) << all.error().message();
}

TEST_F(DeviceTest, DisablingWhatIsNotEnabledIsANoOp) {
  auto d = open();
  ASSERT_TRUE(d);
  EXPECT_TRUE(d->disable_irqs(IrqKind::msix));
  EXPECT_TRUE(world_.kernel.irq_set_calls.empty());  // the kernel would say EINVAL
  auto v = d->enable_irqs(IrqKind::msix, 1);
  ASSERT_TRUE(v);
  EXPECT_TRUE(d->disable_irqs(IrqKind::msix));
  EXPECT_TRUE(d->disable_irqs(IrqKind::msix));
  EXPECT_EQ(world_.kernel.irq_set_calls.size(), 2u);  // one enable, one disable
}

TEST_F(DeviceTest, VectorCountIsChecked) {
  auto d = open();
  ASSERT_TRUE(d);
  auto too_many = d->enable_irqs(IrqKind::msix, 6);
  ASSERT_FALSE(too_many);
  EXPECT_TRUE(contains(too_many.error().message(), "offers only 5 MSI-X vector(s)")) << too_many.error().message();
  EXPECT_FALSE(d->enable_irqs(IrqKind::msix, 0));
  EXPECT_TRUE(world_.kernel.irq_set_calls.empty());
}

TEST_F(DeviceTest, OnlyOneInterruptTypeAtATime) {
  auto d = open();
  ASSERT_TRUE(d);
  auto msi = d->enable_irqs(IrqKind::msi, 1);
  ASSERT_TRUE(msi);
  auto msix = d->enable_irqs(IrqKind::msix, 1);
  ASSERT_FALSE(msix);
  EXPECT_TRUE(contains(msix.error().message(), "MSI is enabled")) << msix.error().message();
}

TEST_F(DeviceTest, KernelRefusalClosesTheEventfds) {
  auto d = open();
  ASSERT_TRUE(d);
  world_.kernel.fail_ioctl(VFIO_DEVICE_SET_IRQS, EINVAL);
  auto vectors = d->enable_irqs(IrqKind::msix, 2);
  ASSERT_FALSE(vectors);
  EXPECT_TRUE(contains(vectors.error().message(), "VFIO_DEVICE_SET_IRQS")) << vectors.error().message();
  EXPECT_EQ(d->enabled_irqs(IrqKind::msix), 0u);
  EXPECT_EQ(world_.kernel.open_fds(), 3u);  // container, group, device: the eventfds are closed
}

TEST_F(DeviceTest, IntxCanBeUnmasked) {
  auto d = open();
  ASSERT_TRUE(d);
  auto intx = d->enable_irqs(IrqKind::intx, 1);
  ASSERT_TRUE(intx);
  ASSERT_TRUE(d->unmask_intx());
  EXPECT_EQ(world_.kernel.irq_set_calls.back().flags, uint32_t{VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_UNMASK});
}

TEST_F(DeviceTest, ResetWhenSupported) {
  auto d = open();
  ASSERT_TRUE(d);
  ASSERT_TRUE(d->reset());
  EXPECT_EQ(nic().resets, 1);
}

TEST_F(DeviceTest, ResetWithoutSupportIsAClearError) {
  nic().flags = VFIO_DEVICE_FLAGS_PCI;
  auto d = open();
  ASSERT_TRUE(d);
  auto status = d->reset();
  ASSERT_FALSE(status);
  EXPECT_EQ(status.error().code(), ENOTSUP);
  EXPECT_TRUE(contains(status.error().message(), "does not support reset")) << status.error().message();
  EXPECT_TRUE(contains(status.error().message(), "own registers")) << status.error().message();
  EXPECT_EQ(nic().resets, 0);
}

TEST_F(DeviceTest, DestructionUnmapsRegionsAndClosesEverything) {
  {
    auto d = open();
    ASSERT_TRUE(d);
    ASSERT_TRUE(d->map_region(0));
    auto v = d->enable_irqs(IrqKind::msix, 5);
    ASSERT_TRUE(v);
    EXPECT_EQ(world_.kernel.device_mmaps(), 1u);
    // Moving the device keeps one owner of the mapping and the IRQs.
    Device moved = std::move(*d);
    EXPECT_EQ(moved.enabled_irqs(IrqKind::msix), 5u);
  }
  EXPECT_EQ(world_.kernel.device_mmaps(), 0u);
  EXPECT_EQ(world_.kernel.open_fds(), 0u);
  // Exactly one disable: the moved-from object did nothing.
  int disables = 0;
  for (const auto& call : world_.kernel.irq_set_calls) disables += call.count == 0;
  EXPECT_EQ(disables, 1);
}

TEST_F(DeviceTest, DeviceKeepsItsContainerAlive) {
  auto c = Container::open(world_.env());
  ASSERT_TRUE(c);
  std::weak_ptr<Container> weak = *c;
  auto d = Device::open(*c, kNic);
  ASSERT_TRUE(d);
  c->reset();
  EXPECT_FALSE(weak.expired());
  EXPECT_TRUE(d->info().is_pci());
}

TEST_F(DeviceTest, DeviceOutsideTheGroupIsRejected) {
  world_.sysfs.add_device("0000:00:05.0", 5, "vfio-pci");  // sysfs says group 5, VFIO does not know it
  auto c = Container::open(world_.env());
  ASSERT_TRUE(c);
  auto d = Device::open(*c, PciAddress{0, 0, 5, 0});
  ASSERT_FALSE(d);
  EXPECT_EQ(d.error().code(), ENODEV);
  EXPECT_TRUE(contains(d.error().message(), "not in this group")) << d.error().message();
}

}  // namespace
}  // namespace ufab::vfio
