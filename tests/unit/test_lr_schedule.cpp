// LR schedules against values computed by hand from DeepSpeed's formulas (lr_schedules.py), boundaries included.
#include <gtest/gtest.h>

#include <cmath>

#include "dscpp/runtime/config.h"
#include "dscpp/runtime/lr_schedule.h"

using namespace dscpp;

static SchedulerConfig sched(const std::string& params_json) {
  auto c = DeepSpeedConfig::from_string(R"({"train_batch_size": 1, "scheduler": )" + params_json + "}");
  return c.scheduler;
}

TEST(LRSchedule, ConstantWithoutScheduler) {
  LRScheduler s(SchedulerConfig{}, 0.003);
  EXPECT_EQ(s.lr_at(-1), 0.003);
  EXPECT_EQ(s.lr_at(1000), 0.003);
  EXPECT_FALSE(s.betas_at(5).has_value());
}

TEST(LRSchedule, WarmupLRLog) {
  // W = 10, min 0.01, max 0.1: lr(it) = 0.01 + 0.09 * ln(it + 1) / ln(10) for it < 10, then 0.1.
  auto s = make_lr_scheduler(sched(R"({"type": "WarmupLR", "params": {"warmup_min_lr": 0.01, "warmup_max_lr": 0.1,
                                                                    "warmup_num_steps": 10}})"), 1.0);
  EXPECT_DOUBLE_EQ(s.lr_at(-1), 0.01);               // before the first step(): min lr
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.01);                // ln 1 = 0
  EXPECT_DOUBLE_EQ(s.lr_at(4), 0.01 + 0.09 * std::log(5.0) / std::log(10.0));
  EXPECT_DOUBLE_EQ(s.lr_at(9), 0.1);                 // ln 10 / ln 10 = 1 at the last warmup step
  EXPECT_DOUBLE_EQ(s.lr_at(10), 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(100000), 0.1);
}

TEST(LRSchedule, WarmupLRLinearDefaultsToOptimizerLr) {
  // warmup_max_lr unset: the optimizer's lr (0.2). Linear: it / W. warmup_num_steps 1 -> max(2, 1) = 2.
  auto s = make_lr_scheduler(sched(R"({"type": "WarmupLR", "params": {"warmup_num_steps": 4, "warmup_type": "linear"}})"), 0.2);
  EXPECT_DOUBLE_EQ(s.lr_at(-1), 0.0);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.0);
  EXPECT_DOUBLE_EQ(s.lr_at(1), 0.05);
  EXPECT_DOUBLE_EQ(s.lr_at(3), 0.15);
  EXPECT_DOUBLE_EQ(s.lr_at(4), 0.2);
  auto one = make_lr_scheduler(sched(R"({"type": "WarmupLR", "params": {"warmup_num_steps": 1, "warmup_type": "linear"}})"), 0.2);
  EXPECT_DOUBLE_EQ(one.lr_at(1), 0.1);  // 1 / 2
  EXPECT_DOUBLE_EQ(one.lr_at(2), 0.2);
}

TEST(LRSchedule, WarmupDecayLR) {
  // W = 10, total 30, linear warmup to 0.1, then 0.1 * (30 - it) / 20, floored at 0.
  auto s = make_lr_scheduler(sched(R"({"type": "WarmupDecayLR", "params": {"total_num_steps": 30, "warmup_max_lr": 0.1,
                                    "warmup_num_steps": 10, "warmup_type": "linear"}})"), 1.0);
  EXPECT_DOUBLE_EQ(s.lr_at(5), 0.05);
  EXPECT_DOUBLE_EQ(s.lr_at(10), 0.1);   // (30 - 10) / 20 = 1
  EXPECT_DOUBLE_EQ(s.lr_at(20), 0.05);
  EXPECT_DOUBLE_EQ(s.lr_at(30), 0.0);
  EXPECT_DOUBLE_EQ(s.lr_at(45), 0.0);   // max(0, ...)
}

TEST(LRSchedule, WarmupCosineLR) {
  // base 0.5, W = 5, total 25, warmup_min_ratio 0.1, cos_min_ratio 0.01, log warmup.
  auto s = make_lr_scheduler(sched(R"({"type": "WarmupCosineLR", "params": {"total_num_steps": 25, "warmup_num_steps": 5,
                                    "warmup_min_ratio": 0.1, "cos_min_ratio": 0.01}})"), 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(-1), 0.0);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.5 * 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(2), 0.5 * (0.1 + 0.9 * std::log(3.0) / std::log(5.0)));
  // it = 5: progress (5 - 5 + 1) / 20 = 0.05
  auto cosr = [](double p) { return 0.01 + 0.99 * (1 + std::cos(M_PI * p)) / 2; };
  EXPECT_DOUBLE_EQ(s.lr_at(5), 0.5 * cosr(0.05));
  EXPECT_DOUBLE_EQ(s.lr_at(14), 0.5 * cosr(0.5));
  EXPECT_DOUBLE_EQ(s.lr_at(24), 0.5 * 0.01);  // progress 1
  EXPECT_DOUBLE_EQ(s.lr_at(40), 0.5 * 0.01);  // clamped: no rise after the end
}

