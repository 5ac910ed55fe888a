// CPU reference ops (include/dscpp/kernels/ops.h) against plain double-precision scalar references written here, on
// random odd shapes. Forward: the f32 kernel vs the double reference. Backward: the f32 kernel vs central finite
// differences (in double) of the double reference, projected on a random cotangent R (loss = sum R * f(x)).
// Outputs are poisoned with NaN first, so an element a kernel forgets to write fails the comparison.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "dscpp/core/rng.h"
#include "dscpp/core/tensor.h"
#include "dscpp/kernels/ops.h"
#include "cpu_op_checks.h"

using namespace dscpp;
using namespace dscpp::op_checks;

namespace {

// ---- double-precision references ----
Vec matmul_ref(const Vec& x, const Vec& w, const Vec* b, int64_t N, int64_t C, int64_t OC) {
  Vec y(size_t(N * OC));
  for (int64_t n = 0; n < N; n++)
    for (int64_t o = 0; o < OC; o++) {
      double s = b ? (*b)[size_t(o)] : 0.0;
      for (int64_t c = 0; c < C; c++) s += x[size_t(n * C + c)] * w[size_t(o * C + c)];
      y[size_t(n * OC + o)] = s;
    }
  return y;
}

Vec layernorm_ref(const Vec& x, const Vec& w, const Vec* b, int64_t N, int64_t C, double eps, Vec* mean = nullptr,
                  Vec* rstd = nullptr) {
  Vec y(x.size());
  for (int64_t n = 0; n < N; n++) {
    double m = 0, v = 0;
    for (int64_t c = 0; c < C; c++) m += x[size_t(n * C + c)];
    m /= double(C);
    for (int64_t c = 0; c < C; c++) v += (x[size_t(n * C + c)] - m) * (x[size_t(n * C + c)] - m);
    v /= double(C);
    const double r = 1 / std::sqrt(v + eps);
    for (int64_t c = 0; c < C; c++)
      y[size_t(n * C + c)] = (x[size_t(n * C + c)] - m) * r * w[size_t(c)] + (b ? (*b)[size_t(c)] : 0.0);
    if (mean) mean->push_back(m);
    if (rstd) rstd->push_back(r);
  }
  return y;
}

Vec rmsnorm_ref(const Vec& x, const Vec& w, int64_t N, int64_t C, double eps, Vec* rstd = nullptr) {
  Vec y(x.size());
  for (int64_t n = 0; n < N; n++) {
    double ss = 0;
    for (int64_t c = 0; c < C; c++) ss += x[size_t(n * C + c)] * x[size_t(n * C + c)];
    const double r = 1 / std::sqrt(ss / double(C) + eps);
    for (int64_t c = 0; c < C; c++) y[size_t(n * C + c)] = x[size_t(n * C + c)] * r * w[size_t(c)];
    if (rstd) rstd->push_back(r);
  }
  return y;
}

double gelu1(double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }
double silu1(double x) { return x / (1 + std::exp(-x)); }

Vec map(const Vec& x, double (*f)(double)) {
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); i++) y[i] = f(x[i]);
  return y;
}

Vec swiglu_ref(const Vec& gu, int64_t N, int64_t F) {
  Vec y(size_t(N * F));
  for (int64_t n = 0; n < N; n++)
    for (int64_t f = 0; f < F; f++) y[size_t(n * F + f)] = silu1(gu[size_t(n * 2 * F + f)]) * gu[size_t(n * 2 * F + F + f)];
  return y;
}

Vec rope_ref(Vec x, const std::vector<int32_t>& pos, int64_t H, int64_t Hkv, int64_t D, double theta) {
  const int64_t row = (H + 2 * Hkv) * D, half = D / 2;
  for (size_t n = 0; n < pos.size(); n++)
    for (int64_t h = 0; h < H + Hkv; h++)
      for (int64_t i = 0; i < half; i++) {
        const double a = pos[n] * std::pow(theta, -2.0 * double(i) / double(D));
        double& x1 = x[n * size_t(row) + size_t(h * D + i)];
        double& x2 = x[n * size_t(row) + size_t(h * D + i + half)];
        const double y1 = x1 * std::cos(a) - x2 * std::sin(a), y2 = x2 * std::cos(a) + x1 * std::sin(a);
        x1 = y1;
        x2 = y2;
      }
  return x;
}

// Causal GQA attention on packed qkv[B,T,(H+2Hkv)*D] -> out[B,T,H*D], lse[B,H,T].
Vec attention_ref(const Vec& qkv, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, Vec* lse = nullptr) {
  const int64_t R = (H + 2 * Hkv) * D, G = H / Hkv;
  Vec out(size_t(B * T * H * D));
  if (lse) lse->assign(size_t(B * H * T), 0);
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t t = 0; t < T; t++) {
        const double* q = &qkv[size_t((b * T + t) * R + h * D)];
        Vec s(size_t(t + 1));
        double mx = -INFINITY;
        for (int64_t j = 0; j <= t; j++) {
          const double* k = &qkv[size_t((b * T + j) * R + (H + h / G) * D)];
          double d = 0;
          for (int64_t c = 0; c < D; c++) d += q[c] * k[c];
          s[size_t(j)] = d / std::sqrt(double(D));
          mx = std::max(mx, s[size_t(j)]);
        }
        double sum = 0;
        for (double& v : s) sum += (v = std::exp(v - mx));
        for (int64_t j = 0; j <= t; j++) {
          const double* v = &qkv[size_t((b * T + j) * R + (H + Hkv + h / G) * D)];
          for (int64_t c = 0; c < D; c++) out[size_t((b * T + t) * H * D + h * D + c)] += s[size_t(j)] / sum * v[c];
        }
        if (lse) (*lse)[size_t((b * H + h) * T + t)] = mx + std::log(sum);
      }
  return out;
}

Vec crossentropy_ref(const Vec& logits, const std::vector<int32_t>& targets, int64_t V, int64_t Vp) {
  Vec loss(targets.size());
  for (size_t n = 0; n < targets.size(); n++) {
    if (targets[n] < 0) continue;
    const double* x = &logits[n * size_t(Vp)];
    double mx = -INFINITY, s = 0;
    for (int64_t v = 0; v < V; v++) mx = std::max(mx, x[v]);
    for (int64_t v = 0; v < V; v++) s += std::exp(x[v] - mx);
    loss[n] = mx + std::log(s) - x[targets[n]];
  }
  return loss;
}

}  // namespace

