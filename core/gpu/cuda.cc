#include "core/gpu/cuda.h"

#include <dlfcn.h>
#include <link.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <vector>

#include "base/hex.h"

#if defined(UFAB_HAVE_CUDA_TOOLKIT)
#include <cuda.h>
#endif

namespace ufab::gpu {

const char* memory_type_name(MemoryType t) {
  switch (t) {
    case MemoryType::kNotCuda: return "not CUDA";
    case MemoryType::kHost: return "CUDA host";
    case MemoryType::kDevice: return "CUDA device";
    case MemoryType::kArray: return "CUDA array";
  }
  return "?";
}

std::string cuda_version_string(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }

#if !defined(UFAB_HAVE_CUDA_TOOLKIT)

// ------------------------------------------------------ built without CUDA

namespace {
constexpr const char* kNotBuilt =
    "no GPU support: this ufab was built without the CUDA Toolkit's headers (cuda.h); install the toolkit "
    "(/usr/local/cuda, or set CUDA_PATH) and rebuild (README.md, \"GPU support\")";
}

bool built_with_cuda() { return false; }
int built_cuda_version() { return 0; }
std::string unavailable_reason() { return kNotBuilt; }

struct Driver::Api {};
Driver::Driver() = default;
Driver::~Driver() = default;
Result<const Driver*> Driver::load() { return fail(ENOTSUP, kNotBuilt); }
Result<const Driver*> Driver::get() { return load(); }
const Driver* Driver::if_loaded() { return nullptr; }
Result<int> Driver::device_count() const { return fail(ENOTSUP, kNotBuilt); }
Result<DeviceInfo> Driver::device(int) const { return fail(ENOTSUP, kNotBuilt); }
Result<PointerInfo> Driver::pointer_info(const void*) const { return fail(ENOTSUP, kNotBuilt); }
Result<uint64_t> Driver::buffer_id(const void*) const { return fail(ENOTSUP, kNotBuilt); }
Status Driver::probe_stream_memops(int) const { return fail(ENOTSUP, kNotBuilt); }
std::string Driver::error_text(int r) const { return "CUresult " + std::to_string(r); }

Result<PrimaryContext> PrimaryContext::retain(const Driver&, int) { return fail(ENOTSUP, kNotBuilt); }
PrimaryContext& PrimaryContext::operator=(PrimaryContext&& o) noexcept {
  std::swap(ctx_, o.ctx_);
  return *this;
}
PrimaryContext::~PrimaryContext() = default;
void PrimaryContext::reset() {}
Status PrimaryContext::make_current() const { return fail(ENOTSUP, kNotBuilt); }

Result<Allocation> Allocation::allocate(const Driver&, int, Kind, size_t) { return fail(ENOTSUP, kNotBuilt); }
Allocation::Allocation(Allocation&& o) noexcept : ctx_(std::move(o.ctx_)) {}
Allocation& Allocation::operator=(Allocation&&) noexcept { return *this; }
Allocation::~Allocation() = default;
Status Allocation::free() { return {}; }
Status Allocation::write(size_t, const void*, size_t) const { return fail(ENOTSUP, kNotBuilt); }
Result<uint64_t> Allocation::device_address() const { return fail(ENOTSUP, kNotBuilt); }
Status Driver::stream_write_value32(void*, uint64_t, uint32_t) const { return fail(ENOTSUP, kNotBuilt); }
Status Driver::stream_wait_value32_geq(void*, uint64_t, uint32_t) const { return fail(ENOTSUP, kNotBuilt); }
Result<void*> Driver::kernel(int, const char*, const char*) const { return fail(ENOTSUP, kNotBuilt); }
Status Driver::launch(void*, void*, unsigned, void**) const { return fail(ENOTSUP, kNotBuilt); }
Status Allocation::read(size_t, void*, size_t) const { return fail(ENOTSUP, kNotBuilt); }
Result<Driver::IpcExport> Driver::ipc_export(const void*, int) const { return fail(ENOTSUP, kNotBuilt); }
Result<uint64_t> Driver::ipc_open(const uint8_t (&)[kIpcHandleBytes]) const { return fail(ENOTSUP, kNotBuilt); }
Status Driver::ipc_close(uint64_t) const { return fail(ENOTSUP, kNotBuilt); }
Result<bool> Driver::can_access_peer(int, int) const { return fail(ENOTSUP, kNotBuilt); }
Result<int> Driver::ordinal_of_pci(const std::string&) const { return fail(ENOTSUP, kNotBuilt); }

Result<AsyncStream> AsyncStream::create(const Driver&) { return fail(ENOTSUP, kNotBuilt); }
AsyncStream::~AsyncStream() = default;
Status AsyncStream::copy(void*, const void*, size_t) { return fail(ENOTSUP, kNotBuilt); }
Status AsyncStream::write_value(uint64_t, uint32_t) { return fail(ENOTSUP, kNotBuilt); }
Status AsyncStream::synchronize() { return fail(ENOTSUP, kNotBuilt); }
Result<uint64_t> host_device_pointer(const Driver&, void*) { return fail(ENOTSUP, kNotBuilt); }

#else  // UFAB_HAVE_CUDA_TOOLKIT

// ------------------------------------------------------------ the loader

// Every entry point ufab calls, with the signatures of the cuda.h compiled
// against. The name given to cuGetProcAddress is the base name ("cuMemAlloc",
// not the header's cuMemAlloc_v2 macro): with CUDA_VERSION as the version,
// the driver returns the variant whose signature that header declares.
#define UFAB_CUDA_REQUIRED(X)  \
  X(cuDriverGetVersion)        \
  X(cuGetErrorName)            \
  X(cuGetErrorString)          \
  X(cuDeviceGetCount)          \
  X(cuDeviceGet)               \
  X(cuDeviceGetName)           \
  X(cuDeviceGetAttribute)      \
  X(cuDeviceTotalMem)          \
  X(cuDevicePrimaryCtxRetain)  \
  X(cuDevicePrimaryCtxRelease) \
  X(cuCtxSetCurrent)           \
  X(cuPointerGetAttributes)    \
  X(cuMemAlloc)                \
  X(cuMemFree)                 \
  X(cuMemAllocManaged)         \
  X(cuMemHostAlloc)            \
  X(cuMemFreeHost)             \
  X(cuMemcpyHtoD)              \
  X(cuMemcpyDtoH)              \
  X(cuMemcpyAsync)             \
  X(cuStreamCreate)            \
  X(cuStreamDestroy)           \
  X(cuStreamSynchronize)       \
  X(cuStreamQuery)
// Looked up too, but a driver without them still loads (probe says so).
#define UFAB_CUDA_OPTIONAL(X) \
  X(cuStreamWriteValue32)     \
  X(cuStreamWaitValue32)      \
  X(cuMemHostGetDevicePointer) \
  X(cuModuleLoadData)          \
  X(cuModuleGetFunction)       \
  X(cuLaunchKernel)            \
  X(cuMemGetAddressRange)     \
  X(cuIpcGetMemHandle)        \
  X(cuIpcOpenMemHandle)       \
  X(cuIpcCloseMemHandle)      \
  X(cuDeviceCanAccessPeer)

struct Driver::Api {
#define UFAB_CUDA_MEMBER(name) decltype(&::name) name = nullptr;
  UFAB_CUDA_REQUIRED(UFAB_CUDA_MEMBER)
  UFAB_CUDA_OPTIONAL(UFAB_CUDA_MEMBER)
#undef UFAB_CUDA_MEMBER
};

namespace {

constexpr const char* kLibrary = "libcuda.so.1";

int errno_for(CUresult r) {
  switch (r) {
    case CUDA_ERROR_INVALID_VALUE: return EINVAL;
    case CUDA_ERROR_OUT_OF_MEMORY: return ENOMEM;
    case CUDA_ERROR_NO_DEVICE: return ENODEV;
    case CUDA_ERROR_INVALID_DEVICE: return ENODEV;
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH: return ENOSYS;
    case CUDA_ERROR_NOT_SUPPORTED: return ENOTSUP;
    case CUDA_ERROR_NOT_PERMITTED: return EPERM;
    default: return EIO;
  }
}

std::string dl_error() {
  const char* e = ::dlerror();
  return e ? e : "unknown dlopen error";
}

}  // namespace

bool built_with_cuda() { return true; }
int built_cuda_version() { return CUDA_VERSION; }

Driver::Driver() : api_(std::make_unique<Api>()) {}
// Runs only for a driver that failed to load (a loaded one is never freed).
Driver::~Driver() {
  if (handle_ != nullptr) ::dlclose(handle_);
}

std::string Driver::error_text(int r) const {
  const char* name = nullptr;
  const char* text = nullptr;
  if (api_->cuGetErrorName) api_->cuGetErrorName(static_cast<CUresult>(r), &name);
  if (api_->cuGetErrorString) api_->cuGetErrorString(static_cast<CUresult>(r), &text);
  std::string out = name ? name : "CUresult " + std::to_string(r);
  if (text) out += std::string(" (") + text + ")";
  return out;
}

Result<const Driver*> Driver::load() {
  void* handle = ::dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    return fail(ENOENT, std::string("no GPU driver (") + kLibrary + " not found: " + dl_error() +
                            "): install the NVIDIA driver (its user-space library libcuda.so.1), or put the "
                            "directory holding it on LD_LIBRARY_PATH");
  }
  // The handle is kept by the Driver, which lives until the process ends:
  // closing libcuda while its own threads run is not supported by NVIDIA.
  std::unique_ptr<Driver> d(new Driver());
  d->handle_ = handle;
  if (link_map* lm = nullptr; ::dlinfo(handle, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name) d->library_ = lm->l_name;
  if (d->library_.empty()) d->library_ = kLibrary;
  // cuGetProcAddress_v2 (CUDA 12.0 on) is the only symbol taken by name.
  using GetProc = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
  auto get_proc = reinterpret_cast<GetProc>(::dlsym(handle, "cuGetProcAddress_v2"));
  if (get_proc == nullptr) {
    return fail(ENOSYS, d->library_ + " has no cuGetProcAddress_v2: the NVIDIA driver is older than CUDA 12; "
                                       "install driver 525 or newer");
  }
  // Required entry points first, so a failure below can be put in words.
  std::string missing;
  auto resolve = [&](const char* name, void** slot, bool required) {
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
    CUresult r = get_proc(name, slot, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &status);
    if (r != CUDA_SUCCESS || status != CU_GET_PROC_ADDRESS_SUCCESS || *slot == nullptr) {
      *slot = nullptr;
      if (required) missing += std::string(missing.empty() ? "" : ", ") + name;
    }
  };
#define UFAB_CUDA_RESOLVE_REQ(name) resolve(#name, reinterpret_cast<void**>(&d->api_->name), true);
#define UFAB_CUDA_RESOLVE_OPT(name) resolve(#name, reinterpret_cast<void**>(&d->api_->name), false);
  UFAB_CUDA_REQUIRED(UFAB_CUDA_RESOLVE_REQ)
  UFAB_CUDA_OPTIONAL(UFAB_CUDA_RESOLVE_OPT)
#undef UFAB_CUDA_RESOLVE_REQ
#undef UFAB_CUDA_RESOLVE_OPT
  // cuInit is resolved by name only here so the loop above stays one list.
  decltype(&::cuInit) init = nullptr;
  resolve("cuInit", reinterpret_cast<void**>(&init), true);
  if (!missing.empty()) {
    return fail(ENOSYS, d->library_ + " lacks driver entry points ufab needs (" + missing +
                            ") at CUDA " + cuda_version_string(CUDA_VERSION) +
                            "'s signatures: update the NVIDIA driver");
  }
  int version = 0;
  d->api_->cuDriverGetVersion(&version);
  d->version_ = version;
  if (CUresult r = init(0); r != CUDA_SUCCESS) {
    return fail(errno_for(r), "the NVIDIA driver (" + d->library_ + ", CUDA " + cuda_version_string(version) +
                                  ") failed to initialise: cuInit: " + d->error_text(r) +
                                  (r == CUDA_ERROR_NO_DEVICE ? "; no GPU is visible to this process (nvidia-smi; "
                                                               "CUDA_VISIBLE_DEVICES)"
                                                             : "; nvidia-smi shows whether the driver works"));
  }
  return d.release();
}

Result<const Driver*> Driver::get() {
  static const Result<const Driver*> loaded = load();
  return loaded;
}

// Objects loaded into the process so far (the dynamic loader's count of
// loads, dlpi_adds): unchanged means no library came since the last look.
static unsigned long long loads_so_far() {
  unsigned long long adds = 0;
  ::dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) -> int {
        *static_cast<unsigned long long*>(out) = info->dlpi_adds;
        return 1;  // the first object is enough
      },
      &adds);
  return adds;
}

