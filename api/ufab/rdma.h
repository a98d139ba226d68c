/*
 * ufab's RDMA API in C: devices, protection domains, memory regions,
 * completion queues, RC and UD queue pairs, address handles. No libibverbs,
 * no kernel verbs. Installed as <ufab/rdma.h>; link with
 * `pkg-config --cflags --libs ufab`. The C++ API (<ufab/rdma.hpp>) is a thin
 * layer over this one. docs/rdma-api.md is the guide, examples/rdma_c_example.c
 * a whole program.
 *
 * Which provider serves a device follows from its name:
 *   "0000:00:02.0"  a NIC bound to vfio-pci: soft-RoCE (RoCEv2 as Linux
 *                   rdma_rxe puts it on the wire) over the NIC's plugin;
 *   "swnic:LAB:0"   the software NIC's port 0: soft-RoCE over it;
 *   "shm:DOMAIN"    the shared-memory provider: processes on this host that
 *                   open the same DOMAIN reach each other's queue pairs.
 * ufab_device_query() says which provider it is.
 *
 * Values are libibverbs' (ibv_wr_opcode, ibv_wc_status, ibv_qp_state,
 * ibv_access_flags, ibv_qp_attr_mask ...), so verbs programmers read them
 * without a table. Two differences: path MTU is in bytes (1024, not
 * IBV_MTU_1024), and imm_data is a number in host order (the wire carries
 * it big-endian).
 *
 * Errors: a call that fails returns a negative errno (or NULL) and leaves a
 * sentence in ufab_last_error() (per thread) saying what failed, why, and
 * what to do. Work that fails after it was posted comes back as a
 * completion with a status; ufab_cq_wc_detail() explains it.
 *
 * Lifetimes: every object keeps its device open, so objects may be
 * destroyed in any order; the device closes with the last of them.
 *
 * Threads: every object may be used from any thread. Progress (receiving,
 * acknowledging, retransmitting) happens inside poll, wait and post calls,
 * or on a progress thread (ufab_device_opts.progress_thread).
 */
#ifndef UFAB_RDMA_H
#define UFAB_RDMA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The API's version; libufab.so.UFAB_API_MAJOR. Additions bump the minor. */
#define UFAB_API_MAJOR 1
#define UFAB_API_MINOR 6 /* 1: FLUSH, ATOMIC_WRITE, UFAB_ACCESS_FLUSH_*; 2: UFAB_SEND_COMMIT, persistent memory;
                           3: UFAB_QPT_GSI, ufab_qp_type, ufab_qp_device, ufab/cm.h;
                           4: ufab_mr_cache_*, UFAB_MEM_CUDA registration;
                           5: ufab/stream.h (stream-ordered operations);
                           6: ufab_stream_engine_set_wait, UFAB_STREAM_WAIT_*, ufab_stream_post_send_device,
                              ufab_stream_wait_word, <ufab/stream_device.cuh>,
                              ufab_mr_cache_attr.flags, UFAB_MR_CACHE_WATCH_GPU_FREES, ufab_mr_cache_gpu_watch */

struct ufab_device;
struct ufab_pd;
struct ufab_mr;
struct ufab_cq;
struct ufab_qp;
struct ufab_ah;

/* ------------------------------------------------------------------ values */

enum ufab_wr_opcode {
  UFAB_WR_RDMA_WRITE = 0,
  UFAB_WR_RDMA_WRITE_WITH_IMM = 1,
  UFAB_WR_SEND = 2,
  UFAB_WR_SEND_WITH_IMM = 3,
  UFAB_WR_RDMA_READ = 4,
  UFAB_WR_ATOMIC_CMP_AND_SWP = 5,
  UFAB_WR_ATOMIC_FETCH_AND_ADD = 6,
  /* Memory placement (IBA's extensions, Linux rxe since 6.2): RC only. */
  UFAB_WR_FLUSH = 14,        /* make remote memory visible or durable: flush_type, flush_level */
  UFAB_WR_ATOMIC_WRITE = 15, /* store atomic_value (8 bytes, aligned) at remote_addr in one piece */
};

/* FLUSH: what the peer makes of the range (ufab_send_wr.flush_type, one
 * or both; the QP and the region need the matching UFAB_ACCESS_FLUSH_*). */
