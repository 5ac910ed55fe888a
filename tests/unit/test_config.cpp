// DeepSpeed config parsing: defaults, batch-size derivation and DeepSpeed's exact messages, every error path.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "dscpp/runtime/config.h"

using dscpp::ConfigError;
using dscpp::DeepSpeedConfig;
using json = nlohmann::json;

// Parses and expects a ConfigError whose message contains every fragment and whose key is `key`.
static void expect_error(const std::string& text, const std::string& key, std::vector<std::string> fragments,
                         int W = 1) {
  try {
    DeepSpeedConfig::from_string(text, W);
    ADD_FAILURE() << "no error for " << text;
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key, key) << e.what();
    for (const auto& f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos)
        << "message '" << e.what() << "' lacks '" << f << "'";
  }
}

static std::string with_batch(const std::string& rest) {
  return R"({"train_batch_size": 8, )" + rest + "}";
}

TEST(Config, CodeDefaults) {
  auto c = DeepSpeedConfig::from_string(R"({"train_micro_batch_size_per_gpu": 2})");
  EXPECT_EQ(c.train_batch_size, 2);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.optimizer.type, "");
  EXPECT_EQ(c.scheduler.type, "");
  EXPECT_EQ(c.gradient_clipping, 0.0);
  EXPECT_EQ(c.steps_per_print, 10);
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.initial_scale_power, 16);
  EXPECT_EQ(c.fp16.hysteresis, 2);
  EXPECT_FALSE(c.fp16.dynamic_loss_args_given);
  EXPECT_EQ(c.zero_optimization.stage, 0);
  EXPECT_FALSE(c.zero_optimization.overlap_comm);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 500000000);
  EXPECT_EQ(c.zero_optimization.stage3_prefetch_bucket_size, 50000000);
  EXPECT_EQ(c.zero_optimization.sub_group_size, 1000000000);
  EXPECT_EQ(c.seed, 1234u);
  EXPECT_FALSE(c.activation_checkpointing.number_checkpoints.has_value());
}

// ---- batch sizes: every row of DeepSpeed's derivation table, with W = 2 ----
TEST(ConfigBatch, DerivationTable) {
  struct Case { const char* text; int64_t tb, mb, gas; };
  const Case cases[] = {
      {R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})", 16, 4, 2},
      {R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4})", 16, 4, 2},   // GAS = TB // MB // W
      {R"({"train_batch_size": 16, "gradient_accumulation_steps": 4})", 16, 2, 4},      // MB = TB // W // GAS
      {R"({"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 5})", 30, 3, 5},  // TB = MB*GAS*W
      {R"({"train_batch_size": 16})", 16, 8, 1},                                        // GAS = 1, MB = TB // W
      {R"({"train_micro_batch_size_per_gpu": 3})", 6, 3, 1},                            // GAS = 1, TB = MB * W
  };
  for (const auto& c : cases) {
    auto cfg = DeepSpeedConfig::from_string(c.text, 2);
    EXPECT_EQ(cfg.train_batch_size, c.tb) << c.text;
    EXPECT_EQ(cfg.train_micro_batch_size_per_gpu, c.mb) << c.text;
    EXPECT_EQ(cfg.gradient_accumulation_steps, c.gas) << c.text;
    EXPECT_EQ(cfg.dp_world_size, 2);
  }
}

// DeepSpeed's text, exactly, at the start of the message; what follows names the key in the user's config.
static void expect_exact(const std::string& text, int W, const std::string& msg, const std::string& then = "") {
  try {
    DeepSpeedConfig::from_string(text, W);
    ADD_FAILURE() << "no error for " << text;
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.substr(0, msg.size()), msg) << what;
    EXPECT_NE(what.find(then), std::string::npos) << "missing '" << then << "' in: " << what;
  }
}

TEST(ConfigBatch, DeepSpeedMessages) {
  expect_exact("{}", 1, "Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided");
  expect_exact(R"({"gradient_accumulation_steps": 2})", 1,
               "Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided");
  expect_exact(R"({"train_batch_size": 0})", 1, "Train batch size: 0 has to be greater than 0",
               "train_batch_size = 0 in the config");
  expect_exact(R"({"train_batch_size": -4, "train_micro_batch_size_per_gpu": 2})", 1,
               "Train batch size: -4 has to be greater than 0");
  expect_exact(R"({"train_micro_batch_size_per_gpu": 0, "gradient_accumulation_steps": 1, "train_batch_size": 4})",
               1, "Micro batch size per gpu: 0 has to be greater than 0", "train_micro_batch_size_per_gpu = 0");
  // A negative micro batch alone: DeepSpeed derives train_batch_size = -1 and blames it; we name the key written.
  expect_exact(R"({"train_micro_batch_size_per_gpu": -1})", 2, "Micro batch size per gpu: -1 has to be greater than 0",
               "train_micro_batch_size_per_gpu = -1 in the config; it must be >= 1");
  expect_exact(R"({"gradient_accumulation_steps": -2, "train_micro_batch_size_per_gpu": 2})", 1,
               "Gradient accumulation steps: -2 has to be greater than 0", "gradient_accumulation_steps = -2");
  // TB < MB: GAS = 8 // 16 // 1 = 0
  expect_exact(R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 16})", 1,
               "Gradient accumulation steps: 0 has to be greater than 0",
               "gradient_accumulation_steps = train_batch_size 8 // train_micro_batch_size_per_gpu 16 // 1 rank is 0");
  // TB only with TB < W: MB = 1 // 2 = 0
  expect_exact(R"({"train_batch_size": 1})", 2, "Micro batch size per gpu: 0 has to be greater than 0",
               "train_micro_batch_size_per_gpu = train_batch_size 1 // 2 ranks is 0");
  expect_exact(R"({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2})",
               2,
               "Check batch related parameters. train_batch_size is not equal to micro_batch_per_gpu * "
               "gradient_acc_step * world_size 10 != 2 * 2 * 2");
  // A floor-division remainder fails the assertion: 10 // 4 // 1 = 2, 4 * 2 * 1 != 10
  expect_exact(R"({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4})", 1,
               "Check batch related parameters. train_batch_size is not equal to micro_batch_per_gpu * "
               "gradient_acc_step * world_size 10 != 4 * 2 * 1");
  expect_error(R"({"train_batch_size": "auto"})", "train_batch_size", {"auto"});
  expect_error(R"({"train_batch_size": 2.5})", "train_batch_size", {"expected an integer"});
}

