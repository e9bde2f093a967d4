// offload_optimizer.ratio "auto": the first step runs with the whole shard on the host, then the
// share the device's memory can hold moves there. On CPU ranks ZEROSHARD_DEVICE_MEMORY rehearses
// a device's size; training goes on bit for bit as at ratio 1, and the share moved is the
// estimator's for the memory that step left.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine_internals.h"
#include "layout/shard_layout.h"  // split_optimizer, kTensorAlignment
#include "mpi/toy_model.h"
#include "zeroshard/log.h"
#include "zeroshard/memory_estimator.h"

namespace zeroshard::testing {
namespace {

/// Sets ZEROSHARD_DEVICE_MEMORY for its lifetime (unset: no device limit).
class RehearsedDevice {
 public:
  explicit RehearsedDevice(std::optional<std::int64_t> bytes) {
    if (bytes) {
      ::setenv("ZEROSHARD_DEVICE_MEMORY", std::to_string(*bytes).c_str(), 1);
    } else {
      ::unsetenv("ZEROSHARD_DEVICE_MEMORY");
    }
  }
  ~RehearsedDevice() { ::unsetenv("ZEROSHARD_DEVICE_MEMORY"); }
  RehearsedDevice(const RehearsedDevice&) = delete;
  RehearsedDevice& operator=(const RehearsedDevice&) = delete;
};

Config auto_config(int stage, DType dtype, bool super_offload) {
  Config config = toy_config(stage, dtype);
  config.gradient_clipping = 1.0;
  OffloadConfig& offload = config.zero_optimization.offload_optimizer;
  offload.device = OffloadDevice::kCpu;
  offload.super_offload = super_offload;
  offload.ratio = std::nullopt;
  offload.auto_ratio_margin = 0.0;
  return config;
}

struct TrainedRun {
  std::vector<float> master;
  std::vector<char> model;
  int rank = 0;
  int world = 1;
  std::int64_t owned = 0;
  std::int64_t host_before = 0;  ///< host elements before the first step's end
  std::int64_t host_after = 0;   ///< and after the last step
  /// After the first step: the engine's peak in the rehearsed device's memory (host memory less
  /// the optimizer's host part), as settle_auto_offload_ratio() measures it.
  std::int64_t first_step_peak = 0;
  std::vector<std::string> logged;
};

TrainedRun train(const Config& config, int rule, int micro_steps = 8) {
  TrainedRun run;
  set_log_sink([&run](const LogRecord& record) { run.logged.emplace_back(record.message); });
  Engine engine = make_engine(config, rule_cases()[rule].make());
  const auto tensors = uneven_toy_tensors();
  const auto handles = register_toy(engine, tensors);
  auto& state = detail::EngineInternals::state(engine);
  run.rank = engine.rank();
  run.world = engine.world_size();
  for (std::int64_t step = 0; step < micro_steps; ++step) {
    if (step == 0) {
      run.owned = state.optimizer().owned_end() - state.optimizer().owned_begin();
      run.host_before = state.optimizer().host_elements();
    }
    toy_micro_step_any_precision(engine, tensors, handles, step);
    if (step == 1) {
      run.first_step_peak = engine.memory_report().total_peak[0] - state.optimizer().host_bytes();
    }
    engine.step();
  }
  run.host_after = state.optimizer().host_elements();
  run.master = engine.consolidated_parameters();
  run.model = model_bytes(engine, tensors, handles);
  set_log_sink({});
  return run;
}

/// The estimator's input for the toy, as the engine builds it for "auto".
EstimateInput toy_estimate_input(const Config& config, int rule, int world) {
  EstimateInput in = estimate_input_from_config(config, 0, world);
  for (const ToyTensor& t : uneven_toy_tensors()) {
    if (t.trainable) in.tensors.push_back(t.numel);
  }
  in.optimizer_state_arrays = rule_cases()[rule].make()->state_count();
  return in;
}

bool logged_containing(const TrainedRun& run, const std::string& text) {
  for (const std::string& line : run.logged) {
    if (line.find(text) != std::string::npos) return true;
  }
  return false;
}

// stage, precision, rule, super_offload
using AutoCase = std::tuple<int, DType, int, bool>;

class AutoRatio : public ::testing::TestWithParam<AutoCase> {};

// The rehearsed device holds the first step's peak plus about half the shard's device bytes: the
// shard splits where the estimator says, and every step is the one ratio 1 takes.
TEST_P(AutoRatio, MovesTheShareThatFitsAndTrainsBitForBitAsRatioOne) {
  const auto [stage, dtype, rule, super_offload] = GetParam();
  const Config config = auto_config(stage, dtype, super_offload);
  Config whole = config;
  whole.zero_optimization.offload_optimizer.ratio = 1.0;
  TrainedRun expected;
  {
    const RehearsedDevice unlimited(std::nullopt);
    expected = train(whole, rule);
  }
  // The peak the "auto" run will measure: the same engine's first step, with no limit to act on.
  TrainedRun probe;
  {
    const RehearsedDevice unlimited(std::nullopt);
    probe = train(config, rule, 2);
  }
  EXPECT_EQ(probe.host_after, probe.owned);
  if (probe.rank == 0) {
    EXPECT_TRUE(logged_containing(probe, "the device has no memory limit"));
  }
  ASSERT_GT(probe.owned, 2 * detail::kTensorAlignment);

  EstimateInput in = toy_estimate_input(config, rule, probe.world);
  in.offload_ratio = 1.0;
  const std::int64_t at_one = estimate(in).total();
  in.offload_ratio = 0.5;
  const std::int64_t half_spare = estimate(in).total() - at_one;
  ASSERT_GT(half_spare, 0);
  const std::int64_t expected_host =
      detail::split_optimizer(true, smallest_offload_ratio(half_spare, in), probe.owned).host;
  EXPECT_GT(expected_host, 0);
  EXPECT_LT(expected_host, probe.owned);

  TrainedRun actual;
  {
    const RehearsedDevice device(probe.first_step_peak + half_spare);
    actual = train(config, rule);
  }
  EXPECT_EQ(actual.first_step_peak, probe.first_step_peak);
  EXPECT_EQ(actual.host_before, actual.owned);
  EXPECT_EQ(actual.host_after, expected_host);
  EXPECT_TRUE(same_bits(actual.master, expected.master)) << "fp32 master weights differ";
  EXPECT_EQ(actual.model, expected.model) << "the parameters the model sees differ";
  if (actual.rank == 0) {
    EXPECT_TRUE(logged_containing(actual, "offload_optimizer.ratio \"auto\": "));
  }
}

std::vector<AutoCase> auto_cases() {
  std::vector<AutoCase> cases;
  for (int stage = 1; stage <= 3; ++stage) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      const int rule = (stage + static_cast<int>(dtype)) % static_cast<int>(rule_cases().size());
      cases.emplace_back(stage, dtype, rule, false);
      if (dtype != DType::kFloat16) cases.emplace_back(stage, dtype, rule, true);
    }
  }
  return cases;
}