enum ufab_flush_type {
  UFAB_FLUSH_GLOBAL = 1,     /* visible to everything that reads the memory after the completion */
  UFAB_FLUSH_PERSISTENT = 2, /* durable: survives power loss (persistent memory only) */
};

/* FLUSH: which bytes (ufab_send_wr.flush_level). */
enum ufab_flush_level {
  UFAB_FLUSH_RANGE = 0, /* [remote_addr, remote_addr + flush_length) */
  UFAB_FLUSH_MR = 1,    /* the whole region rkey names (remote_addr, flush_length unused) */
};

enum ufab_send_flags {
  UFAB_SEND_FENCE = 1u << 0,     /* wait for earlier READs/atomics first */
  UFAB_SEND_SIGNALED = 1u << 1,  /* a completion on success too */
  UFAB_SEND_SOLICITED = 1u << 2, /* the receiver's solicited event */
  UFAB_SEND_INLINE = 1u << 3,    /* data copied at post time; lkeys ignored */
  /* RDMA_WRITE(_WITH_IMM) only: the completion means the data is durable
   * at the target (commit-complete; libfabric's FI_COMMIT_COMPLETE). The
   * WRITE goes out followed by a FLUSH PERSISTENT of its range and
   * completes (as RDMA_WRITE) when the FLUSH is answered. Needs: the
   * target region's and QP's UFAB_ACCESS_FLUSH_PERSISTENT, two free
   * send-queue entries (the FLUSH takes a responder resource, like a READ). A SEND has no range to flush: a
   * receive posted into persistent memory lands durably before the SEND
   * is acknowledged (soft-RoCE targets), so that SEND completes durable. */
  UFAB_SEND_COMMIT = 1u << 4,
};

enum ufab_wc_status {
  UFAB_WC_SUCCESS = 0,
  UFAB_WC_LOC_LEN_ERR = 1,
  UFAB_WC_LOC_QP_OP_ERR = 2,
  UFAB_WC_LOC_PROT_ERR = 4,
  UFAB_WC_WR_FLUSH_ERR = 5,
  UFAB_WC_BAD_RESP_ERR = 7,
  UFAB_WC_LOC_ACCESS_ERR = 8,
  UFAB_WC_REM_INV_REQ_ERR = 9,
  UFAB_WC_REM_ACCESS_ERR = 10,
  UFAB_WC_REM_OP_ERR = 11,
  UFAB_WC_RETRY_EXC_ERR = 12,
  UFAB_WC_RNR_RETRY_EXC_ERR = 13,
  UFAB_WC_GENERAL_ERR = 21,
};

enum ufab_wc_opcode {
  UFAB_WC_SEND = 0,
  UFAB_WC_RDMA_WRITE = 1,
  UFAB_WC_RDMA_READ = 2,
  UFAB_WC_COMP_SWAP = 3,
  UFAB_WC_FETCH_ADD = 4,
  UFAB_WC_FLUSH = 8,
  UFAB_WC_ATOMIC_WRITE = 9,
  UFAB_WC_RECV = 128,
  UFAB_WC_RECV_RDMA_WITH_IMM = 129,
};

enum ufab_wc_flags {
  UFAB_WC_GRH = 1u << 0,      /* UD receive: the first 40 bytes hold the GRH area */
  UFAB_WC_WITH_IMM = 1u << 1, /* imm_data is valid */
};

enum ufab_access_flags {
  UFAB_ACCESS_LOCAL_WRITE = 1u << 0,
  UFAB_ACCESS_REMOTE_WRITE = 1u << 1,
  UFAB_ACCESS_REMOTE_READ = 1u << 2,
  UFAB_ACCESS_REMOTE_ATOMIC = 1u << 3,
  /* A peer may FLUSH with that placement type (on the QP: the peer may
   * ask; on the region: the region may be flushed so). PERSISTENT needs
   * memory that is durable: registering host memory (UFAB_MEM_HOST, DRAM)
   * with it is refused. */
  UFAB_ACCESS_FLUSH_GLOBAL = 1u << 8,
  UFAB_ACCESS_FLUSH_PERSISTENT = 1u << 9,
};

/* What kind of memory a region is (providers say which they take in
 * ufab_device_attr.mem_types, a mask of 1u << type). */
