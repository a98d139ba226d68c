#include "vfio/container.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include "tests/unit/vfio/fake_kernel.h"

namespace ufab::vfio {
namespace {

using testing::FakeWorld;

constexpr uint64_t KiB = 1024, MiB = 1024 * KiB;
const PciAddress kNic{0, 0, 3, 0};      // 0000:00:03.0
const PciAddress kSecond{0, 0, 4, 0};   // 0000:00:04.0

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Page-aligned anonymous memory to map for DMA.
class Buffer {
 public:
  explicit Buffer(size_t size) : size_(size) {
    ptr_ = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  }
  ~Buffer() { ::munmap(ptr_, size_); }
  void* get() const { return ptr_; }

 private:
  void* ptr_;
  size_t size_;
};

class ContainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    world_.sysfs.create_vfio_node();
    world_.add_vfio_device("0000:00:03.0", 5);
  }
  void TearDown() override { EXPECT_EQ(world_.kernel.open_fds(), 0u) << "the VFIO layer leaked fds"; }

  std::shared_ptr<Container> open_with_group() {
    auto c = Container::open(world_.env());
    EXPECT_TRUE(c) << c.error().message();
    if (!c) return nullptr;
    auto group = (*c)->add_group_of(kNic);
    EXPECT_TRUE(group) << group.error().message();
    return *c;
  }

  FakeWorld world_;
};

TEST_F(ContainerTest, OpensAndSetsTheIommuWhenTheFirstGroupJoins) {
  auto c = Container::open(world_.env());
  ASSERT_TRUE(c) << c.error().message();
  EXPECT_EQ((*c)->kind(), "vfio-type1");
  EXPECT_EQ(world_.kernel.set_iommu_calls, 0);  // needs a group first
  auto group = (*c)->add_group_of(kNic);
  ASSERT_TRUE(group) << group.error().message();
  EXPECT_EQ(*group, 5);
  EXPECT_EQ(world_.kernel.set_iommu_calls, 1);
  EXPECT_EQ((*c)->groups(), std::vector<int>{5});
  // Adding it again is a no-op.
  ASSERT_TRUE((*c)->add_group_of(kNic));
  EXPECT_EQ(world_.kernel.set_iommu_calls, 1);
}

TEST_F(ContainerTest, MissingVfioSaysToLoadTheModule) {
  world_.kernel.open_errors[world_.sysfs.dev() + "/vfio/vfio"] = ENOENT;
  auto c = Container::open(world_.env());
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code(), ENOENT);
  EXPECT_TRUE(contains(c.error().message(), "modprobe vfio-pci")) << c.error().message();
}

TEST_F(ContainerTest, WrongApiVersionIsRefused) {
  world_.kernel.api_version = 1;
  auto c = Container::open(world_.env());
  ASSERT_FALSE(c);
  EXPECT_TRUE(contains(c.error().message(), "API version 1")) << c.error().message();
}

TEST_F(ContainerTest, MissingType1v2IsExplained) {
  world_.kernel.extensions = {};
  auto c = Container::open(world_.env());
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code(), ENOTSUP);
  EXPECT_TRUE(contains(c.error().message(), "modprobe vfio_iommu_type1")) << c.error().message();
  EXPECT_TRUE(contains(c.error().message(), "intel_iommu=on")) << c.error().message();
}

TEST_F(ContainerTest, SetIommuEpermExplainsInterruptRemapping) {
  world_.kernel.fail_ioctl(VFIO_SET_IOMMU, EPERM);
  auto c = Container::open(world_.env());
  ASSERT_TRUE(c);
  auto group = (*c)->add_group_of(kNic);
  ASSERT_FALSE(group);
  EXPECT_EQ(group.error().code(), EPERM);
  const std::string& m = group.error().message();
  EXPECT_TRUE(contains(m, "interrupt remapping")) << m;
  EXPECT_TRUE(contains(m, "intremap=on")) << m;
  EXPECT_TRUE(contains(m, "allow_unsafe_interrupts=1")) << m;
  EXPECT_TRUE((*c)->groups().empty());
}

