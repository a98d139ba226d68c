// A plugin that claims ABI major 2 from the 1.x entry symbol: the loader
// must refuse it after reading only the version fields.
#include "abi/raw_frame.h"

namespace {
ufab_driver make() {
  ufab_driver d{};
  d.abi_major = 2;
  d.abi_minor = 0;
  d.size = sizeof(ufab_driver);
  d.name = "abi2";
  return d;
}
const ufab_driver kDriver = make();
}  // namespace

extern "C" __attribute__((visibility("default"))) const ufab_driver* ufab_driver_entry_v1(void) { return &kDriver; }
