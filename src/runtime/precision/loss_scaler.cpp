// DeepSpeed's loss scalers (deepspeed 0.16 runtime/fp16/loss_scaler.py, fp16/fused_optimizer.py,
// fp16/unfused_optimizer.py, runtime/config.py get_dynamic_loss_scale_args).
//
// Note [Which DeepSpeed scaler]: DeepSpeed has two dynamic-scale state machines and picks one by ZeRO stage, so we do
// too (matching DeepSpeed beats a uniform rule: a config moved between the two systems must behave the same).
//  - ZeRO stages 1-3 (CreateLossScaler -> DynamicLossScaler, rule kZero). On overflow: if delayed_shift == 1 or
//    cur_hysteresis == 1, halve (max(cur/2, min); at min with raise_error_at_min_scale: throw), else
//    cur_hysteresis -= 1; last_overflow_iter = cur_iter. Clean: refill the hysteresis if consecutive_hysteresis;
//    if (cur_iter - last_overflow_iter) % window == 0, refill (when not consecutive) and double. cur_iter += 1.
//  - Stage 0 (FP16_Optimizer for fused Adam, FP16_UnfusedOptimizer otherwise, rule kFused). On overflow:
//    cur = max(cur/2, min), never an error; clean: stable = cur_iter - last_overflow_iter - 1 doubles when
//    stable > 0 and stable % window == 0 (one iteration later than kZero). hysteresis and consecutive_hysteresis
//    are ignored. cur_iter += 1.
// The "dynamic args present?" quirk: DeepSpeed builds dynamic_loss_scale_args only when the fp16 section names one
// of initial_scale_power, loss_scale_window, min_loss_scale, hysteresis, consecutive_hysteresis
// (Fp16Config::dynamic_loss_args_given). With args, every path takes init 2^initial_scale_power, the window, min and
// (kZero) the hysteresis from the config (defaults 2^16, 1000, 1, 2, false). Without args:
//    kZero:  DynamicLossScaler's defaults: init 2^32, window 1000, min 1, hysteresis 1.
//    kFused: init 2^initial_scale_power (= 2^16: the engine passes initial_dynamic_scale), window 1000, min 1;
//            FP16_UnfusedOptimizer (non-Adam optimizers) has init 2^16, window 1000, min 0.25.
// A static scale (fp16.loss_scale > 0) never changes; an overflow still skips the step.
#include "dscpp/runtime/loss_scaler.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "dscpp/core/check.h"

