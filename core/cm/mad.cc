// CM MAD codec. Offsets are those of IBTA vol 1 ch 12's message tables as
// the Linux kernel writes them (include/rdma/ibta_vol1_c12.h): a byte
// offset from the start of the CM data (after the 24-byte MAD header) and a
// bit offset counted from the most significant bit of that byte.
#include "core/cm/mad.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <bit>
#include <initializer_list>
#include <string_view>
#include <type_traits>

#include "core/roce/bytes.h"

namespace ufab::cm {

namespace {

using roce::load_be16;
using roce::load_be24;
using roce::load_be32;
using roce::load_be64;
using roce::store_be16;
using roce::store_be24;
using roce::store_be32;
using roce::store_be64;

// A small "{}" / "{:0Nx}" formatter for the error messages (gcc 12 has no
// <format>).
struct FmtArg {
  bool number;
  uint64_t value;
  std::string_view text;
};

template <typename T>
FmtArg fmt_arg(const T& v) {
  if constexpr (std::is_integral_v<T> || std::is_enum_v<T>)
    return {true, static_cast<uint64_t>(v), {}};
  else
    return {false, 0, std::string_view(v)};
}

std::string fmt_list(std::string_view f, std::initializer_list<FmtArg> args) {
  std::string out;
  auto next = args.begin();
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] != '{') {
      out += f[i];
      continue;
    }
    size_t close = f.find('}', i);
    std::string_view spec = f.substr(i + 1, close - i - 1);
    i = close;
    if (next == args.end()) break;
    const FmtArg& a = *next++;
    if (!a.number) {
      out += a.text;
    } else if (spec.size() == 4 && spec[0] == ':' && spec[1] == '0' && spec[3] == 'x') {
      char buf[24];
      std::snprintf(buf, sizeof buf, "%0*llx", spec[2] - '0', static_cast<unsigned long long>(a.value));
      out += buf;
    } else {
      out += std::to_string(a.value);
    }
  }
  return out;
}

template <typename... Args>
std::string fmt(std::string_view f, const Args&... args) {
  return fmt_list(f, {fmt_arg(args)...});
}

// --- reading (d points at the CM data, kCmDataSize bytes) ---

// width bits at [byte].bit (bit 0 = most significant), within one byte.
uint8_t get_bits(const uint8_t* d, size_t byte, unsigned bit, unsigned width) {
  return static_cast<uint8_t>((d[byte] >> (8 - bit - width)) & ((1u << width) - 1));
}

// A 24-bit field in the top three bytes of the 32-bit word at byte.
uint32_t get24(const uint8_t* d, size_t byte) { return load_be24(d + byte); }

// The 20-bit flow label in the top bits of the 32-bit word at byte.
uint32_t get_flow_label(const uint8_t* d, size_t byte) { return load_be32(d + byte) >> 12; }

PrivateData get_area(const uint8_t* d, size_t byte, size_t size) { return PrivateData(d + byte, d + byte + size); }

// --- writing (the buffer starts zeroed; every field is written once) ---

class Writer {
 public:
  explicit Writer(uint8_t* d) : d_(d) {}

  void bits(size_t byte, unsigned bit, unsigned width, unsigned v) {
    d_[byte] = static_cast<uint8_t>(d_[byte] | ((v & ((1u << width) - 1)) << (8 - bit - width)));
  }
  void u8(size_t byte, uint8_t v) { d_[byte] = v; }
  void u16(size_t byte, uint16_t v) { store_be16(d_ + byte, v); }
  void u24(size_t byte, uint32_t v) { store_be24(d_ + byte, v); }
  void u32(size_t byte, uint32_t v) { store_be32(d_ + byte, v); }
  void u64(size_t byte, uint64_t v) { store_be64(d_ + byte, v); }
  void flow_label(size_t byte, uint32_t v) {
    // Top 20 bits of the word; the low 12 bits hold other fields (packet
    // rate in REQ) which are written after, so or them in.
    uint32_t w = load_be32(d_ + byte) | (v << 12);
    store_be32(d_ + byte, w);
  }
  void area(size_t byte, std::span<const uint8_t> v) {
    if (!v.empty()) std::memcpy(d_ + byte, v.data(), v.size());
  }

