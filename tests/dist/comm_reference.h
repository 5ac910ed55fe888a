// Serial references for collective tests: deterministic per-rank inputs (so every rank can compute the result of
// all ranks), poisoned outputs, per-dtype tolerances, and a worst-error check. Shared by the Gloo and NCCL tests.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "dscpp/comm/process_group.h"

namespace dscpp::test {

// Rank r's input for case `c`: deterministic, so every rank can compute the serial result of all ranks.
// Integers in [-50, 50] for i32, else uniform in [-2, 2) rounded to the dtype (never zero-filled).
inline std::vector<double> rank_input(int r, int c, int64_t n, DType dt) {
  uint64_t s = 0x9E3779B97F4A7C15ull * uint64_t(r * 7919 + c * 104729 + 1);
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    double u = double(s >> 11) / double(1ull << 53);
    if (dt == DType::i32) x = std::floor(u * 101.0) - 50.0;
    else x = u * 4.0 - 2.0;
  }
  return v;
}

inline Tensor make_tensor(const std::vector<double>& v, DType dt) {
  Tensor t = Tensor::empty({int64_t(v.size())}, dt);
  for (size_t i = 0; i < v.size(); ++i) {
    if (dt == DType::i32) t.data<int32_t>()[i] = int32_t(v[i]);
    else store_from_float(t, int64_t(i), float(v[i]));
  }
  return t;
}
inline double load(const Tensor& t, int64_t i) {
  return t.dtype() == DType::i32 ? double(t.data<int32_t>()[i]) : double(load_as_float(t, i));
}
inline Tensor poisoned(int64_t n, DType dt) {  // NaN (or INT_MIN) everywhere: unwritten elements fail
  Tensor t = Tensor::empty({n}, dt);
  for (int64_t i = 0; i < n; ++i) {
    if (dt == DType::i32) t.data<int32_t>()[i] = std::numeric_limits<int32_t>::min();
    else store_from_float(t, i, std::nanf(""));
  }
  return t;
}
// The value rank inputs (already rounded to dt) reduce to.
inline double reduce_ref(const std::vector<double>& xs, ReduceOp op) {
  double acc = xs[0];
  for (size_t i = 1; i < xs.size(); ++i) {
    if (op == ReduceOp::max) acc = std::max(acc, xs[i]);
    else if (op == ReduceOp::min) acc = std::min(acc, xs[i]);
    else acc += xs[i];
  }
  return op == ReduceOp::avg ? acc / double(xs.size()) : acc;
}
// Roundings a 16-bit reduction may take: 1 when the backend sums in f32 and rounds once (Gloo here); NCCL's ring
// rounds the running sum to the buffer's dtype at every hop, so world - 1 (seen on 4 H200s: 2 bf16 ulps at 2.3).
inline int& reduction_roundings() {
  static int r = 1;
  return r;
}
inline double tolerance(DType dt, double ref) {  // the 16-bit roundings of the result, plus f32 accumulation
  const double k = double(std::max(1, reduction_roundings()));
  switch (dt) {
    case DType::bf16: return k * 1e-2 * std::max(1.0, std::fabs(ref));
    case DType::f16: return k * 2e-3 * std::max(1.0, std::fabs(ref));
    case DType::f32: return 1e-5 * std::max(1.0, std::fabs(ref));
    default: return 0.0;
  }
}
// Worst error over the tensor vs ref(i); fails with the index, values and dtype.
template <typename Ref>
void expect_matches(const Tensor& got, Ref ref, const std::string& what) {
  double worst = -1;
  int64_t at = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    double g = load(got, i), r = ref(i);
    double err = std::isnan(g) ? std::numeric_limits<double>::infinity() : std::fabs(g - r) - tolerance(got.dtype(), r);
    if (err > worst) worst = err, at = i;
  }
  EXPECT_LE(worst, 0.0) << what << " (" << dtype_name(got.dtype()) << ", n=" << got.numel() << "): element " << at
                        << " is " << load(got, at) << ", expected " << ref(at) << " (tol "
                        << tolerance(got.dtype(), ref(at)) << ")";
}

inline std::vector<double> rounded(const std::vector<double>& v, DType dt) {  // as the tensor holds them
  Tensor t = make_tensor(v, dt);
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = load(t, int64_t(i));
  return out;
}

}  // namespace dscpp::test
