// Checked entry points of the weight-only quantization ops (quant_ops.h): the layout's shapes and dtypes (Note
// [Quantized weight layout]), one device, then cpu:: or cuda::.
#include <algorithm>
#include <string>
#include <vector>

#include "dscpp/kernels/ops.h"
#include "dscpp/kernels/quant_ops.h"
#include "kernels/cpu/cpu_kernels.h"
#ifdef DSCPP_WITH_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace dscpp::ops {
namespace {

std::string str(const Tensor& t) { return t.defined() ? t.str() : std::string("undefined"); }

void need(const char* op, const char* name, const Tensor& t, DType dt, const Shape& s, const Tensor& like) {
  DSCPP_CHECK(t.defined() && t.dtype() == dt && t.shape() == s && t.device() == like.device(), op, ": ", name, " is ",
              str(t), ", expected ", dtype_name(dt), " ", shape_str(s), " on ", like.device().str());
}

// A float tensor of the layer (w, inp, out): f32 on the CPU; f32, bf16 or f16 on CUDA.
void need_float(const char* op, const char* name, const Tensor& t, const Tensor& like) {
  const bool cuda = like.device().is_cuda();
  DSCPP_CHECK(t.defined() && t.device() == like.device() &&
                  (t.dtype() == DType::f32 || (cuda && (t.dtype() == DType::bf16 || t.dtype() == DType::f16))),
              op, ": ", name, " is ", str(t), ", expected ", cuda ? "f32, bf16 or f16" : "f32 (bf16 / f16 need CUDA)",
              " on ", like.device().str());
}

// w[OC, C] for int4 groups of `group` columns (group > 0) or int8 (group == 0).
void need_weight_shape(const char* op, int64_t OC, int64_t C, int64_t group) {
  DSCPP_CHECK(OC > 0 && C > 0, op, ": the weight is [", OC, ", ", C, "], expected a non-empty [OC, C]");
  DSCPP_CHECK(group >= 0 && group % 2 == 0 && (group == 0 || C % group == 0), op, ": group = ", group,
              " for C = ", C, ", expected 0 (int8) or an even divisor of C (int4)");
}

bool is_fp8(const Tensor& q) { return q.defined() && q.dtype() == DType::fp8_e4m3; }

// q, scale and zero of an [OC, C] weight (Note [Quantized weight layout]).
void need_quant(const char* op, const Tensor& q, const Tensor& scale, const Tensor& zero, int64_t group, int64_t OC,
                int64_t C, const Tensor& like) {
  need_weight_shape(op, OC, C, group);
  DSCPP_CHECK(!is_fp8(q) || group == 0, op, ": group = ", group, " with fp8 weights, expected 0 (one scale a row)");
  if (group == 0) {
    need(op, "q", q, is_fp8(q) ? DType::fp8_e4m3 : DType::i8, {OC, C}, like);
    need(op, "scale", scale, DType::f32, {OC}, like);
    DSCPP_CHECK(!zero.defined(), op, ": zero is ", str(zero), ", expected undefined for int8 and fp8 (group 0)");
    return;
  }
  need(op, "q", q, DType::i8, {OC, C / 2}, like);
  need(op, "scale", scale, DType::f32, {OC, C / group}, like);
  need(op, "zero", zero, DType::i8, {OC, C / group}, like);
}

// {OC, C} of the weight that q holds.
std::pair<int64_t, int64_t> quant_shape(const char* op, const Tensor& q, int64_t group) {
  DSCPP_CHECK(q.defined() && q.dim() == 2, op, ": q is ", str(q),
              ", expected i8 [OC, C] (int8), i8 [OC, C/2] (int4) or fp8_e4m3 [OC, C] (fp8)");
  return {q.size(0), group ? 2 * q.size(1) : q.size(1)};
}

// Note [fp8 matmul] on the host, as written there: the e4m3 codes of inp's rows and of the weight as f32 values, their
// f32 product (matmul_forward, no bias), then each element scaled by its row's and its column's scale, then the bias
// and the residual.
void fp8_reference(const Tensor& out, const Tensor& inp, const Tensor& q, const Tensor& scale, const Tensor& bias,
                   const Tensor& residual) {
  const int64_t OC = q.size(0), C = q.size(1), N = inp.numel() / C;
  std::vector<uint8_t> xq(size_t(N * C));
  Tensor sx = Tensor::empty({N}, DType::f32), xf = Tensor::empty({N, C}, DType::f32);
  Tensor wf = Tensor::empty({OC, C}, DType::f32);
  cpu::quantize_rows_fp8(xq.data(), sx.data<float>(), inp.data<float>(), N, C);
  const std::vector<float> ones(size_t(std::max(N, OC)), 1.0f);
  cpu::dequantize_weight_fp8(xf.data<float>(), xq.data(), ones.data(), N, C);
  cpu::dequantize_weight_fp8(wf.data<float>(), static_cast<const uint8_t*>(q.raw()), ones.data(), OC, C);
  Tensor acc = Tensor::empty({N, OC}, DType::f32);
  matmul_forward(acc, xf, wf, Tensor());
  const float *a = acc.data<float>(), *s = scale.data<float>(), *r = sx.data<float>();
  const float* b = bias.defined() ? bias.data<float>() : nullptr;
  const float* res = residual.defined() ? residual.data<float>() : nullptr;
  float* o = out.data<float>();
  for (int64_t n = 0; n < N; n++)
    for (int64_t c = 0; c < OC; c++) {
      float v = a[n * OC + c] * r[n] * s[c];
      if (b) v += b[c];
      if (res) v += res[n * OC + c];
      o[n * OC + c] = v;
    }
}

}  // namespace

