// A multi-layer perceptron classifier written the way a user writes their model: its parameters
// live in a zeroshard Engine, its forward and backward run where the engine's buffers are
// (OpenBLAS on the CPU, cuBLAS on a GPU).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "mlp_math.h"
#include "zeroshard/activation_checkpointing.h"
#include "zeroshard/engine.h"

namespace zeroshard::examples {

/// `layers` fully connected layers: inputs -> width -> ... -> width -> classes, ReLU between
/// them, softmax cross-entropy on the last. One layer means a linear classifier.
struct MlpShape {
  int inputs = 64;
  int width = 256;
  int layers = 4;
  int classes = 10;
};

/// The part of a micro-step that has just ended (MlpModel::set_phase_hook).
enum class MlpPhase { kForward, kBackward };

/// Training-time options of the model.
struct MlpTraining {
  /// Checkpoint every K layers (0 = keep every activation): blocks of K layers keep only their
  /// input and run their forward again in backward (zeroshard/activation_checkpointing.h).
  int checkpoint_every = 0;
  /// Dropout probability after each hidden ReLU (0 = none), from a counter-based generator whose
  /// offset the checkpointer saves and restores.
  float dropout = 0.0f;
  std::uint64_t dropout_seed = 0x5eed;
  /// kPerParameter: each layer hands its gradients over as its backward ends; kAtEnd: all at
  /// once after the whole backward, as a model with weights stacked over layers must.
  GradHandover grad_handover = GradHandover::kPerParameter;
  /// The model allocates its parameters and gradients itself, one flat block each, reads and
  /// writes them there, and lends them to the engine (Engine::adopt_memory).
  bool adopt_memory = false;
};

/// Registers "fc{i}.weight" [out, in] and "fc{i}.bias" [out] (module "fc{i}", i = 0..layers-1)
/// with the engine and trains them one micro-batch at a time. Not copyable or movable: it holds
/// a reference to the engine and handles into it.
class MlpModel {
 public:
  /// Registers the parameters and allocates activations for micro-batches of up to `max_batch`
  /// samples through the engine (so the memory report counts them). Throws UsageError for a
  /// shape or batch that is not positive. Under fp16/bf16 the layers compute in
  /// fp32 on working copies of the 16-bit parameters. On a GPU engine the model computes on a
  /// stream of its own, which it hands to Engine::set_compute_stream.
  MlpModel(Engine& engine, const MlpShape& shape, int max_batch, const MlpTraining& training = {});
  MlpModel(const MlpModel&) = delete;
  MlpModel& operator=(const MlpModel&) = delete;

  /// Sets every parameter as torch.nn.Linear does (Kaiming-uniform weights and uniform biases,
  /// both in +-1/sqrt(fan_in)) from `seed`, identically on every rank. Collective at stage 3.
  /// With adopt_memory the values go into the model's own block, which the engine then takes.
  void initialize(std::uint64_t seed);

  /// One micro-step: forward over `batch` samples (x is [batch, inputs] row-major, labels in
  /// [0, classes)), softmax cross-entropy, backward that adds the gradients into the engine's
  /// buffers and hands them over (per layer, or all at the end). Returns this rank's mean loss over
  /// the batch. The caller calls Engine::step() afterwards.
  float train_micro_step(const float* x, const int* labels, int batch);

  /// Called as each micro-step's forward ends (after the loss) and as its backward ends (before
  /// GradHandover::kAtEnd hands the gradients over): for a caller that measures the phases.
  void set_phase_hook(std::function<void(MlpPhase)> hook) { phase_hook_ = std::move(hook); }

  const MlpShape& shape() const noexcept { return shape_; }
  const MlpTraining& training() const noexcept { return training_; }
  /// With checkpoint_every > 0: its checkpointer (profile, memory); null otherwise.
  const ActivationCheckpointer* checkpointer() const noexcept { return checkpointer_.get(); }
  /// Bytes of the activation buffers the model holds whatever the depth: labels, losses, the
  /// gradient ping-pong buffers and (16-bit) the fp32 working copies.
  std::int64_t fixed_activation_bytes() const noexcept;
  /// Trainable elements of the whole model, P.
  std::int64_t parameter_count() const noexcept;

 private:
  struct Layer {
    ModuleId module = -1;
    Parameter weight;
    Parameter bias;
    int in = 0;
    int out = 0;
    /// [max_batch, out]: ReLU output, or logits on the last layer. Empty with checkpointing,
    /// where each block allocates its layers' outputs.
    ActivationBuffer output;
  };

  /// The dropout generator's state: the counter the next mask starts at.
  class DropoutState final : public RandomState {
   public:
    explicit DropoutState(std::uint64_t& offset) : offset_(&offset) {}
    std::vector<std::byte> save() const override;
    void restore(std::span<const std::byte> state) override;

   private:
    std::uint64_t* offset_;
  };

  /// Where `parameter` lives in one of the model's own blocks (adopt_memory).
  void* own(const std::shared_ptr<void>& block, const Parameter& parameter) const;
  void* data_of(const Parameter& parameter) const;
  /// The gradient buffer, and whether the backward adds to it or writes it (grad_target()).
  GradTarget grad_of(const Parameter& parameter) const;
  const float* values_of(const Parameter& parameter, const ActivationBuffer& work);
  /// The fp32 gradient the layer math adds to or writes: the engine's buffer, or under 16 bits
  /// `work`, holding the engine's values when they are added to.
  float* begin_grad(const Parameter& parameter, const GradTarget& target,
                    const ActivationBuffer& work);
  void end_grad(const Parameter& parameter, const GradTarget& target, const ActivationBuffer& work);
  /// Linear, then (hidden layers) ReLU and dropout, into `output`.
  void forward_layer(const Layer& layer, const float* input, float* output, int batch, bool relu);
  /// The micro-step's forward, loss and backward, keeping every activation or checkpointing.
  float forward_backward(int batch);
  float forward_backward_checkpointed(int batch);
  float loss_of(float* logits, int batch);
  void phase_ended(MlpPhase phase) {
    if (phase_hook_) phase_hook_(phase);
  }
  void backward_layer(const Layer& layer, const float* input, float* output_grad, float* input_grad,
                      int batch);

  Engine& engine_;
  MlpShape shape_;
  MlpTraining training_;
  std::uint64_t dropout_offset_ = 0;
  DropoutState dropout_state_{dropout_offset_};
  std::unique_ptr<ActivationCheckpointer> checkpointer_;
  int max_batch_ = 0;
  std::unique_ptr<MlpMath> math_;
  std::function<void(MlpPhase)> phase_hook_;
  std::vector<Layer> layers_;
  /// adopt_memory: the model's own flat parameter and gradient blocks, in the engine's layout.
  std::shared_ptr<void> own_parameters_;
  std::shared_ptr<void> own_gradients_;
  /// The micro-batch on the engine's device: samples [max_batch, inputs], labels, and the
  /// per-sample losses the loss is summed from.
  ActivationBuffer input_;
  ActivationBuffer labels_;
  ActivationBuffer sample_losses_;
  /// Gradients flowing back between layers, [max_batch, max(width, classes)] each, ping-ponged.
  ActivationBuffer grad_a_;
  ActivationBuffer grad_b_;
  /// fp16/bf16 only: fp32 working copies of one layer's weight, bias and their gradients.
  ActivationBuffer weight_work_;
  ActivationBuffer bias_work_;
  ActivationBuffer grad_work_;
  ActivationBuffer bias_grad_work_;
};

}  // namespace zeroshard::examples
