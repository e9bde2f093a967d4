// Offload moves the gradient shard, never what it accumulates in: with gradient accumulation in
// every precision and at every stage, training with offload_optimizer in CPU memory or on NVMe
// skips the same fp16 steps and gives the same loss scales, norms and parameters, bit for bit, as
// training without it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "mpi/toy_model.h"

namespace zeroshard::testing {
namespace {

constexpr std::int64_t kSteps = 8;  // optimizer steps per run

enum class Offload { kCpu, kCpuWithParams, kNvme };

struct AccumulationCase {
  int stage = 0;
  DType dtype = DType::kFloat32;
  std::int64_t accumulation_steps = 1;
  bool fp32_accumulation = false;  ///< data_types.grad_accum_dtype "fp32"
};

Config case_config(const AccumulationCase& c) {
  Config config = toy_config(c.stage);
  config.gradient_accumulation_steps = c.accumulation_steps;
  config.gradient_clipping = 1.0;
  config.bf16.enabled = c.dtype == DType::kBFloat16;
  config.fp16.enabled = c.dtype == DType::kFloat16;
  // DeepSpeed's initial scale (2^16) overflows the toy's scaled gradients; the scale falls until a
  // micro-step's sum fits in fp16, where a window's accumulated sum may still overflow, and the
  // short window raises it again: overflows and updates alternate through the run.
  config.fp16.initial_scale_power = 16;
  config.fp16.loss_scale_window = 2;
  config.fp16.hysteresis = 1;
  if (c.fp32_accumulation) config.grad_accum_dtype = "fp32";
  return config;
}

Config with_offload(Config config, Offload offload) {
  ZeroConfig& zero = config.zero_optimization;
  switch (offload) {
    case Offload::kCpuWithParams:
      zero.offload_param.device = OffloadDevice::kCpu;
      [[fallthrough]];
    case Offload::kCpu:
      zero.offload_optimizer.device = OffloadDevice::kCpu;
      break;
    case Offload::kNvme:
      zero.offload_optimizer.device = OffloadDevice::kNvme;
      zero.offload_optimizer.nvme_path = nvme_test_directory();
      // Sub-groups of 24 elements: several swap records per rank at every world size.
      zero.sub_group_size = 24;
      break;
  }
  return config;
}

std::string offload_name(Offload offload) {
  switch (offload) {
    case Offload::kCpu:
      return "offload_optimizer cpu";
    case Offload::kCpuWithParams:
      return "offload_optimizer and offload_param cpu";
    case Offload::kNvme:
      return "offload_optimizer nvme";
  }
  return "";
}

struct Trained {
  std::vector<bool> skipped;  ///< per optimizer step
  std::vector<double> loss_scales;
  std::vector<double> grad_norms;
  std::vector<float> master;
  std::vector<char> model;  ///< every trainable parameter as the model sees it
};

Trained train(Config config) {
  const std::int64_t accumulation_steps = config.gradient_accumulation_steps;
  Engine engine = make_engine(std::move(config), rule_cases()[0].make());
  const auto tensors = uneven_toy_tensors();
  const auto handles = register_toy(engine, tensors);
  Trained run;
  for (std::int64_t step = 0; step < kSteps; ++step) {
    StepResult result;
    for (std::int64_t micro = 0; micro < accumulation_steps; ++micro) {
      toy_micro_step_any_precision(engine, tensors, handles, step * accumulation_steps + micro);
      result = engine.step();
    }
    run.skipped.push_back(result.skipped);
    run.loss_scales.push_back(engine.loss_scale());
    run.grad_norms.push_back(result.grad_norm);
  }
  run.master = engine.consolidated_parameters();
  run.model = model_bytes(engine, tensors, handles);
  return run;
}

std::int64_t differing_elements(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return static_cast<std::int64_t>(std::max(a.size(), b.size()));
  std::int64_t count = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    count += std::memcmp(&a[i], &b[i], sizeof(float)) != 0 ? 1 : 0;
  }
  return count;
}

class OffloadAccumulation : public ::testing::TestWithParam<AccumulationCase> {};

TEST_P(OffloadAccumulation, TrainsBitForBitAsWithoutOffload) {
  const AccumulationCase c = GetParam();
  const Config resident = case_config(c);
  const Trained expected = train(resident);
  if (c.dtype == DType::kFloat16) {
    // The case exercises the skipped-step sequence: some steps overflow, others update.
    const auto skips = std::count(expected.skipped.begin(), expected.skipped.end(), true);
    EXPECT_GT(skips, 0);
    EXPECT_LT(skips, kSteps);
  }
  // Stage 0 has no optimizer offload (the config refuses it); it gives what stage 1 gives without
  // offload, so it must give what stage 1 gives with it.
  Config base = resident;
  if (c.stage == 0) base.zero_optimization.stage = 1;
  std::vector<Offload> offloads = {Offload::kCpu, Offload::kNvme};
  if (c.stage == 3) offloads.push_back(Offload::kCpuWithParams);
  for (Offload offload : offloads) {
    SCOPED_TRACE(offload_name(offload) + (c.stage == 0 ? " at stage 1" : ""));
    const Trained actual = train(with_offload(base, offload));
    EXPECT_EQ(actual.skipped, expected.skipped) << "the steps skipped differ";
    EXPECT_EQ(actual.loss_scales, expected.loss_scales);
    EXPECT_EQ(actual.grad_norms, expected.grad_norms);
    EXPECT_EQ(differing_elements(actual.master, expected.master), 0)
        << "fp32 master weights differ, of " << expected.master.size();
    EXPECT_EQ(actual.model, expected.model) << "the parameters the model sees differ";
  }
}

std::vector<AccumulationCase> accumulation_cases() {
  std::vector<AccumulationCase> cases;
  for (int stage = 0; stage <= 3; ++stage) {
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      for (std::int64_t accumulation_steps : {1, 3}) {
        cases.push_back({stage, dtype, accumulation_steps, false});
        // fp32 accumulation of 16-bit gradients: the gradient shard at stages 2-3, the whole
        // gradients' accumulator at stages 0-1.
        if (dtype != DType::kFloat32) {
          cases.push_back({stage, dtype, accumulation_steps, true});
        }
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(StagesPrecisionsWindows, OffloadAccumulation,
                         ::testing::ValuesIn(accumulation_cases()), [](const auto& info) {
                           const AccumulationCase& c = info.param;
                           return "stage" + std::to_string(c.stage) + "_" + to_string(c.dtype) +
                                  "_ga" + std::to_string(c.accumulation_steps) +
                                  (c.fp32_accumulation ? "_fp32_accum" : "");
                         });

}  // namespace
}  // namespace zeroshard::testing
