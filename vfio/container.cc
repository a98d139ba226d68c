#include "vfio/container.h"

#include <fcntl.h>
#include <linux/vfio.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/files.h"
#include "vfio/info_caps.h"
#include "vfio/text.h"

namespace ufab::vfio {
namespace {

// argsz values ufab sends; fixed by the uAPI since these ioctls appeared.
static_assert(sizeof(vfio_iommu_type1_dma_map) == 32);
static_assert(sizeof(vfio_iommu_type1_dma_unmap) == 24);
static_assert(sizeof(vfio_iommu_type1_info) == 24);  // caps start here
static_assert(sizeof(vfio_group_status) == 8);

constexpr uint32_t kDefaultDmaEntryLimit = 65535;  // vfio_iommu_type1's default
constexpr uint64_t kLargestMappingAlignment = 1ull << 30;

// Used only when the kernel predates VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE
// (Linux < 5.4): below 2^39 (the smallest common width: client VT-d, QEMU
// 7.2's intel-iommu) and around the x86 MSI window.
std::vector<IovaRange> fallback_iova_ranges() {
  return {{0x1000, 0xfedfffff}, {0xfef00000, (1ull << 39) - 1}};
}

std::string dma_entry_limit_param(const Environment& env) {
  return env.sysfs_root + "/module/vfio_iommu_type1/parameters/dma_entry_limit";
}

}  // namespace

std::optional<uint64_t> locked_memory_bytes(const Environment& env) {
  auto status = read_file(env.proc_root + "/self/status");
  if (!status) return std::nullopt;
  auto pos = status->find("\nVmLck:");
  if (pos == std::string::npos) return std::nullopt;
  auto end = status->find('\n', pos + 1);
  std::string field = status->substr(pos + 7, end == std::string::npos ? std::string::npos : end - pos - 7);
  field = trim(field);
  if (field.size() < 3 || field.compare(field.size() - 2, 2, "kB") != 0) return std::nullopt;
  auto kib = parse_uint(field.substr(0, field.size() - 2), 10);
  if (!kib) return std::nullopt;
  return *kib * 1024;
}

Result<std::shared_ptr<Container>> Container::open(Environment env) {
  Kernel& kernel = *env.kernel;
  const std::string path = env.dev_root + "/vfio/vfio";
  int fd = kernel.open(path.c_str(), O_RDWR);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT)
      return fail_errno(err, "cannot open " + path + ": VFIO is not loaded; run `modprobe vfio-pci` "
                             "(it loads vfio and vfio_iommu_type1)");
    if (err == EACCES || err == EPERM)
      return fail_errno(err, "cannot open " + path + ": run as root or make it accessible (mode 0666 is "
                             "the usual default)");
    return fail_errno(err, "cannot open " + path);
  }
  KernelFd owned(kernel, fd);

  int version = kernel.ioctl_value(fd, VFIO_GET_API_VERSION, 0);
  if (version < 0) return fail_errno("VFIO_GET_API_VERSION on " + path);
  if (version != VFIO_API_VERSION)
    return fail(EPROTO, "VFIO API version " + std::to_string(version) + " reported by " + path +
                            "; ufab speaks version " + std::to_string(VFIO_API_VERSION));
  int type1v2 = kernel.ioctl_value(fd, VFIO_CHECK_EXTENSION, VFIO_TYPE1v2_IOMMU);
  if (type1v2 < 0) return fail_errno("VFIO_CHECK_EXTENSION(VFIO_TYPE1v2_IOMMU)");
  if (type1v2 == 0)
    return fail(ENOTSUP, "the kernel offers no VFIO type1v2 IOMMU: run `modprobe vfio_iommu_type1`; "
                         "if it is loaded, the machine has no usable IOMMU (enable VT-d/AMD-Vi in "
                         "firmware and boot with `intel_iommu=on` or `amd_iommu=on`)");
  return std::shared_ptr<Container>(new Container(std::move(env), std::move(owned)));
}

Container::~Container() {
  // Nothing can still be mapped (see the header). Should a failed unmap have
  // left an entry behind, closing the fd makes the kernel release it.
}

std::vector<int> Container::groups() const {
  std::lock_guard lock(mutex_);
  std::vector<int> out;
  for (const auto& [number, group] : groups_) out.push_back(number);
  return out;
}

Result<int> Container::add_group_of(const PciAddress& device) {
  auto number = iommu_group_of(env_, device);
  if (!number) return std::unexpected(number.error());
  std::lock_guard lock(mutex_);
  if (auto ok = add_group_locked(*number); !ok) return std::unexpected(ok.error());
  return *number;
}