TEST_F(ContainerTest, GetInfoGrowsArgszAndParsesCapabilities) {
  world_.kernel.dma_entry_limit = 1234;
  auto c = open_with_group();
  ASSERT_TRUE(c);
  // First call with the bare struct, second with the size the kernel asked for.
  ASSERT_EQ(world_.kernel.iommu_info_argsz.size(), 2u);
  EXPECT_EQ(world_.kernel.iommu_info_argsz[0], sizeof(vfio_iommu_type1_info));
  EXPECT_GT(world_.kernel.iommu_info_argsz[1], sizeof(vfio_iommu_type1_info));
  IommuInfo info = c->info();
  EXPECT_EQ(info.page_sizes, (1ull << 12) | (1ull << 21) | (1ull << 30));
  EXPECT_EQ(info.min_page_size(), 4096u);
  ASSERT_TRUE(info.iova_ranges_reported);
  EXPECT_EQ(info.iova_ranges, (std::vector<IovaRange>{{0, 0xfedfffff}, {0xfef00000, (1ull << 39) - 1}}));
  ASSERT_TRUE(info.dma_mappings_available);  // found after skipping the migration cap
  EXPECT_EQ(*info.dma_mappings_available, 1234u);
  EXPECT_EQ(info.dma_entry_limit, 1234u);
  EXPECT_TRUE(contains(info.dma_entry_limit_source, "DMA_AVAIL"));
}

TEST_F(ContainerTest, WithoutDmaAvailTheLimitComesFromSysfs) {
  world_.kernel.report_dma_avail = false;
  world_.sysfs.set_dma_entry_limit(777);
  auto c = open_with_group();
  ASSERT_TRUE(c);
  EXPECT_FALSE(c->info().dma_mappings_available);
  EXPECT_EQ(c->info().dma_entry_limit, 777u);
  EXPECT_TRUE(contains(c->info().dma_entry_limit_source, "dma_entry_limit"));
}

TEST_F(ContainerTest, WithoutAnyLimitSourceTheDefaultIs65535) {
  world_.kernel.report_dma_avail = false;
  auto c = open_with_group();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->info().dma_entry_limit, 65535u);
}

TEST_F(ContainerTest, WithoutTheIovaCapabilityAConservativeDefaultIsUsed) {
  world_.kernel.report_iova_ranges = false;
  world_.kernel.report_migration_cap = false;
  world_.kernel.report_dma_avail = false;
  auto c = open_with_group();
  ASSERT_TRUE(c);
  // No caps at all: one GET_INFO call suffices.
  EXPECT_EQ(world_.kernel.iommu_info_argsz.size(), 1u);
  IommuInfo info = c->info();
  EXPECT_FALSE(info.iova_ranges_reported);
  for (const auto& r : info.iova_ranges) {
    EXPECT_LT(r.last, 1ull << 39);
    EXPECT_FALSE(r.first <= 0xfeefffff && r.last >= 0xfee00000) << "overlaps the MSI window";
  }
}

TEST_F(ContainerTest, CorruptCapabilityChainIsAnError) {
  world_.kernel.corrupt_iommu_caps = true;
  auto c = Container::open(world_.env());
  ASSERT_TRUE(c);
  auto group = (*c)->add_group_of(kNic);
  ASSERT_FALSE(group);
  EXPECT_EQ(group.error().code(), EPROTO);
  EXPECT_TRUE(contains(group.error().message(), "capability chain is corrupt")) << group.error().message();
}

