#include "vfio/text.h"

#include <cstdio>

namespace ufab::vfio {

std::string hex(uint64_t value) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(value));
  return buf;
}

std::string bytes(uint64_t value) {
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (value < 1024) return std::to_string(value) + (value == 1 ? " byte" : " bytes");
  int unit = -1;
  uint64_t scaled = value;
  uint64_t divisor = 1;
  while (scaled >= 1024 && unit < 5) {
    scaled /= 1024;
    divisor *= 1024;
    ++unit;
  }
  if (value % divisor == 0) return std::to_string(scaled) + " " + kUnits[unit];
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.1f %s", static_cast<double>(value) / static_cast<double>(divisor),
                kUnits[unit]);
  return buf;
}

}  // namespace ufab::vfio
