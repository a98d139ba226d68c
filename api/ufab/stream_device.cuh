/* Device-initiated operations: what a CUDA kernel calls to start ufab work
 * and to wait for it (API 1.6; docs/gpu.md, "Device-initiated
 * operations"). Host side: ufab_stream_post_send_device gives a ticket's
 * doorbell (a GPU address and a value), ufab_stream_wait_word a ticket's
 * completion word. Both words are pinned host memory the engine's proxy
 * thread reads and writes; include this header in .cu files (nvcc, sm_70
 * or later: the loads and stores below are Volta's system-scope ones).
 *
 *   __global__ void produce(uint8_t* buf, unsigned n, uint64_t db, uint32_t v,
 *                           unsigned* arrived) {
 *     ... write buf ...
 *     ufab_stream_device_ring_when_done(arrived, db, v);  // every block calls it
 *   }
 *   __global__ void consume(const uint8_t* buf, unsigned n, uint64_t word, uint32_t v,
 *                           unsigned* seen) {
 *     ufab_stream_device_wait_grid(word, v, seen);        // every block calls it
 *     ... read buf ...
 *   }
 *
 * The deadlock rules of streams hold for kernels too: a kernel that waits
 * for a ticket whose doorbell a later kernel of its stream rings never
 * ends. A waiting kernel holds its blocks on their SMs while it waits. */
#ifndef UFAB_STREAM_DEVICE_CUH
#define UFAB_STREAM_DEVICE_CUH

#include <stdint.h>

/* Ring a doorbell: every write this thread made before is visible to the
 * host (and to the peer the work goes to) before the proxy sees the
 * value. Call it from one thread once the data is written, e.g. after
 * __syncthreads() in a kernel of one block. */
__device__ inline void ufab_stream_device_ring(uint64_t doorbell, uint32_t value) {
  __threadfence_system();
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(doorbell), "r"(value) : "memory");
}

/* Ring a doorbell once every block of the grid has written its part: each
 * block calls this after its writes; the last block to arrive rings it.
 * `arrived` is a zeroed counter in device memory, one per kernel in
 * flight; it is zero again when the doorbell has rung. */
__device__ inline void ufab_stream_device_ring_when_done(unsigned* arrived, uint64_t doorbell, uint32_t value) {
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    __threadfence_system();
    const unsigned blocks = gridDim.x * gridDim.y * gridDim.z;
    if (atomicAdd(arrived, 1u) == blocks - 1) {
      *(volatile unsigned*)arrived = 0;
      ufab_stream_device_ring(doorbell, value);
    }
  }
}

/* Wait until a ticket is complete: its completion word reaches `value`
 * (compared as a signed difference, so sequence numbers may wrap). Every
 * thread of the block returns after the block's first thread saw it, and
 * sees what the completed work wrote. For a kernel of one block; with
 * several, ufab_stream_device_wait_grid below. */
__device__ inline void ufab_stream_device_wait(uint64_t word, uint32_t value) {
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    uint32_t seen;
    do {
      asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(seen) : "l"(word) : "memory");
    } while ((int32_t)(seen - value) < 0);
  }
  __syncthreads();
}

/* The same for a kernel of several blocks: block 0 alone reads the
 * completion word (pinned host memory, across PCIe) and passes what it saw
 * to the other blocks through `seen`, a word of device memory they poll
 * in the GPU's own memory. Many blocks reading one host word at once make
 * each of them see it change tens of microseconds late (measured on an
 * H200, docs/gpu.md). `seen` starts at 0 and is only ever raised: give
 * each engine's waits their own (one per engine and stream). */
__device__ inline void ufab_stream_device_wait_grid(uint64_t word, uint32_t value, unsigned* seen) {
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    uint32_t v;
    if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) {
      do {
        asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(word) : "memory");
      } while ((int32_t)(v - value) < 0);
      asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(seen), "r"(v) : "memory");
    } else {
      do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(seen) : "memory");
      } while ((int32_t)(v - value) < 0);
    }
  }
  __syncthreads();
}

#endif /* UFAB_STREAM_DEVICE_CUH */
