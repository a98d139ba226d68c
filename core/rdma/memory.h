// Protection domains, memory regions and their keys: the table the software
// RoCEv2 transport consults before any byte from the wire lands in (or is
// read from) application memory.
//
// Keys are 32 bits like verbs keys: a 24-bit index and an 8-bit key byte.
// Unlike a plain slot number, the index is a per-table secret permutation
// of the slot number and a random per-registration generation, and the key
// byte is random (getrandom) and never repeats the slot's previous one, so
// keys are neither sequential nor valid after deregistration. docs/memory-keys.md has the format, how hard keys are to
// guess (and where that is weaker than a MAC), the check order, the NAK
// mapping and the concurrency design.
//
// Thread safety: every method may be called from any thread. Checks
// (check_remote, check_local) take no lock: each slot is a seqlock and a
// successful check pins the region until the returned Access is destroyed,
// so deregistration can never free memory under a copy in progress.
// Registration, deregistration and PD calls serialize on one mutex.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <expected>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/error.h"
#include "core/rdma/durable.h"
#include "core/rdma/key_permutation.h"

namespace ufab::verbs {

// Access flags, with the values of enum ibv_access_flags so a future verbs-
// shaped C ABI can pass them through unchanged.
using AccessFlags = uint32_t;
inline constexpr AccessFlags kLocalWrite = 1u << 0;    // IBV_ACCESS_LOCAL_WRITE
inline constexpr AccessFlags kRemoteWrite = 1u << 1;   // IBV_ACCESS_REMOTE_WRITE
inline constexpr AccessFlags kRemoteRead = 1u << 2;    // IBV_ACCESS_REMOTE_READ
inline constexpr AccessFlags kRemoteAtomic = 1u << 3;  // IBV_ACCESS_REMOTE_ATOMIC
inline constexpr AccessFlags kRemoteAccess = kRemoteWrite | kRemoteRead | kRemoteAtomic;
// FLUSH targets (IBA memory placement extensions): a peer's FLUSH of each
// placement type needs the matching flag on the QP and on the region.
inline constexpr AccessFlags kFlushGlobal = 1u << 8;      // IBV_ACCESS_FLUSH_GLOBAL
inline constexpr AccessFlags kFlushPersistent = 1u << 9;  // IBV_ACCESS_FLUSH_PERSISTENT
inline constexpr AccessFlags kRemoteFlush = kFlushGlobal | kFlushPersistent;
// Every flag a peer's request can need; a region with any of them has an rkey.
inline constexpr AccessFlags kRemoteAny = kRemoteAccess | kRemoteFlush;
// Everything register_mr accepts. Whether the memory can honour
// FLUSH_PERSISTENT is the caller's to decide (the table does not know what
// memory it guards): the C API refuses it on host DRAM.
inline constexpr AccessFlags kSupportedAccess = kLocalWrite | kRemoteAny;

// "LOCAL_WRITE|REMOTE_READ", "none" for 0; unknown bits as hex.
std::string access_string(AccessFlags flags);

// A protection domain. 0 is never a valid id.
struct PdId {
  uint32_t value = 0;
  friend bool operator==(PdId, PdId) = default;
};

// What register_mr hands out. rkey is 0 when the region has no remote
// access (as rxe does), and 0 never validates as a key.
struct MemoryKeys {
  uint32_t lkey = 0;
  uint32_t rkey = 0;
};

// Why a check failed, in the order the checks run. The transport switches
// on this (aeth_nak_syndrome) without parsing messages.
enum class KeyError : uint8_t {
  kUnknownKey,        // no live region has this index (never issued, freed, key 0)
  kStaleKey,          // names a live region's slot, but not its key (an old incarnation or a guess)
  kPdMismatch,        // region belongs to another protection domain than the QP's
  kAccessDenied,      // region lacks the access the operation needs
  kOutOfBounds,       // [va, va+length) not inside the region, or va+length wraps
  kMisalignedAtomic,  // atomic target not 8-byte aligned
  kBadAtomicLength,   // atomic length other than 8
  // GPU memory (after every check above passed):
  kGpuBufferGone,     // the GPU allocation the region was registered on was freed (its buffer id changed)
  kGpuMemory,         // the region is GPU memory, which this operation cannot use (atomics, FLUSH, UD, ...)
};
inline constexpr int kKeyErrorCount = 9;

// A region on GPU memory: which GPU, and the CUDA buffer id of the
// allocation it was registered on (unique in the process over its
// lifetime, so a buffer freed and allocated again at the same address has
// another one). docs/gpu.md.
struct GpuMemory {
  int device = -1;
  uint64_t buffer_id = 0;
};

// "unknown key", "stale key", ... (static strings, for counters and logs).
const char* key_error_name(KeyError kind);

// Which side asked: the responder checking an rkey from the wire, or a
// local SGE (send gather list, receive scatter list) checked by lkey.
enum class KeyPath : uint8_t { kLocal, kRemote };

// AETH NAK syndromes (IBA 9.7.5.2.8; same values core/roce/ puts on the wire).
inline constexpr uint8_t kNakInvalidRequest = 0x61;
inline constexpr uint8_t kNakRemoteAccessError = 0x62;
inline constexpr uint8_t kNakRemoteOperationalError = 0x63;

// The NAK a responder sends for a failed check, as rxe (rxe_resp.c) does:
// remote key, PD, access and bounds failures -> remote access error (0x62);
// misaligned or wrong-size atomics -> invalid request (0x61); a local
// (receive WQE scatter list) failure on the responder -> remote
// operational error (0x63), rxe's "malformed WQE".
uint8_t aeth_nak_syndrome(KeyError kind, KeyPath path);

// A failed check: what failed and the request that failed it. No strings
// are built on the hot path; message() formats one on demand.
struct KeyCheckError {
  KeyError kind = KeyError::kUnknownKey;
  KeyPath path = KeyPath::kRemote;
  uint32_t key = 0;
  uint64_t va = 0;
  uint64_t length = 0;
  // Region facts where the check got that far (0 otherwise), for messages.
  uint64_t region_start = 0;
  uint64_t region_length = 0;
  AccessFlags region_access = 0;
  AccessFlags needed_access = 0;
  // GPU regions: the device, the buffer id registered and the one now.
  int gpu_device = -1;
  uint64_t gpu_buffer_registered = 0;
  uint64_t gpu_buffer_now = 0;

