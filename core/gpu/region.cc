#include "core/gpu/region.h"

#include "base/hex.h"

namespace ufab::gpu {
namespace {

std::string range(const void* addr, uint64_t length) {
  return "[" + hex(reinterpret_cast<uintptr_t>(addr)) + ", +" + std::to_string(length) + ")";
}

}  // namespace

Result<RegionMemory> classify_region(const PointerInfo& info, const void* addr, uint64_t length, bool told_cuda) {
  // Built only for an error: this runs on every registration in a process
  // with CUDA loaded.
  auto what = [&] { return "memory " + range(addr, length); };
  if (info.managed) {
    return fail(EOPNOTSUPP, what() + " is CUDA managed (unified) memory, whose pages migrate between the host and "
                                   "the GPU while a transfer could be reading them; ufab does not register it: "
                                   "allocate with cudaMalloc (device) or cudaMallocHost (pinned host) instead");
  }
  switch (info.type) {
    case MemoryType::kNotCuda:
    case MemoryType::kHost:
      if (told_cuda) {
        return fail(EINVAL, what() + " was registered as CUDA memory (UFAB_MEM_CUDA) but is " +
                                (info.type == MemoryType::kHost ? "CUDA pinned host memory" : "not CUDA memory") +
                                ": register it as host memory (UFAB_MEM_HOST)");
      }
      return RegionMemory{};
    case MemoryType::kArray:
      return fail(EINVAL, what() + " is a CUDA array, which has no linear addresses to transfer: use memory from "
                                 "cudaMalloc");
    case MemoryType::kDevice: break;
  }
  const uint64_t start = reinterpret_cast<uintptr_t>(addr);
  if (info.buffer_id == 0 || info.range_size == 0) {
    return fail(EINVAL, what() + ": CUDA reports device memory without an allocation (buffer id " +
                            std::to_string(info.buffer_id) + ", size " + std::to_string(info.range_size) + ")");
  }
  if (start < info.range_start || length > info.range_size || start - info.range_start > info.range_size - length) {
    return fail(EINVAL, what() + " is GPU memory but runs past its allocation [" + hex(info.range_start) + ", +" +
                            std::to_string(info.range_size) +
                            "): a region lies inside one allocation (register each allocation as its own region)");
  }
  return RegionMemory{.device = true, .ordinal = info.device, .buffer_id = info.buffer_id};
}

Result<RegionMemory> detect_region(const void* addr, uint64_t length, bool told_cuda) {
  const Driver* driver = nullptr;
  if (told_cuda) {
    auto d = Driver::get();
    if (!d) {
      return fail(d.error().code(), "registering CUDA memory (UFAB_MEM_CUDA) " + range(addr, length) + ": " +
                                        d.error().message());
    }
    driver = *d;
  } else {
    driver = Driver::if_loaded();
    if (driver == nullptr) return RegionMemory{};  // no CUDA in this process: no GPU pointers
  }
  auto info = driver->pointer_info(addr);
  if (!info) return std::unexpected(info.error().context("learning what memory " + range(addr, length) + " is"));
  return classify_region(*info, addr, length, told_cuda);
}

}  // namespace ufab::gpu
