// hpZ (zero_hpz_partition_size): after a module's first gather of the step each rank keeps its
// node group's piece of it, and the module's later gathers (backward) run inside the group. The
// results equal stage 3 without it bit for bit, the backward gathers send nothing over the whole
// world, the secondary partition is counted as the estimator says, and groups that would span
// hosts are refused.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "mpi/toy_model.h"

namespace zeroshard::testing {
namespace {

constexpr const char* kKey = "zero_optimization.zero_hpz_partition_size";

// Pretends that ranks 2h and 2h+1 share host h, so that groups of 2 stay on one host, with an
// odd world's last rank alone on its host; returns the group size that fits: 2, or the world
// when it is odd (one host for everyone) so that 1 and 3 ranks test a group too.
class PretendHosts : public ::testing::Test {
 protected:
  void SetUp() override {
    world_ = Communicator::from_environment();
    rank_ = world_->rank();
    size_ = world_->size();
    const std::string host = size_ % 2 == 0 ? "host" + std::to_string(rank_ / 2) : "one-host";
    setenv("ZEROSHARD_HOST_NAME", host.c_str(), 1);
    group_ = size_ % 2 == 0 ? 2 : size_;
  }
  void TearDown() override { unsetenv("ZEROSHARD_HOST_NAME"); }

  Config config(std::int64_t group, DType dtype, bool quantized) const {
    Config c = toy_config(3);
    // Every tensor is gathered, none kept whole.
    c.zero_optimization.param_persistence_threshold = 0;
    // Nothing kept for reuse: backward gathers every module again.
    c.zero_optimization.max_reuse_distance = 0;
    c.zero_optimization.hpz_partition_size = group;
    c.zero_optimization.quantized_weights = quantized;
    c.bf16.enabled = dtype == DType::kBFloat16;
    c.fp16.enabled = dtype == DType::kFloat16;
    return c;
  }

  std::unique_ptr<Communicator> world_;
  int rank_ = 0;
  int size_ = 1;
  int group_ = 1;
};

struct TrainedRun {
  std::vector<float> master;
  std::vector<std::vector<char>> model;  // each trainable tensor's gathered bytes after training
  std::vector<double> norms;
};

TrainedRun train(const Config& config, int steps) {
  Engine engine = make_engine(config, decayed_adamw());
  const auto tensors = uneven_toy_tensors();
  const auto handles = register_toy(engine, tensors);
  TrainedRun run;
  for (int step = 0; step < steps; ++step) {
    toy_micro_step_any_precision(engine, tensors, handles, step);
    run.norms.push_back(engine.step().grad_norm);
  }
  run.master = engine.consolidated_parameters();
  const std::size_t dsize = size_of(engine.model_dtype());
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    if (!tensors[k].trainable) continue;
    auto guard = engine.gathered(handles[k].module());
    run.model.push_back(to_host(engine, handles[k].raw_data(), tensors[k].numel * dsize));
  }
  return run;
}

TEST_F(PretendHosts, TrainingEqualsStageThreeWithoutItBitForBit) {
  for (const DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (const bool quantized : {false, true}) {
      SCOPED_TRACE(std::string(to_string(dtype)) + (quantized ? " with qwZ" : ""));
      const TrainedRun plain = train(config(1, dtype, quantized), 5);
      const TrainedRun grouped = train(config(group_, dtype, quantized), 5);
      ASSERT_EQ(plain.master.size(), grouped.master.size());
      EXPECT_EQ(std::memcmp(plain.master.data(), grouped.master.data(),
                            plain.master.size() * sizeof(float)),
                0);
      EXPECT_EQ(plain.model, grouped.model);
      EXPECT_EQ(plain.norms, grouped.norms);
    }
  }
}

// Forward gathers every module over the world; backward, which gathers them again, must not
// send a byte over the world communicator's all-gather: it runs inside the groups.
TEST_F(PretendHosts, BackwardGathersSendNothingOverTheWorld) {
  for (const std::int64_t group : {std::int64_t{1}, std::int64_t{group_}}) {
    Engine engine = make_engine(config(group, DType::kFloat32, false), decayed_adamw());
    const auto tensors = uneven_toy_tensors();
    const auto handles = register_toy(engine, tensors);
    std::vector<ModuleId> order;
    for (const Parameter& p : handles) {
      if (order.empty() || order.back() != p.module()) order.push_back(p.module());
    }
    // A step first, so that the gathers of the measured one follow a recorded trace and
    // prefetch, as in training.
    toy_micro_step(engine, tensors, handles, 0);
    engine.step();
    Communicator& world = engine.communicator();
    world.reset_traffic();
    for (ModuleId m : order) {
      auto guard = engine.gathered(m);
    }
    const std::int64_t forward = world.traffic().bytes[static_cast<int>(Collective::kAllGather)];
    world.reset_traffic();
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      auto guard = engine.gathered(*it);
    }
    const std::int64_t backward = world.traffic().bytes[static_cast<int>(Collective::kAllGather)];
    if (size_ == 1) continue;
    EXPECT_GT(forward, 0) << "group " << group;
    // With one group of the whole (odd) world too: the group has a communicator of its own.
    if (group == 1) {
      EXPECT_GT(backward, 0);
    } else {
      EXPECT_EQ(backward, 0) << "group " << group;
    }
    engine.step();
  }
}

