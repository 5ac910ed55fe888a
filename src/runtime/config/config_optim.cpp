// The "optimizer" and "scheduler" sections. DeepSpeed passes their params as keyword arguments to the optimizer
// or scheduler constructor, so an unknown param is an error there too (a TypeError); we say which and suggest one.
#include <algorithm>
#include <cctype>

#include "runtime/config/config_reader.h"

namespace dscpp::config_detail {

static std::string lower(std::string s) {
  for (auto& c : s) c = char(std::tolower((unsigned char)c));
  return s;
}

static const json& empty_object() {
  static const json e = json::object();
  return e;
}

static std::array<double, 2> parse_betas(SectionReader& r, std::array<double, 2> betas);

static void parse_adam(const json& params, AdamConfig& a, bool is_adamw) {
  SectionReader r(params, "optimizer.params");
  r.get("lr", a.lr, 0.0, 1e30);
  a.betas = parse_betas(r, a.betas);
  r.get("eps", a.eps, 0.0, 1e30);
  r.get("weight_decay", a.weight_decay, 0.0, 1e30);
  r.get("adam_w_mode", a.adam_w_mode);
  r.get("torch_adam", a.torch_adam);
  r.get("bias_correction", a.bias_correction);
  bool amsgrad = false, set_grad_none = true;
  if (r.get("amsgrad", amsgrad) && amsgrad)
    fail(r.path("amsgrad"), true, "FusedAdam does not support the AMSGrad variant.");
  r.get("set_grad_none", set_grad_none);  // accepted, no effect: our gradients are one flat buffer
  if (const json* m = r.raw("max_grad_norm"))
    fail(r.path("max_grad_norm"), *m,
         "'max_grad_norm' is not supported as an optimizer parameter, please switch to using the deepspeed "
         "parameter 'gradient_clipping'");
  r.finish();
  // DeepSpeed: "Optimizer name of Adam forces AdamW logic unless adam_w_mode is explicitly set" - i.e. adamw is
  // always decoupled, adam follows adam_w_mode (default true).
  if (is_adamw) a.adam_w_mode = true;
}

static void parse_sgd(const json& params, SgdConfig& s) {
  SectionReader r(params, "optimizer.params");
  r.get("lr", s.lr, 0.0, 1e30);
  r.get("momentum", s.momentum, 0.0, 1e30);
  r.get("dampening", s.dampening, -1e30, 1e30);
  r.get("weight_decay", s.weight_decay, 0.0, 1e30);
  r.get("nesterov", s.nesterov);
  r.finish();
  if (s.nesterov && (s.momentum <= 0.0 || s.dampening != 0.0))
    fail(r.path("nesterov"), true, "Nesterov momentum requires a momentum and zero dampening");
}

static std::array<double, 2> parse_betas(SectionReader& r, std::array<double, 2> betas) {
  if (const json* b = r.raw("betas")) {
    if (!b->is_array() || b->size() != 2 || !(*b)[0].is_number() || !(*b)[1].is_number())
      fail(r.path("betas"), *b, "expected [beta1, beta2]");
    for (int i = 0; i < 2; ++i) {
      double x = (*b)[i].get<double>();
      if (!(x >= 0.0 && x < 1.0)) fail(r.path("betas"), *b, "each beta must be in [0, 1)");
      betas[size_t(i)] = x;
    }
  }
  return betas;
}

static void parse_lion(const json& params, LionConfig& l) {
  SectionReader r(params, "optimizer.params");
  r.get("lr", l.lr, 0.0, 1e30);
  l.betas = parse_betas(r, l.betas);
  r.get("weight_decay", l.weight_decay, 0.0, 1e30);
  r.finish();
}

static void parse_adagrad(const json& params, AdagradConfig& a) {
  SectionReader r(params, "optimizer.params");
  r.get("lr", a.lr, 0.0, 1e30);
  r.get("eps", a.eps, 0.0, 1e30);
  r.get("weight_decay", a.weight_decay, 0.0, 1e30);
  double lr_decay = 0.0, init = 0.0;  // torch's; DeepSpeedCPUAdagrad has neither
  if (r.get("lr_decay", lr_decay, -1e30, 1e30) && lr_decay != 0.0) fail(r.path("lr_decay"), lr_decay, "only 0 is supported");
  if (r.get("initial_accumulator_value", init, -1e30, 1e30) && init != 0.0)
    fail(r.path("initial_accumulator_value"), init, "only 0 is supported");
  r.finish();
}

void parse_optimizer(const json& j, OptimizerConfig& out) {
  SectionReader r(j, "optimizer");
  std::string type;
  if (!r.get("type", type)) throw ConfigError("optimizer.type", "DeepSpeed config: optimizer.type is required");
  bool legacy_fusion = false;
  r.get("legacy_fusion", legacy_fusion);
  const json* params = r.raw("params");
  if (params && params->is_null()) params = nullptr;
  r.finish();
  out.type = lower(type);
  const json& p = params ? *params : empty_object();
  if (out.type == "adam" || out.type == "adamw") {
    parse_adam(p, out.adam, out.type == "adamw");
  } else if (out.type == "sgd") {
    parse_sgd(p, out.sgd);
  } else if (out.type == "lion") {
    parse_lion(p, out.lion);
  } else if (out.type == "adagrad") {
    parse_adagrad(p, out.adagrad);
  } else {
    fail("optimizer.type", type,
         "not supported by DeepSpeed.cpp (supported: Adam, AdamW, SGD, Lion, Adagrad)" +
             did_you_mean(out.type, {"adam", "adamw", "sgd", "lion", "adagrad"}));
  }
}

// The params each scheduler's constructor takes.
static std::vector<std::string> scheduler_keys(const std::string& type) {
  if (type == "WarmupLR") return {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type"};
  if (type == "WarmupDecayLR")
    return {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "total_num_steps"};
  if (type == "WarmupCosineLR")
    return {"total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio", "warmup_type"};
  return {"cycle_min_lr", "cycle_max_lr", "decay_lr_rate", "cycle_first_step_size", "cycle_second_step_size",
          "cycle_first_stair_count", "cycle_second_stair_count", "decay_step_size", "cycle_momentum",
          "cycle_min_mom", "cycle_max_mom", "decay_mom_rate"};
}

void parse_scheduler(const json& j, SchedulerConfig& out, std::vector<std::string>* warnings) {
  SectionReader r(j, "scheduler");
  std::string type;
  if (!r.get("type", type)) throw ConfigError("scheduler.type", "DeepSpeed config: scheduler.type is required");
  const json* params = r.raw("params");
  if (params && params->is_null()) params = nullptr;
  r.finish();
  const std::vector<std::string> types = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle"};
  if (std::find(types.begin(), types.end(), type) == types.end())
    fail("scheduler.type", type,
         "not supported by DeepSpeed.cpp (supported: WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle)" +
             did_you_mean(type, types));
  out.type = type;

  SectionReader p(params ? *params : empty_object(), "scheduler.params");
  for (const auto& k : scheduler_keys(type)) p.known(k.c_str());  // only this type's params are known
  const double big = 1e30;
  if (type == "OneCycle") {
    if (!p.get("cycle_min_lr", out.cycle_min_lr, 0.0, big))
      throw ConfigError("scheduler.params.cycle_min_lr", "DeepSpeed config: OneCycle needs scheduler.params.cycle_min_lr");
    if (!p.get("cycle_max_lr", out.cycle_max_lr, 0.0, big))
      throw ConfigError("scheduler.params.cycle_max_lr", "DeepSpeed config: OneCycle needs scheduler.params.cycle_max_lr");
    p.get("decay_lr_rate", out.decay_lr_rate, 0.0, big);
    p.get("cycle_first_step_size", out.cycle_first_step_size, 1);
    p.get("cycle_second_step_size", out.cycle_second_step_size, 0);
    p.get("cycle_first_stair_count", out.cycle_first_stair_count, 0);
    p.get("cycle_second_stair_count", out.cycle_second_stair_count, 0);
    p.get("decay_step_size", out.decay_step_size, 0);
    p.get("cycle_momentum", out.cycle_momentum);
    p.get("cycle_min_mom", out.cycle_min_mom, 0.0, 1.0, false, true);
    p.get("cycle_max_mom", out.cycle_max_mom, 0.0, 1.0, false, true);
    p.get("decay_mom_rate", out.decay_mom_rate, -big, big);
    p.finish();
    return;
  }
  if (type == "WarmupCosineLR") {
    p.get("warmup_min_ratio", out.warmup_min_ratio, 0.0, 1.0);
    p.get("cos_min_ratio", out.cos_min_ratio, 0.0, 1.0);
  } else {
    p.get("warmup_min_lr", out.warmup_min_lr, 0.0, big);
    p.get("warmup_max_lr", out.warmup_max_lr, 0.0, big);
  }
  p.get("warmup_num_steps", out.warmup_num_steps, 1);  // DeepSpeed: "must be a positive integer"
  if (p.get("warmup_type", out.warmup_type) && out.warmup_type != "log" && out.warmup_type != "linear") {
    warn(warnings, "scheduler.params.warmup_type: Using unknown warmup_type: " + out.warmup_type +
                       ". The increasing function is set to default (log)");
    out.warmup_type = "log";
  }
  if (type != "WarmupLR") {
    if (!p.get("total_num_steps", out.total_num_steps, 0))
      throw ConfigError("scheduler.params.total_num_steps",
                        "DeepSpeed config: " + type + " needs scheduler.params.total_num_steps");
    if (out.total_num_steps < std::max<int64_t>(2, out.warmup_num_steps))
      warn(warnings, "total_num_steps " + std::to_string(out.total_num_steps) + " is less than warmup_num_steps " +
                         std::to_string(out.warmup_num_steps));
  }
  p.finish();
}

}  // namespace dscpp::config_detail

namespace dscpp {

double OptimizerConfig::lr() const {
  if (is_adam()) return adam.lr;
  if (type == "lion") return lion.lr;
  if (type == "adagrad") return adagrad.lr;
  return sgd.lr;
}

int OptimizerConfig::states_per_element() const {
  if (type.empty() || is_adam()) return 2;  // the engine's default optimizer is AdamW
  if (type == "lion" || type == "adagrad") return 1;
  return sgd.momentum != 0.0 ? 1 : 0;
}

}  // namespace dscpp
