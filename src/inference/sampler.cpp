// The sampler (semantics in include/dscpp/inference/sampler.h).
#include "dscpp/inference/sampler.h"

#include <algorithm>
#include <cmath>

#include "inference/sampling/batch_sampler.h"

namespace dscpp {

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
  for (int32_t t : prompt) history_.emplace(t, 0);
}

bool SequenceSampler::penalized() const {
  return p_.repetition_penalty != 1.0f || p_.frequency_penalty != 0.0f || p_.presence_penalty != 0.0f;
}

SampleResult SequenceSampler::sample(const float* logits, int64_t V) {
  DSCPP_CHECK(V > 0, "sample: empty vocabulary");
  BatchSampler one;
  return one.sample(Tensor::wrap(const_cast<float*>(logits), {1, V}, DType::f32), {this})[0];
}

SampleResult SequenceSampler::record(int32_t token) {
  SampleResult r;
  r.token = token;
  step_++;
  history_[token]++;
  r.stop = std::find(p_.stop_token_ids.begin(), p_.stop_token_ids.end(), token) != p_.stop_token_ids.end();
  return r;
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
