// Loss scaler: DeepSpeed's DynamicLossScaler (ZeRO rule) and FP16_Optimizer (fused rule) state machines, exact
// values step by step, the "dynamic args present?" defaults, static scales, log texts and the state round trip.
#include <gtest/gtest.h>

#include "dscpp/core/check.h"
#include "dscpp/runtime/loss_scaler.h"

using namespace dscpp;

namespace {

LossScalerArgs zero_args(double init, int64_t window, double min, int64_t hyst, bool consecutive = false) {
  LossScalerArgs a;
  a.init_scale = init;
  a.scale_window = window;
  a.min_scale = min;
  a.delayed_shift = hyst;
  a.consecutive_hysteresis = consecutive;
  return a;
}

// A straight transcription of deepspeed/runtime/fp16/loss_scaler.py DynamicLossScaler.update_scale, kept apart from
// the library code so a slip in either shows up as a difference.
struct RefZero {
  double cur_scale, min_scale;
  int64_t cur_iter = 0, last_overflow_iter = -1, window, delayed_shift, cur_hysteresis;
  bool consecutive;
  bool update(bool overflow) {  // returns false where DeepSpeed raises
    if (overflow) {
      if (delayed_shift == 1 || cur_hysteresis == 1) {
        if (cur_scale == min_scale) return false;
        cur_scale = std::max(cur_scale / 2, min_scale);
      } else {
        cur_hysteresis -= 1;
      }
      last_overflow_iter = cur_iter;
    } else {
      if (consecutive) cur_hysteresis = delayed_shift;
      if ((cur_iter - last_overflow_iter) % window == 0) {
        if (!consecutive) cur_hysteresis = delayed_shift;
        cur_scale *= 2;
      }
    }
    cur_iter += 1;
    return true;
  }
};

}  // namespace

TEST(LossScaler, OverflowHalvesAndLogs) {
  LossScaler s(zero_args(65536, 1000, 1, 1));
  EXPECT_TRUE(s.dynamic());
  EXPECT_EQ(s.loss_scale(), 65536);
  EXPECT_EQ(s.update_scale(true),
            "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768");
  EXPECT_EQ(s.loss_scale(), 32768);
  EXPECT_EQ(s.last_overflow_iter(), 0);
  EXPECT_EQ(s.cur_iter(), 1);
  EXPECT_EQ(s.update_scale(false), "");
  EXPECT_EQ(s.loss_scale(), 32768);
}

TEST(LossScaler, HysteresisDelaysHalving) {
  LossScaler s(zero_args(1024, 1000, 1, 3));
  EXPECT_EQ(s.update_scale(true), "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 1024, but "
                                  "hysteresis is 3. Reducing hysteresis to 2");
  EXPECT_EQ(s.loss_scale(), 1024);
  EXPECT_EQ(s.cur_hysteresis(), 2);
  s.update_scale(true);
  EXPECT_EQ(s.loss_scale(), 1024);
  EXPECT_EQ(s.cur_hysteresis(), 1);
  s.update_scale(true);  // hysteresis spent: halve, and keep halving on every further overflow
  EXPECT_EQ(s.loss_scale(), 512);
  s.update_scale(true);
  EXPECT_EQ(s.loss_scale(), 256);
  EXPECT_EQ(s.cur_hysteresis(), 1);
  EXPECT_EQ(s.last_overflow_iter(), 3);
}

TEST(LossScaler, WindowDoublesAndRefillsHysteresis) {
  LossScaler s(zero_args(8, 4, 1, 2));
  // From the start (last_overflow_iter = -1) the 4th clean call (cur_iter 3) doubles.
  for (int i = 0; i < 3; i++) s.update_scale(false);
  EXPECT_EQ(s.loss_scale(), 8);
  s.update_scale(false);
  EXPECT_EQ(s.loss_scale(), 16);
  s.update_scale(true);  // iter 4: hysteresis 2 -> 1, scale kept
  EXPECT_EQ(s.loss_scale(), 16);
  EXPECT_EQ(s.cur_hysteresis(), 1);
  // (cur_iter - 4) % 4 == 0 at cur_iter 8: the 4th clean call after the overflow doubles and refills hysteresis.
  for (int i = 0; i < 3; i++) s.update_scale(false);
  EXPECT_EQ(s.loss_scale(), 16);
  EXPECT_EQ(s.cur_hysteresis(), 1);  // not consecutive: no refill before the window
  s.update_scale(false);
  EXPECT_EQ(s.loss_scale(), 32);
  EXPECT_EQ(s.cur_hysteresis(), 2);
}

