// The vocabulary of the RDMA API, shared by the public API (api/rdma.h) and
// the software transport (core/transport): work requests, completions, queue
// pair states and attributes.
//
// Numeric values are those of libibverbs' enums (ibv_wr_opcode,
// ibv_wc_status, ibv_wc_opcode, ibv_send_flags, ibv_qp_state,
// ibv_access_flags), so people who know verbs read them without a table and
// a later C ABI can pass them through unchanged. Where verbs encodes a path
// MTU as an enum (IBV_MTU_1024 = 3), ufab takes bytes (1024).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "core/rdma/memory.h"
#include "ufab/rdma.h"

namespace ufab::verbs {

// One piece of a scatter/gather list: `length` bytes at `addr` inside the
// region whose lkey is `lkey` (addr is the region's iova space, which is the
// process's virtual address unless the region was registered with an iova).
struct Sge {
  uint64_t addr = 0;
  uint32_t length = 0;
  uint32_t lkey = 0;
};

// Most SGEs in one work request.
inline constexpr uint32_t kMaxSge = 16;

enum class WrOpcode : uint8_t {
  kRdmaWrite = 0,
  kRdmaWriteWithImm = 1,
  kSend = 2,
  kSendWithImm = 3,
  kRdmaRead = 4,
  kAtomicCmpAndSwp = 5,
  kAtomicFetchAndAdd = 6,
  kFlush = 14,        // IBV_WR_FLUSH: make remote memory visible or durable
  kAtomicWrite = 15,  // IBV_WR_ATOMIC_WRITE: one 8-byte store at the peer
};
const char* wr_opcode_name(WrOpcode op);  // "RDMA_WRITE", ...

// ibv_send_flags.
using SendFlags = uint32_t;
inline constexpr SendFlags kSendFence = 1u << 0;      // wait for earlier READs/atomics first
inline constexpr SendFlags kSendSignaled = 1u << 1;   // produce a completion on success
inline constexpr SendFlags kSendSolicited = 1u << 2;  // set SE in the last packet
inline constexpr SendFlags kSendInline = 1u << 3;     // copy the data at post time; lkeys ignored
// RDMA_WRITE(_WITH_IMM): complete only once the data is durable at the
// target (the WRITE, then a FLUSH PERSISTENT of its range, answered).
// Not an ibv_send_flags bit: libfabric's FI_COMMIT_COMPLETE.
inline constexpr SendFlags kSendCommit = 1u << 4;

// Where a UD send goes (what verbs keeps in an ibv_ah plus the WR's
// remote_qpn/remote_qkey).
struct UdDestination {
  uint32_t ip = 0;  // host order; the destination GID is ::ffff:ip
  uint32_t qpn = 0;
  uint32_t qkey = 0;
  uint8_t traffic_class = 0;
  uint8_t hop_limit = 64;
};

struct SendWr {
  uint64_t wr_id = 0;
  WrOpcode opcode = WrOpcode::kSend;
  SendFlags flags = 0;
  std::span<const Sge> sgl{};
  uint32_t imm_data = 0;  // SEND_WITH_IMM, RDMA_WRITE_WITH_IMM: the 32-bit value as a number
  // RDMA_WRITE*, RDMA_READ, atomics: the peer's address and rkey.
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  // ATOMIC_CMP_AND_SWP: compare with compare_add, store swap when equal.
  // ATOMIC_FETCH_AND_ADD: add compare_add. The original value lands in the
  // 8-byte SGE.
  uint64_t compare_add = 0;
  uint64_t swap = 0;
  // ATOMIC_WRITE: the 8 bytes stored at remote_addr (8-byte aligned), as
  // they are in this process's memory (host order).
  uint64_t atomic_value = 0;
  // FLUSH: placement type (roce::feth::kGlobal and/or kPersistent) and
  // selectivity (kRange: [remote_addr, remote_addr + flush_length);
  // kWholeRegion: the whole region rkey names). No SGEs.
  uint8_t flush_type = 0;
  uint8_t flush_level = 0;
  uint64_t flush_length = 0;
  // UD queue pairs only.
  UdDestination ud{};
};

struct RecvWr {
  uint64_t wr_id = 0;
  std::span<const Sge> sgl{};
};

enum class WcStatus : uint8_t {
  kSuccess = 0,
  kLocLenErr = 1,       // a message did not fit the receive buffer / SGE list
  kLocQpOpErr = 2,      // the work request cannot be executed on this QP
  kLocProtErr = 4,      // an lkey, its PD, its access or its bounds failed
  kWrFlushErr = 5,      // the QP went to ERROR before this request ran
  kBadRespErr = 7,      // the peer answered with something the request cannot take
  kLocAccessErr = 8,
  kRemInvReqErr = 9,    // the peer NAKed with "invalid request"
  kRemAccessErr = 10,   // the peer NAKed with "remote access error" (rkey, bounds, rights)
  kRemOpErr = 11,       // the peer NAKed with "remote operational error"
  kRetryExcErr = 12,    // retry_cnt transport retries used up
  kRnrRetryExcErr = 13, // rnr_retry RNR retries used up
  kGeneralErr = 21,
};

enum class WcOpcode : uint8_t {
  kSend = 0,
  kRdmaWrite = 1,
  kRdmaRead = 2,
  kCompSwap = 3,
  kFetchAdd = 4,
  kFlush = 8,        // IBV_WC_FLUSH
  kAtomicWrite = 9,  // IBV_WC_ATOMIC_WRITE
  kRecv = 128,
  kRecvRdmaWithImm = 129,
};

// ibv_wc_flags.
inline constexpr uint32_t kWcGrh = 1u << 0;      // UD receive: the first 40 bytes hold the GRH / IPv4 header
inline constexpr uint32_t kWcWithImm = 1u << 1;  // imm_data is valid

struct WorkCompletion {
  uint64_t wr_id = 0;
  WcStatus status = WcStatus::kSuccess;
  WcOpcode opcode = WcOpcode::kSend;
  uint32_t byte_len = 0;  // receives, READs and atomics
  uint32_t imm_data = 0;
  uint32_t qp_num = 0;
  uint32_t src_qp = 0;  // UD receives
  uint32_t wc_flags = 0;
  // What went wrong, for people (empty on success): "rkey 0x... NAKed by
  // the peer: remote access error (AETH 0x62) for RDMA_READ of 4096 bytes".
  // Static storage is not possible here, so errors carry a short string;
  // successes never allocate.
  std::string error{};
};

// kGsi asks create_qp for QP 1, the general services QP: a UD QP (its
// type() is kUd) for management datagrams, one per device.
enum class QpType : uint8_t { kGsi = 1, kRc = 2, kUd = 4 };  // IB_QPT_GSI, IBV_QPT_RC, IBV_QPT_UD

enum class QpState : uint8_t {
  kReset = 0,
  kInit = 1,
  kRtr = 2,
  kRts = 3,
  kError = 6,
};
const char* qp_state_name(QpState s);

// Which QpAttr fields a modify_qp call sets (ibv_qp_attr_mask values).
using QpAttrMask = uint32_t;
inline constexpr QpAttrMask kAttrState = 1u << 0;
inline constexpr QpAttrMask kAttrAccessFlags = 1u << 3;
inline constexpr QpAttrMask kAttrPkeyIndex = 1u << 4;
inline constexpr QpAttrMask kAttrPort = 1u << 5;
inline constexpr QpAttrMask kAttrQkey = 1u << 6;
inline constexpr QpAttrMask kAttrAv = 1u << 7;
inline constexpr QpAttrMask kAttrPathMtu = 1u << 8;
inline constexpr QpAttrMask kAttrTimeout = 1u << 9;
inline constexpr QpAttrMask kAttrRetryCnt = 1u << 10;
inline constexpr QpAttrMask kAttrRnrRetry = 1u << 11;
inline constexpr QpAttrMask kAttrRqPsn = 1u << 12;
inline constexpr QpAttrMask kAttrMaxQpRdAtomic = 1u << 13;
inline constexpr QpAttrMask kAttrMinRnrTimer = 1u << 15;
inline constexpr QpAttrMask kAttrSqPsn = 1u << 16;
inline constexpr QpAttrMask kAttrMaxDestRdAtomic = 1u << 17;
inline constexpr QpAttrMask kAttrDestQpn = 1u << 20;

// The address vector of an RC QP: the peer's GID as an IPv4 address.
struct AddressVector {
  uint32_t dest_ip = 0;  // host order (GID ::ffff:dest_ip)
  uint8_t traffic_class = 0;
  uint8_t hop_limit = 64;
  uint32_t flow_label = 0;  // 0: derived from the QP numbers, as rxe does
};

struct QpAttr {
  QpState state = QpState::kReset;
  // Remote operations the peer may do through this QP (INIT).
  AccessFlags access_flags = kRemoteWrite | kRemoteRead | kRemoteAtomic;
  uint16_t pkey_index = 0;       // must be 0 (one partition, as rxe)
  uint8_t port = 1;              // must be 1
  uint32_t qkey = 0;             // UD
  AddressVector av{};            // RC, RTR
  uint32_t path_mtu = 1024;      // bytes: 256, 512, 1024, 2048 or 4096 (RTR)
  uint32_t dest_qpn = 0;         // RTR
  uint32_t rq_psn = 0;           // RTR: PSN the responder expects first
  uint8_t max_dest_rd_atomic = 16;  // RTR: READs/atomics the peer may have outstanding at us
  uint8_t min_rnr_timer = 12;       // RTR: the RNR NAK timer code we send (IBA table 45; 12 = 0.64 ms)
  uint32_t sq_psn = 0;           // RTS: first PSN we send
  uint8_t timeout = 14;          // RTS: ACK timeout 4.096 us * 2^timeout; 0 waits forever
  uint8_t retry_cnt = 7;         // RTS: retransmissions after a timeout or sequence NAK; 7 = infinite
  uint8_t rnr_retry = 7;         // RTS: retries after RNR NAKs; 7 = infinite
  uint8_t max_rd_atomic = 16;    // RTS: our READs/atomics outstanding at once
};

struct QpCaps {
  uint32_t max_send_wr = 256;
  uint32_t max_recv_wr = 256;
  uint32_t max_send_sge = 4;
  uint32_t max_recv_sge = 4;
  uint32_t max_inline_data = 256;
};

// One QP's identity as a peer needs it to connect (what ibv_rc_pingpong and
// perftest exchange out of band), plus a buffer for tools to target.
struct ConnectionData {
  uint32_t ip = 0;  // GID ::ffff:ip
  uint32_t qpn = 0;
  uint32_t psn = 0;
  uint32_t rkey = 0;
  uint64_t addr = 0;
  uint32_t length = 0;
};

// The values are the C API's, which the provider layer passes through by
// casting (core/provider/softroce.cc, c_api.cc).
static_assert(static_cast<uint32_t>(WrOpcode::kAtomicFetchAndAdd) == UFAB_WR_ATOMIC_FETCH_AND_ADD &&
              static_cast<uint32_t>(WrOpcode::kRdmaRead) == UFAB_WR_RDMA_READ);
static_assert(static_cast<uint32_t>(QpState::kError) == UFAB_QPS_ERR && static_cast<uint32_t>(QpState::kRts) == UFAB_QPS_RTS);
static_assert(static_cast<uint32_t>(WcStatus::kRnrRetryExcErr) == UFAB_WC_RNR_RETRY_EXC_ERR &&
              static_cast<uint32_t>(WcStatus::kGeneralErr) == UFAB_WC_GENERAL_ERR);
static_assert(static_cast<uint32_t>(WcOpcode::kRecvRdmaWithImm) == UFAB_WC_RECV_RDMA_WITH_IMM);
static_assert(static_cast<uint32_t>(WrOpcode::kFlush) == UFAB_WR_FLUSH &&
              static_cast<uint32_t>(WrOpcode::kAtomicWrite) == UFAB_WR_ATOMIC_WRITE &&
              static_cast<uint32_t>(WcOpcode::kFlush) == UFAB_WC_FLUSH &&
              static_cast<uint32_t>(WcOpcode::kAtomicWrite) == UFAB_WC_ATOMIC_WRITE);
static_assert(kFlushGlobal == UFAB_ACCESS_FLUSH_GLOBAL && kFlushPersistent == UFAB_ACCESS_FLUSH_PERSISTENT);
static_assert(kSendCommit == UFAB_SEND_COMMIT && kSendInline == UFAB_SEND_INLINE);

// Counters of the transport on one device: the C API's struct, so the
// provider hands them out as they are (api/ufab/rdma.h says what each is).
using DeviceStats = ::ufab_device_stats;

}  // namespace ufab::verbs
