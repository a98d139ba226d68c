// The shared-memory layout of one shm device: what a peer maps (the
// device's memfd segment) and the messages that travel through its rings.
// docs/drivers/shm.md describes the protocol; this header is its data.
//
//   Segment (one memfd per device, mapped MAP_SHARED by the device and by
//   every peer that connected to it):
//     SegHeader        magic, version, owner, the futex word peers wake
//     KeyEntry[kMaxMr] the published memory-key table (one cache line each)
//     QpCtl[kMaxQp]    per QP: number, state, PD, access flags, who is
//                      connected, and the indices of its two inbound rings
//     rings            per QP: a request ring (the connected peer's
//                      requests) and a response ring (the peer's ACKs,
//                      NAKs and atomic replies), kRingSlots 64-byte slots
//     ud               per QP: the inbound datagram queue of a UD QP,
//                      kUdCells cells of one datagram each (pages are
//                      touched only for UD QPs)
//
// Every ring has one producer (the connected peer QP, under its lock) and
// one consumer (the owning QP, under its lock). The producer writes a
// message's slots, then its first slot's `stamp` (release: the message is
// there) and advances `tail`; the consumer polls the stamp of the slot at
// its `head` (acquire), never `tail`, so a one-slot message costs the
// consumer one cache line from the producer: stamp, header and (up to 32
// bytes) data together. The consumer publishes `head`, which the producer
// re-reads only when the ring looks full. Nothing else is shared per
// message.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace ufab::shm {

constexpr uint32_t kSegMagic = 0x7566736d;  // "ufsm"
// 2: KeyEntry names the file behind a MAP_SHARED region; 3: GPU regions,
// Frag messages; 4: QpCtl::pulled (several GPU work requests in flight per
// QP); 5: a message's first slot carries its stamp (the consumer polls
// slots, not `tail`), 32-byte MsgHdr; 6: UD queues; 7: CUDA IPC exports
// (IpcExport, SegHeader::gpu_ipc/gpu_pci, kFlagIpc, FragBody::lkey).
constexpr uint32_t kSegVersion = 7;

constexpr uint32_t kMaxQp = 256;      // QP index: the low 8 bits of the QPN
constexpr uint32_t kMaxMr = 4096;     // key index: the low 12 bits of a key
constexpr uint32_t kKeyIndexBits = 12;
constexpr uint32_t kRingSlots = 256;  // per ring, power of two
constexpr uint32_t kSlotSize = 64;
constexpr uint32_t kRingBytes = kRingSlots * kSlotSize;

// A message's first slot starts with a MsgHdr; the rest of the message
// (inline data, an iovec list, atomic operands) follows it byte for byte,
// across as many slots as it needs, wrapping at the ring's end.
constexpr uint32_t kHdrSize = 32;
// SEND payloads up to this many bytes travel inside the ring; larger ones
// are pulled by the receiver from the sender's memory (CMA).
constexpr uint32_t kRingInlineMax = 1024;
constexpr uint32_t kMaxMsgSlots = (kHdrSize + kRingInlineMax + kSlotSize - 1) / kSlotSize;

enum MsgType : uint8_t {
  // Requests (request ring)
  kMsgSend = 1,      // len bytes; kFlagInline: data follows, else n_iov RemoteIov
  kMsgWriteImm = 2,  // the completion of a WRITE_WITH_IMM whose data already landed
  kMsgAtomic = 3,    // AtomicBody follows
  // GPU memory (docs/gpu.md, "shm"): a FragBody follows; len is the
  // fragment's bytes. Each is executed by the process that owns the GPU
  // memory; the requester offers only host addresses (a host buffer or one
  // of its staging slots), which the responder reads with CMA.
  kMsgFragWrite = 4,  // place len bytes read from the requester's laddr at raddr of rkey (a GPU region)
  kMsgFragRead = 5,   // stage len bytes of raddr of rkey (a GPU region); answered by kMsgFragReady
  kMsgFragSend = 6,   // bytes [off, off + len) of a SEND of `value` bytes, read from laddr; kFlagLast ends it
  // Responses (response ring)
  kMsgAck = 16,        // every request up to and including seq is done
  kMsgAtomicAck = 17,  // requests before seq done; seq's original value in `value`
  kMsgNak = 18,        // requests before seq done; seq failed with status `value`
  kMsgRnrNak = 19,     // requests before seq done; seq found no receive: retry after timer `value`
  kMsgFragReady = 20,  // requests before seq done; len bytes of kMsgFragRead seq, from byte `imm` of
                       // the fragment, are at `value` in the responder's memory (a staging slot, held
                       // until the requester's QpCtl::consumed passes seq)
};

