// Note [Decode GEMV]
// matmul_forward with a handful of input rows (a decode step of 1-4 sequences) reads a whole weight matrix to
// produce a few outputs: it is bound by the weight bytes, and cuBLASLt's tile kernels reached 1.2-2.8 TB/s on an
// H100 for Llama-1B's projections (o_proj: 1.2), short of the 3.35 TB/s the HBM gives. Here one warp owns one output
// feature: its lanes stream the weight row in 16-byte loads (four in flight per lane), multiply each against the M
// input rows (small, read through L1), keep M f32 sums, reduce across the warp in a fixed order (the same bits on
// every run), and write out = sum + bias + residual in one pass. Taken for bf16 / f16 weights, M <= 4, C a
// multiple of 8 and 16-byte aligned operands; everything else goes to cuBLASLt.
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/gemv_mma.cuh"
#include "kernels/cuda/gemv.h"

namespace dscpp::cuda {
namespace {

// bf16 / f16 weights, 8 columns a load.
template <typename T>
struct DenseRow {
  static constexpr int V = 16 / int(sizeof(T));
  struct Params {
    const T* w;
    int64_t C;
  };
  const T* row;
  __device__ DenseRow(const Params& p, int64_t oc) : row(p.w + oc * p.C) {}
  __device__ uint4 fetch(int c) const { return *reinterpret_cast<const uint4*>(row + c); }
  __device__ const void* address(int c) const { return row + c; }
  __device__ void expand(const uint4& raw, int, float* w) const {
    const T* x = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int k = 0; k < V; k++) w[k] = to_f(x[k]);
  }
};

template <typename T>
bool launch_t(const GemvArgs& g, cudaStream_t s) {
  return gemv::launch_dtypes<DenseRow<T>>(g.out, g.out_t, g.in_t, static_cast<const T*>(g.inp),
                                          {static_cast<const T*>(g.weight), g.C}, g.bias, g.bias_t, g.residual, g.M,
                                          g.OC, g.C, g.norm, g.epi, s);
}

bool tensor_cores = true;

}  // namespace

void set_gemv_tensor_cores(bool on) { tensor_cores = on; }

bool gemv_tensor_cores() { return tensor_cores; }

bool try_gemv(const GemvArgs& g, cudaStream_t s) {
  if (g.M < 1 || g.C > INT32_MAX || g.OC <= 0 || !all_aligned16(g.inp, g.weight)) return false;
  if (tensor_cores && g.in_t == DType::bf16 && g.M >= 2 && g.M <= gemv_mma::kMaxM && g.C % gemv_mma::kMacroCols<16> == 0)
    return gemv_mma::launch<16>(g.out, g.out_t, static_cast<const __nv_bfloat16*>(g.inp),
                                {g.weight, nullptr, nullptr, 0}, g.bias, g.bias_t, g.residual, g.M, g.OC, g.C,
                                g.norm, g.epi, s);
  if (g.M > 4 || g.C % 8 != 0) return false;
  if (g.in_t == DType::bf16) return launch_t<__nv_bfloat16>(g, s);
  if (g.in_t == DType::f16) return launch_t<__half>(g, s);
  return false;
}

}  // namespace dscpp::cuda
