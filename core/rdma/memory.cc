#include "core/rdma/memory.h"

#include <sys/random.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <thread>

#include "base/hex.h"

namespace ufab::verbs {

// One region. Readers never lock: the fields are atomics written only
// inside a seqlock write section (seq odd), and a reader accepts a snapshot
// only when seq was even and unchanged around its loads. Atomics (rather
// than plain fields) keep a torn read defined behaviour; the seq check then
// throws it away.
struct MemoryRegionTable::Slot {
  alignas(64) std::atomic<uint64_t> seq{0};
  std::atomic<uint32_t> key{0};  // full 32-bit key; 0 = free
  std::atomic<uint32_t> pd{0};
  std::atomic<uint32_t> access{0};
  std::atomic<uint64_t> iova{0};
  std::atomic<uint64_t> length{0};
  std::atomic<uint64_t> host{0};
  std::atomic<uint64_t> device{0};  // the device's address of host byte 0; 0: none
  std::atomic<uint8_t> durability{0};  // Durability
  std::atomic<int32_t> gpu_device{-1};
  std::atomic<uint64_t> gpu_buffer{0};  // CUDA buffer id; 0: host memory
  // Live Access objects (successful checks not yet released). On a cache
  // line of its own: every check writes it, and the fields above, which
  // only change on (de)registration, stay shared in every reader's cache.
  alignas(64) std::atomic<uint32_t> pins{0};

