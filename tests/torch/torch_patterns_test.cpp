// The training patterns of public libtorch programs, under mpirun with 1-4 ranks: every way a
// model calls a unit, several backward() calls into one step, a GAN's two optimizers (the
// generator's loss backpropagates through the discriminator), module buffers, parameters
// replaced or shared behind the optimizer's back, a scalar the ranks agree on, and tensors
// detach()ed from parameters that outlive the optimizer.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "torch_training.h"
#include "zeroshard/torch.h"

namespace torch_testing {
namespace {

// A unit called each way forward() and call() take one: a ModuleHolder member (torch::nn::Linear,
// no unit), the AnyModule children of a Sequential (units by default), and a function of a
// ModuleList child reached through its shared_ptr.
struct CallSitesImpl : torch::nn::Module {
  CallSitesImpl()
      : in(register_module("in", torch::nn::Linear(kInputs, kWidth))),
        body(register_module(
            "body", torch::nn::Sequential(torch::nn::Linear(kWidth, kWidth), torch::nn::Tanh(),
                                          torch::nn::Linear(kWidth, kWidth)))),
        blocks(register_module("blocks", torch::nn::ModuleList(Block(kWidth, 0.0)))),
        head(register_module("head", torch::nn::Linear(kWidth, kOutputs))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = zeroshard::torch::forward(in, x);
    for (auto& child : *body) x = zeroshard::torch::forward(child, x);
    const std::shared_ptr<BlockImpl> block = blocks->ptr<BlockImpl>(0);
    x = zeroshard::torch::call(
        block,
        [block](const torch::Tensor& input) {
          return input + torch::tanh(block->fc(block->norm(input)));
        },
        x);
    return zeroshard::torch::forward(head, x);
  }
  torch::nn::Linear in;
  torch::nn::Sequential body;
  torch::nn::ModuleList blocks;
  torch::nn::Linear head;
};
TORCH_MODULE(CallSites);

// The model's trainable parameters after `steps` steps: torch::optim::AdamW on the whole batch
// (stage < 0), or zeroshard at `stage` with each rank's slice.
template <class Model>
std::vector<float> train_model(int stage, int steps) {
  torch::manual_seed(7);
  Model model;
  auto communicator = Communicator::from_environment();
  const int world = stage < 0 ? 1 : communicator->size();
  const int rank = stage < 0 ? 0 : communicator->rank();
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (stage < 0) {
    optimizer = torch_optimizer("adamw", *model);
  } else {
    zeroshard::torch::OptimizerOptions options;
    options.communicator = std::move(communicator);
    optimizer = std::make_unique<zeroshard::torch::Optimizer>(
        *model, Config::from_json_string(config_json(stage, world, "adamw"), world),
        std::move(options));
  }
  const std::int64_t rows = kBatch / world;
  for (int step = 0; step < steps; ++step) {
    const Batch data = batch(step, rank * rows, (rank + 1) * rows);
    optimizer->zero_grad();
    torch::mse_loss(model->forward(data.inputs), data.targets).backward();
    optimizer->step();
  }
  if (stage < 0) return flat_parameters(*model, /*trainable_only=*/true);
  return static_cast<zeroshard::torch::Optimizer&>(*optimizer).engine().consolidated_parameters();
}

TEST(TorchPatterns, ForwardTakesHoldersSequentialChildrenAndFunctionsOfAUnit) {
  const std::vector<float> reference = train_model<CallSites>(-1, 5);
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    EXPECT_LE(max_difference(train_model<CallSites>(stage, 5), reference), kRoundingBound);
  }
}

// A Sequential called whole, as DCGAN's generator and discriminator are: at stage 3 its
// children are units, each gathered as the Sequential's own forward reaches it (a child called
// ungathered would read NaN), whether the program calls `layers->forward(x)` as with torch::optim
// or through zeroshard::torch::forward().
template <bool kThroughZeroshard>
struct WholeSequentialImpl : torch::nn::Module {
  WholeSequentialImpl()
      : layers(register_module(
            "layers", torch::nn::Sequential(torch::nn::Linear(kInputs, kWidth), torch::nn::Tanh(),
                                            torch::nn::Linear(kWidth, kOutputs)))) {}
  torch::Tensor forward(torch::Tensor x) {
    if constexpr (kThroughZeroshard) return zeroshard::torch::forward(layers, x);
    return layers->forward(x);
  }
  torch::nn::Sequential layers;
};
template <bool kThroughZeroshard>
using WholeSequential = torch::nn::ModuleHolder<WholeSequentialImpl<kThroughZeroshard>>;

// The model is the Sequential itself, the optimizer built over `*sequential`, as in DCGAN.
struct SequentialModel : torch::nn::Sequential {
  SequentialModel()
      : torch::nn::Sequential(torch::nn::Linear(kInputs, kWidth), torch::nn::Tanh(),
                              torch::nn::Linear(kWidth, kOutputs)) {}
};

TEST(TorchPatterns, ASequentialsOwnForwardGathersItsUnits) {
  const std::vector<float> reference = train_model<SequentialModel>(-1, 5);
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    EXPECT_LE(max_difference(train_model<WholeSequential<false>>(stage, 5), reference),
              kRoundingBound);
    EXPECT_LE(max_difference(train_model<WholeSequential<true>>(stage, 5), reference),
              kRoundingBound);
    EXPECT_LE(max_difference(train_model<SequentialModel>(stage, 5), reference), kRoundingBound);
  }
}

