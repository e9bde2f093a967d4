// The memory estimator against the ZeRO paper's formulas and Figure 1, its inverse, and offload
// placement.
#include "zeroshard/memory_estimator.h"

#include <gtest/gtest.h>

#include <array>
#include <string>

#include "quantity.h"
#include "zeroshard/error.h"

namespace zeroshard {
namespace {

EstimateInput input(std::int64_t params, int ranks, int stage, DType precision,
                    const std::string& optimizer = "adam") {
  EstimateInput in;
  in.params = params;
  in.ranks = ranks;
  in.stage = stage;
  in.precision = precision;
  in.optimizer = optimizer;
  return in;
}

TEST(MemoryEstimator, ReproducesZeroPaperFigureOne) {
  // 7.5B parameters, 64 ranks, mixed-precision Adam: 120, 31.4, 16.6 and 1.9 GB per device.
  const std::array<const char*, 4> expected = {"120.0 GB", "31.4 GB", "16.6 GB", "1.9 GB"};
  for (int stage = 0; stage <= 3; ++stage) {
    const MemoryEstimate e = estimate(input(7'500'000'000, 64, stage, DType::kFloat16));
    EXPECT_EQ(detail::format_decimal_bytes(e.model_state_bytes()), expected[stage])
        << "stage " << stage;
  }
}

TEST(MemoryEstimator, MixedPrecisionAdamFollowsThePaperFormulas) {
  for (DType precision : {DType::kFloat16, DType::kBFloat16}) {
    for (int n = 1; n <= 8; ++n) {
      const std::int64_t p = 840 * 1000;  // divisible by 1..8, so P/N is exact
      EXPECT_EQ(estimate(input(p, n, 0, precision)).model_state_bytes(), 16 * p);
      EXPECT_EQ(estimate(input(p, n, 1, precision)).model_state_bytes(), 4 * p + 12 * p / n);
      EXPECT_EQ(estimate(input(p, n, 2, precision)).model_state_bytes(), 2 * p + 14 * p / n);
      EXPECT_EQ(estimate(input(p, n, 3, precision)).model_state_bytes(), 16 * p / n);
    }
  }
}

TEST(MemoryEstimator, Fp32AdamFollowsTheFormulas) {
  for (int n = 1; n <= 8; ++n) {
    const std::int64_t p = 840 * 1000;
    EXPECT_EQ(estimate(input(p, n, 0, DType::kFloat32)).model_state_bytes(), 16 * p);
    EXPECT_EQ(estimate(input(p, n, 1, DType::kFloat32)).model_state_bytes(), 8 * p + 8 * p / n);
    EXPECT_EQ(estimate(input(p, n, 2, DType::kFloat32)).model_state_bytes(), 4 * p + 12 * p / n);
    EXPECT_EQ(estimate(input(p, n, 3, DType::kFloat32)).model_state_bytes(), 16 * p / n);
    EXPECT_EQ(estimate(input(p, n, 0, DType::kFloat32)).at(MemoryCategory::kMasterWeights), 0);
  }
}

TEST(MemoryEstimator, OptimizerSetsTheStateArrays) {
  const std::int64_t p = 1000;
  EXPECT_EQ(estimate(input(p, 1, 0, DType::kFloat32, "sgd")).model_state_bytes(), 8 * p);
  EXPECT_EQ(estimate(input(p, 1, 0, DType::kFloat32, "Lion")).model_state_bytes(), 12 * p);
  EXPECT_EQ(estimate(input(p, 1, 0, DType::kFloat32, "adagrad")).model_state_bytes(), 12 * p);
  EstimateInput amsgrad = input(p, 1, 0, DType::kFloat32, "adamw");
  amsgrad.optimizer_state_arrays = 3;
  EXPECT_EQ(estimate(amsgrad).model_state_bytes(), 20 * p);
}

TEST(MemoryEstimator, PadsToAMultipleOfTheRanks) {
  // 10 elements on 4 ranks: the flat buffer is padded to 12 and each shard holds 3.
  const MemoryEstimate e = estimate(input(10, 4, 3, DType::kFloat32));
  EXPECT_EQ(e.model_state_bytes(), 16 * 3);
  EstimateInput padded = input(10, 4, 3, DType::kFloat32);
  padded.padded_params = 64;
  EXPECT_EQ(estimate(padded).model_state_bytes(), 16 * 16);
}

TEST(MemoryEstimator, CountsBucketsFromStageOne) {
  EstimateInput in = input(1'000'000, 4, 0, DType::kFloat32);
  in.reduce_bucket_size = 100'000;
  EXPECT_EQ(estimate(in).at(MemoryCategory::kCommunication), 0);
  for (int stage = 1; stage <= 3; ++stage) {
    in.stage = stage;
    const MemoryEstimate e = estimate(in);
    EXPECT_GT(e.at(MemoryCategory::kCommunication), 0) << "stage " << stage;
    EXPECT_EQ(e.total(), e.model_state_bytes() + e.at(MemoryCategory::kCommunication));
  }
}

TEST(MemoryEstimator, OffloadMovesMasterWeightsStatesAndGradientShardToTheHost) {
  const std::int64_t p = 4'000'000;
  EstimateInput in = input(p, 4, 2, DType::kFloat16);
  in.offload_optimizer = OffloadDevice::kCpu;
  const MemoryEstimate e = estimate(in);
  ASSERT_TRUE(e.valid) << e.reason;
  EXPECT_EQ(e.model_state_bytes(MemoryTier::kDevice), 2 * p);
  EXPECT_EQ(e.at(MemoryCategory::kMasterWeights, MemoryTier::kHost), 4 * p / 4);
  EXPECT_EQ(e.at(MemoryCategory::kOptimizerStates, MemoryTier::kHost), 8 * p / 4);
  EXPECT_EQ(e.at(MemoryCategory::kGradients, MemoryTier::kHost), 4 * p / 4);
  EXPECT_EQ(e.total(MemoryTier::kNvme), 0);
}

TEST(MemoryEstimator, NvmeOffloadAddsPinnedSwapBuffers) {
  const std::int64_t p = 4'000'000;
  EstimateInput in = input(p, 4, 3, DType::kBFloat16);
  in.offload_optimizer = OffloadDevice::kNvme;
  in.offload_param = OffloadDevice::kNvme;
  in.sub_group_size = 100'000;
  in.param_buffer_size = 50'000;
  const MemoryEstimate e = estimate(in);
  ASSERT_TRUE(e.valid) << e.reason;
  EXPECT_EQ(e.model_state_bytes(MemoryTier::kNvme), (2 + 4 + 4 + 8) * p / 4);
  EXPECT_EQ(e.total(MemoryTier::kHost), 4 * 4 * 100'000 + 5 * 2 * 50'000);
}

TEST(MemoryEstimator, RejectsOffloadWhereDeepSpeedDoes) {
  EstimateInput in = input(1000, 2, 2, DType::kFloat16);
  in.offload_param = OffloadDevice::kCpu;
  EXPECT_FALSE(estimate(in).valid);
  in = input(1000, 2, 0, DType::kFloat16);
  in.offload_optimizer = OffloadDevice::kCpu;
  EXPECT_FALSE(estimate(in).valid);
  in.stage = 2;
  in.offload_optimizer = OffloadDevice::kNvme;
  EXPECT_FALSE(estimate(in).valid);
  in.stage = 3;
  EXPECT_TRUE(estimate(in).valid);
}

TEST(MemoryEstimator, NamesTheBadValue) {
  EstimateInput in = input(1000, 2, 4, DType::kFloat32);
  try {
    estimate(in);
    FAIL() << "stage 4 was accepted";
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.key_path(), "zero_optimization.stage");
    EXPECT_NE(std::string(error.what()).find("got 4"), std::string::npos);
  }
  EXPECT_THROW(estimate(input(1000, 2, 0, DType::kFloat32, "rmsprop")), ConfigError);
  in = input(1000, 6, 0, DType::kFloat32);
  in.nodes = 4;
  EXPECT_THROW(estimate(in), ConfigError);
}

TEST(MemoryEstimator, LargestModelRoundTrips) {
  for (DType precision : {DType::kFloat32, DType::kFloat16}) {
    for (int stage = 0; stage <= 3; ++stage) {
      for (std::int64_t budget : {std::int64_t{80'000'000'000}, std::int64_t{123'456'789}}) {
        EstimateInput in = input(0, 8, stage, precision);
        in.reduce_bucket_size = 1'000'000;
        const std::int64_t p = largest_model(budget, in);
        in.params = p;
        EXPECT_LE(estimate(in).device_peak(), budget) << "stage " << stage;
        in.params = p + 1;
        EXPECT_GT(estimate(in).device_peak(), budget) << "stage " << stage;
      }
    }
  }
}

TEST(MemoryEstimator, LargestModelOfThePaperExampleIsAboutSevenPointFiveBillion) {
  // 1.9 GB per rank at stage 3 on 64 ranks holds 16P/N for P a little over 7.5B, less the small
  // buckets and the gathered tensor.
  EstimateInput in = input(0, 64, 3, DType::kFloat16);
  in.reduce_bucket_size = 1'000'000;
  in.largest_tensor = 1'000'000;
  const std::int64_t p = largest_model(1'900'000'000, in);
  EXPECT_GT(p, 7'500'000'000);
  EXPECT_LT(p, 7'600'000'000);
  EXPECT_EQ(largest_model(1000, 1, 0, DType::kFloat16, "adam"), 62);
  EXPECT_EQ(largest_model(10, 1, 0, DType::kFloat16, "adam"), 0);
}

TEST(MemoryEstimator, ReadsAConfig) {
  Config config;
  config.zero_optimization.stage = 2;
  config.bf16.enabled = true;
  config.optimizer.type = "SGD";
  config.optimizer.params["momentum"] = 0.9;
  config.zero_optimization.reduce_bucket_size = 1000;
  const EstimateInput in = estimate_input_from_config(config, 4000, 4);
  EXPECT_EQ(in.stage, 2);
  EXPECT_EQ(in.precision, DType::kBFloat16);
  EXPECT_EQ(in.optimizer_state_arrays, 1);
  EXPECT_EQ(in.reduce_bucket_size, 1000);
  EXPECT_EQ(estimate_from_config(config, 4000, 4).model_state_bytes(),
            2 * 4000 + (2 + 4 + 4) * 1000);
}

}  // namespace
}  // namespace zeroshard
