#include "dscpp/nn/norm.h"

#include "dscpp/kernels/ops.h"

namespace dscpp {

namespace {
NormGrads own_grads(const ParamSet& ps, const Norm& n) {
  return {ps.grad(n.weight_id), n.bias_id >= 0 ? ps.grad(n.bias_id) : Tensor()};
}
}  // namespace

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
                    const NormStats& s, const NormGrads& into) const {
  const NormGrads g = into.weight.defined() ? into : own_grads(ps, *this);
  if (kind == NormKind::layernorm) {
    ops::layernorm_backward(dinp, g.weight, g.bias, dout, inp, ps.param(weight_id), s.mean, s.rstd);
  } else {
    ops::rmsnorm_backward(dinp, g.weight, dout, inp, ps.param(weight_id), s.rstd);
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
                             const Tensor& resid, const NormStats& s, const NormGrads& into) const {
  const NormGrads g = into.weight.defined() ? into : own_grads(ps, *this);
  if (kind == NormKind::layernorm) {
    ops::fused_residual_layernorm_backward(dresid, g.weight, g.bias, dskip, dout, resid, ps.param(weight_id),
                                           s.mean, s.rstd);
  } else {
    ops::fused_residual_rmsnorm_backward(dresid, g.weight, dskip, dout, resid, ps.param(weight_id), s.rstd);
  }
}

void Norm::add_grads(const ParamSet& ps, const NormGrads& g) const {
  ops::add_inplace(ps.grad(weight_id), g.weight);
  if (bias_id >= 0) ops::add_inplace(ps.grad(bias_id), g.bias);
}

std::vector<NormGrads> zeroed_norm_grads(const ParamSet& ps, const std::vector<const Norm*>& norms, Tensor* buf) {
  int64_t total = 0;
  for (const Norm* n : norms) total += ps.info(n->weight_id).numel * (n->bias_id >= 0 ? 2 : 1);
  const Tensor w0 = ps.grad(norms.at(0)->weight_id);
  *buf = Tensor::zeros({total}, w0.dtype(), w0.device());
  std::vector<NormGrads> out;
  int64_t at = 0;
  auto next = [&](int id) {
    if (id < 0) return Tensor();
    const Shape shape = ps.info(id).shape;
    Tensor t = buf->view_at(at, shape);
    at += ps.info(id).numel;
    return t;
  };
  for (const Norm* n : norms) {
    Tensor w = next(n->weight_id);
    out.push_back({w, next(n->bias_id)});
  }
  return out;
}

}  // namespace dscpp
