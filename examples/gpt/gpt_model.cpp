// Forward, loss and backward of the example GPT over the engine's buffers: at stage 3 each module
// is gathered for each use (the token embedding twice: for the lookup and for the tied head), and
// the tied embedding's gradient is handed over once both uses have added to it.
#include "gpt_model.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "model_init.h"
#include "zeroshard/error.h"

namespace zeroshard::examples {
namespace {

// N(0, std) by Box-Muller from two 24-bit uniforms in (0, 1], computed in double so the result
// does not depend on the float library's rounding.
std::vector<float> normal(std::int64_t count, double std, std::uint64_t& state) {
  std::vector<float> values(static_cast<std::size_t>(count));
  for (float& v : values) {
    const double u1 = (static_cast<double>(splitmix64(state) >> 40) + 1.0) * 0x1.0p-24;
    const double u2 = static_cast<double>(splitmix64(state) >> 40) * 0x1.0p-24;
    v = static_cast<float>(std * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  return values;
}

std::size_t floats(std::size_t count) { return count * sizeof(float); }

}  // namespace

GptModel::GptModel(Engine& engine, const GptShape& shape, int max_batch,
                   const GptTraining& training)
    : engine_(engine),
      shape_(shape),
      training_(training),
      max_batch_(max_batch),
      math_(make_gpt_math(engine.device())) {
  require_positive("GptModel", "vocab", shape.vocab);
  require_positive("GptModel", "layers", shape.layers);
  require_positive("GptModel", "channels", shape.channels);
  require_positive("GptModel", "heads", shape.heads);
  require_positive("GptModel", "seq", shape.seq);
  require_positive("GptModel", "max_batch", max_batch);
  if (shape.channels % shape.heads != 0) {
    throw UsageError("GptModel: heads (" + std::to_string(shape.heads) +
                     ") must divide channels (" + std::to_string(shape.channels) + ")");
  }
  if (training.checkpoint_every < 0) {
    throw UsageError("GptModel: checkpoint_every must be 0 (off) or positive, got " +
                     std::to_string(training.checkpoint_every));
  }
  engine.set_compute_stream(math_->stream());

  const std::int64_t c = shape.channels;
  wte_ = engine.register_parameter("wte.weight", {shape.vocab, c});
  wpe_ = engine.register_parameter("wpe.weight", {shape.seq, c});
  wte_module_ = engine.module("wte");
  wpe_module_ = engine.module("wpe");
  blocks_.resize(static_cast<std::size_t>(shape.layers));
  for (int l = 0; l < shape.layers; ++l) {
    Block& block = blocks_[static_cast<std::size_t>(l)];
    const std::string prefix = "h" + std::to_string(l);
    // The whole block is one module: stage 3 gathers it with one all-gather per use.
    ParamOptions options;
    options.module = prefix;
    for (int t = 0; t < kBlockTensors; ++t) {
      block.params[static_cast<std::size_t>(t)] = engine.register_parameter(
          prefix + "." + block_tensor_name(t), block_tensor_shape(t, c), options);
    }
    block.module = engine.module(prefix);
  }
  lnf_weight_ = engine.register_parameter("ln_f.weight", {c});
  lnf_bias_ = engine.register_parameter("ln_f.bias", {c});
  lnf_module_ = engine.module("ln_f");

  if (training.checkpoint_every > 0)
    checkpointer_ = std::make_unique<ActivationCheckpointer>(engine);
  const std::size_t rows = static_cast<std::size_t>(max_batch) * shape.seq;
  const std::size_t channels = static_cast<std::size_t>(c);
  tokens_ = engine.allocate_activations(rows * sizeof(int));
  targets_ = engine.allocate_activations(rows * sizeof(int));
  row_losses_ = engine.allocate_activations(rows * sizeof(double));
  if (!checkpointer_) {
    // With checkpointing the blocks allocate their activations per micro-step.
    embedded_ = engine.allocate_activations(floats(rows * channels));
    const BlockScratch scratch(shape, max_batch);
    for (Block& block : blocks_) {
      block.scratch = engine.allocate_activations(floats(scratch.total));
      block.output = engine.allocate_activations(floats(rows * channels));
    }
  }
  lnf_ = engine.allocate_activations(floats(rows * channels));
  lnf_stats_ = engine.allocate_activations(floats(rows * 2));
  logits_ = engine.allocate_activations(floats(rows * static_cast<std::size_t>(shape.vocab)));
  d_residual_ = engine.allocate_activations(floats(rows * channels));
  d_narrow_ = engine.allocate_activations(floats(rows * channels));
  d_wide_ = engine.allocate_activations(floats(rows * 4 * channels));
  d_att_ = engine.allocate_activations(
      floats(static_cast<std::size_t>(max_batch) * shape.heads * shape.seq * shape.seq));
  backward_ = {d_residual_.data(), d_narrow_.data(), d_wide_.data(), d_att_.data()};
  if (engine.model_dtype() != DType::kFloat32) {
    // The most parameters one step of forward or backward reads at once: a block, or the token
    // embedding beside the position embedding or ln_f.
    const std::int64_t most = std::max({block_numel(c), wte_.numel() + wpe_.numel(),
                                        wte_.numel() + lnf_weight_.numel() + lnf_bias_.numel()});
    values_work_ = engine.allocate_activations(floats(static_cast<std::size_t>(most)));
    grads_work_ = engine.allocate_activations(floats(static_cast<std::size_t>(most)));
  }
}

void GptModel::initialize(std::uint64_t seed) {
  std::uint64_t state = seed;
  const double residual_std = 0.02 / std::sqrt(2.0 * shape_.layers);
  wte_.copy_from(normal(wte_.numel(), 0.02, state));
  wpe_.copy_from(normal(wpe_.numel(), 0.02, state));
  auto constant = [](const Parameter& p, float value) {
    p.copy_from(std::vector<float>(static_cast<std::size_t>(p.numel()), value));
  };
  for (const Block& block : blocks_) {
    for (int t = 0; t < kBlockTensors; ++t) {
      const Parameter& p = block.params[static_cast<std::size_t>(t)];
      if (t == kLn1Weight || t == kLn2Weight) {
        constant(p, 1.0f);
      } else if (p.shape().size() == 1) {
        constant(p, 0.0f);
      } else {
        const bool projection = t == kAttnProjWeight || t == kFcProjWeight;
        p.copy_from(normal(p.numel(), projection ? residual_std : 0.02, state));
      }
    }
  }
  constant(lnf_weight_, 1.0f);
  constant(lnf_bias_, 0.0f);
}

std::int64_t GptModel::parameter_count() const noexcept {
  return static_cast<std::int64_t>(shape_.vocab + shape_.seq) * shape_.channels +
         shape_.layers * block_numel(shape_.channels) + 2 * shape_.channels;
}

double GptModel::flops_per_token() const noexcept {
  const double c = shape_.channels;
  const double matmul_weights = shape_.layers * 12.0 * c * c + shape_.vocab * c;
  return 6.0 * matmul_weights + 12.0 * shape_.layers * c * shape_.seq;
}

void GptModel::check_batch(const char* caller, const int* tokens, const int* targets,
                           int batch) const {
  if (batch <= 0 || batch > max_batch_) {
    throw UsageError(std::string("GptModel::") + caller + ": batch " + std::to_string(batch) +
                     " is outside 1.." + std::to_string(max_batch_));
  }
  const std::int64_t count = static_cast<std::int64_t>(batch) * shape_.seq;
  for (std::int64_t i = 0; i < count; ++i) {
    for (const int* ids : {tokens, targets}) {
      if (ids[i] < 0 || ids[i] >= shape_.vocab) {
        throw UsageError(std::string("GptModel::") + caller + ": token id " +
                         std::to_string(ids[i]) + " at position " + std::to_string(i) +
                         " is outside 0.." + std::to_string(shape_.vocab - 1));
      }
    }
  }
}

void GptModel::upload(const int* tokens, const int* targets, int batch) {
  const std::size_t bytes = static_cast<std::size_t>(batch) * shape_.seq * sizeof(int);
  math_->upload(tokens_.data(), tokens, bytes);
  math_->upload(targets_.data(), targets, bytes);
}

double GptModel::train_micro_step(const int* tokens, const int* targets, int batch) {
  check_batch("train_micro_step", tokens, targets, batch);
  upload(tokens, targets, batch);
  return checkpointer_ ? forward_backward_checkpointed(batch) : forward_backward(batch);
}

double GptModel::evaluate(const int* tokens, const int* targets, int batch) {
  check_batch("evaluate", tokens, targets, batch);
  upload(tokens, targets, batch);
  // Two output buffers in turn and one scratch: no activation is kept for a backward.
  const std::size_t rows = static_cast<std::size_t>(batch) * shape_.seq;
  ActivationBuffer a = engine_.allocate_activations(floats(rows * shape_.channels));
  ActivationBuffer b = engine_.allocate_activations(floats(rows * shape_.channels));
  ActivationBuffer scratch =
      engine_.allocate_activations(floats(BlockScratch(shape_, batch).total));
  embed(batch, a.data());
  for (int l = 0; l < shape_.layers; ++l) {
    run_block(l, batch, a.data(), scratch.data(), b.data());
    std::swap(a, b);
  }
  return head(a.data(), batch, false);
}

double GptModel::forward_backward(int batch) {
  embed(batch, embedded_.data());
  const float* x = embedded_.data();
  for (int l = 0; l < shape_.layers; ++l) {
    Block& block = blocks_[static_cast<std::size_t>(l)];
    run_block(l, batch, x, block.scratch.data(), block.output.data());
    x = block.output.data();
  }
  const double loss = head(x, batch, true);
  for (int l = shape_.layers - 1; l >= 0; --l) {
    const float* input = l == 0 ? embedded_.data() : blocks_[l - 1].output.data();
    backward_block(l, batch, input, blocks_[static_cast<std::size_t>(l)].scratch.data());
  }
  backward_embedding(batch);
  return loss;
}

// The same arithmetic as forward_backward in the same order, so the gradients are bit-identical:
// each run of checkpoint_every blocks keeps its input only and runs again before its backward.
// A block's activations are allocated as scratch, then output, so a run of K blocks leaves
// activation(2 i) = block i's scratch and activation(2 i + 1) = its output.
double GptModel::forward_backward_checkpointed(int batch) {
  const int layers = shape_.layers;
  const int every = training_.checkpoint_every;
  const std::size_t rows = static_cast<std::size_t>(batch) * shape_.seq;
  const std::size_t scratch_bytes = floats(BlockScratch(shape_, batch).total);
  const std::size_t output_bytes = floats(rows * shape_.channels);
  ActivationBuffer x = engine_.allocate_activations(output_bytes);
  embed(batch, x.data());
  for (int first = 0; first < layers; first += every) {
    const int end = std::min(first + every, layers);
    x = checkpointer_->checkpoint(std::move(x), [&, first, end](BlockContext& ctx) {
      const float* in = ctx.input().data();
      for (int l = first; l < end; ++l) {
        float* scratch = ctx.allocate(scratch_bytes);
        float* out = ctx.allocate(output_bytes);
        run_block(l, batch, in, scratch, out);
        in = out;
      }
    });
  }
  const double loss = head(x.data(), batch, true);
  x = ActivationBuffer();
  for (int first = (layers - 1) / every * every; first >= 0; first -= every) {
    const int end = std::min(first + every, layers);
    checkpointer_->backward([&, first, end](BlockContext& ctx) {
      for (int l = end - 1; l >= first; --l) {
        const int i = l - first;
        const float* input = l == first ? ctx.input().data() : ctx.activation(2 * i - 1);
        backward_block(l, batch, input, ctx.activation(2 * i));
      }
    });
  }
  backward_embedding(batch);
  return loss;
}

void GptModel::embed(int batch, float* out) {
  const Engine::GatheredModule te = engine_.gathered(wte_module_);
  const Engine::GatheredModule pe = engine_.gathered(wpe_module_);
  std::size_t offset = 0;
  const float* wte = values_of(wte_, offset);
  const float* wpe = values_of(wpe_, offset);
  math_->embedding_forward(reinterpret_cast<const int*>(tokens_.data()), wte, wpe, out, batch,
                           shape_.seq, shape_.channels);
}

BlockTensors<const float*> GptModel::block_values(const Block& block) {
  BlockTensors<const float*> values;
  std::size_t offset = 0;
  for (std::size_t t = 0; t < values.size(); ++t) values[t] = values_of(block.params[t], offset);
  return values;
}

void GptModel::run_block(int layer, int batch, const float* x, float* scratch, float* out) {
  const Block& block = blocks_[static_cast<std::size_t>(layer)];
  const Engine::GatheredModule gathered = engine_.gathered(block.module);
  block_forward(*math_, shape_, batch, block_values(block), x, scratch, out);
}

void GptModel::backward_block(int layer, int batch, const float* x, const float* scratch) {
  const Block& block = blocks_[static_cast<std::size_t>(layer)];
  const Engine::GatheredModule gathered = engine_.gathered(block.module);
  const BlockTensors<const float*> values = block_values(block);
  BlockTensors<float*> grads;
  std::size_t offset = 0;
  for (std::size_t t = 0; t < grads.size(); ++t) grads[t] = begin_grad(block.params[t], offset);
  block_backward(*math_, shape_, batch, values, grads, x, scratch, backward_);
  // Marked while the module is still gathered, so stage 3 can reduce-scatter straight from it.
  for (std::size_t t = 0; t < grads.size(); ++t) {
    end_grad(block.params[t], grads[t]);
    engine_.grad_ready(block.params[t]);
  }
}

double GptModel::head(const float* x, int batch, bool backward) {
  // The head's second use of the token embedding: gathered again at stage 3.
  const Engine::GatheredModule lnf = engine_.gathered(lnf_module_);
  const Engine::GatheredModule te = engine_.gathered(wte_module_);
  std::size_t offset = 0;
  const float* lnf_weight = values_of(lnf_weight_, offset);
  const float* lnf_bias = values_of(lnf_bias_, offset);
  const float* wte = values_of(wte_, offset);
  head_forward(*math_, shape_, batch, lnf_weight, lnf_bias, wte, x, lnf_.data(), lnf_stats_.data(),
               logits_.data());
  const int rows = batch * shape_.seq;
  const auto* targets = reinterpret_cast<const int*>(targets_.data());
  auto* row_losses = reinterpret_cast<double*>(row_losses_.data());
  if (!backward) {
    return math_->cross_entropy_loss(logits_.data(), targets, row_losses, rows, shape_.vocab);
  }
  // Under fp16 the engine asks for the loss to be scaled before backward; 1 otherwise.
  const float grad_scale = static_cast<float>(engine_.loss_scale()) / static_cast<float>(rows);
  const double loss =
      math_->cross_entropy(logits_.data(), targets, row_losses, rows, shape_.vocab, grad_scale);

  std::size_t grad_offset = 0;
  float* dlnf_weight = begin_grad(lnf_weight_, grad_offset);
  float* dlnf_bias = begin_grad(lnf_bias_, grad_offset);
  float* dwte = begin_grad(wte_, grad_offset);
  head_backward(*math_, shape_, batch, lnf_weight, wte, x, lnf_.data(), lnf_stats_.data(),
                logits_.data(), dwte, dlnf_weight, dlnf_bias, backward_);
  end_grad(lnf_weight_, dlnf_weight);
  end_grad(lnf_bias_, dlnf_bias);
  // wte's gradient is not complete until the embedding's backward adds its share.
  end_grad(wte_, dwte);
  engine_.grad_ready(lnf_weight_);
  engine_.grad_ready(lnf_bias_);
  return loss;
}

void GptModel::backward_embedding(int batch) {
  std::size_t offset = 0;
  float* dwte = begin_grad(wte_, offset);
  float* dwpe = begin_grad(wpe_, offset);
  math_->embedding_backward(backward_.residual, reinterpret_cast<const int*>(tokens_.data()), dwte,
                            dwpe, batch, shape_.seq, shape_.channels, shape_.vocab);
  end_grad(wte_, dwte);
  end_grad(wpe_, dwpe);
  engine_.grad_ready(wpe_);
  engine_.grad_ready(wte_);
}

// The only places the model reads parameter memory or writes gradient memory. Under fp16/bf16
// the engine's buffers are 16-bit: the layers run on fp32 working copies, so every product and
// sum stays fp32 whatever the precision.
const float* GptModel::values_of(const Parameter& parameter, std::size_t& offset) {
  if (parameter.dtype() == DType::kFloat32) return parameter.data();
  float* work = values_work_.data() + offset;
  offset += static_cast<std::size_t>(parameter.numel());
  math_->convert(parameter.raw_data(), parameter.dtype(), work, DType::kFloat32, parameter.numel());
  return work;
}

float* GptModel::begin_grad(const Parameter& parameter, std::size_t& offset) {
  if (parameter.dtype() == DType::kFloat32) return parameter.grad();
  float* work = grads_work_.data() + offset;
  offset += static_cast<std::size_t>(parameter.numel());
  math_->convert(parameter.raw_grad(), parameter.dtype(), work, DType::kFloat32, parameter.numel());
  return work;
}

void GptModel::end_grad(const Parameter& parameter, const float* grad) {
  if (parameter.dtype() == DType::kFloat32) return;
  math_->convert(grad, DType::kFloat32, parameter.raw_grad(), parameter.dtype(), parameter.numel());
}

}  // namespace zeroshard::examples
