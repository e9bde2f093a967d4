// The memory estimator against the ZeRO paper's formulas and Figure 1, its inverse, and offload
// placement.
#include "zeroshard/memory_estimator.h"

#include <gtest/gtest.h>

#include <array>
#include <string>

#include "layout/shard_layout.h"  // split_optimizer, kTensorAlignment
#include "zeroshard/error.h"
#include "zeroshard/quantity.h"

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
    EXPECT_EQ(format_decimal_bytes(e.model_state_bytes()), expected[stage]) << "stage " << stage;
  }
}

// 16 x 840 x 100 elements: the engine's alignment (16 elements per rank) divides it for every N
// in 1..8, so there is no padding and P/N is exact.
constexpr std::int64_t kUnpaddedP = 16 * 840 * 100;

TEST(MemoryEstimator, MixedPrecisionAdamFollowsThePaperFormulas) {
  const std::int64_t p = kUnpaddedP;
  for (DType precision : {DType::kFloat16, DType::kBFloat16}) {
    for (int n = 1; n <= 8; ++n) {
      EXPECT_EQ(estimate(input(p, n, 0, precision)).model_state_bytes(), 16 * p);
      EXPECT_EQ(estimate(input(p, n, 1, precision)).model_state_bytes(), 4 * p + 12 * p / n);
      EXPECT_EQ(estimate(input(p, n, 2, precision)).model_state_bytes(), 2 * p + 14 * p / n);
      EXPECT_EQ(estimate(input(p, n, 3, precision)).model_state_bytes(), 16 * p / n);
    }
    // The 64Ki-element fp32 chunk 16-bit gradients are widened in is a bounded buffer beside
    // the bucket slots (none at stage 0 on one rank).
    const MemoryEstimate e = estimate(input(p, 1, 0, precision));
    EXPECT_EQ(e.at(MemoryCategory::kCommunication), 4 * kGradientScratchElements);
  }
}

TEST(MemoryEstimator, Fp32CommunicationWidensTheBucketSlots) {
  EstimateInput in = input(kUnpaddedP, 4, 2, DType::kBFloat16);
  in.reduce_bucket_size = 100'000;
  const std::int64_t narrow = estimate(in).at(MemoryCategory::kCommunication);
  in.fp32_communication = true;
  const MemoryEstimate e = estimate(in);
  // Two slots, each gaining an fp32 copy of the bucket, which is reduced in place there.
  const std::int64_t bucket = 100'000;
  EXPECT_EQ(e.at(MemoryCategory::kCommunication) - narrow, 2 * 4 * bucket);
  EXPECT_EQ(e.model_state_bytes(), 2 * kUnpaddedP + 14 * kUnpaddedP / 4);
}

TEST(MemoryEstimator, Fp32AdamFollowsTheFormulas) {
  const std::int64_t p = kUnpaddedP;
  for (int n = 1; n <= 8; ++n) {
    EXPECT_EQ(estimate(input(p, n, 0, DType::kFloat32)).model_state_bytes(), 16 * p);
    EXPECT_EQ(estimate(input(p, n, 1, DType::kFloat32)).model_state_bytes(), 8 * p + 8 * p / n);
    EXPECT_EQ(estimate(input(p, n, 2, DType::kFloat32)).model_state_bytes(), 4 * p + 12 * p / n);
    EXPECT_EQ(estimate(input(p, n, 3, DType::kFloat32)).model_state_bytes(), 16 * p / n);
    EXPECT_EQ(estimate(input(p, n, 0, DType::kFloat32)).at(MemoryCategory::kMasterWeights), 0);
  }
}

TEST(MemoryEstimator, OptimizerSetsTheStateArrays) {
  const std::int64_t p = 1024;
  EXPECT_EQ(estimate(input(p, 1, 0, DType::kFloat32, "sgd")).model_state_bytes(), 8 * p);
  EXPECT_EQ(estimate(input(p, 1, 0, DType::kFloat32, "Lion")).model_state_bytes(), 12 * p);
  EXPECT_EQ(estimate(input(p, 1, 0, DType::kFloat32, "adagrad")).model_state_bytes(), 12 * p);
  EstimateInput amsgrad = input(p, 1, 0, DType::kFloat32, "adamw");
  amsgrad.optimizer_state_arrays = 3;
  EXPECT_EQ(estimate(amsgrad).model_state_bytes(), 20 * p);
}