// ---------------------------------------------------------------- embedding
TEST(Embedding, ForwardGathersRows) {
  Rng rng(1);
  const int64_t V = 11, C = 13;
  std::vector<int32_t> ids = {3, 0, 10, 3, 7, 3, 1};
  Tensor table = randn({V, C}, rng), out = poisoned({7, C});
  ops::embedding_forward(out, ints(ids), table);
  Vec tv = dvec(table), want;
  for (int32_t id : ids) want.insert(want.end(), tv.begin() + id * C, tv.begin() + (id + 1) * C);
  expect_close(out, want, 0, 0, "embedding_forward");
}

TEST(Embedding, BackwardAccumulatesRepeatedIds) {
  Rng rng(2);
  const int64_t V = 11, C = 13;
  std::vector<int32_t> ids = {3, 0, 10, 3, 7, 3, 1};
  Tensor dtable = randn({V, C}, rng), dout = randn({7, C}, rng);
  Vec want = dvec(dtable), dv = dvec(dout);
  for (size_t n = 0; n < ids.size(); n++)
    for (int64_t c = 0; c < C; c++) want[size_t(ids[n] * C + c)] += dv[n * C + size_t(c)];
  ops::embedding_backward(dtable, dout, ints(ids));
  expect_close(dtable, want, 1e-6, 1e-6, "embedding_backward");
}

TEST(Embedding, RejectsOutOfRangeIds) {
  Rng rng(3);
  Tensor table = randn({5, 4}, rng), out = poisoned({2, 4});
  expect_error([&] { ops::embedding_forward(out, ints({1, 5}), table); }, {"embedding_forward", "ids[1] = 5", "[0, 5)"});
}

// ---------------------------------------------------------------- matmul
TEST(Matmul, ForwardF32MatchesReference) {
  Rng rng(10);
  const int64_t N = 7, C = 13, OC = 11;
  Tensor inp = randn({1, N, C}, rng), w = randn({OC, C}, rng), b = randn({OC}, rng);
  Vec x = dvec(inp), wv = dvec(w), bv = dvec(b);
  Tensor out = poisoned({1, N, OC});
  ops::matmul_forward(out, inp, w, b);
  expect_close(out, matmul_ref(x, wv, &bv, N, C, OC), 1e-5, 1e-5, "matmul_forward with bias");
  Tensor out2 = poisoned({N, OC});
  ops::matmul_forward(out2, inp, w, Tensor());
  expect_close(out2, matmul_ref(x, wv, nullptr, N, C, OC), 1e-5, 1e-5, "matmul_forward without bias");
}

TEST(Matmul, BackwardMatchesFiniteDifferences) {
  Rng rng(11);
  const int64_t N = 7, C = 13, OC = 11;
  Tensor inp = randn({N, C}, rng), w = randn({OC, C}, rng), b = randn({OC}, rng), dout = randn({N, OC}, rng);
  Tensor dinp = poisoned({N, C}), dw = randn({OC, C}, rng), db = randn({OC}, rng);
  Vec x = dvec(inp), wv = dvec(w), bv = dvec(b), r = dvec(dout), dw0 = dvec(dw), db0 = dvec(db);
  ops::matmul_backward(dinp, dw, db, dout, inp, w);
  expect_close(dinp, fd_grad(x, [&](const Vec& v) { return proj(r, matmul_ref(v, wv, &bv, N, C, OC)); }), 1e-5, 1e-4,
               "matmul_backward dinp (=)");
  expect_close(dw, plus(dw0, fd_grad(wv, [&](const Vec& v) { return proj(r, matmul_ref(x, v, &bv, N, C, OC)); })),
               1e-5, 1e-4, "matmul_backward dweight (+=)");
  expect_close(db, plus(db0, fd_grad(bv, [&](const Vec& v) { return proj(r, matmul_ref(x, wv, &v, N, C, OC)); })),
               1e-5, 1e-4, "matmul_backward dbias (+=)");

  // Undefined dinp and dbias are skipped; dweight still accumulates.
  Tensor dw2 = Tensor::zeros({OC, C}, DType::f32);
  ops::matmul_backward(Tensor(), dw2, Tensor(), dout, inp, w);
  Vec dw_only = fd_grad(wv, [&](const Vec& v) { return proj(r, matmul_ref(x, v, nullptr, N, C, OC)); });
  expect_close(dw2, dw_only, 1e-5, 1e-4, "matmul_backward dweight with dinp, dbias undefined");
}

// bf16/f16 inputs: against the exact double product of the rounded inputs, and against the f32 inputs with an error
// bound of 2u * sum|x*w| (input rounding) + u * |y| (output rounding), u = the dtype's unit roundoff.
TEST(Matmul, LowPrecisionInputsMatchF32Reference) {
  const int64_t N = 300, C = 37, OC = 260;  // more than one 256-row block of inp and of weight
  for (DType t : {DType::bf16, DType::f16}) {
    const double u = t == DType::bf16 ? 1.0 / 256 : 1.0 / 2048;  // 2^-8 / 2^-11: half an ulp at 1, doubled
    for (bool out_lowp : {false, true})
      for (int bias_mode : {0, 1, 2}) {  // none, f32, same dtype
        Rng rng(12);
        Tensor inp32 = randn({N, C}, rng), w32 = randn({OC, C}, rng), b32 = randn({OC}, rng);
        Tensor inp = inp32.to(t), w = w32.to(t);
        Tensor b = bias_mode == 0 ? Tensor() : bias_mode == 1 ? b32 : b32.to(t);
        Tensor out = poisoned({N, OC}, out_lowp ? t : DType::f32);
        ops::matmul_forward(out, inp, w, b);
        const std::string what = std::string("matmul_forward ") + dtype_name(t) + " -> " + dtype_name(out.dtype()) +
                                 " bias mode " + std::to_string(bias_mode);
        Vec bv = b.defined() ? dvec(b) : Vec();
        Vec exact = matmul_ref(dvec(inp), dvec(w), b.defined() ? &bv : nullptr, N, C, OC);
        expect_close(out, exact, 1e-4, out_lowp ? u : 1e-5, what + " vs rounded inputs");
        // vs the unrounded f32 inputs, element by element
        Vec x = dvec(inp32), wv = dvec(w32), bf = dvec(b32), y = dvec(out);
        Vec full = matmul_ref(x, wv, bias_mode ? &bf : nullptr, N, C, OC);
        double worst = 0;
        size_t wi = 0;
        for (int64_t n = 0; n < N; n++)
          for (int64_t o = 0; o < OC; o++) {
            double mag = bias_mode ? std::fabs(bf[size_t(o)]) : 0.0;
            for (int64_t c = 0; c < C; c++) mag += std::fabs(x[size_t(n * C + c)] * wv[size_t(o * C + c)]);
            const size_t i = size_t(n * OC + o);
            const double bound = 1.01 * u * mag + (out_lowp ? u * std::fabs(full[i]) : 0.0) + 1e-5;
            const double ratio = std::isfinite(y[i]) ? std::fabs(y[i] - full[i]) / bound : INFINITY;
            if (ratio > worst) worst = ratio, wi = i;
          }
        EXPECT_LE(worst, 1.0) << what << " vs f32 inputs: worst at [" << wi << "] got " << y[wi] << ", want "
                              << full[wi] << " (" << worst << "x the bound)";
      }
  }
}