enum ufab_mem_type {
  UFAB_MEM_HOST = 0,
  UFAB_MEM_CUDA = 1,       /* device memory of a CUDA GPU */
  /* A durable FLUSH target: persistent memory mapped with DAX (/dev/daxN.M,
   * a file mapped MAP_SYNC), or a file or block device mapped MAP_SHARED
   * (its page cache, synced with msync). Learned from the mapping; the
   * registration fails, saying why, on anything else. docs/persistence.md. */
  UFAB_MEM_PERSISTENT = 2,
};

/* UFAB_QPT_GSI: the device's general services QP, number 1, a UD QP that
 * sends and receives management datagrams (Q_Key 0x80010000): what the
 * connection manager (ufab/cm.h) runs on. One per device; soft-RoCE only. */
enum ufab_qp_type { UFAB_QPT_GSI = 1, UFAB_QPT_RC = 2, UFAB_QPT_UD = 4 };

enum ufab_qp_state {
  UFAB_QPS_RESET = 0,
  UFAB_QPS_INIT = 1,
  UFAB_QPS_RTR = 2,
  UFAB_QPS_RTS = 3,
  UFAB_QPS_ERR = 6,
};

/* Which ufab_qp_attr fields ufab_qp_modify sets (ibv_qp_attr_mask). */
enum ufab_qp_attr_mask {
  UFAB_QP_STATE = 1u << 0,
  UFAB_QP_ACCESS_FLAGS = 1u << 3,
  UFAB_QP_PKEY_INDEX = 1u << 4,
  UFAB_QP_PORT = 1u << 5,
  UFAB_QP_QKEY = 1u << 6,
  UFAB_QP_AV = 1u << 7,
  UFAB_QP_PATH_MTU = 1u << 8,
  UFAB_QP_TIMEOUT = 1u << 9,
  UFAB_QP_RETRY_CNT = 1u << 10,
  UFAB_QP_RNR_RETRY = 1u << 11,
  UFAB_QP_RQ_PSN = 1u << 12,
  UFAB_QP_MAX_QP_RD_ATOMIC = 1u << 13,
  UFAB_QP_MIN_RNR_TIMER = 1u << 15,
  UFAB_QP_SQ_PSN = 1u << 16,
  UFAB_QP_MAX_DEST_RD_ATOMIC = 1u << 17,
  UFAB_QP_DEST_QPN = 1u << 20,
};

#define UFAB_MAX_SGE 16

/* ----------------------------------------------------------------- structs */

/* `length` bytes at `addr` inside the region whose lkey is `lkey`. */
struct ufab_sge {
  uint64_t addr;
  uint32_t length;
  uint32_t lkey;
};

/* Where a UD send goes: the peer's address (GID ::ffff:ip), QP and Q_Key. */
struct ufab_ud_dest {
  uint32_t ip; /* host order */
  uint32_t qpn;
  uint32_t qkey;
  uint8_t traffic_class;
  uint8_t hop_limit;
  uint16_t reserved;
};

/* FLUSH and ATOMIC_WRITE take no SGEs (num_sge 0): their operands are
 * fields here. The layout is that of API 1.0 (the FLUSH fields took the
 * reserved word; the union shares compare_add's 8 bytes). */
struct ufab_send_wr {
  uint64_t wr_id;
  const struct ufab_sge* sg_list;
  uint32_t num_sge;
  uint32_t opcode;     /* enum ufab_wr_opcode */
  uint32_t send_flags; /* enum ufab_send_flags */
  uint32_t imm_data;   /* *_WITH_IMM */
  uint64_t remote_addr; /* RDMA_WRITE*, RDMA_READ, atomics, FLUSH (RANGE), ATOMIC_WRITE */
  uint32_t rkey;
  uint8_t flush_type;  /* FLUSH: enum ufab_flush_type, one or both */
  uint8_t flush_level; /* FLUSH: enum ufab_flush_level */
  uint16_t reserved;
  union {
    uint64_t compare_add;  /* CMP_AND_SWP: compare; FETCH_AND_ADD: add */
    uint64_t atomic_value; /* ATOMIC_WRITE: the 8 bytes stored, as in memory (host order) */
    uint64_t flush_length; /* FLUSH, UFAB_FLUSH_RANGE: bytes from remote_addr (at most 2^31) */
  };
  uint64_t swap;        /* CMP_AND_SWP */
  struct ufab_ud_dest ud; /* UD only */
};