 private:
  uint8_t* d_;
};

// Range checks for build, collected into the first failure.
class Limits {
 public:
  explicit Limits(std::string message) : message_(std::move(message)) {}

  void max(const char* field, uint64_t value, uint64_t limit) {
    if (!error_.empty() || value <= limit) return;
    code_ = EINVAL;
    error_ = fmt("building a CM {}: {} is {} but the field holds at most {} ({} bits); fix the value", message_,
                         field, value, limit, std::bit_width(limit));
  }
  void size(const char* field, size_t size, size_t limit) {
    if (!error_.empty() || size <= limit) return;
    code_ = EMSGSIZE;
    error_ = fmt("building a CM {}: {} is {} bytes but the message carries at most {}; send less", message_,
                         field, size, limit);
  }
  void path(const char* which, const Path& p) {
    std::string f(which);
    max((f + " flow label").c_str(), p.flow_label, 0xFFFFF);
    max((f + " packet rate").c_str(), p.packet_rate, 0x3F);
    max((f + " SL").c_str(), p.sl, 0xF);
    max((f + " local ACK timeout").c_str(), p.local_ack_timeout, 0x1F);
  }
  bool ok() const { return error_.empty(); }
  Error error() const { return Error(code_, error_); }

 private:
  std::string message_;
  int code_ = 0;
  std::string error_;
};

constexpr uint32_t k24 = 0xFFFFFF;

std::unexpected<Error> bad(const std::string& what) {
  return fail(EBADMSG, "CM MAD rejected: " + what + "; the MAD is dropped");
}

Result<MessageCode> message_code(uint8_t v, const char* message, const char* field) {
  if (v > 2)
    return bad(fmt("{} {} is 3, which is reserved (0 REQ, 1 REP, 2 other)", message, field));
  return static_cast<MessageCode>(v);
}

// --- paths ---

// REQ's primary path at 52, alternate at 96 (44 bytes each).
Path get_req_path(const uint8_t* d, size_t o) {
  Path p;
  p.local_lid = load_be16(d + o);
  p.remote_lid = load_be16(d + o + 2);
  std::memcpy(p.local_gid.data(), d + o + 4, 16);
  std::memcpy(p.remote_gid.data(), d + o + 20, 16);
  p.flow_label = get_flow_label(d, o + 36);
  p.packet_rate = get_bits(d, o + 39, 2, 6);
  p.traffic_class = d[o + 40];
  p.hop_limit = d[o + 41];
  p.sl = get_bits(d, o + 42, 0, 4);
  p.subnet_local = get_bits(d, o + 42, 4, 1);
  p.local_ack_timeout = get_bits(d, o + 43, 0, 5);
  return p;
}

void put_req_path(Writer& w, size_t o, const Path& p) {
  w.u16(o, p.local_lid);
  w.u16(o + 2, p.remote_lid);
  w.area(o + 4, p.local_gid);
  w.area(o + 20, p.remote_gid);
  w.flow_label(o + 36, p.flow_label);
  w.bits(o + 39, 2, 6, p.packet_rate);
  w.u8(o + 40, p.traffic_class);
  w.u8(o + 41, p.hop_limit);
  w.bits(o + 42, 0, 4, p.sl);
  w.bits(o + 42, 4, 1, p.subnet_local);
  w.bits(o + 43, 0, 5, p.local_ack_timeout);
}

// LAP's alternate path at 20: LIDs, GIDs, flow label (56), traffic class
// (59), hop limit (60), packet rate (61), SL and subnet local (62), local
// ACK timeout (63).
Path get_lap_path(const uint8_t* d) {
  Path p;
  p.local_lid = load_be16(d + 20);
  p.remote_lid = load_be16(d + 22);
  std::memcpy(p.local_gid.data(), d + 24, 16);
  std::memcpy(p.remote_gid.data(), d + 40, 16);
  p.flow_label = get_flow_label(d, 56);
  p.traffic_class = d[59];
  p.hop_limit = d[60];
  p.packet_rate = get_bits(d, 61, 2, 6);
  p.sl = get_bits(d, 62, 0, 4);
  p.subnet_local = get_bits(d, 62, 4, 1);
  p.local_ack_timeout = get_bits(d, 63, 0, 5);
  return p;
}

