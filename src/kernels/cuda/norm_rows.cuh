// Private: the pieces the norm kernels of norm.cu and fused_norm.cu share. One expression writes a normalized row, so
// the plain forward, the residual-fused forward and the rebuild from saved statistics (norm_apply, which a block's
// backward relies on to reproduce the forward's output bit for bit) give the same bits by construction.
#pragma once
#include "kernels/cuda/common.cuh"

namespace dscpp::cuda {
namespace {

// o[c] = (x[c] - m) * rs * w[c] (+ b[c], LayerNorm with a bias) over one row of C, the lanes of a warp striding V
// elements. RMSNorm passes m = 0.
template <typename T, typename W, int V, bool LN>
__device__ __forceinline__ void write_normalized_row(T* o, const T* x, const W* w, const W* b, float m, float rs, int C,
                                                     int lane) {
  for (int c = lane * V; c < C; c += 32 * V) {
    float v[V], wv[V], bv[V];
    load_f<T, V>(x + c, v);
    load_f<W, V>(w + c, wv);
    if (LN && b) load_f<W, V>(b + c, bv);
#pragma unroll
    for (int k = 0; k < V; k++) v[k] = (v[k] - m) * rs * wv[k] + ((LN && b) ? bv[k] : 0.0f);
    store_f<T, V>(o + c, v);
  }
}

// The norms' parameter gradients, second pass: dw[c] += sum_g part_w[g, c] in order of g (deterministic); db alike.
// Either output may be null.
template <typename W>
__global__ void norm_param_final_kernel(W* dw, W* db, const float* part_w, const float* part_b, int G, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  if (dw) {
    float s = 0.0f;
    for (int g = 0; g < G; g++) s += part_w[int64_t(g) * C + c];
    dw[c] = from_f<W>(to_f(dw[c]) + s);
  }
  if (db) {
    float s = 0.0f;
    for (int g = 0; g < G; g++) s += part_b[int64_t(g) * C + c];
    db[c] = from_f<W>(to_f(db[c]) + s);
  }
}

}  // namespace
}  // namespace dscpp::cuda
