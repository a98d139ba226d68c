// A count of the CUDA calls that can free device memory or give its
// address to other memory (frees, allocations, mappings, IPC, context
// destruction, graph launches), kept by CUPTI's driver-API callbacks,
// bumped as each such call starts and as it returns. A registration cache
// that checked a GPU buffer when the count was N knows, while the count is
// still N, that nothing since could have freed or replaced it: no CUDA
// question on a hit (docs/gpu.md, "Registration cache").
//
// Opt-in (UFAB_MR_CACHE_WATCH_GPU_FREES): CUPTI allows one subscriber per
// process before CUPTI 13.5, so a profiler started later would fail, and
// every counted call takes the callback.
#pragma once

#include <atomic>
#include <cstdint>

#include "base/error.h"

namespace ufab::gpu {

// Starts the watch for the process (once; later calls return the same
// counter or the same error): libcupti loaded with dlopen (libcupti.so.13,
// then libcupti.so), a subscriber, and the callbacks enabled. Fails, saying
// why, where CUPTI is missing or another subscriber holds it.
Result<const std::atomic<uint64_t>*> watch_frees();

}  // namespace ufab::gpu
