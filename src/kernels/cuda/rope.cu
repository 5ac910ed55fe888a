// Rotary position embedding (HF Llama rotate_half) on CUDA, in place on the q and k heads of packed qkv.
// Same angles as src/kernels/cpu/rope.cpp: inv_freq_i = rope_inv_freq(i) in f32 (kernels/rope_params.h: 1 / theta^(2i/D),
// Llama 3 scaling when set), angle = pos * inv_freq_i.
// A block row (threadIdx.y) owns one token: it first puts the token's D/2 cos/sin pairs in shared memory (one
// sincosf per pair, shared by all H + Hkv heads, where a thread per element made the kernel compute-bound at
// ~4x the copy time), then each thread rotates V pairs of one head: x[i..i+V) and x[i+D/2..i+D/2+V) (or where
// rope.pair_block puts them, rope_params.h), owned by that thread alone, so the in-place update has no races. V > 1
// uses 16-byte accesses (Note [Vector width]).
// rope_kv_cache_append is the same kernel with a cache to fill: the threads that rotate a k head also store it into
// the token's slot, and the block row copies the v heads there too, so decode runs one kernel where rope_forward
// and kv_cache_append ran two (Llama-3.1-8B: 32 fewer launches, and their gaps, a token).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/kv_cache_elem.cuh"

namespace dscpp::cuda {
namespace {

constexpr int kThreads = 256;

// Where rope_kv_cache_append puts a token's rotated k heads and its v heads: cache[slot] = [2][Hkv][D] (as
// kv_cache_append); a null cache: rope alone.
template <typename C>
struct KvSink {
  C* cache = nullptr;
  const int32_t* slots = nullptr;
  int64_t n_slots = 0;
};

// qkv[N, (H+2Hkv)*D]: rotates heads [0, H+Hkv) (the q heads, then the k heads). sign = +1 forward, -1 backward
// (the inverse rotation: sin negated). Shared memory: D/2 + blockDim.y * D floats.
template <typename T, int V, typename C>
__global__ void rope_kernel(T* qkv, const int32_t* pos, int64_t N, int heads, int Htot, int D, float theta,
                            RopeScaling scaling, int pair_block, float sign, KvSink<C> sink) {
  extern __shared__ float table[];
  const int half = D / 2, groups = half / V, per_token = heads * groups, gap = rope_gap(D, pair_block);
  float* inv_freq = table;  // the block's frequencies, once: a double pow each (kernels/rope_params.h)
  float* cs = table + half + threadIdx.y * D;
  float* sn = cs + half;
  for (int i = threadIdx.y * blockDim.x + threadIdx.x; i < half; i += blockDim.x * blockDim.y)
    inv_freq[i] = rope_inv_freq(i, D, theta, scaling);
  for (int64_t n0 = int64_t(blockIdx.x) * blockDim.y; n0 < N; n0 += int64_t(gridDim.x) * blockDim.y) {
    const int64_t n = n0 + threadIdx.y;
    __syncthreads();  // the previous token's readers are done with the table
    if (n < N)
      for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float s, c;
        sincosf(float(pos[n]) * inv_freq[i], &s, &c);
        cs[i] = c;
        sn[i] = s * sign;
      }
    __syncthreads();
    if (n >= N) continue;
    T* row = qkv + n * int64_t(Htot) * D;
    const int Hkv = Htot - heads, Hq = heads - Hkv, kv = Hkv * D;  // kv: the elements of the k (or of the v) heads
    int64_t slot = -1;
    if (sink.cache) {
      slot = sink.slots[n];
      if (slot >= sink.n_slots) slot = -1;  // Note [Paged attention design]: indices
    }
    C* dst = slot >= 0 ? sink.cache + slot * 2 * kv : nullptr;
    if (dst)
      for (int i = threadIdx.x * V; i < kv; i += blockDim.x * V) {  // the v heads, as they are
        float v[V];
        load_f<T, V>(row + Hq * D + kv + i, v);
        store_cache<C, V>(dst + kv + i, v);
      }
    for (int j = threadIdx.x; j < per_token; j += blockDim.x) {
      const int i0 = (j % groups) * V, e0 = rope_first(i0, pair_block);  // V divides pair_block
      T* x = row + (j / groups) * D + e0;
      float x1[V], x2[V], y1[V], y2[V];
      load_f<T, V>(x, x1);
      load_f<T, V>(x + gap, x2);
#pragma unroll
      for (int k = 0; k < V; k++) rope_rotate(x1[k], x2[k], cs[i0 + k], sn[i0 + k], y1[k], y2[k]);
      store_f<T, V>(x, y1);
      store_f<T, V>(x + gap, y2);
      const int head = j / groups;
      if (dst && head >= Hq) {
        store_cache<C, V>(dst + (head - Hq) * D + e0, y1);
        store_cache<C, V>(dst + (head - Hq) * D + e0 + gap, y2);
      }
    }
  }
}

template <typename T, int V, typename C>
void launch_rope_v(T* qkv, const int32_t* pos, int64_t N, int heads, int Htot, int D, const RopeParams& rope,
                   float sign, KvSink<C> sink, cudaStream_t s) {
  const int per_token = heads * (D / 2 / V);
  const int x = per_token < kThreads ? per_token : kThreads;
  const int y = kThreads / x;  // tokens per block
  const dim3 block{unsigned(x), unsigned(y)};
  const size_t shared = (size_t(y) * D + D / 2) * sizeof(float);
  rope_kernel<T, V, C><<<grid_for(N, y), block, shared, s>>>(qkv, pos, N, heads, Htot, D, rope.theta, rope.scaling,
                                                              rope.pair_block, sign, sink);
  DSCPP_CUDA_CHECK_LAUNCH();
}

}  // namespace

