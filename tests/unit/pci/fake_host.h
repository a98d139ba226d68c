// A throw-away host for core/pci tests: a temp dir laid out like /sys,
// /proc, /dev and /run, and a fake kernel that reacts to driver_override,
// unbind, bind and drivers_probe writes the way Linux does (moving the
// `driver` symlinks), so bind/unbind run end to end without touching the
// real machine.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "core/pci/host.h"

namespace ufab::pci::testing {

struct FakeNetdev {
  std::string name = "";
  std::string operstate = "up";
  std::string mac = "52:54:00:12:34:56";
  std::optional<std::string> flags = std::nullopt;  // "0x1003" (IFF_UP set); nullopt: no `flags` file
  // Subdirectory of the device holding net/, e.g. "virtio2" as virtio-net
  // has it; "" = <device>/net. Either way <sysfs>/class/net/<name> links to it.
  std::string parent = "";
};

struct FakeDevice {
  std::string address = "";  // "0000:01:00.0"
  uint16_t vendor = 0x8086;
  uint16_t device = 0x10d3;
  uint32_t class_code = 0x020000;
  uint16_t subsystem_vendor = 0x8086;
  uint16_t subsystem_device = 0xa01f;
  uint8_t revision = 0;
  std::string driver = "";          // bound now, "" = none
  std::string natural_driver = "";  // what a probe without override picks; defaults to `driver`
  std::optional<unsigned> iommu_group = std::nullopt;
  int numa_node = -1;
  std::optional<std::string> link_speed = std::nullopt;  // current and max
  std::optional<unsigned> link_width = std::nullopt;
  std::vector<FakeNetdev> netdevs = {};
  std::string resource = "";  // text of `resource`; empty = no file
  std::string config = "";    // bytes of `config`; empty = no file
  bool has_driver_override = true;
  bool minimal = false;  // only vendor/device/class: what libpci strictly needs
};

// Builds a config space: ids, class, and a capability chain from 0x40.
class ConfigBuilder {
 public:
  ConfigBuilder(uint16_t vendor, uint16_t device, uint32_t class_code, size_t size = 256);
  ConfigBuilder& power_management();
  ConfigBuilder& msi(unsigned log2_vectors, bool is_64bit);
  ConfigBuilder& pcie(unsigned port_type, unsigned speed, unsigned width, unsigned max_speed, unsigned max_width);
  ConfigBuilder& msix(unsigned vectors, unsigned table_bar, uint32_t table_offset, unsigned pba_bar,
                      uint32_t pba_offset);
  ConfigBuilder& vendor_specific(uint8_t length);
  // Extended capabilities (need size 4096), chained from 0x100.
  ConfigBuilder& extended(uint16_t id, uint8_t version, const std::vector<uint8_t>& body);
  ConfigBuilder& raw(size_t offset, uint8_t value);
  std::string bytes() const { return config_; }

 private:
  size_t add_standard(uint8_t id, size_t length);
  void put16(size_t at, uint16_t v);
  void put32(size_t at, uint32_t v);
  std::string config_;
  size_t next_standard_ = 0x40;
  size_t last_standard_ = 0;  // 0 = none yet
  size_t next_extended_ = 0x100;
  size_t last_extended_ = 0;
};

class FakeHost {
 public:
  FakeHost();
  ~FakeHost();
  FakeHost(const FakeHost&) = delete;
  FakeHost& operator=(const FakeHost&) = delete;

  void add_driver(const std::string& name);
  void add_device(const FakeDevice& device);
  // Standard setup of a VFIO-capable host: IOMMU on, vfio modules loaded,
  // /dev/vfio/vfio present, vfio-pci registered.
  void add_vfio_support();

  // A Host whose paths point into the fake tree and whose side effects go
  // to the fake kernel and the knobs below. Valid while *this lives.
  Host host();

  // Every file, directory and link under the root with type, mode and
  // content: equal snapshots mean nothing was changed.
  std::map<std::string, std::string> snapshot() const;
  // The entries that differ between two snapshots, one per line ("" = none).
  static std::string diff(const std::map<std::string, std::string>& before,
                          const std::map<std::string, std::string>& after);

  // Files.
  void write(const std::string& path, const std::string& content, unsigned mode = 0644);
  void mkdirs(const std::string& path);
  void link(const std::string& target, const std::string& link_path);
  std::string read(const std::string& path) const;  // "" when absent
  bool exists(const std::string& path) const;
  std::string device_dir(const std::string& address) const;  // the real (non-link) directory
  std::string driver_of(const std::string& address) const;

  // Paths of the fake tree.
  std::string root, sysfs, proc, dev, state_dir;

  // Knobs for the Host returned by host().
  uid_t euid = 0;
  std::set<std::string> unwritable;                      // paths can_access() denies
  std::set<std::pair<std::string, std::string>> refuse;  // (address, driver) probes that fail
  Result<HostNetworkState> network = HostNetworkState{};
  Result<MemlockLimit> memlock = MemlockLimit{MemlockLimit::kUnlimited, MemlockLimit::kUnlimited};

  // What the code under test wrote, in order: (path, data).
  std::vector<std::pair<std::string, std::string>> writes;

 private:
  Status kernel_write(const std::string& path, const std::string& data);
  Status attach(const std::string& address, const std::string& driver);
  void detach(const std::string& address);
  std::string override_of(const std::string& address) const;
  std::optional<unsigned> group_of(const std::string& address) const;

  std::map<std::string, std::string> natural_driver_;
};

}  // namespace ufab::pci::testing