static bool libcuda_in_process() {
  bool found = false;
  ::dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) -> int {
        const char* name = info->dlpi_name ? info->dlpi_name : "";
        const char* base = std::strrchr(name, '/');
        base = base ? base + 1 : name;
        if (std::strncmp(base, "libcuda.so", 10) == 0) {
          *static_cast<bool*>(out) = true;
          return 1;
        }
        return 0;
      },
      &found);
  return found;
}

const Driver* Driver::if_loaded() {
  static std::atomic<const Driver*> known{nullptr};
  static std::atomic<unsigned long long> looked_at{~0ull};
  if (const Driver* d = known.load(std::memory_order_acquire)) return d;
  // Registration calls this for all host memory, so it must be cheap: the
  // loader's load count (one dl_iterate_phdr step) says whether anything
  // was loaded since the last look; only then is the list searched. (A
  // dlopen with RTLD_NOLOAD would search the library path on disk each
  // time libcuda is absent: tens of microseconds.)
  const unsigned long long adds = loads_so_far();
  if (looked_at.load(std::memory_order_relaxed) == adds) return nullptr;
  if (!libcuda_in_process()) {
    looked_at.store(adds, std::memory_order_relaxed);
    return nullptr;
  }
  auto d = get();
  if (!d) return nullptr;
  known.store(*d, std::memory_order_release);
  return *d;
}

