// stage3_max_live_parameters, stage3_prefetch_bucket_size and stage3_max_reuse_distance as
// DeepSpeed means them: budgets for what is prefetched and kept, never a wall for the module a
// model asks for. Run at 1-4 ranks; the training must equal a run with no budget.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "toy_model.h"

namespace zeroshard::testing {
namespace {

constexpr std::int64_t kLayer = 1024;  // elements per layer: no alignment padding

std::vector<ToyTensor> layers() {
  return {
      {"l0.weight", kLayer}, {"l1.weight", kLayer}, {"l2.weight", kLayer}, {"l3.weight", kLayer}};
}

struct BudgetRun {
  std::int64_t peak_gathered_bytes = 0;
  std::vector<float> parameters;
};

BudgetRun train(std::int64_t max_live, std::int64_t prefetch, std::int64_t reuse_distance) {
  Config config = toy_config(3);
  config.zero_optimization.max_live_parameters = max_live;
  config.zero_optimization.prefetch_bucket_size = prefetch;
  config.zero_optimization.max_reuse_distance = reuse_distance;
  config.zero_optimization.param_persistence_threshold = 0;
  Engine engine = make_engine(config, make_adamw({.lr = 1e-2}));
  const std::vector<ToyTensor> tensors = layers();
  const std::vector<Parameter> handles = register_toy(engine, tensors);
  for (std::int64_t step = 0; step < 3; ++step) {
    toy_micro_step(engine, tensors, handles, step);
    engine.step();
  }
  return {engine.peak_gathered_bytes(), engine.consolidated_parameters()};
}

TEST(Stage3Budget, AModuleLargerThanTheBudgetIsGatheredAlone) {
  // Half a layer: DeepSpeed still gathers each layer the model asks for, prefetches nothing and
  // keeps nothing for reuse, so one layer at a time is the peak.
  const BudgetRun small = train(kLayer / 2, 1'000'000'000, 1'000'000'000);
  EXPECT_EQ(small.peak_gathered_bytes, kLayer * 4);
  const BudgetRun unbounded = train(1'000'000'000, 1'000'000'000, 1'000'000'000);
  EXPECT_EQ(small.parameters, unbounded.parameters);
  EXPECT_GT(unbounded.peak_gathered_bytes, 2 * kLayer * 4) << "no budget: more is prefetched";
}

TEST(Stage3Budget, ABudgetOfTwoLayersKeepsAtMostTwoGathered) {
  const BudgetRun two = train(2 * kLayer, 1'000'000'000, 1'000'000'000);
  EXPECT_EQ(two.peak_gathered_bytes, 2 * kLayer * 4) << "the budget is used for prefetch";
  EXPECT_EQ(two.parameters, train(1'000'000'000, 0, 0).parameters);
}

}  // namespace
}  // namespace zeroshard::testing