TEST(Matmul, RejectsMismatchedShapesAndDtypes) {
  Rng rng(13);
  Tensor inp = randn({7, 13}, rng), w = randn({11, 12}, rng), out = poisoned({7, 11});
  expect_error([&] { ops::matmul_forward(out, inp, w, Tensor()); }, {"matmul_forward", "inp", "[7, 13]", "[7, 12]"});
  Tensor w16 = randn({11, 13}, rng).to(DType::bf16);
  expect_error([&] { ops::matmul_forward(out, inp, w16, Tensor()); }, {"matmul_forward", "weight", "bf16", "f32"});
}

TEST(Gemm, AllTransposesMatchReference) {
  const int64_t M = 7, N = 5, K = 13;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.0f, 0.3f}) {
        Rng rng(14);
        Tensor a = randn(ta ? Shape{K, M} : Shape{M, K}, rng), b = randn(tb ? Shape{N, K} : Shape{K, N}, rng);
        Tensor c = beta == 0.0f ? poisoned({M, N}) : randn({M, N}, rng);
        Vec av = dvec(a), bv = dvec(b), c0 = dvec(c), want(size_t(M * N));
        for (int64_t i = 0; i < M; i++)
          for (int64_t j = 0; j < N; j++) {
            double s = 0;
            for (int64_t k = 0; k < K; k++)
              s += av[size_t(ta ? k * M + i : i * K + k)] * bv[size_t(tb ? j * K + k : k * N + j)];
            want[size_t(i * N + j)] = 0.7 * s + (beta == 0.0f ? 0.0 : beta * c0[size_t(i * N + j)]);
          }
        ops::gemm(c, a, ta, b, tb, 0.7f, beta);
        expect_close(c, want, 1e-5, 1e-5,
                     "gemm ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) + " beta=" + std::to_string(beta));
      }
}

// ---------------------------------------------------------------- normalisation
TEST(LayerNorm, ForwardMatchesReference) {
  Rng rng(20);
  const int64_t N = 7, C = 13;
  Tensor x = randn({N, C}, rng, 2.0f, 0.5f), w = randn({C}, rng), b = randn({C}, rng);
  Tensor out = poisoned({N, C}), mean = poisoned({N}), rstd = poisoned({N});
  ops::layernorm_forward(out, mean, rstd, x, w, b, 1e-5f);
  Vec bv = dvec(b), m, r;
  Vec want = layernorm_ref(dvec(x), dvec(w), &bv, N, C, 1e-5, &m, &r);
  expect_close(out, want, 1e-5, 1e-5, "layernorm_forward out");
  expect_close(mean, m, 1e-6, 1e-5, "layernorm_forward mean");
  expect_close(rstd, r, 1e-6, 1e-5, "layernorm_forward rstd");
  // No bias, no saved statistics (inference).
  Tensor out2 = poisoned({N, C});
  ops::layernorm_forward(out2, Tensor(), Tensor(), x, w, Tensor(), 1e-5f);
  expect_close(out2, layernorm_ref(dvec(x), dvec(w), nullptr, N, C, 1e-5), 1e-5, 1e-5, "layernorm_forward no bias");
}

TEST(LayerNorm, BackwardMatchesFiniteDifferences) {
  Rng rng(21);
  const int64_t N = 7, C = 13;
  const double eps = 1e-5;
  Tensor x = randn({N, C}, rng, 2.0f, 0.5f), w = randn({C}, rng), b = randn({C}, rng), dout = randn({N, C}, rng);
  Tensor out = poisoned({N, C}), mean = poisoned({N}), rstd = poisoned({N});
  ops::layernorm_forward(out, mean, rstd, x, w, b, float(eps));
  Tensor dx = poisoned({N, C}), dw = randn({C}, rng), db = randn({C}, rng);
  Vec xv = dvec(x), wv = dvec(w), bv = dvec(b), r = dvec(dout), dw0 = dvec(dw), db0 = dvec(db);
  ops::layernorm_backward(dx, dw, db, dout, x, w, mean, rstd);
  expect_close(dx, fd_grad(xv, [&](const Vec& v) { return proj(r, layernorm_ref(v, wv, &bv, N, C, eps)); }), 1e-4,
               1e-4, "layernorm_backward dinp");
  expect_close(dw, plus(dw0, fd_grad(wv, [&](const Vec& v) { return proj(r, layernorm_ref(xv, v, &bv, N, C, eps)); })),
               1e-4, 1e-4, "layernorm_backward dweight (+=)");
  expect_close(db, plus(db0, fd_grad(bv, [&](const Vec& v) { return proj(r, layernorm_ref(xv, wv, &v, N, C, eps)); })),
               1e-4, 1e-4, "layernorm_backward dbias (+=)");
}

