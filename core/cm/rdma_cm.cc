#include "core/cm/rdma_cm.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "core/roce/bytes.h"

namespace ufab::cm {

namespace {

std::string hex64(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

bool is_zero(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] != 0) return false;
  return true;
}

std::optional<uint32_t> ipv4_of(uint8_t ip_version, const CmaAddress& a) {
  if (ip_version == 4) return roce::load_be32(a.data() + 12);
  static constexpr uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};
  if (ip_version == 6 && std::memcmp(a.data(), kMapped, 12) == 0) return roce::load_be32(a.data() + 12);
  return std::nullopt;
}

}  // namespace

Result<RdmaCmService> parse_rdma_cm_service_id(uint64_t service_id) {
  if ((service_id & kRdmaCmServiceIdMask) != kRdmaCmServiceIdBase)
    return fail(EINVAL, "service id " + hex64(service_id) +
                            " is not an rdma_cm one (0x0000000001PPPPNNNN: port space PPPP, port NNNN); it is a "
                            "native IB CM service, which ufab does not serve");
  return RdmaCmService{static_cast<uint16_t>(service_id >> 16), static_cast<uint16_t>(service_id)};
}

CmaAddress cma_ipv4(uint32_t address) {
  CmaAddress a{};
  roce::store_be32(a.data() + 12, address);
  return a;
}

CmaAddress cma_ipv4(uint8_t a, uint8_t b, uint8_t c, uint8_t d) {
  return cma_ipv4((uint32_t{a} << 24) | (uint32_t{b} << 16) | (uint32_t{c} << 8) | d);
}

std::optional<uint32_t> CmaHeader::src_ipv4() const { return ipv4_of(ip_version, src_addr); }
std::optional<uint32_t> CmaHeader::dst_ipv4() const { return ipv4_of(ip_version, dst_addr); }

Result<CmaHeader> parse_cma_header(std::span<const uint8_t> private_data) {
  if (private_data.size() < kCmaHeaderSize)
    return fail(EBADMSG, "rdma_cm header rejected: the REQ private data is " + std::to_string(private_data.size()) +
                             " bytes, shorter than the 36-byte header");
  const uint8_t* p = private_data.data();
  if (p[0] != kCmaVersion)
    return fail(EBADMSG, "rdma_cm header rejected: version is " + std::to_string(p[0]) +
                             ", expected 0 (the peer is not rdma_cm, or a newer one)");
  CmaHeader h;
  h.ip_version = p[1] >> 4;
  if (h.ip_version != 4 && h.ip_version != 6)
    return fail(EBADMSG, "rdma_cm header rejected: IP version (high nibble of byte 1) is " +
                             std::to_string(h.ip_version) + ", expected 4 or 6");
  h.port = roce::load_be16(p + 2);
  std::memcpy(h.src_addr.data(), p + 4, 16);
  std::memcpy(h.dst_addr.data(), p + 20, 16);
  return h;
}

Result<std::array<uint8_t, kCmaHeaderSize>> build_cma_header(const CmaHeader& header) {
  if (header.ip_version != 4 && header.ip_version != 6)
    return fail(EINVAL, "building an rdma_cm header: IP version " + std::to_string(header.ip_version) +
                            " is neither 4 nor 6");
  if (header.ip_version == 4 &&
      (!is_zero(header.src_addr.data(), 12) || !is_zero(header.dst_addr.data(), 12)))
    return fail(EINVAL,
                "building an rdma_cm header: IP version 4 but an address has nonzero bytes before its last 4; "
                "write IPv4 addresses with cma_ipv4(), or use IP version 6 for IPv6 and IPv4-mapped addresses");
  std::array<uint8_t, kCmaHeaderSize> out{};
  out[0] = kCmaVersion;
  out[1] = static_cast<uint8_t>(header.ip_version << 4);
  roce::store_be16(out.data() + 2, header.port);
  std::memcpy(out.data() + 4, header.src_addr.data(), 16);
  std::memcpy(out.data() + 20, header.dst_addr.data(), 16);
  return out;
}

Result<PrivateData> build_rdma_cm_req_private_data(const CmaHeader& header, std::span<const uint8_t> user_data) {
  if (user_data.size() > kRdmaCmReqUserDataSize)
    return fail(EMSGSIZE, "building an rdma_cm REQ: " + std::to_string(user_data.size()) +
                              " bytes of private data, but a REQ has room for " +
                              std::to_string(kRdmaCmReqUserDataSize) + " after rdma_cm's 36-byte header; send less");
  auto h = build_cma_header(header);
  if (!h) return std::unexpected(h.error());
  PrivateData out(h->begin(), h->end());
  out.insert(out.end(), user_data.begin(), user_data.end());
  return out;
}

std::span<const uint8_t> rdma_cm_req_user_data(std::span<const uint8_t> private_data) {
  if (private_data.size() <= kCmaHeaderSize) return {};
  return private_data.subspan(kCmaHeaderSize);
}

}  // namespace ufab::cm
