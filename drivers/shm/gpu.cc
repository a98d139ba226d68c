// GPU memory on the shm provider (docs/gpu.md, "shm"). CMA cannot reach
// device memory, so only the process that owns a GPU buffer moves its
// bytes, between the GPU and pinned slots of its device's staging pool
// (core/staging: the copy engine and pool soft-RoCE uses). CMA and mapped
// regions move host bytes only: application host memory and slots.
//
//   requester, GPU memory here, host region there (WRITE, READ): one-sided
//     as for host memory, a piece at a time through a slot;
//   a GPU region there (WRITE, WRITE_WITH_IMM's data, READ): kMsgFragWrite
//     and kMsgFragRead; the owner executes them through its slots;
//   SEND from GPU memory: kMsgFragSend, a piece at a time from slots;
//   SEND into a GPU receive: the receiver pulls into its slots.
//
// A peer reads a requester's slot (kMsgFragWrite/Send) and a requester
// reads a responder's slot (kMsgFragReady); nobody writes into a peer's
// slot, so a slot is reused only once nobody can still be reading it.
//
// CUDA IPC (GPU memory on both sides of a WRITE, WRITE_WITH_IMM or READ,
// two processes, the CUDA engine): a GPU region's allocation is exported
// at registration (Segment::ipc); the requester sends its GPU pieces as
// Frag messages with kFlagIpc (laddr: its GPU address, up to kIpcPiece
// bytes, no slot) and the responder, after the checks it makes for any
// Frag message, has its copy thread open the requester's allocation
// (cached per peer and handle) and copy device to device, one
// cuMemcpyAsync, on the engine's device-to-device stream; the completion
// word and the ACK / kMsgFragReady (kFlagIpc: nothing to read) follow as
// for staged pieces. Whatever cannot go that way stages as above.
#include <sys/uio.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <functional>
#include <map>

#include "core/gpu/cuda.h"
#include "core/gpu/region.h"
#include "core/staging/fake_engine.h"
#include "drivers/shm/shm.h"
#include "drivers/shm/shm_impl.h"

namespace ufab::shm {
namespace {

bool seq_le(uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b) <= 0; }
bool seq_lt(uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b) < 0; }

using staging::CopyEngine;
using staging::CopySegment;

// A piece of a GPU work request copied through CUDA IPC: one copy (and
// one Frag message) per this many bytes of an SGE.
constexpr uint64_t kIpcPiece = 64ull << 20;

}  // namespace

GpuPathCounters& gpu_counters() {
  static GpuPathCounters c;
  return c;
}

GpuPathStats gpu_path_stats() {
  GpuPathCounters& c = gpu_counters();
  return GpuPathStats{c.ipc_wrs.load(),          c.staged_wrs.load(), c.ipc_copies.load(),
                      c.staged_pieces.load(),    c.ipc_opens.load(),  c.ipc_closes.load(),
                      c.ipc_open_failures.load(), c.ipc_exports.load(), c.ipc_export_refused.load()};
}

// ------------------------------------------------------------------ device

void Device::take_gpu_params(const ufab_device_opts* opts) {
  std::map<std::string, std::string> kv;
  if (opts && opts->params) {
    for (const char* const* p = opts->params; *p; ++p) {
      std::string s = *p;
      auto eq = s.find('=');
      if (eq == std::string::npos) continue;
      if (s.rfind("gpu_", 0) == 0) kv[s.substr(0, eq)] = s.substr(eq + 1);
    }
  }
  // The gpu_* keys only: other parameters (a swnic's loss=, ...) are not
  // the shm provider's and are ignored, as before. gpu_ipc is ours.
  if (auto it = kv.find("gpu_ipc"); it != kv.end()) {
    if (it->second != "0" && it->second != "1") {
      throw Error(EINVAL, "opening \"" + name + "\": gpu_ipc=" + it->second +
                              ": say 1 (GPU<->GPU through CUDA IPC when possible, the default) or 0 (always "
                              "through the staging slots)");
    }
    ipc_param = it->second == "1";
    kv.erase(it);
  }
  auto p = staging::take_params(kv);
  if (!p) throw Error(p.error().code(), "opening \"" + name + "\": " + p.error().message());
  if (!kv.empty()) {
    throw Error(EINVAL, "opening \"" + name + "\": unknown parameter " + kv.begin()->first +
                            "; the shm provider takes gpu_copy, gpu_frag, gpu_depth, gpu_slots, gpu_ipc, "
                            "gpu_fake_delay_us and gpu_fake_order");
  }
  gparams = *p;
}

staging::Pool* Device::staging_for(int ordinal) {
  std::lock_guard<std::mutex> g(pool_mu);
  if (pool) {
    if (pool->ordinal() != ordinal) {
      throw Error(EOPNOTSUPP, "GPU memory on GPU " + std::to_string(ordinal) + ": " + name + " stages through GPU " +
                                  std::to_string(pool->ordinal()) +
                                  " already (one GPU per device); open another shm device for the other GPU");
    }
    return pool.get();
  }
  auto p = staging::Pool::create(gparams, ordinal);
  if (!p) throw Error(p.error().code(), "GPU staging pipeline of " + name + ": " + p.error().message());
  pool = std::move(*p);
  pool_ptr.store(pool.get(), std::memory_order_release);
  // Peers may send us their GPU pieces through CUDA IPC: say so, with our
  // GPU's PCI address (peers check they can reach it).
  if (ipc_param && !gparams.fake && std::string(pool->engine().name()) == "cuda") {
    if (auto d = gpu::Driver::get()) {
      if (auto info = (*d)->device(ordinal)) {
        std::snprintf(seg->hdr.gpu_pci, sizeof seg->hdr.gpu_pci, "%s", info->pci_address.c_str());
        seg->hdr.gpu_ipc.store(1, std::memory_order_release);
      }
    }
  }
  return pool.get();
}

// Closes an opened IPC mapping on the copy thread, after the copies
// queued before (which may still read or write through it).
static void close_after_copies(staging::Pool& pool, std::shared_ptr<IpcMap> m) {
  const gpu::Driver* d = gpu::Driver::if_loaded();
  pool.engine().after_copies([m = std::move(m), d] {
    if (m->mapped && d) {
      (void)d->ipc_close(m->mapped);
      gpu_counters().ipc_closes.fetch_add(1, std::memory_order_relaxed);
    }
    m->mapped = 0;
  });
}

void Device::ipc_forget(const Peer* p) {
  staging::Pool* pl = pool_ptr.load(std::memory_order_acquire);
  std::lock_guard<std::mutex> g(ipc_mu);
  std::erase_if(ipc_maps, [&](const std::shared_ptr<IpcMap>& m) {
    if (p && m->peer != p) return false;
    if (pl) close_after_copies(*pl, m);
    return true;
  });
}

bool Device::gpu_buffer_ok(uint32_t index, uint64_t addr, std::string* why) const {
  const GpuKey& k = gpu_keys[index];
  if (gparams.fake) {
    // Made-up ids: host memory standing for GPU memory; a test marks a
    // range freed (staging::fake_free) to stand for cuMemFree.
    if (!staging::fake_freed(addr)) return true;
    *why = "the GPU memory under key index " + std::to_string(index) + " (fake buffer id " +
           std::to_string(k.buffer_id) +
           ") was freed; the region no longer names it (deregister it before freeing the memory, and register the "
           "new allocation)";
    return false;
  }
  uint64_t now = 0;
  if (const gpu::Driver* d = gpu::Driver::if_loaded()) {
    auto id = d->buffer_id(reinterpret_cast<const void*>(static_cast<uintptr_t>(addr)));
    if (id) now = *id;
  }
  if (now == k.buffer_id) return true;
  *why = "the GPU memory under key index " + std::to_string(index) + " (CUDA buffer id " +
         std::to_string(k.buffer_id) + ") was freed" +
         (now != 0 ? " and the address reallocated (buffer id " + std::to_string(now) + ")" : std::string()) +
         "; the region no longer names it (deregister it before freeing the memory, and register the new "
         "allocation)";
  return false;
}

