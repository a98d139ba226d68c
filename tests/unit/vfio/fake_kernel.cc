#include "tests/unit/vfio/fake_kernel.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace ufab::vfio::testing {
namespace {

constexpr uint64_t kRegionShift = 40;  // vfio-pci: region offset = index << 40
constexpr uint64_t kPage = 4096;

int set_errno(int err) {
  errno = err;
  return -1;
}

// Inclusive range subtraction.
std::vector<vfio_iova_range> subtract(const std::vector<vfio_iova_range>& ranges, const vfio_iova_range& hole) {
  std::vector<vfio_iova_range> out;
  for (const auto& r : ranges) {
    if (hole.end < r.start || hole.start > r.end) {
      out.push_back(r);
      continue;
    }
    if (hole.start > r.start) out.push_back({r.start, hole.start - 1});
    if (hole.end < r.end) out.push_back({hole.end + 1, r.end});
  }
  return out;
}

}  // namespace

FakeKernel::FakeKernel(std::string dev_root) : dev_root_(std::move(dev_root)) {}

FakeKernel::~FakeKernel() {
  for (auto& [fd, c] : containers_) ::close(fd);
  for (auto& [fd, g] : group_fds_) ::close(fd);
  for (auto& [fd, d] : device_fds_) ::close(fd);
  for (int fd : eventfds_) ::close(fd);
  for (auto& [name, d] : devices_)
    for (auto& r : d.regions)
      if (r.memfd >= 0) ::close(r.memfd);
}

FakeKernel::Device& FakeKernel::add_device(int group, const std::string& name) {
  if (!groups_.count(group)) add_group(group);
  groups_[group].devices.push_back(name);
  device_group_[name] = group;
  Device& d = devices_[name];
  d.name = name;
  d.regions.resize(VFIO_PCI_NUM_REGIONS);
  d.regions[0] = Region::with(
      VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE | VFIO_REGION_INFO_FLAG_MMAP, 128 * 1024);
  d.regions[1] = Region::with(VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE, 32);  // I/O BAR
  d.regions[VFIO_PCI_CONFIG_REGION_INDEX] =
      Region::with(VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE, 256);
  d.regions[VFIO_PCI_VGA_REGION_INDEX].absent = true;
  d.irqs = {{VFIO_IRQ_INFO_EVENTFD | VFIO_IRQ_INFO_MASKABLE | VFIO_IRQ_INFO_AUTOMASKED, 1},
            {VFIO_IRQ_INFO_EVENTFD | VFIO_IRQ_INFO_NORESIZE, 1},
            {VFIO_IRQ_INFO_EVENTFD | VFIO_IRQ_INFO_NORESIZE, 5},
            {VFIO_IRQ_INFO_EVENTFD, 1},
            {VFIO_IRQ_INFO_EVENTFD, 1}};
  d.config.assign(256, 0);
  // 8086:10d3 (82574L), status: capability list, first capability at 0xc8.
  d.config[0] = 0x86, d.config[1] = 0x80, d.config[2] = 0xd3, d.config[3] = 0x10;
  d.config[6] = 0x10;
  d.config[0x34] = 0xc8;
  d.config[0xc8] = 0x01, d.config[0xc9] = 0xd0;  // PM -> MSI
  d.config[0xd0] = 0x05, d.config[0xd1] = 0xe0;  // MSI -> PCIe
  d.config[0xe0] = 0x10, d.config[0xe1] = 0xa0;  // PCIe -> MSI-X
  d.config[0xa0] = 0x11, d.config[0xa1] = 0x00;  // MSI-X, end
  d.config[0xa2] = 0x04, d.config[0xa3] = 0x00;  // 5 vectors
  d.config[0xa4] = 0x03, d.config[0xa5] = 0x00;  // table in BAR 3 at 0
  d.config[0xa8] = 0x03, d.config[0xa9] = 0x20;  // PBA in BAR 3 at 0x2000
  return d;
}

void FakeKernel::add_group(int number, bool viable) {
  groups_[number].viable = viable;
}

void FakeKernel::set_group_viable(int number, bool viable) { groups_[number].viable = viable; }

void FakeKernel::fail_ioctl(unsigned long request, int err, int times) { failures_[request] = {err, times}; }

bool FakeKernel::injected_failure(unsigned long request) {
  auto it = failures_.find(request);
  if (it == failures_.end() || it->second.second <= 0) return false;
  errno = it->second.first;
  if (--it->second.second == 0) failures_.erase(it);
  return true;
}

