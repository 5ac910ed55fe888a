// Helpers shared by the CPU op tests (test_ops_cpu.cpp, test_ops_fused_norm.cpp): random and poisoned tensors,
// double-precision vectors, the worst-element closeness check, central differences, expected errors.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "dscpp/core/check.h"
#include "dscpp/core/rng.h"
#include "dscpp/core/tensor.h"

namespace dscpp::op_checks {

using Vec = std::vector<double>;

inline Tensor randn(const Shape& s, Rng& rng, float scale = 1.0f, float shift = 0.0f, DType t = DType::f32) {
  Tensor x = Tensor::empty(s, t);
  for (int64_t i = 0; i < x.numel(); i++) store_from_float(x, i, shift + scale * rng.normal());
  return x;
}

inline Tensor poisoned(const Shape& s, DType t = DType::f32) {
  Tensor x = Tensor::empty(s, t);
  x.fill(NAN);
  return x;
}

inline Tensor ints(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::i32);
  std::memcpy(t.raw(), v.data(), v.size() * sizeof(int32_t));
  return t;
}

inline Vec dvec(const Tensor& t) {
  std::vector<float> f = to_float_vector(t);
  return Vec(f.begin(), f.end());
}

inline Vec plus(Vec a, const Vec& b) {
  for (size_t i = 0; i < a.size(); i++) a[i] += b[i];
  return a;
}

inline double proj(const Vec& r, const Vec& y) {
  double s = 0;
  for (size_t i = 0; i < r.size(); i++) s += r[i] * y[i];
  return s;
}

// Fails when any element is NaN/Inf or |got - want| > atol + rtol * |want|; reports the worst element.
inline void expect_close(const Tensor& got, const Vec& want, double atol, double rtol, const std::string& what) {
  std::vector<float> g = to_float_vector(got);
  ASSERT_EQ(g.size(), want.size()) << what;
  double worst = 0;
  size_t wi = 0;
  for (size_t i = 0; i < g.size(); i++) {
    const double err = std::fabs(double(g[i]) - want[i]);
    double ratio = err == 0 ? 0.0 : err / (atol + rtol * std::fabs(want[i]));
    if (!std::isfinite(g[i]) || std::isnan(ratio)) ratio = INFINITY;
    if (ratio > worst) worst = ratio, wi = i;
  }
  if (worst > 1.0)
    ADD_FAILURE() << what << ": worst error at [" << wi << "] of " << g.size() << ": got " << g[wi] << ", want "
                  << want[wi] << ", |err| = " << std::fabs(g[wi] - want[wi]) << " = " << worst
                  << "x the tolerance (atol " << atol << ", rtol " << rtol << ")";
}

// Central differences of a scalar function of x, in double.
inline Vec fd_grad(const Vec& x0, const std::function<double(const Vec&)>& f) {
  const double h = 1e-6;
  Vec x = x0, g(x.size());
  for (size_t i = 0; i < x.size(); i++) {
    const double xi = x[i];
    x[i] = xi + h;
    const double lp = f(x);
    x[i] = xi - h;
    const double lm = f(x);
    x[i] = xi;
    g[i] = (lp - lm) / (2 * h);
  }
  return g;
}

inline void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected dscpp::Error mentioning " << parts[0];
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

}  // namespace dscpp::op_checks
