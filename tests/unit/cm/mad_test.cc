// Tests of the CM MAD codec (core/cm/mad.h) and rdma_cm's conventions
// (core/cm/rdma_cm.h).
//
// The kernel REQ and REP below are not captures: this slice has no GSI QP
// to capture with (and no VM). They are built byte by byte, independently
// of the codec, from the Linux sources: the field offsets of
// include/rdma/ibta_vol1_c12.h (a byte offset into the CM data after the
// 24-byte MAD header, a bit offset from the most significant bit) and the
// values cm.c's cm_format_req / cm_format_rep and cma.c's cma_connect_ib /
// cma_accept_ib write for an rping client on rxe connecting over RoCEv2
// (IPv4), as the comments at each field say. Per-connection values (comm
// ids, QPNs, PSNs, transaction ids, the flow label cma derives from the
// UDP ports) are examples.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "core/cm/mad.h"
#include "core/cm/rdma_cm.h"

namespace ufab::cm {
namespace {

using Bytes = std::array<uint8_t, kMadSize>;

// Independent writer: absolute MAD offsets (24 + the table's offset).
struct Raw {
  Bytes b{};
  static constexpr size_t kCm = kMadHeaderSize;
  void u8(size_t at, uint8_t v) { b[kCm + at] = v; }
  void or8(size_t at, uint8_t v) { b[kCm + at] |= v; }
  void u16(size_t at, uint16_t v) {
    b[kCm + at] = v >> 8;
    b[kCm + at + 1] = v & 0xFF;
  }
  void u24(size_t at, uint32_t v) {
    b[kCm + at] = (v >> 16) & 0xFF;
    b[kCm + at + 1] = (v >> 8) & 0xFF;
    b[kCm + at + 2] = v & 0xFF;
  }
  void u32(size_t at, uint32_t v) {
    u16(at, v >> 16);
    u16(at + 2, v & 0xFFFF);
  }
  void u64(size_t at, uint64_t v) {
    u32(at, v >> 32);
    u32(at + 4, v & 0xFFFFFFFF);
  }
  void mem(size_t at, const void* p, size_t n) { std::memcpy(&b[kCm + at], p, n); }
  void header(uint16_t attr, uint64_t tid, uint32_t attr_mod = 0) {
    b[0] = 1;     // base version
    b[1] = 0x07;  // class: CM
    b[2] = 2;     // class version
    b[3] = 0x03;  // Send
    for (int i = 0; i < 8; ++i) b[8 + i] = (tid >> (56 - 8 * i)) & 0xFF;
    b[16] = attr >> 8;
    b[17] = attr & 0xFF;
    for (int i = 0; i < 4; ++i) b[20 + i] = (attr_mod >> (24 - 8 * i)) & 0xFF;
  }
};

Gid ipv4_gid(uint8_t a, uint8_t b, uint8_t c, uint8_t d) {
  return Gid{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, a, b, c, d};
}

PrivateData padded(PrivateData p, size_t size) {
  p.resize(size, 0);
  return p;
}

Bytes build_ok(const Mad& m) {
  auto b = build_mad(m);
  EXPECT_TRUE(b.has_value()) << (b ? "" : b.error().message());
  return b ? *b : Bytes{};
}

Mad parse_ok(const Bytes& b) {
  auto m = parse_mad(b);
  EXPECT_TRUE(m.has_value()) << (m ? "" : m.error().message());
  return m ? *m : Mad{};
}

// Parses, expects failure with the given errno and message fragment.
void expect_parse_error(const Bytes& b, int code, const std::string& fragment) {
  auto m = parse_mad(b);
  ASSERT_FALSE(m.has_value()) << "parsed although " << fragment;
  EXPECT_EQ(m.error().code(), code) << m.error().message();
  EXPECT_NE(m.error().message().find(fragment), std::string::npos) << m.error().message();
}

void expect_build_error(const Mad& mad, int code, const std::string& fragment) {
  auto b = build_mad(mad);
  ASSERT_FALSE(b.has_value()) << "built although " << fragment;
  EXPECT_EQ(b.error().code(), code) << b.error().message();
  EXPECT_NE(b.error().message().find(fragment), std::string::npos) << b.error().message();
}

// --- the kernel's REQ and REP --------------------------------------------------

constexpr uint64_t kClientGuid = 0x505400fffe123402ull;  // rxe node GUID: EUI-64 of 52:54:00:12:34:02
constexpr uint64_t kServerGuid = 0x505400fffe123401ull;
constexpr uint16_t kRpingPort = 7174;                  // rping's default port
constexpr uint16_t kClientPort = 40001;

// The REQ rping -c -a 10.0.0.1 sends from 10.0.0.2 through the kernel's
// rdma_cm over rxe.
Raw kernel_req() {
  Raw r;
  // cm_format_mad_ece_hdr: Send, class version 2, TID = agent hi_tid << 32 |
  // local comm id; attr_mod = ECE attr_mod (0 without ECE).
  r.header(0x0010, 0x000000011a2b3c4dull, 0);
  r.u32(0, 0x1a2b3c4d);              // local comm id (cm_id local_id)
  r.u24(5, 0);                       // vendor id (ECE; 0)
  r.u64(8, 0x0000000001060000ull | kRpingPort);  // RDMA_PS_TCP << 16 | port
  r.u64(16, kClientGuid);            // local CA GUID
  r.u32(28, 0);                      // Q_Key: not written for RC
  r.u24(32, 0x000011);               // local QPN
  r.u8(35, 1);                       // responder resources (rping: 1)
  r.u24(36, 0);                      // local EECN
  r.u8(39, 1);                       // initiator depth (rping: 1)
  r.u24(40, 0);                      // remote EECN
  r.or8(43, 20 << 3);                // remote CM response timeout: CMA_CM_RESPONSE_TIMEOUT 20
  r.or8(43, 0 << 1);                 // transport service type RC
  r.or8(43, 0);                      // end-to-end flow control (rping: 0)
  r.u24(44, 0x4d5e6f);               // starting PSN (random)
  r.or8(47, (20 << 3) | 7);          // local CM response timeout 20, retry count 7
  r.u16(48, 0xFFFF);                 // P_Key of the RoCE path
  r.or8(50, (3 << 4) | 7);           // path MTU IB_MTU_1024 (netdev MTU 1500), RDC 0, RNR retry 7
  r.or8(51, 15 << 4);                // max CM retries CMA_MAX_CM_RETRIES 15, SRQ 0, ext type 0
  r.u16(52, 0xFFFF);                 // primary local LID: permissive, hop limit > 1
  r.u16(54, 0xFFFF);                 // primary remote LID
  Gid src = ipv4_gid(10, 0, 0, 2), dst = ipv4_gid(10, 0, 0, 1);
  r.mem(56, src.data(), 16);         // primary local GID
  r.mem(72, dst.data(), 16);         // primary remote GID
  r.u32(88, (0x2b1c5u << 12) | 3);   // flow label (from the UDP ports), packet rate 3 (10 Gb/s)
  r.u8(92, 0);                       // traffic class (ToS 0)
  r.u8(93, 64);                      // hop limit (IPv4 route's TTL)
  r.u8(94, 0);                       // SL 0, subnet local 0 (hop limit > 1)
  r.u8(95, 17 << 3);                 // local ACK timeout: cm_ack_timeout(rxe ack delay 15, packet life 16) = 17
  // No alternate path: bytes 96..139 stay zero.
  // Private data: cma_hdr (version 0, IP version 4, source port, addresses).
  uint8_t pd[36] = {0x00, 0x40, kClientPort >> 8, kClientPort & 0xFF};
  pd[16] = 10, pd[17] = 0, pd[18] = 0, pd[19] = 2;  // src: 12 zero bytes + 10.0.0.2
  pd[32] = 10, pd[33] = 0, pd[34] = 0, pd[35] = 1;  // dst: 12 zero bytes + 10.0.0.1
  r.mem(140, pd, sizeof pd);
  return r;
}

// The REP rping -s answers it with (cma_accept_ib -> cm_format_rep).
Raw kernel_rep() {
  Raw r;
  r.header(0x0013, 0x000000011a2b3c4dull, 0);  // the REQ's TID
  r.u32(0, 0x5a6b7c8d);                // local comm id
  r.u32(4, 0x1a2b3c4d);                // remote comm id: the REQ's local one
  r.u32(8, 0);                         // Q_Key: not written for RC
  r.u24(12, 0x000012);                 // local QPN
  r.u8(15, 0);                         // vendor id high byte
  r.u24(16, 0);                        // EECN
  r.u8(19, 0);                         // vendor id middle byte
  r.u24(20, 0x0a0b0c);                 // starting PSN
  r.u8(23, 0);                         // vendor id low byte
  r.u8(24, 1);                         // responder resources
  r.u8(25, 1);                         // initiator depth
  r.u8(26, 15 << 3);                   // target ACK delay: rxe's 15; failover 0; flow control 0
  r.u8(27, 7 << 5);                    // RNR retry count 7, SRQ 0
  r.u64(28, kServerGuid);              // local CA GUID
  return r;
}

TEST(CmMadKernel, ParsesRdmaCmReqFieldByField) {
  Raw r = kernel_req();
  Mad mad = parse_ok(r.b);
  EXPECT_EQ(mad.header.base_version, 1);
  EXPECT_EQ(mad.header.mgmt_class, 0x07);
  EXPECT_EQ(mad.header.class_version, 2);
  EXPECT_EQ(mad.header.method, 0x03);
  EXPECT_EQ(mad.header.transaction_id, 0x000000011a2b3c4dull);
  EXPECT_EQ(mad.header.attribute_id, 0x0010);
  ASSERT_TRUE(std::holds_alternative<Req>(mad.message));
  const Req& q = std::get<Req>(mad.message);
  EXPECT_EQ(q.local_comm_id, 0x1a2b3c4du);
  EXPECT_EQ(q.service_id, 0x0000000001061c06ull);
  EXPECT_EQ(q.local_ca_guid, kClientGuid);
  EXPECT_EQ(q.local_qkey, 0u);
  EXPECT_EQ(q.local_qpn, 0x11u);
  EXPECT_EQ(q.responder_resources, 1);
  EXPECT_EQ(q.initiator_depth, 1);
  EXPECT_EQ(q.remote_cm_response_timeout, 20);
  EXPECT_EQ(q.transport_service_type, TransportType::kRc);
  EXPECT_FALSE(q.end_to_end_flow_control);
  EXPECT_EQ(q.starting_psn, 0x4d5e6fu);
  EXPECT_EQ(q.local_cm_response_timeout, 20);
  EXPECT_EQ(q.retry_count, 7);
  EXPECT_EQ(q.partition_key, 0xFFFF);
  EXPECT_EQ(q.path_mtu, 3);
  EXPECT_EQ(q.rnr_retry_count, 7);
  EXPECT_EQ(q.max_cm_retries, 15);
  EXPECT_FALSE(q.srq);
  EXPECT_EQ(q.primary.local_lid, 0xFFFF);
  EXPECT_EQ(q.primary.remote_lid, 0xFFFF);
  EXPECT_EQ(q.primary.local_gid, ipv4_gid(10, 0, 0, 2));
  EXPECT_EQ(q.primary.remote_gid, ipv4_gid(10, 0, 0, 1));
  EXPECT_EQ(q.primary.flow_label, 0x2b1c5u);
  EXPECT_EQ(q.primary.packet_rate, 3);
  EXPECT_EQ(q.primary.hop_limit, 64);
  EXPECT_EQ(q.primary.sl, 0);
  EXPECT_FALSE(q.primary.subnet_local);
  EXPECT_EQ(q.primary.local_ack_timeout, 17);
  EXPECT_EQ(q.alternate, Path{});
  ASSERT_EQ(q.private_data.size(), kReqPrivateDataSize);

  auto service = parse_rdma_cm_service_id(q.service_id);
  ASSERT_TRUE(service.has_value());
  EXPECT_EQ(service->port_space, kRdmaPsTcp);
  EXPECT_EQ(service->port, kRpingPort);
  auto h = parse_cma_header(q.private_data);
  ASSERT_TRUE(h.has_value()) << h.error().message();
  EXPECT_EQ(h->ip_version, 4);
  EXPECT_EQ(h->port, kClientPort);
  EXPECT_EQ(h->src_ipv4(), 0x0a000002u);
  EXPECT_EQ(h->dst_ipv4(), 0x0a000001u);
  auto user = rdma_cm_req_user_data(q.private_data);
  EXPECT_EQ(user.size(), kRdmaCmReqUserDataSize);

  // ufab builds the same bytes from the same fields.
  EXPECT_EQ(build_ok(mad), r.b);
}

TEST(CmMadKernel, BuildsTheKernelsReqFromFields) {
  Req q;
  q.local_comm_id = 0x1a2b3c4d;
  q.service_id = rdma_cm_service_id(kRdmaPsTcp, kRpingPort);
  q.local_ca_guid = kClientGuid;
  q.local_qpn = 0x11;
  q.responder_resources = 1;
  q.initiator_depth = 1;
  q.remote_cm_response_timeout = 20;
  q.starting_psn = 0x4d5e6f;
  q.local_cm_response_timeout = 20;
  q.retry_count = 7;
  q.path_mtu = 3;
  q.rnr_retry_count = 7;
  q.max_cm_retries = 15;
  q.primary = Path{0xFFFF, 0xFFFF, ipv4_gid(10, 0, 0, 2), ipv4_gid(10, 0, 0, 1), 0x2b1c5, 3, 0, 64, 0, false, 17};
  CmaHeader h;
  h.ip_version = 4;
  h.port = kClientPort;
  h.src_addr = cma_ipv4(10, 0, 0, 2);
  h.dst_addr = cma_ipv4(10, 0, 0, 1);
  auto pd = build_rdma_cm_req_private_data(h, {});
  ASSERT_TRUE(pd.has_value()) << pd.error().message();
  q.private_data = *pd;
  Mad mad{cm_header(0x000000011a2b3c4dull), q};
  EXPECT_EQ(build_ok(mad), kernel_req().b);
}

TEST(CmMadKernel, RoundTripsTheKernelsRep) {
  Raw r = kernel_rep();
  Mad mad = parse_ok(r.b);
  ASSERT_TRUE(std::holds_alternative<Rep>(mad.message));
  const Rep& p = std::get<Rep>(mad.message);
  EXPECT_EQ(p.local_comm_id, 0x5a6b7c8du);
  EXPECT_EQ(p.remote_comm_id, 0x1a2b3c4du);
  EXPECT_EQ(p.local_qpn, 0x12u);
  EXPECT_EQ(p.starting_psn, 0x0a0b0cu);
  EXPECT_EQ(p.responder_resources, 1);
  EXPECT_EQ(p.initiator_depth, 1);
  EXPECT_EQ(p.target_ack_delay, 15);
  EXPECT_EQ(p.failover_accepted, 0);
  EXPECT_FALSE(p.end_to_end_flow_control);
  EXPECT_EQ(p.rnr_retry_count, 7);
  EXPECT_FALSE(p.srq);
  EXPECT_EQ(p.local_ca_guid, kServerGuid);
  EXPECT_EQ(p.vendor_id, 0u);
  EXPECT_EQ(p.private_data, PrivateData(kRepPrivateDataSize, 0));

  Rep built;
  built.local_comm_id = 0x5a6b7c8d;
  built.remote_comm_id = 0x1a2b3c4d;
  built.local_qpn = 0x12;
  built.starting_psn = 0x0a0b0c;
  built.responder_resources = 1;
  built.initiator_depth = 1;
  built.target_ack_delay = 15;
  built.rnr_retry_count = 7;
  built.local_ca_guid = kServerGuid;
  EXPECT_EQ(build_ok(Mad{cm_header(0x000000011a2b3c4dull), built}), r.b);
}

// --- bit placement: every field at its maximum leaves exactly the reserved bits clear

// Reserved bits of a message (CM-data offsets), from the IBTA tables.
using Mask = std::vector<std::pair<size_t, uint8_t>>;  // byte, reserved bits there

void expect_only_reserved_clear(const Bytes& b, const Mask& reserved) {
  std::array<uint8_t, kCmDataSize> expect;
  expect.fill(0xFF);
  for (auto [at, bits] : reserved) expect[at] &= static_cast<uint8_t>(~bits);
  for (size_t i = 0; i < kCmDataSize; ++i)
    EXPECT_EQ(b[kMadHeaderSize + i], expect[i]) << "CM data byte " << i;
}

Path max_path() {
  Gid ones;
  ones.fill(0xFF);
  return Path{0xFFFF, 0xFFFF, ones, ones, 0xFFFFF, 0x3F, 0xFF, 0xFF, 0xF, true, 0x1F};
}

TEST(CmMadBits, ReqFieldsAtMaximumFillAllButReservedBits) {
  Req q;
  q.local_comm_id = 0xFFFFFFFF;
  q.vendor_id = 0xFFFFFF;
  q.service_id = ~0ull;
  q.local_ca_guid = ~0ull;
  q.local_qkey = 0xFFFFFFFF;
  q.local_qpn = 0xFFFFFF;
  q.responder_resources = 0xFF;
  q.local_eecn = 0xFFFFFF;
  q.initiator_depth = 0xFF;
  q.remote_eecn = 0xFFFFFF;
  q.remote_cm_response_timeout = 0x1F;
  q.transport_service_type = TransportType::kExtended;
  q.end_to_end_flow_control = true;
  q.starting_psn = 0xFFFFFF;
  q.local_cm_response_timeout = 0x1F;
  q.retry_count = 7;
  q.partition_key = 0xFFFF;
  q.path_mtu = 0xF;
  q.rdc_exists = true;
  q.rnr_retry_count = 7;
  q.max_cm_retries = 0xF;
  q.srq = true;
  q.extended_transport_type = 7;
  q.primary = max_path();
  q.alternate = max_path();
  q.sap_supported = true;
  q.private_data = PrivateData(kReqPrivateDataSize, 0xFF);
  Bytes b = build_ok(Mad{cm_header(1), q});
  // Byte 4 (before the vendor id), 24-27, flow label word's 6 reserved
  // bits (byte 90 low nibble, byte 91 top 2), SL byte low 3, ACK timeout
  // byte low 3 (byte 139: low 2, bit 5 is SAP).
  expect_only_reserved_clear(b, {{4, 0xFF}, {24, 0xFF}, {25, 0xFF}, {26, 0xFF}, {27, 0xFF},
                                 {90, 0x0F}, {91, 0xC0}, {94, 0x07}, {95, 0x07},
                                 {134, 0x0F}, {135, 0xC0}, {138, 0x07}, {139, 0x03}});
  EXPECT_EQ(parse_ok(b).message, Message(q)) << "round trip";
}

TEST(CmMadBits, RepFieldsAtMaximumFillAllButReservedBits) {
  Rep p;
  p.local_comm_id = p.remote_comm_id = p.local_qkey = 0xFFFFFFFF;
  p.local_qpn = p.local_eecn = p.starting_psn = p.vendor_id = 0xFFFFFF;
  p.responder_resources = p.initiator_depth = 0xFF;
  p.target_ack_delay = 0x1F;
  p.failover_accepted = 3;
  p.end_to_end_flow_control = true;
  p.rnr_retry_count = 7;
  p.srq = true;
  p.local_ca_guid = ~0ull;
  p.private_data = PrivateData(kRepPrivateDataSize, 0xFF);
  Bytes b = build_ok(Mad{cm_header(1), p});
  expect_only_reserved_clear(b, {{27, 0x0F}});
  EXPECT_EQ(parse_ok(b).message, Message(p));
}

TEST(CmMadBits, LapFieldsAtMaximumFillAllButReservedBits) {
  Lap l;
  l.local_comm_id = l.remote_comm_id = 0xFFFFFFFF;
  l.remote_qpn_eecn = 0xFFFFFF;
  l.remote_cm_response_timeout = 0x1F;
  l.alternate = max_path();
  l.private_data = PrivateData(kLapPrivateDataSize, 0xFF);
  Bytes b = build_ok(Mad{cm_header(1), l});
  expect_only_reserved_clear(b, {{8, 0xFF}, {9, 0xFF}, {10, 0xFF}, {11, 0xFF}, {15, 0x07},
                                 {16, 0xFF}, {17, 0xFF}, {18, 0xFF}, {19, 0xFF},
                                 {58, 0x0F}, {61, 0xC0}, {62, 0x07}, {63, 0x07}});
  EXPECT_EQ(parse_ok(b).message, Message(l));
}

TEST(CmMadBits, ShortMessagesFieldsAtMaximum) {
  Mra m{0xFFFFFFFF, 0xFFFFFFFF, MessageCode::kOther, 0x1F, PrivateData(kMraPrivateDataSize, 0xFF)};
  Bytes b = build_ok(Mad{cm_header(1), m});
  EXPECT_EQ(b[kMadHeaderSize + 8], 0x80);  // message MRAed 2 in the top 2 bits
  EXPECT_EQ(b[kMadHeaderSize + 9], 0xF8);  // service timeout in the top 5
  EXPECT_EQ(parse_ok(b).message, Message(m));

  Rej j{0xFFFFFFFF, 0xFFFFFFFF, MessageCode::kOther, 0xFFFF, std::vector<uint8_t>(kRejAriSize, 0xFF),
        PrivateData(kRejPrivateDataSize, 0xFF)};
  b = build_ok(Mad{cm_header(1), j});
  EXPECT_EQ(b[kMadHeaderSize + 8], 0x80);
  EXPECT_EQ(b[kMadHeaderSize + 9], 72 << 1);  // rejected info length in the top 7 bits
  EXPECT_EQ(parse_ok(b).message, Message(j));

  Dreq d{0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFF, PrivateData(kDreqPrivateDataSize, 0xFF)};
  b = build_ok(Mad{cm_header(1), d});
  EXPECT_EQ(b[kMadHeaderSize + 11], 0x00);  // reserved byte after the 24-bit QPN
  EXPECT_EQ(parse_ok(b).message, Message(d));

  SidrRep s{0xFFFFFFFF, 0xFF, 0xFFFFFF, 0xFFFFFF, ~0ull, 0xFFFFFFFF, std::vector<uint8_t>(kSidrRepInfoSize, 0xFF),
            PrivateData(kSidrRepPrivateDataSize, 0xFF)};
  b = build_ok(Mad{cm_header(1), s});
  for (size_t i = 0; i < kCmDataSize; ++i) EXPECT_EQ(b[kMadHeaderSize + i], i == 5 ? 72 : 0xFF) << i;
  EXPECT_EQ(parse_ok(b).message, Message(s));

  Apr a{0xFFFFFFFF, 0xFFFFFFFF, 0xFF, std::vector<uint8_t>(kAprInfoSize, 0xFF), PrivateData(kAprPrivateDataSize, 0xFF)};
  b = build_ok(Mad{cm_header(1), a});
  EXPECT_EQ(b[kMadHeaderSize + 8], 72);
  EXPECT_EQ(b[kMadHeaderSize + 10], 0);  // reserved
  EXPECT_EQ(parse_ok(b).message, Message(a));
}

// --- round trips of every message ----------------------------------------------

std::vector<Message> examples() {
  std::vector<Message> v;
  Req q;
  q.local_comm_id = 0x01020304;
  q.vendor_id = 0x02c9;
  q.service_id = rdma_cm_service_id(kRdmaPsTcp, 4791);
  q.local_ca_guid = 0x0011223344556677;
  q.local_qkey = 0x11112222;
  q.local_qpn = 0xABCDEF;
  q.responder_resources = 16;
  q.initiator_depth = 8;
  q.remote_cm_response_timeout = 22;
  q.transport_service_type = TransportType::kUc;
  q.end_to_end_flow_control = true;
  q.starting_psn = 0x123456;
  q.local_cm_response_timeout = 21;
  q.retry_count = 6;
  q.partition_key = 0x8001;
  q.path_mtu = 5;
  q.rnr_retry_count = 3;
  q.max_cm_retries = 9;
  q.srq = true;
  q.primary = Path{0x11, 0x22, ipv4_gid(1, 2, 3, 4), ipv4_gid(5, 6, 7, 8), 0xABCDE, 0x2A, 0x28, 1, 5, true, 14};
  q.alternate = Path{0x33, 0x44, ipv4_gid(9, 9, 9, 9), ipv4_gid(8, 8, 8, 8), 0x12345, 7, 3, 2, 9, false, 30};
  q.sap_supported = true;
  q.private_data = padded({1, 2, 3}, kReqPrivateDataSize);
  v.push_back(q);
  v.push_back(Mra{7, 8, MessageCode::kRep, 24, padded({9}, kMraPrivateDataSize)});
  v.push_back(Rej{7, 8, MessageCode::kReq, static_cast<uint16_t>(RejectReason::kConsumerDefined), {1, 2, 3, 4},
                  padded({'n', 'o'}, kRejPrivateDataSize)});
  Rep p;
  p.local_comm_id = 10;
  p.remote_comm_id = 11;
  p.local_qkey = 0x80010000;
  p.local_qpn = 0x654321;
  p.local_eecn = 0x000abc;
  p.starting_psn = 0xFEDCBA;
  p.vendor_id = 0x123456;
  p.responder_resources = 4;
  p.initiator_depth = 2;
  p.target_ack_delay = 15;
  p.failover_accepted = 2;
  p.end_to_end_flow_control = true;
  p.rnr_retry_count = 5;
  p.srq = true;
  p.local_ca_guid = 0x1234;
  p.private_data = padded({5, 6}, kRepPrivateDataSize);
  v.push_back(p);
  v.push_back(Rtu{12, 13, padded({}, kRtuPrivateDataSize)});
  v.push_back(Dreq{14, 15, 0x000777, padded({1}, kDreqPrivateDataSize)});
  v.push_back(Drep{16, 17, padded({2}, kDrepPrivateDataSize)});
  v.push_back(SidrReq{18, 0x7FFF, rdma_cm_service_id(kRdmaPsUdp, 5000), padded({3}, kSidrReqPrivateDataSize)});
  v.push_back(SidrRep{19, static_cast<uint8_t>(SidrStatus::kSuccess), 0x00AABB, 0x000123,
                      rdma_cm_service_id(kRdmaPsUdp, 5000), 0x01234567, {1, 2}, padded({4}, kSidrRepPrivateDataSize)});
  v.push_back(Lap{20, 21, 0x000555, 19,
                  Path{0x55, 0x66, ipv4_gid(1, 1, 1, 1), ipv4_gid(2, 2, 2, 2), 0x54321, 0x11, 0x22, 0x33, 4, true, 12},
                  padded({5}, kLapPrivateDataSize)});
  v.push_back(Apr{22, 23, static_cast<uint8_t>(AprStatus::kUnsupported), {7}, padded({6}, kAprPrivateDataSize)});
  return v;
}

TEST(CmMadRoundTrip, EveryMessage) {
  auto all = examples();
  ASSERT_EQ(all.size(), std::variant_size_v<Message>);
  for (const Message& msg : all) {
    Mad mad{cm_header(0xDEADBEEF00000001ull, 0x5), msg};
    mad.header.attribute_id = static_cast<uint16_t>(attribute_of(msg));
    SCOPED_TRACE(std::string(attribute_name(mad.header.attribute_id)));
    Bytes b = build_ok(mad);
    EXPECT_EQ(b[16] << 8 | b[17], mad.header.attribute_id);
    EXPECT_EQ(parse_ok(b), mad);
    EXPECT_EQ(build_ok(parse_ok(b)), b);
  }
}

TEST(CmMadRoundTrip, ShortPrivateDataIsZeroPadded) {
  Rtu r{1, 2, {0xAA, 0xBB}};
  Bytes b = build_ok(Mad{cm_header(3), r});
  EXPECT_EQ(b[kMadHeaderSize + 8], 0xAA);
  EXPECT_EQ(b[kMadHeaderSize + 9], 0xBB);
  EXPECT_EQ(b[kMadHeaderSize + 10], 0x00);
  const Rtu& back = std::get<Rtu>(parse_ok(b).message);
  EXPECT_EQ(back.private_data, padded({0xAA, 0xBB}, kRtuPrivateDataSize));
}

TEST(CmMadRoundTrip, BuildWritesTheMessagesAttributeIdNotTheHeaders) {
  Mad mad{cm_header(3), Drep{1, 2, {}}};
  mad.header.attribute_id = 0x0010;  // REQ: ignored
  Bytes b = build_ok(mad);
  EXPECT_EQ(b[16] << 8 | b[17], 0x0016);
}

TEST(CmMadRoundTrip, ReservedBitsAreIgnoredOnParse) {
  Raw r = kernel_req();
  r.b[kMadHeaderSize + 4] = 0xFF;   // reserved byte
  r.b[kMadHeaderSize + 24] = 0xFF;  // reserved word
  r.b[kMadHeaderSize + 94] |= 0x07;
  r.b[kMadHeaderSize + 95] |= 0x07;
  Mad m = parse_ok(r.b);
  EXPECT_EQ(m, parse_ok(kernel_req().b));
  EXPECT_EQ(build_ok(m), kernel_req().b);  // rebuilt with the reserved bits clear
}

// --- field limits on build -----------------------------------------------------

TEST(CmMadLimits, OversizedFieldsAreRefusedByName) {
  auto req = [] { return std::get<Req>(examples()[0]); };
  struct Case {
    const char* field;
    void (*edit)(Req&);
  };
  const Case cases[] = {
      {"local QPN", [](Req& q) { q.local_qpn = 0x1000000; }},
      {"starting PSN", [](Req& q) { q.starting_psn = 0x1000000; }},
      {"vendor id", [](Req& q) { q.vendor_id = 0x1000000; }},
      {"local EECN", [](Req& q) { q.local_eecn = 0x1000000; }},
      {"remote EECN", [](Req& q) { q.remote_eecn = 0x1000000; }},
      {"remote CM response timeout", [](Req& q) { q.remote_cm_response_timeout = 32; }},
      {"local CM response timeout", [](Req& q) { q.local_cm_response_timeout = 32; }},
      {"transport service type", [](Req& q) { q.transport_service_type = static_cast<TransportType>(4); }},
      {"retry count", [](Req& q) { q.retry_count = 8; }},
      {"RNR retry count", [](Req& q) { q.rnr_retry_count = 8; }},
      {"path MTU", [](Req& q) { q.path_mtu = 16; }},
      {"max CM retries", [](Req& q) { q.max_cm_retries = 16; }},
      {"extended transport type", [](Req& q) { q.extended_transport_type = 8; }},
      {"primary path flow label", [](Req& q) { q.primary.flow_label = 0x100000; }},
      {"primary path packet rate", [](Req& q) { q.primary.packet_rate = 64; }},
      {"primary path SL", [](Req& q) { q.primary.sl = 16; }},
      {"primary path local ACK timeout", [](Req& q) { q.primary.local_ack_timeout = 32; }},
      {"alternate path flow label", [](Req& q) { q.alternate.flow_label = 0x100000; }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.field);
    Req q = req();
    c.edit(q);
    expect_build_error(Mad{cm_header(1), q}, EINVAL, std::string("REQ: ") + c.field + " is");
  }
}

TEST(CmMadLimits, PrivateDataAtItsMaximumBuildsAndOneMoreByteDoesNot) {
  struct Case {
    Message at_max;
    Message over;
    size_t max;
  };
  auto pd = [](size_t n) { return PrivateData(n, 0x5A); };
  const Case cases[] = {
      {Req{.private_data = pd(92)}, Req{.private_data = pd(93)}, 92},
      {Mra{.private_data = pd(222)}, Mra{.private_data = pd(223)}, 222},
      {Rej{.private_data = pd(148)}, Rej{.private_data = pd(149)}, 148},
      {Rep{.private_data = pd(196)}, Rep{.private_data = pd(197)}, 196},
      {Rtu{.private_data = pd(224)}, Rtu{.private_data = pd(225)}, 224},
      {Dreq{.private_data = pd(220)}, Dreq{.private_data = pd(221)}, 220},
      {Drep{.private_data = pd(224)}, Drep{.private_data = pd(225)}, 224},
      {SidrReq{.private_data = pd(216)}, SidrReq{.private_data = pd(217)}, 216},
      {SidrRep{.private_data = pd(136)}, SidrRep{.private_data = pd(137)}, 136},
      {Lap{.private_data = pd(168)}, Lap{.private_data = pd(169)}, 168},
      {Apr{.private_data = pd(148)}, Apr{.private_data = pd(149)}, 148},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(attribute_name(static_cast<uint16_t>(attribute_of(c.at_max)))));
    Bytes b = build_ok(Mad{cm_header(1), c.at_max});
    EXPECT_EQ(parse_ok(b).message, c.at_max);
    // The private data ends the message: its last byte is the MAD's last.
    EXPECT_EQ(b[kMadSize - 1], 0x5A);
    EXPECT_EQ(b[kMadSize - c.max - 1] == 0x5A, false) << "private data starts " << c.max << " bytes from the end";
    expect_build_error(Mad{cm_header(1), c.over}, EMSGSIZE,
                       "private data is " + std::to_string(c.max + 1) + " bytes but the message carries at most " +
                           std::to_string(c.max));
  }
}

TEST(CmMadLimits, AdditionalInformationAndCodes) {
  expect_build_error(Mad{cm_header(1), Rej{.ari = std::vector<uint8_t>(73, 1)}}, EMSGSIZE, "ARI is 73 bytes");
  expect_build_error(Mad{cm_header(1), Apr{.additional_info = std::vector<uint8_t>(73, 1)}}, EMSGSIZE,
                     "additional information is 73 bytes");
  expect_build_error(Mad{cm_header(1), SidrRep{.additional_info = std::vector<uint8_t>(73, 1)}}, EMSGSIZE,
                     "additional information is 73 bytes");
  expect_build_error(Mad{cm_header(1), SidrRep{.qpn = 0x1000000}}, EINVAL, "QPN is 16777216");
  expect_build_error(Mad{cm_header(1), Mra{.message_mraed = static_cast<MessageCode>(3)}}, EINVAL, "message MRAed");
  expect_build_error(Mad{cm_header(1), Mra{.service_timeout = 32}}, EINVAL, "service timeout");
  expect_build_error(Mad{cm_header(1), Rej{.message_rejected = static_cast<MessageCode>(3)}}, EINVAL,
                     "message rejected");
  expect_build_error(Mad{cm_header(1), Rep{.target_ack_delay = 32}}, EINVAL, "target ACK delay");
  expect_build_error(Mad{cm_header(1), Rep{.failover_accepted = 4}}, EINVAL, "failover accepted");
  expect_build_error(Mad{cm_header(1), Dreq{.remote_qpn_eecn = 0x1000000}}, EINVAL, "remote QPN/EECN");
  expect_build_error(Mad{cm_header(1), Lap{.remote_cm_response_timeout = 32}}, EINVAL,
                     "remote CM response timeout");
  expect_build_error(Mad{cm_header(1), Lap{.alternate = Path{.sl = 16}}}, EINVAL, "alternate path SL");
}

// --- malformed input -----------------------------------------------------------

TEST(CmMadMalformed, WrongSize) {
  Bytes good = kernel_req().b;
  for (size_t n : {size_t{0}, size_t{23}, size_t{24}, size_t{255}}) {
    auto m = parse_mad(std::span<const uint8_t>(good.data(), n));
    ASSERT_FALSE(m.has_value());
    EXPECT_EQ(m.error().code(), EMSGSIZE);
    EXPECT_NE(m.error().message().find(std::to_string(n) + " bytes"), std::string::npos) << m.error().message();
  }
  std::vector<uint8_t> longer(good.begin(), good.end());
  longer.push_back(0);
  auto m = parse_mad(longer);
  ASSERT_FALSE(m.has_value());
  EXPECT_NE(m.error().message().find("257 bytes, but a MAD is exactly 256"), std::string::npos);
}

TEST(CmMadMalformed, HeaderFields) {
  Bytes b = kernel_req().b;
  b[0] = 2;
  expect_parse_error(b, EPROTONOSUPPORT, "base version is 2, expected 1");
  b = kernel_req().b;
  b[1] = 0x04;
  expect_parse_error(b, ENOTSUP, "management class is 0x04, expected 0x07");
  b = kernel_req().b;
  b[2] = 1;
  expect_parse_error(b, EPROTONOSUPPORT, "CM class version is 1, expected 2");
  b = kernel_req().b;
  b[3] = 0x81;
  expect_parse_error(b, ENOTSUP, "method is 0x81");
  b = kernel_req().b;
  b[3] = 0x01;
  expect_parse_error(b, ENOTSUP, "method is 0x01");
  for (uint16_t attr : {0x0000, 0x0001, 0x000F, 0x001B, 0xFFFF}) {
    b = kernel_req().b;
    b[16] = attr >> 8;
    b[17] = attr & 0xFF;
    char want[64];
    std::snprintf(want, sizeof want, "attribute id 0x%04x is not a CM message", attr);
    expect_parse_error(b, ENOTSUP, want);
  }
}

TEST(CmMadMalformed, LengthsAndCodesInsideMessages) {
  Bytes b = build_ok(Mad{cm_header(1), Rej{}});
  b[kMadHeaderSize + 9] = 73 << 1;
  expect_parse_error(b, EBADMSG, "REJ rejected info length is 73 but the ARI field holds 72 bytes");
  b[kMadHeaderSize + 9] = 72 << 1;
  EXPECT_EQ(std::get<Rej>(parse_ok(b).message).ari.size(), 72u);
  b[kMadHeaderSize + 8] = 0xC0;
  expect_parse_error(b, EBADMSG, "REJ message rejected is 3, which is reserved");

  b = build_ok(Mad{cm_header(1), Mra{}});
  b[kMadHeaderSize + 8] = 0xC0;
  expect_parse_error(b, EBADMSG, "MRA message MRAed is 3, which is reserved");

  b = build_ok(Mad{cm_header(1), SidrRep{}});
  b[kMadHeaderSize + 5] = 73;
  expect_parse_error(b, EBADMSG, "SIDR_REP additional information length is 73");

  b = build_ok(Mad{cm_header(1), Apr{}});
  b[kMadHeaderSize + 8] = 255;
  expect_parse_error(b, EBADMSG, "APR additional information length is 255");
}

TEST(CmMadMalformed, HeaderParsesAloneForAnsweringBadMads) {
  Bytes b = kernel_req().b;
  b[2] = 1;  // class version a REJ would answer
  auto h = parse_mad_header(b);
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->class_version, 1);
  EXPECT_EQ(h->transaction_id, 0x000000011a2b3c4dull);
  EXPECT_FALSE(parse_mad_header(std::span<const uint8_t>(b.data(), 23)).has_value());
}

