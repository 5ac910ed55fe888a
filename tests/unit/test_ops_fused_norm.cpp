// The residual add fused with LayerNorm/RMSNorm (ops::fused_residual_*), CPU reference, against double-precision
// scalar references written here. Forward: resid = x + residual and norm(resid) vs the double composite. Backward:
// dresid = dskip + norm'(dnorm) and dweight/dbias (+=) vs central finite differences (in double) of
// loss = sum(dskip * resid) + sum(dnorm * norm(resid)). Outputs are poisoned with NaN first. Also: in-place use (as
// the block does), agreement with the unfused ops, determinism on the parallel path, and the checked entries' errors.
#include <gtest/gtest.h>

#include <cmath>
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

Tensor ones(const Shape& s, DType t) {
  Tensor x = Tensor::empty(s, t);
  x.fill(1.0f);
  return x;
}

// ---- double-precision references: norm of s[N,C] (LN with weight and optional bias, or RMS) ----
Vec norm_ref(bool ln, const Vec& s, const Vec& w, const Vec* b, int64_t N, int64_t C, double eps,
             Vec* mean = nullptr, Vec* rstd = nullptr) {
  Vec y(s.size());
  for (int64_t n = 0; n < N; n++) {
    const double* x = s.data() + n * C;
    double m = 0, v = 0;
    if (ln) {
      for (int64_t c = 0; c < C; c++) m += x[c];
      m /= double(C);
    }
    for (int64_t c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
    const double r = 1 / std::sqrt(v / double(C) + eps);
    for (int64_t c = 0; c < C; c++)
      y[size_t(n * C + c)] = (x[c] - m) * r * w[size_t(c)] + (b ? (*b)[size_t(c)] : 0.0);
    if (mean) mean->push_back(m);
    if (rstd) rstd->push_back(r);
  }
  return y;
}

struct Kind {
  bool ln;
  double eps;
  const char* name;
};
void PrintTo(const Kind& k, std::ostream* os) { *os << k.name; }

const Kind kLayerNorm{true, 1e-5, "layernorm"};
const Kind kRmsNorm{false, 1e-6, "rmsnorm"};

// Saved statistics of a fused forward (mean undefined for RMSNorm).
struct Stats {
  Tensor mean, rstd;
};

Stats fused_forward(const Kind& k, const Tensor& resid, const Tensor& out, const Tensor& x, const Tensor& r,
                    const Tensor& w, const Tensor& b) {
  const int64_t N = x.numel() / x.size(-1);
  Stats st{k.ln ? poisoned({N}) : Tensor(), poisoned({N})};
  if (k.ln) ops::fused_residual_layernorm_forward(resid, out, st.mean, st.rstd, x, r, w, b, float(k.eps));
  else ops::fused_residual_rmsnorm_forward(resid, out, st.rstd, x, r, w, float(k.eps));
  return st;
}

void fused_backward(const Kind& k, const Tensor& dresid, const Tensor& dw, const Tensor& db, const Tensor& dskip,
                    const Tensor& dnorm, const Tensor& resid, const Tensor& w, const Stats& st) {
  if (k.ln) ops::fused_residual_layernorm_backward(dresid, dw, db, dskip, dnorm, resid, w, st.mean, st.rstd);
  else ops::fused_residual_rmsnorm_backward(dresid, dw, dskip, dnorm, resid, w, st.rstd);
}

class FusedNorm : public ::testing::TestWithParam<Kind> {};

// ---------------------------------------------------------------- forward
TEST_P(FusedNorm, ForwardMatchesReference) {
  const Kind k = GetParam();
  Rng rng(k.ln ? 40 : 41);
  for (int64_t C : {int64_t(13), int64_t(64)}) {
    const int64_t N = 7;
    Tensor x = randn({N, C}, rng, 1.5f, 0.4f), r = randn({N, C}, rng, 1.0f, -0.2f);
    Tensor w = randn({C}, rng, 0.5f, 1.0f), b = k.ln ? randn({C}, rng) : Tensor();
    Tensor resid = poisoned({N, C}), out = poisoned({N, C});
    const Stats st = fused_forward(k, resid, out, x, r, w, b);
    const std::string tag = std::string(k.name) + " C=" + std::to_string(C);
    const Vec sv = plus(dvec(x), dvec(r)), bv = k.ln ? dvec(b) : Vec();
    expect_close(resid, sv, 1e-6, 1e-6, tag + " resid = x + residual");
    Vec m, rs;
    // The statistics are those of the stored (f32) resid: the reference normalises what was written.
    const Vec want = norm_ref(k.ln, dvec(resid), dvec(w), k.ln ? &bv : nullptr, N, C, k.eps, &m, &rs);
    expect_close(out, want, 1e-5, 1e-5, tag + " norm");
    expect_close(st.rstd, rs, 1e-6, 1e-5, tag + " rstd");
    if (k.ln) expect_close(st.mean, m, 1e-6, 1e-5, tag + " mean");
  }
}

TEST_P(FusedNorm, ForwardInPlaceAndWithoutStatistics) {
  // The block writes x1 over the attention output (resid aliases x); resid may alias residual as well.
  const Kind k = GetParam();
  Rng rng(k.ln ? 42 : 43);
  const int64_t N = 5, C = 24;
  Tensor x = randn({N, C}, rng), r = randn({N, C}, rng), w = randn({C}, rng), b = k.ln ? randn({C}, rng) : Tensor();
  Tensor resid = poisoned({N, C}), out = poisoned({N, C});
  fused_forward(k, resid, out, x, r, w, b);
  for (int alias = 0; alias < 2; alias++) {
    Tensor xa = x.clone(), ra = r.clone(), outa = poisoned({N, C});
    const Tensor& into = alias == 0 ? xa : ra;
    fused_forward(k, into, outa, xa, ra, w, b);
    EXPECT_TRUE(bitwise_equal(into, resid)) << k.name << ": resid aliasing " << (alias == 0 ? "x" : "residual");
    EXPECT_TRUE(bitwise_equal(outa, out)) << k.name << ": norm with resid aliasing " << (alias == 0 ? "x" : "residual");
  }
  // No saved statistics (inference) and, for LayerNorm, no bias.
  Tensor resid2 = poisoned({N, C}), out2 = poisoned({N, C});
  if (k.ln) ops::fused_residual_layernorm_forward(resid2, out2, Tensor(), Tensor(), x, r, w, Tensor(), float(k.eps));
  else ops::fused_residual_rmsnorm_forward(resid2, out2, Tensor(), x, r, w, float(k.eps));
  const Vec sv = plus(dvec(x), dvec(r));
  expect_close(resid2, sv, 1e-6, 1e-6, std::string(k.name) + " resid without statistics");
  expect_close(out2, norm_ref(k.ln, dvec(resid2), dvec(w), nullptr, N, C, k.eps), 1e-5, 1e-5,
               std::string(k.name) + " norm without statistics / bias");
}

// ---------------------------------------------------------------- backward
TEST_P(FusedNorm, BackwardMatchesFiniteDifferences) {
  const Kind k = GetParam();
  Rng rng(k.ln ? 44 : 45);
  const int64_t N = 7, C = 13;
  Tensor x = randn({N, C}, rng, 1.5f, 0.4f), r = randn({N, C}, rng), w = randn({C}, rng, 0.5f, 1.0f);
  Tensor b = k.ln ? randn({C}, rng) : Tensor();
  Tensor resid = poisoned({N, C}), out = poisoned({N, C});
  const Stats st = fused_forward(k, resid, out, x, r, w, b);
  Tensor dskip = randn({N, C}, rng), dnorm = randn({N, C}, rng);
  Tensor dresid = poisoned({N, C}), dw = randn({C}, rng), db = k.ln ? randn({C}, rng) : Tensor();
  const Vec sv = dvec(resid), wv = dvec(w), bv = k.ln ? dvec(b) : Vec(), ks = dvec(dskip), kn = dvec(dnorm);
  const Vec dw0 = dvec(dw), db0 = k.ln ? dvec(db) : Vec();
  fused_backward(k, dresid, dw, db, dskip, dnorm, resid, w, st);

  // loss(s, w, b) = sum(dskip * s) + sum(dnorm * norm(s)): its gradient in s is dresid (= d x = d residual).
  auto loss = [&](const Vec& s, const Vec& wq, const Vec* bq) {
    return proj(ks, s) + proj(kn, norm_ref(k.ln, s, wq, bq, N, C, k.eps));
  };
  const std::string tag = k.name;
  expect_close(dresid, fd_grad(sv, [&](const Vec& v) { return loss(v, wv, k.ln ? &bv : nullptr); }), 1e-4, 1e-4,
               tag + " dresid = dskip + norm'(dnorm)");
  expect_close(dw, plus(dw0, fd_grad(wv, [&](const Vec& v) { return loss(sv, v, k.ln ? &bv : nullptr); })), 1e-4, 1e-4,
               tag + " dweight (+=)");
  if (k.ln)
    expect_close(db, plus(db0, fd_grad(bv, [&](const Vec& v) { return loss(sv, wv, &v); })), 1e-4, 1e-4,
                 tag + " dbias (+=)");
}

TEST_P(FusedNorm, BackwardInPlaceAndWithoutParamGrads) {
  // The block passes its gradient buffer as both dskip and dresid.
  const Kind k = GetParam();
  Rng rng(k.ln ? 46 : 47);
  const int64_t N = 9, C = 40;
  Tensor x = randn({N, C}, rng), r = randn({N, C}, rng), w = randn({C}, rng), b = k.ln ? randn({C}, rng) : Tensor();
  Tensor resid = poisoned({N, C}), out = poisoned({N, C});
  const Stats st = fused_forward(k, resid, out, x, r, w, b);
  Tensor dskip = randn({N, C}, rng), dnorm = randn({N, C}, rng);
  Tensor dresid = poisoned({N, C}), dw = Tensor::zeros({C}, DType::f32), db = Tensor::zeros({C}, DType::f32);
  fused_backward(k, dresid, dw, k.ln ? db : Tensor(), dskip, dnorm, resid, w, st);
  Tensor inplace = dskip.clone(), dw2 = Tensor::zeros({C}, DType::f32), db2 = Tensor::zeros({C}, DType::f32);
  fused_backward(k, inplace, dw2, k.ln ? db2 : Tensor(), inplace, dnorm, resid, w, st);
  EXPECT_TRUE(bitwise_equal(inplace, dresid)) << k.name << ": dresid aliasing dskip";
  EXPECT_TRUE(bitwise_equal(dw2, dw) && bitwise_equal(db2, db)) << k.name << ": parameter gradients in place";
  // No parameter gradients requested (frozen norm): dresid unchanged.
  Tensor dresid3 = poisoned({N, C});
  fused_backward(k, dresid3, Tensor(), Tensor(), dskip, dnorm, resid, w, st);
  EXPECT_TRUE(bitwise_equal(dresid3, dresid)) << k.name << ": dresid without parameter gradients";
}

TEST_P(FusedNorm, AgreesWithTheUnfusedOps) {
  // residual_forward + norm forward, and norm backward + add_inplace: the same arithmetic per element (bitwise equal
  // in the default build; a tight tolerance here so -march=native FMA contraction cannot fail it).
  const Kind k = GetParam();
  Rng rng(k.ln ? 48 : 49);
  const int64_t N = 33, C = 48;
  Tensor x = randn({N, C}, rng), r = randn({N, C}, rng), w = randn({C}, rng), b = k.ln ? randn({C}, rng) : Tensor();
  Tensor resid = poisoned({N, C}), out = poisoned({N, C});
  const Stats st = fused_forward(k, resid, out, x, r, w, b);
  Tensor resid_u = poisoned({N, C}), out_u = poisoned({N, C}), mean_u = poisoned({N}), rstd_u = poisoned({N});
  ops::residual_forward(resid_u, x, r);
  if (k.ln) ops::layernorm_forward(out_u, mean_u, rstd_u, resid_u, w, b, float(k.eps));
  else ops::rmsnorm_forward(out_u, rstd_u, resid_u, w, float(k.eps));
  expect_close(resid, dvec(resid_u), 0, 1e-7, std::string(k.name) + " resid vs residual_forward");
  expect_close(out, dvec(out_u), 1e-6, 1e-6, std::string(k.name) + " norm vs the unfused norm");
  expect_close(st.rstd, dvec(rstd_u), 0, 1e-6, std::string(k.name) + " rstd vs the unfused norm");

  Tensor dskip = randn({N, C}, rng), dnorm = randn({N, C}, rng);
  Tensor dresid = dskip.clone(), dw = Tensor::zeros({C}, DType::f32), db = Tensor::zeros({C}, DType::f32);
  fused_backward(k, dresid, dw, k.ln ? db : Tensor(), dresid, dnorm, resid, w, st);
  Tensor dx = poisoned({N, C}), dw_u = Tensor::zeros({C}, DType::f32), db_u = Tensor::zeros({C}, DType::f32);
  if (k.ln) ops::layernorm_backward(dx, dw_u, db_u, dnorm, resid, w, st.mean, st.rstd);
  else ops::rmsnorm_backward(dx, dw_u, dnorm, resid, w, st.rstd);
  Tensor dres_u = dskip.clone();
  ops::add_inplace(dres_u, dx);
  expect_close(dresid, dvec(dres_u), 1e-6, 1e-6, std::string(k.name) + " dresid vs norm backward + add_inplace");
  expect_close(dw, dvec(dw_u), 1e-6, 1e-6, std::string(k.name) + " dweight vs the unfused norm backward");
  if (k.ln) expect_close(db, dvec(db_u), 1e-6, 1e-6, "layernorm dbias vs the unfused norm backward");
}

TEST_P(FusedNorm, BackwardIsDeterministicOnTheParallelPath) {
  const Kind k = GetParam();
  Rng rng(k.ln ? 50 : 51);
  const int64_t N = 4099, C = 37;  // N * C above the parallel threshold
  Tensor x = randn({N, C}, rng), r = randn({N, C}, rng), w = randn({C}, rng), b = k.ln ? randn({C}, rng) : Tensor();
  Tensor resid = poisoned({N, C}), out = poisoned({N, C});
  const Stats st = fused_forward(k, resid, out, x, r, w, b);
  Tensor dskip = randn({N, C}, rng), dnorm = randn({N, C}, rng);
  Tensor d1 = poisoned({N, C}), d2 = poisoned({N, C}), dw1 = Tensor::zeros({C}, DType::f32), dw2 = dw1.clone();
  Tensor db1 = Tensor::zeros({C}, DType::f32), db2 = db1.clone();
  fused_backward(k, d1, dw1, k.ln ? db1 : Tensor(), dskip, dnorm, resid, w, st);
  fused_backward(k, d2, dw2, k.ln ? db2 : Tensor(), dskip, dnorm, resid, w, st);
  EXPECT_TRUE(bitwise_equal(d1, d2) && bitwise_equal(dw1, dw2) && bitwise_equal(db1, db2)) << k.name;
  // dweight over all rows against a double sum of dnorm * (normalised resid).
  Vec want(size_t(C), 0.0);
  const Vec sv = dvec(resid), dv = dvec(dnorm), rs = dvec(st.rstd), m = k.ln ? dvec(st.mean) : Vec(size_t(N), 0.0);
  for (int64_t n = 0; n < N; n++)
    for (int64_t c = 0; c < C; c++)
      want[size_t(c)] += dv[size_t(n * C + c)] * (sv[size_t(n * C + c)] - m[size_t(n)]) * rs[size_t(n)];
  expect_close(dw1, want, 1e-3, 1e-4, std::string(k.name) + " dweight over 4099 rows");
}

INSTANTIATE_TEST_SUITE_P(Kinds, FusedNorm, ::testing::Values(kLayerNorm, kRmsNorm),
                         [](const ::testing::TestParamInfo<Kind>& i) { return std::string(i.param.name); });

// ---------------------------------------------------------------- checked entries
TEST(FusedNormErrors, NameTheOpAndTheArgument) {
  const int64_t N = 4, C = 8;
  Tensor x = ones({N, C}, DType::f32), w = ones({C}, DType::f32), b = Tensor::zeros({C}, DType::f32);
  Tensor st = Tensor::empty({N}, DType::f32), out = Tensor::empty({N, C}, DType::f32);
  const Tensor wide = ones({N, C + 1}, DType::f32), w9 = ones({C + 1}, DType::f32);
  expect_error([&] { ops::fused_residual_layernorm_forward(out, out, st, st, x, wide, w, b, 1e-5f); },
               {"fused_residual_layernorm_forward", "residual", "[4, 9]"});
  expect_error([&] { ops::fused_residual_rmsnorm_forward(out, out, st, x, x, w9, 1e-6f); },
               {"fused_residual_rmsnorm_forward", "weight", "[9]"});
  expect_error([&] { ops::fused_residual_layernorm_backward(out, w, b, out, out, x, w, Tensor(), st); },
               {"fused_residual_layernorm_backward", "mean", "undefined"});
  const Tensor ints = Tensor::empty({N, C}, DType::i32);
  expect_error([&] { ops::fused_residual_rmsnorm_backward(out, w, ints, out, x, w, st); },
               {"fused_residual_rmsnorm_backward", "dskip", "i32"});
  Tensor h = Tensor::zeros({N, C}, DType::bf16);
  expect_error([&] { ops::fused_residual_rmsnorm_forward(h, h, st, h, h, w, 1e-6f); },
               {"fused_residual_rmsnorm_forward", "CUDA"});
}

}  // namespace