enum MsgFlags : uint8_t {
  kFlagInline = 1,     // the SEND payload is in the ring
  kFlagImm = 2,        // imm is valid
  kFlagSolicited = 4,  // the sender asked for a solicited event
  kFlagCmpSwp = 8,     // atomic: compare-and-swap (else fetch-and-add)
  kFlagLast = 16,      // kMsgFragSend: the SEND's last fragment
  // kMsgFragWrite/Read: laddr is the requester's GPU memory, in the
  // allocation exported under FragBody::lkey (its IpcExport): the
  // responder copies device to device through CUDA IPC, no slot on either
  // side. kMsgFragReady: the bytes are placed in the requester's GPU
  // memory already (value 0, nothing to read, nothing held).
  kFlagIpc = 32,
};

struct MsgHdr {
  // stamp_of(the ring position of this slot), written last by the producer
  // (RingView::publish); anything else (0, a stale stamp of an earlier lap)
  // means the message is not there yet.
  uint32_t stamp;
  uint8_t type;
  uint8_t nslots;  // slots this message takes, this one included
  uint8_t flags;
  uint8_t n_iov;
  uint32_t seq;  // the requester's message sequence number
  uint32_t len;  // SEND: payload bytes; WRITE_IMM: the WRITE's length
  uint32_t imm;
  uint32_t reserved;
  uint64_t value;  // responses: original value, status or RNR timer code
};
static_assert(sizeof(MsgHdr) == kHdrSize);
static_assert(offsetof(MsgHdr, stamp) == 0 && offsetof(MsgHdr, nslots) == 5);

// Where the payload of a large SEND is in the sender's address space.
struct RemoteIov {
  uint64_t addr;
  uint64_t len;
};

struct FragBody {
  uint64_t raddr;  // kMsgFragWrite/Read: the responder's address (in the region of rkey)
  uint64_t laddr;  // kMsgFragWrite/Send: where the bytes are in the requester's address space
  uint64_t off;    // kMsgFragSend: the fragment's offset in the SEND
  uint32_t rkey;
  uint32_t lkey;   // kFlagIpc: the requester's key of laddr (its IpcExport says which allocation)
};

struct AtomicBody {
  uint64_t addr;
  uint64_t compare_add;
  uint64_t swap;
  uint32_t rkey;
  uint32_t reserved;
};

// One registered region as peers see it. `key` is written last on
// registration (release) and cleared first on deregistration; a peer pins
// before it reads the key and unpins after its copy, so deregistration
// waits for copies in flight (bounded).
//
// When the region lies in one MAP_SHARED mapping of a file (a memfd, a
// file in /dev/shm) and the owner holds a descriptor of that file, `fd1` is
// that descriptor + 1 and file_off, file_dev, file_ino say where and which
// file: a peer opens /proc/<owner pid>/fd/<fd1 - 1>, checks the file is
// that one, maps the region's pages and copies with memcpy instead of CMA.
// fd1 0: no such file; peers use CMA.
// flags & kKeyGpu: the region is GPU memory (or, with gpu_copy=fake, host
// memory standing for it): no peer ever copies it; operations on it are
// Frag messages its owner executes through its staging pool.
constexpr uint32_t kKeyGpu = 1;
struct alignas(64) KeyEntry {
  std::atomic<uint32_t> key;  // 0: free
  std::atomic<uint32_t> pins;
  std::atomic<uint32_t> access;
  std::atomic<uint32_t> pd;
  std::atomic<uint64_t> addr;
  std::atomic<uint64_t> length;
  std::atomic<uint32_t> fd1;
  std::atomic<uint32_t> flags;
  std::atomic<uint64_t> file_off;
  std::atomic<uint64_t> file_dev;
  std::atomic<uint64_t> file_ino;
};
static_assert(sizeof(KeyEntry) == 64);