void Device::reap_quarantine(bool all) {
  std::lock_guard<std::mutex> g(quarantine_mu);
  staging::Pool* p = pool_ptr.load(std::memory_order_acquire);
  std::erase_if(quarantine, [&](Quarantined& q) {
    bool free = all || q.peer->dead.load() || q.idx->head.load(std::memory_order_acquire) >= q.ring_end;
    if (!free) return false;
    if (p) {
      if (q.ticket >= 0) {
        p->orphan(static_cast<uint32_t>(q.ticket), q.slot);
      } else {
        p->give(q.slot);
      }
    }
    peer_unref(q.peer);
    return true;
  });
  quarantined.store(static_cast<uint32_t>(quarantine.size()), std::memory_order_release);
}

// --------------------------------------------------------------- requester

bool Qp::remote_gpu(const SendWqe& w) const {
  uint32_t op = w.wr.opcode;
  if (op != UFAB_WR_RDMA_WRITE && op != UFAB_WR_RDMA_WRITE_WITH_IMM && op != UFAB_WR_RDMA_READ) return false;
  if (!peer || w.length == 0) return false;
  const KeyEntry& e = peer->seg->keys[w.wr.rkey & (kMaxMr - 1)];
  return e.key.load(std::memory_order_acquire) == w.wr.rkey && (e.flags.load(std::memory_order_relaxed) & kKeyGpu);
}

// Whether the peer's device copies our GPU pieces through CUDA IPC: the
// CUDA engine here with gpu_ipc on, a peer in another process whose pool
// says it opens IPC handles (SegHeader::gpu_ipc), on our GPU or one with
// peer access to it. Decided once per peer.
bool Qp::ipc_usable() {
  if (!dev->ipc_param || dev->gparams.fake || !peer) return false;
  int known = peer->ipc_ok.load(std::memory_order_acquire);
  if (known >= 0) return known == 1;
  staging::Pool* pool = dev->pool_ptr.load(std::memory_order_acquire);
  bool ok = false;
  std::string why;
  if (!pool || std::string(pool->engine().name()) != "cuda") {
    why = "no CUDA copy engine here";
  } else if (peer->pid == dev->pid) {
    why = "the peer device is in this process (CUDA IPC is between processes)";
  } else if (peer->seg->hdr.gpu_ipc.load(std::memory_order_acquire) != 1) {
    why = "the peer device does not open CUDA IPC handles (gpu_ipc=0, or no CUDA engine there yet)";
  } else if (auto d = gpu::Driver::get(); !d) {
    why = d.error().message();
  } else {
    char pci[sizeof peer->seg->hdr.gpu_pci + 1] = {};
    std::memcpy(pci, peer->seg->hdr.gpu_pci, sizeof peer->seg->hdr.gpu_pci);
    auto theirs = (*d)->ordinal_of_pci(pci);
    if (!theirs) {
      why = theirs.error().message();
    } else if (auto can = (*d)->can_access_peer(pool->ordinal(), *theirs); !can) {
      why = can.error().message();
    } else if (!*can) {
      why = "GPU " + std::to_string(pool->ordinal()) + " has no peer access to the peer's GPU " + pci;
    } else {
      ok = true;
    }
  }
  if (!ok) dev->log(2, "shm device " + dev->name + ": GPU memory to peer pid " + std::to_string(peer->pid) +
                           " goes through the staging slots, not CUDA IPC: " + why);
  peer->ipc_ok.store(ok ? 1 : 0, std::memory_order_release);
  return ok;
}

// The one-sided copy of host bytes between `local` and the peer's region
// (key pinned and checked): a mapped region's memcpy, or CMA.
uint32_t Qp::remote_copy(uint32_t rkey, uint64_t raddr, void* local, uint64_t len, bool read, std::string* why) {
  KeyEntry* pin = nullptr;
  uint32_t right = read ? UFAB_ACCESS_REMOTE_READ : UFAB_ACCESS_REMOTE_WRITE;
  if (uint32_t s = check_remote_key(rkey, raddr, len, right, peer->seg, peer_ctl->pd.load(std::memory_order_acquire),
                                    &pin, why)) {
    return s;
  }
  if (pin->flags.load(std::memory_order_relaxed) & kKeyGpu) {
    // Registered again as GPU memory meanwhile: never copied from here.
    pin->pins.fetch_sub(1, std::memory_order_release);
    *why = "rkey " + hex(rkey) + " names GPU memory at the target now";
    return UFAB_WC_REM_ACCESS_ERR;
  }
  int e = 0;
  const DirectMap* dm = direct(rkey, *pin);
  if (dm && dm->base && (read || dm->writable)) {
    unsigned char* r = dm->base + (raddr - dm->addr);
    if (read) {
      std::memcpy(local, r, len);
    } else {
      std::memcpy(r, local, len);
    }
  } else {
    struct iovec l = {local, len}, r = {reinterpret_cast<void*>(raddr), len};
    e = cma(peer->pid, !read, &l, 1, &r, 1);
  }
  pin->pins.fetch_sub(1, std::memory_order_release);
  if (e == 0) return 0;
  if (e == ESRCH) {
    *why = "the peer process (pid " + std::to_string(peer->pid) + ") is gone";
    return UFAB_WC_RETRY_EXC_ERR;
  }
  *why = cma_words(e, !read, peer->pid);
  return UFAB_WC_REM_OP_ERR;
}

// Whether the GPU work request `w` at sq_next may start now: with nothing
// in flight, or behind GPU work requests only, of its kind (all Frag
// messages or all one-sided; READs only behind READs, so a READ never
// overtakes a WRITE's copies into the same GPU memory at the responder,
// nor a WRITE a READ's), the last one staged whole, with a piece of the
// gpu_depth budget free and fewer than 2 * gpu_depth in flight.
bool Qp::gpu_tx_may_join(const SendWqe& w) const {
  if (sq_head == sq_next) return true;
  if (gtxq_.empty() || gtxq_.size() != sq_next - sq_head) return false;  // other work in flight
  const GpuTx& last = gtxq_.back();
  if ((w.wr.opcode == UFAB_WR_RDMA_READ) != (last.type == kMsgFragRead)) return false;
  if (last.fail || !last.staged_all()) return false;
  const bool send = w.wr.opcode == UFAB_WR_SEND || w.wr.opcode == UFAB_WR_SEND_WITH_IMM;
  if ((send || remote_gpu(w)) != last.messages) return false;
  staging::Pool* pool = dev->pool_ptr.load(std::memory_order_acquire);
  const uint32_t depth = pool ? pool->depth() : dev->gparams.depth;
  if (gtxq_.size() >= 2 * size_t{depth}) return false;
  size_t staged = 0;
  for (const GpuTx& t : gtxq_) {
    for (const TxFrag& f : t.frags) staged += f.released ? 0 : 1;
  }
  return staged < depth;
}

