// Contract checks of the engine's public calls: shapes whose element counts overflow, a config
// built in code, non-finite learning rates, and ranks that were started with different configs or
// models.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <utility>

#include "mpi/toy_model.h"

namespace zeroshard::testing {
namespace {

using ::testing::HasSubstr;

Engine toy_engine() {
  AdamWOptions options;
  options.lr = 1e-3;
  return make_engine(toy_config(2), make_adamw(options));
}

TEST(EngineShapes, AShapeWhoseProductOverflowsIsRefusedNamingTheParameter) {
  Engine engine = toy_engine();
  const std::string message = message_of<UsageError>([&] {
    engine.register_parameter("w", {3, std::int64_t{1} << 62});
  });
  EXPECT_THAT(message, HasSubstr("'w'"));
  EXPECT_THAT(message, HasSubstr("[3, 4611686018427387904]"));
  // Before the check, 2^40 x 2^40 wrapped to 0 elements and was silently accepted.
  EXPECT_THROW(engine.register_parameter("v", {std::int64_t{1} << 40, std::int64_t{1} << 40}),
               UsageError);
  EXPECT_THROW(engine.register_parameter("u", {4, -1}), UsageError);
  EXPECT_TRUE(engine.parameters().empty());
}

TEST(EngineShapes, AZeroDimensionMakesAnEmptyTensorWhateverTheOthers) {
  Engine engine = toy_engine();
  const Parameter empty = engine.register_parameter("e", {std::int64_t{1} << 62, 0, 1 << 30});
  EXPECT_EQ(empty.numel(), 0);
}

TEST(EngineShapes, ParametersTotallingMoreThanTheEngineAddressesAreRefusedAtFinalize) {
  Engine engine = toy_engine();
  engine.register_parameter("a.weight", {std::int64_t{1} << 55});
  engine.register_parameter("b.weight", {std::int64_t{1} << 55});
  engine.register_parameter("c.weight", {std::int64_t{1} << 55});
  const std::string message = message_of<UsageError>([&] { engine.finalize(); });
  EXPECT_THAT(message, HasSubstr("'b.weight'"));
  EXPECT_THAT(message, HasSubstr("2^56"));
}

TEST(EngineUserRule, AConfigOptimizerSectionBesideItIsAConfigErrorNamingEveryKey) {
  const Config config = Config::from_json_string(
      R"({"train_micro_batch_size_per_gpu": 1,
          "optimizer": {"type": "AdamW", "params": {"weight_decay": 0.1, "betas": [0.9, 0.95]}}})",
      Communicator::from_environment()->size());
  const Device device = test_device();
  try {
    Engine engine(config, device, Communicator::from_environment(device), make_sgd({.lr = 0.1}));
    FAIL() << "the config's optimizer section was ignored without a word";
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.key_path(), "optimizer.params.betas");
    const std::string what = error.what();
    EXPECT_THAT(what, HasSubstr("'sgd'"));
    EXPECT_THAT(what, HasSubstr("optimizer.type ('adamw')"));
    EXPECT_THAT(what, HasSubstr("optimizer.params.weight_decay"));
  }
}

TEST(EngineUserRule, AConfigWithoutAnOptimizerSectionTakesIt) {
  Config config;
  const Device device = test_device();
  Engine engine(config, device, Communicator::from_environment(device), make_sgd({.lr = 0.1}));
  EXPECT_EQ(engine.update_rule().name(), "sgd");
}

