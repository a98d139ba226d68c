// An open NIC: a driver plugin's device instance plus the host services the
// framework hands it (BAR mappings and config space through VFIO, DMA memory
// through the IOMMU, MSI-X eventfds, frame buffer pools). Software devices
// (UFAB_DRIVER_F_SOFTWARE) get the same services without VFIO.
//
// Typical use:
//   auto nic = core::Nic::open_pci(*registry.for_device(addr), addr);
//   auto pool = (*nic)->create_pool(4096);
//   (*nic)->setup_rx_queue(0, 256, **pool);  (*nic)->setup_tx_queue(0, 128);
//   (*nic)->start();
//   n = (*nic)->rx_burst(0, bufs, 32);  ...  (*pool)->free(bufs, n);
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/pci_address.h"
#include "core/plugin_ops.h"
#include "dma/buffer_pool.h"
#include "dma/dma.h"
#include "abi/raw_frame.h"
#include "vfio/container.h"
#include "vfio/device.h"

namespace ufab::core {

using NicParams = std::map<std::string, std::string>;

class Nic {
 public:
  // A PCI NIC bound to vfio-pci, driven by `driver`.
  static Result<std::unique_ptr<Nic>> open_pci(const ufab_driver& driver, const PciAddress& address,
                                               NicParams params = {}, vfio::Environment env = {});
  // A software device (UFAB_DRIVER_F_SOFTWARE) by name, e.g. "swnic0:0".
  static Result<std::unique_ptr<Nic>> open_software(const ufab_driver& driver, const std::string& name,
                                                    NicParams params = {});
  // Stops and closes the plugin's device, then releases IRQs, DMA memory,
  // BAR mappings and the VFIO device, in that order.
  ~Nic();
  Nic(const Nic&) = delete;
  Nic& operator=(const Nic&) = delete;

  const std::string& name() const { return name_; }
  const ufab_driver& driver() const { return driver_; }
  const ufab_dev_info& info() const { return info_; }
  Result<ufab_link> link();
  Result<ufab_stats> stats();

  // Buffers in this NIC's DMA space (count buffers of buffer_size bytes).
  // The NIC keeps a reference: a pool lives at least until the plugin has
  // closed the device and handed back every buffer it held, whatever order
  // the caller drops things in.
  Result<std::shared_ptr<dma::BufferPool>> create_pool(uint32_t count, uint32_t buffer_size = 2048);
  Status setup_rx_queue(uint16_t queue, uint32_t size, dma::BufferPool& pool);
  Status setup_tx_queue(uint16_t queue, uint32_t size);
  Status start();
  Status stop();
  Status set_promiscuous(bool enable);

  // Hot path: straight calls into the plugin. Return a count, or a negative
  // errno (last_error() explains it).
  int rx_burst(uint16_t queue, ufab_buf** bufs, uint16_t n) { return driver_.rx_burst(dev_, queue, bufs, n); }
  int tx_burst(uint16_t queue, ufab_buf** bufs, uint16_t n) { return driver_.tx_burst(dev_, queue, bufs, n); }
  // Gather transmit (abi/raw_frame.h tx_burst_gather); -EOPNOTSUPP when the
  // plugin cannot gather (can_gather() is false).
  int tx_burst_gather(uint16_t queue, const ufab_tx_frame* frames, uint16_t n) {
    return driver_.tx_burst_gather(dev_, queue, frames, n);
  }
  // Whether the plugin implements tx_burst_gather.
  bool can_gather() const { return can_gather_; }

  // Interrupt mode: the eventfd becomes readable when frames arrive on the
  // queue; read it (8 bytes) and rx_burst until empty before sleeping again.
  Result<int> enable_rx_irq(uint16_t queue);
  Status disable_rx_irq(uint16_t queue);
  // Right before sleeping on the interrupt's eventfd (abi/raw_frame.h
  // rx_irq_arm). 0, or -EOPNOTSUPP when the driver re-arms by itself; no
  // error text is formatted (it runs on every sleep).
  int arm_rx_irq(uint16_t queue) { return driver_.rx_irq_arm(dev_, queue); }
  // Receive steering (abi/raw_frame.h rx_steer): before start(). An
  // error says why the device cannot (EOPNOTSUPP: steer in software).
  Status set_rx_steering(uint32_t mode, uint16_t nqueues);

  // What the plugin said about the last operation that failed on this
  // thread (rx_burst and tx_burst included).
  std::string last_error() const;
  // DMA memory for this NIC (IOMMU-mapped for PCI devices).
  dma::DmaAllocator& dma() { return *dma_; }
  // The VFIO device and IOMMU, nullptr for software devices.
  vfio::Device* vfio_device() { return device_.get(); }
  std::shared_ptr<vfio::IommuBackend> iommu() const { return iommu_; }

 private:
  struct HostBridge;
  Nic() = default;
  Status open_plugin();
  // Runs a plugin operation and turns a negative errno plus the plugin's
  // explanation into an Error.
  Status call(const std::string& what, const std::function<int()>& op);

  std::string name_;
  NicParams params_;
  ufab_driver driver_{};
  std::shared_ptr<vfio::IommuBackend> iommu_;
  std::unique_ptr<vfio::Device> device_;
  std::shared_ptr<dma::DmaAllocator> dma_;
  std::vector<std::shared_ptr<dma::BufferPool>> pools_;  // destroyed after the plugin closes
  std::unique_ptr<HostBridge> host_;
  ufab_dev* dev_ = nullptr;
  ufab_dev_info info_{};
  bool can_gather_ = false;
};

}  // namespace ufab::core
