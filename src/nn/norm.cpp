#include "dscpp/nn/norm.h"

#include "dscpp/kernels/ops.h"

namespace dscpp {

Norm Norm::declare(ParamSet& ps, NormKind kind, const std::string& name, int64_t C, float eps) {
  Norm n;
  n.kind = kind;
  n.eps = eps;
  n.weight_id = ps.add(name + ".weight", {C}, false);
  if (kind == NormKind::layernorm) n.bias_id = ps.add(name + ".bias", {C}, false);
  return n;
}

NormStats Norm::forward(const ParamSet& ps, const Tensor& out, const Tensor& inp) const {
  int64_t N = inp.numel() / inp.size(-1);
  NormStats s;
  s.rstd = Tensor::empty({N}, DType::f32, out.device());
  if (kind == NormKind::layernorm) {
    s.mean = Tensor::empty({N}, DType::f32, out.device());
    ops::layernorm_forward(out, s.mean, s.rstd, inp, ps.param(weight_id), ps.param(bias_id), eps);
  } else {
    ops::rmsnorm_forward(out, s.rstd, inp, ps.param(weight_id), eps);
  }
  return s;
}

void Norm::apply(const ParamSet& ps, const Tensor& out, const Tensor& inp, const NormStats& s) const {
  if (kind == NormKind::layernorm)
    ops::layernorm_apply(out, inp, ps.param(weight_id), ps.param(bias_id), s.mean, s.rstd);
  else
    ops::rmsnorm_apply(out, inp, ps.param(weight_id), s.rstd);
}

void Norm::backward(const ParamSet& ps, const Tensor& dinp, const Tensor& dout, const Tensor& inp,
                    const NormStats& s) const {
  if (kind == NormKind::layernorm) {
    ops::layernorm_backward(dinp, ps.grad(weight_id), ps.grad(bias_id), dout, inp, ps.param(weight_id), s.mean,
                            s.rstd);
  } else {
    ops::rmsnorm_backward(dinp, ps.grad(weight_id), dout, inp, ps.param(weight_id), s.rstd);
  }
}

NormStats Norm::forward_residual(const ParamSet& ps, const Tensor& resid, const Tensor& out, const Tensor& x,
                                 const Tensor& residual) const {
  int64_t N = x.numel() / x.size(-1);
  NormStats s;
  s.rstd = Tensor::empty({N}, DType::f32, out.device());
  if (kind == NormKind::layernorm) {
    s.mean = Tensor::empty({N}, DType::f32, out.device());
    ops::fused_residual_layernorm_forward(resid, out, s.mean, s.rstd, x, residual, ps.param(weight_id),
                                          ps.param(bias_id), eps);
  } else {
    ops::fused_residual_rmsnorm_forward(resid, out, s.rstd, x, residual, ps.param(weight_id), eps);
  }
  return s;
}

void Norm::backward_residual(const ParamSet& ps, const Tensor& dresid, const Tensor& dskip, const Tensor& dout,
                             const Tensor& resid, const NormStats& s) const {
  if (kind == NormKind::layernorm) {
    ops::fused_residual_layernorm_backward(dresid, ps.grad(weight_id), ps.grad(bias_id), dskip, dout, resid,
                                           ps.param(weight_id), s.mean, s.rstd);
  } else {
    ops::fused_residual_rmsnorm_backward(dresid, ps.grad(weight_id), dskip, dout, resid, ps.param(weight_id), s.rstd);
  }
}

}  // namespace dscpp