// While the optimizer lives, a unit's entry in the Sequential is the optimizer's caller, named
// and printed as the layer; afterwards the program's own entries are back and hold the values
// trained.
TEST(TorchPatterns, ASequentialGetsItsOwnEntriesBackWithTheOptimizer) {
  const int world = Communicator::from_environment()->size();
  torch::manual_seed(7);
  SequentialModel model;
  const std::shared_ptr<torch::nn::Module> first = model->named_children()["0"];
  std::ostringstream printed_before;
  first->pretty_print(printed_before);
  {
    zeroshard::torch::Optimizer optimizer(
        *model, Config::from_json_string(config_json(3, world, "adamw"), world));
    EXPECT_NE(model[0].get(), first.get());
    EXPECT_EQ(model[0]->name(), first->name());
    EXPECT_EQ(model->named_children()["0"].get(), first.get());
    std::ostringstream printed;
    model[0]->pretty_print(printed);
    EXPECT_EQ(printed.str(), printed_before.str());
    const Batch data = batch(0, 0, kBatch);
    optimizer.zero_grad();
    torch::mse_loss(model->forward(data.inputs), data.targets).backward();
    optimizer.step();
  }
  EXPECT_EQ(model[0].get(), first.get());
  EXPECT_EQ(model->ptr<torch::nn::LinearImpl>(0).get(), first.get());
  EXPECT_TRUE(model->ptr<torch::nn::LinearImpl>(0)->weight.isfinite().all().item<bool>());
}

// The rows each batch of a loader holds, batch by batch.
template <class Loader>
std::vector<torch::Tensor> batches_of(Loader& loader) {
  std::vector<torch::Tensor> batches;
  for (const auto& batch : loader) batches.push_back(batch.data.flatten());
  return batches;
}

// zeroshard::torch::make_data_loader yields, on each rank, its share of what torch's loader
// yields with a batch world times as large (the same draw: torch's generator seeded alike), so
// that no row goes to two ranks and every rank takes as many steps; on one rank, torch's batches.
// Its ranks are the optimizer's.
template <class Sampler>
void expect_rank_shares_of_torchs_loader() {
  const int world = Communicator::from_environment()->size();
  TinyNet model = make_tiny_net();
  zeroshard::torch::Optimizer optimizer(
      *model, Config::from_json_string(config_json(1, world, "adamw"), world));
  const int rank = optimizer.engine().rank();
  // 50 rows: the last draw of 4 x world rows does not split evenly among 3 or 4 ranks.
  const auto dataset = torch::data::datasets::TensorDataset(torch::arange(50).unsqueeze(1))
                           .map(torch::data::transforms::Stack<torch::data::TensorExample>());
  torch::manual_seed(3);
  auto ours = zeroshard::torch::make_data_loader<Sampler>(dataset, 4);
  const std::vector<torch::Tensor> shares = batches_of(*ours);
  torch::manual_seed(3);
  auto torchs = torch::data::make_data_loader<Sampler>(dataset, 4 * world);
  std::vector<torch::Tensor> expected;
  for (const torch::Tensor& drawn : batches_of(*torchs)) {
    const std::int64_t rows = drawn.size(0) / world;
    if (rows > 0) expected.push_back(drawn.narrow(0, rank * rows, rows));
  }
  ASSERT_EQ(shares.size(), expected.size());
  for (std::size_t b = 0; b < shares.size(); ++b) {
    EXPECT_TRUE(torch::equal(shares[b], expected[b])) << "batch " << b;
  }
  EXPECT_EQ(optimizer.mean_over_ranks(static_cast<double>(shares.size())),
            static_cast<double>(shares.size()));
}

