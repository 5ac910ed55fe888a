// Learning-rate schedules with DeepSpeed's formulas (deepspeed/runtime/lr_schedules.py): WarmupLR, WarmupDecayLR,
// WarmupCosineLR, OneCycle; no scheduler = the optimizer's constant lr.
//
// Step semantics (as DeepSpeed): a scheduler starts at last_batch_iteration = -1 and its constructor already sets
// the lr for -1; the engine calls step() after each optimizer step that was not skipped (fp16 overflow), which
// increments last_batch_iteration and sets the lr for the new value. So optimizer step k (1-based, counting applied
// steps) runs with lr_at(k - 2): the first step uses lr_at(-1) (WarmupLR: warmup_min_lr; WarmupCosineLR: 0).
//
// Formulas follow DeepSpeed 0.17+ where it fixed 0.16.5: WarmupCosineLR clamps the cosine progress at 1 (no rise
// after total_num_steps), OneCycle honours the stair counts, WarmupLR's warmup_max_lr defaults to the optimizer lr.
#pragma once
#include <array>
#include <cstdint>
#include <optional>

#include <nlohmann/json.hpp>

#include "dscpp/runtime/config_sections.h"

namespace dscpp {

class LRScheduler {
 public:
  // base_lr: the optimizer's lr (WarmupCosineLR scales it; WarmupLR/WarmupDecayLR use it when warmup_max_lr is
  // unset; the constant schedule returns it).
  LRScheduler(const SchedulerConfig& cfg, double base_lr);

  double lr_at(int64_t last_batch_iteration) const;  // -1 = the initial lr
  // OneCycle with cycle_momentum: (beta1, 0.99) for the optimizer (DeepSpeed sets beta2 to 0.99!); the initial
  // value (-1) is (cycle_min_mom, 0.99) as DeepSpeed's constructor sets it. nullopt for the other schedules.
  // DeepSpeed skips momentum cycling (with a warning) for optimizers without betas (SGD); so should the caller.
  std::optional<std::array<double, 2>> betas_at(int64_t last_batch_iteration) const;

  void step() { ++last_batch_iteration_; }  // after each applied optimizer step
  double get_lr() const { return lr_at(last_batch_iteration_); }
  int64_t last_batch_iteration() const { return last_batch_iteration_; }
  const SchedulerConfig& config() const { return cfg_; }

  nlohmann::json state_json() const { return {{"last_batch_iteration", last_batch_iteration_}}; }  // as DeepSpeed
  void load_state(const nlohmann::json& sd) { last_batch_iteration_ = sd.at("last_batch_iteration").get<int64_t>(); }

 private:
  double warmup_gamma(int64_t it) const;       // WarmupLR / WarmupDecayLR / WarmupCosineLR ramp in [0, 1]
  double onecycle_scale(int64_t it) const;     // OneCycle position in the cycle, in [0, 1]
  SchedulerConfig cfg_;
  double base_lr_;
  int64_t warmup_steps_ = 2;                   // max(2, warmup_num_steps)
  int64_t last_batch_iteration_ = -1;
};

LRScheduler make_lr_scheduler(const SchedulerConfig& cfg, double base_lr);

}  // namespace dscpp