Status Container::add_group(int number) {
  std::lock_guard lock(mutex_);
  return add_group_locked(number);
}

Status Container::add_group_locked(int number) {
  if (groups_.count(number)) return {};
  auto group = Group::open(env_, number);
  if (!group) return std::unexpected(group.error());
  if (auto ok = group->require_viable(); !ok) return ok;
  if (auto ok = group->set_container(fd_.get()); !ok) return ok;
  if (!iommu_set_) {
    if (env_.kernel->ioctl_value(fd_.get(), VFIO_SET_IOMMU, VFIO_TYPE1v2_IOMMU) != 0) {
      int err = errno;
      if (err == EPERM)
        return fail_errno(err,
                          "VFIO_SET_IOMMU(VFIO_TYPE1v2_IOMMU) after adding IOMMU group " + std::to_string(number) +
                              ": the platform has no interrupt remapping, which vfio_iommu_type1 requires "
                              "so a device cannot forge MSIs. Enable it (Intel VT-d with IR and "
                              "`intel_iommu=on`; in QEMU `-device intel-iommu,intremap=on` with "
                              "`-machine kernel-irqchip=split`) or, accepting the risk, `modprobe "
                              "vfio_iommu_type1 allow_unsafe_interrupts=1`");
      return fail_errno(err, "VFIO_SET_IOMMU(VFIO_TYPE1v2_IOMMU) after adding IOMMU group " +
                                 std::to_string(number));
    }
    iommu_set_ = true;
  }
  // Joining may narrow the IOVA ranges (the new group's reserved regions).
  groups_.emplace(number, std::move(*group));
  if (auto ok = refresh_info_locked(); !ok) {
    groups_.erase(number);
    if (groups_.empty()) iommu_set_ = false;
    return ok;
  }
  return {};
}

Status Container::refresh_info_locked() {
  const std::string what = "VFIO_IOMMU_GET_INFO";
  auto buffer = detail::query_info(*env_.kernel, fd_.get(), VFIO_IOMMU_GET_INFO,
                                   sizeof(vfio_iommu_type1_info), what, [](detail::InfoBuffer&) {});
  if (!buffer) return std::unexpected(buffer.error());
  const auto* fixed = buffer->as<vfio_iommu_type1_info>();

  IommuInfo info;
  info.page_sizes = (fixed->flags & VFIO_IOMMU_INFO_PGSIZES) ? fixed->iova_pgsizes : 4096;
  if (info.page_sizes == 0) return fail(EPROTO, what + " reported no IOMMU page sizes");
  if ((fixed->flags & VFIO_IOMMU_INFO_CAPS) && fixed->cap_offset != 0) {
    auto caps = detail::walk_info_caps(*buffer, sizeof(vfio_iommu_type1_info), fixed->cap_offset, what);
    if (!caps) return std::unexpected(caps.error());
    for (const auto& cap : *caps) {
      const uint8_t* at = buffer->data() + cap.offset;
      if (cap.id == VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE) {
        vfio_iommu_type1_info_cap_iova_range head;
        if (cap.length < sizeof head) return fail(EPROTO, what + ": truncated IOVA range capability");
        std::memcpy(&head, at, sizeof head);
        if (head.nr_iovas > (cap.length - sizeof head) / sizeof(vfio_iova_range))
          return fail(EPROTO, what + ": IOVA range capability claims " + std::to_string(head.nr_iovas) +
                                  " ranges but holds fewer");
        for (uint32_t i = 0; i < head.nr_iovas; ++i) {
          vfio_iova_range r;
          std::memcpy(&r, at + sizeof head + i * sizeof r, sizeof r);
          info.iova_ranges.push_back({r.start, r.end});
        }
        info.iova_ranges_reported = true;
      } else if (cap.id == VFIO_IOMMU_TYPE1_INFO_DMA_AVAIL) {
        vfio_iommu_type1_info_dma_avail avail;
        if (cap.length < sizeof avail) return fail(EPROTO, what + ": truncated DMA-available capability");
        std::memcpy(&avail, at, sizeof avail);
        info.dma_mappings_available = avail.avail;
      }
      // Others (migration, id 2) do not concern a NIC driver.
    }
  }
  if (!info.iova_ranges_reported) info.iova_ranges = fallback_iova_ranges();

  // The kernel copies dma_entry_limit into the container when the IOMMU is
  // set; DMA_AVAIL (Linux >= 5.10) is then the exact remaining count.
  if (info.dma_mappings_available) {
    uint64_t limit = mappings_.size() + uint64_t{*info.dma_mappings_available};
    info.dma_entry_limit = static_cast<uint32_t>(std::min<uint64_t>(limit, UINT32_MAX));
    info.dma_entry_limit_source = "the container's DMA_AVAIL capability";
  } else if (auto param = read_attr(dma_entry_limit_param(env_)); param && parse_uint(*param, 10)) {
    info.dma_entry_limit = static_cast<uint32_t>(std::min<unsigned long long>(*parse_uint(*param, 10), UINT32_MAX));
    info.dma_entry_limit_source = dma_entry_limit_param(env_);
  } else {
    info.dma_entry_limit = kDefaultDmaEntryLimit;
    info.dma_entry_limit_source = "vfio_iommu_type1's default";
  }

  if (!allocator_) {
    auto allocator = IovaAllocator::create(info.iova_ranges, info.min_page_size());
    if (!allocator) return std::unexpected(allocator.error().context(what));
    allocator_ = std::move(*allocator);
  } else if (auto ok = allocator_->set_ranges(info.iova_ranges); !ok) {
    return std::unexpected(ok.error().context(what));
  }
  info_ = std::move(info);
  return {};
}

