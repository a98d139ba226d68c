// PCI addresses in the kernel's canonical form "dddd:bb:dd.f".
#pragma once

#include <compare>
#include <cstdint>
#include <string>

#include "base/error.h"

namespace ufab {

struct PciAddress {
  uint16_t domain = 0;
  uint8_t bus = 0;
  uint8_t device = 0;    // 0..31
  uint8_t function = 0;  // 0..7

  // Accepts "0000:01:00.0" and the short "01:00.0" (domain 0). Hex digits,
  // either case. Anything else is an error that shows the expected form.
  static Result<PciAddress> parse(const std::string& text);
  // Canonical lower-case "0000:01:00.0", as sysfs names devices.
  std::string str() const;
  auto operator<=>(const PciAddress&) const = default;
};

}  // namespace ufab
