// Sharding changes memory, never the math: every stage and world size gives the parameters of
// one unsharded rank after 10 steps, for every update rule, with uneven sizes, a frozen tensor
// and a parameter group of its own.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>
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

/// A user rule that forwards to another and records the largest slice it was given.
class LargestSliceRule final : public UpdateRule {
 public:
  explicit LargestSliceRule(std::unique_ptr<UpdateRule> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return "largest-slice"; }
  int state_count() const override { return inner_->state_count(); }
  double default_lr() const override { return inner_->default_lr(); }
  double default_weight_decay() const override { return inner_->default_weight_decay(); }
  std::optional<double> beta1() const override { return inner_->beta1(); }
  void apply(const ShardSlice& slice, const StepContext& context) const override {
    *largest_ = std::max(*largest_, slice.size);
    inner_->apply(slice, context);
  }
  std::shared_ptr<std::int64_t> largest() const { return largest_; }

 private:
  std::unique_ptr<UpdateRule> inner_;
  std::shared_ptr<std::int64_t> largest_ = std::make_shared<std::int64_t>(0);
};

TEST(EngineEquivalence, SubGroupSizeZeroMakesTheLargestParameterPieceTheSubGroup) {
  // DeepSpeed's sub_group_size: 0 makes every parameter its own sub-group; zeroshard's sub-groups
  // are tiles of the rank's shard, as large as the largest piece of one parameter in it. The
  // update is element-wise, so the result is the default tiling's, bit for bit.
  if (test_device().is_cuda()) {
    GTEST_SKIP() << "the rule that records the tile sizes is the test's own, and a GPU engine runs "
                    "only the built-in rules";
  }
  for (const int stage : {1, 2, 3}) {
    const auto tensors = uneven_toy_tensors();
    Config tiled = toy_config(stage);
    tiled.zero_optimization.sub_group_size = 0;
    auto rule = std::make_unique<LargestSliceRule>(rule_cases()[0].make());
    const std::shared_ptr<std::int64_t> largest = rule->largest();
    Engine engine = make_engine(tiled, std::move(rule));
    const auto handles = register_toy(engine, tensors);
    Engine whole =
        make_engine(toy_config(stage), std::make_unique<LargestSliceRule>(rule_cases()[0].make()));
    const auto whole_handles = register_toy(whole, tensors);
    for (std::int64_t step = 0; step < 3; ++step) {
      toy_micro_step(engine, tensors, handles, step);
      engine.step();
      toy_micro_step(whole, tensors, whole_handles, step);
      whole.step();
    }
    EXPECT_EQ(engine.consolidated_parameters(), whole.consolidated_parameters())
        << "stage " << stage;
    std::int64_t largest_piece = 0;
    for (const Parameter& p : handles) {
      if (!p.trainable()) continue;
      const std::int64_t begin = std::max(engine.flat_offset(p), engine.shard_begin());
      const std::int64_t end = std::min(engine.flat_offset(p) + p.numel(), engine.shard_end());
      largest_piece = std::max(largest_piece, end - begin);
    }
    EXPECT_EQ(*largest, largest_piece) << "stage " << stage << " rank " << engine.rank();
  }
}

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
