// An shm queue pair: state machine, posting, the requester and the
// responder (RC), datagrams (UD, at the end). Everything here runs under
// the QP's mutex.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "drivers/shm/shm_impl.h"

namespace ufab::shm {
namespace {

constexpr uint32_t kLater = 0xFFFF;  // one_sided: the target is not ready yet; try again
constexpr uint32_t kPsnMask = 0xFFFFFF;
constexpr uint32_t kRights = UFAB_ACCESS_LOCAL_WRITE | UFAB_ACCESS_REMOTE_WRITE | UFAB_ACCESS_REMOTE_READ |
                             UFAB_ACCESS_REMOTE_ATOMIC;

bool seq_le(uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b) <= 0; }
bool seq_lt(uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b) < 0; }

bool is_atomic(uint32_t op) { return op == UFAB_WR_ATOMIC_CMP_AND_SWP || op == UFAB_WR_ATOMIC_FETCH_AND_ADD; }

uint32_t wc_opcode(uint32_t op) {
  switch (op) {
    case UFAB_WR_RDMA_WRITE:
    case UFAB_WR_RDMA_WRITE_WITH_IMM: return UFAB_WC_RDMA_WRITE;
    case UFAB_WR_RDMA_READ: return UFAB_WC_RDMA_READ;
    case UFAB_WR_ATOMIC_CMP_AND_SWP: return UFAB_WC_COMP_SWAP;
    case UFAB_WR_ATOMIC_FETCH_AND_ADD: return UFAB_WC_FETCH_ADD;
    default: return UFAB_WC_SEND;
  }
}

const char* state_name(uint32_t s) {
  switch (s) {
    case UFAB_QPS_RESET: return "RESET";
    case UFAB_QPS_INIT: return "INIT";
    case UFAB_QPS_RTR: return "RTR";
    case UFAB_QPS_RTS: return "RTS";
    case UFAB_QPS_ERR: return "ERROR";
    default: return "an unknown state";
  }
}

std::string mask_names(uint32_t m) {
  static const struct {
    uint32_t bit;
    const char* name;
  } kNames[] = {{UFAB_QP_ACCESS_FLAGS, "access_flags"}, {UFAB_QP_PKEY_INDEX, "pkey_index"},
                {UFAB_QP_PORT, "port"},                 {UFAB_QP_QKEY, "qkey"},
                {UFAB_QP_AV, "av"},                     {UFAB_QP_PATH_MTU, "path_mtu"},
                {UFAB_QP_TIMEOUT, "timeout"},           {UFAB_QP_RETRY_CNT, "retry_cnt"},
                {UFAB_QP_RNR_RETRY, "rnr_retry"},       {UFAB_QP_RQ_PSN, "rq_psn"},
                {UFAB_QP_MAX_QP_RD_ATOMIC, "max_rd_atomic"}, {UFAB_QP_MIN_RNR_TIMER, "min_rnr_timer"},
                {UFAB_QP_SQ_PSN, "sq_psn"},             {UFAB_QP_MAX_DEST_RD_ATOMIC, "max_dest_rd_atomic"},
                {UFAB_QP_DEST_QPN, "dest_qpn"}};
  std::string out;
  for (const auto& n : kNames) {
    if (m & n.bit) out += (out.empty() ? "" : ", ") + std::string(n.name);
    m &= ~n.bit;
  }
  if (m) out += (out.empty() ? "" : ", ") + std::string("unknown bits ") + hex(m);
  return out;
}

struct Transition {
  uint32_t from, to, required, optional;
};
constexpr uint32_t kInitRc = UFAB_QP_PKEY_INDEX | UFAB_QP_PORT | UFAB_QP_ACCESS_FLAGS;
constexpr uint32_t kRtrRc = UFAB_QP_AV | UFAB_QP_PATH_MTU | UFAB_QP_DEST_QPN | UFAB_QP_RQ_PSN |
                            UFAB_QP_MAX_DEST_RD_ATOMIC | UFAB_QP_MIN_RNR_TIMER;
constexpr uint32_t kRtsRc =
    UFAB_QP_TIMEOUT | UFAB_QP_RETRY_CNT | UFAB_QP_RNR_RETRY | UFAB_QP_SQ_PSN | UFAB_QP_MAX_QP_RD_ATOMIC;
constexpr Transition kTransitions[] = {
    {UFAB_QPS_RESET, UFAB_QPS_INIT, kInitRc, 0},
    {UFAB_QPS_INIT, UFAB_QPS_INIT, 0, kInitRc},
    {UFAB_QPS_INIT, UFAB_QPS_RTR, kRtrRc, UFAB_QP_PKEY_INDEX | UFAB_QP_ACCESS_FLAGS},
    {UFAB_QPS_RTR, UFAB_QPS_RTS, kRtsRc, UFAB_QP_ACCESS_FLAGS | UFAB_QP_MIN_RNR_TIMER},
    {UFAB_QPS_RTS, UFAB_QPS_RTS, 0, UFAB_QP_ACCESS_FLAGS | UFAB_QP_MIN_RNR_TIMER},
};
// UD (IBA 10.3.1, as soft-RoCE takes them): the Q_Key at INIT, nothing at
// RTR, the send PSN at RTS.
constexpr uint32_t kInitUd = UFAB_QP_PKEY_INDEX | UFAB_QP_PORT | UFAB_QP_QKEY;
constexpr Transition kTransitionsUd[] = {
    {UFAB_QPS_RESET, UFAB_QPS_INIT, kInitUd, 0},
    {UFAB_QPS_INIT, UFAB_QPS_INIT, 0, kInitUd},
    {UFAB_QPS_INIT, UFAB_QPS_RTR, 0, UFAB_QP_PKEY_INDEX | UFAB_QP_QKEY},
    {UFAB_QPS_RTR, UFAB_QPS_RTS, UFAB_QP_SQ_PSN, UFAB_QP_QKEY},
    {UFAB_QPS_RTS, UFAB_QPS_RTS, 0, UFAB_QP_QKEY},
};

// Bytes a UD receive starts with: the GRH area (verbs' rule), holding an
// IPv4 header in its last 20 bytes as RoCEv2 gives it.
constexpr uint32_t kGrhBytes = 40;

void store_be16(unsigned char* p, uint16_t v) {
  p[0] = static_cast<unsigned char>(v >> 8);
  p[1] = static_cast<unsigned char>(v);
}
void store_be32(unsigned char* p, uint32_t v) {
  store_be16(p, static_cast<uint16_t>(v >> 16));
  store_be16(p + 2, static_cast<uint16_t>(v));
}

}  // namespace

const char* op_name(uint32_t op) {
  static const char* kNames[] = {"RDMA_WRITE", "RDMA_WRITE_WITH_IMM", "SEND", "SEND_WITH_IMM", "RDMA_READ",
                                 "ATOMIC_CMP_AND_SWP", "ATOMIC_FETCH_AND_ADD"};
  return op < 7 ? kNames[op] : "an unknown opcode";
}


// Moves n bytes of an iovec pair forward after a partial transfer.
static void advance(struct iovec*& v, unsigned long& n, size_t bytes) {
  while (bytes > 0 && n > 0) {
    if (bytes >= v->iov_len) {
      bytes -= v->iov_len;
      ++v;
      --n;
    } else {
      v->iov_base = static_cast<char*>(v->iov_base) + bytes;
      v->iov_len -= bytes;
      bytes = 0;
    }
  }
  while (n > 0 && v->iov_len == 0) {
    ++v;
    --n;
  }
}

