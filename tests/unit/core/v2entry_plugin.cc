// A plugin built for a future ABI major: it exports the entry symbol of
// major 2 only, so this ufab finds no ufab_driver_entry_v1.
#include <cstddef>

extern "C" __attribute__((visibility("default"))) const void* ufab_driver_entry_v2(void) { return nullptr; }
