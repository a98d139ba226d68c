// cm_pcap_gen: writes a pcap of CM MADs over RoCEv2 between the two sides
// of the rdma_cm VM suite (tests/vm/suites/rdma_cm.sh), built with ufab's
// own CM codec (core/cm) and frame builder (core/roce): the known input on
// which tests/vm/cm_wire_check.sh --selftest checks that its tshark
// filters see what they should, and fail when something is wrong. Runs on
// the host.
//
// Usage: cm_pcap_gen OUT.pcap [DEFECT]
//
// The frames, in order (ufab = 52:54:00:00:00:01 / 10.0.0.2, rxe =
// 52:54:00:00:00:02 / 10.0.0.1, as in the VM):
//   ufab connects to rxe port 7201:   REQ >, < REP, RTU >, < SEND, SEND >,
//                                     DREQ >, < DREP
//   rxe connects to ufab port 7202:   < REQ, REP >, < RTU, SEND >, < SEND,
//                                     < DREQ, DREP >
//   ufab to rxe port 7203 (nobody):   REQ >, < REJ (invalid service id)
//   rxe to ufab port 7204 (nobody):   < REQ, REJ > (invalid service id)
// Every REQ carries rdma_cm's private-data header (the two addresses).
//
// DEFECT (one, to make one check fail): none (default), truncated (ufab's
// first REQ cut to 200 of its 256 bytes), qkey (ufab's RTU with Q_Key
// 0x80010001), class-version (rxe's REP with class version 1), attribute
// (rxe's REP with attribute id 0x0099, which no CM message has), no-rtu
// (ufab's RTU left out), rej-reason (rxe's REJ with reason 28, consumer
// defined), cma-address (ufab's first REQ's header names 10.0.0.3 as the
// destination), psn (ufab, passive, sends its first SEND from the PSN of
// its own REP rather than the REQ's).
// Each SEND after an RTU starts where Linux's ib_cm starts it: the passive
// side's from the REQ's starting PSN, the active side's from the REP's.
// Exit status: 0 written, 1 an error (said on stderr), 2 usage.
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/cm/mad.h"
#include "core/cm/rdma_cm.h"
#include "core/roce/builder.h"
#include "core/roce/opcodes.h"

namespace {

using namespace ufab;

struct Side {
  roce::MacAddr mac;
  uint32_t ip;  // host order
  uint64_t guid;
};

const Side kUfab{{0x52, 0x54, 0x00, 0x00, 0x00, 0x01}, 0x0A000002, 0x5054000000000001ull};
const Side kRxe{{0x52, 0x54, 0x00, 0x00, 0x00, 0x02}, 0x0A000001, 0x5054000000000002ull};

cm::Gid gid_of(uint32_t ip) {
  cm::Gid g{};
  g[10] = 0xFF;
  g[11] = 0xFF;
  g[12] = static_cast<uint8_t>(ip >> 24);
  g[13] = static_cast<uint8_t>(ip >> 16);
  g[14] = static_cast<uint8_t>(ip >> 8);
  g[15] = static_cast<uint8_t>(ip);
  return g;
}

class PcapWriter {
 public:
  explicit PcapWriter(const std::string& path) : out_(path, std::ios::binary) {
    // Classic pcap, microseconds, Ethernet (what run-vm --pcap writes).
    const uint32_t hdr[6] = {0xA1B2C3D4u, 0x00040002u, 0, 0, 65535, 1};
    out_.write(reinterpret_cast<const char*>(hdr), sizeof hdr);
  }
  bool ok() const { return static_cast<bool>(out_); }
  void frame(std::span<const uint8_t> bytes) {
    ++n_;
    const uint32_t rec[4] = {1000000000u + n_, 0, static_cast<uint32_t>(bytes.size()),
                             static_cast<uint32_t>(bytes.size())};
    out_.write(reinterpret_cast<const char*>(rec), sizeof rec);
    out_.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }

 private:
  std::ofstream out_;
  uint32_t n_ = 0;
};

struct Gen {
  PcapWriter& pcap;
  std::string defect;
  uint32_t psn = 0;
  uint64_t tid = 0x0000000100000000ull;
  bool failed = false;