TEST(EngineConfig, ACodeBuiltConfigIsCheckedAsAParsedOneIs) {
  // One validation path: what the parser refuses, the engine refuses in a Config built in code,
  // even where nothing would read the key (no NVMe offload here).
  const auto key_of_error = [](void (*change)(Config&)) -> std::string {
    Config config = toy_config(2);
    change(config);
    try {
      Engine engine = make_engine(config, make_adamw({}));
    } catch (const ConfigError& error) {
      return error.key_path();
    }
    return "";
  };
  EXPECT_EQ(key_of_error([](Config& c) { c.aio.use_gds = true; }), "aio.use_gds");
  EXPECT_EQ(key_of_error([](Config& c) { c.aio.block_size = 1000; }), "aio.block_size");
  EXPECT_EQ(key_of_error([](Config& c) { c.zero_optimization.contiguous_gradients = false; }),
            "zero_optimization.contiguous_gradients");
  EXPECT_EQ(key_of_error([](Config&) {}), "");
}

TEST(EngineConfig, ACodeBuiltConfigMeetsTheCrossKeyRules) {
  // Each of these trained before, silently doing something other than asked.
  const auto error_of = [](void (*change)(Config&)) -> std::pair<std::string, std::string> {
    Config config = toy_config(2);
    change(config);
    try {
      Engine engine = make_engine(config, make_adamw({}));
    } catch (const ConfigError& error) {
      return {error.key_path(), error.what()};
    }
    return {"", "no ConfigError"};
  };
  const auto param_offload_at_stage_2 =
      error_of([](Config& c) { c.zero_optimization.offload_param.device = OffloadDevice::kCpu; });
  EXPECT_EQ(param_offload_at_stage_2.first, "zero_optimization.offload_param.device");
  EXPECT_THAT(param_offload_at_stage_2.second, HasSubstr("parameter offload needs stage 3"));
  const auto optimizer_offload_at_stage_0 = error_of([](Config& c) {
    c.zero_optimization.stage = 0;
    c.zero_optimization.offload_optimizer.device = OffloadDevice::kCpu;
  });
  EXPECT_EQ(optimizer_offload_at_stage_0.first, "zero_optimization.offload_optimizer.device");
  EXPECT_THAT(optimizer_offload_at_stage_0.second, HasSubstr("needs stage 1, 2 or 3"));
  const auto both_precisions = error_of([](Config& c) {
    c.fp16.enabled = true;
    c.bf16.enabled = true;
  });
  EXPECT_EQ(both_precisions.first, "bf16.enabled");
  EXPECT_THAT(both_precisions.second, HasSubstr("enable at most one"));
  const auto nvme_without_path = error_of(
      [](Config& c) { c.zero_optimization.offload_optimizer.device = OffloadDevice::kNvme; });
  EXPECT_EQ(nvme_without_path.first, "zero_optimization.offload_optimizer.nvme_path");
  EXPECT_THAT(nvme_without_path.second, HasSubstr("required when device is \"nvme\""));
  const auto no_offloaded_share = error_of([](Config& c) {
    c.zero_optimization.offload_optimizer.device = OffloadDevice::kCpu;
    c.zero_optimization.offload_optimizer.ratio = 0.0;
  });
  EXPECT_EQ(no_offloaded_share.first, "zero_optimization.offload_optimizer.ratio");
  EXPECT_THAT(no_offloaded_share.second,
              HasSubstr("expected the share of the optimizer offloaded"));
  const auto partial_offload_on_nvme = error_of([](Config& c) {
    c.zero_optimization.offload_optimizer.device = OffloadDevice::kNvme;
    c.zero_optimization.offload_optimizer.nvme_path = "/tmp";
    c.zero_optimization.offload_optimizer.ratio = 0.5;
  });
  EXPECT_EQ(partial_offload_on_nvme.first, "zero_optimization.offload_optimizer.ratio");
  EXPECT_THAT(partial_offload_on_nvme.second, HasSubstr("offloaded to CPU memory only"));
}