  uint8_t nak_syndrome() const { return aeth_nak_syndrome(kind, path); }
  // "rkey 0x1234ab07: [0x1000, +64) is outside region [0x2000, +4096): ..."
  std::string message() const;
  // As a ufab::Error (EACCES for key/PD/access/bounds and a freed GPU
  // buffer, EINVAL for atomics, EOPNOTSUPP for GPU memory).
  Error to_error() const;
};

template <typename T>
using CheckResult = std::expected<T, KeyCheckError>;

// Permission to touch [data(), data() + length()) of a registered region,
// granted by a successful check. While it lives the region cannot be
// deregistered (deregister_mr waits for it), so hold one per packet or per
// copy, never across a blocking call. Must not outlive the table; if one
// does (a bug in the caller), the table leaves that region's slot memory
// allocated so the late release still writes valid memory, but the region's
// bytes are no longer guarded by anything.
class Access {
 public:
  Access() = default;
  Access(Access&& other) noexcept
      : data_(other.data_),
        length_(other.length_),
        key_(other.key_),
        pin_(other.pin_),
        device_(other.device_),
        durability_(other.durability_),
        gpu_device_(other.gpu_device_) {
    other.data_ = nullptr;
    other.length_ = 0;
    other.key_ = 0;
    other.pin_ = nullptr;
  }
  Access& operator=(Access&& other) noexcept {
    if (this != &other) {
      release();
      data_ = other.data_;
      length_ = other.length_;
      key_ = other.key_;
      pin_ = other.pin_;
      device_ = other.device_;
      durability_ = other.durability_;
      gpu_device_ = other.gpu_device_;
      other.data_ = nullptr;
      other.length_ = 0;
      other.key_ = 0;
      other.pin_ = nullptr;
    }
    return *this;
  }
  Access(const Access&) = delete;
  Access& operator=(const Access&) = delete;
  ~Access() { release(); }

  uint8_t* data() const { return data_; }
  uint64_t length() const { return length_; }
  uint32_t key() const { return key_; }
  // The device's address of data() when the region was registered with
  // one (a DMA mapping for a NIC that gathers), else 0.
  uint64_t device_addr() const { return device_; }
  // How a FLUSH PERSISTENT (or a receive into the region) makes these
  // bytes durable: make_durable(durability(), data(), length()).
  Durability durability() const { return durability_; }
  // The GPU the bytes live on (data() is then a CUDA device address, never
  // to be read or written by the CPU: only the staging pipeline's copy
  // engine moves it), -1 for host memory. Only checks that pass
  // allow_gpu hand out GPU memory.
  int gpu_device() const { return gpu_device_; }
  // Gives the pin back early; data() must not be used afterwards. Inline:
  // it runs once per packet on the data path.
  void release() {
    // Release order: the caller's copies into or out of the region happen
    // before deregister_mr (which loads pins) lets the memory go.
    if (pin_) pin_->fetch_sub(1, std::memory_order_release);
    pin_ = nullptr;
    data_ = nullptr;
    length_ = 0;
    device_ = 0;
  }

