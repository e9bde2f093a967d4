// DeepSpeed's learning-rate schedules: values worked out by hand from lr_schedules.py's formulas
// at the start, inside and at the end of each phase, and the validation of their params.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>

#include "zeroshard/config.h"
#include "zeroshard/error.h"
#include "zeroshard/lr_scheduler.h"

namespace zeroshard {
namespace {

using ::testing::HasSubstr;

constexpr double kTolerance = 1e-12;
constexpr double kOptimizerLr = 0.5;
constexpr double kBeta1 = 0.9;

SchedulerConfig scheduler(const std::string& type) {
  SchedulerConfig config;
  config.type = type;
  return config;
}

std::unique_ptr<LrScheduler> make(const SchedulerConfig& config,
                                  std::optional<double> beta1 = kBeta1) {
  auto result = make_lr_scheduler(config, kOptimizerLr, beta1);
  EXPECT_NE(result, nullptr);
  EXPECT_EQ(result->name(), config.type);
  return result;
}

double lr_at(const LrScheduler& schedule, std::int64_t iteration) {
  return schedule.at(iteration).lr;
}

/// Expects make_lr_scheduler(config) to throw ConfigError on `key_path` with `text` in it.
void expect_config_error(const SchedulerConfig& config, const std::string& key_path,
                         const std::string& text, std::optional<double> beta1 = kBeta1) {
  try {
    make_lr_scheduler(config, kOptimizerLr, beta1);
    ADD_FAILURE() << "no ConfigError; expected one on " << key_path;
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.key_path(), key_path);
    EXPECT_THAT(error.what(), HasSubstr(text));
  }
}

TEST(LrScheduler, IsNullWithoutASchedulerSection) {
  EXPECT_EQ(make_lr_scheduler(SchedulerConfig{}, kOptimizerLr, kBeta1), nullptr);
}

// --- WarmupLR -----------------------------------------------------------------------------------

TEST(WarmupLr, RisesLogarithmicallyThenHolds) {
  SchedulerConfig config = scheduler("WarmupLR");
  config.params = {{"warmup_min_lr", 0.0}, {"warmup_max_lr", 0.1}, {"warmup_num_steps", 100}};
  const auto schedule = make(config);
  EXPECT_EQ(lr_at(*schedule, -1), 0.0);  // what DeepSpeed sets when it builds the scheduler
  EXPECT_EQ(lr_at(*schedule, 0), 0.0);   // log(1) = 0
  // 0.1 * log(10) / log(100) = 0.05
  EXPECT_NEAR(lr_at(*schedule, 9), 0.05, kTolerance);
  EXPECT_NEAR(lr_at(*schedule, 99), 0.1, kTolerance);
  EXPECT_EQ(lr_at(*schedule, 100), 0.1);
  EXPECT_EQ(lr_at(*schedule, 100000), 0.1);
  EXPECT_FALSE(schedule->at(50).momentum.has_value());
}

TEST(WarmupLr, RisesLinearlyFromTheMinimum) {
  SchedulerConfig config = scheduler("WarmupLR");
  config.params = {{"warmup_min_lr", 0.02}, {"warmup_max_lr", 0.1}, {"warmup_num_steps", 100}};
  config.string_params = {{"warmup_type", "linear"}};
  const auto schedule = make(config);
  EXPECT_EQ(lr_at(*schedule, -1), 0.02);
  EXPECT_EQ(lr_at(*schedule, 0), 0.02);
  EXPECT_NEAR(lr_at(*schedule, 50), 0.02 + 0.08 * 0.5, kTolerance);
  EXPECT_NEAR(lr_at(*schedule, 99), 0.02 + 0.08 * 0.99, kTolerance);
  EXPECT_EQ(lr_at(*schedule, 100), 0.1);
}

TEST(WarmupLr, WarmsUpToTheOptimizerLrWhenNoMaximumIsGiven) {
  // Newest DeepSpeed: warmup_max_lr defaults to the optimizer's lr.
  const auto schedule = make(scheduler("WarmupLR"));
  EXPECT_EQ(lr_at(*schedule, 1000), kOptimizerLr);
  // Default warmup: log over 1000 steps from 0.
  EXPECT_NEAR(lr_at(*schedule, 9), kOptimizerLr / 3.0, kTolerance);  // log(10) / log(1000)
}

TEST(WarmupLr, StretchesAZeroOrOneStepWarmupToTwoAsDeepSpeedDoes) {
  // 0 is the Hugging Face Trainer's default warmup_steps, which it writes into warmup_num_steps.
  for (double steps : {0.0, 1.0}) {
    SchedulerConfig config = scheduler("WarmupLR");
    config.params = {{"warmup_max_lr", 1.0}, {"warmup_num_steps", steps}};
    config.string_params = {{"warmup_type", "linear"}};
    const auto schedule = make(config);
    EXPECT_EQ(lr_at(*schedule, 0), 0.0) << steps;
    EXPECT_EQ(lr_at(*schedule, 1), 0.5) << steps;
    EXPECT_EQ(lr_at(*schedule, 2), 1.0) << steps;
  }
}

// --- WarmupDecayLR ------------------------------------------------------------------------------

TEST(WarmupDecayLr, DecaysLinearlyToTheMinimumAtTotalNumSteps) {
  SchedulerConfig config = scheduler("WarmupDecayLR");
  config.params = {{"warmup_min_lr", 0.0},
                   {"warmup_max_lr", 0.1},
                   {"warmup_num_steps", 100},
                   {"total_num_steps", 300}};
  config.string_params = {{"warmup_type", "linear"}};
  const auto schedule = make(config);
  EXPECT_EQ(lr_at(*schedule, -1), 0.0);
  EXPECT_NEAR(lr_at(*schedule, 50), 0.05, kTolerance);
  EXPECT_NEAR(lr_at(*schedule, 100), 0.1, kTolerance);  // (300 - 100) / (300 - 100)
  EXPECT_NEAR(lr_at(*schedule, 200), 0.05, kTolerance);
  EXPECT_NEAR(lr_at(*schedule, 299), 0.1 / 200.0, kTolerance);
  EXPECT_EQ(lr_at(*schedule, 300), 0.0);
  EXPECT_EQ(lr_at(*schedule, 1000), 0.0);
}

TEST(WarmupDecayLr, KeepsDeepSpeedsMaximumDefaultOf0_001) {
  SchedulerConfig config = scheduler("WarmupDecayLR");
  config.params = {{"total_num_steps", 2000}};
  const auto schedule = make(config);
  EXPECT_NEAR(lr_at(*schedule, 1000), 0.001, kTolerance);
  EXPECT_NEAR(lr_at(*schedule, 1500), 0.0005, kTolerance);
}

TEST(WarmupDecayLr, NeedsTotalNumStepsNoShorterThanTheWarmup) {
  expect_config_error(scheduler("WarmupDecayLR"), "scheduler.params.total_num_steps",
                      "required by scheduler type 'WarmupDecayLR'");
  SchedulerConfig config = scheduler("WarmupDecayLR");
  config.params = {{"total_num_steps", 50}, {"warmup_num_steps", 100}};
  expect_config_error(config, "scheduler.params.total_num_steps",
                      "got 50, expected at least warmup_num_steps (100)");
}

// --- WarmupCosineLR -----------------------------------------------------------------------------

TEST(WarmupCosineLr, ScalesTheOptimizerLrThroughWarmupAndCosine) {
  SchedulerConfig config = scheduler("WarmupCosineLR");
  config.params = {{"total_num_steps", 1100},
                   {"warmup_num_steps", 100},
                   {"warmup_min_ratio", 0.2},
                   {"cos_min_ratio", 0.1}};
  config.string_params = {{"warmup_type", "linear"}};
  const auto schedule = make(config);
  EXPECT_EQ(lr_at(*schedule, -1), 0.0);  // DeepSpeed's first update runs with lr 0
  EXPECT_NEAR(lr_at(*schedule, 0), kOptimizerLr * 0.2, kTolerance);
  EXPECT_NEAR(lr_at(*schedule, 50), kOptimizerLr * (0.2 + 0.5 * 0.8), kTolerance);
  EXPECT_NEAR(lr_at(*schedule, 99), kOptimizerLr * (0.2 + 0.99 * 0.8), kTolerance);
  // 500 of 1000 decay steps: half way down the cosine, ratio 0.1 + 0.9 * 0.5.
  EXPECT_NEAR(lr_at(*schedule, 599), kOptimizerLr * 0.55, kTolerance);
  EXPECT_NEAR(lr_at(*schedule, 1099), kOptimizerLr * 0.1, kTolerance);
  EXPECT_NEAR(lr_at(*schedule, 5000), kOptimizerLr * 0.1, kTolerance);
}

TEST(WarmupCosineLr, DefaultsToALogWarmupFromZero) {
  SchedulerConfig config = scheduler("WarmupCosineLR");
  config.params = {{"total_num_steps", 10000}, {"warmup_num_steps", 100}};
  const auto schedule = make(config);
  EXPECT_NEAR(lr_at(*schedule, 9), kOptimizerLr * 0.5, kTolerance);  // log(10) / log(100)
  EXPECT_NEAR(lr_at(*schedule, 10000), kOptimizerLr * 0.0001, kTolerance);
}

// --- OneCycle -----------------------------------------------------------------------------------

SchedulerConfig one_cycle() {
  SchedulerConfig config = scheduler("OneCycle");
  config.params = {{"cycle_min_lr", 0.01}, {"cycle_max_lr", 0.1}, {"cycle_first_step_size", 10}};
  return config;
}

TEST(OneCycle, CyclesLrUpAndDownAndMomentumTheOtherWay) {
  const auto schedule = make(one_cycle());
  // DeepSpeed's constructor sets cycle_min_lr and cycle_min_mom.
  EXPECT_EQ(schedule->at(-1).lr, 0.01);
  EXPECT_EQ(schedule->at(-1).momentum, 0.8);
  // Iteration i is at 1 + i steps into the 20-step cycle; the peak is at 10.
  EXPECT_NEAR(schedule->at(0).lr, 0.01 + 0.09 * 0.1, kTolerance);
  EXPECT_NEAR(*schedule->at(0).momentum, 0.9 - 0.1 * 0.1, kTolerance);
  EXPECT_NEAR(schedule->at(4).lr, 0.055, kTolerance);
  EXPECT_NEAR(*schedule->at(4).momentum, 0.85, kTolerance);
  EXPECT_NEAR(schedule->at(9).lr, 0.1, kTolerance);
  EXPECT_NEAR(*schedule->at(9).momentum, 0.8, kTolerance);
  EXPECT_NEAR(schedule->at(14).lr, 0.055, kTolerance);
  EXPECT_NEAR(schedule->at(19).lr, 0.01, kTolerance);
  EXPECT_NEAR(*schedule->at(19).momentum, 0.9, kTolerance);
  // No decay_step_size: the decay phase holds cycle_min_lr and cycle_max_mom.
  EXPECT_EQ(schedule->at(20).lr, 0.01);
  EXPECT_EQ(schedule->at(500).momentum, 0.9);
}

TEST(OneCycle, DecaysAfterTheCycle) {
  SchedulerConfig config = one_cycle();
  config.params["decay_step_size"] = 5;
  config.params["decay_lr_rate"] = 0.5;
  config.params["decay_mom_rate"] = 0.01;
  const auto schedule = make(config);
  // 10 iterations into the decay = 2 decay intervals: lr 0.01 / (1 + 0.5 * 2); DeepSpeed raises
  // momentum by the same factor form, 0.9 * (1 + 0.01 * 2).
  EXPECT_NEAR(schedule->at(29).lr, 0.005, kTolerance);
  EXPECT_NEAR(*schedule->at(29).momentum, 0.918, kTolerance);
}

TEST(OneCycle, MovesInStairsWhenAStairCountIsGiven) {
  SchedulerConfig config = one_cycle();
  config.params["cycle_first_stair_count"] = 2;
  const auto schedule = make(config);
  EXPECT_NEAR(schedule->at(2).lr, 0.01, kTolerance);    // 3 of 10 steps: stair 0
  EXPECT_NEAR(schedule->at(4).lr, 0.055, kTolerance);   // 5 of 10: stair 1
  EXPECT_NEAR(schedule->at(9).lr, 0.1, kTolerance);     // the peak
  EXPECT_NEAR(schedule->at(12).lr, 0.055, kTolerance);  // 7 steps left of 10: stair 1
  EXPECT_NEAR(schedule->at(15).lr, 0.01, kTolerance);   // 4 left: stair 0
}

TEST(OneCycle, LeavesMomentumAloneForOptimizersWithoutBetas) {
  EXPECT_FALSE(make(one_cycle(), std::nullopt)->at(5).momentum.has_value());
  SchedulerConfig config = one_cycle();
  config.params["cycle_momentum"] = 0.0;
  EXPECT_FALSE(make(config)->at(5).momentum.has_value());
  config.params["cycle_momentum"] = 1.0;
  expect_config_error(config, "scheduler.params.cycle_momentum", "has no betas", std::nullopt);
}

TEST(OneCycle, NeedsBothLrBounds) {
  SchedulerConfig config = scheduler("OneCycle");
  config.params = {{"cycle_max_lr", 0.1}};
  expect_config_error(config, "scheduler.params.cycle_min_lr", "required");
}

// --- LRRangeTest --------------------------------------------------------------------------------

TEST(LrRangeTest, GrowsTheLrContinuouslyOrInStairs) {
  SchedulerConfig config = scheduler("LRRangeTest");
  config.params = {{"lr_range_test_step_size", 10}};
  const auto continuous = make(config);
  EXPECT_EQ(lr_at(*continuous, -1), 0.001);
  EXPECT_NEAR(lr_at(*continuous, 0), 0.0011, kTolerance);  // 0.001 * (1 + 1 / 10)
  EXPECT_NEAR(lr_at(*continuous, 9), 0.002, kTolerance);
  EXPECT_NEAR(lr_at(*continuous, 19), 0.003, kTolerance);
  config.params["lr_range_test_staircase"] = 1.0;
  config.params["lr_range_test_step_rate"] = 2.0;
  const auto staircase = make(config);
  EXPECT_EQ(lr_at(*staircase, 8), 0.001);
  EXPECT_NEAR(lr_at(*staircase, 9), 0.003, kTolerance);
  EXPECT_NEAR(lr_at(*staircase, 18), 0.003, kTolerance);
}

TEST(LrRangeTest, UsesDeepSpeedsDefaults) {
  const auto schedule = make(scheduler("LRRangeTest"));
  EXPECT_NEAR(lr_at(*schedule, 1999), 0.002, kTolerance);  // step size 2000, rate 1
}

// --- Validation ---------------------------------------------------------------------------------

TEST(LrScheduler, RejectsAnUnknownType) {
  expect_config_error(scheduler("CosineAnnealing"), "scheduler.type",
                      "expected one of WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, "
                      "LRRangeTest");
}

TEST(LrScheduler, RejectsAnUnknownParamListingTheAllowedOnes) {
  SchedulerConfig config = scheduler("WarmupLR");
  config.params = {{"total_num_steps", 100}};
  expect_config_error(config, "scheduler.params.total_num_steps",
                      "allowed: warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type");
}

TEST(LrScheduler, RejectsAnUnknownWarmupType) {
  SchedulerConfig config = scheduler("WarmupCosineLR");
  config.params = {{"total_num_steps", 100}, {"warmup_num_steps", 10}};
  config.string_params = {{"warmup_type", "cosine"}};
  expect_config_error(config, "scheduler.params.warmup_type",
                      "got 'cosine', expected 'log' or 'linear'");
}

TEST(LrScheduler, RejectsNegativeOrFractionalWarmupSteps) {
  SchedulerConfig config = scheduler("WarmupLR");
  config.params = {{"warmup_num_steps", -1}};
  expect_config_error(config, "scheduler.params.warmup_num_steps",
                      "got -1, expected an integer >= 0");
  config.params = {{"warmup_num_steps", 2.5}};
  expect_config_error(config, "scheduler.params.warmup_num_steps", "got 2.5, expected an integer");
}

TEST(LrScheduler, RejectsValuesOfTheWrongKind) {
  SchedulerConfig config = scheduler("WarmupLR");
  config.params = {{"warmup_type", 1}};
  expect_config_error(config, "scheduler.params.warmup_type", "expected a string");
  config = scheduler("WarmupLR");
  config.string_params = {{"warmup_max_lr", "0.1"}};
  expect_config_error(config, "scheduler.params.warmup_max_lr", "expected a number");
  config = scheduler("LRRangeTest");
  config.params = {{"lr_range_test_staircase", 3}};
  expect_config_error(config, "scheduler.params.lr_range_test_staircase",
                      "expected true or false, got 3");
  config = one_cycle();
  config.params["cycle_max_mom"] = 1.5;
  expect_config_error(config, "scheduler.params.cycle_max_mom", "expected a number in [0, 1)");
}

}  // namespace
}  // namespace zeroshard
