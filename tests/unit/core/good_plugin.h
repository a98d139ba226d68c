// The "good" test plugin, laid out the way a real plugin is (see
// docs/plugin-guide.md): this header declares the driver function a program
// calls to link the plugin in statically; good_entry.cc exports the same
// table from the shared library.
#pragma once

#include "abi/raw_frame.h"

const ufab_driver* ufab_good_driver();
