// Number formatting for error messages (gcc 12 has no <format>).
#pragma once

#include <cstdint>
#include <string>

namespace ufab::vfio {

// "0x1f000"
std::string hex(uint64_t value);
// "2 MiB", "1.5 GiB", "64 KiB", "100 bytes": exact units where possible, one
// decimal otherwise, so a limit in an error reads the way an operator types it.
std::string bytes(uint64_t value);

}  // namespace ufab::vfio
