/* ufab connection management: connect RC queue pairs the way rdma_cm does.
 *
 * A ufab_cm is one device's connection manager: it owns the device's GSI
 * QP (QP 1) and a thread that speaks the InfiniBand CM protocol (IBTA vol 1
 * ch 12: REQ, REP, RTU, REJ, MRA, DREQ, DREP) inside RoCEv2 with rdma_cm's
 * conventions (service id from port space TCP and a port, rdma_cm's
 * private-data header), so the kernel's rdma_cm (rping, ucmatose, perftest
 * -R) and ufab connect to each other. docs/cm.md describes the protocol,
 * the state machines and the timeouts.
 *
 * Events come in order from ufab_cm_get_event; ufab_cm_event_fd becomes
 * readable while events wait. Every call is thread-safe. Soft-RoCE only
 * (a provider without a GSI QP fails ufab_cm_open with -EOPNOTSUPP).
 *
 * Functions return 0 or a negative errno; ufab_last_error() says why. */
#ifndef UFAB_CM_H
#define UFAB_CM_H

#include <stdint.h>

#include "ufab/rdma.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ufab_cm;
struct ufab_cm_id;
struct ufab_cm_listener;

/* Private data: a REQ carries 56 bytes after rdma_cm's 36-byte header; a
 * REP 196, a REJ 148, a DREQ and a DREP 220, an RTU 224 (ufab sends none
 * with RTU, DREQ and DREP). */
#define UFAB_CM_REQ_PRIVATE_DATA 56
#define UFAB_CM_REP_PRIVATE_DATA 196
#define UFAB_CM_REJ_PRIVATE_DATA 148
#define UFAB_CM_MAX_PRIVATE_DATA 196
/* UD (SIDR): a SIDR_REQ carries 180 bytes after rdma_cm's header; a
 * SIDR_REP 136. */
#define UFAB_CM_SIDR_REQ_PRIVATE_DATA 180
#define UFAB_CM_SIDR_REP_PRIVATE_DATA 136
/* Requests (REQ or SIDR_REQ) waiting for the application's accept or
 * reject, at most, per connection manager; beyond that a REQ is answered
 * REJ "no resources" (3) and a SIDR_REQ SIDR_REP "rejected" (2) at once. */
#define UFAB_CM_MAX_PENDING_REQUESTS 256
/* The Q_Key rdma_cm gives UD QPs of its UDP port space (RDMA_UDP_QKEY):
 * ufab_cm_accept sets it on a UD QP, and a kernel peer insists on it. */
#define UFAB_CM_UDP_QKEY 0x01234567u

struct ufab_cm_opts {
  uint32_t size; /* sizeof(struct ufab_cm_opts) */
  /* How long the peer's CM may take to answer before a message is sent
   * again, as the IBA's 4.096 us * 2^code (0: 18, about 1.07 s; rdma_cm
   * sends 20, about 4.3 s). Sent in REQs as our response timeout too. */
  uint8_t response_timeout;
  /* How often a REQ, REP or DREQ is sent again before giving up (0: 7,
   * at most 15). */
  uint8_t max_retries;
  uint16_t reserved;
};

/* What the two sides agree on (rdma_conn_param's fields). In a
 * CONNECT_REQUEST event: what the peer offers (its initiator depth is the
 * most READs/atomics it will have outstanding toward us). */
struct ufab_cm_conn_param {
  const void* private_data; /* NULL with private_data_len 0 */
  uint8_t private_data_len;
  uint8_t responder_resources; /* READs/atomics we take at once (0: 16, the most) */
  uint8_t initiator_depth;     /* READs/atomics we send at once (0: 16) */
  uint8_t retry_count;         /* transport retries, 0..7 (0: 7) */
  uint8_t rnr_retry_count;     /* 0..7, 7 = infinite (0: 7) */
  uint8_t reserved[3];
};

