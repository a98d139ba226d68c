/*
 * ufab's RDMA API from C: two endpoints in one process, an RC queue pair
 * between them, and SEND/RECV with immediate data, RDMA WRITE, RDMA READ
 * and FETCH_AND_ADD, each result checked.
 *
 *   rdma_c_example shm:demo shm:demo                 shared-memory provider
 *   rdma_c_example swnic:demo:0 swnic:demo:1 10.0.0.1 10.0.0.2
 *                                                    soft-RoCE over the software NIC
 *   rdma_c_example 0000:00:02.0 0000:00:03.0 10.0.0.1 10.0.0.2
 *                                                    soft-RoCE over two vfio-bound NICs on one link
 *
 * Built with: cc rdma_c_example.c $(pkg-config --cflags --libs ufab)
 * Exit status 0 when every step checked out; otherwise a message saying
 * which step failed and why.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ufab/rdma.h>

#define BUF_SIZE 8192
#define TIMEOUT_MS 5000

/* One end: device, PD, a buffer registered for everything, CQ, QP. */
struct end {
  struct ufab_device* dev;
  struct ufab_pd* pd;
  struct ufab_mr* mr;
  struct ufab_cq* cq;
  struct ufab_qp* qp;
  uint64_t* buf; /* 8-byte aligned for the atomic */
};

static int failed(const char* step, int rc) {
  fprintf(stderr, "rdma_c_example: %s failed (%d): %s\n", step, rc, ufab_last_error());
  return 1;
}

static int open_end(struct end* e, const char* name, const char* ip) {
  struct ufab_device_opts opts = {.size = sizeof opts, .ip = ip};
  int rc;
  if ((rc = ufab_device_open(name, &opts, &e->dev)) < 0) return failed("ufab_device_open", rc);
  if ((rc = ufab_pd_alloc(e->dev, &e->pd)) < 0) return failed("ufab_pd_alloc", rc);
  e->buf = aligned_alloc(64, BUF_SIZE);
  if (e->buf == NULL) return failed("aligned_alloc", -12);
  memset(e->buf, 0, BUF_SIZE);
  uint32_t access = UFAB_ACCESS_LOCAL_WRITE | UFAB_ACCESS_REMOTE_WRITE | UFAB_ACCESS_REMOTE_READ |
                    UFAB_ACCESS_REMOTE_ATOMIC;
  if ((rc = ufab_mr_reg(e->pd, e->buf, BUF_SIZE, access, &e->mr)) < 0) return failed("ufab_mr_reg", rc);
  if ((rc = ufab_cq_create(e->dev, 64, &e->cq)) < 0) return failed("ufab_cq_create", rc);
  struct ufab_qp_init_attr init = {
      .qp_type = UFAB_QPT_RC,
      .send_cq = e->cq,
      .recv_cq = e->cq,
      .cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1, .max_inline_data = 64},
  };
  if ((rc = ufab_qp_create(e->pd, &init, &e->qp)) < 0) return failed("ufab_qp_create", rc);
  return 0;
}

static void close_end(struct end* e) {
  /* Any order works: each object keeps what it needs alive. */
  ufab_qp_destroy(e->qp);
  ufab_cq_destroy(e->cq);
  ufab_mr_dereg(e->mr);
  ufab_pd_free(e->pd);
  ufab_device_close(e->dev);
  free(e->buf);
}

/* Waits for one completion on `e`, driving the other end's progress too
 * (both ends live in this one thread). */
