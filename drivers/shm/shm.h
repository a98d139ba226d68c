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
#endif
