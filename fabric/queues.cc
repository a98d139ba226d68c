// Completion queues, counters, event queues and address vectors.
#include <arpa/inet.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "fabric/provider.h"

namespace ufab_fi {

int wc_status_to_fi(uint32_t status) {
  switch (status) {
    case UFAB_WC_SUCCESS: return 0;
    case UFAB_WC_LOC_LEN_ERR: return FI_ETRUNC;
    case UFAB_WC_WR_FLUSH_ERR: return FI_ECANCELED;
    case UFAB_WC_LOC_PROT_ERR:
    case UFAB_WC_LOC_ACCESS_ERR:
    case UFAB_WC_REM_ACCESS_ERR: return FI_EACCES;
    case UFAB_WC_REM_INV_REQ_ERR: return FI_EINVAL;
    case UFAB_WC_REM_OP_ERR: return FI_EREMOTEIO;
    case UFAB_WC_RETRY_EXC_ERR: return FI_ETIMEDOUT;
    case UFAB_WC_RNR_RETRY_EXC_ERR: return FI_ENORX;
    default: return FI_EIO;
  }
}

namespace {

int no_ops_open(fid*, const char*, uint64_t, void**, void*) { return -FI_ENOSYS; }
int no_bind(fid*, fid*, uint64_t) { return -FI_ENOSYS; }

size_t entry_size(fi_cq_format f) {
  switch (f) {
    case FI_CQ_FORMAT_UNSPEC:
    case FI_CQ_FORMAT_CONTEXT: return sizeof(fi_cq_entry);
    case FI_CQ_FORMAT_MSG: return sizeof(fi_cq_msg_entry);
    case FI_CQ_FORMAT_DATA: return sizeof(fi_cq_data_entry);
    case FI_CQ_FORMAT_TAGGED: return sizeof(fi_cq_tagged_entry);
  }
  return sizeof(fi_cq_entry);
}

// The source IPv4 address of a UD receive, from the IPv4 header in the
// last 20 bytes of its GRH area (RoCEv2).
uint32_t grh_source_ip(const void* buf) {
  uint32_t be;
  std::memcpy(&be, static_cast<const uint8_t*>(buf) + 20 + 12, 4);
  return ntohl(be);
}

}  // namespace

// ---------------------------------------------------------- work completions

void handle_wc(Domain* dom, UCq* u, const ufab_wc& wc, const char* detail) {
  Op* op = reinterpret_cast<Op*>(static_cast<uintptr_t>(wc.wr_id));
  if (op->quiet) {  // unsignaled: only a failure has a completion
    Cq* cq = u->owner;
    if (cq == nullptr || wc.status == UFAB_WC_SUCCESS) return;
    CqEntry e;
    e.e.flags = op->flags;
    e.is_err = true;
    e.err = wc_status_to_fi(wc.status);
    e.prov_errno = static_cast<int>(wc.status);
    e.detail = detail != nullptr && *detail != '\0' ? detail : ufab_wc_status_str(wc.status);
    cq->q.push_back(std::move(e));
    cq->qlen.store(cq->q.size(), std::memory_order_release);
    return;
  }
  if (u->inflight != 0) u->inflight--;
  Ep* ep = op->ep;
  if (ep == nullptr) {  // its endpoint is gone
    dom->put_op(op);
    return;
  }
  ep->ops.erase(op);
  bool ok = wc.status == UFAB_WC_SUCCESS;
  if (op->cntr != nullptr) {
    if (ok)
      op->cntr->value++;
    else
      op->cntr->errors++;
  }
  Cq* cq = u->owner;
  // Errors always reach the CQ (flushes of an endpoint going down too).
  if (cq != nullptr && (op->want_cq || !ok)) {
    CqEntry e;
    e.e.op_context = op->context;
    e.e.flags = op->flags;
    bool is_recv = (op->flags & FI_RECV) != 0;
    if (is_recv) {
      e.e.len = wc.byte_len;
      if ((wc.wc_flags & UFAB_WC_WITH_IMM) != 0) {
        e.e.flags |= FI_REMOTE_CQ_DATA;
        e.e.data = wc.imm_data;
      }
      if (wc.opcode == UFAB_WC_RECV_RDMA_WITH_IMM) e.e.flags = FI_RMA | FI_REMOTE_WRITE | FI_REMOTE_CQ_DATA;
      if (ep->type == FI_EP_DGRAM && ok && ep->av != nullptr && op->buf != nullptr)
        e.src = ep->av->reverse(grh_source_ip(op->buf), wc.src_qp);
    }
    if (!ok) {
      e.is_err = true;
      e.err = wc_status_to_fi(wc.status);
      e.prov_errno = static_cast<int>(wc.status);
      e.detail = detail != nullptr && *detail != '\0' ? detail : ufab_wc_status_str(wc.status);
      e.e.len = 0;
    }
    cq->q.push_back(std::move(e));
    cq->qlen.store(cq->q.size(), std::memory_order_release);
  }
  dom->put_op(op);
}

int poll_ucq_locked(Domain* dom, UCq* u) {
  ufab_wc wc[kPollBatch];
  int n = ufab_cq_poll(u->ucq, wc, kPollBatch);
  if (n <= 0) return 0;
  for (int i = 0; i < n; i++)
    handle_wc(dom, u, wc[i], wc[i].status != UFAB_WC_SUCCESS ? ufab_cq_wc_detail(u->ucq, &wc[i]) : nullptr);
  return n;
}

int poll_ucq(Domain* dom, UCq* u) {
  std::lock_guard<std::mutex> lk(dom->mu);
  return poll_ucq_locked(dom, u);
}

// ---------------------------------------------------------------------- CQ

namespace {

// dom->mu held.
ssize_t cq_take_locked(Cq* cq, void* buf, size_t count, fi_addr_t* src) {
  if (cq->q.empty()) return -FI_EAGAIN;
  if (cq->q.front().is_err) return -FI_EAVAIL;
  size_t sz = entry_size(cq->format);
  size_t n = 0;
  auto* out = static_cast<uint8_t*>(buf);
  while (n < count && !cq->q.empty() && !cq->q.front().is_err) {
    CqEntry& e = cq->q.front();
    std::memcpy(out + n * sz, &e.e, sz);
    if (src != nullptr) src[n] = e.src;
    cq->q.pop_front();
    n++;
  }
  cq->qlen.store(cq->q.size(), std::memory_order_release);
  return static_cast<ssize_t>(n);
}

ssize_t cq_take(Cq* cq, void* buf, size_t count, fi_addr_t* src) {
  if (cq->qlen.load(std::memory_order_acquire) == 0) return -FI_EAGAIN;
  std::lock_guard<std::mutex> lk(cq->dom->mu);
  return cq_take_locked(cq, buf, count, src);
}

// Manual progress: a read drives the device through its own ufab CQ and,
// when that found work, empties the domain's other ufab CQs that expect
// completions (UCq::inflight), and every 64th read all of them (a quiet
// operation's error). An application that never reads a CQ its signaled
// operations complete into (a send counter only) would otherwise let that
// ufab CQ fill up, and a full ufab CQ sends its QP to ERROR.
ssize_t cq_readfrom(fid_cq* c, void* buf, size_t count, fi_addr_t* src) {
  auto* cq = reinterpret_cast<Cq*>(c);
  ssize_t r = cq_take(cq, buf, count, src);
  if (r != -FI_EAGAIN) return r;
  std::lock_guard<std::mutex> lk(cq->dom->mu);
  int n = poll_ucq_locked(cq->dom, &cq->u);
  const bool all = (++cq->reads & 63) == 0;
  if (n > 0 || all)
    for (UCq* u : cq->dom->ucqs)
      if (u != &cq->u && (all || u->inflight != 0))
        while (poll_ucq_locked(cq->dom, u) == kPollBatch) {
        }
  if (n == 0) return -FI_EAGAIN;
  return cq_take_locked(cq, buf, count, src);  // under the same lock
}

ssize_t cq_read(fid_cq* c, void* buf, size_t count) { return cq_readfrom(c, buf, count, nullptr); }

ssize_t cq_readerr(fid_cq* c, fi_cq_err_entry* buf, uint64_t flags) {
  (void)flags;
  auto* cq = reinterpret_cast<Cq*>(c);
  std::lock_guard<std::mutex> lk(cq->dom->mu);
  if (cq->q.empty() || !cq->q.front().is_err) return -FI_EAGAIN;
  CqEntry& e = cq->q.front();
  void* user_data = buf->err_data;
  size_t user_size = buf->err_data_size;
  buf->op_context = e.e.op_context;
  buf->flags = e.e.flags;
  buf->len = e.e.len;
  buf->buf = e.e.buf;
  buf->data = e.e.data;
  buf->tag = 0;
  buf->olen = 0;
  buf->err = e.err;
  buf->prov_errno = e.prov_errno;
  cq->last_err = e.detail;
  // API 1.5 and later: the caller's buffer if it gave one, else ours.
  if (user_size > 0 && user_data != nullptr) {
    size_t n = std::min(user_size, cq->last_err.size() + 1);
    std::memcpy(user_data, cq->last_err.c_str(), n);
    static_cast<char*>(user_data)[n - 1] = '\0';
    buf->err_data_size = n;
  } else {
    buf->err_data = const_cast<char*>(cq->last_err.c_str());
    buf->err_data_size = cq->last_err.size() + 1;
  }
  cq->q.pop_front();
  cq->qlen.store(cq->q.size(), std::memory_order_release);
  return 1;
}

ssize_t cq_sreadfrom(fid_cq* c, void* buf, size_t count, fi_addr_t* src, const void* cond, int timeout) {
  (void)cond;
  auto* cq = reinterpret_cast<Cq*>(c);
  if (cq->wait_obj == FI_WAIT_NONE) return -FI_EINVAL;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout < 0 ? 0 : timeout);
  for (;;) {
    ssize_t r = cq_readfrom(c, buf, count, src);
    if (r != -FI_EAGAIN) return r;
    if (cq->signaled.exchange(false)) return -FI_ECANCELED;
    int left = -1;
    if (timeout >= 0) {
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
      if (ms <= 0) return -FI_EAGAIN;
      left = static_cast<int>(ms);
    }
    // Wait in slices so fi_cq_signal is seen.
    int slice = left < 0 || left > 100 ? 100 : left;
    ufab_wc wc[16];
    int n = ufab_cq_wait(cq->u.ucq, wc, 16, slice);
    if (n > 0) {
      std::lock_guard<std::mutex> lk(cq->dom->mu);
      for (int i = 0; i < n; i++)
        handle_wc(cq->dom, &cq->u, wc[i],
                  wc[i].status != UFAB_WC_SUCCESS ? ufab_cq_wc_detail(cq->u.ucq, &wc[i]) : nullptr);
    }
  }
}

ssize_t cq_sread(fid_cq* c, void* buf, size_t count, const void* cond, int timeout) {
  return cq_sreadfrom(c, buf, count, nullptr, cond, timeout);
}

int cq_signal(fid_cq* c) {
  reinterpret_cast<Cq*>(c)->signaled = true;
  return 0;
}

const char* cq_strerror(fid_cq*, int prov_errno, const void* err_data, char* buf, size_t len) {
  const char* s = err_data != nullptr ? static_cast<const char*>(err_data) : ufab_wc_status_str(prov_errno);
  if (buf != nullptr && len > 0) {
    std::snprintf(buf, len, "%s", s);
    return buf;
  }
  return s;
}

int cq_close(fid* f) {
  auto* cq = reinterpret_cast<Cq*>(f);
  if (cq->refs.load() != 0) return -FI_EBUSY;
  {
    std::lock_guard<std::mutex> lk(cq->dom->mu);
    cq->dom->ucqs.erase(&cq->u);
  }
  int rc = ufab_cq_destroy(cq->u.ucq);
  if (rc != 0) return -FI_EBUSY;
  cq->dom->refs--;
  delete cq;
  return 0;
}

int cq_control(fid* f, int command, void* arg) {
  auto* cq = reinterpret_cast<Cq*>(f);
  switch (command) {
    case FI_GETWAIT:
      if (cq->wait_obj != FI_WAIT_FD) return -FI_ENODATA;
      *static_cast<int*>(arg) = ufab_cq_event_fd(cq->u.ucq);
      // Armed here; the application reads the CQ before it waits (trywait).
      ufab_cq_req_notify(cq->u.ucq);
      return 0;
    case FI_GETWAITOBJ:
      *static_cast<fi_wait_obj*>(arg) = cq->wait_obj;
      return 0;
    default: return -FI_ENOSYS;
  }
}

fi_ops g_cq_fi_ops = {sizeof(fi_ops), cq_close, no_bind, cq_control, no_ops_open, nullptr, nullptr};
fi_ops_cq g_cq_ops = {sizeof(fi_ops_cq), cq_read,  cq_readfrom, cq_readerr, cq_sread,
                      cq_sreadfrom,      cq_signal, cq_strerror};

}  // namespace

