#include "core/provider/registries.h"

#include "core/nic_open.h"
#include "core/provider/softroce.h"

namespace ufab::provider {
namespace {

struct State {
  core::PluginRegistry raw;
  ProviderRegistry providers;
  std::vector<std::string> warnings;
};

// Never destroyed: devices, and the handles of the objects on them, may
// live in other static objects that outlast any destruction order chosen
// here (the providers' tables and the plugins' code must stay until exit).
const State& state() {
  static const State& s = *[] {
    auto* made = new State{core::default_registry(builtins().drivers), {}, {}};
    State& st = *made;
    auto add = [&st](const ufab_rdma_provider* table, const std::string& origin) {
      if (auto added = st.providers.add(table, origin); !added) st.warnings.push_back(added.error().message());
    };
    add(softroce_provider(st.raw), "built-in");
    for (const ufab_rdma_provider* p : builtins().providers) add(p, "built-in");
    for (const auto& loaded : st.raw.rdma_providers()) add(loaded.table, loaded.origin);
    return made;
  }();
  return s;
}

}  // namespace

const ProviderRegistry& providers() { return state().providers; }
const core::PluginRegistry& raw_plugins() { return state().raw; }
const std::vector<std::string>& provider_warnings() { return state().warnings; }

}  // namespace ufab::provider