TEST(RmsNorm, ForwardMatchesReference) {
  Rng rng(22);
  const int64_t N = 7, C = 13;
  Tensor x = randn({N, C}, rng, 1.5f, 0.3f), w = randn({C}, rng), out = poisoned({N, C}), rstd = poisoned({N});
  ops::rmsnorm_forward(out, rstd, x, w, 1e-6f);
  Vec r;
  Vec want = rmsnorm_ref(dvec(x), dvec(w), N, C, 1e-6, &r);
  expect_close(out, want, 1e-5, 1e-5, "rmsnorm_forward out");
  expect_close(rstd, r, 1e-6, 1e-5, "rmsnorm_forward rstd");
}

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  Rng rng(23);
  const int64_t N = 7, C = 13;
  const double eps = 1e-6;
  Tensor x = randn({N, C}, rng, 1.5f, 0.3f), w = randn({C}, rng), dout = randn({N, C}, rng);
  Tensor out = poisoned({N, C}), rstd = poisoned({N});
  ops::rmsnorm_forward(out, rstd, x, w, float(eps));
  Tensor dx = poisoned({N, C}), dw = randn({C}, rng);
  Vec xv = dvec(x), wv = dvec(w), r = dvec(dout), dw0 = dvec(dw);
  ops::rmsnorm_backward(dx, dw, dout, x, w, rstd);
  expect_close(dx, fd_grad(xv, [&](const Vec& v) { return proj(r, rmsnorm_ref(v, wv, N, C, eps)); }), 1e-4, 1e-4,
               "rmsnorm_backward dinp");
  expect_close(dw, plus(dw0, fd_grad(wv, [&](const Vec& v) { return proj(r, rmsnorm_ref(xv, v, N, C, eps)); })), 1e-4,
               1e-4, "rmsnorm_backward dweight (+=)");
}

TEST(Norm, BackwardIsDeterministic) {
  Rng rng(24);
  const int64_t N = 4099, C = 37;  // large enough for the parallel path
  Tensor x = randn({N, C}, rng), w = randn({C}, rng), b = randn({C}, rng), dout = randn({N, C}, rng);
  Tensor out = poisoned({N, C}), mean = poisoned({N}), rstd = poisoned({N});
  ops::layernorm_forward(out, mean, rstd, x, w, b, 1e-5f);
  Tensor dx1 = poisoned({N, C}), dx2 = poisoned({N, C}), dw1 = Tensor::zeros({C}, DType::f32), dw2 = dw1.clone();
  Tensor db1 = Tensor::zeros({C}, DType::f32), db2 = db1.clone();
  ops::layernorm_backward(dx1, dw1, db1, dout, x, w, mean, rstd);
  ops::layernorm_backward(dx2, dw2, db2, dout, x, w, mean, rstd);
  EXPECT_TRUE(bitwise_equal(dx1, dx2) && bitwise_equal(dw1, dw2) && bitwise_equal(db1, db2));
  Vec want(size_t(C), 0.0), dv = dvec(dout);
  for (int64_t n = 0; n < N; n++)
    for (int64_t c = 0; c < C; c++) want[size_t(c)] += dv[size_t(n * C + c)];
  expect_close(db1, want, 1e-3, 1e-4, "layernorm_backward dbias over 4099 rows");
}

// ---------------------------------------------------------------- activations
TEST(Gelu, ForwardMatchesGpt2GeluNew) {
  Rng rng(30);
  Tensor x = randn({7, 13}, rng, 2.5f), out = poisoned({7, 13});
  x.data<float>()[0] = -30.0f;  // saturated tails: exp overflow must give 0 and x, not NaN
  x.data<float>()[1] = 30.0f;
  ops::gelu_forward(out, x);
  expect_close(out, map(dvec(x), gelu1), 1e-6, 1e-5, "gelu_forward");
}

TEST(Gelu, BackwardMatchesFiniteDifferencesInPlace) {
  Rng rng(31);
  Tensor x = randn({7, 13}, rng, 2.5f), dout = randn({7, 13}, rng);
  Vec xv = dvec(x), r = dvec(dout);
  Tensor d = dout.clone();
  ops::gelu_backward(d, d, x);  // dinp aliases dout
  expect_close(d, fd_grad(xv, [&](const Vec& v) { return proj(r, map(v, gelu1)); }), 1e-5, 1e-4,
               "gelu_backward (dinp aliases dout)");
}

TEST(Silu, ForwardAndBackward) {
  Rng rng(32);
  Tensor x = randn({7, 13}, rng, 3.0f), dout = randn({7, 13}, rng), out = poisoned({7, 13}), dx = poisoned({7, 13});
  ops::silu_forward(out, x);
  expect_close(out, map(dvec(x), silu1), 1e-6, 1e-5, "silu_forward");
  ops::silu_backward(dx, dout, x);
  Vec r = dvec(dout);
  expect_close(dx, fd_grad(dvec(x), [&](const Vec& v) { return proj(r, map(v, silu1)); }), 1e-5, 1e-4,
               "silu_backward");
}

TEST(Swiglu, ForwardAndBackward) {
  Rng rng(33);
  const int64_t N = 7, F = 11;
  Tensor gu = randn({N, 2 * F}, rng, 2.0f), dout = randn({N, F}, rng);
  Tensor out = poisoned({N, F}), dgu = poisoned({N, 2 * F});
  ops::swiglu_forward(out, gu);
  expect_close(out, swiglu_ref(dvec(gu), N, F), 1e-6, 1e-5, "swiglu_forward");
  ops::swiglu_backward(dgu, dout, gu);
  Vec r = dvec(dout);
  expect_close(dgu, fd_grad(dvec(gu), [&](const Vec& v) { return proj(r, swiglu_ref(v, N, F)); }), 1e-5, 1e-4,
               "swiglu_backward");
}

TEST(Swiglu, PairBlocksReadTheInterleavedLayout) {
  Rng rng(34);
  const int64_t N = 3, F = 12;
  Tensor gu = randn({N, 2 * F}, rng, 2.0f);
  const Vec want = swiglu_ref(dvec(gu), N, F);
  for (int64_t k : {1, 4, 12}) {
    // [gate | up] rearranged into F/k blocks of [k gate | k up]
    Tensor inter = poisoned({N, 2 * F}), out = poisoned({N, F});
    for (int64_t n = 0; n < N; n++)
      for (int64_t f = 0; f < F; f++) {
        const int64_t at = n * 2 * F + f / k * 2 * k + f % k;
        inter.data<float>()[at] = gu.data<float>()[n * 2 * F + f];
        inter.data<float>()[at + k] = gu.data<float>()[n * 2 * F + F + f];
      }
    ops::swiglu_forward(out, inter, k);
    expect_close(out, want, 1e-6, 1e-5, "swiglu_forward pair_block " + std::to_string(k));
  }
  EXPECT_THROW(ops::swiglu_forward(poisoned({N, F}), gu, 5), Error);
}