FakeKernel::Device& FakeKernel::device(const std::string& name) { return devices_.at(name); }

std::vector<FakeKernel::DmaMap> FakeKernel::live_dma_maps() const {
  std::vector<DmaMap> out;
  for (const auto& [fd, c] : containers_)
    for (const auto& [iova, m] : c.maps) out.push_back(m);
  return out;
}

uint64_t FakeKernel::pinned_bytes() const {
  uint64_t total = 0;
  for (const auto& m : live_dma_maps()) total += m.size;
  return total;
}

size_t FakeKernel::open_fds() const {
  return containers_.size() + group_fds_.size() + device_fds_.size() + eventfds_.size();
}

size_t FakeKernel::device_mmaps() const { return device_mmaps_.size(); }

int FakeKernel::new_fd() { return ::open("/dev/null", O_RDONLY | O_CLOEXEC); }

int FakeKernel::open(const char* path_c, int) {
  std::string path = path_c;
  if (auto it = open_errors.find(path); it != open_errors.end()) return set_errno(it->second);
  const std::string vfio = dev_root_ + "/vfio/";
  if (path.rfind(vfio, 0) != 0) return set_errno(ENOENT);
  std::string leaf = path.substr(vfio.size());
  if (leaf == "vfio") {
    int fd = new_fd();
    containers_[fd] = {};
    return fd;
  }
  char* end = nullptr;
  long number = std::strtol(leaf.c_str(), &end, 10);
  if (leaf.empty() || *end != '\0' || !groups_.count(static_cast<int>(number))) return set_errno(ENOENT);
  GroupObj& g = groups_[static_cast<int>(number)];
  if (g.open) return set_errno(EBUSY);  // one user per group
  g.open = true;
  int fd = new_fd();
  group_fds_[fd] = static_cast<int>(number);
  return fd;
}

void FakeKernel::detach_group(int number) {
  GroupObj& g = groups_[number];
  if (g.container_fd < 0) return;
  auto it = containers_.find(g.container_fd);
  if (it != containers_.end()) {
    it->second.groups.erase(number);
    if (it->second.groups.empty()) {
      // As type1 does when its last group leaves: everything is unmapped.
      it->second.maps.clear();
      it->second.iommu_set = false;
    }
  }
  g.container_fd = -1;
}

int FakeKernel::close(int fd) {
  if (auto it = containers_.find(fd); it != containers_.end()) {
    for (auto& [number, g] : groups_)
      if (g.container_fd == fd) g.container_fd = -1;
    containers_.erase(it);
  } else if (auto git = group_fds_.find(fd); git != group_fds_.end()) {
    detach_group(git->second);
    groups_[git->second].open = false;
    group_fds_.erase(git);
  } else if (auto dit = device_fds_.find(fd); dit != device_fds_.end()) {
    Device& d = devices_.at(dit->second);
    if (!d.enabled.empty()) ++devices_closed_with_irqs_enabled;
    d.enabled.clear();
    device_fds_.erase(dit);
  } else if (eventfds_.erase(fd) == 0) {
    ++foreign_closes;
    return set_errno(EBADF);
  }
  return ::close(fd);
}

int FakeKernel::ioctl_value(int fd, unsigned long request, unsigned long value) {
  if (injected_failure(request)) return -1;
  if (auto it = containers_.find(fd); it != containers_.end()) {
    ContainerObj& c = it->second;
    switch (request) {
      case VFIO_GET_API_VERSION:
        return api_version;
      case VFIO_CHECK_EXTENSION:
        return extensions.count(value) ? 1 : 0;
      case VFIO_SET_IOMMU:
        ++set_iommu_calls;
        if (c.iommu_set) return set_errno(EBUSY);
        if (c.groups.empty() || !extensions.count(value)) return set_errno(EINVAL);
        c.iommu_set = true;
        return 0;
      default:
        return set_errno(ENOTTY);
    }
  }
  if (auto it = device_fds_.find(fd); it != device_fds_.end()) {
    Device& d = devices_.at(it->second);
    if (request != VFIO_DEVICE_RESET) return set_errno(ENOTTY);
    if (!(d.flags & VFIO_DEVICE_FLAGS_RESET)) return set_errno(EINVAL);
    ++d.resets;
    return 0;
  }
  return set_errno(EBADF);
}

