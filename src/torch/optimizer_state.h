// What zeroshard::torch::Optimizer keeps behind its public face: the engine, each model parameter
// as an engine-backed tensor with its gradient hook, and at stage 3 the units and the parameters
// of no unit (kept gathered between steps).
#pragma once

#include <torch/csrc/autograd/function.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "torch/engine_tensors.h"
#include "zeroshard/activation_checkpointing.h"
#include "zeroshard/torch.h"

namespace zeroshard::torch {

namespace detail {

/// On a GPU: the engine's work goes on torch's current stream from now on, after what it queued
/// on its previous one. Called wherever the engine is about to queue work. A CUDA model with a
/// libtorch without CUDA is refused (UsageError).
void follow_current_stream(Engine& engine);

}  // namespace detail

struct ManagedParam {
  detail::EngineBackedTensor backing;
  Parameter parameter;
  UnitScope::Unit* unit = nullptr;  ///< stage 3: the unit it is gathered with; null: no unit
  /// Stages 0-1: the view of the engine's gradient memory that `.grad()` is.
  at::Tensor grad_view;
  /// Keeps autograd's accumulator, and so the post hook on it, alive (libtorch 1.x holds nodes
  /// in a shared_ptr, 2.x in an intrusive_ptr).
  decltype(::torch::autograd::impl::grad_accumulator(
      std::declval<const at::Tensor&>())) accumulator;
  std::uintptr_t hook = 0;  ///< the post hook's key, to remove it with the optimizer
  /// reduce_during_backward: the gradient went to the engine in this micro-step.
  bool handed_over = false;
};

struct UnitScope::Unit {
  Optimizer::State* owner = nullptr;
  std::string name;
  const ::torch::nn::Module* torch_module = nullptr;
  ModuleId module = -1;
  std::vector<int> params;  ///< indices into State::params
  int trainable = 0;
  int holders = 0;  ///< forward scopes and the backward gather holding it now
  bool held_for_backward = false;
  int grads_pending = 0;  ///< trainable parameters whose gradient this backward has not handed

  void gather();
  void release();
  /// Before the unit's backward: gathered again until its last gradient is handed over (or the
  /// backward ends, for parameters that got none).
  void gather_for_backward();
  void gradient_handed_over();
  void end_backward();
};

/// One checkpointed call of a unit, from its forward to its backward.
struct UnitCheckpoint {
  UnitScope::Unit* unit = nullptr;
  std::function<at::Tensor(const at::Tensor&)> forward;
  std::vector<std::int64_t> input_shape;
  at::TensorOptions input_options;
  bool input_requires_grad = false;
  std::vector<std::int64_t> output_shape;
  at::TensorOptions output_options;
  at::Tensor recomputed_input;  ///< during its backward: the graph the recompute built
  at::Tensor recomputed_output;
};

struct Optimizer::State {
  State(::torch::nn::Module& model, Config config, OptimizerOptions options);
  ~State();

  /// The torch optimizer's groups: the default group, then one per OptimizerOptions::groups.
  std::vector<::torch::optim::OptimizerParamGroup> torch_groups() const;
  /// Group `g`'s lr and weight decay as the torch side reads them (0: the default group).
  std::unique_ptr<GroupOptions> group_options(std::size_t g) const;

  /// Stages 0-1: `.grad()` becomes a view of the engine's gradient memory. Every stage: a post
  /// hook on each trainable parameter's gradient accumulator hands the gradient over.
  void install_gradient_hooks();
  /// Makes the units known to UnitScope (zeroshard::torch::forward), and forgets them.
  void register_units();
  void unregister_units() noexcept;
  /// The post hook's work once autograd has accumulated parameter `index`'s gradient.
  void hand_over_gradient(int index);
  /// At step(), unless reduce_during_backward: every `.grad()` as torch::optim would read it goes
  /// to the engine.
  void hand_over_gradients();
  /// Before the engine uses the model's tensors: UsageError naming a parameter whose data the
  /// program replaced (set_data, module->to()) since the optimizer was built.
  void check_parameters_are_ours() const;
  /// Collective (broadcast_buffers): rank 0's module buffers on every rank.
  void broadcast_module_buffers();
  /// The module buffers beside checkpoint `dir`/`tag`: written by rank 0, read by every rank.
  void save_module_buffers(const std::string& dir, const std::string& tag);
  void load_module_buffers(const std::string& dir, const std::string& tag);
  /// Every group's lr from the torch side to the engine, before an update.
  void push_learning_rates(std::vector<::torch::optim::OptimizerParamGroup>& groups);
  /// The engine's lr (its scheduler's) back to every group.
  void pull_learning_rates(std::vector<::torch::optim::OptimizerParamGroup>& groups);
  /// The engine's checkpointer for the units, with torch's CPU generator as its random state.
  void start_checkpointing();
  /// Forwards never backpropagated (evaluation with gradients on) are forgotten at each step().
  void drop_pending_checkpoints();
  void gather_units_of_no_unit();
  /// Stage 3: a trainable parameter of a unit, which has values only while its unit is gathered.
  bool follows_its_unit(const ManagedParam& param) const {
    return units_gather && param.unit != nullptr && param.parameter.trainable();
  }
  void release_units_of_no_unit();
  /// Every Sequential entry of `model` that is a unit calls it through forward() from now on, so
  /// that `sequential->forward(x)` gathers it; restore_sequentials() puts the entries back.
  void route_sequentials_through_units(::torch::nn::Module& model);
  void restore_sequentials() noexcept;

  Engine engine;
  /// Stage 3: units are gathered around their forward and backward; at stages 0-2 they exist
  /// only to be checkpointed.
  bool units_gather = false;
  std::vector<std::unique_ptr<RandomState>> torch_random;    ///< the CPU's and the model's GPU's
  std::unique_ptr<ActivationCheckpointer> checkpointer;      ///< with checkpoint_units
  std::vector<std::shared_ptr<UnitCheckpoint>> checkpoints;  ///< forwards awaiting backward
  at::Tensor checkpoint_anchor;
  std::vector<ManagedParam> params;
  std::vector<std::unique_ptr<UnitScope::Unit>> units;
  struct RoutedEntry {
    std::weak_ptr<::torch::nn::Module> sequential;
    std::size_t index = 0;
    ::torch::nn::AnyModule unit;                  ///< the entry the program built
    const ::torch::nn::Module* caller = nullptr;  ///< what stands in its place
  };
  std::vector<RoutedEntry> routed_entries;
  /// Stage 3: the engine modules of the parameters in no unit.
  std::vector<ModuleId> modules_of_no_unit;
  bool per_parameter_grads = false;  ///< stages 2-3: gradients go to bucket slots
  bool reduce_during_backward = false;
  bool broadcast_buffers = true;
  /// The model's buffers (BatchNorm's running statistics), by name.
  std::vector<std::pair<std::string, at::Tensor>> buffers;
  /// Stage 3: what a released unit's parameter storage holds (NaN, as wide as the widest one), so
  /// that a tensor detach()ed from it inside its unit reads valid memory.
  at::Tensor released_values;
  bool backward_callback_queued = false;

  struct Group {
    std::string name;
    std::vector<int> params;
    double lr_ratio = 1.0;  ///< the group's lr over the default group's, fixed
    double weight_decay = 0.0;
    double lr_written = 0.0;  ///< what the optimizer last wrote to the torch group's lr
  };
  std::vector<Group> groups;
  StepResult last_step;
};

}  // namespace zeroshard::torch