TEST(TorchPatterns, MakeDataLoaderGivesEachRankItsShareOfTorchsBatches) {
  expect_rank_shares_of_torchs_loader<torch::data::samplers::SequentialSampler>();
  expect_rank_shares_of_torchs_loader<torch::data::samplers::RandomSampler>();
}

TEST(TorchPatterns, RankShareIsThisRanksPartOfAGlobalBatch) {
  const int world = Communicator::from_environment()->size();
  TinyNet model = make_tiny_net();
  zeroshard::torch::Optimizer optimizer(
      *model, Config::from_json_string(config_json(1, world, "adamw"), world));
  const std::int64_t rows = 10 / world, first = optimizer.engine().rank() * rows;
  EXPECT_TRUE(
      torch::equal(optimizer.rank_share(torch::arange(10)), torch::arange(first, first + rows)));
  if (world > 1) {
    try {
      optimizer.rank_share(torch::arange(world - 1));
      ADD_FAILURE() << "a batch with fewer rows than ranks was split";
    } catch (const zeroshard::UsageError& error) {
      EXPECT_NE(std::string(error.what()).find("draw at least one row per rank"), std::string::npos)
          << error.what();
    }
  }
}

// A loss computed in two halves, each backpropagated (a GAN discriminator's real and fake
// losses): autograd accumulates, and the step equals one backward of the whole.
TEST(TorchPatterns, SeveralBackwardsIntoOneStepAccumulate) {
  const std::vector<float> reference = train_torch("adamw", 10);
  const std::int64_t rows = kBatch / Communicator::from_environment()->size();
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    auto communicator = Communicator::from_environment();
    const int world = communicator->size();
    const int rank = communicator->rank();
    TinyNet model = make_tiny_net();
    zeroshard::torch::OptimizerOptions options;
    options.communicator = std::move(communicator);
    zeroshard::torch::Optimizer optimizer(
        *model, Config::from_json_string(config_json(stage, world, "adamw"), world),
        std::move(options));
    for (int step = 0; step < 10; ++step) {
      optimizer.zero_grad();
      for (int half = 0; half < 2; ++half) {
        const std::int64_t begin = rank * rows + half * rows / 2;
        const Batch data = batch(step, begin, begin + rows / 2);
        optimizer.backward(torch::mse_loss(model->forward(data.inputs), data.targets) * 0.5);
      }
      optimizer.step();
    }
    EXPECT_LE(max_difference(optimizer.engine().consolidated_parameters(), reference),
              kRoundingBound);
  }
}

// reduce_during_backward trades that for overlap: a second backward is refused at once, in the
// words of a torch program.
TEST(TorchPatterns, ReducingDuringBackwardRefusesASecondBackwardByName) {
  const int world = Communicator::from_environment()->size();
  for (int stage : {1, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    TinyNet model = make_tiny_net();
    zeroshard::torch::OptimizerOptions options;
    options.reduce_during_backward = true;
    zeroshard::torch::Optimizer optimizer(
        *model, Config::from_json_string(config_json(stage, world, "adamw"), world),
        std::move(options));
    const Batch data = batch(0, 0, kBatch / world);
    optimizer.backward(torch::mse_loss(model->forward(data.inputs), data.targets));
    try {
      optimizer.backward(torch::mse_loss(model->forward(data.inputs), data.targets));
      ADD_FAILURE() << "a second backward was accepted";
    } catch (const std::exception& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("second backward()"), std::string::npos) << message;
      EXPECT_NE(message.find("'head.bias'"), std::string::npos) << message;
      EXPECT_EQ(message.find("grad_ready"), std::string::npos) << message;
    }
    optimizer.zero_grad();
  }
}

