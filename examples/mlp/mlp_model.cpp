// Forward, softmax cross-entropy and backward of the example MLP, with its parameters and
// gradients held by the engine (on its device) and, at stage 3, gathered one layer at a time.
#include "mlp_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "model_init.h"
#include "zeroshard/error.h"

namespace zeroshard::examples {
namespace {

// Uniform in [-bound, bound), built from 24 random bits so the float is exact.
void fill_uniform(std::vector<float>& values, float bound, std::uint64_t& state) {
  for (float& v : values) {
    const float unit = static_cast<float>(splitmix64(state) >> 40) * 0x1.0p-24f;
    v = (2.0f * unit - 1.0f) * bound;
  }
}

}  // namespace

std::vector<std::byte> MlpModel::DropoutState::save() const {
  std::vector<std::byte> state(sizeof(std::uint64_t));
  std::memcpy(state.data(), offset_, sizeof(std::uint64_t));
  return state;
}

void MlpModel::DropoutState::restore(std::span<const std::byte> state) {
  std::memcpy(offset_, state.data(), sizeof(std::uint64_t));
}

MlpModel::MlpModel(Engine& engine, const MlpShape& shape, int max_batch,
                   const MlpTraining& training)
    : engine_(engine),
      shape_(shape),
      training_(training),
      max_batch_(max_batch),
      math_(make_mlp_math(engine.device())) {
  require_positive("MlpModel", "inputs", shape.inputs);
  require_positive("MlpModel", "width", shape.width);
  require_positive("MlpModel", "layers", shape.layers);
  require_positive("MlpModel", "classes", shape.classes);
  require_positive("MlpModel", "max_batch", max_batch);
  if (training.checkpoint_every < 0) {
    throw UsageError("MlpModel: checkpoint_every must be 0 (off) or positive, got " +
                     std::to_string(training.checkpoint_every));
  }
  if (!(training.dropout >= 0.0f && training.dropout < 1.0f)) {
    throw UsageError("MlpModel: dropout must be in [0, 1), got " +
                     std::to_string(training.dropout));
  }

  engine.set_compute_stream(math_->stream());
  engine.set_grad_handover(training.grad_handover);
  const std::size_t batch = static_cast<std::size_t>(max_batch);
  if (training.checkpoint_every > 0) {
    checkpointer_ = std::make_unique<ActivationCheckpointer>(engine);
    checkpointer_->register_random_state(dropout_state_);
  } else {
    // With checkpointing the input is the first block's kept input, allocated per micro-step.
    input_ = engine.allocate_activations(batch * shape.inputs * sizeof(float));
  }
  labels_ = engine.allocate_activations(batch * sizeof(int));
  sample_losses_ = engine.allocate_activations(batch * sizeof(double));
  layers_.resize(static_cast<std::size_t>(shape.layers));
  for (int i = 0; i < shape.layers; ++i) {
    Layer& layer = layers_[static_cast<std::size_t>(i)];
    layer.in = i == 0 ? shape.inputs : shape.width;
    layer.out = i == shape.layers - 1 ? shape.classes : shape.width;
    const std::string name = "fc" + std::to_string(i);
    layer.weight = engine.register_parameter(name + ".weight", {layer.out, layer.in});
    layer.bias = engine.register_parameter(name + ".bias", {layer.out});
    layer.module = engine.module(name);
    if (!checkpointer_)
      layer.output = engine.allocate_activations(batch * layer.out * sizeof(float));
  }
  if (training.adopt_memory) {
    const std::size_t bytes =
        static_cast<std::size_t>(engine.padded_numel()) * size_of(engine.model_dtype());
    own_parameters_ = math_->allocate(bytes);
    own_gradients_ = math_->allocate(bytes);
    engine.adopt_memory({.parameters = own_parameters_.get(), .gradients = own_gradients_.get()});
  }
  const std::size_t widest = static_cast<std::size_t>(std::max(shape.width, shape.classes));
  grad_a_ = engine.allocate_activations(batch * widest * sizeof(float));
  grad_b_ = engine.allocate_activations(batch * widest * sizeof(float));
  if (engine.model_dtype() != DType::kFloat32) {
    std::size_t largest_weight = 0;
    for (const Layer& layer : layers_) {
      largest_weight = std::max(largest_weight, static_cast<std::size_t>(layer.weight.numel()));
    }
    weight_work_ = engine.allocate_activations(largest_weight * sizeof(float));
    bias_work_ = engine.allocate_activations(widest * sizeof(float));
    grad_work_ = engine.allocate_activations(largest_weight * sizeof(float));
    bias_grad_work_ = engine.allocate_activations(widest * sizeof(float));
  }
}

void MlpModel::initialize(std::uint64_t seed) {
  std::uint64_t state = seed;
  for (const Layer& layer : layers_) {
    // torch.nn.Linear: kaiming_uniform_(a=sqrt(5)) gives bound sqrt(6 / (6 fan_in)), and the
    // bias uses the same 1/sqrt(fan_in).
    const float bound = 1.0f / std::sqrt(static_cast<float>(layer.in));
    std::vector<float> weight(static_cast<std::size_t>(layer.weight.numel()));
    std::vector<float> bias(static_cast<std::size_t>(layer.bias.numel()));
    fill_uniform(weight, bound, state);
    fill_uniform(bias, bound, state);
    if (!own_parameters_) {
      layer.weight.copy_from(weight);
      layer.bias.copy_from(bias);
      continue;
    }
    // The model writes its own memory, as a trainer that reads its checkpoint into it does.
    for (const auto& [parameter, values] :
         {std::pair{&layer.weight, &weight}, {&layer.bias, &bias}}) {
      const DType dtype = engine_.model_dtype();
      std::vector<std::byte> raw(values->size() * size_of(dtype));
      convert(values->data(), DType::kFloat32, raw.data(), dtype,
              static_cast<std::int64_t>(values->size()));
      math_->upload(own(own_parameters_, *parameter), raw.data(), raw.size());
    }
  }
  // The engine takes the initial values (its master weights, stage 3's shards) from there.
  if (own_parameters_) engine_.finalize();
}

void* MlpModel::own(const std::shared_ptr<void>& block, const Parameter& parameter) const {
  return static_cast<char*>(block.get()) +
         engine_.flat_offset(parameter) * static_cast<std::int64_t>(size_of(engine_.model_dtype()));
}

void* MlpModel::data_of(const Parameter& parameter) const {
  return own_parameters_ ? own(own_parameters_, parameter) : parameter.raw_data();
}

GradTarget MlpModel::grad_of(const Parameter& parameter) const {
  // The model's own gradient memory accumulates over the window at every stage.
  if (own_gradients_) return {own(own_gradients_, parameter), true};
  return parameter.grad_target();
}

std::int64_t MlpModel::fixed_activation_bytes() const noexcept {
  std::int64_t total = 0;
  for (const ActivationBuffer* buffer :
       {&labels_, &sample_losses_, &grad_a_, &grad_b_, &weight_work_, &bias_work_, &grad_work_,
        &bias_grad_work_}) {
    total += static_cast<std::int64_t>(buffer->bytes());
  }
  return total;
}

std::int64_t MlpModel::parameter_count() const noexcept {
  std::int64_t total = 0;
  for (const Layer& layer : layers_) {
    total += static_cast<std::int64_t>(layer.out) * layer.in + layer.out;
  }
  return total;
}

float MlpModel::train_micro_step(const float* x, const int* labels, int batch) {
  if (batch <= 0 || batch > max_batch_) {
    throw UsageError("MlpModel::train_micro_step: batch " + std::to_string(batch) +
                     " is outside 1.." + std::to_string(max_batch_));
  }
  for (int i = 0; i < batch; ++i) {
    if (labels[i] < 0 || labels[i] >= shape_.classes) {
      throw UsageError("MlpModel::train_micro_step: label " + std::to_string(labels[i]) +
                       " of sample " + std::to_string(i) + " is outside 0.." +
                       std::to_string(shape_.classes - 1));
    }
  }

  if (checkpointer_) {
    input_ = engine_.allocate_activations(static_cast<std::size_t>(batch) * shape_.inputs *
                                          sizeof(float));
  }
  math_->upload(input_.data(), x, static_cast<std::size_t>(batch) * shape_.inputs * sizeof(float));
  math_->upload(labels_.data(), labels, static_cast<std::size_t>(batch) * sizeof(int));
  return checkpointer_ ? forward_backward_checkpointed(batch) : forward_backward(batch);
}

float MlpModel::loss_of(float* logits, int batch) {
  // Under fp16 the engine asks for the loss to be scaled before backward; 1 otherwise.
  const float grad_scale = static_cast<float>(engine_.loss_scale()) / static_cast<float>(batch);
  return math_->softmax_cross_entropy(logits, reinterpret_cast<const int*>(labels_.data()),
                                      reinterpret_cast<double*>(sample_losses_.data()), batch,
                                      shape_.classes, grad_scale);
}

float MlpModel::forward_backward(int batch) {
  const float* input_batch = input_.data();
  const std::size_t last = layers_.size() - 1;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const float* input = i == 0 ? input_batch : layers_[i - 1].output.data();
    forward_layer(layers_[i], input, layers_[i].output.data(), batch, i != last);
  }
  const float loss = loss_of(layers_[last].output.data(), batch);
  phase_ended(MlpPhase::kForward);