// ---------------------------------------------------------------- elementwise
TEST(Elementwise, ResidualAddScaleSumSquares) {
  Rng rng(40);
  const int64_t n = 100003;  // odd, and large enough for the parallel path
  Tensor a = randn({n}, rng), b = randn({n}, rng), out = poisoned({n});
  Vec av = dvec(a), bv = dvec(b);
  ops::residual_forward(out, a, b);
  expect_close(out, plus(av, bv), 1e-6, 1e-6, "residual_forward");
  Tensor a2 = a.clone();
  ops::residual_forward(a2, a2, b);  // out aliases a
  expect_close(a2, plus(av, bv), 1e-6, 1e-6, "residual_forward in place");
  Tensor acc = a.clone();
  ops::add_inplace(acc, b);
  expect_close(acc, plus(av, bv), 1e-6, 1e-6, "add_inplace");
  ops::scale_inplace(acc, -0.25f);
  Vec want = plus(av, bv);
  for (double& v : want) v *= -0.25;
  expect_close(acc, want, 1e-6, 1e-6, "scale_inplace");
  double ss = 0;
  for (double v : av) ss += v * v;
  EXPECT_NEAR(ops::sum_squares(a), ss, 1e-12 * ss);
  EXPECT_EQ(ops::sum_squares(a), ops::sum_squares(a));  // deterministic
  Tensor small = randn({7}, rng);
  double ss7 = 0;
  for (double v : dvec(small)) ss7 += v * v;
  EXPECT_NEAR(ops::sum_squares(small), ss7, 1e-14 * ss7);
}

TEST(Elementwise, SumBlocksAddsTheBlocksAndScales) {
  Rng rng(43);
  for (int64_t blocks : {1, 3, 4}) {
    const int64_t n = 40000 + 7;  // past the parallel threshold, odd
    Tensor in = randn({blocks * n}, rng), out = Tensor::empty({n}, DType::f32);
    out.fill(std::nanf(""));  // poison: every element must be written
    ops::sum_blocks(out, in, 0.5f);
    const Vec iv = dvec(in);
    Vec want(size_t(n), 0.0);
    for (int64_t j = 0; j < blocks; j++)
      for (int64_t i = 0; i < n; i++) want[size_t(i)] += iv[size_t(j * n + i)];
    for (double& v : want) v *= 0.5;
    expect_close(out, want, 1e-6, 1e-6, "sum_blocks");
  }
  Tensor in = randn({10}, rng), out = Tensor::empty({4}, DType::f32);
  expect_error([&] { ops::sum_blocks(out, in, 1.0f); }, {"sum_blocks", "10 elements", "blocks of out's 4"});
}

TEST(Elementwise, AddSumAccumulatesTheScaledSum) {
  Rng rng(44);
  Tensor x = randn({1001}, rng), acc = Tensor::empty({1}, DType::f32);
  acc.data<float>()[0] = 1.5f;
  double s = 0;
  for (double v : dvec(x)) s += v;
  ops::add_sum(acc, x, 0.25f);
  EXPECT_NEAR(acc.data<float>()[0], 1.5 + 0.25 * s, 1e-5);
  ops::add_sum(acc, x, -0.25f);  // accumulates: back where it started
  EXPECT_NEAR(acc.data<float>()[0], 1.5, 1e-5);
  Tensor two = Tensor::empty({2}, DType::f32), half = x.to(DType::bf16);
  expect_error([&] { ops::add_sum(two, x, 1.0f); }, {"add_sum", "acc has 2 elements, expected 1"});
  expect_error([&] { ops::add_sum(acc, half, 1.0f); }, {"add_sum", "x"});
}

TEST(Elementwise, AddSumSquaresAccumulatesTheSquares) {
  Rng rng(45);
  Tensor x = randn({3001}, rng), acc = Tensor::empty({1}, DType::f32);
  acc.data<float>()[0] = 2.0f;
  double s = 0;
  for (double v : dvec(x)) s += v * v;
  ops::add_sum_squares(acc, x);
  EXPECT_NEAR(acc.data<float>()[0], 2.0 + s, 1e-6 * s);
  ops::add_sum_squares(acc, x);  // accumulates
  EXPECT_NEAR(acc.data<float>()[0], 2.0 + 2 * s, 2e-6 * s);
  x.data<float>()[7] = std::numeric_limits<float>::infinity();  // an overflow survives into the sum
  ops::add_sum_squares(acc, x);
  EXPECT_TRUE(std::isinf(acc.data<float>()[0]));
  Tensor two = Tensor::empty({2}, DType::f32), ints = Tensor::empty({3}, DType::i32);
  expect_error([&] { ops::add_sum_squares(two, x); }, {"add_sum_squares", "acc has 2 elements, expected 1"});
  expect_error([&] { ops::add_sum_squares(acc, ints); }, {"add_sum_squares", "x"});
}

TEST(Elementwise, RejectsMismatchedNumel) {
  Rng rng(41);
  Tensor a = randn({7}, rng), b = randn({8}, rng);
  expect_error([&] { ops::add_inplace(a, b); }, {"add_inplace", "x", "[8]", "7 elements"});
  Tensor i = Tensor::empty({7}, DType::i32);
  expect_error([&] { ops::gelu_forward(i, a); }, {"gelu_forward", "out", "i32", "f32"});
}

// ---------------------------------------------------------------- rope
namespace {
struct RopeCase {
  int64_t B = 2, T = 5, H = 6, Hkv = 2, D = 8;
  float theta = 10000.0f;
  std::vector<int32_t> pos;
  int64_t row() const { return (H + 2 * Hkv) * D; }
  explicit RopeCase(Rng& rng) {
    for (int64_t i = 0; i < B * T; i++) pos.push_back(int32_t(rng.below(100)));
  }
};
}  // namespace

