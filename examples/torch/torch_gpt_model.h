// The example's character-level GPT written with torch::nn layers, as a libtorch user would: its
// transformer blocks sit in a ModuleList and are called through zeroshard::torch::forward(), the
// one change ZeRO stage 3 asks of a model (its parameters are gathered around each block).
#pragma once

#include <torch/torch.h>

#include <cstdint>

// Not inside namespace zeroshard: there `torch::` would name zeroshard::torch, and TORCH_MODULE
// must be used outside it.
namespace torch_gpt {

struct GptShape {
  std::int64_t vocab = 0;  ///< 0 until the corpus says
  std::int64_t layers = 4;
  std::int64_t width = 64;
  std::int64_t heads = 4;
  std::int64_t seq = 64;
};

/// Multi-head self-attention in which position t sees positions 0..t only.
struct CausalSelfAttentionImpl : torch::nn::Module {
  CausalSelfAttentionImpl(std::int64_t width, std::int64_t heads);
  torch::Tensor forward(const torch::Tensor& x);

  std::int64_t heads;
  torch::nn::Linear qkv;
  torch::nn::Linear proj;
};
TORCH_MODULE(CausalSelfAttention);

/// Pre-norm transformer block: x + attention(norm(x)), then x + MLP(norm(x)).
struct BlockImpl : torch::nn::Module {
  BlockImpl(std::int64_t width, std::int64_t heads);
  torch::Tensor forward(torch::Tensor x);

  torch::nn::LayerNorm attention_norm;
  CausalSelfAttention attention;
  torch::nn::LayerNorm mlp_norm;
  torch::nn::Linear mlp_in;
  torch::nn::Linear mlp_out;
};
TORCH_MODULE(Block);

struct GptImpl : torch::nn::Module {
  explicit GptImpl(const GptShape& shape);
  /// tokens [batch, seq] (int64) -> logits [batch, seq, vocab].
  torch::Tensor forward(const torch::Tensor& tokens);
  /// The mean cross-entropy of predicting `targets` [batch, seq], in nats per token.
  torch::Tensor loss(const torch::Tensor& tokens, const torch::Tensor& targets);
  std::int64_t parameter_count() const;

  GptShape shape;
  torch::nn::Embedding token_embedding;
  torch::nn::Embedding position_embedding;
  torch::nn::ModuleList blocks;  ///< stage 3's units: the children of a ModuleList by default
  torch::nn::LayerNorm final_norm;
  torch::nn::Linear head;
};
TORCH_MODULE(Gpt);

/// The same initial weights on every rank (the optimizer requires it) and in every run.
Gpt make_gpt(const GptShape& shape, std::uint64_t seed);

}  // namespace torch_gpt
