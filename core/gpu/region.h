// What memory a registration covers, decided from CUDA's pointer
// attributes: plain host memory, or device memory of one GPU allocation
// (with its ordinal and buffer id). The rules (docs/gpu.md):
//   - asked for host memory (UFAB_MEM_HOST), the type is still detected
//     when the process has the CUDA driver loaded, so device memory
//     registered as host is known as device memory (and never memcpy'd);
//     a process without the driver loaded pays nothing (no dlopen);
//   - asked for CUDA memory (UFAB_MEM_CUDA), the driver is loaded if need
//     be, and the range must be device memory;
//   - device memory must lie inside one allocation;
//   - managed (unified) memory is refused: its pages migrate between the
//     host and the GPU under the application's feet.
#pragma once

#include <cstdint>
#include <optional>

#include "base/error.h"
#include "core/gpu/cuda.h"

namespace ufab::gpu {

struct RegionMemory {
  bool device = false;    // false: host memory (plain, or CUDA pinned host memory)
  int ordinal = -1;       // the GPU, for device memory
  uint64_t buffer_id = 0; // the allocation's CUDA buffer id, for device memory
};

// The decision, from the attributes of the range's first byte (`info`);
// pure, so it is tested without a GPU. `told_cuda`: the caller said the
// memory is CUDA device memory.
Result<RegionMemory> classify_region(const PointerInfo& info, const void* addr, uint64_t length, bool told_cuda);

// The whole step for a registration: learns `info` through the driver
// (Driver::get() when told_cuda, else only Driver::if_loaded()) and
// classifies. Host memory in a process without CUDA loaded: no call at all.
Result<RegionMemory> detect_region(const void* addr, uint64_t length, bool told_cuda);

}  // namespace ufab::gpu