// process_vm_readv/writev until everything moved; 0 or an errno.
int cma(pid_t pid, bool write, struct iovec* local, unsigned long nl, struct iovec* remote, unsigned long nr) {
  advance(local, nl, 0);
  advance(remote, nr, 0);
  while (nl > 0 && nr > 0) {
    ssize_t n = write ? ::process_vm_writev(pid, local, nl, remote, nr, 0)
                      : ::process_vm_readv(pid, local, nl, remote, nr, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EFAULT;
    advance(local, nl, static_cast<size_t>(n));
    advance(remote, nr, static_cast<size_t>(n));
  }
  return 0;
}

std::string cma_words(int e, bool write, pid_t pid) {
  std::string what = std::string(write ? "process_vm_writev" : "process_vm_readv") + " to pid " + std::to_string(pid) +
                     " failed: " + std::strerror(e);
  if (e == EPERM) {
    what += "; the kernel refused cross-process copies (CMA needs ptrace access: same uid, Yama ptrace_scope 0, no "
            "seccomp filter); use soft-RoCE (a swnic device) between these processes";
  } else if (e == ENOSYS) {
    what += "; this kernel has no cross-memory attach (CONFIG_CROSS_MEMORY_ATTACH)";
  } else if (e == EFAULT) {
    what += "; memory behind a registered region is not mapped (was it freed before deregistration?)";
  }
  return what;
}

// ------------------------------------------------------------ completions

bool Cq::push(const ufab_wc& wc, const char* detail) {
  {
    std::lock_guard<std::mutex> g(mu);
    if (count == ring.size()) {
      overflow = true;
      avail.store(count, std::memory_order_release);
      return false;
    }
    uint32_t slot = (head + count) % static_cast<uint32_t>(ring.size());
    ring[slot] = wc;
    if (detail && *detail) {
      details[slot] = detail;
    } else {
      details[slot].clear();
    }
    ++count;
    avail.store(count, std::memory_order_release);
  }
  if (armed.load(std::memory_order_relaxed) && armed.exchange(false)) {
    uint64_t one = 1;
    ssize_t w = ::write(event_fd, &one, sizeof one);
    (void)w;
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (dev->seg->hdr.sleepers.load(std::memory_order_relaxed)) dev->wake_self();
  return true;
}

void Qp::complete_send(SendWqe& w, uint32_t status, const std::string& detail) {
  if (status == UFAB_WC_SUCCESS && !w.signaled) return;
  ufab_wc wc = {};
  wc.wr_id = w.wr.wr_id;
  wc.status = status;
  wc.opcode = wc_opcode(w.wr.opcode);
  wc.byte_len = static_cast<uint32_t>(w.length);
  wc.qp_num = qpn;
  if (!scq->push(wc, detail.c_str()) && attr.state != UFAB_QPS_ERR) {
    enter_error();
  }
}

void Qp::complete_recv(const RecvWqe& r, uint32_t status, uint32_t opcode, uint32_t len, uint32_t imm,
                       uint32_t flags, const std::string& detail) {
  ufab_wc wc = {};
  wc.wr_id = r.wr_id;
  wc.status = status;
  wc.opcode = opcode;
  wc.byte_len = len;
  wc.imm_data = imm;
  wc.qp_num = qpn;
  wc.wc_flags = flags;
  if (!rcq->push(wc, detail.c_str()) && attr.state != UFAB_QPS_ERR) {
    enter_error();
  }
}

void Qp::flush_all() {
  static const std::string kFlushed = "flushed: the QP is in ERROR";
  while (sq_head < sq_tail) {
    SendWqe& w = sq[sq_head % sq.size()];
    ++sq_head;
    complete_send(w, UFAB_WC_WR_FLUSH_ERR, kFlushed);
  }
  sq_next = sq_tail;
  while (rq_head < rq_tail) {
    RecvWqe& r = rq[rq_head % rq.size()];
    ++rq_head;
    complete_recv(r, UFAB_WC_WR_FLUSH_ERR, UFAB_WC_RECV, 0, 0, 0, kFlushed);
  }
  rnr_wait = false;
}

void Qp::enter_error() {
  if (attr.state == UFAB_QPS_ERR) return;
  attr.state = UFAB_QPS_ERR;
  ctl->state.store(UFAB_QPS_ERR, std::memory_order_release);
  gpu_tx_clear();
  gpu_rx_clear(true);
  flush_all();
}

// The oldest work request in flight fails with `status`; the QP goes to ERROR.
void Qp::fail_head(uint32_t status, const std::string& detail) {
  if (sq_head < sq_tail) {
    SendWqe& w = sq[sq_head % sq.size()];
    ++sq_head;
    if (sq_next < sq_head) sq_next = sq_head;
    complete_send(w, status, detail);
  }
  enter_error();
}

// ------------------------------------------------------------ state machine

Qp::~Qp() {
  if (dev && ctl) {
    gpu_tx_clear();
    gpu_rx_clear(false);
  }
  drop_direct();
}

void Qp::drop_direct() {
  for (auto& m : direct_) {
    if (m.map) ::munmap(m.map, m.map_len);
  }
  direct_.clear();
}

// At most this many of a peer's regions are mapped per QP; more go by CMA.
constexpr size_t kMaxDirect = 16;

const DirectMap* Qp::direct(uint32_t rkey, const KeyEntry& e) {
  const uint64_t addr = e.addr.load(std::memory_order_relaxed), len = e.length.load(std::memory_order_relaxed);
  for (size_t i = 0; i < direct_.size(); ++i) {
    DirectMap& m = direct_[i];
    if (((m.key ^ rkey) & (kMaxMr - 1)) != 0) continue;
    if (m.key == rkey && m.addr == addr && m.len == len) return &m;
    // The key was registered again: the old mapping goes.
    if (m.map) ::munmap(m.map, m.map_len);
    direct_.erase(direct_.begin() + static_cast<ptrdiff_t>(i));
    break;
  }
  if (direct_.size() >= kMaxDirect) return nullptr;
  DirectMap m;
  m.key = rkey;
  m.addr = addr;
  m.len = len;
  const uint32_t fd1 = e.fd1.load(std::memory_order_relaxed);
  const uint64_t off = e.file_off.load(std::memory_order_relaxed);
  if (fd1 != 0 && peer) {
    // The owner's descriptor, opened anew: ptrace access to the owner is
    // needed, as for CMA. Then the file must be the one registered, and
    // long enough (a mapping past its end would fault).
    char path[64];
    std::snprintf(path, sizeof path, "/proc/%d/fd/%u", static_cast<int>(peer->pid), fd1 - 1);
    int fd = ::open(path, O_RDWR | O_CLOEXEC);
    m.writable = fd >= 0;
    if (fd < 0) fd = ::open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd >= 0 && ::fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_dev) == e.file_dev.load() &&
        static_cast<uint64_t>(st.st_ino) == e.file_ino.load() && st.st_size >= 0 &&
        off + len <= static_cast<uint64_t>(st.st_size)) {
      const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
      const uint64_t start = off & ~(page - 1);
      m.map_len = static_cast<size_t>(off + len - start);
      void* p = ::mmap(nullptr, m.map_len, PROT_READ | (m.writable ? PROT_WRITE : 0), MAP_SHARED, fd,
                       static_cast<off_t>(start));
      if (p != MAP_FAILED) {
        m.map = p;
        m.base = static_cast<unsigned char*>(p) + (off - start);
      }
    }
    if (fd >= 0) ::close(fd);
  }
  direct_.push_back(m);
  return &direct_.back();
}

void Qp::release_peer() {
  drop_direct();
  if (!peer) return;
  if (peer_ctl) {
    uint64_t me = (static_cast<uint64_t>(dev->addr) << 32) | qpn;
    peer_ctl->producer.compare_exchange_strong(me, 0);
  }
  peer_unref(peer);
  peer = nullptr;
  peer_ctl = nullptr;
  out_req = out_resp = RingView{};
}

void Qp::reset_locked() {
  gpu_tx_clear();
  gpu_rx_clear(false);
  release_peer();
  if (type == UFAB_QPT_UD) {
    ctl->state.store(UFAB_QPS_RESET, std::memory_order_release);  // senders stop enqueueing
    ud_release_dests(false);
    ud_reset_queue();
    stats.dropped += ctl->ud_lost.exchange(0);
  }
  for (auto& w : sq) w = SendWqe{};
  sq_head = sq_next = sq_tail = 0;
  rq_head = rq_tail = 0;
  next_seq = expected_seq = msgs_sent = msgs_received = 0;
  rnr_left = 0;
  rnr_wait = false;
  ack_owed = false;
  stalled_ = false;
  attr = ufab_qp_attr{};
  attr.port = 1;
  attr.path_mtu = 4096;
  attr.sq_psn = initial_psn;
  ctl->producer.store(0);
  ctl->fatal.store(0);
  ctl->consumed.store(0);
  ctl->pulled.store(0);
  ctl->access.store(0);
  if (type == UFAB_QPT_RC) {
    // Positions go on from the producer's tail; no stamp may be left
    // behind (a message never consumed, payload slots of one).
    ctl->req.head.store(ctl->req.tail.load());
    ctl->resp.head.store(ctl->resp.tail.load());
    std::memset(in_req.bytes, 0, kRingBytes);
    std::memset(in_resp.bytes, 0, kRingBytes);
  }
  ctl->state.store(UFAB_QPS_RESET, std::memory_order_release);
}

void Qp::destroy_locked() {
  reset_locked();
  ctl->qpn.store(0, std::memory_order_release);
  active.store(false);
  timer.store(false);
  gpu_wait.store(false);
  std::vector<SendWqe>().swap(sq);
  std::vector<RecvWqe>().swap(rq);
  std::vector<unsigned char>().swap(inline_buf);
}