int cq_open(fid_domain* domain, fi_cq_attr* attr, fid_cq** out, void* context) {
  auto* d = reinterpret_cast<Domain*>(domain);
  fi_cq_format format = attr != nullptr ? attr->format : FI_CQ_FORMAT_CONTEXT;
  if (format == FI_CQ_FORMAT_UNSPEC) format = FI_CQ_FORMAT_CONTEXT;
  fi_wait_obj w = attr != nullptr ? attr->wait_obj : FI_WAIT_NONE;
  if (w == FI_WAIT_UNSPEC) w = FI_WAIT_FD;
  if (w != FI_WAIT_NONE && w != FI_WAIT_FD) return -FI_ENOSYS;
  if (attr != nullptr && (attr->flags & FI_AFFINITY) != 0) return -FI_ENOSYS;
  uint32_t depth = attr != nullptr && attr->size != 0 ? static_cast<uint32_t>(attr->size) : 4096;
  if (depth > d->dev->attr.max_cqe) depth = d->dev->attr.max_cqe;
  auto* cq = new Cq;
  int rc = ufab_cq_create(d->dev->dev, depth, &cq->u.ucq);
  if (rc != 0) {
    delete cq;
    return neg(-rc);
  }
  cq->u.owner = cq;
  cq->dom = d;
  cq->format = format;
  cq->wait_obj = w;
  cq->cq.fid.fclass = FI_CLASS_CQ;
  cq->cq.fid.context = context;
  cq->cq.fid.ops = &g_cq_fi_ops;
  cq->cq.ops = &g_cq_ops;
  {
    std::lock_guard<std::mutex> lk(d->mu);
    d->ucqs.insert(&cq->u);
  }
  d->refs++;
  *out = &cq->cq;
  return 0;
}

