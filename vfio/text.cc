#include "vfio/text.h"

#include <cstdio>

namespace ufab::vfio {

std::string bytes(uint64_t value) {
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (value < 1024) return std::to_string(value) + (value == 1 ? " byte" : " bytes");
  int unit = -1;
  uint64_t divisor = 1;
  while (value / divisor >= 1024 && unit < 5) {
    divisor *= 1024;
    ++unit;
  }
  if (value % divisor == 0) return std::to_string(value / divisor) + " " + kUnits[unit];
  char buf[48];
  // One decimal when that is exact (1.5 MiB); otherwise the next smaller unit
  // when that is exact (2 MiB + 20 KiB reads "2068 KiB", not a rounded
  // "2.0 MiB"); otherwise two decimals, marked approximate.
  if ((value % divisor) * 10 % divisor == 0) {
    std::snprintf(buf, sizeof buf, "%.1f %s", static_cast<double>(value) / static_cast<double>(divisor), kUnits[unit]);
    return buf;
  }
  uint64_t smaller = divisor / 1024;
  if (value % smaller == 0)
    return std::to_string(value / smaller) + " " + (unit == 0 ? "bytes" : kUnits[unit - 1]);
  std::snprintf(buf, sizeof buf, "~%.2f %s", static_cast<double>(value) / static_cast<double>(divisor), kUnits[unit]);
  return buf;
}

}  // namespace ufab::vfio
