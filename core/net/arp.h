// ARP for Ethernet/IPv4 (RFC 826): what the user-space RoCEv2 stack needs
// to be reachable (answer requests for its addresses, as the kernel's rxe
// peer ARPs for us when its QP goes to RTR) and to reach peers (resolve
// their MACs). docs/arp.md describes the behaviour and the timing.
//
// Nothing here reads a clock or does I/O: frames come in as bytes, frames
// to send go out as return values, and time is a parameter, so behaviour is
// deterministic and testable. Not thread-safe: one instance per progress
// thread, or the caller's lock.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <expected>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "base/error.h"
#include "core/net/addresses.h"

namespace ufab::net {

inline constexpr uint16_t kEtherTypeArp = 0x0806;
inline constexpr uint16_t kEtherTypeIpv4 = 0x0800;
inline constexpr uint16_t kArpHardwareEthernet = 1;
inline constexpr size_t kEthernetHeaderSize = 14;
inline constexpr size_t kArpPayloadSize = 28;
inline constexpr size_t kArpFrameSize = kEthernetHeaderSize + kArpPayloadSize;  // 42
// Frames we build are padded with zeros to Ethernet's 60-byte minimum
// (64 with the FCS the NIC appends), so no NIC has to pad them.
inline constexpr size_t kMinEthernetFrameSize = 60;
using ArpFrame = std::array<uint8_t, kMinEthernetFrameSize>;

enum class ArpOp : uint16_t { kRequest = 1, kReply = 2 };

// An ARP frame, decoded. Only Ethernet/IPv4 ARP is representable.
struct ArpPacket {
  MacAddress eth_dst{};
  MacAddress eth_src{};
  ArpOp op = ArpOp::kRequest;
  MacAddress sender_mac{};
  Ipv4Address sender_ip;
  MacAddress target_mac{};
  Ipv4Address target_ip;

  friend bool operator==(const ArpPacket&, const ArpPacket&) = default;
};

// Why a frame is not a usable ARP packet. Checked in this order.
enum class ArpDrop : uint8_t {
  kTruncated,      // shorter than the 14-byte Ethernet header or the 42-byte ARP frame
  kNotArp,         // EtherType is not 0x0806 (VLAN-tagged frames included)
  kHardwareType,   // hardware type is not 1 (Ethernet)
  kProtocolType,   // protocol type is not 0x0800 (IPv4)
  kHardwareSize,   // hardware address length is not 6
  kProtocolSize,   // protocol address length is not 4
  kOperation,      // operation is neither 1 (request) nor 2 (reply)
  kBadSenderMac,   // sender MAC or Ethernet source is multicast, broadcast or zero
};
inline constexpr size_t kArpDropCount = 8;
const char* arp_drop_name(ArpDrop reason);  // "truncated", "not ARP", ...

// Decodes an Ethernet frame (no FCS). Bytes after the 42nd (padding) are
// ignored. Never reads outside `frame`.
std::expected<ArpPacket, ArpDrop> parse_arp(std::span<const uint8_t> frame);

// Encodes `p` into a zero-padded 60-byte frame.
ArpFrame build_arp_frame(const ArpPacket& p);

// "Who has `target`? Tell `our_ip`": broadcast, target MAC zero (as Linux
// sends them). With `unicast_to`, sent to that MAC instead: a probe that
// reconfirms a cached entry without bothering every host.
ArpFrame build_arp_request(const MacAddress& our_mac, Ipv4Address our_ip, Ipv4Address target,
                           std::optional<MacAddress> unicast_to = std::nullopt);

// The reply to `request` from the owner of request.target_ip: unicast to
// the requester. A probe (sender IP 0.0.0.0, RFC 5227) is answered to the
// prober's MAC with target IP 0.0.0.0, as Linux does.
ArpFrame build_arp_reply(const ArpPacket& request, const MacAddress& our_mac);

// Announces `ip` at `mac` to the link (RFC 5227 "ARP announcement"):
// broadcast, sender IP = target IP = ip. The request form is what Linux
// sends when an address comes up; the reply form is what some switches and
// older hosts expect. Either makes peers with a cache entry update it.
ArpFrame build_gratuitous_arp(const MacAddress& mac, Ipv4Address ip, ArpOp op = ArpOp::kRequest);

// ---------------------------------------------------------------- responder

struct ArpResponderStats {
  uint64_t answered = 0;           // requests for our addresses (reply returned)
  uint64_t not_for_us = 0;         // requests for other addresses
  uint64_t not_a_request = 0;      // replies: the resolver's business
  uint64_t wrong_destination = 0;  // Ethernet destination neither broadcast nor our MAC
  uint64_t own_frames = 0;         // our own frames looped back to us
  uint64_t conflicts = 0;          // another MAC uses one of our addresses as sender (not answered)
  std::array<uint64_t, kArpDropCount> malformed{};  // per ArpDrop

  uint64_t malformed_total() const;
};

// Answers ARP requests for our addresses.
class ArpResponder {
 public:
  // `mac` must be unicast; `addresses` non-empty, each unicast (not 0, not
  // broadcast, multicast or loopback). EINVAL otherwise.
  static Result<ArpResponder> create(const MacAddress& mac, std::vector<Ipv4Address> addresses);

