// libFuzzer target for the CM MAD codec (core/cm/mad.h) and rdma_cm's
// private-data header (core/cm/rdma_cm.h): everything a MAD arriving on the
// GSI can reach once the CM receives it.
//
// Properties checked on every input:
//   1. parse_mad / parse_mad_header / parse_cma_header never crash, read
//      nothing outside the input (ASan) and do nothing undefined (UBSan);
//   2. a MAD that parses builds again (every parsed value fits its field),
//      the built bytes parse to the same message, and building that gives
//      the same bytes (reserved bits are the only thing a round trip drops);
//   3. a REQ's rdma_cm header that parses builds again to the same 36 bytes
//      (apart from the low nibble of byte 1, which is not the IP version)
//      when it is in a form build accepts;
//   4. errors carry a message.
// A violated property aborts with a message, which libFuzzer reports as a
// crash and saves the input.
//
// Build and run: tests/fuzz/run.sh [seconds] cm_mad. The same file also
// builds with gcc into //tests/fuzz:cm_mad_corpus_test, which replays the
// seed corpus (tests/fuzz/corpus/cm_mad, written by make_cm_corpus.py).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>

#include "core/cm/mad.h"
#include "core/cm/rdma_cm.h"

namespace {

using namespace ufab::cm;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "cm_mad_fuzzer: property violated: %s\n", what);
  std::abort();
}

void check(bool ok, const char* what) {
  if (!ok) fail(what);
}

void check_cma(const Req& req) {
  auto h = parse_cma_header(req.private_data);
  if (!h) {
    check(!h.error().message().empty(), "cma header error without a message");
    return;
  }
  check(h->ip_version == 4 || h->ip_version == 6, "cma header with an IP version build refuses");
  auto b = build_cma_header(*h);
  if (!b) {
    // Only an IPv4 header with bytes before the address is refused.
    check(h->ip_version == 4, "a parsed IPv6 cma header does not build");
    return;
  }
  for (size_t i = 0; i < kCmaHeaderSize; ++i) {
    uint8_t want = req.private_data[i];
    if (i == 1) want &= 0xF0;
    check((*b)[i] == want, "cma header does not rebuild to its bytes");
  }
  auto again = parse_cma_header(*b);
  check(again && *again == *h, "rebuilt cma header parses differently");
  auto user = rdma_cm_req_user_data(req.private_data);
  check(user.size() == kRdmaCmReqUserDataSize, "REQ user data is not 56 bytes");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> in(data, size);

  auto h = parse_mad_header(in);
  check(h.has_value() == (size >= kMadHeaderSize), "parse_mad_header accepts exactly 24+ bytes");

  auto mad = parse_mad(in);
  if (!mad) {
    check(!mad.error().message().empty(), "parse error without a message");
    return 0;
  }
  check(size == kMadSize, "parsed a MAD that is not 256 bytes");
  check(mad->header == *h, "parse_mad and parse_mad_header disagree");
  check(mad->header.attribute_id == static_cast<uint16_t>(attribute_of(mad->message)),
        "parsed message does not match its attribute id");

  auto built = build_mad(*mad);
  if (!built) fail("a parsed MAD does not build");
  auto again = parse_mad(*built);
  if (!again) fail("a built MAD does not parse");
  check(*again == *mad, "round trip changed the message");
  auto rebuilt = build_mad(*again);
  check(rebuilt && *rebuilt == *built, "building twice gave different bytes");
  // Outside reserved bits the built bytes are the input's: the header is
  // copied whole.
  check(std::memcmp(built->data(), data, kMadHeaderSize) == 0, "header bytes changed");

  if (const Req* req = std::get_if<Req>(&mad->message)) check_cma(*req);
  return 0;
}
