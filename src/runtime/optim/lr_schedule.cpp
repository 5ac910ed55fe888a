// DeepSpeed's LR schedule formulas, evaluated at any last_batch_iteration (all math in double, as Python).
#include "dscpp/runtime/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "dscpp/core/check.h"

namespace dscpp {

LRScheduler::LRScheduler(const SchedulerConfig& cfg, double base_lr) : cfg_(cfg), base_lr_(base_lr) {
  warmup_steps_ = std::max<int64_t>(2, cfg.warmup_num_steps);
  if (cfg.type == "OneCycle")
    DSCPP_CHECK(cfg.cycle_first_step_size > 0 && cfg.cycle_second_step_size.value_or(0) >= 0,
                "OneCycle: cycle_first_step_size must be positive and cycle_second_step_size non-negative");
  else if (!cfg.type.empty())
    DSCPP_CHECK(cfg.type == "WarmupLR" || cfg.type == "WarmupDecayLR" || cfg.type == "WarmupCosineLR",
                "LRScheduler: unknown scheduler type '", cfg.type, "'");
}

// Warmup ramp: log: ln(it + 1) / ln(W); linear: it / W; 1 once it >= W.
double LRScheduler::warmup_gamma(int64_t it) const {
  if (it >= warmup_steps_) return 1.0;
  if (cfg_.warmup_type == "linear") return double(it) / double(warmup_steps_);
  return std::log(double(it + 1)) / std::log(double(warmup_steps_));
}

// OneCycle: batch = it + 1 within a cycle of first + second steps; rising half x / ratio, falling half
// (x - 1) / (ratio - 1); with stairs, floor(position * stairs) / stairs from the integer offset in the cycle.
double LRScheduler::onecycle_scale(int64_t it) const {
  const double first = double(cfg_.cycle_first_step_size);
  const double second = cfg_.cycle_second_step_size ? double(*cfg_.cycle_second_step_size) : first;
  const double total = first + second, ratio = first / total;
  const double batch = double(it + 1);
  const double cycle = std::floor(1.0 + batch / total);
  const double x = 1.0 + batch / total - cycle;
  double scale;
  int64_t stairs;
  if (x <= ratio) {
    scale = x / ratio;
    stairs = cfg_.cycle_first_stair_count;
  } else {
    scale = (x - 1.0) / (ratio - 1.0);
    stairs = cfg_.cycle_second_stair_count.value_or(cfg_.cycle_first_stair_count);
  }
  if (stairs > 0) {
    double ci = std::fmod(batch, total);  // batch >= 0, so fmod is Python's %
    double pos = ci <= first ? ci * double(stairs) / first : (total - ci) * double(stairs) / second;
    scale = std::floor(pos) / double(stairs);
  }
  return scale;
}

double LRScheduler::lr_at(int64_t it) const {
  const std::string& t = cfg_.type;
  if (t.empty()) return base_lr_;
  if (t == "WarmupLR" || t == "WarmupDecayLR") {
    const double min_lr = cfg_.warmup_min_lr, max_lr = cfg_.warmup_max_lr.value_or(base_lr_);
    if (it < 0) return min_lr;  // DeepSpeed: "before it has started" -> min lr
    double gamma = warmup_gamma(it);
    if (t == "WarmupDecayLR" && it >= warmup_steps_)
      gamma = std::max(0.0, double(cfg_.total_num_steps - it) /
                                std::max(1.0, double(cfg_.total_num_steps - warmup_steps_)));
    return min_lr + (max_lr - min_lr) * gamma;
  }
  if (t == "WarmupCosineLR") {
    if (it < 0) return 0.0;
    double ratio;
    if (it < warmup_steps_) {
      ratio = cfg_.warmup_min_ratio + warmup_gamma(it) * (1.0 - cfg_.warmup_min_ratio);
    } else {
      double done = double(it - warmup_steps_ + 1);
      double span = double(std::max<int64_t>(1, cfg_.total_num_steps - warmup_steps_));
      double progress = std::min(1.0, done / span);
      ratio = std::max(0.0, cfg_.cos_min_ratio + (1.0 - cfg_.cos_min_ratio) * (1.0 + std::cos(M_PI * progress)) / 2.0);
    }
    return base_lr_ * ratio;
  }
  // OneCycle
  const double first = double(cfg_.cycle_first_step_size);
  const double total = first + (cfg_.cycle_second_step_size ? double(*cfg_.cycle_second_step_size) : first);
  if (double(it) < total) return cfg_.cycle_min_lr + (cfg_.cycle_max_lr - cfg_.cycle_min_lr) * onecycle_scale(it);
  if (cfg_.decay_step_size == 0 || cfg_.decay_lr_rate == 0.0) return cfg_.cycle_min_lr;
  double interval = (double(it) - total + 1.0) / double(cfg_.decay_step_size);
  return cfg_.cycle_min_lr / (1.0 + cfg_.decay_lr_rate * interval);
}

std::optional<std::array<double, 2>> LRScheduler::betas_at(int64_t it) const {
  if (cfg_.type != "OneCycle" || !cfg_.cycle_momentum) return std::nullopt;
  if (it < 0) return std::array<double, 2>{cfg_.cycle_min_mom, 0.99};
  const double first = double(cfg_.cycle_first_step_size);
  const double total = first + (cfg_.cycle_second_step_size ? double(*cfg_.cycle_second_step_size) : first);
  if (double(it) < total)
    return std::array<double, 2>{cfg_.cycle_max_mom - (cfg_.cycle_max_mom - cfg_.cycle_min_mom) * onecycle_scale(it),
                                 0.99};
  if (cfg_.decay_step_size == 0 || cfg_.decay_mom_rate == 0.0) return std::array<double, 2>{cfg_.cycle_max_mom, 0.99};
  double interval = (double(it) - total + 1.0) / double(cfg_.decay_step_size);
  return std::array<double, 2>{cfg_.cycle_max_mom * (1.0 + cfg_.decay_mom_rate * interval), 0.99};
}

LRScheduler make_lr_scheduler(const SchedulerConfig& cfg, double base_lr) { return LRScheduler(cfg, base_lr); }

}  // namespace dscpp
