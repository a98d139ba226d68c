// Every plugin of drivers/ linked in (the in-tree library, tools, tests).
#include "core/provider/registries.h"
#include "drivers/builtin.h"
#include "drivers/builtin_providers.h"

namespace ufab::provider {

Builtins builtins() {
  size_t n = 0;
  const ufab_rdma_provider* const* list = ufab_builtin_providers(&n);
  return {drivers::builtin_drivers(), {list, n}};
}

}  // namespace ufab::provider