// DCGAN's loop: the discriminator learns from a real and a fake half (two backwards), the
// generator's loss backpropagates through the discriminator, and each model's zero_grad() drops
// what the other's loss left. The same losses as torch::optim, and the discriminator's engine
// reduces nothing for the generator's step.
// The generator's layers are stage 3's units. BatchNorm (`norm`) normalises each rank's rows
// alone, as under DDP, so the one-process torch::optim run is no reference for it beyond 1 rank.
// The layer before it has no bias: BatchNorm cancels that gradient, leaving rounding noise that
// Adam would scale up to whole steps.
struct GeneratorImpl : torch::nn::Module {
  explicit GeneratorImpl(bool norm)
      : layers(register_module("layers",
                               torch::nn::Sequential(torch::nn::Linear(
                                   torch::nn::LinearOptions(kInputs, kInputs).bias(!norm))))) {
    if (norm) layers->push_back(torch::nn::BatchNorm1d(kInputs));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& layer : *layers) x = zeroshard::torch::forward(layer, x);
    return x;
  }
  torch::nn::Sequential layers;
};
TORCH_MODULE(Generator);

struct Gan {
  Generator generator{nullptr};
  TinyNet discriminator{nullptr};
};

Gan make_gan(bool norm) {
  torch::manual_seed(11);
  Gan gan;
  gan.generator = Generator(norm);
  gan.discriminator = TinyNet(kInputs, kWidth, kDepth, kOutputs, 0.0);
  return gan;
}

struct GanRun {
  std::vector<float> generator;
  std::vector<float> discriminator;
  std::int64_t reductions_for_the_generator = 0;
};

// Steps [first, first + steps); `load` and `save` name a folder of checkpoints (one per model).
GanRun train_gan(int stage, bool norm, int first = 0, int steps = 6, const std::string& load = "",
                 const std::string& save = "") {
  Gan gan = make_gan(norm);
  auto communicator = Communicator::from_environment();
  const int world = stage < 0 ? 1 : communicator->size();
  const int rank = stage < 0 ? 0 : communicator->rank();
  std::unique_ptr<torch::optim::Optimizer> optimizer_g;
  std::unique_ptr<torch::optim::Optimizer> optimizer_d;
  if (stage < 0) {
    optimizer_g = torch_optimizer("adamw", *gan.generator);
    optimizer_d = torch_optimizer("adamw", *gan.discriminator);
  } else {
    const Config config = Config::from_json_string(config_json(stage, world, "adamw"), world);
    zeroshard::torch::OptimizerOptions options_g;
    options_g.communicator = std::move(communicator);
    optimizer_g =
        std::make_unique<zeroshard::torch::Optimizer>(*gan.generator, config, std::move(options_g));
    optimizer_d = std::make_unique<zeroshard::torch::Optimizer>(*gan.discriminator, config);
    if (!load.empty()) {
      static_cast<zeroshard::torch::Optimizer&>(*optimizer_g).load_checkpoint(load + "/g");
      static_cast<zeroshard::torch::Optimizer&>(*optimizer_d).load_checkpoint(load + "/d");
    }
  }
  GanRun run;
  const auto reductions = [&] {
    if (stage < 0) return std::int64_t{0};
    const TrafficCounters& traffic =
        static_cast<zeroshard::torch::Optimizer&>(*optimizer_d).engine().communicator().traffic();
    return traffic.calls[static_cast<int>(Collective::kReduceScatter)] +
           traffic.calls[static_cast<int>(Collective::kAllReduce)];
  };
  const std::int64_t rows = kBatch / world;
  for (int step = first; step < first + steps; ++step) {
    const Batch real = batch(step, rank * rows, (rank + 1) * rows);
    const Batch noise = batch(100 + step, rank * rows, (rank + 1) * rows);
    gan.discriminator->zero_grad();
    (torch::mse_loss(gan.discriminator->forward(real.inputs), real.targets) * 0.5).backward();
    const torch::Tensor fake = gan.generator->forward(noise.inputs);
    (torch::mse_loss(gan.discriminator->forward(fake.detach()), -real.targets) * 0.5).backward();
    optimizer_d->step();

    const std::int64_t before = reductions();
    gan.generator->zero_grad();
    torch::mse_loss(gan.discriminator->forward(fake), real.targets).backward();
    optimizer_g->step();
    run.reductions_for_the_generator += reductions() - before;
  }
  if (!save.empty()) {
    static_cast<zeroshard::torch::Optimizer&>(*optimizer_g).save_checkpoint(save + "/g", "t");
    static_cast<zeroshard::torch::Optimizer&>(*optimizer_d).save_checkpoint(save + "/d", "t");
  }
  if (stage < 0) {
    run.generator = flat_parameters(*gan.generator);
    run.discriminator = flat_parameters(*gan.discriminator);
  } else {
    run.generator =
        static_cast<zeroshard::torch::Optimizer&>(*optimizer_g).engine().consolidated_parameters();
    run.discriminator =
        static_cast<zeroshard::torch::Optimizer&>(*optimizer_d).engine().consolidated_parameters();
  }
  return run;
}

