// torch::optim::AdamW set up from a zeroshard config, with the data-parallel averaging and
// clipping the engine would do, so that the two runs of the example train alike.
#include "torch_gpt_trainers.h"

#include <span>
#include <string>

namespace torch_gpt {

namespace {

torch::optim::AdamWOptions adamw_options(const zeroshard::Config& config) {
  const zeroshard::OptimizerConfig& optimizer = config.optimizer;
  if (optimizer.type != "adamw") {
    throw zeroshard::UsageError(
        "--torch-optim runs torch::optim::AdamW; the config's optimizer is '" + optimizer.type +
        "'");
  }
  const auto param = [&](const char* key, double fallback) {
    const auto it = optimizer.params.find(key);
    return it == optimizer.params.end() ? fallback : it->second;
  };
  // torch's defaults, which are also the engine's for AdamW.
  torch::optim::AdamWOptions options(param("lr", 1e-3));
  options.eps(param("eps", 1e-8)).weight_decay(param("weight_decay", 1e-2));
  if (const auto betas = optimizer.array_params.find("betas");
      betas != optimizer.array_params.end()) {
    options.betas({betas->second.at(0), betas->second.at(1)});
  }
  return options;
}

}  // namespace

TorchTrainer::TorchTrainer(torch::nn::Module& model, const zeroshard::Config& config,
                           zeroshard::Communicator& communicator)
    : parameters_(model.parameters()),
      communicator_(communicator),
      accumulation_(static_cast<int>(config.gradient_accumulation_steps)),
      clip_(config.gradient_clipping),
      optimizer_(parameters_, adamw_options(config)) {}

void TorchTrainer::step() {
  if (++micro_step_ < accumulation_) return;
  micro_step_ = 0;
  average_gradients();
  if (clip_ > 0.0) torch::nn::utils::clip_grad_norm_(parameters_, clip_);
  optimizer_.step();
}

void TorchTrainer::average_gradients() {
  const double ranks = static_cast<double>(communicator_.size());
  for (torch::Tensor& parameter : parameters_) {
    torch::Tensor grad = parameter.mutable_grad();
    if (!grad.defined()) continue;
    // The sum of each rank's sum over the window's micro-batches, made the mean per micro-batch.
    // The program's communicator sums host memory: a GPU's gradient goes through a host copy.
    if (ranks > 1.0) {
      torch::Tensor host = grad.to(torch::kCPU).contiguous();
      communicator_.all_reduce(
          std::span<float>(host.data_ptr<float>(), static_cast<std::size_t>(host.numel())));
      if (!host.is_same(grad)) grad.copy_(host);
    }
    grad.div_(ranks * accumulation_);
  }
}

}  // namespace torch_gpt