int FakeKernel::ioctl(int fd, unsigned long request, void* arg) {
  if (injected_failure(request)) return -1;
  if (auto it = containers_.find(fd); it != containers_.end()) return container_ioctl(it->second, request, arg);
  if (auto it = group_fds_.find(fd); it != group_fds_.end()) return group_ioctl(it->second, request, arg);
  if (auto it = device_fds_.find(fd); it != device_fds_.end())
    return device_ioctl(devices_.at(it->second), request, arg);
  return set_errno(EBADF);
}

std::vector<vfio_iova_range> FakeKernel::effective_ranges(const ContainerObj& c) const {
  auto ranges = iova_ranges;
  for (int g : c.groups)
    if (auto it = group_reserved.find(g); it != group_reserved.end())
      for (const auto& hole : it->second) ranges = subtract(ranges, hole);
  return ranges;
}

int FakeKernel::container_ioctl(ContainerObj& c, unsigned long request, void* arg) {
  switch (request) {
    case VFIO_IOMMU_GET_INFO:
      return iommu_get_info(c, arg);
    case VFIO_IOMMU_MAP_DMA: {
      if (!c.iommu_set) return set_errno(EINVAL);
      vfio_iommu_type1_dma_map map;
      std::memcpy(&map, arg, sizeof map);
      if (map.argsz < sizeof map) return set_errno(EINVAL);
      uint32_t prot = map.flags & (VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE);
      if (map.flags & ~uint32_t{VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE}) return set_errno(EINVAL);
      if (!prot || !map.size || ((map.size | map.iova | map.vaddr) & (kPage - 1))) return set_errno(EINVAL);
      uint64_t last = map.iova + map.size - 1;
      if (last < map.iova) return set_errno(EINVAL);
      bool inside = false;
      for (const auto& r : effective_ranges(c)) inside |= map.iova >= r.start && last <= r.end;
      if (!inside) return set_errno(EINVAL);
      for (const auto& [iova, m] : c.maps)
        if (map.iova <= m.iova + m.size - 1 && m.iova <= last) return set_errno(EEXIST);
      if (c.maps.size() >= dma_entry_limit) return set_errno(ENOSPC);
      if (!cap_ipc_lock && memlock.rlim_cur != RLIM_INFINITY && pinned_bytes() + map.size > memlock.rlim_cur)
        return set_errno(ENOMEM);
      DmaMap m{map.vaddr, map.iova, map.size, map.flags};
      c.maps[map.iova] = m;
      map_calls.push_back(m);
      return 0;
    }
    case VFIO_IOMMU_UNMAP_DMA: {
      vfio_iommu_type1_dma_unmap unmap;
      std::memcpy(&unmap, arg, sizeof unmap);
      unmap_calls.push_back({unmap.iova, unmap.size});
      if (unmap.argsz < sizeof unmap || unmap.flags != 0) return set_errno(EINVAL);
      auto it = c.maps.find(unmap.iova);
      if (it == c.maps.end() || it->second.size != unmap.size) {
        ++unmatched_unmaps;
        return set_errno(EINVAL);
      }
      c.maps.erase(it);
      static_cast<vfio_iommu_type1_dma_unmap*>(arg)->size = unmap.size;
      return 0;
    }
    default:
      return set_errno(ENOTTY);
  }
}

