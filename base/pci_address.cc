#include "base/pci_address.h"

#include <cctype>
#include <cstdio>

namespace ufab {
namespace {

bool parse_hex(const std::string& s, size_t pos, size_t len, unsigned& out) {
  if (pos + len > s.size()) return false;
  out = 0;
  for (size_t i = pos; i < pos + len; ++i) {
    if (!std::isxdigit(static_cast<unsigned char>(s[i]))) return false;
    out = out * 16 + static_cast<unsigned>(std::isdigit(static_cast<unsigned char>(s[i]))
                                               ? s[i] - '0'
                                               : std::tolower(static_cast<unsigned char>(s[i])) - 'a' + 10);
  }
  return true;
}

}  // namespace

Result<PciAddress> PciAddress::parse(const std::string& text) {
  std::string s = text.size() == 7 ? "0000:" + text : text;
  unsigned dom, bus, dev, fn;
  bool ok = s.size() == 12 && s[4] == ':' && s[7] == ':' && s[10] == '.' && parse_hex(s, 0, 4, dom) &&
            parse_hex(s, 5, 2, bus) && parse_hex(s, 8, 2, dev) && parse_hex(s, 11, 1, fn);
  if (!ok || dev > 31 || fn > 7) {
    return fail(EINVAL, "'" + text +
                            "' is not a PCI address: expected domain:bus:device.function in hex, "
                            "e.g. 0000:01:00.0 or 01:00.0 (device <= 1f, function <= 7); `ufab list` shows them");
  }
  return PciAddress{static_cast<uint16_t>(dom), static_cast<uint8_t>(bus), static_cast<uint8_t>(dev),
                    static_cast<uint8_t>(fn)};
}

std::string PciAddress::str() const {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%04x:%02x:%02x.%x", domain, bus, device, function);
  return buf;
}

}  // namespace ufab
