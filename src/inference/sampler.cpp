// The sampler (semantics in include/dscpp/inference/sampler.h).
#include "dscpp/inference/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace dscpp {
namespace {

int32_t argmax(const float* l, int64_t V) { return int32_t(std::max_element(l, l + V) - l); }

// Candidates in descending order of l (ties: lower id first) with their probabilities, after temperature, top-k,
// top-p and min-p; the probabilities are unnormalised (the draw scales u by their sum).
struct Candidates {
  std::vector<int32_t> ids;
  std::vector<double> w;
};

Candidates candidates(const float* l, int64_t V, const SamplingParams& p) {
  Candidates c;
  c.ids.resize(size_t(V));
  std::iota(c.ids.begin(), c.ids.end(), 0);
  const int64_t k = (p.top_k > 0 && p.top_k < V) ? p.top_k : V;
  auto by_logit = [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); };
  std::partial_sort(c.ids.begin(), c.ids.begin() + k, c.ids.end(), by_logit);
  c.ids.resize(size_t(k));
  c.w.resize(c.ids.size());
  const double mx = l[c.ids[0]];
  double sum = 0.0;
  for (size_t i = 0; i < c.ids.size(); i++) sum += c.w[i] = std::exp((double(l[c.ids[i]]) - mx) / p.temperature);
  size_t keep = c.ids.size();
  if (p.top_p < 1.0f) {
    double acc = 0.0;
    for (size_t i = 0; i < keep; i++) {
      acc += c.w[i] / sum;
      if (acc >= double(p.top_p)) { keep = i + 1; break; }
    }
  }
  if (p.min_p > 0.0f)  // w[0] is the largest: keep w >= min_p * w[0], a prefix
    while (keep > 1 && c.w[keep - 1] < double(p.min_p) * c.w[0]) keep--;
  c.ids.resize(keep);
  c.w.resize(keep);
  return c;
}

// Inverse CDF at u in [0, 1) over the candidates in order.
int32_t draw(const Candidates& c, float u) {
  double r = double(u) * std::accumulate(c.w.begin(), c.w.end(), 0.0);
  for (size_t i = 0; i < c.ids.size(); i++) {
    r -= c.w[i];
    if (r < 0.0) return c.ids[i];
  }
  return c.ids.back();
}

}  // namespace

void SamplingParams::validate() const {
  DSCPP_CHECK(temperature >= 0 && std::isfinite(temperature), "sampling: temperature must be >= 0, got ", temperature);
  DSCPP_CHECK(top_k >= 0, "sampling: top_k must be >= 0 (0 = off), got ", top_k);
  DSCPP_CHECK(top_p > 0 && top_p <= 1, "sampling: top_p must be in (0, 1], got ", top_p);
  DSCPP_CHECK(min_p >= 0 && min_p <= 1, "sampling: min_p must be in [0, 1], got ", min_p);
  DSCPP_CHECK(repetition_penalty > 0 && std::isfinite(repetition_penalty),
              "sampling: repetition_penalty must be > 0 (1 = off), got ", repetition_penalty);
  DSCPP_CHECK(std::fabs(presence_penalty) <= 2, "sampling: presence_penalty must be in [-2, 2], got ", presence_penalty);
  DSCPP_CHECK(std::fabs(frequency_penalty) <= 2, "sampling: frequency_penalty must be in [-2, 2], got ",
              frequency_penalty);
  DSCPP_CHECK(logprobs >= -1 && logprobs <= 20, "sampling: logprobs must be -1 (none) or in [0, 20], got ", logprobs);
}

SequenceSampler::SequenceSampler(SamplingParams p, const std::vector<int32_t>& prompt) : p_(std::move(p)) {
  p_.validate();
  for (int32_t t : prompt) prompt_[t]++;
}

