// The one symbol libufab_e1000e.so exports (everything else is hidden by
// -fvisibility=hidden and exports.lds).
#include "drivers/e1000e/e1000e.h"

extern "C" __attribute__((visibility("default"))) const ufab_driver* ufab_driver_entry_v1() {
  return ufab_e1000e_driver();
}