int FakeKernel::iommu_get_info(ContainerObj& c, void* arg) {
  if (!c.iommu_set) return set_errno(EINVAL);
  auto* user = static_cast<uint8_t*>(arg);
  vfio_iommu_type1_info info{};
  std::memcpy(&info, user, offsetof(vfio_iommu_type1_info, cap_offset));
  iommu_info_argsz.push_back(info.argsz);
  if (info.argsz < offsetof(vfio_iommu_type1_info, cap_offset)) return set_errno(EINVAL);
  size_t copy_back = offsetof(vfio_iommu_type1_info, iova_pgsizes) + sizeof(uint64_t);
  if (info.argsz >= offsetof(vfio_iommu_type1_info, cap_offset) + sizeof(uint32_t)) {
    copy_back = offsetof(vfio_iommu_type1_info, cap_offset) + sizeof(uint32_t);
    info.cap_offset = 0;
  }
  info.flags = VFIO_IOMMU_INFO_PGSIZES;
  info.iova_pgsizes = page_sizes;

  // Build the chain as type1 does: migration, DMA available, IOVA ranges;
  // each capability 8-byte aligned, offsets relative to the start of info.
  std::vector<uint8_t> caps;
  std::vector<size_t> headers;
  auto add = [&](const void* cap, size_t size) {
    size_t at = (caps.size() + 7) & ~size_t{7};
    caps.resize(at + ((size + 7) & ~size_t{7}), 0);
    std::memcpy(caps.data() + at, cap, size);
    headers.push_back(at);
  };
  if (report_migration_cap) {
    vfio_iommu_type1_info_cap_migration mig{};
    mig.header = {VFIO_IOMMU_TYPE1_INFO_CAP_MIGRATION, 1, 0};
    mig.pgsize_bitmap = page_sizes;
    mig.max_dirty_bitmap_size = 1ull << 28;
    add(&mig, sizeof mig);
  }
  if (report_dma_avail) {
    vfio_iommu_type1_info_dma_avail avail{};
    avail.header = {VFIO_IOMMU_TYPE1_INFO_DMA_AVAIL, 1, 0};
    avail.avail = dma_entry_limit - static_cast<uint32_t>(c.maps.size());
    add(&avail, sizeof avail);
  }
  if (report_iova_ranges) {
    auto ranges = effective_ranges(c);
    std::vector<uint8_t> cap(sizeof(vfio_iommu_type1_info_cap_iova_range) + ranges.size() * sizeof(vfio_iova_range));
    vfio_iommu_type1_info_cap_iova_range head{};
    head.header = {VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE, 1, 0};
    head.nr_iovas = static_cast<uint32_t>(ranges.size());
    std::memcpy(cap.data(), &head, sizeof head);
    std::memcpy(cap.data() + sizeof head, ranges.data(), ranges.size() * sizeof(vfio_iova_range));
    add(cap.data(), cap.size());
  }
  const size_t base = sizeof(vfio_iommu_type1_info);
  for (size_t i = 0; i + 1 < headers.size(); ++i) {
    uint32_t next = static_cast<uint32_t>(base + headers[i + 1]);
    if (corrupt_iommu_caps) next = static_cast<uint32_t>(base + headers[i]);  // points at itself
    std::memcpy(caps.data() + headers[i] + offsetof(vfio_info_cap_header, next), &next, sizeof next);
  }
  if (!caps.empty()) {
    info.flags |= VFIO_IOMMU_INFO_CAPS;
    if (info.argsz < base + caps.size()) {
      info.argsz = static_cast<uint32_t>(base + caps.size());
    } else {
      std::memcpy(user + base, caps.data(), caps.size());
      info.cap_offset = static_cast<uint32_t>(base + headers.front());
    }
  }
  std::memcpy(user, &info, copy_back);
  return 0;
}

int FakeKernel::group_ioctl(int number, unsigned long request, void* arg) {
  GroupObj& g = groups_[number];
  switch (request) {
    case VFIO_GROUP_GET_STATUS: {
      auto* status = static_cast<vfio_group_status*>(arg);
      if (status->argsz < sizeof *status) return set_errno(EINVAL);
      status->flags = (g.viable ? VFIO_GROUP_FLAGS_VIABLE : 0) |
                      (g.container_fd >= 0 ? VFIO_GROUP_FLAGS_CONTAINER_SET : 0);
      return 0;
    }
    case VFIO_GROUP_SET_CONTAINER: {
      int container_fd = *static_cast<int*>(arg);
      if (g.container_fd >= 0) return set_errno(EINVAL);
      auto it = containers_.find(container_fd);
      if (it == containers_.end()) return set_errno(EBADF);
      if (!g.viable) return set_errno(EPERM);  // DMA ownership claim fails
      g.container_fd = container_fd;
      it->second.groups.insert(number);
      return 0;
    }
    case VFIO_GROUP_GET_DEVICE_FD: {
      std::string name = static_cast<const char*>(arg);
      if (g.container_fd < 0 || !containers_.at(g.container_fd).iommu_set) return set_errno(EINVAL);
      if (std::find(g.devices.begin(), g.devices.end(), name) == g.devices.end()) return set_errno(ENODEV);
      int fd = new_fd();
      device_fds_[fd] = name;
      return fd;
    }
    default:
      return set_errno(ENOTTY);
  }
}

