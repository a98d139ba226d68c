#include "base/hex.h"

namespace ufab {

std::string hex_digits(uint64_t value, int digits) {
  char buf[16];
  int n = 0;
  do {
    buf[n++] = "0123456789abcdef"[value & 0xf];
    value >>= 4;
  } while (value != 0);
  std::string out;
  if (digits > n) out.assign(static_cast<size_t>(digits - n), '0');
  while (n > 0) out += buf[--n];
  return out;
}

std::string hex(uint64_t value) { return "0x" + hex_digits(value, 1); }

std::string hex(uint64_t value, int digits) { return "0x" + hex_digits(value, digits); }

}  // namespace ufab
