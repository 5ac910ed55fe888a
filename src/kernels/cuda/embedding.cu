// Token embedding on CUDA: forward gather and a deterministic backward scatter-add.
//
// Note [Deterministic embedding backward]: dtable[ids[n], :] += dout[n, :] has collisions (repeated tokens). Instead
// of float atomics (whose summation order changes run to run), the token indices 0..N-1 are sorted by id with a
// stable radix sort (CUB), so equal ids form runs with their tokens in increasing n. A block (per run start, per
// slice of channels) sums its run's rows in that order in f32 and adds the sum to dtable once. Same inputs, same
// bits, every run. A very frequent id makes one long serial run; the channel slices keep it spread over C/(128 V)
// blocks, which is enough for language-model batches.
//
// Dtypes: table/out T (f32, bf16, f16); dout T with dtable f32 (f32 gradient accumulation) or T. ids i32.
#include <cmath>

#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/parallel_ops_cuda.h"

namespace dscpp::cuda {
namespace {

constexpr int kBlock = 128;

// out[n, c..c+V) = table[ids[n] - first, c..c+V). Rows whose id falls outside the table are `outside`: NaN for
// embedding_forward, so that the error is visible (the CPU path range-checks ids; reading them here would cost a
// device sync), 0 for a vocabulary shard (embedding_shard_forward).
template <typename T, int V>
__global__ void embedding_fwd_kernel(T* out, const int32_t* ids, const T* table, int64_t N, int64_t C,
                                     int64_t vocab, int64_t first, float outside) {
  const int64_t total = N * C, stride = int64_t(gridDim.x) * blockDim.x * V;
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * V; i < total; i += stride) {
    const int64_t n = i / C, c = i - n * C;
    const int64_t id = int64_t(ids[n]) - first;
    float v[V];
    if (id >= 0 && id < vocab) {
      load_f<T, V>(table + id * C + c, v);
    } else {
#pragma unroll
      for (int k = 0; k < V; k++) v[k] = outside;
    }
    store_f<T, V>(out + i, v);
  }
}

__global__ void iota_kernel(int32_t* x, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = int32_t(i);
}

// Note [Deterministic embedding backward]. Grid (N, channel slices); block kBlock threads of V channels each.
// Block (i, y) does work only when sorted position i starts a run of equal ids.
template <typename T, typename G, int V>
__global__ void embedding_bwd_kernel(G* dtable, const T* dout, const int32_t* sorted_ids, const int32_t* order,
                                     int64_t N, int64_t C, int64_t vocab, int64_t first) {
  const int64_t i = blockIdx.x;
  const int32_t key = sorted_ids[i];
  if (i > 0 && sorted_ids[i - 1] == key) return;  // not a run start
  const int64_t id = int64_t(key) - first;
  if (id < 0 || id >= vocab) return;               // ids outside the table (or the shard) contribute nothing
  const int64_t c = (int64_t(blockIdx.y) * blockDim.x + threadIdx.x) * V;
  if (c >= C) return;
  float acc[V];
#pragma unroll
  for (int k = 0; k < V; k++) acc[k] = 0.0f;
  for (int64_t j = i; j < N && sorted_ids[j] == key; j++) {
    float d[V];
    load_f<T, V>(dout + int64_t(order[j]) * C + c, d);
#pragma unroll
    for (int k = 0; k < V; k++) acc[k] += d[k];
  }
  G* row = dtable + id * C + c;
  float cur[V];
  load_f<G, V>(row, cur);
#pragma unroll
  for (int k = 0; k < V; k++) cur[k] += acc[k];
  store_f<G, V>(row, cur);
}

}  // namespace

// ---- raw launchers ----
// out[N,C] = table[ids[N], :]; table[vocab, C]
// With `first` / `outside`: out[N,C] = table[ids - first] where in [0, vocab), else `outside`.
template <typename T>
void launch_embedding_forward(T* out, const int32_t* ids, const T* table, int64_t N, int64_t C, int64_t vocab,
                              cudaStream_t s, int64_t first = 0, float outside = NAN) {
  constexpr int V = 16 / sizeof(T);
  if (C % V == 0 && all_aligned16(out, table))
    embedding_fwd_kernel<T, V><<<grid_for(N * C / V, kBlock), kBlock, 0, s>>>(out, ids, table, N, C, vocab, first,
                                                                             outside);
  else
    embedding_fwd_kernel<T, 1><<<grid_for(N * C, kBlock), kBlock, 0, s>>>(out, ids, table, N, C, vocab, first,
                                                                         outside);
  DSCPP_CUDA_CHECK_LAUNCH();
}

