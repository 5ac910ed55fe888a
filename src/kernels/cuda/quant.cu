// CUDA twins of the weight-only quantization ops (quant_ops.h, Note [Quantized weight layout]): the same f32
// operations in the same order as src/kernels/cpu/quant.cpp, so q, scale and zero match the CPU bit for bit.
//
// Note [Quantized GEMV]
// matmul_q_forward at decode with bf16 inputs (N <= 8) runs the tensor-core GEMV (Note [Decode GEMV on tensor
// cores], gemv_mma.cuh): int8 when C is a multiple of 64, int4 when the group is a multiple of 128. Other decode
// shapes and dtypes (N <= 4) run the CUDA-core GEMV of Note [Decode GEMV] (gemv.cuh) with a loader that reads the
// packed weights: each lane fetches 16 bytes at a time (16 int8 weights or 32 int4 ones, four fetches in flight),
// dequantizes them in registers, (q - zero) * scale in f32 exactly as dequantize_weight does, and multiplies them
// against the few input rows; every weight byte is read once. Taken for C a multiple of 16 (int8) or 32 (int4, with
// the group a multiple of 32 so that one fetch lies in one group) and 16-byte aligned inp and q. Otherwise, and for
// larger N (prefill), this first version dequantizes the whole weight into a scratch tensor of inp's dtype and runs
// matmul_forward: correct, but it writes and reads the weight in 16 bits again, so prefill gains nothing from
// quantization yet (a mixed-input tensor-core GEMM would). fp8 weights take their own two paths (Note [fp8 decode
// GEMV], Note [fp8 GEMM]).
#include <cmath>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/gemv_fp8.cuh"
#include "kernels/cuda/gemv_mma.cuh"

namespace dscpp::cuda {
namespace {

constexpr int kThreads = 256;

// ---- quantize ----
// One CTA per row: scale[o] = absmax / 127, q = clamp(rint(w / scale), -127, 127).
template <typename T>
__global__ void quantize_int8_kernel(int8_t* q, float* scale, const T* w, int64_t C) {
  __shared__ float scratch[32];
  const int64_t o = blockIdx.x;
  const T* row = w + o * C;
  float amax = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) amax = fmaxf(amax, fabsf(to_f(row[c])));
  const float s = block_max(amax, scratch) / 127.0f;
  if (threadIdx.x == 0) scale[o] = s;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
    q[o * C + c] = s == 0.0f ? int8_t(0) : int8_t(fminf(fmaxf(rintf(to_f(row[c]) / s), -127.0f), 127.0f));
}

// One thread per group of G columns: the range [min(w, 0), max(w, 0)] in 15 steps.
template <typename T>
__global__ void quantize_int4_kernel(uint8_t* q, float* scale, uint8_t* zero, const T* w, int64_t OC, int64_t C,
                                     int64_t G) {
  const int64_t groups = C / G;
  for (int64_t og = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; og < OC * groups;
       og += int64_t(gridDim.x) * blockDim.x) {
    const int64_t o = og / groups, c0 = og % groups * G;
    const T* x = w + o * C + c0;
    float lo = 0.0f, hi = 0.0f;
    for (int64_t c = 0; c < G; c++) lo = fminf(lo, to_f(x[c])), hi = fmaxf(hi, to_f(x[c]));
    const float s = (hi - lo) / 15.0f;
    const float z = s == 0.0f ? 0.0f : fminf(fmaxf(rintf(-lo / s), 0.0f), 15.0f);
    scale[og] = s;
    zero[og] = uint8_t(z);
    uint8_t* out = q + (o * C + c0) / 2;
    for (int64_t c = 0; c < G; c += 2) {
      unsigned nib[2];
#pragma unroll
      for (int k = 0; k < 2; k++)
        nib[k] = s == 0.0f ? 0u : unsigned(fminf(fmaxf(rintf(to_f(x[c + k]) / s) + z, 0.0f), 15.0f));
      out[c / 2] = uint8_t(nib[0] | nib[1] << 4);
    }
  }
}

// One CTA per row: scale[o] = absmax / 448, q = e4m3(w * (448 / absmax)) (quantize_rows_fp8: weights, and the
// activations of Note [fp8 matmul]); V consecutive elements a thread (8 where C and the pointers allow 16-byte
// vectors of T, else 1).
template <typename T, int V>
__global__ void quantize_fp8_kernel(uint8_t* q, float* scale, const T* w, int64_t C) {
  __shared__ float scratch[32];
  const int64_t o = blockIdx.x;
  const T* row = w + o * C;
  float amax = 0.0f;
  for (int64_t c = int64_t(threadIdx.x) * V; c < C; c += int64_t(blockDim.x) * V) {
    float v[V];
    load_f<T, V>(row + c, v);
#pragma unroll
    for (int k = 0; k < V; k++) amax = fmaxf(amax, fabsf(v[k]));
  }
  amax = block_max(amax, scratch);
  if (threadIdx.x == 0) scale[o] = amax / 448.0f;
  const float inv = amax == 0.0f ? 0.0f : 448.0f / amax;
  for (int64_t c = int64_t(threadIdx.x) * V; c < C; c += int64_t(blockDim.x) * V) {
    float v[V];
    load_f<T, V>(row + c, v);
    uint8_t b[V];
#pragma unroll
    for (int k = 0; k < V; k++) b[k] = __nv_cvt_float_to_fp8(v[k] * inv, __NV_SATFINITE, __NV_E4M3);
    if constexpr (V == 8) *reinterpret_cast<uint2*>(q + o * C + c) = *reinterpret_cast<const uint2*>(b);
    else q[o * C + c] = b[0];
  }
}

// ---- dequantize: one thread per weight (grid-stride) ----
template <typename T>
__global__ void dequantize_fp8_kernel(T* w, const uint8_t* q, const float* scale, int64_t OC, int64_t C) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < OC * C; i += int64_t(gridDim.x) * blockDim.x)
    w[i] = from_f<T>(__half2float(__half(__nv_cvt_fp8_to_halfraw(q[i], __NV_E4M3))) * scale[i / C]);
}

