/* ufab stream-ordered operations: RDMA work posted in the order of a CUDA
 * stream, and stream waits for its completion (API 1.5; docs/gpu.md,
 * "Stream-ordered operations").
 *
 *   kernel A<<<..., s>>>(buf);                     // produces the data
 *   ufab_stream_post_send(qp, &write, 1, s, &op);  // posted when s gets here
 *   ufab_stream_wait(op, s);                       // s waits for its completion
 *   kernel B<<<..., s>>>(...);                     // runs after the WRITE completed
 *
 * ufab_stream_post_send checks and copies the work requests now (errors
 * come back now) and enqueues on the stream a write of a doorbell word in
 * pinned host memory; ufab's watcher thread sees the word and posts the
 * work requests as ufab_post_send would, without any CUDA call. When the
 * last of them retires, ufab stores a completion word, which
 * ufab_stream_wait has the stream wait on (cuStreamWaitValue32, GEQ).
 * Completions appear in the CQ as for ufab_post_send: a signaled work
 * request gives its completion (before the completion word is stored), an
 * unsignaled one gives none unless it fails.
 *
 * `stream` is a CUstream (cudaStream_t) of the current context's GPU, or
 * NULL for the legacy default stream (not advised: see the ordering rules).
 * Works on every provider that implements the ABI 1.1 notify operations
 * (soft-RoCE on every NIC, shm); the QP may use host or GPU memory regions
 * as for ufab_post_send.
 *
 * Functions return 0 or a negative errno; ufab_last_error() says why. Every
 * call is thread-safe. */
#ifndef UFAB_STREAM_H
#define UFAB_STREAM_H

#include <stdint.h>

#include "ufab/rdma.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ufab_stream_op;

/* Enqueues wrs[0..n) (1 to 64; SEND, SEND_WITH_IMM, RDMA_WRITE,
 * RDMA_WRITE_WITH_IMM, RDMA_READ) on `stream`: posted on `qp`, in one post,
 * when the stream reaches this point. The work requests and their SGE
 * lists are copied now; the data is read when they are posted (inline data
 * too). *op is the handle for ufab_stream_wait and ufab_stream_op_query;
 * give it back with ufab_stream_op_free. Errors: -EINVAL (arguments,
 * opcode, the QP not in RTS), -EOPNOTSUPP (the provider cannot notify
 * completions), -ENOTSUP/-ENOENT/-ENODEV (no GPU support, no driver, no
 * GPU), a CUDA error enqueuing the write (-EIO). */
int ufab_stream_post_send(struct ufab_qp* qp, const struct ufab_send_wr* wrs, uint32_t n, void* stream,
                          struct ufab_stream_op** op);

/* Posts receives now, as ufab_post_recv does; the op completes when the
 * last of them does, so a stream can wait for data to arrive. */
int ufab_stream_post_recv(struct ufab_qp* qp, const struct ufab_recv_wr* wrs, uint32_t n,
                          struct ufab_stream_op** op);

/* Enqueues on `stream` a wait for `op`'s completion (successful or not:
 * ufab_stream_op_query says which). Any stream, any number of times. */
int ufab_stream_wait(struct ufab_stream_op* op, void* stream);

enum ufab_stream_op_state {
  UFAB_STREAM_OP_ARMED = 0,  /* waiting for its stream */
  UFAB_STREAM_OP_POSTED = 1, /* posted, not yet completed */
  UFAB_STREAM_OP_DONE = 2,   /* completed (its completion word is stored) */
};

struct ufab_stream_op_info {
  uint32_t state;     /* enum ufab_stream_op_state */
  uint32_t wc_status; /* DONE: the last work request's enum ufab_wc_status */
  int32_t post_error; /* DONE: 0, or the negative errno of a post that failed when
                         the stream reached it (-ECANCELED: the QP was destroyed first) */
  uint32_t reserved;
};

/* Where `op` is; *error (may be NULL) gets the words of a post_error,
 * valid until the op is freed. */
int ufab_stream_op_query(struct ufab_stream_op* op, struct ufab_stream_op_info* out, const char** error);

/* Gives the handle back; an op still armed or in flight runs to its end. */
void ufab_stream_op_free(struct ufab_stream_op* op);

#ifdef __cplusplus
}
#endif

#endif /* UFAB_STREAM_H */
