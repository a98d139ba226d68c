// Link and network addresses as the software transport uses them: Ethernet
// MACs and IPv4 addresses (RoCEv2 GIDs are IPv4-mapped IPv6, ::ffff:a.b.c.d).
#pragma once

#include <array>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "base/error.h"

namespace ufab::net {

// Same shape as core::MacAddress (mac_probe.h): six bytes in wire order.
using MacAddress = std::array<uint8_t, 6>;

inline constexpr MacAddress kBroadcastMac{0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
inline constexpr MacAddress kZeroMac{};

// Group bit set: multicast, including broadcast.
inline bool is_multicast(const MacAddress& mac) { return (mac[0] & 1) != 0; }
inline bool is_zero(const MacAddress& mac) { return mac == kZeroMac; }
// A MAC a host can have: not multicast/broadcast, not all zero.
inline bool is_unicast(const MacAddress& mac) { return !is_multicast(mac) && !is_zero(mac); }

std::string format_mac(const MacAddress& mac);  // "52:54:00:12:34:56"
// "52:54:00:12:34:56" (also '-' separated); EINVAL with an example otherwise.
Result<MacAddress> parse_mac(std::string_view text);

// An IPv4 address held as a number in host order: 10.0.0.2 is 0x0A000002.
struct Ipv4Address {
  uint32_t value = 0;

  static constexpr Ipv4Address of(uint8_t a, uint8_t b, uint8_t c, uint8_t d) {
    return Ipv4Address{uint32_t{a} << 24 | uint32_t{b} << 16 | uint32_t{c} << 8 | uint32_t{d}};
  }
  // Dotted quad, each part 0-255 in decimal without leading zeros (as
  // inet_pton), no signs or spaces; EINVAL otherwise.
  static Result<Ipv4Address> parse(std::string_view text);
  std::string str() const;  // "10.0.0.2"

  bool is_zero() const { return value == 0; }
  bool is_broadcast() const { return value == 0xFFFFFFFFu; }
  bool is_multicast() const { return (value >> 28) == 0xE; }  // 224.0.0.0/4
  bool is_loopback() const { return (value >> 24) == 127; }
  // An address one may ARP for or answer ARP for: none of the above.
  bool is_unicast() const { return !is_zero() && !is_broadcast() && !is_multicast() && !is_loopback(); }

  friend auto operator<=>(Ipv4Address, Ipv4Address) = default;
};

}  // namespace ufab::net

template <>
struct std::hash<ufab::net::Ipv4Address> {
  size_t operator()(ufab::net::Ipv4Address a) const noexcept { return std::hash<uint32_t>{}(a.value); }
};
