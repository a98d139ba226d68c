#include "core/roce/opcodes.h"

#include <array>

namespace ufab::roce {
namespace {

using K = OpKind;
using P = PayloadRule;
constexpr Transport RC = Transport::kRc;
constexpr Transport UC = Transport::kUc;
constexpr Transport UD = Transport::kUd;
constexpr bool kReq = true;
constexpr bool kResp = false;

// One row per opcode, ascending. Header sets follow rxe_opcode.c (Linux
// 6.1 for everything but FLUSH/ATOMIC_WRITE, 6.2 for those two); payload
// rules follow its RXE_PAYLOAD_MASK, with ATOMIC_WRITE's 8 bytes from the
// IBA memory placement extensions.
constexpr OpcodeInfo kTable[] = {
    {0x00, "SEND_FIRST", RC, K::kSend, 0, P::kAny, kFirst, kReq, true},
    {0x01, "SEND_MIDDLE", RC, K::kSend, 0, P::kAny, kMiddle, kReq, true},
    {0x02, "SEND_LAST", RC, K::kSend, 0, P::kAny, kLast, kReq, true},
    {0x03, "SEND_LAST_WITH_IMMEDIATE", RC, K::kSend, kImmDt, P::kAny, kLast, kReq, true},
    {0x04, "SEND_ONLY", RC, K::kSend, 0, P::kAny, kOnly, kReq, true},
    {0x05, "SEND_ONLY_WITH_IMMEDIATE", RC, K::kSend, kImmDt, P::kAny, kOnly, kReq, true},
    {0x06, "RDMA_WRITE_FIRST", RC, K::kRdmaWrite, kReth, P::kAny, kFirst, kReq, true},
    {0x07, "RDMA_WRITE_MIDDLE", RC, K::kRdmaWrite, 0, P::kAny, kMiddle, kReq, true},
    {0x08, "RDMA_WRITE_LAST", RC, K::kRdmaWrite, 0, P::kAny, kLast, kReq, true},
    {0x09, "RDMA_WRITE_LAST_WITH_IMMEDIATE", RC, K::kRdmaWrite, kImmDt, P::kAny, kLast, kReq, true},
    {0x0A, "RDMA_WRITE_ONLY", RC, K::kRdmaWrite, kReth, P::kAny, kOnly, kReq, true},
    {0x0B, "RDMA_WRITE_ONLY_WITH_IMMEDIATE", RC, K::kRdmaWrite, kReth | kImmDt, P::kAny, kOnly, kReq,
     true},
    {0x0C, "RDMA_READ_REQUEST", RC, K::kReadRequest, kReth, P::kNone, kOnly, kReq, true},
    {0x0D, "RDMA_READ_RESPONSE_FIRST", RC, K::kReadResponse, kAeth, P::kAny, kFirst, kResp, true},
    {0x0E, "RDMA_READ_RESPONSE_MIDDLE", RC, K::kReadResponse, 0, P::kAny, kMiddle, kResp, true},
    {0x0F, "RDMA_READ_RESPONSE_LAST", RC, K::kReadResponse, kAeth, P::kAny, kLast, kResp, true},
    {0x10, "RDMA_READ_RESPONSE_ONLY", RC, K::kReadResponse, kAeth, P::kAny, kOnly, kResp, true},
    {0x11, "ACKNOWLEDGE", RC, K::kAck, kAeth, P::kNone, kOnly, kResp, true},
    {0x12, "ATOMIC_ACKNOWLEDGE", RC, K::kAtomicAck, kAeth | kAtomicAckEth, P::kNone, kOnly, kResp, true},
    {0x13, "COMPARE_SWAP", RC, K::kAtomic, kAtomicEth, P::kNone, kOnly, kReq, true},
    {0x14, "FETCH_ADD", RC, K::kAtomic, kAtomicEth, P::kNone, kOnly, kReq, true},
    // 0x15 is reserved (RESYNC in later IBA releases); rxe has no entry.
    {0x16, "SEND_LAST_WITH_INVALIDATE", RC, K::kSend, kIeth, P::kAny, kLast, kReq, true},
    {0x17, "SEND_ONLY_WITH_INVALIDATE", RC, K::kSend, kIeth, P::kAny, kOnly, kReq, true},
    {0x1C, "FLUSH", RC, K::kFlush, kFeth | kReth, P::kNone, kOnly, kReq, false},
    {0x1D, "ATOMIC_WRITE", RC, K::kAtomicWrite, kReth, P::kExactly8, kOnly, kReq, false},

    {0x20, "SEND_FIRST", UC, K::kSend, 0, P::kAny, kFirst, kReq, true},
    {0x21, "SEND_MIDDLE", UC, K::kSend, 0, P::kAny, kMiddle, kReq, true},
    {0x22, "SEND_LAST", UC, K::kSend, 0, P::kAny, kLast, kReq, true},
    {0x23, "SEND_LAST_WITH_IMMEDIATE", UC, K::kSend, kImmDt, P::kAny, kLast, kReq, true},
    {0x24, "SEND_ONLY", UC, K::kSend, 0, P::kAny, kOnly, kReq, true},
    {0x25, "SEND_ONLY_WITH_IMMEDIATE", UC, K::kSend, kImmDt, P::kAny, kOnly, kReq, true},
    {0x26, "RDMA_WRITE_FIRST", UC, K::kRdmaWrite, kReth, P::kAny, kFirst, kReq, true},
    {0x27, "RDMA_WRITE_MIDDLE", UC, K::kRdmaWrite, 0, P::kAny, kMiddle, kReq, true},
    {0x28, "RDMA_WRITE_LAST", UC, K::kRdmaWrite, 0, P::kAny, kLast, kReq, true},
    {0x29, "RDMA_WRITE_LAST_WITH_IMMEDIATE", UC, K::kRdmaWrite, kImmDt, P::kAny, kLast, kReq, true},
    {0x2A, "RDMA_WRITE_ONLY", UC, K::kRdmaWrite, kReth, P::kAny, kOnly, kReq, true},
    {0x2B, "RDMA_WRITE_ONLY_WITH_IMMEDIATE", UC, K::kRdmaWrite, kReth | kImmDt, P::kAny, kOnly, kReq,
     true},

    {0x64, "SEND_ONLY", UD, K::kSend, kDeth, P::kAny, kOnly, kReq, true},
    {0x65, "SEND_ONLY_WITH_IMMEDIATE", UD, K::kSend, kDeth | kImmDt, P::kAny, kOnly, kReq, true},
};

constexpr bool table_is_sorted() {
  for (size_t i = 1; i < std::size(kTable); ++i)
    if (kTable[i - 1].opcode >= kTable[i].opcode) return false;
  return true;
}
static_assert(table_is_sorted(), "opcode table must be ascending and free of duplicates");

// Direct index: the parser looks up every received packet's opcode.
constexpr std::array<int8_t, 256> make_index() {
  std::array<int8_t, 256> idx{};
  for (auto& v : idx) v = -1;
  for (size_t i = 0; i < std::size(kTable); ++i) idx[kTable[i].opcode] = static_cast<int8_t>(i);
  return idx;
}
constexpr std::array<int8_t, 256> kIndex = make_index();

// The transport lives in the top three opcode bits (IBA 9.2.1).
constexpr bool transports_match_opcodes() {
  for (const auto& e : kTable) {
    uint8_t t = e.opcode >> 5;
    if ((e.transport == RC && t != 0) || (e.transport == UC && t != 1) || (e.transport == UD && t != 3))
      return false;
  }
  return true;
}
static_assert(transports_match_opcodes());

}  // namespace

const OpcodeInfo* opcode_info(uint8_t opcode) {
  int8_t i = kIndex[opcode];
  return i < 0 ? nullptr : &kTable[i];
}

std::span<const OpcodeInfo> opcode_table() { return kTable; }

const char* opcode_full_name(uint8_t opcode) {
  // Names are built once; the table is small and fixed.
  static const auto names = [] {
    std::array<std::array<char, 40>, std::size(kTable)> out{};
    for (size_t i = 0; i < std::size(kTable); ++i) {
      const char* prefix = kTable[i].transport == RC ? "RC_" : kTable[i].transport == UC ? "UC_" : "UD_";
      size_t n = 0;
      for (const char* p = prefix; *p && n + 1 < out[i].size(); ++p) out[i][n++] = *p;
      for (const char* p = kTable[i].name; *p && n + 1 < out[i].size(); ++p) out[i][n++] = *p;
      out[i][n] = '\0';
    }
    return out;
  }();
  int8_t i = kIndex[opcode];
  return i < 0 ? "UNKNOWN" : names[i].data();
}

}  // namespace ufab::roce
