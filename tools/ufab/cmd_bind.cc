// ufab bind / unbind: hand a NIC to vfio-pci and give it back.
#include <cstdio>

#include "base/json.h"
#include "core/pci/bind.h"
#include "tools/ufab/cli.h"

namespace ufab::cli {
namespace {

void print_lines(const char* prefix, const std::vector<std::string>& lines, FILE* out) {
  for (const auto& l : lines) std::fprintf(out, "%s%s\n", prefix, l.c_str());
}

void write_strings(JsonWriter& w, const char* key, const std::vector<std::string>& v) {
  w.key(key).begin_array();
  for (const auto& s : v) w.value(s);
  w.end_array();
}

}  // namespace

int cmd_bind(const Options& opts) {
  auto report = pci::bind_to_vfio(opts.host, opts.args[0], pci::BindOptions{.force = opts.force});
  if (!report) return report_error(opts, "bind", report.error());
  if (opts.json) {
    JsonWriter w;
    w.begin_object().field("ok", true).field("address", report->address.str());
    w.field("previous_driver", report->previous_driver).field("driver", report->driver_now);
    w.key("iommu_group");
    if (report->iommu_group) {
      w.value(*report->iommu_group);
    } else {
      w.null();
    }
    w.field("vfio_node", report->vfio_node);
    write_strings(w, "actions", report->actions);
    write_strings(w, "warnings", report->warnings);
    w.end_object();
    std::printf("%s\n", w.str().c_str());
    return kExitOk;
  }
  print_lines("  ", report->actions, stdout);
  std::printf("%s: bound to %s (was %s); IOMMU group %s, %s\n", report->address.str().c_str(),
              report->driver_now.c_str(), report->previous_driver.empty() ? "no driver" : report->previous_driver.c_str(),
              report->iommu_group ? std::to_string(*report->iommu_group).c_str() : "-", report->vfio_node.c_str());
  print_lines("warning: ", report->warnings, stderr);
  return kExitOk;
}

int cmd_unbind(const Options& opts) {
  auto report = pci::unbind_from_vfio(opts.host, opts.args[0]);
  if (!report) return report_error(opts, "unbind", report.error());
  if (opts.json) {
    JsonWriter w;
    w.begin_object().field("ok", true).field("address", report->address.str());
    w.key("recorded_driver");
    if (report->recorded_driver) {
      w.value(*report->recorded_driver);
    } else {
      w.null();
    }
    w.field("driver", report->driver_now);
    write_strings(w, "actions", report->actions);
    write_strings(w, "warnings", report->warnings);
    w.end_object();
    std::printf("%s\n", w.str().c_str());
    return kExitOk;
  }
  print_lines("  ", report->actions, stdout);
  std::printf("%s: released from vfio-pci; driver now %s\n", report->address.str().c_str(),
              report->driver_now.empty() ? "none" : report->driver_now.c_str());
  print_lines("warning: ", report->warnings, stderr);
  return kExitOk;
}

}  // namespace ufab::cli
