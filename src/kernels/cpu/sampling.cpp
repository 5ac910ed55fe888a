// Token sampling's rows (include/dscpp/kernels/sampling_ops.h). The candidate set is a threshold on the logits (the
// top_k-th largest, top_p's tau, min_p's weight), so a GPU kernel finds it by radix select instead of a sort, and the
// draw walks the candidates in id order, so a block-wide scan reproduces it. Masses are summed in double here; the
// CUDA twin sums fixed-point integers (deterministic): the two agree except where u or top_p falls within rounding
// of a boundary.
#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <vector>

#include "dscpp/core/rng.h"
#include "kernels/cpu/cpu_kernels.h"

namespace dscpp::cpu {

void apply_penalties(float* out, const float* logits, const int32_t* hist_start, const int32_t* hist_token,
                     const int32_t* hist_count, const float* repetition, const float* presence, const float* frequency,
                     int64_t S, int64_t V) {
#pragma omp parallel for if (S > 1)
  for (int64_t s = 0; s < S; s++) {
    float* o = out + s * V;
    std::copy(logits + s * V, logits + (s + 1) * V, o);
    for (int32_t j = hist_start[s]; j < hist_start[s + 1]; j++) {
      float& l = o[hist_token[j]];
      l = l > 0 ? l / repetition[s] : l * repetition[s];
      const int32_t n = hist_count[j];
      if (n > 0) l -= frequency[s] * float(n) + presence[s];
    }
  }
}

float sample_uniform(uint64_t seed, int64_t step) { return Rng(RngState{seed, uint64_t(step), 4}).uniform(); }

RowDraw sample_row(const float* l, int64_t V, const SampleKnobs& k, float u) {
  const int32_t top = int32_t(std::max_element(l, l + V) - l);  // the first maximum: ties to the lower id
  if (k.temperature <= 0.0f) return {top, 0.0, 1.0};
  const double mx = l[top];
  auto weight = [&](float x) { return std::exp((double(x) - mx) / double(k.temperature)); };
  float cut = -INFINITY;
  if (k.top_k > 0 && k.top_k < V) {  // the top_k-th largest logit; its ties stay
    std::vector<float> c(l, l + V);
    std::nth_element(c.begin(), c.begin() + (k.top_k - 1), c.end(), std::greater<float>());
    cut = c[size_t(k.top_k - 1)];
  }
  if (k.top_p < 1.0f) {  // the largest tau whose upper set {l >= tau} holds top_p of the top-k set's mass
    std::vector<float> c;
    for (int64_t i = 0; i < V; i++)
      if (l[i] >= cut) c.push_back(l[i]);
    std::sort(c.begin(), c.end(), std::greater<float>());
    double total = 0.0;
    for (float x : c) total += weight(x);
    const double target = double(k.top_p) * total;
    double acc = 0.0;
    for (size_t i = 0; i < c.size(); i++) {
      acc += weight(c[i]);
      if (acc >= target && (i + 1 == c.size() || c[i + 1] != c[i])) {  // a tie group counts as a whole
        cut = std::max(cut, c[i]);
        break;
      }
    }
  }
  auto candidate = [&](int64_t i) { return l[i] >= cut && weight(l[i]) >= double(k.min_p); };
  double sum = 0.0;
  for (int64_t i = 0; i < V; i++)
    if (candidate(i)) sum += weight(l[i]);
  const double r = double(u) * sum;
  double acc = 0.0;
  RowDraw d{top, 0.0, 1.0};
  for (int64_t i = 0; i < V; i++) {
    if (!candidate(i)) continue;
    const double w = weight(l[i]);
    d = {int32_t(i), acc / sum, (acc + w) / sum};
    acc += w;
    if (acc > r) break;  // else rounding left r past the last candidate, which d holds
  }
  return d;
}

void sample_rows(int32_t* tokens, const float* logits, const float* temperature, const int32_t* top_k,
                 const float* top_p, const float* min_p, const int32_t* seed, const int32_t* step, int64_t S,
                 int64_t V) {
#pragma omp parallel for schedule(dynamic) if (S > 1)
  for (int64_t s = 0; s < S; s++) {
    const uint64_t sd = uint64_t(uint32_t(seed[2 * s])) | uint64_t(uint32_t(seed[2 * s + 1])) << 32;
    const SampleKnobs k{temperature[s], top_p[s], min_p[s], top_k[s]};
    tokens[s] = sample_row(logits + s * V, V, k, k.temperature > 0 ? sample_uniform(sd, step[s]) : 0.0f).token;
  }
}

void logprobs_rows(float* chosen, int32_t* top_ids, float* top_logprob, const float* logits, const int32_t* tokens,
                   int64_t S, int64_t V, int64_t n) {
#pragma omp parallel for if (S > 1)
  for (int64_t s = 0; s < S; s++) {
    const float* l = logits + s * V;
    const double mx = *std::max_element(l, l + V);
    double sum = 0.0;
    for (int64_t i = 0; i < V; i++) sum += std::exp(double(l[i]) - mx);
    const double lse = mx + std::log(sum);
    chosen[s] = float(double(l[tokens[s]]) - lse);
    std::vector<int32_t> ids(static_cast<size_t>(V));
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + n, ids.end(),
                      [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    for (int64_t j = 0; j < n; j++) {
      top_ids[s * n + j] = ids[size_t(j)];
      top_logprob[s * n + j] = float(double(l[ids[size_t(j)]]) - lse);
    }
  }
}

}  // namespace dscpp::cpu