TEST(CmMadNames, AttributesAndReasons) {
  EXPECT_EQ(attribute_name(0x0010), "REQ");
  EXPECT_EQ(attribute_name(0x001A), "APR");
  EXPECT_EQ(attribute_name(0x0001), "unknown");
  EXPECT_EQ(reject_reason_name(28), "consumer defined");
  EXPECT_EQ(reject_reason_name(8), "invalid service id");
  EXPECT_EQ(reject_reason_name(35), "vendor option not supported");
  EXPECT_EQ(reject_reason_name(34), "unknown reason 34");
  EXPECT_EQ(reject_reason_name(0), "unknown reason 0");
  EXPECT_EQ(reject_reason_name(999), "unknown reason 999");
}

// --- rdma_cm ---------------------------------------------------------------------

TEST(RdmaCm, ServiceIds) {
  EXPECT_EQ(rdma_cm_service_id(kRdmaPsTcp, 0x1234), 0x0000000001061234ull);
  EXPECT_EQ(rdma_cm_service_id(kRdmaPsUdp, 1), 0x0000000001110001ull);
  EXPECT_EQ(rdma_cm_service_id(kRdmaPsIb, 0xFFFF), 0x00000000013FFFFFull);
  auto s = parse_rdma_cm_service_id(0x0000000001060017ull);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(*s, (RdmaCmService{kRdmaPsTcp, 23}));
  for (uint64_t bad : {0ull, 0x0000000002060017ull, 0x1000000001060017ull, 0x0200000000000001ull}) {
    auto r = parse_rdma_cm_service_id(bad);
    ASSERT_FALSE(r.has_value()) << std::hex << bad;
    EXPECT_EQ(r.error().code(), EINVAL);
    EXPECT_NE(r.error().message().find("is not an rdma_cm one"), std::string::npos);
  }
}

