// The training loops the adapter's tests share: the zeroshard one (each rank a slice of the
// batch) and the plain torch::optim one on the whole batch, on the tiny models.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tiny_models.h"
#include "zeroshard/torch.h"

namespace torch_testing {

// Not `using namespace zeroshard`: zeroshard::torch would make every torch:: ambiguous.
using zeroshard::CheckpointInfo;
using zeroshard::Collective;
using zeroshard::Communicator;
using zeroshard::Config;
using zeroshard::Engine;
using zeroshard::MemoryCategory;
using zeroshard::MemoryReport;
using zeroshard::StepResult;
using zeroshard::TrafficCounters;

// fp32 rounding between one process summing the whole batch's gradient and N ranks summing
// slices and averaging, carried through 10 updates (AdamW, Adam at lr 1e-2, SGD at 5e-2):
// measured 1.7e-7 at most over 1-4 ranks, for parameters of magnitude up to about 1.
constexpr float kRoundingBound = 1e-6f;

inline std::unique_ptr<torch::optim::Optimizer> torch_optimizer(const std::string& rule,
                                                                torch::nn::Module& model) {
  if (rule == "adamw") {
    return std::make_unique<torch::optim::AdamW>(
        model.parameters(), torch::optim::AdamWOptions(0.01).weight_decay(0.01));
  }
  if (rule == "adam") {
    return std::make_unique<torch::optim::Adam>(model.parameters(),
                                                torch::optim::AdamOptions(0.01).weight_decay(0.01));
  }
  return std::make_unique<torch::optim::SGD>(model.parameters(),
                                             torch::optim::SGDOptions(0.05).momentum(0.9));
}

inline std::string nvme_directory() {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const auto path = std::filesystem::current_path() / ("torch_nvme_np" + std::to_string(world));
  std::filesystem::create_directories(path);
  return path.string();
}

struct Setup {
  int stage = 0;
  std::string rule = "adamw";
  std::map<std::string, std::string> zero{};
  std::string extra{};
  int steps = 10;
  int micro_batches = 1;  ///< per step(), each a slice of the rank's rows
  std::function<void(TinyNet&)> prepare{};
  std::function<void(TinyNet&, zeroshard::torch::OptimizerOptions&)> configure{};
  double dropout = 0.0;
  std::function<void()> before_forward{};  ///< called before each micro-step's forward
  /// The model, its data and the engine on the GPU Device::from_environment() picks for the rank.
  bool cuda = false;
};

inline torch::Device torch_device(const zeroshard::Device& device) {
  if (!device.is_cuda()) return torch::kCPU;
  return {torch::kCUDA, static_cast<torch::DeviceIndex>(device.index)};
}

struct TrainingRun {
  std::vector<float> parameters;  ///< the engine's fp32 master values, whole
  std::vector<double> losses;
  std::vector<StepResult> steps;
};

// What a test does to the model and optimizer after building them, and after training.
using Inspect = std::function<void(TinyNet&, zeroshard::torch::Optimizer&)>;

inline TrainingRun train_zero(const Setup& setup, const Inspect& before = {},
                              const Inspect& after = {}) {
  const zeroshard::Device device =
      setup.cuda ? zeroshard::Device::from_environment() : zeroshard::Device::cpu();
  auto communicator = Communicator::from_environment(device);
  const int world = communicator->size();
  const int rank = communicator->rank();
  TinyNet model = make_tiny_net(7, setup.dropout);
  model->to(torch_device(device));
  if (setup.prepare) setup.prepare(model);
  zeroshard::torch::OptimizerOptions options;
  options.communicator = std::move(communicator);
  if (setup.configure) setup.configure(model, options);
  zeroshard::torch::Optimizer optimizer(
      *model,
      Config::from_json_string(
          config_json(setup.stage, world, setup.rule, setup.zero, setup.extra, setup.micro_batches),
          world),
      std::move(options));
  if (before) before(model, optimizer);
  // fp32, or the 16-bit type of a bf16 or fp16 config: the inputs are cast to it, the loss is fp32.
  const torch::ScalarType dtype = model->parameters().front().scalar_type();
  const std::int64_t rows = kBatch / world;
  TrainingRun run;
  const std::int64_t micro_rows = rows / setup.micro_batches;
  for (int step = 0; step < setup.steps; ++step) {
    for (int micro = 0; micro < setup.micro_batches; ++micro) {
      const std::int64_t begin = rank * rows + micro * micro_rows;
      const Batch data = batch(step, begin, begin + micro_rows, torch_device(device));
      if (micro == 0) optimizer.zero_grad();
      if (setup.before_forward) setup.before_forward();
      const torch::Tensor loss =
          torch::mse_loss(model->forward(data.inputs.to(dtype)).to(torch::kFloat), data.targets);
      optimizer.backward(loss);
      optimizer.step();
      run.losses.push_back(loss.item<double>());
      run.steps.push_back(optimizer.last_step());
    }
  }
  if (after) after(model, optimizer);
  run.parameters = optimizer.engine().consolidated_parameters();
  return run;
}

/// `make_optimizer` replaces the rule's plain optimizer (for parameter groups, say); `prepare`
/// changes the model first (frozen parameters).
inline std::vector<float> train_torch(
    const std::string& rule, int steps,
    const std::function<std::unique_ptr<torch::optim::Optimizer>(TinyNet&)>& make_optimizer = {},
    const std::function<void(TinyNet&)>& prepare = {}, torch::Device device = torch::kCPU) {
  TinyNet model = make_tiny_net();
  model->to(device);
  if (prepare) prepare(model);
  auto optimizer = make_optimizer ? make_optimizer(model) : torch_optimizer(rule, *model);
  for (int step = 0; step < steps; ++step) {
    const Batch data = batch(step, 0, kBatch, device);
    optimizer->zero_grad();
    torch::mse_loss(model->forward(data.inputs), data.targets).backward();
    optimizer->step();
  }
  return flat_parameters(*model, /*trainable_only=*/true);
}

inline float max_difference(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float most = 0.0f;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    most = std::max(most, std::abs(a[i] - b[i]));
  }
  return most;
}

}  // namespace torch_testing
