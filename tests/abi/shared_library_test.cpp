// A program as users write them: it links libzeroshard.so alone and includes only
// include/zeroshard/. Errors thrown inside the library are caught by their public types, and a
// rule derived from the public UpdateRule is called back from inside it.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <typeinfo>
#include <vector>

#include "zeroshard/zeroshard.h"

namespace {

using zeroshard::Config;
using zeroshard::ConfigError;

TEST(SharedLibrary, ItsConfigErrorIsCaughtByType) {
  try {
    Config::from_json_string(R"({"train_batch_size": 8, "zero_optimization": {"stage": 4}})");
    FAIL() << "stage 4 was accepted";
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.key_path(), "zero_optimization.stage");
    EXPECT_EQ(error.code(), zeroshard::ErrorCode::kInvalidConfig);
  }
  try {
    Config::from_json_string(R"({"train_batch_size": 8, "zero_optimization": {"stage": 4}})");
  } catch (const zeroshard::Error& error) {
    EXPECT_EQ(typeid(error), typeid(ConfigError));
    EXPECT_NE(dynamic_cast<const ConfigError*>(&error), nullptr);
  }
}

TEST(SharedLibrary, ItsUsageErrorIsCaughtByType) {
  const std::unique_ptr<zeroshard::Communicator> comm = zeroshard::Communicator::from_environment();
  std::vector<double> data(3);
  const std::vector<std::int64_t> counts(static_cast<std::size_t>(comm->size()), 2);
  EXPECT_THROW(comm->all_gather(std::span<double>(data), counts), zeroshard::UsageError);
}

/// param -= lr * grad, counting its calls.
class CountingSgd final : public zeroshard::UpdateRule {
 public:
  std::string name() const override { return "counting-sgd"; }
  int state_count() const override { return 0; }
  double default_lr() const override { return 0.5; }
  double default_weight_decay() const override { return 0.0; }
  void apply(const zeroshard::ShardSlice& slice,
             const zeroshard::StepContext& context) const override {
    ++*calls_;
    for (std::int64_t i = 0; i < slice.size; ++i) {
      slice.param[i] -= static_cast<float>(context.lr) * slice.grad[i];
    }
  }
  std::shared_ptr<int> calls() const { return calls_; }

 private:
  std::shared_ptr<int> calls_ = std::make_shared<int>(0);
};

TEST(SharedLibrary, CallsBackARuleTheProgramDerived) {
  auto rule = std::make_unique<CountingSgd>();
  const std::shared_ptr<int> calls = rule->calls();
  // No clipping: the gradient reaches the rule as written.
  zeroshard::Engine engine(
      Config::from_json_string(R"({"train_batch_size": 1, "gradient_clipping": 0})"),
      zeroshard::Communicator::from_environment(), std::move(rule));
  zeroshard::Parameter w = engine.register_parameter("w", {4});
  w.copy_from(std::vector<float>{1, 2, 3, 4});
  for (int i = 0; i < 4; ++i) w.grad()[i] = 2.0f;
  engine.grad_ready(w);
  engine.step();
  EXPECT_GT(*calls, 0);
  EXPECT_EQ(std::vector<float>(w.data(), w.data() + 4), (std::vector<float>{0, 1, 2, 3}));
}

}  // namespace
