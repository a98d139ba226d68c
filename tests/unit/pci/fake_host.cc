#include "tests/unit/pci/fake_host.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "base/files.h"
#include "base/hex.h"

namespace ufab::pci::testing {
namespace {

constexpr const char* kDevicesDir = "/devices/pci0000:00/";

std::string dirname_of(const std::string& path) { return path.substr(0, path.find_last_of('/')); }
std::string basename_of(const std::string& path) { return path.substr(path.find_last_of('/') + 1); }

std::string resolve(const std::string& path) {
  char buf[PATH_MAX];
  if (!::realpath(path.c_str(), buf)) return "";
  return buf;
}

std::string hex_attr(uint64_t value, int digits) { return hex(value, digits) + "\n"; }

void walk(const std::string& base, const std::string& rel, std::map<std::string, std::string>& out) {
  DIR* dir = ::opendir((base + rel).c_str());
  if (!dir) return;
  std::vector<std::string> names;
  while (dirent* e = ::readdir(dir)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  ::closedir(dir);
  for (const std::string& n : names) {
    std::string r = rel + "/" + n;
    std::string full = base + r;
    struct stat st;
    if (::lstat(full.c_str(), &st) != 0) continue;
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", st.st_mode & 07777);
    if (S_ISLNK(st.st_mode)) {
      char target[PATH_MAX];
      ssize_t len = ::readlink(full.c_str(), target, sizeof target - 1);
      out[r] = "link -> " + std::string(target, len > 0 ? static_cast<size_t>(len) : 0);
    } else if (S_ISDIR(st.st_mode)) {
      out[r] = std::string("dir ") + mode;
      walk(base, r, out);
    } else {
      std::ifstream in(full, std::ios::binary);
      std::stringstream content;
      content << in.rdbuf();
      out[r] = std::string("file ") + mode + " " + content.str();
    }
  }
}

}  // namespace

// ---- ConfigBuilder ----

ConfigBuilder::ConfigBuilder(uint16_t vendor, uint16_t device, uint32_t class_code, size_t size) : config_(size, '\0') {
  put16(0x00, vendor);
  put16(0x02, device);
  config_[0x09] = static_cast<char>(class_code & 0xff);
  config_[0x0a] = static_cast<char>((class_code >> 8) & 0xff);
  config_[0x0b] = static_cast<char>((class_code >> 16) & 0xff);
}

void ConfigBuilder::put16(size_t at, uint16_t v) {
  config_[at] = static_cast<char>(v & 0xff);
  config_[at + 1] = static_cast<char>(v >> 8);
}

void ConfigBuilder::put32(size_t at, uint32_t v) {
  put16(at, static_cast<uint16_t>(v & 0xffff));
  put16(at + 2, static_cast<uint16_t>(v >> 16));
}

ConfigBuilder& ConfigBuilder::raw(size_t offset, uint8_t value) {
  config_[offset] = static_cast<char>(value);
  return *this;
}

size_t ConfigBuilder::add_standard(uint8_t id, size_t length) {
  size_t at = next_standard_;
  config_[0x06] = static_cast<char>(config_[0x06] | 0x10);  // status: capability list
  config_[at] = static_cast<char>(id);
  config_[at + 1] = 0;
  if (last_standard_ == 0) {
    config_[0x34] = static_cast<char>(at);
  } else {
    config_[last_standard_ + 1] = static_cast<char>(at);
  }
  last_standard_ = at;
  next_standard_ += (length + 3) & ~size_t{3};
  return at;
}

ConfigBuilder& ConfigBuilder::power_management() {
  size_t at = add_standard(0x01, 8);
  put16(at + 2, 0x0003);  // version 3
  return *this;
}

ConfigBuilder& ConfigBuilder::msi(unsigned log2_vectors, bool is_64bit) {
  size_t at = add_standard(0x05, 24);
  put16(at + 2, static_cast<uint16_t>((log2_vectors & 7) << 1 | (is_64bit ? 0x80 : 0)));
  return *this;
}

ConfigBuilder& ConfigBuilder::pcie(unsigned port_type, unsigned speed, unsigned width, unsigned max_speed,
                                   unsigned max_width) {
  size_t at = add_standard(0x10, 0x3c);
  put16(at + 2, static_cast<uint16_t>(2 | port_type << 4));
  put32(at + 0x0c, max_speed | max_width << 4);
  put16(at + 0x12, static_cast<uint16_t>(speed | width << 4));
  return *this;
}

ConfigBuilder& ConfigBuilder::msix(unsigned vectors, unsigned table_bar, uint32_t table_offset, unsigned pba_bar,
                                   uint32_t pba_offset) {
  size_t at = add_standard(0x11, 12);
  put16(at + 2, static_cast<uint16_t>(vectors - 1));
  put32(at + 4, table_offset | table_bar);
  put32(at + 8, pba_offset | pba_bar);
  return *this;
}

ConfigBuilder& ConfigBuilder::vendor_specific(uint8_t length) {
  size_t at = add_standard(0x09, length);
  config_[at + 2] = static_cast<char>(length);
  return *this;
}

ConfigBuilder& ConfigBuilder::extended(uint16_t id, uint8_t version, const std::vector<uint8_t>& body) {
  size_t at = next_extended_;
  put32(at, id | static_cast<uint32_t>(version) << 16);
  if (last_extended_ != 0) {
    uint32_t prev = static_cast<uint8_t>(config_[last_extended_]) |
                    static_cast<uint8_t>(config_[last_extended_ + 1]) << 8 |
                    static_cast<uint8_t>(config_[last_extended_ + 2]) << 16;
    put32(last_extended_, prev | static_cast<uint32_t>(at) << 20);
  }
  for (size_t i = 0; i < body.size(); ++i) config_[at + 4 + i] = static_cast<char>(body[i]);
  last_extended_ = at;
  next_extended_ += (4 + body.size() + 3) & ~size_t{3};
  return *this;
}

// ---- FakeHost ----

FakeHost::FakeHost() {
  char tmpl[] = "/tmp/ufab_pci_XXXXXX";
  if (!::mkdtemp(tmpl)) ADD_FAILURE() << "mkdtemp failed: " << std::strerror(errno);
  root = resolve(tmpl);
  sysfs = root + "/sys";
  proc = root + "/proc";
  dev = root + "/dev";
  state_dir = root + "/run/ufab";
  mkdirs(sysfs + "/bus/pci/devices");
  mkdirs(sysfs + "/bus/pci/drivers");
  mkdirs(sysfs + "/devices/pci0000:00");
  mkdirs(sysfs + "/kernel/iommu_groups");
  write(sysfs + "/bus/pci/drivers_probe", "", 0200);
  write(proc + "/cmdline", "BOOT_IMAGE=/vmlinuz root=/dev/vda1 console=ttyS0\n", 0444);
  write(proc + "/self/status", "Name:\tufab\nCapEff:\t0000000000000000\n", 0444);
  mkdirs(dev);
}

FakeHost::~FakeHost() {
  std::string command = "rm -rf '" + root + "'";
  if (std::system(command.c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", root.c_str());
}

void FakeHost::mkdirs(const std::string& path) {
  std::string partial;
  std::stringstream parts(path);
  for (std::string part; std::getline(parts, part, '/');) {
    if (part.empty()) continue;
    partial += "/" + part;
    ::mkdir(partial.c_str(), 0755);
  }
}

void FakeHost::write(const std::string& path, const std::string& content, unsigned mode) {
  mkdirs(dirname_of(path));
  ::unlink(path.c_str());
  std::ofstream out(path, std::ios::binary);
  out << content;
  out.close();
  ::chmod(path.c_str(), mode);
}

void FakeHost::link(const std::string& target, const std::string& link_path) {
  mkdirs(dirname_of(link_path));
  ::unlink(link_path.c_str());
  if (::symlink(target.c_str(), link_path.c_str()) != 0)
    ADD_FAILURE() << "symlink " << link_path << ": " << std::strerror(errno);
}

std::string FakeHost::read(const std::string& path) const {
  std::ifstream in(path, std::ios::binary);
  std::stringstream content;
  content << in.rdbuf();
  return content.str();
}

bool FakeHost::exists(const std::string& path) const {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

std::string FakeHost::device_dir(const std::string& address) const { return sysfs + kDevicesDir + address; }

std::string FakeHost::driver_of(const std::string& address) const {
  return link_basename(device_dir(address) + "/driver").value_or("");
}

void FakeHost::add_driver(const std::string& name) {
  std::string dir = sysfs + "/bus/pci/drivers/" + name;
  if (exists(dir)) return;
  write(dir + "/bind", "", 0200);
  write(dir + "/unbind", "", 0200);
  write(dir + "/new_id", "", 0200);
}

void FakeHost::add_vfio_support() {
  add_driver("vfio-pci");
  write(sysfs + "/module/vfio/parameters/enable_unsafe_noiommu_mode", "N\n");
  write(sysfs + "/module/vfio_pci/parameters/ids", "\n");
  write(sysfs + "/module/vfio_iommu_type1/parameters/dma_entry_limit", "65535\n");
  write(sysfs + "/module/vfio_iommu_type1/parameters/allow_unsafe_interrupts", "N\n");
  write(dev + "/vfio/vfio", "", 0666);
  write(proc + "/cmdline", "BOOT_IMAGE=/vmlinuz root=/dev/vda1 console=ttyS0 intel_iommu=on\n", 0444);
  write(sysfs + "/firmware/acpi/tables/DMAR", "DMAR", 0400);
  write(sysfs + "/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages", "512\n");
  write(sysfs + "/kernel/mm/hugepages/hugepages-2048kB/free_hugepages", "512\n");
  write(sysfs + "/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages", "0\n");
  // VT-d extended capabilities with IR (bit 3) set.
  write(sysfs + "/class/iommu/dmar0/intel-iommu/ecap", "f020de\n", 0444);
}

void FakeHost::add_device(const FakeDevice& d) {
  std::string dir = device_dir(d.address);
  mkdirs(dir);
  write(dir + "/vendor", hex_attr(d.vendor, 4), 0444);
  write(dir + "/device", hex_attr(d.device, 4), 0444);
  write(dir + "/class", hex_attr(d.class_code, 6), 0444);
  if (!d.minimal) {
    write(dir + "/subsystem_vendor", hex_attr(d.subsystem_vendor, 4), 0444);
    write(dir + "/subsystem_device", hex_attr(d.subsystem_device, 4), 0444);
    write(dir + "/revision", hex_attr(d.revision, 2), 0444);
    write(dir + "/numa_node", std::to_string(d.numa_node) + "\n", 0444);
    write(dir + "/irq", "11\n", 0444);
    if (d.link_speed) {
      write(dir + "/current_link_speed", *d.link_speed + "\n", 0444);
      write(dir + "/max_link_speed", *d.link_speed + "\n", 0444);
    }
    if (d.link_width) {
      write(dir + "/current_link_width", std::to_string(*d.link_width) + "\n", 0444);
      write(dir + "/max_link_width", std::to_string(*d.link_width) + "\n", 0444);
    }
    if (d.has_driver_override) write(dir + "/driver_override", "(null)\n", 0644);
  }
  if (!d.resource.empty()) write(dir + "/resource", d.resource, 0444);
  if (!d.config.empty()) write(dir + "/config", d.config, 0644);
  link("../../../devices/pci0000:00/" + d.address, sysfs + "/bus/pci/devices/" + d.address);
  if (d.iommu_group) {
    std::string group = std::to_string(*d.iommu_group);
    link("../../../../devices/pci0000:00/" + d.address,
         sysfs + "/kernel/iommu_groups/" + group + "/devices/" + d.address);
    link("../../../kernel/iommu_groups/" + group, dir + "/iommu_group");
  }
  for (const FakeNetdev& n : d.netdevs) {
    std::string within = (n.parent.empty() ? "" : n.parent + "/") + "net/" + n.name;
    write(dir + "/" + within + "/operstate", n.operstate + "\n", 0444);
    write(dir + "/" + within + "/address", n.mac + "\n", 0444);
    if (n.flags) write(dir + "/" + within + "/flags", *n.flags + "\n", 0444);
    link("../../devices/pci0000:00/" + d.address + "/" + within, sysfs + "/class/net/" + n.name);
  }
  natural_driver_[d.address] = d.natural_driver.empty() ? d.driver : d.natural_driver;
  if (!d.driver.empty()) {
    add_driver(d.driver);
    (void)attach(d.address, d.driver);
  }
}

Host FakeHost::host() {
  Host h;
  h.paths.sysfs = sysfs;
  h.paths.proc = proc;
  h.paths.dev = dev;
  h.paths.state_dir = state_dir;
  h.write_sysfs = [this](const std::string& path, const std::string& data) { return kernel_write(path, data); };
  h.can_access = [this](const std::string& path, int) { return exists(path) && unwritable.count(path) == 0; };
  h.effective_uid = [this] { return euid; };
  h.network_state = [this](const HostPaths&) { return network; };
  h.memlock_limit = [this] { return memlock; };
  return h;
}

std::map<std::string, std::string> FakeHost::snapshot() const {
  std::map<std::string, std::string> out;
  walk(root, "", out);
  return out;
}

std::string FakeHost::diff(const std::map<std::string, std::string>& before,
                           const std::map<std::string, std::string>& after) {
  std::string out;
  for (const auto& [path, entry] : before) {
    auto it = after.find(path);
    if (it == after.end())
      out += "removed " + path + " (" + entry + ")\n";
    else if (it->second != entry)
      out += "changed " + path + ": " + entry + " -> " + it->second + "\n";
  }
  for (const auto& [path, entry] : after) {
    if (!before.count(path)) out += "added " + path + " (" + entry + ")\n";
  }
  return out;
}

std::string FakeHost::override_of(const std::string& address) const {
  std::string text = trim(read(device_dir(address) + "/driver_override"));
  return text == "(null)" ? "" : text;
}

std::optional<unsigned> FakeHost::group_of(const std::string& address) const {
  auto name = link_basename(device_dir(address) + "/iommu_group");
  if (!name) return std::nullopt;
  return static_cast<unsigned>(std::stoul(*name));
}

Status FakeHost::attach(const std::string& address, const std::string& driver) {
  if (refuse.count({address, driver})) return fail(ENXIO, driver + " probe of " + address + " failed");
  link("../../../bus/pci/drivers/" + driver, device_dir(address) + "/driver");
  link("../../../../devices/pci0000:00/" + address, sysfs + "/bus/pci/drivers/" + driver + "/" + address);
  if (driver == "vfio-pci") {
    if (auto group = group_of(address)) write(dev + "/vfio/" + std::to_string(*group), "", 0600);
  }
  return {};
}

void FakeHost::detach(const std::string& address) {
  std::string driver = driver_of(address);
  ::unlink((device_dir(address) + "/driver").c_str());
  ::unlink((sysfs + "/bus/pci/drivers/" + driver + "/" + address).c_str());
  auto group = group_of(address);
  if (driver != "vfio-pci" || !group) return;
  std::string members = sysfs + "/kernel/iommu_groups/" + std::to_string(*group) + "/devices";
  for (const std::string& m : list_dir(members)) {
    if (driver_of(m) == "vfio-pci") return;  // the group node stays while any member is on vfio-pci
  }
  ::unlink((dev + "/vfio/" + std::to_string(*group)).c_str());
}

Status FakeHost::kernel_write(const std::string& path, const std::string& data) {
  writes.emplace_back(path, data);
  if (!exists(path)) return fail(ENOENT, "cannot open " + path + " for writing: No such file or directory");
  std::string parent = resolve(dirname_of(path));
  std::string name = basename_of(path);
  std::string address = trim(data);
  std::string drivers = sysfs + "/bus/pci/drivers";

  if (name == "driver_override") {
    write(path, address.empty() ? "(null)\n" : address + "\n", 0644);
    return {};
  }
  if (parent == sysfs + "/bus/pci" && name == "drivers_probe") {
    if (!exists(device_dir(address))) return fail(ENODEV, "no device " + address);
    if (!driver_of(address).empty()) return {};
    std::string wanted = override_of(address);
    if (wanted.empty()) wanted = natural_driver_[address];
    // Like the kernel: no matching driver is not an error, the device just stays unbound.
    if (wanted.empty() || !exists(drivers + "/" + wanted)) return {};
    (void)attach(address, wanted);
    return {};
  }
  if (dirname_of(parent) == drivers && (name == "bind" || name == "unbind")) {
    std::string driver = basename_of(parent);
    if (!exists(device_dir(address))) return fail(ENODEV, "no device " + address);
    if (name == "unbind") {
      if (driver_of(address) != driver) return fail(ENODEV, address + " is not bound to " + driver);
      detach(address);
      return {};
    }
    if (!driver_of(address).empty()) return fail(EBUSY, address + " already has a driver");
    std::string wanted = override_of(address);
    bool matches = wanted.empty() ? natural_driver_[address] == driver : wanted == driver;
    if (!matches) return fail(ENODEV, driver + " does not match " + address);
    return attach(address, driver);
  }
  write(path, data, 0644);
  return {};
}

}  // namespace ufab::pci::testing
