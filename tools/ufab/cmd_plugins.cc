// ufab plugins: the driver plugins and RDMA providers this ufab can use.
#include <cstdio>

#include "base/hex.h"

#include "core/provider/registries.h"
#include "base/json.h"
#include "tools/ufab/cli.h"
#include "tools/ufab/render.h"
#include "tools/ufab/table.h"

namespace ufab::cli {
namespace {

std::string id_or_any(uint16_t id) { return id == UFAB_PCI_ANY ? "*" : hex_digits(id, 4); }

std::string match_text(const ufab_pci_match& m) {
  std::string s = id_or_any(m.vendor_id) + ":" + id_or_any(m.device_id);
  if (m.subsystem_vendor_id != UFAB_PCI_ANY || m.subsystem_device_id != UFAB_PCI_ANY) {
    s += " sub " + id_or_any(m.subsystem_vendor_id) + ":" + id_or_any(m.subsystem_device_id);
  }
  if (m.class_mask) s += " class " + hex_digits(m.class_code, 6) + "/" + hex_digits(m.class_mask, 6);
  if (m.model) s += std::string(" (") + m.model + ")";
  return s;
}

// What a provider serves, in words.
std::string serves(const provider::Provider& p) {
  if (p.prefixes.empty()) return "PCI NICs and software NICs (RDMA over their raw-frame plugins)";
  std::string s;
  for (const auto& prefix : p.prefixes) s += (s.empty() ? "" : ", ") + prefix + ":<name>";
  return s;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

}  // namespace

int cmd_plugins(const Options& opts) {
  // The API's own registries: what Device::open would use.
  const core::PluginRegistry& registry = provider::raw_plugins();
  const provider::ProviderRegistry& providers = provider::providers();
  if (opts.json) {
    JsonWriter w;
    w.begin_object().field("ok", true).field("abi", std::to_string(UFAB_ABI_MAJOR) + "." + std::to_string(UFAB_ABI_MINOR));
    w.key("plugins").begin_array();
    for (const auto& p : registry.plugins()) {
      w.begin_object().field("name", p->name).field("description", p->description).field("origin", p->origin);
      w.field("abi", std::to_string(p->abi_major) + "." + std::to_string(p->abi_minor)).field("software", p->software);
      w.key("matches").begin_array();
      for (const auto& m : p->matches) {
        w.begin_object().field("vendor_id", hex_digits(m.vendor_id, 4)).field("device_id", hex_digits(m.device_id, 4));
        w.field("subsystem_vendor_id", hex_digits(m.subsystem_vendor_id, 4));
        w.field("subsystem_device_id", hex_digits(m.subsystem_device_id, 4));
        w.field("class", hex_digits(m.class_code, 6)).field("class_mask", hex_digits(m.class_mask, 6));
        w.field("model", m.model ? m.model : "").end_object();
      }
      w.end_array().key("unsupported_ops").begin_array();
      for (const auto& op : p->stubbed_ops) w.value(op);
      w.end_array().end_object();
    }
    w.end_array().key("rdma_abi").value(std::to_string(UFAB_RDMA_ABI_MAJOR) + "." + std::to_string(UFAB_RDMA_ABI_MINOR));
    w.key("providers").begin_array();
    for (const auto& p : providers.providers()) {
      w.begin_object().field("name", p->name).field("description", p->description).field("origin", p->origin);
      w.field("abi", std::to_string(p->abi_major) + "." + std::to_string(p->abi_minor)).field("serves", serves(*p));
      w.key("prefixes").begin_array();
      for (const auto& prefix : p->prefixes) w.value(prefix);
      w.end_array().key("unsupported_ops").begin_array();
      for (const auto& op : p->stubbed_ops) w.value(op);
      w.end_array().end_object();
    }
    w.end_array().key("warnings").begin_array();
    for (const auto& warn : registry.warnings()) w.value(warn);
    for (const auto& warn : provider::provider_warnings()) w.value(warn);
    w.end_array().end_object();
    std::printf("%s\n", w.str().c_str());
    return kExitOk;
  }
  std::printf("plugin ABI %d.%d\n", UFAB_ABI_MAJOR, UFAB_ABI_MINOR);
  Table t({"PLUGIN", "ABI", "ORIGIN", "DRIVES"});
  for (const auto& p : registry.plugins()) {
    std::string drives;
    for (const auto& m : p->matches) drives += (drives.empty() ? "" : ", ") + match_text(m);
    if (p->software) drives = "software device (" + p->name + ":<name>)";
    t.add({p->name, std::to_string(p->abi_major) + "." + std::to_string(p->abi_minor), p->origin, drives});
  }
  std::fputs(t.render().c_str(), stdout);
  for (const auto& p : registry.plugins()) {
    if (!p->stubbed_ops.empty()) std::printf("%s does not implement: %s\n", p->name.c_str(), join(p->stubbed_ops).c_str());
  }
  std::printf("\nRDMA provider ABI %d.%d\n", UFAB_RDMA_ABI_MAJOR, UFAB_RDMA_ABI_MINOR);
  Table pt({"PROVIDER", "ABI", "ORIGIN", "SERVES"});
  for (const auto& p : providers.providers()) {
    pt.add({p->name, std::to_string(p->abi_major) + "." + std::to_string(p->abi_minor), p->origin, serves(*p)});
  }
  std::fputs(pt.render().c_str(), stdout);
  for (const auto& p : providers.providers()) {
    if (!p->stubbed_ops.empty()) std::printf("%s does not implement: %s\n", p->name.c_str(), join(p->stubbed_ops).c_str());
  }
  for (const auto& warn : registry.warnings()) std::fprintf(stderr, "warning: %s\n", warn.c_str());
  for (const auto& warn : provider::provider_warnings()) std::fprintf(stderr, "warning: %s\n", warn.c_str());
  return kExitOk;
}

}  // namespace ufab::cli