void quantize_weight_int8(const Tensor& q, const Tensor& scale, const Tensor& w) {
  const char* op = "quantize_weight_int8";
  DSCPP_CHECK(w.defined() && w.dim() == 2, op, ": w is ", str(w), ", expected [OC, C]");
  need_float(op, "w", w, w);
  const int64_t OC = w.size(0), C = w.size(1);
  need_quant(op, q, scale, Tensor(), 0, OC, C, w);
#ifdef DSCPP_WITH_CUDA
  if (w.device().is_cuda()) return cuda::quantize_weight_int8(q, scale, w);
#endif
  cpu::quantize_weight_int8(q.data<int8_t>(), scale.data<float>(), w.data<float>(), OC, C);
}

void quantize_weight_int4(const Tensor& q, const Tensor& scale, const Tensor& zero, const Tensor& w, int64_t group) {
  const char* op = "quantize_weight_int4";
  DSCPP_CHECK(w.defined() && w.dim() == 2, op, ": w is ", str(w), ", expected [OC, C]");
  need_float(op, "w", w, w);
  DSCPP_CHECK(group > 0, op, ": group = ", group, ", expected a positive even divisor of C");
  const int64_t OC = w.size(0), C = w.size(1);
  need_quant(op, q, scale, zero, group, OC, C, w);
#ifdef DSCPP_WITH_CUDA
  if (w.device().is_cuda()) return cuda::quantize_weight_int4(q, scale, zero, w, group);
#endif
  cpu::quantize_weight_int4(static_cast<uint8_t*>(q.raw()), scale.data<float>(), static_cast<uint8_t*>(zero.raw()),
                            w.data<float>(), OC, C, group);
}

void quantize_weight_fp8(const Tensor& q, const Tensor& scale, const Tensor& w) {
  const char* op = "quantize_weight_fp8";
  DSCPP_CHECK(w.defined() && w.dim() == 2, op, ": w is ", str(w), ", expected [OC, C]");
  need_float(op, "w", w, w);
  const int64_t OC = w.size(0), C = w.size(1);
  need(op, "q", q, DType::fp8_e4m3, {OC, C}, w);
  need(op, "scale", scale, DType::f32, {OC}, w);
#ifdef DSCPP_WITH_CUDA
  if (w.device().is_cuda()) return cuda::quantize_weight_fp8(q, scale, w);
#endif
  cpu::quantize_rows_fp8(static_cast<uint8_t*>(q.raw()), scale.data<float>(), w.data<float>(), OC, C);
}

