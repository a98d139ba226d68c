// rdma_cm's conventions on top of the IB CM (as the Linux kernel's
// drivers/infiniband/core/cma.c speaks them), so a REQ from ufab reaches a
// kernel rdma_cm listener and a kernel REQ is matched to a ufab listener:
//
//  * the service id is the port space and port: 0x0000000001000000 |
//    (port space << 16) | port, e.g. 0x0000000001061234 for RDMA_PS_TCP port
//    0x1234;
//  * the first 36 bytes of a REQ's private data are rdma_cm's header
//    (struct cma_hdr): version 0x00, the IP version in the high nibble of
//    byte 1, the active side's (source) port, then the source and the
//    destination address, 16 bytes each. An IPv4 address takes the last 4
//    of its 16 bytes and 12 zero bytes before it (the kernel's form; it
//    reads only those 4 bytes); an IPv6 address takes all 16. The
//    application's own private data follows, up to 92 - 36 = 56 bytes.
//    REP, REJ, RTU, DREQ and DREP private data carry no header.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "base/error.h"
#include "core/cm/mad.h"

namespace ufab::cm {

// rdma_cm port spaces (include/rdma/rdma_cm.h enum rdma_ucm_port_space).
inline constexpr uint16_t kRdmaPsIpoib = 0x0002;
inline constexpr uint16_t kRdmaPsIb = 0x013F;
inline constexpr uint16_t kRdmaPsTcp = 0x0106;
inline constexpr uint16_t kRdmaPsUdp = 0x0111;

// Service ids rdma_cm uses: 0x0000000001000000 under the mask
// 0xFFFFFFFFFF000000 (ib_cm.h IB_CMA_SERVICE_ID / _MASK).
inline constexpr uint64_t kRdmaCmServiceIdBase = 0x0000000001000000ull;
inline constexpr uint64_t kRdmaCmServiceIdMask = 0xFFFFFFFFFF000000ull;

// The service id rdma_cm connects to for a port space and port.
constexpr uint64_t rdma_cm_service_id(uint16_t port_space, uint16_t port) {
  return (uint64_t{port_space} << 16) | port;
}

struct RdmaCmService {
  uint16_t port_space = 0;
  uint16_t port = 0;

  bool operator==(const RdmaCmService&) const = default;
};

// Splits an rdma_cm service id; fails (EINVAL) for one outside rdma_cm's
// range (a native IB CM service id), naming it.
Result<RdmaCmService> parse_rdma_cm_service_id(uint64_t service_id);

inline constexpr size_t kCmaHeaderSize = 36;
inline constexpr uint8_t kCmaVersion = 0x00;
// The application's share of a REQ's private data under rdma_cm.
inline constexpr size_t kRdmaCmReqUserDataSize = kReqPrivateDataSize - kCmaHeaderSize;  // 56

// An address as the header carries it: 16 bytes.
using CmaAddress = std::array<uint8_t, 16>;

// The IPv4 form (12 zero bytes, then the address in network order).
CmaAddress cma_ipv4(uint32_t address);
CmaAddress cma_ipv4(uint8_t a, uint8_t b, uint8_t c, uint8_t d);

struct CmaHeader {
  uint8_t ip_version = 4;  // 4 or 6
  uint16_t port = 0;       // the active side's source port
  CmaAddress src_addr{};
  CmaAddress dst_addr{};

  bool operator==(const CmaHeader&) const = default;

  // The IPv4 address of an IPv4 header, or of an IPv6 header holding an
  // IPv4-mapped (::ffff:a.b.c.d) address; nullopt otherwise. Host order.
  std::optional<uint32_t> src_ipv4() const;
  std::optional<uint32_t> dst_ipv4() const;
};

// Parses the header at the start of a REQ's private data (at least 36
// bytes). Checks what the kernel checks before it matches a listener:
// version 0x00 and IP version 4 or 6. Errors (EBADMSG) name the field.
Result<CmaHeader> parse_cma_header(std::span<const uint8_t> private_data);

// Writes the 36 header bytes; fails (EINVAL) for an IP version other than 4
// or 6. For IP version 4, bytes 0-11 of each address must be zero (the
// kernel's form; use cma_ipv4()).
Result<std::array<uint8_t, kCmaHeaderSize>> build_cma_header(const CmaHeader& header);

// A REQ's private data under rdma_cm: the header, then user_data (at most
// kRdmaCmReqUserDataSize bytes; EMSGSIZE otherwise).
Result<PrivateData> build_rdma_cm_req_private_data(const CmaHeader& header, std::span<const uint8_t> user_data);

// The application's part of a REQ's private data (after the header), as
// the kernel hands it to the listener: everything after byte 36 of the
// 92-byte area.
std::span<const uint8_t> rdma_cm_req_user_data(std::span<const uint8_t> private_data);

}  // namespace ufab::cm
