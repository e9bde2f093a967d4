// Contract checks of the engine's public calls: shapes whose element counts overflow, non-finite
// learning rates, and ranks that were started with different configs or models.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "mpi/toy_model.h"

namespace zeroshard::testing {
namespace {

using ::testing::HasSubstr;

Engine toy_engine() {
  AdamWOptions options;
  options.lr = 1e-3;
  return make_engine(toy_config(2), make_adamw(options));
}

// Runs `call`, which must throw E, and returns the message.
template <typename E, typename Call>
std::string message_of(Call&& call) {
  try {
    call();
  } catch (const E& error) {
    return error.what();
  }
  ADD_FAILURE() << "no exception of the expected type";
  return {};
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

TEST_F(RankAgreement, AMissingParameterIsNamed) {
  Engine engine = toy_engine();
  engine.register_parameter("a.weight", {8, 4});
  if (!odd_one_) engine.register_parameter("b.weight", {4});
  const std::string message = message_of<UsageError>([&] { engine.finalize(); });
  EXPECT_THAT(message, HasSubstr("the number of registered parameters"));
}

}  // namespace
}  // namespace zeroshard::testing
