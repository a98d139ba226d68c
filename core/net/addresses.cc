#include "core/net/addresses.h"

#include <cstdio>

namespace ufab::net {

namespace {

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string format_mac(const MacAddress& mac) {
  char buf[18];
  std::snprintf(buf, sizeof(buf), "%02x:%02x:%02x:%02x:%02x:%02x", mac[0], mac[1], mac[2], mac[3], mac[4], mac[5]);
  return buf;
}

Result<MacAddress> parse_mac(std::string_view text) {
  auto bad = [&] {
    return fail(EINVAL, "'" + std::string(text) + "' is not a MAC address (e.g. 52:54:00:12:34:56)");
  };
  // Exactly 6 groups of 2 hex digits with one separator kind between them.
  if (text.size() != 17) return bad();
  char sep = text[2];
  if (sep != ':' && sep != '-') return bad();
  MacAddress mac{};
  for (size_t i = 0; i < 6; ++i) {
    int hi = hex_digit(text[i * 3]);
    int lo = hex_digit(text[i * 3 + 1]);
    if (hi < 0 || lo < 0) return bad();
    if (i < 5 && text[i * 3 + 2] != sep) return bad();
    mac[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return mac;
}

Result<Ipv4Address> Ipv4Address::parse(std::string_view text) {
  auto bad = [&] { return fail(EINVAL, "'" + std::string(text) + "' is not an IPv4 address (e.g. 10.0.0.2)"); };
  uint32_t value = 0;
  size_t pos = 0;
  for (int part = 0; part < 4; ++part) {
    if (part > 0) {
      if (pos >= text.size() || text[pos] != '.') return bad();
      ++pos;
    }
    size_t begin = pos;
    uint32_t n = 0;
    while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9' && pos - begin < 3) {
      n = n * 10 + static_cast<uint32_t>(text[pos] - '0');
      ++pos;
    }
    // Leading zeros are refused (as inet_pton does): inet_aton would read
    // "010" as octal 8, so the text is ambiguous.
    if (pos == begin || n > 255 || (pos - begin > 1 && text[begin] == '0')) return bad();
    value = value << 8 | n;
  }
  if (pos != text.size()) return bad();
  return Ipv4Address{value};
}

std::string Ipv4Address::str() const {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%u.%u.%u.%u", value >> 24, (value >> 16) & 0xFF, (value >> 8) & 0xFF,
                value & 0xFF);
  return buf;
}

}  // namespace ufab::net
