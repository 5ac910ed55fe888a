// Engine mixed-precision logic on the CPU (EngineOptions::mixed_precision_on_f32_model: the fp16/bf16 path over an
// f32 model): loss scaling is exact (power-of-two scales), an injected inf skips the step as DeepSpeed does (no
// optimizer or LR step, gradients zeroed, skipped_steps and global_steps += 1), hysteresis / halving / doubling
// through the engine, the min-scale error, and checkpoints of master weights and scaler state.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>

#include "dscpp/core/rng.h"
#include "dscpp/runtime/engine.h"
#include "tiny_models.h"

using namespace dscpp;
namespace fs = std::filesystem;

namespace {

ModelConfig tiny() { return test_fixtures::tiny_model_config("gpt2"); }

DeepSpeedConfig config(const std::string& extra, double clip = 0.0) {
  std::string j = R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
                      "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}},
                      "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 5, "warmup_type": "linear"}},
                      "gradient_clipping": )" + std::to_string(clip) + extra + "}";
  return DeepSpeedConfig::from_string(j);
}

std::unique_ptr<Engine> make_engine(const DeepSpeedConfig& cfg, bool mixed_on_f32 = true) {
  auto m = make_model(tiny());
  m->init_weights(7);
  EngineOptions o;
  o.mixed_precision_on_f32_model = mixed_on_f32;
  return initialize(std::move(m), cfg, o);
}

void batch(int64_t g, int64_t m, Tensor& x, Tensor& y) {
  for (int64_t i = 0; i < x.numel(); i++) {
    Rng rng(500 + uint64_t(g) * 16 + uint64_t(m) * 997 + uint64_t(i));
    x.data<int32_t>()[i] = int32_t(rng.below(97));
    y.data<int32_t>()[i] = int32_t(rng.below(97));
  }
}

// One optimizer step (gas micro-batches). With `poison`, an inf lands in one gradient before the boundary.
void train_step(Engine& e, bool poison = false) {
  Tensor x = Tensor::empty({4, 8}, DType::i32), y = Tensor::empty({4, 8}, DType::i32);
  const int64_t g = e.global_steps();
  for (int64_t m = 0; m < 2; m++) {
    batch(g, m, x, y);
    e.forward(x, y);
    e.backward();
    if (poison && m == 1) {
      Tensor gr = e.model().params().grad(3);
      store_from_float(gr, 5, std::numeric_limits<float>::infinity());
    }
    e.step();
  }
}

std::vector<float> params_of(Engine& e) { return to_float_vector(e.model().params().flat_params()); }

bool all_zero(const Tensor& t) {
  for (float v : to_float_vector(t))
    if (v != 0.0f) return false;
  return true;
}

}  // namespace

TEST(EngineMixed, RefusedOnCpuWithoutTheTestOption) {
  try {
    make_engine(config(R"(, "fp16": {"enabled": true})"), false);
    FAIL() << "fp16 on a CPU f32 model was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CPU kernels are f32 only"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_model(tiny(), {DType::bf16, Device::cpu()}), Error);
  EXPECT_THROW(make_model(tiny(), {DType::f16, Device::cpu()}), Error);
  EXPECT_EQ(model_dtype(config(R"(, "bf16": {"enabled": true})")), DType::bf16);
  EXPECT_EQ(model_dtype(config(R"(, "fp16": {"enabled": true})")), DType::f16);
  EXPECT_EQ(model_dtype(config("")), DType::f32);
}

// Scaling by 2^k commutes with f32 rounding, so with no clipping the fp16 path (scaled backward, f32 masters,
// unscale by 2^-k, cast back) reproduces the f32 run bit for bit; with clipping, to the rounding of the factor.
TEST(EngineMixed, LossScalingIsExactAgainstF32) {
  for (double clip : {0.0, 0.05}) {
    auto ref = make_engine(config("", clip), false);
    auto mp = make_engine(config(R"(, "fp16": {"enabled": true, "initial_scale_power": 12})", clip));
    EXPECT_TRUE(mp->mixed_precision());
    EXPECT_EQ(mp->loss_scale(), 4096.0);
    for (int s = 0; s < 4; s++) {
      train_step(*ref);
      train_step(*mp);
      if (clip == 0.0) EXPECT_EQ(mp->last_loss(), ref->last_loss()) << "step " << s;
      else EXPECT_NEAR(mp->last_loss(), ref->last_loss(), 1e-5) << "step " << s << " clip " << clip;
      EXPECT_NEAR(mp->last_grad_norm(), ref->last_grad_norm(), 1e-6 * ref->last_grad_norm());
    }
    std::vector<float> a = params_of(*ref), b = params_of(*mp), m = to_float_vector(mp->master_params());
    double worst = 0;
    for (size_t i = 0; i < a.size(); i++) worst = std::max(worst, double(std::fabs(a[i] - b[i])));
    if (clip == 0.0) EXPECT_EQ(worst, 0.0) << "fp16 logic differs from f32 without clipping";
    else EXPECT_LT(worst, 1e-6) << "clip " << clip;
    EXPECT_EQ(m, b) << "master weights and parameters differ";
    EXPECT_EQ(mp->skipped_steps(), 0);
  }
}