// Starts the GPU work request at sq_next: queued in gtxq_ (a failure
// found here is queued too, completed in its turn). 0, or kLater (0xFFFF:
// the peer QP is not ready yet, or the work request is of another kind
// than those in flight).
uint32_t Qp::gpu_tx_start(SendWqe& w, std::string* why) {
  uint32_t op = w.wr.opcode;
  bool send = op == UFAB_WR_SEND || op == UFAB_WR_SEND_WITH_IMM;
  GpuTx t;
  t.wr = sq_next;
  t.total = w.length;
  t.imm = op == UFAB_WR_RDMA_WRITE_WITH_IMM;
  auto failed = [&](uint32_t st) {
    t.fail = st;
    t.fail_why = *why;
    t.next_off = t.total;  // nothing to stage
    gtxq_.push_back(std::move(t));
    return 0u;
  };
  if (!send) {
    uint32_t st = peer_ctl->state.load(std::memory_order_acquire);
    if (peer_ctl->qpn.load(std::memory_order_acquire) != attr.dest_qpn) {
      *why = "the peer QP " + hex(attr.dest_qpn) + " was destroyed";
      return failed(UFAB_WC_RETRY_EXC_ERR);
    }
    if (st == UFAB_QPS_RESET || st == UFAB_QPS_INIT) return 0xFFFF;  // later
    if (st == UFAB_QPS_ERR) {
      *why = "the peer QP " + hex(attr.dest_qpn) + " is in ERROR and answers nothing";
      return failed(UFAB_WC_RETRY_EXC_ERR);
    }
    bool read = op == UFAB_WR_RDMA_READ;
    uint32_t right = read ? UFAB_ACCESS_REMOTE_READ : UFAB_ACCESS_REMOTE_WRITE;
    if (!(peer_ctl->access.load(std::memory_order_acquire) & right)) {
      *why = std::string("the target QP ") + hex(attr.dest_qpn) + " does not allow " +
             (read ? "REMOTE_READ" : "REMOTE_WRITE") + " (its access_flags)";
      return failed(UFAB_WC_REM_INV_REQ_ERR);
    }
    KeyEntry* pin = nullptr;
    if (uint32_t s = check_remote_key(w.wr.rkey, w.wr.remote_addr, w.length, right, peer->seg,
                                      peer_ctl->pd.load(std::memory_order_acquire), &pin, why)) {
      return failed(s);
    }
    t.messages = (pin->flags.load(std::memory_order_relaxed) & kKeyGpu) != 0;
    pin->pins.fetch_sub(1, std::memory_order_release);
    t.type = read ? kMsgFragRead : kMsgFragWrite;
    t.ipc = t.messages && w.local_gpu && ipc_usable();
  } else {
    t.messages = true;
    t.type = kMsgFragSend;
  }
  // The key was registered again as another kind since gpu_tx_may_join
  // looked: after the ones in flight.
  if (!gtxq_.empty() && t.messages != gtxq_.back().messages) return 0xFFFF;
  gtxq_.push_back(std::move(t));
  return 0;
}

int Qp::gpu_tx_owns(uint32_t seq) const {
  for (size_t k = 0; k < gtxq_.size(); ++k) {
    const GpuTx& t = gtxq_[k];
    if (t.imm_sent && t.imm_seq == seq) return static_cast<int>(k);
    for (const TxFrag& f : t.frags) {
      if (f.sent && f.seq == seq) return static_cast<int>(k);
    }
  }
  return -1;
}

// An ACK through `seq`: the responder is done with those Frag messages
// (their slots go back) and those kMsgWriteImm.
void Qp::gpu_tx_ack(uint32_t seq) {
  for (GpuTx& t : gtxq_) {
    if (t.imm_sent && seq_le(t.imm_seq, seq)) t.imm_acked = true;
    if (t.type == kMsgFragRead) continue;
    for (TxFrag& f : t.frags) {
      if (f.sent && seq_le(f.seq, seq)) f.acked = true;
    }
  }
}

// kMsgFragReady: part of a READ fragment staged at the responder; read it
// now (the responder holds that slot until `consumed` passes the message).
uint32_t Qp::gpu_tx_ready(const MsgHdr& h, std::string* why) {
  for (GpuTx& t : gtxq_) {
    if (t.type != kMsgFragRead) continue;
    for (TxFrag& f : t.frags) {
      if (!f.sent || f.seq != h.seq) continue;
      if (h.imm > f.len || h.len > f.len - h.imm) {
        *why = "the responder answered a READ fragment with bytes outside it";
        return UFAB_WC_REM_OP_ERR;
      }
      if (h.flags & kFlagIpc) {
        // Placed in our GPU memory by the responder's copy through CUDA IPC.
        if (!f.ipc) {
          *why = "the responder answered a staged READ fragment as a CUDA IPC one";
          return UFAB_WC_REM_OP_ERR;
        }
      } else {
        struct iovec l = {reinterpret_cast<void*>(f.laddr + h.imm), h.len},
                     r = {reinterpret_cast<void*>(h.value), h.len};
        int e = cma(peer->pid, false, &l, 1, &r, 1);
        if (e == ESRCH) {
          *why = "the peer process (pid " + std::to_string(peer->pid) + ") is gone";
          return UFAB_WC_RETRY_EXC_ERR;
        }
        if (e) {
          *why = "reading the responder's staged bytes: " + cma_words(e, false, peer->pid);
          return UFAB_WC_REM_OP_ERR;
        }
      }
      f.pulled += h.len;
      if (f.pulled == f.len) {
        f.acked = true;
        peer_ctl->consumed.store(f.seq + 1, std::memory_order_release);
      }
      return 0;
    }
  }
  return 0;  // not ours (a READ failed meanwhile): ignored
}

