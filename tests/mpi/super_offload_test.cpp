// super_offload updates the offloaded optimizer during backward and keeps that update only when
// the step would have made the same one: training gives the same parameters, bit for bit, as the
// update after backward, for every rule, stage, precision and world size, whether the steps keep
// the overlapped update, clip and redo it, or overflow and skip it. Its second master and states
// are in the memory report and the estimate; the key is refused where it cannot act.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "mpi/toy_model.h"

namespace zeroshard::testing {
namespace {

enum class Clip { kNever, kAlways, kSometimes };

using SuperOffloadCase = std::tuple<int, DType, int, Clip>;  // stage, precision, rule, clipping

Config case_config(int stage, DType dtype, Clip clip) {
  Config config = toy_config(stage, dtype);
  // The toy's gradient norms range from about 1.6 to 18 over its steps at every world size: 8
  // clips some steps and not others.
  config.gradient_clipping = clip == Clip::kNever ? 0.0 : clip == Clip::kAlways ? 1.0 : 8.0;
  config.zero_optimization.offload_optimizer.device = OffloadDevice::kCpu;
  return config;
}

struct Trained {
  std::vector<float> master;
  std::vector<char> model;
  std::vector<double> norms;
  double loss_scale = 0.0;
  int updates = 0;
  int skipped = 0;
  int overlapped = 0;
};

Trained train(Config config, int rule, int steps = 12,
              const std::vector<ToyTensor>& tensors = uneven_toy_tensors()) {
  Engine engine = make_engine(std::move(config), rule_cases()[rule].make());
  const int slow_group = add_slow_group(engine);
  const auto handles = register_toy(engine, tensors, slow_group);
  Trained result;
  for (int step = 0; step < steps; ++step) {
    toy_micro_step_any_precision(engine, tensors, handles, step);
    const StepResult r = engine.step();
    result.updates += r.updated ? 1 : 0;
    result.skipped += r.skipped ? 1 : 0;
    result.overlapped += r.overlapped ? 1 : 0;
    if (r.updated) result.norms.push_back(r.grad_norm);
  }
  result.master = engine.consolidated_parameters();
  result.model = model_bytes(engine, tensors, handles);
  result.loss_scale = engine.loss_scale();
  return result;
}

void expect_same_training(const Trained& actual, const Trained& expected) {
  EXPECT_EQ(actual.updates, expected.updates);
  EXPECT_EQ(actual.skipped, expected.skipped);
  EXPECT_TRUE(same_bits(actual.master, expected.master)) << "fp32 master weights differ";
  EXPECT_EQ(actual.model, expected.model) << "the parameters the model sees differ";
  EXPECT_EQ(actual.norms, expected.norms);
  EXPECT_EQ(actual.loss_scale, expected.loss_scale);
}

// Trains `sequential` and the same config with super_offload; expects the same training and
// returns the overlapped run.
Trained expect_overlap_trains_alike(const Config& sequential, int steps = 12,
                                    const std::vector<ToyTensor>& tensors = uneven_toy_tensors()) {
  Config overlapped = sequential;
  overlapped.zero_optimization.offload_optimizer.super_offload = true;
  const Trained expected = train(sequential, 0, steps, tensors);
  const Trained actual = train(overlapped, 0, steps, tensors);
  expect_same_training(actual, expected);
  return actual;
}

// Sizes the host team of the engines built in its scope, as OMP_NUM_THREADS does for a user.
class ScopedTeam {
 public:
  explicit ScopedTeam(int threads) : threads_(omp_get_max_threads()) {
    if (const char* value = std::getenv("OMP_NUM_THREADS")) variable_ = value;
    setenv("OMP_NUM_THREADS", std::to_string(threads).c_str(), 1);
    omp_set_num_threads(threads);
  }
  ~ScopedTeam() {
    omp_set_num_threads(threads_);
    if (variable_) {
      setenv("OMP_NUM_THREADS", variable_->c_str(), 1);
    } else {
      unsetenv("OMP_NUM_THREADS");
    }
  }
  ScopedTeam(const ScopedTeam&) = delete;
  ScopedTeam& operator=(const ScopedTeam&) = delete;