std::string auto_case_name(const ::testing::TestParamInfo<AutoCase>& info) {
  const auto& [stage, dtype, rule, super_offload] = info.param;
  return "stage" + std::to_string(stage) + "_" + to_string(dtype) + "_" + rule_cases()[rule].name +
         (super_offload ? "_super_offload" : "");
}

INSTANTIATE_TEST_SUITE_P(StagesPrecisions, AutoRatio, ::testing::ValuesIn(auto_cases()),
                         auto_case_name);

// A device with no room past the first step keeps ratio 1; one with room for everything keeps a
// single aligned run on the host, so that the shard stays offloaded.
TEST(AutoRatioBounds, NoRoomKeepsRatioOneAndAllRoomKeepsOneRunOnTheHost) {
  const Config config = auto_config(2, DType::kBFloat16, false);
  TrainedRun tight;
  {
    const RehearsedDevice device(1);
    tight = train(config, 0, 2);
  }
  EXPECT_EQ(tight.host_after, tight.owned);
  TrainedRun roomy;
  {
    const RehearsedDevice device(std::int64_t{1} << 40);
    roomy = train(config, 0, 4);
  }
  EXPECT_EQ(roomy.host_after, std::min(roomy.owned, detail::kTensorAlignment));
}

}  // namespace
}  // namespace zeroshard::testing
