#include "dscpp/autotune/tuner.h"

#include <algorithm>
#include <numeric>

#include "dscpp/autotune/cost_model.h"
#include "dscpp/core/check.h"

namespace dscpp::autotune {

namespace {

class GridTuner : public Tuner {
 public:
  explicit GridTuner(std::vector<size_t> order) : Tuner(order.size()), order_(std::move(order)) {}
  std::vector<size_t> next_batch(size_t n) override {
    std::vector<size_t> out;
    for (size_t i : order_)
      if (out.size() < n && !visited_[i]) visited_[i] = true, out.push_back(i);
    return out;
  }

 private:
  std::vector<size_t> order_;
};

class ModelBasedTuner : public Tuner {
 public:
  ModelBasedTuner(std::vector<std::vector<double>> features, uint64_t seed)
      : Tuner(features.size()), features_(std::move(features)), rng_(seed) {
    if (!features_.empty()) seeds_.push_back(0);  // DeepSpeed's first seed is experiment 0
    if (features_.size() > 1) seeds_.push_back(1 + pick(features_.size() - 1));
  }

  std::vector<size_t> next_batch(size_t n) override {
    std::vector<size_t> out;
    while (out.size() < n && has_next()) {
      size_t i = next_seed();
      if (i == kNone) i = explore() ? random_unvisited() : best_predicted();
      visited_[i] = true;
      out.push_back(i);
    }
    return out;
  }

  void update(const std::vector<size_t>& batch, const std::vector<std::optional<double>>& scores) override {
    for (size_t k = 0; k < batch.size(); k++) {
      x_.push_back(features_[batch[k]]);
      y_.push_back(scores[k].value_or(0.0));
    }
    model_.fit(x_, y_);
    fitted_ = true;
  }

  // The seeds exist to give the model its first points; trials that already ran give it better ones.
  void prior(const std::vector<double>& features, std::optional<double> score) override {
    x_.push_back(features);
    y_.push_back(score.value_or(0.0));
    model_.fit(x_, y_);
    fitted_ = true;
    seeds_.clear();
  }

 private:
  static constexpr size_t kNone = size_t(-1);
  static constexpr double kRandomExploration = 0.2;

  size_t pick(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }
  bool explore() { return !fitted_ || std::uniform_real_distribution<double>(0, 1)(rng_) < kRandomExploration; }
  size_t next_seed() {
    while (!seeds_.empty()) {
      const size_t i = seeds_.front();
      seeds_.erase(seeds_.begin());
      if (!visited_[i]) return i;
    }
    return kNone;
  }
  size_t random_unvisited() {
    std::vector<size_t> left;
    for (size_t i = 0; i < visited_.size(); i++)
      if (!visited_[i]) left.push_back(i);
    return left[pick(left.size())];
  }
  size_t best_predicted() {
    size_t best = kNone;
    double best_v = 0;
    for (size_t i = 0; i < visited_.size(); i++) {
      if (visited_[i]) continue;
      const double v = model_.predict(features_[i]);
      if (best == kNone || v > best_v) best = i, best_v = v;  // ties: the first in grid order
    }
    return best;
  }

  std::vector<std::vector<double>> features_;
  std::mt19937_64 rng_;
  std::vector<size_t> seeds_;
  std::vector<std::vector<double>> x_;
  std::vector<double> y_;
  CostModel model_;
  bool fitted_ = false;
};

}  // namespace

bool Tuner::has_next() const { return std::find(visited_.begin(), visited_.end(), false) != visited_.end(); }

std::unique_ptr<Tuner> make_tuner(const std::string& type, std::vector<std::vector<double>> features, uint64_t seed) {
  std::vector<size_t> order(features.size());
  std::iota(order.begin(), order.end(), 0);
  if (type == "gridsearch") return std::make_unique<GridTuner>(order);
  if (type == "random") {
    std::mt19937_64 rng(seed);
    std::shuffle(order.begin(), order.end(), rng);
    return std::make_unique<GridTuner>(order);
  }
  DSCPP_CHECK(type == "model_based", "autotuning.tuner_type: unknown tuner '", type, "'");
  return std::make_unique<ModelBasedTuner>(std::move(features), seed);
}

TuneStats tune(Tuner& tuner, size_t sample_size, size_t n_trials, size_t early_stopping,
               const std::function<std::vector<std::optional<double>>(const std::vector<size_t>&)>& evaluate,
               std::optional<double> prior_best) {
  TuneStats st;
  st.best_score = prior_best.value_or(0.0);
  bool have_best = prior_best.has_value();
  sample_size = std::max<size_t>(1, sample_size);
  while (st.trials < n_trials && tuner.has_next()) {
    const std::vector<size_t> batch = tuner.next_batch(std::min(sample_size, n_trials - st.trials));
    const std::vector<std::optional<double>> scores = evaluate(batch);
    for (size_t k = 0; k < batch.size(); k++)
      if (scores[k] && (!have_best || *scores[k] > st.best_score)) {
        have_best = true;
        st.best = batch[k];
        st.best_score = *scores[k];
        st.best_iter = st.trials;
      }
    st.trials += batch.size();
    tuner.update(batch, scores);
    if (early_stopping && st.trials >= st.best_iter + early_stopping && st.trials < n_trials && tuner.has_next()) {
      st.early_stopped = true;
      break;
    }
  }
  return st;
}

}  // namespace dscpp::autotune
