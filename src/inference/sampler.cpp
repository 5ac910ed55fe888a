#include "dscpp/inference/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace dscpp {

int32_t sample_token(const float* logits, int64_t V, const SamplingParams& p, Rng& rng) {
  DSCPP_CHECK(V > 0, "sample_token: empty vocabulary");
  if (p.temperature <= 0.0f) return int32_t(std::max_element(logits, logits + V) - logits);
  // Candidates sorted by logit, cut to top-k; softmax at the temperature; cut to the nucleus of mass top_p.
  std::vector<int32_t> idx(size_t(V), 0);
  std::iota(idx.begin(), idx.end(), 0);
  int64_t k = (p.top_k > 0 && p.top_k < V) ? p.top_k : V;
  auto by_logit = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), by_logit);
  idx.resize(size_t(k));
  std::vector<double> prob(idx.size());
  double mx = logits[idx[0]], sum = 0.0;
  for (size_t i = 0; i < idx.size(); i++) sum += prob[i] = std::exp((logits[idx[i]] - mx) / p.temperature);
  size_t keep = idx.size();
  if (p.top_p < 1.0f) {
    double acc = 0.0;
    for (size_t i = 0; i < idx.size(); i++) {
      acc += prob[i] / sum;
      if (acc >= p.top_p) { keep = i + 1; break; }
    }
  }
  double total = std::accumulate(prob.begin(), prob.begin() + long(keep), 0.0);
  double r = double(rng.uniform()) * total;
  for (size_t i = 0; i < keep; i++) {
    r -= prob[i];
    if (r < 0.0) return idx[i];
  }
  return idx[keep - 1];
}

std::vector<int32_t> generate(Model& model, std::vector<int32_t> tokens, int64_t max_new_tokens,
                              const SamplingParams& p, int32_t stop_token, void (*on_token)(int32_t, void*),
                              void* user) {
  return generate(model, std::move(tokens), max_new_tokens, p,
                  stop_token >= 0 ? std::vector<int32_t>{stop_token} : std::vector<int32_t>{}, on_token, user);
}

std::vector<int32_t> generate(Model& model, std::vector<int32_t> tokens, int64_t max_new_tokens,
                              const SamplingParams& p, const std::vector<int32_t>& stop_tokens,
                              void (*on_token)(int32_t, void*), void* user) {
  DSCPP_CHECK(!tokens.empty(), "generate: empty prompt");
  const int64_t ctx = model.config().max_seq_len, V = model.config().vocab_size;
  Rng rng(p.seed);
  for (int64_t n = 0; n < max_new_tokens; n++) {
    int64_t T = std::min<int64_t>(int64_t(tokens.size()), ctx);
    Tensor in = Tensor::empty({1, T}, DType::i32);
    std::copy(tokens.end() - T, tokens.end(), in.data<int32_t>());
    Tensor logits = model.logits(in);
    if (!logits.device().is_cpu()) logits = logits.to(Device::cpu());
    int32_t next = sample_token(logits.data<float>() + (T - 1) * V, V, p, rng);
    tokens.push_back(next);
    if (on_token) on_token(next, user);
    if (std::find(stop_tokens.begin(), stop_tokens.end(), next) != stop_tokens.end()) break;
  }
  return tokens;
}

}  // namespace dscpp
