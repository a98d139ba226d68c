/* ufab stream-ordered operations: work requests a CUDA stream triggers.
 *
 * A stream engine owns one completion queue and a thread (a proxy) that
 * watches words in pinned host memory. ufab_stream_post_send prepares
 * work requests now (checked and copied) and enqueues on the stream a
 * write of a doorbell word; when the stream reaches that point (after the
 * kernels before it), the proxy sees the word and posts the work requests
 * on their queue pair through the ordinary post path. ufab_stream_wait
 * enqueues on a stream a wait for a ticket's completion word, which the
 * proxy writes when the ticket's last work request completes (or a
 * posted receive, ufab_stream_post_recv): cuStreamWaitValue32, or a
 * one-thread kernel that polls the word (ufab_stream_engine_set_wait). So a kernel produces data, the
 * transfer starts when the stream gets there, and a later kernel waits for
 * it, with no CPU synchronisation in the application. It works on every
 * provider: the proxy uses the public API.
 *
 * Ordering and the deadlock to avoid are in docs/gpu.md ("Stream-ordered
 * operations"). In short: a stream never waits for a ticket whose doorbell
 * is behind the wait on the same stream; completions of the engine's CQ
 * come to the application through ufab_stream_engine_poll (the proxy owns
 * the CQ); destroying the engine releases every wait still armed.
 *
 * Rules the engine does not check (docs/gpu.md, "Known limits"): a QP with
 * tickets armed or in flight must not be destroyed (the proxy would post on
 * it: destroy the engine, or wait for the tickets, first); the QPs' send and
 * receive CQs must both be the engine's (a receive ticket completes only
 * through it); a ticket's last work request is made signaled, so its
 * completion comes through ufab_stream_engine_poll even when the
 * application did not ask for one.
 *
 * Functions return 0 or a negative errno; ufab_last_error() says why. */
#ifndef UFAB_STREAM_H
#define UFAB_STREAM_H

#include <stdint.h>

#include "ufab/rdma.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ufab_stream_engine;

/* The engine for the queue pairs whose send and receive completions go to
 * `cq` (the engine polls it from now on). `gpu`: the CUDA device whose
 * streams will trigger it (its primary context; pinned words allocated
 * there). `slots`: tickets in flight at most (0: 1024). -ENOTSUP/-ENOENT/
 * -ENODEV without GPU support, driver or device. */
int ufab_stream_engine_create(struct ufab_cq* cq, int gpu, uint32_t slots, struct ufab_stream_engine** out);
/* Stops the proxy. Tickets not complete are dropped and their completion
 * words written, so no stream waits for ever; their words (8 bytes a slot)
 * are then kept until the process ends, since a stream may still ring or
 * pass them. Best called once the streams that use it are done. */
void ufab_stream_engine_destroy(struct ufab_stream_engine* engine);

/* n work requests (a batch: one doorbell, posted together, in order) for
 * `qp`, triggered when `stream` (a CUstream) gets here. The last one is
 * made signaled; its completion completes the ticket. -EAGAIN when every
 * slot holds a ticket not yet complete. */
int ufab_stream_post_send(struct ufab_stream_engine* engine, struct ufab_qp* qp, const struct ufab_send_wr* wrs,
                          uint32_t n, void* stream, uint64_t* ticket);
/* A receive posted now; its completion completes the ticket (a stream can
 * wait for a peer's SEND or WRITE_WITH_IMM). */
int ufab_stream_post_recv(struct ufab_stream_engine* engine, struct ufab_qp* qp, const struct ufab_recv_wr* wr,
                          uint64_t* ticket);
/* `stream` waits, from here, until the ticket is complete. */
int ufab_stream_wait(struct ufab_stream_engine* engine, uint64_t ticket, void* stream);
/* 1 when the ticket completed well, 0 while it is not complete, -EIO when
 * a work request of it completed in error (ufab_last_error() names the
 * status), -ECANCELED when the engine dropped it, -EINVAL for a ticket it
 * never gave or has forgotten (a slot holds one ticket at a time). */
int ufab_stream_ticket_status(struct ufab_stream_engine* engine, uint64_t ticket);
/* How ufab_stream_wait makes a stream wait (API 1.6).
 * UFAB_STREAM_WAIT_MEMOP (the default): cuStreamWaitValue32, which holds
 * no SM; the GPU notices the word 3.5 to 9.5 us after it is written
 * (measured, docs/gpu.md). UFAB_STREAM_WAIT_KERNEL (sm_70 on; loaded on
 * first use): a kernel of one thread that reads the word until the ticket
 * is complete; it notices within about 1 us, adds a kernel to the stream
 * and holds one block slot of an SM while it waits. A stream the kernel
 * cannot be launched on (another context) gets the memory operation.
 * Applies to waits enqueued from then on. 0, -EINVAL for another value,
 * -ENOTSUP for the kernel where it cannot be loaded (ufab_last_error()
 * says why). */
#define UFAB_STREAM_WAIT_KERNEL 0
#define UFAB_STREAM_WAIT_MEMOP 1
int ufab_stream_engine_set_wait(struct ufab_stream_engine* engine, int mode);
/* The mode waits are enqueued with now (UFAB_STREAM_WAIT_*). */
int ufab_stream_engine_wait_mode(struct ufab_stream_engine* engine);
/* Device-initiated operations (API 1.6): the application's own kernels
 * ring doorbells and wait for tickets, with the functions of
 * <ufab/stream_device.cuh>, instead of stream memory operations between
 * kernels.
 *
 * ufab_stream_post_send_device: as ufab_stream_post_send, but no stream
 * writes the doorbell: a kernel writes `*doorbell_value` to the pinned
 * word at GPU address `*doorbell` (ufab_stream_device_ring) once the data
 * is written. A QP's device-rung tickets are posted in ticket order: ring
 * them in that order. The ticket completes as any other (a wait, a
 * completion word, ufab_stream_ticket_status).
 *
 * ufab_stream_wait_word: the GPU address of a ticket's completion word and
 * the value it reaches when the ticket is complete, for a kernel to wait
 * on (ufab_stream_device_wait, ufab_stream_device_wait_grid); valid while
 * the ticket holds its slot. */
int ufab_stream_post_send_device(struct ufab_stream_engine* engine, struct ufab_qp* qp,
                                 const struct ufab_send_wr* wrs, uint32_t n, uint64_t* ticket, uint64_t* doorbell,
                                 uint32_t* doorbell_value);
int ufab_stream_wait_word(struct ufab_stream_engine* engine, uint64_t ticket, uint64_t* word, uint32_t* value);
/* The completions of the engine's CQ, in order, with the application's
 * wr_ids (signaled work requests of tickets, receives, and anything else
 * posted on the CQ's queue pairs). Returns how many (0..n). */
int ufab_stream_engine_poll(struct ufab_stream_engine* engine, struct ufab_wc* wc, uint32_t n);

#ifdef __cplusplus
}
#endif

#endif /* UFAB_STREAM_H */