template <typename T>
__global__ void dequantize_int8_kernel(T* w, const int8_t* q, const float* scale, int64_t OC, int64_t C) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < OC * C; i += int64_t(gridDim.x) * blockDim.x)
    w[i] = from_f<T>(float(q[i]) * scale[i / C]);
}

template <typename T>
__global__ void dequantize_int4_kernel(T* w, const uint8_t* q, const float* scale, const uint8_t* zero, int64_t OC,
                                       int64_t C, int64_t G) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < OC * C; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t g = i / C * (C / G) + i % C / G;
    const int nib = q[i / 2] >> (i % 2 * 4) & 15;
    w[i] = from_f<T>(float(nib - int(zero[g])) * scale[g]);
  }
}

// ---- the GEMV's weight loaders (gemv.cuh) ----
struct Int8Row {
  static constexpr int V = 16;
  struct Params {
    const int8_t* q;
    const float* scale;
    int64_t C;
  };
  const int8_t* row;
  float s;
  __device__ Int8Row(const Params& p, int64_t oc) : row(p.q + oc * p.C), s(p.scale[oc]) {}
  __device__ uint4 fetch(int c) const { return *reinterpret_cast<const uint4*>(row + c); }
  __device__ const void* address(int c) const { return row + c; }
  __device__ void expand(const uint4& raw, int, float* w) const {
    const int8_t* b = reinterpret_cast<const int8_t*>(&raw);
#pragma unroll
    for (int k = 0; k < V; k++) w[k] = float(b[k]) * s;
  }
};

struct Int4Row {
  static constexpr int V = 32;
  struct Params {
    const uint8_t* q;
    const float* scale;
    const uint8_t* zero;
    int64_t C;
    int G;
  };
  const uint8_t* row;
  const float* scale;
  const uint8_t* zero;
  int G;
  __device__ Int4Row(const Params& p, int64_t oc)
      : row(p.q + oc * p.C / 2), scale(p.scale + oc * (p.C / p.G)), zero(p.zero + oc * (p.C / p.G)), G(p.G) {}
  __device__ uint4 fetch(int c) const { return *reinterpret_cast<const uint4*>(row + c / 2); }
  __device__ const void* address(int c) const { return row + c / 2; }
  __device__ void expand(const uint4& raw, int c, float* w) const {
    const uint8_t* b = reinterpret_cast<const uint8_t*>(&raw);
    const float s = scale[c / G];
    const int z = zero[c / G];
#pragma unroll
    for (int k = 0; k < V / 2; k++) {
      w[2 * k] = float(int(b[k] & 15) - z) * s;
      w[2 * k + 1] = float(int(b[k] >> 4) - z) * s;
    }
  }
};

template <typename L>
bool try_quant_gemv(const Tensor& out, const Tensor& inp, const typename L::Params& w, const Tensor& bias,
                    const Tensor& residual, int64_t N, int64_t OC, int64_t C, const GemvNorm& norm, const GemvEpilogue& epi,
                    cudaStream_t s) {
  bool done = false;
  dispatch_float("matmul_q_forward", inp.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    done = gemv::launch_dtypes<L, T>(out.raw(), out.dtype(), inp.dtype(), ptr<const T>(inp), w,
                                     bias.defined() ? bias.raw() : nullptr, bias.defined() ? bias.dtype() : DType::f32,
                                     residual.defined() ? residual.raw() : nullptr, N, OC, C, norm, epi, s);
  });
  return done;
}