  // The reply to send, when `frame` asks for one of our addresses; nullopt
  // for everything else (counted in stats()).
  std::optional<ArpFrame> on_frame(std::span<const uint8_t> frame);
  std::optional<ArpFrame> on_packet(const ArpPacket& p);

  bool owns(Ipv4Address ip) const;
  const MacAddress& mac() const { return mac_; }
  const std::vector<Ipv4Address>& addresses() const { return addresses_; }
  const ArpResponderStats& stats() const { return stats_; }

 private:
  ArpResponder(const MacAddress& mac, std::vector<Ipv4Address> addresses)
      : mac_(mac), addresses_(std::move(addresses)) {}

  MacAddress mac_;
  std::vector<Ipv4Address> addresses_;
  ArpResponderStats stats_;
};

// ----------------------------------------------------------------- resolver

using ArpClock = std::chrono::steady_clock;
using ArpTime = ArpClock::time_point;

struct ArpResolverOptions {
  // How long a reply keeps an entry reachable (Linux: base_reachable_time,
  // 30 s). After that the entry is stale: still used, but reconfirmed.
  std::chrono::milliseconds reachable_time{30'000};
  // Time between requests for one address (Linux: retrans_time, 1 s).
  std::chrono::milliseconds retry_interval{1'000};
  // Requests before giving up (Linux: mcast_solicit / ucast_solicit, 3).
  uint32_t max_requests = 3;
  // Most cached addresses; least recently used go first.
  size_t capacity = 256;
};

enum class NeighborState : uint8_t {
  kIncomplete,  // requests sent, no answer yet: no MAC
  kReachable,   // confirmed by a reply within reachable_time
  kStale,       // MAC known but unconfirmed (old, or learned from a request): used while reconfirming
};
const char* neighbor_state_name(NeighborState s);

struct NeighborEntry {
  Ipv4Address ip;
  MacAddress mac{};          // meaningful unless kIncomplete
  NeighborState state = NeighborState::kIncomplete;
  ArpTime updated{};         // last time an ARP packet set the MAC
  ArpTime first_request{};   // first request of the current round
  ArpTime last_request{};
  uint32_t requests = 0;     // requests sent in the current round
  bool used = false;         // resolve() asked for it at least once
};

// What resolve() says now.
struct Resolution {
  std::optional<MacAddress> mac;    // send to this MAC; empty: pending, queue or retry later
  std::optional<ArpFrame> request;  // a request to transmit now, when set

  bool ready() const { return mac.has_value(); }
};

// What an incoming ARP frame changed.
struct ArpEvents {
  std::vector<Ipv4Address> resolved;  // were pending, now have a MAC: wake their waiters
  std::vector<Ipv4Address> changed;   // had a MAC, now have another (peer moved or replaced its NIC)
};

struct ArpResolverStats {
  uint64_t requests_sent = 0;
  uint64_t failures = 0;          // resolutions given up after max_requests
  uint64_t learned = 0;           // entries created from requests addressed to us
  uint64_t learn_skipped = 0;     // ... not created: cache full of entries in use
  uint64_t updates = 0;           // entries updated by replies and other ARP traffic
  uint64_t evictions = 0;
  uint64_t ignored = 0;           // frames that taught nothing (malformed, own, unrelated)
};

// An IPv4 -> MAC cache with Linux-like states and retries.
class ArpResolver {
 public:
  // `mac` is ours; `addresses` are ours (requests for them teach us the
  // requester's MAC; the first is the sender IP of our requests).
  static Result<ArpResolver> create(const MacAddress& mac, std::vector<Ipv4Address> addresses,
                                    ArpResolverOptions options = {});

  // The MAC of `ip`, or pending plus, when one is due, a request frame to
  // transmit. Fails when `ip` cannot be resolved at all (not unicast, or
  // our own) or when max_requests went unanswered (EHOSTUNREACH; the entry
  // is dropped, so a later call starts a new round).
  Result<Resolution> resolve(Ipv4Address ip, ArpTime now);

  // Learns from any ARP frame (replies, requests for us, updates of cached
  // addresses). Non-ARP and malformed frames are ignored.
  ArpEvents on_frame(std::span<const uint8_t> frame, ArpTime now);
  ArpEvents on_packet(const ArpPacket& p, ArpTime now);

  // The entry for `ip`, without touching its LRU position or state.
  std::optional<NeighborEntry> lookup(Ipv4Address ip) const;
  void forget(Ipv4Address ip);
  size_t size() const { return map_.size(); }
  const ArpResolverStats& stats() const { return stats_; }
  const ArpResolverOptions& options() const { return options_; }

 private:
  using Lru = std::list<NeighborEntry>;  // front: most recently used

  ArpResolver(const MacAddress& mac, std::vector<Ipv4Address> addresses, ArpResolverOptions options)
      : mac_(mac), addresses_(std::move(addresses)), options_(options) {}

  bool is_ours(Ipv4Address ip) const;
  Lru::iterator insert(NeighborEntry e, bool front);
  bool make_room(bool only_unused);
  ArpFrame request_for(const NeighborEntry& e) const;
  Error give_up(Lru::iterator it, ArpTime now);

  MacAddress mac_;
  std::vector<Ipv4Address> addresses_;
  ArpResolverOptions options_;
  Lru lru_;
  std::unordered_map<Ipv4Address, Lru::iterator> map_;
  ArpResolverStats stats_;
};

}  // namespace ufab::net
