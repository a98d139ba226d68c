// The shared-library entry point of the virtio-net plugin: the one symbol
// libufab_virtio_net.so exports (see plugin.lds).
#include "abi/raw_frame.h"
#include "drivers/virtio_net/virtio_net.h"

extern "C" __attribute__((visibility("default"))) const ufab_driver* ufab_driver_entry_v1() {
  return ufab_virtio_net_driver();
}