// ------------------------------------------------------------------ counters

namespace {

uint64_t cntr_read(fid_cntr* c) {
  auto* k = reinterpret_cast<Cntr*>(c);
  k->dom->progress_all();
  return k->value.load();
}
uint64_t cntr_readerr(fid_cntr* c) {
  auto* k = reinterpret_cast<Cntr*>(c);
  k->dom->progress_all();
  return k->errors.load();
}
int cntr_add(fid_cntr* c, uint64_t v) {
  reinterpret_cast<Cntr*>(c)->value += v;
  return 0;
}
int cntr_set(fid_cntr* c, uint64_t v) {
  reinterpret_cast<Cntr*>(c)->value = v;
  return 0;
}
int cntr_adderr(fid_cntr* c, uint64_t v) {
  reinterpret_cast<Cntr*>(c)->errors += v;
  return 0;
}
int cntr_seterr(fid_cntr* c, uint64_t v) {
  reinterpret_cast<Cntr*>(c)->errors = v;
  return 0;
}
int cntr_wait(fid_cntr* c, uint64_t threshold, int timeout) {
  auto* k = reinterpret_cast<Cntr*>(c);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout);
  uint64_t errs = k->errors.load();
  for (;;) {
    k->dom->progress_all();
    if (k->value.load() >= threshold) return 0;
    if (k->errors.load() != errs) return -FI_EAVAIL;
    if (timeout >= 0 && std::chrono::steady_clock::now() >= deadline) return -FI_ETIMEDOUT;
    std::this_thread::yield();
  }
}
int cntr_close(fid* f) {
  auto* k = reinterpret_cast<Cntr*>(f);
  if (k->refs.load() != 0) return -FI_EBUSY;
  k->dom->refs--;
  delete k;
  return 0;
}
int cntr_control(fid* f, int command, void* arg) {
  (void)f;
  if (command == FI_GETWAITOBJ) {
    *static_cast<fi_wait_obj*>(arg) = FI_WAIT_NONE;
    return 0;
  }
  return -FI_ENOSYS;
}

