// A fake of the kernel's VFIO interface behind the vfio::Kernel seam: it
// emulates the container, group and device ioctls of Linux 6.1 on fds of its
// own, backs BARs with memfds (so mmap works), keeps config space in a byte
// array, and records what was asked of it so tests can check the calls.
// It is strict where the kernel is lenient in ways ufab must not rely on:
// UNMAP_DMA must name exactly one earlier mapping.
#pragma once

#include <linux/vfio.h>
#include <sys/resource.h>

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "vfio/kernel.h"

namespace ufab::vfio::testing {

class FakeKernel : public Kernel {
 public:
  // `dev_root` is the Environment::dev_root the code under test uses.
  explicit FakeKernel(std::string dev_root);
  ~FakeKernel() override;

  // ---- the emulated machine ----
  struct Region {
    uint32_t flags = 0;
    uint64_t size = 0;
    bool absent = false;  // GET_REGION_INFO answers EINVAL (a missing VGA region)
    std::optional<std::vector<std::pair<uint64_t, uint64_t>>> sparse_areas;  // offset, size
    std::optional<std::pair<uint32_t, uint32_t>> type;                      // type, subtype
    bool msix_mappable = false;
    int memfd = -1;  // backing store, made on first use

    static Region with(uint32_t flags, uint64_t size) {
      Region r;
      r.flags = flags;
      r.size = size;
      return r;
    }
  };
  struct Irq {
    uint32_t flags = 0;
    uint32_t count = 0;
  };
  struct Device {
    std::string name;
    uint32_t flags = VFIO_DEVICE_FLAGS_PCI | VFIO_DEVICE_FLAGS_RESET;
    std::vector<Region> regions;  // index -> region
    std::vector<Irq> irqs;
    std::vector<uint8_t> config;
    bool bus_master_sticks = true;
    int resets = 0;
    // IRQ index -> eventfds currently bound
    std::map<uint32_t, std::vector<int>> enabled;
  };
  // A device in `group` shaped like QEMU's e1000e: BAR0 128 KiB mmap-able,
  // BAR1 I/O (no mmap), config space 256 bytes, no VGA, INTx/MSI 1, MSI-X 5.
  Device& add_device(int group, const std::string& name);
  void add_group(int number, bool viable = true);
  void set_group_viable(int number, bool viable);

  // ---- knobs ----
  int api_version = VFIO_API_VERSION;
  std::set<unsigned long> extensions = {VFIO_TYPE1_IOMMU, VFIO_TYPE1v2_IOMMU};
  uint64_t page_sizes = (1ull << 12) | (1ull << 21) | (1ull << 30);
  std::vector<vfio_iova_range> iova_ranges = {{0, 0xfedfffff}, {0xfef00000, (1ull << 39) - 1}};
  // Reserved ranges a group brings when it joins (intersected out of the
  // container's IOVA ranges), by group number.
  std::map<int, std::vector<vfio_iova_range>> group_reserved;
  bool report_iova_ranges = true;
  bool report_dma_avail = true;
  bool report_migration_cap = true;  // an unrelated cap ufab must skip
  bool corrupt_iommu_caps = false;   // a next pointer that points backwards
  uint32_t dma_entry_limit = 65535;
  rlimit memlock = {RLIM_INFINITY, RLIM_INFINITY};
  bool cap_ipc_lock = false;
  std::map<std::string, int> open_errors;  // path -> errno
  // Makes the next `times` calls of `request` fail with `err`.
  void fail_ioctl(unsigned long request, int err, int times = 1);

  // ---- what happened ----
  struct DmaMap {
    uint64_t vaddr = 0, iova = 0, size = 0;
    uint32_t flags = 0;
  };
  std::vector<DmaMap> map_calls;                           // successful MAP_DMA
  std::vector<std::pair<uint64_t, uint64_t>> unmap_calls;  // every UNMAP_DMA (iova, size)
  int unmatched_unmaps = 0;  // UNMAP_DMA that did not name exactly one mapping
  std::vector<DmaMap> live_dma_maps() const;
  uint64_t pinned_bytes() const;
  std::vector<uint32_t> iommu_info_argsz;  // argsz of each IOMMU_GET_INFO
  std::map<uint32_t, std::vector<uint32_t>> region_info_argsz;  // index -> argsz of each call
  int set_iommu_calls = 0;
  struct IrqSetCall {
    uint32_t index = 0, flags = 0, start = 0, count = 0;
    std::vector<int32_t> fds;
  };
  std::vector<IrqSetCall> irq_set_calls;
  int devices_closed_with_irqs_enabled = 0;
  size_t open_fds() const;      // fds handed out (objects + eventfds) and not closed
  size_t device_mmaps() const;  // live mmaps of device regions
  int foreign_closes = 0;       // close() of an fd this fake never made