struct ufab_recv_wr {
  uint64_t wr_id;
  const struct ufab_sge* sg_list;
  uint32_t num_sge;
  uint32_t reserved;
};

struct ufab_wc {
  uint64_t wr_id;
  uint32_t status; /* enum ufab_wc_status */
  uint32_t opcode; /* enum ufab_wc_opcode */
  uint32_t byte_len;
  uint32_t imm_data;
  uint32_t qp_num;
  uint32_t src_qp;   /* UD receives */
  uint32_t wc_flags; /* enum ufab_wc_flags */
  uint32_t detail;   /* errors: a handle for ufab_cq_wc_detail; 0 on success */
};

/* The peer of an RC QP: its GID as an IPv4 address. */
struct ufab_av {
  uint32_t dest_ip; /* host order */
  uint8_t traffic_class;
  uint8_t hop_limit;
  uint16_t reserved;
  uint32_t flow_label; /* 0: derived from the QP numbers, as rxe does */
};

struct ufab_qp_attr {
  uint32_t state; /* enum ufab_qp_state */
  uint32_t access_flags;
  uint16_t pkey_index; /* 0 */
  uint8_t port;        /* 1 */
  uint8_t reserved0;
  uint32_t qkey; /* UD */
  struct ufab_av av;
  uint32_t path_mtu; /* bytes: 256 .. 4096 */
  uint32_t dest_qpn;
  uint32_t rq_psn;
  uint32_t sq_psn;
  uint8_t max_dest_rd_atomic;
  uint8_t min_rnr_timer; /* IBA table 45 code */
  uint8_t timeout;       /* 4.096 us * 2^timeout; 0 waits forever */
  uint8_t retry_cnt;     /* 7: infinite */
  uint8_t rnr_retry;     /* 7: infinite */
  uint8_t max_rd_atomic;
  uint16_t reserved1;
};

struct ufab_qp_cap {
  uint32_t max_send_wr;
  uint32_t max_recv_wr;
  uint32_t max_send_sge;
  uint32_t max_recv_sge;
  uint32_t max_inline_data;
};

struct ufab_qp_init_attr {
  uint32_t qp_type; /* enum ufab_qp_type */
  uint32_t sq_sig_all;
  struct ufab_cq* send_cq;
  struct ufab_cq* recv_cq;
  struct ufab_qp_cap cap;
};

/* What a peer needs to connect to a QP, as ibv_rc_pingpong and perftest
 * exchange it out of band, plus a buffer for the peer to target. */
struct ufab_conn {
  uint32_t ip; /* host order; GID ::ffff:ip */
  uint32_t qpn;
  uint32_t psn;
  uint32_t rkey;
  uint64_t addr;
  uint32_t length;
  uint32_t reserved;
};

struct ufab_device_opts {
  uint32_t size; /* sizeof(struct ufab_device_opts) */
  /* This port's IPv4 address, dotted quad. Required for Ethernet NICs,
   * which have no kernel netdev to take it from; GID 0 is ::ffff:ip. */
  const char* ip;
  /* Provider and plugin parameters, "key=value" strings, NULL-terminated
   * (swnic's "loss=0.01", "seed=7"; NULL for none). */
  const char* const* params;
  /* Run a thread that drives progress, so peers are answered while the
   * application does not call into ufab. */
  uint32_t progress_thread;
  /* Frames per RX/TX ring for Ethernet NICs (0: 512). */
  uint32_t ring_size;
};

#define UFAB_DEVICE_CAP_UD (1u << 0)          /* UD queue pairs */
#define UFAB_DEVICE_CAP_ATOMICS (1u << 1)     /* CMP_AND_SWP, FETCH_AND_ADD */
#define UFAB_DEVICE_CAP_WIRE_ROCEV2 (1u << 2) /* RoCEv2 on an Ethernet NIC */
#define UFAB_DEVICE_CAP_FLUSH_GLOBAL (1u << 3)     /* FLUSH with UFAB_FLUSH_GLOBAL, both directions */
#define UFAB_DEVICE_CAP_FLUSH_PERSISTENT (1u << 4) /* FLUSH with UFAB_FLUSH_PERSISTENT (a durable memory type) */
#define UFAB_DEVICE_CAP_ATOMIC_WRITE (1u << 5)     /* ATOMIC_WRITE, both directions */

