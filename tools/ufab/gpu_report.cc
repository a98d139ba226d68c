#include "tools/ufab/gpu_report.h"

#include <cstdio>

namespace ufab::cli {

GpuReport gpu_report() {
  GpuReport r;
  r.built = gpu::built_with_cuda();
  r.built_version = gpu::built_cuda_version();
  if (!r.built) {
    r.unavailable = gpu::unavailable_reason();
    return r;
  }
  auto d = gpu::Driver::get();
  if (!d) {
    r.unavailable = d.error().message();
    return r;
  }
  const gpu::Driver& driver = **d;
  r.driver_version = driver.version();
  r.library = driver.library_path();
  auto n = driver.device_count();
  if (!n) {
    r.count_error = n.error().message();
    return r;
  }
  for (int i = 0; i < *n; ++i) {
    GpuDeviceReport dev;
    dev.ordinal = i;
    if (auto info = driver.device(i)) {
      dev.info = *info;
      auto probe = driver.probe_stream_memops(i);
      dev.memops = bool(probe);
      if (!probe) dev.memops_error = probe.error().message();
    } else {
      dev.error = info.error().message();
    }
    r.devices.push_back(std::move(dev));
  }
  return r;
}

std::string gpu_device_line(const gpu::DeviceInfo& d) {
  char mem[32];
  std::snprintf(mem, sizeof mem, "%.1f GiB", double(d.memory_bytes) / double(1ull << 30));
  return d.name + ", " + d.pci_address + ", " + mem + ", sm_" + std::to_string(d.compute_major) +
         std::to_string(d.compute_minor);
}

}  // namespace ufab::cli