 private:
  friend class MemoryRegionTable;
  Access(uint8_t* data, uint64_t length, uint32_t key, std::atomic<uint32_t>* pin, uint64_t device,
         Durability durability, int gpu_device = -1)
      : data_(data),
        length_(length),
        key_(key),
        pin_(pin),
        device_(device),
        durability_(durability),
        gpu_device_(gpu_device) {}

  uint8_t* data_ = nullptr;
  uint64_t length_ = 0;
  uint32_t key_ = 0;
  std::atomic<uint32_t>* pin_ = nullptr;
  uint64_t device_ = 0;
  Durability durability_ = Durability::kNone;
  int gpu_device_ = -1;
};

// Everything known about one live region (cold path: tools, tests).
struct RegionInfo {
  PdId pd;
  uint8_t* addr = nullptr;  // host address of the first byte
  uint64_t iova = 0;        // address peers and SGEs use for the first byte
  uint64_t length = 0;
  AccessFlags access = 0;
  MemoryKeys keys;
  Durability durability = Durability::kNone;
  std::optional<GpuMemory> gpu;  // set for a region on GPU memory
  uint32_t bound = 0;  // bind() count
};

struct MemoryTableOptions {
  // Most regions live at once; at most 2^24 (the key's index field).
  uint32_t max_regions = 1u << 16;
  // Most protection domains at once.
  uint32_t max_pds = 1u << 16;
  // A freed slot is reused only once this many freed slots are queued (or
  // no fresh slot is left), so a stale key's slot stays dead for a while.
  uint32_t reuse_delay = 1024;
  // How long deregister_mr waits for in-flight Access objects to go away
  // before it gives up with EBUSY (leaving the region registered).
  std::chrono::milliseconds drain_timeout{1000};
  // Fills a buffer with random bytes; getrandom(2) when empty. Tests inject
  // their own to force collisions.
  std::function<Status(void* buf, size_t len)> random;
  // The CUDA buffer id of the allocation holding a host-visible address
  // now (0: none), for GPU regions: a check on one compares it with the id
  // registered, so memory freed and allocated again under a live region is
  // caught. Empty: the registered id is trusted. Called only for GPU
  // regions, never for host memory.
  std::function<uint64_t(uint64_t addr)> gpu_buffer_id;
};

class MemoryRegionTable {
 public:
  static Result<std::unique_ptr<MemoryRegionTable>> create(MemoryTableOptions options = {});
  ~MemoryRegionTable();
  MemoryRegionTable(const MemoryRegionTable&) = delete;
  MemoryRegionTable& operator=(const MemoryRegionTable&) = delete;

  // Protection domains. dealloc_pd fails with EBUSY while regions remain.
  Result<PdId> alloc_pd();
  Status dealloc_pd(PdId pd);

  // Registers [addr, addr + length) of this process's memory. Peers and
  // SGEs address it as [iova, iova + length); iova defaults to addr, as
  // ibv_reg_mr does (ibv_reg_mr_iova lets it differ). Verbs rules apply:
  // length > 0; flags within kSupportedAccess; REMOTE_WRITE or
  // REMOTE_ATOMIC require LOCAL_WRITE (EINVAL). ENOSPC when the table is
  // full. The memory itself is the caller's: it must stay valid until
  // deregister_mr returns. `device_addr`, when not 0, is where a device
  // sees addr (the caller mapped the region for a NIC that gathers frames
  // from memory, and keeps it mapped until deregister_mr returns); checks
  // hand it out as Access::device_addr(). `durability` is how the memory
  // is made durable (classify_mapping tells); FLUSH_PERSISTENT needs one
  // (EINVAL on Durability::kNone: no flush would make it durable).
  //
  // `gpu`: the region is GPU memory (core/gpu tells). Its bytes are not
  // host-accessible, so every check on it fails after the key, PD, access
  // and bounds checks: kGpuBufferGone when the allocation was freed
  // (options.gpu_buffer_id gives another id), else kGpuMemory unless the
  // check allows GPU memory (the staging pipeline's). No device_addr or durability with it (EINVAL).
  Result<MemoryKeys> register_mr(PdId pd, void* addr, uint64_t length, AccessFlags access,
                                 std::optional<uint64_t> iova = std::nullopt, uint64_t device_addr = 0,
                                 Durability durability = Durability::kNone,
                                 std::optional<GpuMemory> gpu = std::nullopt);

  // Live regions on GPU memory (one atomic load): posts look at their SGEs
  // only while this is not 0.
  uint32_t gpu_regions() const { return gpu_live_.load(std::memory_order_relaxed); }
  // Post-time check of a local key: the GPU error (kGpuBufferGone or
  // kGpuMemory) when `lkey` names a live GPU region, nullopt otherwise
  // (host regions and bad keys are left to check_local).
  std::optional<KeyCheckError> gpu_check(uint32_t lkey) const;

