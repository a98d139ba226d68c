// ufab doctor [BDF]: is this host ready for user-space NIC drivers?
#include <cstdio>
#include <vector>

#include "base/json.h"
#include "core/pci/doctor.h"
#include "tools/ufab/cli.h"
#include "tools/ufab/gpu_report.h"

namespace ufab::cli {
namespace {

// GPU support (docs/gpu.md): optional, so its absence is "skip" with the
// reason, never a failure. A GPU whose stream memory operations fail is a
// warning: registration works, GPU-triggered operations will not.
void gpu_checks(std::vector<pci::Check>& checks) {
  using pci::CheckStatus;
  GpuReport r = gpu_report();
  if (!r.built) {
    checks.push_back({"gpu support", CheckStatus::kSkip, r.unavailable,
                      "install the CUDA Toolkit (/usr/local/cuda or CUDA_PATH) and rebuild"});
    return;
  }
  if (!r.unavailable.empty()) {
    checks.push_back({"gpu driver", CheckStatus::kSkip, r.unavailable, "install the NVIDIA driver where GPU memory is wanted"});
    return;
  }
  checks.push_back({"gpu driver", r.devices.empty() ? CheckStatus::kSkip : CheckStatus::kOk,
                    "CUDA " + gpu::cuda_version_string(r.driver_version) + " driver (" + r.library +
                        "), built against CUDA " + gpu::cuda_version_string(r.built_version) + ", " +
                        (r.count_error.empty() ? std::to_string(r.devices.size()) + " GPU(s)" : r.count_error),
                    ""});
  for (const auto& d : r.devices) {
    std::string name = "gpu " + std::to_string(d.ordinal);
    if (!d.info) {
      checks.push_back({name, CheckStatus::kWarn, d.error, ""});
      continue;
    }
    checks.push_back({name, d.memops ? CheckStatus::kOk : CheckStatus::kWarn,
                      gpu_device_line(*d.info) + "; stream memory operations: " + (d.memops ? "work" : d.memops_error),
                      d.memops ? "" : "GPU-triggered operations need cuStreamWriteValue32/cuStreamWaitValue32"});
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
