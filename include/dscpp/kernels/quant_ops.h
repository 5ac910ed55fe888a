// The op contracts of weight-only quantized matmuls (a Linear's weight w[OC, C] stored in 8 or 4 bits, activations
// in floating point), in the conventions of ops.h (shape letters, "(=)" overwrites). Each has a CPU reference
// (src/kernels/cpu/quant.cpp, f32) and a CUDA twin (src/kernels/cuda/quant.cu); every tensor of a call is on one
// device.
//
// Note [Quantized weight layout]
// int8, symmetric per output channel:  q i8 [OC, C], scale f32 [OC];  w[o, c] = q[o, c] * scale[o].
// int4, asymmetric per group of G consecutive columns (G even, C % G == 0; G = 128 by default):
//   q i8 [OC, C/2] holds unsigned bytes, two weights each along C: the low nibble is the even column 2j, the high
//   nibble column 2j + 1, each in 0..15;  scale f32 [OC, C/G];  zero i8 [OC, C/G] an unsigned zero point in 0..15;
//   w[o, c] = (q[o, c] - zero[o, c / G]) * scale[o, c / G]   (the integer difference first, then one f32 product).
// The core has no u8 dtype, so the packed bytes and zero points travel as i8; readers reinterpret them as uint8_t.
// Quantization rounds to nearest (ties to even). int8: scale = absmax / 127, q = clamp(rint(w / scale), -127, 127).
// int4: over each group, lo = min(min w, 0), hi = max(max w, 0) (the range holds 0, as GPTQ's does, so the zero
// point is an integer in 0..15 without clamping away part of the group), scale = (hi - lo) / 15,
// zero = clamp(rint(-lo / scale), 0, 15), q = clamp(rint(w / scale) + zero, 0, 15): |w - dequant(q)| <= scale / 2.
// A row (int8) or group (int4) of zeros has scale 0, zero 0 and q 0 (no division by zero; it dequantizes to 0).
// fp8 (OCP e4m3), symmetric per output channel:  q fp8_e4m3 [OC, C], scale f32 [OC];  w[o, c] = float(q[o, c]) *
//   scale[o];  scale = absmax / 448, q = e4m3(w * (448 / absmax)) rounded to nearest even (core/half.h's fp8_e4m3).
//   Told apart from int8 by q's dtype (group 0 for both). Its matmul quantizes the activations too: Note [fp8 matmul].
//
// Note [fp8 matmul] (W8A8 with dynamic per-token scales, as vLLM's and TensorRT-LLM's fp8 on Hopper): each input row
// n is quantized on the fly exactly as a weight row is, sx[n] = absmax(x[n]) / 448, xq[n, c] = e4m3(x[n, c] * (448 /
// absmax(x[n]))), and out[n, o] = (sum_c xq[n, c] * q[o, c]) * sx[n] * scale[o] + bias[o] + residual[n, o], the sum
// in f32. The two-operand fp8 product is what Hopper's fp8 tensor cores compute at twice bf16's rate (cuBLASLt with
// per-row and per-column scale vectors); the decode GEMV computes the same sum with both operands in e4m3.
#pragma once
#include <cstdint>

#include "dscpp/core/tensor.h"

namespace dscpp::ops {

// q[OC,C] (=), scale[OC] (=) of w[OC,C] (f32; f32, bf16 or f16 on CUDA).
void quantize_weight_int8(const Tensor& q, const Tensor& scale, const Tensor& w);
// q[OC,C/2] (=), scale[OC,C/G] (=), zero[OC,C/G] (=) of w[OC,C] (f32; f32, bf16 or f16 on CUDA), G = group.
void quantize_weight_int4(const Tensor& q, const Tensor& scale, const Tensor& zero, const Tensor& w,
                          int64_t group = 128);
// q[OC,C] (=, fp8_e4m3), scale[OC] (=) of w[OC,C] (f32; f32, bf16 or f16 on CUDA).
void quantize_weight_fp8(const Tensor& q, const Tensor& scale, const Tensor& w);
// w[OC,C] (=) = dequant(q): fp8 when q is fp8_e4m3, int8 when group == 0 (zero undefined), else int4 with groups of
// `group` columns.
// w is f32 (f32, bf16 or f16 on CUDA).
void dequantize_weight(const Tensor& w, const Tensor& q, const Tensor& scale, const Tensor& zero, int64_t group);
// out[N,OC] (=) = inp[N,C] @ dequant(q)^T + bias[OC] + residual[N,OC], exactly matmul_forward on the f32 dequantized
// weight (int8: group 0, zero undefined; int4: group G); fp8 (group 0) quantizes inp's rows too (Note [fp8
// matmul]). inp and out f32 (f32, bf16 or f16 on CUDA, out f32 or inp's dtype); bias f32 or inp's dtype, residual
// out's, both optional; residual may be out itself.
// CUDA: N <= 4 takes a decode GEMV that dequantizes in registers (Note [Quantized GEMV], quant.cu); more rows
// dequantize into a scratch weight of inp's dtype and run matmul_forward. fp8: bf16 rows up to 4 take the fp8 decode
// GEMV (Note [fp8 decode GEMV]), more rows cuBLASLt's fp8 GEMM (Note [fp8 GEMM]).
void matmul_q_forward(const Tensor& out, const Tensor& inp, const Tensor& q, const Tensor& scale, const Tensor& zero,
                      int64_t group, const Tensor& bias, const Tensor& residual = Tensor());

}  // namespace dscpp::ops
