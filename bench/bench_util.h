// Helpers shared by the kernel benchmarks: random tensors, device copies, error measures and CUDA-event timing.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <vector>

#include "core/cuda/cuda_runtime.cuh"
#include "dscpp/core/rng.h"
#include "dscpp/core/tensor.h"

namespace bench {
using dscpp::Device;
using dscpp::DType;
using dscpp::Shape;
using dscpp::Tensor;

// f32 CPU tensor of N(0, sigma^2) values, rounded to `dt` and back so the CPU reference sees exactly what the GPU sees.
inline Tensor randn_rounded(const Shape& s, DType dt, uint64_t seed, float sigma = 1.0f) {
  Tensor t = Tensor::empty(s, DType::f32);
  dscpp::Rng rng(seed);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); i++) p[i] = sigma * rng.normal();
  return t.to(dt).to(DType::f32);
}

inline Tensor to_device(const Tensor& cpu_f32, DType dt) { return cpu_f32.to(dt).to(Device::cuda(0)); }
inline Tensor to_host_f32(const Tensor& dev) { return dev.to(Device::cpu()).to(DType::f32); }

// Device tensor filled with NaN: any element a kernel fails to write shows up in the comparison.
inline Tensor poisoned(const Shape& s, DType dt) {
  Tensor t = Tensor::empty(s, dt, Device::cuda(0));
  t.fill(NAN);
  return t;
}

// max |got - want| / max(max |want|, 1e-3) over [begin, end) of the flattened tensors; NaN if any got is NaN.
inline double rel_err(const Tensor& got, const Tensor& want, int64_t begin = 0, int64_t end = -1) {
  const float* g = got.data<float>();
  const float* w = want.data<float>();
  if (end < 0) end = want.numel();
  // Floor 1e-3 (inputs are O(1)): an exactly-zero reference (dq and dk at T = 1, where softmax over one key has no
  // gradient) must not turn f32 rounding (~1e-7) into a large relative error.
  double err = 0.0, ref = 1e-3;
  for (int64_t i = begin; i < end; i++) {
    if (std::isnan(g[i]) != std::isnan(w[i])) return NAN;
    err = std::max(err, double(std::fabs(g[i] - w[i])));
    ref = std::max(ref, double(std::fabs(w[i])));
  }
  return err / ref;
}

// Median milliseconds of `iters` runs of f on the current stream of device 0 (after `warmup` runs).
// `before` (optional) runs untimed ahead of every run, e.g. to flush the L2.
inline double time_ms(const std::function<void()>& f, int warmup = 3, int iters = 20,
                      const std::function<void()>& before = nullptr) {
  cudaStream_t s = dscpp::cuda::current_stream(0);
  for (int i = 0; i < warmup; i++) {
    if (before) before();
    f();
  }
  std::vector<double> ms;
  for (int i = 0; i < iters; i++) {
    if (before) before();
    dscpp::cuda::Event a, b;
    a.record(s);
    f();
    b.record(s);
    b.synchronize();
    ms.push_back(b.elapsed_ms(a));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

inline const char* verdict(double err, double tol) { return err <= tol ? "PASS" : "FAIL"; }

}  // namespace bench
