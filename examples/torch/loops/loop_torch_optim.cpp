// One training loop twice: loop_torch_optim.cpp with torch::optim::AdamW, loop_zeroshard.cpp with
// zeroshard::torch::Optimizer at the stage its config (argv[1]) picks; docs/torch.md shows the
// diff.
#include <torch/torch.h>

#include <cstdio>

struct BlockImpl : torch::nn::Module {
  BlockImpl() : fc(register_module("fc", torch::nn::Linear(64, 64))) {}
  torch::Tensor forward(const torch::Tensor& x) { return x + torch::tanh(fc(x)); }
  torch::nn::Linear fc;
};
TORCH_MODULE(Block);

struct NetImpl : torch::nn::Module {
  NetImpl()
      : embed(register_module("embed", torch::nn::Linear(32, 64))),
        blocks(register_module("blocks", torch::nn::ModuleList())),
        head(register_module("head", torch::nn::Linear(64, 8))) {
    for (int i = 0; i < 4; ++i) blocks->push_back(Block());
  }
  torch::Tensor forward(torch::Tensor x) {
    x = embed(x);
    for (const auto& block : *blocks) x = block->as<BlockImpl>()->forward(x);
    return head(x);
  }
  torch::nn::Linear embed;
  torch::nn::ModuleList blocks;
  torch::nn::Linear head;
};
TORCH_MODULE(Net);

// Inputs and the outputs of a fixed random layer, which the model learns.
struct Pairs : torch::data::datasets::Dataset<Pairs> {
  Pairs()
      : inputs(torch::randn({1024, 32})),
        targets(torch::tanh(inputs.matmul(torch::randn({32, 8})))) {}
  torch::data::Example<> get(size_t index) override { return {inputs[index], targets[index]}; }
  torch::optional<size_t> size() const override { return inputs.size(0); }
  torch::Tensor inputs, targets;
};

int main([[maybe_unused]] int argc, [[maybe_unused]] char** argv) {
  torch::manual_seed(0);
  Net model;
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
  torch::data::samplers::RandomSampler sampler(1024);
  auto loader = torch::data::make_data_loader(Pairs().map(torch::data::transforms::Stack<>()),
                                              std::move(sampler), 32);
  double first = 0.0, last = 0.0;
  for (int epoch = 0; epoch < 5; ++epoch) {
    double sum = 0.0;
    int batches = 0;
    for (auto& batch : *loader) {
      optimizer.zero_grad();
      torch::Tensor loss = torch::mse_loss(model->forward(batch.data), batch.target);
      loss.backward();
      optimizer.step();
      sum += loss.item<double>();
      ++batches;
    }
    last = sum / batches;
    if (epoch == 0) first = last;
    std::printf("epoch %d: mean loss %.5f\n", epoch, last);
  }
  return last < first ? 0 : 1;
}