static int expect(struct end* e, struct end* other, uint32_t opcode, uint64_t wr_id, struct ufab_wc* out) {
  for (int waited = 0; waited < TIMEOUT_MS; ++waited) {
    ufab_device_progress(other->dev);
    int n = ufab_cq_wait(e->cq, out, 1, 1);
    if (n < 0) return failed("ufab_cq_wait", n);
    if (n == 0) continue;
    if (out->status != UFAB_WC_SUCCESS) {
      fprintf(stderr, "rdma_c_example: %s completed with %s: %s\n", ufab_wc_opcode_str(out->opcode),
              ufab_wc_status_str(out->status), ufab_cq_wc_detail(e->cq, out));
      return 1;
    }
    if (out->opcode != opcode || out->wr_id != wr_id) {
      fprintf(stderr, "rdma_c_example: expected %s (wr_id %llu), got %s (wr_id %llu)\n", ufab_wc_opcode_str(opcode),
              (unsigned long long)wr_id, ufab_wc_opcode_str(out->opcode), (unsigned long long)out->wr_id);
      return 1;
    }
    return 0;
  }
  fprintf(stderr, "rdma_c_example: no %s completion within %d ms\n", ufab_wc_opcode_str(opcode), TIMEOUT_MS);
  return 1;
}

static int post(struct end* e, const struct ufab_send_wr* wr) {
  int rc = ufab_post_send(e->qp, wr, 1, NULL);
  return rc < 0 ? failed(ufab_wr_opcode_str(wr->opcode), rc) : 0;
}