TEST(Rope, ForwardMatchesReferenceAndLeavesVAlone) {
  Rng rng(50);
  RopeCase k(rng);
  Tensor qkv = randn({k.B, k.T, k.row()}, rng), orig = qkv.clone();
  ops::rope_forward(qkv, ints(k.pos), k.H, k.Hkv, k.D, k.theta);
  expect_close(qkv, rope_ref(dvec(orig), k.pos, k.H, k.Hkv, k.D, k.theta), 2e-5, 1e-5, "rope_forward");
  for (int64_t n = 0; n < k.B * k.T; n++) {  // the v heads are not rotated (bitwise)
    const int64_t v0 = n * k.row() + (k.H + k.Hkv) * k.D;
    EXPECT_EQ(std::memcmp(qkv.data<float>() + v0, orig.data<float>() + v0, size_t(k.Hkv * k.D) * 4), 0) << n;
  }
}

TEST(Rope, BackwardInvertsForwardAndMatchesFiniteDifferences) {
  Rng rng(51);
  RopeCase k(rng);
  Tensor x = randn({k.B * k.T, k.row()}, rng), y = x.clone();
  ops::rope_forward(y, ints(k.pos), k.H, k.Hkv, k.D, k.theta);
  ops::rope_backward(y, ints(k.pos), k.H, k.Hkv, k.D, k.theta);
  expect_close(y, dvec(x), 1e-6, 1e-6, "rope_backward(rope_forward(x)) == x");
  Tensor d = randn({k.B * k.T, k.row()}, rng);
  Vec r = dvec(d);
  ops::rope_backward(d, ints(k.pos), k.H, k.Hkv, k.D, k.theta);
  expect_close(d, fd_grad(dvec(x), [&](const Vec& v) { return proj(r, rope_ref(v, k.pos, k.H, k.Hkv, k.D, k.theta)); }),
               2e-5, 1e-5, "rope_backward");
}

// Llama 3.1's rope scaling, against Hugging Face's _compute_llama3_parameters written out here in double: long
// wavelengths slowed by the factor, short ones kept, the band between interpolated. Llama 3.2 1B's parameters
// (D 64, theta 500000, factor 32, 1 / 4, 8192) put frequencies in all three bands.
TEST(Rope, Llama3ScalingFollowsHuggingFace) {
  const RopeScaling sc{32.0f, 1.0f, 4.0f, 8192.0f};
  const int D = 64;
  const double theta = 500000.0, pi = 3.14159265358979323846;
  int low = 0, high = 0, mid = 0;
  std::vector<double> want(D / 2);
  for (int i = 0; i < D / 2; i++) {
    const double f = std::pow(theta, -2.0 * i / D), wavelen = 2 * pi / f;
    if (wavelen > 8192.0 / 1.0) {
      want[size_t(i)] = f / 32.0, low++;
    } else if (wavelen < 8192.0 / 4.0) {
      want[size_t(i)] = f, high++;
    } else {
      const double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
      want[size_t(i)] = (1 - smooth) * f / 32.0 + smooth * f, mid++;
    }
    EXPECT_NEAR(rope_inv_freq(i, D, float(theta), sc), want[size_t(i)], 2e-6 * want[size_t(i)]) << "i = " << i;
    // HF's f32 powf and our correctly rounded power may differ in the last bit (kernels/rope_params.h).
    const float hf = 1.0f / powf(float(theta), float(2 * i) / float(D));
    EXPECT_NEAR(rope_inv_freq(i, D, float(theta), RopeScaling{}), hf, 2.5e-7f * hf) << "i = " << i;
  }
  EXPECT_GT(low, 0);
  EXPECT_GT(high, 0);
  EXPECT_GT(mid, 0);
  // The op rotates by those frequencies: q and k heads of a GQA row at positions up to 2000.
  const int64_t H = 4, Hkv = 2, N = 6, row = (H + 2 * Hkv) * D;
  const std::vector<int32_t> pos{0, 1, 17, 511, 1024, 1999};
  Rng rng(52);
  Tensor qkv = randn({N, row}, rng), orig = qkv.clone();
  ops::rope_forward(qkv, ints(pos), H, Hkv, D, RopeParams(float(theta), sc));
  Vec ref = dvec(orig);
  for (int64_t n = 0; n < N; n++)
    for (int64_t h = 0; h < H + Hkv; h++)
      for (int64_t i = 0; i < D / 2; i++) {
        const double a = pos[size_t(n)] * want[size_t(i)];
        double& x1 = ref[size_t(n * row + h * D + i)];
        double& x2 = ref[size_t(n * row + h * D + i + D / 2)];
        const double y1 = x1 * std::cos(a) - x2 * std::sin(a), y2 = x2 * std::cos(a) + x1 * std::sin(a);
        x1 = y1, x2 = y2;
      }
  expect_close(qkv, ref, 5e-4, 5e-4, "rope_forward with llama3 scaling");  // f32 angles at positions ~2000
  ops::rope_backward(qkv, ints(pos), H, Hkv, D, RopeParams(float(theta), sc));
  expect_close(qkv, dvec(orig), 1e-5, 1e-5, "rope_backward inverts it");
  EXPECT_THROW(ops::rope_forward(qkv, ints(pos), H, Hkv, D, RopeParams(float(theta), RopeScaling{8.0f, 4.0f, 1.0f, 8192.0f})),
               Error) << "high_freq_factor must exceed low_freq_factor";
}

// ---------------------------------------------------------------- attention
TEST(Attention, ForwardMatchesReference) {
  for (int64_t Hkv : {2, 3, 6})
    for (int64_t T : {5, 17}) {
      Rng rng(60 + uint64_t(Hkv * 100 + T));
      const int64_t B = 2, H = 6, D = 8;
      Tensor qkv = randn({B, T, (H + 2 * Hkv) * D}, rng), out = poisoned({B, T, H * D}), lse = poisoned({B, H, T});
      ops::attention_forward(out, lse, qkv, B, T, H, Hkv, D);
      Vec l;
      Vec want = attention_ref(dvec(qkv), B, T, H, Hkv, D, &l);
      const std::string what = "attention_forward Hkv=" + std::to_string(Hkv) + " T=" + std::to_string(T);
      expect_close(out, want, 1e-5, 1e-4, what + " out");
      expect_close(lse, l, 1e-5, 1e-5, what + " lse");
    }
}

