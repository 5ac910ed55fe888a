// Does a small cudaMemsetAsync on one stream wait for a large peer-to-peer copy (copy engines) on another stream of
// the same GPU? Stage 3's traces (docs/PERF.md, tenth session) show the compute stream stalling right after the
// 4-byte memsets cuBLASLt and cuDNN issue before their kernels, until the copy-engine all-to-all beside it ends.
//   build-gpu/bench/ce_memset_probe        (2 GPUs with peer access)
// For each way of sending 128 MiB from GPU 1 to GPU 0 beside it (none; one copy; 8 or 32 pieces), the time from
// the start of stream B's work to the end of a 4-byte memset and to the end of a small kernel after it, and the
// same kernel without the memset. Medians of 20 trials, microseconds. On 2 H200s (docs/PERF.md): the memset ends
// 7-12 us later beside a 347 us copy than alone, so it does not wait for the copy; the stalls have another cause.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s: %s at %s:%d\n", #x, cudaGetErrorString(e_), __FILE__, __LINE__); \
      return 1;                                                                               \
    }                                                                                         \
  } while (0)

__global__ void touch(float* p, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = p[i] * 0.5f + 1.0f;
}

int main() {
  int n = 0;
  CK(cudaGetDeviceCount(&n));
  if (n < 2) {
    std::printf("ce_memset_probe: needs 2 GPUs, found %d\n", n);
    return 0;
  }
  int can = 0;
  CK(cudaDeviceCanAccessPeer(&can, 0, 1));
  if (!can) {
    std::printf("ce_memset_probe: GPU 0 cannot access GPU 1\n");
    return 0;
  }
  const size_t bytes = size_t(128) << 20;
  void *src = nullptr, *dst = nullptr;
  CK(cudaSetDevice(1));
  CK(cudaMalloc(&src, bytes));
  CK(cudaSetDevice(0));
  CK(cudaDeviceEnablePeerAccess(1, 0));
  CK(cudaMalloc(&dst, bytes));
  float* small = nullptr;
  int* flag = nullptr;
  CK(cudaMalloc(&small, 1 << 20));
  CK(cudaMalloc(&flag, 4));
  cudaStream_t a, b;
  CK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  cudaEvent_t e0, e1, e2, c0, c1;
  for (cudaEvent_t* e : {&e0, &e1, &e2, &c0, &c1}) CK(cudaEventCreate(e));
  auto median = [](std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf("| copy beside | memset end us | kernel end us | kernel alone us | copy us |\n|---|---:|---:|---:|---:|\n");
  for (int pieces : {0, 1, 8, 32}) {
    std::vector<float> t_memset, t_kernel, t_alone, t_copy;
    for (int trial = 0; trial < 21; trial++) {
      for (int with_memset : {1, 0}) {
        CK(cudaDeviceSynchronize());
        CK(cudaEventRecord(c0, a));
        for (int p = 0; p < pieces; p++) {
          const size_t chunk = bytes / size_t(pieces);
          CK(cudaMemcpyPeerAsync(static_cast<char*>(dst) + p * chunk, 0, static_cast<char*>(src) + p * chunk, 1,
                                 chunk, a));
        }
        CK(cudaEventRecord(c1, a));
        // Let the copy start first, as backward's memset comes after the all-to-all was queued.
        touch<<<1, 32, 0, b>>>(small, 32);
        CK(cudaEventRecord(e0, b));
        if (with_memset) CK(cudaMemsetAsync(flag, 0, 4, b));
        CK(cudaEventRecord(e1, b));
        touch<<<256, 256, 0, b>>>(small, 1 << 16);
        CK(cudaEventRecord(e2, b));
        CK(cudaDeviceSynchronize());
        float m = 0, k = 0, c = 0;
        CK(cudaEventElapsedTime(&m, e0, e1));
        CK(cudaEventElapsedTime(&k, e0, e2));
        CK(cudaEventElapsedTime(&c, c0, c1));
        if (trial == 0) continue;  // warm-up
        if (with_memset) {
          t_memset.push_back(m * 1e3f);
          t_kernel.push_back(k * 1e3f);
          t_copy.push_back(c * 1e3f);
        } else {
          t_alone.push_back(k * 1e3f);
        }
      }
    }
    std::printf("| %s | %.1f | %.1f | %.1f | %.1f |\n",
                pieces == 0 ? "none" : (pieces == 1 ? "one 128 MiB copy" : (pieces == 8 ? "8 pieces" : "32 pieces")),
                median(t_memset), median(t_kernel), median(t_alone), pieces ? median(t_copy) : 0.0f);
  }
  return 0;
}