namespace dscpp {

namespace {
// Python's str(float): shortest round-trip digits, with ".0" on integral values (FP16_Optimizer prints floats).
std::string py_float(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, r.ptr);
  if (std::isfinite(v) && s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}
// Python's int(float) of a scale (DynamicLossScaler prints int(self.cur_scale)).
std::string py_int(double v) { return std::to_string(int64_t(v)); }
}  // namespace

LossScalerArgs loss_scaler_args(const Fp16Config& f, int64_t zero_stage, bool fused_optimizer) {
  if (!f.enabled) return LossScaler::static_loss_scale(1.0, /*half=*/false);
  const LossScaleRule rule = zero_stage == 0 ? LossScaleRule::kFused : LossScaleRule::kZero;
  if (f.loss_scale > 0) {
    LossScalerArgs a = LossScaler::static_loss_scale(f.loss_scale);
    a.rule = rule;
    return a;
  }
  LossScalerArgs a;
  a.rule = rule;
  if (f.dynamic_loss_args_given) {
    a.init_scale = std::ldexp(1.0, int(f.initial_scale_power));
    a.scale_window = f.loss_scale_window;
    a.min_scale = f.min_loss_scale;
    a.delayed_shift = f.hysteresis;
    a.consecutive_hysteresis = f.consecutive_hysteresis;
  } else if (a.rule == LossScaleRule::kFused) {
    a.init_scale = fused_optimizer ? std::ldexp(1.0, int(f.initial_scale_power)) : 65536.0;
    a.min_scale = fused_optimizer ? 1.0 : 0.25;
  }  // else: DynamicLossScaler's defaults as initialised in LossScalerArgs
  if (a.rule == LossScaleRule::kFused) {  // FP16_Optimizer has no hysteresis and no min-scale error
    a.delayed_shift = 1;
    a.consecutive_hysteresis = false;
    a.raise_error_at_min_scale = false;
  }
  return a;
}

LossScalerArgs LossScaler::static_loss_scale(double scale, bool half) {
  LossScalerArgs a;
  a.dynamic = false;
  a.init_scale = scale;
  a.half = half;
  return a;
}

LossScaler::LossScaler() : LossScaler(static_loss_scale(1.0)) {}

LossScaler::LossScaler(const LossScalerArgs& a) : args_(a) {
  DSCPP_CHECK(a.init_scale > 0 && std::isfinite(a.init_scale), "loss scaler: initial scale ", a.init_scale,
              " must be finite and > 0");
  DSCPP_CHECK(!a.dynamic || (a.scale_window >= 1 && a.min_scale > 0 && a.delayed_shift >= 1 && a.scale_factor > 1),
              "loss scaler: needs scale_window >= 1 (got ", a.scale_window, "), min_scale > 0 (got ", a.min_scale,
              "), hysteresis >= 1 (got ", a.delayed_shift, ")");
  cur_scale_ = a.init_scale;
  cur_hysteresis_ = a.delayed_shift;
}

std::string LossScaler::update_scale(bool overflow) {
  std::string msg;
  if (!args_.dynamic) {
    // DynamicLossScaler's static twin does nothing; FP16_Optimizer logs the overflow and counts iterations.
    if (args_.rule == LossScaleRule::kFused && overflow && args_.half)
      msg = "Grad overflow on iteration: " + std::to_string(cur_iter_) +
            "\nUsing static loss scale of: " + py_float(cur_scale_);
    cur_iter_++;
    return msg;
  }
  if (args_.rule == LossScaleRule::kFused) {
    if (overflow) {
      double prev = cur_scale_;
      cur_scale_ = std::max(cur_scale_ / args_.scale_factor, args_.min_scale);
      last_overflow_iter_ = cur_iter_;
      msg = "Overflow detected. Skipping step. Attempted loss scale: " + py_float(prev) + ", reducing to " +
            py_float(cur_scale_);
    } else {
      int64_t stable = cur_iter_ - last_overflow_iter_ - 1;
      if (stable > 0 && stable % args_.scale_window == 0) cur_scale_ *= args_.scale_factor;
    }
    cur_iter_++;
    return msg;
  }
  // kZero: DynamicLossScaler.update_scale.
  if (overflow) {
    const std::string head = "[deepspeed] OVERFLOW! Rank 0 Skipping step.";
    if (args_.delayed_shift == 1 || cur_hysteresis_ == 1) {
      if (cur_scale_ == args_.min_scale && args_.raise_error_at_min_scale)
        DSCPP_FAIL("Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.");
      double next = std::max(cur_scale_ / args_.scale_factor, args_.min_scale);
      msg = head;
      if (args_.half) msg += " Attempted loss scale: " + py_int(cur_scale_) + ", reducing to " + py_int(next);
      cur_scale_ = next;
    } else {
      msg = head;
      if (args_.half)
        msg += " Attempted loss scale: " + py_int(cur_scale_) + ", but hysteresis is " +
               std::to_string(cur_hysteresis_) + ". Reducing hysteresis to " + std::to_string(cur_hysteresis_ - 1);
      cur_hysteresis_--;
    }
    last_overflow_iter_ = cur_iter_;
  } else {
    if (args_.consecutive_hysteresis) {
      msg = "Consecutive hysteresis is enabled. Restoring hysteresis to " + std::to_string(args_.delayed_shift);
      cur_hysteresis_ = args_.delayed_shift;
    }
    if ((cur_iter_ - last_overflow_iter_) % args_.scale_window == 0) {
      if (!args_.consecutive_hysteresis) cur_hysteresis_ = args_.delayed_shift;
      cur_scale_ *= args_.scale_factor;
    }
  }
  cur_iter_++;
  return msg;
}

nlohmann::json LossScaler::state_json() const {
  return {{"dynamic", args_.dynamic},
          {"rule", args_.rule == LossScaleRule::kZero ? "zero" : "fused"},
          {"cur_scale", cur_scale_},
          {"cur_iter", cur_iter_},
          {"last_overflow_iter", last_overflow_iter_},
          {"cur_hysteresis", cur_hysteresis_},
          {"scale_window", args_.scale_window},
          {"min_scale", args_.min_scale},
          {"delayed_shift", args_.delayed_shift},
          {"consecutive_hysteresis", args_.consecutive_hysteresis}};
}

void LossScaler::load_state(const nlohmann::json& j) {
  double scale = j.at("cur_scale").get<double>();
  int64_t hyst = j.at("cur_hysteresis").get<int64_t>();
  DSCPP_CHECK(scale > 0 && std::isfinite(scale), "loss scaler state: cur_scale ", scale, " must be finite and > 0");
  DSCPP_CHECK(hyst >= 0, "loss scaler state: cur_hysteresis ", hyst, " must be >= 0");
  // A static run keeps its configured scale; the counters still carry over.
  if (args_.dynamic) cur_scale_ = scale;
  cur_iter_ = j.at("cur_iter").get<int64_t>();
  last_overflow_iter_ = j.at("last_overflow_iter").get<int64_t>();
  cur_hysteresis_ = std::min(hyst, args_.delayed_shift);
}

}  // namespace dscpp