// One round of one GPU work request: copies that landed, finished pieces
// retired (their budget back), pieces staged ahead (may_stage: the ones
// before it are staged whole; *budget: pieces free of gpu_depth), Frag
// messages and kMsgWriteImm sent (may_send: the ones before it sent all
// theirs, so the peer's ring keeps the send queue's order).
int Qp::gpu_tx_step(GpuTx& t, SendWqe& w, bool may_stage, bool may_send, uint32_t* budget, uint32_t* status,
                    std::string* why) {
  staging::Pool* pool = dev->pool_ptr.load(std::memory_order_acquire);
  const uint64_t frag = pool ? pool->frag() : dev->gparams.frag;
  const bool read = t.type == kMsgFragRead;
  auto failed = [&](uint32_t st, const std::string& m) {
    *status = st;
    *why = m;
    return kGpuFailed;
  };
  if (peer_ctl->qpn.load(std::memory_order_acquire) != attr.dest_qpn) {
    return failed(UFAB_WC_RETRY_EXC_ERR, "the peer QP " + hex(attr.dest_qpn) + " was destroyed");
  }
  // Copies that landed.
  for (TxFrag& f : t.frags) {
    if (f.ticket < 0) continue;
    uint32_t s = pool->engine().state(static_cast<uint32_t>(f.ticket));
    if (s == CopyEngine::kPending) continue;
    std::string m = s == CopyEngine::kFailed ? pool->engine().failure(static_cast<uint32_t>(f.ticket)) : "";
    pool->engine().release(static_cast<uint32_t>(f.ticket));
    f.ticket = -1;
    ++gtx_work_;
    if (s == CopyEngine::kFailed) return failed(UFAB_WC_LOC_PROT_ERR, "the GPU copy engine failed: " + m);
    if (read) {
      f.done = true;  // placed in GPU memory
    } else {
      f.staged = true;
    }
  }
  // Frag messages whose bytes the responder has read (QpCtl::pulled, in
  // order): their slots go back now, before the ACK (which waits for the
  // bytes to land in the responder's GPU), and they leave the budget.
  if (t.messages && !read) {
    const uint32_t pulled = ctl->pulled.load(std::memory_order_acquire);
    for (TxFrag& f : t.frags) {
      if (f.released) continue;
      if (!f.sent || !seq_lt(f.seq, pulled)) break;
      f.released = true;
      if (f.slot) {
        pool->give(*f.slot);
        f.slot.reset();
      }
      ++*budget;
      ++gtx_work_;
    }
  }
  // One-sided pieces (a host region at the peer) and READ pieces whose
  // bytes are all here.
  for (TxFrag& f : t.frags) {
    if (f.done || f.ticket >= 0) continue;
    if (!t.messages && !f.acked) {
      if (!read && !f.staged) continue;
      uint64_t raddr = w.wr.remote_addr + f.off;
      if (uint32_t st = remote_copy(w.wr.rkey, raddr, reinterpret_cast<void*>(f.laddr), f.len, read, why)) {
        *status = st;
        return kGpuFailed;
      }
      f.acked = true;
      ++stats.tx;
      ++gtx_work_;
      if (!read || !f.slot) f.done = true;
    } else if (f.acked && (!read || !f.slot)) {
      f.done = true;
    }
    if (read && f.acked && f.slot && !f.done) {
      CopySegment seg{reinterpret_cast<void*>(f.gaddr), reinterpret_cast<const void*>(f.laddr), f.len};
      auto tk = pool->engine().submit(std::span<const CopySegment>(&seg, 1));
      if (!tk) break;  // the engine is full: next round
      f.ticket = *tk;
    }
  }
  // Retire finished pieces, in order.
  while (!t.frags.empty() && t.frags.front().done) {
    if (t.frags.front().slot) pool->give(*t.frags.front().slot);
    if (!t.frags.front().released) ++*budget;
    t.frags.pop_front();
  }
  // Stage more.
  while (may_stage && *budget > 0 && t.next_off < t.total) {
    while (t.sge < w.wr.num_sge && t.sge_off >= w.sge[t.sge].length) {
      ++t.sge;
      t.sge_off = 0;
    }
    const ufab_sge& s = w.sge[t.sge];
    const GpuKey& gk = dev->gpu_keys[s.lkey & (kMaxMr - 1)];
    const bool g = gk.gpu;
    const bool ipc = g && t.ipc && gk.ipc;
    uint64_t n = s.length - t.sge_off;
    if (n > (ipc ? kIpcPiece : frag)) n = ipc ? kIpcPiece : frag;
    if (n > t.total - t.next_off) n = t.total - t.next_off;
    TxFrag f;
    f.off = t.next_off;
    f.len = static_cast<uint32_t>(n);
    if (ipc) {
      // The responder copies it from / into our GPU memory directly.
      f.ipc = true;
      f.lkey = s.lkey;
      f.laddr = s.addr + t.sge_off;
      f.staged = true;
      f.released = true;  // no slot: outside the gpu_depth budget (which paces slots)
      t.used_ipc = true;
    } else if (!g) {
      f.laddr = s.addr + t.sge_off;
      f.staged = true;
    } else {
      t.used_slots = true;
      if (!pool) return failed(UFAB_WC_LOC_PROT_ERR, "GPU memory without a staging pool");
      auto slot = pool->take();
      if (!slot) break;  // all slots taken: next round
      f.slot = *slot;
      f.laddr = reinterpret_cast<uint64_t>(pool->slot(*slot));
      f.gaddr = s.addr + t.sge_off;
      if (!read) {
        CopySegment seg{reinterpret_cast<void*>(f.laddr), reinterpret_cast<const void*>(f.gaddr), n};
        auto tk = pool->engine().submit(std::span<const CopySegment>(&seg, 1));
        if (!tk) {
          pool->give(*slot);
          break;
        }
        f.ticket = *tk;
      }
    }
    t.frags.push_back(f);
    t.next_off += n;
    t.sge_off += n;
    if (!ipc) --*budget;
    ++gtx_work_;
  }
  if (!may_send) return kGpuPending;
  // Frag messages, in order, for pieces whose bytes are ready.
  auto ring_room = [&](uint32_t nslots) {
    uint64_t tail = out_req.idx->tail.load(std::memory_order_relaxed);
    if (tail + nslots - out_req_head <= kRingSlots) return true;
    out_req_head = out_req.idx->head.load(std::memory_order_acquire);
    if (tail + nslots - out_req_head <= kRingSlots) return true;
    ++stats.stalls;
    return false;
  };
  bool blocked = false;
  if (t.messages) {
    for (TxFrag& f : t.frags) {
      if (f.sent) continue;
      if (!read && !f.staged) {
        blocked = true;
        break;
      }
      MsgHdr h = {};
      h.type = t.type;
      h.nslots = static_cast<uint8_t>(msg_slots(sizeof(FragBody)));
      h.seq = next_seq;
      h.len = f.len;
      FragBody b = {};
      b.laddr = f.laddr;
      b.rkey = w.wr.rkey;
      if (f.ipc) {
        h.flags |= kFlagIpc;
        b.lkey = f.lkey;
      }
      if (t.type == kMsgFragSend) {
        b.off = f.off;
        h.value = t.total;
        if (f.off + f.len == t.total) h.flags |= kFlagLast;
        if (w.wr.opcode == UFAB_WR_SEND_WITH_IMM) {
          h.flags |= kFlagImm;
          h.imm = w.wr.imm_data;
        }
        if (w.wr.send_flags & UFAB_SEND_SOLICITED) h.flags |= kFlagSolicited;
      } else {
        b.raddr = w.wr.remote_addr + f.off;
      }
      if (!ring_room(h.nslots)) {
        blocked = true;
        break;
      }
      uint64_t tail = out_req.idx->tail.load(std::memory_order_relaxed);
      out_req.put(tail, 0, &h, sizeof h);
      out_req.put(tail, kHdrSize, &b, sizeof b);
      out_req.publish(tail, h.nslots);
      f.sent = true;
      f.seq = next_seq++;
      f.ring_end = tail + h.nslots;
      if (f.off == 0) w.seq = f.seq;  // an RNR NAK names the first
      ++msgs_sent;
      ++stats.tx;
      ++gtx_work_;
      notify_ = true;
    }
  }
  // WRITE_WITH_IMM's immediate: after the last piece's message (the
  // responder holds it until their copies landed), or, one-sided, once
  // every piece is at the target.
  if (t.imm && !t.imm_sent && !blocked && t.staged_all() && (t.messages || t.frags.empty())) {
    MsgHdr h = {};
    h.type = kMsgWriteImm;
    h.nslots = 1;
    h.seq = next_seq;
    h.len = static_cast<uint32_t>(t.total);
    h.flags = kFlagImm;
    h.imm = w.wr.imm_data;
    if (w.wr.send_flags & UFAB_SEND_SOLICITED) h.flags |= kFlagSolicited;
    if (ring_room(1)) {
      uint64_t tail = out_req.idx->tail.load(std::memory_order_relaxed);
      out_req.put(tail, 0, &h, sizeof h);
      out_req.publish(tail, 1);
      t.imm_sent = true;
      t.imm_seq = next_seq++;
      w.seq = t.imm_seq;
      ++msgs_sent;
      ++stats.tx;
      ++gtx_work_;
      notify_ = true;
    }
  }
  return t.finished() ? kGpuDone : kGpuPending;
}

