#include "drivers/virtio_net/virtio_pci.h"

#include <cerrno>
#include <cstdio>

namespace ufab::virtio {
namespace {

std::string hex8(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%02x", v);
  return b;
}

}  // namespace

int find_capabilities(const ConfigRead& read, Capabilities* out, std::string* error) {
  *out = Capabilities{};
  uint32_t status = 0;
  if (int rc = read(kPciStatus, 2, &status); rc < 0) {
    *error = "reading the PCI status register failed";
    return rc;
  }
  if (!(status & kPciStatusCapList)) {
    *error = "the device has no PCI capability list, so it exposes no virtio structures";
    return -ENODEV;
  }
  uint32_t ptr = 0;
  if (int rc = read(kPciCapPointer, 1, &ptr); rc < 0) {
    *error = "reading the capability pointer failed";
    return rc;
  }
  ptr &= 0xfc;
  // At most 48 capabilities fit between 0x40 and 0xff; more means a loop.
  for (int hops = 0; ptr != 0; ++hops) {
    if (hops >= 48 || ptr < 0x40 || ptr > 0xfc) {
      *error = "malformed PCI capability list (pointer " + hex8(ptr) + " after " + std::to_string(hops) +
               " entries)";
      return -EPROTO;
    }
    uint32_t head = 0;
    if (int rc = read(ptr, 2, &head); rc < 0) {
      *error = "reading the capability at " + hex8(ptr) + " failed";
      return rc;
    }
    uint8_t id = head & 0xff;
    uint32_t next = (head >> 8) & 0xfc;
    if (id == kPciCapMsix) out->has_msix = true;
    if (id == kPciCapVendor && ptr + kCapOffLength + 4 <= 0x100) {
      uint32_t type = 0, bar = 0, offset = 0, length = 0;
      int rc = read(ptr + kCapOffType, 1, &type);
      if (rc == 0) rc = read(ptr + kCapOffBar, 1, &bar);
      if (rc == 0) rc = read(ptr + kCapOffOffset, 4, &offset);
      if (rc == 0) rc = read(ptr + kCapOffLength, 4, &length);
      if (rc < 0) {
        *error = "reading the virtio capability at " + hex8(ptr) + " failed";
        return rc;
      }
      Region region{true, static_cast<uint8_t>(bar), offset, length};
      Region* slot = nullptr;
      switch (type) {
        case kCapCommonCfg: slot = &out->common; break;
        case kCapNotifyCfg: slot = &out->notify; break;
        case kCapIsrCfg: slot = &out->isr; break;
        case kCapDeviceCfg: slot = &out->device; break;
        default: break;  // PCI cfg access, shared memory, vendor extensions
      }
      // 4.1.4.1: ignore reserved BAR values; use the first instance of a type.
      if (slot && bar <= 5 && !slot->present) {
        bool usable = true;
        if (type == kCapNotifyCfg) {
          uint32_t mult = 0;
          usable = ptr + kCapOffNotifyMultiplier + 4 <= 0x100;
          if (usable) {
            if (int r = read(ptr + kCapOffNotifyMultiplier, 4, &mult); r < 0) {
              *error = "reading the notify multiplier at " + hex8(ptr) + " failed";
              return r;
            }
            out->notify_multiplier = mult;
          }
        }
        if (usable) *slot = region;
      }
    }
    ptr = next;
  }
  return 0;
}

}  // namespace ufab::virtio
