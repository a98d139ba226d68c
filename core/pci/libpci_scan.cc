#include "core/pci/libpci_scan.h"

extern "C" {
#include <pci/pci.h>
}

#include <algorithm>
#include <csetjmp>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "base/files.h"

namespace ufab::pci::libpci {
namespace {

// libpci reports fatal problems (e.g. a device directory without its
// `device` file, as happens mid hot-plug) through pci_access::error, which
// must not return and by default calls exit(). ufab must not exit from a
// library, so the handler longjmp()s back to scan_into(). Only libpci's C
// frames and collect() are skipped, and collect() keeps nothing with a
// destructor alive across libpci calls, so no C++ destructor is bypassed.
// libpci may leak what it had allocated for that one failed scan.
thread_local std::jmp_buf* t_error_jump = nullptr;
thread_local char t_error_message[512];

[[noreturn]] void on_error(char* format, ...) {
  va_list args;
  va_start(args, format);
  std::vsnprintf(t_error_message, sizeof t_error_message, format, args);
  va_end(args);
  std::longjmp(*t_error_jump, 1);
}

// Warnings are about optional attributes (e.g. `config` unreadable for
// non-root users); the fields then keep libpci's defaults.
void on_warning(char*, ...) {}
void on_debug(char*, ...) {}

// Plain data only: it is filled while a longjmp may still happen.
struct RawIdentity {
  int domain, bus, dev, func;
  uint16_t vendor_id, device_id, subsystem_vendor_id, subsystem_device_id, device_class;
  uint8_t revision, prog_if;
  char vendor_name[128];
  char device_name[256];
  char subsystem_name[256];
  char class_name[128];
};

void lookup(pci_access* access, char* out, int size, int flags, unsigned a, unsigned b = 0, unsigned c = 0,
            unsigned d = 0) {
  // NO_NUMBERS: an unknown id gives NULL rather than "Device 1234", so the
  // caller can tell "no name" from a name. NO_HWDB: names come from pci.ids
  // alone, the same on every host and in tests.
  const char* name = pci_lookup_name(access, out, size, flags | PCI_LOOKUP_NO_NUMBERS | PCI_LOOKUP_NO_HWDB, a, b, c, d);
  if (!name) out[0] = '\0';
}

void collect(pci_access* access, std::vector<RawIdentity>* out) {
  pci_init(access);
  pci_scan_bus(access);
  for (pci_dev* d = access->devices; d; d = d->next) {
    pci_fill_info(d, PCI_FILL_IDENT | PCI_FILL_CLASS | PCI_FILL_CLASS_EXT | PCI_FILL_SUBSYS);
    RawIdentity r{};
    r.domain = d->domain;
    r.bus = d->bus;
    r.dev = d->dev;
    r.func = d->func;
    r.vendor_id = d->vendor_id;
    r.device_id = d->device_id;
    r.subsystem_vendor_id = d->subsys_vendor_id;
    r.subsystem_device_id = d->subsys_id;
    r.device_class = d->device_class;
    r.revision = d->rev_id;
    r.prog_if = d->prog_if;
    lookup(access, r.vendor_name, sizeof r.vendor_name, PCI_LOOKUP_VENDOR, d->vendor_id);
    lookup(access, r.device_name, sizeof r.device_name, PCI_LOOKUP_DEVICE, d->vendor_id, d->device_id);
    if (r.subsystem_vendor_id != 0 || r.subsystem_device_id != 0) {
      lookup(access, r.subsystem_name, sizeof r.subsystem_name, PCI_LOOKUP_SUBSYSTEM | PCI_LOOKUP_DEVICE, d->vendor_id,
             d->device_id, r.subsystem_vendor_id, r.subsystem_device_id);
    }
    lookup(access, r.class_name, sizeof r.class_name, PCI_LOOKUP_CLASS, d->device_class);
    out->push_back(r);
  }
}

// Returns false with t_error_message set when libpci gave up.
bool scan_into(pci_access* access, std::vector<RawIdentity>* out) {
  std::jmp_buf jump;
  t_error_jump = &jump;
  if (setjmp(jump) != 0) {
    t_error_jump = nullptr;
    return false;
  }
  collect(access, out);
  t_error_jump = nullptr;
  return true;
}

}  // namespace

Result<std::vector<Identity>> scan(const HostPaths& paths) {
  std::string bus_dir = paths.sysfs + "/bus/pci";
  if (!path_exists(bus_dir + "/devices")) {
    return fail(ENOENT, "no PCI bus at " + bus_dir + "/devices: is sysfs mounted at " + paths.sysfs + "?");
  }
  if (!paths.pci_ids.empty() && !path_exists(paths.pci_ids)) {
    return fail(ENOENT, "PCI id database " + paths.pci_ids + " not found: install the pci.ids package");
  }

  pci_access* access = pci_alloc();
  access->error = on_error;
  access->warning = on_warning;
  access->debug = on_debug;
  // The sysfs method reads vendor/device/class (and revision/subsystem_*/
  // numa_node when present, else config space) from <sysfs.path>/devices/*,
  // so pointing sysfs.path at a fake tree is all a test needs.
  access->method = PCI_ACCESS_SYS_BUS_PCI;
  // Never go to the network or a per-user cache for names.
  access->id_lookup_mode = 0;
  pci_set_param(access, const_cast<char*>("sysfs.path"), const_cast<char*>(bus_dir.c_str()));
  if (!paths.pci_ids.empty()) pci_set_name_list_path(access, strdup(paths.pci_ids.c_str()), 1);

  std::vector<RawIdentity> raw;
  if (!scan_into(access, &raw)) {
    // pci_access may be half set up after an error; leaking it is safer than
    // cleaning up a structure in an unknown state.
    return fail(EIO, std::string("libpci could not enumerate ") + bus_dir + ": " + t_error_message +
                         " (a device entry is incomplete; if a device is being hot-plugged, try again)");
  }
  pci_cleanup(access);

  std::vector<Identity> devices;
  for (const RawIdentity& r : raw) {
    Identity id;
    id.address = PciAddress{static_cast<uint16_t>(r.domain), static_cast<uint8_t>(r.bus), static_cast<uint8_t>(r.dev),
                            static_cast<uint8_t>(r.func)};
    id.vendor_id = r.vendor_id;
    id.device_id = r.device_id;
    id.subsystem_vendor_id = r.subsystem_vendor_id;
    id.subsystem_device_id = r.subsystem_device_id;
    id.revision = r.revision;
    id.class_code = static_cast<uint32_t>(r.device_class) << 8 | r.prog_if;
    id.vendor_name = r.vendor_name;
    id.device_name = r.device_name;
    id.subsystem_name = r.subsystem_name;
    id.class_name = r.class_name;
    devices.push_back(std::move(id));
  }
  std::sort(devices.begin(), devices.end(), [](const Identity& a, const Identity& b) { return a.address < b.address; });
  return devices;
}

}  // namespace ufab::pci::libpci
