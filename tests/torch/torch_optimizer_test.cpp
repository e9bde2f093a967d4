// zeroshard::torch::Optimizer against torch::optim, run under mpirun with 1-4 ranks: each rank
// trains on its slice of the batch; the sharded result must equal torch's on the whole batch to
// rounding, and every stage, offload and precision must equal its reference as stated per test.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "torch_training.h"
#include "zeroshard/communicator_mpi.h"
#include "zeroshard/torch.h"

namespace torch_testing {
namespace {

TEST(TorchOptimizer, MatchesTorchOptimAndStagesOneToThreeEqualStageZeroBitForBit) {
  for (const std::string rule : {"adamw", "adam", "sgd"}) {
    SCOPED_TRACE(rule);
    const std::vector<float> reference = train_torch(rule, 10);
    const TrainingRun stage0 = train_zero({.stage = 0, .rule = rule});
    EXPECT_LE(max_difference(stage0.parameters, reference), kRoundingBound);
    for (int stage = 1; stage <= 3; ++stage) {
      SCOPED_TRACE("stage " + std::to_string(stage));
      EXPECT_EQ(train_zero({.stage = stage, .rule = rule}).parameters, stage0.parameters);
    }
  }
}

TEST(TorchOptimizer, OffloadEqualsNoOffloadBitForBit) {
  const std::string cpu = R"({"device": "cpu"})";
  const std::string nvme = R"({"device": "nvme", "nvme_path": ")" + nvme_directory() + R"("})";
  const std::vector<float> stage2 = train_zero({.stage = 2}).parameters;
  const std::vector<float> stage3 = train_zero({.stage = 3}).parameters;
  EXPECT_EQ(train_zero({.stage = 2, .zero = {{"offload_optimizer", cpu}}}).parameters, stage2);
  EXPECT_EQ(train_zero({.stage = 3, .zero = {{"offload_optimizer", cpu}, {"offload_param", cpu}}})
                .parameters,
            stage3);
  EXPECT_EQ(train_zero({.stage = 3, .zero = {{"offload_optimizer", nvme}, {"offload_param", nvme}}})
                .parameters,
            stage3);
}

// Identity whose backward calls `seen`: placed after the first block, it runs once every later
// layer's gradients are complete and before the first block's.
struct Probe : public torch::autograd::Function<Probe> {
  static torch::Tensor forward(torch::autograd::AutogradContext* context, torch::Tensor x,
                               std::int64_t seen) {
    context->saved_data["seen"] = seen;
    return x;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* context,
                                                 torch::autograd::variable_list grads) {
    (*reinterpret_cast<std::function<void()>*>(context->saved_data["seen"].toInt()))();
    return {grads.at(0), torch::Tensor()};
  }
};

std::int64_t reductions(const Communicator& communicator) {
  const TrafficCounters& traffic = communicator.traffic();
  return traffic.calls[static_cast<int>(Collective::kReduceScatter)] +
         traffic.calls[static_cast<int>(Collective::kAllReduce)];
}

// With reduce_during_backward (by default gradients wait in .grad() for step()).
TEST(TorchOptimizer, Stage2StartsABucketsReductionBeforeBackwardEnds) {
  std::int64_t before_backward = 0;
  std::int64_t in_backward = -1;
  std::function<void()> seen;
  const Inspect install = [&](TinyNet& model, zeroshard::torch::Optimizer& optimizer) {
    seen = [&] { in_backward = reductions(optimizer.engine().communicator()); };
    model->probe = [&](torch::Tensor x) {
      before_backward = reductions(optimizer.engine().communicator());
      return Probe::apply(x, reinterpret_cast<std::int64_t>(&seen));
    };
  };
  // 100-element buckets: the head's and the last blocks' gradients fill several.
  train_zero({.stage = 2,
              .zero = {{"reduce_bucket_size", "100"}},
              .steps = 1,
              .configure =
                  [](TinyNet&, zeroshard::torch::OptimizerOptions& options) {
                    options.reduce_during_backward = true;
                  }},
             install);
  EXPECT_GT(in_backward, before_backward)
      << "no gradient reduction started while backward was still running";
}

TEST(TorchOptimizer, Stage3HoldsTheShardPlusTheWindowAndEmptiesParametersOutsideUnits) {
  const Inspect check = [](TinyNet& model, zeroshard::torch::Optimizer& optimizer) {
    Engine& engine = optimizer.engine();
    const MemoryReport report = engine.memory_report();
    const std::int64_t shard_bytes = (engine.shard_end() - engine.shard_begin()) * 4;
    const std::int64_t window = engine.peak_gathered_bytes();
    EXPECT_LE(report.at(MemoryCategory::kParameters, engine.memory_location()).peak,
              shard_bytes + window);
    // No prefetch and no reuse: at most the parameters of no unit (embed, head) and two blocks
    // at once. Sizes from a fresh model: the trained one's blocks hold nothing now.
    TinyNet fresh = make_tiny_net();
    auto bytes_of = [](torch::nn::Module& module) {
      std::int64_t numel = 0;
      for (const auto& parameter : module.parameters()) numel += (parameter.numel() + 15) / 16 * 16;
      return numel * 4;
    };
    const std::int64_t no_unit = bytes_of(*fresh->embed) + bytes_of(*fresh->head);
    EXPECT_LE(window, no_unit + 2 * bytes_of(*fresh->blocks[0]));
    EXPECT_LT(window, engine.padded_numel() * 4);

    BlockImpl& block = *model->blocks[1]->as<BlockImpl>();
    EXPECT_EQ(block.fc->weight.numel(), 0) << "a unit's parameter outside its forward";
    const torch::Tensor x = torch::ones({2, kWidth});
    EXPECT_THROW(block.forward(x), c10::Error);
    EXPECT_EQ(zeroshard::torch::forward(&block, x).sizes(), x.sizes());
    EXPECT_GT(model->embed->weight.numel(), 0) << "parameters of no unit stay gathered";
  };
  train_zero({.stage = 3,
              .zero = {{"stage3_prefetch_bucket_size", "0"}, {"stage3_max_reuse_distance", "0"}},
              .steps = 3},
             {}, check);
}

// torch's StepLR writes the groups' lr; each step() hands it to the engine.
TEST(TorchOptimizer, TorchLrSchedulerDrivesTheEngine) {
  const Inspect check = [](TinyNet&, zeroshard::torch::Optimizer& optimizer) {
    torch::optim::StepLR scheduler(optimizer, /*step_size=*/2, /*gamma=*/0.5);
    // The same schedule on a plain torch optimizer gives the lr each update must use.
    torch::Tensor weight = torch::zeros({1}, torch::requires_grad());
    torch::optim::SGD reference({weight}, torch::optim::SGDOptions(0.01));
    torch::optim::StepLR reference_scheduler(reference, 2, 0.5);
    for (int step = 0; step < 5; ++step) {
      scheduler.step();
      reference_scheduler.step();
      optimizer.zero_grad();
      optimizer.step();
      EXPECT_DOUBLE_EQ(optimizer.last_step().lr, reference.param_groups()[0].options().get_lr());
      EXPECT_DOUBLE_EQ(optimizer.param_groups()[0].options().get_lr(), optimizer.last_step().lr);
    }
    EXPECT_LT(optimizer.last_step().lr, 0.01);
  };
  train_zero({.stage = 1, .steps = 1}, {}, check);
}

// Save at 4 ranks after 3 steps, resume at 2 for 3 more: equal to 6 steps at 4 ranks (to the
// rounding of a batch summed in halves instead of quarters).
TEST(TorchOptimizer, SavedAtFourRanksResumesAtTwo) {
  int world = 1;
  int rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (world != 4) GTEST_SKIP() << "needs 4 ranks";
  const std::string dir = (std::filesystem::current_path() / "torch_resume_checkpoint").string();
  if (rank == 0) std::filesystem::remove_all(dir);
  MPI_Barrier(MPI_COMM_WORLD);

  const std::vector<float> straight = train_zero({.stage = 3, .steps = 6}).parameters;
  train_zero({.stage = 3, .steps = 3}, {}, [&](TinyNet&, zeroshard::torch::Optimizer& optimizer) {
    optimizer.save_checkpoint(dir, "step3", "after three steps");
  });

  MPI_Comm half = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, rank < 2 ? 0 : 1, rank, &half);
  if (rank < 2) {
    TinyNet model = make_tiny_net(/*seed=*/99);  // other values: the checkpoint must replace them
    zeroshard::torch::OptimizerOptions options;
    options.communicator = Communicator::from_mpi(half);
    zeroshard::torch::Optimizer optimizer(
        *model, Config::from_json_string(config_json(2, 2, "adamw"), 2), std::move(options));
    const CheckpointInfo info = optimizer.load_checkpoint(dir);
    EXPECT_EQ(info.global_step, 3);
    EXPECT_EQ(info.user_state, "after three steps");
    for (int step = 3; step < 6; ++step) {
      const Batch data = batch(step, rank * kBatch / 2, (rank + 1) * kBatch / 2);
      optimizer.zero_grad();
      optimizer.backward(torch::mse_loss(model->forward(data.inputs), data.targets));
      optimizer.step();
    }
    EXPECT_LE(max_difference(optimizer.engine().consolidated_parameters(), straight),
              kRoundingBound);
  }
  MPI_Comm_free(&half);
}

}  // namespace
}  // namespace torch_testing
