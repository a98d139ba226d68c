// swnic: a software NIC. Two Ethernet ports, "NAME:0" and "NAME:1", joined
// over a POSIX shared memory segment, driven through the same plugin ABI as
// the hardware drivers (UFAB_DRIVER_F_SOFTWARE: no PCI device, no VFIO).
//
// Open parameters (host->param):
//   ring       slots per direction, power of two in [2, 32768]; default 1024
//   slot_size  largest frame in bytes, [1518, 65536]; default 2048
//   queues     RX and TX queues per port, [1, 16]; default 1 (both ports of a
//              link have the same; the first to open sets it)
//   loss, dup, reorder, corrupt   fault probabilities in [0, 1] (TX side)
//   seed       u64 seed of the fault injection; default 0
//   stale      "auto" (default): reclaim ports held by dead processes;
//              "off": never (peers in different PID namespaces);
//              "reset": remove any existing segment of this name first
//
// Receive steering (rx_steer, raw ABI 1.2): UFAB_STEER_NONE and
// UFAB_STEER_ROCE_QPN. Threading: one thread per queue at a time; different
// queues from different threads at once, with no lock.
//
// See docs/drivers/swnic.md.
#pragma once

#include "abi/raw_frame.h"

// The driver table, for linking swnic into a binary statically.
#ifdef __cplusplus
extern "C" {
#endif

const struct ufab_driver* ufab_swnic_driver(void);

#ifdef __cplusplus
}
#endif