TEST(RdmaCm, Ipv4HeaderRoundTrip) {
  CmaHeader h{4, 40001, cma_ipv4(192, 168, 1, 2), cma_ipv4(0xC0A80103)};
  auto b = build_cma_header(h);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ((*b)[0], 0x00);
  EXPECT_EQ((*b)[1], 0x40);
  EXPECT_EQ((*b)[2], 40001 >> 8);
  EXPECT_EQ((*b)[3], 40001 & 0xFF);
  for (int i = 4; i < 16; ++i) EXPECT_EQ((*b)[i], 0) << i;
  EXPECT_EQ((*b)[16], 192);
  EXPECT_EQ((*b)[35], 3);
  auto back = parse_cma_header(*b);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(*back, h);
  EXPECT_EQ(back->src_ipv4(), 0xC0A80102u);
  EXPECT_EQ(back->dst_ipv4(), 0xC0A80103u);
}

TEST(RdmaCm, Ipv6AndIpv4MappedHeaders) {
  CmaAddress v6{0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x50, 0x54, 0, 0xff, 0xfe, 0x12, 0x34, 0x56};
  CmaAddress mapped{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 10, 0, 0, 7};
  CmaHeader h{6, 7, v6, mapped};
  auto b = build_cma_header(h);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ((*b)[1], 0x60);
  auto back = parse_cma_header(*b);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(*back, h);
  EXPECT_EQ(back->src_ipv4(), std::nullopt);
  EXPECT_EQ(back->dst_ipv4(), 0x0a000007u);
  // The low nibble of byte 1 is not the IP version: ignored.
  (*b)[1] = 0x6F;
  EXPECT_EQ(parse_cma_header(*b)->ip_version, 6);
}

