// ufab list: every network-class PCI device and whether ufab can use it.
#include <cstdio>

#include "base/hex.h"

#include "core/pci/discovery.h"
#include "tools/ufab/cli.h"
#include "tools/ufab/render.h"
#include "tools/ufab/table.h"

namespace ufab::cli {

int cmd_list(const Options& opts) {
  auto devices = pci::list_network_devices(opts.host);
  if (!devices) return report_error(opts, "list", devices.error());

  if (opts.json) {
    JsonWriter w;
    w.begin_object().field("ok", true).key("devices").begin_array();
    for (const auto& d : *devices) {
      w.begin_object();
      write_device_fields(w, d);
      w.end_object();
    }
    w.end_array().end_object();
    std::printf("%s\n", w.str().c_str());
    return kExitOk;
  }

  if (devices->empty()) {
    std::printf("no network PCI devices found under %s/bus/pci/devices\n", opts.host.paths.sysfs.c_str());
    return kExitOk;
  }
  Table table({"BDF", "ID", "DEVICE", "DRIVER", "GROUP", "NUMA", "NETDEV", "UFAB"});
  for (const auto& d : *devices) {
    table.add({d.address.str(), hex_digits(d.vendor_id, 4) + ":" + hex_digits(d.device_id, 4), device_title(d),
               d.driver.empty() ? "-" : d.driver, group_text(d),
               d.numa_node < 0 ? "-" : std::to_string(d.numa_node), interfaces_summary(d),
               pci::readiness_name(d.readiness)});
  }
  std::fputs(table.render().c_str(), stdout);
  for (const auto& d : *devices) {
    if (d.readiness != pci::Readiness::kReady && d.readiness != pci::Readiness::kBindable) {
      std::printf("%s: %s\n", d.address.str().c_str(), d.readiness_reason.c_str());
    }
  }
  return kExitOk;
}

}  // namespace ufab::cli
