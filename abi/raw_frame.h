/*
 * ufab driver plugin ABI: the only framework header a plugin includes.
 *
 * A plugin is a shared library exporting one symbol, ufab_driver_entry_v1(),
 * which returns a constant `struct ufab_driver`: a header (ABI version, size,
 * name, PCI match table) followed by operations. Rules of the contract:
 *
 *  - Append-only. New operations go at the end and bump UFAB_ABI_MINOR; the
 *    loader reads `size` to know which ones a plugin has and fills the rest
 *    with stubs that return -EOPNOTSUPP, so no operation is ever NULL.
 *  - An incompatible change bumps UFAB_ABI_MAJOR and the entry symbol's name.
 *  - Plain C: opaque handles, fixed-width integers, no C++ types, no
 *    exceptions crossing it. Operations return 0 or a count on success and a
 *    negative errno on failure; a plugin explains a failure in words through
 *    host->set_error() before returning it.
 *  - The match table is data: the framework picks the plugin for a device
 *    without running plugin code.
 *  - A plugin touches hardware only through the host services it is handed:
 *    BAR mappings, config space, DMA memory, interrupt eventfds, buffers.
 */
#ifndef UFAB_ABI_RAW_FRAME_H
#define UFAB_ABI_RAW_FRAME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define UFAB_ABI_MAJOR 1
#define UFAB_ABI_MINOR 3
#define UFAB_DRIVER_ENTRY_SYMBOL "ufab_driver_entry_v1"

/* ---------------------------------------------------------------- matching */

#define UFAB_PCI_ANY 0xffffu

/* One row of a plugin's PCI match table; the table ends with a row whose
 * vendor_id is 0. UFAB_PCI_ANY matches any id; class_mask selects the bits
 * of the 24-bit class code that must equal class_code (0: any class). */
struct ufab_pci_match {
  uint16_t vendor_id;
  uint16_t device_id;
  uint16_t subsystem_vendor_id;
  uint16_t subsystem_device_id;
  uint32_t class_code;
  uint32_t class_mask;
  const char* model; /* human name, e.g. "82574L" */
};

/* ----------------------------------------------------------------- buffers */

struct ufab_pool; /* opaque: a pool of DMA-able frame buffers */

/* A frame buffer in DMA memory. `base`/`base_iova` address the buffer's
 * first byte; the frame occupies [offset, offset + len). The space before
 * `offset` (headroom) lets a driver prepend a device header in place (the
 * 12-byte virtio-net header, for example). */
struct ufab_buf {
  uint8_t* base;
  uint64_t base_iova;
  uint32_t capacity; /* bytes from base */
  uint32_t offset;   /* frame start, from base */
  uint32_t len;      /* frame length */
  uint32_t flags;    /* UFAB_BUF_F_* */
  uint64_t user;     /* free for the application */
  struct ufab_pool* pool;
};

#define UFAB_BUF_F_RX_CSUM_BAD (1u << 0) /* the device reported a bad checksum */

/* ABI 1.3, gather transmit (tx_burst_gather): a frame made of segments. */
#define UFAB_TX_SEGS_MAX 4

struct ufab_tx_seg {
  const uint8_t* va; /* CPU address (software devices read this) */
  uint64_t iova;     /* device address (DMA devices read this) */
  uint32_t len;      /* bytes, > 0 */
  uint32_t reserved; /* 0 */
};

struct ufab_tx_frame {
  struct ufab_buf* buf; /* the frame's own buffer: freed by the driver when sent */
  uint32_t nsegs;       /* 1..UFAB_TX_SEGS_MAX */
  uint32_t len;         /* sum of the segments' len */
  struct ufab_tx_seg segs[UFAB_TX_SEGS_MAX];
};

/* ------------------------------------------------------------ host services */

struct ufab_host; /* opaque: the framework's side of one open device */

/* A block of DMA memory: CPU address, device address (IOVA), size. */
struct ufab_dma_mem {
  void* va;
  uint64_t iova;
  size_t size;
  uint64_t cookie; /* the host's; pass back to dma_free */
};

enum ufab_log_level { UFAB_LOG_ERROR = 0, UFAB_LOG_WARN = 1, UFAB_LOG_INFO = 2, UFAB_LOG_DEBUG = 3 };

struct ufab_host_ops {
  uint32_t size; /* sizeof(struct ufab_host_ops) the host was built with */

