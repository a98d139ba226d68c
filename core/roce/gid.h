// GIDs for RoCEv2 over IPv4 and the ways the peer tools print and exchange
// them.
//
// A RoCEv2 GID for an IPv4 address is the IPv4-mapped IPv6 address
// ::ffff:a.b.c.d (rxe fills its GID table this way, one entry per address
// of the netdev). The tools ufab talks to write GIDs three ways:
//   - ibv_rc_pingpong (libibverbs/examples/pingpong.c gid_to_wire_gid): 32
//     lowercase hex digits, the 16 bytes in network order, inside its
//     "%04x:%06x:%06x:%s" message; on screen it prints inet_ntop's text.
//   - perftest on screen (GID_FMT): the 16 bytes as %02d (decimal, zero
//     padded to two digits) joined by ':'.
//   - perftest in its key exchange: the 16 bytes as %02x, each followed by ':'.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ufab::roce {

using Gid = std::array<uint8_t, 16>;

// ::ffff:a.b.c.d for `ip` in host order (10.0.0.1 is 0x0A000001).
Gid gid_from_ipv4(uint32_t ip);
bool gid_is_ipv4_mapped(const Gid& gid);
// The IPv4 address of an IPv4-mapped GID; nullopt for any other GID.
std::optional<uint32_t> ipv4_from_gid(const Gid& gid);

// rc_pingpong's wire form: 32 lowercase hex digits.
std::string gid_to_wire_hex(const Gid& gid);
// Reads exactly 32 hex digits (either case); nullopt otherwise.
std::optional<Gid> gid_from_wire_hex(std::string_view text);

// inet_ntop(AF_INET6) text, as rc_pingpong prints it: "::ffff:10.0.0.1".
std::string gid_to_text(const Gid& gid);

// perftest's screen form: "00:00:00:00:00:00:00:00:00:00:255:255:10:00:00:01".
std::string gid_to_perftest_text(const Gid& gid);

// perftest's key-exchange form without the final ':':
// "00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:01".
std::string gid_to_colon_hex(const Gid& gid);
// Reads 16 two-digit hex groups separated by ':' (either case).
std::optional<Gid> gid_from_colon_hex(std::string_view text);

// Dotted-quad text for a host-order IPv4 address, and back (strict: four
// decimal parts 0..255, no leading '+', no spaces).
std::string ipv4_to_string(uint32_t ip);
std::optional<uint32_t> ipv4_from_string(std::string_view text);

}  // namespace ufab::roce
