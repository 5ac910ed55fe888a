// The weight-only quantization ops on the CPU (quant_ops.h, Note [Quantized weight layout]): a hand-computed int8
// and int4 example (values, scales, zero points, the packing order: the even column in the low nibble, groups of
// zeros and of one repeated value), the round-trip bound |w - dequant(q)| <= scale / 2 on random weights, and
// matmul_q_forward against matmul_forward on the dequantized weight and against a double-precision scalar sum.
// Outputs are poisoned first; inputs are never all zeros except where a zero group is the point.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "dscpp/core/half.h"
#include "dscpp/core/rng.h"
#include "dscpp/core/tensor.h"
#include "dscpp/kernels/ops.h"
#include "dscpp/kernels/quant_ops.h"

using namespace dscpp;

namespace {

Tensor from(const Shape& s, const std::vector<float>& v) {
  Tensor t = Tensor::empty(s, DType::f32);
  std::memcpy(t.raw(), v.data(), v.size() * sizeof(float));
  return t;
}

Tensor poisoned(const Shape& s, DType t) {
  Tensor x = Tensor::empty(s, t);
  std::memset(x.raw(), 0xFF, size_t(x.numel()) * dtype_size(t));  // NaN in f32; 255 / -1 in the bytes
  return x;
}

Tensor randn(const Shape& s, Rng& rng, float scale = 1.0f) {
  Tensor x = Tensor::empty(s, DType::f32);
  for (int64_t i = 0; i < x.numel(); i++) x.data<float>()[i] = scale * rng.normal();
  return x;
}

std::vector<int> bytes(const Tensor& t) {
  std::vector<int> b;
  for (int64_t i = 0; i < t.numel(); i++) b.push_back(static_cast<const uint8_t*>(t.raw())[i]);
  return b;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// w[OC, C] quantized as int8 (group 0) or int4 (groups of `group`), outputs poisoned first.
struct Quantized {
  Tensor q, scale, zero;
};
Quantized quantize(const Tensor& w, int64_t group) {
  const int64_t OC = w.size(0), C = w.size(1), groups = group ? C / group : 1;
  Quantized r{poisoned({OC, group ? C / 2 : C}, DType::i8),
              poisoned(group ? Shape{OC, groups} : Shape{OC}, DType::f32),
              group ? poisoned({OC, groups}, DType::i8) : Tensor()};
  if (group) ops::quantize_weight_int4(r.q, r.scale, r.zero, w, group);
  else ops::quantize_weight_int8(r.q, r.scale, w);
  return r;
}

TEST(QuantOps, Int8HandExample) {
  // Row 0: absmax 2.54, scale 0.02; row 1: all zeros, scale 0 and q 0.
  Tensor w = from({2, 4}, {2.54f, -1.0f, 0.5f, 0.02f, 0, 0, 0, 0});
  Tensor q = poisoned({2, 4}, DType::i8), scale = poisoned({2}, DType::f32);
  ops::quantize_weight_int8(q, scale, w);
  EXPECT_EQ(scale.data<float>()[0], 2.54f / 127.0f);
  EXPECT_EQ(scale.data<float>()[1], 0.0f);
  const std::vector<int8_t> want = {127, -50, 25, 1, 0, 0, 0, 0};
  for (int i = 0; i < 8; i++) EXPECT_EQ(q.data<int8_t>()[i], want[size_t(i)]) << "element " << i;
  Tensor back = poisoned({2, 4}, DType::f32);
  ops::dequantize_weight(back, q, scale, Tensor(), 0);
  for (int i = 0; i < 8; i++) EXPECT_EQ(back.data<float>()[i], float(want[size_t(i)]) * scale.data<float>()[i / 4]);
}

TEST(QuantOps, Int4HandExample) {
  // Groups of 4. Row 0, group 0: range [-1.5, 3], scale 0.3, zero 5, q = 0 5 10 15 -> bytes 0x50 0xFA (the even
  // column in the low nibble). Row 0, group 1: 2.0 four times: range [0, 2], scale 2/15, zero 0, q 15. Row 1,
  // group 0: zeros (scale 0, zero 0, q 0); group 1: -0.75 four times: range [-0.75, 0], scale 0.05, zero 15, q 0.
  Tensor w = from({2, 8}, {-1.5f, 0, 1.5f, 3.0f, 2, 2, 2, 2, 0, 0, 0, 0, -0.75f, -0.75f, -0.75f, -0.75f});
  Tensor q = poisoned({2, 4}, DType::i8), scale = poisoned({2, 2}, DType::f32), zero = poisoned({2, 2}, DType::i8);
  ops::quantize_weight_int4(q, scale, zero, w, 4);
  EXPECT_EQ(bytes(q), (std::vector<int>{0x50, 0xFA, 0xFF, 0xFF, 0x00, 0x00, 0x00, 0x00}));
  EXPECT_EQ(bytes(zero), (std::vector<int>{5, 0, 0, 15}));
  const float* s = scale.data<float>();
  EXPECT_EQ(s[0], 4.5f / 15.0f);
  EXPECT_EQ(s[1], 2.0f / 15.0f);
  EXPECT_EQ(s[2], 0.0f);
  EXPECT_EQ(s[3], 0.75f / 15.0f);
  Tensor back = poisoned({2, 8}, DType::f32);
  ops::dequantize_weight(back, q, scale, zero, 4);
  const float* b = back.data<float>();
  const std::vector<float> want = {-5 * s[0], 0, 5 * s[0], 10 * s[0], 15 * s[1], 15 * s[1], 15 * s[1], 15 * s[1],
                                   0,         0, 0,        0,         -15 * s[3], -15 * s[3], -15 * s[3], -15 * s[3]};
  for (int i = 0; i < 16; i++) {
    EXPECT_EQ(b[i], want[size_t(i)]) << "element " << i;
    EXPECT_NEAR(b[i], w.data<float>()[i], 1e-6) << "element " << i;  // this example's values are on the grid
  }
}

// |w - dequant(q)| <= scale / 2 (up to the f32 rounding of w / scale and of the product) on random weights, some
// rows scaled far apart and one row with a single large value.
TEST(QuantOps, RoundTripWithinHalfAStep) {
  Rng rng(7);
  const int64_t OC = 9, C = 256;
  Tensor w = randn({OC, C}, rng);
  for (int64_t c = 0; c < C; c++) w.data<float>()[2 * C + c] *= 1e-3f, w.data<float>()[3 * C + c] *= 50.0f;
  w.data<float>()[4 * C + 17] = 40.0f;
  for (int64_t group : {int64_t(0), int64_t(64), int64_t(128)}) {
    const int64_t G = group ? group : C, groups = C / G;
    const auto [q, scale, zero] = quantize(w, group);
    Tensor back = poisoned({OC, C}, DType::f32);
    ops::dequantize_weight(back, q, scale, zero, group);
    double worst = 0;
    for (int64_t o = 0; o < OC; o++)
      for (int64_t c = 0; c < C; c++) {
        const double s = scale.data<float>()[o * groups + c / G], x = w.data<float>()[o * C + c];
        const double err = std::fabs(x - back.data<float>()[o * C + c]);
        ASSERT_LE(err, s / 2 * (1 + 1e-5) + 1e-7 * std::fabs(x)) << "group " << group << " at " << o << ", " << c;
        worst = std::max(worst, err / s);
      }
    EXPECT_GT(worst, 0.3) << "group " << group << ": the bound is checked on errors that reach it";
  }
}

TEST(QuantOps, MatmulEqualsMatmulOnTheDequantizedWeight) {
  Rng rng(8);
  const int64_t N = 5, C = 256, OC = 19;
  Tensor inp = randn({N, C}, rng), w = randn({OC, C}, rng, 0.05f), bias = randn({OC}, rng),
         residual = randn({N, OC}, rng);
  for (int64_t group : {int64_t(0), int64_t(128), int64_t(64)}) {
    const auto [q, scale, zero] = quantize(w, group);
    Tensor deq = poisoned({OC, C}, DType::f32);
    ops::dequantize_weight(deq, q, scale, zero, group);
    Tensor got = poisoned({N, OC}, DType::f32), want = poisoned({N, OC}, DType::f32);
    ops::matmul_q_forward(got, inp, q, scale, zero, group, bias, residual);
    ops::matmul_forward(want, inp, deq, bias, residual);
    for (int64_t i = 0; i < N * OC; i++) {
      ASSERT_EQ(got.data<float>()[i], want.data<float>()[i]) << "group " << group << " at " << i;
      double ref = double(bias.data<float>()[i % OC]) + residual.data<float>()[i];
      for (int64_t c = 0; c < C; c++)
        ref += double(inp.data<float>()[i / OC * C + c]) * deq.data<float>()[i % OC * C + c];
      EXPECT_NEAR(got.data<float>()[i], ref, 1e-5 * (1 + std::fabs(ref))) << "group " << group << " at " << i;
    }
    // In place on the residual, as matmul_forward allows.
    Tensor acc = residual.clone();
    ops::matmul_q_forward(acc, inp, q, scale, zero, group, bias, acc);
    EXPECT_EQ(std::memcmp(acc.raw(), want.raw(), size_t(N * OC) * sizeof(float)), 0) << "group " << group;
  }
}

// fp8 (Note [Quantized weight layout], Note [fp8 matmul]): a row's absmax maps to 448 exactly, a zero row has scale
// 0 and codes 0, every weight comes back within half an e4m3 step (2^-4 relative above e4m3's smallest normal,
// 2^-10 of the scale below it), and the matmul is its definition, summed here in double from codes made by
// core/half.h's conversion: the activations quantized per row too, unlike the weight-only formats.
TEST(QuantOps, Fp8WeightsAndActivations) {
  Rng rng(11);
  const int64_t OC = 9, C = 64, N = 3;
  Tensor w = randn({OC, C}, rng, 0.05f);
  w.narrow0(4, 1).fill(0.0f);  // row 4: zeros
  Tensor q = poisoned({OC, C}, DType::fp8_e4m3), scale = poisoned({OC}, DType::f32);
  ops::quantize_weight_fp8(q, scale, w);
  Tensor back = poisoned({OC, C}, DType::f32);
  ops::dequantize_weight(back, q, scale, Tensor(), 0);
  const uint8_t* code = static_cast<const uint8_t*>(q.raw());
  for (int64_t o = 0; o < OC; o++) {
    float amax = 0;
    for (int64_t c = 0; c < C; c++) amax = std::max(amax, std::fabs(w.data<float>()[o * C + c]));
    const float s = scale.data<float>()[o];
    EXPECT_EQ(s, amax / 448.0f) << "row " << o;
    for (int64_t c = 0; c < C; c++) {
      const float x = w.data<float>()[o * C + c], y = back.data<float>()[o * C + c];
      if (o == 4) {
        EXPECT_EQ(code[o * C + c], 0) << c;
        EXPECT_EQ(y, 0.0f) << c;
        continue;
      }
      EXPECT_LE(std::fabs(x - y), std::max(std::fabs(x) * 0x1p-4f, s * 0x1p-10f)) << "row " << o << " col " << c;
      if (std::fabs(x) == amax) {
        EXPECT_EQ(fp8_e4m3::to_float(code[o * C + c]), x < 0 ? -448.0f : 448.0f);
      }
    }
  }
  Tensor inp = randn({N, C}, rng), bias = randn({OC}, rng), residual = randn({N, OC}, rng);
  Tensor got = poisoned({N, OC}, DType::f32);
  ops::matmul_q_forward(got, inp, q, scale, Tensor(), 0, bias, residual);
  Tensor dense = poisoned({N, OC}, DType::f32);
  ops::matmul_forward(dense, inp, back, bias, residual);
  double diff_dense = 0;
  for (int64_t n = 0; n < N; n++) {
    float amax = 0;
    for (int64_t c = 0; c < C; c++) amax = std::max(amax, std::fabs(inp.data<float>()[n * C + c]));
    const float inv = 448.0f / amax;
    for (int64_t o = 0; o < OC; o++) {
      double sum = 0;
      for (int64_t c = 0; c < C; c++)
        sum += double(fp8_e4m3::to_float(fp8_e4m3::from_float(inp.data<float>()[n * C + c] * inv))) *
               fp8_e4m3::to_float(code[o * C + c]);
      const double ref = sum * (amax / 448.0f) * scale.data<float>()[o] + bias.data<float>()[o] +
                         residual.data<float>()[n * OC + o];
      const float g = got.data<float>()[n * OC + o];
      EXPECT_NEAR(g, ref, 1e-5 * (1 + std::fabs(ref))) << "row " << n << " out " << o;
      diff_dense = std::max(diff_dense, std::fabs(g - double(dense.data<float>()[n * OC + o])));
    }
  }
  // The activations' rounding shows against the weight-only product, within e4m3's precision of it.
  EXPECT_GT(diff_dense, 0.0);
  EXPECT_LT(diff_dense, 0.05);
  EXPECT_NE(error_of([&] { ops::dequantize_weight(back, q, scale, Tensor(), 32); }).find("with fp8 weights"),
            std::string::npos);
}

TEST(QuantOps, ChecksSayWhatIsWrong) {
  Rng rng(9);
  Tensor w = randn({4, 96}, rng);
  Tensor q = Tensor::empty({4, 48}, DType::i8), scale = Tensor::empty({4, 3}, DType::f32),
         zero = Tensor::empty({4, 3}, DType::i8);
  EXPECT_NE(error_of([&] { ops::quantize_weight_int4(q, scale, zero, w, 64); }).find("even divisor of C"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ops::quantize_weight_int4(q, Tensor::empty({4, 2}, DType::f32), zero, w, 32); })
                .find("scale is"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ops::quantize_weight_int4(Tensor::empty({4, 48}, DType::f32), scale, zero, w, 32); })
                .find("q is"),
            std::string::npos);
  ops::quantize_weight_int4(q, scale, zero, w, 32);
  EXPECT_NE(error_of([&] {
              ops::matmul_q_forward(Tensor::empty({2, 4}, DType::f32), Tensor::empty({2, 64}, DType::f32), q, scale,
                                    zero, 32, Tensor());
            }).find("inp is"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ops::dequantize_weight(Tensor::empty({4, 96}, DType::f32), q, scale, Tensor(), 32); })
                .find("zero is"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ops::dequantize_weight(Tensor::empty({4, 96}, DType::bf16), q, scale, zero, 32); })
                .find("need CUDA"),
            std::string::npos);
}

}  // namespace