// A GPU region's allocation exported for CUDA IPC (by index, beside its
// KeyEntry): written by the owner at registration before the key is
// published, when cuIpcGetMemHandle accepts the memory; `key` is the
// region's key then, 0 when nothing is exported (VMM or pool memory,
// gpu_copy=fake, gpu_ipc=0). A peer checks `key` against the key it was
// given before it trusts the rest.
constexpr uint32_t kIpcHandleBytes = 64;
struct alignas(64) IpcExport {
  std::atomic<uint32_t> key;
  uint32_t reserved;
  uint64_t base;       // the allocation in the owner's address space
  uint64_t size;
  uint64_t buffer_id;  // CUDA's id of the allocation in the owner
  unsigned char handle[kIpcHandleBytes];  // CUipcMemHandle
};
static_assert(sizeof(IpcExport) == 128);

struct alignas(64) RingIdx {
  std::atomic<uint64_t> tail;  // producer
  char pad0[56];
  std::atomic<uint64_t> head;  // consumer
  char pad1[56];
};

struct alignas(64) QpCtl {
  std::atomic<uint32_t> qpn;    // 0: no QP
  std::atomic<uint32_t> state;  // enum ufab_qp_state
  std::atomic<uint32_t> pd;
  std::atomic<uint32_t> access;  // the QP's remote access flags
  // (peer address << 32) | peer QPN of the one QP allowed to produce into
  // this QP's rings; 0: nobody.
  std::atomic<uint64_t> producer;
  // Set by a peer whose one-sided operation on this QP failed with a
  // fatal error (the status): the owner moves the QP to ERROR.
  std::atomic<uint32_t> fatal;
  // Written by the connected peer: 1 + the sequence number of the last
  // kMsgFragRead whose staged bytes it has read (this QP's slots held for
  // them go back to the pool).
  std::atomic<uint32_t> consumed;
  // Written by the connected peer (as responder): 1 + the sequence number
  // of the last kMsgFragWrite/kMsgFragSend whose bytes it has read from
  // this QP's memory (this QP's slots for them go back to the pool then,
  // before the ACK, which waits for placement).
  std::atomic<uint32_t> pulled;
  std::atomic<uint32_t> type;  // enum ufab_qp_type (RC or UD)
  // UD: datagrams for this QP that senders could not enqueue (the queue
  // was full, or the QP not in RTR/RTS); the owner adds them to its
  // dropped count.
  std::atomic<uint32_t> ud_lost;
  char pad[12];
  // RC: the request ring's indices. UD: `tail` is the next cell position
  // producers claim, `head` the owner's next one to take.
  RingIdx req;
  RingIdx resp;
};

struct alignas(64) SegHeader {
  uint32_t magic;
  uint32_t version;
  uint32_t addr;  // the device's endpoint address
  uint32_t pid;
  uint64_t size;
  uint32_t max_qp, max_mr, ring_slots, slot_size;
  // 1 once this device's staging pool runs the CUDA copy engine with
  // gpu_ipc on (it opens peers' IpcExports); gpu_pci is that GPU's PCI
  // address ("0000:01:00.0"), written before gpu_ipc (release).
  std::atomic<uint32_t> gpu_ipc;
  char gpu_pci[20];
  // The futex word: sleepers wait on it; anyone who gives them work
  // increments it and wakes them, when `sleepers` says someone sleeps.
  alignas(64) std::atomic<uint32_t> epoch;
  std::atomic<uint32_t> sleepers;
};

struct RingPair {
  unsigned char req[kRingBytes];
  unsigned char resp[kRingBytes];
};