  // Writer-side state, only touched under mu_.
  uint32_t bound = 0;
  uint32_t last_generation = 0;
  uint8_t last_key_byte = 0;
  bool keyed_before = false;
};

struct MemoryRegionTable::Snapshot {
  uint64_t seq;
  uint32_t key;
  uint32_t pd;
  uint32_t access;
  uint64_t iova;
  uint64_t length;
  uint64_t host;
  uint64_t device;
  uint8_t durability;
  int32_t gpu_device;
  uint64_t gpu_buffer;
};

namespace {

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Seqlock writer: odd while fields change. Field stores are release and
// the reader's field loads acquire, so a reader that sees any new field
// value also sees the odd (or later) sequence number on its re-read. That
// needs no standalone fences, which ThreadSanitizer cannot model, and costs
// nothing on x86 (plain moves either way).
template <typename SlotT>
void write_begin(SlotT& s) {
  uint64_t v = s.seq.load(std::memory_order_relaxed);
  s.seq.store(v + 1, std::memory_order_relaxed);
}

template <typename T, typename V>
void put(std::atomic<T>& field, V value) {
  field.store(static_cast<T>(value), std::memory_order_release);
}

// seq_cst, not just release: deregister_mr relies on this store and its
// later load of `pins` being ordered against a reader's pin increment and
// its re-read of seq (a Dekker-style handshake; see docs/memory-keys.md).
template <typename SlotT>
void write_end(SlotT& s) {
  uint64_t v = s.seq.load(std::memory_order_relaxed);
  s.seq.store(v + 1, std::memory_order_seq_cst);
}

Status getrandom_fill(void* buf, size_t len) {
  auto* p = static_cast<uint8_t*>(buf);
  while (len > 0) {
    ssize_t n = ::getrandom(p, len, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail_errno("getrandom for memory keys (the kernel's random source is unavailable)");
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return {};
}

}  // namespace

std::string access_string(AccessFlags flags) {
  if (flags == 0) return "none";
  static constexpr struct {
    AccessFlags bit;
    const char* name;
  } kNames[] = {{kLocalWrite, "LOCAL_WRITE"},
                {kRemoteWrite, "REMOTE_WRITE"},
                {kRemoteRead, "REMOTE_READ"},
                {kRemoteAtomic, "REMOTE_ATOMIC"},
                {kFlushGlobal, "FLUSH_GLOBAL"},
                {kFlushPersistent, "FLUSH_PERSISTENT"}};
  std::string out;
  for (const auto& n : kNames) {
    if (!(flags & n.bit)) continue;
    if (!out.empty()) out += '|';
    out += n.name;
    flags &= ~n.bit;
  }
  if (flags) {
    if (!out.empty()) out += '|';
    out += hex(flags, 8);
  }
  return out;
}

const char* key_error_name(KeyError kind) {
  switch (kind) {
    case KeyError::kUnknownKey: return "unknown key";
    case KeyError::kStaleKey: return "stale key";
    case KeyError::kPdMismatch: return "protection domain mismatch";
    case KeyError::kAccessDenied: return "access denied";
    case KeyError::kOutOfBounds: return "out of bounds";
    case KeyError::kMisalignedAtomic: return "misaligned atomic";
    case KeyError::kBadAtomicLength: return "bad atomic length";
    case KeyError::kGpuBufferGone: return "GPU buffer freed";
    case KeyError::kGpuMemory: return "GPU memory not supported by this operation";
  }
  return "unknown key error";
}

uint8_t aeth_nak_syndrome(KeyError kind, KeyPath path) {
  // A local SGE that fails while the responder scatters a SEND into a
  // receive WQE is the local application's fault, not the requester's:
  // IBA class A, "remote operational error" (rxe: RESPST_ERR_MALFORMED_WQE).
  if (path == KeyPath::kLocal) return kNakRemoteOperationalError;
  switch (kind) {
    case KeyError::kMisalignedAtomic:
    case KeyError::kBadAtomicLength:
      return kNakInvalidRequest;  // rxe: RESPST_ERR_MISALIGNED_ATOMIC, class C
    case KeyError::kUnknownKey:
    case KeyError::kStaleKey:
    case KeyError::kPdMismatch:
    case KeyError::kAccessDenied:
    case KeyError::kOutOfBounds:
    case KeyError::kGpuBufferGone:  // the region's memory is gone: a protection error
      return kNakRemoteAccessError;  // rxe: RESPST_ERR_RKEY_VIOLATION, class C
    case KeyError::kGpuMemory:  // a valid request this responder cannot carry out
      return kNakRemoteOperationalError;
  }
  return kNakRemoteAccessError;
}

std::string KeyCheckError::message() const {
  const char* key_name = path == KeyPath::kRemote ? "rkey" : "lkey";
  char buf[512];
  switch (kind) {
    case KeyError::kUnknownKey:
      std::snprintf(buf, sizeof(buf),
                    "%s %s matches no memory region: it was never issued or its region was deregistered "
                    "(use the key register_mr returned for a live region)",
                    key_name, hex(key, 8).c_str());
      break;
    case KeyError::kStaleKey:
      std::snprintf(buf, sizeof(buf),
                    "%s %s is stale: its region was deregistered and the slot now holds another region "
                    "(re-exchange keys after re-registering)",
                    key_name, hex(key, 8).c_str());
      break;
    case KeyError::kPdMismatch:
      std::snprintf(buf, sizeof(buf),
                    "%s %s: the region belongs to another protection domain than the queue pair "
                    "(register it in the QP's PD)",
                    key_name, hex(key, 8).c_str());
      break;
    case KeyError::kAccessDenied:
      if (path == KeyPath::kRemote && !(region_access & kRemoteAny)) {
        std::snprintf(buf, sizeof(buf),
                      "%s %s: the region was registered without remote access (%s), so it has no rkey "
                      "(register it with %s)",
                      key_name, hex(key, 8).c_str(), access_string(region_access).c_str(),
                      access_string(needed_access).c_str());
      } else {
        std::snprintf(buf, sizeof(buf),
                      "%s %s: the operation needs %s but the region allows %s (register it with the "
                      "needed access)",
                      key_name, hex(key, 8).c_str(), access_string(needed_access).c_str(),
                      access_string(region_access).c_str());
      }
      break;
    case KeyError::kOutOfBounds:
      if (length > std::numeric_limits<uint64_t>::max() - va) {
        std::snprintf(buf, sizeof(buf),
                      "%s %s: address 0x%" PRIx64 " + length %" PRIu64
                      " wraps around 2^64 (a corrupt or hostile address)",
                      key_name, hex(key, 8).c_str(), va, length);
      } else {
        std::snprintf(buf, sizeof(buf),
                      "%s %s: [0x%" PRIx64 ", +%" PRIu64 ") is outside the region [0x%" PRIx64 ", +%" PRIu64
                      ") (check the address and length against the region the key came with)",
                      key_name, hex(key, 8).c_str(), va, length, region_start, region_length);
      }
      break;
    case KeyError::kMisalignedAtomic:
      std::snprintf(buf, sizeof(buf),
                    "%s %s: atomic at 0x%" PRIx64 " is not 8-byte aligned (atomics need an aligned 8-byte "
                    "target)",
                    key_name, hex(key, 8).c_str(), va);
      break;
    case KeyError::kBadAtomicLength:
      std::snprintf(buf, sizeof(buf), "%s %s: atomic of %" PRIu64 " bytes; atomics are exactly 8 bytes",
                    key_name, hex(key, 8).c_str(), length);
      break;
    case KeyError::kGpuBufferGone:
      std::snprintf(buf, sizeof(buf),
                    "%s %s: the GPU memory under this region (GPU %d, CUDA buffer id %" PRIu64
                    ") was freed%s; the region no longer names it (deregister it before freeing the memory, "
                    "and register the new allocation)",
                    key_name, hex(key, 8).c_str(), gpu_device, gpu_buffer_registered,
                    gpu_buffer_now != 0 ? " and the address reallocated (another buffer id)" : "");
      break;
    case KeyError::kGpuMemory:
      std::snprintf(buf, sizeof(buf),
                    "%s %s: the region is GPU memory (GPU %d), which this operation cannot use: atomics, FLUSH, "
                    "ATOMIC_WRITE and UD datagrams on GPU memory are not supported (SEND/RECV, WRITE and READ on "
                    "RC queue pairs are, through the staging pipeline: docs/gpu.md); use host memory for these",
                    key_name, hex(key, 8).c_str(), gpu_device);
      break;
  }
  return buf;
}

Error KeyCheckError::to_error() const {
  int code = EACCES;
  if (kind == KeyError::kOutOfBounds) code = EFAULT;
  if (kind == KeyError::kMisalignedAtomic || kind == KeyError::kBadAtomicLength) code = EINVAL;
  if (kind == KeyError::kGpuMemory) code = EOPNOTSUPP;
  return Error(code, message());
}

MemoryRegionTable::MemoryRegionTable(MemoryTableOptions options) : options_(std::move(options)) {}

MemoryRegionTable::~MemoryRegionTable() {
  // An Access that outlives its table (a caller's bug: see Access) holds a
  // pointer to its slot's pin counter and decrements it when released. A
  // chunk with such a pin is therefore not freed but left behind, so that
  // late decrement lands in memory that is still ours instead of a freed
  // block. The leak is bounded by the misuse, costs the hot path nothing
  // (Access::release stays one atomic decrement).
  for (uint32_t c = 0; c < chunk_count_; ++c) {
    Slot* chunk = chunks_[c].load(std::memory_order_relaxed);
    if (!chunk) continue;
    bool pinned = false;
    for (uint32_t i = 0; i < kChunkSlots && !pinned; ++i) {
      pinned = chunk[i].pins.load(std::memory_order_acquire) != 0;
    }
    if (!pinned) delete[] chunk;
  }
}

Result<std::unique_ptr<MemoryRegionTable>> MemoryRegionTable::create(MemoryTableOptions options) {
  if (options.max_regions == 0 || options.max_regions > (1u << KeyPermutation::kBits)) {
    return fail(EINVAL, "max_regions " + std::to_string(options.max_regions) +
                            " is out of range: a key's 24-bit index allows 1 to 16777216 regions");
  }
  if (options.max_pds == 0) return fail(EINVAL, "max_pds is 0: allow at least one protection domain");
  if (!options.random) options.random = getrandom_fill;
  std::unique_ptr<MemoryRegionTable> table(new MemoryRegionTable(std::move(options)));
  if (auto st = table->init(); !st) return std::unexpected(st.error());
  return table;
}

Status MemoryRegionTable::init() {
  KeyPermutation::Keys keys{};
  if (auto st = options_.random(keys.data(), sizeof(keys)); !st) {
    return std::unexpected(st.error().context("creating the memory region table"));
  }
  permutation_ = KeyPermutation(keys);
  while (slot_bits_ < KeyPermutation::kBits && (uint64_t{1} << slot_bits_) < options_.max_regions) ++slot_bits_;
  slot_mask_ = static_cast<uint32_t>((uint64_t{1} << slot_bits_) - 1);
  chunk_count_ = (options_.max_regions + kChunkSlots - 1) / kChunkSlots;
  chunks_ = std::make_unique<std::atomic<Slot*>[]>(chunk_count_);
  for (uint32_t c = 0; c < chunk_count_; ++c) chunks_[c].store(nullptr, std::memory_order_relaxed);
  return {};
}

MemoryRegionTable::Slot* MemoryRegionTable::slot_at(uint32_t slot) const {
  uint32_t c = slot >> kChunkShift;
  if (c >= chunk_count_) return nullptr;
  Slot* chunk = chunks_[c].load(std::memory_order_acquire);
  return chunk ? &chunk[slot & (kChunkSlots - 1)] : nullptr;
}

Result<PdId> MemoryRegionTable::alloc_pd() {
  std::lock_guard lock(mu_);
  if (pds_.size() >= options_.max_pds) {
    return fail(ENOSPC, "protection domain limit reached (" + std::to_string(options_.max_pds) +
                            "): deallocate unused PDs or raise max_pds");
  }
  // Ids count up and skip 0 and ids still in use after a wrap.
  for (;;) {
    uint32_t id = next_pd_++;
    if (next_pd_ == 0) next_pd_ = 1;
    if (id != 0 && !pds_.contains(id)) {
      pds_.emplace(id, 0);
      return PdId{id};
    }
  }
}

Status MemoryRegionTable::dealloc_pd(PdId pd) {
  std::lock_guard lock(mu_);
  auto it = pds_.find(pd.value);
  if (it == pds_.end()) {
    return fail(ENOENT, "protection domain " + std::to_string(pd.value) +
                            " does not exist (never allocated or already deallocated)");
  }
  if (it->second != 0) {
    return fail(EBUSY, "protection domain " + std::to_string(pd.value) + " still has " +
                           std::to_string(it->second) + " memory region(s): deregister them first");
  }
  pds_.erase(it);
  return {};
}

Result<uint32_t> MemoryRegionTable::take_slot() {
  bool can_fresh = fresh_slots_ < options_.max_regions;
  if (!freed_.empty() && (freed_.size() >= options_.reuse_delay || !can_fresh)) {
    uint32_t slot = freed_.front();
    freed_.pop_front();
    return slot;
  }
  if (!can_fresh) {
    return fail(ENOSPC, "memory region table is full (" + std::to_string(options_.max_regions) +
                            " regions): deregister unused regions or raise max_regions");
  }
  uint32_t slot = fresh_slots_;
  uint32_t c = slot >> kChunkShift;
  if (!chunks_[c].load(std::memory_order_relaxed)) {
    auto* chunk = new (std::nothrow) Slot[kChunkSlots];
    if (!chunk) return fail(ENOMEM, "out of memory allocating memory region slots");
    // Release: a reader that sees the pointer sees constructed slots.
    chunks_[c].store(chunk, std::memory_order_release);
  }
  ++fresh_slots_;
  return slot;
}

Result<uint32_t> MemoryRegionTable::draw(uint32_t bits, std::optional<uint32_t> previous, bool avoid_zero) {
  if (bits == 0) return 0u;
  uint32_t mask = static_cast<uint32_t>((uint64_t{1} << bits) - 1);
  // A fair random source needs ~1 draw; 256 rejected draws in a row mean
  // it is broken, and keys from it would be guessable.
  for (int attempt = 0; attempt < 256; ++attempt) {
    uint8_t raw[4] = {};
    if (auto st = options_.random(raw, (bits + 7) / 8); !st) return std::unexpected(st.error());
    uint32_t v = (uint32_t{raw[0]} | uint32_t{raw[1]} << 8 | uint32_t{raw[2]} << 16 | uint32_t{raw[3]} << 24) & mask;
    if (previous && v == *previous) continue;  // a stale key must never validate again
    if (avoid_zero && v == 0) continue;
    return v;
  }
  return fail(EIO, "the random source returned the same value 256 times: refusing to make predictable memory keys");
}

Result<MemoryKeys> MemoryRegionTable::register_mr(PdId pd, void* addr, uint64_t length, AccessFlags access,
                                                  std::optional<uint64_t> iova_opt, uint64_t device_addr,
                                                  Durability durability, std::optional<GpuMemory> gpu) {
  uint64_t host = reinterpret_cast<uintptr_t>(addr);
  uint64_t iova = iova_opt.value_or(host);
  if (access & ~kSupportedAccess) {
    return fail(EINVAL, "access flags " + access_string(access) +
                            " include unsupported bits: use LOCAL_WRITE, REMOTE_WRITE, REMOTE_READ, REMOTE_ATOMIC, "
                            "FLUSH_GLOBAL, FLUSH_PERSISTENT");
  }
  if ((access & (kRemoteWrite | kRemoteAtomic)) && !(access & kLocalWrite)) {
    return fail(EINVAL, "access " + access_string(access) +
                            " is invalid: REMOTE_WRITE and REMOTE_ATOMIC require LOCAL_WRITE (verbs rule); "
                            "add LOCAL_WRITE");
  }
  if ((access & kFlushPersistent) && durability == Durability::kNone) {
    return fail(EINVAL, "access FLUSH_PERSISTENT on memory that nothing makes durable (DRAM): a peer's FLUSH "
                        "PERSISTENT would be told its data survives a power loss when it does not; use FLUSH_GLOBAL, "
                        "or register a durable mapping (DAX persistent memory, a file or block device mapped shared)");
  }
  if (gpu && (gpu->buffer_id == 0 || device_addr != 0 || durability != Durability::kNone)) {
    return fail(EINVAL, "a GPU memory region needs its CUDA buffer id, and has no NIC mapping or durability");
  }
  if (length == 0) return fail(EINVAL, "memory region of length 0: register at least one byte");
  if (addr == nullptr) return fail(EINVAL, "memory region at a null address: pass the buffer's address");
  if (length > std::numeric_limits<uint64_t>::max() - host) {
    return fail(EINVAL, "memory region [" + hex(host) + ", +" + std::to_string(length) +
                            ") wraps around the address space: the length is wrong");
  }
  if (length > std::numeric_limits<uint64_t>::max() - iova) {
    return fail(EINVAL, "iova range [iova, iova + " + std::to_string(length) +
                            ") wraps around 2^64: choose a smaller iova");
  }

  std::lock_guard lock(mu_);
  auto pd_it = pds_.find(pd.value);
  if (pd_it == pds_.end()) {
    return fail(ENOENT, "protection domain " + std::to_string(pd.value) +
                            " does not exist: allocate it with alloc_pd first");
  }
  auto slot_no = take_slot();
  if (!slot_no) return std::unexpected(slot_no.error());
  Slot& s = *slot_at(*slot_no);
  // A new generation moves the index, so a stale key does not even tell a
  // peer where the slot's next region is; the new key byte differs from
  // the previous one, so a stale key never validates even when the
  // generation has no bits (max_regions = 2^24).
  std::optional<uint32_t> prev_gen, prev_byte;
  if (s.keyed_before) {
    prev_gen = s.last_generation;
    prev_byte = s.last_key_byte;
  }
  auto generation = draw(KeyPermutation::kBits - slot_bits_, prev_gen, false);
  if (!generation) {
    freed_.push_front(*slot_no);  // give the slot back unchanged
    return std::unexpected(generation.error().context("registering a memory region"));
  }
  uint32_t index = permutation_.forward(*generation << slot_bits_ | *slot_no);
  auto byte = draw(8, prev_byte, index == 0);  // key 0 means "no key"
  if (!byte) {
    freed_.push_front(*slot_no);
    return std::unexpected(byte.error().context("registering a memory region"));
  }
  uint32_t key = (index << 8) | *byte;

  write_begin(s);
  put(s.pd, pd.value);
  put(s.access, access);
  put(s.iova, iova);
  put(s.length, length);
  put(s.host, host);
  put(s.device, device_addr);
  put(s.durability, static_cast<uint8_t>(durability));
  put(s.gpu_device, gpu ? gpu->device : -1);
  put(s.gpu_buffer, gpu ? gpu->buffer_id : 0);
  put(s.key, key);
  write_end(s);

  s.bound = 0;
  s.last_generation = *generation;
  s.last_key_byte = static_cast<uint8_t>(*byte);
  s.keyed_before = true;
  ++pd_it->second;
  ++live_;
  if (gpu) gpu_live_.fetch_add(1, std::memory_order_relaxed);
  return MemoryKeys{key, (access & kRemoteAny) ? key : 0u};
}

Result<MemoryRegionTable::Slot*> MemoryRegionTable::writer_find(uint32_t lkey, const char* what) const {
  if (lkey == 0) return fail(EINVAL, std::string(what) + ": 0 is not a memory key (pass the region's lkey)");
  uint32_t slot_no = slot_of(lkey);
  Slot* s = slot_no < fresh_slots_ ? slot_at(slot_no) : nullptr;
  if (!s || s->key.load(std::memory_order_relaxed) != lkey) {
    return fail(ENOENT, std::string(what) + ": no memory region has lkey " + hex(lkey, 8) +
                            " (never registered, already deregistered, or an rkey/lkey mix-up)");
  }
  return s;
}

Status MemoryRegionTable::deregister_mr(uint32_t lkey) {
  std::lock_guard lock(mu_);
  auto found = writer_find(lkey, "deregistering a memory region");
  if (!found) return std::unexpected(found.error());
  Slot& s = **found;
  if (s.bound != 0) {
    return fail(EBUSY, "memory region " + hex(lkey, 8) + " is still bound by " + std::to_string(s.bound) +
                           " user(s) (memory windows or queue pairs): unbind or destroy them first");
  }
  // Unpublish first, so no new check can succeed, then wait for the checks
  // that already succeeded (pins) to finish their copies.
  write_begin(s);
  put(s.key, 0);
  write_end(s);
  auto deadline = std::chrono::steady_clock::now() + options_.drain_timeout;
  for (uint32_t spins = 0; s.pins.load(std::memory_order_seq_cst) != 0; ++spins) {
    if (std::chrono::steady_clock::now() >= deadline) {
      uint32_t pins = s.pins.load(std::memory_order_relaxed);
      write_begin(s);
      put(s.key, lkey);  // never handed to anyone else: safe to restore
      write_end(s);
      return fail(EBUSY, "memory region " + hex(lkey, 8) + " still has " + std::to_string(pins) +
                             " access(es) in flight after " + std::to_string(options_.drain_timeout.count()) +
                             " ms: some code holds an Access too long (release it after each copy)");
    }
    if (spins < 64) {
      cpu_relax();
    } else {
      std::this_thread::yield();
    }
  }
  uint32_t pd = s.pd.load(std::memory_order_relaxed);
  const bool was_gpu = s.gpu_buffer.load(std::memory_order_relaxed) != 0;
  write_begin(s);
  put(s.pd, 0);
  put(s.access, 0);
  put(s.iova, 0);
  put(s.length, 0);
  put(s.host, 0);
  put(s.gpu_device, -1);
  put(s.gpu_buffer, 0);
  write_end(s);
  if (auto it = pds_.find(pd); it != pds_.end() && it->second > 0) --it->second;
  --live_;
  if (was_gpu) gpu_live_.fetch_sub(1, std::memory_order_relaxed);
  freed_.push_back(slot_of(lkey));
  return {};
}

Status MemoryRegionTable::bind(uint32_t lkey) {
  std::lock_guard lock(mu_);
  auto found = writer_find(lkey, "binding a memory region");
  if (!found) return std::unexpected(found.error());
  Slot& s = **found;
  if (s.bound == std::numeric_limits<uint32_t>::max()) {
    return fail(EOVERFLOW, "memory region " + hex(lkey, 8) + " is bound 2^32-1 times: an unbind is missing");
  }
  ++s.bound;
  return {};
}

Status MemoryRegionTable::unbind(uint32_t lkey) {
  std::lock_guard lock(mu_);
  auto found = writer_find(lkey, "unbinding a memory region");
  if (!found) return std::unexpected(found.error());
  Slot& s = **found;
  if (s.bound == 0) {
    return fail(EINVAL, "memory region " + hex(lkey, 8) + " is not bound: unbind without a matching bind");
  }
  --s.bound;
  return {};
}

Result<RegionInfo> MemoryRegionTable::query(uint32_t lkey) const {
  std::lock_guard lock(mu_);
  auto found = writer_find(lkey, "querying a memory region");
  if (!found) return std::unexpected(found.error());
  const Slot& s = **found;
  RegionInfo info;
  info.pd = PdId{s.pd.load(std::memory_order_relaxed)};
  info.addr = reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(s.host.load(std::memory_order_relaxed)));
  info.iova = s.iova.load(std::memory_order_relaxed);
  info.length = s.length.load(std::memory_order_relaxed);
  info.access = s.access.load(std::memory_order_relaxed);
  info.durability = static_cast<Durability>(s.durability.load(std::memory_order_relaxed));
  if (uint64_t b = s.gpu_buffer.load(std::memory_order_relaxed); b != 0) {
    info.gpu = GpuMemory{s.gpu_device.load(std::memory_order_relaxed), b};
  }
  info.keys = MemoryKeys{lkey, (info.access & kRemoteAny) ? lkey : 0u};
  info.bound = s.bound;
  return info;
}

uint32_t MemoryRegionTable::live_regions() const {
  std::lock_guard lock(mu_);
  return live_;
}

bool MemoryRegionTable::read_snapshot(const Slot& s, Snapshot* out) const {
  uint64_t s1 = s.seq.load(std::memory_order_acquire);
  if (s1 & 1) return false;
  out->key = s.key.load(std::memory_order_acquire);
  out->pd = s.pd.load(std::memory_order_acquire);
  out->access = s.access.load(std::memory_order_acquire);
  out->iova = s.iova.load(std::memory_order_acquire);
  out->length = s.length.load(std::memory_order_acquire);
  out->host = s.host.load(std::memory_order_acquire);
  out->device = s.device.load(std::memory_order_acquire);
  out->durability = s.durability.load(std::memory_order_acquire);
  out->gpu_device = s.gpu_device.load(std::memory_order_acquire);
  out->gpu_buffer = s.gpu_buffer.load(std::memory_order_acquire);
  if (s.seq.load(std::memory_order_relaxed) != s1) return false;
  out->seq = s1;
  return true;
}

CheckResult<Access> MemoryRegionTable::check(KeyPath path, uint32_t key, PdId pd, uint64_t va, uint64_t length,
                                             AccessFlags needed, bool whole_region, bool allow_gpu) const {
  // The error is built only on failure: a successful check (every packet)
  // fills no error record.
  const Snapshot* seen = nullptr;  // the region's fields, once the key matched
  auto failure = [&](KeyError kind) {
    KeyCheckError err;
    err.kind = kind;
    err.path = path;
    err.key = key;
    err.va = va;
    err.length = length;
    err.needed_access = needed;
    if (seen != nullptr) {
      err.region_start = seen->iova;
      err.region_length = seen->length;
      err.region_access = seen->access;
      err.gpu_device = seen->gpu_device;
      err.gpu_buffer_registered = seen->gpu_buffer;
    }
    return std::unexpected(err);
  };

  // 1. Key. The index is checked against the table before any slot is
  // touched, so a hostile key can only ever select a real slot or nothing.
  if (key == 0) return failure(KeyError::kUnknownKey);
  uint32_t slot_no = slot_of(key);
  if (slot_no >= options_.max_regions) return failure(KeyError::kUnknownKey);
  Slot* s = slot_at(slot_no);
  if (!s) return failure(KeyError::kUnknownKey);

  Snapshot snap;
  for (uint32_t spins = 0;; ++spins) {
    seen = nullptr;
    if (!read_snapshot(*s, &snap)) {
      // A writer is mid-update (a few stores); wait it out.
      if (spins < 64) {
        cpu_relax();
      } else {
        std::this_thread::yield();
      }
      continue;
    }
    if (snap.key == 0) return failure(KeyError::kUnknownKey);
    if (snap.key != key) return failure(KeyError::kStaleKey);
    seen = &snap;

    // 2. Protection domain.
    if (snap.pd != pd.value) return failure(KeyError::kPdMismatch);

    // 3. Access. Remote: a region without remote flags has no rkey at all,
    // and `needed` must be a non-empty set of remote flags (anything else
    // is a transport bug, refused rather than trusted).
    if (path == KeyPath::kRemote) {
      if (!(snap.access & kRemoteAny)) return failure(KeyError::kAccessDenied);
      if (needed == 0 || (needed & ~kRemoteAny)) return failure(KeyError::kAccessDenied);
    }
    if ((snap.access & needed) != needed) return failure(KeyError::kAccessDenied);

    if (whole_region) {
      va = snap.iova;
      length = snap.length;
    }
    // 4. Bounds, without ever computing a sum that can wrap: va >= start,
    // length <= region length, and (va - start) <= region length - length.
    // Length 0 passes anywhere in [start, end], as for verbs SGEs.
    if (va < snap.iova || length > snap.length || va - snap.iova > snap.length - length) {
      return failure(KeyError::kOutOfBounds);
    }
    uint64_t host = snap.host + (va - snap.iova);  // inside [host, host + length]: cannot wrap

    // 5. Atomics: 8 bytes, aligned both as the peer sees it (va) and as
    // the CPU will access it (host), so the atomic is a real one.
    if (needed & kRemoteAtomic) {
      if ((va & 7) != 0 || (host & 7) != 0) return failure(KeyError::kMisalignedAtomic);
      if (length != 8) return failure(KeyError::kBadAtomicLength);
    }

    // 6. GPU memory: not host-accessible, so never handed out. A freed
    // allocation is told apart from a live one by its buffer id.
    if (snap.gpu_buffer != 0) {
      uint64_t now = options_.gpu_buffer_id ? options_.gpu_buffer_id(snap.host) : snap.gpu_buffer;
      if (now != snap.gpu_buffer) {
        auto e = failure(KeyError::kGpuBufferGone);
        e.error().gpu_buffer_now = now;
        return e;
      }
      if (!allow_gpu) return failure(KeyError::kGpuMemory);
    }

    // Pin, then confirm the slot did not change since the snapshot. Both
    // seq_cst: either deregister_mr's wait sees this pin, or this re-read
    // sees its change (then back out and look again).
    s->pins.fetch_add(1, std::memory_order_seq_cst);
    if (s->seq.load(std::memory_order_seq_cst) != snap.seq) {
      s->pins.fetch_sub(1, std::memory_order_release);
      continue;
    }
    uint64_t device = snap.device ? snap.device + (host - snap.host) : 0;
    return Access(reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(host)), length, key, &s->pins, device,
                  static_cast<Durability>(snap.durability), snap.gpu_buffer != 0 ? snap.gpu_device : -1);
  }
}

std::optional<KeyCheckError> MemoryRegionTable::gpu_check(uint32_t lkey) const {
  if (lkey == 0) return std::nullopt;
  uint32_t slot_no = slot_of(lkey);
  if (slot_no >= options_.max_regions) return std::nullopt;
  Slot* s = slot_at(slot_no);
  if (!s) return std::nullopt;
  Snapshot snap;
  for (uint32_t spins = 0; !read_snapshot(*s, &snap); ++spins) {
    if (spins < 64) {
      cpu_relax();
    } else {
      std::this_thread::yield();
    }
  }
  if (snap.key != lkey || snap.gpu_buffer == 0) return std::nullopt;
  KeyCheckError err;
  err.path = KeyPath::kLocal;
  err.key = lkey;
  err.region_start = snap.iova;
  err.region_length = snap.length;
  err.region_access = snap.access;
  err.gpu_device = snap.gpu_device;
  err.gpu_buffer_registered = snap.gpu_buffer;
  err.gpu_buffer_now = options_.gpu_buffer_id ? options_.gpu_buffer_id(snap.host) : snap.gpu_buffer;
  err.kind = err.gpu_buffer_now != snap.gpu_buffer ? KeyError::kGpuBufferGone : KeyError::kGpuMemory;
  return err;
}

CheckResult<Access> MemoryRegionTable::check_remote(uint32_t rkey, PdId pd, uint64_t va, uint64_t length,
                                                    AccessFlags needed, bool allow_gpu) const {
  return check(KeyPath::kRemote, rkey, pd, va, length, needed, false, allow_gpu);
}

CheckResult<Access> MemoryRegionTable::check_remote_region(uint32_t rkey, PdId pd, AccessFlags needed) const {
  return check(KeyPath::kRemote, rkey, pd, 0, 0, needed, true);
}

CheckResult<Access> MemoryRegionTable::check_local(uint32_t lkey, PdId pd, uint64_t addr, uint64_t length,
                                                   bool needs_write, bool allow_gpu) const {
  return check(KeyPath::kLocal, lkey, pd, addr, length, needs_write ? kLocalWrite : 0, false, allow_gpu);
}

}  // namespace ufab::verbs
