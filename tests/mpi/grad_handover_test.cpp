// Gradients handed over all at once after backward (GradHandover::kAtEnd): the same parameters
// as per-parameter handover at stage 0, bit for bit, at every stage and with accumulation; stage 2
// never holds more bytes than stage 0, smaller buckets never more than larger ones; and the slot
// pool of a per-parameter engine that receives its gradients late shrinks back after step().
#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "mpi/toy_model.h"

namespace zeroshard::testing {
namespace {

/// One micro-step of a model whose backward completes every gradient only at its end: the same
/// module walk and gradients as toy_micro_step, handed over with one all_grads_ready().
void toy_micro_step_at_end(Engine& engine, const std::vector<ToyTensor>& tensors,
                           const std::vector<Parameter>& handles, std::int64_t step) {
  toy_backward(
      engine, tensors, handles,
      [&](std::size_t k) { add_toy_gradient(engine, handles[k], k, step); },
      /*hand_over_each=*/false);
  engine.all_grads_ready();
}

std::unique_ptr<UpdateRule> adamw() { return rule_cases()[0].make(); }

/// Trains the uneven toy model for six optimizer steps and returns its consolidated parameters.
std::vector<float> train(int stage, GradHandover handover, int accumulation) {
  Config config = toy_config(stage);
  config.gradient_accumulation_steps = accumulation;
  Engine engine = make_engine(config, adamw());
  engine.set_grad_handover(handover);
  const auto tensors = uneven_toy_tensors();
  const auto handles = register_toy(engine, tensors);
  for (std::int64_t step = 0; step < 6 * accumulation; ++step) {
    if (handover == GradHandover::kAtEnd) {
      toy_micro_step_at_end(engine, tensors, handles, step);
    } else {
      toy_micro_step(engine, tensors, handles, step);
    }
    EXPECT_EQ(engine.step().updated, (step + 1) % accumulation == 0);
  }
  return engine.consolidated_parameters();
}

class GradHandoverAtEnd : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(GradHandoverAtEnd, TrainsToTheParametersOfPerParameterHandoverAtStageZero) {
  const int stage = std::get<0>(GetParam());
  const int accumulation = std::get<1>(GetParam());
  const std::vector<float> expected = train(0, GradHandover::kPerParameter, accumulation);
  const std::vector<float> actual = train(stage, GradHandover::kAtEnd, accumulation);
  // The toy gradients sum exactly, so the order of the reduction cannot change a bit.
  EXPECT_EQ(actual, expected) << "stage " << stage << ", accumulation " << accumulation;
}

INSTANTIATE_TEST_SUITE_P(StagesAndAccumulation, GradHandoverAtEnd,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3), ::testing::Values(1, 2)),
                         [](const auto& info) {
                           return "stage" + std::to_string(std::get<0>(info.param)) +
                                  "_accumulation" + std::to_string(std::get<1>(info.param));
                         });

// Multiples of 16 elements whose total divides by 16 x {1,2,3,4}: no padding.
std::vector<ToyTensor> aligned_tensors() {
  return {{"a.weight", 160}, {"a.bias", 32}, {"b.weight", 160}, {"b.bias", 32}};
}
constexpr std::int64_t kP = 384;

struct Footprint {
  std::int64_t total_peak = 0;
  std::int64_t gradients = 0;
  std::int64_t communication_peak = 0;
  std::int64_t communication_after_step = 0;
};

