// The one symbol libufab_swnic.so exports (see swnic.lds).
#include "drivers/swnic/swnic.h"

extern "C" __attribute__((visibility("default"))) const ufab_driver* ufab_driver_entry_v1() {
  return ufab_swnic_driver();
}
