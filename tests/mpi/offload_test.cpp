// Offload moves bytes, never the math: with offload_optimizer (and at stage 3 offload_param) on
// CPU memory, training gives the same parameters, bit for bit, as without, for every rule, stage,
// precision and world size; the bytes move to host memory; the offload keys are honoured or
// refused by name.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "engine/engine_internals.h"
#include "layout/shard_layout.h"  // split_optimizer
#include "mpi/toy_model.h"
#include "zeroshard/log.h"

namespace zeroshard::testing {
namespace {

enum class Offload {
  kOptimizer,
  kOptimizerAndParams,
  kOptimizerOnNvme,
  kAllOnNvme,
  kPartOfOptimizer,  ///< offload_optimizer.ratio below 1: the rest stays on the device
  kPartOfOptimizerAndParams,
};

// Shares of the shard on the host: a few elements, about half, nearly all.
double partial_ratio(int rule) { return std::array{0.5, 0.1, 0.8, 0.3}[rule % 4]; }

using OffloadCase = std::tuple<int, DType, int, Offload>;  // stage, precision, rule, offload

Config case_config(int stage, DType dtype) {
  Config config = toy_config(stage, dtype);
  config.gradient_clipping = 1.0;
  return config;
}

struct Trained {
  std::vector<float> master;
  std::vector<char> model;  ///< every trainable parameter as the model sees it
  double loss_scale = 0.0;
  double grad_norm = 0.0;
  int updates = 0;
  std::int64_t host_master_bytes = 0;  ///< where an offloaded update keeps its fp32 copy
  std::int64_t nvme_param_bytes = 0;   ///< the parameter shard's swap file
};

Trained train(Config config, int rule) {
  Engine engine = make_engine(std::move(config), rule_cases()[rule].make());
  const int slow_group = add_slow_group(engine);
  const auto tensors = uneven_toy_tensors();
  const auto handles = register_toy(engine, tensors, slow_group);
  Trained result;
  for (std::int64_t step = 0; step < 8; ++step) {
    toy_micro_step_any_precision(engine, tensors, handles, step);
    result.updates += engine.step().updated ? 1 : 0;
  }
  result.master = engine.consolidated_parameters();
  result.model = model_bytes(engine, tensors, handles);
  result.loss_scale = engine.loss_scale();
  result.grad_norm = engine.global_grad_norm();
  const MemoryReport report = engine.memory_report();
  result.host_master_bytes =
      report.at(MemoryCategory::kMasterWeights, MemoryLocation::kHost).current;
  result.nvme_param_bytes = report.at(MemoryCategory::kParameters, MemoryLocation::kNvme).current;
  return result;
}

class OffloadEquivalence : public ::testing::TestWithParam<OffloadCase> {};

TEST_P(OffloadEquivalence, TrainsBitForBitAsWithoutOffload) {
  const auto [stage, dtype, rule, offload] = GetParam();
  const Config resident = case_config(stage, dtype);
  Config offloaded = resident;
  offloaded.zero_optimization.offload_optimizer.device = OffloadDevice::kCpu;
  if (offload == Offload::kOptimizerAndParams || offload == Offload::kPartOfOptimizerAndParams) {
    offloaded.zero_optimization.offload_param.device = OffloadDevice::kCpu;
  }
  if (offload == Offload::kPartOfOptimizer || offload == Offload::kPartOfOptimizerAndParams) {
    offloaded.zero_optimization.offload_optimizer.ratio = partial_ratio(rule);
  }
  if (offload == Offload::kOptimizerOnNvme || offload == Offload::kAllOnNvme) {
    OffloadConfig& nvme = offloaded.zero_optimization.offload_optimizer;
    nvme.device = OffloadDevice::kNvme;
    nvme.nvme_path = nvme_test_directory();
    // Sub-groups of 24 elements cut the toy's tensors across swap records at every world size;
    // the cases walk the pipeline's shapes: one buffer (no overlap) up to reads ahead and writes
    // behind.
    offloaded.zero_optimization.sub_group_size = 24;
    nvme.buffer_count = 1 + rule % 4;
    nvme.pipeline_read = rule % 2 == 0;
    nvme.pipeline_write = stage != 2;
    nvme.fast_init = dtype == DType::kFloat16;
  }
  if (offload == Offload::kAllOnNvme) {
    OffloadConfig& params = offloaded.zero_optimization.offload_param;
    params.device = OffloadDevice::kNvme;
    params.nvme_path = nvme_test_directory();
    // Tiles of 7 to 19 elements through 1 to 3 buffers: gathers cross tiles, the cache evicts
    // changed tiles mid-update, and read-ahead competes for buffers; max_in_cpu keeps none, or
    // the first 13 elements, of the shard in CPU memory.
    params.buffer_size = 7 + 3 * rule;
    params.buffer_count = 1 + rule % 3;
    params.max_in_cpu = rule % 2 == 0 ? 0 : 13;
  }
  const Trained expected = train(resident, rule);
  const Trained actual = train(offloaded, rule);
  EXPECT_EQ(expected.updates, 4);
  EXPECT_EQ(actual.updates, expected.updates);
  EXPECT_TRUE(same_bits(actual.master, expected.master)) << "fp32 master weights differ";
  EXPECT_EQ(actual.model, expected.model) << "the parameters the model sees differ";
  EXPECT_EQ(actual.loss_scale, expected.loss_scale);
  EXPECT_EQ(actual.grad_norm, expected.grad_norm);
  // The offloaded run did offload: its update has an fp32 master of its own in host memory, even
  // for an fp32 model, whose resident update works on the parameters themselves.
  EXPECT_GT(actual.host_master_bytes, 0);
  if (dtype == DType::kFloat32 && !test_device().is_cuda()) {
    EXPECT_EQ(expected.host_master_bytes, 0);
  }
  EXPECT_EQ(actual.nvme_param_bytes > 0, offload == Offload::kAllOnNvme);
}

std::vector<OffloadCase> offload_cases() {
  std::vector<OffloadCase> cases;
  for (int stage = 1; stage <= 3; ++stage) {
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      for (int rule = 0; rule < static_cast<int>(rule_cases().size()); ++rule) {
        cases.emplace_back(stage, dtype, rule, Offload::kOptimizer);
        if (stage == 3) cases.emplace_back(stage, dtype, rule, Offload::kOptimizerAndParams);
        cases.emplace_back(stage, dtype, rule, Offload::kOptimizerOnNvme);
        if (stage == 3) cases.emplace_back(stage, dtype, rule, Offload::kAllOnNvme);
        cases.emplace_back(stage, dtype, rule, Offload::kPartOfOptimizer);
        if (stage == 3) cases.emplace_back(stage, dtype, rule, Offload::kPartOfOptimizerAndParams);
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(StagesPrecisionsRules, OffloadEquivalence,
                         ::testing::ValuesIn(offload_cases()), [](const auto& info) {
                           const OffloadCase& c = info.param;
                           return "stage" + std::to_string(std::get<0>(c)) + "_" +
                                  to_string(std::get<1>(c)) + "_" +
                                  rule_cases()[std::get<2>(c)].name +
                                  (std::get<3>(c) == Offload::kOptimizerAndParams ? "_params"
                                   : std::get<3>(c) == Offload::kOptimizerOnNvme  ? "_nvme"
                                   : std::get<3>(c) == Offload::kAllOnNvme        ? "_params_nvme"
                                   : std::get<3>(c) == Offload::kPartOfOptimizer  ? "_ratio"
                                   : std::get<3>(c) == Offload::kPartOfOptimizerAndParams
                                       ? "_ratio_params"
                                       : "");
                         });

// Partial offload: the first `ratio` of the shard (to a multiple of 16 elements) is counted in
// host memory, the rest where the device's update keeps it; on CPU ranks the device is host
// memory too, so each share is told apart by the master weights, which a resident fp32 update
// does not hold.
TEST(OffloadMemory, EachShareOfAPartialOffloadIsCountedWhereItLives) {
  for (double ratio : {0.25, 0.5, 1.0}) {
    SCOPED_TRACE("ratio " + std::to_string(ratio));
    Config config = case_config(2, DType::kBFloat16);
    config.zero_optimization.offload_optimizer.device = OffloadDevice::kCpu;
    config.zero_optimization.offload_optimizer.ratio = ratio;
    Engine engine = make_engine(config, make_adamw());
    const auto tensors = uneven_toy_tensors();
    register_toy(engine, tensors);
    const MemoryReport report = engine.memory_report();
    const std::int64_t shard = engine.shard_end() - engine.shard_begin();
    const std::int64_t host_share = detail::split_optimizer(true, ratio, shard).host;
    EXPECT_EQ(host_share % 16, 0);
    if (ratio < 1.0) {
      EXPECT_GT(host_share, 0);
      EXPECT_LT(host_share, shard);
    }
    const std::int64_t device_share = shard - host_share;
    const MemoryLocation host = MemoryLocation::kHost;
    const MemoryLocation device = engine.device().is_cuda() ? MemoryLocation::kDevice : host;
    // fp32 master 4, Adam's two states 8, bf16 gradients 2 bytes per element in either share.
    if (device == host) {
      EXPECT_EQ(report.at(MemoryCategory::kMasterWeights, host).current, 4 * shard);
      EXPECT_EQ(report.at(MemoryCategory::kOptimizerStates, host).current, 8 * shard);
    } else {
      EXPECT_EQ(report.at(MemoryCategory::kMasterWeights, host).current, 4 * host_share);
      EXPECT_EQ(report.at(MemoryCategory::kMasterWeights, device).current, 4 * device_share);
      EXPECT_EQ(report.at(MemoryCategory::kOptimizerStates, host).current, 8 * host_share);
      EXPECT_EQ(report.at(MemoryCategory::kOptimizerStates, device).current, 8 * device_share);
    }
    EXPECT_EQ(detail::EngineInternals::state(engine).optimizer().host_elements(), host_share);
    // The estimator places each share alike.
    EstimateInput in = estimate_input_from_config(config, 0, engine.world_size());
    for (const ToyTensor& t : tensors) {
      if (t.trainable) in.tensors.push_back(t.numel);
    }
    const MemoryEstimate estimated = estimate(in);
    const auto both_tiers = [&](MemoryCategory category) {
      return estimated.at(category, MemoryTier::kHost) +
             estimated.at(category, MemoryTier::kDevice);
    };
    EXPECT_EQ(estimated.at(MemoryCategory::kMasterWeights, MemoryTier::kHost), 4 * host_share);
    EXPECT_EQ(estimated.at(MemoryCategory::kMasterWeights, MemoryTier::kDevice), 4 * device_share);
    EXPECT_EQ(estimated.at(MemoryCategory::kOptimizerStates, MemoryTier::kHost), 8 * host_share);
    EXPECT_EQ(estimated.at(MemoryCategory::kOptimizerStates, MemoryTier::kDevice),
              8 * device_share);
    EXPECT_EQ(estimated.at(MemoryCategory::kGradients, MemoryTier::kHost), 2 * host_share);
    EXPECT_EQ(estimated.at(MemoryCategory::kGradients, MemoryTier::kDevice), 2 * device_share);
    if (device == host) {
      for (MemoryCategory category :
           {MemoryCategory::kMasterWeights, MemoryCategory::kOptimizerStates,
            MemoryCategory::kGradients}) {
        EXPECT_EQ(both_tiers(category), report.at(category, host).current) << to_string(category);
      }
    }
  }
}

// Where the bytes go: the optimizer shard (master, states, and the gradient shard in the type it
// accumulates in) is counted where the offloaded update runs, and the parameters the model reads
// stay with the engine.
TEST(OffloadMemory, OptimizerShardBytesFollowTheZeroOffloadLayout) {
  for (const std::string accumulation : {"", "fp32"}) {
    SCOPED_TRACE("grad_accum_dtype '" + accumulation + "'");
    Config config = case_config(2, DType::kBFloat16);
    config.grad_accum_dtype = accumulation;
    config.zero_optimization.offload_optimizer.device = OffloadDevice::kCpu;
    Engine engine = make_engine(config, make_adamw());
    const auto tensors = uneven_toy_tensors();
    register_toy(engine, tensors);
    const MemoryReport report = engine.memory_report();
    const std::int64_t shard = engine.shard_end() - engine.shard_begin();
    const MemoryLocation host = MemoryLocation::kHost;
    EXPECT_EQ(report.at(MemoryCategory::kMasterWeights, host).current, 4 * shard);
    EXPECT_EQ(report.at(MemoryCategory::kOptimizerStates, host).current, 8 * shard);
    EXPECT_EQ(report.at(MemoryCategory::kGradients, host).current,
              (accumulation.empty() ? 2 : 4) * shard);
    if (engine.device().is_cuda()) {
      const MemoryLocation device = MemoryLocation::kDevice;
      EXPECT_EQ(report.at(MemoryCategory::kMasterWeights, device).current, 0);
      EXPECT_EQ(report.at(MemoryCategory::kOptimizerStates, device).current, 0);
      EXPECT_EQ(report.at(MemoryCategory::kGradients, device).current, 0);
    }
  }
}

// Bytes of communication memory the engine holds after registration, wherever they live.
std::int64_t communication_bytes(const Config& config) {
  Engine engine = make_engine(config, make_adamw());
  register_toy(engine, uneven_toy_tensors());
  const MemoryReport report = engine.memory_report();
  return report.at(MemoryCategory::kCommunication, MemoryLocation::kHost).current +
         report.at(MemoryCategory::kCommunication, MemoryLocation::kDevice).current;
}

// The offloaded update's staging (two halves of pinned host memory between it and the device, on
// either backend) is what the estimator counts: each half the larger of a bucket's share and a
// write-back tile, here the whole 16-bit shard, of which a share is never more.
TEST(OffloadMemory, StagingIsTwoHalvesAsTheEstimatorCounts) {
  for (int stage = 1; stage <= 3; ++stage) {
    for (bool params_too : {false, true}) {
      if (params_too && stage != 3) continue;
      const Config resident = case_config(stage, DType::kBFloat16);
      Config offloaded = resident;
      offloaded.zero_optimization.offload_optimizer.device = OffloadDevice::kCpu;
      if (params_too) offloaded.zero_optimization.offload_param.device = OffloadDevice::kCpu;
      const std::int64_t measured = communication_bytes(offloaded) - communication_bytes(resident);
      const auto estimated_communication = [](const Config& config, int world) {
        EstimateInput in = estimate_input_from_config(config, 0, world);
        for (const ToyTensor& t : uneven_toy_tensors()) {
          if (t.trainable) in.tensors.push_back(t.numel);
        }
        in.frozen_params = 15;
        const MemoryEstimate e = estimate(in);
        return e.at(MemoryCategory::kCommunication, MemoryTier::kHost) +
               e.at(MemoryCategory::kCommunication, MemoryTier::kDevice);
      };
      Engine engine = make_engine(offloaded, make_adamw());
      register_toy(engine, uneven_toy_tensors());
      const int world = engine.world_size();
      const std::int64_t estimated =
          estimated_communication(offloaded, world) - estimated_communication(resident, world);
      const std::string what = "stage " + std::to_string(stage) + (params_too ? " + params" : "");
      if (params_too) {
        // Only the shares are staged: the estimate is the rank with the largest one.
        EXPECT_GT(measured, 0) << what;
        EXPECT_LE(measured, estimated) << what;
        if (world == 1) {
          EXPECT_EQ(measured, estimated) << what;
        }
      } else {
        const std::int64_t shard = engine.shard_end() - engine.shard_begin();
        EXPECT_EQ(measured, 2 * 2 * shard) << what;
        EXPECT_EQ(measured, estimated) << what;
      }
    }
  }
}

// Stage 1 with grad_accum_dtype fp32 delivers the reduced shares from its fp32 accumulator: the
// halves are sized for fp32 shares, in the engine as in the estimator.
TEST(OffloadMemory, StagingOfFp32AccumulatedSharesIsAsTheEstimatorCounts) {
  Config resident = case_config(1, DType::kBFloat16);
  resident.grad_accum_dtype = "fp32";
  Config offloaded = resident;
  offloaded.zero_optimization.offload_optimizer.device = OffloadDevice::kCpu;
  const std::int64_t measured = communication_bytes(offloaded) - communication_bytes(resident);
  Engine engine = make_engine(offloaded, make_adamw());
  register_toy(engine, uneven_toy_tensors());
  const auto estimated_communication = [&engine](const Config& config) {
    EstimateInput in = estimate_input_from_config(config, 0, engine.world_size());
    for (const ToyTensor& t : uneven_toy_tensors()) {
      if (t.trainable) in.tensors.push_back(t.numel);
    }
    in.frozen_params = 15;
    const MemoryEstimate e = estimate(in);
    return e.at(MemoryCategory::kCommunication, MemoryTier::kHost) +
           e.at(MemoryCategory::kCommunication, MemoryTier::kDevice);
  };
  // An fp32 share may be larger than the 16-bit write-back tile: the estimate is the rank with the
  // largest share.
  const std::int64_t estimated =
      estimated_communication(offloaded) - estimated_communication(resident);
  EXPECT_GT(measured, 0);
  EXPECT_LE(measured, estimated);
  if (engine.world_size() == 1) {
    EXPECT_EQ(measured, estimated);
  }
  // The shard the offloaded update reads is fp32 too.
  const std::int64_t shard = engine.shard_end() - engine.shard_begin();
  const std::int64_t whole = engine.padded_numel() * (2 + 4);
  const MemoryReport report = engine.memory_report();
  const std::int64_t gradients =
      report.at(MemoryCategory::kGradients, MemoryLocation::kHost).current +
      report.at(MemoryCategory::kGradients, MemoryLocation::kDevice).current;
  EXPECT_EQ(gradients, whole + 4 * shard);
}

TEST(OffloadKeys, MaxInCpuBelowTheShardIsRefusedByName) {
  Config config = toy_config(3);
  config.zero_optimization.offload_param.device = OffloadDevice::kCpu;
  config.zero_optimization.offload_param.max_in_cpu = 10;
  Engine engine = make_engine(config, make_adamw());
  try {
    register_toy(engine, uneven_toy_tensors());
    FAIL() << "finalize() accepted a shard larger than max_in_cpu";
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.key_path(), "zero_optimization.offload_param.max_in_cpu");
    EXPECT_NE(std::string(error.what()).find("parameter shard of"), std::string::npos)
        << error.what();
  }
}

// A shard large enough for the host's update and scan to run on a team: the team the share of
// cores gives changes where each tile runs, never a bit, and the start-up report says how many
// threads run it and why.
TEST(OffloadCores, TheShareOfCoresSetsTheTeamAndChangesNoBit) {
  const std::int64_t numel = (std::int64_t{1} << 21) * 3 + 37;
  int rank = 0;
  const auto train_large = [numel, &rank](Config config) {
    Engine engine = make_engine(std::move(config), make_adamw());
    rank = engine.rank();
    const Parameter w = engine.register_parameter("w", {numel});
    std::vector<float> values(static_cast<std::size_t>(numel));
    for (std::int64_t i = 0; i < numel; ++i) values[i] = initial_value(0, i);
    w.copy_from(values);
    for (std::int64_t step = 0; step < 3; ++step) {
      float* grad = w.grad();
      for (std::int64_t i = 0; i < numel; ++i) {
        grad[i] = toy_gradient(values[i], 0, i, engine.rank(), step);
      }
      engine.grad_ready(w);
      EXPECT_TRUE(engine.step().updated);
    }
    return std::make_pair(engine.consolidated_parameters(), engine.global_grad_norm());
  };
  Config resident = toy_config(2);
  resident.zero_optimization.reduce_bucket_size = numel;
  resident.gradient_clipping = 1.0;
  const auto expected = train_large(resident);

  std::vector<std::string> reports;
  set_log_level(LogLevel::kInfo);
  set_log_sink([&reports](const LogRecord& record) { reports.emplace_back(record.message); });
  for (const double share : {0.5, 1.0}) {
    Config offloaded = resident;
    offloaded.zero_optimization.offload_optimizer.device = OffloadDevice::kCpu;
    offloaded.zero_optimization.offload_optimizer.cpuadam_cores_perc = share;
    const auto trained = train_large(offloaded);
    EXPECT_TRUE(same_bits(trained.first, expected.first)) << "cpuadam_cores_perc " << share;
    EXPECT_EQ(trained.second, expected.second) << "cpuadam_cores_perc " << share;
  }
  set_log_sink({});
  set_log_level(LogLevel::kProgress);

  if (rank != 0) return;  // rank 0 reports for every rank
  std::vector<std::string> team_lines;
  for (const std::string& line : reports) {
    if (line.find("the offloaded update runs on the host") != std::string::npos) {
      team_lines.push_back(line);
    }
  }
  ASSERT_EQ(team_lines.size(), 2u);
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    EXPECT_NE(team_lines[0].find("cpuadam_cores_perc 0.5 of"), std::string::npos) << team_lines[0];
    EXPECT_NE(team_lines[1].find("cpuadam_cores_perc 1 of"), std::string::npos) << team_lines[1];
  } else {
    EXPECT_NE(team_lines[0].find("OMP_NUM_THREADS="), std::string::npos) << team_lines[0];
  }
}

TEST(OffloadCores, AShareOutsideZeroToOneIsRefusedByName) {
  for (const double share : {0.0, -0.5, 1.5, std::nan("")}) {
    Config config = toy_config(2);
    config.zero_optimization.offload_optimizer.device = OffloadDevice::kCpu;
    config.zero_optimization.offload_optimizer.cpuadam_cores_perc = share;
    try {
      make_engine(config, make_adamw());
      FAIL() << "cpuadam_cores_perc " << share << " was accepted";
    } catch (const ConfigError& error) {
      EXPECT_EQ(error.key_path(), "zero_optimization.offload_optimizer.cpuadam_cores_perc");
    }
  }
}

}  // namespace
}  // namespace zeroshard::testing
