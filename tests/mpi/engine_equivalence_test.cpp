// Sharding changes memory, never the math: every stage and world size gives the parameters of
// one unsharded rank after 10 steps, for every update rule, with uneven sizes, a frozen tensor
// and a parameter group of its own.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <tuple>

#include "mpi/toy_model.h"

namespace zeroshard::testing {
namespace {

class EngineEquivalence : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(EngineEquivalence, ShardedParametersEqualOneUnshardedRankAfterTenSteps) {
  const int stage = std::get<0>(GetParam());
  const RuleCase rule_case = rule_cases()[std::get<1>(GetParam())];
  Engine engine = make_engine(toy_config(stage), rule_case.make());
  const int slow_group = add_slow_group(engine);
  const auto tensors = uneven_toy_tensors();
  const auto handles = register_toy(engine, tensors, slow_group);

  auto reference_rule = rule_case.make();
  ToyReference reference(tensors, *reference_rule, engine.world_size());
  const double base_lr = reference_rule->default_lr();
  auto lr_of = [&](std::size_t k) {
    return tensors[k].name.rfind("b.", 0) == 0 ? base_lr * 0.5 : base_lr;
  };
  const std::vector<float> frozen_before = floats_to_host(engine, handles[2].data(), 15);
  for (std::int64_t step = 0; step < 10; ++step) {
    toy_micro_step(engine, tensors, handles, step);
    const StepResult result = engine.step();
    ASSERT_TRUE(result.updated);
    reference.step(step, lr_of, reference_rule->default_weight_decay());
  }
  EXPECT_EQ(engine.global_step(), 10);
  const std::vector<float> actual = engine.consolidated_parameters();
  const std::vector<float> expected = reference.trainable_values();
  ASSERT_EQ(actual.size(), expected.size());
  double worst = 0.0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double scale = std::max(1e-3, std::fabs(static_cast<double>(expected[i])));
    worst = std::max(worst, std::fabs(static_cast<double>(actual[i]) - expected[i]) / scale);
  }
  EXPECT_LE(worst, 1e-6) << rule_case.name << " stage " << stage << " world "
                         << engine.world_size();
  const std::vector<float> frozen_after = floats_to_host(engine, handles[2].data(), 15);
  EXPECT_EQ(frozen_before, frozen_after) << "a frozen parameter changed";
}

INSTANTIATE_TEST_SUITE_P(StagesAndRules, EngineEquivalence,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3), ::testing::Range(0, 5)),
                         [](const auto& info) {
                           return "stage" + std::to_string(std::get<0>(info.param)) + "_" +
                                  rule_cases()[std::get<1>(info.param)].name;
                         });

class EngineCommunicationSwitches : public ::testing::TestWithParam<int> {};

TEST_P(EngineCommunicationSwitches, DeepSpeedsAlternativesKeepTheMath) {
  // All-reduce instead of reduce-scatter, broadcasts instead of all-gather, no overlap,
  // pre-scaled gradients and a tiled step: each changes how the work is done, never the result
  // (up to the rounding of scaling before rather than after the sum).
  const int stage = GetParam();
  Config config = toy_config(stage);
  config.zero_optimization.reduce_scatter = false;
  config.zero_optimization.allgather_partitions = false;
  config.zero_optimization.overlap_comm = false;
  config.zero_optimization.sub_group_size = 10;
  config.prescale_gradients = stage % 2 == 0;
  config.gradient_predivide_factor = 2.0;
  Engine engine = make_engine(config, rule_cases()[0].make());
  const auto tensors = uneven_toy_tensors();
  const auto handles = register_toy(engine, tensors);
  auto reference_rule = rule_cases()[0].make();
  ToyReference reference(tensors, *reference_rule, engine.world_size());
  for (std::int64_t step = 0; step < 10; ++step) {
    toy_micro_step(engine, tensors, handles, step);
    engine.step();
    reference.step(
        step, [&](std::size_t) { return reference_rule->default_lr(); },
        reference_rule->default_weight_decay());
  }
  const std::vector<float> actual = engine.consolidated_parameters();
  const std::vector<float> expected = reference.trainable_values();
  ASSERT_EQ(actual.size(), expected.size());
  for (std::size_t i = 0; i < actual.size(); ++i) {
    EXPECT_NEAR(actual[i], expected[i], 1e-6 * std::max(1e-3f, std::fabs(expected[i])))
        << "element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, EngineCommunicationSwitches, ::testing::Values(0, 1, 2, 3),
                         [](const auto& info) { return "stage" + std::to_string(info.param); });

TEST(EngineEquivalence, AllgatherBucketSizeZeroGathersEverythingAtOnce) {
  // DeepSpeed's allgather_bucket_size: 0 (accepted by its config); newest DeepSpeed gathers the
  // updated parameters in one call whatever the size, and so does zeroshard for 0.
  for (const int stage : {1, 2}) {
    Config config = toy_config(stage);
    config.zero_optimization.allgather_bucket_size = 0;
    Engine engine = make_engine(config, rule_cases()[0].make());
    const auto tensors = uneven_toy_tensors();
    const auto handles = register_toy(engine, tensors);
    auto reference_rule = rule_cases()[0].make();
    ToyReference reference(tensors, *reference_rule, engine.world_size());
    engine.communicator().reset_traffic();
    for (std::int64_t step = 0; step < 3; ++step) {
      toy_micro_step(engine, tensors, handles, step);
      engine.step();
      reference.step(
          step, [&](std::size_t) { return reference_rule->default_lr(); },
          reference_rule->default_weight_decay());
    }
    const std::int64_t gathers =
        engine.communicator().traffic().calls[static_cast<std::size_t>(Collective::kAllGather)];
    EXPECT_EQ(gathers, 3) << "one all-gather per step at stage " << stage;
    const std::vector<float> actual = engine.consolidated_parameters();
    const std::vector<float> expected = reference.trainable_values();
    ASSERT_EQ(actual.size(), expected.size());
    for (std::size_t i = 0; i < actual.size(); ++i) {
      EXPECT_NEAR(actual[i], expected[i], 1e-6 * std::max(1e-3f, std::fabs(expected[i])))
          << "element " << i << " stage " << stage;
    }
  }
}

TEST(EngineEquivalence, GradientsArrivingInAnyOrderGiveTheSameResult) {
  // Each rank hands its gradients over in a different order; buckets still reduce in a fixed
  // order, so no rank deadlocks and the result matches the in-order run.
  auto run = [](bool shuffled) {
    Engine engine = make_engine(toy_config(2), rule_cases()[0].make());
    const auto tensors = uneven_toy_tensors();
    const auto handles = register_toy(engine, tensors);
    for (std::int64_t step = 0; step < 3; ++step) {
      std::vector<std::size_t> order;
      for (std::size_t k = 0; k < tensors.size(); ++k) {
        if (tensors[k].trainable) order.push_back(k);
      }
      if (shuffled) std::rotate(order.begin(), order.begin() + engine.rank() % 3, order.end());
      for (std::size_t k : order) {
        add_toy_gradient(engine, handles[k], k, step);
        engine.grad_ready(handles[k]);
      }
      engine.step();
    }
    return engine.consolidated_parameters();
  };
  EXPECT_EQ(run(false), run(true));
}

}  // namespace
}  // namespace zeroshard::testing