Footprint footprint(int stage, GradHandover handover, std::int64_t bucket, bool late = false) {
  Config config = toy_config(stage);
  config.zero_optimization.param_persistence_threshold = 0;
  config.zero_optimization.reduce_bucket_size = bucket;
  Engine engine = make_engine(config, adamw());
  engine.set_grad_handover(handover);
  const auto tensors = aligned_tensors();
  const auto handles = register_toy(engine, tensors);
  for (std::int64_t step = 0; step < 2; ++step) {
    if (handover == GradHandover::kAtEnd || late) {
      toy_micro_step_at_end(engine, tensors, handles, step);
    } else {
      toy_micro_step(engine, tensors, handles, step);
    }
    engine.step();
  }
  const MemoryReport report = engine.memory_report();
  const MemoryLocation where = engine_memory(engine);
  return {report.total_peak[static_cast<int>(where)],
          report.at(MemoryCategory::kGradients, where).current,
          report.at(MemoryCategory::kCommunication, where).peak,
          report.at(MemoryCategory::kCommunication, where).current};
}

constexpr std::int64_t kDefaultBucket = 500000000;

TEST(GradHandover, AtEndStageTwoHoldsNoMoreBytesThanStageZero) {
  const Footprint zero = footprint(0, GradHandover::kAtEnd, kDefaultBucket);
  const Footprint zero_per_parameter = footprint(0, GradHandover::kPerParameter, kDefaultBucket);
  const Footprint two = footprint(2, GradHandover::kAtEnd, kDefaultBucket);
  const Footprint two_small = footprint(2, GradHandover::kAtEnd, 32);
  EXPECT_EQ(zero.total_peak, zero_per_parameter.total_peak);
  EXPECT_LE(two.total_peak, zero.total_peak);
  EXPECT_LE(two_small.total_peak, two.total_peak);
  // The whole gradients and nothing else: each bucket is reduced in place there, with no slot.
  EXPECT_EQ(two.gradients, 4 * kP);
  Engine probe = make_engine(toy_config(2), adamw());
  const std::int64_t allowance = backend_workspace_allowance(probe);
  EXPECT_LE(two.communication_peak, allowance);
  EXPECT_LE(two_small.communication_peak, allowance);
}

TEST(GradHandover, AtEndStageThreeKeepsWholeGradientsAndNoShard) {
  const Footprint three = footprint(3, GradHandover::kAtEnd, 32);
  EXPECT_EQ(three.gradients, 4 * kP);
}

TEST(GradHandover, SlotPoolShrinksBackAfterStepWhenGradientsArriveLate) {
  // Per-parameter handover whose gradients all arrive at the end: every one of the four buckets
  // (160, 32, 160, 32 elements) holds a slot at once, and step() gives the surplus back.
  const Footprint late = footprint(2, GradHandover::kPerParameter, 32, /*late=*/true);
  Engine probe = make_engine(toy_config(2), adamw());
  // A slot is an input area of the widest bucket, in which this rank's part is reduced when it
  // does not go straight into the gradient shard.
  EXPECT_GE(late.communication_peak, 4 * 4 * 160);
  EXPECT_LE(late.communication_after_step, 2 * 4 * 160 + backend_workspace_allowance(probe));
  EXPECT_GT(late.communication_peak, late.communication_after_step);
}

TEST(GradHandover, SetAfterFinalizeIsAUsageError) {
  Engine engine = make_engine(toy_config(2), adamw());
  register_toy(engine, uneven_toy_tensors());
  engine.finalize();
  try {
    engine.set_grad_handover(GradHandover::kAtEnd);
    FAIL() << "expected UsageError";
  } catch (const UsageError& error) {
    EXPECT_NE(std::string(error.what()).find("set_grad_handover() after the engine was finalized"),
              std::string::npos)
        << error.what();
  }
}

TEST(GradHandover, AtEndWithAnFp32GradientShardIsAConfigError) {
  Config config = toy_config(2);
  config.bf16.enabled = true;
  config.grad_accum_dtype = "fp32";
  Engine engine = make_engine(config, adamw());
  engine.set_grad_handover(GradHandover::kAtEnd);
  engine.register_parameter("a.weight", {64});
  try {
    engine.finalize();
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find("data_types.grad_accum_dtype"), std::string::npos)
        << error.what();
    EXPECT_NE(std::string(error.what()).find("GradHandover::kAtEnd"), std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace zeroshard::testing