TEST(LRSchedule, OneCycleContinuousAndDecay) {
  // first 4, second 6 (total 10), lr 0.01..0.1, decay rate 0.5 every 2 steps, momentum 0.8..0.9.
  auto s = make_lr_scheduler(sched(R"({"type": "OneCycle", "params": {"cycle_min_lr": 0.01, "cycle_max_lr": 0.1,
        "cycle_first_step_size": 4, "cycle_second_step_size": 6, "decay_lr_rate": 0.5, "decay_step_size": 2,
        "decay_mom_rate": 0.1}})"), 1.0);
  // batch = it + 1; x = batch / 10 (first cycle); ratio 0.4.
  EXPECT_DOUBLE_EQ(s.lr_at(-1), 0.01);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.01 + 0.09 * (0.1 / 0.4));
  EXPECT_DOUBLE_EQ(s.lr_at(3), 0.01 + 0.09 * 1.0);                        // x = 0.4: the peak
  EXPECT_DOUBLE_EQ(s.lr_at(6), 0.01 + 0.09 * ((0.7 - 1) / (0.4 - 1)));    // falling half
  // it = 9 < total: batch 10, cycle 2, x = 0 -> scale 0
  EXPECT_DOUBLE_EQ(s.lr_at(9), 0.01);
  // Decay: it >= 10: d = it - 10 + 1; lr = 0.01 / (1 + 0.5 * d / 2)
  EXPECT_DOUBLE_EQ(s.lr_at(10), 0.01 / 1.25);
  EXPECT_DOUBLE_EQ(s.lr_at(13), 0.01 / 2.0);
  // Momentum: initial (min, 0.99); cycle max - (max - min) * scale; decay max * (1 + rate * d / step).
  EXPECT_DOUBLE_EQ((*s.betas_at(-1))[0], 0.8);
  EXPECT_DOUBLE_EQ((*s.betas_at(-1))[1], 0.99);
  EXPECT_DOUBLE_EQ((*s.betas_at(3))[0], 0.9 - 0.1 * 1.0);
  EXPECT_DOUBLE_EQ((*s.betas_at(0))[0], 0.9 - 0.1 * 0.25);
  EXPECT_DOUBLE_EQ((*s.betas_at(13))[0], 0.9 * (1 + 0.1 * 2.0));
}

TEST(LRSchedule, OneCycleStairsAndNoDecay) {
  // first = second = 4, 2 stairs each: position floor(ci * 2 / 4) / 2 rising, floor((8 - ci) * 2 / 4) / 2 falling.
  auto s = make_lr_scheduler(sched(R"({"type": "OneCycle", "params": {"cycle_min_lr": 0.0, "cycle_max_lr": 1.0,
        "cycle_first_step_size": 4, "cycle_first_stair_count": 2}})"), 1.0);
  const double want[] = {0.0 /*it 0, ci 1*/, 0.5, 0.5, 1.0, 0.5 /*ci 5: (3*2/4)=1.5*/, 0.5, 0.0};
  for (int it = 0; it < 7; ++it) EXPECT_DOUBLE_EQ(s.lr_at(it), want[it]) << "it " << it;
  EXPECT_DOUBLE_EQ(s.lr_at(8), 0.0);    // decay_step_size 0: stays at cycle_min_lr
  EXPECT_DOUBLE_EQ(s.lr_at(500), 0.0);
  EXPECT_DOUBLE_EQ((*s.betas_at(500))[0], 0.9);
}

TEST(LRSchedule, StepAndStateRoundTrip) {
  auto cfg = sched(R"({"type": "WarmupLR", "params": {"warmup_num_steps": 10}})");
  auto s = make_lr_scheduler(cfg, 0.1);
  EXPECT_EQ(s.last_batch_iteration(), -1);
  EXPECT_DOUBLE_EQ(s.get_lr(), 0.0);
  for (int i = 0; i < 4; ++i) s.step();
  EXPECT_EQ(s.last_batch_iteration(), 3);
  EXPECT_DOUBLE_EQ(s.get_lr(), 0.1 * std::log(4.0) / std::log(10.0));
  auto t = make_lr_scheduler(cfg, 0.1);
  t.load_state(s.state_json());
  EXPECT_EQ(t.state_json(), nlohmann::json({{"last_batch_iteration", 3}}));
  t.step(), s.step();
  EXPECT_EQ(t.get_lr(), s.get_lr());
}
