#include "core/net/arp.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace ufab::net {

namespace {

uint16_t load16(const uint8_t* p) { return static_cast<uint16_t>(p[0] << 8 | p[1]); }

uint32_t load32(const uint8_t* p) {
  return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | uint32_t{p[3]};
}

void store16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v >> 8);
  p[1] = static_cast<uint8_t>(v);
}

void store32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (24 - 8 * i));
}

MacAddress load_mac(const uint8_t* p) {
  MacAddress m;
  std::memcpy(m.data(), p, m.size());
  return m;
}

// Frame layout offsets.
constexpr size_t kOffEthDst = 0;
constexpr size_t kOffEthSrc = 6;
constexpr size_t kOffEtherType = 12;
constexpr size_t kOffHwType = 14;
constexpr size_t kOffProtoType = 16;
constexpr size_t kOffHwSize = 18;
constexpr size_t kOffProtoSize = 19;
constexpr size_t kOffOp = 20;
constexpr size_t kOffSenderMac = 22;
constexpr size_t kOffSenderIp = 28;
constexpr size_t kOffTargetMac = 32;
constexpr size_t kOffTargetIp = 38;

// Non-negative time since `since` (0 if the caller's clock went backwards).
std::chrono::nanoseconds since(ArpTime now, ArpTime earlier) {
  return now > earlier ? now - earlier : std::chrono::nanoseconds(0);
}

// "3 s", "1.5 s", "250 ms".
std::string human(std::chrono::nanoseconds d) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
  char buf[48];
  if (ms < 1000) {
    std::snprintf(buf, sizeof(buf), "%lld ms", static_cast<long long>(ms));
  } else if (ms % 1000 == 0) {
    std::snprintf(buf, sizeof(buf), "%lld s", static_cast<long long>(ms / 1000));
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f s", static_cast<double>(ms) / 1000.0);
  }
  return buf;
}

Status check_config(const MacAddress& mac, const std::vector<Ipv4Address>& addresses, const char* who) {
  if (!is_unicast(mac)) {
    return fail(EINVAL, std::string(who) + ": MAC " + format_mac(mac) +
                            " is not a unicast address: use the NIC's own MAC");
  }
  if (addresses.empty()) {
    return fail(EINVAL, std::string(who) + ": no IPv4 address given: configure at least one local address");
  }
  for (Ipv4Address a : addresses) {
    if (!a.is_unicast()) {
      return fail(EINVAL, std::string(who) + ": " + a.str() +
                              " cannot be a host address (zero, broadcast, multicast or loopback)");
    }
  }
  return {};
}

}  // namespace

const char* arp_drop_name(ArpDrop reason) {
  switch (reason) {
    case ArpDrop::kTruncated: return "truncated";
    case ArpDrop::kNotArp: return "not ARP";
    case ArpDrop::kHardwareType: return "hardware type not Ethernet";
    case ArpDrop::kProtocolType: return "protocol type not IPv4";
    case ArpDrop::kHardwareSize: return "hardware address length not 6";
    case ArpDrop::kProtocolSize: return "protocol address length not 4";
    case ArpDrop::kOperation: return "operation neither request nor reply";
    case ArpDrop::kBadSenderMac: return "sender MAC multicast or zero";
  }
  return "unknown";
}

std::expected<ArpPacket, ArpDrop> parse_arp(std::span<const uint8_t> frame) {
  // EtherType before the full length: a short frame of another protocol is
  // "not ARP", which is the counter an operator expects it in.
  if (frame.size() < kEthernetHeaderSize) return std::unexpected(ArpDrop::kTruncated);
  const uint8_t* f = frame.data();
  if (load16(f + kOffEtherType) != kEtherTypeArp) return std::unexpected(ArpDrop::kNotArp);
  if (frame.size() < kArpFrameSize) return std::unexpected(ArpDrop::kTruncated);
  if (load16(f + kOffHwType) != kArpHardwareEthernet) return std::unexpected(ArpDrop::kHardwareType);
  if (load16(f + kOffProtoType) != kEtherTypeIpv4) return std::unexpected(ArpDrop::kProtocolType);
  if (f[kOffHwSize] != 6) return std::unexpected(ArpDrop::kHardwareSize);
  if (f[kOffProtoSize] != 4) return std::unexpected(ArpDrop::kProtocolSize);
  uint16_t op = load16(f + kOffOp);
  if (op != static_cast<uint16_t>(ArpOp::kRequest) && op != static_cast<uint16_t>(ArpOp::kReply)) {
    return std::unexpected(ArpDrop::kOperation);
  }
  ArpPacket p;
  p.eth_dst = load_mac(f + kOffEthDst);
  p.eth_src = load_mac(f + kOffEthSrc);
  p.op = static_cast<ArpOp>(op);
  p.sender_mac = load_mac(f + kOffSenderMac);
  p.sender_ip = Ipv4Address{load32(f + kOffSenderIp)};
  p.target_mac = load_mac(f + kOffTargetMac);
  p.target_ip = Ipv4Address{load32(f + kOffTargetIp)};
  // Nobody can own a group or zero MAC: answering or caching one would
  // turn a single forged frame into a broadcast storm or a black hole.
  if (!is_unicast(p.sender_mac) || !is_unicast(p.eth_src)) return std::unexpected(ArpDrop::kBadSenderMac);
  return p;
}