fi_ops g_cntr_fi_ops = {sizeof(fi_ops), cntr_close, no_bind, cntr_control, no_ops_open, nullptr, nullptr};
fi_ops_cntr g_cntr_ops = {sizeof(fi_ops_cntr), cntr_read, cntr_readerr, cntr_add, cntr_set,
                          cntr_wait,           cntr_adderr, cntr_seterr};

}  // namespace

int cntr_open(fid_domain* domain, fi_cntr_attr* attr, fid_cntr** out, void* context) {
  if (attr != nullptr && attr->events != FI_CNTR_EVENTS_COMP) return -FI_ENOSYS;
  if (attr != nullptr && attr->wait_obj != FI_WAIT_NONE && attr->wait_obj != FI_WAIT_UNSPEC) return -FI_ENOSYS;
  auto* d = reinterpret_cast<Domain*>(domain);
  auto* k = new Cntr;
  k->dom = d;
  k->cntr.fid.fclass = FI_CLASS_CNTR;
  k->cntr.fid.context = context;
  k->cntr.fid.ops = &g_cntr_fi_ops;
  k->cntr.ops = &g_cntr_ops;
  d->refs++;
  *out = &k->cntr;
  return 0;
}

// ---------------------------------------------------------------------- EQ

void Eq::push(EqEntry e) {
  {
    std::lock_guard<std::mutex> lk(mu);
    q.push_back(std::move(e));
  }
  uint64_t one = 1;
  if (efd >= 0) (void)!::write(efd, &one, sizeof one);
  cv.notify_all();
}

