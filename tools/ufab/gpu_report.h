// What GPU support this ufab has on this machine (docs/gpu.md): the build,
// the CUDA driver and every GPU with its stream memory operations. Shared
// by `ufab doctor` (as checks) and `ufab info gpu` (as a report).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/gpu/cuda.h"

namespace ufab::cli {

struct GpuDeviceReport {
  int ordinal = 0;
  std::optional<gpu::DeviceInfo> info;  // empty: `error` says why
  std::string error;
  bool memops = false;                  // stream write/wait-value probed and working
  std::string memops_error;
};

struct GpuReport {
  bool built = false;           // compiled against cuda.h
  int built_version = 0;        // its CUDA_VERSION
  std::string unavailable;      // why there is no usable driver ("" when there is)
  int driver_version = 0;
  std::string library;          // the libcuda the dynamic loader found
  std::string count_error;      // cuDeviceGetCount failing
  std::vector<GpuDeviceReport> devices;
};

// Loads the driver if need be and probes every GPU (a stream round trip
// each: a few milliseconds).
GpuReport gpu_report();

// "NVIDIA H100 80GB HBM3, 0000:01:00.0, 79.1 GiB, sm_90".
std::string gpu_device_line(const gpu::DeviceInfo& d);

}  // namespace ufab::cli