// Every GPU work request in flight, one round each in send-queue order;
// then those finished at the head of the send queue complete, in order,
// and a failed one at the head fails (the QP goes to ERROR).
int Qp::gpu_tx_run() {
  if (gtxq_.empty()) return 0;
  gtx_work_ = 0;
  staging::Pool* pool = dev->pool_ptr.load(std::memory_order_acquire);
  const uint32_t depth = pool ? pool->depth() : dev->gparams.depth;
  size_t inflight = 0;
  for (const GpuTx& t : gtxq_) {
    for (const TxFrag& f : t.frags) inflight += f.released ? 0 : 1;
  }
  uint32_t budget = inflight < depth ? depth - static_cast<uint32_t>(inflight) : 0;
  bool may_stage = true, may_send = !rnr_wait;
  for (GpuTx& t : gtxq_) {
    if (t.fail) break;  // nothing after a failed one moves
    uint32_t st = 0;
    std::string why;
    if (gpu_tx_step(t, sq[t.wr % sq.size()], may_stage, may_send, &budget, &st, &why) == kGpuFailed) {
      t.fail = st;
      t.fail_why = why;
      break;
    }
    may_stage = may_stage && t.staged_all();
    may_send = may_send && t.sent_all();
  }
  int work = gtx_work_;
  while (!gtxq_.empty() && gtxq_.front().wr == sq_head && attr.state == UFAB_QPS_RTS) {
    GpuTx& t = gtxq_.front();
    SendWqe& w = sq[t.wr % sq.size()];
    const uint32_t op = w.wr.opcode;
    if (t.fail) {
      const uint32_t st = t.fail;
      const bool send = op == UFAB_WR_SEND || op == UFAB_WR_SEND_WITH_IMM;
      if (!t.fail_nak && (st == UFAB_WC_REM_ACCESS_ERR || st == UFAB_WC_REM_INV_REQ_ERR)) {
        // The responder's QP goes to ERROR too, as it does after a NAK.
        uint32_t zero = 0;
        peer_ctl->fatal.compare_exchange_strong(zero, st);
        notify_ = true;
        ++stats.naks_received;
      }
      std::string detail = t.fail_nak ? t.fail_why
                                      : std::string(op_name(op)) + (send ? "" : " to rkey " + hex(w.wr.rkey)) + ": " +
                                            t.fail_why;
      fail_head(st, detail);  // enter_error clears gtxq_
      return work + 1;
    }
    if (!t.finished()) break;
    if (t.used_ipc) gpu_counters().ipc_wrs.fetch_add(1, std::memory_order_relaxed);
    if (t.used_slots) gpu_counters().staged_wrs.fetch_add(1, std::memory_order_relaxed);
    gtxq_.pop_front();
    ++sq_head;
    rnr_left = attr.rnr_retry;
    ++work;
    complete_send(w, UFAB_WC_SUCCESS, std::string());
  }
  return work;
}

// One GPU work request ends (failed, flushed, RNR restart, reset): slots
// back to the pool, or to the quarantine while the peer may still read
// one (a Frag message sent and not answered), or as orphans while a copy
// into one runs.
void Qp::gpu_tx_drop(GpuTx& t) {
  staging::Pool* pool = dev->pool_ptr.load(std::memory_order_acquire);
  if (!pool) return;
  for (TxFrag& f : t.frags) {
    if (!f.slot) {
      if (f.ticket >= 0) pool->orphan(static_cast<uint32_t>(f.ticket), std::nullopt);
      continue;
    }
    bool peer_may_read = t.messages && t.type != kMsgFragRead && f.sent && !f.acked && peer && !peer->dead.load();
    if (peer_may_read) {
      peer_ref(peer);
      std::lock_guard<std::mutex> g(dev->quarantine_mu);
      dev->quarantine.push_back(Quarantined{*f.slot, f.ticket, peer, out_req.idx, f.ring_end});
      dev->quarantined.store(static_cast<uint32_t>(dev->quarantine.size()), std::memory_order_release);
    } else if (f.ticket >= 0) {
      pool->orphan(static_cast<uint32_t>(f.ticket), f.slot);
    } else {
      pool->give(*f.slot);
    }
  }
  t.frags.clear();
}

void Qp::gpu_tx_clear() {
  for (GpuTx& t : gtxq_) gpu_tx_drop(t);
  gtxq_.clear();
}

// An RNR NAK for a message of gtxq_[k]: it and everything after it go
// again after the timer (the responder drops what followed). keep: the
// NAK named gtxq_[k]'s kMsgWriteImm, whose data landed: only that goes
// again; else (a SEND's first fragment) gtxq_[k] starts over too.
void Qp::gpu_tx_rewind(size_t k, bool keep) {
  const size_t from = keep ? k + 1 : k;
  while (gtxq_.size() > from) {
    gpu_tx_drop(gtxq_.back());
    gtxq_.pop_back();
  }
  if (keep) {
    gtxq_[k].imm_sent = false;
    gtxq_[k].imm_acked = false;
  }
}

// --------------------------------------------------------------- responder

bool Qp::recv_is_gpu(const RecvWqe& r) const {
  if (dev->gpu_regions.load(std::memory_order_relaxed) == 0) return false;
  for (uint32_t k = 0; k < r.num_sge; ++k) {
    if (r.sge[k].length && dev->gpu_keys[r.sge[k].lkey & (kMaxMr - 1)].gpu) return true;
  }
  return false;
}

// Reads bytes [pos, pos + sum of local) of the message at `at` into the
// local iovecs: from the ring (inline SEND), the sender's iovec list
// (SEND), or laddr (Frag messages). 0 or an errno.
int Qp::gpu_pull(const MsgHdr& h, uint64_t at, uint64_t laddr, uint64_t pos, struct iovec* local, unsigned long nl) {
  uint64_t want = 0;
  for (unsigned long k = 0; k < nl; ++k) want += local[k].iov_len;
  if (h.type == kMsgSend && (h.flags & kFlagInline)) {
    uint32_t off = kHdrSize + static_cast<uint32_t>(pos);
    for (unsigned long k = 0; k < nl; ++k) {
      in_req.get(at, off, local[k].iov_base, local[k].iov_len);
      off += static_cast<uint32_t>(local[k].iov_len);
    }
    return 0;
  }
  struct iovec remote[UFAB_MAX_SGE];
  unsigned long nr = 0;
  if (h.type == kMsgSend) {
    uint64_t skip = pos;
    for (uint32_t k = 0; k < h.n_iov && k < UFAB_MAX_SGE && want > 0; ++k) {
      RemoteIov v;
      in_req.get(at, kHdrSize + k * sizeof(RemoteIov), &v, sizeof v);
      if (skip >= v.len) {
        skip -= v.len;
        continue;
      }
      uint64_t n = v.len - skip;
      if (n > want) n = want;
      remote[nr++] = {reinterpret_cast<void*>(v.addr + skip), n};
      skip = 0;
      want -= n;
    }
  } else {
    remote[nr++] = {reinterpret_cast<void*>(laddr + pos), want};
  }
  return cma(peer->pid, false, local, nl, remote, nr);
}