namespace {

void eq_consume_fd(Eq* eq) {
  uint64_t v;
  if (eq->efd >= 0) (void)!::read(eq->efd, &v, sizeof v);
}

ssize_t eq_read(fid_eq* e, uint32_t* event, void* buf, size_t len, uint64_t flags) {
  auto* eq = reinterpret_cast<Eq*>(e);
  std::lock_guard<std::mutex> lk(eq->mu);
  if (eq->q.empty()) return -FI_EAGAIN;
  EqEntry& x = eq->q.front();
  if (x.is_err) return -FI_EAVAIL;
  // A CM entry's data may be cut short (the caller's buffer says how much
  // it wants); the entry itself may not.
  size_t min = x.bytes.size();
  if (x.event == FI_CONNREQ || x.event == FI_CONNECTED || x.event == FI_SHUTDOWN) min = sizeof(fi_eq_cm_entry);
  if (len < min) return -FI_ETOOSMALL;
  if (event != nullptr) *event = x.event;
  size_t n = std::min(len, x.bytes.size());
  std::memcpy(buf, x.bytes.data(), n);
  if ((flags & FI_PEEK) == 0) {
    eq->q.pop_front();
    eq_consume_fd(eq);
  }
  return static_cast<ssize_t>(n);
}

ssize_t eq_readerr(fid_eq* e, fi_eq_err_entry* buf, uint64_t flags) {
  auto* eq = reinterpret_cast<Eq*>(e);
  std::lock_guard<std::mutex> lk(eq->mu);
  if (eq->q.empty() || !eq->q.front().is_err) return -FI_EAGAIN;
  EqEntry& x = eq->q.front();
  void* user_data = buf->err_data;
  size_t user_size = buf->err_data_size;
  *buf = x.err;
  eq->last_err = x.err_data;
  if (eq->last_err.empty()) {
    buf->err_data = nullptr;
    buf->err_data_size = 0;
  } else if (user_size > 0 && user_data != nullptr) {
    size_t n = std::min(user_size, eq->last_err.size());
    std::memcpy(user_data, eq->last_err.data(), n);
    buf->err_data = user_data;
    buf->err_data_size = n;
  } else {
    buf->err_data = eq->last_err.data();
    buf->err_data_size = eq->last_err.size();
  }
  if ((flags & FI_PEEK) == 0) {
    eq->q.pop_front();
    eq_consume_fd(eq);
  }
  return sizeof(fi_eq_err_entry);
}

ssize_t eq_write(fid_eq* e, uint32_t event, const void* buf, size_t len, uint64_t) {
  auto* eq = reinterpret_cast<Eq*>(e);
  EqEntry x;
  x.event = event;
  x.bytes.assign(static_cast<const uint8_t*>(buf), static_cast<const uint8_t*>(buf) + len);
  eq->push(std::move(x));
  return static_cast<ssize_t>(len);
}

ssize_t eq_sread(fid_eq* e, uint32_t* event, void* buf, size_t len, int timeout, uint64_t flags) {
  auto* eq = reinterpret_cast<Eq*>(e);
  if (eq->wait_obj == FI_WAIT_NONE) return -FI_EINVAL;
  {
    std::unique_lock<std::mutex> lk(eq->mu);
    auto ready = [&] { return !eq->q.empty(); };
    if (timeout < 0)
      eq->cv.wait(lk, ready);
    else if (!eq->cv.wait_for(lk, std::chrono::milliseconds(timeout), ready))
      return -FI_EAGAIN;
  }
  return eq_read(e, event, buf, len, flags);
}

const char* eq_strerror(fid_eq*, int prov_errno, const void* err_data, char* buf, size_t len) {
  // prov_errno is the IBA REJ reason of a refused connection, else 0.
  std::string s = prov_errno != 0 ? "connection rejected by the peer: REJ reason " + std::to_string(prov_errno) + " (" +
                                        ufab_cm_reject_reason_str(static_cast<uint16_t>(prov_errno)) + ")"
                                  : "connection failed (no answer, or the peer gave up)";
  (void)err_data;
  if (buf != nullptr && len > 0) {
    std::snprintf(buf, len, "%s", s.c_str());
    return buf;
  }
  static thread_local std::string keep;
  keep = s;
  return keep.c_str();
}

int eq_close(fid* f) {
  auto* eq = reinterpret_cast<Eq*>(f);
  if (eq->refs.load() != 0) return -FI_EBUSY;
  if (eq->efd >= 0) ::close(eq->efd);
  delete eq;
  return 0;
}

int eq_control(fid* f, int command, void* arg) {
  auto* eq = reinterpret_cast<Eq*>(f);
  switch (command) {
    case FI_GETWAIT:
      if (eq->wait_obj != FI_WAIT_FD) return -FI_ENODATA;
      *static_cast<int*>(arg) = eq->efd;
      return 0;
    case FI_GETWAITOBJ:
      *static_cast<fi_wait_obj*>(arg) = eq->wait_obj;
      return 0;
    default: return -FI_ENOSYS;
  }
}

fi_ops g_eq_fi_ops = {sizeof(fi_ops), eq_close, no_bind, eq_control, no_ops_open, nullptr, nullptr};
fi_ops_eq g_eq_ops = {sizeof(fi_ops_eq), eq_read, eq_readerr, eq_write, eq_sread, eq_strerror};

}  // namespace