TEST_F(ContainerTest, MapAndUnmapExactlyWhatWasMapped) {
  auto c = open_with_group();
  ASSERT_TRUE(c);
  Buffer a(64 * KiB), b(2 * MiB);
  {
    auto ma = c->map_dma(a.get(), 64 * KiB, DmaAccess::device_reads_and_writes);
    ASSERT_TRUE(ma) << ma.error().message();
    auto mb = c->map_dma(b.get(), 2 * MiB, DmaAccess::device_writes);
    ASSERT_TRUE(mb) << mb.error().message();
    ASSERT_EQ(world_.kernel.live_dma_maps().size(), 2u);
    const auto& first = world_.kernel.map_calls[0];
    EXPECT_EQ(first.vaddr, reinterpret_cast<uint64_t>(a.get()));
    EXPECT_EQ(first.iova, ma->iova());
    EXPECT_EQ(first.size, 64 * KiB);
    EXPECT_EQ(first.flags, uint32_t{VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE});
    EXPECT_EQ(world_.kernel.map_calls[1].flags, uint32_t{VFIO_DMA_MAP_FLAG_WRITE});
    // IOVAs are not VAs, not 0, inside the 39-bit range, and do not overlap.
    EXPECT_NE(ma->iova(), reinterpret_cast<uint64_t>(a.get()));
    EXPECT_NE(ma->iova(), 0u);
    EXPECT_LT(mb->iova() + mb->size(), 1ull << 39);
    EXPECT_TRUE(ma->iova() + ma->size() <= mb->iova() || mb->iova() + mb->size() <= ma->iova());
    auto inside = ma->iova_of(static_cast<uint8_t*>(a.get()) + 100);
    ASSERT_TRUE(inside);
    EXPECT_EQ(*inside, ma->iova() + 100);
    EXPECT_FALSE(ma->iova_of(b.get()));
    EXPECT_EQ(c->usage().mappings, 2u);
    EXPECT_EQ(c->usage().pinned_bytes, 64 * KiB + 2 * MiB);
    ASSERT_TRUE(ma->unmap());
    EXPECT_FALSE(ma->valid());
    EXPECT_EQ(world_.kernel.live_dma_maps().size(), 1u);
  }  // mb unmapped by its destructor
  EXPECT_TRUE(world_.kernel.live_dma_maps().empty());
  EXPECT_EQ(world_.kernel.unmap_calls.size(), 2u);
  EXPECT_EQ(world_.kernel.unmatched_unmaps, 0);
  EXPECT_EQ(c->usage().mappings, 0u);
  EXPECT_EQ(c->usage().pinned_bytes, 0u);
}

TEST_F(ContainerTest, HugePageSizedBuffersGetAlignedIovas) {
  auto c = open_with_group();
  ASSERT_TRUE(c);
  // 2 MiB-aligned vaddr: carve it out of a larger reservation.
  Buffer big(6 * MiB);
  auto base = (reinterpret_cast<uintptr_t>(big.get()) + 2 * MiB - 1) & ~(2 * MiB - 1);
  auto small = c->map_dma(big.get() == reinterpret_cast<void*>(base) ? static_cast<uint8_t*>(big.get()) + 4 * MiB
                                                                     : big.get(),
                          4 * KiB, DmaAccess::device_reads);
  ASSERT_TRUE(small);
  auto huge = c->map_dma(reinterpret_cast<void*>(base), 2 * MiB, DmaAccess::device_reads);
  ASSERT_TRUE(huge) << huge.error().message();
  EXPECT_EQ(huge->iova() % (2 * MiB), 0u);
}

TEST_F(ContainerTest, MovingAMappingKeepsOneUnmap) {
  auto c = open_with_group();
  ASSERT_TRUE(c);
  Buffer a(4 * KiB);
  DmaMapping kept;
  {
    auto m = c->map_dma(a.get(), 4 * KiB, DmaAccess::device_reads);
    ASSERT_TRUE(m);
    kept = std::move(*m);
  }
  EXPECT_TRUE(kept.valid());
  EXPECT_EQ(world_.kernel.live_dma_maps().size(), 1u);
  kept = DmaMapping();
  EXPECT_TRUE(world_.kernel.live_dma_maps().empty());
  EXPECT_EQ(world_.kernel.unmap_calls.size(), 1u);
  EXPECT_EQ(world_.kernel.unmatched_unmaps, 0);
}

