// The engine's batch sampler (src/inference/sampling/batch_sampler.h) against SequenceSampler::sample row by row:
// rows mixing greedy, top-k, top-p, min-p, penalties and log-probabilities, rows nobody wants, over several steps
// (the histories grow); on the host, then device against host (skipped without CUDA).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "dscpp/core/cuda.h"
#include "inference/sampling/batch_sampler.h"

using namespace dscpp;

namespace {

constexpr int64_t kV = 1000, kRows = 7;

std::vector<SamplingParams> row_params() {
  std::vector<SamplingParams> ps(static_cast<size_t>(kRows));
  ps[0].temperature = 0;
  ps[0].logprobs = 3;
  ps[1].top_k = 20, ps[1].seed = 7;
  ps[2].top_p = 0.8f, ps[2].temperature = 0.7f, ps[2].repetition_penalty = 1.3f, ps[2].seed = 1ull << 40;
  ps[3].min_p = 0.05f, ps[3].temperature = 1.4f, ps[3].presence_penalty = 0.5f, ps[3].frequency_penalty = 0.3f;
  ps[3].logprobs = 5, ps[3].seed = 3;
  // ps[4]: a row nobody wants
  ps[5].top_k = 50, ps[5].top_p = 0.9f, ps[5].min_p = 0.01f, ps[5].repetition_penalty = 0.8f, ps[5].logprobs = 0;
  ps[5].seed = 11;
  ps[6].temperature = 0, ps[6].repetition_penalty = 2.0f, ps[6].stop_token_ids = {1, 2, 3};
  return ps;
}

// Logits of a step: random, some rows with ties, and row 6 pushed towards its stop tokens.
std::vector<float> step_logits(int step) {
  std::mt19937 rng(unsigned(100 + step));
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> l(static_cast<size_t>(kRows * kV));
  for (float& x : l) x = nd(rng);
  for (int64_t i = 0; i < kV; i++) l[size_t(1 * kV + i)] = std::round(l[size_t(1 * kV + i)]);  // ties
  l[size_t(6 * kV + 2)] = 30;
  return l;
}

std::vector<int32_t> prompt(int64_t s) { return {int32_t(s), 5, 5, 17, int32_t(100 + s), int32_t(kV + 3)}; }

void expect_same(const SampleResult& a, const SampleResult& b, const std::string& where, float tol) {
  EXPECT_EQ(a.token, b.token) << where;
  EXPECT_EQ(a.stop, b.stop) << where;
  EXPECT_NEAR(a.logprob, b.logprob, tol) << where;
  ASSERT_EQ(a.top.size(), b.top.size()) << where;
  for (size_t j = 0; j < a.top.size(); j++) {
    EXPECT_EQ(a.top[j].token, b.top[j].token) << where << ", top " << j;
    EXPECT_NEAR(a.top[j].logprob, b.top[j].logprob, tol) << where << ", top " << j;
  }
}

// Runs 6 steps of the batch on `dev` and, row by row, through SequenceSampler::sample on the host.
void compare(Device dev, float tol) {
  const std::vector<SamplingParams> ps = row_params();
  std::vector<SequenceSampler> batch, single;
  for (int64_t s = 0; s < kRows; s++) batch.emplace_back(ps[size_t(s)], prompt(s)), single.emplace_back(ps[size_t(s)], prompt(s));
  BatchSampler sampler;
  int drawn = 0, stops = 0, with_top = 0;
  for (int step = 0; step < 6; step++) {
    const std::vector<float> l = step_logits(step);
    Tensor host = Tensor::empty({kRows, kV}, DType::f32);
    std::copy(l.begin(), l.end(), host.data<float>());
    std::vector<SequenceSampler*> rows;
    for (int64_t s = 0; s < kRows; s++) rows.push_back(s == 4 ? nullptr : &batch[size_t(s)]);
    const std::vector<SampleResult> got = sampler.sample(dev.is_cpu() ? host : host.to(dev), rows);
    ASSERT_EQ(got.size(), size_t(kRows));
    EXPECT_EQ(got[4].token, -1) << "a row nobody wants";
    for (int64_t s = 0; s < kRows; s++) {
      if (s == 4) continue;
      const SampleResult want = single[size_t(s)].sample(l.data() + s * kV, kV);
      expect_same(got[size_t(s)], want, "step " + std::to_string(step) + ", row " + std::to_string(s), tol);
      EXPECT_EQ(batch[size_t(s)].steps(), single[size_t(s)].steps());
      EXPECT_EQ(batch[size_t(s)].history(), single[size_t(s)].history());
      drawn++, stops += want.stop, with_top += !want.top.empty();
    }
  }
  EXPECT_EQ(drawn, 36);
  EXPECT_GT(stops, 0) << "row 6 never stopped";
  EXPECT_GT(with_top, 0);
  // Row 6 is greedy with a repetition penalty: its first token (2) is penalised from then on.
  EXPECT_EQ(batch[6].history().at(2), 6);
}

TEST(BatchSampler, HostBatchMatchesRowByRow) { compare(Device::cpu(), 0.0f); }

TEST(BatchSampler, DeviceMatchesHost) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  compare(Device::cuda(0), 2e-5f);
}

TEST(BatchSampler, ReusesItsBuffersAsTheBatchChanges) {
  BatchSampler sampler;
  SamplingParams p;
  p.seed = 5;
  for (int64_t S : {3, 1, 5}) {
    std::vector<SequenceSampler> a, b;
    for (int64_t s = 0; s < S; s++) a.emplace_back(p, prompt(s)), b.emplace_back(p, prompt(s));
    const std::vector<float> l = step_logits(int(S));
    Tensor host = Tensor::empty({S, kV}, DType::f32);
    std::copy(l.begin(), l.begin() + S * kV, host.data<float>());
    std::vector<SequenceSampler*> rows;
    for (auto& x : a) rows.push_back(&x);
    const std::vector<SampleResult> got = sampler.sample(host, rows);
    for (int64_t s = 0; s < S; s++) EXPECT_EQ(got[size_t(s)].token, b[size_t(s)].sample(l.data() + s * kV, kV).token);
  }
}

}  // namespace
