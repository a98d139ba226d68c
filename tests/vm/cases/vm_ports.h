// Helpers shared by the VM test programs: device lists from the environment
// and a started port (NIC + buffer pool, queue 0 set up).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/nic.h"
#include "core/traffic.h"

namespace ufab::vmtest {

// "a,b,c" from the environment variable, or from `fallback` when unset.
std::vector<std::string> env_list(const char* name, const std::string& fallback = "");
uint64_t env_count(const char* name, uint64_t fallback);

std::string mac_text(const uint8_t* mac);
core::Mac mac_of(const core::Nic& nic);

struct Port {
  std::unique_ptr<core::Nic> nic;  // keeps the pool alive as long as it needs it
  std::shared_ptr<dma::BufferPool> pool;
};

// Opens the PCI NIC `bdf` with `driver`, sets up queue 0 and starts it.
// Failures are recorded as gtest failures and give an empty Port. The RX ring
// defaults to twice the TX ring: QEMU's hub reorders frames for a receiver
// whose ring ran dry (docs/drivers/virtio_net.md), so receivers get headroom.
Port open_port(const ufab_driver& driver, const std::string& bdf, uint32_t rx_ring = 256, uint32_t tx_ring = 128,
               uint32_t pool_buffers = 2048);

}  // namespace ufab::vmtest
