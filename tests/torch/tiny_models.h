// Small libtorch models for the adapter's tests: a stack of residual blocks in a ModuleList (the
// blocks are stage 3's units by default), and an element-wise model for fp16, which the CPU
// builds of libtorch 1.13 cannot multiply matrices in.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "zeroshard/torch.h"

namespace torch_testing {

struct BlockImpl : torch::nn::Module {
  BlockImpl(std::int64_t width, double dropout)
      : norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        fc(register_module("fc", torch::nn::Linear(width, width))),
        dropout(dropout) {}
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor y = torch::tanh(fc(norm(x)));
    if (dropout > 0.0) y = torch::dropout(y, dropout, is_training());
    return x + y;
  }
  torch::nn::LayerNorm norm;
  torch::nn::Linear fc;
  double dropout;
};
TORCH_MODULE(Block);

/// Hook for a test: a function of the hidden state after the first block (identity by default).
using Probe = std::function<torch::Tensor(torch::Tensor)>;

struct TinyNetImpl : torch::nn::Module {
  TinyNetImpl(std::int64_t inputs, std::int64_t width, int depth, std::int64_t outputs,
              double dropout)
      : embed(register_module("embed", torch::nn::Linear(inputs, width))),
        blocks(register_module("blocks", torch::nn::ModuleList())),
        head(register_module("head", torch::nn::Linear(width, outputs))) {
    for (int i = 0; i < depth; ++i) blocks->push_back(Block(width, dropout));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = embed(x);
    for (std::size_t i = 0; i < blocks->size(); ++i) {
      x = zeroshard::torch::forward(blocks[i]->as<BlockImpl>(), x);
      if (i == 0 && probe) x = probe(x);
    }
    return head(x);
  }
  torch::nn::Linear embed;
  torch::nn::ModuleList blocks;
  torch::nn::Linear head;
  Probe probe;
};
TORCH_MODULE(TinyNet);

inline constexpr std::int64_t kInputs = 8;
inline constexpr std::int64_t kWidth = 16;
inline constexpr int kDepth = 3;
inline constexpr std::int64_t kOutputs = 4;
inline constexpr std::int64_t kBatch = 24;  ///< divides among 1-4 ranks, and again in two

/// The same initial values on every rank and in every run, and the same generator state after
/// them (the dropout masks a run draws).
inline TinyNet make_tiny_net(std::uint64_t seed = 7, double dropout = 0.0) {
  torch::manual_seed(seed);
  return TinyNet(kInputs, kWidth, kDepth, kOutputs, dropout);
}

struct Batch {
  torch::Tensor inputs;
  torch::Tensor targets;
};

/// Step `step`'s whole batch; rows [begin, end) of it for one rank. The targets are a fixed
/// function of the inputs (a random teacher layer), so that training can lower the loss.
inline Batch batch(int step, std::int64_t begin = 0, std::int64_t end = kBatch,
                   torch::Device device = torch::kCPU) {
  torch::Generator teacher = ::at::detail::createCPUGenerator(4242);
  const torch::Tensor teacher_weight = ::at::randn({kInputs, kOutputs}, teacher);
  torch::Generator generator = ::at::detail::createCPUGenerator(1000 + step);
  torch::Tensor inputs = ::at::randn({kBatch, kInputs}, generator);
  torch::Tensor targets = torch::tanh(inputs.matmul(teacher_weight));
  return {inputs.slice(0, begin, end).to(device), targets.slice(0, begin, end).to(device)};
}

/// A model's parameters, flattened in module order (the order the engine registers them).
inline std::vector<float> flat_parameters(torch::nn::Module& model, bool trainable_only = false) {
  std::vector<float> values;
  for (const torch::Tensor& parameter : model.parameters()) {
    if (trainable_only && !parameter.requires_grad()) continue;
    const torch::Tensor host = parameter.detach().to(torch::kCPU, torch::kFloat).contiguous();
    values.insert(values.end(), host.data_ptr<float>(), host.data_ptr<float>() + host.numel());
  }
  return values;
}

/// The `optimizer` section of the tests' configs for rule adamw, adam or sgd, with the options
/// of the torch::optim optimizer each is compared with.
inline std::string optimizer_json(const std::string& rule) {
  if (rule == "adamw") return R"({"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}})";
  if (rule == "adam") {
    return R"({"type": "Adam", "params": {"lr": 0.01, "weight_decay": 0.01, "adam_w_mode": false}})";
  }
  return R"({"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9}})";
}

// `zero` overrides or adds zero_optimization keys (values as JSON text); `extra` adds top-level
// keys (", \"bf16\": {...}").
inline std::string config_json(int stage, int world, const std::string& rule,
                               const std::map<std::string, std::string>& zero = {},
                               const std::string& extra = "", int micro_batches = 1) {
  std::map<std::string, std::string> keys = {{"stage", std::to_string(stage)},
                                             {"reduce_bucket_size", "500"},
                                             {"allgather_bucket_size", "500"},
                                             {"stage3_prefetch_bucket_size", "500"},
                                             {"stage3_param_persistence_threshold", "0"},
                                             // Stage 0 then sums as stages 1-3 do, bit for bit.
                                             {"reduce_scatter", "true"}};
  for (const auto& [key, value] : zero) keys[key] = value;
  std::ostringstream json;
  json << R"({"train_micro_batch_size_per_gpu": )" << kBatch / world / micro_batches
       << R"(, "gradient_accumulation_steps": )" << micro_batches
       << R"(, "gradient_clipping": 0, "optimizer": )" << optimizer_json(rule)
       << R"(, "zero_optimization": {)";
  const char* separator = "";
  for (const auto& [key, value] : keys) {
    json << separator << '"' << key << "\": " << value;
    separator = ", ";
  }
  json << "}" << extra << "}";
  return json.str();
}

}  // namespace torch_testing