enum ufab_cm_event_type {
  /* Passive: a REQ for a listener. `id` is new: ufab_cm_accept or
   * ufab_cm_reject it, then ufab_cm_id_destroy it when done. */
  UFAB_CM_EVENT_CONNECT_REQUEST = 1,
  /* Both: the QP is connected (RTS) and may be used. UD (active side of
   * ufab_cm_resolve_ud): the peer's QP is peer_qpn with Q_Key qkey. */
  UFAB_CM_EVENT_ESTABLISHED = 2,
  /* Active: the peer answered REJ (reject_reason, its private data). UD:
   * a SIDR_REP other than success, reject_reason its status (1 no such
   * service, 2 rejected, 3 no QP, 5 unsupported version). */
  UFAB_CM_EVENT_REJECTED = 3,
  /* Active: the peer did not answer (no ARP reply, or every REQ went
   * unanswered). status -EHOSTUNREACH or -ETIMEDOUT. */
  UFAB_CM_EVENT_UNREACHABLE = 4,
  /* Passive: the peer gave up or rejected our REP, or went silent after
   * it (no RTU); also after CONNECT_REQUEST when the peer gives up before
   * the accept. */
  UFAB_CM_EVENT_CONNECT_ERROR = 5,
  /* Both: the connection ended (the peer's DREQ, or ours answered or timed
   * out). The QP is in ERROR; its outstanding work completes flushed. */
  UFAB_CM_EVENT_DISCONNECTED = 6,
};

/* IBA table 112's REJ reasons most often seen. */
enum ufab_cm_reject_reason {
  UFAB_CM_REJ_NO_QP = 1,
  UFAB_CM_REJ_TIMEOUT = 4, /* the peer gave up waiting */
  UFAB_CM_REJ_INVALID_SERVICE_ID = 8, /* nobody listens on the port */
  UFAB_CM_REJ_STALE_CONN = 10,
  UFAB_CM_REJ_CONSUMER_REJECTED = 28, /* ufab_cm_reject, rdma_reject */
  UFAB_CM_REJ_INVALID_CLASS_VERSION = 31,
};

struct ufab_cm_event {
  uint32_t type;   /* enum ufab_cm_event_type */
  int32_t status;  /* 0, or a negative errno saying what failed */
  struct ufab_cm_id* id;
  struct ufab_cm_listener* listener; /* CONNECT_REQUEST: whose port */
  uint32_t peer_ip;    /* host order */
  uint16_t peer_port;  /* rdma_cm's port of the peer (its source port) */
  uint16_t local_port;
  uint16_t reject_reason; /* REJECTED: enum ufab_cm_reject_reason or another IBA code */
  uint8_t private_data_len;
  uint8_t reserved;
  /* CONNECT_REQUEST: the peer's offer; ESTABLISHED: what the QP got.
   * param.private_data points at private_data below. */
  struct ufab_cm_conn_param param;
  uint32_t peer_qpn;
  uint32_t qkey; /* UD: the peer QP's Q_Key */
  uint8_t private_data[UFAB_CM_MAX_PRIVATE_DATA]; /* the peer's, rdma_cm's header removed */
  uint32_t qp_type; /* UFAB_QPT_RC, or UFAB_QPT_UD for SIDR requests and answers */
  uint32_t reserved3;
};

/* One connection manager per device (it takes QP 1: -EBUSY if taken).
 * Close it before its device; keep a QP given to it until its id is
 * destroyed. */
int ufab_cm_open(struct ufab_device* dev, const struct ufab_cm_opts* opts, struct ufab_cm** out);
/* Destroys every id and listener still there (connected ones are
 * disconnected with a DREQ: sent, up to 500 ms for them to leave, but their
 * DREPs not waited for). NULL is ignored. */
void ufab_cm_close(struct ufab_cm* cm);
/* Readable while ufab_cm_get_event has an event to return. */
int ufab_cm_event_fd(struct ufab_cm* cm);
/* The next event, waiting up to timeout_ms (0: do not wait; -1: forever).
 * -ETIMEDOUT when none came. */
int ufab_cm_get_event(struct ufab_cm* cm, struct ufab_cm_event* out, int timeout_ms);

