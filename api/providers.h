// The RDMA providers of this library: soft-RoCE for raw-frame NICs, and the
// queue-pair plugins linked in (drivers/builtin_providers). The C API picks
// from these; `ufab plugins` lists them.
#pragma once

#include "core/provider/providers.h"

namespace ufab::api {

const provider::ProviderRegistry& providers();

}  // namespace ufab::api
