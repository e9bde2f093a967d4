// Per-rank bytes match the ZeRO formulas for fp32 Adam (parameters 4P, gradients 4P, states 8P
// at stage 0; 4P + 4P + 8P/N at stage 1; 4P + 12P/N at stage 2; 16P/N at stage 3), buffers stay
// within the bucket sizes, and the elements sent per step match 2P (stages 0-2) and 3P (stage 3).
#include <gtest/gtest.h>

#include <string>

#include "mpi/toy_model.h"

namespace zeroshard::testing {
namespace {

// Sizes that are multiples of 16 elements and a total divisible by 16 x {1,2,3,4}: the layout
// then has no padding and the formulas hold exactly.
std::vector<ToyTensor> aligned_tensors() {
  return {{"a.weight", 160}, {"a.bias", 32}, {"b.weight", 160}, {"b.bias", 32}};
}
constexpr std::int64_t kP = 384;

Config memory_config(int stage) {
  Config config = toy_config(stage);
  config.zero_optimization.param_persistence_threshold = 0;
  config.zero_optimization.max_reuse_distance = 0;
  config.zero_optimization.reduce_bucket_size = 200;
  return config;
}

std::unique_ptr<UpdateRule> adam() {
  AdamWOptions options;
  options.lr = 1e-3;
  return make_adamw(options);
}

class EngineMemory : public ::testing::TestWithParam<int> {};

TEST_P(EngineMemory, ModelStateBytesMatchTheZeroFormulas) {
  const int stage = GetParam();
  Engine engine = make_engine(memory_config(stage), adam());
  const auto tensors = aligned_tensors();
  const auto handles = register_toy(engine, tensors);
  ASSERT_EQ(engine.padded_numel(), kP);
  const std::int64_t n = engine.world_size();
  const std::int64_t params = stage <= 2 ? 4 * kP : 4 * kP / n;
  const std::int64_t grads = stage <= 1 ? 4 * kP : 4 * kP / n;
  const std::int64_t states = stage == 0 ? 8 * kP : 8 * kP / n;
  const MemoryLocation where = engine_memory(engine);
  ASSERT_EQ(engine.memory_location(), where);
  for (int step = 0; step < 2; ++step) {
    toy_micro_step(engine, tensors, handles, step);
    engine.step();
    const MemoryReport report = engine.memory_report();
    EXPECT_EQ(report.at(MemoryCategory::kParameters, where).current, params);
    EXPECT_EQ(report.at(MemoryCategory::kGradients, where).current, grads);
    EXPECT_EQ(report.at(MemoryCategory::kOptimizerStates, where).current, states);
    EXPECT_EQ(report.at(MemoryCategory::kMasterWeights, where).current, 0)
        << "fp32 has no extra copy";
    EXPECT_EQ(report.model_state_bytes(where), params + grads + states);
    // Stage 3 on host memory keeps its gathered buffers through the step, apart from the
    // parameters: at most the gathered bytes it held at once (stage3_max_live_parameters).
    const std::int64_t kept = report.kept_for_reuse[static_cast<int>(where)].current;
    if (stage == 3 && where == MemoryLocation::kHost) {
      EXPECT_GT(kept, 0);
      EXPECT_LE(kept, 4 * kP);
      EXPECT_EQ(report.total_current(where),
                params + grads + states + kept +
                    report.at(MemoryCategory::kCommunication, where).current);
    } else {
      EXPECT_EQ(kept, 0);
    }
  }
  const MemoryReport report = engine.memory_report();
  // Communication buffers: at most two buckets in flight, each an input area (stages 2-3) and a
  // receive area of at most one shard's share of a bucket (stage 0 too on several ranks).
  const std::int64_t bucket = 200;
  const bool receives = stage >= 1 || engine.world_size() > 1;
  const std::int64_t per_slot = (stage >= 2 ? bucket : 0) + (receives ? bucket : 0);
  EXPECT_LE(report.at(MemoryCategory::kCommunication, where).peak,
            2 * per_slot * 4 + backend_workspace_allowance(engine));
  if (stage == 3) {
    // Gathered modules come and go: the peak stays under stage3_max_live_parameters and the
    // shard, and nothing gathered stays after step().
    EXPECT_LE(report.at(MemoryCategory::kParameters, where).peak, params + 4 * kP);
  }
}

TEST_P(EngineMemory, ElementsSentPerStepMatchTheory) {
  const int stage = GetParam();
  Engine engine = make_engine(memory_config(stage), adam());
  const auto tensors = aligned_tensors();
  const auto handles = register_toy(engine, tensors);
  // The first step records stage 3's module order; the second prefetches along it.
  for (int step = 0; step < 2; ++step) {
    engine.communicator().reset_traffic();
    toy_micro_step(engine, tensors, handles, step);
    engine.step();
    const TrafficCounters& t = engine.communicator().traffic();
    // Every stage also all-reduces two scalars (sum of squares, non-finite count) and, on two
    // ranks or more, the eight small integers that carry the step's agreement digest.
    const std::int64_t scalars = 2 * (engine.world_size() > 1 ? 2 + 8 : 2);
    const std::int64_t expected = (stage == 3 ? 3 * kP : 2 * kP) + scalars;
    EXPECT_EQ(t.total_elements(), expected) << "stage " << stage << " step " << step;
    const int all_reduce = static_cast<int>(Collective::kAllReduce);
    const int reduce_scatter = static_cast<int>(Collective::kReduceScatter);
    const int all_gather = static_cast<int>(Collective::kAllGather);
    if (stage == 0 && engine.world_size() == 1) {
      // One rank has nothing to scatter: stage 0 all-reduces in place.
      EXPECT_EQ(t.elements[all_reduce], 2 * kP + scalars);
    } else {
      // Stage 0 reduce-scatters as stages 1-3 do, then gathers the sums back.
      EXPECT_EQ(t.elements[reduce_scatter], kP);
      EXPECT_EQ(t.elements[all_gather], stage == 3 ? 2 * kP : kP);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, EngineMemory, ::testing::Values(0, 1, 2, 3),
                         [](const auto& info) { return "stage" + std::to_string(info.param); });

TEST(EngineMemory, StageThreeRefusesToReadAParameterThatIsNotGathered) {
  Engine engine = make_engine(memory_config(3), adam());
  const auto handles = register_toy(engine, aligned_tensors());
  EXPECT_THROW(handles[0].data(), UsageError);
  {
    auto guard = engine.gathered(handles[0].module());
    EXPECT_NO_THROW(handles[0].data());
  }
  EXPECT_THROW(handles[0].data(), UsageError);
}

TEST(EngineMemory, StepWhileAModuleIsGatheredIsAUsageError) {
  Engine engine = make_engine(memory_config(3), adam());
  const auto handles = register_toy(engine, aligned_tensors());
  engine.gather(handles[0].module());
  EXPECT_THROW(engine.step(), UsageError);
  engine.release(handles[0].module());
}

}  // namespace
}  // namespace zeroshard::testing
