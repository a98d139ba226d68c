#include "core/pci/host.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <bit>
#include <cstring>
#include <sstream>

#include "base/files.h"

namespace ufab::pci {
namespace {

// Route flags from <linux/route.h> and <linux/ipv6_route.h>.
constexpr unsigned kRouteUp = 0x0001;
constexpr unsigned kRouteReject = 0x0200;
// IPv6 local-table entry for one of the host's own addresses: it repeats
// the address, which is listed anyway.
constexpr unsigned long long kRouteLocal = 0x80000000;

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!trim(line).empty()) lines.push_back(line);
  }
  return lines;
}

std::vector<std::string> split_fields(const std::string& line) {
  std::vector<std::string> fields;
  std::istringstream in(line);
  for (std::string f; in >> f;) fields.push_back(f);
  return fields;
}

std::string ipv4_text(uint32_t as_stored) {
  // /proc/net/route prints the in-memory (network order) word with %08X, so
  // the parsed integer already has the bytes in the order inet_ntop wants.
  in_addr addr{};
  addr.s_addr = as_stored;
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &addr, buf, sizeof buf);
  return buf;
}

std::optional<in6_addr> parse_ipv6_hex(const std::string& hex) {
  if (hex.size() != 32) return std::nullopt;
  in6_addr addr{};
  for (size_t i = 0; i < 16; ++i) {
    auto byte = parse_uint(hex.substr(2 * i, 2), 16);
    if (!byte) return std::nullopt;
    addr.s6_addr[i] = static_cast<uint8_t>(*byte);
  }
  return addr;
}

std::string ipv6_text(const in6_addr& addr) {
  char buf[INET6_ADDRSTRLEN];
  inet_ntop(AF_INET6, &addr, buf, sizeof buf);
  return buf;
}

bool is_ipv6_link_local(const in6_addr& a) { return a.s6_addr[0] == 0xfe && (a.s6_addr[1] & 0xc0) == 0x80; }
bool is_ipv6_multicast(const in6_addr& a) { return a.s6_addr[0] == 0xff; }

unsigned prefix_from_mask(const sockaddr* mask) {
  if (!mask) return 0;
  unsigned bits = 0;
  if (mask->sa_family == AF_INET) {
    bits = static_cast<unsigned>(std::popcount(reinterpret_cast<const sockaddr_in*>(mask)->sin_addr.s_addr));
  } else if (mask->sa_family == AF_INET6) {
    for (uint8_t byte : reinterpret_cast<const sockaddr_in6*>(mask)->sin6_addr.s6_addr) {
      bits += static_cast<unsigned>(std::popcount(byte));
    }
  }
  return bits;
}

}  // namespace

std::string InterfaceAddress::str() const { return address + "/" + std::to_string(prefix_length); }

std::string Route::str() const {
  std::string text = is_default() ? "default" : destination + "/" + std::to_string(prefix_length);
  if (!gateway.empty()) text += " via " + gateway;
  return text;
}

Result<std::vector<Route>> parse_ipv4_routes(const std::string& proc_net_route) {
  std::vector<Route> routes;
  auto lines = split_lines(proc_net_route);
  for (size_t i = 1; i < lines.size(); ++i) {  // line 0 is the column header
    auto f = split_fields(lines[i]);
    // Iface Destination Gateway Flags RefCnt Use Metric Mask ...
    auto destination = f.size() >= 8 ? parse_uint(f[1], 16) : std::nullopt;
    auto gateway = f.size() >= 8 ? parse_uint(f[2], 16) : std::nullopt;
    auto flags = f.size() >= 8 ? parse_uint(f[3], 16) : std::nullopt;
    auto mask = f.size() >= 8 ? parse_uint(f[7], 16) : std::nullopt;
    if (!destination || !gateway || !flags || !mask) {
      return fail(EINVAL, "cannot parse line " + std::to_string(i + 1) + " of /proc/net/route: '" + lines[i] + "'");
    }
    if (!(*flags & kRouteUp) || (*flags & kRouteReject) || f[0] == "lo") continue;
    Route r;
    r.interface = f[0];
    r.destination = ipv4_text(static_cast<uint32_t>(*destination));
    r.prefix_length = static_cast<unsigned>(std::popcount(static_cast<uint32_t>(*mask)));
    if (*gateway != 0) r.gateway = ipv4_text(static_cast<uint32_t>(*gateway));
    routes.push_back(r);
  }
  return routes;
}