TEST(Attention, BackwardMatchesFiniteDifferences) {
  for (int64_t Hkv : {2, 3, 6}) {
    Rng rng(70 + uint64_t(Hkv));
    const int64_t B = 2, T = 9, H = 6, D = 8;
    Tensor qkv = randn({B, T, (H + 2 * Hkv) * D}, rng), out = poisoned({B, T, H * D}), lse = poisoned({B, H, T});
    ops::attention_forward(out, lse, qkv, B, T, H, Hkv, D);
    Tensor dout = randn({B, T, H * D}, rng), dqkv = poisoned({B, T, (H + 2 * Hkv) * D});
    ops::attention_backward(dqkv, dout, qkv, out, lse, B, T, H, Hkv, D);
    Vec r = dvec(dout);
    expect_close(dqkv,
                 fd_grad(dvec(qkv), [&](const Vec& v) { return proj(r, attention_ref(v, B, T, H, Hkv, D)); }), 1e-5,
                 1e-4, "attention_backward Hkv=" + std::to_string(Hkv));
    Tensor again = poisoned({B, T, (H + 2 * Hkv) * D});
    ops::attention_backward(again, dout, qkv, out, lse, B, T, H, Hkv, D);
    EXPECT_TRUE(bitwise_equal(dqkv, again)) << "attention_backward is not deterministic, Hkv=" << Hkv;
  }
}

TEST(Attention, IsCausal) {
  Rng rng(80);
  const int64_t B = 1, T = 11, H = 6, Hkv = 3, D = 8, R = (H + 2 * Hkv) * D, t0 = 6;
  Tensor qkv = randn({B, T, R}, rng), out1 = poisoned({B, T, H * D}), lse1 = poisoned({B, H, T});
  ops::attention_forward(out1, lse1, qkv, B, T, H, Hkv, D);
  Tensor qkv2 = qkv.clone();
  for (int64_t i = t0 * R; i < (t0 + 1) * R; i++) qkv2.data<float>()[i] += 1.0f;  // change token t0's q, k and v
  Tensor out2 = poisoned({B, T, H * D}), lse2 = poisoned({B, H, T});
  ops::attention_forward(out2, lse2, qkv2, B, T, H, Hkv, D);
  const float* a = out1.data<float>();
  const float* b = out2.data<float>();
  EXPECT_EQ(std::memcmp(a, b, size_t(t0 * H * D) * 4), 0) << "an output before t0 changed";
  for (int64_t t = t0; t < T; t++)
    EXPECT_NE(std::memcmp(a + t * H * D, b + t * H * D, size_t(H * D) * 4), 0) << "output " << t << " did not change";
}

// GQA equals MHA with every kv head repeated for its group; the kv gradients are the group sums of the MHA ones.
TEST(Attention, GroupedMatchesMhaWithRepeatedKvHeads) {
  for (int64_t Hkv : {1, 2, 3, 6}) {
    Rng rng(90 + uint64_t(Hkv));
    const int64_t B = 2, T = 7, H = 6, D = 8, G = H / Hkv, Rg = (H + 2 * Hkv) * D, Rm = 3 * H * D;
    Tensor qkv = randn({B, T, Rg}, rng), mha = Tensor::empty({B, T, Rm}, DType::f32);
    for (int64_t n = 0; n < B * T; n++) {
      const float* s = qkv.data<float>() + n * Rg;
      float* d = mha.data<float>() + n * Rm;
      std::memcpy(d, s, size_t(H * D) * 4);
      for (int64_t h = 0; h < H; h++) {
        std::memcpy(d + (H + h) * D, s + (H + h / G) * D, size_t(D) * 4);
        std::memcpy(d + (2 * H + h) * D, s + (H + Hkv + h / G) * D, size_t(D) * 4);
      }
    }
    Tensor og = poisoned({B, T, H * D}), lg = poisoned({B, H, T}), om = poisoned({B, T, H * D}), lm = poisoned({B, H, T});
    ops::attention_forward(og, lg, qkv, B, T, H, Hkv, D);
    ops::attention_forward(om, lm, mha, B, T, H, H, D);
    const std::string what = "Hkv=" + std::to_string(Hkv);
    expect_close(og, dvec(om), 1e-6, 1e-6, "GQA vs MHA out " + what);
    expect_close(lg, dvec(lm), 1e-6, 1e-6, "GQA vs MHA lse " + what);
    Tensor dout = randn({B, T, H * D}, rng), dg = poisoned({B, T, Rg}), dm = poisoned({B, T, Rm});
    ops::attention_backward(dg, dout, qkv, og, lg, B, T, H, Hkv, D);
    ops::attention_backward(dm, dout, mha, om, lm, B, T, H, H, D);
    Vec dmv = dvec(dm), want(size_t(B * T * Rg), 0.0);
    for (int64_t n = 0; n < B * T; n++) {
      for (int64_t i = 0; i < H * D; i++) want[size_t(n * Rg + i)] = dmv[size_t(n * Rm + i)];
      for (int64_t h = 0; h < H; h++)
        for (int64_t d = 0; d < D; d++) {
          want[size_t(n * Rg + (H + h / G) * D + d)] += dmv[size_t(n * Rm + (H + h) * D + d)];
          want[size_t(n * Rg + (H + Hkv + h / G) * D + d)] += dmv[size_t(n * Rm + (2 * H + h) * D + d)];
        }
    }
    expect_close(dg, want, 1e-5, 1e-5, "GQA vs MHA dqkv " + what);
  }
}

TEST(Attention, StableForLargeScores) {
  Rng rng(95);
  const int64_t B = 1, T = 9, H = 2, Hkv = 1, D = 8;
  Tensor qkv = randn({B, T, (H + 2 * Hkv) * D}, rng, 30.0f);  // scores in the thousands: exp overflows unshifted
  Tensor out = poisoned({B, T, H * D}), lse = poisoned({B, H, T});
  ops::attention_forward(out, lse, qkv, B, T, H, Hkv, D);
  Vec l;
  Vec want = attention_ref(dvec(qkv), B, T, H, Hkv, D, &l);
  expect_close(out, want, 1e-3, 1e-4, "attention_forward large scores out");
  expect_close(lse, l, 1e-2, 1e-5, "attention_forward large scores lse");
  Tensor dqkv = poisoned({B, T, (H + 2 * Hkv) * D});
  ops::attention_backward(dqkv, randn({B, T, H * D}, rng), qkv, out, lse, B, T, H, Hkv, D);
  for (float v : to_float_vector(dqkv)) ASSERT_TRUE(std::isfinite(v));
}