 private:
  int threads_;
  std::optional<std::string> variable_;
};

class SuperOffloadEquivalence : public ::testing::TestWithParam<SuperOffloadCase> {};

TEST_P(SuperOffloadEquivalence, TrainsBitForBitAsTheUpdateAfterBackward) {
  const auto [stage, dtype, rule, clip] = GetParam();
  const Config sequential = case_config(stage, dtype, clip);
  Config overlapped = sequential;
  overlapped.zero_optimization.offload_optimizer.super_offload = true;
  const Trained expected = train(sequential, rule);
  const Trained actual = train(overlapped, rule);
  expect_same_training(actual, expected);
  EXPECT_EQ(expected.updates, 6);
  EXPECT_EQ(expected.overlapped, 0);
  switch (clip) {
    case Clip::kNever:
      EXPECT_EQ(actual.overlapped, actual.updates);
      break;
    case Clip::kAlways:
      // The first step overlaps, clips and is redone; after a clipped step none overlaps.
      EXPECT_EQ(actual.overlapped, 0);
      break;
    case Clip::kSometimes: {
      // A step after one that did not clip overlaps, and keeps it unless it clips itself.
      int expected_kept = 0;
      bool overlaps = true;
      for (double norm : expected.norms) {
        const bool clips = 8.0 / (norm + 1e-6) < 1.0;
        if (overlaps && !clips) ++expected_kept;
        overlaps = !clips;
      }
      EXPECT_EQ(actual.overlapped, expected_kept);
      // Both happen: kept overlapped updates and clipped steps redone.
      EXPECT_GT(expected_kept, 0);
      EXPECT_LT(expected_kept, expected.updates - 1);
      break;
    }
  }
}

std::vector<SuperOffloadCase> super_offload_cases() {
  std::vector<SuperOffloadCase> cases;
  for (int stage = 1; stage <= 3; ++stage) {
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      for (int rule = 0; rule < static_cast<int>(rule_cases().size()); ++rule) {
        cases.emplace_back(stage, dtype, rule, Clip::kNever);
      }
      cases.emplace_back(stage, dtype, 0, Clip::kAlways);
      cases.emplace_back(stage, dtype, 0, Clip::kSometimes);
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(StagesPrecisionsRules, SuperOffloadEquivalence,
                         ::testing::ValuesIn(super_offload_cases()), [](const auto& info) {
                           const SuperOffloadCase& c = info.param;
                           const Clip clip = std::get<3>(c);
                           return "stage" + std::to_string(std::get<0>(c)) + "_" +
                                  to_string(std::get<1>(c)) + "_" +
                                  rule_cases()[std::get<2>(c)].name +
                                  (clip == Clip::kAlways      ? "_clipped"
                                   : clip == Clip::kSometimes ? "_sometimes_clipped"
                                                              : "");
                         });

// With part of the shard kept on the device (offload_optimizer.ratio), the host's share overlaps
// backward and the device's is updated when the step keeps it: still bit for bit as both shares
// updated after backward, clipped or not (on CPU ranks also as ratio 1: tests/mpi/offload_test).
TEST(SuperOffload, PartialOffloadTrainsBitForBit) {
  for (int stage = 1; stage <= 3; ++stage) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      for (Clip clip : {Clip::kNever, Clip::kSometimes}) {
        SCOPED_TRACE("stage " + std::to_string(stage) + ", " + to_string(dtype) +
                     (clip == Clip::kNever ? "" : ", sometimes clipped"));
        Config sequential = case_config(stage, dtype, clip);
        sequential.zero_optimization.offload_optimizer.ratio = 0.4;
        EXPECT_GT(expect_overlap_trains_alike(sequential).overlapped, 0);
      }
    }
  }
}

// Parts of a million elements or more are updated by the host's team, two threads here (set
// through OMP_NUM_THREADS, which sizes the team): still bit for bit as the update after backward.
TEST(SuperOffload, LargePartsRunOnTheHostTeamBitForBit) {
  // The team's threads on top of 3 or 4 ranks would oversubscribe a 2-core machine for a minute;
  // the split of the work is the same at every world size.
  if (make_engine(toy_config(1), make_adamw()).world_size() > 2) {
    GTEST_SKIP() << "runs on 1 and 2 ranks";
  }
  const ScopedTeam team(2);
  // At 4 ranks each still owns 1.25M elements of the large tensor.
  const std::vector<ToyTensor> tensors = {{"a.weight", std::int64_t{5} << 20}, {"b.bias", 5}};
  for (const auto& [stage, dtype] : {std::pair{1, DType::kFloat32}, {3, DType::kBFloat16}}) {
    SCOPED_TRACE("stage " + std::to_string(stage) + ", " + to_string(dtype));
    Config sequential = case_config(stage, dtype, Clip::kNever);
    sequential.zero_optimization.reduce_bucket_size = std::int64_t{1} << 23;
    const Trained actual = expect_overlap_trains_alike(sequential, 4, tensors);
    EXPECT_EQ(actual.overlapped, actual.updates);
  }
}

// With the parameter shard in host memory too (stage 3), the kept update rounds it there.
TEST(SuperOffload, ParametersOffloadedTooTrainBitForBit) {
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(to_string(dtype));
    Config sequential = case_config(3, dtype, Clip::kSometimes);
    sequential.zero_optimization.offload_param.device = OffloadDevice::kCpu;
    EXPECT_GT(expect_overlap_trains_alike(sequential).overlapped, 0);
  }
}

// fp16 steps that overflow drop the overlapped update and skip, as the update after backward
// does; the steps after them overlap again.
TEST(SuperOffload, OverflowedStepsSkipAsWithoutIt) {
  for (int stage = 1; stage <= 3; ++stage) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    Config sequential = case_config(stage, DType::kFloat16, Clip::kNever);
    // 2^16 times gradients of up to 4 summed over 2 micro-steps and 4 ranks overflows fp16's
    // 65504 until the scale has come down.
    sequential.fp16.initial_scale_power = 16;
    sequential.fp16.hysteresis = 1;
    Config overlapped = sequential;
    overlapped.zero_optimization.offload_optimizer.super_offload = true;
    const Trained expected = train(sequential, 0, 16);
    const Trained actual = train(overlapped, 0, 16);
    expect_same_training(actual, expected);
    EXPECT_GT(expected.skipped, 0);
    EXPECT_GT(expected.updates, 0);
    EXPECT_EQ(actual.overlapped, actual.updates);
  }
}

