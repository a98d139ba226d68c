#include "core/pci/bind.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "base/files.h"
#include "base/hex.h"
#include "core/pci/discovery.h"
#include "core/pci/sysfs_layout.h"

namespace ufab::pci {
namespace {

constexpr const char* kRecordKey = "previous_driver=";

std::string driver_text(const std::string& driver) { return driver.empty() ? "no driver" : driver; }

// Every sysfs store goes through here so the report lists exactly what was
// written, in order.
Status store(const Host& host, std::vector<std::string>& actions, const std::string& path, const std::string& data) {
  auto written = host.write_sysfs(path, data);
  std::string shown = trim(data).empty() ? "echo" : "echo " + trim(data);
  if (!written) return std::unexpected(written.error());
  actions.push_back(shown + " > " + path);
  return {};
}

Status mkdir_p(const std::string& dir) {
  std::string partial;
  std::istringstream parts(dir);
  if (!dir.empty() && dir[0] == '/') partial = "/";
  for (std::string part; std::getline(parts, part, '/');) {
    if (part.empty()) continue;
    partial += part;
    if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) return fail_errno("cannot create " + partial);
    partial += "/";
  }
  return {};
}

Status write_record(const HostPaths& paths, const PciAddress& address, const std::string& previous_driver) {
  if (auto made = mkdir_p(paths.state_dir); !made) {
    return std::unexpected(made.error().context("recording the previous driver of " + address.str()));
  }
  std::string path = layout::state_file(paths, address);
  std::string text = "# Written by `ufab bind`: the driver " + address.str() +
                     " had before it was bound to vfio-pci.\n# `ufab unbind` hands the device back to it.\n" +
                     kRecordKey + previous_driver + "\n";
  std::string temp = path + ".tmp";
  FILE* f = std::fopen(temp.c_str(), "w");
  if (!f) return fail_errno("cannot record the previous driver of " + address.str() + " in " + temp);
  bool ok = std::fputs(text.c_str(), f) >= 0;
  ok = (std::fclose(f) == 0) && ok;
  // rename() makes the record appear whole or not at all.
  if (!ok || std::rename(temp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(temp.c_str());
    return fail_errno(err, "cannot record the previous driver of " + address.str() + " in " + path);
  }
  return {};
}

bool valid_driver_name(const std::string& name) {
  // A name that could walk out of drivers/ must never reach a sysfs path.
  return !name.empty() && name.find('/') == std::string::npos && name != "." && name != "..";
}

std::string group_warning(const HostPaths& paths, const DeviceInfo& info) {
  auto blockers = info.group_blockers();
  if (blockers.empty()) return "";
  std::string text = "IOMMU group " + std::to_string(*info.iommu_group) + " is not viable until ";
  std::string fixes;
  for (size_t i = 0; i < blockers.size(); ++i) {
    const GroupMember& m = blockers[i];
    text += (i ? ", " : "") + m.name + " (" + m.driver + ")";
    bool nic = (m.class_code >> 16) == 0x02;
    fixes += std::string(i ? "; " : "") +
             (nic ? "`ufab bind " + m.name + "`"
                  : "`echo " + m.name + " > " + paths.sysfs + "/bus/pci/devices/" + m.name + "/driver/unbind`");
  }
  return text + (blockers.size() == 1 ? " is" : " are") + " unbound too: " + fixes;
}

Status check_writable(const Host& host, const std::string& verb, const PciAddress& address,
                      const std::vector<std::string>& files) {
  uid_t uid = host.effective_uid();
  if (uid != 0) {
    return fail(EPERM, verb + " " + address.str() + " needs root (running as uid " + std::to_string(uid) +
                           "): run `sudo ufab " + verb + " " + address.str() + "`");
  }
  for (const std::string& file : files) {
    if (!host.can_access(file, W_OK)) {
      return fail(EACCES, "cannot write " + file +
                              " although running as root: is sysfs mounted read-only "
                              "(a container?); run ufab as root on the host itself");
    }
  }
  return {};
}

// Puts a device whose bind went wrong back on the driver it had.
std::string roll_back(const Host& host, const PciAddress& address, const std::string& previous_driver,
                      std::vector<std::string>& actions) {
  std::string dir = layout::device_dir(host.paths, address);
  std::vector<std::string> done;
  if (store(host, actions, dir + "/driver_override", "\n")) done.push_back("driver_override cleared");
  std::string now = layout::current_driver(dir);
  if (now == layout::kVfioDriver) {
    if (store(host, actions, dir + "/driver/unbind", address.str())) done.push_back("unbound from vfio-pci");
    now = layout::current_driver(dir);
  }
  if (now.empty()) {
    std::string prev_dir = layout::driver_dir(host.paths, previous_driver);
    bool direct = !previous_driver.empty() && path_exists(prev_dir);
    if (direct ? store(host, actions, prev_dir + "/bind", address.str()).has_value()
               : store(host, actions, layout::pci_bus_dir(host.paths) + "/drivers_probe", address.str()).has_value()) {
      done.push_back(direct ? "handed back to " + previous_driver : "re-probed");
    }
    now = layout::current_driver(dir);
  }
  std::string summary;
  for (size_t i = 0; i < done.size(); ++i) summary += (i ? ", " : "") + done[i];
  return "rolled back (" + (summary.empty() ? std::string("nothing could be undone") : summary) +
         "); the device now has " + driver_text(now);
}

}  // namespace

Result<std::optional<BindRecord>> read_bind_record(const HostPaths& paths, const PciAddress& address) {
  std::string path = layout::state_file(paths, address);
  if (!path_exists(path)) return std::optional<BindRecord>{};
  auto text = read_file(path);
  if (!text) return std::unexpected(text.error());
  std::istringstream lines(*text);
  for (std::string line; std::getline(lines, line);) {
    line = trim(line);
    if (line.rfind(kRecordKey, 0) == 0) {
      BindRecord record{line.substr(std::string(kRecordKey).size())};
      if (!record.previous_driver.empty() && !valid_driver_name(record.previous_driver)) break;
      return std::optional<BindRecord>(record);
    }
  }
  return fail(EINVAL, path + " is not a ufab bind record (no valid '" + std::string(kRecordKey) +
                          "' line); delete it and bind the device to its driver by hand");
}

std::vector<std::string> vfio_group_users(const HostPaths& paths, unsigned group) {
  std::vector<std::string> nodes = {layout::vfio_group_node(paths, group)};
  // With iommufd the device has its own node /dev/vfio/devices/vfioN.
  std::string members = layout::group_devices_dir(paths, group);
  for (const std::string& member : list_dir(members)) {
    for (const std::string& cdev : list_dir(members + "/" + member + "/vfio-dev")) {
      nodes.push_back(paths.dev + "/vfio/devices/" + cdev);
    }
  }
  std::vector<std::string> users;
  for (const std::string& pid : list_dir(paths.proc)) {
    if (pid.empty() ||
        !std::all_of(pid.begin(), pid.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
      continue;
    }
    std::string fd_dir = paths.proc + "/" + pid + "/fd";
    for (const std::string& fd : list_dir(fd_dir)) {
      char target[4096];
      ssize_t n = ::readlink((fd_dir + "/" + fd).c_str(), target, sizeof target - 1);
      if (n <= 0) continue;
      if (std::find(nodes.begin(), nodes.end(), std::string(target, static_cast<size_t>(n))) != nodes.end()) {
        users.push_back("pid " + pid + " (" + read_attr(paths.proc + "/" + pid + "/comm").value_or("?") + ")");
        break;
      }
    }
  }
  return users;
}

Result<BindReport> bind_to_vfio(const Host& host, const PciAddress& address, BindOptions options) {
  const HostPaths& paths = host.paths;
  std::string dir = layout::device_dir(paths, address);
  auto described = describe(host, address);
  if (!described) return std::unexpected(described.error().context("cannot bind " + address.str()));
  const DeviceInfo& info = *described;

  // --- every check, before anything is written ---
  if (!info.is_network()) {
    return fail(EINVAL, "cannot bind " + address.str() + ": it is not a network device (class " +
                            hex(info.class_code, 6) + (info.class_name.empty() ? "" : ", " + info.class_name) +
                            "); ufab only binds NICs (`ufab list` shows them)");
  }
  if (info.driver == layout::kVfioDriver) {
    return fail(EALREADY, address.str() + " is already bound to vfio-pci; nothing to do (`ufab info " + address.str() +
                              "` shows whether it is ready)");
  }
  // The safety rule first: it is the one thing the operator must hear.
  std::vector<std::string> warnings;
  if (info.carries_host_connection()) {
    std::string why;
    for (const NetInterface& nic : info.interfaces) {
      if (nic.carries_host_connection) why += (why.empty() ? "" : "; ") + nic.connection_reason;
    }
    if (!options.force) {
      return fail(EBUSY, "refusing to bind " + address.str() + ": " + why +
                             ". This is likely the host's own network connection and binding would cut it. "
                             "Take the interface down or use --force if you really mean it");
    }
    warnings.push_back("forced: " + why + "; that connection is gone now");
  }

  if (!path_exists(layout::driver_dir(paths, layout::kVfioDriver))) {
    return fail(ENOENT, "cannot bind " + address.str() + ": the vfio-pci driver is not loaded (no " +
                            layout::driver_dir(paths, layout::kVfioDriver) + "): run `modprobe vfio-pci`");
  }
  if (!info.iommu_group) {
    return fail(EOPNOTSUPP, "cannot bind " + address.str() +
                                ": it has no IOMMU group, so the IOMMU is off; enable VT-d/AMD-Vi in firmware and "
                                "boot with intel_iommu=on (Intel) or amd_iommu=on (AMD) (`ufab doctor` checks)");
  }
  std::string override_file = dir + "/driver_override";
  if (!path_exists(override_file)) {
    return fail(EOPNOTSUPP, "cannot bind " + address.str() + ": the kernel has no " + override_file +
                                " (Linux 3.16 or newer is needed)");
  }
  std::string probe_file = layout::pci_bus_dir(paths) + "/drivers_probe";
  std::vector<std::string> to_write = {override_file, probe_file};
  if (!info.driver.empty()) to_write.push_back(dir + "/driver/unbind");
  if (auto allowed = check_writable(host, "bind", address, to_write); !allowed) return std::unexpected(allowed.error());

  // The record goes first: if it cannot be written, nothing has changed yet.
  std::string previous_driver = info.driver;
  if (previous_driver.empty()) {
    // Keep an earlier record: someone may have unbound the kernel driver by
    // hand after a failed unbind, and the record is the only trace of it.
    auto earlier = read_bind_record(paths, address);
    if (earlier && *earlier) {
      previous_driver = (*earlier)->previous_driver;
      if (!previous_driver.empty()) {
        warnings.push_back("the device had no driver; keeping the earlier record that it belongs to " +
                           previous_driver);
      }
    }
  }
  if (auto recorded = write_record(paths, address, previous_driver); !recorded) {
    return std::unexpected(recorded.error().context("cannot bind " + address.str()));
  }

  // --- the writes ---
  BindReport report;
  report.address = address;
  report.previous_driver = previous_driver;
  report.iommu_group = info.iommu_group;
  report.vfio_node = layout::vfio_group_node(paths, *info.iommu_group);
  auto give_up = [&](const Error& error, const std::string& what) -> Result<BindReport> {
    std::string undo = roll_back(host, address, previous_driver, report.actions);
    ::unlink(layout::state_file(paths, address).c_str());
    return fail(error.code(), "binding " + address.str() + " to vfio-pci failed while " + what + ": " +
                                  error.message() + "; " + undo);
  };
  if (auto s = store(host, report.actions, override_file, layout::kVfioDriver); !s) {
    ::unlink(layout::state_file(paths, address).c_str());
    return fail(s.error().code(), "cannot bind " + address.str() + ": " + s.error().message());
  }
  if (!info.driver.empty()) {
    if (auto s = store(host, report.actions, dir + "/driver/unbind", address.str()); !s) {
      return give_up(s.error(), "unbinding it from " + info.driver);
    }
  }
  if (auto s = store(host, report.actions, probe_file, address.str()); !s) {
    return give_up(s.error(), "asking the kernel to probe it");
  }
  report.driver_now = layout::current_driver(dir);
  if (report.driver_now != layout::kVfioDriver) {
    return give_up(Error(EIO, "vfio-pci did not take it (driver now: " + driver_text(report.driver_now) +
                                  "); `dmesg | tail` shows the kernel's reason"),
                   "checking the result");
  }

  // --- what the operator should know ---
  auto after = describe(host, address);
  if (after) {
    if (auto w = group_warning(paths, *after); !w.empty()) warnings.push_back(w);
    if (after->vfio_node && !after->vfio_node->exists) {
      warnings.push_back(report.vfio_node + " did not appear: is the vfio module working? (`ufab doctor " +
                         address.str() + "`)");
    }
  }
  report.warnings = warnings;
  return report;
}

Result<BindReport> bind_to_vfio(const Host& host, const std::string& address, BindOptions options) {
  auto parsed = PciAddress::parse(address);
  if (!parsed) return std::unexpected(parsed.error());
  return bind_to_vfio(host, *parsed, options);
}

Result<UnbindReport> unbind_from_vfio(const Host& host, const PciAddress& address) {
  const HostPaths& paths = host.paths;
  std::string dir = layout::device_dir(paths, address);
  auto described = describe(host, address);
  if (!described) return std::unexpected(described.error().context("cannot unbind " + address.str()));
  const DeviceInfo& info = *described;

  // --- every check, before anything is written ---
  if (!info.is_network()) {
    return fail(EINVAL, "cannot unbind " + address.str() + ": it is not a network device (class " +
                            hex(info.class_code, 6) + (info.class_name.empty() ? "" : ", " + info.class_name) +
                            "); ufab only manages NICs");
  }
  if (info.driver != layout::kVfioDriver) {
    return fail(EINVAL, address.str() + " is not bound to vfio-pci (it has " + driver_text(info.driver) +
                            "); nothing to unbind");
  }
  auto record = read_bind_record(paths, address);
  if (!record) return std::unexpected(record.error().context("cannot unbind " + address.str()));

  UnbindReport report;
  report.address = address;
  std::string restore_file;  // where the BDF goes to hand the device back; "" = leave it driverless
  std::string probe_file = layout::pci_bus_dir(paths) + "/drivers_probe";
  if (!*record) {
    restore_file = probe_file;
    report.warnings.push_back("no record of the driver " + address.str() +
                              " had before vfio-pci; asked the kernel to probe it");
  } else {
    report.recorded_driver = (*record)->previous_driver;
    const std::string& previous = (*record)->previous_driver;
    if (previous.empty()) {
      report.warnings.push_back("left without a driver, as it was before `ufab bind`");
    } else if (path_exists(layout::driver_dir(paths, previous))) {
      restore_file = layout::driver_dir(paths, previous) + "/bind";
    } else {
      restore_file = probe_file;
      report.warnings.push_back("its previous driver " + previous +
                                " is not loaded; asked the kernel to probe it "
                                "(run `modprobe " +
                                previous + "` and `ufab unbind` is done, or bind it by hand)");
    }
  }

  std::string vfio_unbind = layout::driver_dir(paths, layout::kVfioDriver) + "/unbind";
  std::vector<std::string> to_write = {vfio_unbind, dir + "/driver_override"};
  if (!restore_file.empty()) to_write.push_back(restore_file);
  if (auto allowed = check_writable(host, "unbind", address, to_write); !allowed)
    return std::unexpected(allowed.error());

  if (info.iommu_group) {
    auto users = vfio_group_users(paths, *info.iommu_group);
    if (!users.empty()) {
      std::string who;
      for (size_t i = 0; i < users.size(); ++i) who += (i ? ", " : "") + users[i];
      return fail(EBUSY, "cannot unbind " + address.str() + ": its VFIO group " + std::to_string(*info.iommu_group) +
                             " is open by " + who +
                             "; stop that first (the kernel would block the unbind until it "
                             "lets go)");
    }
  }

  // --- the writes ---
  if (auto s = store(host, report.actions, vfio_unbind, address.str()); !s) {
    return fail(s.error().code(), "cannot unbind " + address.str() + " from vfio-pci: " + s.error().message());
  }
  if (auto s = store(host, report.actions, dir + "/driver_override", "\n"); !s) {
    return fail(s.error().code(), address.str() +
                                      " is unbound from vfio-pci but its driver_override could not be "
                                      "cleared (" +
                                      s.error().message() + "); run `echo > " + dir + "/driver_override` and `echo " +
                                      address.str() + " > " + probe_file + "`");
  }
  if (!restore_file.empty()) {
    auto s = store(host, report.actions, restore_file, address.str());
    if (!s && restore_file != probe_file) {
      report.warnings.push_back("handing it back to " + *report.recorded_driver + " failed (" + s.error().message() +
                                "); asked the kernel to probe it instead");
      s = store(host, report.actions, probe_file, address.str());
    }
    if (!s) report.warnings.push_back("the kernel could not probe it: " + s.error().message());
  }
  report.driver_now = layout::current_driver(dir);
  if (report.recorded_driver && !report.recorded_driver->empty() && report.driver_now != *report.recorded_driver) {
    report.warnings.push_back("it was on " + *report.recorded_driver + " before, but now has " +
                              driver_text(report.driver_now) + "; `dmesg | tail` may say why");
  }
  if (::unlink(layout::state_file(paths, address).c_str()) != 0 && errno != ENOENT) {
    report.warnings.push_back("could not remove " + layout::state_file(paths, address) + ": " + std::strerror(errno));
  }
  return report;
}

Result<UnbindReport> unbind_from_vfio(const Host& host, const std::string& address) {
  auto parsed = PciAddress::parse(address);
  if (!parsed) return std::unexpected(parsed.error());
  return unbind_from_vfio(host, *parsed);
}

}  // namespace ufab::pci
