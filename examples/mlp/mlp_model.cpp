// Forward, softmax cross-entropy and backward of the example MLP, with its parameters and
// gradients held by the engine (on its device) and, at stage 3, gathered one layer at a time.
#include "mlp_model.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "zeroshard/error.h"

namespace zeroshard::examples {
namespace {

// splitmix64: a tiny counter-based generator whose output is fixed by the seed alone, so every
// rank (and every standard library) produces the same initial weights.
std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Uniform in [-bound, bound), built from 24 random bits so the float is exact.
void fill_uniform(std::vector<float>& values, float bound, std::uint64_t& state) {
  for (float& v : values) {
    const float unit = static_cast<float>(splitmix64(state) >> 40) * 0x1.0p-24f;
    v = (2.0f * unit - 1.0f) * bound;
  }
}

void require_positive(const char* what, int value) {
  if (value <= 0) {
    throw UsageError("MlpModel: " + std::string(what) + " must be positive, got " +
                     std::to_string(value));
  }
}

}  // namespace

MlpModel::MlpModel(Engine& engine, const MlpShape& shape, int max_batch)
    : engine_(engine), shape_(shape), max_batch_(max_batch), math_(make_mlp_math(engine.device())) {
  require_positive("inputs", shape.inputs);
  require_positive("width", shape.width);
  require_positive("layers", shape.layers);
  require_positive("classes", shape.classes);
  require_positive("max_batch", max_batch);

  engine.set_compute_stream(math_->stream());
  const std::size_t batch = static_cast<std::size_t>(max_batch);
  input_ = engine.allocate_activations(batch * shape.inputs * sizeof(float));
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
    layer.output = engine.allocate_activations(batch * layer.out * sizeof(float));
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
    layer.weight.copy_from(weight);
    layer.bias.copy_from(bias);
  }
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

  math_->upload(input_.data(), x, static_cast<std::size_t>(batch) * shape_.inputs * sizeof(float));
  math_->upload(labels_.data(), labels, static_cast<std::size_t>(batch) * sizeof(int));
  const float* input_batch = input_.data();

  const std::size_t last = layers_.size() - 1;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const float* input = i == 0 ? input_batch : layers_[i - 1].output.data();
    forward_layer(layers_[i], input, batch, i != last);
  }
  // Under fp16 the engine asks for the loss to be scaled before backward; 1 otherwise.
  const float grad_scale = static_cast<float>(engine_.loss_scale()) / static_cast<float>(batch);
  const float loss = math_->softmax_cross_entropy(
      layers_[last].output.data(), reinterpret_cast<const int*>(labels_.data()),
      reinterpret_cast<double*>(sample_losses_.data()), batch, shape_.classes, grad_scale);

  // The last layer's output buffer now holds d(loss)/d(logits); each hidden layer's gradient
  // arrives in one ping-pong buffer and its input's gradient leaves in the other.
  float* output_grad = layers_[last].output.data();
  float* spare[2] = {grad_a_.data(), grad_b_.data()};
  for (std::size_t i = layers_.size(); i-- > 0;) {
    const Layer& layer = layers_[i];
    if (i != last) {
      math_->relu_backward(layer.output.data(), output_grad,
                           static_cast<std::int64_t>(batch) * layer.out);
    }
    const float* input = i == 0 ? input_batch : layers_[i - 1].output.data();
    float* input_grad = i == 0 ? nullptr : spare[i % 2];
    backward_layer(layer, input, output_grad, input_grad, batch);
    output_grad = input_grad;
  }
  return loss;
}

// The only places the model reads parameter memory or writes gradient memory. Under fp16/bf16
// the engine's buffers are 16-bit: the layer math runs on fp32 working copies, so the matrix
// products stay fp32 whatever the precision.
const float* MlpModel::values_of(const Parameter& parameter, const ActivationBuffer& work) {
  if (parameter.dtype() == DType::kFloat32) return parameter.data();
  math_->convert(parameter.raw_data(), parameter.dtype(), work.data(), DType::kFloat32,
                 parameter.numel());
  return work.data();
}

float* MlpModel::begin_grad(const Parameter& parameter, const ActivationBuffer& work) {
  if (parameter.dtype() == DType::kFloat32) return parameter.grad();
  math_->convert(parameter.raw_grad(), parameter.dtype(), work.data(), DType::kFloat32,
                 parameter.numel());
  return work.data();
}

void MlpModel::end_grad(const Parameter& parameter, const ActivationBuffer& work) {
  if (parameter.dtype() == DType::kFloat32) return;
  math_->convert(work.data(), DType::kFloat32, parameter.raw_grad(), parameter.dtype(),
                 parameter.numel());
}

void MlpModel::forward_layer(const Layer& layer, const float* input, int batch, bool relu) {
  // Stage 3 all-gathers the layer's parameters for the guard's lifetime; other stages hold them.
  const Engine::GatheredModule gathered = engine_.gathered(layer.module);
  math_->linear_forward(input, values_of(layer.weight, weight_work_),
                        values_of(layer.bias, bias_work_), layer.output.data(), batch, layer.in,
                        layer.out, relu);
}

void MlpModel::backward_layer(const Layer& layer, const float* input, float* output_grad,
                              float* input_grad, int batch) {
  const Engine::GatheredModule gathered = engine_.gathered(layer.module);
  math_->add_linear_grads(output_grad, input, begin_grad(layer.weight, grad_work_),
                          begin_grad(layer.bias, bias_grad_work_), batch, layer.in, layer.out);
  end_grad(layer.weight, grad_work_);
  end_grad(layer.bias, bias_grad_work_);
  if (input_grad != nullptr) {
    math_->input_grad(output_grad, values_of(layer.weight, weight_work_), input_grad, batch,
                      layer.in, layer.out);
  }
  // Marked while the module is still gathered, so stage 3 can reduce-scatter straight from it.
  engine_.grad_ready(layer.weight);
  engine_.grad_ready(layer.bias);
}

}  // namespace zeroshard::examples