  Device& device(const std::string& name);
  // Reads/writes a BAR's backing store directly (what the "hardware" sees).
  uint32_t bar_read32(const std::string& device, uint32_t index, uint64_t offset);
  void bar_write32(const std::string& device, uint32_t index, uint64_t offset, uint32_t value);

  // ---- Kernel ----
  int open(const char* path, int flags) override;
  int close(int fd) override;
  int ioctl(int fd, unsigned long request, void* arg) override;
  int ioctl_value(int fd, unsigned long request, unsigned long value) override;
  void* mmap(void* addr, size_t length, int prot, int flags, int fd, off_t offset) override;
  int munmap(void* addr, size_t length) override;
  ssize_t pread(int fd, void* buf, size_t count, off_t offset) override;
  ssize_t pwrite(int fd, const void* buf, size_t count, off_t offset) override;
  int eventfd(unsigned initial_value, int flags) override;
  int getrlimit(int resource, struct rlimit* limit) override;
  bool has_cap_ipc_lock() override { return cap_ipc_lock; }

 private:
  struct ContainerObj {
    bool iommu_set = false;
    std::set<int> groups;
    std::map<uint64_t, DmaMap> maps;  // by IOVA
  };
  struct GroupObj {
    bool viable = true;
    std::vector<std::string> devices;
    bool open = false;
    int container_fd = -1;
  };

  int new_fd();
  bool injected_failure(unsigned long request);
  int container_ioctl(ContainerObj& c, unsigned long request, void* arg);
  int group_ioctl(int number, unsigned long request, void* arg);
  int device_ioctl(Device& d, unsigned long request, void* arg);
  int iommu_get_info(ContainerObj& c, void* arg);
  int region_info(Device& d, void* arg);
  int set_irqs(Device& d, void* arg);
  std::vector<vfio_iova_range> effective_ranges(const ContainerObj& c) const;
  int backing(Region& r);
  Region* region_at(Device& d, uint64_t offset, uint32_t* index);
  void detach_group(int number);

  std::string dev_root_;
  std::map<int, ContainerObj> containers_;
  std::map<int, GroupObj> groups_;
  std::map<int, int> group_fds_;            // fd -> group number
  std::map<std::string, Device> devices_;   // by name
  std::map<std::string, int> device_group_; // name -> group
  std::map<int, std::string> device_fds_;   // fd -> device name
  std::set<int> eventfds_;
  std::map<uintptr_t, size_t> device_mmaps_;  // address -> length
  std::map<unsigned long, std::pair<int, int>> failures_;  // request -> (errno, times)
};

// A sysfs/dev/proc tree in a temporary directory.
class FakeSysfs {
 public:
  FakeSysfs();
  ~FakeSysfs();
  std::string root() const { return root_; }
  std::string sysfs() const { return root_ + "/sys"; }
  std::string dev() const { return root_ + "/dev"; }
  std::string proc() const { return root_ + "/proc"; }

  // <sys>/bus/pci/devices/<name> with its iommu_group link, listed under
  // <sys>/kernel/iommu_groups/<group>/devices; `driver` empty = unbound.
  void add_device(const std::string& name, int group, const std::string& driver);
  void add_device_without_group(const std::string& name);
  void set_driver(const std::string& name, const std::string& driver);
  void set_dma_entry_limit(uint32_t limit);
  void set_locked_kib(uint64_t kib);  // VmLck in <proc>/self/status
  void create_vfio_node();            // <dev>/vfio/vfio, for "is VFIO loaded" checks

 private:
  std::string root_;
};

}  // namespace ufab::vfio::testing

namespace ufab::vfio::testing {

// A fake sysfs tree plus a fake kernel that agree on the devices.
struct FakeWorld {
  FakeSysfs sysfs;
  FakeKernel kernel{sysfs.dev()};

  Environment env() {
    Environment e;
    e.kernel = &kernel;
    e.sysfs_root = sysfs.sysfs();
    e.dev_root = sysfs.dev();
    e.proc_root = sysfs.proc();
    return e;
  }
  // A device bound to vfio-pci in `group`, known to both.
  FakeKernel::Device& add_vfio_device(const std::string& name, int group) {
    sysfs.add_device(name, group, "vfio-pci");
    return kernel.add_device(group, name);
  }
};

}  // namespace ufab::vfio::testing