void put_lap_path(Writer& w, const Path& p) {
  w.u16(20, p.local_lid);
  w.u16(22, p.remote_lid);
  w.area(24, p.local_gid);
  w.area(40, p.remote_gid);
  w.flow_label(56, p.flow_label);
  w.u8(59, p.traffic_class);
  w.u8(60, p.hop_limit);
  w.bits(61, 2, 6, p.packet_rate);
  w.bits(62, 0, 4, p.sl);
  w.bits(62, 4, 1, p.subnet_local);
  w.bits(63, 0, 5, p.local_ack_timeout);
}

// --- per message parse ---

Result<Message> parse_req(const uint8_t* d) {
  Req m;
  m.local_comm_id = load_be32(d + 0);
  m.vendor_id = get24(d, 5);
  m.service_id = load_be64(d + 8);
  m.local_ca_guid = load_be64(d + 16);
  m.local_qkey = load_be32(d + 28);
  m.local_qpn = get24(d, 32);
  m.responder_resources = d[35];
  m.local_eecn = get24(d, 36);
  m.initiator_depth = d[39];
  m.remote_eecn = get24(d, 40);
  m.remote_cm_response_timeout = get_bits(d, 43, 0, 5);
  m.transport_service_type = static_cast<TransportType>(get_bits(d, 43, 5, 2));
  m.end_to_end_flow_control = get_bits(d, 43, 7, 1);
  m.starting_psn = get24(d, 44);
  m.local_cm_response_timeout = get_bits(d, 47, 0, 5);
  m.retry_count = get_bits(d, 47, 5, 3);
  m.partition_key = load_be16(d + 48);
  m.path_mtu = get_bits(d, 50, 0, 4);
  m.rdc_exists = get_bits(d, 50, 4, 1);
  m.rnr_retry_count = get_bits(d, 50, 5, 3);
  m.max_cm_retries = get_bits(d, 51, 0, 4);
  m.srq = get_bits(d, 51, 4, 1);
  m.extended_transport_type = get_bits(d, 51, 5, 3);
  m.primary = get_req_path(d, 52);
  m.alternate = get_req_path(d, 96);
  m.sap_supported = get_bits(d, 139, 5, 1);
  m.private_data = get_area(d, 140, kReqPrivateDataSize);
  return m;
}

Result<Message> parse_mra(const uint8_t* d) {
  Mra m;
  m.local_comm_id = load_be32(d + 0);
  m.remote_comm_id = load_be32(d + 4);
  auto code = message_code(get_bits(d, 8, 0, 2), "MRA", "message MRAed");
  if (!code) return std::unexpected(code.error());
  m.message_mraed = *code;
  m.service_timeout = get_bits(d, 9, 0, 5);
  m.private_data = get_area(d, 10, kMraPrivateDataSize);
  return m;
}

Result<Message> parse_rej(const uint8_t* d) {
  Rej m;
  m.local_comm_id = load_be32(d + 0);
  m.remote_comm_id = load_be32(d + 4);
  auto code = message_code(get_bits(d, 8, 0, 2), "REJ", "message rejected");
  if (!code) return std::unexpected(code.error());
  m.message_rejected = *code;
  size_t ari_length = get_bits(d, 9, 0, 7);
  if (ari_length > kRejAriSize)
    return bad(fmt("REJ rejected info length is {} but the ARI field holds {} bytes", ari_length,
                           kRejAriSize));
  m.reason = load_be16(d + 10);
  m.ari.assign(d + 12, d + 12 + ari_length);
  m.private_data = get_area(d, 84, kRejPrivateDataSize);
  return m;
}