// ---- types, ranges, strictness ----
TEST(Config, WrongTypesAndRanges) {
  expect_error(with_batch(R"("zero_optimization": {"stage": 4})"), "zero_optimization.stage",
               {"zero_optimization.stage", "4", "Maximum supported ZeRO stage is 3"});
  expect_error(with_batch(R"("zero_optimization": {"stage": "2"})"), "zero_optimization.stage", {"integer"});
  expect_error(with_batch(R"("zero_optimization": {"reduce_bucket_size": -1})"),
               "zero_optimization.reduce_bucket_size", {"-1", ">= 0"});
  expect_error(with_batch(R"("zero_optimization": {"allgather_bucket_size": 3})"),
               "zero_optimization.allgather_bucket_size", {"multiple of nccl_start_alignment_factor, 2"});
  expect_error(with_batch(R"("zero_optimization": {"contiguous_gradients": 1})"),
               "zero_optimization.contiguous_gradients", {"true or false"});
  expect_error(with_batch(R"("optimizer": {"type": "Adam", "params": {"lr": -0.1}})"), "optimizer.params.lr",
               {"-0.1", ">= 0"});
  expect_error(with_batch(R"("optimizer": {"type": "Adam", "params": {"betas": [0.9, 1.0]}})"),
               "optimizer.params.betas", {"[0, 1)"});
  expect_error(with_batch(R"("optimizer": {"type": "Adam", "params": {"betas": [0.9]}})"), "optimizer.params.betas",
               {"[beta1, beta2]"});
  expect_error(with_batch(R"("optimizer": {"type": "Adam", "params": {"amsgrad": true}})"),
               "optimizer.params.amsgrad", {"AMSGrad"});
  expect_error(with_batch(R"("optimizer": {"type": "Adam", "params": {"max_grad_norm": 1.0}})"),
               "optimizer.params.max_grad_norm", {"gradient_clipping"});
  expect_error(with_batch(R"("optimizer": {"type": "Lamb"})"), "optimizer.type", {"not supported"});
  expect_error(with_batch(R"("optimizer": {"type": "Lion", "params": {"eps": 1e-8}})"), "optimizer.params.eps", {});
  expect_error(with_batch(R"("optimizer": {"type": "Lion", "params": {"betas": [1.0, 0.99]}})"),
               "optimizer.params.betas", {"[0, 1)"});
  expect_error(with_batch(R"("optimizer": {"type": "Adagrad", "params": {"initial_accumulator_value": 0.1}})"),
               "optimizer.params.initial_accumulator_value", {"only 0"});
  expect_error(with_batch(R"("optimizer": {"params": {}})"), "optimizer.type", {"required"});
  expect_error(with_batch(R"("optimizer": {"type": "SGD", "params": {"nesterov": true}})"),
               "optimizer.params.nesterov", {"Nesterov momentum requires a momentum and zero dampening"});
  expect_error(with_batch(R"("fp16": {"enabled": true, "hysteresis": 0})"), "fp16.hysteresis", {">= 1"});
  expect_error(with_batch(R"("fp16": {"min_loss_scale": 0})"), "fp16.min_loss_scale", {"> 0"});
  expect_error(with_batch(R"("fp16": {"loss_scale_window": 0})"), "fp16.loss_scale_window", {">= 1"});
  expect_error(with_batch(R"("gradient_clipping": -1)"), "gradient_clipping", {">= 0"});
  expect_error(with_batch(R"("gradient_clipping": "auto")"), "gradient_clipping", {"expected a number"});
  expect_error(with_batch(R"("steps_per_print": 1.5)"), "steps_per_print", {"integer"});
  expect_error(with_batch(R"("seed": -3)"), "seed", {">= 0"});
  expect_error(with_batch(R"("fp16": true)"), "fp16", {"object"});
  expect_error(with_batch(R"("activation_checkpointing": {"number_checkpoints": 0})"),
               "activation_checkpointing.number_checkpoints", {">= 1"});
  expect_error(with_batch(R"("activation_checkpointing": {"contiguous_memory_optimization": true})"),
               "activation_checkpointing.contiguous_memory_optimization", {"partition"});
  expect_error(with_batch(R"("zero_optimization": {"offload_optimizer": {"device": "gpu"}})"),
               "zero_optimization.offload_optimizer.device", {"'none', 'cpu', 'nvme'"});
  expect_error(with_batch(R"("zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}})"),
               "zero_optimization.offload_optimizer.nvme_path", {"required", "\"nvme\""});
  expect_error(with_batch(R"("zero_optimization": {"offload_optimizer": {"device": "cpu"}})"),
               "zero_optimization.offload_optimizer.device", {"\"cpu\"", "stage 1, 2 or 3", "got stage 0"});
  expect_error(with_batch(R"("zero_optimization": {"legacy_stage1": true})"), "zero_optimization.legacy_stage1",
               {"no longer supported"});
  expect_error(with_batch(R"("zero_optimization": {"stage3_max_live_parameters": 1, "max_live_parameters": 2})"),
               "zero_optimization.max_live_parameters", {"only one"});
  expect_error(with_batch(R"("fp16": {"enabled": true, "fp16_master_weights_and_grads": true})"),
               "fp16.fp16_master_weights_and_grads",
               {"Fp16_master_weights_and_grads is only supported with ZeRO Stage 2 for now."});
  expect_error("[1, 2]", "<root>", {"JSON object"});
  expect_error("{\"train_batch_size\": ", "", {"not valid JSON"});
}