TEST(LossScaler, ConsecutiveHysteresisRefillsEveryCleanStep) {
  LossScaler s(zero_args(64, 1000, 1, 2, true));
  s.update_scale(true);
  EXPECT_EQ(s.cur_hysteresis(), 1);
  EXPECT_EQ(s.update_scale(false), "Consecutive hysteresis is enabled. Restoring hysteresis to 2");
  EXPECT_EQ(s.cur_hysteresis(), 2);
  s.update_scale(true);  // spends the refilled unit: no halving
  EXPECT_EQ(s.loss_scale(), 64);
  s.update_scale(true);
  EXPECT_EQ(s.loss_scale(), 32);
}

TEST(LossScaler, MinScaleClampsThenThrows) {
  LossScaler s(zero_args(6, 1000, 4, 1));
  EXPECT_EQ(s.update_scale(true),
            "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 6, reducing to 4");
  EXPECT_EQ(s.loss_scale(), 4);
  try {
    s.update_scale(true);
    FAIL() << "no error at the minimum scale";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.");
  }
  EXPECT_EQ(s.loss_scale(), 4);
  EXPECT_EQ(s.cur_iter(), 1);  // unchanged by the failed call
}

TEST(LossScaler, MatchesReferenceOnRandomOverflowPattern) {
  for (bool consecutive : {false, true}) {
    LossScaler s(zero_args(1 << 20, 5, 0.5, 3, consecutive));
    RefZero r{double(1 << 20), 0.5, 0, -1, 5, 3, 3, consecutive};
    uint32_t x = 12345;
    for (int i = 0; i < 400; i++) {
      x = x * 1664525u + 1013904223u;
      bool ov = (x >> 24) < 70;  // about 27% overflows
      bool ok = r.update(ov);
      if (!ok) {
        EXPECT_THROW(s.update_scale(ov), Error);
        break;
      }
      s.update_scale(ov);
      ASSERT_EQ(s.loss_scale(), r.cur_scale) << "iteration " << i << " consecutive " << consecutive;
      ASSERT_EQ(s.cur_hysteresis(), r.cur_hysteresis) << "iteration " << i;
      ASSERT_EQ(s.last_overflow_iter(), r.last_overflow_iter) << "iteration " << i;
    }
  }
}

TEST(LossScaler, FusedRuleHasNoHysteresisAndDoublesOneLater) {
  Fp16Config f;
  f.enabled = true;
  f.dynamic_loss_args_given = true;
  f.initial_scale_power = 4;
  f.loss_scale_window = 3;
  f.hysteresis = 5;  // ignored by FP16_Optimizer
  LossScalerArgs a = loss_scaler_args(f, 0);
  EXPECT_EQ(a.rule, LossScaleRule::kFused);
  LossScaler s(a);
  EXPECT_EQ(s.loss_scale(), 16);
  // stable = cur_iter - (-1) - 1 = cur_iter: doubles at cur_iter 3 (the 4th clean call), kZero at cur_iter 2.
  for (int i = 0; i < 3; i++) s.update_scale(false);
  EXPECT_EQ(s.loss_scale(), 16);
  s.update_scale(false);
  EXPECT_EQ(s.loss_scale(), 32);
  EXPECT_EQ(s.update_scale(true), "Overflow detected. Skipping step. Attempted loss scale: 32.0, reducing to 16.0");
  EXPECT_EQ(s.loss_scale(), 16);  // halved at once despite hysteresis 5
  for (int i = 0; i < 4; i++) s.update_scale(true);
  EXPECT_EQ(s.loss_scale(), 1);   // clamped at min 1, no error
  EXPECT_NO_THROW(s.update_scale(true));
  EXPECT_EQ(s.loss_scale(), 1);
}