// UD datagrams. A UD QP's inbound queue is kUdCells cells, each holding
// one datagram of up to kUdMaxData bytes, with any number of producers
// (every process that sends to the QP) and one consumer (the owner).
//
// Each cell has a state word: the position (a counter over all laps, low
// 32 bits) it is for, what it holds, and who claimed it:
//   bits 63..32  position
//   bits 31..30  kUdFree (a producer may claim it for that position),
//                kUdClaimed (a producer is writing it), kUdReady (written)
//   bits 29..0   the claiming device's address (pid << 8 | n; pids are
//                below 2^22)
// A producer reads QpCtl::req.tail = t; if cell t % kUdCells is Free(t) it
// claims it with a CAS to Claimed(t, itself) and moves tail on (CAS; any
// producer that finds cell t taken helps tail past it, so a producer that
// dies after its claim never stops the others), writes the cell, and
// publishes with a CAS Claimed(t, itself) -> Ready(t, itself). A cell of
// an earlier lap still unconsumed means the queue is full: the datagram is
// dropped and counted in QpCtl::ud_lost. The consumer takes Ready(head),
// then frees the cell for the next lap, Free(head + kUdCells). A cell that
// stays Claimed (its producer died, or stopped) is skipped by the consumer
// with a CAS to Free(head + kUdCells) once the claimer's process is gone
// (checked after 10 ms) or after 1 s; a late producer's publishing CAS
// then fails and its datagram is lost.
constexpr uint32_t kUdCells = 32;     // per UD QP
constexpr uint32_t kUdMaxData = 4096;  // bytes per datagram: the device's active MTU
constexpr uint32_t kUdFree = 0, kUdClaimed = 1, kUdReady = 2;
constexpr uint32_t kUdAddrMask = (1u << 30) - 1;

inline uint64_t ud_state(uint64_t pos, uint32_t kind, uint32_t addr) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(pos)) << 32) | (static_cast<uint64_t>(kind) << 30) |
         (addr & kUdAddrMask);
}
inline uint32_t ud_pos(uint64_t s) { return static_cast<uint32_t>(s >> 32); }
inline uint32_t ud_kind(uint64_t s) { return static_cast<uint32_t>(s >> 30) & 3; }
inline uint32_t ud_addr(uint64_t s) { return static_cast<uint32_t>(s) & kUdAddrMask; }

struct alignas(64) UdCellHdr {
  std::atomic<uint64_t> state;
  // Written by the producer between its claim and its publish; read by
  // the consumer after Ready, and checked (nothing here is trusted).
  uint32_t src_addr;  // the sending device
  uint32_t src_qpn;
  uint32_t dst_qpn;   // the QP it was sent to (a QP later made at the same index drops it)
  uint32_t qkey;
  uint32_t len;
  uint32_t imm;
  uint32_t flags;     // kFlagImm, kFlagSolicited
  uint8_t traffic_class, hop_limit;
};
struct UdCell {
  UdCellHdr h;
  unsigned char data[kUdMaxData];
};
static_assert(sizeof(UdCell) == 64 + kUdMaxData);
struct UdQueue {
  UdCell cells[kUdCells];
};

struct Segment {
  SegHeader hdr;
  KeyEntry keys[kMaxMr];
  QpCtl ctl[kMaxQp];
  RingPair rings[kMaxQp];
  UdQueue ud[kMaxQp];
  IpcExport ipc[kMaxMr];
};

// A datagram is waiting (or being written) at the consumer's `head`.
inline bool ud_input(const UdQueue& q, uint64_t head) {
  uint64_t s = q.cells[head % kUdCells].h.state.load(std::memory_order_acquire);
  return ud_pos(s) == static_cast<uint32_t>(head) && ud_kind(s) != kUdFree;
}
// A datagram is published at `head` (what a sleeper waits for: a cell
// being written wakes it when published, a stuck one is polled).
inline bool ud_ready(const UdQueue& q, uint64_t head) {
  uint64_t s = q.cells[head % kUdCells].h.state.load(std::memory_order_acquire);
  return ud_pos(s) == static_cast<uint32_t>(head) && ud_kind(s) == kUdReady;
}

static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

// The stamp of the message starting at ring position `pos`: never 0 and
// different from the stamps an earlier lap left in the same slot.
inline uint32_t stamp_of(uint64_t pos) { return static_cast<uint32_t>(pos) | 1u; }

