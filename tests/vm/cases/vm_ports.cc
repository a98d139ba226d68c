#include "tests/vm/cases/vm_ports.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "base/pci_address.h"

namespace ufab::vmtest {

std::vector<std::string> env_list(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  std::string s = v ? v : fallback;
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    if (comma == std::string::npos) comma = s.size();
    if (comma > pos) out.push_back(s.substr(pos, comma - pos));
    pos = comma + 1;
  }
  return out;
}

uint64_t env_count(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v ? std::strtoull(v, nullptr, 10) : fallback;
}

std::string mac_text(const uint8_t* m) {
  char b[24];
  std::snprintf(b, sizeof b, "%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4], m[5]);
  return b;
}

core::Mac mac_of(const core::Nic& nic) {
  core::Mac m;
  std::memcpy(m.data(), nic.info().mac, 6);
  return m;
}

Port open_port(const ufab_driver& driver, const std::string& bdf, uint32_t rx_ring, uint32_t tx_ring,
               uint32_t pool_buffers) {
  Port p;
  auto addr = PciAddress::parse(bdf);
  EXPECT_TRUE(addr) << bdf;
  if (!addr) return p;
  auto nic = core::Nic::open_pci(driver, *addr);
  EXPECT_TRUE(nic) << (nic ? "" : nic.error().message());
  if (!nic) return p;
  p.nic = std::move(*nic);
  auto pool = p.nic->create_pool(pool_buffers);
  EXPECT_TRUE(pool) << (pool ? "" : pool.error().message());
  if (!pool) return Port{};
  p.pool = *pool;
  auto ok = p.nic->setup_rx_queue(0, rx_ring, *p.pool);
  if (ok) ok = p.nic->setup_tx_queue(0, tx_ring);
  if (ok) ok = p.nic->start();
  EXPECT_TRUE(ok) << (ok ? "" : ok.error().message());
  if (!ok) return Port{};
  return p;
}

}  // namespace ufab::vmtest
