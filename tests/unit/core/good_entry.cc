// The shared-library entry point of the "good" plugin. It lives in its own
// file, built only into libgood_plugin.so, so that the driver library
// (good_plugin.cc) can be linked statically next to other plugins without
// several definitions of ufab_driver_entry_v1 colliding.
#include "tests/unit/core/good_plugin.h"

// -fvisibility=hidden hides everything by default; this is the one symbol
// that must be visible (the version script then keeps it the only one).
extern "C" __attribute__((visibility("default"))) const ufab_driver* ufab_driver_entry_v1(void) {
  return ufab_good_driver();
}
