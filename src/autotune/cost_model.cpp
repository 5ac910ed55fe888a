#include "dscpp/autotune/cost_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "dscpp/core/check.h"

namespace dscpp::autotune {

void CostModel::fit(const std::vector<std::vector<double>>& x, const std::vector<double>& y, int rounds,
                    double shrinkage) {
  DSCPP_CHECK(x.size() == y.size() && !x.empty(), "CostModel::fit: ", x.size(), " rows for ", y.size(), " scores");
  const size_t n = x.size(), f = x[0].size();
  scale_ = 0;  // scores in units of the largest, so that the split threshold below means the same for any metric
  for (double v : y) scale_ = std::max(scale_, std::abs(v));
  if (scale_ == 0) scale_ = 1;
  base_ = std::accumulate(y.begin(), y.end(), 0.0) / double(n) / scale_;
  stumps_.clear();
  std::vector<double> r(n);
  for (size_t i = 0; i < n; i++) r[i] = y[i] / scale_ - base_;
  std::vector<size_t> order(n);
  for (int round = 0; round < rounds; round++) {
    Stump best;
    double best_gain = 1e-12;  // an improvement of the squared error this small is no split
    for (size_t k = 0; k < f; k++) {
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return x[a][k] < x[b][k]; });
      const double total = std::accumulate(r.begin(), r.end(), 0.0);
      double left = 0;
      for (size_t i = 0; i + 1 < n; i++) {
        left += r[order[i]];
        const double a = x[order[i]][k], b = x[order[i + 1]][k];
        if (a == b) continue;  // split only between distinct values
        const double nl = double(i + 1), nr = double(n - i - 1);
        // The squared error's reduction by the two means: sum_l^2 / n_l + sum_r^2 / n_r - total^2 / n.
        const double gain = left * left / nl + (total - left) * (total - left) / nr - total * total / double(n);
        if (gain > best_gain) {
          best_gain = gain;
          best = {k, (a + b) / 2, left / nl, (total - left) / nr};
        }
      }
    }
    if (best_gain <= 1e-12) break;  // the residuals are constant on every feature
    best.left *= shrinkage;
    best.right *= shrinkage;
    for (size_t i = 0; i < n; i++) r[i] -= x[i][best.feature] <= best.threshold ? best.left : best.right;
    stumps_.push_back(best);
  }
}

double CostModel::predict(const std::vector<double>& x) const {
  double s = base_;
  for (const Stump& t : stumps_) s += x[t.feature] <= t.threshold ? t.left : t.right;
  return s * scale_;
}

}  // namespace dscpp::autotune
