// The norm-and-linear ops (norm_matmul_ops.h). The one-kernel CUDA path is taken only where both component ops
// would accept their arguments (checked here without throwing); anything else runs the two ops, which validate
// and name what is wrong.
#include "dscpp/kernels/norm_matmul_ops.h"

#include "dscpp/kernels/ops.h"
#include "dscpp/kernels/quant_ops.h"
#ifdef DSCPP_WITH_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace dscpp::ops {
namespace {

// inp [N, C] of bf16 / f16 on a CUDA device, normed and norm_weight alike, out [N, OC] of f32 or inp's dtype, bias
// [OC] of f32 or inp's dtype (or none), all on inp's device.
bool fusable(const Tensor& out, const Tensor& normed, const Tensor& inp, const Tensor& norm_weight, const Tensor& bias,
             int64_t OC, int64_t C) {
  if (!inp.defined() || !out.defined() || !normed.defined() || !norm_weight.defined() || !inp.device().is_cuda())
    return false;
  const DType t = inp.dtype();
  const Device d = inp.device();
  if ((t != DType::bf16 && t != DType::f16) || C <= 0 || inp.size(-1) != C || inp.numel() % C) return false;
  const int64_t N = inp.numel() / C;
  auto same = [&](const Tensor& x) { return x.device() == d; };
  return same(out) && same(normed) && same(norm_weight) && normed.dtype() == t && normed.numel() == N * C &&
         normed.size(-1) == C && norm_weight.dtype() == t && norm_weight.dim() == 1 && norm_weight.numel() == C &&
         (out.dtype() == t || out.dtype() == DType::f32) && out.numel() == N * OC && out.size(-1) == OC &&
         (!bias.defined() || (same(bias) && bias.dim() == 1 && bias.numel() == OC &&
                              (bias.dtype() == t || bias.dtype() == DType::f32)));
}

}  // namespace

void rmsnorm_matmul_forward(const Tensor& out, const Tensor& normed, const Tensor& inp, const Tensor& norm_weight,
                            float eps, const Tensor& weight, const Tensor& bias) {
#ifdef DSCPP_WITH_CUDA
  if (weight.defined() && weight.dim() == 2 && weight.dtype() == inp.dtype() && weight.device() == inp.device() &&
      fusable(out, normed, inp, norm_weight, bias, weight.size(0), weight.size(1)) &&
      cuda::try_rmsnorm_matmul(out, normed, inp, norm_weight, eps, weight, bias))
    return;
#endif
  rmsnorm_forward(normed, Tensor(), inp, norm_weight, eps);
  matmul_forward(out, normed, weight, bias);
}

void rmsnorm_matmul_q_forward(const Tensor& out, const Tensor& normed, const Tensor& inp, const Tensor& norm_weight,
                              float eps, const Tensor& q, const Tensor& scale, const Tensor& zero, int64_t group,
                              const Tensor& bias) {
#ifdef DSCPP_WITH_CUDA
  // The quantized weight's own layout checks are matmul_q_forward's; here only that it is a 2-D tensor on inp's
  // device whose shape the kernels read (its scale and zero point are checked there before any launch).
  if (q.defined() && q.dim() == 2 && q.device() == inp.device() && scale.defined() && scale.device() == inp.device() &&
      group >= 0) {
    const int64_t OC = q.size(0), C = group ? 2 * q.size(1) : q.size(1);
    const bool fp8 = q.dtype() == DType::fp8_e4m3;
    const bool layout = (q.dtype() == DType::i8 || (fp8 && group == 0)) &&
                        (group ? zero.defined() && zero.dtype() == DType::i8 && zero.device() == inp.device() &&
                                     group % 2 == 0 && C % group == 0 && scale.numel() == OC * (C / group) &&
                                     zero.numel() == OC * (C / group)
                               : !zero.defined() && scale.numel() == OC);
    if (layout && scale.dtype() == DType::f32 && fusable(out, normed, inp, norm_weight, bias, OC, C) &&
        cuda::try_rmsnorm_matmul_q(out, normed, inp, norm_weight, eps, q, scale, zero, group, bias))
      return;
  }
#endif
  rmsnorm_forward(normed, Tensor(), inp, norm_weight, eps);
  matmul_q_forward(out, normed, q, scale, zero, group, bias);
}

}  // namespace dscpp::ops
