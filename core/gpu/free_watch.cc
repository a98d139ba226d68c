// CUPTI's callback API, loaded at run time. The few declarations used are
// written here (ABI facts of cupti_callbacks.h and cupti_driver_cbid.h,
// CUDA 12 and 13), so the build needs no CUPTI headers.
#include "core/gpu/free_watch.h"

#include <dlfcn.h>

#include <mutex>
#include <string>

namespace ufab::gpu {
namespace {

using CuptiResult = int;  // CUptiResult: 0 is success
using Subscriber = void*;
using Callback = void (*)(void* userdata, int domain, uint32_t cbid, const void* data);
constexpr int kDriverApiDomain = 1;  // CUPTI_CB_DOMAIN_DRIVER_API

// CUPTI_DRIVER_TRACE_CBID_* of every call that may free device memory or
// put other memory at a freed address.
constexpr uint32_t kWatched[] = {
    11,   // cuCtxDestroy
    29,   // cuMemAlloc
    31,   // cuMemAllocPitch
    33,   // cuMemFree
    37,   // cuMemAllocHost
    38,   // cuMemFreeHost
    39,   // cuMemHostAlloc
    243,  // cuMemAlloc_v2
    244,  // cuMemAllocPitch_v2
    245,  // cuMemFree_v2
    294,  // cuMemAllocHost_v2
    301,  // cuMemHostRegister
    302,  // cuMemHostUnregister
    322,  // cuCtxDestroy_v2
    329,  // cuIpcOpenMemHandle
    330,  // cuIpcCloseMemHandle
    371,  // cuMemAllocManaged
    379,  // cuMemHostRegister_v2
    514,  // cuGraphLaunch (graph memory nodes allocate and free)
    515,  // cuGraphLaunch_ptsz
    516,  // cuGraphExecDestroy
    544,  // cuDevicePrimaryCtxRelease_v2
    545,  // cuDevicePrimaryCtxReset_v2
    548,  // cuMemAddressFree
    550,  // cuMemRelease
    551,  // cuMemMap
    552,  // cuMemUnmap
    567,  // cuIpcOpenMemHandle_v2
    580,  // cuGraphUpload
    598,  // cuMemAllocAsync
    599,  // cuMemAllocAsync_ptsz
    600,  // cuMemFreeAsync
    601,  // cuMemFreeAsync_ptsz
    602,  // cuMemPoolTrimTo
    608,  // cuMemPoolDestroy
    611,  // cuMemAllocFromPoolAsync
    612,  // cuMemAllocFromPoolAsync_ptsz
    640,  // cuDeviceGraphMemTrim
};

std::atomic<uint64_t> g_events{0};

// Both at entry and at return: a check made while a call runs sees a
// count the return then moves.
void on_call(void*, int, uint32_t, const void*) { g_events.fetch_add(1, std::memory_order_acq_rel); }

struct Watch {
  Result<const std::atomic<uint64_t>*> result = fail(EAGAIN, "not started");
};

Result<const std::atomic<uint64_t>*> start() {
  void* lib = nullptr;
  std::string tried;
  for (const char* name : {"libcupti.so.13", "libcupti.so.12", "libcupti.so"}) {
    lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib != nullptr) break;
    const char* e = dlerror();
    tried += std::string(tried.empty() ? "" : "; ") + (e ? e : name);
  }
  if (lib == nullptr) {
    return fail(ENOENT, "watching GPU frees needs CUPTI (libcupti.so from the CUDA toolkit, on the library path): " +
                            tried);
  }
  auto subscribe = reinterpret_cast<CuptiResult (*)(Subscriber*, Callback, void*)>(dlsym(lib, "cuptiSubscribe"));
  auto enable = reinterpret_cast<CuptiResult (*)(uint32_t, Subscriber, int, uint32_t)>(dlsym(lib, "cuptiEnableCallback"));
  auto text = reinterpret_cast<CuptiResult (*)(CuptiResult, const char**)>(dlsym(lib, "cuptiGetResultString"));
  if (subscribe == nullptr || enable == nullptr) return fail(ENOSYS, "libcupti has no cuptiSubscribe/cuptiEnableCallback");
  auto words = [&](CuptiResult r) {
    const char* s = nullptr;
    if (text != nullptr) text(r, &s);
    return std::string(s ? s : "CUPTI error ") + " (" + std::to_string(r) + ")";
  };
  Subscriber sub = nullptr;
  if (CuptiResult r = subscribe(&sub, on_call, nullptr); r != 0) {
    return fail(EBUSY, "cuptiSubscribe: " + words(r) +
                           (r == 39 ? ": another CUPTI client (a profiler?) holds the one subscriber of this process" : ""));
  }
  for (uint32_t cbid : kWatched) {
    // All or nothing: a call left out could free memory unseen.
    if (CuptiResult r = enable(1, sub, kDriverApiDomain, cbid); r != 0) {
      if (auto unsubscribe = reinterpret_cast<CuptiResult (*)(Subscriber)>(dlsym(lib, "cuptiUnsubscribe"))) {
        unsubscribe(sub);
      }
      return fail(ENOTSUP, "cuptiEnableCallback for driver call id " + std::to_string(cbid) + ": " + words(r) +
                               " (a CUPTI older than CUDA 12?)");
    }
  }
  // Kept for the process: the library, the subscriber, the counter.
  return &g_events;
}

}  // namespace

Result<const std::atomic<uint64_t>*> watch_frees() {
  static std::once_flag once;
  static Watch* w = new Watch;
  std::call_once(once, [] { w->result = start(); });
  return w->result;
}

}  // namespace ufab::gpu