// One ring as one side sees it: its indices and its bytes.
struct RingView {
  RingIdx* idx = nullptr;
  unsigned char* bytes = nullptr;

  uint32_t* stamp_word(uint64_t pos) const {
    return reinterpret_cast<uint32_t*>(bytes + (pos % kRingSlots) * kSlotSize);
  }
  // Consumer: a message starts at `pos` (its slots are readable).
  bool ready(uint64_t pos) const { return __atomic_load_n(stamp_word(pos), __ATOMIC_ACQUIRE) == stamp_of(pos); }
  // Producer: the message of `nslots` slots at `pos` is written (its header
  // with stamp 0); make it visible and advance tail.
  void publish(uint64_t pos, uint32_t nslots) const {
    __atomic_store_n(stamp_word(pos), stamp_of(pos), __ATOMIC_RELEASE);
    idx->tail.store(pos + nslots, std::memory_order_release);
  }
  // Consumer: done with the message at `pos`; returns the position after
  // it. Its later slots hold payload bytes that a later lap's consumer
  // could take for a stamp at `head` (where no message starts yet), so
  // their stamp words are cleared. One-slot messages write nothing.
  uint64_t next(uint64_t pos, uint32_t nslots) const {
    for (uint32_t k = 1; k < nslots; ++k) __atomic_store_n(stamp_word(pos + k), 0u, __ATOMIC_RELAXED);
    return pos + nslots;
  }
  // Consumer: drops everything published from `head` on (stamps cleared);
  // returns the new head. `tail` may lag the stamps (the producer stores it
  // after the stamp), and may even be behind `head` for a moment; what was
  // published beyond it is found by its stamps.
  uint64_t drop_all(uint64_t head) const {
    uint64_t tail = idx->tail.load(std::memory_order_acquire);
    if (static_cast<int64_t>(tail - head) > 0) {
      uint64_t n = tail - head > kRingSlots ? kRingSlots : tail - head;
      for (uint64_t k = 0; k < n; ++k) __atomic_store_n(stamp_word(head + k), 0u, __ATOMIC_RELAXED);
      head = tail;
    }
    for (uint32_t guard = 0; guard < kRingSlots && ready(head); ++guard) {
      uint8_t nslots = bytes[(head % kRingSlots) * kSlotSize + 5];  // MsgHdr::nslots
      if (nslots == 0 || nslots > kMaxMsgSlots + 4) nslots = 1;
      for (uint32_t k = 0; k < nslots; ++k) __atomic_store_n(stamp_word(head + k), 0u, __ATOMIC_RELAXED);
      head += nslots;
    }
    return head;
  }

  // Copies n bytes into the ring starting `off` bytes into slot `slot`.
  void put(uint64_t slot, uint32_t off, const void* src, size_t n) const {
    size_t pos = (slot % kRingSlots) * kSlotSize + off;
    pos %= kRingBytes;
    size_t first = n < kRingBytes - pos ? n : kRingBytes - pos;
    std::memcpy(bytes + pos, src, first);
    if (first < n) std::memcpy(bytes, static_cast<const unsigned char*>(src) + first, n - first);
  }
  void get(uint64_t slot, uint32_t off, void* dst, size_t n) const {
    size_t pos = (slot % kRingSlots) * kSlotSize + off;
    pos %= kRingBytes;
    size_t first = n < kRingBytes - pos ? n : kRingBytes - pos;
    std::memcpy(dst, bytes + pos, first);
    if (first < n) std::memcpy(static_cast<unsigned char*>(dst) + first, bytes, n - first);
  }
};

inline uint32_t msg_slots(size_t body_bytes) {
  return static_cast<uint32_t>((kHdrSize + body_bytes + kSlotSize - 1) / kSlotSize);
}

// IBA table 45: the RNR NAK timer code in microseconds.
inline uint32_t rnr_timer_us(uint32_t code) {
  static const uint32_t kUs[32] = {655360, 10,    20,    30,    40,    60,     80,     120,    160,    240,   320,
                                   480,    640,   960,   1280,  1920,  2560,   3840,   5120,   7680,   10240, 15360,
                                   20480,  30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520};
  return kUs[code & 31];
}

}  // namespace ufab::shm
