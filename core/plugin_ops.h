// Completing a plugin's driver table.
//
// A plugin hands the framework a `struct ufab_driver` whose `size` says how
// much of the table it was built with: a plugin compiled against an older
// ABI minor has a shorter table, and any plugin may leave operations it does
// not support NULL. The framework wants to call every operation without a
// NULL check on the hot path, so it works on a completed copy in which every
// missing operation is a stub that returns -EOPNOTSUPP (close: does nothing).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "abi/raw_frame.h"

namespace ufab::core {

// Bytes of the table header (ABI version, size, name, description, match
// table, flags) that every ABI 1.x plugin has; operations start here. A table
// whose `size` is smaller than this is not a driver table.
inline constexpr size_t kDriverHeaderSize = offsetof(ufab_driver, open);

// A full-size copy of `driver`. Only the first `driver.size` bytes of the
// plugin's table are read (the plugin's table may be that short); header
// fields and operations that lie beyond it, and operations that are NULL,
// are filled in: header fields with zero, operations with -EOPNOTSUPP stubs
// (close with a no-op). abi_major and abi_minor keep the plugin's values;
// `size` becomes sizeof(ufab_driver), since the copy now has every field.
// `open` is stubbed like any other operation; the plugin registry refuses a
// plugin without open before it gets here.
ufab_driver complete_driver_ops(const ufab_driver& driver);

// Names of the operations complete_driver_ops(driver) fills with stubs, in
// table order ("rx_irq", "set_promiscuous", ...). Reads what
// complete_driver_ops reads and no more.
std::vector<std::string> stubbed_driver_ops(const ufab_driver& driver);

// Names of every operation of this ufab's ABI, in table order.
const std::vector<std::string>& driver_op_names();

}  // namespace ufab::core