  // Removes a region. EBUSY while bind() holds it (a memory window or QP
  // still uses it), or when an Access stays alive past drain_timeout. On
  // success no check grants access to it any more and none in flight
  // remains: the memory may be freed or unmapped.
  Status deregister_mr(uint32_t lkey);

  // "Bound" count for users that must keep a region registered (memory
  // windows, queue pairs holding it): while > 0 deregister_mr fails.
  Status bind(uint32_t lkey);
  Status unbind(uint32_t lkey);

  Result<RegionInfo> query(uint32_t lkey) const;
  uint32_t live_regions() const;

  // Responder path: may a peer holding `rkey` on a QP of `pd` do `needed`
  // (a non-empty set of remote flags) to [va, va + length)? Checks, in
  // order: key (unknown, stale), PD, access, bounds (overflow-safe; length
  // 0 is fine anywhere in [start, end]), and for REMOTE_ATOMIC 8-byte
  // alignment and length 8. IBA C9-88 lets a zero-length RDMA READ/WRITE
  // carry any rkey and va, and rxe does not look them up at all; the
  // transport honours that by not calling this for such packets (see
  // rkey_check_needed). On success the Access points at the bytes.
  //
  // `allow_gpu`: a GPU region passes too (Access::gpu_device() says so) for
  // the staging pipeline; without it a live GPU region fails kGpuMemory,
  // so no CPU copy ever touches GPU memory.
  CheckResult<Access> check_remote(uint32_t rkey, PdId pd, uint64_t va, uint64_t length,
                                   AccessFlags needed, bool allow_gpu = false) const;

  // The same checks for the whole region `rkey` names (key, PD, access; no
  // range is given, so none can be out of bounds): a FLUSH of selectivity
  // "whole region". The Access spans the region.
  CheckResult<Access> check_remote_region(uint32_t rkey, PdId pd, AccessFlags needed) const;

  // Local path, for SGEs: key, PD, LOCAL_WRITE when the operation writes
  // into the region (receive, READ response, atomic result), bounds.
  CheckResult<Access> check_local(uint32_t lkey, PdId pd, uint64_t addr, uint64_t length,
                                  bool needs_write, bool allow_gpu = false) const;

 private:
  struct Slot;
  struct Snapshot;
  struct LocatedSlot;

  explicit MemoryRegionTable(MemoryTableOptions options);
  Status init();

  Slot* slot_at(uint32_t slot) const;  // nullptr when that chunk was never allocated
  Result<uint32_t> take_slot();        // under mu_
  Result<uint32_t> draw(uint32_t bits, std::optional<uint32_t> previous, bool avoid_zero);  // under mu_
  uint32_t slot_of(uint32_t key) const { return permutation_.inverse(key >> 8) & slot_mask_; }
  // Live slot whose key equals `lkey` exactly, or an error; under mu_.
  Result<Slot*> writer_find(uint32_t lkey, const char* what) const;
  bool read_snapshot(const Slot& s, Snapshot* out) const;
  // whole_region: va and length are ignored; the region's own are used.
  CheckResult<Access> check(KeyPath path, uint32_t key, PdId pd, uint64_t va, uint64_t length,
                            AccessFlags needed, bool whole_region = false, bool allow_gpu = false) const;

  MemoryTableOptions options_;
  KeyPermutation permutation_;
  // The permutation's input is generation << slot_bits_ | slot: the slot
  // needs slot_bits_ (enough for max_regions), the rest is generation.
  uint32_t slot_bits_ = 0;
  uint32_t slot_mask_ = 0;

  // Slots live in fixed-size chunks allocated on demand and never moved or
  // freed before the table, so a lock-free reader can hold a Slot* safely.
  static constexpr uint32_t kChunkShift = 10;
  static constexpr uint32_t kChunkSlots = 1u << kChunkShift;
  std::unique_ptr<std::atomic<Slot*>[]> chunks_;
  uint32_t chunk_count_ = 0;

  mutable std::mutex mu_;  // guards everything below and all writer-side slot state
  uint32_t fresh_slots_ = 0;   // slots [0, fresh_slots_) have been used at least once
  std::deque<uint32_t> freed_;  // FIFO: oldest freed slot first
  uint32_t live_ = 0;
  uint32_t next_pd_ = 1;
  std::unordered_map<uint32_t, uint32_t> pds_;  // pd id -> regions in it
  std::atomic<uint32_t> gpu_live_{0};
};

// Whether a packet's RETH needs a key check at all: IBA C9-88 (and rxe's
// check_rkey) skip zero-length RDMA READ/WRITE, whose rkey and va may be
// anything.
inline bool rkey_check_needed(uint32_t dma_length) { return dma_length != 0; }

}  // namespace ufab::verbs