// kMsgFragWrite/Read with kFlagIpc: the requester's GPU memory at laddr
// (key lkey, its allocation exported in its segment) and ours at raddr of
// rkey, copied device to device by our copy thread through CUDA IPC, the
// whole message as one copy. The checks are those of a staged piece
// (rights, the key, our buffer id) plus the requester's export.
int Qp::gpu_request_ipc(const MsgHdr& h, const FragBody& b, bool write, uint32_t right,
                        const std::function<int(uint32_t, const std::string&)>& nak) {
  GpuRx& rx = grx_;
  staging::Pool* pool = dev->pool_ptr.load(std::memory_order_acquire);
  const uint64_t n = h.len;
  std::string why;
  KeyEntry* pin = nullptr;
  if (check_remote_key(b.rkey, b.raddr, n, right, dev->seg, pd->id, &pin, &why)) {
    return nak(UFAB_WC_REM_ACCESS_ERR, why);
  }
  const uint32_t index = b.rkey & (kMaxMr - 1);
  auto unpin = [&] { pin->pins.fetch_sub(1, std::memory_order_release); };
  if (!(pin->flags.load(std::memory_order_relaxed) & kKeyGpu) || !pool) {
    unpin();
    return nak(UFAB_WC_REM_ACCESS_ERR, "rkey " + hex(b.rkey) + " is not GPU memory (registered again?)");
  }
  if (!dev->gpu_buffer_ok(index, b.raddr, &why)) {
    unpin();
    return nak(UFAB_WC_REM_ACCESS_ERR, "rkey " + hex(b.rkey) + ": " + why);
  }
  // The requester's export: its key still that one, the bytes inside the
  // exported allocation (read twice around the copy of the handle).
  const IpcExport& x = peer->seg->ipc[b.lkey & (kMaxMr - 1)];
  const KeyEntry& lk = peer->seg->keys[b.lkey & (kMaxMr - 1)];
  IpcMap want;
  const bool before = x.key.load(std::memory_order_acquire) == b.lkey && lk.key.load(std::memory_order_acquire) == b.lkey;
  want.base = x.base;
  want.size = x.size;
  std::memcpy(want.handle, x.handle, sizeof want.handle);
  std::atomic_thread_fence(std::memory_order_acquire);
  const bool after = x.key.load(std::memory_order_relaxed) == b.lkey;
  if (!before || !after || b.laddr < want.base || n > want.size || b.laddr - want.base > want.size - n) {
    unpin();
    return nak(UFAB_WC_REM_OP_ERR, "the requester's GPU memory under lkey " + hex(b.lkey) +
                                       " is not exported for CUDA IPC any more (deregistered?) or the piece is "
                                       "outside it");
  }
  std::optional<uint32_t> ticket;
  {
    // Looked up and submitted under ipc_mu: a close (ipc_forget, an
    // eviction) queued after this copy runs after it.
    std::lock_guard<std::mutex> g(dev->ipc_mu);
    if (peer->dead.load()) {
      // Its mappings are being closed (ipc_forget): none opened again.
      unpin();
      return kRxDead;
    }
    std::shared_ptr<IpcMap> m;
    for (auto& e : dev->ipc_maps) {
      if (e->peer == peer && e->pid == peer->pid && e->base == want.base &&
          std::memcmp(e->handle, want.handle, sizeof want.handle) == 0) {
        m = e;
        break;
      }
    }
    if (!m) {
      if (dev->ipc_maps.size() >= Device::kIpcMaps) {
        auto lru = std::min_element(dev->ipc_maps.begin(), dev->ipc_maps.end(),
                                    [](const auto& a, const auto& c) { return a->last_use < c->last_use; });
        std::shared_ptr<IpcMap> old = *lru;
        dev->ipc_maps.erase(lru);
        close_after_copies(*pool, old);
      }
      m = std::make_shared<IpcMap>(want);
      m->peer = peer;
      m->pid = peer->pid;
      dev->ipc_maps.push_back(m);
    }
    m->last_use = ++dev->ipc_clock;
    const uint64_t off = b.laddr - want.base;
    const pid_t pid = peer->pid;
    // Theirs is filled in on the copy thread, once the handle is open.
    CopySegment seg = write ? CopySegment{reinterpret_cast<void*>(b.raddr), nullptr, n}
                            : CopySegment{nullptr, reinterpret_cast<const void*>(b.raddr), n};
    auto prepare = [m, off, write, pid](std::vector<CopySegment>& segs) -> std::string {
      if (!m->mapped && m->error.empty()) {
        auto d = gpu::Driver::get();
        auto p = d ? (*d)->ipc_open(m->handle) : Result<uint64_t>(std::unexpected(d.error()));
        if (p) {
          m->mapped = *p;
          gpu_counters().ipc_opens.fetch_add(1, std::memory_order_relaxed);
        } else {
          m->error = p.error().message();
          gpu_counters().ipc_open_failures.fetch_add(1, std::memory_order_relaxed);
        }
      }
      if (!m->mapped) {
        return "CUDA IPC: opening the GPU allocation of process " + std::to_string(pid) + " failed: " + m->error +
               " (open both shm devices with gpu_ipc=0 to stage GPU<->GPU through host slots instead)";
      }
      void* theirs = reinterpret_cast<void*>(static_cast<uintptr_t>(m->mapped + off));
      if (write) {
        segs[0].src = theirs;
      } else {
        segs[0].dst = theirs;
      }
      return std::string();
    };
    auto t = pool->engine().submit(std::span<const CopySegment>(&seg, 1), std::move(prepare), true);
    if (t) ticket = *t;
  }
  if (!ticket) {
    unpin();
    return kRxStall;  // the engine is full: next round
  }
  RxJob j;
  j.seq = h.seq;
  j.ticket = *ticket;
  j.pin = pin;
  j.ready = !write;
  j.ipc = true;
  j.piece_off = 0;
  j.piece_len = static_cast<uint32_t>(n);
  rx.jobs.push_back(j);
  rx.done = n;
  rx.partial = false;
  gpu_counters().ipc_copies.fetch_add(1, std::memory_order_relaxed);
  if (write) peer_ctl->pulled.store(h.seq + 1, std::memory_order_release);
  return kRxNext;
}