ArpFrame build_arp_frame(const ArpPacket& p) {
  ArpFrame f{};
  std::memcpy(f.data() + kOffEthDst, p.eth_dst.data(), 6);
  std::memcpy(f.data() + kOffEthSrc, p.eth_src.data(), 6);
  store16(f.data() + kOffEtherType, kEtherTypeArp);
  store16(f.data() + kOffHwType, kArpHardwareEthernet);
  store16(f.data() + kOffProtoType, kEtherTypeIpv4);
  f[kOffHwSize] = 6;
  f[kOffProtoSize] = 4;
  store16(f.data() + kOffOp, static_cast<uint16_t>(p.op));
  std::memcpy(f.data() + kOffSenderMac, p.sender_mac.data(), 6);
  store32(f.data() + kOffSenderIp, p.sender_ip.value);
  std::memcpy(f.data() + kOffTargetMac, p.target_mac.data(), 6);
  store32(f.data() + kOffTargetIp, p.target_ip.value);
  return f;
}

ArpFrame build_arp_request(const MacAddress& our_mac, Ipv4Address our_ip, Ipv4Address target,
                           std::optional<MacAddress> unicast_to) {
  ArpPacket p;
  p.eth_dst = unicast_to.value_or(kBroadcastMac);
  p.eth_src = our_mac;
  p.op = ArpOp::kRequest;
  p.sender_mac = our_mac;
  p.sender_ip = our_ip;
  p.target_mac = kZeroMac;
  p.target_ip = target;
  return build_arp_frame(p);
}

ArpFrame build_arp_reply(const ArpPacket& request, const MacAddress& our_mac) {
  ArpPacket p;
  p.eth_dst = request.sender_mac;
  p.eth_src = our_mac;
  p.op = ArpOp::kReply;
  p.sender_mac = our_mac;
  p.sender_ip = request.target_ip;
  p.target_mac = request.sender_mac;
  p.target_ip = request.sender_ip;
  return build_arp_frame(p);
}

ArpFrame build_gratuitous_arp(const MacAddress& mac, Ipv4Address ip, ArpOp op) {
  ArpPacket p;
  p.eth_dst = kBroadcastMac;
  p.eth_src = mac;
  p.op = op;
  p.sender_mac = mac;
  p.sender_ip = ip;
  // Requests carry a zero target MAC (Linux); a reply names the sender.
  p.target_mac = op == ArpOp::kReply ? mac : kZeroMac;
  p.target_ip = ip;
  return build_arp_frame(p);
}

// ---------------------------------------------------------------- responder

uint64_t ArpResponderStats::malformed_total() const {
  uint64_t n = 0;
  for (uint64_t v : malformed) n += v;
  return n;
}

Result<ArpResponder> ArpResponder::create(const MacAddress& mac, std::vector<Ipv4Address> addresses) {
  if (auto st = check_config(mac, addresses, "ARP responder"); !st) return std::unexpected(st.error());
  return ArpResponder(mac, std::move(addresses));
}

bool ArpResponder::owns(Ipv4Address ip) const {
  return std::find(addresses_.begin(), addresses_.end(), ip) != addresses_.end();
}

std::optional<ArpFrame> ArpResponder::on_frame(std::span<const uint8_t> frame) {
  auto p = parse_arp(frame);
  if (!p) {
    ++stats_.malformed[static_cast<size_t>(p.error())];
    return std::nullopt;
  }
  return on_packet(*p);
}

