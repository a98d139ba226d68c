#include "core/roce/udp_port.h"

#include <gtest/gtest.h>

namespace ufab::roce {
namespace {

// Values worked out by hand from the kernel formulas (include/linux/hash.h,
// include/rdma/ib_verbs.h), with the intermediate steps shown.

TEST(UdpPort, KernelHash32) {
  // 17 * 0x61C88647 = 0x6_7E50EAB7 (mod 2^32: 0x7E50EAB7); top 14 bits:
  // 0x7E50EAB7 >> 18 = 0x1F94.
  EXPECT_EQ(kernel_hash_32(17, 14), 0x1F94u);
  EXPECT_EQ(kernel_hash_32(0, 14), 0u);
  // 1 * 0x61C88647 >> 18 = 0x1872.
  EXPECT_EQ(kernel_hash_32(1, 14), 0x1872u);
  EXPECT_EQ(kernel_hash_32(1, 32), 0x61C88647u);
}

TEST(UdpPort, AtQpCreate) {
  EXPECT_EQ(rxe_sport_at_create(17), 0xC000 + 0x1F94);  // 0xDF94
  EXPECT_EQ(rxe_sport_at_create(1), 0xD872);
  // QPN 0x12 (18): 18 * 0x61C88647 = 0x6_E01970FE -> 0xE01970FE >> 18 =
  // 0x3806 -> 0xC000 + 0x3806 = 0xF806.
  EXPECT_EQ(rxe_sport_at_create(0x12), 0xF806);
  for (uint32_t q = 0; q < 100000; q += 97) {
    uint16_t p = rxe_sport_at_create(q);
    EXPECT_GE(p, 0xC000);
  }
}

TEST(UdpPort, FlowLabelFromQpNumbers) {
  // lqpn 0x11, rqpn 0x12: v = 0x132; v ^= v >> 20 (0); v ^= v >> 40 (0);
  // fl = 0x132 -> port 0xC000 | (0x132 ^ 0) = 0xC132.
  EXPECT_EQ(rdma_calc_flow_label(0x11, 0x12), 0x132u);
  EXPECT_EQ(rxe_sport_after_modify(0, 0x11, 0x12), 0xC132);
  // Symmetric: both ends compute the same port.
  EXPECT_EQ(rxe_sport_after_modify(0, 0x12, 0x11), 0xC132);

  // lqpn 0x123456, rqpn 0xABCDEF:
  //   v = 0x123456 * 0xABCDEF = 0xC37_9A59_BA4A
  //   v >> 20 = 0xC3_79A5;  v ^= it -> 0xC37_9A9A_C3EF
  //   v >> 40 = 0xC;        v ^= it -> 0xC37_9A9A_C3E3
  //   fl = v & 0xFFFFF = 0xAC3E3
  //   low 14 bits 0x03E3 ^ ((0xAC3E3 & 0xFC000) >> 14 = 0x2B) = 0x03C8
  //   port = 0xC000 | 0x03C8 = 0xC3C8
  EXPECT_EQ(rdma_calc_flow_label(0x123456, 0xABCDEF), 0xAC3E3u);
  EXPECT_EQ(rxe_sport_after_modify(0, 0x123456, 0xABCDEF), 0xC3C8);
  EXPECT_EQ(rxe_sport_after_modify(0, 0xABCDEF, 0x123456), 0xC3C8);
}

TEST(UdpPort, ExplicitFlowLabel) {
  // fl = 0xFFFFF: low 0x3FFF ^ high 0x3F = 0x3FC0 -> 0xFFC0.
  EXPECT_EQ(rxe_sport_after_modify(0xFFFFF, 1, 2), 0xFFC0);
  // fl = 0x4000: low 0 ^ 1 = 1 -> 0xC001.
  EXPECT_EQ(flow_label_to_udp_sport(0x4000), 0xC001);
  EXPECT_EQ(flow_label_to_udp_sport(0x1), 0xC001);
  // The QP numbers do not matter once a flow label is given.
  EXPECT_EQ(rxe_sport_after_modify(0x4000, 7, 9), 0xC001);
}

}  // namespace
}  // namespace ufab::roce