// The report's parameter peak grows by the secondary partition, exactly as the estimator's rows
// do for modules of one tensor each.
TEST_F(PretendHosts, TheSecondaryPartitionIsCountedAsTheEstimatorCountsIt) {
  const std::vector<ToyTensor> tensors = {{"a.weight", 301}, {"b.weight", 97}, {"c.weight", 64}};
  std::int64_t peak[2] = {};
  std::int64_t estimated[2] = {};
  for (const bool hpz : {false, true}) {
    const Config c = config(hpz ? group_ : 1, DType::kBFloat16, false);
    Engine engine = make_engine(c, decayed_adamw());
    const auto handles = register_toy(engine, tensors);
    for (const Parameter& p : handles) {
      auto guard = engine.gathered(p.module());
    }
    const MemoryLocation where = engine_memory(engine);
    peak[hpz] = engine.memory_report().at(MemoryCategory::kParameters, where).current;
    EstimateInput in = estimate_input_from_config(c, 0, engine.world_size());
    in.tensors = {301, 97, 64};
    const MemoryEstimate estimate = zeroshard::estimate(in);
    estimated[hpz] = estimate.at(MemoryCategory::kParameters, MemoryTier::kDevice);
  }
  const std::int64_t k = group_;
  const std::int64_t pieces =
      k == 1 ? 0 : 2 * ((301 + k - 1) / k + (97 + k - 1) / k + (64 + k - 1) / k);
  // This rank's piece is the ceiling or the floor of each tensor's share.
  EXPECT_LE(peak[1] - peak[0], pieces);
  EXPECT_GE(peak[1] - peak[0], k == 1 ? 0 : 2 * (301 / k + 97 / k + 64 / k));
  EXPECT_EQ(estimated[1] - estimated[0], pieces);
}

TEST_F(PretendHosts, AGroupSpanningHostsIsRefusedNamingTheKeyAndTheHost) {
  // Every host holds two ranks at most, or an odd world's ranks all: one more never fits.
  try {
    Engine engine = make_engine(config(group_ + 1, DType::kFloat32, false), decayed_adamw());
    register_toy(engine, uneven_toy_tensors());
    engine.finalize();
    ADD_FAILURE() << "groups of " << group_ + 1 << " were accepted";
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.key_path(), kKey);
    EXPECT_NE(std::string(error.what()).find("host '"), std::string::npos) << error.what();
  }
}

TEST(HierarchicalPartitionConfig, StageTwoIsRefusedByName) {
  Config config = toy_config(2);
  config.zero_optimization.hpz_partition_size = 2;
  try {
    Engine engine = make_engine(config, decayed_adamw());
    FAIL() << "stage 2 with zero_hpz_partition_size 2 was accepted";
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.key_path(), kKey);
  }
}

}  // namespace
}  // namespace zeroshard::testing