TEST_F(ContainerTest, FreedIovaIsReused) {
  auto c = open_with_group();
  ASSERT_TRUE(c);
  Buffer a(8 * KiB);
  uint64_t first;
  {
    auto m = c->map_dma(a.get(), 8 * KiB, DmaAccess::device_reads);
    ASSERT_TRUE(m);
    first = m->iova();
  }
  auto again = c->map_dma(a.get(), 8 * KiB, DmaAccess::device_reads);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->iova(), first);
}

TEST_F(ContainerTest, MappingOutlivesTheCallersContainerReference) {
  auto c = open_with_group();
  ASSERT_TRUE(c);
  Buffer a(4 * KiB);
  auto m = c->map_dma(a.get(), 4 * KiB, DmaAccess::device_reads);
  ASSERT_TRUE(m);
  std::weak_ptr<Container> weak = c;
  c.reset();
  // The mapping keeps the container (and its fd and groups) alive...
  EXPECT_FALSE(weak.expired());
  EXPECT_EQ(world_.kernel.open_fds(), 2u);
  // ...until it is gone; then everything closes, after an exact unmap.
  *m = DmaMapping();
  EXPECT_TRUE(weak.expired());
  EXPECT_EQ(world_.kernel.unmatched_unmaps, 0);
  EXPECT_EQ(world_.kernel.unmap_calls.size(), 1u);
}

TEST_F(ContainerTest, MapBeforeAnyGroupIsRefused) {
  auto c = Container::open(world_.env());
  ASSERT_TRUE(c);
  Buffer a(4 * KiB);
  auto m = (*c)->map_dma(a.get(), 4 * KiB, DmaAccess::device_reads);
  ASSERT_FALSE(m);
  EXPECT_TRUE(contains(m.error().message(), "no IOMMU group has joined")) << m.error().message();
}

TEST_F(ContainerTest, UnalignedMappingIsRefusedUpFront) {
  auto c = open_with_group();
  ASSERT_TRUE(c);
  Buffer a(16 * KiB);
  auto m = c->map_dma(static_cast<uint8_t*>(a.get()) + 8, 4 * KiB, DmaAccess::device_reads);
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error().code(), EINVAL);
  EXPECT_TRUE(contains(m.error().message(), "IOMMU page size (4 KiB)")) << m.error().message();
  EXPECT_FALSE(c->map_dma(a.get(), 100, DmaAccess::device_reads));
  EXPECT_FALSE(c->map_dma(a.get(), 0, DmaAccess::device_reads));
  EXPECT_TRUE(world_.kernel.map_calls.empty());
}

TEST_F(ContainerTest, EntryLimitIsCheckedUpFrontAndNamesTheFix) {
  world_.kernel.dma_entry_limit = 2;
  auto c = open_with_group();
  ASSERT_TRUE(c);
  Buffer a(12 * KiB);
  auto* p = static_cast<uint8_t*>(a.get());
  auto m1 = c->map_dma(p, 4 * KiB, DmaAccess::device_reads);
  auto m2 = c->map_dma(p + 4 * KiB, 4 * KiB, DmaAccess::device_reads);
  ASSERT_TRUE(m1 && m2);
  auto m3 = c->map_dma(p + 8 * KiB, 4 * KiB, DmaAccess::device_reads);
  ASSERT_FALSE(m3);
  EXPECT_EQ(m3.error().code(), ENOSPC);
  const std::string& m = m3.error().message();
  EXPECT_TRUE(contains(m, "dma_entry_limit (2")) << m;
  EXPECT_TRUE(contains(m, "holds 2 DMA mappings")) << m;
  EXPECT_TRUE(contains(m, "modprobe vfio_iommu_type1 dma_entry_limit=N")) << m;
  EXPECT_EQ(world_.kernel.map_calls.size(), 2u);  // refused before the kernel
}

