// An installed zeroshard::torch trains a libtorch layer one step: the package finds Torch and
// links the adapter.
#include <torch/torch.h>

#include <cstdio>

#include "zeroshard/torch.h"

int main() {
  torch::nn::Linear layer(4, 2);
  zeroshard::torch::Optimizer optimizer(
      *layer, zeroshard::Config::from_json_string(
                  R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1},
                      "optimizer": {"type": "AdamW", "params": {"lr": 0.1}}})"));
  const torch::Tensor before = layer->weight.detach().clone();
  optimizer.zero_grad();
  optimizer.backward(layer->forward(torch::ones({1, 4})).sum());
  optimizer.step();
  const bool changed = !torch::equal(before, layer->weight.detach());
  std::printf("torch consumer: %s\n", changed ? "updated" : "NOT updated");
  return changed ? 0 : 1;
}
