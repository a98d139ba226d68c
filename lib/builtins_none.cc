// No plugin linked in: libufab.so loads them all from its plugin directory
// (<libdir>/ufab-plugins, or UFAB_PLUGIN_PATH).
#include "core/provider/registries.h"

namespace ufab::provider {

Builtins builtins() { return {}; }

}  // namespace ufab::provider
