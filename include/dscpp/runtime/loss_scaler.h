// Loss scaling for fp16 training: DeepSpeed's static and dynamic loss scalers, state for state, so a run's scale
// trajectory, skipped steps and log lines match DeepSpeed's (see Note [Which DeepSpeed scaler] in
// src/runtime/precision/loss_scaler.cpp for which of DeepSpeed's two state machines applies when, and the
// "dynamic args present?" quirk). bf16 and f32 runs use a static scale of 1.
//
// The engine calls update_scale(overflow) once per optimizer boundary: an overflow (a non-finite gradient) skips the
// step and, for a dynamic scaler, halves the scale (or spends one unit of hysteresis first); `scale_window` clean
// boundaries in a row double it.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "dscpp/runtime/config_sections.h"

namespace dscpp {

// kZero: runtime/fp16/loss_scaler.py DynamicLossScaler (ZeRO stages 1-3), with hysteresis and the min-scale error.
// kFused: fp16/fused_optimizer.py FP16_Optimizer (stage 0): no hysteresis, clamps at min_scale, doubles when
//         (iterations since the last overflow - 1) is a positive multiple of scale_window.
enum class LossScaleRule : uint8_t { kZero, kFused };

struct LossScalerArgs {
  bool dynamic = true;                 // false: cur_scale stays init_scale forever
  double init_scale = 4294967296.0;    // DynamicLossScaler's default 2^32
  double scale_factor = 2.0;           // DeepSpeed fixes it at 2
  int64_t scale_window = 1000;         // clean iterations before doubling (>= 1)
  double min_scale = 1.0;              // lower bound of the scale (> 0)
  int64_t delayed_shift = 1;           // hysteresis: overflows tolerated before halving (>= 1; kZero only)
  bool consecutive_hysteresis = false; // refill the hysteresis on every clean iteration (kZero only)
  bool raise_error_at_min_scale = true;  // kZero: an overflow at min_scale throws
  LossScaleRule rule = LossScaleRule::kZero;
  bool half = true;                    // fp16: overflow messages name the scale (DeepSpeed omits it for bf16)
};

// The scaler DeepSpeed builds for this config: fp16 disabled -> static 1; fp16.loss_scale > 0 -> static that scale;
// otherwise dynamic, kFused at ZeRO stage 0 (`fused_optimizer`: Adam/AdamW, else FP16_UnfusedOptimizer's defaults)
// and kZero at stages 1-3, with defaults that depend on Fp16Config::dynamic_loss_args_given.
LossScalerArgs loss_scaler_args(const Fp16Config& fp16, int64_t zero_stage, bool fused_optimizer = true);

class LossScaler {
 public:
  LossScaler();  // static scale 1
  explicit LossScaler(const LossScalerArgs& args);
  static LossScalerArgs static_loss_scale(double scale, bool half = true);

  double loss_scale() const { return cur_scale_; }
  bool dynamic() const { return args_.dynamic; }
  const LossScalerArgs& args() const { return args_; }
  int64_t cur_iter() const { return cur_iter_; }
  int64_t last_overflow_iter() const { return last_overflow_iter_; }
  int64_t cur_hysteresis() const { return cur_hysteresis_; }

  // Advances the state machine by one boundary. Returns DeepSpeed's log line(s) for it ("" when it logs nothing),
  // e.g. "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768".
  // Throws dscpp::Error "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run." on an
  // overflow at min_scale (kZero, raise_error_at_min_scale); the state is then unchanged.
  std::string update_scale(bool overflow);

  // cur_scale, cur_iter, last_overflow_iter, cur_hysteresis (+ the args, for information). load_state restores the
  // four counters; the args stay those of this run's config, as a resumed DeepSpeed FP16_Optimizer does.
  nlohmann::json state_json() const;
  void load_state(const nlohmann::json& j);

 private:
  LossScalerArgs args_;
  double cur_scale_ = 1.0;
  int64_t cur_iter_ = 0;
  int64_t last_overflow_iter_ = -1;
  int64_t cur_hysteresis_ = 1;
};

}  // namespace dscpp
