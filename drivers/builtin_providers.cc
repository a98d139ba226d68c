// The explicit list of RDMA provider plugins linked into ufab binaries.
#include "drivers/builtin_providers.h"

#include "drivers/shm/shm.h"

extern "C" const ufab_rdma_provider* const* ufab_builtin_providers(size_t* count) {
  static const ufab_rdma_provider* const providers[] = {
      ufab_shm_provider(),
  };
  *count = sizeof providers / sizeof providers[0];
  return providers;
}
