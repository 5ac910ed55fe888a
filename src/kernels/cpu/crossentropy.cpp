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
                           float dloss, int64_t N, int64_t V, int64_t Vp, int64_t first) {
#pragma omp parallel for if (N * V >= 16384)
  for (int64_t n = 0; n < N; n++) {
    const float* x = logits + n * Vp;
    float* dx = dlogits + n * Vp;
    const int64_t target = int64_t(targets[n]) - first;  // a shard's column; may lie outside it
    const bool here = target >= 0 && target < V;
    if (targets[n] < 0) {
      for (int64_t v = 0; v < Vp; v++) dx[v] = 0.0f;
      continue;
    }
    if (lse) {  // the forward's log-sum-exp: one pass, exp(x - lse) is the softmax
      const float l = lse[n];
      for (int64_t v = 0; v < V; v++) dx[v] = dloss * std::exp(x[v] - l);
      if (here) dx[target] -= dloss;
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
    if (here) dx[target] -= dloss;
    for (int64_t v = V; v < Vp; v++) dx[v] = 0.0f;
  }
}

void crossentropy_shard_stats(float* stats, const float* logits, const int32_t* targets, int64_t N, int64_t V,
                              int64_t Vp, int64_t first) {
#pragma omp parallel for if (N * V >= 16384)
  for (int64_t n = 0; n < N; n++) {
    float& lse = stats[n];
    float& target = stats[N + n];
    lse = target = 0.0f;
    if (targets[n] < 0) continue;
    const float* x = logits + n * Vp;
    float mx, sum;
    row_max_sum(x, V, mx, sum);
    lse = mx + std::log(sum);
    const int64_t t = int64_t(targets[n]) - first;
    if (t >= 0 && t < V) target = x[t];
  }
}

void crossentropy_combine(float* losses, float* lse, const float* stats, const int32_t* targets, int64_t N,
                          int64_t S) {
  for (int64_t n = 0; n < N; n++) {
    if (targets[n] < 0) {
      losses[n] = lse[n] = 0.0f;
      continue;
    }
    float mx = -std::numeric_limits<float>::infinity(), target = 0.0f;
    for (int64_t s = 0; s < S; s++) mx = std::max(mx, stats[s * 2 * N + n]);
    float sum = 0.0f;
    for (int64_t s = 0; s < S; s++) {
      sum += std::exp(stats[s * 2 * N + n] - mx);
      target += stats[s * 2 * N + N + n];
    }
    lse[n] = mx + std::log(sum);
    losses[n] = lse[n] - target;
  }
}

}  // namespace dscpp::cpu
