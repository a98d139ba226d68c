// The CUDA driver, loaded at run time: libcuda.so.1 is opened with dlopen
// and every entry point is resolved through cuGetProcAddress (CUDA 12+),
// asking for the versions of the cuda.h this was compiled against. Nothing
// links against CUDA, so every ufab binary runs on machines without a GPU
// driver and says so, with the fix, when GPU memory is asked for.
//
// Built without the CUDA Toolkit's headers (no cuda.h at build time, see
// third_party/cuda/cuda.bzl), every call here fails with ENOTSUP saying
// how to rebuild with GPU support.
//
// This header does not include cuda.h: users see plain C++ types.
// docs/gpu.md.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"

namespace ufab::gpu {

// Whether this build can load CUDA at all (compiled against cuda.h).
bool built_with_cuda();
// The CUDA_VERSION of the cuda.h compiled against (13000 = 13.0), 0 when none.
int built_cuda_version();

// "13.0" from 13000.
std::string cuda_version_string(int version);

// What memory a pointer addresses, as the driver sees it.
enum class MemoryType : uint8_t {
  kNotCuda,     // not allocated, mapped or registered by CUDA: plain host memory
  kHost,        // host memory CUDA allocated or registered (cuMemHostAlloc, cuMemHostRegister): host-accessible
  kDevice,      // device memory (cuMemAlloc, cudaMalloc, or managed memory: see `managed`)
  kArray,       // a CUDA array
};
const char* memory_type_name(MemoryType t);  // "not CUDA", "CUDA host", "CUDA device", "CUDA array"

struct PointerInfo {
  MemoryType type = MemoryType::kNotCuda;
  bool managed = false;     // unified (managed) memory, which may migrate between host and GPU
  int device = -1;          // ordinal of the GPU it was allocated on or registered with; -1: none
  uint64_t buffer_id = 0;   // unique within the process over its lifetime; 0: no CUDA allocation here
  uint64_t range_start = 0; // the allocation that holds the pointer
  uint64_t range_size = 0;
};

struct DeviceInfo {
  int ordinal = 0;
  std::string name;        // "NVIDIA H100 80GB HBM3"
  std::string pci_address; // "0000:01:00.0"
  uint64_t memory_bytes = 0;
  int compute_major = 0, compute_minor = 0;
  // cuDeviceGetAttribute's word on the stream memory operations
  // (CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, ..._WAIT_VALUE_NOR).
  bool memops_64bit = false;
  bool memops_wait_nor = false;
};

class Driver;

// The primary context of a GPU, retained and made current on this thread
// while the object lives (cuDevicePrimaryCtxRetain / Release). Every call
// below that allocates or launches needs one current.
class PrimaryContext {
 public:
  static Result<PrimaryContext> retain(const Driver& driver, int ordinal);
  PrimaryContext(PrimaryContext&& o) noexcept : driver_(o.driver_), ordinal_(o.ordinal_), ctx_(o.ctx_) { o.ctx_ = nullptr; }
  PrimaryContext& operator=(PrimaryContext&& o) noexcept;
  PrimaryContext(const PrimaryContext&) = delete;
  PrimaryContext& operator=(const PrimaryContext&) = delete;
  ~PrimaryContext();
  // Makes it current on the calling thread (again).
  Status make_current() const;
  int ordinal() const { return ordinal_; }