  // One MAD from `from` to `to` as a UD SEND to QP 1.
  // attribute: written over the MAD's attribute id when not 0 (the codec
  // builds only the ids it knows).
  void send(const Side& from, const Side& to, const cm::Mad& mad, size_t keep = cm::kMadSize,
            uint32_t qkey = cm::kGsiQKey, uint16_t attribute = 0) {
    auto built = cm::build_mad(mad);
    if (!built) {
      std::fprintf(stderr, "cm_pcap_gen: build_mad: %s\n", built.error().message().c_str());
      failed = true;
      return;
    }
    if (attribute != 0) {
      (*built)[16] = static_cast<uint8_t>(attribute >> 8);
      (*built)[17] = static_cast<uint8_t>(attribute);
    }
    std::span<const uint8_t> payload(built->data(), keep);
    roce::FrameSpec spec;
    spec.dst_mac = to.mac;
    spec.src_mac = from.mac;
    spec.src_ip = from.ip;
    spec.dst_ip = to.ip;
    spec.udp_sport = static_cast<uint16_t>(0xC000 | (psn & 0x3FFF));
    spec.ip_id = static_cast<uint16_t>(psn);
    spec.bth.opcode = roce::op::kUdSendOnly;
    spec.bth.dest_qp = cm::kGsiQpn;
    spec.bth.psn = psn++;
    spec.ext.deth.qkey = qkey;
    spec.ext.deth.src_qp = cm::kGsiQpn;
    std::vector<uint8_t> frame(roce::frame_length(spec.bth.opcode, payload.size()));
    auto r = roce::build_frame(spec, payload, frame);
    if (!r) {
      std::fprintf(stderr, "cm_pcap_gen: build_frame: %s\n", roce::build_error_text(r.error));
      failed = true;
      return;
    }
    frame.resize(r.length);
    pcap.frame(frame);
  }

  // One RC SEND ONLY of 16 bytes from `from` to QP `qpn` of `to`, PSN `psn`.
  void rc_send(const Side& from, const Side& to, uint32_t qpn, uint32_t rc_psn) {
    const std::array<uint8_t, 16> payload{};
    roce::FrameSpec spec;
    spec.dst_mac = to.mac;
    spec.src_mac = from.mac;
    spec.src_ip = from.ip;
    spec.dst_ip = to.ip;
    spec.udp_sport = 0xC123;
    spec.bth.opcode = roce::op::kRcSendOnly;
    spec.bth.dest_qp = qpn;
    spec.bth.psn = rc_psn;
    spec.bth.ack_req = true;
    std::vector<uint8_t> frame(roce::frame_length(spec.bth.opcode, payload.size()));
    auto r = roce::build_frame(spec, payload, frame);
    if (!r) {
      std::fprintf(stderr, "cm_pcap_gen: build_frame: %s\n", roce::build_error_text(r.error));
      failed = true;
      return;
    }
    frame.resize(r.length);
    pcap.frame(frame);
  }

  cm::Req req(const Side& from, const Side& to, uint16_t port, uint32_t comm_id, uint32_t qpn, bool bad_addr) {
    cm::Req q;
    q.local_comm_id = comm_id;
    q.service_id = cm::kRdmaCmServiceIdBase | cm::rdma_cm_service_id(cm::kRdmaPsTcp, port);
    q.local_ca_guid = from.guid;
    q.local_qpn = qpn;
    q.responder_resources = 1;
    q.initiator_depth = 1;
    q.remote_cm_response_timeout = 20;
    q.starting_psn = 0x123456 ^ qpn;
    q.local_cm_response_timeout = 20;
    q.retry_count = 7;
    q.path_mtu = 3;  // 1024
    q.rnr_retry_count = 7;
    q.max_cm_retries = 15;
    q.primary.local_lid = 0xFFFF;
    q.primary.remote_lid = 0xFFFF;
    q.primary.local_gid = gid_of(from.ip);
    q.primary.remote_gid = gid_of(to.ip);
    q.primary.hop_limit = 64;
    q.primary.packet_rate = 3;
    q.primary.local_ack_timeout = 14;
    cm::CmaHeader h;
    h.ip_version = 4;
    h.port = static_cast<uint16_t>(40000 + port);
    h.src_addr = cm::cma_ipv4(from.ip);
    h.dst_addr = cm::cma_ipv4(bad_addr ? 0x0A000003 : to.ip);
    auto pd = cm::build_rdma_cm_req_private_data(h, {});
    if (!pd) {
      std::fprintf(stderr, "cm_pcap_gen: rdma_cm header: %s\n", pd.error().message().c_str());
      failed = true;
    } else {
      q.private_data = *pd;
    }
    return q;
  }

