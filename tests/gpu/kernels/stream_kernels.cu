// The kernels of tests/gpu/stream_gpu.cc, compiled to PTX by
// tests/gpu/kernels/gen.sh into stream_kernels_ptx.h (checked in, so the
// build needs no nvcc): a producer and a verifier of a byte pattern.
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