int main(int argc, char** argv) {
  if (argc != 3 && argc != 5) {
    fprintf(stderr, "usage: rdma_c_example DEVICE_A DEVICE_B [IP_A IP_B]\n"
                    "  e.g. rdma_c_example shm:demo shm:demo\n"
                    "       rdma_c_example swnic:demo:0 swnic:demo:1 10.0.0.1 10.0.0.2\n");
    return 2;
  }
  struct end a = {0}, b = {0};
  if (open_end(&a, argv[1], argc == 5 ? argv[3] : NULL) || open_end(&b, argv[2], argc == 5 ? argv[4] : NULL)) return 1;
  struct ufab_device_attr attr;
  ufab_device_query(a.dev, &attr);
  printf("provider %s (%s)\n", attr.provider, attr.transport);

  /* Connect: each side takes the other's address, QP number and PSN, as
   * two processes would exchange them out of band. */
  struct ufab_conn ca, cb;
  int rc;
  if ((rc = ufab_qp_local(a.qp, &ca)) < 0 || (rc = ufab_qp_local(b.qp, &cb)) < 0) return failed("ufab_qp_local", rc);
  if ((rc = ufab_qp_connect(a.qp, &cb, NULL)) < 0) return failed("connect A", rc);
  if ((rc = ufab_qp_connect(b.qp, &ca, NULL)) < 0) return failed("connect B", rc);

  struct ufab_wc wc;
  char* abuf = (char*)a.buf;
  char* bbuf = (char*)b.buf;

  /* 1. SEND with immediate data: A -> B's posted receive. */
  struct ufab_sge rsge = {.addr = (uintptr_t)bbuf, .length = 256, .lkey = ufab_mr_lkey(b.mr)};
  struct ufab_recv_wr rwr = {.wr_id = 10, .sg_list = &rsge, .num_sge = 1};
  if ((rc = ufab_post_recv(b.qp, &rwr, 1, NULL)) < 0) return failed("ufab_post_recv", rc);
  strcpy(abuf, "hello from C");
  struct ufab_sge ssge = {.addr = (uintptr_t)abuf, .length = 13, .lkey = ufab_mr_lkey(a.mr)};
  struct ufab_send_wr send = {.wr_id = 1, .sg_list = &ssge, .num_sge = 1, .opcode = UFAB_WR_SEND_WITH_IMM,
                              .send_flags = UFAB_SEND_SIGNALED, .imm_data = 0x1234};
  if (post(&a, &send) || expect(&b, &a, UFAB_WC_RECV, 10, &wc)) return 1;
  if (wc.byte_len != 13 || !(wc.wc_flags & UFAB_WC_WITH_IMM) || wc.imm_data != 0x1234 || strcmp(bbuf, abuf) != 0) {
    fprintf(stderr, "rdma_c_example: SEND arrived wrong (len %u, imm 0x%x, \"%s\")\n", wc.byte_len, wc.imm_data, bbuf);
    return 1;
  }
  if (expect(&a, &b, UFAB_WC_SEND, 1, &wc)) return 1;
  printf("SEND_WITH_IMM: \"%s\" imm 0x%x\n", bbuf, 0x1234);

  /* 2. RDMA WRITE: 4 KiB from A into B at offset 4096. */
  for (int i = 0; i < 4096; ++i) abuf[i] = (char)(i * 7 + 1);
  struct ufab_sge wsge = {.addr = (uintptr_t)abuf, .length = 4096, .lkey = ufab_mr_lkey(a.mr)};
  struct ufab_send_wr write = {.wr_id = 2, .sg_list = &wsge, .num_sge = 1, .opcode = UFAB_WR_RDMA_WRITE,
                               .send_flags = UFAB_SEND_SIGNALED, .remote_addr = (uintptr_t)bbuf + 4096,
                               .rkey = ufab_mr_rkey(b.mr)};
  if (post(&a, &write) || expect(&a, &b, UFAB_WC_RDMA_WRITE, 2, &wc)) return 1;
  if (memcmp(bbuf + 4096, abuf, 4096) != 0) return fprintf(stderr, "rdma_c_example: WRITE data differs\n"), 1;
  printf("RDMA_WRITE: 4096 bytes checked\n");

  /* 3. RDMA READ: B's 4 KiB back into A at offset 4096. */
  struct ufab_sge dsge = {.addr = (uintptr_t)abuf + 4096, .length = 4096, .lkey = ufab_mr_lkey(a.mr)};
  struct ufab_send_wr read = {.wr_id = 3, .sg_list = &dsge, .num_sge = 1, .opcode = UFAB_WR_RDMA_READ,
                              .send_flags = UFAB_SEND_SIGNALED, .remote_addr = (uintptr_t)bbuf + 4096,
                              .rkey = ufab_mr_rkey(b.mr)};
  if (post(&a, &read) || expect(&a, &b, UFAB_WC_RDMA_READ, 3, &wc)) return 1;
  if (memcmp(abuf + 4096, abuf, 4096) != 0) return fprintf(stderr, "rdma_c_example: READ data differs\n"), 1;
  printf("RDMA_READ: 4096 bytes checked\n");

  /* 4. FETCH_AND_ADD on B's first word; the old value lands in A's. */
  b.buf[0] = 40;
  struct ufab_sge asge = {.addr = (uintptr_t)a.buf, .length = 8, .lkey = ufab_mr_lkey(a.mr)};
  struct ufab_send_wr fadd = {.wr_id = 4, .sg_list = &asge, .num_sge = 1, .opcode = UFAB_WR_ATOMIC_FETCH_AND_ADD,
                              .send_flags = UFAB_SEND_SIGNALED, .remote_addr = (uintptr_t)b.buf,
                              .rkey = ufab_mr_rkey(b.mr), .compare_add = 2};
  if (post(&a, &fadd) || expect(&a, &b, UFAB_WC_FETCH_ADD, 4, &wc)) return 1;
  if (a.buf[0] != 40 || b.buf[0] != 42) {
    fprintf(stderr, "rdma_c_example: FETCH_AND_ADD gave %llu, target %llu (want 40, 42)\n",
            (unsigned long long)a.buf[0], (unsigned long long)b.buf[0]);
    return 1;
  }
  printf("FETCH_AND_ADD: 40 + 2 = 42\n");

  /* 5. An error, as it reaches an application: a bad rkey. */
  write.wr_id = 5;
  write.rkey ^= 0x5a5a00;
  if (post(&a, &write)) return 1;
  for (int waited = 0; waited < TIMEOUT_MS; ++waited) {
    ufab_device_progress(b.dev);
    if ((rc = ufab_cq_wait(a.cq, &wc, 1, 1)) != 0) break;
  }
  if (rc != 1 || wc.status != UFAB_WC_REM_ACCESS_ERR) {
    fprintf(stderr, "rdma_c_example: a bad rkey gave %s, not remote access error\n",
            rc == 1 ? ufab_wc_status_str(wc.status) : "no completion");
    return 1;
  }
  printf("bad rkey: %s (%s)\n", ufab_wc_status_str(wc.status), ufab_cq_wc_detail(a.cq, &wc));

  close_end(&a);
  close_end(&b);
  printf("all steps passed\n");
  return 0;
}