  // The last layer's output buffer now holds d(loss)/d(logits); each hidden layer's gradient
  // arrives in one ping-pong buffer and its input's gradient leaves in the other.
  const float dropout_scale = 1.0f / (1.0f - training_.dropout);
  float* output_grad = layers_[last].output.data();
  float* spare[2] = {grad_a_.data(), grad_b_.data()};
  for (std::size_t i = layers_.size(); i-- > 0;) {
    const Layer& layer = layers_[i];
    if (i != last) {
      math_->relu_backward(layer.output.data(), output_grad,
                           static_cast<std::int64_t>(batch) * layer.out, dropout_scale);
    }
    const float* input = i == 0 ? input_batch : layers_[i - 1].output.data();
    float* input_grad = i == 0 ? nullptr : spare[i % 2];
    backward_layer(layer, input, output_grad, input_grad, batch);
    output_grad = input_grad;
  }
  phase_ended(MlpPhase::kBackward);
  if (training_.grad_handover == GradHandover::kAtEnd) engine_.all_grads_ready();
  return loss;
}

// The same arithmetic as forward_backward in the same order, so the gradients are bit-identical:
// each block of checkpoint_every layers keeps its input only and runs again before its backward.
float MlpModel::forward_backward_checkpointed(int batch) {
  const int layers = shape_.layers;
  const int every = training_.checkpoint_every;
  ActivationBuffer x = std::move(input_);
  for (int first = 0; first < layers; first += every) {
    const int end = std::min(first + every, layers);
    x = checkpointer_->checkpoint(std::move(x), [this, first, end, batch](BlockContext& ctx) {
      const float* in = ctx.input().data();
      for (int i = first; i < end; ++i) {
        const Layer& layer = layers_[static_cast<std::size_t>(i)];
        float* out = ctx.allocate(static_cast<std::size_t>(batch) * layer.out * sizeof(float));
        forward_layer(layer, in, out, batch, i != shape_.layers - 1);
        in = out;
      }
    });
  }
  const float loss = loss_of(x.data(), batch);
  phase_ended(MlpPhase::kForward);

  // The loss gradient moves to the ping-pong buffer the last layer does not write, so that the
  // logits are freed before backward: the recompute then finds only the kept inputs beside it.
  const float dropout_scale = 1.0f / (1.0f - training_.dropout);
  float* spare[2] = {grad_a_.data(), grad_b_.data()};
  float* output_grad = spare[layers % 2];
  math_->copy(output_grad, x.data(), x.bytes());
  x = ActivationBuffer();
  for (int first = (layers - 1) / every * every; first >= 0; first -= every) {
    const int end = std::min(first + every, layers);
    checkpointer_->backward([&, first, end](BlockContext& ctx) {
      for (int i = end - 1; i >= first; --i) {
        const Layer& layer = layers_[static_cast<std::size_t>(i)];
        const float* output = ctx.activation(i - first);
        if (i != layers - 1) {
          math_->relu_backward(output, output_grad, static_cast<std::int64_t>(batch) * layer.out,
                               dropout_scale);
        }
        const float* input = i == first ? ctx.input().data() : ctx.activation(i - first - 1);
        float* input_grad = i == 0 ? nullptr : spare[i % 2];
        backward_layer(layer, input, output_grad, input_grad, batch);
        output_grad = input_grad;
      }
    });
  }
  phase_ended(MlpPhase::kBackward);
  if (training_.grad_handover == GradHandover::kAtEnd) engine_.all_grads_ready();
  return loss;
}