 private:
  PrimaryContext(const Driver* d, int ordinal, void* ctx) : driver_(d), ordinal_(ordinal), ctx_(ctx) {}
  void reset();
  const Driver* driver_ = nullptr;
  int ordinal_ = 0;
  void* ctx_ = nullptr;  // CUcontext
};

// Memory from the driver, freed with the object: device memory (cuMemAlloc,
// what cudaMalloc gives), managed memory (cuMemAllocManaged) or pinned host
// memory (cuMemHostAlloc). The primary context of its GPU is retained, and
// made current on the thread that frees it.
class Allocation {
 public:
  enum class Kind : uint8_t { kDevice, kManaged, kPinnedHost };
  static Result<Allocation> allocate(const Driver& driver, int ordinal, Kind kind, size_t bytes);
  Allocation(Allocation&& o) noexcept;
  Allocation& operator=(Allocation&& o) noexcept;
  Allocation(const Allocation&) = delete;
  Allocation& operator=(const Allocation&) = delete;
  ~Allocation();
  void* data() const { return reinterpret_cast<void*>(ptr_); }
  size_t size() const { return size_; }
  Kind kind() const { return kind_; }
  // Frees it now (the object becomes empty).
  Status free();
  // Synchronous copies between host memory and [offset, offset + n) of
  // the allocation (cuMemcpyHtoD / cuMemcpyDtoH on device and managed
  // memory, memcpy on pinned host memory). For tools and tests, not for a
  // data path: they block until the copy is done. EINVAL past the end.
  Status write(size_t offset, const void* src, size_t n) const;
  Status read(size_t offset, void* dst, size_t n) const;
  // The address GPU work uses for it: the device pointer of device and
  // managed memory; for pinned host memory cuMemHostGetDevicePointer's.
  Result<uint64_t> device_address() const;

 private:
  Allocation(const Driver* d, PrimaryContext ctx, Kind kind, uint64_t ptr, size_t size)
      : driver_(d), ctx_(std::move(ctx)), kind_(kind), ptr_(ptr), size_(size) {}
  [[maybe_unused]] const Driver* driver_ = nullptr;  // unused without the toolkit
  PrimaryContext ctx_;
  Kind kind_ = Kind::kDevice;
  uint64_t ptr_ = 0;
  size_t size_ = 0;
};

// A non-blocking stream (CU_STREAM_NON_BLOCKING) on the context current
// on the creating thread, for the staging copy thread (core/staging): it
// queues copies and 32-bit writes into pinned host memory, in order. Use it
// from one thread, with the same context current.
class AsyncStream {
 public:
  static Result<AsyncStream> create(const Driver& driver);
  AsyncStream(AsyncStream&& o) noexcept : driver_(o.driver_), stream_(o.stream_) { o.stream_ = nullptr; }
  AsyncStream& operator=(AsyncStream&&) = delete;
  AsyncStream(const AsyncStream&) = delete;
  AsyncStream& operator=(const AsyncStream&) = delete;
  ~AsyncStream();
  // cuMemcpyAsync: any two addresses CUDA knows (device memory, pinned or
  // pageable host memory; unified addressing tells which).
  Status copy(void* dst, const void* src, size_t n);
  // cuStreamWriteValue32 of `value` to the pinned host word whose device
  // address is `device_word` (host_device_pointer), once what was queued
  // before it is done. ENOSYS when the driver lacks the entry point.
  Status write_value(uint64_t device_word, uint32_t value);
  // cuStreamSynchronize: blocks until everything queued is done.
  Status synchronize();

 private:
  AsyncStream(const Driver* d, void* s) : driver_(d), stream_(s) {}
  [[maybe_unused]] const Driver* driver_ = nullptr;
  void* stream_ = nullptr;  // CUstream
};

// The device address of pinned host memory allocated with DEVICEMAP
// (Allocation::Kind::kPinnedHost), for stream memory operations.
Result<uint64_t> host_device_pointer(const Driver& driver, void* host);

// The loaded driver: one per process, loaded on first use and kept until
// the process ends (libcuda is not made to be unloaded).
class Driver {
 public:
  // Loads libcuda.so.1 and initialises it (cuInit), once; later calls give
  // the same answer. Errors say what is missing: GPU support not built
  // (ENOTSUP), no driver library (ENOENT), a driver older than CUDA 12 or
  // an entry point missing (ENOSYS), cuInit failing (no device, a driver
  // and kernel module that do not match: ENODEV / EIO).
  static Result<const Driver*> get();
  // The driver when libcuda.so.1 is already in this process (the
  // application uses CUDA), loading nothing otherwise: a process that never
  // loaded CUDA has no GPU pointers, so registering host memory there costs
  // no dlopen of the driver. nullptr when not loaded or when it fails.
  static const Driver* if_loaded();

  // cuDriverGetVersion: 13000 for CUDA 13.0.
  int version() const { return version_; }
  // The library's path as the dynamic loader found it.
  const std::string& library_path() const { return library_; }

