#include "api/providers.h"

#include "core/nic_open.h"
#include "core/provider/softroce.h"
#include "drivers/builtin.h"
#include "drivers/builtin_providers.h"

namespace ufab::api {

const provider::ProviderRegistry& providers() {
  static const provider::ProviderRegistry registry = [] {
    provider::ProviderRegistry r;
    // Built-in tables are checked by the tests; a refusal here would be a
    // build mistake, and the device open that needs it names what is there.
    // The raw-frame plugins soft-RoCE opens NICs with: the built-in ones and
    // those in the plugin directories. Kept for the life of the process.
    static const core::PluginRegistry raw_plugins = core::default_registry(drivers::builtin_drivers());
    (void)r.add(provider::softroce_provider(raw_plugins), "built-in");
    size_t n = 0;
    const ufab_rdma_provider* const* list = ufab_builtin_providers(&n);
    for (size_t i = 0; i < n; ++i) (void)r.add(list[i], "built-in");
    return r;
  }();
  return registry;
}

}  // namespace ufab::api