// The only places the model reads parameter memory or writes gradient memory. Under fp16/bf16
// the engine's buffers are 16-bit: the layer math runs on fp32 working copies, so the matrix
// products stay fp32 whatever the precision.
const float* MlpModel::values_of(const Parameter& parameter, const ActivationBuffer& work) {
  if (parameter.dtype() == DType::kFloat32) return static_cast<const float*>(data_of(parameter));
  math_->convert(data_of(parameter), parameter.dtype(), work.data(), DType::kFloat32,
                 parameter.numel());
  return work.data();
}

float* MlpModel::begin_grad(const Parameter& parameter, const GradTarget& target,
                            const ActivationBuffer& work) {
  if (parameter.dtype() == DType::kFloat32) return static_cast<float*>(target.data);
  if (target.accumulate) {
    math_->convert(target.data, parameter.dtype(), work.data(), DType::kFloat32, parameter.numel());
  }
  return work.data();
}

void MlpModel::end_grad(const Parameter& parameter, const GradTarget& target,
                        const ActivationBuffer& work) {
  if (parameter.dtype() == DType::kFloat32) return;
  math_->convert(work.data(), DType::kFloat32, target.data, parameter.dtype(), parameter.numel());
}

void MlpModel::forward_layer(const Layer& layer, const float* input, float* output, int batch,
                             bool relu) {
  // Stage 3 all-gathers the layer's parameters for the guard's lifetime; other stages hold them.
  const Engine::GatheredModule gathered = engine_.gathered(layer.module);
  math_->linear_forward(input, values_of(layer.weight, weight_work_),
                        values_of(layer.bias, bias_work_), output, batch, layer.in, layer.out,
                        relu);
  if (relu && training_.dropout > 0.0f) {
    const auto count = static_cast<std::int64_t>(batch) * layer.out;
    math_->dropout(output, count, training_.dropout, training_.dropout_seed, dropout_offset_);
    dropout_offset_ += static_cast<std::uint64_t>(count);
  }
}

void MlpModel::backward_layer(const Layer& layer, const float* input, float* output_grad,
                              float* input_grad, int batch) {
  const Engine::GatheredModule gathered = engine_.gathered(layer.module);
  const GradTarget weight_grad = grad_of(layer.weight);
  const GradTarget bias_grad = grad_of(layer.bias);
  math_->linear_grads(output_grad, input, begin_grad(layer.weight, weight_grad, grad_work_),
                      begin_grad(layer.bias, bias_grad, bias_grad_work_), batch, layer.in,
                      layer.out, weight_grad.accumulate, bias_grad.accumulate);
  end_grad(layer.weight, weight_grad, grad_work_);
  end_grad(layer.bias, bias_grad, bias_grad_work_);
  if (input_grad != nullptr) {
    math_->input_grad(output_grad, values_of(layer.weight, weight_work_), input_grad, batch,
                      layer.in, layer.out);
  }
  // Marked while the module is still gathered, so stage 3 can reduce-scatter straight from it.
  if (training_.grad_handover == GradHandover::kPerParameter) {
    engine_.grad_ready(layer.weight);
    engine_.grad_ready(layer.bias);
  }
}

}  // namespace zeroshard::examples
