// The training model as the inference tests' reference: its full forward's logits for a sequence's last token, and
// the f32 comparison rule (|got - ref| <= 1e-5 * max|ref|: the two forwards sum in different orders).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "dscpp/models/model.h"

namespace dscpp::test_fixtures {

// Row T-1 of the training model's logits for tokens (its full forward, no cache).
inline std::vector<float> reference_last(Model& m, const std::vector<int32_t>& tokens) {
  const int64_t T = int64_t(tokens.size()), V = m.config().vocab_size;
  Tensor in = Tensor::empty({1, T}, DType::i32);
  std::copy(tokens.begin(), tokens.end(), in.data<int32_t>());
  const Tensor l = m.logits(in);
  return std::vector<float>(l.data<float>() + (T - 1) * V, l.data<float>() + T * V);
}

inline void expect_logits_close(const float* got, const std::vector<float>& ref, const std::string& what) {
  float scale = 0, worst = 0;
  for (float r : ref) scale = std::max(scale, std::fabs(r));
  ASSERT_GT(scale, 0.1f) << what << ": reference logits near zero";
  for (size_t i = 0; i < ref.size(); i++) worst = std::max(worst, std::fabs(got[i] - ref[i]));
  EXPECT_LE(worst, 1e-5f * scale) << what << ": worst |diff| " << worst << " vs logits scale " << scale;
}

// Two logits tensors of one shape (host, f32): the largest |got - ref| (infinite where either is NaN) and the
// largest |ref|, for the GPU tests' tolerance relative to the logits' own size.
struct LogitsDiff {
  float worst = 0, scale = 0;
};
inline LogitsDiff logits_diff(const Tensor& got, const Tensor& ref) {
  LogitsDiff d;
  for (int64_t i = 0; i < ref.numel(); i++) {
    d.scale = std::max(d.scale, std::fabs(ref.data<float>()[i]));
    const float x = std::fabs(got.data<float>()[i] - ref.data<float>()[i]);
    d.worst = std::isnan(x) ? INFINITY : std::max(d.worst, x);
  }
  return d;
}

}  // namespace dscpp::test_fixtures
