// The sampler's knobs, each against a distribution computed here by hand from its definition (sampler.h), on the
// logits l = [2, 1, 0, -1]: every draw is the token the inverse CDF in id order picks from it at Philox's u; seeded reproducibility; stop ids and
// log-probabilities.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "dscpp/inference/sampler.h"

using namespace dscpp;

namespace {

const std::vector<float> kLogits{2.0f, 1.0f, 0.0f, -1.0f};

// softmax(l / T) over the ids in `keep` (others 0).
std::vector<double> softmax_over(const std::vector<double>& l, double T, const std::vector<int>& keep) {
  std::vector<double> p(l.size(), 0.0);
  double sum = 0;
  for (int i : keep) sum += std::exp(l[size_t(i)] / T);
  for (int i : keep) p[size_t(i)] = std::exp(l[size_t(i)] / T) / sum;
  return p;
}

// The token the definition draws at u from distribution p: inverse CDF over the ids in ascending order.
int32_t inverse_cdf(const std::vector<double>& p, float u) {
  double acc = 0;
  for (size_t i = 0; i < p.size(); i++)
    if (p[i] > 0 && (acc += p[i]) > double(u)) return int32_t(i);
  return -1;
}

// Draws from `logits` after the output history `output`, one fresh sampler per seed, each against the token the
// definition picks from `want` at that seed's u (Philox(seed, counter = the step)): 300 draws see every candidate
// of these small distributions, and a token outside them, or an order other than the ids', fails.
void expect_dist(const SamplingParams& sp, const std::vector<int32_t>& prompt, const std::vector<int32_t>& output,
                 const std::vector<double>& want, const char* what,
                 const std::vector<float>& logits = kLogits) {
  std::vector<int> seen(want.size(), 0);
  for (uint64_t seed = 0; seed < 300; seed++) {
    SamplingParams p = sp;
    p.seed = seed;
    SequenceSampler s(p, prompt);
    // The output history: sample() records its token, so feed it logits that make the token certain.
    for (int32_t t : output) {
      std::vector<float> onehot(logits.size(), -1e9f);
      onehot[size_t(t)] = 1e9f;
      ASSERT_EQ(s.sample(onehot.data(), int64_t(onehot.size())).token, t);
    }
    const float u = Rng(RngState{seed, uint64_t(output.size()), 4}).uniform();
    const int32_t got = s.sample(logits.data(), int64_t(logits.size())).token;
    ASSERT_EQ(got, inverse_cdf(want, u)) << what << ", seed " << seed << ", u " << u;
    seen[size_t(got)]++;
  }
  for (size_t i = 0; i < want.size(); i++)
    if (want[i] > 0.02) {
      EXPECT_GT(seen[i], 0) << what << ": token " << i << " never drawn";
    }
}

const std::vector<double> L{2, 1, 0, -1};

TEST(Sampler, Temperature) {
  SamplingParams p;
  expect_dist(p, {}, {}, softmax_over(L, 1.0, {0, 1, 2, 3}), "T=1");
  p.temperature = 0.5f;
  expect_dist(p, {}, {}, softmax_over(L, 0.5, {0, 1, 2, 3}), "T=0.5");
  p.temperature = 0;
  expect_dist(p, {}, {}, {1, 0, 0, 0}, "greedy");
}

TEST(Sampler, TopKTopPMinP) {
  SamplingParams p;
  p.top_k = 2;
  expect_dist(p, {}, {}, softmax_over(L, 1.0, {0, 1}), "top_k 2");
  // Probabilities at T = 1: .6439, .2369, .0871, .0321. top_p 0.7: .6439 < .7 <= .8808, so the first two.
  p = {};
  p.top_p = 0.7f;
  expect_dist(p, {}, {}, softmax_over(L, 1.0, {0, 1}), "top_p 0.7");
  p.top_p = 0.9f;  // .8808 < .9 <= .9679
  expect_dist(p, {}, {}, softmax_over(L, 1.0, {0, 1, 2}), "top_p 0.9");
  // min_p 0.1: keep p >= .06439: tokens 0, 1, 2 (.0871), not 3 (.0321).
  p = {};
  p.min_p = 0.1f;
  expect_dist(p, {}, {}, softmax_over(L, 1.0, {0, 1, 2}), "min_p 0.1");
  p.min_p = 0.2f;  // >= .1288: tokens 0, 1
  expect_dist(p, {}, {}, softmax_over(L, 1.0, {0, 1}), "min_p 0.2");
  // Thresholds keep ties: top_k 1 over two maxima keeps both, and so does top_p 0.3 (tau = 1 holds all its ties).
  const std::vector<float> tied{1, 1, 0, 0};
  p = {};
  p.top_k = 1;
  expect_dist(p, {}, {}, softmax_over({1, 1, 0, 0}, 1.0, {0, 1}), "top_k 1 over a tie", tied);
  p = {};
  p.top_p = 0.3f;
  expect_dist(p, {}, {}, softmax_over({1, 1, 0, 0}, 1.0, {0, 1}), "top_p 0.3 over a tie", tied);
  p.top_k = 3;  // top_p's mass is that of the top-k set, the tie at 0 included: {1, 1, 0, 0}
  p.top_p = 0.8f;  // .7311 of the mass in {0, 1} < .8: tau = 0
  expect_dist(p, {}, {}, softmax_over({1, 1, 0, 0}, 1.0, {0, 1, 2, 3}), "top_k 3 keeps the tie, then top_p", tied);
}

TEST(Sampler, Penalties) {
  SamplingParams p;
  p.repetition_penalty = 2.0f;  // HF: positive logits divided, negative multiplied, prompt and output alike
  expect_dist(p, {0, 3, 3}, {}, softmax_over({1, 1, 0, -2}, 1.0, {0, 1, 2, 3}), "repetition over the prompt");
  expect_dist(p, {}, {3}, softmax_over({2, 1, 0, -2}, 1.0, {0, 1, 2, 3}), "repetition over the output");
  p = {};
  p.presence_penalty = 0.5f;  // OpenAI: output tokens only; l -= 0.25 * count + 0.5
  p.frequency_penalty = 0.25f;
  expect_dist(p, {0}, {1, 1, 2}, softmax_over({2, 0, -0.75, -1}, 1.0, {0, 1, 2, 3}), "presence + frequency");
  p.temperature = 0;  // greedy sees the penalties too
  p.presence_penalty = 2.0f;
  p.frequency_penalty = 0;
  expect_dist(p, {}, {0}, {0, 1, 0, 0}, "greedy after a presence penalty");
}

TEST(Sampler, DrawFollowsTheDistributionAndIsSeeded) {
  SamplingParams p;
  p.temperature = 0.8f;
  p.seed = 42;
  const std::vector<double> want = softmax_over(L, 0.8, {0, 1, 2, 3});
  SequenceSampler a(p, {}), b(p, {});
  std::vector<int> count(4, 0);
  const int n = 20000;
  std::vector<int32_t> first;
  for (int i = 0; i < n; i++) {
    const int32_t t = a.sample(kLogits.data(), 4).token;
    ASSERT_EQ(t, b.sample(kLogits.data(), 4).token) << "same seed, step " << i;
    count[size_t(t)]++;
    if (i < 32) first.push_back(t);
  }
  for (size_t i = 0; i < 4; i++) EXPECT_NEAR(double(count[i]) / n, want[i], 0.015) << "token " << i;
  p.seed = 43;
  SequenceSampler c(p, {});
  std::vector<int32_t> other;
  for (int i = 0; i < 32; i++) other.push_back(c.sample(kLogits.data(), 4).token);
  EXPECT_NE(first, other) << "another seed, the same 32 draws";
}

TEST(Sampler, StopIdsAndLogprobs) {
  SamplingParams p;
  p.temperature = 0;
  p.stop_token_ids = {0};
  p.logprobs = 2;
  p.repetition_penalty = 1.5f;  // log-probabilities are of the raw logits, whatever the processing
  SequenceSampler s(p, {1});
  const SampleResult r = s.sample(kLogits.data(), 4);
  EXPECT_EQ(r.token, 0);
  EXPECT_TRUE(r.stop);
  const double lse = std::log(std::exp(2.0) + std::exp(1.0) + std::exp(0.0) + std::exp(-1.0));
  EXPECT_NEAR(r.logprob, 2.0 - lse, 1e-6);
  ASSERT_EQ(r.top.size(), 2u);
  EXPECT_EQ(r.top[0].token, 0);
  EXPECT_EQ(r.top[1].token, 1);
  EXPECT_NEAR(r.top[1].logprob, 1.0 - lse, 1e-6);
  p.stop_token_ids = {3};
  EXPECT_FALSE(SequenceSampler(p, {}).sample(kLogits.data(), 4).stop);
}

TEST(Sampler, InvalidKnobsAreRefusedByName) {
  auto msg = [](SamplingParams p) {
    try {
      p.validate();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  SamplingParams p;
  p.top_p = 0;
  EXPECT_NE(msg(p).find("top_p"), std::string::npos);
  p = {};
  p.repetition_penalty = 0;
  EXPECT_NE(msg(p).find("repetition_penalty"), std::string::npos);
  p = {};
  p.frequency_penalty = 3;
  EXPECT_NE(msg(p).find("frequency_penalty"), std::string::npos);
}

}  // namespace