Result<std::vector<Route>> parse_ipv6_routes(const std::string& proc_net_ipv6_route) {
  std::vector<Route> routes;
  auto lines = split_lines(proc_net_ipv6_route);
  for (size_t i = 0; i < lines.size(); ++i) {  // no header line in this file
    auto f = split_fields(lines[i]);
    // dest dest_plen src src_plen next_hop metric refcnt use flags device
    auto destination = f.size() >= 10 ? parse_ipv6_hex(f[0]) : std::nullopt;
    auto prefix = f.size() >= 10 ? parse_uint(f[1], 16) : std::nullopt;
    auto next_hop = f.size() >= 10 ? parse_ipv6_hex(f[4]) : std::nullopt;
    auto flags = f.size() >= 10 ? parse_uint(f[8], 16) : std::nullopt;
    if (!destination || !prefix || !next_hop || !flags || *prefix > 128) {
      return fail(EINVAL,
                  "cannot parse line " + std::to_string(i + 1) + " of /proc/net/ipv6_route: '" + lines[i] + "'");
    }
    if (!(*flags & kRouteUp) || (*flags & kRouteReject) || (*flags & kRouteLocal) || f[9] == "lo") continue;
    if (is_ipv6_link_local(*destination) || is_ipv6_multicast(*destination)) continue;
    Route r;
    r.interface = f[9];
    r.destination = ipv6_text(*destination);
    r.prefix_length = static_cast<unsigned>(*prefix);
    r.ipv6 = true;
    static const in6_addr kAny{};
    if (std::memcmp(&*next_hop, &kAny, sizeof kAny) != 0) r.gateway = ipv6_text(*next_hop);
    routes.push_back(r);
  }
  return routes;
}

Result<HostNetworkState> read_host_network(const HostPaths& paths) {
  HostNetworkState state;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return fail_errno("cannot list the host's interface addresses (getifaddrs)");
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr || !a->ifa_name) continue;
    InterfaceAddress entry;
    entry.interface = a->ifa_name;
    char buf[INET6_ADDRSTRLEN];
    if (a->ifa_addr->sa_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, buf, sizeof buf);
    } else if (a->ifa_addr->sa_family == AF_INET6) {
      const in6_addr& addr = reinterpret_cast<sockaddr_in6*>(a->ifa_addr)->sin6_addr;
      inet_ntop(AF_INET6, &addr, buf, sizeof buf);
      entry.ipv6 = true;
      entry.link_local = is_ipv6_link_local(addr);
    } else {
      continue;
    }
    entry.address = buf;
    entry.prefix_length = prefix_from_mask(a->ifa_netmask);
    state.addresses.push_back(entry);
  }
  ::freeifaddrs(list);

  std::string route_file = paths.proc + "/net/route";
  auto v4 = read_file(route_file);
  if (!v4) return std::unexpected(v4.error().context("reading the host's IPv4 routes"));
  auto v4_routes = parse_ipv4_routes(*v4);
  if (!v4_routes) return std::unexpected(v4_routes.error());
  state.routes = *v4_routes;
  // Absent when IPv6 is disabled: then there are simply no IPv6 routes.
  std::string route6_file = paths.proc + "/net/ipv6_route";
  if (path_exists(route6_file)) {
    auto v6 = read_file(route6_file);
    if (!v6) return std::unexpected(v6.error().context("reading the host's IPv6 routes"));
    auto v6_routes = parse_ipv6_routes(*v6);
    if (!v6_routes) return std::unexpected(v6_routes.error());
    state.routes.insert(state.routes.end(), v6_routes->begin(), v6_routes->end());
  }
  return state;
}

Result<MemlockLimit> read_memlock_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_MEMLOCK, &limit) != 0) return fail_errno("getrlimit(RLIMIT_MEMLOCK)");
  auto convert = [](rlim_t v) { return v == RLIM_INFINITY ? MemlockLimit::kUnlimited : static_cast<uint64_t>(v); };
  return MemlockLimit{convert(limit.rlim_cur), convert(limit.rlim_max)};
}

bool effective_access(const std::string& path, int mode) {
  return ::faccessat(AT_FDCWD, path.c_str(), mode, AT_EACCESS) == 0;
}

Status Host::write_sysfs_file(const std::string& path, const std::string& data) { return write_file(path, data); }

}  // namespace ufab::pci