TEST(Config, Fp16AndBf16BothEnabled) {
  expect_error(with_batch(R"("fp16": {"enabled": true}, "bf16": {"enabled": true})"), "bf16.enabled",
               {"bfloat16 and fp16 modes cannot be simultaneously enabled"});
  expect_error(with_batch(R"("fp16": {"enabled": true}, "bfloat16": {"enabled": true})"), "bf16.enabled",
               {"bfloat16 and fp16 modes cannot be simultaneously enabled"});
  auto c = DeepSpeedConfig::from_string(with_batch(R"("bfloat16": {"enabled": true})"));
  EXPECT_TRUE(c.bf16.enabled);
  expect_error(with_batch(R"("bf16": {"enabled": true}, "bfloat16": {"enabled": true})"), "bfloat16",
               {"only one"});
}

TEST(Config, UnknownNestedKeyIsAnErrorWithDidYouMean) {
  expect_error(with_batch(R"("zero_optimization": {"stage": 2, "overlap_com": true})"),
               "zero_optimization.overlap_com", {"unknown key", "did you mean 'overlap_comm'"});
  expect_error(with_batch(R"("fp16": {"enabled": true, "loss_scale_windw": 10})"), "fp16.loss_scale_windw",
               {"did you mean 'loss_scale_window'"});
  expect_error(with_batch(R"("optimizer": {"type": "AdamW", "params": {"weight_decy": 0.1}})"),
               "optimizer.params.weight_decy", {"did you mean 'weight_decay'"});
  expect_error(with_batch(R"("scheduler": {"type": "WarmupLR", "params": {"warmup_num_step": 10}})"),
               "scheduler.params.warmup_num_step", {"did you mean 'warmup_num_steps'"});
  // A param of another scheduler type is unknown for this one.
  expect_error(with_batch(R"("scheduler": {"type": "WarmupLR", "params": {"total_num_steps": 10}})"),
               "scheduler.params.total_num_steps", {"unknown key"});
  expect_error(with_batch(R"("zero_optimization": {"offload_param": {"device": "cpu", "buffer_cnt": 2}})"),
               "zero_optimization.offload_param.buffer_cnt", {"did you mean 'buffer_count'"});
  expect_error(with_batch(R"("scheduler": {"type": "WarmupLr"})"), "scheduler.type", {"did you mean 'WarmupLR'"});
}

TEST(Config, UnknownTopLevelKeyIsAWarningWithDidYouMean) {
  std::vector<std::string> w;
  auto c = DeepSpeedConfig::from_string(with_batch(R"("gradient_cliping": 1.0, "tensorboard": {}, "zzz": 1)"),
                                        1, &w);
  EXPECT_EQ(c.gradient_clipping, 0.0);
  ASSERT_EQ(w.size(), 3u);
  std::string all = w[0] + "|" + w[1] + "|" + w[2];
  EXPECT_NE(all.find("'gradient_cliping' ignored (did you mean 'gradient_clipping'?)"), std::string::npos) << all;
  EXPECT_NE(all.find("'tensorboard' is not implemented by DeepSpeed.cpp yet"), std::string::npos) << all;
  EXPECT_NE(all.find("'zzz' ignored"), std::string::npos) << all;
  EXPECT_EQ(all.find("'zzz' ignored (did you mean"), std::string::npos) << all;
}

TEST(Config, DuplicateKeys) {
  expect_error(R"({"train_batch_size": 8, "train_batch_size": 8})", "train_batch_size",
               {"Duplicate keys in DeepSpeed config: [\"train_batch_size\"]"});
  expect_error(with_batch(R"("zero_optimization": {"stage": 1, "stage": 2})"), "zero_optimization.stage",
               {"Duplicate keys in DeepSpeed config", "zero_optimization"});
  // The same key in two different objects is fine.
  auto c = DeepSpeedConfig::from_string(with_batch(R"("fp16": {"enabled": false}, "bf16": {"enabled": true})"));
  EXPECT_TRUE(c.bf16.enabled);
}