std::string unavailable_reason() {
  auto d = Driver::get();
  if (!d) return d.error().message();
  auto n = (*d)->device_count();
  if (!n) return n.error().message();
  if (*n == 0) return "the NVIDIA driver reports no GPU";
  return "";
}

Result<int> Driver::device_count() const {
  int n = 0;
  if (CUresult r = api_->cuDeviceGetCount(&n); r != CUDA_SUCCESS) {
    return fail(errno_for(r), "cuDeviceGetCount: " + error_text(r));
  }
  return n;
}

Result<DeviceInfo> Driver::device(int ordinal) const {
  CUdevice dev = 0;
  if (CUresult r = api_->cuDeviceGet(&dev, ordinal); r != CUDA_SUCCESS) {
    return fail(errno_for(r), "GPU " + std::to_string(ordinal) + ": cuDeviceGet: " + error_text(r));
  }
  DeviceInfo info;
  info.ordinal = ordinal;
  char name[256] = {};
  api_->cuDeviceGetName(name, sizeof name - 1, dev);
  info.name = name;
  size_t bytes = 0;
  api_->cuDeviceTotalMem(&bytes, dev);
  info.memory_bytes = bytes;
  auto attr = [&](CUdevice_attribute a) {
    int v = 0;
    return api_->cuDeviceGetAttribute(&v, a, dev) == CUDA_SUCCESS ? v : 0;
  };
  info.compute_major = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  info.compute_minor = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  char pci[32];
  std::snprintf(pci, sizeof pci, "%04x:%02x:%02x.0", attr(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID),
                attr(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID), attr(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID));
  info.pci_address = pci;
  info.memops_64bit = attr(CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS) != 0;
  info.memops_wait_nor = attr(CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR) != 0;
  return info;
}

