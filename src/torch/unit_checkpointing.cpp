// Activation checkpointing of units through the engine's ActivationCheckpointer: an autograd
// function whose forward runs the unit without a graph and keeps only its input in engine memory,
// and whose backward runs it again with a graph (the checkpointer restores the input and torch's
// generator) and backpropagates through it, a backward inside the backward, as torch's
// reentrant checkpoint does.
#include <ATen/Context.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstring>
#include <mutex>

#include "torch/optimizer_state.h"

namespace zeroshard::torch {

namespace {

// One of torch's default generators: the CPU's (dropout on the CPU draws from it) or, for a model
// on a GPU, that GPU's.
class TorchGeneratorState final : public RandomState {
 public:
  explicit TorchGeneratorState(c10::Device device) : device_(device) {}
  std::vector<std::byte> save() const override {
    at::Generator generator = at::globalContext().defaultGenerator(device_);
    std::lock_guard lock(generator.mutex());
    const at::Tensor state = generator.get_state();
    const auto* begin = static_cast<const std::byte*>(state.data_ptr());
    return std::vector<std::byte>(begin, begin + state.numel());
  }
  void restore(std::span<const std::byte> bytes) override {
    at::Tensor state = at::empty({static_cast<std::int64_t>(bytes.size())}, at::kByte);
    std::memcpy(state.data_ptr(), bytes.data(), bytes.size());
    at::Generator generator = at::globalContext().defaultGenerator(device_);
    std::lock_guard lock(generator.mutex());
    generator.set_state(state);
  }

 private:
  c10::Device device_;
};

struct CheckpointedUnit : public ::torch::autograd::Function<CheckpointedUnit> {
  static at::Tensor forward(::torch::autograd::AutogradContext* context, const at::Tensor& input,
                            const at::Tensor& /*anchor*/, std::int64_t record_address) {
    context->saved_data["record"] = record_address;
    auto* record = reinterpret_cast<UnitCheckpoint*>(record_address);
    Optimizer::State& state = *record->unit->owner;
    const at::Tensor contiguous = input.contiguous();
    record->input_shape = contiguous.sizes().vec();
    record->input_options = contiguous.options();
    record->input_requires_grad = input.requires_grad();
    ActivationBuffer kept = state.engine.allocate_activations(contiguous.nbytes());
    at::from_blob(kept.data(), record->input_shape, record->input_options).copy_(contiguous);
    ActivationBuffer output =
        state.checkpointer->checkpoint(std::move(kept), [record](BlockContext& block) {
          const at::Tensor kept_input =
              at::from_blob(block.input().data(), record->input_shape, record->input_options);
          if (!block.recomputing()) {
            at::Tensor result;
            {
              at::NoGradGuard no_grad;
              result = record->forward(kept_input).contiguous();
            }
            record->output_shape = result.sizes().vec();
            record->output_options = result.options();
            at::from_blob(block.allocate(result.nbytes()), record->output_shape,
                          record->output_options)
                .copy_(result);
            return;
          }
          at::AutoGradMode enable_grad(true);
          record->recomputed_input =
              kept_input.detach().requires_grad_(record->input_requires_grad);
          record->recomputed_output = record->forward(record->recomputed_input);
          // The checkpointer rebuilds the block's buffers in order; the output's is the last.
          block.allocate(record->recomputed_output.nbytes());
        });
    // The output lives in engine memory for as long as torch holds the tensor.
    auto holder = std::make_shared<ActivationBuffer>(std::move(output));
    return at::from_blob(
        holder->data(), record->output_shape, [holder](void*) mutable { holder.reset(); },
        record->output_options);
  }

  static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* context,
                                                   ::torch::autograd::variable_list grads) {
    auto* record = reinterpret_cast<UnitCheckpoint*>(context->saved_data["record"].toInt());
    Optimizer::State& state = *record->unit->owner;
    if (state.checkpoints.empty() || state.checkpoints.back().get() != record) {
      throw UsageError(
          "zeroshard::torch: checkpointed units must be backpropagated in the reverse order of "
          "their forwards, and every forward with gradients on must be followed by its backward "
          "before the next step() (run evaluation under torch::NoGradGuard)");
    }
    record->unit->gather_for_backward();
    at::Tensor input_grad;
    state.checkpointer->backward([&](BlockContext&) {
      ::torch::autograd::backward({record->recomputed_output}, {grads.at(0)});
      if (record->input_requires_grad) input_grad = record->recomputed_input.grad();
      record->recomputed_input = at::Tensor();
      record->recomputed_output = at::Tensor();
    });
    state.checkpoints.pop_back();
    return {input_grad, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

void Optimizer::State::start_checkpointing() {
  checkpointer = std::make_unique<ActivationCheckpointer>(engine);
  torch_random.push_back(std::make_unique<TorchGeneratorState>(c10::Device(c10::DeviceType::CPU)));
  if (engine.device().is_cuda()) {
    torch_random.push_back(
        std::make_unique<TorchGeneratorState>(detail::torch_device(engine.device())));
  }
  for (const auto& state : torch_random) checkpointer->register_random_state(*state);
  // A graph input that always wants a gradient, so that a unit whose input wants none (token
  // embeddings computed without one, say) still has its backward run.
  checkpoint_anchor = at::zeros({}, at::TensorOptions().requires_grad(true));
}

void Optimizer::State::drop_pending_checkpoints() {
  if (!checkpointer) return;
  checkpointer->clear();
  checkpoints.clear();
}

bool UnitScope::checkpointed() const noexcept {
  return unit_ != nullptr && unit_->owner->checkpointer != nullptr;
}

at::Tensor UnitScope::checkpoint(std::function<at::Tensor(const at::Tensor&)> forward,
                                 const at::Tensor& input) const {
  if (!at::GradMode::is_enabled()) return forward(input);
  Optimizer::State& state = *unit_->owner;
  auto record = std::make_shared<UnitCheckpoint>();
  record->forward = std::move(forward);
  record->unit = unit_;
  state.checkpoints.push_back(record);
  return CheckpointedUnit::apply(input, state.checkpoint_anchor,
                                 reinterpret_cast<std::int64_t>(record.get()));
}

}  // namespace zeroshard::torch
