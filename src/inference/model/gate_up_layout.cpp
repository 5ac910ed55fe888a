// interleave_gate_up (inference_model.h): the fused gate | up weight's rows regrouped so that each block of
// kSwigluPairBlock gate rows is followed by the same features' up rows (Note [SwiGLU in the decode GEMV]).
#include "dscpp/core/copy_2d.h"
#include "dscpp/core/cuda.h"
#include "dscpp/inference/inference_model.h"
#include "dscpp/kernels/norm_matmul_ops.h"

namespace dscpp::inference {
namespace {

// t [2F, ...] (any dtype: weights, int4 / int8 codes, scales, zero points) with its rows regrouped: two strided
// copies, gate rows into the first half of every 2k-row block, up rows into the second.
Tensor interleaved(const Tensor& t, int64_t F, int64_t k) {
  if (!t.defined()) return t;
  const int64_t n = t.numel(), R = n / (2 * F);  // elements a row
  Tensor out = Tensor::empty(t.shape(), t.dtype(), t.device());
  const Tensor src = t.view({n}), dst = out.view({n});
  copy_2d_async(dst, 2 * k * R, src, k * R, F / k, k * R);
  copy_2d_async(dst.view_at(k * R, {n - k * R}), 2 * k * R, src.view_at(F * R, {n - F * R}), k * R, F / k, k * R);
  return out;
}

}  // namespace

void interleave_gate_up(InferenceModel& m) {
  const int64_t F = m.cfg.ffn, k = ops::kSwigluPairBlock;
  if (m.cfg.mlp != MlpKind::swiglu || m.up_pair_block != 0 || F % k != 0) return;
  for (LayerWeights& w : m.layers) {
    w.up_w = interleaved(w.up_w, F, k), w.up_b = interleaved(w.up_b, F, k);
    QuantWeight& q = w.up_q;
    q.q = interleaved(q.q, F, k), q.scale = interleaved(q.scale, F, k), q.zero = interleaved(q.zero, F, k);
  }
  if (m.device.is_cuda()) cuda_synchronize();
  m.up_pair_block = k;
}

}  // namespace dscpp::inference