int Qp::modify(const ufab_qp_attr& a, uint32_t mask) {
  auto fail = [this](int code, const std::string& m) {
    dev->error("modifying QP " + hex(qpn) + " " + m);
    return -code;
  };
  uint32_t from = attr.state;
  uint32_t to = (mask & UFAB_QP_STATE) ? a.state : from;
  uint32_t given = mask & ~static_cast<uint32_t>(UFAB_QP_STATE);
  std::string tr = std::string(state_name(from)) + " -> " + state_name(to);
  if (to != UFAB_QPS_RESET && to != UFAB_QPS_INIT && to != UFAB_QPS_RTR && to != UFAB_QPS_RTS && to != UFAB_QPS_ERR) {
    return fail(EINVAL, "to state " + std::to_string(to) + ": not a QP state (RESET 0, INIT 1, RTR 2, RTS 3, ERROR 6)");
  }
  if (to == UFAB_QPS_RESET || to == UFAB_QPS_ERR) {
    if (given) return fail(EINVAL, "to " + std::string(state_name(to)) + ": only the state may be given, not " + mask_names(given));
    if (to == UFAB_QPS_ERR) {
      // The responses already in the ring are taken in first, as a NIC
      // that handles them as they arrive would have: work the peer
      // acknowledged before this moment completes as done, not flushed
      // (the peer may acknowledge, then leave at once).
      if ((from == UFAB_QPS_RTS || from == UFAB_QPS_RTR) &&
          in_resp.ready(in_resp.idx->head.load(std::memory_order_relaxed)))
        requester_responses();
      enter_error();
    } else {
      reset_locked();
    }
    return 0;
  }
  const Transition* t = nullptr;
  if (type == UFAB_QPT_UD) {
    for (const auto& c : kTransitionsUd) {
      if (c.from == from && c.to == to) t = &c;
    }
  } else {
    for (const auto& c : kTransitions) {
      if (c.from == from && c.to == to) t = &c;
    }
  }
  if (!t) return fail(EINVAL, tr + " is not a valid transition (RESET -> INIT -> RTR -> RTS; any -> ERROR or RESET)");
  if (uint32_t missing = t->required & ~given) return fail(EINVAL, tr + ": missing " + mask_names(missing));
  if (uint32_t extra = given & ~(t->required | t->optional)) {
    return fail(EINVAL, tr + ": " + mask_names(extra) + " cannot be set in this transition");
  }
  if ((given & UFAB_QP_PKEY_INDEX) && a.pkey_index != 0) {
    return fail(EINVAL, tr + ": pkey_index " + std::to_string(a.pkey_index) + " does not exist (index 0 only)");
  }
  if ((given & UFAB_QP_PORT) && a.port != 1) {
    return fail(EINVAL, tr + ": port " + std::to_string(a.port) + " does not exist (an shm device has port 1)");
  }
  if ((given & UFAB_QP_ACCESS_FLAGS) &&
      (a.access_flags & (UFAB_ACCESS_FLUSH_GLOBAL | UFAB_ACCESS_FLUSH_PERSISTENT))) {
    return fail(EOPNOTSUPP, tr + ": access_flags " + hex(a.access_flags) +
                                " allow FLUSH, which the shm provider does not implement; use a soft-RoCE device");
  }
  if ((given & UFAB_QP_ACCESS_FLAGS) && (a.access_flags & ~kRights)) {
    return fail(EINVAL, tr + ": access_flags " + hex(a.access_flags) + " has unsupported bits");
  }
  if (given & UFAB_QP_PATH_MTU) {
    uint32_t m = a.path_mtu;
    if (m != 256 && m != 512 && m != 1024 && m != 2048 && m != 4096) {
      return fail(EINVAL, tr + ": path_mtu " + std::to_string(m) + " is not 256, 512, 1024, 2048 or 4096");
    }
  }
  if ((given & UFAB_QP_DEST_QPN) && (a.dest_qpn > kPsnMask || a.dest_qpn < 2)) {
    return fail(EINVAL, tr + ": dest_qpn " + hex(a.dest_qpn) + " is not a QP number (2 .. 0xffffff)");
  }
  if (((given & UFAB_QP_RQ_PSN) && a.rq_psn > kPsnMask) || ((given & UFAB_QP_SQ_PSN) && a.sq_psn > kPsnMask)) {
    return fail(EINVAL, tr + ": PSNs are 24 bits (at most 0xffffff)");
  }
  if ((given & UFAB_QP_TIMEOUT) && a.timeout > 31) return fail(EINVAL, tr + ": timeout must be 0..31");
  if ((given & UFAB_QP_RETRY_CNT) && a.retry_cnt > 7) return fail(EINVAL, tr + ": retry_cnt must be 0..7");
  if ((given & UFAB_QP_RNR_RETRY) && a.rnr_retry > 7) return fail(EINVAL, tr + ": rnr_retry must be 0..7");
  if ((given & UFAB_QP_MIN_RNR_TIMER) && a.min_rnr_timer > 31) return fail(EINVAL, tr + ": min_rnr_timer must be 0..31");
  if ((given & UFAB_QP_MAX_DEST_RD_ATOMIC) && (a.max_dest_rd_atomic == 0 || a.max_dest_rd_atomic > 128)) {
    return fail(EINVAL, tr + ": max_dest_rd_atomic must be 1..128");
  }
  if ((given & UFAB_QP_MAX_QP_RD_ATOMIC) && (a.max_rd_atomic == 0 || a.max_rd_atomic > 128)) {
    return fail(EINVAL, tr + ": max_rd_atomic must be 1..128");
  }

  if (to == UFAB_QPS_RTR && type == UFAB_QPT_RC) {
    // Reach the peer device, check that the QP exists, and claim its rings.
    Peer* p = nullptr;
    try {
      p = dev->connect_peer(a.av.dest_ip);
    } catch (const Error& e) {
      return fail(e.code, tr + ": " + e.msg);
    }
    QpCtl* pc = &p->seg->ctl[a.dest_qpn % kMaxQp];
    if (pc->qpn.load(std::memory_order_acquire) != a.dest_qpn) {
      peer_unref(p);
      return fail(ECONNREFUSED, tr + ": the device at " + hex(a.av.dest_ip) + " has no QP " + hex(a.dest_qpn) +
                                    " (destroyed, or the number is wrong)");
    }
    uint64_t me = (static_cast<uint64_t>(dev->addr) << 32) | qpn;
    uint64_t cur = 0;
    if (!pc->producer.compare_exchange_strong(cur, me) && cur != me) {
      peer_unref(p);
      return fail(EBUSY, tr + ": QP " + hex(a.dest_qpn) + " at " + hex(a.av.dest_ip) + " is already connected to QP " +
                             hex(cur & 0xffffffff) + " at " + hex(cur >> 32) + "; an RC QP has one peer");
    }
    release_peer();
    peer = p;
    peer_ctl = pc;
    RingPair& rp = p->seg->rings[a.dest_qpn % kMaxQp];
    out_req = RingView{&pc->req, rp.req};
    out_resp = RingView{&pc->resp, rp.resp};
    out_req_head = pc->req.head.load(std::memory_order_acquire);
    out_resp_head = pc->resp.head.load(std::memory_order_acquire);
  }

  if (given & UFAB_QP_ACCESS_FLAGS) {
    attr.access_flags = a.access_flags;
    ctl->access.store(a.access_flags, std::memory_order_release);
  }
  if (given & UFAB_QP_PKEY_INDEX) attr.pkey_index = a.pkey_index;
  if (given & UFAB_QP_QKEY) attr.qkey = a.qkey;
  if (given & UFAB_QP_PORT) attr.port = a.port;
  if (given & UFAB_QP_AV) attr.av = a.av;
  if (given & UFAB_QP_PATH_MTU) attr.path_mtu = a.path_mtu;
  if (given & UFAB_QP_DEST_QPN) attr.dest_qpn = a.dest_qpn;
  if (given & UFAB_QP_RQ_PSN) {
    attr.rq_psn = a.rq_psn;
    msgs_received = 0;
  }
  if (given & UFAB_QP_MAX_DEST_RD_ATOMIC) attr.max_dest_rd_atomic = a.max_dest_rd_atomic;
  if (given & UFAB_QP_MIN_RNR_TIMER) attr.min_rnr_timer = a.min_rnr_timer;
  if (given & UFAB_QP_SQ_PSN) {
    attr.sq_psn = a.sq_psn;
    msgs_sent = 0;
  }
  if (given & UFAB_QP_TIMEOUT) attr.timeout = a.timeout;
  if (given & UFAB_QP_RETRY_CNT) attr.retry_cnt = a.retry_cnt;
  if (given & UFAB_QP_RNR_RETRY) attr.rnr_retry = rnr_left = a.rnr_retry;
  if (given & UFAB_QP_MAX_QP_RD_ATOMIC) attr.max_rd_atomic = a.max_rd_atomic;
  attr.state = to;
  ctl->state.store(to, std::memory_order_release);
  return 0;
}

void Qp::query(ufab_qp_attr* out) {
  *out = attr;
  out->sq_psn = (attr.sq_psn + msgs_sent) & kPsnMask;
  out->rq_psn = (attr.rq_psn + msgs_received) & kPsnMask;
}

// ------------------------------------------------------------------ posting

int Qp::post_send(const ufab_send_wr* wrs, uint32_t n, uint32_t* bad) {
  int rc = 0;
  uint32_t i = 0;
  auto fail = [&](int code, const std::string& m) {
    dev->error("post_send on QP " + hex(qpn) + ": work request " + std::to_string(i) + " (wr_id " +
               hex(wrs[i].wr_id) + "): " + m);
    rc = -code;
  };
  for (; i < n; ++i) {
    const ufab_send_wr& wr = wrs[i];
    if (wr.opcode == UFAB_WR_FLUSH || wr.opcode == UFAB_WR_ATOMIC_WRITE || (wr.send_flags & UFAB_SEND_COMMIT)) {
      fail(EOPNOTSUPP, std::string(wr.opcode == UFAB_WR_FLUSH          ? "FLUSH"
                                   : wr.opcode == UFAB_WR_ATOMIC_WRITE ? "ATOMIC_WRITE"
                                                                       : "UFAB_SEND_COMMIT (a commit-complete WRITE)") +
                           " is not implemented by the shm provider (its peers share this host's memory, but it "
                           "has no FLUSH or ATOMIC_WRITE messages yet); use a soft-RoCE device (swnic or a NIC)");
      break;
    }
    if (attr.state != UFAB_QPS_RTS && attr.state != UFAB_QPS_ERR) {
      fail(EINVAL, std::string("the QP is in ") + state_name(attr.state) + "; sends need RTS (modify it to RTS first)");
      break;
    }
    if (sq_tail - sq_head >= sq.size()) {
      fail(ENOMEM, "the send queue is full (" + std::to_string(sq.size()) +
                       " work requests outstanding); poll the CQ or create the QP with a larger max_send_wr");
      break;
    }
    if (wr.opcode > UFAB_WR_ATOMIC_FETCH_AND_ADD) {
      fail(EINVAL, "unknown opcode " + std::to_string(wr.opcode));
      break;
    }
    if (wr.num_sge > cap.max_send_sge) {
      fail(EINVAL, std::to_string(wr.num_sge) + " SGEs, the QP allows " + std::to_string(cap.max_send_sge) +
                       " (max_send_sge)");
      break;
    }
    if (wr.num_sge > 0 && !wr.sg_list) {
      fail(EINVAL, "num_sge is " + std::to_string(wr.num_sge) + " but sg_list is NULL");
      break;
    }
    uint64_t length = 0;
    for (uint32_t k = 0; k < wr.num_sge; ++k) length += wr.sg_list[k].length;
    if (length > (1ull << 31)) {
      fail(EINVAL, "messages are at most 2 GiB");
      break;
    }
    bool atomic = is_atomic(wr.opcode);
    if (atomic && (wr.num_sge != 1 || length != 8)) {
      fail(EINVAL, std::string(op_name(wr.opcode)) + " needs exactly one 8-byte SGE for the result");
      break;
    }
    bool inl = (wr.send_flags & UFAB_SEND_INLINE) && wr.opcode != UFAB_WR_RDMA_READ && !atomic;
    if (inl && length > cap.max_inline_data) {
      fail(EINVAL, std::to_string(length) + " bytes of inline data, the QP allows " +
                       std::to_string(cap.max_inline_data) + " (max_inline_data)");
      break;
    }
    // GPU memory: never read by the CPU (no inline data from it, no atomic
    // result into it), and still the allocation it was registered on.
    bool gpu_sge = false;
    if (dev->gpu_regions.load(std::memory_order_relaxed) != 0) {
      std::string why;
      for (uint32_t k = 0; k < wr.num_sge && why.empty(); ++k) {
        const ufab_sge& g = wr.sg_list[k];
        const uint32_t index = g.lkey & (kMaxMr - 1);
        if (!g.length || dev->seg->keys[index].key.load(std::memory_order_acquire) != g.lkey ||
            !dev->gpu_keys[index].gpu) {
          continue;
        }
        gpu_sge = true;
        if (!dev->gpu_buffer_ok(index, g.addr, &why)) why = "SGE " + std::to_string(k) + ", lkey " + hex(g.lkey) + ": " + why;
      }
      if (!why.empty()) {
        fail(EACCES, why);
        break;
      }
      if (gpu_sge && (wr.send_flags & UFAB_SEND_INLINE) && wr.opcode != UFAB_WR_RDMA_READ && !atomic) {
        fail(EINVAL, "inline data from GPU memory: the CPU cannot read it; post it without UFAB_SEND_INLINE");
        break;
      }
      if (gpu_sge && atomic) {
        fail(EOPNOTSUPP, std::string(op_name(wr.opcode)) +
                             ": the result SGE is GPU memory; atomics on GPU memory are not supported (SEND/RECV, "
                             "WRITE and READ are, through the staging pipeline: docs/gpu.md); use host memory for "
                             "the result");
        break;
      }
    }
    if (type == UFAB_QPT_UD) {
      if (wr.opcode != UFAB_WR_SEND && wr.opcode != UFAB_WR_SEND_WITH_IMM) {
        fail(EINVAL, std::string(op_name(wr.opcode)) + " needs an RC QP (this one is UD: SEND and SEND_WITH_IMM)");
        break;
      }
      if (length > kUdMaxData) {
        fail(EINVAL, "a UD message of " + std::to_string(length) + " bytes exceeds the path MTU " +
                         std::to_string(kUdMaxData) + " (the largest datagram of an shm device)");
        break;
      }
      if (gpu_sge) {
        fail(EOPNOTSUPP, std::string(op_name(wr.opcode)) +
                             " from GPU memory on a UD QP: datagrams are not staged; use host memory, or an RC QP "
                             "(docs/gpu.md)");
        break;
      }
    }
    uint64_t slot = sq_tail % sq.size();
    SendWqe& w = sq[slot];
    // Every field set here; only the SGEs in use are copied (not the
    // whole 16-entry array, zeroed first: most of a small SEND's post).
    w.local_gpu = gpu_sge;
    w.wr = wr;
    w.wr.sg_list = nullptr;
    if (wr.num_sge) std::memcpy(w.sge, wr.sg_list, sizeof(ufab_sge) * wr.num_sge);
    w.seq = 0;
    w.checked = false;
    w.data_done = false;
    w.sent = false;
    w.length = length;
    w.signaled = sig_all || (wr.send_flags & UFAB_SEND_SIGNALED);
    w.is_inline = inl;
    if (inl) {
      unsigned char* dst = inline_buf.data() + slot * cap.max_inline_data;
      for (uint32_t k = 0; k < wr.num_sge; ++k) {
        std::memcpy(dst, reinterpret_cast<const void*>(wr.sg_list[k].addr), wr.sg_list[k].length);
        dst += wr.sg_list[k].length;
      }
    }
    ++sq_tail;
  }
  if (rc != 0 && bad) *bad = i;
  if (attr.state == UFAB_QPS_ERR) {
    flush_all();
  } else {
    requester_send();
    notify_peer();
  }
  timer.store(rnr_wait || stalled_, std::memory_order_relaxed);
  return rc;
}

