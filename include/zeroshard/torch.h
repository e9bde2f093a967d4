// zeroshard for libtorch models: an optimizer that a training loop written for
// torch::optim::AdamW takes in its place. The engine holds the model's parameters (the module's
// tensors become views of its memory), takes each gradient as autograd completes it, and at stage
// 3 gathers one unit of the model (a transformer block, say) at a time around its forward and
// backward. Link zeroshard::torch (built where CMake finds libtorch). Guide: docs/torch.md.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "zeroshard/zeroshard.h"

namespace zeroshard::torch {

/// A parameter group's options as torch's LR schedulers see them (param_groups()[i].options()).
/// The engine reads `lr` at every step(); `weight_decay` is fixed when the optimizer is built.
class GroupOptions : public ::torch::optim::OptimizerCloneableOptions<GroupOptions> {
 public:
  GroupOptions(double lr, double weight_decay) : lr_(lr), weight_decay_(weight_decay) {}
  TORCH_ARG(double, lr);
  TORCH_ARG(double, weight_decay);

 public:
  double get_lr() const override { return lr_; }
  void set_lr(const double lr) override { lr_ = lr; }
};

/// Parameters trained with their own learning rate or weight decay (no decay for biases and
/// norms, say). Parameters in no group train in the default group.
struct ParamGroup {
  std::string name;
  std::vector<at::Tensor> parameters;
  std::optional<double> lr;
  std::optional<double> weight_decay;
};

/// Decides, at stage 3, whether submodule `name` (its path in the model, "blocks.3") is a unit:
/// gathered whole around each call of zeroshard::torch::forward(). Units do not nest.
using UnitPredicate = std::function<bool(const std::string& name, const ::torch::nn::Module&)>;

/// What the optimizer is built with besides the model and the config.
struct OptimizerOptions {
  /// The update rule; null: the config's `optimizer` section chooses it, as in DeepSpeed.
  std::unique_ptr<UpdateRule> rule;
  /// Null: Communicator::from_environment(device) (MPI under mpirun, a world of one otherwise).
  std::unique_ptr<Communicator> communicator;
  /// Unset: where the model's parameters are (CPU tensors: the CPU backend; CUDA tensors: the
  /// CUDA backend on their GPU).
  std::optional<Device> device;
  std::vector<ParamGroup> groups;
  /// Unset: the children of every ModuleList and Sequential (transformer blocks, usually), with
  /// the parameters of no unit kept gathered between steps. Stages 0-2 gather no unit.
  UnitPredicate is_unit;
  /// Activation checkpointing of the units, at every stage: a unit called through forward() with
  /// one tensor keeps only that input (in engine memory, where the config's
  /// `activation_checkpointing` section puts it: cpu_checkpointing, contiguous buffers, profile)
  /// and runs its forward again just before its backward, with torch's CPU generator (and the
  /// model's GPU's) restored so that dropout draws alike. Without it, an `activation_checkpointing`
  /// key that asks for something is refused (ConfigError naming it): nothing would checkpoint.
  bool checkpoint_units = false;
};

/// A torch::optim::Optimizer whose state is sharded by a zeroshard Engine. Built from the model
/// after its parameters are initialised (every rank the same values) and before the first
/// forward: from then on the model's trainable parameters are views of the engine's memory, in
/// the model's precision (fp16/bf16 tensors under those configs; the fp32 master stays in the
/// engine). Gradients are handed to the engine as autograd completes them: at stages 0-1 they are
/// views of its gradient memory, at stages 2-3 each is copied into its bucket and freed, so
/// `.grad()` is undefined after backward. Call step() after every micro-step (the engine counts
/// gradient_accumulation_steps); zero_grad() clears what an interrupted micro-step left. When the
/// optimizer is destroyed the model keeps its parameters' values in torch's memory, except, at
/// stage 3, those of units, which are left empty (take engine().consolidated_parameters() or
/// engine().save_16bit_model() first).
class Optimizer : public ::torch::optim::Optimizer {
 public:
  Optimizer(::torch::nn::Module& model, Config config, OptimizerOptions options = {});
  /// The same with the DeepSpeed JSON file `config_file`, read for the communicator's world size
  /// (the batch-size identity): the one line a torch::optim loop changes.
  Optimizer(::torch::nn::Module& model, const std::string& config_file,
            OptimizerOptions options = {});
  ~Optimizer() override;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// Ends a micro-step (engine.step()): at an accumulation boundary the sharded update, after
  /// reading each group's lr (a torch LR scheduler's writes included) and before writing back the
  /// lr the engine's own scheduler set. With `closure`, evaluates it first and returns its loss.
  at::Tensor step(LossClosure closure = nullptr) override;
  /// Zeroes this window's gradients in the engine and drops any `.grad()` a caller replaced.
  void zero_grad();
  /// backward() of `loss` times the fp16 loss scale (1 otherwise); step() unscales.
  void backward(const at::Tensor& loss);
  double loss_scale() const;
  /// Engine::log_loss: the loss of the step the last step() ended, for the monitors.
  void log_loss(double loss);
  /// What the last step() did (skipped: an fp16 overflow, the update was not applied).
  const StepResult& last_step() const noexcept;