const uint8_t* bytes(const Tensor& t) { return static_cast<const uint8_t*>(t.raw()); }

}  // namespace

void quantize_weight_int8(const Tensor& q, const Tensor& scale, const Tensor& w) {
  const int64_t OC = w.size(0), C = w.size(1);
  OpLaunch l(w);
  dispatch_float("quantize_weight_int8", w.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    quantize_int8_kernel<T><<<unsigned(OC), kThreads, 0, l.stream>>>(ptr<int8_t>(q), ptr<float>(scale),
                                                                     ptr<const T>(w), C);
  });
  DSCPP_CUDA_CHECK_LAUNCH();
}

void quantize_weight_int4(const Tensor& q, const Tensor& scale, const Tensor& zero, const Tensor& w, int64_t group) {
  const int64_t OC = w.size(0), C = w.size(1);
  OpLaunch l(w);
  dispatch_float("quantize_weight_int4", w.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    quantize_int4_kernel<T><<<grid_for(OC * (C / group), kThreads), kThreads, 0, l.stream>>>(
        ptr<uint8_t>(q), ptr<float>(scale), ptr<uint8_t>(zero), ptr<const T>(w), OC, C, group);
  });
  DSCPP_CUDA_CHECK_LAUNCH();
}

namespace {
// q[rows, C] (=) e4m3 codes, scale[rows] (=) of x[rows, C] on l's stream.
void quantize_rows_fp8(const Tensor& q, const Tensor& scale, const Tensor& x, int64_t rows, int64_t C,
                       cudaStream_t stream) {
  const bool vec = C % 8 == 0 && all_aligned16(x.raw()) && reinterpret_cast<uintptr_t>(q.raw()) % 8 == 0;
  dispatch_float("quantize_rows_fp8", x.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    auto go = [&](auto kernel) {
      kernel<<<unsigned(rows), kThreads, 0, stream>>>(ptr<uint8_t>(q), ptr<float>(scale), ptr<const T>(x), C);
    };
    vec ? go(quantize_fp8_kernel<T, 8>) : go(quantize_fp8_kernel<T, 1>);
  });
  DSCPP_CUDA_CHECK_LAUNCH();
}
}  // namespace

void quantize_weight_fp8(const Tensor& q, const Tensor& scale, const Tensor& w) {
  OpLaunch l(w);
  quantize_rows_fp8(q, scale, w, w.size(0), w.size(1), l.stream);
}

void dequantize_weight(const Tensor& w, const Tensor& q, const Tensor& scale, const Tensor& zero, int64_t group) {
  const int64_t OC = w.size(0), C = w.size(1);
  OpLaunch l(w);
  dispatch_float("dequantize_weight", w.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const unsigned grid = grid_for(OC * C, kThreads);
    if (q.dtype() == DType::fp8_e4m3)
      dequantize_fp8_kernel<T><<<grid, kThreads, 0, l.stream>>>(ptr<T>(w), bytes(q), ptr<const float>(scale), OC, C);
    else if (group == 0)
      dequantize_int8_kernel<T><<<grid, kThreads, 0, l.stream>>>(ptr<T>(w), ptr<const int8_t>(q),
                                                                 ptr<const float>(scale), OC, C);
    else
      dequantize_int4_kernel<T><<<grid, kThreads, 0, l.stream>>>(ptr<T>(w), bytes(q), ptr<const float>(scale),
                                                                 bytes(zero), OC, C, group);
  });
  DSCPP_CUDA_CHECK_LAUNCH();
}