TEST(EngineLearningRate, NonFiniteValuesAreRefused) {
  Engine engine = toy_engine();
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_THROW(engine.set_lr(inf), UsageError);
  EXPECT_THROW(engine.set_lr(std::nan("")), UsageError);
  EXPECT_THROW(engine.set_lr(-1.0), UsageError);
  EXPECT_THROW(engine.add_param_group({.name = "g", .lr = inf, .weight_decay = {}}), UsageError);
  EXPECT_THROW(engine.add_param_group({.name = "g", .lr = 0.1, .weight_decay = inf}), UsageError);
  engine.set_lr(0.5);
  EXPECT_EQ(engine.lr(), 0.5);
}

// The learning rate, stage or shape below differs on the last rank only.
class RankAgreement : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto probe = Communicator::from_environment();
    if (probe->size() == 1) GTEST_SKIP() << "needs two ranks or more to disagree";
    odd_one_ = probe->rank() == probe->size() - 1;
    world_size_ = probe->size();
  }

  Engine engine_from_json(const std::string& lr, int stage) const {
    const std::string text = R"({"train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": )" +
                             lr + R"(}}, "zero_optimization": {"stage": )" + std::to_string(stage) +
                             "}}";
    const Device device = test_device();
    Config config = Config::from_json_string(text, world_size_);
    return Engine(std::move(config), device, Communicator::from_environment(device));
  }

  bool odd_one_ = false;
  int world_size_ = 1;
};

TEST_F(RankAgreement, ADifferentLearningRateIsAConfigErrorNamingTheKeyOnEveryRank) {
  Engine engine = engine_from_json(odd_one_ ? "2e-3" : "1e-3", 2);
  engine.register_parameter("a.weight", {8, 4});
  try {
    engine.finalize();
    FAIL() << "ranks with different learning rates were not detected";
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.key_path(), "optimizer.params.lr");
    EXPECT_THAT(std::string(error.what()), HasSubstr("0.001"));
    EXPECT_THAT(std::string(error.what()), HasSubstr("0.002"));
  }
}

TEST_F(RankAgreement, ADifferentStageIsAConfigErrorNamingTheKey) {
  Engine engine = engine_from_json("1e-3", odd_one_ ? 3 : 2);
  engine.register_parameter("a.weight", {8, 4});
  try {
    engine.finalize();
    FAIL() << "ranks with different stages were not detected";
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.key_path(), "zero_optimization.stage");
  }
}

TEST_F(RankAgreement, ADifferentShapeIsAUsageErrorNamingTheParameterAndBothShapes) {
  Engine engine = toy_engine();
  engine.register_parameter("a.weight", {8, 4});
  engine.register_parameter("b.weight", {odd_one_ ? 5 : 4, 4});
  const std::string message = message_of<UsageError>([&] { engine.finalize(); });
  EXPECT_THAT(message, HasSubstr("'b.weight' [4, 4]"));
  EXPECT_THAT(message, HasSubstr("'b.weight' [5, 4]"));
}

// The shape that differs sits past the first 64 characters of each rank's description: the
// message still tells the two apart.
TEST_F(RankAgreement, AShapeAfterALongParameterNameIsStillNamed) {
  const std::string name = "model.encoder.layers.11.self_attention.query_key_value.lora_b.weight";
  Engine engine = toy_engine();
  engine.register_parameter(name, {odd_one_ ? 5 : 4, 4});
  const std::string message = message_of<UsageError>([&] { engine.finalize(); });
  EXPECT_THAT(message, HasSubstr("[4, 4]"));
  EXPECT_THAT(message, HasSubstr("[5, 4]"));
  EXPECT_THAT(message, HasSubstr("rank " + std::to_string(world_size_ - 1) + " has"));
}

TEST_F(RankAgreement, AMissingParameterIsNamed) {
  Engine engine = toy_engine();
  engine.register_parameter("a.weight", {8, 4});
  if (!odd_one_) engine.register_parameter("b.weight", {4});
  const std::string message = message_of<UsageError>([&] { engine.finalize(); });
  EXPECT_THAT(message, HasSubstr("the number of registered parameters"));
}

