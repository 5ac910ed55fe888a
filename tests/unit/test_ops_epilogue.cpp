// The fused matmul + GELU ops (ops::matmul_bias_gelu_forward, ops::matmul_dgelu_backward), CPU reference, against
// double-precision scalar references written here with GPT-2's tanh GELU, 0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715
// x^3))), spelled in that form (our kernels use the equivalent x * sigmoid(2u)). Outputs are poisoned with NaN
// first. Also: bitwise agreement with the unfused ops they replace (so CPU training numerics are unchanged), the GELU
// MLP layer against the old op sequence bit for bit, and the checked entries' errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "dscpp/core/rng.h"
#include "dscpp/core/tensor.h"
#include "dscpp/kernels/ops.h"
#include "dscpp/nn/mlp.h"

using namespace dscpp;

namespace {

Tensor randn(const Shape& s, Rng& rng, float scale = 1.0f) {
  Tensor x = Tensor::empty(s, DType::f32);
  for (int64_t i = 0; i < x.numel(); i++) x.data<float>()[i] = scale * rng.normal();
  return x;
}

Tensor poisoned(const Shape& s) {
  Tensor x = Tensor::empty(s, DType::f32);
  x.fill(NAN);
  return x;
}

double gelu_ref(double x) {
  const double k = std::sqrt(2.0 / M_PI), u = k * (x + 0.044715 * x * x * x);
  return 0.5 * x * (1.0 + std::tanh(u));
}
double dgelu_ref(double x) {
  const double k = std::sqrt(2.0 / M_PI), th = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

// Worst |got - ref| / (atol + rtol |ref|) over the elements; > 1 fails. NaN anywhere fails.
void expect_close(const char* what, const Tensor& got, const std::vector<double>& ref, double tol) {
  ASSERT_EQ(got.numel(), int64_t(ref.size())) << what;
  double worst = 0;
  int64_t at = -1;
  for (int64_t i = 0; i < got.numel(); i++) {
    const double g = got.data<float>()[i];
    const double share = std::isnan(g) ? INFINITY : std::abs(g - ref[size_t(i)]) / (tol + tol * std::abs(ref[size_t(i)]));
    if (share > worst) worst = share, at = i;
  }
  EXPECT_LE(worst, 1.0) << what << ": worst at " << at << ": got " << got.data<float>()[at] << ", ref "
                        << ref[size_t(at)] << " (" << worst << " x the tolerance " << tol << ")";
}

void expect_same_bits(const char* what, const Tensor& a, const Tensor& b) {
  ASSERT_EQ(a.nbytes(), b.nbytes()) << what;
  EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << what << ": differs from the unfused ops";
}

struct Shape3 {
  int64_t N, C, F;
};
class Epilogue : public ::testing::TestWithParam<Shape3> {};

TEST_P(Epilogue, ForwardMatchesDoubleReference) {
  const auto [N, C, F] = GetParam();
  for (bool with_bias : {true, false}) {
    Rng rng(11);
    Tensor x = randn({N, C}, rng), w = randn({F, C}, rng, 0.5f), b = randn({F}, rng);
    Tensor out = poisoned({N, F}), pre = poisoned({N, F});
    ops::matmul_bias_gelu_forward(out, pre, x, w, with_bias ? b : Tensor());
    std::vector<double> rpre(size_t(N * F)), rout(size_t(N * F));
    for (int64_t n = 0; n < N; n++)
      for (int64_t f = 0; f < F; f++) {
        double acc = with_bias ? b.data<float>()[f] : 0.0;
        for (int64_t c = 0; c < C; c++) acc += double(x.data<float>()[n * C + c]) * w.data<float>()[f * C + c];
        rpre[size_t(n * F + f)] = acc;
        rout[size_t(n * F + f)] = gelu_ref(acc);
      }
    expect_close("pre", pre, rpre, 1e-5);
    expect_close("out", out, rout, 1e-5);
  }
}

TEST_P(Epilogue, BackwardMatchesDoubleReference) {
  const auto [N, C, F] = GetParam();
  (void)C;
  const int64_t OC = 5;  // the down projection maps F back to OC channels
  Rng rng(12);
  Tensor pre = randn({N, F}, rng, 2.0f), w = randn({OC, F}, rng, 0.5f), dy = randn({N, OC}, rng);
  Tensor dpre = poisoned({N, F});
  ops::matmul_dgelu_backward(dpre, dy, w, pre);
  std::vector<double> ref(size_t(N * F));
  for (int64_t n = 0; n < N; n++)
    for (int64_t f = 0; f < F; f++) {
      double acc = 0;
      for (int64_t o = 0; o < OC; o++) acc += double(dy.data<float>()[n * OC + o]) * w.data<float>()[o * F + f];
      ref[size_t(n * F + f)] = acc * dgelu_ref(pre.data<float>()[n * F + f]);
    }
  expect_close("dpre", dpre, ref, 1e-5);
}

TEST_P(Epilogue, BitwiseEqualToTheUnfusedOps) {
  const auto [N, C, F] = GetParam();
  Rng rng(13);
  Tensor x = randn({N, C}, rng), w = randn({F, C}, rng, 0.5f), b = randn({F}, rng);
  Tensor out = poisoned({N, F}), pre = poisoned({N, F}), out2 = poisoned({N, F}), pre2 = poisoned({N, F});
  ops::matmul_bias_gelu_forward(out, pre, x, w, b);
  ops::matmul_forward(pre2, x, w, b);
  ops::gelu_forward(out2, pre2);
  expect_same_bits("pre", pre, pre2);
  expect_same_bits("out", out, out2);

  Tensor w2 = randn({C, F}, rng), dy = randn({N, C}, rng);
  Tensor dpre = poisoned({N, F}), dact = poisoned({N, F});
  ops::matmul_dgelu_backward(dpre, dy, w2, pre);
  ops::matmul_backward(dact, Tensor(), Tensor(), dy, out, w2);
  ops::gelu_backward(dact, dact, pre);
  expect_same_bits("dpre", dpre, dact);
}

INSTANTIATE_TEST_SUITE_P(Shapes, Epilogue,
                         ::testing::Values(Shape3{1, 8, 8}, Shape3{7, 13, 33}, Shape3{33, 64, 256},
                                           Shape3{300, 48, 200}));  // the last one takes the parallel GELU path

// The GELU MLP (which now calls the fused ops) against the op sequence it used before, bit for bit: output, input
// gradient and every parameter gradient (accumulated onto non-zero gradients, as in gradient accumulation).
TEST(EpilogueMlp, SameBitsAsTheOldOpSequence) {
  const int64_t N = 9, C = 12, F = 40;
  Rng rng(14);
  ParamSet ps;
  Mlp m;
  m.kind = MlpKind::gelu;
  m.ffn = F;
  m.up = Linear::declare(ps, "c_fc", F, C, true);
  m.down = Linear::declare(ps, "c_proj", C, F, true);
  ps.materialize();
  for (int64_t i = 0; i < ps.flat_numel(); i++) ps.flat_params().data<float>()[i] = 0.3f * rng.normal();
  for (int64_t i = 0; i < ps.flat_numel(); i++) ps.flat_grads().data<float>()[i] = 0.1f * rng.normal();
  const Tensor grads0 = ps.flat_grads().clone();
  Tensor x = randn({N, C}, rng), dy = randn({N, C}, rng);

  Tensor out = poisoned({N, C}), dx = poisoned({N, C});
  m.forward(ps, out, x);
  m.backward(ps, dx, dy, x);
  const Tensor grads_new = ps.flat_grads().clone();

  // The old sequence (src/nn/mlp.cpp before the fused ops), from the same starting gradients.
  Tensor(ps.flat_grads()).copy_from(grads0);
  const Tensor wfc = m.up.weight(ps), bfc = m.up.bias(ps), wpr = m.down.weight(ps), bpr = m.down.bias(ps);
  Tensor pre = poisoned({N, F}), act = poisoned({N, F}), out2 = poisoned({N, C}), dact = poisoned({N, F});
  Tensor dx2 = poisoned({N, C});
  ops::matmul_forward(pre, x, wfc, bfc);
  ops::gelu_forward(act, pre);
  ops::matmul_forward(out2, act, wpr, bpr);
  ops::matmul_backward(dact, m.down.weight_grad(ps), m.down.bias_grad(ps), dy, act, wpr);
  ops::gelu_backward(dact, dact, pre);
  ops::matmul_backward(dx2, m.up.weight_grad(ps), m.up.bias_grad(ps), dact, x, wfc);

  expect_same_bits("out", out, out2);
  expect_same_bits("dinp", dx, dx2);
  expect_same_bits("parameter gradients", grads_new, ps.flat_grads());
}

TEST(EpilogueErrors, CheckedEntriesNameTheProblem) {
  Rng rng(15);
  Tensor x = randn({4, 8}, rng), w = randn({16, 8}, rng), b = randn({16}, rng);
  Tensor out = poisoned({4, 16}), pre = poisoned({4, 16});
  auto expect_error = [](const std::function<void()>& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "no error, expected one mentioning '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error([&] { ops::matmul_bias_gelu_forward(out, out, x, w, b); }, "distinct");
  expect_error([&] { ops::matmul_bias_gelu_forward(out, pre, x, w, randn({15}, rng)); }, "bias has shape");
  expect_error([&] { ops::matmul_bias_gelu_forward(poisoned({4, 15}), pre, x, w, b); }, "out has shape");
  expect_error([&] { ops::matmul_bias_gelu_forward(out, pre, x, randn({16, 7}, rng), b); }, "inp has shape");
  expect_error([&] { ops::matmul_bias_gelu_forward(out, pre, x.to(DType::bf16), w, b); }, "dtype");
  expect_error([&] { ops::matmul_bias_gelu_forward(out, pre, x, w, Tensor::empty({16}, DType::i32)); }, "dtype");
  Tensor dpre = poisoned({4, 16}), dy = randn({4, 8}, rng), w2 = randn({8, 16}, rng);
  expect_error([&] { ops::matmul_dgelu_backward(dpre, dy, w2, poisoned({4, 15})); }, "pre has shape");
  expect_error([&] { ops::matmul_dgelu_backward(dpre, randn({4, 7}, rng), w2, pre); }, "dout has shape");
  expect_error([&] { ops::matmul_dgelu_backward(dpre, dy, w2, Tensor()); }, "undefined");
}

}  // namespace