struct ufab_device_attr {
  char name[64];     /* as opened */
  char provider[32]; /* "soft-roce", "shm", ... */
  char transport[64]; /* what carries it: "e1000e 82574L", "shared memory" */
  uint32_t ip;        /* host order */
  uint32_t active_mtu; /* the path MTU QPs get by default, bytes */
  uint32_t caps;       /* UFAB_DEVICE_CAP_* */
  uint32_t mem_types;  /* 1u << enum ufab_mem_type, for each one taken */
  uint32_t max_qp;
  uint32_t max_qp_wr;
  uint32_t max_sge;
  uint32_t max_inline_data;
  uint32_t max_cqe;
  uint32_t max_qp_rd_atom;
  uint64_t max_mr_size;
};

/* Counters; a provider fills those it keeps and leaves the rest 0. */
struct ufab_device_stats {
  uint64_t rx_frames, tx_frames;
  uint64_t rx_roce, rx_arp, rx_other;
  uint64_t rx_parse_errors; /* malformed RoCE frames (bad ICRC, truncated, ...) */
  uint64_t rx_unknown_qp;
  uint64_t rx_dropped;      /* well-formed but not acceptable (wrong source, state, Q_Key, ...) */
  uint64_t retransmits;     /* packets sent again */
  uint64_t timeouts;
  uint64_t naks_sent, naks_received;
  uint64_t rnr_naks_sent, rnr_naks_received;
  uint64_t duplicates; /* requests seen again (re-ACKed or replayed) */
  uint64_t tx_stalls;  /* sends put off because the NIC had no free buffer */
  /* Appended (fields are only ever added here, at the end). Data
   * packets are the RC request packets (SEND, WRITE, READ request, atomic)
   * and the READ response packets this device put on the wire. Packets sent
   * per packet needed: tx_data_packets / (tx_data_packets - tx_data_resent). */
  uint64_t tx_data_packets; /* data packets sent, first sends and resends */
  uint64_t tx_data_resent;  /* of those, sent again: go-backs, READ ranges asked for again, READ responses replayed */
  uint64_t rx_read_responses;     /* READ response packets taken by this device's requesters */
  uint64_t rx_read_response_dups; /* of those, for responses already received (the peer sent them twice) */
  uint64_t window_cuts;           /* congestion window halvings (sequence NAK, RNR NAK, timeout) */
  uint64_t rx_data_packets;  /* RC request packets received by this device's responders */
  uint64_t rx_data_unneeded; /* of those, not taken: duplicates and packets ahead of a gap */
  uint64_t tx_gather_frames; /* frames whose payload the NIC read from the memory region (zero copy) */
};
/* Data packets per packet needed, as this device sees them: sent (with
 * resends) plus received from a peer that sends (READ responses, requests),
 * over the same without resends and without what arrived twice or ahead of
 * a gap. 1.0: nothing sent twice. The receiving side cannot see packets the
 * wire lost, so there it is a lower bound. */
static inline double ufab_sent_per_needed(const struct ufab_device_stats* st) {
  uint64_t sent = st->tx_data_packets + st->rx_data_packets + st->rx_read_responses;
  uint64_t again = st->tx_data_resent + st->rx_data_unneeded + st->rx_read_response_dups;
  return sent > again ? (double)sent / (double)(sent - again) : 1.0;
}

struct ufab_mr_attr {
  uint32_t size; /* sizeof(struct ufab_mr_attr) */
  uint32_t access; /* enum ufab_access_flags */
  void* addr;
  uint64_t length;
  uint32_t mem_type; /* enum ufab_mem_type */
  uint32_t reserved;
};

/* ------------------------------------------------------------------- calls */

/* The last failure on this thread, in words ("" when none). */
const char* ufab_last_error(void);

int ufab_device_open(const char* name, const struct ufab_device_opts* opts, struct ufab_device** out);
/* Drops the application's reference; the device closes with its last object. */
void ufab_device_close(struct ufab_device* dev);
int ufab_device_query(struct ufab_device* dev, struct ufab_device_attr* out);
int ufab_device_query_stats(struct ufab_device* dev, struct ufab_device_stats* out);
/* Runs the provider once (receive, acknowledge, retransmit); returns the
 * work done. poll, wait and post call it. */
int ufab_device_progress(struct ufab_device* dev);
/* A progress thread for a while (while blocked in an out-of-band exchange,
 * say); a no-op when the device already has one. */