TEST(MemoryEstimator, FollowsTheEnginesAlignedLayout) {
  // 10 elements on 4 ranks: padded to 16 x 4 = 64 so that every shard (16) stays aligned.
  const MemoryEstimate e = estimate(input(10, 4, 3, DType::kFloat32));
  EXPECT_EQ(e.padded_params, 64);
  EXPECT_EQ(e.shard_params, 16);
  EXPECT_EQ(e.model_state_bytes(), 16 * 16);
  // Tensors of 20, 5 and 40 start at 0, 32 and 48: 88 elements, padded to 96 on 2 ranks.
  EstimateInput tensors = input(0, 2, 0, DType::kFloat32);
  tensors.tensors = {20, 5, 40};
  EXPECT_EQ(estimate(tensors).padded_params, 96);
  EXPECT_EQ(estimate(tensors).model_state_bytes(), 16 * 96);
}

TEST(MemoryEstimator, StageThreeKeepsSmallTensorsWhole) {
  EstimateInput in = input(0, 4, 3, DType::kFloat32);
  in.tensors = {4096, 64, 4096, 64};
  in.param_persistence_threshold = 100;
  const MemoryEstimate e = estimate(in);
  EXPECT_EQ(e.at(MemoryCategory::kParameters), 4 * (e.shard_params + 128));
  in.model_persistence_threshold = 64;  // room for the first small tensor only
  EXPECT_EQ(estimate(in).at(MemoryCategory::kParameters), 4 * (e.shard_params + 64));
}

TEST(MemoryEstimator, StageThreeGathersTheModuleInUseBeyondTheLiveBudget) {
  // stage3_max_live_parameters bounds prefetch and reuse; the module in use is gathered whole,
  // here the largest tensor, which stands for it.
  EstimateInput in = input(0, 4, 3, DType::kFloat32);
  in.tensors = {4096, 64, 4096, 64};
  in.max_live_parameters = 1000;
  EXPECT_EQ(estimate(in).transient_device_bytes, 4 * 4096);
  in.max_live_parameters = 1'000'000;
  EXPECT_EQ(estimate(in).transient_device_bytes, 4 * estimate(in).padded_params);
  EstimateInput sized = input(1'000'000, 4, 3, DType::kFloat32);
  sized.largest_tensor = 5000;
  sized.max_live_parameters = 1000;
  EXPECT_EQ(estimate(sized).transient_device_bytes, 4 * 5000);
}

TEST(MemoryEstimator, QuantizedWeightsAddThreeEncodedGathersOfTheLargestTensor) {
  EstimateInput in = input(0, 4, 3, DType::kFloat32);
  in.tensors = {4096, 64, 4096, 64};
  in.max_live_parameters = 1000;
  in.quantized_weights = true;
  // 8320 elements, shards of 2080: the first tensor is 2080 elements on rank 0 (9 blocks, 2116
  // bytes) and 2016 on rank 1 (8 blocks, 2048 bytes), after the 4-byte non-finite counter.
  EXPECT_EQ(estimate(in).transient_device_bytes, 4 * 4096 + 3 * (4 + 2116 + 2048));
  in.stage = 2;
  EXPECT_EQ(estimate(in).transient_device_bytes, 0) << "no gathers below stage 3";
}