  void (*log)(struct ufab_host* host, int level, const char* message);
  /* Keeps a human explanation for the error the current op is about to
   * return: what failed, why, what to do. */
  void (*set_error)(struct ufab_host* host, const char* message);
  /* Device name (PCI address or software device name). */
  const char* (*name)(struct ufab_host* host);
  /* Open parameter by key ("peer", "seed", ...), NULL when not given. */
  const char* (*param)(struct ufab_host* host, const char* key);

  /* PCI devices only. BAR `index` mapped into this process: *base points to
   * offset 0, *size is its length. Valid until close. */
  int (*map_bar)(struct ufab_host* host, uint32_t index, volatile void** base, uint64_t* size);
  /* Config space, little-endian, len 1, 2 or 4 at a naturally aligned offset. */
  int (*config_read)(struct ufab_host* host, uint32_t offset, uint32_t len, uint32_t* value);
  int (*config_write)(struct ufab_host* host, uint32_t offset, uint32_t len, uint32_t value);
  int (*enable_bus_master)(struct ufab_host* host);

  /* Pinned, zeroed, IOMMU-mapped memory; align is a power of two. */
  int (*dma_alloc)(struct ufab_host* host, size_t size, size_t align, struct ufab_dma_mem* out);
  void (*dma_free)(struct ufab_host* host, struct ufab_dma_mem* mem);

  /* MSI-X vectors 0..count-1, each on its own eventfd (returned in fds[]). */
  int (*irq_enable)(struct ufab_host* host, uint32_t count, int* fds);
  int (*irq_disable)(struct ufab_host* host);

  /* Buffers: get up to n (returns how many), put n back to their pools. */
  int (*buf_alloc)(struct ufab_host* host, struct ufab_pool* pool, struct ufab_buf** bufs, uint32_t n);
  void (*buf_free)(struct ufab_host* host, struct ufab_buf** bufs, uint32_t n);
};

/* ----------------------------------------------------------------- devices */

struct ufab_dev; /* opaque: the plugin's state for one open device */

struct ufab_dev_info {
  uint8_t mac[6];
  uint16_t max_rx_queues;
  uint16_t max_tx_queues;
  uint16_t min_ring_size;
  uint16_t max_ring_size;
  uint32_t mtu;     /* current L3 MTU, 1500 on Ethernet */
  uint32_t max_mtu;
  uint32_t caps;    /* UFAB_DEV_CAP_* */
  char model[48];   /* "82574L (e1000e)" */
};

#define UFAB_DEV_CAP_RX_IRQ (1u << 0)   /* rx_irq works: an eventfd per RX queue */
#define UFAB_DEV_CAP_LOOPBACK (1u << 1) /* software device or MAC loopback */

struct ufab_link {
  uint32_t up;
  uint32_t speed_mbps; /* 0 when unknown */
  uint32_t full_duplex;
};

struct ufab_queue_conf {
  uint32_t size;           /* descriptors; a power of two within the device's limits */
  struct ufab_pool* pool;  /* RX: where receive buffers come from */
};

/* Counters since open, read from the device (clear-on-read registers are
 * accumulated by the driver). */
struct ufab_stats {
  uint64_t rx_packets;
  uint64_t rx_bytes;
  uint64_t tx_packets;
  uint64_t tx_bytes;
  uint64_t rx_dropped; /* no buffer, ring full, injected loss */
  uint64_t rx_errors;
  uint64_t tx_errors;
  uint64_t irqs;       /* interrupts taken (eventfd wake-ups armed by rx_irq) */
};

struct ufab_driver {
  /* Header: never moves. */
  uint16_t abi_major;
  uint16_t abi_minor;
  uint32_t size; /* sizeof(struct ufab_driver) the plugin was built with */
  const char* name;
  const char* description;
  const struct ufab_pci_match* pci_match; /* NULL for software devices */
  uint32_t flags;                          /* UFAB_DRIVER_F_* */
  uint32_t reserved;