TEST_F(ContainerTest, KernelEnospcIsExplainedAsTheEntryLimit) {
  auto c = open_with_group();
  ASSERT_TRUE(c);
  world_.kernel.fail_ioctl(VFIO_IOMMU_MAP_DMA, ENOSPC);
  Buffer a(4 * KiB);
  auto m = c->map_dma(a.get(), 4 * KiB, DmaAccess::device_reads);
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error().code(), ENOSPC);
  EXPECT_TRUE(contains(m.error().message(), "VFIO_IOMMU_MAP_DMA of 4 KiB at IOVA 0x")) << m.error().message();
  EXPECT_TRUE(contains(m.error().message(), "dma_entry_limit")) << m.error().message();
  // The IOVA went back: the next mapping gets the same one.
  auto retry = c->map_dma(a.get(), 4 * KiB, DmaAccess::device_reads);
  ASSERT_TRUE(retry);
  EXPECT_EQ(retry->iova(), 0x1000u);
}

TEST_F(ContainerTest, MemlockIsCheckedUpFrontAndNamesTheFix) {
  world_.kernel.memlock = {64 * KiB, 64 * KiB};
  world_.sysfs.set_locked_kib(16);  // something else already locked 16 KiB
  auto c = open_with_group();
  ASSERT_TRUE(c);
  Buffer a(64 * KiB);
  auto m = c->map_dma(a.get(), 64 * KiB, DmaAccess::device_reads);
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error().code(), ENOMEM);
  const std::string& msg = m.error().message();
  EXPECT_TRUE(contains(msg, "RLIMIT_MEMLOCK (64 KiB)")) << msg;
  EXPECT_TRUE(contains(msg, "16 KiB locked")) << msg;
  EXPECT_TRUE(contains(msg, "ulimit -l unlimited")) << msg;
  EXPECT_TRUE(contains(msg, "limits.conf")) << msg;
  EXPECT_TRUE(contains(msg, "CAP_IPC_LOCK")) << msg;
  EXPECT_TRUE(world_.kernel.map_calls.empty());
  // 48 KiB still fits.
  EXPECT_TRUE(c->map_dma(a.get(), 48 * KiB, DmaAccess::device_reads));
}

TEST_F(ContainerTest, CapIpcLockBypassesTheMemlockCheck) {
  world_.kernel.memlock = {64 * KiB, 64 * KiB};
  world_.kernel.cap_ipc_lock = true;
  auto c = open_with_group();
  ASSERT_TRUE(c);
  Buffer a(1 * MiB);
  EXPECT_TRUE(c->map_dma(a.get(), 1 * MiB, DmaAccess::device_reads));
}

TEST_F(ContainerTest, KernelEnomemIsExplainedAsMemlock) {
  world_.kernel.memlock = {1 * MiB, 1 * MiB};
  auto c = open_with_group();
  ASSERT_TRUE(c);
  world_.kernel.fail_ioctl(VFIO_IOMMU_MAP_DMA, ENOMEM);
  Buffer a(4 * KiB);
  auto m = c->map_dma(a.get(), 4 * KiB, DmaAccess::device_reads);
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error().code(), ENOMEM);
  EXPECT_TRUE(contains(m.error().message(), "RLIMIT_MEMLOCK (1 MiB)")) << m.error().message();
  EXPECT_TRUE(contains(m.error().message(), "ulimit -l")) << m.error().message();
}

TEST_F(ContainerTest, KernelEinvalShowsTheRanges) {
  auto c = open_with_group();
  ASSERT_TRUE(c);
  world_.kernel.fail_ioctl(VFIO_IOMMU_MAP_DMA, EINVAL);
  Buffer a(4 * KiB);
  auto m = c->map_dma(a.get(), 4 * KiB, DmaAccess::device_reads);
  ASSERT_FALSE(m);
  EXPECT_TRUE(contains(m.error().message(), "0xfef00000-0x7fffffffff")) << m.error().message();
}

