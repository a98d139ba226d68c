// The host as ufab's PCI code sees it: where sysfs/procfs/devfs live, and
// the few side effects and probes (sysfs writes, permission checks, network
// state, memlock limit) that unit tests replace to run on a fake tree.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/error.h"

namespace ufab::pci {

struct HostPaths {
  std::string sysfs = "/sys";
  std::string proc = "/proc";
  std::string dev = "/dev";
  // Where bind records the driver a device had, so unbind can restore it.
  std::string state_dir = "/run/ufab";
  // pci.ids for vendor/device/class names; empty = libpci's built-in default.
  std::string pci_ids;
};

// One IP address configured on an interface.
struct InterfaceAddress {
  std::string interface;
  std::string address;  // "192.0.2.2", "fd00::2"
  unsigned prefix_length = 0;
  bool ipv6 = false;
  // fe80::/10: the kernel adds one to every interface that comes up, so it
  // says nothing about the interface carrying traffic.
  bool link_local = false;

  std::string str() const;  // "192.0.2.2/24"
};

// One route that leaves through an interface (link-local and multicast IPv6
// routes, which every up interface has, are not listed).
struct Route {
  std::string interface;
  std::string destination;  // "0.0.0.0", "192.0.2.0", "fd00::"
  unsigned prefix_length = 0;
  std::string gateway;  // empty when directly connected
  bool ipv6 = false;

  bool is_default() const { return prefix_length == 0; }
  std::string str() const;  // "default via 192.0.2.1", "192.0.2.0/24"
};

struct HostNetworkState {
  std::vector<InterfaceAddress> addresses;
  std::vector<Route> routes;
};

// getrlimit(RLIMIT_MEMLOCK); kUnlimited for RLIM_INFINITY.
struct MemlockLimit {
  static constexpr uint64_t kUnlimited = UINT64_MAX;
  uint64_t soft = 0;
  uint64_t hard = 0;
};

// Default probes, used by a default-constructed Host.
Result<HostNetworkState> read_host_network(const HostPaths& paths);
Result<MemlockLimit> read_memlock_limit();
// faccessat(AT_EACCESS): may this process (by its effective ids) access path?
bool effective_access(const std::string& path, int mode);

// Parsers of /proc/net/route and /proc/net/ipv6_route. Routes that are not
// up, reject routes, routes through "lo", IPv6 local-table entries (the
// host's own addresses) and IPv6 link-local/multicast destinations are left
// out. A line that does not parse is an error naming it.
Result<std::vector<Route>> parse_ipv4_routes(const std::string& proc_net_route);
Result<std::vector<Route>> parse_ipv6_routes(const std::string& proc_net_ipv6_route);

struct Host {
  HostPaths paths;
  // Every store into sysfs goes through here (default: one write(2)).
  std::function<Status(const std::string& path, const std::string& data)> write_sysfs = write_sysfs_file;
  // access(2)-style check with R_OK/W_OK bits.
  std::function<bool(const std::string& path, int mode)> can_access = effective_access;
  std::function<uid_t()> effective_uid = [] { return ::geteuid(); };
  std::function<Result<HostNetworkState>(const HostPaths&)> network_state = read_host_network;
  std::function<Result<MemlockLimit>()> memlock_limit = read_memlock_limit;

 private:
  static Status write_sysfs_file(const std::string& path, const std::string& data);
};

}  // namespace ufab::pci