Result<Message> parse_rep(const uint8_t* d) {
  Rep m;
  m.local_comm_id = load_be32(d + 0);
  m.remote_comm_id = load_be32(d + 4);
  m.local_qkey = load_be32(d + 8);
  m.local_qpn = get24(d, 12);
  m.local_eecn = get24(d, 16);
  m.starting_psn = get24(d, 20);
  m.vendor_id = (uint32_t{d[15]} << 16) | (uint32_t{d[19]} << 8) | d[23];
  m.responder_resources = d[24];
  m.initiator_depth = d[25];
  m.target_ack_delay = get_bits(d, 26, 0, 5);
  m.failover_accepted = get_bits(d, 26, 5, 2);
  m.end_to_end_flow_control = get_bits(d, 26, 7, 1);
  m.rnr_retry_count = get_bits(d, 27, 0, 3);
  m.srq = get_bits(d, 27, 3, 1);
  m.local_ca_guid = load_be64(d + 28);
  m.private_data = get_area(d, 36, kRepPrivateDataSize);
  return m;
}

Result<Message> parse_rtu(const uint8_t* d) {
  Rtu m;
  m.local_comm_id = load_be32(d + 0);
  m.remote_comm_id = load_be32(d + 4);
  m.private_data = get_area(d, 8, kRtuPrivateDataSize);
  return m;
}

Result<Message> parse_dreq(const uint8_t* d) {
  Dreq m;
  m.local_comm_id = load_be32(d + 0);
  m.remote_comm_id = load_be32(d + 4);
  m.remote_qpn_eecn = get24(d, 8);
  m.private_data = get_area(d, 12, kDreqPrivateDataSize);
  return m;
}

Result<Message> parse_drep(const uint8_t* d) {
  Drep m;
  m.local_comm_id = load_be32(d + 0);
  m.remote_comm_id = load_be32(d + 4);
  m.private_data = get_area(d, 8, kDrepPrivateDataSize);
  return m;
}

Result<Message> parse_sidr_req(const uint8_t* d) {
  SidrReq m;
  m.request_id = load_be32(d + 0);
  m.partition_key = load_be16(d + 4);
  m.service_id = load_be64(d + 8);
  m.private_data = get_area(d, 16, kSidrReqPrivateDataSize);
  return m;
}

Result<Message> parse_sidr_rep(const uint8_t* d) {
  SidrRep m;
  m.request_id = load_be32(d + 0);
  m.status = d[4];
  size_t info_length = d[5];
  if (info_length > kSidrRepInfoSize)
    return bad(fmt("SIDR_REP additional information length is {} but the field holds {} bytes",
                           info_length, kSidrRepInfoSize));
  m.vendor_id = (uint32_t{load_be16(d + 6)} << 8) | d[11];
  m.qpn = get24(d, 8);
  m.service_id = load_be64(d + 12);
  m.qkey = load_be32(d + 20);
  m.additional_info.assign(d + 24, d + 24 + info_length);
  m.private_data = get_area(d, 96, kSidrRepPrivateDataSize);
  return m;
}

Result<Message> parse_lap(const uint8_t* d) {
  Lap m;
  m.local_comm_id = load_be32(d + 0);
  m.remote_comm_id = load_be32(d + 4);
  m.remote_qpn_eecn = get24(d, 12);
  m.remote_cm_response_timeout = get_bits(d, 15, 0, 5);
  m.alternate = get_lap_path(d);
  m.private_data = get_area(d, 64, kLapPrivateDataSize);
  return m;
}

Result<Message> parse_apr(const uint8_t* d) {
  Apr m;
  m.local_comm_id = load_be32(d + 0);
  m.remote_comm_id = load_be32(d + 4);
  size_t info_length = d[8];
  if (info_length > kAprInfoSize)
    return bad(fmt("APR additional information length is {} but the field holds {} bytes", info_length,
                           kAprInfoSize));
  m.status = d[9];
  m.additional_info.assign(d + 12, d + 12 + info_length);
  m.private_data = get_area(d, 84, kAprPrivateDataSize);
  return m;
}

// --- per message build ---