int eq_open(fid_fabric* fabric, fi_eq_attr* attr, fid_eq** out, void* context) {
  fi_wait_obj w = attr != nullptr ? attr->wait_obj : FI_WAIT_NONE;
  if (w == FI_WAIT_UNSPEC) w = FI_WAIT_FD;
  if (w != FI_WAIT_NONE && w != FI_WAIT_FD) return -FI_ENOSYS;
  auto* eq = new Eq;
  eq->fabric = reinterpret_cast<Fabric*>(fabric);
  eq->wait_obj = w;
  eq->efd = eventfd(0, EFD_NONBLOCK | EFD_SEMAPHORE | EFD_CLOEXEC);
  if (eq->efd < 0) {
    delete eq;
    return -FI_EMFILE;
  }
  eq->eq.fid.fclass = FI_CLASS_EQ;
  eq->eq.fid.context = context;
  eq->eq.fid.ops = &g_eq_fi_ops;
  eq->eq.ops = &g_eq_ops;
  *out = &eq->eq;
  return 0;
}

// ---------------------------------------------------------------------- AV

fi_addr_t Av::reverse(uint32_t ip, uint32_t qpn) {
  std::lock_guard<std::mutex> lk(mu);
  for (size_t i = 0; i < table.size(); i++)
    if (table[i].valid && table[i].ip == ip && table[i].qpn == qpn) return i;
  return FI_ADDR_NOTAVAIL;
}

