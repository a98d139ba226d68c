/*
 * ufab RDMA provider ABI: what a plugin implements to give ufab queue pairs
 * itself (a shared-memory device, a NIC with RDMA in hardware), instead of
 * moving raw frames under ufab's soft-RoCE.
 *
 * Same conventions as the raw-frame ABI (abi/raw_frame.h):
 *  - A plugin exports ufab_rdma_provider_entry_v1(), returning a constant
 *    `struct ufab_rdma_provider`: a header (ABI version, size, name, the
 *    device-name prefixes it serves) followed by operations.
 *  - Append-only: new operations go at the end and bump the minor; the
 *    loader reads `size` and fills missing or NULL operations with stubs
 *    returning -EOPNOTSUPP. An incompatible change bumps the major and the
 *    entry symbol.
 *  - Plain C: opaque handles, the value structs of <ufab/rdma.h>, no C++
 *    types or exceptions across it. Operations return 0 (or a count) on
 *    success and a negative errno on failure, after explaining the failure
 *    through host->set_error().
 *  - The prefix table is data: "shm" serves every device named "shm:...",
 *    and the framework picks the provider without running plugin code.
 *
 * The framework owns the public handles (struct ufab_qp ...), their
 * reference counts and lifetimes; a provider sees only its own handles, and
 * the framework calls destroy operations children first (QPs before the
 * CQs and PD they use, everything before close_device).
 *
 * Threads: the framework may call any operation from any thread, so a
 * provider locks what it shares; on the post and poll paths it should lock
 * per queue, not per device (soft-RoCE still takes one device lock: issue
 * 11's work).
 */
#ifndef UFAB_ABI_RDMA_PROVIDER_H
#define UFAB_ABI_RDMA_PROVIDER_H

#include <stddef.h>
#include <stdint.h>

#include "ufab/rdma.h"

#ifdef __cplusplus
extern "C" {
#endif

#define UFAB_RDMA_ABI_MAJOR 1
#define UFAB_RDMA_ABI_MINOR 0
#define UFAB_RDMA_PROVIDER_ENTRY_SYMBOL "ufab_rdma_provider_entry_v1"

/* A provider's objects, defined by the provider. */
struct ufab_rdma_dev;
struct ufab_rdma_pd;
struct ufab_rdma_mr;
struct ufab_rdma_cq;
struct ufab_rdma_qp;
struct ufab_rdma_ah;

/* Services the framework hands a provider at open. */
struct ufab_rdma_host {
  uint32_t size; /* sizeof(struct ufab_rdma_host) the framework was built with */
  uint32_t reserved;
  /* Keeps a sentence for the error the current operation is about to
   * return (what failed, why, what to do); it reaches ufab_last_error(). */
  void (*set_error)(const char* message);
  /* level: 0 error, 1 warning, 2 info, 3 debug. */
  void (*log)(int level, const char* message);
};

/* create_qp's arguments, with the provider's own CQ handles. */
struct ufab_rdma_qp_init {
  uint32_t qp_type;
  uint32_t sq_sig_all;
  struct ufab_rdma_cq* send_cq;
  struct ufab_rdma_cq* recv_cq;
  struct ufab_qp_cap cap;
};

struct ufab_rdma_provider {
  /* Header: never moves. */
  uint16_t abi_major;
  uint16_t abi_minor;
  uint32_t size; /* sizeof(struct ufab_rdma_provider) the plugin was built with */
  const char* name;
  const char* description;
  /* Device-name prefixes served, NULL-terminated: {"shm", NULL} serves
   * "shm:anything". */
  const char* const* prefixes;
  uint32_t flags;
  uint32_t reserved;

  /* ABI 1.0 operations. */
  int (*open_device)(const struct ufab_rdma_host* host, const char* name, const struct ufab_device_opts* opts,
                     struct ufab_rdma_dev** out);
  void (*close_device)(struct ufab_rdma_dev* dev);
  int (*query_device)(struct ufab_rdma_dev* dev, struct ufab_device_attr* out);
  int (*device_stats)(struct ufab_rdma_dev* dev, struct ufab_device_stats* out);
  /* One round of progress; returns how much work it did. */
  int (*progress)(struct ufab_rdma_dev* dev);
  int (*start_progress_thread)(struct ufab_rdma_dev* dev);
  void (*stop_progress_thread)(struct ufab_rdma_dev* dev);

  int (*alloc_pd)(struct ufab_rdma_dev* dev, struct ufab_rdma_pd** out);
  int (*dealloc_pd)(struct ufab_rdma_pd* pd);

  /* lkey and rkey out; the framework keeps them for ufab_mr_lkey/rkey. */
  int (*reg_mr)(struct ufab_rdma_pd* pd, const struct ufab_mr_attr* attr, struct ufab_rdma_mr** out, uint32_t* lkey,
                uint32_t* rkey);
  int (*dereg_mr)(struct ufab_rdma_mr* mr);

  int (*create_cq)(struct ufab_rdma_dev* dev, uint32_t depth, struct ufab_rdma_cq** out);
  int (*destroy_cq)(struct ufab_rdma_cq* cq);
  /* Up to n completions; wc[i].detail is 0 or a handle for wc_detail. */
  int (*poll_cq)(struct ufab_rdma_cq* cq, struct ufab_wc* wc, uint32_t n);
  /* Blocks until the CQ has a completion (returns 1) or timeout_ms passes
   * (returns 0); a negative timeout waits without limit. It does not poll. */
  int (*wait_cq)(struct ufab_rdma_cq* cq, int timeout_ms);
  /* The words behind wc->detail, valid until the next poll_cq; NULL when
   * the provider has none. */
  const char* (*wc_detail)(struct ufab_rdma_cq* cq, uint32_t detail);
  int (*req_notify_cq)(struct ufab_rdma_cq* cq);
  int (*cq_event_fd)(struct ufab_rdma_cq* cq);

  int (*create_qp)(struct ufab_rdma_pd* pd, const struct ufab_rdma_qp_init* init, struct ufab_rdma_qp** out,
                   uint32_t* qpn);
  int (*destroy_qp)(struct ufab_rdma_qp* qp);
  int (*modify_qp)(struct ufab_rdma_qp* qp, const struct ufab_qp_attr* attr, uint32_t mask);
  int (*query_qp)(struct ufab_rdma_qp* qp, struct ufab_qp_attr* out);
  /* Its first send PSN, for what a peer needs to connect. */
  int (*qp_initial_psn)(struct ufab_rdma_qp* qp, uint32_t* psn);
  /* Posts wrs[0..n) in order, one doorbell; *bad is the index refused. */
  int (*post_send)(struct ufab_rdma_qp* qp, const struct ufab_send_wr* wrs, uint32_t n, uint32_t* bad);
  int (*post_recv)(struct ufab_rdma_qp* qp, const struct ufab_recv_wr* wrs, uint32_t n, uint32_t* bad);

  int (*create_ah)(struct ufab_rdma_pd* pd, const struct ufab_av* av, struct ufab_rdma_ah** out);
  int (*destroy_ah)(struct ufab_rdma_ah* ah);
};

typedef const struct ufab_rdma_provider* (*ufab_rdma_provider_entry_fn)(void);

/* The one symbol a provider plugin exports. */
const struct ufab_rdma_provider* ufab_rdma_provider_entry_v1(void);

#ifdef __cplusplus
}
#endif

#endif /* UFAB_ABI_RDMA_PROVIDER_H */
