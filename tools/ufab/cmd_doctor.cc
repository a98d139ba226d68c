// ufab doctor [BDF]: is this host ready for user-space NIC drivers?
#include <cstdio>
#include <vector>

#include "base/json.h"
#include "core/gpu/cuda.h"
#include "core/pci/doctor.h"
#include "tools/ufab/cli.h"

namespace ufab::cli {
namespace {

// GPU support (docs/gpu.md): optional, so its absence is "skip" with the
// reason, never a failure. A GPU whose stream memory operations fail is a
// warning: registration works, GPU-triggered operations will not.
void gpu_checks(std::vector<pci::Check>& checks) {
  using pci::CheckStatus;
  if (!gpu::built_with_cuda()) {
    checks.push_back({"gpu support", CheckStatus::kSkip, gpu::unavailable_reason(),
                      "install the CUDA Toolkit (/usr/local/cuda or CUDA_PATH) and rebuild"});
    return;
  }
  auto d = gpu::Driver::get();
  if (!d) {
    checks.push_back({"gpu driver", CheckStatus::kSkip, d.error().message(),
                      "install the NVIDIA driver where GPU memory is wanted"});
    return;
  }
  const gpu::Driver& driver = **d;
  auto n = driver.device_count();
  checks.push_back({"gpu driver", n && *n > 0 ? CheckStatus::kOk : CheckStatus::kSkip,
                    "CUDA " + gpu::cuda_version_string(driver.version()) + " driver (" + driver.library_path() +
                        "), built against CUDA " + gpu::cuda_version_string(gpu::built_cuda_version()) + ", " +
                        (n ? std::to_string(*n) + " GPU(s)" : n.error().message()),
                    ""});
  for (int i = 0; n && i < *n; ++i) {
    auto info = driver.device(i);
    if (!info) {
      checks.push_back({"gpu " + std::to_string(i), CheckStatus::kWarn, info.error().message(), ""});
      continue;
    }
    auto probe = driver.probe_stream_memops(i);
    char mem[32];
    std::snprintf(mem, sizeof mem, "%.1f GiB", double(info->memory_bytes) / double(1ull << 30));
    checks.push_back({"gpu " + std::to_string(i), probe ? CheckStatus::kOk : CheckStatus::kWarn,
                      info->name + ", " + info->pci_address + ", " + mem + ", sm_" +
                          std::to_string(info->compute_major) + std::to_string(info->compute_minor) +
                          "; stream memory operations: " + (probe ? "work" : probe.error().message()),
                      probe ? "" : "GPU-triggered operations need cuStreamWriteValue32/cuStreamWaitValue32"});
  }
}

}  // namespace

int cmd_doctor(const Options& opts) {
  std::optional<PciAddress> device;
  if (!opts.args.empty()) {
    auto addr = PciAddress::parse(opts.args[0]);
    if (!addr) return report_error(opts, "doctor", addr.error());
    device = *addr;
  }
  auto checks = pci::run_doctor(opts.host, device);
  gpu_checks(checks);
  auto worst = pci::worst_status(checks);
  if (opts.json) {
    JsonWriter w;
    w.begin_object().field("ok", worst != pci::CheckStatus::kFail).key("checks").begin_array();
    for (const auto& c : checks) {
      w.begin_object().field("name", c.name).field("status", pci::check_status_name(c.status));
      w.field("detail", c.detail).field("fix", c.fix).end_object();
    }
    w.end_array().end_object();
    std::printf("%s\n", w.str().c_str());
  } else {
    for (const auto& c : checks) {
      std::printf("[%-4s] %-24s %s\n", pci::check_status_name(c.status), c.name.c_str(), c.detail.c_str());
      if (!c.fix.empty() && (c.status == pci::CheckStatus::kFail || c.status == pci::CheckStatus::kWarn)) {
        std::printf("       fix: %s\n", c.fix.c_str());
      }
    }
    std::printf("%s\n", worst == pci::CheckStatus::kFail   ? "doctor: problems found; apply the fixes above"
                        : worst == pci::CheckStatus::kWarn ? "doctor: usable, with warnings"
                                                           : "doctor: all checks passed");
  }
  return worst == pci::CheckStatus::kFail ? kExitFailed : kExitOk;
}

}  // namespace ufab::cli
