// A minimal driver written against the C++ adapter: enough operations to
// prove that a table built by ufab::sdk::make_driver survives loading and
// that calls land in the plugin's code.
#include "tests/unit/core/good_plugin.h"

#include <cstring>
#include <memory>

#include "drivers/sdk/adapter.h"

namespace {

class GoodDev {
 public:
  static int open(const ufab_host_ops* ops, ufab_host* host, GoodDev** out) {
    auto dev = std::make_unique<GoodDev>();
    if (ops != nullptr && ops->log != nullptr) ops->log(host, UFAB_LOG_DEBUG, "good: open");
    *out = dev.release();
    return 0;
  }
  int info(ufab_dev_info* out) {
    *out = {};
    const uint8_t mac[6] = {0x02, 0x00, 0x00, 0x00, 0x00, 0x01};
    std::memcpy(out->mac, mac, sizeof(mac));
    out->max_rx_queues = 1;
    out->max_tx_queues = 1;
    std::strncpy(out->model, "good test device", sizeof(out->model) - 1);
    return 0;
  }
  int start() {
    started_ = true;
    return 0;
  }
  int stop() {
    started_ = false;
    return 0;
  }
  int rx_burst(uint16_t, ufab_buf**, uint16_t) { return 0; }
  int stats(ufab_stats* out) {
    *out = {};
    return 0;
  }

 private:
  bool started_ = false;
};

// Data the registry reads to decide, without running plugin code, that this
// plugin drives a device. Ends with the all-zero row.
const ufab_pci_match kMatches[] = {
    {0x8086, 0x10d3, UFAB_PCI_ANY, UFAB_PCI_ANY, 0, 0, "82574L"},
    {0x8086, UFAB_PCI_ANY, UFAB_PCI_ANY, UFAB_PCI_ANY, 0x020000, 0xffff00, "Intel Ethernet"},
    {},
};

}  // namespace

const ufab_driver* ufab_good_driver() {
  static const ufab_driver driver = ufab::sdk::make_driver<GoodDev>("good", "test plugin that loads cleanly", kMatches);
  return &driver;
}
