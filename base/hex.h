// Hexadecimal text for messages, tables and attributes: ufab's one hex
// formatter (gcc 12 has no <format>).
#pragma once

#include <cstdint>
#include <string>

namespace ufab {

// "0x1a2b": lowercase, no leading zeros ("0x0" for zero).
std::string hex(uint64_t value);
// "0x001a2b" for hex(0x1a2b, 6): zero-padded to at least `digits` digits.
std::string hex(uint64_t value, int digits);
// "001a2b" for hex_digits(0x1a2b, 6): the digits alone, zero-padded to at
// least `digits`, for where the prefix is implied (PCI ids "8086:10d3",
// JSON fields, tables).
std::string hex_digits(uint64_t value, int digits);

}  // namespace ufab
