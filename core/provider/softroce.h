// The soft-RoCE provider: RDMA over any raw-frame NIC plugin through ufab's
// user-space RoCEv2 transport (core/transport), behind the same provider
// ABI (abi/rdma_provider.h) as queue-pair plugins. It serves every
// device name no other provider claims: PCI addresses of vfio-bound NICs
// and software NICs such as "swnic:LAB:0".
#pragma once

#include "core/plugin_registry.h"
#include "abi/rdma_provider.h"

namespace ufab::provider {

// The provider's table. Devices are opened through `raw_plugins` (which
// raw-frame plugins exist is the program's choice), which must outlive
// every device opened: the NICs hold its plugins' tables.
const ufab_rdma_provider* softroce_provider(const core::PluginRegistry& raw_plugins);

}  // namespace ufab::provider
