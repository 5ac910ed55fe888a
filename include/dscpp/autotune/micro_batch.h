// The micro-batch search's arithmetic (DeepSpeed's Autotuner.get_tuning_micro_batch_size_list and
// run_tuning_micro_batch_sizes), with the memory estimate in place of DeepSpeed's out-of-memory probes: the largest
// micro-batch that fits comes from the estimator, so no trial is launched to find it.
//
// The global batch: a train_batch_size in the user's config fixes it, and a micro-batch is allowed when it divides
// train_batch_size / world (gradient accumulation makes up the rest); otherwise the config's
// gradient_accumulation_steps (1 when absent) is kept and the global batch follows the micro-batch, within
// autotuning.{min,max}_train_batch_size. autotuning.{min,max}_train_micro_batch_size_per_gpu bound it either way.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dscpp/runtime/autotuning_config.h"

namespace dscpp::autotune {

struct BatchRules {
  int world = 1;
  std::optional<int64_t> per_rank;  // train_batch_size / world when the global batch is fixed
  int64_t gas = 1;                  // when it is not
  int64_t min_mbs = 1, max_mbs = 1024;
  int64_t min_global = 1;
  std::optional<int64_t> max_global;

  bool allowed(int64_t mbs) const;
  int64_t gas_for(int64_t mbs) const;  // per_rank / mbs, or gas
  std::vector<int64_t> allowed_list() const;  // ascending
  std::string describe() const;        // "train_batch_size 64 fixed: micro-batch x accumulation = 32 per rank"
};
// Throws ConfigError naming the key when the config's batch keys leave no micro-batch (train_batch_size not a
// multiple of the world size, bounds that cross).
// world: the data-parallel ranks of a trial (its ranks over tp x pp), over which the global batch is split.
BatchRules batch_rules(const nlohmann::json& user_config, const AutotuningConfig& at, int world);

// The largest allowed micro-batch that fits (fits() is monotone: a larger micro-batch never needs less memory),
// by bisection over the allowed list; 0 when none does.
int64_t largest_fitting(const BatchRules& rules, const std::function<bool(int64_t)>& fits);

// DeepSpeed's list: from max(min, max / 2) up to `most` in num strides, keeping those whose accumulation differs
// from `most`'s (at a fixed global batch), then `most` itself.
std::vector<int64_t> tuning_micro_batch_sizes(const BatchRules& rules, int64_t most, int64_t num);

// DeepSpeed's refinement below the largest: the allowed micro-batches between the list's second largest + 1 and
// its largest, in strides of a third of that gap, largest first. The search runs them in order and stops at the
// first that does not beat the best so far by 5% (METRIC_PERCENT_DIFF_CONST).
std::vector<int64_t> refinement_micro_batches(const BatchRules& rules, const std::vector<int64_t>& list);
constexpr double kMetricPercentDiff = 0.05;

}  // namespace dscpp::autotune