int FakeKernel::device_ioctl(Device& d, unsigned long request, void* arg) {
  switch (request) {
    case VFIO_DEVICE_GET_INFO: {
      auto* info = static_cast<vfio_device_info*>(arg);
      if (info->argsz < offsetof(vfio_device_info, num_irqs) + 4) return set_errno(EINVAL);
      info->flags = d.flags;
      info->num_regions = static_cast<uint32_t>(d.regions.size());
      info->num_irqs = static_cast<uint32_t>(d.irqs.size());
      if (info->argsz >= offsetof(vfio_device_info, cap_offset) + 4) info->cap_offset = 0;
      return 0;
    }
    case VFIO_DEVICE_GET_REGION_INFO:
      return region_info(d, arg);
    case VFIO_DEVICE_GET_IRQ_INFO: {
      auto* irq = static_cast<vfio_irq_info*>(arg);
      if (irq->argsz < sizeof *irq || irq->index >= d.irqs.size()) return set_errno(EINVAL);
      irq->flags = d.irqs[irq->index].flags;
      irq->count = d.irqs[irq->index].count;
      return 0;
    }
    case VFIO_DEVICE_SET_IRQS:
      return set_irqs(d, arg);
    default:
      return set_errno(ENOTTY);
  }
}

int FakeKernel::region_info(Device& d, void* arg) {
  auto* user = static_cast<uint8_t*>(arg);
  vfio_region_info info;
  std::memcpy(&info, user, sizeof info);
  region_info_argsz[info.index].push_back(info.argsz);
  if (info.argsz < sizeof info || info.index >= d.regions.size()) return set_errno(EINVAL);
  const Region& r = d.regions[info.index];
  if (r.absent) return set_errno(EINVAL);
  info.flags = r.flags;
  info.size = r.size;
  info.offset = uint64_t{info.index} << kRegionShift;
  info.cap_offset = 0;

  std::vector<uint8_t> caps;
  std::vector<size_t> headers;
  auto add = [&](const void* cap, size_t size) {
    size_t at = (caps.size() + 7) & ~size_t{7};
    caps.resize(at + ((size + 7) & ~size_t{7}), 0);
    std::memcpy(caps.data() + at, cap, size);
    headers.push_back(at);
  };
  if (r.sparse_areas) {
    std::vector<uint8_t> cap(sizeof(vfio_region_info_cap_sparse_mmap) +
                             r.sparse_areas->size() * sizeof(vfio_region_sparse_mmap_area));
    vfio_region_info_cap_sparse_mmap head{};
    head.header = {VFIO_REGION_INFO_CAP_SPARSE_MMAP, 1, 0};
    head.nr_areas = static_cast<uint32_t>(r.sparse_areas->size());
    std::memcpy(cap.data(), &head, sizeof head);
    for (size_t i = 0; i < r.sparse_areas->size(); ++i) {
      vfio_region_sparse_mmap_area a{(*r.sparse_areas)[i].first, (*r.sparse_areas)[i].second};
      std::memcpy(cap.data() + sizeof head + i * sizeof a, &a, sizeof a);
    }
    add(cap.data(), cap.size());
  }
  if (r.type) {
    vfio_region_info_cap_type t{};
    t.header = {VFIO_REGION_INFO_CAP_TYPE, 1, 0};
    t.type = r.type->first;
    t.subtype = r.type->second;
    add(&t, sizeof t);
  }
  if (r.msix_mappable) {
    vfio_info_cap_header h{VFIO_REGION_INFO_CAP_MSIX_MAPPABLE, 1, 0};
    add(&h, sizeof h);
  }
  const size_t base = sizeof(vfio_region_info);
  for (size_t i = 0; i + 1 < headers.size(); ++i) {
    uint32_t next = static_cast<uint32_t>(base + headers[i + 1]);
    std::memcpy(caps.data() + headers[i] + offsetof(vfio_info_cap_header, next), &next, sizeof next);
  }
  if (!caps.empty()) {
    info.flags |= VFIO_REGION_INFO_FLAG_CAPS;
    if (info.argsz < base + caps.size()) {
      info.argsz = static_cast<uint32_t>(base + caps.size());
    } else {
      std::memcpy(user + base, caps.data(), caps.size());
      info.cap_offset = static_cast<uint32_t>(base + headers.front());
    }
  }
  std::memcpy(user, &info, sizeof info);
  return 0;
}

