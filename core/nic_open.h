// Opening a NIC by what an operator types: a PCI address ("0000:00:02.0",
// the plugin chosen by the device's ids through the registry's match
// tables) or "<software plugin>:<device name>" ("swnic:lab:0").
#pragma once

#include <memory>
#include <span>
#include <string>

#include "base/error.h"
#include "core/nic.h"
#include "core/plugin_registry.h"

namespace ufab::core {

struct OpenOptions {
  NicParams params;
  vfio::Environment env;
};

// The plugin that would drive `spec`, without opening anything.
Result<const Plugin*> plugin_for(const PluginRegistry& registry, const std::string& spec,
                                 const vfio::Environment& env = {});
Result<std::unique_ptr<Nic>> open_nic(const PluginRegistry& registry, const std::string& spec,
                                      const OpenOptions& options = {});

// A registry holding `builtins`, the plugins linked into the program, plus
// those found by PluginRegistry::load_default(); load problems are in
// warnings(). The program chooses its built-in list, core does not: ufab's
// binaries and the API pass drivers/builtin's (ufab::drivers::builtin_drivers()
// in drivers/builtin.h), a test may pass its own or none.
PluginRegistry default_registry(std::span<const ufab_driver* const> builtins);

}  // namespace ufab::core
