// The one symbol libufab_shm.so exports (see shm.lds).
#include "drivers/shm/shm.h"

extern "C" __attribute__((visibility("default"))) const struct ufab_rdma_provider* ufab_rdma_provider_entry_v1(void) {
  return ufab_shm_provider();
}