// A message that carries GPU work (a Frag message, or a SEND into a GPU
// receive), started or resumed at the ring's head. kRxNext: done with it;
// kRxStall: try again next round (no slot, copies to finish first);
// kRxRnr: RNR NAK sent; kRxFatal: NAK sent, the QP goes to ERROR;
// kRxDead: the peer process is gone.
int Qp::gpu_request(const MsgHdr& h, uint64_t at) {
  GpuRx& rx = grx_;
  FragBody b = {};
  if (h.type != kMsgSend) in_req.get(at, kHdrSize, &b, sizeof b);
  staging::Pool* pool = dev->pool_ptr.load(std::memory_order_acquire);
  const uint64_t frag = pool ? pool->frag() : dev->gparams.frag;
  auto nak = [&](uint32_t st, const std::string& why) {
    if (!rx.jobs.empty()) return kRxStall;  // answers keep their order: after the copies before
    dev->log(3, "shm QP " + hex(qpn) + ": refused a request: " + why);
    rx.partial = false;
    send_resp(kMsgNak, h.seq, st);
    return kRxFatal;
  };
  const bool resumed = rx.partial && rx.partial_seq == h.seq;

  if (h.type == kMsgFragWrite || h.type == kMsgFragRead) {
    const bool write = h.type == kMsgFragWrite;
    const uint32_t right = write ? UFAB_ACCESS_REMOTE_WRITE : UFAB_ACCESS_REMOTE_READ;
    if (!resumed) {
      if (!(attr.access_flags & right)) {
        return nak(UFAB_WC_REM_INV_REQ_ERR, std::string("this QP's access_flags do not allow ") +
                                                (write ? "REMOTE_WRITE" : "REMOTE_READ"));
      }
      rx.partial = true;
      rx.partial_seq = h.seq;
      rx.done = 0;
    }
    if ((h.flags & kFlagIpc) && rx.done < h.len) return gpu_request_ipc(h, b, write, right, nak);
    while (rx.done < h.len) {
      uint64_t n = h.len - rx.done;
      if (n > frag) n = frag;
      const uint64_t raddr = b.raddr + rx.done;
      std::string why;
      KeyEntry* pin = nullptr;
      if (check_remote_key(b.rkey, raddr, n, right, dev->seg, pd->id, &pin, &why)) {
        return nak(UFAB_WC_REM_ACCESS_ERR, why);
      }
      const uint32_t index = b.rkey & (kMaxMr - 1);
      if (!(pin->flags.load(std::memory_order_relaxed) & kKeyGpu) || !pool) {
        pin->pins.fetch_sub(1, std::memory_order_release);
        return nak(UFAB_WC_REM_ACCESS_ERR, "rkey " + hex(b.rkey) + " is not GPU memory (registered again?)");
      }
      if (!dev->gpu_buffer_ok(index, raddr, &why)) {
        pin->pins.fetch_sub(1, std::memory_order_release);
        return nak(UFAB_WC_REM_ACCESS_ERR, "rkey " + hex(b.rkey) + ": " + why);
      }
      auto slot = pool->take();
      if (!slot) {
        pin->pins.fetch_sub(1, std::memory_order_release);
        return kRxStall;
      }
      uint8_t* sp = pool->slot(*slot);
      if (write) {
        struct iovec l = {sp, n};
        int e = gpu_pull(h, at, b.laddr, rx.done, &l, 1);
        if (e) {
          pool->give(*slot);
          pin->pins.fetch_sub(1, std::memory_order_release);
          if (e == ESRCH) return kRxDead;
          return nak(UFAB_WC_REM_OP_ERR, "reading the requester's bytes: " + cma_words(e, false, peer->pid));
        }
      }
      CopySegment seg = write ? CopySegment{reinterpret_cast<void*>(raddr), sp, n}
                              : CopySegment{sp, reinterpret_cast<const void*>(raddr), n};
      auto t = pool->engine().submit(std::span<const CopySegment>(&seg, 1));
      if (!t) {
        pool->give(*slot);
        pin->pins.fetch_sub(1, std::memory_order_release);
        return kRxStall;
      }
      RxJob j;
      j.seq = h.seq;
      j.ticket = *t;
      j.slot = *slot;
      j.pin = pin;
      j.ready = !write;
      j.piece_off = static_cast<uint32_t>(rx.done);
      j.piece_len = static_cast<uint32_t>(n);
      rx.jobs.push_back(j);
      rx.done += n;
      gpu_counters().staged_pieces.fetch_add(1, std::memory_order_relaxed);
    }
    rx.partial = false;
    // The requester's slot is read: it may have it back before the ACK.
    if (write) peer_ctl->pulled.store(h.seq + 1, std::memory_order_release);
    return kRxNext;
  }

  // A SEND: kMsgSend into a GPU receive, or kMsgFragSend (from GPU memory).
  const bool frag_send = h.type == kMsgFragSend;
  const uint64_t msg_off = frag_send ? b.off : 0;
  const bool last = !frag_send || (h.flags & kFlagLast);
  if (!resumed) {
    if (!frag_send || b.off == 0) {
      // A receive is taken: only with nothing before it in flight, so its
      // answer (RNR NAK, NAK) and its completion keep their order.
      if (!rx.jobs.empty()) return kRxStall;
      if (rq_head == rq_tail) {
        send_resp(kMsgRnrNak, h.seq, attr.min_rnr_timer);
        ++stats.rnr_sent;
        return kRxRnr;
      }
      RecvWqe& r = rq[rq_head % rq.size()];
      const uint64_t total = frag_send ? h.value : h.len;
      uint64_t room = 0;
      for (uint32_t k = 0; k < r.num_sge; ++k) room += r.sge[k].length;
      if (total > room) {
        ++rq_head;
        complete_recv(r, UFAB_WC_LOC_LEN_ERR, UFAB_WC_RECV, static_cast<uint32_t>(total), 0, 0,
                      "a " + std::to_string(total) + "-byte SEND arrived for a receive of " + std::to_string(room) +
                          " bytes");
        send_resp(kMsgNak, h.seq, UFAB_WC_REM_INV_REQ_ERR);
        return kRxFatal;
      }
      std::string why;
      uint32_t st = 0;
      uint64_t need = total;
      for (uint32_t k = 0; k < r.num_sge && need > 0 && !st; ++k) {
        ufab_sge s = r.sge[k];
        if (s.length > need) s.length = static_cast<uint32_t>(need);
        st = check_local(s, true, &why);
        const uint32_t index = s.lkey & (kMaxMr - 1);
        if (!st && s.length && dev->gpu_keys[index].gpu && !dev->gpu_buffer_ok(index, s.addr, &why)) {
          st = UFAB_WC_LOC_PROT_ERR;
          why = "lkey " + hex(s.lkey) + ": " + why;
        }
        need -= s.length;
      }
      if (st) {
        ++rq_head;
        complete_recv(r, st, UFAB_WC_RECV, 0, 0, 0, "the receive's scatter list: " + why);
        send_resp(kMsgNak, h.seq, UFAB_WC_REM_OP_ERR);
        return kRxFatal;
      }
      rx.recv = r;
      rx.recv_open = true;
      rx.recv_total = total;
      ++rq_head;
    } else if (!rx.recv_open) {
      dev->log(1, "shm QP " + hex(qpn) + ": a SEND fragment without its start; the QP goes to ERROR");
      return kRxFatal;
    }
    rx.partial = true;
    rx.partial_seq = h.seq;
    rx.done = 0;
  }
  const RecvWqe& r = rx.recv;
  while (rx.done < h.len) {
    uint64_t n = h.len - rx.done;
    if (n > frag) n = frag;
    // Where [msg_off + done, + n) goes: pieces of the receive's SGEs.
    struct iovec dst[UFAB_MAX_SGE];
    unsigned long nd = 0;
    bool any_gpu = false;
    uint64_t skip = msg_off + rx.done, left = n;
    for (uint32_t k = 0; k < r.num_sge && left > 0; ++k) {
      if (skip >= r.sge[k].length) {
        skip -= r.sge[k].length;
        continue;
      }
      uint64_t m = r.sge[k].length - skip;
      if (m > left) m = left;
      dst[nd++] = {reinterpret_cast<void*>(r.sge[k].addr + skip), m};
      if (dev->gpu_keys[r.sge[k].lkey & (kMaxMr - 1)].gpu) any_gpu = true;
      skip = 0;
      left -= m;
    }
    if (!any_gpu) {
      int e = gpu_pull(h, at, b.laddr, rx.done, dst, nd);
      if (e == ESRCH) return kRxDead;
      if (e) {
        if (!rx.jobs.empty()) return kRxStall;
        rx.recv_open = false;
        rx.partial = false;
        complete_recv(r, UFAB_WC_LOC_PROT_ERR, UFAB_WC_RECV, 0, 0, 0,
                      "reading the sender's data failed: " + cma_words(e, false, peer->pid));
        send_resp(kMsgNak, h.seq, UFAB_WC_REM_OP_ERR);
        return kRxFatal;
      }
    } else {
      if (!pool) return kRxFatal;
      auto slot = pool->take();
      if (!slot) return kRxStall;
      uint8_t* sp = pool->slot(*slot);
      struct iovec l = {sp, n};
      int e = gpu_pull(h, at, b.laddr, rx.done, &l, 1);
      if (e) {
        pool->give(*slot);
        if (e == ESRCH) return kRxDead;
        if (!rx.jobs.empty()) return kRxStall;
        rx.recv_open = false;
        rx.partial = false;
        complete_recv(r, UFAB_WC_LOC_PROT_ERR, UFAB_WC_RECV, 0, 0, 0,
                      "reading the sender's data failed: " + cma_words(e, false, peer->pid));
        send_resp(kMsgNak, h.seq, UFAB_WC_REM_OP_ERR);
        return kRxFatal;
      }
      CopySegment segs[UFAB_MAX_SGE];
      uint64_t o = 0;
      for (unsigned long k = 0; k < nd; ++k) {
        segs[k] = CopySegment{dst[k].iov_base, sp + o, dst[k].iov_len};
        o += dst[k].iov_len;
      }
      auto t = pool->engine().submit(std::span<const CopySegment>(segs, nd));
      if (!t) {
        pool->give(*slot);
        return kRxStall;
      }
      RxJob j;
      j.seq = h.seq;
      j.ticket = *t;
      j.slot = *slot;
      rx.jobs.push_back(j);
      gpu_counters().staged_pieces.fetch_add(1, std::memory_order_relaxed);
    }
    rx.done += n;
  }
  rx.partial = false;
  if (frag_send) peer_ctl->pulled.store(h.seq + 1, std::memory_order_release);
  if (last) {
    rx.recv_open = false;
    const uint32_t flags = (h.flags & kFlagImm) ? UFAB_WC_WITH_IMM : 0;
    if (rx.jobs.empty()) {
      complete_recv(r, UFAB_WC_SUCCESS, UFAB_WC_RECV, static_cast<uint32_t>(rx.recv_total), h.imm, flags,
                    std::string());
    } else {
      RxJob j;
      j.seq = h.seq;
      j.completion = true;
      j.r = r;
      j.len = static_cast<uint32_t>(rx.recv_total);
      j.imm = h.imm;
      j.flags = flags;
      rx.jobs.push_back(j);
    }
  }
  return kRxNext;
}

