// The virtio-net driver plugin (modern virtio-pci 1.x, 1AF4:1041), linked
// statically: the framework's built-in registry calls this to get the table.
// As a shared library the same table comes from ufab_driver_entry_v1().
#pragma once

#include "abi/raw_frame.h"

#ifdef __cplusplus
extern "C" {
#endif

const struct ufab_driver* ufab_virtio_net_driver(void);

#ifdef __cplusplus
}
#endif