Result<PointerInfo> Driver::pointer_info(const void* p) const {
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                 CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                 CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE};
  unsigned int type = 0;
  unsigned int managed = 0;  // written as a bool: the rest stays 0
  int ordinal = -1;
  unsigned long long buffer_id = 0;
  CUdeviceptr start = 0;
  size_t size = 0;
  void* data[] = {&type, &managed, &ordinal, &buffer_id, &start, &size};
  CUresult r = api_->cuPointerGetAttributes(sizeof attrs / sizeof attrs[0], attrs, data,
                                            reinterpret_cast<CUdeviceptr>(p));
  if (r != CUDA_SUCCESS) {
    return fail(errno_for(r), "cuPointerGetAttributes(" + hex(reinterpret_cast<uintptr_t>(p)) + "): " + error_text(r));
  }
  PointerInfo info;
  switch (type) {
    case CU_MEMORYTYPE_HOST: info.type = MemoryType::kHost; break;
    case CU_MEMORYTYPE_DEVICE: info.type = MemoryType::kDevice; break;
    case CU_MEMORYTYPE_ARRAY: info.type = MemoryType::kArray; break;
    case CU_MEMORYTYPE_UNIFIED: info.type = MemoryType::kDevice; info.managed = true; break;
    default: info.type = MemoryType::kNotCuda; break;
  }
  info.managed = info.managed || (managed & 0xff) != 0;
  if (info.type != MemoryType::kNotCuda) {
    info.device = ordinal;
    info.buffer_id = buffer_id;
    info.range_start = start;
    info.range_size = size;
  }
  return info;
}

Result<uint64_t> Driver::buffer_id(const void* p) const {
  CUpointer_attribute attr = CU_POINTER_ATTRIBUTE_BUFFER_ID;
  unsigned long long id = 0;
  void* data[] = {&id};
  CUresult r = api_->cuPointerGetAttributes(1, &attr, data, reinterpret_cast<CUdeviceptr>(p));
  if (r != CUDA_SUCCESS) {
    return fail(errno_for(r), "cuPointerGetAttributes(" + hex(reinterpret_cast<uintptr_t>(p)) +
                                  ", buffer id): " + error_text(r));
  }
  return static_cast<uint64_t>(id);
}

