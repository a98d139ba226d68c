#include "core/plugin_ops.h"

#include <cerrno>
#include <cstring>

namespace ufab::core {
namespace {

// Stubs for operations a plugin does not provide. Each has exactly the
// signature of its slot so the completed table is called like any other.
int stub_open(const ufab_host_ops*, ufab_host*, ufab_dev**) { return -EOPNOTSUPP; }
void stub_close(ufab_dev*) {}
int stub_info(ufab_dev*, ufab_dev_info*) { return -EOPNOTSUPP; }
int stub_link(ufab_dev*, ufab_link*) { return -EOPNOTSUPP; }
int stub_queue_setup(ufab_dev*, uint16_t, const ufab_queue_conf*) { return -EOPNOTSUPP; }
int stub_dev(ufab_dev*) { return -EOPNOTSUPP; }
int stub_burst(ufab_dev*, uint16_t, ufab_buf**, uint16_t) { return -EOPNOTSUPP; }
int stub_stats(ufab_dev*, ufab_stats*) { return -EOPNOTSUPP; }
int stub_rx_irq(ufab_dev*, uint16_t, int, int*) { return -EOPNOTSUPP; }
int stub_set_promiscuous(ufab_dev*, int) { return -EOPNOTSUPP; }
int stub_rx_irq_arm(ufab_dev*, uint16_t) { return -EOPNOTSUPP; }
int stub_rx_steer(ufab_dev*, uint32_t, uint16_t) { return -EOPNOTSUPP; }
int stub_tx_burst_gather(ufab_dev*, uint16_t, const ufab_tx_frame*, uint16_t) { return -EOPNOTSUPP; }

// True when the whole field [offset, offset + len) lies within the plugin's
// `size` bytes: a field cut in half by a short table is as absent as one
// beyond it.
bool within(size_t offset, size_t len, uint32_t size) { return offset + len <= size; }

// Calls visit(member, offset, name, stub) for every operation, in table
// order. This list is the one place that knows the operations; the
// static_assert below keeps it from falling behind abi/raw_frame.h.
template <typename Visit>
void for_each_op(Visit&& visit) {
  visit(&ufab_driver::open, offsetof(ufab_driver, open), "open", &stub_open);
  visit(&ufab_driver::close, offsetof(ufab_driver, close), "close", &stub_close);
  visit(&ufab_driver::info, offsetof(ufab_driver, info), "info", &stub_info);
  visit(&ufab_driver::link, offsetof(ufab_driver, link), "link", &stub_link);
  visit(&ufab_driver::rx_queue_setup, offsetof(ufab_driver, rx_queue_setup), "rx_queue_setup", &stub_queue_setup);
  visit(&ufab_driver::tx_queue_setup, offsetof(ufab_driver, tx_queue_setup), "tx_queue_setup", &stub_queue_setup);
  visit(&ufab_driver::start, offsetof(ufab_driver, start), "start", &stub_dev);
  visit(&ufab_driver::stop, offsetof(ufab_driver, stop), "stop", &stub_dev);
  visit(&ufab_driver::rx_burst, offsetof(ufab_driver, rx_burst), "rx_burst", &stub_burst);
  visit(&ufab_driver::tx_burst, offsetof(ufab_driver, tx_burst), "tx_burst", &stub_burst);
  visit(&ufab_driver::stats, offsetof(ufab_driver, stats), "stats", &stub_stats);
  visit(&ufab_driver::rx_irq, offsetof(ufab_driver, rx_irq), "rx_irq", &stub_rx_irq);
  visit(&ufab_driver::set_promiscuous, offsetof(ufab_driver, set_promiscuous), "set_promiscuous",
        &stub_set_promiscuous);
  visit(&ufab_driver::rx_irq_arm, offsetof(ufab_driver, rx_irq_arm), "rx_irq_arm", &stub_rx_irq_arm);
  visit(&ufab_driver::rx_steer, offsetof(ufab_driver, rx_steer), "rx_steer", &stub_rx_steer);
  visit(&ufab_driver::tx_burst_gather, offsetof(ufab_driver, tx_burst_gather), "tx_burst_gather",
        &stub_tx_burst_gather);
}

// Appending an operation to struct ufab_driver without adding it to
// for_each_op would leave it NULL in completed tables; fail the build instead.
static_assert(offsetof(ufab_driver, tx_burst_gather) + sizeof(ufab_driver::tx_burst_gather) == sizeof(ufab_driver),
              "struct ufab_driver grew: add the new operation and its stub to for_each_op in core/plugin_ops.cc");

// The part of the plugin's table we may read, copied into a zeroed
// full-size table. Copying with the plugin's own size, rather than reading
// fields through a full-size view of its memory, keeps every read within the
// bytes the plugin promised.
ufab_driver bounded_copy(const ufab_driver& driver) {
  ufab_driver copy{};
  size_t n = driver.size < sizeof(ufab_driver) ? driver.size : sizeof(ufab_driver);
  if (n < offsetof(ufab_driver, name)) n = offsetof(ufab_driver, name);  // abi_major, abi_minor, size: always there
  std::memcpy(&copy, &driver, n);
  // A header field cut by a short table would hold half a pointer; clear it.
  auto clear_cut = [&](auto member, size_t offset) {
    if (!within(offset, sizeof(copy.*member), driver.size)) copy.*member = {};
  };
  clear_cut(&ufab_driver::name, offsetof(ufab_driver, name));
  clear_cut(&ufab_driver::description, offsetof(ufab_driver, description));
  clear_cut(&ufab_driver::pci_match, offsetof(ufab_driver, pci_match));
  clear_cut(&ufab_driver::flags, offsetof(ufab_driver, flags));
  clear_cut(&ufab_driver::reserved, offsetof(ufab_driver, reserved));
  return copy;
}

}  // namespace

ufab_driver complete_driver_ops(const ufab_driver& driver) {
  ufab_driver out = bounded_copy(driver);
  for_each_op([&](auto member, size_t offset, const char*, auto stub) {
    if (!within(offset, sizeof(out.*member), driver.size) || out.*member == nullptr) out.*member = stub;
  });
  out.size = sizeof(ufab_driver);
  return out;
}

std::vector<std::string> stubbed_driver_ops(const ufab_driver& driver) {
  ufab_driver copy = bounded_copy(driver);
  std::vector<std::string> names;
  for_each_op([&](auto member, size_t offset, const char* name, auto) {
    if (!within(offset, sizeof(copy.*member), driver.size) || copy.*member == nullptr) names.emplace_back(name);
  });
  return names;
}

const std::vector<std::string>& driver_op_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for_each_op([&](auto, size_t, const char* name, auto) { v.emplace_back(name); });
    return v;
  }();
  return names;
}

}  // namespace ufab::core
