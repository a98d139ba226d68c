#include "core/roce/gid.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstdio>

namespace ufab::roce {
namespace {

constexpr char kHex[] = "0123456789abcdef";

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

Gid gid_from_ipv4(uint32_t ip) {
  Gid g{};
  g[10] = 0xFF;
  g[11] = 0xFF;
  g[12] = static_cast<uint8_t>(ip >> 24);
  g[13] = static_cast<uint8_t>(ip >> 16);
  g[14] = static_cast<uint8_t>(ip >> 8);
  g[15] = static_cast<uint8_t>(ip);
  return g;
}

bool gid_is_ipv4_mapped(const Gid& g) {
  for (int i = 0; i < 10; ++i)
    if (g[i] != 0) return false;
  return g[10] == 0xFF && g[11] == 0xFF;
}

std::optional<uint32_t> ipv4_from_gid(const Gid& g) {
  if (!gid_is_ipv4_mapped(g)) return std::nullopt;
  return (uint32_t{g[12]} << 24) | (uint32_t{g[13]} << 16) | (uint32_t{g[14]} << 8) | uint32_t{g[15]};
}

std::string gid_to_wire_hex(const Gid& g) {
  std::string s(32, '0');
  for (size_t i = 0; i < g.size(); ++i) {
    s[2 * i] = kHex[g[i] >> 4];
    s[2 * i + 1] = kHex[g[i] & 0xF];
  }
  return s;
}

std::optional<Gid> gid_from_wire_hex(std::string_view t) {
  if (t.size() != 32) return std::nullopt;
  Gid g{};
  for (size_t i = 0; i < g.size(); ++i) {
    int hi = hex_value(t[2 * i]), lo = hex_value(t[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    g[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return g;
}

std::string gid_to_text(const Gid& g) {
  in6_addr a;
  static_assert(sizeof a == sizeof(Gid));
  std::copy(g.begin(), g.end(), reinterpret_cast<uint8_t*>(&a));
  char buf[INET6_ADDRSTRLEN];
  if (inet_ntop(AF_INET6, &a, buf, sizeof buf) == nullptr) return gid_to_colon_hex(g);
  return buf;
}

std::string gid_to_perftest_text(const Gid& g) {
  std::string s;
  for (size_t i = 0; i < g.size(); ++i) {
    char part[8];
    std::snprintf(part, sizeof part, "%s%02d", i ? ":" : "", g[i]);
    s += part;
  }
  return s;
}

std::string gid_to_colon_hex(const Gid& g) {
  std::string s;
  s.reserve(47);
  for (size_t i = 0; i < g.size(); ++i) {
    if (i) s += ':';
    s += kHex[g[i] >> 4];
    s += kHex[g[i] & 0xF];
  }
  return s;
}

std::optional<Gid> gid_from_colon_hex(std::string_view t) {
  if (t.size() != 47) return std::nullopt;
  Gid g{};
  for (size_t i = 0; i < g.size(); ++i) {
    size_t at = 3 * i;
    if (i && t[at - 1] != ':') return std::nullopt;
    int hi = hex_value(t[at]), lo = hex_value(t[at + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    g[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return g;
}

std::string ipv4_to_string(uint32_t ip) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%u.%u.%u.%u", ip >> 24, (ip >> 16) & 0xFF, (ip >> 8) & 0xFF, ip & 0xFF);
  return buf;
}

std::optional<uint32_t> ipv4_from_string(std::string_view t) {
  uint32_t ip = 0;
  size_t i = 0;
  for (int part = 0; part < 4; ++part) {
    if (part) {
      if (i >= t.size() || t[i] != '.') return std::nullopt;
      ++i;
    }
    size_t start = i;
    uint32_t v = 0;
    while (i < t.size() && t[i] >= '0' && t[i] <= '9' && i - start < 3) v = v * 10 + uint32_t(t[i++] - '0');
    if (i == start || v > 255) return std::nullopt;
    ip = ip << 8 | v;
  }
  if (i != t.size()) return std::nullopt;
  return ip;
}

}  // namespace ufab::roce