std::vector<float> SequenceSampler::penalized(const float* logits, int64_t V) const {
  std::vector<float> l(logits, logits + V);
  if (p_.repetition_penalty != 1.0f) {
    auto penalize = [&](int32_t t) {
      if (t >= 0 && t < V) l[size_t(t)] = l[size_t(t)] > 0 ? l[size_t(t)] / p_.repetition_penalty
                                                           : l[size_t(t)] * p_.repetition_penalty;
    };
    for (const auto& [t, n] : prompt_) penalize(t);
    for (const auto& [t, n] : output_)
      if (!prompt_.count(t)) penalize(t);  // once per token, seen in the prompt or not
  }
  for (const auto& [t, n] : output_)
    if (t >= 0 && t < V) l[size_t(t)] -= p_.frequency_penalty * float(n) + p_.presence_penalty;
  return l;
}

std::vector<double> SequenceSampler::distribution(const float* logits, int64_t V) const {
  const std::vector<float> l = penalized(logits, V);
  std::vector<double> out(size_t(V), 0.0);
  if (p_.temperature <= 0.0f) {
    out[size_t(argmax(l.data(), V))] = 1.0;
    return out;
  }
  const Candidates c = candidates(l.data(), V, p_);
  const double sum = std::accumulate(c.w.begin(), c.w.end(), 0.0);
  for (size_t i = 0; i < c.ids.size(); i++) out[size_t(c.ids[i])] = c.w[i] / sum;
  return out;
}

SampleResult SequenceSampler::sample(const float* logits, int64_t V) {
  DSCPP_CHECK(V > 0, "sample: empty vocabulary");
  // Without penalties the logits are read in place: a copy of a 128K-token row per request and step would be a
  // large part of a decode step's host time.
  const bool plain = p_.repetition_penalty == 1.0f && p_.frequency_penalty == 0.0f && p_.presence_penalty == 0.0f;
  std::vector<float> copy;
  if (!plain) copy = penalized(logits, V);
  const float* l = plain ? logits : copy.data();
  SampleResult r;
  if (p_.temperature <= 0.0f) {
    r.token = argmax(l, V);
  } else {
    const float u = Rng(RngState{p_.seed, uint64_t(step_), 4}).uniform();  // Philox(seed, step): see the header
    r.token = draw(candidates(l, V, p_), u);
  }
  step_++;
  output_[r.token]++;
  r.stop = std::find(p_.stop_token_ids.begin(), p_.stop_token_ids.end(), r.token) != p_.stop_token_ids.end();
  if (p_.logprobs >= 0) {
    const double mx = *std::max_element(logits, logits + V);
    double sum = 0.0;
    for (int64_t i = 0; i < V; i++) sum += std::exp(double(logits[i]) - mx);
    const double lse = mx + std::log(sum);
    r.logprob = float(double(logits[r.token]) - lse);
    std::vector<int32_t> ids(static_cast<size_t>(V));
    std::iota(ids.begin(), ids.end(), 0);
    const int64_t n = std::min<int64_t>(p_.logprobs, V);
    std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (int64_t i = 0; i < n; i++) r.top.push_back({ids[size_t(i)], float(double(logits[ids[size_t(i)]]) - lse)});
  }
  return r;
}

int32_t sample_token(const float* logits, int64_t V, const SamplingParams& p, Rng& rng) {
  DSCPP_CHECK(V > 0, "sample_token: empty vocabulary");
  if (p.temperature <= 0.0f) return argmax(logits, V);
  return draw(candidates(logits, V, p), rng.uniform());
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
  SamplingParams sp = p;
  sp.stop_token_ids.insert(sp.stop_token_ids.end(), stop_tokens.begin(), stop_tokens.end());
  SequenceSampler sampler(sp, tokens);
  for (int64_t n = 0; n < max_new_tokens; n++) {
    int64_t T = std::min<int64_t>(int64_t(tokens.size()), ctx);
    Tensor in = Tensor::empty({1, T}, DType::i32);
    std::copy(tokens.end() - T, tokens.end(), in.data<int32_t>());
    Tensor logits = model.logits(in);
    if (!logits.device().is_cpu()) logits = logits.to(Device::cpu());
    const SampleResult r = sampler.sample(logits.data<float>() + (T - 1) * V, V);
    tokens.push_back(r.token);
    if (on_token) on_token(r.token, user);
    if (r.stop) break;
  }
  return tokens;
}

}  // namespace dscpp