struct Builder {
  Writer& w;
  Limits& lim;

  void operator()(const Req& m) {
    lim.max("vendor id", m.vendor_id, k24);
    lim.max("local QPN", m.local_qpn, k24);
    lim.max("local EECN", m.local_eecn, k24);
    lim.max("remote EECN", m.remote_eecn, k24);
    lim.max("remote CM response timeout", m.remote_cm_response_timeout, 0x1F);
    lim.max("transport service type", static_cast<uint8_t>(m.transport_service_type), 3);
    lim.max("starting PSN", m.starting_psn, k24);
    lim.max("local CM response timeout", m.local_cm_response_timeout, 0x1F);
    lim.max("retry count", m.retry_count, 7);
    lim.max("path MTU", m.path_mtu, 0xF);
    lim.max("RNR retry count", m.rnr_retry_count, 7);
    lim.max("max CM retries", m.max_cm_retries, 0xF);
    lim.max("extended transport type", m.extended_transport_type, 7);
    lim.path("primary path", m.primary);
    lim.path("alternate path", m.alternate);
    lim.size("private data", m.private_data.size(), kReqPrivateDataSize);
    if (!lim.ok()) return;
    w.u32(0, m.local_comm_id);
    w.u24(5, m.vendor_id);
    w.u64(8, m.service_id);
    w.u64(16, m.local_ca_guid);
    w.u32(28, m.local_qkey);
    w.u24(32, m.local_qpn);
    w.u8(35, m.responder_resources);
    w.u24(36, m.local_eecn);
    w.u8(39, m.initiator_depth);
    w.u24(40, m.remote_eecn);
    w.bits(43, 0, 5, m.remote_cm_response_timeout);
    w.bits(43, 5, 2, static_cast<uint8_t>(m.transport_service_type));
    w.bits(43, 7, 1, m.end_to_end_flow_control);
    w.u24(44, m.starting_psn);
    w.bits(47, 0, 5, m.local_cm_response_timeout);
    w.bits(47, 5, 3, m.retry_count);
    w.u16(48, m.partition_key);
    w.bits(50, 0, 4, m.path_mtu);
    w.bits(50, 4, 1, m.rdc_exists);
    w.bits(50, 5, 3, m.rnr_retry_count);
    w.bits(51, 0, 4, m.max_cm_retries);
    w.bits(51, 4, 1, m.srq);
    w.bits(51, 5, 3, m.extended_transport_type);
    put_req_path(w, 52, m.primary);
    put_req_path(w, 96, m.alternate);
    w.bits(139, 5, 1, m.sap_supported);
    w.area(140, m.private_data);
  }

  void operator()(const Mra& m) {
    lim.max("message MRAed", static_cast<uint8_t>(m.message_mraed), 2);
    lim.max("service timeout", m.service_timeout, 0x1F);
    lim.size("private data", m.private_data.size(), kMraPrivateDataSize);
    if (!lim.ok()) return;
    w.u32(0, m.local_comm_id);
    w.u32(4, m.remote_comm_id);
    w.bits(8, 0, 2, static_cast<uint8_t>(m.message_mraed));
    w.bits(9, 0, 5, m.service_timeout);
    w.area(10, m.private_data);
  }

  void operator()(const Rej& m) {
    lim.max("message rejected", static_cast<uint8_t>(m.message_rejected), 2);
    lim.size("ARI", m.ari.size(), kRejAriSize);
    lim.size("private data", m.private_data.size(), kRejPrivateDataSize);
    if (!lim.ok()) return;
    w.u32(0, m.local_comm_id);
    w.u32(4, m.remote_comm_id);
    w.bits(8, 0, 2, static_cast<uint8_t>(m.message_rejected));
    w.bits(9, 0, 7, static_cast<unsigned>(m.ari.size()));
    w.u16(10, m.reason);
    w.area(12, m.ari);
    w.area(84, m.private_data);
  }