TEST(TorchPatterns, AGansTwoOptimizersMatchTorchOptim) {
  const GanRun reference = train_gan(-1, false);
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const GanRun run = train_gan(stage, false);
    EXPECT_LE(max_difference(run.generator, reference.generator), kRoundingBound);
    EXPECT_LE(max_difference(run.discriminator, reference.discriminator), kRoundingBound);
    EXPECT_EQ(run.reductions_for_the_generator, 0)
        << "the discriminator's engine reduced gradients of the generator's loss";
  }
}

// DCGAN's save and resume: both optimizers and the generator's BatchNorm statistics come back, and
// the resumed run equals the run that never stopped.
TEST(TorchPatterns, AGanSavedAndResumedEqualsTheRunThatNeverStopped) {
  const int world = Communicator::from_environment()->size();
  const std::string dir =
      (std::filesystem::current_path() / ("torch_gan_np" + std::to_string(world))).string();
  for (int stage : {0, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    if (Communicator::from_environment()->rank() == 0) std::filesystem::remove_all(dir);
    MPI_Barrier(MPI_COMM_WORLD);
    const GanRun whole = train_gan(stage, true, 0, 6);
    train_gan(stage, true, 0, 3, "", dir);
    const GanRun resumed = train_gan(stage, true, 3, 3, dir);
    EXPECT_EQ(resumed.generator, whole.generator);
    EXPECT_EQ(resumed.discriminator, whole.discriminator);
  }
}

TEST(TorchPatterns, ParametersReplacedOrSharedAreNamed) {
  const int world = Communicator::from_environment()->size();
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const Config config = Config::from_json_string(config_json(stage, world, "adamw"), world);
    const auto expect_named = [](const std::function<void()>& misuse, const std::string& words) {
      try {
        misuse();
        ADD_FAILURE() << "accepted";
      } catch (const zeroshard::UsageError& error) {
        EXPECT_NE(std::string(error.what()).find(words), std::string::npos) << error.what();
      }
    };
    {
      TinyNet model = make_tiny_net();
      zeroshard::torch::Optimizer optimizer(*model, config);
      model->head->weight.set_data(torch::zeros_like(model->head->weight));
      expect_named([&] { optimizer.step(); }, "parameter 'head.weight' was given new data");
    }
    {
      TinyNet model = make_tiny_net();
      zeroshard::torch::Optimizer optimizer(*model, config);
      model->to(torch::kFloat64);
      expect_named([&] { optimizer.step(); }, "was given new data");
    }
    {
      TinyNet model = make_tiny_net();
      zeroshard::torch::Optimizer optimizer(*model, config);
      expect_named([&] { zeroshard::torch::Optimizer second(*model, config); },
                   "parameter 'embed.weight' is already trained by another");
    }
  }
}

// BatchNorm's running statistics, from each rank's own rows.
struct NormedImpl : torch::nn::Module {
  NormedImpl()
      : fc(register_module("fc", torch::nn::Linear(kInputs, kWidth))),
        norm(register_module("norm", torch::nn::BatchNorm1d(kWidth))),
        head(register_module("head", torch::nn::Linear(kWidth, kOutputs))) {}
  torch::Tensor forward(torch::Tensor x) { return head(torch::relu(norm(fc(x)))); }
  torch::nn::Linear fc;
  torch::nn::BatchNorm1d norm;
  torch::nn::Linear head;
};
TORCH_MODULE(Normed);

// The spread of `value` over the ranks (max - min).
float spread(float value) {
  float most = value;
  float least = value;
  MPI_Allreduce(MPI_IN_PLACE, &most, 1, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &least, 1, MPI_FLOAT, MPI_MIN, MPI_COMM_WORLD);
  return most - least;
}

void train_normed(Normed& model, zeroshard::torch::Optimizer& optimizer, int first, int steps) {
  const int world = optimizer.engine().world_size();
  const int rank = optimizer.engine().rank();
  const std::int64_t rows = kBatch / world;
  for (int step = first; step < first + steps; ++step) {
    const Batch data = batch(step, rank * rows, (rank + 1) * rows);
    optimizer.zero_grad();
    optimizer.backward(torch::mse_loss(model->forward(data.inputs), data.targets));
    optimizer.step();
  }
}