void dequantize_weight(const Tensor& w, const Tensor& q, const Tensor& scale, const Tensor& zero, int64_t group) {
  const char* op = "dequantize_weight";
  const auto [OC, C] = quant_shape(op, q, group);
  need_quant(op, q, scale, zero, group, OC, C, q);
  need_float(op, "w", w, q);
  DSCPP_CHECK(w.shape() == Shape({OC, C}), op, ": w is ", str(w), ", expected [", OC, ", ", C, "] (as q holds)");
#ifdef DSCPP_WITH_CUDA
  if (q.device().is_cuda()) return cuda::dequantize_weight(w, q, scale, zero, group);
#endif
  if (is_fp8(q))
    return cpu::dequantize_weight_fp8(w.data<float>(), static_cast<const uint8_t*>(q.raw()), scale.data<float>(), OC,
                                      C);
  if (group == 0) return cpu::dequantize_weight_int8(w.data<float>(), q.data<int8_t>(), scale.data<float>(), OC, C);
  cpu::dequantize_weight_int4(w.data<float>(), static_cast<const uint8_t*>(q.raw()), scale.data<float>(),
                              static_cast<const uint8_t*>(zero.raw()), OC, C, group);
}

void matmul_q_forward(const Tensor& out, const Tensor& inp, const Tensor& q, const Tensor& scale, const Tensor& zero,
                      int64_t group, const Tensor& bias, const Tensor& residual) {
  const char* op = "matmul_q_forward";
  const auto [OC, C] = quant_shape(op, q, group);
  need_quant(op, q, scale, zero, group, OC, C, q);
  need_float(op, "inp", inp, q);
  need_float(op, "out", out, q);
  const int64_t N = inp.numel() / C;
  DSCPP_CHECK(inp.dim() > 0 && inp.size(-1) == C && inp.numel() == N * C, op, ": inp is ", str(inp),
              ", expected [N, ", C, "] (C of the weight)");
  DSCPP_CHECK(out.numel() == N * OC && out.size(-1) == OC, op, ": out is ", str(out), ", expected [", N, ", ", OC,
              "]");
  DSCPP_CHECK(out.dtype() == DType::f32 || out.dtype() == inp.dtype(), op, ": out is ", dtype_name(out.dtype()),
              ", expected f32 or ", dtype_name(inp.dtype()), " (inp's dtype)");
  if (bias.defined())
    DSCPP_CHECK(bias.device() == q.device() && bias.numel() == OC && bias.dim() == 1 &&
                    (bias.dtype() == DType::f32 || bias.dtype() == inp.dtype()),
                op, ": bias is ", str(bias), ", expected f32 or ", dtype_name(inp.dtype()), " [", OC, "]");
  if (residual.defined())
    DSCPP_CHECK(residual.device() == q.device() && residual.dtype() == out.dtype() && residual.numel() == N * OC &&
                    residual.size(-1) == OC,
                op, ": residual is ", str(residual), ", expected out's dtype and shape (", str(out), ")");
#ifdef DSCPP_WITH_CUDA
  if (q.device().is_cuda()) return cuda::matmul_q_forward(out, inp, q, scale, zero, group, bias, residual);
#endif
  if (is_fp8(q)) return fp8_reference(out, inp, q, scale, bias, residual);
  // The reference is its definition: matmul_forward on the f32 dequantized weight.
  Tensor w = Tensor::empty({OC, C}, DType::f32);
  dequantize_weight(w, q, scale, zero, group);
  matmul_forward(out, inp, w, bias, residual);
}

}  // namespace dscpp::ops
