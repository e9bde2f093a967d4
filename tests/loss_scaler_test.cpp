// Tests of the loss scaler's state machine against DeepSpeed's DynamicLossScaler.update_scale:
// growth window, hysteresis, consecutive hysteresis, the floor, static scales and checkpoints.
#include "precision/loss_scaler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>
#include <random>
#include <vector>

#include "zeroshard/error.h"

namespace zeroshard::detail {
namespace {

using testing::HasSubstr;

constexpr bool kClean = false;
constexpr bool kOverflow = true;

Fp16Config dynamic_config(int initial_scale_power, int window, int hysteresis,
                          bool consecutive_hysteresis = false, double min_loss_scale = 1.0) {
  Fp16Config config;
  config.enabled = true;
  config.initial_scale_power = initial_scale_power;
  config.loss_scale_window = window;
  config.hysteresis = hysteresis;
  config.consecutive_hysteresis = consecutive_hysteresis;
  config.min_loss_scale = min_loss_scale;
  return config;
}

// Feeds `steps` to the scaler and returns the scale after each one.
std::vector<double> scales_after(LossScaler& scaler, const std::vector<bool>& steps) {
  std::vector<double> scales;
  for (const bool overflow : steps) {
    scaler.update(overflow);
    scales.push_back(scaler.scale());
  }
  return scales;
}

TEST(LossScaler, StartsAtDeepSpeedsDefaultOfTwoToTheSixteen) {
  const LossScaler scaler(Fp16Config{});
  EXPECT_TRUE(scaler.dynamic());
  EXPECT_EQ(scaler.scale(), 65536.0);
  const LossScalerState state = scaler.state();
  EXPECT_EQ(state.iteration, 0);
  EXPECT_EQ(state.iterations_since_overflow, 1);  // cur_iter 0 - last_overflow_iter -1
  EXPECT_EQ(state.hysteresis_left, 2);
  EXPECT_EQ(state.overflows, 0);
}

TEST(LossScaler, HysteresisZeroNeverLowersTheScaleAsInDeepSpeed) {
  // DeepSpeed halves when delayed_shift == 1 or cur_hysteresis == 1; from 0 its counter only
  // runs down, so every overflow skips the step and the scale stays.
  LossScaler scaler(dynamic_config(4, /*window=*/100, /*hysteresis=*/0));
  EXPECT_EQ(scales_after(scaler, std::vector<bool>(5, kOverflow)),
            (std::vector<double>{16, 16, 16, 16, 16}));
  EXPECT_EQ(scaler.state().overflows, 5);
  LossScaler restored(dynamic_config(4, 100, 0));
  restored.restore(scaler.state());
  EXPECT_EQ(restored.scale(), 16);
}

TEST(LossScaler, DoublesOnTheCleanStepAfterAFullWindow) {
  // DeepSpeed grows when (cur_iter - last_overflow_iter - 1) is a positive multiple of the
  // window: from the start that is at cur_iter 4, 8, ..., i.e. after the 5th and 9th clean step.
  LossScaler scaler(dynamic_config(4, /*window=*/4, /*hysteresis=*/1));
  EXPECT_EQ(scales_after(scaler, std::vector<bool>(9, kClean)),
            (std::vector<double>{16, 16, 16, 16, 32, 32, 32, 32, 64}));
}

TEST(LossScaler, DeepSpeedDefaultsGrowAfterAThousandAndOneCleanSteps) {
  LossScaler scaler(Fp16Config{});
  for (int step = 0; step < 1000; ++step) EXPECT_FALSE(scaler.update(kClean));
  EXPECT_EQ(scaler.scale(), 65536.0);
  scaler.update(kClean);
  EXPECT_EQ(scaler.scale(), 131072.0);
}

TEST(LossScaler, HalvesOnOverflowAndRestartsTheWindowFromIt) {
  LossScaler scaler(dynamic_config(4, /*window=*/4, /*hysteresis=*/1));
  EXPECT_TRUE(scaler.update(kOverflow));
  EXPECT_EQ(scaler.scale(), 8.0);
  EXPECT_EQ(scaler.state().iterations_since_overflow, 1);
  EXPECT_EQ(scales_after(scaler, std::vector<bool>(5, kClean)),
            (std::vector<double>{8, 8, 8, 8, 16}));
  EXPECT_EQ(scaler.state().iterations_since_overflow, 6);
  EXPECT_EQ(scaler.state().overflows, 1);
}

TEST(LossScaler, HysteresisOfTwoNeedsTwoOverflowsBeforeHalving) {
  LossScaler scaler(dynamic_config(4, /*window=*/1000, /*hysteresis=*/2));
  EXPECT_TRUE(scaler.update(kOverflow));
  EXPECT_EQ(scaler.scale(), 16.0);
  EXPECT_EQ(scaler.state().hysteresis_left, 1);
  EXPECT_TRUE(scaler.update(kOverflow));
  EXPECT_EQ(scaler.scale(), 8.0);
  // Hysteresis is spent until the scale grows again: every further overflow halves.
  EXPECT_EQ(scaler.state().hysteresis_left, 1);
  EXPECT_TRUE(scaler.update(kOverflow));
  EXPECT_EQ(scaler.scale(), 4.0);
}

TEST(LossScaler, CleanStepsDoNotRefillHysteresisWithoutConsecutiveHysteresis) {
  LossScaler scaler(dynamic_config(4, /*window=*/1000, /*hysteresis=*/2));
  EXPECT_EQ(scales_after(scaler, {kOverflow, kClean, kClean, kOverflow}),
            (std::vector<double>{16, 16, 16, 8}));
}

TEST(LossScaler, GrowthRefillsHysteresis) {
  LossScaler scaler(dynamic_config(4, /*window=*/2, /*hysteresis=*/2));
  EXPECT_EQ(scales_after(scaler, {kOverflow, kClean, kClean}), (std::vector<double>{16, 16, 16}));
  EXPECT_EQ(scaler.state().hysteresis_left, 1);
  scaler.update(kClean);  // cur_iter 3: three steps since the overflow at 0, minus one, is 2
  EXPECT_EQ(scaler.scale(), 32.0);
  EXPECT_EQ(scaler.state().hysteresis_left, 2);
  EXPECT_EQ(scales_after(scaler, {kOverflow, kOverflow}), (std::vector<double>{32, 16}));
}

TEST(LossScaler, ConsecutiveHysteresisRefillsOnEveryCleanStep) {
  LossScaler scaler(dynamic_config(4, /*window=*/1000, /*hysteresis=*/2, /*consecutive=*/true));
  // Overflows that alternate with clean steps never halve the scale...
  EXPECT_EQ(scales_after(scaler, {kOverflow, kClean, kOverflow, kClean, kOverflow}),
            (std::vector<double>{16, 16, 16, 16, 16}));
  EXPECT_EQ(scaler.state().hysteresis_left, 1);
  scaler.update(kClean);
  EXPECT_EQ(scaler.state().hysteresis_left, 2);
  // ...two in a row do.
  EXPECT_EQ(scales_after(scaler, {kOverflow, kOverflow}), (std::vector<double>{16, 8}));
}

TEST(LossScaler, NeverGoesBelowTheMinimum) {
  LossScaler scaler(dynamic_config(4, /*window=*/1000, /*hysteresis=*/1, false, /*min=*/3.0));
  EXPECT_EQ(scales_after(scaler, {kOverflow, kOverflow, kOverflow}),
            (std::vector<double>{8, 4, 3}));
}

TEST(LossScaler, ThrowsOnOverflowAtTheMinimumAndChangesNothing) {
  LossScaler scaler(dynamic_config(1, /*window=*/1000, /*hysteresis=*/1));
  scaler.update(kOverflow);
  ASSERT_EQ(scaler.scale(), 1.0);
  const LossScalerState before = scaler.state();
  try {
    scaler.update(kOverflow);
    FAIL() << "expected UsageError";
  } catch (const UsageError& error) {
    EXPECT_THAT(error.what(), HasSubstr("Current loss scale already at minimum"));
    EXPECT_THAT(error.what(), HasSubstr("fp16.min_loss_scale = 1"));
    EXPECT_THAT(error.what(), HasSubstr("bf16"));
    EXPECT_THAT(error.what(), HasSubstr("static fp16.loss_scale"));
  }
  const LossScalerState after = scaler.state();
  EXPECT_EQ(after.scale, before.scale);
  EXPECT_EQ(after.iteration, before.iteration);
  EXPECT_EQ(after.overflows, before.overflows);
  // A clean step still goes on from there.
  EXPECT_FALSE(scaler.update(kClean));
}

TEST(LossScaler, SpendsHysteresisBeforeThrowingAtTheMinimum) {
  LossScaler scaler(dynamic_config(0, /*window=*/1000, /*hysteresis=*/2));
  ASSERT_EQ(scaler.scale(), 1.0);
  EXPECT_TRUE(scaler.update(kOverflow));
  EXPECT_EQ(scaler.state().hysteresis_left, 1);
  EXPECT_THROW(scaler.update(kOverflow), UsageError);
}

TEST(LossScaler, StaticScaleNeverChangesButReportsSkips) {
  Fp16Config config = dynamic_config(4, /*window=*/2, /*hysteresis=*/1);
  config.loss_scale = 128.0;
  LossScaler scaler(config);
  EXPECT_FALSE(scaler.dynamic());
  EXPECT_EQ(scaler.scale(), 128.0);
  for (int step = 0; step < 10; ++step) {
    EXPECT_TRUE(scaler.update(kOverflow));
    EXPECT_FALSE(scaler.update(kClean));
    EXPECT_FALSE(scaler.update(kClean));
    EXPECT_EQ(scaler.scale(), 128.0);
  }
  EXPECT_EQ(scaler.state().overflows, 10);
  EXPECT_EQ(scaler.state().iteration, 30);
  EXPECT_EQ(scaler.state().iterations_since_overflow, 3);
}

TEST(LossScaler, RestoredStateContinuesIdentically) {
  for (const bool consecutive : {false, true}) {
    const Fp16Config config = dynamic_config(12, /*window=*/5, /*hysteresis=*/2, consecutive);
    // One step in six overflows: the scale goes both ways without reaching the minimum.
    // mt19937's raw output is the same with every standard library.
    std::mt19937 rng(42);
    auto overflows = [&rng] { return rng() % 6 == 0; };
    LossScaler original(config);
    for (int step = 0; step < 57; ++step) original.update(overflows());
    LossScaler resumed(config);
    resumed.restore(original.state());
    bool halved = false;
    bool grew = false;
    for (int step = 0; step < 200; ++step) {
      const bool overflow = overflows();
      const double scale_before = original.scale();
      ASSERT_EQ(resumed.update(overflow), original.update(overflow));
      halved = halved || original.scale() < scale_before;
      grew = grew || original.scale() > scale_before;
      const LossScalerState expected = original.state();
      const LossScalerState actual = resumed.state();
      ASSERT_EQ(actual.scale, expected.scale) << "step " << step;
      ASSERT_EQ(actual.iterations_since_overflow, expected.iterations_since_overflow);
      ASSERT_EQ(actual.hysteresis_left, expected.hysteresis_left);
      ASSERT_EQ(actual.overflows, expected.overflows);
      ASSERT_EQ(actual.iteration, expected.iteration);
    }
    EXPECT_TRUE(halved && grew) << "the sequence should exercise both directions";
  }
}

TEST(LossScaler, StaticScaleKeepsItsConfiguredValueOnRestore) {
  Fp16Config config;
  config.loss_scale = 512.0;
  config.hysteresis = 0;  // meaningless with a static scale, and so accepted
  LossScaler scaler(config);
  LossScaler(config).restore(scaler.state());
  scaler.restore(LossScalerState{.scale = 8.0,
                                 .iterations_since_overflow = 3,
                                 .hysteresis_left = 2,
                                 .overflows = 4,
                                 .iteration = 10});
  EXPECT_EQ(scaler.scale(), 512.0);
  EXPECT_EQ(scaler.state().iteration, 10);
  EXPECT_EQ(scaler.state().overflows, 4);
}

TEST(LossScaler, RejectsAStateNoScalerCanReach) {
  LossScaler scaler(Fp16Config{});
  const LossScalerState good{.scale = 1024.0,
                             .iterations_since_overflow = 3,
                             .hysteresis_left = 1,
                             .overflows = 1,
                             .iteration = 5};
  auto with = [&](auto change) {
    LossScalerState state = good;
    change(state);
    return state;
  };
  EXPECT_NO_THROW(scaler.restore(good));
  EXPECT_THROW(scaler.restore(with([](auto& s) { s.scale = 0; })), UsageError);
  EXPECT_THROW(
      scaler.restore(with([](auto& s) { s.scale = std::numeric_limits<double>::infinity(); })),
      UsageError);
  EXPECT_THROW(scaler.restore(with([](auto& s) { s.iteration = -1; })), UsageError);
  EXPECT_THROW(scaler.restore(with([](auto& s) { s.iterations_since_overflow = 0; })), UsageError);
  EXPECT_THROW(scaler.restore(with([](auto& s) { s.iterations_since_overflow = 7; })), UsageError);
  EXPECT_THROW(scaler.restore(with([](auto& s) { s.hysteresis_left = -1; })), UsageError);
  EXPECT_THROW(scaler.restore(with([](auto& s) { s.overflows = 6; })), UsageError);
  EXPECT_EQ(scaler.scale(), 1024.0) << "a rejected state leaves the last good one";
}

void expect_config_error(const Fp16Config& config, const char* key) {
  try {
    LossScaler scaler(config);
    ADD_FAILURE() << "expected a ConfigError for " << key;
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.key_path(), key);
  }
}

TEST(LossScaler, RejectsSettingsDeepSpeedRejects) {
  const Fp16Config good = dynamic_config(16, 1000, 2);
  auto with = [&](auto change) {
    Fp16Config config = good;
    change(config);
    return config;
  };
  expect_config_error(with([](auto& c) { c.loss_scale = -1; }), "fp16.loss_scale");
  expect_config_error(
      with([](auto& c) { c.loss_scale = std::numeric_limits<double>::quiet_NaN(); }),
      "fp16.loss_scale");
  expect_config_error(with([](auto& c) { c.loss_scale_window = 0; }), "fp16.loss_scale_window");
  expect_config_error(with([](auto& c) { c.hysteresis = -1; }), "fp16.hysteresis");
  expect_config_error(with([](auto& c) { c.min_loss_scale = 0; }), "fp16.min_loss_scale");
  expect_config_error(
      with([](auto& c) { c.min_loss_scale = std::numeric_limits<double>::infinity(); }),
      "fp16.min_loss_scale");
  expect_config_error(with([](auto& c) { c.initial_scale_power = 1024; }),
                      "fp16.initial_scale_power");
  // A static scale makes the dynamic settings irrelevant, as in DeepSpeed's CreateLossScaler.
  EXPECT_NO_THROW(LossScaler{with([](auto& c) {
    c.loss_scale = 1.0;
    c.loss_scale_window = 0;
  })});
}

}  // namespace
}  // namespace zeroshard::detail
