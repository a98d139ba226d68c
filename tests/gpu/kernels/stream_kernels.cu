// The kernels of tests/gpu/stream_gpu.cc, compiled to PTX by
// tests/gpu/kernels/gen.sh into stream_kernels_ptx.h (checked in, so the
// build needs no nvcc): a producer and a verifier of a byte pattern, and
// the same two started and ended by the kernels themselves
// (<ufab/stream_device.cuh>: the producer rings the doorbell of the
// WRITE that sends its bytes, the verifier waits for the receive).
#include "ufab/stream_device.cuh"

extern "C" __global__ void ufab_fill(unsigned char* p, unsigned int n, unsigned int seed) {
  for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    p[i] = (unsigned char)(i * 13u + seed);
  }
}

extern "C" __global__ void ufab_verify(const unsigned char* p, unsigned int n, unsigned int seed, unsigned int* bad) {
  for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    if (p[i] != (unsigned char)(i * 13u + seed)) atomicAdd(bad, 1u);
  }
}

extern "C" __global__ void ufab_fill_ring(unsigned char* p, unsigned int n, unsigned int seed, unsigned int* arrived,
                                          unsigned long long doorbell, unsigned int value) {
  for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    p[i] = (unsigned char)(i * 13u + seed);
  }
  ufab_stream_device_ring_when_done(arrived, doorbell, value);
}

extern "C" __global__ void ufab_verify_after(const unsigned char* p, unsigned int n, unsigned int seed,
                                             unsigned int* bad, unsigned long long word, unsigned int value,
                                             unsigned int* seen) {
  ufab_stream_device_wait_grid(word, value, seen);
  for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    if (p[i] != (unsigned char)(i * 13u + seed)) atomicAdd(bad, 1u);
  }
}
