// Driver SDK: turns a C++ driver class into the C `struct ufab_driver` table.
//
// A plugin writes a class with the operations it supports, e.g.
//
//   class E1000e {
//    public:
//     static int open(const ufab_host_ops* ops, ufab_host* host, E1000e** out);
//     ~E1000e();                                  // close
//     int info(ufab_dev_info* out);
//     int rx_burst(uint16_t q, ufab_buf** bufs, uint16_t n);
//     ...
//   };
//   const ufab_driver* ufab_e1000e_driver() {
//     static const ufab_driver d = ufab::sdk::make_driver<E1000e>(
//         "e1000e", "Intel 82574L", kMatchTable);
//     return &d;
//   }
//
// Operations the class does not define stay NULL here and the loader fills
// them with -EOPNOTSUPP stubs. Every generated function catches exceptions
// (a plugin may use the STL freely) and turns them into a negative errno.
#pragma once

#include <cerrno>
#include <new>

#include "abi/raw_frame.h"

namespace ufab::sdk {

template <typename Fn>
int guarded(Fn&& fn) noexcept {
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    return -ENOMEM;
  } catch (...) {
    return -EIO;
  }
}

template <typename Dev>
Dev* self(ufab_dev* dev) {
  return reinterpret_cast<Dev*>(dev);
}

template <typename Dev>
constexpr ufab_driver make_driver(const char* name, const char* description, const ufab_pci_match* match,
                                  uint32_t flags = 0) {
  ufab_driver d{};
  d.abi_major = UFAB_ABI_MAJOR;
  d.abi_minor = UFAB_ABI_MINOR;
  d.size = sizeof(ufab_driver);
  d.name = name;
  d.description = description;
  d.pci_match = match;
  d.flags = flags;

  d.open = [](const ufab_host_ops* ops, ufab_host* host, ufab_dev** out) -> int {
    return guarded([&] {
      Dev* dev = nullptr;
      int rc = Dev::open(ops, host, &dev);
      if (rc < 0) return rc;
      *out = reinterpret_cast<ufab_dev*>(dev);
      return 0;
    });
  };
  d.close = [](ufab_dev* dev) {
    guarded([&] {
      delete self<Dev>(dev);
      return 0;
    });
  };
  if constexpr (requires(Dev& x, ufab_dev_info* i) { x.info(i); }) {
    d.info = [](ufab_dev* dev, ufab_dev_info* out) { return guarded([&] { return self<Dev>(dev)->info(out); }); };
  }
  if constexpr (requires(Dev& x, ufab_link* l) { x.link(l); }) {
    d.link = [](ufab_dev* dev, ufab_link* out) { return guarded([&] { return self<Dev>(dev)->link(out); }); };
  }
  if constexpr (requires(Dev& x, const ufab_queue_conf* c) { x.rx_queue_setup(uint16_t{}, c); }) {
    d.rx_queue_setup = [](ufab_dev* dev, uint16_t q, const ufab_queue_conf* c) {
      return guarded([&] { return self<Dev>(dev)->rx_queue_setup(q, c); });
    };
  }
  if constexpr (requires(Dev& x, const ufab_queue_conf* c) { x.tx_queue_setup(uint16_t{}, c); }) {
    d.tx_queue_setup = [](ufab_dev* dev, uint16_t q, const ufab_queue_conf* c) {
      return guarded([&] { return self<Dev>(dev)->tx_queue_setup(q, c); });
    };
  }
  if constexpr (requires(Dev& x) { x.start(); }) {
    d.start = [](ufab_dev* dev) { return guarded([&] { return self<Dev>(dev)->start(); }); };
  }
  if constexpr (requires(Dev& x) { x.stop(); }) {
    d.stop = [](ufab_dev* dev) { return guarded([&] { return self<Dev>(dev)->stop(); }); };
  }
  if constexpr (requires(Dev& x, ufab_buf** b) { x.rx_burst(uint16_t{}, b, uint16_t{}); }) {
    d.rx_burst = [](ufab_dev* dev, uint16_t q, ufab_buf** bufs, uint16_t n) {
      return guarded([&] { return self<Dev>(dev)->rx_burst(q, bufs, n); });
    };
  }
  if constexpr (requires(Dev& x, ufab_buf** b) { x.tx_burst(uint16_t{}, b, uint16_t{}); }) {
    d.tx_burst = [](ufab_dev* dev, uint16_t q, ufab_buf** bufs, uint16_t n) {
      return guarded([&] { return self<Dev>(dev)->tx_burst(q, bufs, n); });
    };
  }
  if constexpr (requires(Dev& x, ufab_stats* s) { x.stats(s); }) {
    d.stats = [](ufab_dev* dev, ufab_stats* out) { return guarded([&] { return self<Dev>(dev)->stats(out); }); };
  }
  if constexpr (requires(Dev& x, int* fd) { x.rx_irq(uint16_t{}, 0, fd); }) {
    d.rx_irq = [](ufab_dev* dev, uint16_t q, int enable, int* fd) {
      return guarded([&] { return self<Dev>(dev)->rx_irq(q, enable, fd); });
    };
  }
  if constexpr (requires(Dev& x) { x.set_promiscuous(0); }) {
    d.set_promiscuous = [](ufab_dev* dev, int enable) {
      return guarded([&] { return self<Dev>(dev)->set_promiscuous(enable); });
    };
  }
  if constexpr (requires(Dev& x) { x.rx_irq_arm(uint16_t{}); }) {
    d.rx_irq_arm = [](ufab_dev* dev, uint16_t q) { return guarded([&] { return self<Dev>(dev)->rx_irq_arm(q); }); };
  }
  if constexpr (requires(Dev& x) { x.rx_steer(uint32_t{}, uint16_t{}); }) {
    d.rx_steer = [](ufab_dev* dev, uint32_t mode, uint16_t nqueues) {
      return guarded([&] { return self<Dev>(dev)->rx_steer(mode, nqueues); });
    };
  }
  if constexpr (requires(Dev& x, const ufab_tx_frame* f) { x.tx_burst_gather(uint16_t{}, f, uint16_t{}); }) {
    d.tx_burst_gather = [](ufab_dev* dev, uint16_t q, const ufab_tx_frame* frames, uint16_t n) {
      return guarded([&] { return self<Dev>(dev)->tx_burst_gather(q, frames, n); });
    };
  }
  return d;
}

}  // namespace ufab::sdk