Status Driver::probe_stream_memops(int ordinal) const {
  const std::string who = "stream memory operations on GPU " + std::to_string(ordinal);
  if (!api_->cuStreamWriteValue32 || !api_->cuStreamWaitValue32 || !api_->cuMemHostGetDevicePointer) {
    return fail(ENOSYS, who + ": the driver has no cuStreamWriteValue32/cuStreamWaitValue32");
  }
  auto ctx = PrimaryContext::retain(*this, ordinal);
  if (!ctx) return std::unexpected(ctx.error().context(who));
  auto words = Allocation::allocate(*this, ordinal, Allocation::Kind::kPinnedHost, 32 * sizeof(uint32_t));
  if (!words) return std::unexpected(words.error().context(who));
  auto* w = static_cast<volatile uint32_t*>(words->data());
  w[0] = 0;   // the stream writes 0x5eed here
  w[16] = 7;  // the stream waits for >= 7 here (already true)
  CUdeviceptr dw0 = 0, dw16 = 0;
  if (CUresult r = api_->cuMemHostGetDevicePointer(&dw0, words->data(), 0); r != CUDA_SUCCESS) {
    return fail(errno_for(r), who + ": cuMemHostGetDevicePointer: " + error_text(r));
  }
  dw16 = dw0 + 16 * sizeof(uint32_t);
  CUstream stream = nullptr;
  if (CUresult r = api_->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING); r != CUDA_SUCCESS) {
    return fail(errno_for(r), who + ": cuStreamCreate: " + error_text(r));
  }
  Status result;
  if (CUresult r = api_->cuStreamWaitValue32(stream, dw16, 7, CU_STREAM_WAIT_VALUE_GEQ); r != CUDA_SUCCESS) {
    result = fail(errno_for(r), who + ": cuStreamWaitValue32: " + error_text(r));
  } else if (CUresult r2 = api_->cuStreamWriteValue32(stream, dw0, 0x5eed, CU_STREAM_WRITE_VALUE_DEFAULT);
             r2 != CUDA_SUCCESS) {
    result = fail(errno_for(r2), who + ": cuStreamWriteValue32: " + error_text(r2));
  } else if (CUresult r3 = api_->cuStreamSynchronize(stream); r3 != CUDA_SUCCESS) {
    result = fail(errno_for(r3), who + ": cuStreamSynchronize: " + error_text(r3));
  } else if (w[0] != 0x5eed) {
    result = fail(EIO, who + ": the stream's write of 0x5eed did not reach host memory (read " + hex(w[0]) + ")");
  }
  api_->cuStreamDestroy(stream);
  return result;
}

// ------------------------------------------------------------ async streams

Result<AsyncStream> AsyncStream::create(const Driver& d) {
  CUstream stream = nullptr;
  if (CUresult r = d.api().cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING); r != CUDA_SUCCESS) {
    return fail(errno_for(r), "cuStreamCreate (non-blocking): " + d.error_text(r));
  }
  return AsyncStream(&d, stream);
}

AsyncStream::~AsyncStream() {
  if (stream_ != nullptr) driver_->api().cuStreamDestroy(static_cast<CUstream>(stream_));
}

Status AsyncStream::copy(void* dst, const void* src, size_t n) {
  CUresult r = driver_->api().cuMemcpyAsync(static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(dst)),
                                            static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(src)), n,
                                            static_cast<CUstream>(stream_));
  if (r != CUDA_SUCCESS) {
    return fail(errno_for(r), "cuMemcpyAsync of " + std::to_string(n) + " bytes from " +
                                  hex(reinterpret_cast<uintptr_t>(src)) + " to " + hex(reinterpret_cast<uintptr_t>(dst)) +
                                  ": " + driver_->error_text(r));
  }
  return {};
}

Status AsyncStream::write_value(uint64_t device_word, uint32_t value) {
  if (!driver_->api().cuStreamWriteValue32) return fail(ENOSYS, "the driver has no cuStreamWriteValue32");
  CUresult r = driver_->api().cuStreamWriteValue32(static_cast<CUstream>(stream_), device_word, value,
                                                   CU_STREAM_WRITE_VALUE_DEFAULT);
  if (r != CUDA_SUCCESS) return fail(errno_for(r), "cuStreamWriteValue32: " + driver_->error_text(r));
  return {};
}

Status AsyncStream::synchronize() {
  CUresult r = driver_->api().cuStreamSynchronize(static_cast<CUstream>(stream_));
  if (r != CUDA_SUCCESS) return fail(errno_for(r), "cuStreamSynchronize: " + driver_->error_text(r));
  return {};
}

Result<uint64_t> host_device_pointer(const Driver& d, void* host) {
  if (!d.api().cuMemHostGetDevicePointer) return fail(ENOSYS, "the driver has no cuMemHostGetDevicePointer");
  CUdeviceptr p = 0;
  if (CUresult r = d.api().cuMemHostGetDevicePointer(&p, host, 0); r != CUDA_SUCCESS) {
    return fail(errno_for(r), "cuMemHostGetDevicePointer: " + d.error_text(r));
  }
  return static_cast<uint64_t>(p);
}

// ------------------------------------------------------- primary contexts