int Qp::post_recv(const ufab_recv_wr* wrs, uint32_t n, uint32_t* bad) {
  int rc = 0;
  uint32_t i = 0;
  auto fail = [&](int code, const std::string& m) {
    dev->error("post_recv on QP " + hex(qpn) + ": work request " + std::to_string(i) + " (wr_id " +
               hex(wrs[i].wr_id) + "): " + m);
    rc = -code;
  };
  for (; i < n; ++i) {
    const ufab_recv_wr& wr = wrs[i];
    if (attr.state == UFAB_QPS_RESET) {
      fail(EINVAL, "the QP is in RESET; receives can be posted from INIT on");
      break;
    }
    if (rq_tail - rq_head >= rq.size()) {
      fail(ENOMEM, "the receive queue is full (" + std::to_string(rq.size()) +
                       " receives posted); poll the CQ or create the QP with a larger max_recv_wr");
      break;
    }
    if (wr.num_sge > cap.max_recv_sge) {
      fail(EINVAL, std::to_string(wr.num_sge) + " SGEs, the QP allows " + std::to_string(cap.max_recv_sge) +
                       " (max_recv_sge)");
      break;
    }
    if (wr.num_sge > 0 && !wr.sg_list) {
      fail(EINVAL, "num_sge is " + std::to_string(wr.num_sge) + " but sg_list is NULL");
      break;
    }
    if (dev->gpu_regions.load(std::memory_order_relaxed) != 0) {
      std::string why;
      for (uint32_t k = 0; k < wr.num_sge && why.empty(); ++k) {
        const ufab_sge& g = wr.sg_list[k];
        const uint32_t index = g.lkey & (kMaxMr - 1);
        if (g.length && dev->seg->keys[index].key.load(std::memory_order_acquire) == g.lkey &&
            dev->gpu_keys[index].gpu && !dev->gpu_buffer_ok(index, g.addr, &why)) {
          why = "SGE " + std::to_string(k) + ", lkey " + hex(g.lkey) + ": " + why;
        }
      }
      if (!why.empty()) {
        fail(EACCES, why);
        break;
      }
    }
    RecvWqe& r = rq[rq_tail % rq.size()];
    r.wr_id = wr.wr_id;
    r.num_sge = wr.num_sge;
    std::memcpy(r.sge, wr.sg_list, sizeof(ufab_sge) * wr.num_sge);
    ++rq_tail;
  }
  if (rc != 0 && bad) *bad = i;
  if (attr.state == UFAB_QPS_ERR) flush_all();
  return rc;
}

// ----------------------------------------------------------------- helpers

uint32_t Qp::check_local(const ufab_sge& s, bool need_write, std::string* why) const {
  if (s.length == 0) return 0;
  const KeyEntry& e = dev->seg->keys[s.lkey & (kMaxMr - 1)];
  uint32_t key = e.key.load(std::memory_order_acquire);
  if (key == 0 || key != s.lkey) {
    *why = "lkey " + hex(s.lkey) + " is not a registered region of this device";
  } else if (e.pd.load(std::memory_order_relaxed) != pd->id) {
    *why = "lkey " + hex(s.lkey) + " belongs to another protection domain than the QP's";
  } else if (need_write && !(e.access.load(std::memory_order_relaxed) & UFAB_ACCESS_LOCAL_WRITE)) {
    *why = "lkey " + hex(s.lkey) + " has no LOCAL_WRITE, and this operation writes into it";
  } else {
    uint64_t base = e.addr.load(std::memory_order_relaxed), len = e.length.load(std::memory_order_relaxed);
    if (s.addr >= base && s.length <= len && s.addr - base <= len - s.length) return 0;
    *why = "SGE [" + hex(s.addr) + ", +" + std::to_string(s.length) + ") lies outside the region of lkey " +
           hex(s.lkey) + " [" + hex(base) + ", +" + std::to_string(len) + ")";
  }
  return UFAB_WC_LOC_PROT_ERR;
}

uint32_t Qp::check_remote_key(uint32_t rkey, uint64_t addr, uint64_t len, uint32_t right, Segment* s,
                              uint32_t target_pd, KeyEntry** pinned, std::string* why) const {
  KeyEntry& e = s->keys[rkey & (kMaxMr - 1)];
  e.pins.fetch_add(1, std::memory_order_seq_cst);
  uint32_t key = e.key.load(std::memory_order_seq_cst);
  const char* rname = right == UFAB_ACCESS_REMOTE_WRITE  ? "REMOTE_WRITE"
                      : right == UFAB_ACCESS_REMOTE_READ ? "REMOTE_READ"
                                                         : "REMOTE_ATOMIC";
  if (key == 0 || key != rkey) {
    *why = "rkey " + hex(rkey) + " is not registered at the target (never, or deregistered)";
  } else if (e.pd.load(std::memory_order_relaxed) != target_pd) {
    *why = "rkey " + hex(rkey) + " belongs to another protection domain than the target QP's";
  } else if (!(e.access.load(std::memory_order_relaxed) & right)) {
    *why = "the target region of rkey " + hex(rkey) + " was registered without " + rname;
  } else {
    uint64_t base = e.addr.load(std::memory_order_relaxed), rlen = e.length.load(std::memory_order_relaxed);
    if (addr >= base && len <= rlen && addr - base <= rlen - len) {
      *pinned = &e;
      return 0;
    }
    *why = "[" + hex(addr) + ", +" + std::to_string(len) + ") lies outside the target region of rkey " + hex(rkey) +
           " [" + hex(base) + ", +" + std::to_string(rlen) + ")";
  }
  e.pins.fetch_sub(1, std::memory_order_release);
  return UFAB_WC_REM_ACCESS_ERR;
}

void Qp::notify_peer() {
  if (!notify_ || !peer) return;
  notify_ = false;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (peer->seg->hdr.sleepers.load(std::memory_order_relaxed)) Device::wake(peer->seg);
}

bool Qp::resp_space(uint32_t slots) const {
  uint64_t tail = out_resp.idx->tail.load(std::memory_order_relaxed);
  if (tail + slots - out_resp_head <= kRingSlots) return true;
  out_resp_head = out_resp.idx->head.load(std::memory_order_acquire);
  return tail + slots - out_resp_head <= kRingSlots;
}

bool Qp::send_resp(uint8_t type, uint32_t seq, uint64_t value) {
  if (!peer || !resp_space(1)) return false;
  MsgHdr h = {};
  h.type = type;
  h.nslots = 1;
  h.seq = seq;
  h.value = value;
  uint64_t tail = out_resp.idx->tail.load(std::memory_order_relaxed);
  out_resp.put(tail, 0, &h, sizeof h);
  out_resp.publish(tail, 1);
  notify_ = true;
  return true;
}

// ---------------------------------------------------------------- requester