// ---------------------------------------------------------------- cross-entropy
namespace {
struct CeCase {
  int64_t N = 7, V = 11, Vp = 13;
  std::vector<int32_t> targets = {3, -1, 10, 0, -100, 7, 3};
  Tensor logits;
  explicit CeCase(Rng& rng, float scale = 2.0f) {
    logits = randn({N, Vp}, rng, scale);
    for (int64_t n = 0; n < N; n++)  // padded columns hold large values: they must not enter the softmax
      for (int64_t v = V; v < Vp; v++) logits.data<float>()[n * Vp + v] = 50.0f;
  }
};
}  // namespace

TEST(CrossEntropy, ForwardMatchesReferenceWithPaddingAndIgnoredRows) {
  Rng rng(100);
  CeCase k(rng);
  Tensor losses = poisoned({k.N});
  ops::crossentropy_forward(losses, k.logits, ints(k.targets), k.V);
  expect_close(losses, crossentropy_ref(dvec(k.logits), k.targets, k.V, k.Vp), 1e-5, 1e-5, "crossentropy_forward");
  EXPECT_EQ(losses.data<float>()[1], 0.0f);
  EXPECT_EQ(losses.data<float>()[4], 0.0f);
  // V = 0 means the whole row (no padding).
  Tensor full = poisoned({k.N});
  ops::crossentropy_forward(full, k.logits, ints(k.targets));
  expect_close(full, crossentropy_ref(dvec(k.logits), k.targets, k.Vp, k.Vp), 1e-5, 1e-5, "crossentropy_forward V=0");
}

TEST(CrossEntropy, BackwardMatchesFiniteDifferences) {
  Rng rng(101);
  CeCase k(rng);
  const float dloss = 0.37f;
  Tensor dlogits = poisoned({k.N, k.Vp});
  ops::crossentropy_backward(dlogits, k.logits, ints(k.targets), dloss, k.V);
  Vec want = fd_grad(dvec(k.logits), [&](const Vec& v) {
    double s = 0;
    for (double l : crossentropy_ref(v, k.targets, k.V, k.Vp)) s += dloss * l;
    return s;
  });
  expect_close(dlogits, want, 1e-6, 1e-4, "crossentropy_backward");
  for (int64_t n = 0; n < k.N; n++)
    for (int64_t v = 0; v < k.Vp; v++)
      if (k.targets[size_t(n)] < 0 || v >= k.V) {
        EXPECT_EQ(dlogits.data<float>()[n * k.Vp + v], 0.0f) << "row " << n << ", column " << v;
      }
}

TEST(CrossEntropy, ForwardLseFeedsTheOnePassBackward) {
  Rng rng(105);
  CeCase k(rng);
  Tensor losses = poisoned({k.N}), lse = poisoned({k.N});
  ops::crossentropy_forward(losses, k.logits, ints(k.targets), k.V, lse);
  expect_close(losses, crossentropy_ref(dvec(k.logits), k.targets, k.V, k.Vp), 1e-5, 1e-5, "losses with lse");
  // lse - x[target] is the loss, for every row that is not ignored; ignored rows get 0.
  for (int64_t n = 0; n < k.N; n++) {
    const int32_t t = k.targets[size_t(n)];
    const float want = t < 0 ? 0.0f : losses.data<float>()[n] + k.logits.data<float>()[n * k.Vp + t];
    EXPECT_NEAR(lse.data<float>()[n], want, 1e-5f) << "row " << n;
  }
  const float dloss = 0.37f;
  Tensor two_pass = poisoned({k.N, k.Vp}), one_pass = poisoned({k.N, k.Vp}), in_place = k.logits.clone();
  ops::crossentropy_backward(two_pass, k.logits, ints(k.targets), dloss, k.V);
  ops::crossentropy_backward(one_pass, k.logits, ints(k.targets), dloss, k.V, lse);
  ops::crossentropy_backward(in_place, in_place, ints(k.targets), dloss, k.V, lse);
  expect_close(one_pass, dvec(two_pass), 1e-7, 1e-5, "backward with lse vs without");
  EXPECT_TRUE(bitwise_equal(one_pass, in_place));
  Tensor wrong = Tensor::empty({k.N + 1}, DType::f32);
  expect_error([&] { ops::crossentropy_backward(one_pass, k.logits, ints(k.targets), dloss, k.V, wrong); },
               {"crossentropy_backward", "lse"});
}

TEST(CrossEntropy, InPlaceEqualsOutOfPlace) {
  Rng rng(102);
  CeCase k(rng);
  Tensor out = poisoned({k.N, k.Vp}), inplace = k.logits.clone();
  ops::crossentropy_backward(out, k.logits, ints(k.targets), 0.5f, k.V);
  ops::crossentropy_backward(inplace, inplace, ints(k.targets), 0.5f, k.V);
  EXPECT_TRUE(bitwise_equal(out, inplace));
}

TEST(CrossEntropy, AllIgnoredGivesZeros) {
  Rng rng(103);
  CeCase k(rng);
  std::vector<int32_t> none(size_t(k.N), -1);
  Tensor losses = poisoned({k.N}), d = poisoned({k.N, k.Vp});
  ops::crossentropy_forward(losses, k.logits, ints(none), k.V);
  ops::crossentropy_backward(d, k.logits, ints(none), 1.0f, k.V);
  expect_close(losses, Vec(size_t(k.N), 0.0), 0, 0, "crossentropy_forward all ignored");
  expect_close(d, Vec(size_t(k.N * k.Vp), 0.0), 0, 0, "crossentropy_backward all ignored");
}

TEST(CrossEntropy, StableForLargeLogitsAndRejectsBadTargets) {
  Rng rng(104);
  CeCase k(rng, 500.0f);
  Tensor losses = poisoned({k.N});
  ops::crossentropy_forward(losses, k.logits, ints(k.targets), k.V);
  expect_close(losses, crossentropy_ref(dvec(k.logits), k.targets, k.V, k.Vp), 1e-3, 1e-5, "crossentropy large logits");
  std::vector<int32_t> bad = k.targets;
  bad[2] = int32_t(k.V);  // a padded column is not a valid target
  expect_error([&] { ops::crossentropy_forward(losses, k.logits, ints(bad), k.V); },
               {"crossentropy_forward", "targets[2] = 11", "11)"});
  expect_error([&] { ops::crossentropy_forward(losses, k.logits, ints(k.targets), k.Vp + 1); },
               {"crossentropy_forward", "V = 14"});
}
