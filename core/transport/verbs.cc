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
    case WrOpcode::kFlush: return "FLUSH";
    case WrOpcode::kAtomicWrite: return "ATOMIC_WRITE";
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

}  // namespace ufab::verbs