bool Qp::send_message(SendWqe& w) {
  MsgHdr h = {};
  h.seq = next_seq;
  uint32_t body = 0;
  uint32_t op = w.wr.opcode;
  bool inline_data = false;
  if (op == UFAB_WR_SEND || op == UFAB_WR_SEND_WITH_IMM) {
    h.type = kMsgSend;
    h.len = static_cast<uint32_t>(w.length);
    if (w.is_inline || w.length <= kRingInlineMax) {
      inline_data = true;
      h.flags |= kFlagInline;
      body = static_cast<uint32_t>(w.length);
    } else {
      for (uint32_t k = 0; k < w.wr.num_sge; ++k) h.n_iov += w.sge[k].length ? 1 : 0;
      body = h.n_iov * sizeof(RemoteIov);
    }
    if (op == UFAB_WR_SEND_WITH_IMM) {
      h.flags |= kFlagImm;
      h.imm = w.wr.imm_data;
    }
  } else if (op == UFAB_WR_RDMA_WRITE_WITH_IMM) {
    h.type = kMsgWriteImm;
    h.len = static_cast<uint32_t>(w.length);
    h.flags |= kFlagImm;
    h.imm = w.wr.imm_data;
  } else {
    h.type = kMsgAtomic;
    if (op == UFAB_WR_ATOMIC_CMP_AND_SWP) h.flags |= kFlagCmpSwp;
    body = sizeof(AtomicBody);
  }
  if (w.wr.send_flags & UFAB_SEND_SOLICITED) h.flags |= kFlagSolicited;
  h.nslots = static_cast<uint8_t>(msg_slots(body));
  uint64_t tail = out_req.idx->tail.load(std::memory_order_relaxed);
  if (tail + h.nslots - out_req_head > kRingSlots) {
    out_req_head = out_req.idx->head.load(std::memory_order_acquire);
    if (tail + h.nslots - out_req_head > kRingSlots) return false;
  }
  out_req.put(tail, 0, &h, sizeof h);
  if (h.type == kMsgSend) {
    uint32_t off = kHdrSize;
    if (inline_data) {
      if (w.is_inline) {
        out_req.put(tail, off, inline_buf.data() + (sq_next % sq.size()) * cap.max_inline_data, w.length);
      } else {
        for (uint32_t k = 0; k < w.wr.num_sge; ++k) {
          out_req.put(tail, off, reinterpret_cast<const void*>(w.sge[k].addr), w.sge[k].length);
          off += w.sge[k].length;
        }
      }
    } else {
      for (uint32_t k = 0; k < w.wr.num_sge; ++k) {
        if (!w.sge[k].length) continue;
        RemoteIov v = {w.sge[k].addr, w.sge[k].length};
        out_req.put(tail, off, &v, sizeof v);
        off += sizeof v;
      }
    }
  } else if (h.type == kMsgAtomic) {
    AtomicBody b = {w.wr.remote_addr, w.wr.compare_add, w.wr.swap, w.wr.rkey, 0};
    out_req.put(tail, kHdrSize, &b, sizeof b);
  }
  out_req.publish(tail, h.nslots);
  w.seq = next_seq++;
  w.sent = true;
  ++msgs_sent;
  ++stats.tx;
  notify_ = true;
  return true;
}

// RDMA WRITE (the data of WRITE_WITH_IMM too) and READ, executed here: the
// target's key table is checked, then CMA copies. 0, kLater or a status.
uint32_t Qp::one_sided(SendWqe& w, std::string* why) {
  uint32_t st = peer_ctl->state.load(std::memory_order_acquire);
  if (peer_ctl->qpn.load(std::memory_order_acquire) != attr.dest_qpn) {
    *why = "the peer QP " + hex(attr.dest_qpn) + " was destroyed";
    return UFAB_WC_RETRY_EXC_ERR;
  }
  if (st == UFAB_QPS_RESET || st == UFAB_QPS_INIT) return kLater;  // as a dropped packet: sent again later
  if (st == UFAB_QPS_ERR) {
    *why = "the peer QP " + hex(attr.dest_qpn) + " is in ERROR and answers nothing";
    return UFAB_WC_RETRY_EXC_ERR;
  }
  bool read = w.wr.opcode == UFAB_WR_RDMA_READ;
  uint32_t right = read ? UFAB_ACCESS_REMOTE_READ : UFAB_ACCESS_REMOTE_WRITE;
  if (!(peer_ctl->access.load(std::memory_order_acquire) & right)) {
    *why = std::string("the target QP ") + hex(attr.dest_qpn) + " does not allow " +
           (read ? "REMOTE_READ" : "REMOTE_WRITE") + " (its access_flags)";
    return UFAB_WC_REM_INV_REQ_ERR;
  }
  if (w.length == 0) return 0;  // zero-length READ/WRITE: no key check (IBA C9-88)
  KeyEntry* pin = nullptr;
  uint32_t s = check_remote_key(w.wr.rkey, w.wr.remote_addr, w.length, right, peer->seg,
                                peer_ctl->pd.load(std::memory_order_acquire), &pin, why);
  if (s) return s;
  struct iovec local[UFAB_MAX_SGE];
  unsigned long nl = 0;
  for (uint32_t k = 0; k < w.wr.num_sge; ++k) {
    if (!w.sge[k].length) continue;
    local[nl].iov_base = w.is_inline ? nullptr : reinterpret_cast<void*>(w.sge[k].addr);
    local[nl].iov_len = w.sge[k].length;
    ++nl;
  }
  if (w.is_inline) {
    nl = 1;
    local[0].iov_base = inline_buf.data() + (sq_next % sq.size()) * cap.max_inline_data;
    local[0].iov_len = w.length;
  }
  int e = 0;
  const DirectMap* dm = direct(w.wr.rkey, *pin);
  if (dm && dm->base && (read || dm->writable)) {
    // The region is mapped here: copy, no system call.
    unsigned char* r = dm->base + (w.wr.remote_addr - dm->addr);
    for (unsigned long k = 0; k < nl; ++k) {
      if (read) {
        std::memcpy(local[k].iov_base, r, local[k].iov_len);
      } else {
        std::memcpy(r, local[k].iov_base, local[k].iov_len);
      }
      r += local[k].iov_len;
    }
  } else {
    struct iovec remote = {reinterpret_cast<void*>(w.wr.remote_addr), w.length};
    e = cma(peer->pid, !read, local, nl, &remote, 1);
  }
  pin->pins.fetch_sub(1, std::memory_order_release);
  ++stats.tx;
  if (e == 0) return 0;
  if (e == ESRCH) {
    *why = "the peer process (pid " + std::to_string(peer->pid) + ") is gone";
    return UFAB_WC_RETRY_EXC_ERR;
  }
  *why = cma_words(e, !read, peer->pid);
  return UFAB_WC_REM_OP_ERR;
}

int Qp::requester_send() {
  if (type == UFAB_QPT_UD) return ud_send();
  int work = 0;
  stalled_ = false;
  if (rnr_wait && Clock::now() >= rnr_until) rnr_wait = false;
  // GPU work requests in flight (gpu.cc): copies that landed, pieces
  // staged and sent, the finished ones completed in order.
  work += gpu_tx_run();
  while (sq_next < sq_tail && attr.state == UFAB_QPS_RTS) {
    if (rnr_wait) {
      if (Clock::now() < rnr_until) break;
      rnr_wait = false;
    }
    SendWqe& w = sq[sq_next % sq.size()];
    uint32_t op = w.wr.opcode;
    bool one = (op == UFAB_WR_RDMA_WRITE || op == UFAB_WR_RDMA_READ || op == UFAB_WR_RDMA_WRITE_WITH_IMM) && !w.data_done;
    bool send = op == UFAB_WR_SEND || op == UFAB_WR_SEND_WITH_IMM;
    // GPU memory here or a GPU region there: the staging pipeline (gpu.cc).
    bool gpu = w.length > 0 && !w.is_inline && ((send && w.local_gpu) || (one && (w.local_gpu || remote_gpu(w))));
    // One-sided work and fences start once everything before them is
    // done, so a WRITE never overtakes a SEND still in the peer's ring;
    // anything else behind GPU work once that completed. GPU work starts
    // behind GPU work of its kind (gpu_tx_may_join), else once everything
    // before it is done.
    if (gpu) {
      if (!gpu_tx_may_join(w)) break;
    } else if (!gtxq_.empty() || ((one || (w.wr.send_flags & UFAB_SEND_FENCE)) && sq_head != sq_next)) {
      break;
    }
    if (!w.checked) {
      std::string why;
      uint32_t st = 0;
      if (!w.is_inline) {
        bool need_write = op == UFAB_WR_RDMA_READ || is_atomic(op);
        for (uint32_t k = 0; k < w.wr.num_sge && !st; ++k) st = check_local(w.sge[k], need_write, &why);
      }
      if (st) {
        if (sq_head != sq_next) break;  // complete in order: after what is in flight
        fail_head(st, std::string(op_name(op)) + ": " + why);
        return work + 1;
      }
      w.checked = true;
    }
    if (gpu) {
      std::string why;
      if (gpu_tx_start(w, &why) == kLater) {
        stalled_ = true;
        break;
      }
      ++sq_next;
      ++work;
      work += gpu_tx_run();  // its first pieces staged now
      continue;
    } else if (one) {
      std::string why;
      uint32_t st = one_sided(w, &why);
      if (st == kLater) {
        stalled_ = true;
        break;
      }
      if (st) {
        if (st == UFAB_WC_REM_ACCESS_ERR || st == UFAB_WC_REM_INV_REQ_ERR) {
          // The responder's QP goes to ERROR too, as it does after a NAK.
          uint32_t zero = 0;
          peer_ctl->fatal.compare_exchange_strong(zero, st);
          notify_ = true;
          ++stats.naks_received;
        }
        fail_head(st, std::string(op_name(op)) + " to rkey " + hex(w.wr.rkey) + ": " + why);
        return work + 1;
      }
      ++work;
      if (op != UFAB_WR_RDMA_WRITE_WITH_IMM) {
        ++sq_next;
        ++sq_head;
        complete_send(w, UFAB_WC_SUCCESS, std::string());
        continue;
      }
      w.data_done = true;
    }
    if (!send_message(w)) {
      stalled_ = true;
      ++stats.stalls;
      break;
    }
    ++sq_next;
    ++work;
  }
  if (!gtxq_.empty()) stalled_ = true;  // copies to land, answers to come: polled
  return work;
}

// Completes, in order, the messages the peer finished: those before `seq`,
// and `seq` itself when inclusive.
void Qp::ack_through(uint32_t seq, bool inclusive) {
  while (sq_head < sq_next && attr.state != UFAB_QPS_ERR) {
    SendWqe& w = sq[sq_head % sq.size()];
    if (!w.sent) break;
    if (!(inclusive ? seq_le(w.seq, seq) : seq_lt(w.seq, seq))) break;
    ++sq_head;
    rnr_left = attr.rnr_retry;
    complete_send(w, UFAB_WC_SUCCESS, std::string());
  }
}

