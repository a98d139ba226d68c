#include "core/transport/verbs.h"

namespace ufab::verbs {

const char* wr_opcode_name(WrOpcode op) {
  switch (op) {
    case WrOpcode::kRdmaWrite: return "RDMA_WRITE";
    case WrOpcode::kRdmaWriteWithImm: return "RDMA_WRITE_WITH_IMM";
    case WrOpcode::kSend: return "SEND";
    case WrOpcode::kSendWithImm: return "SEND_WITH_IMM";
    case WrOpcode::kRdmaRead: return "RDMA_READ";
    case WrOpcode::kAtomicCmpAndSwp: return "ATOMIC_CMP_AND_SWP";
    case WrOpcode::kAtomicFetchAndAdd: return "ATOMIC_FETCH_AND_ADD";
  }
  return "unknown opcode";
}

// The words of libibverbs' ibv_wc_status_str.
const char* wc_status_name(WcStatus s) {
  switch (s) {
    case WcStatus::kSuccess: return "success";
    case WcStatus::kLocLenErr: return "local length error";
    case WcStatus::kLocQpOpErr: return "local QP operation error";
    case WcStatus::kLocProtErr: return "local protection error";
    case WcStatus::kWrFlushErr: return "Work Request Flushed Error";
    case WcStatus::kBadRespErr: return "bad response error";
    case WcStatus::kLocAccessErr: return "local access error";
    case WcStatus::kRemInvReqErr: return "remote invalid request error";
    case WcStatus::kRemAccessErr: return "remote access error";
    case WcStatus::kRemOpErr: return "remote operation error";
    case WcStatus::kRetryExcErr: return "transport retry counter exceeded";
    case WcStatus::kRnrRetryExcErr: return "RNR retry counter exceeded";
    case WcStatus::kGeneralErr: return "general error";
  }
  return "unknown status";
}

const char* wc_opcode_name(WcOpcode op) {
  switch (op) {
    case WcOpcode::kSend: return "SEND";
    case WcOpcode::kRdmaWrite: return "RDMA_WRITE";
    case WcOpcode::kRdmaRead: return "RDMA_READ";
    case WcOpcode::kCompSwap: return "COMP_SWAP";
    case WcOpcode::kFetchAdd: return "FETCH_ADD";
    case WcOpcode::kRecv: return "RECV";
    case WcOpcode::kRecvRdmaWithImm: return "RECV_RDMA_WITH_IMM";
  }
  return "unknown opcode";
}

const char* qp_state_name(QpState s) {
  switch (s) {
    case QpState::kReset: return "RESET";
    case QpState::kInit: return "INIT";
    case QpState::kRtr: return "RTR";
    case QpState::kRts: return "RTS";
    case QpState::kError: return "ERROR";
  }
  return "unknown state";
}

std::string to_string(const DeviceStats& st) {
  auto n = [](uint64_t v) { return std::to_string(v); };
  return "tx " + n(st.tx_frames) + " rx " + n(st.rx_frames) + " frames (RoCE " + n(st.rx_roce) + ", ARP " +
         n(st.rx_arp) + "), parse errors " + n(st.rx_parse_errors) + ", dropped " + n(st.rx_dropped) +
         ", retransmits " + n(st.retransmits) + ", timeouts " + n(st.timeouts) + ", duplicates " +
         n(st.duplicates) + ", NAKs sent " + n(st.naks_sent) + " received " + n(st.naks_received) +
         ", RNR NAKs sent " + n(st.rnr_naks_sent) + " received " + n(st.rnr_naks_received);
}

}  // namespace ufab::verbs
