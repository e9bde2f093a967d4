// bf16 and fp16 through zeroshard::torch, under mpirun with 1-4 ranks: the model's parameters are
// 16-bit views of the engine's copy, the run trains, and it equals the same run through the core
// Engine API fed the same gradients, bit for bit (fp16 skipped steps included).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "tiny_models.h"
#include "zeroshard/torch.h"

namespace torch_testing {
namespace {

using zeroshard::Communicator;
using zeroshard::Config;
using zeroshard::Engine;

// x * w + b, element-wise: the fp16 model, as libtorch 1.13's CPU kernels have no fp16 matmul.
struct ScaleNetImpl : torch::nn::Module {
  ScaleNetImpl()
      : weight(register_parameter("weight", torch::ones({kInputs}) * 0.5)),
        bias(register_parameter("bias", torch::zeros({kInputs}))) {}
  torch::Tensor forward(const torch::Tensor& x) { return x * weight + bias; }
  torch::Tensor weight;
  torch::Tensor bias;
};
TORCH_MODULE(ScaleNet);

struct PrecisionRun {
  std::vector<double> losses;  ///< of the whole batch 0, before each step and after the last
  std::vector<bool> skipped;
  /// Per step, the gradient bytes autograd computed on this rank, per parameter, before the
  /// engine took them (a hook on the tensor sees them ahead of the accumulation).
  std::vector<std::vector<std::vector<char>>> gradients;
  std::vector<float> initial;
  std::vector<float> parameters;
};

std::vector<char> bytes_of(const torch::Tensor& tensor) {
  const torch::Tensor contiguous = tensor.contiguous();
  const auto* begin = static_cast<const char*>(contiguous.data_ptr());
  return std::vector<char>(begin, begin + contiguous.numel() * contiguous.element_size());
}

// What each model learns: TinyNet the batch's teacher, ScaleNet the line 2x + 0.5.
using Targets = torch::Tensor (*)(const Batch&);
torch::Tensor teacher_targets(const Batch& data) { return data.targets; }
torch::Tensor line_targets(const Batch& data) { return data.inputs * 2 + 0.5; }

template <class Model>
PrecisionRun train(Model model, Targets targets, const std::string& config_text, int steps,
                   torch::ScalarType dtype) {
  auto communicator = Communicator::from_environment();
  const int world = communicator->size();
  const int rank = communicator->rank();
  PrecisionRun run;
  run.initial = flat_parameters(*model);
  zeroshard::torch::OptimizerOptions options;
  options.communicator = std::move(communicator);
  zeroshard::torch::Optimizer optimizer(*model, Config::from_json_string(config_text, world),
                                        std::move(options));
  const std::vector<torch::Tensor> parameters = model->parameters();
  for (std::size_t p = 0; p < parameters.size(); ++p) {
    if (parameters[p].numel() > 0) {
      EXPECT_EQ(parameters[p].scalar_type(), dtype);
    }
    parameters[p].register_hook([&run, p](torch::Tensor grad) {
      run.gradients.back()[p] = bytes_of(grad);
      return grad;
    });
  }
  auto loss_of = [&](const Batch& data) {
    return torch::mse_loss(model->forward(data.inputs.to(dtype)).to(torch::kFloat), targets(data));
  };
  auto evaluate = [&] {
    torch::NoGradGuard no_grad;
    run.losses.push_back(loss_of(batch(0)).template item<double>());
  };
  const std::int64_t rows = kBatch / world;
  for (int step = 0; step < steps; ++step) {
    evaluate();
    run.gradients.emplace_back(parameters.size());
    optimizer.zero_grad();
    optimizer.backward(loss_of(batch(step, rank * rows, (rank + 1) * rows)));
    optimizer.step();
    run.skipped.push_back(optimizer.last_step().skipped);
  }
  evaluate();
  run.parameters = optimizer.engine().consolidated_parameters();
  return run;
}

// The core API with the same config, initial values and gradients.
template <class Model>
std::vector<float> replay_through_engine(Model model, const std::string& config_text,
                                         const PrecisionRun& run, std::vector<bool>& skipped) {
  auto communicator = Communicator::from_environment();
  const int world = communicator->size();
  Engine engine(Config::from_json_string(config_text, world), zeroshard::Device::cpu(),
                std::move(communicator));
  std::vector<zeroshard::Parameter> parameters;
  for (const auto& item : model->named_parameters()) {
    parameters.push_back(engine.register_parameter(item.key(), item.value().sizes().vec()));
  }
  engine.finalize();
  std::size_t offset = 0;
  for (const zeroshard::Parameter& parameter : parameters) {
    parameter.copy_from({run.initial.data() + offset, static_cast<std::size_t>(parameter.numel())});
    offset += static_cast<std::size_t>(parameter.numel());
  }
  for (const auto& gradients : run.gradients) {
    for (std::size_t p = 0; p < parameters.size(); ++p) {
      std::memcpy(parameters[p].raw_grad(), gradients[p].data(), gradients[p].size());
      engine.grad_ready(parameters[p]);
    }
    skipped.push_back(engine.step().skipped);
  }
  return engine.consolidated_parameters();
}

TEST(TorchPrecision, Bf16TrainsAndEqualsTheCoreApiWithTheSameGradients) {
  const int world = Communicator::from_environment()->size();
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const std::string config =
        config_json(stage, world, "adamw", {}, R"(, "bf16": {"enabled": true})");
    const PrecisionRun run = train(make_tiny_net(), teacher_targets, config, 20, torch::kBFloat16);
    EXPECT_LT(run.losses.back(), 0.8 * run.losses.front());
    std::vector<bool> skipped;
    EXPECT_EQ(replay_through_engine(make_tiny_net(), config, run, skipped), run.parameters);
  }
}

TEST(TorchPrecision, Fp16SkipsOverflowingStepsTrainsAndEqualsTheCoreApi) {
  const int world = Communicator::from_environment()->size();
  // 2^20: the first gradients overflow fp16, so the first steps are skipped and the scale falls;
  // the long window keeps it from growing back into overflow within the run.
  const std::string fp16 =
      R"(, "fp16": {"enabled": true, "initial_scale_power": 20, "loss_scale_window": 1000})";
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const std::string config = config_json(stage, world, "adamw", {}, fp16);
    const PrecisionRun run = train(ScaleNet(), line_targets, config, 40, torch::kHalf);
    EXPECT_TRUE(run.skipped.front()) << "2^20 times the loss should overflow fp16";
    EXPECT_FALSE(run.skipped.back());
    EXPECT_LT(run.losses.back(), 0.8 * run.losses.front());
    std::vector<bool> skipped;
    EXPECT_EQ(replay_through_engine(ScaleNet(), config, run, skipped), run.parameters);
    EXPECT_EQ(skipped, run.skipped);
  }
}

}  // namespace
}  // namespace torch_testing