  /* ABI 1.0 operations. */
  int (*open)(const struct ufab_host_ops* ops, struct ufab_host* host, struct ufab_dev** out);
  void (*close)(struct ufab_dev* dev);
  int (*info)(struct ufab_dev* dev, struct ufab_dev_info* out);
  int (*link)(struct ufab_dev* dev, struct ufab_link* out);
  int (*rx_queue_setup)(struct ufab_dev* dev, uint16_t queue, const struct ufab_queue_conf* conf);
  int (*tx_queue_setup)(struct ufab_dev* dev, uint16_t queue, const struct ufab_queue_conf* conf);
  int (*start)(struct ufab_dev* dev);
  int (*stop)(struct ufab_dev* dev);
  /* Up to n received frames into bufs (ownership passes to the caller);
   * returns how many. Never blocks. */
  int (*rx_burst)(struct ufab_dev* dev, uint16_t queue, struct ufab_buf** bufs, uint16_t n);
  /* Queues up to n frames with one doorbell; returns how many were taken
   * (ownership passes to the driver, which frees them when sent). */
  int (*tx_burst)(struct ufab_dev* dev, uint16_t queue, struct ufab_buf** bufs, uint16_t n);
  int (*stats)(struct ufab_dev* dev, struct ufab_stats* out);
  /* enable=1: arm the queue's interrupt and return the eventfd that becomes
   * readable when frames arrive; enable=0: back to polling. Until the caller
   * uses rx_irq_arm, the driver re-arms by itself whenever rx_burst finds
   * the queue empty (the caller may be about to sleep). */
  int (*rx_irq)(struct ufab_dev* dev, uint16_t queue, int enable, int* eventfd);
  int (*set_promiscuous)(struct ufab_dev* dev, int enable);

  /* ABI 1.1. Arms the queue's interrupt right before the caller sleeps on
   * its eventfd (rx_irq enable=1 in effect): the eventfd becomes readable
   * when frames arrive from now on, at once if some already wait. After the
   * first call the driver stops re-arming on an empty rx_burst, so a caller
   * that busy-polls costs neither itself nor its peer a wake-up per frame
   * (a register access per empty poll on a NIC, a futex wake per frame on
   * swnic). Missing (the loader's -EOPNOTSUPP stub): the driver re-arms by
   * itself, as before. */
  int (*rx_irq_arm)(struct ufab_dev* dev, uint16_t queue);

  /* ABI 1.2. Receive steering: which RX queue a received frame lands in.
   * `mode` is a UFAB_STEER_* value, `nqueues` the RX queues it spreads over
   * (1..max_rx_queues, each set up before start()). Called before start()
   * or after stop(). Without it (or with UFAB_STEER_NONE) every frame lands
   * in queue 0. A device that cannot steer by the rule returns -EOPNOTSUPP
   * and says why through set_error; the caller then steers in software. */
  int (*rx_steer)(struct ufab_dev* dev, uint32_t mode, uint16_t nqueues);

  /* ABI 1.3. Gather transmit: like tx_burst, but each frame is the
   * concatenation of frames[i].nsegs segments (1..UFAB_TX_SEGS_MAX, each
   * len > 0), so a payload goes to the wire straight from where it lies
   * (registered memory) without being copied into a frame buffer first.
   * Returns how many frames were taken (0 when the ring is full), one
   * doorbell for them all. For each frame taken, `buf` passes to the
   * driver, which frees it once the device has read every segment (segments
   * may point into it: headers, trailer). Memory outside `buf` is the
   * caller's: a DMA device reads it through `iova`, which the caller has
   * mapped for this device, after the call returns, until `buf` is freed; a
   * software device (UFAB_DRIVER_F_SOFTWARE) reads it through `va` and has
   * finished with every segment when the call returns. The frames' array
   * is the caller's and only read during the call. A device that cannot
   * gather leaves this out (the loader's -EOPNOTSUPP stub): the caller
   * copies into one buffer and uses tx_burst. */
  int (*tx_burst_gather)(struct ufab_dev* dev, uint16_t queue, const struct ufab_tx_frame* frames, uint16_t n);
};

/* Steering rules for rx_steer. */
#define UFAB_STEER_NONE 0u
/* RoCEv2 (IPv4, UDP destination port 4791): queue = BTH destination QP
 * (24 bits at UDP payload offset 5) modulo nqueues; every other frame, and
 * one too short to hold a BTH, lands in queue 0. */
#define UFAB_STEER_ROCE_QPN 1u

#define UFAB_DRIVER_F_SOFTWARE (1u << 0) /* no PCI device, no VFIO */

typedef const struct ufab_driver* (*ufab_driver_entry_fn)(void);

/* The one symbol a plugin exports. */
const struct ufab_driver* ufab_driver_entry_v1(void);

#ifdef __cplusplus
}
#endif

#endif /* UFAB_ABI_RAW_FRAME_H */