Result<KernelFd> Container::open_device(const PciAddress& address) {
  auto number = iommu_group_of(env_, address);
  if (!number) return std::unexpected(number.error());
  std::lock_guard lock(mutex_);
  if (auto ok = add_group_locked(*number); !ok) return std::unexpected(ok.error().context("opening " + address.str()));
  return groups_.at(*number).open_device(address);
}

IommuInfo Container::info() const {
  std::lock_guard lock(mutex_);
  return info_;
}

DmaUsage Container::usage() const {
  std::lock_guard lock(mutex_);
  return {mappings_.size(), pinned_bytes_};
}

std::string Container::entry_limit_error(const std::string& what) const {
  return what + ": the container holds " + std::to_string(mappings_.size()) +
         " DMA mappings, the vfio_iommu_type1 dma_entry_limit (" + std::to_string(info_.dma_entry_limit) +
         ", from " + info_.dma_entry_limit_source +
         "). Map fewer, larger buffers, or raise the limit: `modprobe vfio_iommu_type1 "
         "dma_entry_limit=N` (or write N to " + dma_entry_limit_param(env_) +
         " as root) before the container is opened";
}

std::string Container::memlock_error(const std::string& what, uint64_t limit, std::optional<uint64_t> locked) const {
  std::string already =
      locked ? "this process already has " + bytes(*locked) + " locked (VmLck), " + bytes(pinned_bytes_) +
                   " of it pinned by this container"
             : "this container already pins " + bytes(pinned_bytes_);
  return what + ": pinning it would exceed RLIMIT_MEMLOCK (" + bytes(limit) + "); " + already +
         ". Raise the limit: `ulimit -l unlimited` in the shell that starts the program, `memlock "
         "unlimited` lines in /etc/security/limits.conf, LimitMEMLOCK=infinity for a systemd service, or "
         "run with CAP_IPC_LOCK (root has it)";
}