TEST(Config, AutoInsideSectionsFallsBackToDefault) {
  auto c = DeepSpeedConfig::from_string(with_batch(
      R"("optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto", "betas": "auto"}},
         "fp16": {"enabled": "auto", "loss_scale_window": "auto"},
         "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto"})"));
  EXPECT_EQ(c.optimizer.adam.lr, 1e-3);
  EXPECT_EQ(c.optimizer.adam.weight_decay, 0.0);
  EXPECT_EQ(c.optimizer.adam.betas[0], 0.9);
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_FALSE(c.fp16.dynamic_loss_args_given);  // "auto" does not count as given
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 500000000);
  EXPECT_EQ(c.zero_optimization.stage3_prefetch_bucket_size, 50000000);
}

TEST(Config, DeprecatedKeysAreRemapped) {
  std::vector<std::string> w;
  auto c = DeepSpeedConfig::from_string(
      with_batch(R"("zero_optimization": {"stage": 3, "cpu_offload": true, "cpu_offload_param": true,
                    "cpu_offload_use_pin_memory": true, "stage3_gather_fp16_weights_on_model_save": true})"),
      1, &w);
  ASSERT_TRUE(c.zero_optimization.offload_optimizer.has_value());
  EXPECT_EQ(c.zero_optimization.offload_optimizer->device, "cpu");
  ASSERT_TRUE(c.zero_optimization.offload_param.has_value());
  EXPECT_EQ(c.zero_optimization.offload_param->device, "cpu");
  EXPECT_TRUE(c.zero_optimization.stage3_gather_16bit_weights_on_model_save);
  ASSERT_EQ(w.size(), 4u);  // the 4 deprecations
  EXPECT_EQ(w[0], "Config parameter cpu_offload is deprecated use offload_optimizer instead");
  expect_error(with_batch(R"("zero_optimization": {"cpu_offload": true, "offload_optimizer": {"device": "cpu"}})"),
               "zero_optimization.cpu_offload",
               {"Cannot provide deprecated parameter 'cpu_offload' and replacing parameter 'offload_optimizer' "
                "together"});
  auto off = DeepSpeedConfig::from_string(with_batch(R"("zero_optimization": {"cpu_offload": false})"));
  EXPECT_FALSE(off.zero_optimization.offload_optimizer.has_value());
}

TEST(Config, LegacyZeroBoolean) {
  std::vector<std::string> w;
  auto c = DeepSpeedConfig::from_string(with_batch(R"("zero_optimization": true, "allgather_size": 1000)"), 1, &w);
  EXPECT_EQ(c.zero_optimization.stage, 1);
  EXPECT_EQ(c.zero_optimization.allgather_bucket_size, 1000);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("deprecated"), std::string::npos);
  auto off = DeepSpeedConfig::from_string(with_batch(R"("zero_optimization": false)"));
  EXPECT_EQ(off.zero_optimization.stage, 0);
}

TEST(Config, OverlapCommDefaultFollowsStage) {
  EXPECT_TRUE(DeepSpeedConfig::from_string(with_batch(R"("zero_optimization": {"stage": 3})")).zero_optimization.overlap_comm);
  EXPECT_FALSE(DeepSpeedConfig::from_string(with_batch(R"("zero_optimization": {"stage": 2})")).zero_optimization.overlap_comm);
  EXPECT_FALSE(DeepSpeedConfig::from_string(with_batch(R"("zero_optimization": {"stage": 3, "overlap_comm": false})"))
                   .zero_optimization.overlap_comm);
}

TEST(Config, OptimizerTypesAndAdamWMode) {
  auto a = DeepSpeedConfig::from_string(with_batch(R"("optimizer": {"type": "ADAM", "params": {"adam_w_mode": false, "lr": 0.01, "betas": [0.8, 0.99]}})"));
  EXPECT_EQ(a.optimizer.type, "adam");
  EXPECT_FALSE(a.optimizer.adam.adam_w_mode);
  EXPECT_EQ(a.optimizer.adam.lr, 0.01);
  EXPECT_EQ(a.optimizer.adam.betas[1], 0.99);
  // "adamw" forces decoupled decay even with adam_w_mode false (DeepSpeed engine rule).
  auto w = DeepSpeedConfig::from_string(with_batch(R"("optimizer": {"type": "AdamW", "params": {"adam_w_mode": false}})"));
  EXPECT_TRUE(w.optimizer.adam.adam_w_mode);
  auto s = DeepSpeedConfig::from_string(with_batch(R"("optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9, "nesterov": true}})"));
  EXPECT_EQ(s.optimizer.type, "sgd");
  EXPECT_TRUE(s.optimizer.sgd.nesterov);
  EXPECT_EQ(s.optimizer.lr(), 0.1);
  auto l = DeepSpeedConfig::from_string(with_batch(R"("optimizer": {"type": "Lion", "params": {"lr": 2e-4, "betas": [0.95, 0.98], "weight_decay": 0.1}})"));
  EXPECT_EQ(l.optimizer.type, "lion");
  EXPECT_EQ(l.optimizer.lr(), 2e-4);
  EXPECT_EQ(l.optimizer.lion.betas[0], 0.95);
  EXPECT_EQ(l.optimizer.lion.weight_decay, 0.1);
  EXPECT_EQ(DeepSpeedConfig::from_string(l.to_json().dump()).optimizer.lion.betas[1], 0.98);  // round trip
  auto g = DeepSpeedConfig::from_string(with_batch(R"("optimizer": {"type": "Adagrad", "params": {"eps": 1e-8, "lr_decay": 0}})"));
  EXPECT_EQ(g.optimizer.type, "adagrad");
  EXPECT_EQ(g.optimizer.lr(), 1e-2);  // torch's default
  EXPECT_EQ(g.optimizer.adagrad.eps, 1e-8);
  EXPECT_EQ(DeepSpeedConfig::from_string(g.to_json().dump()).optimizer.adagrad.eps, 1e-8);
}

