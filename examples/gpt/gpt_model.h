// A small GPT written the way a user writes their model: its parameters live in a zeroshard
// Engine, its forward and backward (gpt_layers.h) run where the engine's buffers are (OpenBLAS
// on the CPU, cuBLAS and kernels on a GPU), and its head reuses the token embedding.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "gpt_layers.h"
#include "gpt_math.h"
#include "zeroshard/activation_checkpointing.h"
#include "zeroshard/engine.h"

namespace zeroshard::examples {

/// Training-time options of the model.
struct GptTraining {
  /// Checkpoint every K blocks (0 = keep every activation): runs of K blocks keep only their
  /// input and run their forward again in backward (zeroshard/activation_checkpointing.h).
  int checkpoint_every = 0;
};

/// Registers "wte.weight" [vocab, channels], "wpe.weight" [seq, channels], per block l the
/// tensors "h{l}.<block_tensor_name>" as one module "h{l}", and "ln_f.weight", "ln_f.bias", and
/// trains them one micro-batch at a time. Not copyable or movable: it holds a reference to the
/// engine and handles into it.
class GptModel {
 public:
  /// Registers the parameters and allocates activations for micro-batches of up to `max_batch`
  /// sequences through the engine (so the memory report counts them). Throws UsageError for a
  /// shape that is not positive or heads that do not divide channels. Under fp16/bf16 the layers
  /// compute in fp32 on working copies of the 16-bit parameters and gradients.
  GptModel(Engine& engine, const GptShape& shape, int max_batch, const GptTraining& training = {});
  GptModel(const GptModel&) = delete;
  GptModel& operator=(const GptModel&) = delete;

  /// GPT-2's initialisation from `seed`, identically on every rank: weights N(0, 0.02), the
  /// projections into the residual stream N(0, 0.02 / sqrt(2 layers)), biases 0, layer norms 1
  /// and 0. Collective at stage 3.
  void initialize(std::uint64_t seed);

  /// One micro-step over `batch` sequences: tokens and targets are [batch, seq] token ids (the
  /// targets the tokens shifted by one). Forward, cross-entropy, backward that adds the gradients
  /// into the engine's buffers and marks each parameter ready. Returns this rank's mean loss per
  /// token. The caller calls Engine::step() afterwards.
  double train_micro_step(const int* tokens, const int* targets, int batch);
  /// Forward only: this rank's mean loss per token over `batch` sequences (validation). Makes
  /// the same gather calls on every rank as training does.
  double evaluate(const int* tokens, const int* targets, int batch);

  const GptShape& shape() const noexcept { return shape_; }
  /// With checkpoint_every > 0: its checkpointer (profile, memory); null otherwise.
  const ActivationCheckpointer* checkpointer() const noexcept { return checkpointer_.get(); }
  /// Trainable elements of the whole model, P (the tied head adds none).
  std::int64_t parameter_count() const noexcept;
  /// Floating-point operations of one training token: 6 per parameter for the matrix products
  /// and the attention's, as PaLM's model-FLOPs count does.
  double flops_per_token() const noexcept;

 private:
  struct Block {
    ModuleId module = -1;
    BlockTensors<Parameter> params;
    /// Without checkpointing: the block's scratch (BlockScratch) and output, for max_batch.
    ActivationBuffer scratch;
    ActivationBuffer output;
  };

  void check_batch(const char* caller, const int* tokens, const int* targets, int batch) const;
  void upload(const int* tokens, const int* targets, int batch);
  BlockTensors<const float*> block_values(const Block& block);
  void embed(int batch, float* out);
  void run_block(int layer, int batch, const float* x, float* scratch, float* out);
  void backward_block(int layer, int batch, const float* x, const float* scratch);
  /// ln_f, the tied head and the loss from the last block's output; with `backward`, then the
  /// head's backward into backward_.residual.
  double head(const float* x, int batch, bool backward);
  void backward_embedding(int batch);
  double forward_backward(int batch);
  double forward_backward_checkpointed(int batch);

  /// fp32 views of the parameters: the engine's buffers under fp32; under fp16/bf16 working
  /// copies at `offset` elements into values_work_ / grads_work_ (advanced past them).
  const float* values_of(const Parameter& parameter, std::size_t& offset);
  float* begin_grad(const Parameter& parameter, std::size_t& offset);
  void end_grad(const Parameter& parameter, const float* grad);

  Engine& engine_;
  GptShape shape_;
  GptTraining training_;
  int max_batch_ = 0;
  std::unique_ptr<GptMath> math_;
  std::unique_ptr<ActivationCheckpointer> checkpointer_;

  Parameter wte_;
  Parameter wpe_;
  ModuleId wte_module_ = -1;
  ModuleId wpe_module_ = -1;
  std::vector<Block> blocks_;
  Parameter lnf_weight_;
  Parameter lnf_bias_;
  ModuleId lnf_module_ = -1;

  /// The micro-batch on the engine's device, [max_batch, seq] each, and per-token losses.
  ActivationBuffer tokens_;
  ActivationBuffer targets_;
  ActivationBuffer row_losses_;
  /// The embedding's output (without checkpointing), ln_f's output and statistics, the logits
  /// (then their gradient), and backward's working memory.
  ActivationBuffer embedded_;
  ActivationBuffer lnf_;
  ActivationBuffer lnf_stats_;
  ActivationBuffer logits_;
  ActivationBuffer d_residual_;
  ActivationBuffer d_narrow_;
  ActivationBuffer d_wide_;
  ActivationBuffer d_att_;
  BackwardBuffers<float> backward_;
  /// fp16/bf16 only: fp32 working copies of the parameters (and gradients) one layer uses.
  ActivationBuffer values_work_;
  ActivationBuffer grads_work_;
};

}  // namespace zeroshard::examples
