#include "core/nic_open.h"

#include <cstdio>

#include "base/files.h"
#include "base/pci_address.h"

namespace ufab::core {
namespace {

Result<PciIdentity> read_identity(const vfio::Environment& env, const PciAddress& address) {
  std::string dir = env.sysfs_root + "/bus/pci/devices/" + address.str() + "/";
  if (!path_exists(dir)) {
    return fail(ENODEV, "no PCI device " + address.str() + " (`ufab list` shows the NICs)");
  }
  auto id = [&](const char* attr) -> Result<uint32_t> {
    auto text = read_attr(dir + attr);
    auto v = text ? parse_uint(*text, 16) : std::nullopt;
    if (!v) return fail(EIO, "cannot read " + dir + attr);
    return static_cast<uint32_t>(*v);
  };
  PciIdentity ident{};
  for (auto [field, attr] : {std::pair{&ident.vendor_id, "vendor"}, std::pair{&ident.device_id, "device"},
                             std::pair{&ident.subsystem_vendor_id, "subsystem_vendor"},
                             std::pair{&ident.subsystem_device_id, "subsystem_device"}}) {
    auto v = id(attr);
    if (!v) return std::unexpected(v.error());
    *field = static_cast<uint16_t>(*v);
  }
  auto cls = id("class");
  if (!cls) return std::unexpected(cls.error());
  ident.class_code = *cls;
  return ident;
}

}  // namespace

Result<const Plugin*> plugin_for(const PluginRegistry& registry, const std::string& spec,
                                 const vfio::Environment& env) {
  if (auto address = PciAddress::parse(spec)) {
    auto ident = read_identity(env, *address);
    if (!ident) return std::unexpected(ident.error());
    if (const Plugin* p = registry.for_pci(*ident)) return p;
    char ids[16];
    std::snprintf(ids, sizeof ids, "%04x:%04x", ident->vendor_id, ident->device_id);
    return fail(ENOTSUP, "no ufab plugin drives " + address->str() + " (" + ids +
                             "); `ufab plugins` lists the plugins and the devices they match");
  }
  auto colon = spec.find(':');
  if (colon != std::string::npos) {
    const Plugin* p = registry.by_name(spec.substr(0, colon));
    if (p && p->software) return p;
  }
  return fail(EINVAL, "'" + spec +
                          "' is neither a PCI address (0000:01:00.0) nor a software device "
                          "(<plugin>:<name>, e.g. swnic:lab:0)");
}

Result<std::unique_ptr<Nic>> open_nic(const PluginRegistry& registry, const std::string& spec,
                                      const OpenOptions& options) {
  auto plugin = plugin_for(registry, spec, options.env);
  if (!plugin) return std::unexpected(plugin.error());
  if ((*plugin)->software) {
    return Nic::open_software((*plugin)->ops, spec.substr(spec.find(':') + 1), options.params);
  }
  return Nic::open_pci((*plugin)->ops, *PciAddress::parse(spec), options.params, options.env);
}

PluginRegistry default_registry(std::span<const ufab_driver* const> builtins) {
  PluginRegistry registry;
  // A refused built-in is a build mistake the registry tests catch; the
  // device open that needs it then says which plugins there are.
  for (const ufab_driver* driver : builtins) (void)registry.add_builtin(driver);
  (void)registry.load_default();
  return registry;
}

}  // namespace ufab::core
