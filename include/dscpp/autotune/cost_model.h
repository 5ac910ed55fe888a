// The model-based tuner's cost model: gradient-boosted decision stumps (regression trees of depth one, squared
// loss, shrinkage 0.3 as XGBoost's default eta) fitted on the finished trials' features and scores, predicting the
// score of those not run yet. DeepSpeed's ModelBasedTuner fits XGBoost's "rank:pairwise" (depth 3) on the same kind
// of data; with a handful to fifty trials per space, stumps rank as well, need no library on the GPU machines (Debian
// has libxgboost-dev, the GPU image does not), and fit the same way on every machine.
#pragma once
#include <cstddef>
#include <vector>

namespace dscpp::autotune {

class CostModel {
 public:
  // x: one feature row per trial (every row of one length); y: its score (higher is better).
  void fit(const std::vector<std::vector<double>>& x, const std::vector<double>& y, int rounds = 100,
           double shrinkage = 0.3);
  double predict(const std::vector<double>& x) const;
  size_t stumps() const { return stumps_.size(); }

 private:
  struct Stump {
    size_t feature = 0;
    double threshold = 0, left = 0, right = 0;  // x[feature] <= threshold ? left : right
  };
  double base_ = 0, scale_ = 1;
  std::vector<Stump> stumps_;
};

}  // namespace dscpp::autotune