// Ranks that start alike but then diverge: one rank's initial values, or a learning rate set on
// one rank only. Each is found at the next step, before any update, on every rank.
class StepAgreement : public RankAgreement {
 protected:
  // One micro-step of the toy model at `stage`, then the step; `prepare` runs before it. Returns
  // what the step did and how far the trainable values moved (the largest change of one).
  struct Stepped {
    StepResult result;
    float largest_change = 0.0f;
  };
  Stepped run_step(int stage,
                   const std::function<void(Engine&, std::vector<Parameter>&)>& prepare) {
    Engine engine = toy_engine_at(stage);
    const std::vector<ToyTensor> tensors = uneven_toy_tensors();
    std::vector<Parameter> handles = register_toy(engine, tensors);
    prepare(engine, handles);
    const std::vector<float> before = engine.consolidated_parameters();
    toy_micro_step(engine, tensors, handles, 0);
    Stepped stepped{engine.step()};
    const std::vector<float> after = engine.consolidated_parameters();
    for (std::size_t i = 0; i < std::min(before.size(), after.size()); ++i) {
      stepped.largest_change = std::max(stepped.largest_change, std::fabs(after[i] - before[i]));
    }
    return stepped;
  }
  static Engine toy_engine_at(int stage) {
    AdamWOptions options;
    options.lr = 1e-3;
    return make_engine(toy_config(stage), make_adamw(options));
  }
};

TEST_F(StepAgreement, DifferentInitialValuesOnOneRankAreNamedAtTheFirstStepAtEveryStage) {
  for (int stage = 0; stage <= 3; ++stage) {
    const std::string message = message_of<UsageError>([&] {
      run_step(stage, [&](Engine&, std::vector<Parameter>& handles) {
        if (!odd_one_) return;
        std::vector<float> values(static_cast<std::size_t>(handles[3].numel()), 0.25f);
        handles[3].copy_from(values);  // "b.weight", a seed of its own
      });
    });
    EXPECT_THAT(message, HasSubstr("initial values of 'b.weight'")) << "stage " << stage;
    EXPECT_THAT(message, HasSubstr("rank " + std::to_string(world_size_ - 1))) << "stage " << stage;
  }
}

TEST_F(StepAgreement, ALearningRateSetOnOneRankOnlyIsNamedBeforeTheUpdate) {
  for (int stage = 0; stage <= 3; ++stage) {
    Engine engine = toy_engine_at(stage);
    const std::vector<ToyTensor> tensors = uneven_toy_tensors();
    std::vector<Parameter> handles = register_toy(engine, tensors);
    toy_micro_step(engine, tensors, handles, 0);
    engine.step();
    if (odd_one_) engine.set_lr(5e-4);
    toy_micro_step(engine, tensors, handles, 1);
    const std::string message = message_of<UsageError>([&] { engine.step(); });
    EXPECT_THAT(message, HasSubstr("learning rate")) << "stage " << stage;
    EXPECT_THAT(message, HasSubstr("0.0005")) << "stage " << stage;
    EXPECT_THAT(message, HasSubstr("0.001")) << "stage " << stage;
    EXPECT_EQ(engine.global_step(), 1) << "the update ran; stage " << stage;
  }
}

TEST_F(StepAgreement, RanksThatSetTheSameValuesTrainOn) {
  for (int stage = 0; stage <= 3; ++stage) {
    const Stepped stepped =
        run_step(stage, [](Engine& engine, std::vector<Parameter>&) { engine.set_lr(5e-4); });
    EXPECT_TRUE(stepped.result.updated) << "stage " << stage;
    EXPECT_EQ(stepped.result.lr, 5e-4) << "stage " << stage;
    // AdamW's first step moves every element with a gradient by about lr.
    EXPECT_GT(stepped.largest_change, 4e-4f) << "stage " << stage;
    EXPECT_LT(stepped.largest_change, 6e-4f) << "stage " << stage;
  }
}

}  // namespace
}  // namespace zeroshard::testing
