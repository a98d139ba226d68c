#include "api/providers.h"

#include "core/nic_open.h"
#include "core/provider/softroce.h"

namespace ufab::api {
namespace {

struct State {
  core::PluginRegistry raw;
  provider::ProviderRegistry providers;
  std::vector<std::string> warnings;
};

const State& state() {
  static const State s = [] {
    State st{core::default_registry(builtins().drivers), {}, {}};
    auto add = [&st](const ufab_rdma_provider* table, const std::string& origin) {
      if (auto added = st.providers.add(table, origin); !added) st.warnings.push_back(added.error().message());
    };
    add(provider::softroce_provider(st.raw), "built-in");
    for (const ufab_rdma_provider* p : builtins().providers) add(p, "built-in");
    for (const auto& loaded : st.raw.rdma_providers()) add(loaded.table, loaded.origin);
    return st;
  }();
  return s;
}

}  // namespace

const provider::ProviderRegistry& providers() { return state().providers; }
const core::PluginRegistry& raw_plugins() { return state().raw; }
const std::vector<std::string>& provider_warnings() { return state().warnings; }

}  // namespace ufab::api
