// The RDMA providers this process knows, and which one serves a device.
//
// A device name "PREFIX:rest" goes to the provider whose prefix table holds
// PREFIX ("shm:lab" to the shared-memory plugin); every other name (a PCI
// address, "swnic:LAB:0") goes to soft-RoCE, which opens it through the
// raw-frame plugin registry. Each provider's table is completed at
// registration: operations it lacks (a short table from an older ABI minor,
// or NULL) become stubs returning -EOPNOTSUPP, so callers never check.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "abi/rdma_provider.h"

namespace ufab::provider {

struct Provider {
  std::string name;
  std::string description;
  std::string origin;  // "built-in" or the .so path
  uint16_t abi_major = 0, abi_minor = 0;
  std::vector<std::string> prefixes;     // empty: the fallback (soft-RoCE)
  std::vector<std::string> stubbed_ops;  // filled with -EOPNOTSUPP stubs
  ufab_rdma_provider ops{};              // complete table
};

// The calling thread's last error, in words: what ufab_last_error() returns
// and what providers' set_error() writes.
std::string& last_error();
// For the C API's functions: `e` (or `message`) becomes the last error;
// returns -errno (-EINVAL).
int report(const Error& e);
int invalid(const char* message);

// `table` with every operation present; `stubbed` gets the names filled in.
ufab_rdma_provider complete_provider_ops(const ufab_rdma_provider& table, std::vector<std::string>* stubbed);

class ProviderRegistry {
 public:
  // Checks the header (ABI major, size, name, prefixes) and adds a copy.
  Status add(const ufab_rdma_provider* table, const std::string& origin);
  // The provider for a device name; an error names the providers there are
  // when none serves it.
  Result<const Provider*> for_device(const std::string& name) const;
  const std::vector<std::unique_ptr<Provider>>& providers() const { return providers_; }

 private:
  std::vector<std::unique_ptr<Provider>> providers_;
};

}  // namespace ufab::provider
