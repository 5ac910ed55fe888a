// Analytic FLOPs of the ops our decoders run, forward and backward. See Note [FLOPs conventions] in
// src/flops_profiler/flops.cpp for why each count is what it is; in short:
// - a multiply-accumulate (MAC) is 2 FLOPs; matmul [M,K] x [K,N] is M*N*K MACs;
// - backward = 2 x forward for every op (DeepSpeed's flops profiler; exact for matmuls: dX and dW);
// - "matmul" FLOPs (weights and the two attention products) are the model FLOPs behind MFU; elementwise and
//   reduction work (norms, activations, softmax, rope, residual and bias adds) is counted apart as "other";
// - causal attention counts T*T/2 scores per head (llm.c: 6*L*C*T per token); AttentionCount::full counts T*T
//   (PaLM / nanoGPT: 12*L*C*T).
#pragma once
#include <cstdint>

namespace dscpp {

enum class AttentionCount : uint8_t { causal_half, full };

// Forward cost of one op. Backward is 2 x forward.
struct OpCost {
  double macs = 0;          // multiply-accumulates of matmuls
  double matmul_flops = 0;  // 2 * macs
  double other_flops = 0;   // elementwise / reduction FLOPs
  double fwd() const { return matmul_flops + other_flops; }
  double bwd() const { return 2.0 * fwd(); }
  OpCost& operator+=(const OpCost& o) {
    macs += o.macs;
    matmul_flops += o.matmul_flops;
    other_flops += o.other_flops;
    return *this;
  }
  OpCost scaled(double s) const { return {macs * s, matmul_flops * s, other_flops * s}; }
};

namespace flops {

// FLOPs per element of the elementwise ops (forward).
inline constexpr double kLayerNorm = 5;   // mean, centre, variance, normalise, affine (DeepSpeed's 5 with affine)
inline constexpr double kRmsNorm = 4;     // square, sum, scale, weight
inline constexpr double kGelu = 8;        // tanh approximation: x^3, two scales, add, tanh, add, two muls
inline constexpr double kSwiglu = 5;      // per output: silu(g) = g / (1 + exp(-g)) is 4, times up is 1
inline constexpr double kRope = 3;        // per rotated element: two muls and an add
inline constexpr double kSoftmax = 5;     // per score or logit: max, subtract, exp, sum, divide
inline constexpr double kAdd = 1;         // residual and bias adds

OpCost matmul(double M, double N, double K);                           // [M,K] x [K,N]
OpCost linear(int64_t tokens, int64_t in, int64_t out, bool bias);     // y[tokens,out] = x W^T (+ b)
// Scaled dot-product attention core of B sequences of T tokens, H query heads of size D: QK^T, softmax, AV.
// Grouped-query (fewer K/V heads) does not change it: each query head still attends over T keys.
OpCost attention(int64_t B, int64_t T, int64_t H, int64_t D, AttentionCount count);
OpCost layernorm(int64_t tokens, int64_t C);
OpCost rmsnorm(int64_t tokens, int64_t C);
OpCost gelu(int64_t tokens, int64_t F);
OpCost swiglu(int64_t tokens, int64_t F);                              // F = output width
OpCost rope(int64_t tokens, int64_t H, int64_t Hkv, int64_t D);        // on q and k
OpCost softmax_crossentropy(int64_t tokens, int64_t V);
OpCost add(int64_t elements);
inline OpCost embedding() { return {}; }                               // a lookup: 0 MACs, 0 FLOPs

}  // namespace flops
}  // namespace dscpp