// ---- raw launcher (rope.pair_block: where a head's pairs lie, rope_params.h) ----
template <typename T, typename C = T>
void launch_rope(T* qkv, const int32_t* pos, int64_t N, int H, int Hkv, int D, const RopeParams& rope, float sign,
                 cudaStream_t s, KvSink<C> sink = {}) {
  const int heads = H + Hkv, Htot = H + 2 * Hkv;
  constexpr int V = 16 / int(sizeof(T));
  // 16-byte accesses need every run of V pair elements to start on a 16-byte boundary: half (and the pair block) a
  // multiple of V (which makes D and the row length multiples of V too) and an aligned base; the cache's too.
  if ((D / 2) % V == 0 && rope.pair_block % V == 0 && aligned16(qkv) && aligned16(sink.cache))
    launch_rope_v<T, V, C>(qkv, pos, N, heads, Htot, D, rope, sign, sink, s);
  else
    launch_rope_v<T, 1, C>(qkv, pos, N, heads, Htot, D, rope, sign, sink, s);
}

// ---- checked entries (ops.cpp has validated shapes and dtypes) ----
namespace {
void rope(const char* op, const Tensor& qkv, const Tensor& pos, int64_t H, int64_t Hkv, int64_t D,
          const RopeParams& rope, float sign) {
  const int64_t N = qkv.numel() / ((H + 2 * Hkv) * D);
  if (N == 0) return;
  OpLaunch L(qkv);
  dispatch_float(op, qkv.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    launch_rope<T>(ptr<T>(qkv), ptr<int32_t>(pos), N, int(H), int(Hkv), int(D), rope, sign, L.stream);
  });
}
}  // namespace

void rope_forward(const Tensor& qkv, const Tensor& pos, int64_t H, int64_t Hkv, int64_t D, const RopeParams& rope) {
  cuda::rope("rope_forward", qkv, pos, H, Hkv, D, rope, 1.0f);
}

void rope_backward(const Tensor& dqkv, const Tensor& pos, int64_t H, int64_t Hkv, int64_t D, const RopeParams& rope) {
  cuda::rope("rope_backward", dqkv, pos, H, Hkv, D, rope, -1.0f);
}

void rope_kv_cache_append(const Tensor& cache, const Tensor& qkv, const Tensor& pos, const Tensor& slots, int64_t H,
                          int64_t Hkv, int64_t D, const RopeParams& rope) {
  const char* op = "rope_kv_cache_append";
  const int64_t N = qkv.numel() / ((H + 2 * Hkv) * D);
  if (N == 0) return;
  OpLaunch L(qkv);
  dispatch_paged(op, qkv.dtype(), cache.dtype(), [&](auto* tag, auto* ctag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using C = std::remove_pointer_t<decltype(ctag)>;
    const KvSink<C> sink{ptr<C>(cache), ptr<int32_t>(slots), cache.size(0) * cache.size(1)};
    launch_rope<T, C>(ptr<T>(qkv), ptr<int32_t>(pos), N, int(H), int(Hkv), int(D), rope, 1.0f, L.stream, sink);
  });
}

}  // namespace dscpp::cuda
