// ufab doctor [BDF]: is this host ready for user-space NIC drivers?
#include <cstdio>

#include "base/json.h"
#include "core/pci/doctor.h"
#include "tools/ufab/cli.h"

namespace ufab::cli {

int cmd_doctor(const Options& opts) {
  std::optional<PciAddress> device;
  if (!opts.args.empty()) {
    auto addr = PciAddress::parse(opts.args[0]);
    if (!addr) return report_error(opts, "doctor", addr.error());
    device = *addr;
  }
  auto checks = pci::run_doctor(opts.host, device);
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
