// Text and JSON renderings of discovery results shared by the subcommands.
#pragma once

#include <cstdint>
#include <string>

#include "base/json.h"
#include "core/pci/discovery.h"
#include "ufab/rdma.hpp"

namespace ufab::cli {

std::string human_size(uint64_t bytes);  // "128 KiB"
// "Intel Corporation 82574L Gigabit Network Connection", or the ids.
std::string device_title(const pci::DeviceInfo& d);
// "eth0 (up)" or "-".
std::string interfaces_summary(const pci::DeviceInfo& d);
std::string group_text(const pci::DeviceInfo& d);

// The object every command uses for one device (discovery fields only).
void write_device_fields(JsonWriter& w, const pci::DeviceInfo& d);

// "transport": the RDMA transport's counters (pingpong, perf).
void write_transport_stats(JsonWriter& w, const rdma::DeviceStats& st);

}  // namespace ufab::cli