  void operator()(const Rep& m) {
    lim.max("local QPN", m.local_qpn, k24);
    lim.max("local EECN", m.local_eecn, k24);
    lim.max("starting PSN", m.starting_psn, k24);
    lim.max("vendor id", m.vendor_id, k24);
    lim.max("target ACK delay", m.target_ack_delay, 0x1F);
    lim.max("failover accepted", m.failover_accepted, 3);
    lim.max("RNR retry count", m.rnr_retry_count, 7);
    lim.size("private data", m.private_data.size(), kRepPrivateDataSize);
    if (!lim.ok()) return;
    w.u32(0, m.local_comm_id);
    w.u32(4, m.remote_comm_id);
    w.u32(8, m.local_qkey);
    w.u24(12, m.local_qpn);
    w.u8(15, static_cast<uint8_t>(m.vendor_id >> 16));
    w.u24(16, m.local_eecn);
    w.u8(19, static_cast<uint8_t>(m.vendor_id >> 8));
    w.u24(20, m.starting_psn);
    w.u8(23, static_cast<uint8_t>(m.vendor_id));
    w.u8(24, m.responder_resources);
    w.u8(25, m.initiator_depth);
    w.bits(26, 0, 5, m.target_ack_delay);
    w.bits(26, 5, 2, m.failover_accepted);
    w.bits(26, 7, 1, m.end_to_end_flow_control);
    w.bits(27, 0, 3, m.rnr_retry_count);
    w.bits(27, 3, 1, m.srq);
    w.u64(28, m.local_ca_guid);
    w.area(36, m.private_data);
  }

  void operator()(const Rtu& m) {
    lim.size("private data", m.private_data.size(), kRtuPrivateDataSize);
    if (!lim.ok()) return;
    w.u32(0, m.local_comm_id);
    w.u32(4, m.remote_comm_id);
    w.area(8, m.private_data);
  }

  void operator()(const Dreq& m) {
    lim.max("remote QPN/EECN", m.remote_qpn_eecn, k24);
    lim.size("private data", m.private_data.size(), kDreqPrivateDataSize);
    if (!lim.ok()) return;
    w.u32(0, m.local_comm_id);
    w.u32(4, m.remote_comm_id);
    w.u24(8, m.remote_qpn_eecn);
    w.area(12, m.private_data);
  }

  void operator()(const Drep& m) {
    lim.size("private data", m.private_data.size(), kDrepPrivateDataSize);
    if (!lim.ok()) return;
    w.u32(0, m.local_comm_id);
    w.u32(4, m.remote_comm_id);
    w.area(8, m.private_data);
  }

  void operator()(const SidrReq& m) {
    lim.size("private data", m.private_data.size(), kSidrReqPrivateDataSize);
    if (!lim.ok()) return;
    w.u32(0, m.request_id);
    w.u16(4, m.partition_key);
    w.u64(8, m.service_id);
    w.area(16, m.private_data);
  }

  void operator()(const SidrRep& m) {
    lim.max("vendor id", m.vendor_id, k24);
    lim.max("QPN", m.qpn, k24);
    lim.size("additional information", m.additional_info.size(), kSidrRepInfoSize);
    lim.size("private data", m.private_data.size(), kSidrRepPrivateDataSize);
    if (!lim.ok()) return;
    w.u32(0, m.request_id);
    w.u8(4, m.status);
    w.u8(5, static_cast<uint8_t>(m.additional_info.size()));
    w.u16(6, static_cast<uint16_t>(m.vendor_id >> 8));
    w.u24(8, m.qpn);
    w.u8(11, static_cast<uint8_t>(m.vendor_id));
    w.u64(12, m.service_id);
    w.u32(20, m.qkey);
    w.area(24, m.additional_info);
    w.area(96, m.private_data);
  }

  void operator()(const Lap& m) {
    lim.max("remote QPN/EECN", m.remote_qpn_eecn, k24);
    lim.max("remote CM response timeout", m.remote_cm_response_timeout, 0x1F);
    lim.path("alternate path", m.alternate);
    lim.size("private data", m.private_data.size(), kLapPrivateDataSize);
    if (!lim.ok()) return;
    w.u32(0, m.local_comm_id);
    w.u32(4, m.remote_comm_id);
    w.u24(12, m.remote_qpn_eecn);
    w.bits(15, 0, 5, m.remote_cm_response_timeout);
    put_lap_path(w, m.alternate);
    w.area(64, m.private_data);
  }