TEST(RdmaCm, HeaderErrors) {
  std::array<uint8_t, kCmaHeaderSize> b = *build_cma_header(CmaHeader{});
  auto r = parse_cma_header(std::span<const uint8_t>(b.data(), 35));
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message().find("35 bytes, shorter than the 36-byte header"), std::string::npos);
  b[0] = 1;
  r = parse_cma_header(b);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message().find("version is 1, expected 0"), std::string::npos);
  b[0] = 0;
  for (uint8_t v : {0x00, 0x50, 0xF0}) {
    b[1] = v;
    r = parse_cma_header(b);
    ASSERT_FALSE(r.has_value());
    EXPECT_EQ(r.error().code(), EBADMSG);
    EXPECT_NE(r.error().message().find("IP version (high nibble of byte 1) is " + std::to_string(v >> 4)),
              std::string::npos);
  }
  auto w = build_cma_header(CmaHeader{5, 0, {}, {}});
  ASSERT_FALSE(w.has_value());
  EXPECT_EQ(w.error().code(), EINVAL);
  CmaAddress mapped{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 10, 0, 0, 7};
  w = build_cma_header(CmaHeader{4, 0, mapped, {}});
  ASSERT_FALSE(w.has_value());
  EXPECT_NE(w.error().message().find("nonzero bytes before its last 4"), std::string::npos);
}