TEST(MemoryEstimator, QuantizedNontrainableWeightsKeepFrozenParametersAsInt8Blocks) {
  EstimateInput in = input(1'000'000, 4, 3, DType::kBFloat16);
  in.frozen_params = 1001;
  const MemoryEstimate plain = estimate(in);
  in.quantized_nontrainable_weights = true;
  const MemoryEstimate quantized = estimate(in);
  // 4 blocks: 16 bytes of scales and 1001 codes, padded to 1020 bytes, for 2002 of bf16.
  EXPECT_EQ(plain.at(MemoryCategory::kParameters) - quantized.at(MemoryCategory::kParameters),
            2 * 1001 - 1020);
  EXPECT_EQ(quantized.transient_device_bytes - plain.transient_device_bytes, 2 * 1001)
      << "the decoded copies, every frozen parameter gathered at once";
  in.largest_frozen_module = 600;
  EXPECT_EQ(estimate(in).transient_device_bytes - plain.transient_device_bytes, 2 * 600);
  in.stage = 2;
  EXPECT_EQ(estimate(in).at(MemoryCategory::kParameters), 2 * 1001 + estimate(in).padded_params * 2)
      << "stage 2 keeps frozen parameters in the model's type";
}

TEST(MemoryEstimator, BoundsTheBucketSlots) {
  EstimateInput in = input(1'048'576, 4, 2, DType::kFloat16);
  in.reduce_bucket_size = 100'000;
  // Beside the slots: the fp32 chunk 16-bit gradients are widened in.
  const std::int64_t scratch = 4 * kGradientScratchElements;
  // Two slots, each a bucket of 100000 elements, this rank's share reduced in place in it.
  EXPECT_EQ(estimate(in).at(MemoryCategory::kCommunication), 2 * 2 * 100'000 + scratch);
  // Stage 1 reduces the whole gradients in place: no slot at all.
  in.stage = 1;
  EXPECT_EQ(estimate(in).at(MemoryCategory::kCommunication), scratch);
  // A tensor larger than the bucket is a bucket of its own, with its alignment slack.
  in.stage = 3;
  in.largest_tensor = 500'000;
  EXPECT_EQ(estimate(in).at(MemoryCategory::kCommunication), 2 * 2 * (500'000 + 63) + scratch);
}

TEST(MemoryEstimator, PlansBucketsAsTheEngineDoesWhenItKnowsTheTensors) {
  // Four tensors of 100 at offsets 0, 112, 224 and 336, padded to 448 on 2 ranks. From the top,
  // a bucket of 250 elements holds two of them with their alignment gaps: [224, 448) and
  // [0, 224).
  EstimateInput in = input(0, 2, 2, DType::kFloat32);
  in.tensors = {100, 100, 100, 100};
  in.reduce_bucket_size = 250;
  EXPECT_EQ(estimate(in).padded_params, 448);
  EXPECT_EQ(estimate(in).at(MemoryCategory::kCommunication), 2 * 4 * 224);
  in.reduce_bucket_size = 50;  // every tensor a bucket of its own, the top one with the padding
  EXPECT_EQ(estimate(in).at(MemoryCategory::kCommunication), 2 * 4 * 112);
}

TEST(MemoryEstimator, SendsTwoPPerStepAndThreePAtStageThree) {
  for (int stage = 0; stage <= 3; ++stage) {
    const MemoryEstimate e = estimate(input(kUnpaddedP, 4, stage, DType::kBFloat16));
    EXPECT_EQ(e.traffic_bytes_per_step, (stage == 3 ? 3 : 2) * kUnpaddedP * 2);
  }
}

TEST(MemoryEstimator, CountsBucketSlotsFromStageTwoOnly) {
  EstimateInput in = input(1'000'000, 1, 0, DType::kFloat32);
  in.reduce_bucket_size = 100'000;
  for (int ranks : {1, 4}) {
    in.ranks = ranks;
    // Stages 0-1 reduce the whole gradients in place, bucket by bucket (stage 0 on several ranks
    // reduce-scatters and gathers the sums back around this rank's part).
    for (int stage = 0; stage <= 1; ++stage) {
      in.stage = stage;
      EXPECT_EQ(estimate(in).at(MemoryCategory::kCommunication), 0)
          << ranks << " ranks, stage " << stage;
    }
    // Stages 2-3 write gradients into two bucket slots.
    for (int stage = 2; stage <= 3; ++stage) {
      in.stage = stage;
      const MemoryEstimate e = estimate(in);
      EXPECT_EQ(e.at(MemoryCategory::kCommunication), 2 * 4 * 100'000)
          << ranks << " ranks, stage " << stage;
      EXPECT_EQ(e.total(), e.model_state_bytes() + e.at(MemoryCategory::kCommunication));
    }
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
  // The gradient shard, in fp16 as without offload; the scratch the update widens 16-bit
  // gradients in, beside it; two staging halves of the larger of a bucket's share (the whole
  // shard, 16-bit) and a write-back tile (the whole shard too, below 4M elements); and the norm
  // scan's sum and flag for each of the shard's 15 whole tiles of 65,536.
  EXPECT_EQ(e.at(MemoryCategory::kGradients, MemoryTier::kHost), 2 * p / 4);
  EXPECT_EQ(e.at(MemoryCategory::kCommunication, MemoryTier::kHost),
            4 * kGradientScratchElements + 2 * 2 * p / 4 + 9 * 15);
  // With more micro-steps per window the scan takes no sums as gradients land.
  in.gradient_accumulation_steps = 2;
  EXPECT_EQ(estimate(in).at(MemoryCategory::kCommunication, MemoryTier::kHost),
            4 * kGradientScratchElements + 2 * 2 * p / 4);
  in.gradient_accumulation_steps = 1;
  EXPECT_EQ(e.total(MemoryTier::kNvme), 0);
  // grad_accum_dtype fp32 keeps that shard in fp32, as it does on the device without offload.
  in.fp32_grad_accumulation = true;
  EXPECT_EQ(estimate(in).at(MemoryCategory::kGradients, MemoryTier::kHost), 4 * p / 4);
  in.offload_optimizer = OffloadDevice::kNone;
  EXPECT_EQ(estimate(in).at(MemoryCategory::kGradients, MemoryTier::kDevice), 4 * p / 4);
}

// What a GPU rank with offload_optimizer allocates beside the update, in pinned host memory
// (layout/host_staging_size.h): two halves, each the larger of the largest share of a reduced
// bucket this rank receives, in the type it is delivered in, and a write-back tile of at most 4M
// 16-bit elements (min with sub_group_size and the shard).
TEST(MemoryEstimator, CountsTheOffloadStagingHalvesOfAGpuConfig) {
  Config config;
  config.fp16.enabled = true;
  config.optimizer.type = "adamw";
  config.zero_optimization.stage = 2;
  config.zero_optimization.offload_optimizer.device = OffloadDevice::kCpu;
  config.zero_optimization.offload_optimizer.pin_memory = true;
  config.zero_optimization.reduce_bucket_size = 2'000'000;
  const std::int64_t p = 64'000'000;  // 16M elements per rank on 4 ranks
  const auto staging = [&](const Config& c) {
    const MemoryEstimate with = estimate_from_config(c, p, 4);
    Config resident = c;
    resident.zero_optimization.offload_optimizer.device = OffloadDevice::kNone;
    resident.zero_optimization.offload_param.device = OffloadDevice::kNone;
    const MemoryEstimate without = estimate_from_config(resident, p, 4);
    EXPECT_TRUE(with.valid) << with.reason;
    // The scratch moves to the host with the update; everything else in communication stays.
    // The norm scan's sums of the 16M-element shard's 244 whole tiles are not staging.
    return with.at(MemoryCategory::kCommunication, MemoryTier::kHost) +
           with.at(MemoryCategory::kCommunication, MemoryTier::kDevice) -
           without.at(MemoryCategory::kCommunication, MemoryTier::kHost) -
           without.at(MemoryCategory::kCommunication, MemoryTier::kDevice) - 9 * 244;
  };
  // A 4M-element fp16 write-back tile (8 MiB) outweighs the share of a 2M-element bucket, which
  // may lie within one rank's 16M-element shard: 2M elements, 4 MB.
  EXPECT_EQ(staging(config), 2 * 2 * (std::int64_t{1} << 22));
  // A smaller sub_group_size bounds the tile: 100k elements, under the share.
  config.zero_optimization.sub_group_size = 100'000;
  EXPECT_EQ(staging(config), 2 * 2 * 2'000'000);
  // Reduced in fp32 (communication_data_type), the share arrives widened.
  config.communication_data_type = "fp32";
  EXPECT_EQ(staging(config), 2 * 4 * 2'000'000);
  // At stage 1 the whole gradients are reduced in place and delivered in fp16.
  config.zero_optimization.stage = 1;
  EXPECT_EQ(staging(config), 2 * 2 * 2'000'000);
  // Stage 3 with offload_param keeps the parameters on the host: only the shares are staged.
  config.communication_data_type = "";
  config.zero_optimization.stage = 3;
  config.zero_optimization.sub_group_size = 1'000'000'000;
  config.zero_optimization.offload_param.device = OffloadDevice::kCpu;
  EXPECT_EQ(staging(config), 2 * 2 * 2'000'000);
  // Without offload nothing is staged.
  EXPECT_EQ(
      estimate_from_config(Config{}, p, 4).at(MemoryCategory::kCommunication, MemoryTier::kHost),
      0);
}

TEST(MemoryEstimator, NvmeOffloadAddsPinnedSwapBuffers) {
  const std::int64_t p = 4'000'000;
  EstimateInput in = input(p, 4, 3, DType::kBFloat16);
  in.offload_optimizer = OffloadDevice::kNvme;
  in.offload_param = OffloadDevice::kNvme;
  in.sub_group_size = 100'000;
  in.param_buffer_size = 50'000;
  in.param_max_in_cpu = 200'000;
  const MemoryEstimate e = estimate(in);
  ASSERT_TRUE(e.valid) << e.reason;
  // The engine's swap records (offload/nvme_swapper.h): a page of header and the payload rounded
  // up to pages; the master's file holds one fp32 sub-group per record, the states' file two
  // (AdamW), and each file two records per sub-group (10 sub-groups of the 1M-element shard).
  const std::int64_t master_record = 4096 + 401408;
  const std::int64_t states_record = 4096 + 802816;
  EXPECT_EQ(e.at(MemoryCategory::kMasterWeights, MemoryTier::kNvme), 2 * 10 * master_record);
  EXPECT_EQ(e.at(MemoryCategory::kOptimizerStates, MemoryTier::kNvme), 2 * 10 * states_record);
  // Parameters: 200,000 of the shard's 1M elements stay in host memory (max_in_cpu), the other
  // 800,000 go to the file in 16 tiles of 50,000 bf16 elements, two records each.
  const std::int64_t param_record = 4096 + 102400;
  EXPECT_EQ(e.at(MemoryCategory::kParameters, MemoryTier::kNvme), 2 * 16 * param_record);
  EXPECT_EQ(e.at(MemoryCategory::kParameters, MemoryTier::kHost), 2 * 200'000 + 5 * param_record);
  // Host: 4 records of each file, the parameters above, the bf16 gradient shard beside the
  // update, the update's fp32 scratch, two staging halves of a bucket's bf16 share (the
  // parameters, in host memory and on NVMe, are not written back through them), and the norm
  // scan's sums of the shard's 15 whole tiles.
  EXPECT_EQ(e.total(MemoryTier::kHost), 4 * (master_record + states_record) + 2 * 200'000 +
                                            5 * param_record + 2 * p / 4 +
                                            4 * kGradientScratchElements + 2 * 2 * p / 4 + 9 * 15);
}

TEST(MemoryEstimator, RejectsOffloadWhereDeepSpeedDoes) {
  EstimateInput in = input(1000, 2, 2, DType::kFloat16);
  in.offload_param = OffloadDevice::kCpu;
  EXPECT_FALSE(estimate(in).valid);
  in = input(1000, 2, 0, DType::kFloat16);
  in.offload_optimizer = OffloadDevice::kCpu;
  EXPECT_FALSE(estimate(in).valid);
  // DeepSpeed keeps the states in CPU memory under "nvme" below stage 3; zeroshard swaps them at
  // stages 1-3.
  in.stage = 2;
  in.offload_optimizer = OffloadDevice::kNvme;
  EXPECT_TRUE(estimate(in).valid);
  // Parameters on NVMe need the optimizer on NVMe (zeroshard's rule, see docs/config.md).
  in = input(1000, 2, 3, DType::kFloat16);
  in.offload_param = OffloadDevice::kNvme;
  in.offload_optimizer = OffloadDevice::kCpu;
  EXPECT_FALSE(estimate(in).valid);
  in.offload_optimizer = OffloadDevice::kNvme;
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
  try {
    estimate(input(1000, 2, 1, DType::kFloat64));
    FAIL() << "an fp64 model was estimated";
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.key_path(), "precision");
    EXPECT_NE(std::string(error.what()).find("got fp64"), std::string::npos);
  }
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
  // buckets and the gathered parameters (bounded by stage3_max_live_parameters).
  EstimateInput in = input(0, 64, 3, DType::kFloat16);
  in.reduce_bucket_size = 1'000'000;
  in.largest_tensor = 1'000'000;
  in.max_live_parameters = 1'000'000;
  const std::int64_t p = largest_model(1'900'000'000, in);
  EXPECT_GT(p, 7'500'000'000);
  EXPECT_LT(p, 7'600'000'000);
  // 48 elements: 16 x 48 bytes of model states and 4 x 48 of scratch, 960 bytes; the next
  // aligned size, 64, needs 1280.
  EXPECT_EQ(largest_model(1000, 1, 0, DType::kFloat16, "adam"), 48);
  EXPECT_EQ(largest_model(10, 1, 0, DType::kFloat16, "adam"), 0);
}

TEST(MemoryEstimator, ReadsAConfig) {
  Config config;
  config.zero_optimization.stage = 2;
  config.bf16.enabled = true;
  config.optimizer.type = "SGD";
  config.optimizer.params["momentum"] = 0.9;
  config.zero_optimization.reduce_bucket_size = 1000;
  config.grad_accum_dtype = "fp32";
  const EstimateInput in = estimate_input_from_config(config, 4096, 4);
  EXPECT_EQ(in.stage, 2);
  EXPECT_EQ(in.precision, DType::kBFloat16);
  EXPECT_EQ(in.optimizer_state_arrays, 1);
  EXPECT_EQ(in.reduce_bucket_size, 1000);
  EXPECT_TRUE(in.fp32_grad_accumulation);
  // bf16 parameters whole; per element of the 1024-element shard: fp32 gradient, fp32 master
  // weight and one fp32 momentum. (The fp32 scratch, 1024 elements, counts as communication.)
  EXPECT_EQ(estimate_from_config(config, 4096, 4).model_state_bytes(),
            2 * 4096 + (4 + 4 + 4) * 1024);
  config.communication_data_type = "fp32";
  EXPECT_TRUE(estimate_input_from_config(config, 4096, 4).fp32_communication);
}

}  // namespace
}  // namespace zeroshard

namespace zeroshard {
namespace {

TEST(ActivationEstimate, CheckpointingKeepsOneInputPerBlockAndOneBlocksActivations) {
  constexpr std::int64_t kA = 1000;
  EXPECT_EQ(estimate_activations(kA, 16, 0).device, 17 * kA);
  EXPECT_EQ(estimate_activations(kA, 16, 4).device, (4 + 4) * kA);
  EXPECT_EQ(estimate_activations(kA, 16, 1).device, (16 + 1) * kA);
  EXPECT_EQ(estimate_activations(kA, 16, 16).device, (1 + 16) * kA);
  EXPECT_EQ(estimate_activations(kA, 16, 32).device, (1 + 16) * kA);
  // 3 blocks of 3, 3 and 1 layers: the second block (2 kept inputs + 3 layers) is the peak.
  EXPECT_EQ(estimate_activations(kA, 7, 3).device, 5 * kA);
  EXPECT_EQ(estimate_activations(kA, 7, 3).host, 0);
  // cpu_checkpointing: the running block's input and activations, plus one input whose copy is in
  // flight (the previous block's going out, the next block's coming back) from the second block.
  const ActivationEstimate host = estimate_activations(kA, 16, 4, /*cpu_checkpointing=*/true);
  EXPECT_EQ(host.device, (2 + 4) * kA);
  EXPECT_EQ(host.host, 4 * kA);
  // One block: nothing else in flight.
  EXPECT_EQ(estimate_activations(kA, 3, 4, true).device, (1 + 3) * kA);
  // Two blocks of 4 and 1 layers: the first block's 4 layers outweigh the second's 1 plus the
  // prefetched input; of 4 and 3 layers, the second block with it is the peak.
  EXPECT_EQ(estimate_activations(kA, 5, 4, true).device, (1 + 4) * kA);
  EXPECT_EQ(estimate_activations(kA, 7, 4, true).device, (2 + 3) * kA);
  // Three blocks of 3, 3 and 1: the middle one runs beside an input in flight.
  EXPECT_EQ(estimate_activations(kA, 7, 3, true).device, (2 + 3) * kA);
  EXPECT_THROW(estimate_activations(-1, 4, 2), ConfigError);
}

TEST(ActivationEstimate, TheEstimateAddsTheChainAndStageThreeGathersForTheRecompute) {
  EstimateInput in;
  in.params = 1 << 20;
  in.stage = 3;
  in.activation_bytes = 500;
  in.layer_activation_bytes = 1000;
  in.layers = 8;
  const MemoryEstimate plain = estimate(in);
  EXPECT_EQ(plain.at(MemoryCategory::kActivations), 500 + 9 * 1000);
  in.checkpoint_every = 2;
  in.cpu_checkpointing = true;
  const MemoryEstimate checkpointed = estimate(in);
  EXPECT_EQ(checkpointed.at(MemoryCategory::kActivations), 500 + 4 * 1000);
  EXPECT_EQ(checkpointed.at(MemoryCategory::kActivations, MemoryTier::kHost), 4 * 1000);
  EXPECT_EQ(checkpointed.traffic_bytes_per_step * 3, plain.traffic_bytes_per_step * 4);
}

// ratio "auto": the fewest host elements (whole alignment steps) whose device share adds no more
// than the spare bytes; one step fewer would add more.
TEST(SmallestOffloadRatio, KeepsOnTheHostWhatTheSpareDeviceBytesCannotHold) {
  for (int stage : {1, 2, 3}) {  // offload starts at stage 1
    for (DType precision : {DType::kFloat32, DType::kBFloat16}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + " " + to_string(precision));
      EstimateInput in;
      in.params = 1000003;
      in.ranks = 4;
      in.stage = stage;
      in.precision = precision;
      in.offload_optimizer = OffloadDevice::kCpu;
      const MemoryEstimate whole = estimate(in);
      const std::int64_t owned = whole.shard_params;
      const auto growth = [&](double ratio) {
        EstimateInput at = in;
        at.offload_ratio = ratio;
        return estimate(at).total() - whole.total();
      };
      const auto host_of = [owned](double ratio) {
        return detail::split_optimizer(true, ratio, owned).host;
      };
      EXPECT_EQ(smallest_offload_ratio(0, in), 1.0);
      EXPECT_EQ(smallest_offload_ratio(-5, in), 1.0);
      EXPECT_EQ(host_of(smallest_offload_ratio(std::int64_t{1} << 50, in)), 0);
      for (double share : {0.1, 0.5, 0.9}) {  // of the shard on the host
        const std::int64_t spare = growth(share);
        const double ratio = smallest_offload_ratio(spare, in);
        const std::int64_t host = host_of(ratio);
        EXPECT_LE(growth(ratio), spare) << share;
        EXPECT_EQ(host % detail::kTensorAlignment, 0);
        // The whole step nearest the share.
        EXPECT_NEAR(static_cast<double>(host), share * static_cast<double>(owned),
                    detail::kTensorAlignment)
            << share;
        const double one_step_more_on_device =
            static_cast<double>(host - detail::kTensorAlignment) / static_cast<double>(owned);
        EXPECT_GT(growth(one_step_more_on_device), spare) << share;
      }
    }
  }
}

}  // namespace
}  // namespace zeroshard
