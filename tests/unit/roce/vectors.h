// Known-answer frames from make_vectors.py (an independent Python
// implementation using zlib.crc32), with the fields each was built from.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace ufab::roce::testdata {

struct IcrcVector {
  const char* name;
  const uint8_t* frame;
  size_t frame_len;
  uint32_t icrc;
  uint8_t opcode;
  size_t payload_len;
  std::array<uint8_t, 6> dst_mac;
  std::array<uint8_t, 6> src_mac;
  uint32_t src_ip, dst_ip;
  uint8_t tos;
  uint8_t ttl;
  uint16_t ip_id;
  uint16_t sport;
  bool se, migreq;
  uint16_t pkey;
  bool fecn, becn;
  uint32_t dest_qp;
  bool ack_req;
  uint32_t psn;
  uint64_t va;
  uint32_t rkey, dma_len;
  uint64_t swap_add, compare;
  uint8_t syndrome;
  uint32_t msn;
  uint64_t orig;
  uint32_t imm, qkey, src_qp, inv_rkey, feth;
};

#include "tests/unit/roce/icrc_vectors.inc"

}  // namespace ufab::roce::testdata
