// Stage 0 with reduce_scatter true sums every gradient element in the order stages 1-3 sum it (a
// reduce-scatter over the shard boundaries, then the sums gathered back) and takes the gradient
// norm as they do, so in fp32 it trains to their master weights bit for bit, with gradients whose
// sum over the ranks depends on the order of its terms, several buckets and shard boundaries
// inside tensors. With reduce_scatter false (a JSON config's default at stage 0) it all-reduces,
// and agrees with them to rounding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "mpi/toy_model.h"

namespace zeroshard::testing {
namespace {

/// Full 24-bit significands, magnitudes four orders apart across ranks: a sum over three or more
/// ranks rounds differently when its terms are added in another order.
float order_sensitive_gradient(std::size_t tensor, std::int64_t i, int rank, std::int64_t step) {
  constexpr double kScale[] = {1.0, 3.1e-3, 41.0, 0.27};
  return static_cast<float>(kScale[rank % 4] *
                            std::sin(1.3 + 0.71 * static_cast<double>(tensor) +
                                     0.0137 * static_cast<double>(i) * (rank + 1) +
                                     0.29 * static_cast<double>(step)));
}

struct Training {
  int world = 1;
  std::vector<float> parameters;
  std::vector<double> grad_norms;
  TrafficCounters traffic;
};

/// Trains the uneven toy model (shards split tensors and buckets) for `steps` optimizer steps;
/// with `drop_first`, Engine::zero_grad() after each window's first micro-step; with
/// `abandon_backward`, each micro-step is preceded by a whole backward of other gradients that is
/// dropped with Engine::zero_grad() instead of stepped, its last reductions still in flight.
Training train(int stage, int accumulation, int steps, bool drop_first = false,
               bool reduce_scatter = true, bool abandon_backward = false) {
  Config config = toy_config(stage);
  config.zero_optimization.reduce_scatter = reduce_scatter;
  // Buckets of at most 40 elements: seven of them, most split over the ranks unevenly.
  config.zero_optimization.reduce_bucket_size = 40;
  config.gradient_accumulation_steps = accumulation;
  // The toy gradients' norm is far above 1, so every step is clipped: the norm must agree too.
  config.gradient_clipping = 1.0;
  Engine engine = make_engine(config, rule_cases()[0].make());
  const auto tensors = uneven_toy_tensors();
  const auto handles = register_toy(engine, tensors);
  Training run;
  run.world = engine.world_size();
  for (std::int64_t micro = 0; micro < static_cast<std::int64_t>(steps) * accumulation; ++micro) {
    if (abandon_backward) {
      toy_backward(engine, tensors, handles, [&](std::size_t k) {
        const std::int64_t n = tensors[k].numel;
        std::vector<float> g = floats_to_host(engine, handles[k].grad(), n);
        for (std::int64_t i = 0; i < n; ++i) {
          g[i] += order_sensitive_gradient(k, i, engine.rank(), micro + 1000);
        }
        from_host(engine, handles[k].grad(), g.data(), n * sizeof(float));
      });
      engine.zero_grad();
    }
    toy_backward(engine, tensors, handles, [&](std::size_t k) {
      const std::int64_t n = tensors[k].numel;
      std::vector<float> g = floats_to_host(engine, handles[k].grad(), n);
      for (std::int64_t i = 0; i < n; ++i) {
        g[i] += order_sensitive_gradient(k, i, engine.rank(), micro);
      }
      from_host(engine, handles[k].grad(), g.data(), n * sizeof(float));
    });
    const StepResult result = engine.step();
    if (result.updated) run.grad_norms.push_back(result.grad_norm);
    if (drop_first && micro % accumulation == 0) engine.zero_grad();
  }
  EXPECT_EQ(static_cast<int>(run.grad_norms.size()), steps);
  run.traffic = engine.communicator().traffic();
  run.parameters = engine.consolidated_parameters();
  return run;
}

/// Elements of `count` whose sum over `world` ranks' gradients at step 0 differs between adding
/// the ranks first to last and last to first: the data can tell one summation order from another.
int order_sensitive_elements(int world, std::int64_t count) {
  int differing = 0;
  for (std::int64_t i = 0; i < count; ++i) {
    float forward = 0.0f;
    float backward = 0.0f;
    for (int r = 0; r < world; ++r) forward += order_sensitive_gradient(0, i, r, 0);
    for (int r = world; r-- > 0;) backward += order_sensitive_gradient(0, i, r, 0);
    if (forward != backward) ++differing;
  }
  return differing;
}

class StageZeroReduction : public ::testing::TestWithParam<int> {};

TEST_P(StageZeroReduction, GivesTheMasterWeightsOfStagesOneToThreeBitForBit) {
  const int stage = GetParam();
  const Training expected = train(stage, 1, 5);
  const Training actual = train(0, 1, 5);
  if (actual.world >= 3) {
    EXPECT_GT(order_sensitive_elements(actual.world, 91), 0)
        << "the test's gradients sum alike in any order, so they cannot tell orders apart";
  }
  EXPECT_EQ(actual.grad_norms, expected.grad_norms) << "stage 0 against stage " << stage;
  ASSERT_EQ(actual.parameters.size(), expected.parameters.size());
  int differing = 0;
  for (std::size_t i = 0; i < actual.parameters.size(); ++i) {
    if (actual.parameters[i] != expected.parameters[i]) ++differing;
  }
  EXPECT_EQ(differing, 0) << "of " << actual.parameters.size()
                          << " master weights differ between stage 0 and stage " << stage << " on "
                          << actual.world << " ranks";
}

INSTANTIATE_TEST_SUITE_P(Stages, StageZeroReduction, ::testing::Values(1, 2, 3),
                         [](const auto& info) { return "stage" + std::to_string(info.param); });

// Stages 0-1 sum the micro-steps' gradients on each rank before reducing them once per window, so
// with accumulation they still agree bit for bit (stages 2-3 reduce every micro-step and add the
// sums, another order).
TEST(StageZeroReduction, WithAccumulationGivesStageOnesMasterWeightsBitForBit) {
  const Training expected = train(1, 3, 3);
  const Training actual = train(0, 3, 3);
  EXPECT_EQ(actual.grad_norms, expected.grad_norms);
  EXPECT_EQ(actual.parameters, expected.parameters);
}

// zero_grad() after a window's first micro-step leaves only the second: one micro-step's sum,
// which every stage reduces in the same order, so stages 1-3 (stages 2-3 keep a gradient shard
// that the next arrivals replace rather than a zeroed one) still give stage 0's weights.
TEST_P(StageZeroReduction, ZeroGradInsideAWindowDropsItsFirstMicroStepAtEveryStage) {
  const int stage = GetParam();
  const Training expected = train(0, 2, 3, /*drop_first=*/true);
  const Training actual = train(stage, 2, 3, /*drop_first=*/true);
  EXPECT_EQ(actual.grad_norms, expected.grad_norms) << "stage " << stage;
  EXPECT_EQ(actual.parameters, expected.parameters) << "stage " << stage;
  EXPECT_NE(actual.parameters, train(stage, 2, 3).parameters)
      << "the dropped micro-steps changed nothing, so the test cannot tell";
}

// A backward dropped with zero_grad() before step(), as after an exception in a micro-step: the
// reductions it left in flight finish on every rank and none of their sums reaches a gradient.
// zero_grad() drops the whole window, so with two micro-steps per window the one before the
// abandoned backward goes too, as zero_grad() after it does (drop_first).
void expect_abandoned_backwards_dropped(int stage) {
  for (int accumulation : {1, 2}) {
    const Training expected = train(stage, accumulation, 3, /*drop_first=*/accumulation > 1);
    const Training actual = train(stage, accumulation, 3, /*drop_first=*/false,
                                  /*reduce_scatter=*/true, /*abandon_backward=*/true);
    EXPECT_EQ(actual.grad_norms, expected.grad_norms)
        << "stage " << stage << ", accumulation " << accumulation;
    EXPECT_EQ(actual.parameters, expected.parameters)
        << "stage " << stage << ", accumulation " << accumulation;
  }
}

TEST_P(StageZeroReduction, ZeroGradAfterAnAbandonedBackwardDropsItsReductionsInFlight) {
  expect_abandoned_backwards_dropped(GetParam());
}

TEST(StageZeroReduction, ZeroGradAfterAnAbandonedBackwardDropsItsReductionsInFlightAtStageZero) {
  expect_abandoned_backwards_dropped(0);
}

// Stage 0's all-reduce (reduce_scatter false) sums each element in MPI's order, so it agrees with
// stages 1-3 to rounding; it sends its buckets as one all-reduce each, and no reduce-scatter.
TEST(StageZeroReduction, AllReducedAgreesWithStageOneToRounding) {
  const Training expected = train(1, 1, 5);
  const Training actual = train(0, 1, 5, /*drop_first=*/false, /*reduce_scatter=*/false);
  const auto calls = [&](const Training& run, Collective collective) {
    return run.traffic.calls[static_cast<std::size_t>(collective)];
  };
  if (actual.world > 1) {
    EXPECT_EQ(calls(actual, Collective::kReduceScatter), 0);
    // Seven buckets a step, plus the step's scalars.
    EXPECT_GE(calls(actual, Collective::kAllReduce), 5 * 7);
    EXPECT_GT(calls(train(0, 1, 5), Collective::kReduceScatter), 0);
  }
  ASSERT_EQ(actual.grad_norms.size(), expected.grad_norms.size());
  for (std::size_t s = 0; s < actual.grad_norms.size(); ++s) {
    // Measured at 4 ranks: 4e-8 of the norm.
    EXPECT_NEAR(actual.grad_norms[s], expected.grad_norms[s], 1e-6 * expected.grad_norms[s]);
  }
  ASSERT_EQ(actual.parameters.size(), expected.parameters.size());
  for (std::size_t i = 0; i < actual.parameters.size(); ++i) {
    // Measured at 3-4 ranks: 6e-8 at most.
    EXPECT_NEAR(actual.parameters[i], expected.parameters[i],
                1e-6 * std::max(1.0f, std::fabs(expected.parameters[i])))
        << "master weight " << i << " on " << actual.world << " ranks";
  }
}

}  // namespace
}  // namespace zeroshard::testing
