// Note [Imported int4 formats] (quant_formats.h): AWQ and GPTQ int4 linears repacked into quant_ops.h's layout.
#include "dscpp/inference/quant_formats.h"

#include <cstdint>

#include "dscpp/core/check.h"

namespace dscpp::inference {
namespace {

constexpr int kAwqColumn[8] = {0, 2, 4, 6, 1, 3, 5, 7};  // nibble i of an AWQ word holds column 8k + kAwqColumn[i]

uint32_t nibble(uint32_t word, int i) { return word >> (4 * i) & 15u; }

void need(const Tensor& t, DType dt, const Shape& shape, const std::string& name, const char* what) {
  DSCPP_CHECK(t.defined(), name, ".", what, ": missing");
  DSCPP_CHECK(t.dtype() == dt && t.shape() == shape, name, ".", what, ": ", dtype_name(t.dtype()), " ",
              shape_str(t.shape()), ", expected ", dtype_name(dt), " ", shape_str(shape));
}

// The scales as f32 [C/G, OC] and the group G, from their shape against C; checked.
Tensor scales_f32(const Tensor& scales, int64_t C, int64_t OC, const std::string& name, int64_t& group) {
  DSCPP_CHECK(scales.defined() && scales.dim() == 2 && scales.size(1) == OC && scales.size(0) > 0 &&
                  C % scales.size(0) == 0,
              name, ".scales: shape ", scales.defined() ? shape_str(scales.shape()) : "missing",
              ", expected [C/G, ", OC, "] for C = ", C);
  DSCPP_CHECK(dtype_is_float(scales.dtype()), name, ".scales: dtype ", dtype_name(scales.dtype()), ", expected f16");
  group = C / scales.size(0);
  DSCPP_CHECK(group % 2 == 0, name, ": group size ", group, " is odd; our int4 layout packs pairs within a group");
  return scales.to(DType::f32);
}

// Our tensors for [OC, C] in groups of G, filled by zero_of(g, o) and q_of(o, c), scale[o, g] = s[g, o].
template <typename Z, typename Q>
Int4Weight repack(const Tensor& s, int64_t OC, int64_t C, int64_t G, Z zero_of, Q q_of) {
  Int4Weight w;
  w.group = G;
  const int64_t groups = C / G;
  w.q = Tensor::empty({OC, C / 2}, DType::i8), w.scale = Tensor::empty({OC, groups}, DType::f32);
  w.zero = Tensor::empty({OC, groups}, DType::i8);
  const float* sp = s.data<float>();
  auto* q = reinterpret_cast<uint8_t*>(w.q.data<int8_t>());
  auto* z = reinterpret_cast<uint8_t*>(w.zero.data<int8_t>());
  float* sc = w.scale.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t o = 0; o < OC; o++) {
    for (int64_t g = 0; g < groups; g++) sc[o * groups + g] = sp[g * OC + o], z[o * groups + g] = zero_of(g, o);
    for (int64_t c = 0; c < C; c += 2) q[o * (C / 2) + c / 2] = uint8_t(q_of(o, c) | q_of(o, c + 1) << 4);
  }
  return w;
}

}  // namespace

Int4Weight import_awq(const Tensor& qweight, const Tensor& qzeros, const Tensor& scales, const std::string& name) {
  DSCPP_CHECK(qweight.defined() && qweight.dim() == 2, name, ".qweight: missing or not 2-D");
  const int64_t C = qweight.size(0), OC = qweight.size(1) * 8;
  int64_t G = 0;
  const Tensor s = scales_f32(scales, C, OC, name, G);
  need(qweight, DType::i32, {C, OC / 8}, name, "qweight");
  need(qzeros, DType::i32, {C / G, OC / 8}, name, "qzeros");
  const auto* qw = reinterpret_cast<const uint32_t*>(qweight.data<int32_t>());
  const auto* qz = reinterpret_cast<const uint32_t*>(qzeros.data<int32_t>());
  // Column o sits in word o / 8 at the nibble i with kAwqColumn[i] == o % 8.
  int awq_nibble[8];
  for (int i = 0; i < 8; i++) awq_nibble[kAwqColumn[i]] = i;
  return repack(
      s, OC, C, G, [&](int64_t g, int64_t o) { return uint8_t(nibble(qz[g * (OC / 8) + o / 8], awq_nibble[o % 8])); },
      [&](int64_t o, int64_t c) { return nibble(qw[c * (OC / 8) + o / 8], awq_nibble[o % 8]); });
}

Int4Weight import_gptq(const Tensor& qweight, const Tensor& qzeros, const Tensor& scales, const Tensor& g_idx,
                       bool zeros_minus_one, const std::string& name) {
  DSCPP_CHECK(qweight.defined() && qweight.dim() == 2, name, ".qweight: missing or not 2-D");
  const int64_t C = qweight.size(0) * 8, OC = qweight.size(1);
  int64_t G = 0;
  const Tensor s = scales_f32(scales, C, OC, name, G);
  need(qweight, DType::i32, {C / 8, OC}, name, "qweight");
  need(qzeros, DType::i32, {C / G, OC / 8}, name, "qzeros");
  if (g_idx.defined()) {
    need(g_idx, DType::i32, {C}, name, "g_idx");
    const int32_t* gi = g_idx.data<int32_t>();
    for (int64_t c = 0; c < C; c++)
      DSCPP_CHECK(gi[c] == c / G, name, ".g_idx[", c, "] = ", gi[c], ", not ", c / G,
                  ": an act-order (desc_act) GPTQ checkpoint, which needs its inputs permuted at run time; not "
                  "supported: quantize without desc_act, or use `dscpp quantize` on the original model");
  }
  const auto* qw = reinterpret_cast<const uint32_t*>(qweight.data<int32_t>());
  const auto* qz = reinterpret_cast<const uint32_t*>(qzeros.data<int32_t>());
  const uint32_t plus = zeros_minus_one ? 1 : 0;
  return repack(
      s, OC, C, G, [&](int64_t g, int64_t o) { return uint8_t(nibble(qz[g * (OC / 8) + o / 8], int(o % 8)) + plus); },
      [&](int64_t o, int64_t c) { return nibble(qw[(c / 8) * OC + o], int(c % 8)); });
}

}  // namespace dscpp::inference