  // A connection from `a` (active) to `p` (passive): REQ, REP, RTU, DREQ,
  // DREP. `a_is_ufab` says which defects apply.
  void connection(const Side& a, const Side& p, uint16_t port, uint32_t a_id, uint32_t p_id, bool a_is_ufab) {
    const uint64_t t_conn = tid++;
    cm::Req q = req(a, p, port, a_id, 0x11 + a_id, a_is_ufab && defect == "cma-address");
    send(a, p, {cm::cm_header(t_conn), q}, a_is_ufab && defect == "truncated" ? 200 : cm::kMadSize);

    cm::Rep r;
    r.local_comm_id = p_id;
    r.remote_comm_id = a_id;
    r.local_qpn = 0x11 + p_id;
    r.starting_psn = 0x654321 ^ p_id;
    r.responder_resources = 1;
    r.initiator_depth = 1;
    r.target_ack_delay = 15;
    r.rnr_retry_count = 7;
    r.local_ca_guid = p.guid;
    cm::MadHeader rh = cm::cm_header(t_conn);
    if (a_is_ufab && defect == "class-version") rh.class_version = 1;  // the REP is rxe's here
    send(p, a, {rh, r}, cm::kMadSize, cm::kGsiQKey, a_is_ufab && defect == "attribute" ? 0x0099 : 0);

    if (!(a_is_ufab && defect == "no-rtu")) {
      cm::Rtu u;
      u.local_comm_id = a_id;
      u.remote_comm_id = p_id;
      send(a, p, {cm::cm_header(t_conn), u}, cm::kMadSize,
           a_is_ufab && defect == "qkey" ? cm::kGsiQKey + 1 : cm::kGsiQKey);
    }

    // A SEND each way, each from the PSN Linux's ib_cm gives it: the
    // passive side sends from the REQ's starting PSN (cm_req_handler:
    // sq_psn = REQ starting PSN), the active side from the REP's
    // (cm_rep_handler). Defect "psn": ufab, passive in the second
    // connection, sends from its own REP's PSN instead.
    const bool bad_psn = !a_is_ufab && defect == "psn";
    rc_send(p, a, q.local_qpn, bad_psn ? r.starting_psn : q.starting_psn);
    rc_send(a, p, r.local_qpn, r.starting_psn);

    const uint64_t t_disc = tid++;
    cm::Dreq d;
    d.local_comm_id = a_id;
    d.remote_comm_id = p_id;
    d.remote_qpn_eecn = 0x11 + p_id;
    send(a, p, {cm::cm_header(t_disc), d});
    cm::Drep e;
    e.local_comm_id = p_id;
    e.remote_comm_id = a_id;
    send(p, a, {cm::cm_header(t_disc), e});
  }

  // A REQ from `a` to a port nobody on `p` listens on, and p's REJ.
  void rejected(const Side& a, const Side& p, uint16_t port, uint32_t a_id, bool p_is_rxe) {
    const uint64_t t = tid++;
    send(a, p, {cm::cm_header(t), req(a, p, port, a_id, 0x11 + a_id, false)});
    cm::Rej j;
    j.local_comm_id = 0;
    j.remote_comm_id = a_id;
    j.message_rejected = cm::MessageCode::kReq;
    j.reason = static_cast<uint16_t>(p_is_rxe && defect == "rej-reason" ? cm::RejectReason::kConsumerDefined
                                                                       : cm::RejectReason::kInvalidServiceId);
    send(p, a, {cm::cm_header(t), j});
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr,
                 "usage: cm_pcap_gen OUT.pcap "
                 "[none|truncated|qkey|class-version|attribute|no-rtu|rej-reason|cma-address|psn]\n");
    return 2;
  }
  const std::string defect = argc == 3 ? argv[2] : "none";
  const std::string_view known[] = {"none",   "truncated",  "qkey",       "class-version",
                                    "attribute", "no-rtu", "rej-reason", "cma-address", "psn"};
  bool found = false;
  for (auto k : known) found = found || defect == k;
  if (!found) {
    std::fprintf(stderr, "cm_pcap_gen: unknown defect '%s' (see --help)\n", defect.c_str());
    return 2;
  }
  PcapWriter pcap(argv[1]);
  if (!pcap.ok()) {
    std::fprintf(stderr, "cm_pcap_gen: cannot write %s: %s\n", argv[1], std::strerror(errno));
    return 1;
  }
  Gen g{pcap, defect};
  g.connection(kUfab, kRxe, 7201, 0x1001, 0x2001, true);
  g.connection(kRxe, kUfab, 7202, 0x2002, 0x1002, false);
  g.rejected(kUfab, kRxe, 7203, 0x1003, true);
  g.rejected(kRxe, kUfab, 7204, 0x2004, false);
  if (g.failed || !pcap.ok()) {
    std::fprintf(stderr, "cm_pcap_gen: %s not written completely\n", argv[1]);
    return 1;
  }
  return 0;
}