std::optional<ArpFrame> ArpResponder::on_packet(const ArpPacket& p) {
  if (p.sender_mac == mac_ || p.eth_src == mac_) {
    ++stats_.own_frames;  // a hub or loopback echoing what we sent
    return std::nullopt;
  }
  // Someone else uses one of our addresses: an operator must hear of it.
  // Not answered: Linux does not either (its route lookup refuses a local
  // source address), and a reply would not settle the conflict anyway.
  if (owns(p.sender_ip)) {
    ++stats_.conflicts;
    return std::nullopt;
  }
  if (p.op != ArpOp::kRequest) {
    ++stats_.not_a_request;
    return std::nullopt;
  }
  if (p.eth_dst != kBroadcastMac && p.eth_dst != mac_) {
    ++stats_.wrong_destination;  // another host's unicast probe, seen in promiscuous mode
    return std::nullopt;
  }
  if (!owns(p.target_ip)) {
    ++stats_.not_for_us;
    return std::nullopt;
  }
  ++stats_.answered;
  return build_arp_reply(p, mac_);
}

// ----------------------------------------------------------------- resolver

const char* neighbor_state_name(NeighborState s) {
  switch (s) {
    case NeighborState::kIncomplete: return "incomplete";
    case NeighborState::kReachable: return "reachable";
    case NeighborState::kStale: return "stale";
  }
  return "unknown";
}

Result<ArpResolver> ArpResolver::create(const MacAddress& mac, std::vector<Ipv4Address> addresses,
                                        ArpResolverOptions options) {
  if (auto st = check_config(mac, addresses, "ARP resolver"); !st) return std::unexpected(st.error());
  if (options.capacity == 0) return fail(EINVAL, "ARP resolver: capacity 0 leaves no room for any neighbor");
  if (options.max_requests == 0) {
    return fail(EINVAL, "ARP resolver: max_requests 0 would give up before asking: use at least 1");
  }
  if (options.retry_interval.count() <= 0 || options.reachable_time.count() <= 0) {
    return fail(EINVAL, "ARP resolver: retry_interval and reachable_time must be positive");
  }
  return ArpResolver(mac, std::move(addresses), options);
}

bool ArpResolver::is_ours(Ipv4Address ip) const {
  return std::find(addresses_.begin(), addresses_.end(), ip) != addresses_.end();
}

bool ArpResolver::make_room(bool only_unused) {
  if (map_.size() < options_.capacity) return true;
  // Oldest first. Learned-but-unused entries are the first to go; a flood
  // of requests from made-up addresses must not push out neighbours that
  // connections are using, so learning only ever evicts unused entries.
  for (auto it = lru_.end(); it != lru_.begin();) {
    --it;
    if (!it->used) {
      map_.erase(it->ip);
      lru_.erase(it);
      ++stats_.evictions;
      return true;
    }
  }
  if (only_unused) return false;
  map_.erase(lru_.back().ip);
  lru_.pop_back();
  ++stats_.evictions;
  return true;
}

ArpResolver::Lru::iterator ArpResolver::insert(NeighborEntry e, bool front) {
  auto it = front ? lru_.insert(lru_.begin(), std::move(e)) : lru_.insert(lru_.end(), std::move(e));
  map_[it->ip] = it;
  return it;
}

ArpFrame ArpResolver::request_for(const NeighborEntry& e) const {
  // A stale entry is reconfirmed with a unicast probe to the MAC we have;
  // an unknown address needs a broadcast.
  std::optional<MacAddress> to;
  if (e.state != NeighborState::kIncomplete) to = e.mac;
  return build_arp_request(mac_, addresses_.front(), e.ip, to);
}

Error ArpResolver::give_up(Lru::iterator it, ArpTime now) {
  std::string msg = "no ARP reply from " + it->ip.str() + " after " + std::to_string(it->requests) +
                    (it->requests == 1 ? " request" : " requests") + " over " +
                    human(since(now, it->first_request));
  if (it->state != NeighborState::kIncomplete) {
    msg += " (its MAC " + format_mac(it->mac) + " was last heard " + human(since(now, it->updated)) + " ago)";
  }
  msg += ": is the peer up and on this link?";
  ++stats_.failures;
  map_.erase(it->ip);
  lru_.erase(it);
  return Error(EHOSTUNREACH, msg);
}