  Result<int> device_count() const;
  Result<DeviceInfo> device(int ordinal) const;
  // cuPointerGetAttributes: type, managed, ordinal, buffer id, range.
  // Never fails for a host pointer CUDA does not know (kNotCuda).
  Result<PointerInfo> pointer_info(const void* p) const;
  // The CUDA buffer id at `p` alone (cuPointerGetAttributes of that one
  // attribute, nothing else asked of the driver): 0 for memory CUDA does
  // not know. For checks that an allocation is still the one seen before
  // (a registration cache hit, a key's memory still there).
  Result<uint64_t> buffer_id(const void* p) const;
  // Whether the stream memory operations work on this GPU: a stream writes
  // a 32-bit value into pinned host memory (cuStreamWriteValue32) and waits
  // for a value there (cuStreamWaitValue32), and the host sees both.
  Status probe_stream_memops(int ordinal) const;
  // Stream memory operations (v2): when `stream` (a CUstream) gets
  // there, store `value` at the 32-bit word at device address `word`;
  // make `stream` wait until that word is >= `value`. The caller has the
  // stream's context current.
  Status stream_write_value32(void* stream, uint64_t word, uint32_t value) const;
  Status stream_wait_value32_geq(void* stream, uint64_t word, uint32_t value) const;
  // A kernel (a CUfunction) named `name` of the PTX module `ptx`, loaded
  // into GPU `ordinal`'s primary context on first use and kept, with that
  // context retained, until the process ends (a stream may still hold a
  // launch of it). ENOSYS: a driver without cuModuleLoadData/cuLaunchKernel;
  // the JIT's own error when the GPU cannot run the PTX.
  Result<void*> kernel(int ordinal, const char* ptx, const char* name) const;
  // One block of `threads` threads of `function` (from kernel()) on
  // `stream`, with `args` (cuLaunchKernel). The caller has the stream's
  // context current.
  Status launch(void* function, void* stream, unsigned threads, void** args) const;

  // CUDA IPC (cuIpcGetMemHandle / cuIpcOpenMemHandle / cuIpcCloseMemHandle),
  // for two processes on one host moving GPU memory device to device
  // (the shm provider, docs/gpu.md "shm"). The driver entry points are
  // optional: a driver without them says so here (ENOSYS).
  static constexpr size_t kIpcHandleBytes = 64;  // sizeof(CUipcMemHandle)
  struct IpcExport {
    uint8_t handle[kIpcHandleBytes] = {};
    uint64_t base = 0, size = 0;  // the allocation holding the pointer (cuMemGetAddressRange)
  };
  // The IPC handle of the allocation that holds `p` (device memory of GPU
  // `ordinal`, whose primary context is made current on this thread).
  // Fails for memory cuIpcGetMemHandle refuses: virtual memory management
  // (cuMemCreate/cuMemMap) and stream-ordered pool allocations
  // (cuMemAllocAsync), managed memory.
  Result<IpcExport> ipc_export(const void* p, int ordinal) const;
  // Maps another process's exported allocation into this one
  // (CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS); the caller has a context
  // current. Its device address, valid until ipc_close.
  Result<uint64_t> ipc_open(const uint8_t (&handle)[kIpcHandleBytes]) const;
  Status ipc_close(uint64_t mapped) const;
  // cuDeviceCanAccessPeer(a, b); a == b is true.
  Result<bool> can_access_peer(int a, int b) const;
  // The ordinal of the GPU at PCI address `pci` ("0000:01:00.0") as this
  // process numbers them; ENODEV when it does not see it.
  Result<int> ordinal_of_pci(const std::string& pci) const;

  // "CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)".
  std::string error_text(int cu_result) const;

  struct Api;  // the resolved entry points (core/gpu/cuda.cc)
  const Api& api() const { return *api_; }
  ~Driver();

 private:
  Driver();
  static Result<const Driver*> load();
  std::unique_ptr<Api> api_;
  [[maybe_unused]] void* handle_ = nullptr;  // dlopen handle (never closed: see above); unused without the toolkit
  int version_ = 0;
  std::string library_;
};

// One line for tools: "no GPU support: ufab was built without the CUDA
// Toolkit's headers ...", or the error get() gives.
std::string unavailable_reason();

}  // namespace ufab::gpu