Result<PrimaryContext> PrimaryContext::retain(const Driver& d, int ordinal) {
  CUdevice dev = 0;
  if (CUresult r = d.api().cuDeviceGet(&dev, ordinal); r != CUDA_SUCCESS) {
    return fail(errno_for(r), "GPU " + std::to_string(ordinal) + ": cuDeviceGet: " + d.error_text(r));
  }
  CUcontext ctx = nullptr;
  if (CUresult r = d.api().cuDevicePrimaryCtxRetain(&ctx, dev); r != CUDA_SUCCESS) {
    return fail(errno_for(r), "GPU " + std::to_string(ordinal) + ": cuDevicePrimaryCtxRetain: " + d.error_text(r));
  }
  PrimaryContext pc(&d, ordinal, ctx);
  if (auto s = pc.make_current(); !s) return std::unexpected(s.error());
  return pc;
}

PrimaryContext& PrimaryContext::operator=(PrimaryContext&& o) noexcept {
  if (this != &o) {
    reset();
    driver_ = o.driver_;
    ordinal_ = o.ordinal_;
    ctx_ = o.ctx_;
    o.ctx_ = nullptr;
  }
  return *this;
}

PrimaryContext::~PrimaryContext() { reset(); }

void PrimaryContext::reset() {
  if (ctx_ == nullptr) return;
  CUdevice dev = 0;
  if (driver_->api().cuDeviceGet(&dev, ordinal_) == CUDA_SUCCESS) driver_->api().cuDevicePrimaryCtxRelease(dev);
  ctx_ = nullptr;
}

Status PrimaryContext::make_current() const {
  if (CUresult r = driver_->api().cuCtxSetCurrent(static_cast<CUcontext>(ctx_)); r != CUDA_SUCCESS) {
    return fail(errno_for(r), "GPU " + std::to_string(ordinal_) + ": cuCtxSetCurrent: " + driver_->error_text(r));
  }
  return {};
}

// ------------------------------------------------------------ allocations

