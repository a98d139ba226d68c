// shm: the shared-memory RDMA provider. Devices are named "shm:DOMAIN";
// processes of one user on one host that open the same DOMAIN reach each
// other's RC queue pairs. See docs/drivers/shm.md.
#pragma once

#include "abi/rdma_provider.h"

#ifdef __cplusplus
extern "C" {
#endif

// The provider table, for linking shm into a binary statically.
const struct ufab_rdma_provider* ufab_shm_provider(void);

#ifdef __cplusplus
}

#include <cstdint>

namespace ufab::shm {
// Which path GPU work took in this process (docs/gpu.md, "shm"), counted
// since it started: for tests and debugging (statically linked users).
struct GpuPathStats {
  uint64_t ipc_wrs;             // requester: WRs with a piece copied through CUDA IPC
  uint64_t staged_wrs;          // requester: GPU WRs with a piece through its staging slots
  uint64_t ipc_copies;          // responder: device-to-device copies through CUDA IPC
  uint64_t staged_pieces;       // responder: pieces through its staging slots
  uint64_t ipc_opens, ipc_closes, ipc_open_failures;
  uint64_t ipc_exports;         // GPU regions exported for CUDA IPC at registration
  uint64_t ipc_export_refused;  // GPU regions cuIpcGetMemHandle refused (they stage)
};
GpuPathStats gpu_path_stats();
}  // namespace ufab::shm
#endif