// dtable[vocab, C] += scatter of dout[N, C] by ids[N] (Note [Deterministic embedding backward]).
template <typename T, typename G>
void launch_embedding_backward(G* dtable, const T* dout, const int32_t* ids, int64_t N, int64_t C, int64_t vocab,
                               cudaStream_t s, int64_t first = 0) {
  DSCPP_CHECK(N <= INT32_MAX, "embedding_backward: N = ", N, " tokens exceeds the sort's 32-bit index");
  const int n = int(N);
  size_t sort_bytes = 0;
  DSCPP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, static_cast<const int32_t*>(nullptr),
                                                   static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                                   static_cast<int32_t*>(nullptr), n, 0, 32, s));
  // One scratch block: sorted ids | iota | order | CUB temp storage (each piece 256-byte aligned).
  auto up = [](size_t b) { return (b + 255) & ~size_t(255); };
  const size_t idx_bytes = up(size_t(n) * sizeof(int32_t));
  char* scratch = nullptr;
  DSCPP_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&scratch), 3 * idx_bytes + up(sort_bytes), s));
  int32_t* sorted_ids = reinterpret_cast<int32_t*>(scratch);
  int32_t* iota = reinterpret_cast<int32_t*>(scratch + idx_bytes);
  int32_t* order = reinterpret_cast<int32_t*>(scratch + 2 * idx_bytes);
  void* temp = scratch + 3 * idx_bytes;
  iota_kernel<<<unsigned(ceil_div(N, 256)), 256, 0, s>>>(iota, N);
  DSCPP_CUDA_CHECK_LAUNCH();
  // All 32 key bits: out-of-range ids (not range-checked on this path) then form runs of their own and are skipped.
  DSCPP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, sort_bytes, ids, sorted_ids, iota, order, n, 0, 32, s));
  constexpr int V = 16 / (sizeof(T) < sizeof(G) ? sizeof(T) : sizeof(G));
  if (C % V == 0 && all_aligned16(dtable, dout)) {
    const dim3 grid(unsigned(N), unsigned(ceil_div(C, int64_t(kBlock) * V)));
    embedding_bwd_kernel<T, G, V><<<grid, kBlock, 0, s>>>(dtable, dout, sorted_ids, order, N, C, vocab, first);
  } else {
    const dim3 grid(unsigned(N), unsigned(ceil_div(C, kBlock)));
    embedding_bwd_kernel<T, G, 1><<<grid, kBlock, 0, s>>>(dtable, dout, sorted_ids, order, N, C, vocab, first);
  }
  DSCPP_CUDA_CHECK_LAUNCH();
  DSCPP_CUDA_CHECK(cudaFreeAsync(scratch, s));
}

// ---- checked entries (ops.cpp has validated shapes and dtypes) ----
void embedding_forward(const Tensor& out, const Tensor& ids, const Tensor& table) {
  const int64_t vocab = table.size(0), C = table.size(1), N = ids.numel();
  if (N == 0 || C == 0) return;
  OpLaunch L(out);
  dispatch_float("embedding_forward", table.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    launch_embedding_forward<T>(ptr<T>(out), ptr<int32_t>(ids), ptr<T>(table), N, C, vocab, L.stream);
  });
}

void embedding_shard_forward(const Tensor& out, const Tensor& ids, const Tensor& table, int64_t first) {
  const int64_t vocab = table.size(0), C = table.size(1), N = ids.numel();
  if (N == 0 || C == 0) return;
  OpLaunch L(out);
  dispatch_float("embedding_shard_forward", table.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    launch_embedding_forward<T>(ptr<T>(out), ptr<int32_t>(ids), ptr<T>(table), N, C, vocab, L.stream, first, 0.0f);
  });
}

void embedding_shard_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids, int64_t first) {
  const int64_t vocab = dtable.size(0), C = dtable.size(1), N = ids.numel();
  if (N == 0 || C == 0) return;
  OpLaunch L(dtable);
  dispatch_act_param("embedding_backward", dout.dtype(), dtable.dtype(), [&](auto* tt, auto* gt) {
    using T = std::remove_pointer_t<decltype(tt)>;
    using G = std::remove_pointer_t<decltype(gt)>;
    launch_embedding_backward<T, G>(ptr<G>(dtable), ptr<T>(dout), ptr<int32_t>(ids), N, C, vocab, L.stream, first);
  });
}

void embedding_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids) {
  embedding_shard_backward(dtable, dout, ids, 0);
}

}  // namespace dscpp::cuda