Result<Allocation> Allocation::allocate(const Driver& d, int ordinal, Kind kind, size_t bytes) {
  auto ctx = PrimaryContext::retain(d, ordinal);
  if (!ctx) return std::unexpected(ctx.error());
  const char* what = kind == Kind::kDevice ? "cuMemAlloc" : kind == Kind::kManaged ? "cuMemAllocManaged" : "cuMemHostAlloc";
  CUresult r = CUDA_SUCCESS;
  uint64_t ptr = 0;
  switch (kind) {
    case Kind::kDevice: {
      CUdeviceptr p = 0;
      r = d.api().cuMemAlloc(&p, bytes);
      ptr = p;
      break;
    }
    case Kind::kManaged: {
      CUdeviceptr p = 0;
      r = d.api().cuMemAllocManaged(&p, bytes, CU_MEM_ATTACH_GLOBAL);
      ptr = p;
      break;
    }
    case Kind::kPinnedHost: {
      void* p = nullptr;
      r = d.api().cuMemHostAlloc(&p, bytes, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
      ptr = reinterpret_cast<uintptr_t>(p);
      break;
    }
  }
  if (r != CUDA_SUCCESS) {
    return fail(errno_for(r), std::string(what) + " of " + std::to_string(bytes) + " bytes on GPU " +
                                  std::to_string(ordinal) + ": " + d.error_text(r));
  }
  return Allocation(&d, std::move(*ctx), kind, ptr, bytes);
}

Allocation::Allocation(Allocation&& o) noexcept
    : driver_(o.driver_), ctx_(std::move(o.ctx_)), kind_(o.kind_), ptr_(o.ptr_), size_(o.size_) {
  o.ptr_ = 0;
  o.size_ = 0;
}

Allocation& Allocation::operator=(Allocation&& o) noexcept {
  if (this != &o) {
    (void)free();
    driver_ = o.driver_;
    ctx_ = std::move(o.ctx_);
    kind_ = o.kind_;
    ptr_ = o.ptr_;
    size_ = o.size_;
    o.ptr_ = 0;
    o.size_ = 0;
  }
  return *this;
}

Allocation::~Allocation() { (void)free(); }

Status Allocation::free() {
  if (ptr_ == 0) return {};
  (void)ctx_.make_current();
  CUresult r = kind_ == Kind::kPinnedHost ? driver_->api().cuMemFreeHost(reinterpret_cast<void*>(ptr_))
                                          : driver_->api().cuMemFree(static_cast<CUdeviceptr>(ptr_));
  ptr_ = 0;
  size_ = 0;
  if (r != CUDA_SUCCESS) return fail(errno_for(r), "freeing GPU memory: " + driver_->error_text(r));
  return {};
}

namespace {
Status copy_range_check(size_t offset, size_t n, size_t size) {
  if (offset > size || n > size - offset) {
    return fail(EINVAL, "copy of " + std::to_string(n) + " bytes at offset " + std::to_string(offset) +
                            " runs past the " + std::to_string(size) + "-byte GPU allocation");
  }
  return {};
}
}  // namespace

Status Allocation::write(size_t offset, const void* src, size_t n) const {
  if (auto c = copy_range_check(offset, n, size_); !c) return c;
  if (kind_ == Kind::kPinnedHost) {
    std::memcpy(reinterpret_cast<uint8_t*>(ptr_) + offset, src, n);
    return {};
  }
  if (auto c = ctx_.make_current(); !c) return c;
  if (CUresult r = driver_->api().cuMemcpyHtoD(static_cast<CUdeviceptr>(ptr_ + offset), src, n); r != CUDA_SUCCESS) {
    return fail(errno_for(r), "cuMemcpyHtoD of " + std::to_string(n) + " bytes: " + driver_->error_text(r));
  }
  return {};
}

Status Allocation::read(size_t offset, void* dst, size_t n) const {
  if (auto c = copy_range_check(offset, n, size_); !c) return c;
  if (kind_ == Kind::kPinnedHost) {
    std::memcpy(dst, reinterpret_cast<const uint8_t*>(ptr_) + offset, n);
    return {};
  }
  if (auto c = ctx_.make_current(); !c) return c;
  if (CUresult r = driver_->api().cuMemcpyDtoH(dst, static_cast<CUdeviceptr>(ptr_ + offset), n); r != CUDA_SUCCESS) {
    return fail(errno_for(r), "cuMemcpyDtoH of " + std::to_string(n) + " bytes: " + driver_->error_text(r));
  }
  return {};
}

Result<uint64_t> Allocation::device_address() const {
  if (kind_ != Kind::kPinnedHost) return ptr_;
  CUdeviceptr d = 0;
  if (CUresult r = driver_->api().cuMemHostGetDevicePointer(&d, reinterpret_cast<void*>(ptr_), 0); r != CUDA_SUCCESS) {
    return fail(errno_for(r), "cuMemHostGetDevicePointer: " + driver_->error_text(r));
  }
  return uint64_t(d);
}

Status Driver::stream_write_value32(void* stream, uint64_t word, uint32_t value) const {
  if (!api_->cuStreamWriteValue32) return fail(ENOSYS, "this CUDA driver has no cuStreamWriteValue32");
  if (CUresult r = api_->cuStreamWriteValue32(static_cast<CUstream>(stream), static_cast<CUdeviceptr>(word), value,
                                              CU_STREAM_WRITE_VALUE_DEFAULT);
      r != CUDA_SUCCESS) {
    return fail(errno_for(r), "cuStreamWriteValue32: " + error_text(r));
  }
  return {};
}

Status Driver::stream_wait_value32_geq(void* stream, uint64_t word, uint32_t value) const {
  if (!api_->cuStreamWaitValue32) return fail(ENOSYS, "this CUDA driver has no cuStreamWaitValue32");
  if (CUresult r = api_->cuStreamWaitValue32(static_cast<CUstream>(stream), static_cast<CUdeviceptr>(word), value,
                                             CU_STREAM_WAIT_VALUE_GEQ);
      r != CUDA_SUCCESS) {
    return fail(errno_for(r), "cuStreamWaitValue32: " + error_text(r));
  }
  return {};
}

Result<void*> Driver::kernel(int ordinal, const char* ptx, const char* name) const {
  const std::string who = "GPU " + std::to_string(ordinal) + ": loading the kernel " + name;
  if (!api_->cuModuleLoadData || !api_->cuModuleGetFunction || !api_->cuLaunchKernel) {
    return fail(ENOSYS, who + ": this CUDA driver has no cuModuleLoadData/cuModuleGetFunction/cuLaunchKernel");
  }
  struct Loaded {
    int ordinal;
    const char* ptx;
    std::string name;
    CUfunction function;
  };
  // Loaded once per GPU, module and name; the primary contexts they live
  // in stay retained (never released: a stream may launch them later).
  static std::mutex mu;
  static auto* loaded = new std::vector<Loaded>;
  static auto* contexts = new std::vector<PrimaryContext>;
  std::lock_guard lock(mu);
  for (const Loaded& l : *loaded) {
    if (l.ordinal == ordinal && l.ptx == ptx && l.name == name) return static_cast<void*>(l.function);
  }
  auto ctx = PrimaryContext::retain(*this, ordinal);
  if (!ctx) return std::unexpected(ctx.error().context(who));
  CUmodule module = nullptr;
  if (CUresult r = api_->cuModuleLoadData(&module, ptx); r != CUDA_SUCCESS) {
    return fail(errno_for(r), who + ": cuModuleLoadData (JIT of its PTX): " + error_text(r));
  }
  CUfunction function = nullptr;
  if (CUresult r = api_->cuModuleGetFunction(&function, module, name); r != CUDA_SUCCESS) {
    return fail(errno_for(r), who + ": cuModuleGetFunction: " + error_text(r));
  }
  contexts->push_back(std::move(*ctx));
  loaded->push_back({ordinal, ptx, name, function});
  return static_cast<void*>(function);
}

Status Driver::launch(void* function, void* stream, unsigned threads, void** args) const {
  if (!api_->cuLaunchKernel) return fail(ENOSYS, "this CUDA driver has no cuLaunchKernel");
  if (CUresult r = api_->cuLaunchKernel(static_cast<CUfunction>(function), 1, 1, 1, threads, 1, 1, 0,
                                        static_cast<CUstream>(stream), args, nullptr);
      r != CUDA_SUCCESS) {
    return fail(errno_for(r), "cuLaunchKernel: " + error_text(r));
  }
  return {};
}

// ------------------------------------------------------------------- IPC

static_assert(sizeof(CUipcMemHandle) == Driver::kIpcHandleBytes);

Result<Driver::IpcExport> Driver::ipc_export(const void* p, int ordinal) const {
  const std::string who = "CUDA IPC export of " + hex(reinterpret_cast<uintptr_t>(p));
  if (!api_->cuIpcGetMemHandle || !api_->cuMemGetAddressRange) {
    return fail(ENOSYS, who + ": the driver has no cuIpcGetMemHandle/cuMemGetAddressRange");
  }
  auto ctx = PrimaryContext::retain(*this, ordinal);
  if (!ctx) return std::unexpected(ctx.error().context(who));
  IpcExport out;
  CUdeviceptr base = 0;
  size_t size = 0;
  if (CUresult r = api_->cuMemGetAddressRange(&base, &size, reinterpret_cast<CUdeviceptr>(p)); r != CUDA_SUCCESS) {
    return fail(errno_for(r), who + ": cuMemGetAddressRange: " + error_text(r));
  }
  CUipcMemHandle h;
  if (CUresult r = api_->cuIpcGetMemHandle(&h, base); r != CUDA_SUCCESS) {
    return fail(errno_for(r), who + ": cuIpcGetMemHandle: " + error_text(r));
  }
  std::memcpy(out.handle, &h, sizeof h);
  out.base = base;
  out.size = size;
  return out;
}

Result<uint64_t> Driver::ipc_open(const uint8_t (&handle)[kIpcHandleBytes]) const {
  if (!api_->cuIpcOpenMemHandle) return fail(ENOSYS, "the driver has no cuIpcOpenMemHandle");
  CUipcMemHandle h;
  std::memcpy(&h, handle, sizeof h);
  CUdeviceptr p = 0;
  if (CUresult r = api_->cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS); r != CUDA_SUCCESS) {
    return fail(errno_for(r), "cuIpcOpenMemHandle: " + error_text(r));
  }
  return static_cast<uint64_t>(p);
}

