// The two ways the example trains its model, behind the same three verbs so that one loop runs
// both: zeroshard::torch::Optimizer (the engine shards the update) and torch::optim::AdamW with
// gradients averaged over the ranks, for comparison.
#pragma once

#include <torch/torch.h>

#include <utility>

#include "zeroshard/torch.h"

namespace torch_gpt {

/// A training loop's steps are zero_grad(); per micro-step backward(loss) then step().
class ZeroshardTrainer {
 public:
  ZeroshardTrainer(torch::nn::Module& model, const zeroshard::Config& config)
      : optimizer_(model, config, options_for(config)) {}
  void zero_grad() { optimizer_.zero_grad(); }
  void backward(const torch::Tensor& loss) { optimizer_.backward(loss); }
  void step() { optimizer_.step(); }
  zeroshard::torch::Optimizer& optimizer() { return optimizer_; }

 private:
  // The blocks are the units; a config whose activation_checkpointing section asks for anything
  // checkpoints them.
  static zeroshard::torch::OptimizerOptions options_for(const zeroshard::Config& config) {
    const zeroshard::ActivationCheckpointingConfig& checkpointing = config.activation_checkpointing;
    zeroshard::torch::OptimizerOptions options;
    options.checkpoint_units = checkpointing.partition_activations ||
                               checkpointing.cpu_checkpointing ||
                               checkpointing.contiguous_memory_optimization ||
                               checkpointing.number_checkpoints.has_value();
    return options;
  }

  zeroshard::torch::Optimizer optimizer_;
};

/// torch::optim::AdamW with the config's lr, betas, eps and weight decay. At an accumulation
/// boundary step() does what DDP and the engine do before the update: the gradients become their
/// mean over the ranks' micro-batches (all-reduced over `communicator`), clipped to the config's
/// gradient_clipping.
class TorchTrainer {
 public:
  TorchTrainer(torch::nn::Module& model, const zeroshard::Config& config,
               zeroshard::Communicator& communicator);
  void zero_grad() { optimizer_.zero_grad(); }
  void backward(const torch::Tensor& loss) { loss.backward(); }
  void step();

 private:
  void average_gradients();

  std::vector<torch::Tensor> parameters_;
  zeroshard::Communicator& communicator_;
  int accumulation_;
  int micro_step_ = 0;
  double clip_;
  torch::optim::AdamW optimizer_;
};

}  // namespace torch_gpt
