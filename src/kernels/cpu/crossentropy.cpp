// Softmax cross-entropy over a (possibly padded) vocabulary, with ignored rows (target < 0).
// Backward may run in place on the logits: a row's max is found before any of its elements is written, and after
// that each element is read only by the iteration that writes it.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/cpu_kernels.h"

namespace dscpp::cpu {

// log(sum_v exp(x[v])) over x[0..V), stable: the max is factored out.
static void row_max_sum(const float* x, int64_t V, float& mx, float& sum) {
  mx = -std::numeric_limits<float>::infinity();
  for (int64_t v = 0; v < V; v++) mx = std::max(mx, x[v]);
  sum = 0.0f;
  for (int64_t v = 0; v < V; v++) sum += std::exp(x[v] - mx);
}

void crossentropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets, int64_t N,
                          int64_t V, int64_t Vp) {
#pragma omp parallel for if (N * V >= 16384)
  for (int64_t n = 0; n < N; n++) {
    if (targets[n] < 0) {
      losses[n] = 0.0f;
      if (lse) lse[n] = 0.0f;
      continue;
    }
    const float* x = logits + n * Vp;
    float mx, sum;
    row_max_sum(x, V, mx, sum);
    const float l = mx + std::log(sum);
    losses[n] = l - x[targets[n]];
    if (lse) lse[n] = l;
  }
}

void crossentropy_backward(float* dlogits, const float* logits, const int32_t* targets, const float* lse,
                           float dloss, int64_t N, int64_t V, int64_t Vp) {
#pragma omp parallel for if (N * V >= 16384)
  for (int64_t n = 0; n < N; n++) {
    const float* x = logits + n * Vp;
    float* dx = dlogits + n * Vp;
    const int32_t target = targets[n];
    if (target < 0) {
      for (int64_t v = 0; v < Vp; v++) dx[v] = 0.0f;
      continue;
    }
    if (lse) {  // the forward's log-sum-exp: one pass, exp(x - lse) is the softmax
      const float l = lse[n];
      for (int64_t v = 0; v < V; v++) dx[v] = dloss * std::exp(x[v] - l);
      dx[target] -= dloss;
      for (int64_t v = V; v < Vp; v++) dx[v] = 0.0f;
      continue;
    }
    // One exp per element: dx holds exp(x - max) first, then is normalised in a second pass.
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t v = 0; v < V; v++) mx = std::max(mx, x[v]);
    float sum = 0.0f;
    for (int64_t v = 0; v < V; v++) sum += (dx[v] = std::exp(x[v] - mx));
    const float scale = dloss / sum;
    for (int64_t v = 0; v < V; v++) dx[v] *= scale;
    dx[target] -= dloss;
    for (int64_t v = V; v < Vp; v++) dx[v] = 0.0f;
  }
}

}  // namespace dscpp::cpu