  void operator()(const Apr& m) {
    lim.size("additional information", m.additional_info.size(), kAprInfoSize);
    lim.size("private data", m.private_data.size(), kAprPrivateDataSize);
    if (!lim.ok()) return;
    w.u32(0, m.local_comm_id);
    w.u32(4, m.remote_comm_id);
    w.u8(8, static_cast<uint8_t>(m.additional_info.size()));
    w.u8(9, m.status);
    w.area(12, m.additional_info);
    w.area(84, m.private_data);
  }
};

}  // namespace

std::string_view attribute_name(uint16_t attribute_id) {
  switch (static_cast<AttributeId>(attribute_id)) {
    case AttributeId::kReq: return "REQ";
    case AttributeId::kMra: return "MRA";
    case AttributeId::kRej: return "REJ";
    case AttributeId::kRep: return "REP";
    case AttributeId::kRtu: return "RTU";
    case AttributeId::kDreq: return "DREQ";
    case AttributeId::kDrep: return "DREP";
    case AttributeId::kSidrReq: return "SIDR_REQ";
    case AttributeId::kSidrRep: return "SIDR_REP";
    case AttributeId::kLap: return "LAP";
    case AttributeId::kApr: return "APR";
  }
  return "unknown";
}

std::string reject_reason_name(uint16_t reason) {
  static constexpr const char* kNames[] = {
      nullptr,
      "no QP",
      "no EEC",
      "no resources",
      "timeout",
      "unsupported request",
      "invalid communication id",
      "invalid communication instance",
      "invalid service id",
      "invalid transport service type",
      "stale connection",
      "RDC does not exist",
      "primary remote port GID rejected",
      "primary remote port LID rejected",
      "invalid primary SL",
      "invalid primary traffic class",
      "invalid primary hop limit",
      "invalid primary packet rate",
      "alternate remote port GID rejected",
      "alternate remote port LID rejected",
      "invalid alternate SL",
      "invalid alternate traffic class",
      "invalid alternate hop limit",
      "invalid alternate packet rate",
      "port and CM redirection",
      "port redirection",
      "invalid path MTU",
      "insufficient responder resources",
      "consumer defined",
      "invalid RNR NAK retry count",
      "duplicate local communication id",
      "unsupported class version",
      "invalid primary flow label",
      "invalid alternate flow label",
      nullptr,
      "vendor option not supported",
  };
  if (reason < std::size(kNames) && kNames[reason] != nullptr) return kNames[reason];
  return fmt("unknown reason {}", reason);
}

AttributeId attribute_of(const Message& message) {
  static constexpr AttributeId kIds[] = {
      AttributeId::kReq,  AttributeId::kMra,     AttributeId::kRej,     AttributeId::kRep,
      AttributeId::kRtu,  AttributeId::kDreq,    AttributeId::kDrep,    AttributeId::kSidrReq,
      AttributeId::kSidrRep, AttributeId::kLap, AttributeId::kApr,
  };
  static_assert(std::size(kIds) == std::variant_size_v<Message>);
  return kIds[message.index()];
}

MadHeader cm_header(uint64_t transaction_id, uint32_t attribute_modifier) {
  MadHeader h;
  h.transaction_id = transaction_id;
  h.attribute_modifier = attribute_modifier;
  return h;
}

Result<MadHeader> parse_mad_header(std::span<const uint8_t> bytes) {
  if (bytes.size() < kMadHeaderSize)
    return fail(EMSGSIZE, fmt("CM MAD rejected: {} bytes is shorter than the {}-byte MAD header; the MAD is "
                                      "dropped",
                                      bytes.size(), kMadHeaderSize));
  const uint8_t* p = bytes.data();
  MadHeader h;
  h.base_version = p[0];
  h.mgmt_class = p[1];
  h.class_version = p[2];
  h.method = p[3];
  h.status = load_be16(p + 4);
  h.class_specific = load_be16(p + 6);
  h.transaction_id = load_be64(p + 8);
  h.attribute_id = load_be16(p + 16);
  h.reserved = load_be16(p + 18);
  h.attribute_modifier = load_be32(p + 20);
  return h;
}

