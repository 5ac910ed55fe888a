// CUDA twins of the sampling ops (include/dscpp/kernels/sampling_ops.h), the same rows as the CPU references in
// src/kernels/cpu/sampling.cpp.
//
// Note [Sampling kernel design]
// One CTA of 1024 threads per row. A first pass finds the maximum and its id (ties to the lower id); a greedy row
// ends there. The candidates are a threshold on the logits, found without a sort: each float maps to an
// order-preserving u32 key (-0 folded onto +0, as the CPU's float comparisons see them), and a radix descent of 4
// passes of 8-bit digits walks from the top digit down, keeping the digit where a running total reaches its target:
//   - top_k: the target is k and each element counts 1: the descent ends on the k-th largest key (radix select);
//   - top_p: the target is ceil(top_p * mass of the top-k set) and each element weighs its w: the descent ends on
//     the largest tau whose upper set holds the target mass.
// The histograms are per warp (no contention between warps) and merged in a fixed order. Masses are fixed-point
// integers, w * 2^40 truncated (w <= 1, V * 2^40 < 2^64): integer sums give the same bits whatever the order of the
// atomics, so a row gives the same token on every run. The draw: each warp sums the candidates' masses over its
// contiguous 1/32 of the ids, warp 0 scans the 32 sums to find the warp holding r = u * total, and that warp walks
// its ids 32 at a time with a warp scan until the running mass passes r: the inverse CDF in id order.
// Against the CPU's double sums the fixed-point masses differ by about V * 2^-40 of the total, so a token differs
// only where u or top_p falls that close to a boundary.
#include <climits>
#include <cmath>