TEST_F(ContainerTest, FailedUnmapKeepsTheIovaReserved) {
  auto c = open_with_group();
  ASSERT_TRUE(c);
  Buffer a(4 * KiB);
  auto m = c->map_dma(a.get(), 4 * KiB, DmaAccess::device_reads);
  ASSERT_TRUE(m);
  uint64_t iova = m->iova();
  world_.kernel.fail_ioctl(VFIO_IOMMU_UNMAP_DMA, EIO);
  auto status = m->unmap();
  ASSERT_FALSE(status);
  EXPECT_TRUE(contains(status.error().message(), "stays reserved")) << status.error().message();
  // Not reused while the kernel may still translate it.
  auto next = c->map_dma(a.get(), 4 * KiB, DmaAccess::device_reads);
  ASSERT_TRUE(next);
  EXPECT_NE(next->iova(), iova);
}

TEST_F(ContainerTest, SeveralGroupsShareOneContainerAndNarrowTheRanges) {
  world_.add_vfio_device("0000:00:04.0", 6);
  world_.kernel.group_reserved[6] = {{0x100000, 0x1fffff}};  // group 6 reserves 1 MiB
  auto c = open_with_group();
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->add_group_of(kSecond));
  EXPECT_EQ(c->groups(), (std::vector<int>{5, 6}));
  EXPECT_EQ(world_.kernel.set_iommu_calls, 1);  // only for the first group
  auto ranges = c->info().iova_ranges;
  ASSERT_EQ(ranges.size(), 3u);
  EXPECT_EQ(ranges[0].last, 0xfffffu);
  EXPECT_EQ(ranges[1].first, 0x200000u);
  // Allocation skips the reserved hole.
  Buffer a(2 * MiB);
  auto m = c->map_dma(a.get(), 1 * MiB, DmaAccess::device_reads);
  ASSERT_TRUE(m);
  EXPECT_FALSE(m->iova() <= 0x1fffff && m->iova() + m->size() - 1 >= 0x100000) << std::hex << m->iova();
}

TEST_F(ContainerTest, NonViableGroupDoesNotJoin) {
  world_.sysfs.add_device("0000:00:03.1", 5, "e1000e");
  world_.kernel.set_group_viable(5, false);
  auto c = Container::open(world_.env());
  ASSERT_TRUE(c);
  auto group = (*c)->add_group_of(kNic);
  ASSERT_FALSE(group);
  EXPECT_TRUE(contains(group.error().message(), "0000:00:03.1 is bound to e1000e")) << group.error().message();
  EXPECT_EQ(world_.kernel.set_iommu_calls, 0);
}

TEST_F(ContainerTest, OpenDeviceAddsTheGroup) {
  auto c = Container::open(world_.env());
  ASSERT_TRUE(c);
  auto fd = (*c)->open_device(kNic);
  ASSERT_TRUE(fd) << fd.error().message();
  EXPECT_TRUE(fd->valid());
  EXPECT_EQ((*c)->groups(), std::vector<int>{5});
}

TEST_F(ContainerTest, MapDmaNeedsSharedOwnership) {
  // A container can only be made through open(), which returns a shared_ptr;
  // check that a mapping keeps its owner through that pointer.
  auto c = open_with_group();
  ASSERT_TRUE(c);
  Buffer a(4 * KiB);
  long before = c.use_count();
  auto m = c->map_dma(a.get(), 4 * KiB, DmaAccess::device_reads);
  ASSERT_TRUE(m);
  EXPECT_EQ(c.use_count(), before + 1);
}

TEST(LockedMemory, ReadsVmLckInBytes) {
  testing::FakeSysfs sysfs;
  sysfs.set_locked_kib(1536);
  Environment env;
  env.proc_root = sysfs.proc();
  EXPECT_EQ(locked_memory_bytes(env), 1536u * 1024);
  env.proc_root = sysfs.root() + "/nonexistent";
  EXPECT_EQ(locked_memory_bytes(env), std::nullopt);
}

}  // namespace
}  // namespace ufab::vfio
