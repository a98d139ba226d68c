/* The RDMA provider plugins linked into the binary (the explicit built-in
 * list); soft-RoCE is not one of them, it is the framework's own. */
#ifndef UFAB_DRIVERS_BUILTIN_PROVIDERS_H
#define UFAB_DRIVERS_BUILTIN_PROVIDERS_H

#include <stddef.h>

#include "abi/rdma_provider.h"

#ifdef __cplusplus
extern "C" {
#endif

const struct ufab_rdma_provider* const* ufab_builtin_providers(size_t* count);

#ifdef __cplusplus
}
#endif

#endif
