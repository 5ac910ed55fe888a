// Rotary position embedding (HF Llama rotate_half) on CUDA, in place on the q and k heads of packed qkv.
// Same angles as src/kernels/cpu/rope.cpp: inv_freq_i = 1 / theta^(2i/D) in f32, angle = pos * inv_freq_i.
// One thread per (token, head, pair i): it owns x[i] and x[i + D/2], so the in-place update has no races.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace dscpp::cuda {
namespace {

constexpr int kBlock = 256;

// qkv[N, (H+2Hkv)*D]: rotates heads [0, H+Hkv) (the q heads, then the k heads). sign = +1 forward, -1 backward
// (the inverse rotation: sin negated).
template <typename T>
__global__ void rope_kernel(T* qkv, const int32_t* pos, int64_t N, int heads, int Htot, int D, float theta,
                            float sign) {
  const int half = D / 2;
  const int64_t total = N * heads * half;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += stride) {
    const int i = int(t % half);
    const int64_t nh = t / half;
    const int h = int(nh % heads);
    const int64_t n = nh / heads;
    const float inv_freq = 1.0f / powf(theta, float(2 * i) / float(D));
    const float a = float(pos[n]) * inv_freq;
    float sn, cs;
    sincosf(a, &sn, &cs);
    sn *= sign;
    T* x = qkv + n * int64_t(Htot) * D + int64_t(h) * D;
    const float x1 = to_f(x[i]), x2 = to_f(x[i + half]);
    x[i] = from_f<T>(x1 * cs - x2 * sn);
    x[i + half] = from_f<T>(x2 * cs + x1 * sn);
  }
}

}  // namespace

// ---- raw launcher ----
template <typename T>
void launch_rope(T* qkv, const int32_t* pos, int64_t N, int H, int Hkv, int D, float theta, float sign,
                 cudaStream_t s) {
  const int heads = H + Hkv, Htot = H + 2 * Hkv;
  rope_kernel<T><<<grid_for(N * heads * (D / 2), kBlock), kBlock, 0, s>>>(qkv, pos, N, heads, Htot, D, theta, sign);
  DSCPP_CUDA_CHECK_LAUNCH();
}

// ---- checked entries (ops.cpp has validated shapes and dtypes) ----
namespace {
void rope(const char* op, const Tensor& qkv, const Tensor& pos, int64_t H, int64_t Hkv, int64_t D, float theta,
          float sign) {
  const int64_t N = qkv.numel() / ((H + 2 * Hkv) * D);
  if (N == 0) return;
  OpLaunch L(qkv);
  dispatch_float(op, qkv.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    launch_rope<T>(ptr<T>(qkv), ptr<int32_t>(pos), N, int(H), int(Hkv), int(D), theta, sign, L.stream);
  });
}
}  // namespace

void rope_forward(const Tensor& qkv, const Tensor& pos, int64_t H, int64_t Hkv, int64_t D, float theta) {
  rope("rope_forward", qkv, pos, H, Hkv, D, theta, 1.0f);
}

void rope_backward(const Tensor& dqkv, const Tensor& pos, int64_t H, int64_t Hkv, int64_t D, float theta) {
  rope("rope_backward", dqkv, pos, H, Hkv, D, theta, -1.0f);
}

}  // namespace dscpp::cuda
