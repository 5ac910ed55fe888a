// DeepSpeed's tuners (autotuning/tuner/): over one space's experiments (indices 0..n-1, each with a feature row),
// grid search takes them in order, random search in a seeded random order, and the model-based tuner runs two seeds
// (the first experiment and a random one, as DeepSpeed's INIT_NUM = 2) and then, after each batch, refits its cost
// model (cost_model.h) on every finished trial (a failed trial scores 0, as DeepSpeed's) and takes the unvisited
// experiment it predicts best, or with probability 0.2 a random one (DeepSpeed's random_exploration_ratio).
// Trials that ran before the space's search (the micro-batch search's) are handed to it as prior observations: the
// model-based tuner fits on them at once and runs no random seed, and tune() counts early stopping from their best.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace dscpp::autotune {

class Tuner {
 public:
  explicit Tuner(size_t n) : visited_(n, false) {}
  virtual ~Tuner() = default;
  bool has_next() const;
  // Up to n unvisited experiments to run next (marked visited).
  virtual std::vector<size_t> next_batch(size_t n) = 0;
  // Their scores, higher is better; nullopt: the trial failed.
  virtual void update(const std::vector<size_t>& /*batch*/, const std::vector<std::optional<double>>& /*scores*/) {}
  // A finished trial outside the space's experiments (features as theirs); only the model-based tuner learns from it.
  virtual void prior(const std::vector<double>& /*features*/, std::optional<double> /*score*/) {}

 protected:
  std::vector<bool> visited_;
};

// type: "gridsearch" | "random" | "model_based" (autotuning.tuner_type); features: one row per experiment.
std::unique_ptr<Tuner> make_tuner(const std::string& type, std::vector<std::vector<double>> features, uint64_t seed);

struct TuneStats {
  size_t trials = 0;              // experiments run
  std::optional<size_t> best;     // index of the best, if any trial succeeded
  double best_score = 0;
  size_t best_iter = 0;           // trials run before the batch that found it
  bool early_stopped = false;     // tuner_early_stopping trials passed without a better one
};

// DeepSpeed's BaseTuner.tune: batches of sample_size (the trials that fit the slots at once) until n_trials ran or
// the space is exhausted, stopping early once `early_stopping` trials (0: never) have run since the best was found.
// prior_best: the best score of the prior observations, which a trial must beat to count as better.
TuneStats tune(Tuner& tuner, size_t sample_size, size_t n_trials, size_t early_stopping,
               const std::function<std::vector<std::optional<double>>(const std::vector<size_t>&)>& evaluate,
               std::optional<double> prior_best = std::nullopt);

}  // namespace dscpp::autotune