int FakeKernel::set_irqs(Device& d, void* arg) {
  vfio_irq_set set;
  std::memcpy(&set, arg, sizeof set);
  IrqSetCall call{set.index, set.flags, set.start, set.count, {}};
  if (set.argsz < sizeof set || set.index >= d.irqs.size()) return set_errno(EINVAL);
  uint32_t data_type = set.flags & VFIO_IRQ_SET_DATA_TYPE_MASK;
  uint32_t action = set.flags & VFIO_IRQ_SET_ACTION_TYPE_MASK;
  if (__builtin_popcount(data_type) != 1 || __builtin_popcount(action) != 1) return set_errno(EINVAL);
  const Irq& irq = d.irqs[set.index];
  if (set.count == 0 && !(data_type == VFIO_IRQ_SET_DATA_NONE && action == VFIO_IRQ_SET_ACTION_TRIGGER))
    return set_errno(EINVAL);
  if (set.count != 0 && (set.start >= irq.count || set.count > irq.count - set.start)) return set_errno(EINVAL);
  size_t data_size = data_type == VFIO_IRQ_SET_DATA_EVENTFD ? 4u * set.count
                     : data_type == VFIO_IRQ_SET_DATA_BOOL  ? set.count
                                                             : 0;
  if (set.argsz < sizeof set + data_size) return set_errno(EINVAL);
  if (data_type == VFIO_IRQ_SET_DATA_EVENTFD) {
    call.fds.resize(set.count);
    std::memcpy(call.fds.data(), static_cast<uint8_t*>(arg) + sizeof set, data_size);
  }
  irq_set_calls.push_back(call);

  if (action == VFIO_IRQ_SET_ACTION_TRIGGER) {
    if (data_type == VFIO_IRQ_SET_DATA_NONE && set.count == 0) {
      // vfio-pci disables only an enabled index; otherwise EINVAL.
      if (d.enabled.erase(set.index) == 0) return set_errno(EINVAL);
      return 0;
    }
    if (data_type == VFIO_IRQ_SET_DATA_EVENTFD) {
      // One of INTx/MSI/MSI-X at a time.
      for (const auto& [index, fds] : d.enabled)
        if (index != set.index && index <= VFIO_PCI_MSIX_IRQ_INDEX && set.index <= VFIO_PCI_MSIX_IRQ_INDEX)
          return set_errno(EINVAL);
      for (int32_t fd : call.fds)
        if (fd != -1 && !eventfds_.count(fd)) return set_errno(EBADF);
      auto it = d.enabled.find(set.index);
      if (it != d.enabled.end()) {
        // Linux 6.1: an enabled MSI/MSI-X block cannot grow.
        if (set.start + set.count > it->second.size()) return set_errno(EINVAL);
        for (uint32_t i = 0; i < set.count; ++i) it->second[set.start + i] = call.fds[i];
      } else {
        if (set.start != 0) return set_errno(EINVAL);
        d.enabled[set.index] = std::vector<int>(call.fds.begin(), call.fds.end());
      }
      return 0;
    }
    if (data_type == VFIO_IRQ_SET_DATA_NONE) {  // loopback: signal the eventfds
      auto it = d.enabled.find(set.index);
      if (it == d.enabled.end() || set.start + set.count > it->second.size()) return set_errno(EINVAL);
      for (uint32_t i = 0; i < set.count; ++i) {
        uint64_t one = 1;
        if (::write(it->second[set.start + i], &one, sizeof one) != sizeof one) return -1;
      }
      return 0;
    }
    return 0;
  }
  if (action == VFIO_IRQ_SET_ACTION_UNMASK || action == VFIO_IRQ_SET_ACTION_MASK) {
    if (!(irq.flags & VFIO_IRQ_INFO_MASKABLE)) return set_errno(EINVAL);
    return 0;
  }
  return set_errno(EINVAL);
}

int FakeKernel::backing(Region& r) {
  if (r.memfd < 0) {
    r.memfd = ::memfd_create("fake-vfio-region", MFD_CLOEXEC);
    if (r.memfd >= 0 && ::ftruncate(r.memfd, static_cast<off_t>((r.size + kPage - 1) & ~(kPage - 1))) != 0) {
      ::close(r.memfd);
      r.memfd = -1;
    }
  }
  return r.memfd;
}

