// libFuzzer target for the ARP code: everything a frame from the wire can
// reach. Parses arbitrary bytes, checks that whatever parses re-encodes to
// the same packet, and feeds the frame to a responder and a resolver (with
// the first input bytes steering the resolver's clock), so state-machine
// paths are fuzzed too, not just the decoder.
//
// Build (tests/fuzz/run.sh does this): clang++ -std=c++2b -fsanitize=fuzzer,address
//   -I. tests/fuzz/arp_fuzzer.cc core/net/arp.cc core/net/addresses.cc
// Seeds: tests/fuzz/corpus/arp/.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "core/net/addresses.h"
#include "core/net/arp.h"

namespace {

using ufab::net::ArpResolver;
using ufab::net::ArpResponder;
using ufab::net::Ipv4Address;
using ufab::net::MacAddress;

constexpr MacAddress kOurMac{0x52, 0x54, 0x00, 0x00, 0x00, 0x01};
constexpr Ipv4Address kOurIp = Ipv4Address::of(10, 0, 0, 1);

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> frame(data, size);

  auto p = ufab::net::parse_arp(frame);
  if (p) {
    auto again = ufab::net::parse_arp(ufab::net::build_arp_frame(*p));
    if (!again || !(*again == *p)) std::abort();  // encoder and decoder disagree
  } else if (static_cast<size_t>(p.error()) >= ufab::net::kArpDropCount) {
    std::abort();
  }

  static ArpResponder responder = *ArpResponder::create(kOurMac, {kOurIp, Ipv4Address::of(10, 0, 0, 9)});
  (void)responder.on_frame(frame);

  // A small resolver, so eviction and every state are reached quickly; it
  // lives across inputs like the real one does.
  static ArpResolver resolver = [] {
    ufab::net::ArpResolverOptions o;
    o.capacity = 8;
    o.retry_interval = std::chrono::milliseconds(10);
    o.reachable_time = std::chrono::milliseconds(50);
    return *ArpResolver::create(kOurMac, {kOurIp}, o);
  }();
  static ufab::net::ArpTime now{};
  now += std::chrono::milliseconds(size > 0 ? data[0] % 32 : 1);
  (void)resolver.on_frame(frame, now);
  // Ask for the frame's sender and target, as a transport would for a peer.
  if (p) {
    (void)resolver.resolve(p->sender_ip, now);
    (void)resolver.resolve(p->target_ip, now);
  }
  if (resolver.size() > resolver.options().capacity) std::abort();
  return 0;
}