namespace {

// The few-row kernels of matmul_q_forward (with the input rows RMSNorm'ed first when norm.gamma is set, epi's
// epilogue); false, having done nothing, where none takes the shapes.
bool try_q_gemv(const Tensor& out, const Tensor& inp, const Tensor& q, const Tensor& scale, const Tensor& zero,
                int64_t group, const Tensor& bias, const Tensor& residual, const GemvNorm& norm, const GemvEpilogue& epi,
                cudaStream_t s) {
  const int64_t OC = q.size(0), C = group ? 2 * q.size(1) : q.size(1), N = inp.numel() / C;
  if (q.dtype() == DType::fp8_e4m3)  // Note [fp8 decode GEMV]
    return inp.dtype() == DType::bf16 && all_aligned16(inp.raw(), q.raw()) &&
           gemv_fp8::launch(out.raw(), out.dtype(), ptr<const __nv_bfloat16>(inp), bytes(q), ptr<const float>(scale),
                            bias.defined() ? bias.raw() : nullptr, bias.defined() ? bias.dtype() : DType::f32,
                            residual.defined() ? residual.raw() : nullptr, N, OC, C, norm, epi, s);
  if (gemv_tensor_cores() && inp.dtype() == DType::bf16 && N <= gemv_mma::kMaxM && C <= INT32_MAX &&
      all_aligned16(inp.raw(), q.raw())) {  // Note [Decode GEMV on tensor cores]
    const void* b = bias.defined() ? bias.raw() : nullptr;
    const DType bt = bias.defined() ? bias.dtype() : DType::f32;
    const void* res = residual.defined() ? residual.raw() : nullptr;
    const auto* x = ptr<const __nv_bfloat16>(inp);
    if (group == 0 && C % gemv_mma::kMacroCols<8> == 0 &&
        gemv_mma::launch<8>(out.raw(), out.dtype(), x, {q.raw(), ptr<const float>(scale), nullptr, 0}, b, bt, res, N,
                            OC, C, norm, epi, s))
      return true;
    if (group > 0 && group % gemv_mma::kMacroCols<4> == 0 && C % group == 0 &&
        gemv_mma::launch<4>(out.raw(), out.dtype(), x, {q.raw(), ptr<const float>(scale), bytes(zero), int(group)}, b,
                            bt, res, N, OC, C, norm, epi, s))
      return true;
  }
  if (N <= 4 && C <= INT32_MAX && all_aligned16(inp.raw(), q.raw())) {  // Note [Quantized GEMV]
    if (group == 0 && C % Int8Row::V == 0 &&
        try_quant_gemv<Int8Row>(out, inp, {ptr<const int8_t>(q), ptr<const float>(scale), C}, bias, residual, N, OC,
                                C, norm, epi, s))
      return true;
    if (group > 0 && C % Int4Row::V == 0 && group % Int4Row::V == 0 &&
        try_quant_gemv<Int4Row>(out, inp, {bytes(q), ptr<const float>(scale), bytes(zero), C, int(group)}, bias,
                                residual, N, OC, C, norm, epi, s))
      return true;
  }
  return false;
}

// More rows than the fp8 GEMV takes: the rows quantized into a scratch (codes and scales), then matmul_fp8 (Note
// [fp8 GEMM], matmul.cu). Where cuBLASLt has no algorithm for the case, both operands are dequantized into inp's
// dtype and matmul_forward runs: the same product up to that rounding, slowly.
void fp8_gemm(const Tensor& out, const Tensor& inp, const Tensor& q, const Tensor& scale, const Tensor& bias,
              const Tensor& residual, cudaStream_t stream) {
  const int64_t OC = q.size(0), C = q.size(1), N = inp.numel() / C;
  Tensor xq = Tensor::empty({N, C}, DType::fp8_e4m3, q.device()), sx = Tensor::empty({N}, DType::f32, q.device());
  quantize_rows_fp8(xq, sx, inp, N, C, stream);
  if (matmul_fp8(out, xq, sx, q, scale, bias, residual)) return;
  Tensor x = Tensor::empty({N, C}, inp.dtype(), q.device()), w = Tensor::empty({OC, C}, inp.dtype(), q.device());
  dequantize_weight(x, xq, sx, Tensor(), 0);
  dequantize_weight(w, q, scale, Tensor(), 0);
  matmul_forward(out, x, w, bias, residual);
}

}  // namespace

void matmul_q_forward(const Tensor& out, const Tensor& inp, const Tensor& q, const Tensor& scale, const Tensor& zero,
                      int64_t group, const Tensor& bias, const Tensor& residual) {
  const int64_t OC = q.size(0), C = group ? 2 * q.size(1) : q.size(1), N = inp.numel() / C;
  if (N == 0) return;
  OpLaunch l(out);
  if (try_q_gemv(out, inp, q, scale, zero, group, bias, residual, {}, {}, l.stream)) return;
  if (q.dtype() == DType::fp8_e4m3) return fp8_gemm(out, inp, q, scale, bias, residual, l.stream);
  Tensor w = Tensor::empty({OC, C}, inp.dtype(), q.device());  // stream-ordered (Note [Current stream])
  dequantize_weight(w, q, scale, zero, group);
  matmul_forward(out, inp, w, bias, residual);
}

bool try_rmsnorm_matmul_q(const Tensor& out, const Tensor& normed, const Tensor& inp, const Tensor& norm_weight,
                          float eps, const Tensor& q, const Tensor& scale, const Tensor& zero, int64_t group,
                          const Tensor& bias, const GemvEpilogue& epi) {
  const int64_t C = group ? 2 * q.size(1) : q.size(1);
  const bool norm = norm_weight.defined();
  if (inp.numel() == 0 || C % 8 != 0 || (norm && !all_aligned16(norm_weight.raw(), normed.raw()))) return false;
  OpLaunch l(out);
  return try_q_gemv(out, inp, q, scale, zero, group, bias, Tensor(),
                    norm ? GemvNorm{norm_weight.raw(), eps, normed.raw()} : GemvNorm{}, epi, l.stream);
}

}  // namespace dscpp::cuda
