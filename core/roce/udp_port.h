// The UDP source port of RoCEv2 packets, derived the way Linux rxe derives
// it, so a ufab QP and an rxe QP of the same numbers pick the same port.
//
// IBA annex A17 leaves the source port to the sender as flow entropy for
// ECMP and RSS (receivers do not check it; rxe does not). rxe picks it twice:
//   - at QP creation (rxe_qp.c rxe_qp_init_req):
//       0xC000 + (hash_32(qpn, 14) & 0x3FFF)
//     where hash_32 is the kernel's multiplicative hash (include/linux/hash.h;
//     x86 has no arch override): (val * 0x61C88647) >> (32 - bits);
//   - on modify_qp with an address vector that has a GRH (rxe_verbs.c
//     rxe_modify_qp -> rdma_get_udp_sport in include/rdma/ib_verbs.h):
//       fl = AV flow label, or if it is 0 the flow label computed from the
//       two QP numbers (rdma_calc_flow_label); port = 0xC000 | (low 14 bits
//       of fl xor its top 6 bits).
// RoCE address vectors always carry a GRH, so every connected RC/UC QP ends
// up with the second form; UD QPs keep the first.
#pragma once

#include <cstdint>

namespace ufab::roce {

// Start of the IANA dynamic port range; RoCEv2 source ports live above it.
inline constexpr uint16_t kRoceSportMin = 0xC000;

// The kernel's hash_32(val, bits) (generic form: golden-ratio multiply,
// keep the top `bits` bits). bits must be 1..32.
constexpr uint32_t kernel_hash_32(uint32_t val, unsigned bits) {
  return static_cast<uint32_t>(val * 0x61C88647u) >> (32 - bits);
}

// Source port rxe gives a QP when it is created.
constexpr uint16_t rxe_sport_at_create(uint32_t qpn) {
  return static_cast<uint16_t>(kRoceSportMin + (kernel_hash_32(qpn, 14) & 0x3FFF));
}

// rdma_calc_flow_label: a 20-bit flow label that is symmetric in the two
// QP numbers, so both ends of a connection compute the same one.
constexpr uint32_t rdma_calc_flow_label(uint32_t lqpn, uint32_t rqpn) {
  uint64_t v = uint64_t{lqpn} * rqpn;
  v ^= v >> 20;
  v ^= v >> 40;
  return static_cast<uint32_t>(v & 0xFFFFF);
}

// rdma_flow_label_to_udp_sport: fold a 20-bit flow label into 14 bits.
constexpr uint16_t flow_label_to_udp_sport(uint32_t fl) {
  uint32_t low = fl & 0x3FFF;
  uint32_t high = fl & 0xFC000;
  low ^= high >> 14;
  return static_cast<uint16_t>(low | kRoceSportMin);
}

// Source port after modify_qp with an AV: the AV's flow label, or the one
// computed from the local and remote QP numbers when that is 0.
constexpr uint16_t rxe_sport_after_modify(uint32_t flow_label, uint32_t lqpn, uint32_t rqpn) {
  if (flow_label == 0) flow_label = rdma_calc_flow_label(lqpn, rqpn);
  return flow_label_to_udp_sport(flow_label);
}

}  // namespace ufab::roce