TEST(RdmaCm, ReqPrivateDataCarriesUpTo56UserBytes) {
  CmaHeader h{4, 1, cma_ipv4(1, 2, 3, 4), cma_ipv4(5, 6, 7, 8)};
  std::vector<uint8_t> user(56);
  for (size_t i = 0; i < user.size(); ++i) user[i] = static_cast<uint8_t>(i + 1);
  auto pd = build_rdma_cm_req_private_data(h, user);
  ASSERT_TRUE(pd.has_value());
  EXPECT_EQ(pd->size(), kReqPrivateDataSize);
  Req q;
  q.private_data = *pd;
  Mad mad = parse_ok(build_ok(Mad{cm_header(1), q}));
  const Req& back = std::get<Req>(mad.message);
  EXPECT_EQ(*parse_cma_header(back.private_data), h);
  auto got = rdma_cm_req_user_data(back.private_data);
  EXPECT_EQ(std::vector<uint8_t>(got.begin(), got.end()), user);

  user.push_back(57);
  auto over = build_rdma_cm_req_private_data(h, user);
  ASSERT_FALSE(over.has_value());
  EXPECT_EQ(over.error().code(), EMSGSIZE);
  EXPECT_NE(over.error().message().find("57 bytes of private data, but a REQ has room for 56"), std::string::npos);
  EXPECT_TRUE(rdma_cm_req_user_data(std::span<const uint8_t>(pd->data(), 36)).empty());
}

}  // namespace
}  // namespace ufab::cm