#include "dscpp/core/philox.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace dscpp::cuda {
namespace {

constexpr int kThreads = 1024, kWarps = kThreads / 32, kBins = 256;
constexpr float kFix = 0x1p40f;
using u64 = unsigned long long;

struct Smem {
  u64 hist[kWarps][kBins];  // per-warp histograms
  u64 merged[kBins];
  u64 warp_mass[kWarps];
  float fval[kWarps];
  int ival[kWarps];
  u64 above, total;
  int digit, warp, best;
  float best_v;
};

__device__ __forceinline__ uint32_t key_of(float x) {
  uint32_t u = __float_as_uint(x);
  if (u == 0x80000000u) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// (v, i) is before (bv, bi) in the order "larger logit first, lower id first".
__device__ __forceinline__ bool before(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

// The first element of the row in that order among those after (pv, pi) (pv = +inf, pi = -1: all of them); every
// thread gets it in (*v, *i). i = INT_MAX where none is left.
__device__ void block_first(const float* row, int V, float pv, int pi, Smem& sm, float* v, int* i) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float bv = -INFINITY;
  int bi = INT_MAX;
  for (int j = threadIdx.x; j < V; j += kThreads) {
    const float x = row[j];
    if (before(pv, pi, x, j) && before(x, j, bv, bi)) bv = x, bi = j;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (before(ov, oi, bv, bi)) bv = ov, bi = oi;
  }
  if (lane == 0) sm.fval[warp] = bv, sm.ival[warp] = bi;
  __syncthreads();
  if (warp == 0) {
    bv = sm.fval[lane], bi = sm.ival[lane];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (before(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    if (lane == 0) sm.best_v = bv, sm.best = bi;
  }
  __syncthreads();
  *v = sm.best_v, *i = sm.best;
  __syncthreads();
}

__device__ __forceinline__ u64 warp_sum_u64(u64 x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Warp 0: the largest digit d whose upper part of merged (digits >= d, from the top) reaches target; sets sm.digit
// and sm.above (the mass of the digits above d).
__device__ void descend_digit(Smem& sm, u64 target) {
  const int lane = threadIdx.x & 31;
  u64 v[8], s = 0;
#pragma unroll
  for (int j = 0; j < 8; j++) s += v[j] = sm.merged[kBins - 1 - (lane * 8 + j)];
  const u64 incl = warp_inclusive_sum(s);
  const u64 total = __shfl_sync(0xffffffffu, incl, 31);
  if (target > total) target = total;  // only through rounding: keep the lowest digit holding mass
  const unsigned hit = __ballot_sync(0xffffffffu, incl >= target);
  if (lane == __ffs(hit) - 1) {
    u64 acc = incl - s;
    for (int j = 0; j < 8; j++) {
      if (acc + v[j] >= target) {
        sm.digit = kBins - 1 - (lane * 8 + j), sm.above = acc;
        break;
      }
      acc += v[j];
    }
  }
}

// Note [Sampling kernel design]: the key where the running total of value(x, key) over the keys from the top
// reaches target.
template <typename F>
__device__ uint32_t radix_descend(const float* row, int V, Smem& sm, u64 target, F value) {
  const int warp = threadIdx.x >> 5;
  uint32_t prefix = 0, mask = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    u64* flat = &sm.hist[0][0];
    for (int j = threadIdx.x; j < kWarps * kBins; j += kThreads) flat[j] = 0;
    __syncthreads();
    for (int j = threadIdx.x; j < V; j += kThreads) {
      const float x = row[j];
      const uint32_t key = key_of(x);
      if ((key & mask) != prefix) continue;
      const u64 w = value(x, key);
      if (w) atomicAdd(&sm.hist[warp][(key >> shift) & 0xffu], w);
    }
    __syncthreads();
    if (threadIdx.x < kBins) {
      u64 s = 0;
      for (int w = 0; w < kWarps; w++) s += sm.hist[w][threadIdx.x];
      sm.merged[threadIdx.x] = s;
    }
    __syncthreads();
    if (warp == 0) descend_digit(sm, target);
    __syncthreads();
    target -= sm.above;
    prefix |= uint32_t(sm.digit) << shift;
    mask |= 0xffu << shift;
    __syncthreads();
  }
  return prefix;
}

__global__ void __launch_bounds__(kThreads)
    sample_rows_kernel(int32_t* __restrict__ tokens, const float* __restrict__ logits, int V,
                       const float* __restrict__ temperature, const int32_t* __restrict__ top_k,
                       const float* __restrict__ top_p, const float* __restrict__ min_p,
                       const int32_t* __restrict__ seed, const int32_t* __restrict__ step) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Smem& sm = *reinterpret_cast<Smem*>(smem_raw);
  const int s = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float* row = logits + int64_t(s) * V;
  float mx;
  int top;
  block_first(row, V, INFINITY, -1, sm, &mx, &top);
  const float T = temperature[s];
  if (!(T > 0.0f)) {
    if (threadIdx.x == 0) tokens[s] = top;
    return;
  }
  auto fixed = [=](float x) { return u64(__float2ull_rz(expf((x - mx) / T) * kFix)); };
  const int k = top_k[s];
  uint32_t cut = 0;
  if (k > 0 && k < V) cut = radix_descend(row, V, sm, u64(k), [](float, uint32_t) { return u64(1); });
  const float p = top_p[s];
  if (p < 1.0f) {
    u64 local = 0;
    for (int j = threadIdx.x; j < V; j += kThreads) {
      const float x = row[j];
      if (key_of(x) >= cut) local += fixed(x);
    }
    local = warp_sum_u64(local);
    if (lane == 0) sm.warp_mass[warp] = local;
    __syncthreads();
    if (warp == 0) {
      const u64 t = warp_sum_u64(sm.warp_mass[lane]);
      if (lane == 0) sm.total = t;
    }
    __syncthreads();
    const u64 target = u64(ceil(double(p) * double(sm.total)));
    const uint32_t k_cut = cut;
    const uint32_t p_cut =
        radix_descend(row, V, sm, target, [=](float x, uint32_t key) { return key >= k_cut ? fixed(x) : u64(0); });
    cut = max(cut, p_cut);
  }
  const float mp = min_p[s];
  auto weight = [=](float x) -> u64 {
    if (key_of(x) < cut) return 0;
    const float w = expf((x - mx) / T);
    return w >= mp ? u64(__float2ull_rz(w * kFix)) : 0;
  };
  // The draw (Note [Sampling kernel design]): warp w holds ids [w * seg, (w + 1) * seg).
  const int seg = ((V + kWarps - 1) / kWarps + 31) / 32 * 32, begin = warp * seg, end = min(V, begin + seg);
  u64 local = 0;
  for (int j = begin + lane; j < end; j += 32) local += weight(row[j]);
  local = warp_sum_u64(local);
  if (lane == 0) sm.warp_mass[warp] = local;
  __syncthreads();
  if (warp == 0) {
    const u64 v = sm.warp_mass[lane];
    const u64 incl = warp_inclusive_sum(v);
    const u64 total = __shfl_sync(0xffffffffu, incl, 31);
    const uint64_t sd = uint64_t(uint32_t(seed[2 * s])) | uint64_t(uint32_t(seed[2 * s + 1])) << 32;
    const float u = philox_uniform01(philox4x32_10(sd, 0, uint64_t(uint32_t(step[s]))).v[0]);
    const u64 r = u64(double(u) * double(total));
    const unsigned hit = __ballot_sync(0xffffffffu, incl > r);
    const int w = hit ? __ffs(hit) - 1 : -1;
    const u64 below = __shfl_sync(0xffffffffu, incl - v, w >= 0 ? w : 0);
    if (lane == 0) sm.warp = w, sm.above = below, sm.total = r;
  }
  __syncthreads();
  if (sm.warp < 0) {  // no candidate mass: cannot happen (the maximum weighs 2^40), but never leave tokens unset
    if (threadIdx.x == 0) tokens[s] = top;
    return;
  }
  if (warp != sm.warp) return;
  const u64 r = sm.total;
  u64 acc = sm.above;
  for (int base = begin; base < end; base += 32) {
    const int j = base + lane;
    const u64 incl = warp_inclusive_sum(j < end ? weight(row[j]) : u64(0));
    const unsigned hit = __ballot_sync(0xffffffffu, acc + incl > r);
    if (hit) {
      if (lane == __ffs(hit) - 1) tokens[s] = j;
      return;
    }
    acc += __shfl_sync(0xffffffffu, incl, 31);
  }
  if (lane == 0) tokens[s] = top;
}

__global__ void __launch_bounds__(kThreads)
    logprobs_kernel(float* __restrict__ chosen, int32_t* __restrict__ top_ids, float* __restrict__ top_logprob,
                    const float* __restrict__ logits, const int32_t* __restrict__ tokens, int V, int n) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Smem& sm = *reinterpret_cast<Smem*>(smem_raw);
  const int s = blockIdx.x;
  const float* row = logits + int64_t(s) * V;
  float mx;
  int i;
  block_first(row, V, INFINITY, -1, sm, &mx, &i);
  float sum = 0.0f;
  for (int j = threadIdx.x; j < V; j += kThreads) sum += expf(row[j] - mx);
  sum = block_sum(sum, sm.fval);
  const float lse = mx + logf(sum);
  const int tok = tokens[s];
  if (threadIdx.x == 0) chosen[s] = tok >= 0 && tok < V ? row[tok] - lse : NAN;
  float v = INFINITY;
  i = -1;
  for (int j = 0; j < n; j++) {
    block_first(row, V, v, i, sm, &v, &i);
    if (threadIdx.x == 0) top_ids[int64_t(s) * n + j] = i, top_logprob[int64_t(s) * n + j] = v - lse;
  }
}

__global__ void penalties_kernel(float* __restrict__ out, const int32_t* __restrict__ hist_start,
                                 const int32_t* __restrict__ hist_token, const int32_t* __restrict__ hist_count,
                                 const float* __restrict__ repetition, const float* __restrict__ presence,
                                 const float* __restrict__ frequency, int V) {
  const int s = blockIdx.x;
  for (int j = hist_start[s] + threadIdx.x; j < hist_start[s + 1]; j += blockDim.x) {
    const int t = hist_token[j];
    if (t < 0 || t >= V) continue;
    float& l = out[int64_t(s) * V + t];
    float x = l > 0 ? __fdiv_rn(l, repetition[s]) : __fmul_rn(l, repetition[s]);
    const int c = hist_count[j];
    if (c > 0) x = __fsub_rn(x, __fadd_rn(__fmul_rn(frequency[s], float(c)), presence[s]));  // as the CPU: no FMA
    l = x;
  }
}

void launch_rows(const void* kernel, unsigned S, void** args, cudaStream_t stream) {
  const size_t smem = sizeof(Smem);
  DSCPP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  DSCPP_CUDA_CHECK(cudaLaunchKernel(kernel, dim3(S), dim3(kThreads), args, smem, stream));
}

}  // namespace

void apply_penalties(const Tensor& out, const Tensor& logits, const Tensor& hist_start, const Tensor& hist_token,
                     const Tensor& hist_count, const Tensor& repetition, const Tensor& presence,
                     const Tensor& frequency) {
  OpLaunch L(logits);
  const int64_t S = logits.size(0), V = logits.size(1);
  if (S == 0) return;
  DSCPP_CUDA_CHECK(cudaMemcpyAsync(out.raw(), logits.raw(), size_t(S * V) * sizeof(float), cudaMemcpyDeviceToDevice,
                                   L.stream));
  penalties_kernel<<<unsigned(S), 256, 0, L.stream>>>(ptr<float>(out), ptr<int32_t>(hist_start),
                                                     ptr_or_null<int32_t>(hist_token), ptr_or_null<int32_t>(hist_count),
                                                     ptr<float>(repetition), ptr<float>(presence),
                                                     ptr<float>(frequency), int(V));
  DSCPP_CUDA_CHECK(cudaGetLastError());
}

void sample_rows(const Tensor& tokens, const Tensor& logits, const Tensor& temperature, const Tensor& top_k,
                 const Tensor& top_p, const Tensor& min_p, const Tensor& seed, const Tensor& step) {
  OpLaunch L(logits);
  const int64_t S = logits.size(0);
  if (S == 0) return;
  int32_t* tk = ptr<int32_t>(tokens);
  const float* lg = ptr<float>(logits);
  int V = int(logits.size(1));
  const float *te = ptr<float>(temperature), *tp = ptr<float>(top_p), *mp = ptr<float>(min_p);
  const int32_t *kk = ptr<int32_t>(top_k), *sd = ptr<int32_t>(seed), *st = ptr<int32_t>(step);
  void* args[] = {&tk, &lg, &V, &te, &kk, &tp, &mp, &sd, &st};
  launch_rows(reinterpret_cast<const void*>(&sample_rows_kernel), unsigned(S), args, L.stream);
}

void logprobs_rows(const Tensor& chosen, const Tensor& top_ids, const Tensor& top_logprob, const Tensor& logits,
                   const Tensor& tokens) {
  OpLaunch L(logits);
  const int64_t S = logits.size(0);
  if (S == 0) return;
  float* ch = ptr<float>(chosen);
  int32_t* ti = ptr_or_null<int32_t>(top_ids);
  float* tl = ptr_or_null<float>(top_logprob);
  const float* lg = ptr<float>(logits);
  const int32_t* tk = ptr<int32_t>(tokens);
  int V = int(logits.size(1)), n = int(top_ids.defined() ? top_ids.numel() / S : 0);
  void* args[] = {&ch, &ti, &tl, &lg, &tk, &V, &n};
  launch_rows(reinterpret_cast<const void*>(&logprobs_kernel), unsigned(S), args, L.stream);
}

}  // namespace dscpp::cuda