FakeKernel::Region* FakeKernel::region_at(Device& d, uint64_t offset, uint32_t* index) {
  uint64_t i = offset >> kRegionShift;
  if (i >= d.regions.size() || d.regions[i].absent) return nullptr;
  *index = static_cast<uint32_t>(i);
  return &d.regions[i];
}

void* FakeKernel::mmap(void* addr, size_t length, int prot, int flags, int fd, off_t offset) {
  if (fd < 0) return ::mmap(addr, length, prot, flags, fd, offset);
  auto it = device_fds_.find(fd);
  if (it == device_fds_.end()) {
    errno = EBADF;
    return MAP_FAILED;
  }
  Device& d = devices_.at(it->second);
  uint32_t index = 0;
  Region* r = region_at(d, static_cast<uint64_t>(offset), &index);
  uint64_t rel = static_cast<uint64_t>(offset) & ((1ull << kRegionShift) - 1);
  // vfio-pci: only MMAP regions, MAP_SHARED, inside the region.
  if (!r || !(r->flags & VFIO_REGION_INFO_FLAG_MMAP) || !(flags & MAP_SHARED) || rel % kPage != 0 ||
      rel + length > ((r->size + kPage - 1) & ~(kPage - 1))) {
    errno = EINVAL;
    return MAP_FAILED;
  }
  if (r->sparse_areas) {  // refuse anything not inside one listed area
    bool inside = false;
    for (const auto& [area_offset, area_size] : *r->sparse_areas)
      inside |= rel >= area_offset && rel + length <= ((area_offset + area_size + kPage - 1) & ~(kPage - 1));
    if (!inside) {
      errno = EINVAL;
      return MAP_FAILED;
    }
  }
  int memfd = backing(*r);
  if (memfd < 0) return MAP_FAILED;
  void* at = ::mmap(addr, length, prot, flags, memfd, static_cast<off_t>(rel));
  if (at != MAP_FAILED) device_mmaps_[reinterpret_cast<uintptr_t>(at)] = length;
  return at;
}

int FakeKernel::munmap(void* addr, size_t length) {
  auto begin = reinterpret_cast<uintptr_t>(addr);
  for (auto it = device_mmaps_.lower_bound(begin); it != device_mmaps_.end() && it->first < begin + length;)
    it = device_mmaps_.erase(it);
  return ::munmap(addr, length);
}

ssize_t FakeKernel::pread(int fd, void* buf, size_t count, off_t offset) {
  auto it = device_fds_.find(fd);
  if (it == device_fds_.end()) return set_errno(EBADF);
  Device& d = devices_.at(it->second);
  uint32_t index = 0;
  Region* r = region_at(d, static_cast<uint64_t>(offset), &index);
  uint64_t rel = static_cast<uint64_t>(offset) & ((1ull << kRegionShift) - 1);
  if (!r || !(r->flags & VFIO_REGION_INFO_FLAG_READ) || rel >= r->size) return set_errno(EINVAL);
  count = std::min<uint64_t>(count, r->size - rel);
  if (index == VFIO_PCI_CONFIG_REGION_INDEX) {
    std::vector<uint8_t> padded = d.config;
    padded.resize(r->size, 0);
    std::memcpy(buf, padded.data() + rel, count);
    return static_cast<ssize_t>(count);
  }
  int memfd = backing(*r);
  return ::pread(memfd, buf, count, static_cast<off_t>(rel));
}

ssize_t FakeKernel::pwrite(int fd, const void* buf, size_t count, off_t offset) {
  auto it = device_fds_.find(fd);
  if (it == device_fds_.end()) return set_errno(EBADF);
  Device& d = devices_.at(it->second);
  uint32_t index = 0;
  Region* r = region_at(d, static_cast<uint64_t>(offset), &index);
  uint64_t rel = static_cast<uint64_t>(offset) & ((1ull << kRegionShift) - 1);
  if (!r || !(r->flags & VFIO_REGION_INFO_FLAG_WRITE) || rel >= r->size) return set_errno(EINVAL);
  count = std::min<uint64_t>(count, r->size - rel);
  if (index == VFIO_PCI_CONFIG_REGION_INDEX) {
    if (d.config.size() < r->size) d.config.resize(r->size, 0);
    std::memcpy(d.config.data() + rel, buf, count);
    if (!d.bus_master_sticks) d.config[4] &= static_cast<uint8_t>(~0x04);
    return static_cast<ssize_t>(count);
  }
  int memfd = backing(*r);
  return ::pwrite(memfd, buf, count, static_cast<off_t>(rel));
}