TEST(EngineMixed, OverflowSkipsStepLikeDeepSpeed) {
  // ZeRO rule (stage 1, one rank) with hysteresis 2: the first overflow spends hysteresis, the second halves.
  auto e = make_engine(config(R"(, "zero_optimization": {"stage": 1},
                                  "fp16": {"enabled": true, "initial_scale_power": 10, "hysteresis": 2})"));
  train_step(*e);
  ASSERT_EQ(e->global_steps(), 1);
  const std::vector<float> params = params_of(*e), master = to_float_vector(e->master_params());
  const double lr = e->get_lr();
  const int64_t lbi = e->lr_scheduler().last_batch_iteration(), opt_steps = e->optimizer().step_count();

  train_step(*e, /*poison=*/true);
  EXPECT_TRUE(e->last_step_skipped());
  EXPECT_EQ(e->skipped_steps(), 1);
  EXPECT_EQ(e->global_steps(), 2);          // DeepSpeed counts the skipped step
  EXPECT_EQ(e->global_samples(), 2 * 8);
  EXPECT_EQ(e->micro_steps(), 4);
  EXPECT_EQ(e->lr_scheduler().last_batch_iteration(), lbi);  // the LR schedule did not move
  EXPECT_EQ(e->get_lr(), lr);
  EXPECT_EQ(e->optimizer().step_count(), opt_steps);
  EXPECT_EQ(params_of(*e), params);
  EXPECT_EQ(to_float_vector(e->master_params()), master);
  EXPECT_TRUE(all_zero(e->model().params().flat_grads()));
  EXPECT_EQ(e->loss_scale(), 1024.0);       // hysteresis 2 -> 1, scale kept
  EXPECT_EQ(e->loss_scaler().cur_hysteresis(), 1);
  EXPECT_FALSE(std::isfinite(e->last_grad_norm()));

  train_step(*e, true);
  EXPECT_EQ(e->loss_scale(), 512.0);
  EXPECT_EQ(e->skipped_steps(), 2);
  EXPECT_EQ(e->global_steps(), 3);

  train_step(*e);  // clean steps apply again and move the schedule (the next lr, lr_at(0), is 0 in this warmup)
  train_step(*e);
  EXPECT_FALSE(e->last_step_skipped());
  EXPECT_EQ(e->lr_scheduler().last_batch_iteration(), lbi + 2);
  EXPECT_EQ(e->optimizer().step_count(), opt_steps + 2);
  EXPECT_NE(params_of(*e), params);
  EXPECT_EQ(e->skipped_steps(), 2);
  EXPECT_EQ(e->global_steps(), 5);
}

TEST(EngineMixed, FusedRuleDoublesAfterWindow) {
  // Stage 0 (FP16_Optimizer): 2^4, window 2: stable = cur_iter since no overflow; doubles at cur_iter 2 and 4.
  auto e = make_engine(config(R"(, "fp16": {"enabled": true, "initial_scale_power": 4, "loss_scale_window": 2})"));
  std::vector<double> scales;
  for (int s = 0; s < 5; s++) {
    train_step(*e);
    scales.push_back(e->loss_scale());
  }
  EXPECT_EQ(scales, (std::vector<double>{16, 16, 32, 32, 64}));
  train_step(*e, true);
  EXPECT_EQ(e->loss_scale(), 32);  // no hysteresis on this path
  EXPECT_EQ(e->skipped_steps(), 1);
}

TEST(EngineMixed, MinimumScaleErrorStopsTheRun) {
  auto e = make_engine(config(R"(, "zero_optimization": {"stage": 2},
                                  "fp16": {"enabled": true, "initial_scale_power": 1, "min_loss_scale": 1,
                                           "hysteresis": 1})"));
  train_step(*e, true);
  EXPECT_EQ(e->loss_scale(), 1.0);
  try {
    train_step(*e, true);
    FAIL() << "no error at the minimum loss scale";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("Current loss scale already at minimum"), std::string::npos) << err.what();
  }
}

TEST(EngineMixed, Bf16SkipsOverflowWithUnitScale) {
  auto e = make_engine(config(R"(, "bf16": {"enabled": true})"));
  EXPECT_EQ(e->loss_scale(), 1.0);
  EXPECT_FALSE(e->loss_scaler().dynamic());
  train_step(*e);
  train_step(*e, true);
  EXPECT_EQ(e->skipped_steps(), 1);
  EXPECT_EQ(e->loss_scale(), 1.0);
}

TEST(EngineMixed, CheckpointKeepsMastersAndScaler) {
  fs::path dir = fs::temp_directory_path() / ("dscpp_test_engine_mixed_" + std::to_string(getpid()));
  fs::remove_all(dir);
  const DeepSpeedConfig cfg =
      config(R"(, "zero_optimization": {"stage": 1},
                  "fp16": {"enabled": true, "initial_scale_power": 6, "loss_scale_window": 2, "hysteresis": 2})",
             0.05);
  auto a = make_engine(cfg);
  train_step(*a);
  train_step(*a, true);
  train_step(*a);
  a->save_checkpoint(dir.string());
  auto b = make_engine(cfg);
  b->load_checkpoint(dir.string());
  EXPECT_EQ(b->loss_scale(), a->loss_scale());
  EXPECT_EQ(b->loss_scaler().cur_iter(), a->loss_scaler().cur_iter());
  EXPECT_EQ(b->loss_scaler().cur_hysteresis(), a->loss_scaler().cur_hysteresis());
  EXPECT_EQ(b->skipped_steps(), 1);
  EXPECT_EQ(to_float_vector(b->master_params()), to_float_vector(a->master_params()));
  for (int s = 0; s < 3; s++) {
    bool poison = s == 1;
    train_step(*a, poison);
    train_step(*b, poison);
    EXPECT_EQ(b->last_loss(), a->last_loss()) << "step after resume " << s;
    EXPECT_EQ(b->loss_scale(), a->loss_scale());
  }
  EXPECT_EQ(params_of(*b), params_of(*a));
  fs::remove_all(dir);
}