Result<Mad> parse_mad(std::span<const uint8_t> bytes) {
  if (bytes.size() != kMadSize)
    return fail(EMSGSIZE, fmt("CM MAD rejected: {} bytes, but a MAD is exactly {} (the UD payload after "
                                      "the BTH and DETH); the MAD is dropped",
                                      bytes.size(), kMadSize));
  auto h = parse_mad_header(bytes);
  if (!h) return std::unexpected(h.error());
  if (h->base_version != kMadBaseVersion)
    return fail(EPROTONOSUPPORT, fmt("CM MAD rejected: base version is {}, expected {}; the MAD is dropped",
                                             h->base_version, kMadBaseVersion));
  if (h->mgmt_class != kMgmtClassCm)
    return fail(ENOTSUP, fmt("CM MAD rejected: management class is 0x{:02x}, expected 0x{:02x} "
                                     "(Communication Management); the MAD is dropped",
                                     h->mgmt_class, kMgmtClassCm));
  if (h->class_version != kCmClassVersion)
    return fail(EPROTONOSUPPORT,
                fmt("CM MAD rejected: CM class version is {}, expected {}; the sender may be answered with "
                            "REJ \"unsupported class version\" (31)",
                            h->class_version, kCmClassVersion));
  if (h->method != static_cast<uint8_t>(Method::kSend))
    return fail(ENOTSUP, fmt("CM MAD rejected: method is 0x{:02x}, but CM messages are sent with Send "
                                     "(0x03); the MAD is dropped",
                                     h->method));
  const uint8_t* d = bytes.data() + kMadHeaderSize;
  Result<Message> m = [&]() -> Result<Message> {
    switch (static_cast<AttributeId>(h->attribute_id)) {
      case AttributeId::kReq: return parse_req(d);
      case AttributeId::kMra: return parse_mra(d);
      case AttributeId::kRej: return parse_rej(d);
      case AttributeId::kRep: return parse_rep(d);
      case AttributeId::kRtu: return parse_rtu(d);
      case AttributeId::kDreq: return parse_dreq(d);
      case AttributeId::kDrep: return parse_drep(d);
      case AttributeId::kSidrReq: return parse_sidr_req(d);
      case AttributeId::kSidrRep: return parse_sidr_rep(d);
      case AttributeId::kLap: return parse_lap(d);
      case AttributeId::kApr: return parse_apr(d);
    }
    return fail(ENOTSUP, fmt("CM MAD rejected: attribute id 0x{:04x} is not a CM message (REQ 0x0010 .. "
                                     "APR 0x001A); the MAD is dropped",
                                     h->attribute_id));
  }();
  if (!m) return std::unexpected(m.error());
  return Mad{*h, std::move(*m)};
}

Result<std::array<uint8_t, kMadSize>> build_mad(const Mad& mad) {
  std::array<uint8_t, kMadSize> out{};
  AttributeId id = attribute_of(mad.message);
  Limits lim{std::string(attribute_name(static_cast<uint16_t>(id)))};
  Writer w(out.data() + kMadHeaderSize);
  std::visit(Builder{w, lim}, mad.message);
  if (!lim.ok()) return std::unexpected(lim.error());
  const MadHeader& h = mad.header;
  uint8_t* p = out.data();
  p[0] = h.base_version;
  p[1] = h.mgmt_class;
  p[2] = h.class_version;
  p[3] = h.method;
  store_be16(p + 4, h.status);
  store_be16(p + 6, h.class_specific);
  store_be64(p + 8, h.transaction_id);
  store_be16(p + 16, static_cast<uint16_t>(id));
  store_be16(p + 18, h.reserved);
  store_be32(p + 20, h.attribute_modifier);
  return out;
}

}  // namespace ufab::cm
