/* The driver plugins linked into the binary (the explicit built-in list).
 * Plugins found on disk are loaded beside these by the registry. */
#ifndef UFAB_DRIVERS_BUILTIN_H
#define UFAB_DRIVERS_BUILTIN_H

#include <stddef.h>

#include "abi/raw_frame.h"

#ifdef __cplusplus
extern "C" {
#endif

const struct ufab_driver* const* ufab_builtin_drivers(size_t* count);

#ifdef __cplusplus
}

#include <span>

namespace ufab::drivers {

// The same list as a span, for core::default_registry(builtins).
inline std::span<const ufab_driver* const> builtin_drivers() {
  size_t count = 0;
  const ufab_driver* const* list = ufab_builtin_drivers(&count);
  return {list, count};
}

}  // namespace ufab::drivers
#endif

#endif
