// Active endpoints: FI_EP_MSG over RC queue pairs, FI_EP_DGRAM over UD
// queue pairs; their data operations (msg, rma, atomic) and CM calls.
#include <arpa/inet.h>

#include <cstring>

#include "fabric/provider.h"

namespace ufab_fi {

namespace {

int no_ops_open(fid*, const char*, uint64_t, void**, void*) { return -FI_ENOSYS; }

Ep* as_ep(fid_ep* e) { return reinterpret_cast<Ep*>(e); }

int ufab_err(int rc) {
  // Posting errors: a full queue is "try again" (read the CQ), the rest
  // are the caller's.
  if (rc == -ENOMEM || rc == -ENOSPC || rc == -EAGAIN) return -FI_EAGAIN;
  return neg(-rc);
}

struct Post {
  uint32_t opcode = UFAB_WR_SEND;
  const iovec* iov = nullptr;
  void** desc = nullptr;
  size_t count = 0;
  uint64_t flags = 0;  // the caller's operation flags (FI_INJECT, FI_COMPLETION, FI_REMOTE_CQ_DATA, ...)
  uint64_t data = 0;
  fi_addr_t dest = FI_ADDR_UNSPEC;
  uint64_t raddr = 0, rkey = 0;
  uint64_t compare = 0, swap = 0;
  void* context = nullptr;
  bool inject = false;  // no completion at all
};

ssize_t post_send(Ep* ep, const Post& p) {
  if (!ep->enabled || ep->qp == nullptr) return -FI_EOPBADSTATE;
  if (ep->type == FI_EP_MSG && ep->state.load() != EpState::kConnected) return -FI_ENOTCONN;
  if (p.count > ep->max_sge) return -FI_EINVAL;
  ufab_sge sge[UFAB_MAX_SGE];
  uint64_t total = 0;
  bool inline_data = p.inject || (p.flags & FI_INJECT) != 0;
  for (size_t i = 0; i < p.count; i++) {
    sge[i].addr = reinterpret_cast<uintptr_t>(p.iov[i].iov_base);
    sge[i].length = static_cast<uint32_t>(p.iov[i].iov_len);
    total += p.iov[i].iov_len;
    if (!inline_data) {
      if (p.desc == nullptr || p.desc[i] == nullptr) {
        if (p.iov[i].iov_len == 0) {
          sge[i].lkey = 0;
          continue;
        }
        return -FI_EINVAL;  // FI_MR_LOCAL: every buffer needs its descriptor
      }
      sge[i].lkey = desc_lkey(p.desc[i]);
    } else if (p.desc != nullptr && p.desc[i] != nullptr) {
      // Inline data is read by the CPU at post time: never from GPU memory.
      if (static_cast<Mr*>(p.desc[i])->cuda) return -FI_EOPNOTSUPP;
      sge[i].lkey = desc_lkey(p.desc[i]);  // ufab checks it too
    } else {
      // fi_inject*: no descriptor; refused on a registered CUDA range.
      if (ep->dom->touches_cuda(p.iov[i].iov_base, p.iov[i].iov_len)) return -FI_EOPNOTSUPP;
      sge[i].lkey = 0;
    }
  }
  if (inline_data && total > ep->max_inline) return -FI_EINVAL;
  // FI_COMMIT_COMPLETE: a WRITE completes once durable at the target
  // (ufab's commit-complete WRITE: the WRITE, then a FLUSH PERSISTENT of
  // its range). Only where the device has FLUSH PERSISTENT (FI_RMA_PMEM).
  // A SEND or READ needs nothing more: a soft-RoCE receiver makes data
  // landing in persistent memory durable before it acknowledges it, and a
  // READ's data landing in local persistent memory before it completes.
  // Atomics have no durable form.
  bool commit = false;
  if ((p.flags & FI_COMMIT_COMPLETE) != 0 && !p.inject) {
    if (!ep->dom->dev->has_pmem()) return -FI_EOPNOTSUPP;
    if (p.opcode == UFAB_WR_ATOMIC_CMP_AND_SWP || p.opcode == UFAB_WR_ATOMIC_FETCH_AND_ADD) return -FI_EOPNOTSUPP;
    commit = p.opcode == UFAB_WR_RDMA_WRITE || p.opcode == UFAB_WR_RDMA_WRITE_WITH_IMM;
  }
  ufab_send_wr wr{};
  wr.sg_list = sge;
  wr.num_sge = static_cast<uint32_t>(p.count);
  wr.opcode = p.opcode;
  wr.send_flags = UFAB_SEND_SIGNALED | (inline_data ? uint32_t{UFAB_SEND_INLINE} : 0u) |
                  ((p.flags & FI_FENCE) != 0 ? uint32_t{UFAB_SEND_FENCE} : 0u) |
                  (commit ? uint32_t{UFAB_SEND_COMMIT} : 0u);
  wr.imm_data = static_cast<uint32_t>(p.data);
  wr.remote_addr = p.raddr;
  wr.rkey = static_cast<uint32_t>(p.rkey);
  if (p.opcode == UFAB_WR_ATOMIC_CMP_AND_SWP || p.opcode == UFAB_WR_ATOMIC_FETCH_AND_ADD) {
    wr.compare_add = p.compare;
    wr.swap = p.swap;
  }
  if (ep->type == FI_EP_DGRAM) {
    if (ep->av == nullptr) return -FI_EOPBADSTATE;
    std::lock_guard<std::mutex> lk(ep->av->mu);
    if (p.dest >= ep->av->table.size() || !ep->av->table[p.dest].valid) return -FI_EINVAL;
    const AvEntry& a = ep->av->table[p.dest];
    wr.ud = ufab_ah_dest(a.ah, a.qpn, a.qkey);
  }
  Cntr* cntr = nullptr;
  uint64_t cflags = 0;
  int kind = 0;
  switch (p.opcode) {
    case UFAB_WR_SEND:
    case UFAB_WR_SEND_WITH_IMM: cntr = ep->send_cntr; cflags = FI_MSG | FI_SEND; break;
    case UFAB_WR_RDMA_WRITE:
    case UFAB_WR_RDMA_WRITE_WITH_IMM: cntr = ep->write_cntr; cflags = FI_RMA | FI_WRITE; kind = 1; break;
    case UFAB_WR_RDMA_READ: cntr = ep->read_cntr; cflags = FI_RMA | FI_READ; kind = 2; break;
    default: cntr = ep->read_cntr; cflags = FI_ATOMIC | FI_READ; kind = 3; break;
  }
  bool want_cq = !p.inject && (!ep->tx_selective || (p.flags & FI_COMPLETION) != 0);
  // Nothing wanted back (fi_inject*, selective completion, no counter):
  // posted unsignaled, with no operation to track, no lock taken, and no
  // work completion to take in unless it fails.
  if (!want_cq && cntr == nullptr) {
    Op* q = &ep->dom->quiet[kind];
    wr.send_flags &= ~uint32_t{UFAB_SEND_SIGNALED};
    wr.wr_id = reinterpret_cast<uintptr_t>(q);
    int rc = ufab_post_send(ep->qp, &wr, 1, nullptr);
    return rc != 0 ? ufab_err(rc) : 0;
  }
  Op* op;
  {
    std::lock_guard<std::mutex> lk(ep->dom->mu);
    op = ep->dom->get_op();
    op->ep = ep;
    op->context = p.context;
    op->flags = cflags;
    op->want_cq = want_cq;
    op->cntr = cntr;
    op->len = total;
    ep->ops.insert(op);
    ep->tx_u->inflight++;
  }
  wr.wr_id = reinterpret_cast<uintptr_t>(op);
  int rc = ufab_post_send(ep->qp, &wr, 1, nullptr);
  if (rc != 0) {
    std::lock_guard<std::mutex> lk(ep->dom->mu);
    ep->tx_u->inflight--;
    ep->ops.erase(op);
    ep->dom->put_op(op);
    return ufab_err(rc);
  }
  // Every signaled send has a work completion; those nobody asked for (a
  // counter only) are taken in here too, or an application that never
  // reads that CQ would fill it up (its QP then goes to ERROR).
  if (!want_cq && (++ep->quiet_posts & 31) == 0) {
    std::lock_guard<std::mutex> lk(ep->dom->mu);
    while (poll_ucq_locked(ep->dom, ep->tx_u) == kPollBatch) {
    }
  }
  return 0;
}

ssize_t post_recv(Ep* ep, const iovec* iov, void** desc, size_t count, uint64_t flags, void* context) {
  if (ep->qp == nullptr) return -FI_EOPBADSTATE;
  if (count > ep->max_sge) return -FI_EINVAL;
  ufab_sge sge[UFAB_MAX_SGE];
  uint64_t total = 0;
  for (size_t i = 0; i < count; i++) {
    sge[i].addr = reinterpret_cast<uintptr_t>(iov[i].iov_base);
    sge[i].length = static_cast<uint32_t>(iov[i].iov_len);
    total += iov[i].iov_len;
    if (desc == nullptr || desc[i] == nullptr) {
      if (iov[i].iov_len == 0) {
        sge[i].lkey = 0;
        continue;
      }
      return -FI_EINVAL;
    }
    sge[i].lkey = desc_lkey(desc[i]);
  }
  bool want_cq = !ep->rx_selective || (flags & FI_COMPLETION) != 0;
  Op* op;
  {
    std::lock_guard<std::mutex> lk(ep->dom->mu);
    op = ep->dom->get_op();
    op->ep = ep;
    op->context = context;
    op->flags = FI_MSG | FI_RECV;
    op->want_cq = want_cq;
    op->cntr = ep->recv_cntr;
    op->buf = count > 0 ? iov[0].iov_base : nullptr;
    op->len = total;
    ep->ops.insert(op);
    ep->rx_u->inflight++;
  }
  ufab_recv_wr wr{};
  wr.wr_id = reinterpret_cast<uintptr_t>(op);
  wr.sg_list = sge;
  wr.num_sge = static_cast<uint32_t>(count);
  int rc = ufab_post_recv(ep->qp, &wr, 1, nullptr);
  if (rc != 0) {
    std::lock_guard<std::mutex> lk(ep->dom->mu);
    ep->rx_u->inflight--;
    ep->ops.erase(op);
    ep->dom->put_op(op);
    return ufab_err(rc);
  }
  return 0;
}

// ------------------------------------------------------------------- msg

ssize_t ep_recv(fid_ep* e, void* buf, size_t len, void* desc, fi_addr_t, void* context) {
  iovec v{buf, len};
  return post_recv(as_ep(e), &v, &desc, 1, as_ep(e)->rx_op_flags, context);
}
ssize_t ep_recvv(fid_ep* e, const iovec* iov, void** desc, size_t count, fi_addr_t, void* context) {
  return post_recv(as_ep(e), iov, desc, count, as_ep(e)->rx_op_flags, context);
}
ssize_t ep_recvmsg(fid_ep* e, const fi_msg* msg, uint64_t flags) {
  return post_recv(as_ep(e), msg->msg_iov, msg->desc, msg->iov_count, flags, msg->context);
}

ssize_t ep_send(fid_ep* e, const void* buf, size_t len, void* desc, fi_addr_t dest, void* context) {
  iovec v{const_cast<void*>(buf), len};
  Post p;
  p.iov = &v;
  p.desc = &desc;
  p.count = 1;
  p.dest = dest;
  p.context = context;
  p.flags = as_ep(e)->tx_op_flags;
  return post_send(as_ep(e), p);
}
ssize_t ep_sendv(fid_ep* e, const iovec* iov, void** desc, size_t count, fi_addr_t dest, void* context) {
  Post p;
  p.iov = iov;
  p.desc = desc;
  p.count = count;
  p.dest = dest;
  p.context = context;
  p.flags = as_ep(e)->tx_op_flags;
  return post_send(as_ep(e), p);
}
ssize_t ep_sendmsg(fid_ep* e, const fi_msg* msg, uint64_t flags) {
  Post p;
  p.iov = msg->msg_iov;
  p.desc = msg->desc;
  p.count = msg->iov_count;
  p.dest = msg->addr;
  p.context = msg->context;
  p.flags = flags;
  if ((flags & FI_REMOTE_CQ_DATA) != 0) {
    p.opcode = UFAB_WR_SEND_WITH_IMM;
    p.data = msg->data;
  }
  return post_send(as_ep(e), p);
}
ssize_t ep_inject(fid_ep* e, const void* buf, size_t len, fi_addr_t dest) {
  iovec v{const_cast<void*>(buf), len};
  Post p;
  p.iov = &v;
  p.count = 1;
  p.dest = dest;
  p.inject = true;
  return post_send(as_ep(e), p);
}
ssize_t ep_senddata(fid_ep* e, const void* buf, size_t len, void* desc, uint64_t data, fi_addr_t dest,
                    void* context) {
  iovec v{const_cast<void*>(buf), len};
  Post p;
  p.opcode = UFAB_WR_SEND_WITH_IMM;
  p.iov = &v;
  p.desc = &desc;
  p.count = 1;
  p.dest = dest;
  p.data = data;
  p.context = context;
  p.flags = as_ep(e)->tx_op_flags;
  return post_send(as_ep(e), p);
}
ssize_t ep_injectdata(fid_ep* e, const void* buf, size_t len, uint64_t data, fi_addr_t dest) {
  iovec v{const_cast<void*>(buf), len};
  Post p;
  p.opcode = UFAB_WR_SEND_WITH_IMM;
  p.iov = &v;
  p.count = 1;
  p.dest = dest;
  p.data = data;
  p.inject = true;
  return post_send(as_ep(e), p);
}

fi_ops_msg g_msg_ops = {sizeof(fi_ops_msg), ep_recv,   ep_recvv,    ep_recvmsg, ep_send,
                        ep_sendv,           ep_sendmsg, ep_inject,  ep_senddata, ep_injectdata};

// ------------------------------------------------------------------- rma

ssize_t rma_common(Ep* ep, uint32_t opcode, const iovec* iov, void** desc, size_t count, uint64_t addr,
                   uint64_t key, void* context, uint64_t flags, uint64_t data, bool inject) {
  if (ep->type != FI_EP_MSG) return -FI_EOPNOTSUPP;
  if (opcode == UFAB_WR_RDMA_WRITE_WITH_IMM && (ep->info->mode & FI_RX_CQ_DATA) == 0) return -FI_EOPNOTSUPP;
  Post p;
  p.opcode = opcode;
  p.iov = iov;
  p.desc = desc;
  p.count = count;
  p.raddr = addr;
  p.rkey = key;
  p.context = context;
  p.flags = flags;
  p.data = data;
  p.inject = inject;
  return post_send(ep, p);
}

ssize_t rma_read(fid_ep* e, void* buf, size_t len, void* desc, fi_addr_t, uint64_t addr, uint64_t key,
                 void* context) {
  iovec v{buf, len};
  return rma_common(as_ep(e), UFAB_WR_RDMA_READ, &v, &desc, 1, addr, key, context, as_ep(e)->tx_op_flags, 0, false);
}
ssize_t rma_readv(fid_ep* e, const iovec* iov, void** desc, size_t count, fi_addr_t, uint64_t addr, uint64_t key,
                  void* context) {
  return rma_common(as_ep(e), UFAB_WR_RDMA_READ, iov, desc, count, addr, key, context, as_ep(e)->tx_op_flags, 0,
                    false);
}
ssize_t rma_readmsg(fid_ep* e, const fi_msg_rma* msg, uint64_t flags) {
  if (msg->rma_iov_count != 1) return -FI_EINVAL;
  return rma_common(as_ep(e), UFAB_WR_RDMA_READ, msg->msg_iov, msg->desc, msg->iov_count, msg->rma_iov[0].addr,
                    msg->rma_iov[0].key, msg->context, flags, 0, false);
}
ssize_t rma_write(fid_ep* e, const void* buf, size_t len, void* desc, fi_addr_t, uint64_t addr, uint64_t key,
                  void* context) {
  iovec v{const_cast<void*>(buf), len};
  return rma_common(as_ep(e), UFAB_WR_RDMA_WRITE, &v, &desc, 1, addr, key, context, as_ep(e)->tx_op_flags, 0, false);
}
ssize_t rma_writev(fid_ep* e, const iovec* iov, void** desc, size_t count, fi_addr_t, uint64_t addr, uint64_t key,
                   void* context) {
  return rma_common(as_ep(e), UFAB_WR_RDMA_WRITE, iov, desc, count, addr, key, context, as_ep(e)->tx_op_flags, 0,
                    false);
}
ssize_t rma_writemsg(fid_ep* e, const fi_msg_rma* msg, uint64_t flags) {
  if (msg->rma_iov_count != 1) return -FI_EINVAL;
  uint32_t op = (flags & FI_REMOTE_CQ_DATA) != 0 ? UFAB_WR_RDMA_WRITE_WITH_IMM : UFAB_WR_RDMA_WRITE;
  return rma_common(as_ep(e), op, msg->msg_iov, msg->desc, msg->iov_count, msg->rma_iov[0].addr, msg->rma_iov[0].key,
                    msg->context, flags, msg->data, false);
}
ssize_t rma_inject(fid_ep* e, const void* buf, size_t len, fi_addr_t, uint64_t addr, uint64_t key) {
  iovec v{const_cast<void*>(buf), len};
  return rma_common(as_ep(e), UFAB_WR_RDMA_WRITE, &v, nullptr, 1, addr, key, nullptr, 0, 0, true);
}
ssize_t rma_writedata(fid_ep* e, const void* buf, size_t len, void* desc, uint64_t data, fi_addr_t, uint64_t addr,
                      uint64_t key, void* context) {
  iovec v{const_cast<void*>(buf), len};
  return rma_common(as_ep(e), UFAB_WR_RDMA_WRITE_WITH_IMM, &v, &desc, 1, addr, key, context, as_ep(e)->tx_op_flags,
                    data, false);
}
ssize_t rma_injectdata(fid_ep* e, const void* buf, size_t len, uint64_t data, fi_addr_t, uint64_t addr,
                       uint64_t key) {
  iovec v{const_cast<void*>(buf), len};
  return rma_common(as_ep(e), UFAB_WR_RDMA_WRITE_WITH_IMM, &v, nullptr, 1, addr, key, nullptr, 0, data, true);
}

fi_ops_rma g_rma_ops = {sizeof(fi_ops_rma), rma_read,    rma_readv,   rma_readmsg,   rma_write, rma_writev,
                        rma_writemsg,       rma_inject,  rma_writedata, rma_injectdata};

// ---------------------------------------------------------------- atomics
// The verbs atomics: 64-bit fetch-and-add (FI_SUM; FI_ATOMIC_READ as an
// add of 0) and compare-and-swap (FI_CSWAP), one element, fetching.

bool atomic_type_ok(fi_datatype dt) { return dt == FI_UINT64 || dt == FI_INT64; }

ssize_t at_write(fid_ep*, const void*, size_t, void*, fi_addr_t, uint64_t, uint64_t, fi_datatype, fi_op, void*) {
  return -FI_EOPNOTSUPP;
}
ssize_t at_writev(fid_ep*, const fi_ioc*, void**, size_t, fi_addr_t, uint64_t, uint64_t, fi_datatype, fi_op, void*) {
  return -FI_EOPNOTSUPP;
}
ssize_t at_writemsg(fid_ep*, const fi_msg_atomic*, uint64_t) { return -FI_EOPNOTSUPP; }
ssize_t at_inject(fid_ep*, const void*, size_t, fi_addr_t, uint64_t, uint64_t, fi_datatype, fi_op) {
  return -FI_EOPNOTSUPP;
}

ssize_t fetch_common(Ep* ep, const void* operand, void* result, void* result_desc, uint64_t addr, uint64_t key,
                     fi_datatype dt, fi_op op, void* context, uint64_t flags, const void* compare) {
  if (ep->type != FI_EP_MSG || !ep->dom->dev->has_atomics()) return -FI_EOPNOTSUPP;
  if (!atomic_type_ok(dt)) return -FI_EOPNOTSUPP;
  iovec v{result, 8};
  Post p;
  p.iov = &v;
  p.desc = &result_desc;
  p.count = 1;
  p.raddr = addr;
  p.rkey = key;
  p.context = context;
  p.flags = flags;
  if (compare != nullptr) {
    if (op != FI_CSWAP) return -FI_EOPNOTSUPP;
    p.opcode = UFAB_WR_ATOMIC_CMP_AND_SWP;
    std::memcpy(&p.compare, compare, 8);
    std::memcpy(&p.swap, operand, 8);
  } else if (op == FI_SUM) {
    p.opcode = UFAB_WR_ATOMIC_FETCH_AND_ADD;
    std::memcpy(&p.compare, operand, 8);
  } else if (op == FI_ATOMIC_READ) {
    p.opcode = UFAB_WR_ATOMIC_FETCH_AND_ADD;
    p.compare = 0;
  } else {
    return -FI_EOPNOTSUPP;
  }
  return post_send(ep, p);
}

ssize_t at_readwrite(fid_ep* e, const void* buf, size_t count, void*, void* result, void* result_desc, fi_addr_t,
                     uint64_t addr, uint64_t key, fi_datatype dt, fi_op op, void* context) {
  if (count != 1) return -FI_EINVAL;
  return fetch_common(as_ep(e), buf, result, result_desc, addr, key, dt, op, context, as_ep(e)->tx_op_flags,
                      nullptr);
}
ssize_t at_readwritev(fid_ep* e, const fi_ioc* iov, void** desc, size_t count, fi_ioc* resultv, void** result_desc,
                      size_t result_count, fi_addr_t, uint64_t addr, uint64_t key, fi_datatype dt, fi_op op,
                      void* context) {
  (void)desc;
  if (count != 1 || result_count != 1 || iov[0].count != 1 || resultv[0].count != 1) return -FI_EINVAL;
  return fetch_common(as_ep(e), iov[0].addr, resultv[0].addr, result_desc != nullptr ? result_desc[0] : nullptr, addr,
                      key, dt, op, context, as_ep(e)->tx_op_flags, nullptr);
}
ssize_t at_readwritemsg(fid_ep* e, const fi_msg_atomic* msg, fi_ioc* resultv, void** result_desc, size_t result_count,
                        uint64_t flags) {
  if (msg->iov_count != 1 || result_count != 1 || msg->rma_iov_count != 1 || msg->msg_iov[0].count != 1) return -FI_EINVAL;
  return fetch_common(as_ep(e), msg->msg_iov[0].addr, resultv[0].addr,
                      result_desc != nullptr ? result_desc[0] : nullptr, msg->rma_iov[0].addr, msg->rma_iov[0].key,
                      msg->datatype, msg->op, msg->context, flags, nullptr);
}
ssize_t at_compwrite(fid_ep* e, const void* buf, size_t count, void*, const void* compare, void*, void* result,
                     void* result_desc, fi_addr_t, uint64_t addr, uint64_t key, fi_datatype dt, fi_op op,
                     void* context) {
  if (count != 1) return -FI_EINVAL;
  return fetch_common(as_ep(e), buf, result, result_desc, addr, key, dt, op, context, as_ep(e)->tx_op_flags, compare);
}
ssize_t at_compwritev(fid_ep* e, const fi_ioc* iov, void**, size_t count, const fi_ioc* comparev, void**,
                      size_t compare_count, fi_ioc* resultv, void** result_desc, size_t result_count, fi_addr_t,
                      uint64_t addr, uint64_t key, fi_datatype dt, fi_op op, void* context) {
  if (count != 1 || compare_count != 1 || result_count != 1) return -FI_EINVAL;
  return fetch_common(as_ep(e), iov[0].addr, resultv[0].addr, result_desc != nullptr ? result_desc[0] : nullptr, addr,
                      key, dt, op, context, as_ep(e)->tx_op_flags, comparev[0].addr);
}
ssize_t at_compwritemsg(fid_ep* e, const fi_msg_atomic* msg, const fi_ioc* comparev, void**, size_t compare_count,
                        fi_ioc* resultv, void** result_desc, size_t result_count, uint64_t flags) {
  if (msg->iov_count != 1 || compare_count != 1 || result_count != 1 || msg->rma_iov_count != 1) return -FI_EINVAL;
  return fetch_common(as_ep(e), msg->msg_iov[0].addr, resultv[0].addr,
                      result_desc != nullptr ? result_desc[0] : nullptr, msg->rma_iov[0].addr, msg->rma_iov[0].key,
                      msg->datatype, msg->op, msg->context, flags, comparev[0].addr);
}
int at_writevalid(fid_ep*, fi_datatype, fi_op, size_t*) { return -FI_EOPNOTSUPP; }
int at_readwritevalid(fid_ep* e, fi_datatype dt, fi_op op, size_t* count) {
  if (!as_ep(e)->dom->dev->has_atomics() || !atomic_type_ok(dt) || (op != FI_SUM && op != FI_ATOMIC_READ))
    return -FI_EOPNOTSUPP;
  *count = 1;
  return 0;
}
int at_compwritevalid(fid_ep* e, fi_datatype dt, fi_op op, size_t* count) {
  if (!as_ep(e)->dom->dev->has_atomics() || !atomic_type_ok(dt) || op != FI_CSWAP) return -FI_EOPNOTSUPP;
  *count = 1;
  return 0;
}

fi_ops_atomic g_atomic_ops = {sizeof(fi_ops_atomic), at_write,        at_writev,       at_writemsg,
                              at_inject,             at_readwrite,    at_readwritev,   at_readwritemsg,
                              at_compwrite,          at_compwritev,   at_compwritemsg, at_writevalid,
                              at_readwritevalid,     at_compwritevalid};

// -------------------------------------------------------------------- cm

int ep_getname(fid_t f, void* addr, size_t* addrlen) {
  auto* ep = reinterpret_cast<Ep*>(f);
  size_t have = *addrlen;
  if (ep->type == FI_EP_DGRAM) {
    if (ep->qp == nullptr) return -FI_EOPBADSTATE;  // the QP number comes with fi_enable
    std::string n = ud_name(ep->dom->dev->ip, ufab_qp_num(ep->qp));
    *addrlen = n.size() + 1;
    if (have < n.size() + 1) return -FI_ETOOSMALL;
    std::memcpy(addr, n.c_str(), n.size() + 1);
    return 0;
  }
  *addrlen = sizeof(sockaddr_in);
  if (have < sizeof(sockaddr_in)) return -FI_ETOOSMALL;
  sockaddr_in s = ep->local;
  if (s.sin_family == 0) {
    s.sin_family = AF_INET;
    s.sin_addr.s_addr = htonl(ep->dom->dev->ip);
  }
  std::memcpy(addr, &s, sizeof s);
  return 0;
}
int ep_setname(fid_t, void*, size_t) { return -FI_ENOSYS; }
int ep_getpeer(fid_ep* e, void* addr, size_t* addrlen) {
  Ep* ep = as_ep(e);
  if (ep->type != FI_EP_MSG) return -FI_EOPNOTSUPP;
  size_t have = *addrlen;
  *addrlen = sizeof(sockaddr_in);
  if (have < sizeof(sockaddr_in)) return -FI_ETOOSMALL;
  if (ep->peer.sin_family == 0) return -FI_ENOTCONN;
  std::memcpy(addr, &ep->peer, sizeof ep->peer);
  return 0;
}
int ep_connect(fid_ep* e, const void* addr, const void* param, size_t len) {
  Ep* ep = as_ep(e);
  if (ep->type != FI_EP_MSG) return -FI_EOPNOTSUPP;
  if (!ep->enabled) return -FI_EOPBADSTATE;
  if (ep->eq == nullptr) return -FI_ENOEQ;
  auto* s = static_cast<const sockaddr_in*>(addr);
  if (s == nullptr || s->sin_family != AF_INET) return -FI_EINVAL;
  return cm_connect(ep, *s, param, len);
}
int ep_listen(fid_pep*) { return -FI_ENOSYS; }
int ep_accept(fid_ep* e, const void* param, size_t len) {
  Ep* ep = as_ep(e);
  if (!ep->enabled) return -FI_EOPBADSTATE;
  if (ep->eq == nullptr) return -FI_ENOEQ;
  return cm_accept(ep, param, len);
}
int ep_reject(fid_pep*, fid_t, const void*, size_t) { return -FI_ENOSYS; }
int ep_shutdown(fid_ep* e, uint64_t) { return cm_shutdown(as_ep(e)); }
int ep_join(fid_ep*, const void*, uint64_t, fid_mc**, void*) { return -FI_ENOSYS; }

fi_ops_cm g_ep_cm_ops = {sizeof(fi_ops_cm), ep_setname, ep_getname, ep_getpeer, ep_connect,
                         ep_listen,         ep_accept,  ep_reject,  ep_shutdown, ep_join};

// --------------------------------------------------------------- fi_ops_ep

ssize_t ep_cancel(fid_t, void*) { return -FI_ENOENT; }  // posted work cannot be taken back
int ep_getopt(fid_t f, int level, int optname, void* optval, size_t* optlen) {
  auto* ep = reinterpret_cast<Ep*>(f);
  if (level != FI_OPT_ENDPOINT) return -FI_ENOPROTOOPT;
  if (optname == FI_OPT_CM_DATA_SIZE && ep->type == FI_EP_MSG) {
    if (*optlen < sizeof(size_t)) return -FI_ETOOSMALL;
    *static_cast<size_t*>(optval) = kConnectDataMax;
    *optlen = sizeof(size_t);
    return 0;
  }
  if (optname == FI_OPT_FI_HMEM_P2P && ep->dom->dev->has_hmem()) {
    if (*optlen < sizeof(int)) return -FI_ETOOSMALL;
    *static_cast<int*>(optval) = ep->hmem_p2p;
    *optlen = sizeof(int);
    return 0;
  }
  return -FI_ENOPROTOOPT;
}
// FI_OPT_FI_HMEM_P2P: ufab never lets a NIC touch GPU memory (every byte
// is staged through host memory), so P2P can be allowed, preferred or
// disabled, but not required.
int ep_setopt(fid_t f, int level, int optname, const void* optval, size_t optlen) {
  auto* ep = reinterpret_cast<Ep*>(f);
  if (level != FI_OPT_ENDPOINT) return -FI_ENOPROTOOPT;
  if (optname == FI_OPT_FI_HMEM_P2P && ep->dom->dev->has_hmem()) {
    if (optval == nullptr || optlen != sizeof(int)) return -FI_EINVAL;
    int v = *static_cast<const int*>(optval);
    if (v == FI_HMEM_P2P_REQUIRED) return -FI_EOPNOTSUPP;
    if (v != FI_HMEM_P2P_ENABLED && v != FI_HMEM_P2P_PREFERRED && v != FI_HMEM_P2P_DISABLED) return -FI_EINVAL;
    ep->hmem_p2p = v;
    return 0;
  }
  return -FI_ENOPROTOOPT;
}
ssize_t ep_rx_size_left(fid_ep*) { return -FI_ENOSYS; }
ssize_t ep_tx_size_left(fid_ep*) { return -FI_ENOSYS; }

fi_ops_ep g_ep_ops = {sizeof(fi_ops_ep), ep_cancel, ep_getopt, ep_setopt, nullptr, nullptr, ep_rx_size_left,
                      ep_tx_size_left};

// ------------------------------------------------------ bind, enable, close

int ep_bind(fid* f, fid* b, uint64_t flags) {
  auto* ep = reinterpret_cast<Ep*>(f);
  if (ep->enabled && b->fclass != FI_CLASS_EQ) return -FI_EOPBADSTATE;
  switch (b->fclass) {
    case FI_CLASS_CQ: {
      auto* cq = reinterpret_cast<Cq*>(b);
      if (cq->dom != ep->dom) return -FI_EINVAL;
      if ((flags & FI_TRANSMIT) != 0) {
        if (ep->txcq != nullptr) return -FI_EINVAL;
        ep->txcq = cq;
        ep->tx_selective = (flags & FI_SELECTIVE_COMPLETION) != 0;
        cq->refs++;
      }
      if ((flags & FI_RECV) != 0) {
        if (ep->rxcq != nullptr) return -FI_EINVAL;
        ep->rxcq = cq;
        ep->rx_selective = (flags & FI_SELECTIVE_COMPLETION) != 0;
        cq->refs++;
      }
      return 0;
    }
    case FI_CLASS_CNTR: {
      auto* k = reinterpret_cast<Cntr*>(b);
      if ((flags & (FI_REMOTE_READ | FI_REMOTE_WRITE)) != 0) return -FI_EOPNOTSUPP;  // no FI_RMA_EVENT
      auto set = [&](Cntr*& slot, uint64_t bit) {
        if ((flags & bit) == 0) return;
        if (slot != nullptr) slot->refs--;
        slot = k;
        k->refs++;
      };
      set(ep->send_cntr, FI_SEND);
      set(ep->recv_cntr, FI_RECV);
      set(ep->read_cntr, FI_READ);
      set(ep->write_cntr, FI_WRITE);
      return 0;
    }
    case FI_CLASS_EQ: {
      if (ep->type != FI_EP_MSG) return -FI_EINVAL;
      auto* eq = reinterpret_cast<Eq*>(b);
      if (ep->eq != nullptr) ep->eq->refs--;
      ep->eq = eq;
      eq->refs++;
      return 0;
    }
    case FI_CLASS_AV: {
      if (ep->type != FI_EP_DGRAM) return -FI_EINVAL;
      auto* av = reinterpret_cast<Av*>(b);
      if (ep->av != nullptr) return -FI_EINVAL;
      ep->av = av;
      av->refs++;
      return 0;
    }
    default: return -FI_EINVAL;
  }
}

int own_ucq(Ep* ep, UCq* u, uint32_t depth) {
  if (depth > ep->dom->dev->attr.max_cqe) depth = ep->dom->dev->attr.max_cqe;
  int rc = ufab_cq_create(ep->dom->dev->dev, depth, &u->ucq);
  if (rc != 0) return neg(-rc);
  std::lock_guard<std::mutex> lk(ep->dom->mu);
  ep->dom->ucqs.insert(u);
  return 0;
}

int ep_enable(Ep* ep) {
  if (ep->enabled) return 0;
  if (ep->type == FI_EP_MSG && ep->eq == nullptr) return -FI_ENOEQ;
  if (ep->type == FI_EP_DGRAM && ep->av == nullptr) return -FI_ENOAV;
  const ufab_device_attr& a = ep->dom->dev->attr;
  uint32_t tx = static_cast<uint32_t>(ep->info->tx_attr->size), rx = static_cast<uint32_t>(ep->info->rx_attr->size);
  if (tx == 0 || tx > a.max_qp_wr) tx = a.max_qp_wr;
  if (rx == 0 || rx > a.max_qp_wr) rx = a.max_qp_wr;
  if (ep->txcq != nullptr) {
    ep->tx_u = &ep->txcq->u;
  } else {
    if (int rc = own_ucq(ep, &ep->own_tx, tx); rc != 0) return rc;
    ep->tx_u = &ep->own_tx;
  }
  if (ep->rxcq != nullptr) {
    ep->rx_u = &ep->rxcq->u;
  } else {
    if (int rc = own_ucq(ep, &ep->own_rx, rx); rc != 0) return rc;
    ep->rx_u = &ep->own_rx;
  }
  ufab_qp_init_attr init{};
  init.qp_type = ep->type == FI_EP_MSG ? UFAB_QPT_RC : UFAB_QPT_UD;
  init.send_cq = ep->tx_u->ucq;
  init.recv_cq = ep->rx_u->ucq;
  init.cap.max_send_wr = tx;
  init.cap.max_recv_wr = rx;
  init.cap.max_send_sge = ep->max_sge;
  init.cap.max_recv_sge = ep->max_sge;
  init.cap.max_inline_data = ep->max_inline;
  int rc = ufab_qp_create(ep->dom->dev->pd, &init, &ep->qp);
  if (rc != 0) return neg(-rc);
  if (ep->type == FI_EP_MSG) {
    // INIT, so receives may be posted before the connection is up.
    ufab_qp_attr qa{};
    qa.state = UFAB_QPS_INIT;
    qa.pkey_index = 0;
    qa.port = 1;
    // FLUSH rights where the device has them: the peer's FI_COMMIT_COMPLETE
    // writes flush our persistent regions (the regions say which).
    qa.access_flags = UFAB_ACCESS_LOCAL_WRITE | UFAB_ACCESS_REMOTE_WRITE | UFAB_ACCESS_REMOTE_READ |
                      (ep->dom->dev->has_atomics() ? uint32_t{UFAB_ACCESS_REMOTE_ATOMIC} : 0u) |
                      ((a.caps & UFAB_DEVICE_CAP_FLUSH_GLOBAL) != 0 ? uint32_t{UFAB_ACCESS_FLUSH_GLOBAL} : 0u) |
                      (ep->dom->dev->has_pmem() ? uint32_t{UFAB_ACCESS_FLUSH_PERSISTENT} : 0u);
    rc = ufab_qp_modify(ep->qp, &qa, UFAB_QP_STATE | UFAB_QP_PKEY_INDEX | UFAB_QP_PORT | UFAB_QP_ACCESS_FLAGS);
  } else {
    ufab_conn self{};
    self.ip = ep->dom->dev->ip;
    ufab_qp_attr tuning;
    ufab_qp_attr_defaults(&tuning);
    tuning.qkey = kUdQkey;
    rc = ufab_qp_connect(ep->qp, &self, &tuning);
  }
  if (rc != 0) {
    ufab_qp_destroy(ep->qp);
    ep->qp = nullptr;
    return neg(-rc);
  }
  ep->enabled = true;
  return 0;
}

int ep_control(fid* f, int command, void* arg) {
  auto* ep = reinterpret_cast<Ep*>(f);
  switch (command) {
    case FI_ENABLE: return ep_enable(ep);
    case FI_GETOPSFLAG: {
      auto* flags = static_cast<uint64_t*>(arg);
      if ((*flags & FI_TRANSMIT) != 0)
        *flags = ep->tx_op_flags;
      else if ((*flags & FI_RECV) != 0)
        *flags = ep->rx_op_flags;
      else
        return -FI_EINVAL;
      return 0;
    }
    case FI_SETOPSFLAG: {
      uint64_t flags = *static_cast<uint64_t*>(arg);
      if ((flags & FI_TRANSMIT) != 0)
        ep->tx_op_flags = flags & ~(FI_TRANSMIT | FI_RECV);
      else if ((flags & FI_RECV) != 0)
        ep->rx_op_flags = flags & ~(FI_TRANSMIT | FI_RECV);
      else
        return -FI_EINVAL;
      return 0;
    }
    default: return -FI_ENOSYS;
  }
}

int ep_close(fid* f) {
  auto* ep = reinterpret_cast<Ep*>(f);
  // Let the device send what it owes the peer (a coalesced ACK of the last
  // message received) before the QP goes: otherwise the peer's last SEND
  // stays unacknowledged and ends flushed by our disconnect, which ofi_rxm
  // does not report (seen as a peer hanging at the end of fi_pingpong).
  if (ep->qp != nullptr)
    for (int i = 0; i < 4; i++) ufab_device_progress(ep->dom->dev->dev);
  cm_forget_ep(ep);
  {
    std::lock_guard<std::mutex> lk(ep->dom->mu);
    for (Op* op : ep->ops) op->ep = nullptr;  // completions still queued are dropped
    ep->ops.clear();
  }
  if (ep->qp != nullptr) ufab_qp_destroy(ep->qp);
  for (UCq* u : {&ep->own_tx, &ep->own_rx}) {
    if (u->ucq == nullptr) continue;
    {
      std::lock_guard<std::mutex> lk(ep->dom->mu);
      ep->dom->ucqs.erase(u);
      // Drain what is there (their ops are orphaned) before the CQ goes.
      ufab_wc wc[32];
      int n;
      while ((n = ufab_cq_poll(u->ucq, wc, 32)) > 0)
        for (int i = 0; i < n; i++) handle_wc(ep->dom, u, wc[i], nullptr);
    }
    ufab_cq_destroy(u->ucq);
  }
  if (ep->txcq != nullptr) ep->txcq->refs--;
  if (ep->rxcq != nullptr) ep->rxcq->refs--;
  for (Cntr* k : {ep->send_cntr, ep->recv_cntr, ep->read_cntr, ep->write_cntr})
    if (k != nullptr) k->refs--;
  if (ep->eq != nullptr) ep->eq->refs--;
  if (ep->av != nullptr) ep->av->refs--;
  ep->dom->refs--;
  fi_freeinfo(ep->info);
  delete ep;
  return 0;
}

fi_ops g_ep_fi_ops = {sizeof(fi_ops), ep_close, ep_bind, ep_control, no_ops_open, nullptr, nullptr};

}  // namespace

int ep_open(fid_domain* domain, fi_info* info, fid_ep** out, void* context) {
  if (info == nullptr || info->ep_attr == nullptr) return -FI_EINVAL;
  auto* d = reinterpret_cast<Domain*>(domain);
  fi_ep_type type = info->ep_attr->type;
  if (type != FI_EP_MSG && type != FI_EP_DGRAM) return -FI_EINVAL;
  if (type == FI_EP_MSG && !d->dev->has_msg()) return -FI_EOPNOTSUPP;
  if (type == FI_EP_DGRAM && !d->dev->has_ud()) return -FI_EOPNOTSUPP;
  if (info->ep_attr->rx_ctx_cnt == FI_SHARED_CONTEXT || info->ep_attr->tx_ctx_cnt == FI_SHARED_CONTEXT)
    return -FI_EOPNOTSUPP;
  auto* ep = new Ep;
  ep->dom = d;
  ep->info = fi_dupinfo(info);
  ep->type = type;
  ep->max_inline = d->dev->attr.max_inline_data;
  if (info->tx_attr != nullptr && info->tx_attr->inject_size < ep->max_inline)
    ep->max_inline = static_cast<uint32_t>(info->tx_attr->inject_size);
  ep->max_sge = d->dev->attr.max_sge < UFAB_MAX_SGE ? d->dev->attr.max_sge : UFAB_MAX_SGE;
  if (info->tx_attr != nullptr) ep->tx_op_flags = info->tx_attr->op_flags;
  if (info->rx_attr != nullptr) ep->rx_op_flags = info->rx_attr->op_flags;
  if (info->handle != nullptr && info->handle->fclass == FI_CLASS_CONNREQ) {
    ep->connreq = reinterpret_cast<ConnReq*>(info->handle);
    ep->info->handle = nullptr;
  }
  ep->ep.fid.fclass = FI_CLASS_EP;
  ep->ep.fid.context = context;
  ep->ep.fid.ops = &g_ep_fi_ops;
  ep->ep.ops = &g_ep_ops;
  ep->ep.cm = &g_ep_cm_ops;
  ep->ep.msg = &g_msg_ops;
  ep->ep.rma = &g_rma_ops;
  ep->ep.atomic = &g_atomic_ops;
  d->refs++;
  cm_register_ep(ep);
  *out = &ep->ep;
  return 0;
}

}  // namespace ufab_fi