TEST(Config, Fp16DynamicArgsQuirk) {
  EXPECT_FALSE(DeepSpeedConfig::from_string(with_batch(R"("fp16": {"enabled": true})")).fp16.dynamic_loss_args_given);
  auto c = DeepSpeedConfig::from_string(with_batch(R"("fp16": {"enabled": true, "hysteresis": 3})"));
  EXPECT_TRUE(c.fp16.dynamic_loss_args_given);
  EXPECT_EQ(c.fp16.hysteresis, 3);
}

TEST(Config, SchedulerParamsAndWarnings) {
  std::vector<std::string> w;
  auto c = DeepSpeedConfig::from_string(
      with_batch(R"("scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 5, "warmup_num_steps": 10,
                                                                   "warmup_type": "cubic"}})"),
      1, &w);
  EXPECT_EQ(c.scheduler.warmup_type, "log");
  ASSERT_EQ(w.size(), 2u);
  expect_error(with_batch(R"("scheduler": {"type": "WarmupCosineLR", "params": {}})"),
               "scheduler.params.total_num_steps", {"needs"});
  expect_error(with_batch(R"("scheduler": {"type": "OneCycle", "params": {"cycle_max_lr": 0.1}})"),
               "scheduler.params.cycle_min_lr", {"needs"});
  expect_error(with_batch(R"("scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 0.1,
                                                                        "cycle_first_step_size": 0}})"),
               "scheduler.params.cycle_first_step_size", {">= 1"});
  expect_error(with_batch(R"("scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 0}})"),
               "scheduler.params.warmup_num_steps", {">= 1"});
}

TEST(Config, RoundTripAndHash) {
  const std::string text = with_batch(R"(
      "train_micro_batch_size_per_gpu": 2,
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.1}},
      "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-5, "cycle_max_lr": 1e-3, "cycle_first_step_size": 7}},
      "gradient_clipping": 1.0, "bf16": {"enabled": true},
      "fp16": {"hysteresis": 4},
      "activation_checkpointing": {"number_checkpoints": 4},
      "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.5}},
      // comments are allowed
      "seed": 7)");
  auto a = DeepSpeedConfig::from_string(text, 2);
  auto b = DeepSpeedConfig::parse(a.to_json(), 2);
  EXPECT_EQ(a.canonical_dump(), b.canonical_dump());
  EXPECT_EQ(a.hash(), b.hash());
  EXPECT_TRUE(b.fp16.dynamic_loss_args_given);
  EXPECT_EQ(b.zero_optimization.offload_optimizer->ratio, 0.5);
  EXPECT_EQ(b.scheduler.cycle_first_step_size, 7);
  auto c = DeepSpeedConfig::from_string(text + "", 2);
  c.seed = 8;
  EXPECT_NE(a.hash(), c.hash());
}

TEST(Config, FromFile) {
  std::string path = std::string(DSCPP_BINARY_DIR) + "/test_config_tmp.json";
  {
    std::ofstream f(path);
    f << R"({"train_batch_size": 4, "zero_optimization": {"stage": 2}})";
  }
  auto c = DeepSpeedConfig::from_file(path, 4);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 1);
  EXPECT_EQ(c.zero_optimization.stage, 2);
  std::remove(path.c_str());
  EXPECT_THROW(DeepSpeedConfig::from_file(path), ConfigError);
}

TEST(Config, FlopsProfiler) {
  auto d = DeepSpeedConfig::from_string(R"({"train_batch_size": 8})");
  EXPECT_FALSE(d.flops_profiler.enabled);
  EXPECT_EQ(d.flops_profiler.recompute_fwd_factor, 0.0);
  EXPECT_EQ(d.flops_profiler.profile_step, 1);
  EXPECT_EQ(d.flops_profiler.module_depth, -1);
  EXPECT_EQ(d.flops_profiler.top_modules, 1);
  EXPECT_TRUE(d.flops_profiler.detailed);
  EXPECT_FALSE(d.flops_profiler.output_file.has_value());
  EXPECT_FALSE(d.wall_clock_breakdown);

  std::vector<std::string> w;
  auto c = DeepSpeedConfig::from_string(
      with_batch(R"("flops_profiler": {"enabled": true, "recompute_fwd_factor": 1.0, "profile_step": 3,
                    "module_depth": 2, "top_modules": 4, "detailed": false, "output_file": "prof.txt"})"),
      1, &w);
  EXPECT_TRUE(w.empty()) << w[0];
  EXPECT_TRUE(c.flops_profiler.enabled);
  EXPECT_TRUE(c.wall_clock_breakdown);  // enabling the flops profiler enables the breakdown, as DeepSpeed
  EXPECT_EQ(c.flops_profiler.recompute_fwd_factor, 1.0);
  EXPECT_EQ(c.flops_profiler.profile_step, 3);
  EXPECT_EQ(c.flops_profiler.module_depth, 2);
  EXPECT_EQ(c.flops_profiler.top_modules, 4);
  EXPECT_FALSE(c.flops_profiler.detailed);
  EXPECT_EQ(c.flops_profiler.output_file.value(), "prof.txt");
  auto b = DeepSpeedConfig::parse(c.to_json());
  EXPECT_EQ(b.canonical_dump(), c.canonical_dump());
  auto off = DeepSpeedConfig::from_string(with_batch(R"("flops_profiler": {"enabled": false, "output_file": null})"));
  EXPECT_FALSE(off.wall_clock_breakdown);

  expect_error(with_batch(R"("flops_profiler": {"module_depth": -2})"), "flops_profiler.module_depth", {"-2"});
  expect_error(with_batch(R"("flops_profiler": {"top_modules": 0})"), "flops_profiler.top_modules", {});
  expect_error(with_batch(R"("flops_profiler": {"profile_step": -1})"), "flops_profiler.profile_step", {});
  expect_error(with_batch(R"("flops_profiler": {"recompute_fwd_factor": -0.5})"),
               "flops_profiler.recompute_fwd_factor", {});
  expect_error(with_batch(R"("flops_profiler": {"enabled": "yes"})"), "flops_profiler.enabled", {});
  expect_error(with_batch(R"("flops_profiler": {"top_module": 2})"), "flops_profiler.top_module",
               {"did you mean 'top_modules'"});
}

