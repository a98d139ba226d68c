// The process's registries: the raw-frame plugins (built-in and from the
// plugin directories) and the RDMA providers (soft-RoCE over those plugins,
// the queue-pair plugins linked in, and those found in the plugin
// directories). The C API (c_api.cc) picks from these; `ufab plugins` lists
// them.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "abi/raw_frame.h"
#include "abi/rdma_provider.h"
#include "core/plugin_registry.h"
#include "core/provider/providers.h"

namespace ufab::provider {

// The plugins linked into the program, a choice the program makes at link
// time: the in-tree library (//api:rdma) links lib/builtins_static.cc
// (every plugin of drivers/), libufab.so links lib/builtins_none.cc and
// finds them all in its plugin directory at run time.
struct Builtins {
  std::span<const ufab_driver* const> drivers;
  std::span<const ufab_rdma_provider* const> providers;
};
Builtins builtins();

// Built on first use, kept for the life of the process.
const ProviderRegistry& providers();
// The raw-frame plugins soft-RoCE opens NICs with.
const core::PluginRegistry& raw_plugins();
// What did not load, for `ufab plugins`.
const std::vector<std::string>& provider_warnings();

}  // namespace ufab::provider