int Qp::requester_responses() {
  RingIdx* idx = in_resp.idx;
  uint64_t head = idx->head.load(std::memory_order_relaxed);
  int work = 0;
  while (in_resp.ready(head)) {  // responses are one slot each
    MsgHdr h;
    in_resp.get(head, 0, &h, sizeof h);
    ++head;
    ++work;
    if (attr.state != UFAB_QPS_RTS && attr.state != UFAB_QPS_RTR) continue;
    SendWqe* w = sq_head < sq_next ? &sq[sq_head % sq.size()] : nullptr;
    switch (h.type) {
      case kMsgAck:
        ack_through(h.seq, true);
        gpu_tx_ack(h.seq);
        break;
      case kMsgFragReady:
        if (!gtxq_.empty()) {
          std::string why;
          if (uint32_t st = gpu_tx_ready(h, &why)) fail_head(st, std::string("RDMA_READ: ") + why);
        }
        break;
      case kMsgAtomicAck:
        ack_through(h.seq, false);
        w = sq_head < sq_next ? &sq[sq_head % sq.size()] : nullptr;
        if (w && w->sent && w->seq == h.seq && is_atomic(w->wr.opcode)) {
          std::memcpy(reinterpret_cast<void*>(w->sge[0].addr), &h.value, 8);
          ++sq_head;
          rnr_left = attr.rnr_retry;
          complete_send(*w, UFAB_WC_SUCCESS, std::string());
        }
        break;
      case kMsgNak: {
        ack_through(h.seq, false);
        gpu_tx_ack(h.seq - 1);
        ++stats.naks_received;
        uint32_t st = static_cast<uint32_t>(h.value);
        std::string why = st == UFAB_WC_REM_INV_REQ_ERR ? "the responder refused the request as invalid"
                          : st == UFAB_WC_REM_ACCESS_ERR ? "the responder refused the rkey, its rights or bounds"
                          : st == UFAB_WC_REM_OP_ERR     ? "the responder could not complete it (its receive failed)"
                                                         : "the peer QP is in ERROR";
        if (int k = gpu_tx_owns(h.seq); k >= 0) {
          // A GPU work request: it fails in its turn, once the ones before
          // it (all answered) completed.
          GpuTx& t = gtxq_[static_cast<size_t>(k)];
          const uint32_t op = sq[t.wr % sq.size()].wr.opcode;
          if (st == UFAB_WC_REM_INV_REQ_ERR && (op == UFAB_WR_SEND || op == UFAB_WR_SEND_WITH_IMM)) {
            why = "the responder refused it: the message is longer than the receive posted there";
          }
          if (!t.fail) {
            t.fail = st;
            t.fail_nak = true;
            t.fail_why = std::string(op_name(op)) + ": " + why;
          }
          break;
        }
        w = sq_head < sq_next ? &sq[sq_head % sq.size()] : nullptr;
        if (!w || w->seq != h.seq) break;
        if (st == UFAB_WC_REM_INV_REQ_ERR && !is_atomic(w->wr.opcode)) {
          why = "the responder refused it: the message is longer than the receive posted there";
        }
        fail_head(st, std::string(op_name(w->wr.opcode)) + ": " + why);
        break;
      }
      case kMsgRnrNak: {
        ack_through(h.seq, false);
        gpu_tx_ack(h.seq - 1);
        ++stats.rnr_received;
        const int g = gpu_tx_owns(h.seq);
        if (g >= 0) {
          GpuTx& t = gtxq_[static_cast<size_t>(g)];
          const uint64_t wr = t.wr;
          const uint32_t op = sq[wr % sq.size()].wr.opcode;
          if (attr.rnr_retry != 7 && rnr_left == 0) {
            if (!t.fail) {
              t.fail = UFAB_WC_RNR_RETRY_EXC_ERR;
              t.fail_nak = true;
              t.fail_why = std::string(op_name(op)) + ": the peer had no receive posted, " +
                           std::to_string(attr.rnr_retry) + " RNR retries (rnr_retry) ran out";
            }
            break;
          }
          if (attr.rnr_retry != 7) --rnr_left;
          // Go back: the responder drops what followed. A SEND from GPU
          // memory starts again from its first fragment; a WRITE_WITH_IMM
          // whose data landed sends its immediate again; the GPU work
          // requests after it start over.
          const bool keep = t.imm_sent && t.imm_seq == h.seq;
          stats.retransmits += gtxq_.size() - static_cast<size_t>(g);
          gpu_tx_rewind(static_cast<size_t>(g), keep);
          msgs_sent -= next_seq - h.seq;
          sq_next = keep ? wr + 1 : wr;
          next_seq = h.seq;
          rnr_wait = true;
          rnr_until = Clock::now() + std::chrono::microseconds(rnr_timer_us(static_cast<uint32_t>(h.value)));
          break;
        }
        w = sq_head < sq_next ? &sq[sq_head % sq.size()] : nullptr;
        if (!w || w->seq != h.seq) break;
        if (attr.rnr_retry != 7 && rnr_left == 0) {
          fail_head(UFAB_WC_RNR_RETRY_EXC_ERR,
                    std::string(op_name(w->wr.opcode)) + ": the peer had no receive posted, " +
                        std::to_string(attr.rnr_retry) + " RNR retries (rnr_retry) ran out");
          break;
        }
        if (attr.rnr_retry != 7) --rnr_left;
        // Go back: the responder drops what followed; all of it goes again.
        stats.retransmits += sq_next - sq_head;
        for (uint64_t k = sq_head; k < sq_next; ++k) sq[k % sq.size()].sent = false;
        msgs_sent -= next_seq - h.seq;
        sq_next = sq_head;
        next_seq = h.seq;
        rnr_wait = true;
        rnr_until = Clock::now() + std::chrono::microseconds(rnr_timer_us(static_cast<uint32_t>(h.value)));
        break;
      }
      default: break;
    }
  }
  idx->head.store(head, std::memory_order_release);
  return work;
}

// ---------------------------------------------------------------- responder