// A learning rate set after backward began is not the one the overlapped update used: the step
// drops it and updates with the new rate, as without super_offload.
TEST(SuperOffload, LearningRateSetDuringBackwardIsHonoured) {
  const auto train_with_late_lr = [](bool overlap) {
    Config config = case_config(2, DType::kFloat32, Clip::kNever);
    config.zero_optimization.offload_optimizer.super_offload = overlap;
    Engine engine = make_engine(config, make_adamw());
    const auto tensors = uneven_toy_tensors();
    const auto handles = register_toy(engine, tensors);
    std::vector<bool> overlapped;
    for (int step = 0; step < 6; ++step) {
      toy_micro_step(engine, tensors, handles, step);
      if (step == 3) engine.set_lr(engine.lr() * 0.25);
      const StepResult result = engine.step();
      if (result.updated) overlapped.push_back(result.overlapped);
    }
    if (overlap) {
      EXPECT_EQ(overlapped, (std::vector<bool>{true, false, true}));
    }
    return engine.consolidated_parameters();
  };
  EXPECT_TRUE(same_bits(train_with_late_lr(true), train_with_late_lr(false)));
}

// Its second master and states are host memory the report shows and the estimator predicts.
TEST(SuperOffload, SecondMasterAndStatesAreCountedAndEstimated) {
  for (int stage = 1; stage <= 3; ++stage) {
    Config config = case_config(stage, DType::kBFloat16, Clip::kNever);
    const auto host_bytes = [](const Config& c, MemoryCategory category) {
      Engine engine = make_engine(c, make_adamw());
      register_toy(engine, uneven_toy_tensors());
      return engine.memory_report().at(category, MemoryLocation::kHost).current;
    };
    const auto estimated = [](const Config& c, MemoryCategory category, int world) {
      EstimateInput in = estimate_input_from_config(c, 0, world);
      for (const ToyTensor& t : uneven_toy_tensors()) {
        if (t.trainable) in.tensors.push_back(t.numel);
      }
      in.frozen_params = 15;
      return estimate(in).at(category, MemoryTier::kHost);
    };
    Engine probe = make_engine(config, make_adamw());
    register_toy(probe, uneven_toy_tensors());
    const int world = probe.world_size();
    const std::int64_t shard = probe.shard_end() - probe.shard_begin();
    Config overlapped = config;
    overlapped.zero_optimization.offload_optimizer.super_offload = true;
    for (MemoryCategory category :
         {MemoryCategory::kMasterWeights, MemoryCategory::kOptimizerStates}) {
      const std::int64_t per_set =
          category == MemoryCategory::kMasterWeights ? 4 * shard : 8 * shard;
      EXPECT_EQ(host_bytes(config, category), per_set);
      EXPECT_EQ(host_bytes(overlapped, category), 2 * per_set);
      EXPECT_EQ(estimated(config, category, world), per_set);
      EXPECT_EQ(estimated(overlapped, category, world), 2 * per_set);
    }
    // The parameters' copy the overlapped update writes, 2 bytes per owned bf16 element.
    const MemoryCategory params = MemoryCategory::kParameters;
    EXPECT_EQ(host_bytes(overlapped, params) - host_bytes(config, params), 2 * shard);
    EXPECT_EQ(estimated(overlapped, params, world) - estimated(config, params, world), 2 * shard);
  }
}

TEST(SuperOffloadKeys, NeedsTheOptimizerInCpuMemory) {
  for (const char* device : {"none", "nvme"}) {
    const std::string json = std::string(R"({"train_batch_size": 8, "zero_optimization": {)") +
                             R"("stage": 2, "offload_optimizer": {"device": ")" + device +
                             R"(", "super_offload": true)" +
                             (std::string(device) == "nvme" ? R"(, "nvme_path": "/tmp")" : "") +
                             "}}}";
    try {
      Config::from_json_string(json);
      FAIL() << "super_offload accepted with device " << device;
    } catch (const ConfigError& error) {
      EXPECT_EQ(error.key_path(), "zero_optimization.offload_optimizer.super_offload");
      EXPECT_NE(std::string(error.what()).find("to \"cpu\""), std::string::npos) << error.what();
    }
  }
}

}  // namespace
}  // namespace zeroshard::testing
