#include "core/pci/doctor.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <sstream>

#include "base/files.h"
#include "core/pci/discovery.h"
#include "core/pci/sysfs_layout.h"

namespace ufab::pci {
namespace {

constexpr uint64_t kMemlockWanted = 64ull << 20;  // room for rings and buffers of one NIC
constexpr uint64_t kDefaultDmaEntryLimit = 65535;
constexpr unsigned kCapIpcLock = 14;                    // <linux/capability.h>
constexpr uint64_t kIntelEcapInterruptRemap = 1u << 3;  // VT-d ECAP.IR

const char* kIommuBootFix =
    "add intel_iommu=on (Intel) or amd_iommu=on (AMD) to GRUB_CMDLINE_LINUX in /etc/default/grub, run "
    "`update-grub` and reboot; also enable VT-d / AMD-Vi in the firmware setup";

Check make(std::string name, CheckStatus status, std::string detail, std::string fix = "") {
  return Check{std::move(name), status, std::move(detail), std::move(fix)};
}

std::string mode_text(unsigned mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", mode);
  return buf;
}

std::string mib(uint64_t bytes) {
  if (bytes == MemlockLimit::kUnlimited) return "unlimited";
  if (bytes % (1 << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes >> 10) + " KiB";
}

std::vector<std::string> words(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

bool has_iommu_groups(const HostPaths& paths) { return !list_dir(layout::iommu_groups_dir(paths)).empty(); }

Check check_cmdline(const Host& host) {
  std::string name = "kernel-cmdline";
  // /proc/cmdline separates arguments with spaces.
  auto cmdline = read_attr(host.paths.proc + "/cmdline");
  if (!cmdline) return make(name, CheckStatus::kSkip, "cannot read " + host.paths.proc + "/cmdline");
  std::vector<std::string> on, off;
  for (const std::string& w : words(*cmdline)) {
    if (w == "intel_iommu=on" || w == "amd_iommu=on" || w == "iommu=pt" || w == "iommu=on" ||
        w.starts_with("intel_iommu=on,")) {
      on.push_back(w);
    }
    if (w == "intel_iommu=off" || w == "amd_iommu=off" || w == "iommu=off") off.push_back(w);
  }
  if (!off.empty()) {
    return make(name, CheckStatus::kFail, "the kernel was booted with " + off.front() + ", which turns the IOMMU off",
                "remove " + off.front() + " from GRUB_CMDLINE_LINUX in /etc/default/grub, " + kIommuBootFix);
  }
  std::string found;
  for (const std::string& w : on) found += (found.empty() ? "" : " ") + w;
  if (!found.empty()) return make(name, CheckStatus::kOk, "IOMMU options: " + found);
  if (has_iommu_groups(host.paths)) {
    return make(name, CheckStatus::kOk, "no IOMMU option on the command line, but the IOMMU is on by default here");
  }
  return make(name, CheckStatus::kFail, "no intel_iommu=on / amd_iommu=on on the kernel command line", kIommuBootFix);
}

Check check_iommu_groups(const Host& host) {
  std::string dir = layout::iommu_groups_dir(host.paths);
  auto groups = list_dir(dir);
  if (!groups.empty()) return make("iommu-groups", CheckStatus::kOk, std::to_string(groups.size()) + " IOMMU groups");
  return make("iommu-groups", CheckStatus::kFail,
              "no IOMMU groups in " + dir + ": the IOMMU is off, so VFIO cannot give devices to user space",
              kIommuBootFix);
}

Check check_firmware(const Host& host) {
  std::string name = "iommu-firmware";
  std::string tables = host.paths.sysfs + "/firmware/acpi/tables";
  if (!path_exists(tables)) return make(name, CheckStatus::kSkip, "ACPI tables are not visible in " + tables);
  struct Table {
    const char* id;
    const char* what;
  };
  for (Table t : {Table{"DMAR", "Intel VT-d"}, Table{"IVRS", "AMD-Vi"}, Table{"VIOT", "virtio-iommu"}}) {
    if (path_exists(tables + "/" + t.id)) {
      return make(name, CheckStatus::kOk, std::string("ACPI ") + t.id + " table present (" + t.what + ")");
    }
  }
  return make(name, CheckStatus::kWarn, "no DMAR/IVRS/VIOT ACPI table: the firmware reports no IOMMU",
              "enable VT-d (Intel) or AMD-Vi/IOMMU (AMD) in the firmware setup; in QEMU use -machine "
              "q35,kernel-irqchip=split -device intel-iommu,intremap=on,caching-mode=on");
}

Check check_module(const Host& host, const std::string& module, const std::string& fix) {
  std::string name = "module " + module;
  if (path_exists(host.paths.sysfs + "/module/" + module)) return make(name, CheckStatus::kOk, module + " is loaded");
  if (module == "vfio_pci" && path_exists(layout::driver_dir(host.paths, layout::kVfioDriver))) {
    return make(name, CheckStatus::kOk, "the vfio-pci driver is registered");
  }
  return make(name, CheckStatus::kFail, module + " is not loaded (no " + host.paths.sysfs + "/module/" + module + ")",
              fix);
}

Check check_container(const Host& host) {
  std::string name = "vfio-container";
  std::string node = host.paths.dev + "/vfio/vfio";
  struct stat st;
  if (::stat(node.c_str(), &st) != 0) {
    return make(
        name, CheckStatus::kFail, node + " is missing",
        "`modprobe vfio` (if it is loaded and the node is still missing: `mknod -m 0666 " + node + " c 10 196`)");
  }
  std::string mode = mode_text(st.st_mode & 07777);
  if (!host.can_access(node, R_OK | W_OK)) {
    return make(
        name, CheckStatus::kFail,
        node + " (mode " + mode + ") is not readable and writable by uid " + std::to_string(host.effective_uid()),
        "run ufab as root, or `chmod 0666 " + node + "` (it holds no device by itself)");
  }
  return make(name, CheckStatus::kOk, node + " present, mode " + mode);
}

Check check_noiommu(const Host& host) {
  std::string name = "noiommu-mode";
  auto value = read_attr(host.paths.sysfs + "/module/vfio/parameters/enable_unsafe_noiommu_mode");
  if (!value) return make(name, CheckStatus::kSkip, "vfio's enable_unsafe_noiommu_mode is not visible");
  if (*value == "Y" || *value == "1") {
    return make(name, CheckStatus::kWarn,
                "vfio runs in unsafe no-IOMMU mode: devices can DMA anywhere in memory and ufab's groups are "
                "not protected",
                "`echo N > " + host.paths.sysfs +
                    "/module/vfio/parameters/enable_unsafe_noiommu_mode` and enable "
                    "the IOMMU (" +
                    kIommuBootFix + ")");
  }
  return make(name, CheckStatus::kOk, "off");
}

Check check_interrupt_remapping(const Host& host) {
  std::string name = "interrupt-remapping";
  std::string param = host.paths.sysfs + "/module/vfio_iommu_type1/parameters/allow_unsafe_interrupts";
  auto value = read_attr(param);
  if (!value) return make(name, CheckStatus::kSkip, "vfio_iommu_type1's allow_unsafe_interrupts is not visible");
  if (*value == "Y" || *value == "1") {
    return make(name, CheckStatus::kWarn,
                "allow_unsafe_interrupts=Y: without interrupt remapping a device can forge interrupts",
                "once the platform remaps interrupts: `modprobe -r vfio_pci vfio_iommu_type1 && modprobe "
                "vfio_iommu_type1 allow_unsafe_interrupts=0 && modprobe vfio-pci`");
  }
  // Intel units say whether they can remap interrupts (ECAP bit 3).
  std::string units = host.paths.sysfs + "/class/iommu";
  int intel_units = 0, remapping_units = 0;
  for (const std::string& unit : list_dir(units)) {
    auto ecap = read_attr(units + "/" + unit + "/intel-iommu/ecap");
    if (!ecap) continue;
    ++intel_units;
    if (auto bits = parse_uint(*ecap, 16); bits && (*bits & kIntelEcapInterruptRemap)) ++remapping_units;
  }
  if (intel_units > 0 && remapping_units == 0) {
    return make(name, CheckStatus::kFail,
                "no IOMMU unit can remap interrupts and allow_unsafe_interrupts=N: VFIO will refuse to use devices",
                "enable interrupt remapping (firmware: x2APIC/interrupt remapping on; QEMU: -machine "
                "kernel-irqchip=split -device intel-iommu,intremap=on), or as a last resort `modprobe "
                "vfio_iommu_type1 allow_unsafe_interrupts=1`");
  }
  if (intel_units > 0) {
    return make(name, CheckStatus::kOk,
                std::to_string(remapping_units) + " of " + std::to_string(intel_units) +
                    " IOMMU units remap interrupts; allow_unsafe_interrupts=N");
  }
  return make(name, CheckStatus::kOk, "allow_unsafe_interrupts=N (VFIO requires interrupt remapping)");
}

Check check_dma_entry_limit(const Host& host) {
  std::string name = "dma-entry-limit";
  auto value = read_attr(host.paths.sysfs + "/module/vfio_iommu_type1/parameters/dma_entry_limit");
  auto limit = value ? parse_uint(*value, 10) : std::nullopt;
  if (!limit) return make(name, CheckStatus::kSkip, "vfio_iommu_type1's dma_entry_limit is not visible");
  std::string detail = std::to_string(*limit) + " DMA mappings per container";
  if (*limit < kDefaultDmaEntryLimit) {
    return make(name, CheckStatus::kWarn, detail + ", below the default " + std::to_string(kDefaultDmaEntryLimit),
                "`modprobe -r vfio_pci vfio_iommu_type1 && modprobe vfio_iommu_type1 dma_entry_limit=65535 && "
                "modprobe vfio-pci` (persist it with `options vfio_iommu_type1 dma_entry_limit=65535` in "
                "/etc/modprobe.d/vfio.conf)");
  }
  return make(name, CheckStatus::kOk, detail);
}

bool has_cap_ipc_lock(const HostPaths& paths) {
  auto status = read_file(paths.proc + "/self/status");
  if (!status) return false;
  std::istringstream lines(*status);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("CapEff:", 0) != 0) continue;
    auto caps = parse_uint(line.substr(7), 16);
    return caps && (*caps >> kCapIpcLock & 1);
  }
  return false;
}

Check check_memlock(const Host& host) {
  std::string name = "memlock";
  auto limit = host.memlock_limit();
  if (!limit) return make(name, CheckStatus::kSkip, limit.error().message());
  std::string detail = "RLIMIT_MEMLOCK soft " + mib(limit->soft) + ", hard " + mib(limit->hard);
  if (has_cap_ipc_lock(host.paths)) {
    return make(name, CheckStatus::kOk, detail + "; the process has CAP_IPC_LOCK, so VFIO does not apply it");
  }
  if (limit->soft < kMemlockWanted) {
    std::string fix = limit->hard >= kMemlockWanted
                          ? "`ulimit -l unlimited` (or at least 65536 KiB) in the shell that runs ufab"
                          : "add `*  -  memlock  unlimited` to /etc/security/limits.conf and log in again, then "
                            "`ulimit -l unlimited`; for a systemd service set LimitMEMLOCK=infinity";
    return make(name, CheckStatus::kWarn,
                detail + ": below " + mib(kMemlockWanted) + ", so DMA mappings of buffers will fail early", fix);
  }
  return make(name, CheckStatus::kOk, detail);
}

Check check_hugepages(const Host& host) {
  std::string name = "hugepages";
  std::string dir = host.paths.sysfs + "/kernel/mm/hugepages";
  auto sizes = list_dir(dir);
  if (sizes.empty()) return make(name, CheckStatus::kSkip, "no huge page sizes in " + dir);
  std::string detail;
  uint64_t total = 0;
  for (const std::string& size : sizes) {
    auto count = parse_uint(read_attr(dir + "/" + size + "/nr_hugepages").value_or(""), 10).value_or(0);
    auto free = parse_uint(read_attr(dir + "/" + size + "/free_hugepages").value_or(""), 10);
    total += count;
    detail += (detail.empty() ? "" : ", ") + size + ": " + std::to_string(count) +
              (free ? " (" + std::to_string(*free) + " free)" : "");
  }
  if (total == 0) {
    // Prefer 2 MiB pages: every x86 host has them and they can be reserved at runtime.
    std::string size = sizes.front();
    for (const std::string& s : sizes) {
      if (s == "hugepages-2048kB") size = s;
    }
    return make(name, CheckStatus::kWarn,
                "no huge pages reserved (" + detail + "); DMA buffers fall back to 4 KiB pages",
                "`echo 512 > " + dir + "/" + size + "/nr_hugepages`");
  }
  return make(name, CheckStatus::kOk, detail);
}

std::string unbind_fix(const HostPaths& paths, const GroupMember& m) {
  if ((m.class_code >> 16) == 0x02) return "`ufab bind " + m.name + "`";
  return "`echo " + m.name + " > " + paths.sysfs + "/bus/pci/devices/" + m.name + "/driver/unbind`";
}

void check_device(const Host& host, const DeviceInfo& info, std::vector<Check>& checks) {
  std::string bdf = info.address.str();
  if (info.driver != layout::kVfioDriver) {
    std::string fix = info.carries_host_connection() ? "it carries the host's connection (" + info.readiness_reason +
                                                           "); pick another NIC or `ufab bind --force " + bdf + "`"
                                                     : "`ufab bind " + bdf + "`";
    checks.push_back(make(bdf + " on vfio-pci", CheckStatus::kFail,
                          bdf + " is bound to " + (info.driver.empty() ? "no driver" : info.driver), fix));
  } else {
    checks.push_back(make(bdf + " on vfio-pci", CheckStatus::kOk, bdf + " is bound to vfio-pci"));
  }
  if (!info.iommu_group) {
    checks.push_back(make("device " + bdf, CheckStatus::kFail, bdf + " has no IOMMU group", kIommuBootFix));
    return;
  }
  std::string group = std::to_string(*info.iommu_group);
  auto blockers = info.group_blockers();
  if (blockers.empty()) {
    checks.push_back(make("group " + group + " viable", CheckStatus::kOk,
                          "all " + std::to_string(info.group_members.size()) + " members of group " + group +
                              " are on vfio-pci, a bridge, or no driver"));
  } else {
    std::string who, fix;
    for (size_t i = 0; i < blockers.size(); ++i) {
      who += (i ? ", " : "") + blockers[i].name + " (" + blockers[i].driver + ")";
      fix += (i ? "; " : "") + unbind_fix(host.paths, blockers[i]);
    }
    checks.push_back(make("group " + group + " viable", CheckStatus::kFail,
                          "group " + group + " is not viable: " + who + " still " +
                              (blockers.size() == 1 ? "has" : "have") + " a kernel driver",
                          fix));
  }
  const VfioGroupNode& node = *info.vfio_node;
  if (!node.exists) {
    checks.push_back(make(node.path, CheckStatus::kFail, node.path + " is missing",
                          info.driver == layout::kVfioDriver
                              ? "`modprobe vfio-pci`, then `ufab unbind " + bdf + "` and `ufab bind " + bdf + "`"
                              : "`ufab bind " + bdf + "` (the node appears when vfio-pci takes the device)"));
  } else if (!node.accessible) {
    checks.push_back(make(node.path, CheckStatus::kFail,
                          node.path + " (mode " + mode_text(node.mode) + ") is not readable and writable by uid " +
                              std::to_string(host.effective_uid()),
                          "run ufab as root, or `chown $USER " + node.path + "`"));
  } else {
    checks.push_back(make(node.path, CheckStatus::kOk, node.path + " present, mode " + mode_text(node.mode)));
  }
}

void check_devices(const Host& host, const std::optional<PciAddress>& device, std::vector<Check>& checks) {
  if (device) {
    auto info = describe(host, *device);
    if (!info) {
      checks.push_back(make("device " + device->str(), CheckStatus::kFail, info.error().message(),
                            "`ufab list` shows the network devices and their addresses"));
      return;
    }
    if (!info->is_network()) {
      checks.push_back(make("device " + device->str(), CheckStatus::kFail, info->readiness_reason,
                            "pick a network device from `ufab list`"));
      return;
    }
    check_device(host, *info, checks);
    return;
  }
  auto devices = list_network_devices(host);
  if (!devices) {
    checks.push_back(make("vfio devices", CheckStatus::kSkip, devices.error().message()));
    return;
  }
  bool any = false;
  for (const DeviceInfo& info : *devices) {
    if (info.driver != layout::kVfioDriver) continue;
    any = true;
    check_device(host, info, checks);
  }
  if (!any) {
    checks.push_back(make("vfio devices", CheckStatus::kSkip,
                          "no NIC is bound to vfio-pci; `ufab list` shows candidates and `ufab bind <address>` "
                          "takes one"));
  }
}

}  // namespace

const char* check_status_name(CheckStatus status) {
  switch (status) {
    case CheckStatus::kOk:
      return "ok";
    case CheckStatus::kWarn:
      return "warn";
    case CheckStatus::kFail:
      return "fail";
    case CheckStatus::kSkip:
      return "skip";
  }
  return "unknown";
}

std::vector<Check> run_doctor(const Host& host, const std::optional<PciAddress>& device) {
  std::vector<Check> checks;
  checks.push_back(check_cmdline(host));
  checks.push_back(check_iommu_groups(host));
  checks.push_back(check_firmware(host));
  checks.push_back(check_module(host, "vfio", "`modprobe vfio`"));
  checks.push_back(check_module(host, "vfio_pci", "`modprobe vfio-pci`"));
  checks.push_back(check_module(host, "vfio_iommu_type1", "`modprobe vfio_iommu_type1`"));
  checks.push_back(check_container(host));
  checks.push_back(check_noiommu(host));
  checks.push_back(check_interrupt_remapping(host));
  checks.push_back(check_dma_entry_limit(host));
  checks.push_back(check_memlock(host));
  checks.push_back(check_hugepages(host));
  check_devices(host, device, checks);
  return checks;
}

CheckStatus worst_status(const std::vector<Check>& checks) {
  auto rank = [](CheckStatus s) {
    switch (s) {
      case CheckStatus::kFail:
        return 3;
      case CheckStatus::kWarn:
        return 2;
      case CheckStatus::kOk:
        return 1;
      case CheckStatus::kSkip:
        return 0;
    }
    return 0;
  };
  CheckStatus worst = CheckStatus::kSkip;
  for (const Check& c : checks) {
    if (rank(c.status) > rank(worst)) worst = c.status;
  }
  return worst;
}

}  // namespace ufab::pci