int Qp::responder() {
  gpu_rx_drain();
  RingIdx* idx = in_req.idx;
  uint64_t head = idx->head.load(std::memory_order_relaxed);
  int work = 0;
  while (in_req.ready(head)) {
    if (attr.state == UFAB_QPS_ERR || !peer) {
      // An ERROR QP executes nothing. Where soft-RoCE's requester would
      // time out, ours learns it at once: RETRY_EXC_ERR for the oldest.
      if (peer && resp_space(1)) {
        MsgHdr h;
        in_req.get(head, 0, &h, sizeof h);
        send_resp(kMsgNak, h.seq, UFAB_WC_RETRY_EXC_ERR);
      }
      head = in_req.drop_all(head);
      break;
    }
    if (!resp_space(2)) {
      ++stats.stalls;
      break;
    }
    MsgHdr h;
    in_req.get(head, 0, &h, sizeof h);
    if (h.nslots == 0 || h.nslots > kMaxMsgSlots + 4) {
      head = in_req.drop_all(head);
      dev->log(1, "shm QP " + hex(qpn) + ": a malformed message in its ring; the QP goes to ERROR");
      enter_error();
      break;
    }
    uint64_t at = head;
    ++work;
    if (h.seq != expected_seq) {  // behind an RNR NAK: dropped, the requester sends it again
      ++stats.dropped;
      head = in_req.next(head, h.nslots);
      continue;
    }
    // GPU work (gpu.cc): Frag messages, a SEND into a GPU receive. Any
    // other message waits until the copies before it have landed, so its
    // answer and its completion come after theirs.
    const bool gpu_msg =
        h.type == kMsgFragWrite || h.type == kMsgFragRead || h.type == kMsgFragSend ||
        (h.type == kMsgSend && ((grx_.partial && grx_.partial_seq == h.seq) ||
                                (rq_head != rq_tail && h.len > 0 && recv_is_gpu(rq[rq_head % rq.size()]))));
    if (!gpu_msg && !grx_.jobs.empty()) break;
    bool fatal = false;
    if (gpu_msg) {
      int r = gpu_request(h, at);
      if (r == kRxStall) break;
      if (r == kRxDead) {
        head = in_req.drop_all(head);
        peer->dead.store(true);
        break;
      }
      if (r == kRxRnr) {
        head = in_req.next(head, h.nslots);
        continue;
      }
      fatal = r == kRxFatal;
    } else if (h.type == kMsgSend || h.type == kMsgWriteImm) {
      if (rq_head == rq_tail) {
        send_resp(kMsgRnrNak, h.seq, attr.min_rnr_timer);
        ++stats.rnr_sent;
        head = in_req.next(head, h.nslots);
        continue;
      }
      RecvWqe& r = rq[rq_head % rq.size()];
      if (h.type == kMsgWriteImm) {
        ++rq_head;
        complete_recv(r, UFAB_WC_SUCCESS, UFAB_WC_RECV_RDMA_WITH_IMM, h.len, h.imm, UFAB_WC_WITH_IMM, std::string());
      } else {
        uint64_t room = 0;
        for (uint32_t k = 0; k < r.num_sge; ++k) room += r.sge[k].length;
        std::string why;
        uint32_t st = 0;
        if (h.len > room) {
          ++rq_head;
          complete_recv(r, UFAB_WC_LOC_LEN_ERR, UFAB_WC_RECV, h.len, 0, 0,
                        "a " + std::to_string(h.len) + "-byte SEND arrived for a receive of " + std::to_string(room) +
                            " bytes");
          send_resp(kMsgNak, h.seq, UFAB_WC_REM_INV_REQ_ERR);
          fatal = true;
        } else {
          uint64_t need = h.len;
          for (uint32_t k = 0; k < r.num_sge && need > 0 && !st; ++k) {
            ufab_sge s = r.sge[k];
            if (s.length > need) s.length = static_cast<uint32_t>(need);
            st = check_local(s, true, &why);
            need -= s.length;
          }
          int e = 0;
          if (!st && h.len > 0) {
            if (h.flags & kFlagInline) {
              uint32_t off = kHdrSize;
              uint64_t left = h.len;
              for (uint32_t k = 0; k < r.num_sge && left > 0; ++k) {
                uint32_t n = static_cast<uint32_t>(r.sge[k].length < left ? r.sge[k].length : left);
                in_req.get(at, off, reinterpret_cast<void*>(r.sge[k].addr), n);
                off += n;
                left -= n;
              }
            } else {
              struct iovec local[UFAB_MAX_SGE], remote[UFAB_MAX_SGE];
              unsigned long nl = 0, nr = 0;
              uint64_t left = h.len;
              for (uint32_t k = 0; k < r.num_sge && left > 0; ++k) {
                uint64_t n = r.sge[k].length < left ? r.sge[k].length : left;
                local[nl++] = {reinterpret_cast<void*>(r.sge[k].addr), n};
                left -= n;
              }
              for (uint32_t k = 0; k < h.n_iov && k < UFAB_MAX_SGE; ++k) {
                RemoteIov v;
                in_req.get(at, kHdrSize + k * sizeof(RemoteIov), &v, sizeof v);
                remote[nr++] = {reinterpret_cast<void*>(v.addr), v.len};
              }
              e = cma(peer->pid, false, local, nl, remote, nr);
            }
          }
          if (e == ESRCH) {
            head = in_req.drop_all(head);
            peer->dead.store(true);
            break;
          }
          if (e) {
            st = UFAB_WC_LOC_PROT_ERR;
            why = "reading the sender's data failed: " + cma_words(e, false, peer->pid);
          }
          ++rq_head;
          if (st) {
            complete_recv(r, st, UFAB_WC_RECV, 0, 0, 0, "the receive's scatter list: " + why);
            send_resp(kMsgNak, h.seq, UFAB_WC_REM_OP_ERR);
            fatal = true;
          } else {
            uint32_t flags = (h.flags & kFlagImm) ? UFAB_WC_WITH_IMM : 0;
            complete_recv(r, UFAB_WC_SUCCESS, UFAB_WC_RECV, h.len, h.imm, flags, std::string());
          }
        }
      }
    } else if (h.type == kMsgAtomic) {
      AtomicBody b;
      in_req.get(at, kHdrSize, &b, sizeof b);
      std::string why;
      uint32_t nak = 0;
      KeyEntry* pin = nullptr;
      if (!(attr.access_flags & UFAB_ACCESS_REMOTE_ATOMIC)) {
        nak = UFAB_WC_REM_INV_REQ_ERR;
        why = "this QP's access_flags do not allow REMOTE_ATOMIC";
      } else if (check_remote_key(b.rkey, b.addr, 8, UFAB_ACCESS_REMOTE_ATOMIC, dev->seg, pd->id, &pin, &why)) {
        nak = UFAB_WC_REM_ACCESS_ERR;
      } else if (pin->flags.load(std::memory_order_relaxed) & kKeyGpu) {
        nak = UFAB_WC_REM_OP_ERR;
        why = "rkey " + hex(b.rkey) + " is GPU memory: atomics on GPU memory are not supported";
        pin->pins.fetch_sub(1, std::memory_order_release);
      } else if (b.addr % 8) {
        nak = UFAB_WC_REM_INV_REQ_ERR;
        pin->pins.fetch_sub(1, std::memory_order_release);
      }
      if (nak) {
        dev->log(3, "shm QP " + hex(qpn) + ": refused an atomic: " + why);
        send_resp(kMsgNak, h.seq, nak);
        fatal = true;
      } else {
        auto* p = reinterpret_cast<uint64_t*>(b.addr);
        uint64_t orig;
        if (h.flags & kFlagCmpSwp) {
          orig = b.compare_add;
          __atomic_compare_exchange_n(p, &orig, b.swap, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
        } else {
          orig = __atomic_fetch_add(p, b.compare_add, __ATOMIC_SEQ_CST);
        }
        pin->pins.fetch_sub(1, std::memory_order_release);
        send_resp(kMsgAtomicAck, h.seq, orig);
        ack_owed = false;
      }
    } else {
      head = in_req.drop_all(head);
      enter_error();
      break;
    }
    head = in_req.next(head, h.nslots);
    ++stats.rx;
    if (fatal) {
      ++stats.naks_sent;
      ack_owed = false;
      enter_error();
      head = in_req.drop_all(head);
      break;
    }
    ++expected_seq;
    ++msgs_received;
    if (h.type != kMsgAtomic) {
      ack_owed = true;
      ack_seq = h.seq;
    }
  }
  idx->head.store(head, std::memory_order_release);
  gpu_rx_drain();
  responder_ack();
  return work;
}

void Qp::peer_died_locked() {
  if (attr.state == UFAB_QPS_RTR || attr.state == UFAB_QPS_RTS) {
    std::string why = "the peer device at " + hex(peer->addr) + " (pid " + std::to_string(peer->pid) +
                      ") is gone: it closed or its process died";
    if (sq_head < sq_next) {
      fail_head(UFAB_WC_RETRY_EXC_ERR, why);
    } else {
      enter_error();
    }
  }
  release_peer();
}

int Qp::progress_locked() {
  if (type == UFAB_QPT_UD) return ud_progress_locked();
  int work = 0;
  if (peer && peer->dead.load(std::memory_order_relaxed)) {
    peer_died_locked();
    ++work;
  }
  if (uint32_t f = ctl->fatal.load(std::memory_order_relaxed)) {
    ctl->fatal.store(0);
    if (attr.state == UFAB_QPS_RTR || attr.state == UFAB_QPS_RTS) {
      dev->log(3, "shm QP " + hex(qpn) + ": the peer's one-sided operation failed (status " + std::to_string(f) +
                      "); the QP goes to ERROR");
      ++stats.naks_sent;
      enter_error();
    }
    ++work;
  }
  uint32_t st = attr.state;
  if (st == UFAB_QPS_RTR || st == UFAB_QPS_RTS || st == UFAB_QPS_ERR) {
    if (in_resp.ready(in_resp.idx->head.load(std::memory_order_relaxed))) work += requester_responses();
    if (in_req.ready(in_req.idx->head.load(std::memory_order_relaxed)) || ack_owed ||
        !grx_.jobs.empty() || !grx_.held.empty())
      work += responder();
  }
  if (attr.state == UFAB_QPS_RTS) {
    if (sq_next < sq_tail || !gtxq_.empty()) work += requester_send();
    if (sq_head < sq_next && peer_ctl && peer_ctl->qpn.load(std::memory_order_relaxed) != attr.dest_qpn) {
      fail_head(UFAB_WC_RETRY_EXC_ERR, "the peer QP " + hex(attr.dest_qpn) + " was destroyed");
    }
  }
  notify_peer();
  timer.store(rnr_wait || stalled_, std::memory_order_relaxed);
  gpu_wait.store(!gpu_idle(), std::memory_order_relaxed);
  idle.store(!(ack_owed || sq_next < sq_tail || notify_ || rnr_wait || stalled_ || !gpu_idle()),
             std::memory_order_relaxed);
  return work;
}

// ----------------------------------------------------------------------- UD
//
// Datagrams (ring.h, "UD datagrams"): the sender writes each one into a
// cell of the destination QP's queue in the destination's segment and
// completes it at once, delivered or dropped (UD: no acknowledgement); the
// receiver's progress takes the cells in order, checks them and fills its
// receives, GRH area first.

void Qp::ud_release_dests(bool dead_only) {
  for (size_t i = 0; i < ud_dests.size();) {
    if (!dead_only || (ud_dests[i].peer && ud_dests[i].peer->dead.load(std::memory_order_relaxed))) {
      if (ud_dests[i].peer) peer_unref(ud_dests[i].peer);
      ud_dests.erase(ud_dests.begin() + static_cast<ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
}

// Starts the queue a lap past every position a producer may hold: a
// producer's claim made before the reset cannot be published, and a
// producer's stale tail finds no cell free for it.
void Qp::ud_reset_queue() {
  const uint64_t head = ctl->req.tail.load(std::memory_order_acquire) + kUdCells;
  for (uint32_t k = 0; k < kUdCells; ++k) {
    ud_in->cells[(head + k) % kUdCells].h.state.store(ud_state(head + k, kUdFree, 0), std::memory_order_release);
  }
  ctl->req.head.store(head, std::memory_order_relaxed);
  ctl->req.tail.store(head, std::memory_order_release);
  ud_stuck = false;
}

// The segment of the device at `addr`: ours, or a peer's (connected on
// first use, as soft-RoCE resolves a destination's MAC on its first send).
Segment* Qp::ud_segment(uint32_t addr, std::string* why) {
  if (addr == dev->addr) return dev->seg;
  for (size_t i = 0; i < ud_dests.size(); ++i) {
    UdDest& d = ud_dests[i];
    if (d.addr != addr) continue;
    if (!d.peer->dead.load(std::memory_order_relaxed)) return d.peer->seg;
    peer_unref(d.peer);
    ud_dests.erase(ud_dests.begin() + static_cast<ptrdiff_t>(i));
    break;
  }
  try {
    Peer* p = dev->connect_peer(addr);
    ud_dests.push_back(UdDest{addr, p});
    return p->seg;
  } catch (const Error& e) {
    *why = "UD destination " + hex(addr) + ": " + e.msg;
    return nullptr;
  }
}

void Qp::ud_enqueue(Segment* s, const SendWqe& w, const unsigned char* inline_data) {
  const uint32_t idx = w.wr.ud.qpn % kMaxQp;
  QpCtl& c = s->ctl[idx];
  // No such QP there (never made, destroyed, not UD): lost, as a datagram
  // to a QP number nobody has.
  if (c.qpn.load(std::memory_order_acquire) != w.wr.ud.qpn || c.type.load(std::memory_order_relaxed) != UFAB_QPT_UD) {
    return;
  }
  const uint32_t st = c.state.load(std::memory_order_acquire);
  if (st != UFAB_QPS_RTR && st != UFAB_QPS_RTS) {
    c.ud_lost.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  UdQueue& q = s->ud[idx];
  const uint32_t me = dev->addr & kUdAddrMask;
  UdCell* cell = nullptr;
  uint64_t pos = 0;
  // Bounded: every failed try is another producer's progress.
  for (int tries = 0; tries < 64 && !cell; ++tries) {
    uint64_t t = c.req.tail.load(std::memory_order_acquire);
    UdCell& x = q.cells[t % kUdCells];
    uint64_t cs = x.h.state.load(std::memory_order_acquire);
    const int32_t d = static_cast<int32_t>(ud_pos(cs) - static_cast<uint32_t>(t));
    if (d == 0 && ud_kind(cs) == kUdFree) {
      if (x.h.state.compare_exchange_strong(cs, ud_state(t, kUdClaimed, me), std::memory_order_acq_rel)) {
        uint64_t e = t;
        c.req.tail.compare_exchange_strong(e, t + 1, std::memory_order_acq_rel);
        cell = &x;
        pos = t;
      }
    } else if (d >= 0) {
      // Cell t is taken (or already consumed): tail is behind; move it on.
      uint64_t e = t;
      c.req.tail.compare_exchange_strong(e, t + 1, std::memory_order_acq_rel);
    } else {
      break;  // the cell still holds the previous lap's datagram: full
    }
  }
  if (!cell) {
    c.ud_lost.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  UdCellHdr& h = cell->h;
  h.src_addr = dev->addr;
  h.src_qpn = qpn;
  h.dst_qpn = w.wr.ud.qpn;
  h.qkey = w.wr.ud.qkey;
  h.len = static_cast<uint32_t>(w.length);
  h.imm = w.wr.opcode == UFAB_WR_SEND_WITH_IMM ? w.wr.imm_data : 0;
  h.flags = (w.wr.opcode == UFAB_WR_SEND_WITH_IMM ? kFlagImm : 0) |
            ((w.wr.send_flags & UFAB_SEND_SOLICITED) ? kFlagSolicited : 0);
  h.traffic_class = w.wr.ud.traffic_class;
  h.hop_limit = w.wr.ud.hop_limit;
  if (inline_data) {
    std::memcpy(cell->data, inline_data, w.length);
  } else {
    unsigned char* dst = cell->data;
    for (uint32_t k = 0; k < w.wr.num_sge; ++k) {
      std::memcpy(dst, reinterpret_cast<const void*>(w.sge[k].addr), w.sge[k].length);
      dst += w.sge[k].length;
    }
  }
  uint64_t claimed = ud_state(pos, kUdClaimed, me);
  // Fails only when the receiver gave up on this cell (we were stopped
  // for a second) or reset its QP: the datagram is lost, already counted.
  if (!h.state.compare_exchange_strong(claimed, ud_state(pos, kUdReady, me), std::memory_order_release,
                                       std::memory_order_relaxed)) {
    return;
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (s->hdr.sleepers.load(std::memory_order_relaxed)) Device::wake(s);
}

int Qp::ud_send() {
  int work = 0;
  while (sq_next < sq_tail && attr.state == UFAB_QPS_RTS) {
    const uint64_t slot = sq_next % sq.size();
    SendWqe& w = sq[slot];
    ++sq_next;
    ++work;
    std::string why;
    uint32_t st = 0;
    if (!w.is_inline) {
      for (uint32_t k = 0; k < w.wr.num_sge && !st; ++k) st = check_local(w.sge[k], false, &why);
    }
    Segment* s = st ? nullptr : ud_segment(w.wr.ud.ip, &why);
    if (!st && !s) st = UFAB_WC_RETRY_EXC_ERR;  // soft-RoCE: the destination did not answer ARP
    if (!st) {
      ud_enqueue(s, w, w.is_inline ? inline_buf.data() + slot * cap.max_inline_data : nullptr);
      ++stats.tx;
    }
    // A UD QP stays in RTS after a failed datagram (soft-RoCE's).
    ++sq_head;
    complete_send(w, st, st ? std::string(op_name(w.wr.opcode)) + ": " + why : std::string());
  }
  return work;
}

void Qp::ud_deliver(const UdCellHdr& h, const unsigned char* data) {
  ++stats.rx;
  const char* drop = nullptr;
  if (attr.state != UFAB_QPS_RTR && attr.state != UFAB_QPS_RTS) {
    drop = "the QP is not in RTR or RTS";
  } else if (h.dst_qpn != qpn) {
    drop = "sent to an earlier QP of this number";
  } else if (h.qkey != attr.qkey) {
    drop = "its Q_Key differs from the QP's";
  } else if (h.len > kUdMaxData) {
    drop = "its length is larger than a cell";
  } else if (rq_head == rq_tail) {
    drop = "no receive is posted";  // UD has no RNR
  }
  if (drop) {
    ++stats.dropped;
    dev->log(3, "shm UD QP " + hex(qpn) + ": dropped a datagram from QP " + hex(h.src_qpn) + " at " +
                    hex(h.src_addr) + ": " + drop);
    return;
  }
  RecvWqe& r = rq[rq_head % rq.size()];
  ++rq_head;
  ufab_wc wc = {};
  wc.wr_id = r.wr_id;
  wc.opcode = UFAB_WC_RECV;
  wc.qp_num = qpn;
  wc.src_qp = h.src_qpn;
  wc.wc_flags = UFAB_WC_GRH;
  if (h.flags & kFlagImm) {
    wc.imm_data = h.imm;
    wc.wc_flags |= UFAB_WC_WITH_IMM;
  }
  std::string why;
  uint64_t room = 0;
  for (uint32_t k = 0; k < r.num_sge; ++k) room += r.sge[k].length;
  const uint64_t total = kGrhBytes + uint64_t{h.len};
  if (total > room) {
    wc.status = UFAB_WC_LOC_LEN_ERR;
    why = "UD datagram of " + std::to_string(h.len) + " bytes (+40 GRH) into a receive of " + std::to_string(room);
  } else {
    uint64_t need = total;
    for (uint32_t k = 0; k < r.num_sge && need > 0 && !wc.status; ++k) {
      ufab_sge s = r.sge[k];
      if (s.length > need) s.length = static_cast<uint32_t>(need);
      wc.status = check_local(s, true, &why);
      need -= s.length;
    }
  }
  if (!wc.status) {
    // The GRH area: 20 bytes of zeros, then the IPv4 header RoCEv2 would
    // have carried (the sending device's address as source).
    unsigned char grh[kGrhBytes] = {};
    unsigned char* ip = grh + 20;
    ip[0] = 0x45;
    ip[1] = h.traffic_class;
    // IPv4 + UDP + BTH + DETH [+ ImmDt] + payload + ICRC
    store_be16(ip + 2, static_cast<uint16_t>(20 + 8 + 12 + 8 + ((h.flags & kFlagImm) ? 4 : 0) + h.len + 4));
    ip[6] = 0x40;  // don't fragment
    ip[8] = h.hop_limit;
    ip[9] = 17;  // UDP
    store_be32(ip + 12, h.src_addr);
    store_be32(ip + 16, dev->addr);
    uint32_t sum = 0;
    for (int i = 0; i < 20; i += 2) sum += (uint32_t{ip[i]} << 8) | ip[i + 1];
    while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
    store_be16(ip + 10, static_cast<uint16_t>(~sum));
    const unsigned char* src[2] = {grh, data};
    const uint64_t len[2] = {kGrhBytes, h.len};
    uint32_t k = 0;
    uint64_t in = 0;  // bytes used of r.sge[k]
    for (int part = 0; part < 2; ++part) {
      uint64_t off = 0;
      while (off < len[part]) {
        while (k < r.num_sge && in == r.sge[k].length) {
          ++k;
          in = 0;
        }
        const uint64_t n = std::min<uint64_t>(r.sge[k].length - in, len[part] - off);
        std::memcpy(reinterpret_cast<unsigned char*>(r.sge[k].addr) + in, src[part] + off, n);
        in += n;
        off += n;
      }
    }
    wc.byte_len = static_cast<uint32_t>(total);
  }
  // Error completions leave the QP as it is (UD, soft-RoCE's).
  if (!rcq->push(wc, wc.status ? ("UD receive: " + why).c_str() : nullptr) && attr.state != UFAB_QPS_ERR) {
    enter_error();
  }
}

int Qp::ud_receive() {
  int work = 0;
  uint64_t head = ctl->req.head.load(std::memory_order_relaxed);
  for (uint32_t n = 0; n < kUdCells; ++n) {
    UdCell& cell = ud_in->cells[head % kUdCells];
    uint64_t cs = cell.h.state.load(std::memory_order_acquire);
    if (ud_pos(cs) != static_cast<uint32_t>(head) || ud_kind(cs) == kUdFree) break;
    if (ud_kind(cs) == kUdClaimed) {
      // A producer is writing it. One that takes long is looked at: gone
      // (its process no longer exists) after 10 ms, or stopped for 1 s,
      // and the cell is skipped, so nobody wedges the queue.
      const auto now = Clock::now();
      if (!ud_stuck || ud_stuck_pos != head) {
        ud_stuck = true;
        ud_stuck_pos = head;
        ud_stuck_since = now;
        break;
      }
      const auto waited = now - ud_stuck_since;
      bool gone = false;
      const pid_t pid = static_cast<pid_t>(ud_addr(cs) >> 8);
      if (waited >= std::chrono::milliseconds(10) && pid != dev->pid) gone = ::kill(pid, 0) != 0 && errno == ESRCH;
      if (!gone && waited < std::chrono::seconds(1)) break;
      if (!cell.h.state.compare_exchange_strong(cs, ud_state(head + kUdCells, kUdFree, 0),
                                                std::memory_order_acq_rel)) {
        continue;  // published meanwhile: taken in the next pass
      }
      ++stats.dropped;
      dev->log(2, "shm UD QP " + hex(qpn) + ": skipped a datagram that device " + hex(ud_addr(cs)) + " began " +
                      (gone ? "and died writing" : "and did not finish in 1 s"));
      ud_stuck = false;
      ++head;
      ++work;
      continue;
    }
    ud_stuck = false;
    // Read once, then checked: the producer is done with the cell.
    UdCellHdr h;
    h.src_addr = cell.h.src_addr;
    h.src_qpn = cell.h.src_qpn;
    h.dst_qpn = cell.h.dst_qpn;
    h.qkey = cell.h.qkey;
    h.len = cell.h.len;
    h.imm = cell.h.imm;
    h.flags = cell.h.flags;
    h.traffic_class = cell.h.traffic_class;
    h.hop_limit = cell.h.hop_limit;
    ud_deliver(h, cell.data);
    cell.h.state.store(ud_state(head + kUdCells, kUdFree, 0), std::memory_order_release);
    ++head;
    ++work;
  }
  ctl->req.head.store(head, std::memory_order_release);
  return work;
}

int Qp::ud_progress_locked() {
  int work = 0;
  if (ctl->ud_lost.load(std::memory_order_relaxed)) stats.dropped += ctl->ud_lost.exchange(0);
  if (!ud_dests.empty()) ud_release_dests(true);  // peers that died: reconnected on the next send
  const uint32_t st = attr.state;
  if (st == UFAB_QPS_RTR || st == UFAB_QPS_RTS || st == UFAB_QPS_ERR) work += ud_receive();
  if (attr.state == UFAB_QPS_RTS && sq_next < sq_tail) work += ud_send();
  timer.store(ud_stuck, std::memory_order_relaxed);
  gpu_wait.store(false, std::memory_order_relaxed);
  idle.store(!(sq_next < sq_tail || ud_stuck), std::memory_order_relaxed);
  return work;
}

}  // namespace ufab::shm
