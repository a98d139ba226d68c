// The explicit list of plugins linked into ufab binaries. Adding a driver
// here (and to the :builtin deps) makes it available without a .so on disk.
#include "drivers/builtin.h"

#include "drivers/e1000e/e1000e.h"
#include "drivers/swnic/swnic.h"
#include "drivers/virtio_net/virtio_net.h"

extern "C" const ufab_driver* const* ufab_builtin_drivers(size_t* count) {
  static const ufab_driver* const drivers[] = {
      ufab_e1000e_driver(),
      ufab_virtio_net_driver(),
      ufab_swnic_driver(),
  };
  *count = sizeof drivers / sizeof drivers[0];
  return drivers;
}
