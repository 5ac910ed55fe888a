// Analytic op costs.
//
// Note [FLOPs conventions]
// The profiler answers "how much arithmetic does a training step need", not "what did a kernel execute", so the
// counts are conventions chosen to match the figures people compare against:
// - MFU's numerator is the matmul work only (llm.c, PaLM, DeepSpeed's get_model_profile all do this in effect):
//   linear layers, the lm head and the two attention products. Elementwise work is reported as "other" FLOPs so
//   the total is visible but does not inflate MFU.
// - Backward = 2 x forward: for a matmul Y = X W, dX = dY W^T and dW = X^T dY each cost one forward; DeepSpeed
//   applies the same factor to every op (bwd FLOPS = 2 * fwd flops / bwd latency), and so do we.
// - Causal attention: a flash kernel skips the masked upper triangle, so QK^T and AV each cost T*T/2 dot products
//   of length D per head (llm.c's 6*L*C*T term per token, forward + backward). The exact triangle T(T+1)/2 differs
//   by 1/T; the full count (T*T, PaLM's 12*L*C*T) is AttentionCount::full.
// - Activation checkpointing repeats the checkpointed blocks' forward inside backward: that is hardware work,
//   kept apart (ModuleNode::recompute) so model FLOPs stay comparable across checkpointing policies.
// - Biases add 1 FLOP per output (DeepSpeed leaves them out; they are < 0.1% of a linear layer).
#include "dscpp/flops_profiler/flops.h"

#include "dscpp/core/check.h"

namespace dscpp::flops {

OpCost matmul(double M, double N, double K) {
  DSCPP_CHECK(M >= 0 && N >= 0 && K >= 0, "matmul FLOPs: negative size M=", M, " N=", N, " K=", K);
  OpCost c;
  c.macs = M * N * K;
  c.matmul_flops = 2.0 * c.macs;
  return c;
}

OpCost linear(int64_t tokens, int64_t in, int64_t out, bool bias) {
  OpCost c = matmul(double(tokens), double(out), double(in));
  if (bias) c.other_flops += kAdd * double(tokens) * double(out);
  return c;
}

OpCost attention(int64_t B, int64_t T, int64_t H, int64_t D, AttentionCount count) {
  DSCPP_CHECK(B >= 0 && T >= 0 && H >= 0 && D >= 0, "attention FLOPs: negative size");
  // Scores per head per sequence: all T*T, or the causal half.
  const double scores = count == AttentionCount::full ? double(T) * double(T) : double(T) * double(T) / 2.0;
  const double heads = double(B) * double(H);
  OpCost c;
  c.macs = 2.0 * heads * scores * double(D);  // QK^T and AV
  c.matmul_flops = 2.0 * c.macs;
  c.other_flops = kSoftmax * heads * scores;  // the 1/sqrt(D) scale is folded into the softmax
  return c;
}

static OpCost elementwise(double per_element, double elements) {
  OpCost c;
  c.other_flops = per_element * elements;
  return c;
}

OpCost layernorm(int64_t tokens, int64_t C) { return elementwise(kLayerNorm, double(tokens) * double(C)); }
OpCost rmsnorm(int64_t tokens, int64_t C) { return elementwise(kRmsNorm, double(tokens) * double(C)); }
OpCost gelu(int64_t tokens, int64_t F) { return elementwise(kGelu, double(tokens) * double(F)); }
OpCost swiglu(int64_t tokens, int64_t F) { return elementwise(kSwiglu, double(tokens) * double(F)); }
OpCost rope(int64_t tokens, int64_t H, int64_t Hkv, int64_t D) {
  return elementwise(kRope, double(tokens) * double(H + Hkv) * double(D));
}
OpCost softmax_crossentropy(int64_t tokens, int64_t V) { return elementwise(kSoftmax, double(tokens) * double(V)); }
OpCost add(int64_t elements) { return elementwise(kAdd, double(elements)); }

}  // namespace dscpp::flops
