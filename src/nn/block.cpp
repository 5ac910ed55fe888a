#include "dscpp/nn/block.h"

#include "dscpp/kernels/ops.h"
#include "dscpp/profiler/profiler.h"

namespace dscpp {

namespace {
// The output of norm `n` for input `inp` with its saved statistics: a fresh [N, C] temporary.
Tensor norm_output(const ParamSet& ps, const Norm& n, const Tensor& inp, const NormStats& st) {
  Tensor out = Tensor::empty(inp.shape(), inp.dtype(), inp.device());
  n.apply(ps, out, inp, st);
  return out;
}
}  // namespace

void Block::forward(const ParamSet& ps, const Tensor& out, const Tensor& inp, const SeqInfo& s, bool save) {
  MemoryCategoryScope scope(MemoryCategory::activations);
  Device dev = out.device();
  Shape nc = inp.shape();
  const DType act = inp.dtype();  // activations in the compute dtype (f32, or bf16/f16 under mixed precision)
  Tensor h = Tensor::empty(nc, act, dev);  // norm1(x), then norm2(x1): not kept (backward rebuilds them)
  st1_ = norm1.forward(ps, h, inp);
  x1_ = Tensor::empty(nc, act, dev);
  {
    DSCPP_PROFILE_RANGE("model.blocks.*.attn", index);  // the flops profiler's module tree paths
    attn.forward(ps, x1_, h, s);
  }
  st2_ = norm2.forward_residual(ps, x1_, h, x1_, inp);  // x1 = attn + x and h = norm2(x1), one pass
  {
    DSCPP_PROFILE_RANGE("model.blocks.*.mlp", index);
    mlp.forward(ps, out, h, x1_);  // out = mlp(h) + x1: the residual is the down projection's GEMM input C
  }
  h = Tensor();
  if (!save) release();
}

void Block::backward(const ParamSet& ps, const Tensor& dres, const Tensor& inp, const SeqInfo& s) {
  DSCPP_CHECK(saved(), "block backward without a saved forward (recompute it first)");
  MemoryCategoryScope scope(MemoryCategory::activations);
  // Each norm's backward is fused with the skip path's gradient: d(norm input) = dres + norm'(dnorm), in place.
  // The norm outputs are rebuilt inside the sublayers' backward, right before the GEMM that reads them.
  Tensor dnorm = Tensor::empty(dres.shape(), dres.dtype(), dres.device());  // d(norm output)
  {
    DSCPP_PROFILE_RANGE("model.blocks.*.mlp", index);
    mlp.backward(ps, dnorm, dres, [&] { return norm_output(ps, norm2, x1_, st2_); });
    mlp.release();
  }
  norm2.backward_residual(ps, dres, dres, dnorm, x1_, st2_);  // dres = d(x1)
  st2_.release();
  {
    DSCPP_PROFILE_RANGE("model.blocks.*.attn", index);
    attn.backward(ps, dnorm, dres, [&] { return norm_output(ps, norm1, inp, st1_); }, s);
    attn.release();
  }
  norm1.backward_residual(ps, dres, dres, dnorm, inp, st1_);  // dres = d(inp)
  release();
}

void Block::release() {
  attn.release();
  mlp.release();
  x1_ = Tensor();
  st1_.release();
  st2_.release();
}

}  // namespace dscpp