Result<Resolution> ArpResolver::resolve(Ipv4Address ip, ArpTime now) {
  if (!ip.is_unicast()) {
    return fail(EINVAL, "cannot resolve " + ip.str() +
                            " with ARP: it is not a unicast address (zero, broadcast, multicast or loopback)");
  }
  if (is_ours(ip)) return fail(EINVAL, "cannot resolve " + ip.str() + ": it is this host's own address");

  auto found = map_.find(ip);
  if (found == map_.end()) {
    make_room(false);
    NeighborEntry e;
    e.ip = ip;
    e.state = NeighborState::kIncomplete;
    e.first_request = e.last_request = now;
    e.requests = 1;
    e.used = true;
    auto it = insert(e, true);
    ++stats_.requests_sent;
    return Resolution{std::nullopt, request_for(*it)};
  }
  auto it = found->second;
  lru_.splice(lru_.begin(), lru_, it);  // most recently used; iterators stay valid
  it->used = true;

  if (it->state == NeighborState::kReachable) {
    if (since(now, it->updated) < options_.reachable_time) return Resolution{it->mac, std::nullopt};
    it->state = NeighborState::kStale;  // too old to trust blindly: use it, but reconfirm
    it->requests = 0;
  }

  Resolution r;
  if (it->state == NeighborState::kStale) r.mac = it->mac;
  if (it->requests == 0) {
    it->first_request = it->last_request = now;
    it->requests = 1;
    ++stats_.requests_sent;
    r.request = request_for(*it);
    return r;
  }
  if (since(now, it->last_request) < options_.retry_interval) return r;  // wait for the answer
  if (it->requests >= options_.max_requests) return std::unexpected(give_up(it, now));
  ++it->requests;
  it->last_request = now;
  ++stats_.requests_sent;
  r.request = request_for(*it);
  return r;
}

ArpEvents ArpResolver::on_frame(std::span<const uint8_t> frame, ArpTime now) {
  auto p = parse_arp(frame);
  if (!p) {
    ++stats_.ignored;
    return {};
  }
  return on_packet(*p, now);
}

ArpEvents ArpResolver::on_packet(const ArpPacket& p, ArpTime now) {
  ArpEvents ev;
  // Our own frames, probes (sender 0.0.0.0) and claims on our own or
  // impossible addresses teach nothing about a neighbour.
  if (p.sender_mac == mac_ || !is_unicast(p.sender_mac) || !p.sender_ip.is_unicast() || is_ours(p.sender_ip)) {
    ++stats_.ignored;
    return ev;
  }
  // Only a reply sent to us confirms that the peer hears us; anything else
  // (its requests, broadcast or gratuitous ARP) gives a MAC to use but
  // leaves it to be confirmed, as Linux marks such entries STALE.
  bool confirms = p.op == ArpOp::kReply && p.eth_dst == mac_;
  NeighborState state = confirms ? NeighborState::kReachable : NeighborState::kStale;

  auto found = map_.find(p.sender_ip);
  if (found == map_.end()) {
    // Unknown sender: cache it only when it asked for us, since it is about
    // to talk to us (Linux does the same), and only into free or unused room.
    if (p.op != ArpOp::kRequest || !is_ours(p.target_ip)) {
      ++stats_.ignored;
      return ev;
    }
    if (!make_room(true)) {
      ++stats_.learn_skipped;
      return ev;
    }
    NeighborEntry e;
    e.ip = p.sender_ip;
    e.mac = p.sender_mac;
    e.state = NeighborState::kStale;
    e.updated = now;
    e.used = false;
    insert(e, false);  // least recently used until somebody resolves it
    ++stats_.learned;
    return ev;
  }
  NeighborEntry& e = *found->second;
  bool was_incomplete = e.state == NeighborState::kIncomplete;
  bool moved = !was_incomplete && e.mac != p.sender_mac;
  if (was_incomplete) ev.resolved.push_back(e.ip);
  if (moved) ev.changed.push_back(e.ip);
  if (confirms || was_incomplete || moved) {
    // A new MAC, or a confirmation: the entry starts over in `state`.
    e.mac = p.sender_mac;
    e.state = state;
    e.updated = now;
    e.requests = 0;
  } else if (e.state == NeighborState::kStale) {
    // Same MAC, unconfirmed: fresher, still to be confirmed. A probe
    // round in progress goes on (requests unchanged), so a peer that
    // talks ARP but never answers us still ends in a clear failure.
    e.updated = now;
  }
  // (A reachable entry hearing the same MAC unconfirmed keeps its clock:
  // only replies to us prove the path works both ways.)
  ++stats_.updates;
  return ev;
}

std::optional<NeighborEntry> ArpResolver::lookup(Ipv4Address ip) const {
  auto it = map_.find(ip);
  if (it == map_.end()) return std::nullopt;
  return *it->second;
}

void ArpResolver::forget(Ipv4Address ip) {
  auto it = map_.find(ip);
  if (it == map_.end()) return;
  lru_.erase(it->second);
  map_.erase(it);
}

}  // namespace ufab::net