// Copies that landed, in order: pins dropped, READ fragments answered
// (their slots held until the requester read them), receive completions
// made, slots given back. A failed copy NAKs its request.
void Qp::gpu_rx_drain() {
  GpuRx& rx = grx_;
  staging::Pool* pool = dev->pool_ptr.load(std::memory_order_acquire);
  if (!pool) return;
  if (!rx.held.empty()) {
    const uint32_t consumed = ctl->consumed.load(std::memory_order_acquire);
    while (!rx.held.empty() && seq_lt(rx.held.front().seq, consumed)) {
      pool->give(rx.held.front().slot);
      rx.held.pop_front();
    }
  }
  while (!rx.jobs.empty()) {
    RxJob& j = rx.jobs.front();
    if (j.ticket >= 0) {
      uint32_t s = pool->engine().state(static_cast<uint32_t>(j.ticket));
      if (s == CopyEngine::kPending) return;
      if (s == CopyEngine::kFailed) {
        std::string m = pool->engine().failure(static_cast<uint32_t>(j.ticket));
        dev->log(1, "shm QP " + hex(qpn) + ": the GPU copy engine failed: " + m + "; the QP goes to ERROR");
        if (!resp_space(1)) return;
        send_resp(kMsgNak, j.seq, UFAB_WC_REM_OP_ERR);
        ++stats.naks_sent;
        enter_error();  // clears the jobs (this one too)
        return;
      }
      pool->engine().release(static_cast<uint32_t>(j.ticket));
      j.ticket = -1;
      if (j.pin) {
        j.pin->pins.fetch_sub(1, std::memory_order_release);
        j.pin = nullptr;
      }
    }
    if (j.ready) {
      if (!resp_space(1)) return;
      MsgHdr h = {};
      h.type = kMsgFragReady;
      h.nslots = 1;
      h.seq = j.seq;
      h.len = j.piece_len;
      h.imm = j.piece_off;
      if (j.ipc) {
        h.flags = kFlagIpc;  // placed in the requester's GPU memory: nothing to read or hold
      } else {
        h.value = reinterpret_cast<uint64_t>(pool->slot(*j.slot));
      }
      uint64_t tail = out_resp.idx->tail.load(std::memory_order_relaxed);
      out_resp.put(tail, 0, &h, sizeof h);
      out_resp.publish(tail, 1);
      notify_ = true;
      j.ready = false;  // answered (a later `return` in this loop must not answer again)
      if (j.slot) {
        rx.held.push_back(GpuRx::Held{j.seq, *j.slot});
        j.slot.reset();
      }
    }
    if (j.completion) complete_recv(j.r, UFAB_WC_SUCCESS, UFAB_WC_RECV, j.len, j.imm, j.flags, std::string());
    if (j.slot) pool->give(*j.slot);
    rx.jobs.pop_front();
  }
}

// The ACK owed, as far as placement allows: with copies running, through
// the message before the first of them.
void Qp::responder_ack() {
  if (!ack_owed) return;
  if (grx_.jobs.empty()) {
    if (send_resp(kMsgAck, ack_seq, 0)) {
      ack_owed = false;
      grx_.have_ack = true;
      grx_.last_ack = ack_seq;
    }
    return;
  }
  const uint32_t s = grx_.jobs.front().seq - 1;
  if (!seq_lt(s, ack_seq) && s != ack_seq) return;
  if (grx_.have_ack && !seq_lt(grx_.last_ack, s)) return;
  if (send_resp(kMsgAck, s, 0)) {
    grx_.have_ack = true;
    grx_.last_ack = s;
  }
}

// The QP leaves RTS/RTR (ERROR, RESET, destroy): copies orphaned, pins
// dropped, waiting receive completions flushed, held slots given back.
void Qp::gpu_rx_clear(bool complete) {
  GpuRx& rx = grx_;
  staging::Pool* pool = dev->pool_ptr.load(std::memory_order_acquire);
  static const std::string kFlushed = "flushed: the QP is in ERROR";
  for (RxJob& j : rx.jobs) {
    if (j.pin) j.pin->pins.fetch_sub(1, std::memory_order_release);
    if (pool) {
      if (j.ticket >= 0) {
        pool->orphan(static_cast<uint32_t>(j.ticket), j.slot);
      } else if (j.slot) {
        pool->give(*j.slot);
      }
    }
    if (j.completion && complete) complete_recv(j.r, UFAB_WC_WR_FLUSH_ERR, UFAB_WC_RECV, 0, 0, 0, kFlushed);
  }
  if (pool) {
    for (auto& h : rx.held) pool->give(h.slot);
  }
  if (rx.recv_open && complete) complete_recv(rx.recv, UFAB_WC_WR_FLUSH_ERR, UFAB_WC_RECV, 0, 0, 0, kFlushed);
  rx = GpuRx{};
}

}  // namespace ufab::shm