int ufab_device_start_progress_thread(struct ufab_device* dev);
void ufab_device_stop_progress_thread(struct ufab_device* dev);

int ufab_pd_alloc(struct ufab_device* dev, struct ufab_pd** out);
int ufab_pd_free(struct ufab_pd* pd);

/* Host memory [addr, addr + length) with `access`; verbs' rules apply
 * (remote write or atomic need local write). In a process that has the
 * CUDA driver loaded, GPU device memory registered here is recognised
 * (pointer attributes) and registered as UFAB_MEM_CUDA; managed memory is
 * refused (-EOPNOTSUPP). docs/gpu.md. */
int ufab_mr_reg(struct ufab_pd* pd, void* addr, uint64_t length, uint32_t access, struct ufab_mr** out);
int ufab_mr_reg_attr(struct ufab_pd* pd, const struct ufab_mr_attr* attr, struct ufab_mr** out);
uint32_t ufab_mr_lkey(const struct ufab_mr* mr);
uint32_t ufab_mr_rkey(const struct ufab_mr* mr);
/* -EBUSY (and the region stays) while a transfer touches it. -EINVAL for a
 * region from a registration cache (give it back with
 * ufab_mr_cache_release). */
int ufab_mr_dereg(struct ufab_mr* mr);

/* A registration cache on a protection domain: ufab_mr_cache_reg of a
 * range registered before (same address, length and access) returns the
 * same region without registering again. Regions stay registered after
 * their release until evicted (CLOCK, close to least recently used,
 * beyond max_entries or max_bytes) or until their memory goes away: host
 * memory is watched for munmap/madvise/mremap through userfaultfd (memory
 * it cannot watch, such as a file mapping, is registered and deregistered
 * each time); GPU memory is checked against its CUDA buffer id on every
 * hit, unless the cache watches GPU frees (UFAB_MR_CACHE_WATCH_GPU_FREES:
 * then a GPU hit asks CUDA only after a call that may have freed or
 * replaced GPU memory). Thread-safe; a hit and a release take no lock.
 * docs/gpu.md. */
struct ufab_mr_cache;
struct ufab_mr_cache_attr {
  uint32_t size;        /* sizeof(struct ufab_mr_cache_attr); the size before flags (16) is taken too */
  uint32_t max_entries; /* 0: 1024 */
  uint64_t max_bytes;   /* 0: 16 GiB */
  uint32_t flags;       /* UFAB_MR_CACHE_* (API 1.6) */
  uint32_t reserved;    /* 0 */
};
/* Count the CUDA calls that may free GPU memory or reuse its addresses,
 * through CUPTI's callbacks (libcupti from the CUDA toolkit; the process's
 * one CUPTI subscriber before CUPTI 13.5, so a profiler attached later
 * fails), so that GPU hits need no CUDA question while none ran. Where the
 * watch cannot start the cache asks on every GPU hit, as without the flag:
 * ufab_mr_cache_gpu_watch says which. */
#define UFAB_MR_CACHE_WATCH_GPU_FREES 1u
struct ufab_mr_cache_stats {
  uint64_t hits, misses;
  uint64_t uncached;      /* misses on memory that cannot be watched, so not kept */
  uint64_t evictions;     /* dropped to stay within the bounds */
  uint64_t invalidations; /* dropped because the memory went away */
  uint64_t entries, bytes, held;
};
int ufab_mr_cache_create(struct ufab_pd* pd, const struct ufab_mr_cache_attr* attr, struct ufab_mr_cache** out);
/* -EBUSY while regions from it are held (not released). */
int ufab_mr_cache_destroy(struct ufab_mr_cache* cache);
/* A region for exactly [addr, addr + length) with `access`, held until
 * ufab_mr_cache_release (once per ufab_mr_cache_reg, from any thread);
 * the same ufab_mr may be handed to several holders. ufab_mr_lkey/rkey
 * give its keys. */
int ufab_mr_cache_reg(struct ufab_mr_cache* cache, void* addr, uint64_t length, uint32_t access,
                      struct ufab_mr** out);
int ufab_mr_cache_release(struct ufab_mr_cache* cache, struct ufab_mr* mr);
int ufab_mr_cache_query_stats(struct ufab_mr_cache* cache, struct ufab_mr_cache_stats* out);
/* "userfaultfd" when host memory is watched, else why not (then host
 * memory is not cached). Valid while the cache lives. */
