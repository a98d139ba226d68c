// Kernels for the stream-ordered operations tests and benchmark
// (tests/gpu/stream_ops_test.cc, tests/bench/stream_pingpong_bench.cc).
// Compiled to PTX here (gen_ptx.sh writes stream_kernels_ptx.h) and loaded
// with cuModuleLoadData on the GPU machine, which has a driver and no
// toolkit.
#include <stdint.h>

// p[i] = (i * 7 + seed) & 0xff: the data a producer makes.
extern "C" __global__ void ufab_fill(uint8_t* p, unsigned long long n, unsigned int seed) {
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x) {
    p[i] = (uint8_t)(i * 7 + seed);
  }
}

// Counts the bytes that are not what ufab_fill(seed) wrote into *bad.
extern "C" __global__ void ufab_check(const uint8_t* p, unsigned long long n, unsigned int seed, unsigned int* bad) {
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x) {
    if (p[i] != (uint8_t)(i * 7 + seed)) atomicAdd(bad, 1u);
  }
}

// A kernel that runs about `ns` nanoseconds (globaltimer), then stores 1 to *done.
extern "C" __global__ void ufab_spin(unsigned long long ns, unsigned int* done) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
  if (threadIdx.x == 0) *(volatile unsigned int*)done = 1;
}