TEST(TorchPatterns, ModuleBuffersFollowRankZeroAsDdpsBroadcastBuffers) {
  const int world = Communicator::from_environment()->size();
  for (bool broadcast : {true, false}) {
    SCOPED_TRACE(broadcast ? "broadcast_buffers" : "own buffers");
    torch::manual_seed(3);
    Normed model;
    zeroshard::torch::OptimizerOptions options;
    options.broadcast_buffers = broadcast;
    zeroshard::torch::Optimizer optimizer(
        *model, Config::from_json_string(config_json(2, world, "adamw"), world),
        std::move(options));
    train_normed(model, optimizer, 0, 3);
    const float mean = model->norm->running_mean.sum().item<float>();
    const float variance = model->norm->running_var.sum().item<float>();
    if (broadcast || world == 1) {
      EXPECT_EQ(spread(mean), 0.0f);
      EXPECT_EQ(spread(variance), 0.0f);
    } else {
      EXPECT_GT(spread(mean), 0.0f) << "the ranks' rows should give different statistics";
    }
    EXPECT_EQ(model->norm->num_batches_tracked.item<std::int64_t>(), 3);
  }
}

TEST(TorchPatterns, ModuleBuffersAreSavedAndLoadedWithTheCheckpoint) {
  const int world = Communicator::from_environment()->size();
  const std::filesystem::path dir =
      std::filesystem::current_path() / ("torch_buffers_np" + std::to_string(world));
  for (int stage : {0, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    if (Communicator::from_environment()->rank() == 0) std::filesystem::remove_all(dir);
    MPI_Barrier(MPI_COMM_WORLD);
    torch::manual_seed(3);
    Normed model;
    zeroshard::torch::Optimizer optimizer(
        *model, Config::from_json_string(config_json(stage, world, "adamw"), world));
    train_normed(model, optimizer, 0, 2);
    optimizer.save_checkpoint(dir.string(), "two");
    const torch::Tensor saved_mean = model->norm->running_mean.clone();
    train_normed(model, optimizer, 2, 2);
    ASSERT_FALSE(torch::equal(saved_mean, model->norm->running_mean));
    optimizer.load_checkpoint(dir.string());
    EXPECT_TRUE(torch::equal(saved_mean, model->norm->running_mean));
    EXPECT_EQ(model->norm->num_batches_tracked.item<std::int64_t>(), 2);
  }
}

TEST(TorchPatterns, MeanOverRanksIsTheSameOnEveryRank) {
  const int world = Communicator::from_environment()->size();
  TinyNet model = make_tiny_net();
  zeroshard::torch::Optimizer optimizer(
      *model, Config::from_json_string(config_json(1, world, "adamw"), world));
  const double mean = optimizer.mean_over_ranks(optimizer.engine().rank());
  EXPECT_DOUBLE_EQ(mean, (world - 1) / 2.0);
}

// EMA weights and logging keep tensors detach()ed from parameters: they stay readable after the
// optimizer goes (the trained values), and at stage 3 after their unit is released (NaN then).
TEST(TorchPatterns, DetachedParametersStayValidAfterTheOptimizerGoes) {
  const int world = Communicator::from_environment()->size();
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    TinyNet model = make_tiny_net();
    torch::Tensor head;
    torch::Tensor unit_weight;
    torch::Tensor head_values;
    {
      zeroshard::torch::Optimizer optimizer(
          *model, Config::from_json_string(config_json(stage, world, "adamw"), world));
      const Batch data = batch(0, 0, kBatch / world);
      optimizer.zero_grad();
      optimizer.backward(torch::mse_loss(model->forward(data.inputs), data.targets));
      optimizer.step();
      head = model->head->weight.detach();
      head_values = head.clone();
      {
        zeroshard::torch::UnitScope scope(*model->blocks[1]);
        unit_weight = model->blocks[1]->as<BlockImpl>()->fc->weight.detach();
      }
      if (stage == 3) {
        EXPECT_TRUE(torch::isnan(unit_weight).all().item<bool>());
      }
    }
    EXPECT_TRUE(torch::equal(head, head_values));
    if (stage < 3) {
      EXPECT_TRUE(
          torch::equal(unit_weight, model->blocks[1]->as<BlockImpl>()->fc->weight.detach()));
    } else {
      EXPECT_TRUE(torch::isnan(unit_weight).all().item<bool>());
    }
  }
}

}  // namespace
}  // namespace torch_testing
