// A plugin whose entry point returns no table.
#include "abi/raw_frame.h"

extern "C" __attribute__((visibility("default"))) const ufab_driver* ufab_driver_entry_v1(void) { return nullptr; }