const char* ufab_mr_cache_host_watch(struct ufab_mr_cache* cache);
/* "cupti" when GPU frees are watched (UFAB_MR_CACHE_WATCH_GPU_FREES), else
 * why not ("not asked" without the flag). Valid while the cache lives. */
const char* ufab_mr_cache_gpu_watch(struct ufab_mr_cache* cache);

int ufab_cq_create(struct ufab_device* dev, uint32_t depth, struct ufab_cq** out);
int ufab_cq_destroy(struct ufab_cq* cq);
uint32_t ufab_cq_depth(const struct ufab_cq* cq);
/* Up to n completions, oldest first; 0 when none; -EOVERFLOW once after
 * completions were lost to a full CQ (their QPs went to ERROR). */
int ufab_cq_poll(struct ufab_cq* cq, struct ufab_wc* wc, uint32_t n);
/* Blocks until a completion is there or timeout_ms passes (a negative
 * timeout waits without limit), then polls. */
int ufab_cq_wait(struct ufab_cq* cq, struct ufab_wc* wc, uint32_t n, int timeout_ms);
/* Why an error completion failed, in words; valid until the next poll of
 * this CQ. */
const char* ufab_cq_wc_detail(struct ufab_cq* cq, const struct ufab_wc* wc);
/* After this, the CQ's event fd becomes readable at the next completion
 * (read its 8 bytes, arm again, poll). */
int ufab_cq_req_notify(struct ufab_cq* cq);
int ufab_cq_event_fd(struct ufab_cq* cq);

int ufab_qp_create(struct ufab_pd* pd, const struct ufab_qp_init_attr* init, struct ufab_qp** out);
/* Outstanding work is dropped without completions. */
int ufab_qp_destroy(struct ufab_qp* qp);
uint32_t ufab_qp_num(const struct ufab_qp* qp);
uint32_t ufab_qp_type(const struct ufab_qp* qp); /* enum ufab_qp_type */
struct ufab_device* ufab_qp_device(const struct ufab_qp* qp);
/* verbs' ibv_modify_qp: IBA 10.3.1 transitions; a missing or invalid
 * attribute is -EINVAL naming it, and nothing changes. */
int ufab_qp_modify(struct ufab_qp* qp, const struct ufab_qp_attr* attr, uint32_t mask);
int ufab_qp_query(struct ufab_qp* qp, struct ufab_qp_attr* out);
/* Defaults for `tuning` in ufab_qp_connect (verbs' usual values). */
void ufab_qp_attr_defaults(struct ufab_qp_attr* out);
/* RESET -> INIT -> RTR -> RTS towards `peer` in one call (RC), or to RTS
 * with tuning->qkey (UD). tuning NULL: ufab_qp_attr_defaults. */
int ufab_qp_connect(struct ufab_qp* qp, const struct ufab_conn* peer, const struct ufab_qp_attr* tuning);
/* What a peer needs to connect to this QP (ip, qpn, first PSN). */
int ufab_qp_local(struct ufab_qp* qp, struct ufab_conn* out);

/* Posts wrs[0..n) in order with one doorbell. On failure *bad (if given)
 * is the index of the one refused; those before it are posted. */
int ufab_post_send(struct ufab_qp* qp, const struct ufab_send_wr* wrs, uint32_t n, uint32_t* bad);
int ufab_post_recv(struct ufab_qp* qp, const struct ufab_recv_wr* wrs, uint32_t n, uint32_t* bad);

int ufab_ah_create(struct ufab_pd* pd, const struct ufab_av* av, struct ufab_ah** out);
int ufab_ah_destroy(struct ufab_ah* ah);
/* The UD destination for `qpn` and `qkey` through this address handle. */
struct ufab_ud_dest ufab_ah_dest(const struct ufab_ah* ah, uint32_t qpn, uint32_t qkey);

/* Words for values (ibv_wc_status_str's for statuses). */
const char* ufab_wc_status_str(uint32_t status);
const char* ufab_wc_opcode_str(uint32_t opcode);
const char* ufab_wr_opcode_str(uint32_t opcode);
const char* ufab_qp_state_str(uint32_t state);

#ifdef __cplusplus
}
#endif

#endif /* UFAB_RDMA_H */