Status Container::check_limits_locked(uint64_t size) const {
  const std::string what = "MAP_DMA of " + bytes(size) + " refused";
  if (mappings_.size() >= info_.dma_entry_limit) return fail(ENOSPC, entry_limit_error(what));
  if (env_.kernel->has_cap_ipc_lock()) return {};
  rlimit limit{};
  if (env_.kernel->getrlimit(RLIMIT_MEMLOCK, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return {};
  auto locked = locked_memory_bytes(env_);
  uint64_t already = locked ? *locked : pinned_bytes_;
  if (already > limit.rlim_cur || size > limit.rlim_cur - already)
    return fail(ENOMEM, memlock_error(what, limit.rlim_cur, locked));
  return {};
}

uint64_t Container::mapping_alignment(uintptr_t vaddr, uint64_t size) const {
  // Aligning the IOVA like the buffer lets the IOMMU use its large pages
  // when the memory is backed by huge pages.
  uint64_t best = info_.min_page_size();
  for (uint64_t page = best; page != 0 && page <= kLargestMappingAlignment; page <<= 1) {
    if ((info_.page_sizes & page) && page <= size && vaddr % page == 0) best = page;
  }
  return best;
}

Result<DmaMapping> Container::map_dma(void* vaddr, uint64_t size, DmaAccess access) {
  auto self = weak_from_this().lock();
  if (!self) return fail(EINVAL, "container is not owned by a std::shared_ptr; create it with Container::open");
  std::lock_guard lock(mutex_);
  const auto va = reinterpret_cast<uintptr_t>(vaddr);
  if (!iommu_set_ || !allocator_)
    return fail(EINVAL, "MAP_DMA of " + bytes(size) + ": no IOMMU group has joined the container yet; "
                        "open a device (or add its group) before mapping DMA memory");
  const uint64_t page = info_.min_page_size();
  if (size == 0 || va % page != 0 || size % page != 0)
    return fail(EINVAL, "MAP_DMA of " + bytes(size) + " at vaddr " + hex(va) +
                            ": address and size must be multiples of the IOMMU page size (" + bytes(page) +
                            "); allocate DMA memory page-aligned (mmap, aligned_alloc) and map whole pages");
  if ((static_cast<uint32_t>(access) & 3u) == 0)
    return fail(EINVAL, "MAP_DMA needs device read and/or write access");
  if (auto ok = check_limits_locked(size); !ok) return std::unexpected(ok.error());

  auto iova = allocator_->allocate(size, mapping_alignment(va, size));
  if (!iova) return std::unexpected(iova.error().context("MAP_DMA of " + bytes(size)));

  vfio_iommu_type1_dma_map map{};
  map.argsz = sizeof map;
  map.flags = static_cast<uint32_t>(access) & (VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE);
  map.vaddr = va;
  map.iova = *iova;
  map.size = size;
  if (env_.kernel->ioctl(fd_.get(), VFIO_IOMMU_MAP_DMA, &map) != 0) {
    int err = errno;
    (void)allocator_->free(*iova, size);
    const std::string what =
        "VFIO_IOMMU_MAP_DMA of " + bytes(size) + " at IOVA " + hex(*iova) + " (vaddr " + hex(va) + ") failed";
    switch (err) {
      case ENOSPC:
        return fail(err, entry_limit_error(what + ": no space left"));
      case ENOMEM: {
        rlimit limit{};
        if (env_.kernel->getrlimit(RLIMIT_MEMLOCK, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY)
          return fail(err, memlock_error(what + ": cannot allocate memory (the kernel's RLIMIT_MEMLOCK check "
                                                "counts all locked memory of the process)",
                                         limit.rlim_cur, locked_memory_bytes(env_)));
        return fail_errno(err, what + " (out of memory while pinning pages)");
      }
      case EINVAL:
        return fail_errno(err, what + ": the kernel rejected the IOVA, address or size (usable IOVA ranges: " +
                                   allocator_->describe_ranges() + ", IOMMU page size " + bytes(page) + ")");
      case EEXIST:
        return fail_errno(err, what + ": the IOVA range overlaps an existing mapping; is something else "
                                      "mapping through this container's fd?");
      case EFAULT:
        return fail_errno(err, what + ": the memory is not (fully) mapped in this process, or is "
                                      "read-only while the device was to write it");
      default:
        return fail_errno(err, what);
    }
  }
  mappings_[*iova] = {size, vaddr};
  pinned_bytes_ += size;
  auto mapping = make_mapping(*iova, vaddr, size, access);
  if (!mapping) {  // unreachable: `self` proved shared ownership above
    vfio_iommu_type1_dma_unmap unmap{};
    unmap.argsz = sizeof unmap;
    unmap.iova = *iova;
    unmap.size = size;
    env_.kernel->ioctl(fd_.get(), VFIO_IOMMU_UNMAP_DMA, &unmap);
  }
  return mapping;
}

Status Container::unmap_dma(uint64_t iova, uint64_t size) {
  std::lock_guard lock(mutex_);
  auto it = mappings_.find(iova);
  if (it == mappings_.end() || it->second.size != size)
    return fail(EINVAL, "VFIO_IOMMU_UNMAP_DMA of " + bytes(size) + " at IOVA " + hex(iova) +
                            ": no such mapping in this container (type1 unmaps only whole mappings)");
  vfio_iommu_type1_dma_unmap unmap{};
  unmap.argsz = sizeof unmap;
  unmap.flags = 0;
  unmap.iova = iova;
  unmap.size = size;
  if (env_.kernel->ioctl(fd_.get(), VFIO_IOMMU_UNMAP_DMA, &unmap) != 0)
    return fail_errno("VFIO_IOMMU_UNMAP_DMA of " + bytes(size) + " at IOVA " + hex(iova) +
                      " (the IOVA stays reserved until the container closes)");
  if (unmap.size != size)
    return fail(EIO, "VFIO_IOMMU_UNMAP_DMA at IOVA " + hex(iova) + " unmapped " + bytes(unmap.size) +
                         " instead of " + bytes(size) + " (the IOVA stays reserved until the container closes)");
  mappings_.erase(it);
  pinned_bytes_ -= size;
  if (auto ok = allocator_->free(iova, size); !ok) return ok;
  return {};
}

}  // namespace ufab::vfio