namespace {

int av_insert(fid_av* a, const void* addr, size_t count, fi_addr_t* fi_addr, uint64_t flags, void* context) {
  (void)flags;
  (void)context;
  auto* av = reinterpret_cast<Av*>(a);
  const char* p = static_cast<const char*>(addr);
  int done = 0;
  for (size_t i = 0; i < count; i++) {
    size_t len = std::strlen(p);
    AvEntry e;
    if (!parse_ud_name(p, len + 1, &e.ip, &e.qpn)) {
      if (fi_addr != nullptr) fi_addr[i] = FI_ADDR_NOTAVAIL;
      p += len + 1;
      continue;
    }
    e.qkey = kUdQkey;
    ufab_av uav{};
    uav.dest_ip = e.ip;
    uav.hop_limit = 64;
    if (ufab_ah_create(av->dom->dev->pd, &uav, &e.ah) != 0) {
      if (fi_addr != nullptr) fi_addr[i] = FI_ADDR_NOTAVAIL;
      p += len + 1;
      continue;
    }
    e.valid = true;
    std::lock_guard<std::mutex> lk(av->mu);
    av->table.push_back(e);
    if (fi_addr != nullptr) fi_addr[i] = av->table.size() - 1;
    done++;
    p += len + 1;
  }
  return done;
}

int av_insertsvc(fid_av*, const char*, const char*, fi_addr_t*, uint64_t, void*) { return -FI_ENOSYS; }
int av_insertsym(fid_av*, const char*, size_t, const char*, size_t, fi_addr_t*, uint64_t, void*) { return -FI_ENOSYS; }

int av_remove(fid_av* a, fi_addr_t* fi_addr, size_t count, uint64_t) {
  auto* av = reinterpret_cast<Av*>(a);
  std::lock_guard<std::mutex> lk(av->mu);
  for (size_t i = 0; i < count; i++) {
    if (fi_addr[i] >= av->table.size() || !av->table[fi_addr[i]].valid) return -FI_EINVAL;
    AvEntry& e = av->table[fi_addr[i]];
    ufab_ah_destroy(e.ah);
    e = AvEntry{};
  }
  return 0;
}

int av_lookup(fid_av* a, fi_addr_t fi_addr, void* addr, size_t* addrlen) {
  auto* av = reinterpret_cast<Av*>(a);
  std::lock_guard<std::mutex> lk(av->mu);
  if (fi_addr >= av->table.size() || !av->table[fi_addr].valid) return -FI_EINVAL;
  std::string n = ud_name(av->table[fi_addr].ip, av->table[fi_addr].qpn);
  size_t need = n.size() + 1;
  std::memcpy(addr, n.c_str(), std::min(need, *addrlen));
  *addrlen = need;
  return 0;
}

const char* av_straddr(fid_av*, const void* addr, char* buf, size_t* len) {
  std::snprintf(buf, *len, "%s", static_cast<const char*>(addr));
  *len = std::strlen(static_cast<const char*>(addr)) + 1;
  return buf;
}

int av_close(fid* f) {
  auto* av = reinterpret_cast<Av*>(f);
  if (av->refs.load() != 0) return -FI_EBUSY;
  for (AvEntry& e : av->table)
    if (e.valid) ufab_ah_destroy(e.ah);
  av->dom->refs--;
  delete av;
  return 0;
}
int av_control(fid*, int, void*) { return -FI_ENOSYS; }

fi_ops g_av_fi_ops = {sizeof(fi_ops), av_close, no_bind, av_control, no_ops_open, nullptr, nullptr};
fi_ops_av g_av_ops = {sizeof(fi_ops_av), av_insert, av_insertsvc, av_insertsym, av_remove, av_lookup, av_straddr,
                      nullptr};

}  // namespace

int av_open(fid_domain* domain, fi_av_attr* attr, fid_av** out, void* context) {
  auto* d = reinterpret_cast<Domain*>(domain);
  if (attr != nullptr && (attr->flags & (FI_EVENT | FI_SYMMETRIC)) != 0) return -FI_ENOSYS;
  if (attr != nullptr && attr->name != nullptr) return -FI_ENOSYS;
  auto* av = new Av;
  av->dom = d;
  av->av.fid.fclass = FI_CLASS_AV;
  av->av.fid.context = context;
  av->av.fid.ops = &g_av_fi_ops;
  av->av.ops = &g_av_ops;
  d->refs++;
  *out = &av->av;
  return 0;
}

}  // namespace ufab_fi