TEST(Config, CommsLogger) {
  auto d = DeepSpeedConfig::from_string(R"({"train_batch_size": 8})");  // DeepSpeed's defaults
  EXPECT_FALSE(d.comms_logger.enabled);
  EXPECT_FALSE(d.comms_logger.verbose);
  EXPECT_TRUE(d.comms_logger.prof_all);
  EXPECT_FALSE(d.comms_logger.debug);
  EXPECT_TRUE(d.comms_logger.prof_ops.empty());

  std::vector<std::string> w;
  auto c = DeepSpeedConfig::from_string(
      with_batch(R"("comms_logger": {"enabled": true, "verbose": true, "prof_all": false, "debug": true,
                    "prof_ops": ["all_reduce", "all_gather"]})"),
      1, &w);
  EXPECT_TRUE(w.empty()) << w[0];  // no longer "not implemented"
  EXPECT_TRUE(c.comms_logger.enabled);
  EXPECT_TRUE(c.comms_logger.verbose);
  EXPECT_FALSE(c.comms_logger.prof_all);
  EXPECT_TRUE(c.comms_logger.debug);
  EXPECT_EQ(c.comms_logger.prof_ops, (std::vector<std::string>{"all_reduce", "all_gather"}));
  auto b = DeepSpeedConfig::parse(c.to_json());
  EXPECT_EQ(b.canonical_dump(), c.canonical_dump());
  EXPECT_NE(b.hash(), d.hash());

  expect_error(with_batch(R"("comms_logger": {"enabled": 1})"), "comms_logger.enabled", {});
  expect_error(with_batch(R"("comms_logger": {"prof_ops": "all_reduce"})"), "comms_logger.prof_ops",
               {"list of op names"});
  expect_error(with_batch(R"("comms_logger": {"prof_ops": [1]})"), "comms_logger.prof_ops", {"list of op names"});
  expect_error(with_batch(R"("comms_logger": {"verbos": true})"), "comms_logger.verbos", {"did you mean 'verbose'"});
}

