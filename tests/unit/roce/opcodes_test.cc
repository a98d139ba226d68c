#include "core/roce/opcodes.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace ufab::roce {
namespace {

std::set<int> expected_opcodes() {
  std::set<int> s;
  for (int i = 0x00; i <= 0x14; ++i) s.insert(i);  // RC
  s.insert(0x16);
  s.insert(0x17);
  s.insert(0x1C);  // FLUSH
  s.insert(0x1D);  // ATOMIC_WRITE
  for (int i = 0x20; i <= 0x2B; ++i) s.insert(i);  // UC
  s.insert(0x64);  // UD
  s.insert(0x65);
  return s;
}

TEST(Opcodes, TableHoldsExactlyTheRcUcUdOpcodes) {
  auto want = expected_opcodes();
  EXPECT_EQ(opcode_table().size(), want.size());
  for (int op = 0; op < 256; ++op) {
    const OpcodeInfo* info = opcode_info(static_cast<uint8_t>(op));
    EXPECT_EQ(info != nullptr, want.count(op) == 1) << "opcode 0x" << std::hex << op;
    if (info) {
      EXPECT_EQ(info->opcode, op);
    }
  }
  // RD, reserved and CNP are unknown on purpose.
  EXPECT_EQ(opcode_info(0x15), nullptr);
  EXPECT_EQ(opcode_info(0x40), nullptr);
  EXPECT_EQ(opcode_info(0x81), nullptr);
}

TEST(Opcodes, OnlyFlushAndAtomicWriteAreMissingFromRxe61) {
  for (const auto& e : opcode_table())
    EXPECT_EQ(e.in_rxe_6_1, e.opcode != op::kRcFlush && e.opcode != op::kRcAtomicWrite) << e.name;
}

TEST(Opcodes, TransportIsTheTopThreeBits) {
  for (const auto& e : opcode_table()) {
    Transport t = e.opcode < 0x20 ? Transport::kRc : e.opcode < 0x40 ? Transport::kUc : Transport::kUd;
    EXPECT_EQ(e.transport, t) << e.name;
  }
}

TEST(Opcodes, PositionFollowsTheName) {
  for (const auto& e : opcode_table()) {
    std::string n = e.name;
    uint8_t want = n.find("_FIRST") != std::string::npos    ? kFirst
                   : n.find("_MIDDLE") != std::string::npos ? kMiddle
                   : n.find("_LAST") != std::string::npos   ? kLast
                                                            : kOnly;
    EXPECT_EQ(e.position, want) << n;
  }
  EXPECT_TRUE(opcode_info(op::kRcSendOnly)->only());
  EXPECT_TRUE(opcode_info(op::kRcSendFirst)->first());
  EXPECT_FALSE(opcode_info(op::kRcSendFirst)->last());
  EXPECT_TRUE(opcode_info(op::kUcWriteMiddle)->middle());
  EXPECT_TRUE(opcode_info(op::kRcAck)->only());
}

TEST(Opcodes, ResponsesAreReadResponsesAndAcks) {
  for (const auto& e : opcode_table()) {
    bool response = e.kind == OpKind::kReadResponse || e.kind == OpKind::kAck || e.kind == OpKind::kAtomicAck;
    EXPECT_EQ(e.request, !response) << e.name;
  }
}

TEST(Opcodes, HeaderSetsMatchRxe) {
  struct Want {
    uint8_t op;
    uint16_t headers;
  };
  const Want wants[] = {
      {op::kRcSendFirst, 0},
      {op::kRcSendLastImm, kImmDt},
      {op::kRcSendOnlyImm, kImmDt},
      {op::kRcWriteFirst, kReth},
      {op::kRcWriteMiddle, 0},
      {op::kRcWriteLastImm, kImmDt},
      {op::kRcWriteOnly, kReth},
      {op::kRcWriteOnlyImm, kReth | kImmDt},
      {op::kRcReadRequest, kReth},
      {op::kRcReadResponseFirst, kAeth},
      {op::kRcReadResponseMiddle, 0},
      {op::kRcReadResponseLast, kAeth},
      {op::kRcReadResponseOnly, kAeth},
      {op::kRcAck, kAeth},
      {op::kRcAtomicAck, kAeth | kAtomicAckEth},
      {op::kRcCompareSwap, kAtomicEth},
      {op::kRcFetchAdd, kAtomicEth},
      {op::kRcSendLastInv, kIeth},
      {op::kRcSendOnlyInv, kIeth},
      {op::kRcFlush, kFeth | kReth},
      {op::kRcAtomicWrite, kReth},
      {op::kUcWriteFirst, kReth},
      {op::kUcWriteOnlyImm, kReth | kImmDt},
      {op::kUdSendOnly, kDeth},
      {op::kUdSendOnlyImm, kDeth | kImmDt},
  };
  for (const auto& w : wants) EXPECT_EQ(opcode_info(w.op)->headers, w.headers) << opcode_full_name(w.op);
}

TEST(Opcodes, HeaderOffsetsFollowWireOrder) {
  // Offsets after the BTH as rxe_opcode.c lays them out.
  EXPECT_EQ(opcode_info(op::kRcWriteOnlyImm)->offset_of(kReth), 0u);
  EXPECT_EQ(opcode_info(op::kRcWriteOnlyImm)->offset_of(kImmDt), 16u);
  EXPECT_EQ(opcode_info(op::kRcWriteOnlyImm)->ext_bytes(), 20u);
  EXPECT_EQ(opcode_info(op::kRcAtomicAck)->offset_of(kAeth), 0u);
  EXPECT_EQ(opcode_info(op::kRcAtomicAck)->offset_of(kAtomicAckEth), 4u);
  EXPECT_EQ(opcode_info(op::kRcAtomicAck)->ext_bytes(), 12u);
  EXPECT_EQ(opcode_info(op::kUdSendOnlyImm)->offset_of(kDeth), 0u);
  EXPECT_EQ(opcode_info(op::kUdSendOnlyImm)->offset_of(kImmDt), 8u);
  EXPECT_EQ(opcode_info(op::kRcFlush)->offset_of(kFeth), 0u);
  EXPECT_EQ(opcode_info(op::kRcFlush)->offset_of(kReth), 4u);
  EXPECT_EQ(opcode_info(op::kRcFlush)->ext_bytes(), 20u);
  EXPECT_EQ(opcode_info(op::kRcCompareSwap)->ext_bytes(), 28u);
  EXPECT_EQ(opcode_info(op::kRcSendMiddle)->ext_bytes(), 0u);
}

TEST(Opcodes, PayloadRules) {
  for (const auto& e : opcode_table()) {
    PayloadRule want = PayloadRule::kAny;
    if (e.kind == OpKind::kReadRequest || e.kind == OpKind::kAck || e.kind == OpKind::kAtomicAck ||
        e.kind == OpKind::kAtomic || e.kind == OpKind::kFlush)
      want = PayloadRule::kNone;
    if (e.kind == OpKind::kAtomicWrite) want = PayloadRule::kExactly8;
    EXPECT_EQ(e.payload, want) << e.name;
  }
}

TEST(Opcodes, FullNames) {
  EXPECT_STREQ(opcode_full_name(0x04), "RC_SEND_ONLY");
  EXPECT_STREQ(opcode_full_name(0x2B), "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE");
  EXPECT_STREQ(opcode_full_name(0x65), "UD_SEND_ONLY_WITH_IMMEDIATE");
  EXPECT_STREQ(opcode_full_name(0x1C), "RC_FLUSH");
  EXPECT_STREQ(opcode_full_name(0x15), "UNKNOWN");
}

TEST(Opcodes, HeaderSizes) {
  EXPECT_EQ(ext_header_size(kDeth), 8u);
  EXPECT_EQ(ext_header_size(kFeth), 4u);
  EXPECT_EQ(ext_header_size(kReth), 16u);
  EXPECT_EQ(ext_header_size(kAtomicEth), 28u);
  EXPECT_EQ(ext_header_size(kAeth), 4u);
  EXPECT_EQ(ext_header_size(kAtomicAckEth), 8u);
  EXPECT_EQ(ext_header_size(kImmDt), 4u);
  EXPECT_EQ(ext_header_size(kIeth), 4u);
  EXPECT_EQ(ext_headers_size(0xFF), 76u);
}

}  // namespace
}  // namespace ufab::roce
