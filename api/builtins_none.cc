// No plugin linked in: libufab.so loads them all from its plugin directory
// (<libdir>/ufab-plugins, or UFAB_PLUGIN_PATH).
#include "api/providers.h"

namespace ufab::api {

Builtins builtins() { return {}; }

}  // namespace ufab::api