  /// Collective: the engine's sharded checkpoint (dir/tag), loadable at any world size and stage.
  void save_checkpoint(const std::string& dir, const std::string& tag,
                       const std::string& user_state = "");
  /// Collective: loads dir/tag (dir/latest when empty) into the engine; the model's tensors see
  /// the loaded values, and each group's lr is the engine's.
  CheckpointInfo load_checkpoint(const std::string& dir, const std::string& tag = "");
  /// torch::save(optimizer, ...) would write one rank's view of a sharded state: UsageError
  /// pointing at save_checkpoint() and load_checkpoint().
  void save(::torch::serialize::OutputArchive& archive) const override;
  void load(::torch::serialize::InputArchive& archive) override;

  Engine& engine();
  const Engine& engine() const;

  /// Internal state, behind the public API (src/torch/).
  struct State;

 private:
  explicit Optimizer(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

/// Calls around one unit's forward (stage 3): gathers the unit's parameters, and at leave()
/// ties the output to a backward that gathers them again; the destructor releases them. A module
/// that is no unit (every module at stages 0-2) passes through untouched. Use forward() below.
class UnitScope {
 public:
  explicit UnitScope(const ::torch::nn::Module& module);
  ~UnitScope();
  UnitScope(const UnitScope&) = delete;
  UnitScope& operator=(const UnitScope&) = delete;

  /// True when the unit's forward runs through checkpoint() (OptimizerOptions::checkpoint_units).
  bool checkpointed() const noexcept;
  /// Runs `forward` on `input` with activation checkpointing (see checkpoint_units).
  at::Tensor checkpoint(std::function<at::Tensor(const at::Tensor&)> forward,
                        const at::Tensor& input) const;
  at::Tensor leave(at::Tensor output) const;
  std::vector<at::Tensor> leave(std::vector<at::Tensor> outputs) const;
  template <class... Tensors>
  std::tuple<Tensors...> leave(std::tuple<Tensors...> outputs) const {
    std::apply([this](auto&... output) { ((output = leave(std::move(output))), ...); }, outputs);
    return outputs;
  }

  /// A unit's state (src/torch/).
  struct Unit;

 private:
  Unit* unit_ = nullptr;
};

/// module->forward(args...) with the module's parameters gathered when it is a stage-3 unit: the
/// one change a stage-3 model makes at each unit's call site. `module` is a ModuleHolder or a
/// shared_ptr to a module.
template <class ModulePointer, class... Args>
auto forward(const ModulePointer& module, Args&&... args) {
  UnitScope scope(*module);
  using Output = decltype(module->forward(std::forward<Args>(args)...));
  if constexpr (sizeof...(Args) == 1 && std::is_same_v<Output, at::Tensor> &&
                (std::is_convertible_v<Args, const at::Tensor&> && ...)) {
    if (scope.checkpointed()) {
      return scope.checkpoint([module](const at::Tensor& x) { return module->forward(x); },
                              args...);
    }
  } else if (scope.checkpointed()) {
    throw UsageError(
        "zeroshard::torch::forward: a checkpointed unit takes one tensor and returns "
        "one; wrap this module's call in a module that does");
  }
  return scope.leave(module->forward(std::forward<Args>(args)...));
}

}  // namespace zeroshard::torch
