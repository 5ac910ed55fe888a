// Elementwise adds and scales, and the f64 sum of squares used for global gradient norms.
#include <omp.h>

#include <vector>

#include "kernels/cpu/cpu_kernels.h"

namespace dscpp::cpu {

// Below this many elements a parallel region costs more than it saves.
static constexpr int64_t kParallelMin = 32768;

void residual_forward(float* out, const float* a, const float* b, int64_t n) {
#pragma omp parallel for simd if (n >= kParallelMin)
  for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void add_inplace(float* acc, const float* x, int64_t n) {
#pragma omp parallel for simd if (n >= kParallelMin)
  for (int64_t i = 0; i < n; i++) acc[i] += x[i];
}

void scale_inplace(float* x, float s, int64_t n) {
#pragma omp parallel for simd if (n >= kParallelMin)
  for (int64_t i = 0; i < n; i++) x[i] *= s;
}

void sum_blocks(float* out, const float* in, int64_t n, int64_t blocks, float scale) {
#pragma omp parallel for if (n >= kParallelMin)
  for (int64_t i = 0; i < n; i++) {
    float s = 0.0f;
    for (int64_t j = 0; j < blocks; j++) s += in[j * n + i];
    out[i] = s * scale;
  }
}

void add_sum(float* acc, const float* x, int64_t n, float scale) {
  double s = 0.0;  // in order, one thread: the vectors this serves (per-token losses) are small
  for (int64_t i = 0; i < n; i++) s += double(x[i]);
  acc[0] = float(double(acc[0]) + double(scale) * s);
}

double sum_squares(const float* x, int64_t n) {
  // Per-thread partials over a static split, summed in thread order: the same thread count gives the same bits.
  const int nt = n >= kParallelMin ? omp_get_max_threads() : 1;
  std::vector<double> part(size_t(nt), 0.0);
#pragma omp parallel num_threads(nt)
  {
    double s = 0.0;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; i++) s += double(x[i]) * double(x[i]);
    part[size_t(omp_get_thread_num())] = s;
  }
  double total = 0.0;
  for (double s : part) total += s;
  return total;
}

}  // namespace dscpp::cpu
