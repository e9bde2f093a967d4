// The example GPT's layers: attention, block, and the whole model.
#include "torch_gpt_model.h"

#include <cmath>
#include <limits>
#include <vector>

#include "zeroshard/torch.h"  // zeroshard::torch::forward

namespace torch_gpt {

namespace {

torch::nn::LayerNorm layer_norm(std::int64_t width) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({width}));
}

}  // namespace

CausalSelfAttentionImpl::CausalSelfAttentionImpl(std::int64_t width, std::int64_t heads_)
    : heads(heads_),
      qkv(register_module("qkv", torch::nn::Linear(width, 3 * width))),
      proj(register_module("proj", torch::nn::Linear(width, width))) {}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const std::int64_t batch = x.size(0);
  const std::int64_t seq = x.size(1);
  const std::int64_t width = x.size(2);
  const std::int64_t head_width = width / heads;
  // [batch, seq, 3 * width] -> three [batch, heads, seq, head_width]
  const std::vector<torch::Tensor> parts =
      qkv(x).view({batch, seq, 3, heads, head_width}).permute({2, 0, 3, 1, 4}).unbind(0);
  torch::Tensor scores =
      torch::matmul(parts[0], parts[1].transpose(-2, -1)) / std::sqrt(double(head_width));
  const torch::Tensor future =
      torch::ones({seq, seq}, x.options().dtype(torch::kBool)).triu(/*diagonal=*/1);
  scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
  const torch::Tensor mixed = torch::matmul(torch::softmax(scores, -1), parts[2]);
  return proj(mixed.transpose(1, 2).reshape({batch, seq, width}));
}

BlockImpl::BlockImpl(std::int64_t width, std::int64_t heads)
    : attention_norm(register_module("attention_norm", layer_norm(width))),
      attention(register_module("attention", CausalSelfAttention(width, heads))),
      mlp_norm(register_module("mlp_norm", layer_norm(width))),
      mlp_in(register_module("mlp_in", torch::nn::Linear(width, 4 * width))),
      mlp_out(register_module("mlp_out", torch::nn::Linear(4 * width, width))) {}

torch::Tensor BlockImpl::forward(torch::Tensor x) {
  x = x + attention(attention_norm(x));
  return x + mlp_out(torch::gelu(mlp_in(mlp_norm(x))));
}

GptImpl::GptImpl(const GptShape& shape_)
    : shape(shape_),
      token_embedding(
          register_module("token_embedding", torch::nn::Embedding(shape.vocab, shape.width))),
      position_embedding(
          register_module("position_embedding", torch::nn::Embedding(shape.seq, shape.width))),
      blocks(register_module("blocks", torch::nn::ModuleList())),
      final_norm(register_module("final_norm", layer_norm(shape.width))),
      head(register_module("head", torch::nn::Linear(shape.width, shape.vocab))) {
  for (std::int64_t i = 0; i < shape.layers; ++i)
    blocks->push_back(Block(shape.width, shape.heads));
}

torch::Tensor GptImpl::forward(const torch::Tensor& tokens) {
  const torch::Tensor positions = torch::arange(tokens.size(1), tokens.options());
  torch::Tensor x = token_embedding(tokens) + position_embedding(positions);
  for (const auto& block : *blocks) {
    // Stage 3 gathers the block's parameters for its forward, and again for its backward.
    x = zeroshard::torch::forward(block->as<BlockImpl>(), x);
  }
  return head(final_norm(x));
}

torch::Tensor GptImpl::loss(const torch::Tensor& tokens, const torch::Tensor& targets) {
  return torch::cross_entropy_loss(forward(tokens).reshape({-1, shape.vocab}),
                                   targets.reshape({-1}));
}

std::int64_t GptImpl::parameter_count() const {
  std::int64_t count = 0;
  for (const torch::Tensor& parameter : parameters()) count += parameter.numel();
  return count;
}

Gpt make_gpt(const GptShape& shape, std::uint64_t seed) {
  torch::manual_seed(seed);
  return Gpt(shape);
}

}  // namespace torch_gpt