TEST(LossScaler, ConfigDefaultsFollowTheArgsPresentQuirk) {
  Fp16Config f;
  f.enabled = true;  // {"enabled": true} only: no dynamic args
  LossScalerArgs z = loss_scaler_args(f, 2);
  EXPECT_TRUE(z.dynamic);
  EXPECT_EQ(z.rule, LossScaleRule::kZero);
  EXPECT_EQ(z.init_scale, 4294967296.0);
  EXPECT_EQ(z.scale_window, 1000);
  EXPECT_EQ(z.min_scale, 1.0);
  EXPECT_EQ(z.delayed_shift, 1);
  LossScalerArgs s0 = loss_scaler_args(f, 0);
  EXPECT_EQ(s0.rule, LossScaleRule::kFused);
  EXPECT_EQ(s0.init_scale, 65536.0);
  EXPECT_EQ(s0.min_scale, 1.0);
  EXPECT_EQ(loss_scaler_args(f, 0, /*fused_optimizer=*/false).min_scale, 0.25);
  f.dynamic_loss_args_given = true;  // e.g. {"enabled": true, "hysteresis": 2}: the config's values everywhere
  LossScalerArgs z2 = loss_scaler_args(f, 1);
  EXPECT_EQ(z2.init_scale, 65536.0);
  EXPECT_EQ(z2.delayed_shift, 2);
  EXPECT_FALSE(z2.consecutive_hysteresis);
  f.loss_scale = 128;  // static wins
  LossScalerArgs st = loss_scaler_args(f, 1);
  EXPECT_FALSE(st.dynamic);
  EXPECT_EQ(st.init_scale, 128);
  f.enabled = false;
  LossScalerArgs off = loss_scaler_args(f, 0);
  EXPECT_FALSE(off.dynamic);
  EXPECT_EQ(off.init_scale, 1.0);
}

TEST(LossScaler, StaticScaleNeverChanges) {
  Fp16Config f;
  f.enabled = true;
  f.loss_scale = 512;
  LossScaler z(loss_scaler_args(f, 1));
  EXPECT_EQ(z.update_scale(true), "");
  for (int i = 0; i < 2000; i++) z.update_scale(i % 7 == 0);
  EXPECT_EQ(z.loss_scale(), 512);
  LossScaler fused(loss_scaler_args(f, 0));
  EXPECT_EQ(fused.update_scale(true), "Grad overflow on iteration: 0\nUsing static loss scale of: 512.0");
  EXPECT_EQ(fused.loss_scale(), 512);
}

TEST(LossScaler, BadArgsAreRejected) {
  EXPECT_THROW(LossScaler(zero_args(0, 10, 1, 1)), Error);
  EXPECT_THROW(LossScaler(zero_args(8, 0, 1, 1)), Error);
  EXPECT_THROW(LossScaler(zero_args(8, 10, 0, 1)), Error);
  EXPECT_THROW(LossScaler(zero_args(8, 10, 1, 0)), Error);
}

TEST(LossScaler, StateRoundTripContinuesIdentically) {
  LossScaler a(zero_args(256, 3, 1, 2));
  bool pattern[] = {true, false, false, true, true, false, false, false, true, false};
  for (bool ov : pattern) a.update_scale(ov);
  LossScaler b(zero_args(256, 3, 1, 2));
  b.load_state(nlohmann::json::parse(a.state_json().dump()));
  EXPECT_EQ(b.loss_scale(), a.loss_scale());
  for (int i = 0; i < 20; i++) {
    bool ov = i % 5 == 2;
    a.update_scale(ov);
    b.update_scale(ov);
    ASSERT_EQ(a.loss_scale(), b.loss_scale()) << "after resume, iteration " << i;
    ASSERT_EQ(a.cur_hysteresis(), b.cur_hysteresis());
    ASSERT_EQ(a.cur_iter(), b.cur_iter());
  }
  EXPECT_THROW(b.load_state({{"cur_scale", -1.0}, {"cur_iter", 0}, {"last_overflow_iter", -1}, {"cur_hysteresis", 1}}),
               Error);
}