Status Driver::ipc_close(uint64_t mapped) const {
  if (!api_->cuIpcCloseMemHandle) return fail(ENOSYS, "the driver has no cuIpcCloseMemHandle");
  if (CUresult r = api_->cuIpcCloseMemHandle(static_cast<CUdeviceptr>(mapped)); r != CUDA_SUCCESS) {
    return fail(errno_for(r), "cuIpcCloseMemHandle(" + hex(mapped) + "): " + error_text(r));
  }
  return {};
}

Result<bool> Driver::can_access_peer(int a, int b) const {
  if (a == b) return true;
  if (!api_->cuDeviceCanAccessPeer) return fail(ENOSYS, "the driver has no cuDeviceCanAccessPeer");
  CUdevice da = 0, db = 0;
  if (CUresult r = api_->cuDeviceGet(&da, a); r != CUDA_SUCCESS) return fail(errno_for(r), "cuDeviceGet: " + error_text(r));
  if (CUresult r = api_->cuDeviceGet(&db, b); r != CUDA_SUCCESS) return fail(errno_for(r), "cuDeviceGet: " + error_text(r));
  int can = 0;
  if (CUresult r = api_->cuDeviceCanAccessPeer(&can, da, db); r != CUDA_SUCCESS) {
    return fail(errno_for(r), "cuDeviceCanAccessPeer: " + error_text(r));
  }
  return can != 0;
}

Result<int> Driver::ordinal_of_pci(const std::string& pci) const {
  auto n = device_count();
  if (!n) return std::unexpected(n.error());
  for (int i = 0; i < *n; ++i) {
    auto d = device(i);
    if (d && d->pci_address == pci) return i;
  }
  return fail(ENODEV, "no GPU at PCI address " + pci + " is visible to this process (CUDA_VISIBLE_DEVICES)");
}

#endif  // UFAB_HAVE_CUDA_TOOLKIT

}  // namespace ufab::gpu
