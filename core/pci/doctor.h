// `ufab doctor`: is this host set up for user-space NIC drivers? Each check
// says what it found and, when something is wrong, the command that fixes it.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/pci_address.h"
#include "core/pci/host.h"

namespace ufab::pci {

enum class CheckStatus { kOk, kWarn, kFail, kSkip };
const char* check_status_name(CheckStatus status);  // "ok", "warn", "fail", "skip"

struct Check {
  std::string name;  // stable id, e.g. "iommu-groups", "module vfio_pci", "group 7 viable"
  CheckStatus status = CheckStatus::kSkip;
  std::string detail;  // what was found
  std::string fix;     // for warn/fail: the exact command or setting that fixes it
};

// Runs every host check, then the device checks for `device` (or, without
// one, for every NIC bound to vfio-pci). Never fails as a whole: a check
// that cannot look is "skip" with the reason in its detail.
//
// Check names: kernel-cmdline, iommu-groups, iommu-firmware, module vfio,
// module vfio_pci, module vfio_iommu_type1, vfio-container, noiommu-mode,
// interrupt-remapping, dma-entry-limit, memlock, hugepages, and per device:
// "device <bdf>", "<bdf> on vfio-pci", "group N viable", "/dev/vfio/N"
// (with the host's dev path), or "vfio devices" when none is bound.
std::vector<Check> run_doctor(const Host& host, const std::optional<PciAddress>& device = std::nullopt);

// The most severe status in `checks` (fail > warn > ok > skip).
CheckStatus worst_status(const std::vector<Check>& checks);

}  // namespace ufab::pci