/* REQs to `port` (RDMA_PS_TCP) at the device's address become
 * CONNECT_REQUEST events. -EADDRINUSE when the port is taken. */
int ufab_cm_listen(struct ufab_cm* cm, uint16_t port, struct ufab_cm_listener** out);
/* UD service resolution (SIDR): SIDR_REQs for `port` in rdma_cm's UDP
 * port space become CONNECT_REQUEST events with qp_type UFAB_QPT_UD;
 * ufab_cm_accept answers with a UD QP's number and Q_Key, ufab_cm_reject
 * with "rejected". */
int ufab_cm_listen_ud(struct ufab_cm* cm, uint16_t port, struct ufab_cm_listener** out);
/* REQs not yet accepted are rejected; later ones get REJ "invalid service
 * id", as when nobody listened. CONNECT_REQUEST events not yet taken go
 * with their ids (and every other event of those ids). NULL is ignored. */
int ufab_cm_listener_close(struct ufab_cm_listener* listener);

/* QPs are handed over in RESET (they get remote WRITE, READ and atomic
 * access), or in INIT with the access flags the application chose and
 * receives posted (as rdma_cm applications post them before connecting or
 * accepting). After ufab_cm_id_destroy the CM touches the QP no more. */

/* Active side: connects `qp` (RC, in RESET or INIT, on the CM's device) to
 * whoever listens on dest_ip:port. Returns at once with the id; the
 * outcome is an ESTABLISHED, REJECTED or UNREACHABLE event. */
int ufab_cm_connect(struct ufab_cm* cm, struct ufab_qp* qp, uint32_t dest_ip, uint16_t port,
                    const struct ufab_cm_conn_param* param, struct ufab_cm_id** out);
/* Active side, UD: asks dest_ip which UD QP serves `port` (rdma_cm's UDP
 * port space; SIDR_REQ with param's private data). The answer is an
 * ESTABLISHED event (peer_qpn, qkey), REJECTED or UNREACHABLE; the id
 * then only needs destroying. */
int ufab_cm_resolve_ud(struct ufab_cm* cm, uint32_t dest_ip, uint16_t port, const struct ufab_cm_conn_param* param,
                       struct ufab_cm_id** out);
/* Passive side, after CONNECT_REQUEST: moves `qp` (RC, RESET or INIT) to
 * RTS toward the peer and answers REP; ESTABLISHED follows the peer's RTU.
 * For a UD request `qp` is a UD QP: in RESET or INIT it is brought to RTS
 * with Q_Key UFAB_CM_UDP_QKEY; the answer is a SIDR_REP naming it (no
 * ESTABLISHED on this side). */
int ufab_cm_accept(struct ufab_cm_id* id, struct ufab_qp* qp, const struct ufab_cm_conn_param* param);
/* Passive side, after CONNECT_REQUEST: answers REJ "consumer rejected"
 * with up to UFAB_CM_REJ_PRIVATE_DATA bytes. */
int ufab_cm_reject(struct ufab_cm_id* id, const void* private_data, uint8_t private_data_len);
/* Sends DREQ and puts the QP in ERROR; DISCONNECTED follows (the DREP or
 * the retries running out). */
int ufab_cm_disconnect(struct ufab_cm_id* id);
/* Forgets the id: a connected one is disconnected first (no event); its
 * queued events are dropped. The QP stays the caller's. NULL is ignored. */
int ufab_cm_id_destroy(struct ufab_cm_id* id);

struct ufab_qp* ufab_cm_id_qp(const struct ufab_cm_id* id);
void ufab_cm_id_set_context(struct ufab_cm_id* id, void* context);
void* ufab_cm_id_context(const struct ufab_cm_id* id);

const char* ufab_cm_event_str(uint32_t type);
/* "consumer rejected", "invalid service id", ... ("reason N" otherwise). */
const char* ufab_cm_reject_reason_str(uint16_t reason);

#ifdef __cplusplus
}
#endif

#endif /* UFAB_CM_H */
