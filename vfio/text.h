// Number formatting for error messages (gcc 12 has no <format>). Hex is
// base/hex.h's ufab::hex, which code in ufab::vfio finds unqualified.
#pragma once

#include <cstdint>
#include <string>

#include "base/hex.h"

namespace ufab::vfio {

// "2 MiB", "1.5 GiB", "64 KiB", "100 bytes": exact units where possible, one
// decimal otherwise, so a limit in an error reads the way an operator types it.
std::string bytes(uint64_t value);

}  // namespace ufab::vfio
