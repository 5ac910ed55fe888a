#include "dscpp/nn/block.h"

#include "dscpp/kernels/ops.h"
#include "dscpp/profiler/profiler.h"

namespace dscpp {

void Block::forward(const ParamSet& ps, const Tensor& out, const Tensor& inp, const SeqInfo& s, bool save) {
  MemoryCategoryScope scope(MemoryCategory::activations);
  Device dev = out.device();
  const TensorParallel& tp = attn.tp;
  const int64_t N = s.N(), C = inp.size(1);
  const DType act = inp.dtype();  // activations in the compute dtype (f32, or bf16/f16 under mixed precision)
  // norm1(x), then norm2(x1), over every row: this rank's rows are made here, the others gathered by the sublayers
  // (Note [Sequence parallelism]). Not kept: backward rebuilds them.
  Tensor h = Tensor::empty({N, C}, act, dev);
  const Tensor mine = h.narrow0(tp.first_row(N), tp.rows(N));
  st1_ = norm1.forward(ps, mine, inp);
  x1_ = Tensor::empty(inp.shape(), act, dev);
  {
    DSCPP_PROFILE_RANGE("model.blocks.*.attn", index);  // the flops profiler's module tree paths
    attn.forward(ps, x1_, h, s);
  }
  st2_ = norm2.forward_residual(ps, x1_, mine, x1_, inp);  // x1 = attn + x and h = norm2(x1), one pass
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
  const TensorParallel& tp = attn.tp;
  // Note [Sequence parallelism]: the norms see this rank's rows only; their gradients are summed over the ranks.
  Tensor row_grads;
  const std::vector<NormGrads> g = tp.split_rows() ? zeroed_norm_grads(ps, {&norm1, &norm2}, &row_grads)
                                                   : std::vector<NormGrads>(2);
  // Each norm's backward is fused with the skip path's gradient: d(norm input) = dres + norm'(dnorm), in place.
  // The norm outputs are rebuilt inside the sublayers' backward, right before the GEMMs that read them.
  Tensor dnorm = Tensor::empty(dres.shape(), dres.dtype(), dres.device());  // d(norm output)
  {
    DSCPP_PROFILE_RANGE("model.blocks.*.mlp", index);
    mlp.backward(ps, dnorm, dres, [&](const Tensor& dst) { norm2.apply(ps, dst, x1_, st2_); });
    mlp.release();
  }
  norm2.backward_residual(ps, dres, dres, dnorm, x1_, st2_, g[1]);  // dres = d(x1)
  st2_.release();
  {
    DSCPP_PROFILE_RANGE("model.blocks.*.attn", index);
    attn.backward(ps, dnorm, dres, [&](const Tensor& dst) { norm1.apply(ps, dst, inp, st1_); }, s);
    attn.release();
  }
  norm1.backward_residual(ps, dres, dres, dnorm, inp, st1_, g[0]);  // dres = d(inp)
  if (row_grads.defined()) {
    tp.sum_row_partials(row_grads);
    norm1.add_grads(ps, g[0]);
    norm2.add_grads(ps, g[1]);
  }
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
