/* The e1000e driver plugin (Intel 82574L, as QEMU emulates it), linked into
 * a program: pass the table to core::Nic::open_pci() or add it to a plugin
 * registry. libufab_e1000e.so exports the same table as
 * ufab_driver_entry_v1(). See docs/drivers/e1000e.md. */
#ifndef UFAB_DRIVERS_E1000E_E1000E_H
#define UFAB_DRIVERS_E1000E_E1000E_H

#include "abi/raw_frame.h"

#ifdef __cplusplus
extern "C" {
#endif

const struct ufab_driver* ufab_e1000e_driver(void);

#ifdef __cplusplus
}
#endif

#endif