TEST(Config, EngineKeysOfOurs) {
  auto d = DeepSpeedConfig::from_string(R"({"train_batch_size": 8})");
  EXPECT_EQ(d.dscpp.attention, "auto");
  EXPECT_FALSE(d.dscpp.fused_head);
  EXPECT_FALSE(d.dscpp.copy_engine.enabled);
  EXPECT_FALSE(d.dscpp.copy_engine.arena_mib.has_value());

  auto c = DeepSpeedConfig::from_string(with_batch(
      R"("dscpp": {"attention": "own", "fused_head": true, "copy_engine": {"enabled": true, "arena_mib": 64}},
          "zero_optimization": {"overlap_comm": true})"));
  EXPECT_EQ(c.dscpp.attention, "own");
  EXPECT_TRUE(c.dscpp.fused_head);
  EXPECT_TRUE(c.dscpp.copy_engine.enabled);
  EXPECT_EQ(c.dscpp.copy_engine.arena_mib.value(), 64);
  auto b = DeepSpeedConfig::parse(c.to_json());
  EXPECT_EQ(b.canonical_dump(), c.canonical_dump());
  EXPECT_NE(b.hash(), d.hash());  // the cross-rank check sees every engine key

  expect_error(with_batch(R"("dscpp": {"attention": "flash"})"), "dscpp.attention", {"flash", "cudnn"});
  expect_error(with_batch(R"("dscpp": {"fused_head": 1})"), "dscpp.fused_head", {});
  expect_error(with_batch(R"("dscpp": {"copy_engine": {"arena_mib": -3}})"), "dscpp.copy_engine.arena_mib", {"-3"});
  expect_error(with_batch(R"("dscpp": {"fused_haed": true})"), "dscpp.fused_haed", {"did you mean 'fused_head'"});
}

// Keys of current DeepSpeed (0.18+): known, so never "unknown"; those that would change what we compute are refused
// by name when turned on, the others are type-checked.
TEST(Config, CurrentDeepSpeedKeys) {
  auto c = DeepSpeedConfig::from_string(with_batch(R"("bf16": {"enabled": true, "check_grad_overflow": true,
      "bf16_master_weights_and_grads": false, "bf16_optimizer_states": false},
      "zero_optimization": {"stage": 3, "stage3_allgather_sequential": true, "enable_sanity_checks": false,
        "save_muon_momentum_buffer_in_memory": false, "leaf_module": {"classes": ["MixtralSparseMoeBlock"]},
        "offload_optimizer": {"device": "none", "super_offload": false, "cpuadam_cores_perc": 0.5}})"));
  EXPECT_TRUE(c.bf16.enabled);
  EXPECT_EQ(c.zero_optimization.stage, 3);
  EXPECT_EQ(DeepSpeedConfig::parse(c.to_json(), 1).canonical_dump(), c.canonical_dump());
  expect_error(with_batch(R"("bf16": {"enabled": true, "bf16_master_weights_and_grads": true})"),
               "bf16.bf16_master_weights_and_grads", {"bf16.bf16_master_weights_and_grads", "not supported", "f32"});
  expect_error(with_batch(R"("bf16": {"enabled": true, "bf16_optimizer_states": true})"), "bf16.bf16_optimizer_states",
               {"requires bf16_master_weights_and_grads"});
  expect_error(with_batch(R"("bf16": {"check_grad_overflow": 1})"), "bf16.check_grad_overflow", {"true or false"});
  expect_error(with_batch(R"("zero_optimization": {"zenflow": {"topk_ratio": 0.1}})"), "zero_optimization.zenflow",
               {"ZenFlow is not supported"});
  expect_error(with_batch(R"("zero_optimization": {"leaf_module": {"names": "x"}})"),
               "zero_optimization.leaf_module.names", {"list of strings"});
  expect_error(with_batch(R"("zero_optimization": {"offload_optimizer": {"cpuadam_cores_perc": 2}})"),
               "zero_optimization.offload_optimizer.cpuadam_cores_perc", {"<= 1"});
  std::vector<std::string> w;
  DeepSpeedConfig::from_string(with_batch(R"("bf16": {"check_grad_overflow": false}, "gradient_allreduce_op": "mean",
      "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "super_offload": false}})"), 1, &w);
  std::string all;
  for (const auto& m : w) all += m + "\n";
  EXPECT_NE(all.find("bf16.check_grad_overflow = false"), std::string::npos) << all;
  EXPECT_NE(all.find("'gradient_allreduce_op' is not implemented by DeepSpeed.cpp yet"), std::string::npos) << all;
  EXPECT_EQ(all.find("offload_optimizer"), std::string::npos) << all;  // implemented: no warning
}

// Note [Parallel degrees]: the pipeline and tensor_parallel sections, and the batch triple over dp = W / (tp x pp).
TEST(ConfigParallel, PipelineKeysAndDefaults) {
  auto d = DeepSpeedConfig::from_string(R"({"train_batch_size": 8})");
  EXPECT_FALSE(d.pipeline.stages.has_value());
  EXPECT_EQ(d.pp_size(), 1);
  EXPECT_EQ(d.pipeline.partition, "parameters");
  EXPECT_FALSE(d.pipeline.seed_layers);
  EXPECT_EQ(d.pipeline.activation_checkpoint_interval, 0);
  EXPECT_TRUE(d.pipeline.pipe_partitioned);
  EXPECT_TRUE(d.pipeline.grad_partitioned);
  EXPECT_EQ(d.dscpp.pipeline.virtual_stages, 1);

  auto c = DeepSpeedConfig::from_string(R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
      "pipeline": {"stages": 2, "partition": "Uniform", "seed_layers": true, "activation_checkpoint_interval": 1,
                   "pipe_partitioned": false, "grad_partitioned": false},
      "dscpp": {"pipeline": {"virtual_stages": 3}}})", 4);
  EXPECT_EQ(c.pp_size(), 2);
  EXPECT_EQ(c.pipeline.partition, "uniform");
  EXPECT_TRUE(c.pipeline.seed_layers);
  EXPECT_EQ(c.pipeline.activation_checkpoint_interval, 1);
  EXPECT_FALSE(c.pipeline.pipe_partitioned);
  EXPECT_FALSE(c.pipeline.grad_partitioned);
  EXPECT_EQ(c.dscpp.pipeline.virtual_stages, 3);
  EXPECT_EQ(c.dp_world_size, 2);
  EXPECT_EQ(c.world_size, 4);
  EXPECT_EQ(c.train_batch_size, 2 * 4 * 2);
  EXPECT_EQ(DeepSpeedConfig::parse(c.to_json(), 4).canonical_dump(), c.canonical_dump());

  auto a = DeepSpeedConfig::from_string(with_batch(R"("pipeline": {"stages": "auto", "partition": "best"})"));
  EXPECT_EQ(a.pp_size(), 1);
  EXPECT_EQ(a.pipeline.partition, "parameters");  // DeepSpeed's config default, its PipelineModule's meaning
  EXPECT_EQ(DeepSpeedConfig::parse(a.to_json()).canonical_dump(), a.canonical_dump());

  expect_error(with_batch(R"("pipeline": {"partition": "type:transformer"})"), "pipeline.partition",
               {"type:transformer", "\"parameters\" or \"uniform\""});
  expect_error(with_batch(R"("pipeline": {"partition": "profile"})"), "pipeline.partition", {"profile"});
  expect_error(with_batch(R"("pipeline": {"stages": 0})"), "pipeline.stages", {"0"});
  expect_error(with_batch(R"("pipeline": {"stagse": 2})"), "pipeline.stagse", {"did you mean 'stages'"});
  expect_error(with_batch(R"("pipeline": {"activation_checkpoint_interval": -1})"),
               "pipeline.activation_checkpoint_interval", {"-1"});
  expect_error(with_batch(R"("pipeline": {"activation_checkpoint_interval": 2})"),
               "pipeline.activation_checkpoint_interval", {"2", "use 1 (every block of every stage recomputes) or 0"});
  expect_error(with_batch(R"("dscpp": {"pipeline": {"virtual_stages": 0}})"), "dscpp.pipeline.virtual_stages", {"0"});
  // No longer "not implemented yet": both sections are read.
  std::vector<std::string> w;
  DeepSpeedConfig::from_string(with_batch(R"("pipeline": {}, "tensor_parallel": {})"), 1, &w);
  EXPECT_TRUE(w.empty()) << w.front();
}

