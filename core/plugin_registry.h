// The plugin registry: which driver plugins this process knows, and which
// one serves a given device.
//
// Plugins come from two places: built-ins, linked statically and added by
// the program (add_builtin), and shared libraries loaded with dlopen
// (load_file, load_directory, load_default). Every plugin is checked the
// same way before it is registered: ABI major, table size, a name, an open
// operation, a terminated match table. Its match table is copied, so
// choosing a plugin for a device (for_pci) is a lookup in data and never
// runs plugin code.
//
// Lifetime: loaded libraries stay mapped until the registry is destroyed.
// Anything that holds a plugin's table (a core::Nic, a copy of Plugin::ops)
// must be gone before its registry is.
//
// Typical use (the `ufab` CLI):
//   core::PluginRegistry registry;
//   registry.add_builtin(ufab_e1000e_driver());
//   if (auto st = registry.load_default(); !st) print(st.error().message());
//   for (auto& w : registry.warnings()) print(w);
//   const core::Plugin* p = registry.for_pci({0x8086, 0x10d3, 0x8086, 0x0000, 0x020000});
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "abi/raw_frame.h"
#include "abi/rdma_provider.h"

namespace ufab::core {

struct Plugin {
  std::string name;                       // ufab_driver.name
  std::string description;                // ufab_driver.description, "" when NULL
  std::string origin;                     // "built-in" or the .so path as given
  uint16_t abi_major = 0, abi_minor = 0;  // what the plugin was built against
  bool software = false;                  // UFAB_DRIVER_F_SOFTWARE
  // The plugin's match table, copied, without the terminating row. `model`
  // points into model_storage (never NULL; "" when the plugin gave none).
  std::vector<ufab_pci_match> matches;
  std::vector<std::string> stubbed_ops;  // ops the loader filled with -EOPNOTSUPP stubs
  ufab_driver ops{};                     // complete table (complete_driver_ops)
  // Owns the model strings `matches` points to. A deque never moves its
  // elements when it grows, so the pointers stay valid.
  std::deque<std::string> model_storage;
};

// What the registry needs to know about a PCI function to pick its driver:
// the four ids and the 24-bit class code (base class, subclass, prog-if).
struct PciIdentity {
  uint16_t vendor_id;
  uint16_t device_id;
  uint16_t subsystem_vendor_id;
  uint16_t subsystem_device_id;
  uint32_t class_code;
};

class PluginRegistry {
 public:
  PluginRegistry();  // empty
  // Drops every plugin, then closes the libraries they came from.
  ~PluginRegistry();
  PluginRegistry(const PluginRegistry&) = delete;
  PluginRegistry& operator=(const PluginRegistry&) = delete;
  PluginRegistry(PluginRegistry&&) noexcept;
  PluginRegistry& operator=(PluginRegistry&&) noexcept;

  // A plugin linked into this program (ufab_<name>_driver()).
  Status add_builtin(const ufab_driver* driver);
  // One shared library. Refused, with an error naming the file: unsafe
  // permissions, dlopen failure, no entry symbol, NULL table, wrong ABI
  // major, short table, bad name, no open, a name already registered.
  Status load_file(const std::string& so_path);
  // Every *.so directly in `dir`, in name order. The directory itself must
  // exist and be safe, or this is an error and nothing is loaded; a file that
  // fails becomes a "skipped <path>: <why>" warning and the rest still load.
  Status load_directory(const std::string& dir);
  // The plugin directories of this installation: those in UFAB_PLUGIN_PATH
  // (colon-separated; replaces the default), or when it is unset or empty
  // the default directory (default_directory()) if it exists. In a setuid or
  // setgid process UFAB_PLUGIN_PATH is ignored with a warning. A directory of
  // UFAB_PLUGIN_PATH that does not exist is a warning; one that is refused
  // (unsafe, not a directory) is an error, returned after the other
  // directories have been loaded. Built-ins should be added before this, so
  // they win name clashes.
  Status load_default();

  // The plugin whose match table describes the device most precisely; see
  // docs/plugin-guide.md ("Matching"). Software plugins are not considered.
  // `row`, when given, receives the matching row. nullptr when none matches.
  const Plugin* for_pci(const PciIdentity& id, const ufab_pci_match** row = nullptr) const;
  const Plugin* by_name(const std::string& name) const;
  // In registration order.
  const std::vector<std::unique_ptr<Plugin>>& plugins() const;
  // Things worth telling the user that did not stop loading: skipped files,
  // missing or ignored directories, plugins built for a newer ABI minor.
  const std::vector<std::string>& warnings() const;

  // RDMA provider plugins found by load_file/load_directory (libraries that
  // export ufab_rdma_provider_entry_v1), in load order. Their tables are
  // checked and completed by the provider layer, not here.
  struct RdmaProviderTable {
    const ufab_rdma_provider* table;
    std::string origin;  // the .so path
  };
  const std::vector<RdmaProviderTable>& rdma_providers() const;

  // `<directory of the binary or shared library holding the registry>/ufab-plugins`,
  // symlinks resolved; "" when that location cannot be determined.
  static std::string default_directory();

  // Test seam: behave as if the process were setuid (AT_SECURE).
  void set_secure_mode_for_testing(bool secure);

 private:
  class Library;
  Status register_driver(const ufab_driver* driver, const std::string& origin);
  Status load_directory_impl(const std::string& dir, bool missing_is_warning);
  bool secure_mode() const;

  std::vector<std::unique_ptr<Plugin>> plugins_;
  std::vector<std::unique_ptr<Library>> libraries_;
  std::vector<std::string> warnings_;
  std::vector<RdmaProviderTable> rdma_providers_;
  bool force_secure_ = false;
};

}  // namespace ufab::core
