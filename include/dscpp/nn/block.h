// Block: a pre-norm transformer block, shared by GPT-2 and Llama:
//   x1 = x + attn(norm1(x));  y = x1 + mlp(norm2(x1))
// The add that makes x1 runs fused with norm2 (one pass writes x1 and norm2(x1)); in backward each norm's input
// gradient is added to the skip path's in the same kernel (ops::fused_residual_*), so d(x1) and d(x) build in place.
// Kept for backward: x1, both norms' statistics and the sublayers' own tensors, not the norm outputs: backward
// rebuilds norm1(x) and norm2(x1) from x, x1 and the statistics (Norm::apply, one elementwise pass with the forward's
// bits) right before the qkv / up projection GEMM that reads them, and drops each after it: 2 C fewer values kept
// per token and block, for one [N, C] temporary at a time in backward.
// forward(save = false) frees its activations before returning (activation checkpointing keeps only x); backward
// then needs a forward(save = true) on the same input first, which recomputes them bit for bit.
#pragma once
#include "dscpp/nn/attention.h"
#include "dscpp/nn/mlp.h"
#include "dscpp/nn/norm.h"

namespace dscpp {

struct Block {
  Norm norm1;
  CausalSelfAttention attn;
  Norm norm2;
  Mlp mlp;
  int32_t index = -1;  // the block's position: names its profiler ranges ("model.blocks.<index>.attn" / ".mlp")

  // out[N,C] (=), out must not alias inp. Keeps activations for backward when `save`. Under sequence parallelism
  // (Note [Sequence parallelism]) inp, out and dres below hold this rank's rows only: [attn.tp.rows(N), C].
  void forward(const ParamSet& ps, const Tensor& out, const Tensor& inp, const SeqInfo& s, bool save);
  // In place on dres[N,C]: on entry d(out), on return d(inp). Parameter gradients (+=). Frees the activations.
  void backward(const ParamSet& ps, const Tensor& dres, const Tensor& inp, const SeqInfo& s);
  void release();
  bool saved() const { return x1_.defined(); }

 private:
  Tensor x1_;
  NormStats st1_, st2_;
};

}  // namespace dscpp