TEST(ConfigParallel, TensorParallelKeys) {
  auto d = DeepSpeedConfig::from_string(R"({"train_batch_size": 8})");
  EXPECT_EQ(d.tp_size(), 1);
  auto a = DeepSpeedConfig::from_string(R"({"train_micro_batch_size_per_gpu": 1,
                                            "tensor_parallel": {"autotp_size": 2}})", 4);
  EXPECT_EQ(a.tp_size(), 2);
  EXPECT_EQ(a.dp_world_size, 2);
  EXPECT_EQ(a.train_batch_size, 2);
  // The inference config's key, inside "tp" (alias "tensor_parallel"), counts when autotp_size is not set.
  auto b = DeepSpeedConfig::from_string(R"({"train_micro_batch_size_per_gpu": 1,
                                            "tensor_parallel": {"tp": {"tp_size": 4, "tp_grain_size": 8}}})", 4);
  EXPECT_EQ(b.tp_size(), 4);
  EXPECT_EQ(b.dp_world_size, 1);
  auto c = DeepSpeedConfig::from_string(R"({"train_micro_batch_size_per_gpu": 1,
      "tensor_parallel": {"tensor_parallel": {"tp_size": 4, "enabled": false}}})", 4);
  EXPECT_EQ(c.tp_size(), 1);
  EXPECT_EQ(c.dp_world_size, 4);
  auto same = DeepSpeedConfig::from_string(R"({"train_micro_batch_size_per_gpu": 1,
      "tensor_parallel": {"autotp_size": 2, "tp": {"tp_size": 2}}})", 2);
  EXPECT_EQ(same.tp_size(), 2);
  EXPECT_EQ(DeepSpeedConfig::parse(same.to_json(), 2).canonical_dump(), same.canonical_dump());
  std::vector<std::string> w;
  DeepSpeedConfig::from_string(with_batch(R"("tensor_parallel": {"dtype": "bf16"})"), 1, &w);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("tensor_parallel.dtype"), std::string::npos) << w[0];

  expect_error(with_batch(R"("tensor_parallel": {"autotp_size": 2, "tp": {"tp_size": 4}})"),
               "tensor_parallel.autotp_size", {"autotp_size = 2", "tensor_parallel.tp.tp_size = 4", "disagree"}, 8);
  expect_error(with_batch(R"("tensor_parallel": {"tp": {}, "tensor_parallel": {}})"), "tensor_parallel.tensor_parallel",
               {"only one"});
  expect_error(with_batch(R"("tensor_parallel": {"autotp_size": -1})"), "tensor_parallel.autotp_size", {"-1"});
  expect_error(with_batch(R"("tensor_parallel": {"tp_size": 2})"), "tensor_parallel.tp_size",
               {"tensor_parallel.autotp_size", "inference config's key"});
  expect_error(with_batch(R"("tensor_parallel": {"tp": {"tp_size": 0}})"), "tensor_parallel.tp.tp_size", {"0"});
  expect_error(with_batch(R"("tensor_parallel": {"tp": {"mpu": {}}})"), "tensor_parallel.tp.mpu", {"Python object"});
  expect_error(with_batch(R"("tensor_parallel": {"injection_policy_tuple": [1]})"),
               "tensor_parallel.injection_policy_tuple", {"null"});
}

TEST(ConfigParallel, BatchUsesTheDataParallelSize) {
  // world 8 = tp 2 x pp 2 x dp 2: the triple counts the 2 data-parallel replicas, not the 8 ranks.
  const char* both = R"("pipeline": {"stages": 2}, "tensor_parallel": {"autotp_size": 2})";
  auto c = DeepSpeedConfig::from_string(R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, )" +
                                            std::string(both) + "}", 8);
  EXPECT_EQ(c.dp_world_size, 2);
  EXPECT_EQ(c.gradient_accumulation_steps, 4);
  auto m = DeepSpeedConfig::from_string(R"({"train_micro_batch_size_per_gpu": 3, )" + std::string(both) + "}", 8);
  EXPECT_EQ(m.train_batch_size, 6);
  expect_error(R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, )" +
                   std::string(both) + "}",
               "", {"16 != 2 * 1 * 2"}, 8);
  // The world must split into tp x pp x dp; the error names the key, the values and the rule.
  expect_error(R"({"train_batch_size": 8, "pipeline": {"stages": 3}, "tensor_parallel": {"autotp_size": 2}})",
               "pipeline.stages", {"degree 2 x pipeline.stages 3 = 6", "does not divide the world size 4",
                                   "dp = world / (tp x pp)"}, 4);
  expect_error(R"({"train_batch_size": 8, "tensor_parallel": {"autotp_size": 4}})", "tensor_parallel.autotp_size",
               {"does not divide the world size 2"}, 2);
}