int FakeKernel::eventfd(unsigned initial_value, int flags) {
  int fd = ::eventfd(initial_value, flags);
  if (fd >= 0) eventfds_.insert(fd);
  return fd;
}

int FakeKernel::getrlimit(int resource, struct rlimit* limit) {
  if (resource != RLIMIT_MEMLOCK) return ::getrlimit(static_cast<__rlimit_resource>(resource), limit);
  *limit = memlock;
  return 0;
}

uint32_t FakeKernel::bar_read32(const std::string& name, uint32_t index, uint64_t offset) {
  uint32_t v = 0;
  Region& r = devices_.at(name).regions.at(index);
  if (::pread(backing(r), &v, sizeof v, static_cast<off_t>(offset)) != sizeof v) return 0xdeadbeef;
  return v;
}

void FakeKernel::bar_write32(const std::string& name, uint32_t index, uint64_t offset, uint32_t value) {
  Region& r = devices_.at(name).regions.at(index);
  if (::pwrite(backing(r), &value, sizeof value, static_cast<off_t>(offset)) != sizeof value) std::abort();
}

// ---- FakeSysfs ----

namespace {
void make_dirs(const std::string& path) {
  std::string partial;
  size_t pos = 0;
  while ((pos = path.find('/', pos + 1)) != std::string::npos) {
    partial = path.substr(0, pos);
    ::mkdir(partial.c_str(), 0755);
  }
  ::mkdir(path.c_str(), 0755);
}
void write_text(const std::string& path, const std::string& text) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) std::abort();
  std::fputs(text.c_str(), f);
  std::fclose(f);
}
}  // namespace

FakeSysfs::FakeSysfs() {
  char tmpl[] = "/tmp/ufab_vfio_XXXXXX";
  if (!::mkdtemp(tmpl)) std::abort();
  root_ = tmpl;
  make_dirs(sysfs() + "/bus/pci/devices");
  make_dirs(sysfs() + "/bus/pci/drivers");
  make_dirs(sysfs() + "/kernel/iommu_groups");
  make_dirs(dev() + "/vfio");
  make_dirs(proc() + "/self");
  set_locked_kib(0);
}

FakeSysfs::~FakeSysfs() {
  std::string cmd = "rm -rf '" + root_ + "'";
  if (std::system(cmd.c_str()) != 0) {
  }
}

void FakeSysfs::add_device_without_group(const std::string& name) {
  make_dirs(sysfs() + "/bus/pci/devices/" + name);
}

void FakeSysfs::add_device(const std::string& name, int group, const std::string& driver) {
  const std::string dir = sysfs() + "/bus/pci/devices/" + name;
  make_dirs(dir);
  const std::string group_dir = sysfs() + "/kernel/iommu_groups/" + std::to_string(group);
  make_dirs(group_dir + "/devices");
  ::symlink(("../../../../kernel/iommu_groups/" + std::to_string(group)).c_str(), (dir + "/iommu_group").c_str());
  ::symlink(("../../../../bus/pci/devices/" + name).c_str(), (group_dir + "/devices/" + name).c_str());
  set_driver(name, driver);
}

void FakeSysfs::set_driver(const std::string& name, const std::string& driver) {
  const std::string link = sysfs() + "/bus/pci/devices/" + name + "/driver";
  ::unlink(link.c_str());
  if (driver.empty()) return;
  make_dirs(sysfs() + "/bus/pci/drivers/" + driver);
  ::symlink(("../../../../bus/pci/drivers/" + driver).c_str(), link.c_str());
}

void FakeSysfs::set_dma_entry_limit(uint32_t limit) {
  make_dirs(sysfs() + "/module/vfio_iommu_type1/parameters");
  write_text(sysfs() + "/module/vfio_iommu_type1/parameters/dma_entry_limit", std::to_string(limit) + "\n");
}

void FakeSysfs::set_locked_kib(uint64_t kib) {
  write_text(proc() + "/self/status", "Name:\tfake\nVmPeak:\t  1000 kB\nVmLck:\t" + std::to_string(kib) +
                                          " kB\nVmPin:\t       0 kB\n");
}

void FakeSysfs::create_vfio_node() { write_text(dev() + "/vfio/vfio", ""); }

}  // namespace ufab::vfio::testing
