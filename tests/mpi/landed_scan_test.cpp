// An offloaded shard's gradient-norm scan takes each tile's square sum as the tile's gradients
// land, during backward, and step() adds those sums as its own scan would: the norms and every
// parameter are bit for bit those of the same training without offload, however the buckets cut
// the tiles, in every precision, with part of the shard on the device, with super_offload, after
// a zero_grad() that makes the window's gradients land again, and when a tile holds an inf.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "engine/engine_internals.h"
#include "mpi/toy_model.h"

namespace zeroshard::testing {
namespace {

enum class Placement { kAllOnHost, kHalfOnHost, kSuperOffload };

using LandedScanCase = std::tuple<int, DType, Placement>;  // stage, precision, placement

// Each rank's host share holds two scan tiles (2^16 elements) or more at every world size up to 4
// with half the shard on the host; the buckets' ends fall inside tiles, never in two in a row.
std::vector<ToyTensor> large_tensors() {
  return {{"a.weight", 600011}, {"a.bias", 77}, {"b.weight", 599999}};
}

Config case_config(int stage, DType dtype) {
  Config config = toy_config(stage, dtype);
  config.gradient_accumulation_steps = 1;  // the sums are taken only when gradients land once
  config.gradient_clipping = 1.0;
  config.zero_optimization.reduce_bucket_size = 200003;
  config.zero_optimization.allgather_bucket_size = 1 << 20;
  config.zero_optimization.prefetch_bucket_size = 1 << 20;
  return config;
}

struct Trained {
  std::vector<float> master;
  std::vector<char> model;
  std::vector<double> norms;
  int updates = 0;
  double landed_scan_seconds = 0.0;
  std::int64_t landed_tiles = 0;  ///< tiles the steps' scans added as they landed
};

constexpr int kZeroGradStep = 2;
constexpr int kInfStep = 3;
constexpr std::int64_t kInfElement = 70000;  // in b.weight, inside a tile

Trained train(Config config) {
  Engine engine = make_engine(std::move(config), make_adamw());
  const std::vector<ToyTensor> tensors = large_tensors();
  const auto handles = register_toy(engine, tensors);
  const GradientTerm inf_in_b = [](std::size_t k) -> std::function<float(std::int64_t)> {
    return [k](std::int64_t i) { return k == 2 && i == kInfElement ? INFINITY : 0.0f; };
  };
  Trained result;
  for (int step = 0; step < 5; ++step) {
    if (step == kZeroGradStep) {
      // Gradients that landed and were dropped: the window's arrivals then add to zeros.
      toy_micro_step_any_precision(engine, tensors, handles, step + 100);
      engine.zero_grad();
    }
    toy_micro_step_any_precision(engine, tensors, handles, step,
                                 step == kInfStep ? inf_in_b : GradientTerm{});
    if (step == kInfStep && engine.model_dtype() == DType::kFloat32) {
      // With no loss scale to lower, fp32 refuses the step, naming the tensor.
      const std::string message = message_of<Error>([&engine] { engine.step(); });
      EXPECT_NE(message.find("'b.weight'"), std::string::npos) << message;
      engine.zero_grad();
      continue;
    }
    const StepResult r = engine.step();
    result.updates += r.updated ? 1 : 0;
    if (r.updated) result.norms.push_back(r.grad_norm);
  }
  result.master = engine.consolidated_parameters();
  result.model = model_bytes(engine, tensors, handles);
  const detail::StepTimes& times = detail::EngineInternals::state(engine).times();
  result.landed_scan_seconds = times.landed_scan;
  result.landed_tiles = times.landed_tiles;
  return result;
}

class LandedScan : public ::testing::TestWithParam<LandedScanCase> {};

TEST_P(LandedScan, FindsTheNormOfTheScanAtTheStep) {
  const auto [stage, dtype, placement] = GetParam();
  const Config resident = case_config(stage, dtype);
  Config offloaded = resident;
  OffloadConfig& offload = offloaded.zero_optimization.offload_optimizer;
  offload.device = OffloadDevice::kCpu;
  if (placement == Placement::kHalfOnHost) offload.ratio = 0.5;
  offload.super_offload = placement == Placement::kSuperOffload;
  const Trained expected = train(resident);
  const Trained actual = train(offloaded);
  EXPECT_EQ(expected.updates, 4) << "the step with an inf is skipped or refused, no other";
  EXPECT_EQ(actual.updates, expected.updates);
  EXPECT_EQ(actual.norms, expected.norms);
  EXPECT_TRUE(same_bits(actual.master, expected.master)) << "fp32 master weights differ";
  EXPECT_EQ(actual.model, expected.model) << "the parameters the model sees differ";
  EXPECT_GT(actual.landed_scan_seconds, 0.0) << "no tile's sum was taken as it landed";
  EXPECT_GT(actual.landed_tiles, 0) << "no step added a tile's sum taken as it landed";
  EXPECT_EQ(expected.landed_scan_seconds, 0.0);
  EXPECT_EQ(expected.landed_tiles, 0);
}

std::vector<LandedScanCase> landed_scan_cases() {
  std::vector<LandedScanCase> cases;
  for (int stage : {2, 3}) {
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      for (Placement placement :
           {Placement::kAllOnHost, Placement::kHalfOnHost, Placement::kSuperOffload}) {
        cases.emplace_back(stage, dtype, placement);
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(StagesPrecisionsPlacements, LandedScan,
                         ::testing::ValuesIn(landed_scan_cases()), [](const auto& info) {
                           const LandedScanCase& c = info.param;
                           const Placement placement = std::get<2>(c);
                           return "stage" + std::to_string(std::get<0>(c)) + "_" +
                                  to_string(std::get<1>(c)) +
                                  (placement == Placement::kHalfOnHost     ? "_ratio"
                                   : placement == Placement::kSuperOffload ? "_super_offload"
                                                                           : "");
                         });

}  // namespace
}  // namespace zeroshard::testing
