// zeroshard for libtorch models: an optimizer that a training loop written for
// torch::optim::AdamW takes in its place. The engine holds the model's parameters (the module's
// tensors become views of its memory), takes each gradient as autograd completes it, and at stage
// 3 gathers one unit of the model (a transformer block, say) at a time around its forward and
// backward. Link zeroshard::torch (built where CMake finds libtorch). Guide: docs/torch.md.
#pragma once

#include <torch/data/dataloader.h>
#include <torch/data/samplers/base.h>
#include <torch/data/samplers/random.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/pimpl.h>
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
  /// False (the default), as torch::optim: autograd accumulates each gradient in `.grad()` over
  /// any number of backward() calls, the module's or the optimizer's zero_grad() discards it, and
  /// step() hands it to the engine, so a gradient that flows through this model for another
  /// optimizer's loss (a GAN's generator loss through its discriminator) is never reduced. True:
  /// each gradient goes to the engine as soon as autograd completes it, so at stages 2-3 a
  /// bucket's reduction overlaps the rest of backward and no whole gradient is kept; a micro-step
  /// then takes one backward() through this model (a second one is refused, naming the
  /// parameter).
  bool reduce_during_backward = false;
  /// Rank 0's module buffers (BatchNorm's running statistics) are copied to every rank when the
  /// optimizer is built and at every step(), as DDP's broadcast_buffers does before each forward,
  /// so that every rank evaluates alike. False: each rank keeps its own.
  bool broadcast_buffers = true;
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

  /// Collective: the mean of `value` over the ranks. A decision taken on a rank's own loss (stop
  /// when it is below a threshold) makes ranks stop at different steps and the collectives of
  /// the next step() hang; take it on this mean, which every rank gets alike.
  double mean_over_ranks(double value);

  /// This rank's rows of a global batch that every rank draws alike (a program that makes its
  /// own data): dimension 0 split into world-size equal parts, the r-th for rank r, the
  /// remainder rows dropped (as RankShareSampler does), so that every rank trains on as many.
  at::Tensor rank_share(const at::Tensor& batch) const;

  Engine& engine();
  const Engine& engine() const;

  /// Internal state, behind the public API (src/torch/).
  struct State;

 private:
  explicit Optimizer(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

/// A sampler that hands each rank its share of the batches a torch sampler draws (the loader of
/// make_data_loader below). For a batch of B the base sampler draws B x world indices, every
/// rank alike, and rank r keeps the r-th of `world` equal parts; a last draw that does not split
/// evenly loses its remainder, so every rank takes as many steps with as many rows and no
/// collective waits for a rank that has run out. On one rank it is the base sampler. A base that
/// draws from torch's generator (RandomSampler) draws alike where every rank seeded it alike and
/// drew as much from it before each epoch.
class RankShareSampler : public ::torch::data::samplers::Sampler<> {
 public:
  RankShareSampler(std::unique_ptr<::torch::data::samplers::Sampler<>> base, int rank, int world);

  void reset(::torch::optional<std::size_t> new_size = ::torch::nullopt) override;
  ::torch::optional<std::vector<std::size_t>> next(std::size_t batch_size) override;
  void save(::torch::serialize::OutputArchive& archive) const override;
  void load(::torch::serialize::InputArchive& archive) override;

 private:
  std::unique_ptr<::torch::data::samplers::Sampler<>> base_;
  int rank_;
  int world_;
};

/// The rank and world size make_data_loader shares batches among: those of the communicator an
/// Optimizer builds by default (Communicator::from_environment: the MPI world under an MPI
/// launcher; RANK and WORLD_SIZE where a launcher sets them for NCCL's bootstrap; a world of
/// one otherwise). Collective under an MPI launcher.
std::pair<int, int> default_rank_and_world();

/// torch::data::make_data_loader(dataset, options) over the ranks of the default world (see
/// default_rank_and_world; an optimizer over a data-parallel group of the program's own takes a
/// RankShareSampler built with the group's rank and size): the same loader and the same
/// `Sampler` (torch's RandomSampler by default, SequentialSampler, ...), of whose draws each rank
/// takes its share, `options.batch_size` rows (RankShareSampler). On one rank it yields what
/// torch's loader yields; on N ranks, the rows of torch's loader with a batch N times as large.
/// Collective under an MPI launcher: every rank builds its loaders alike.
template <class Sampler = ::torch::data::samplers::RandomSampler, class Dataset>
auto make_data_loader(Dataset dataset, ::torch::data::DataLoaderOptions options = {}) {
  const auto size = dataset.size();
  if (!size) {
    throw UsageError(
        "zeroshard::torch::make_data_loader: the dataset has no size, so no sampler can be "
        "built for it; build the sampler yourself and pass it to torch::data::make_data_loader");
  }
  const auto [rank, world] = default_rank_and_world();
  return ::torch::data::make_data_loader(
      std::move(dataset), RankShareSampler(std::make_unique<Sampler>(*size), rank, world),
      std::move(options));
}

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

namespace detail {

template <class M, class = void>
struct IsModuleHolder : std::false_type {};
template <class M>
struct IsModuleHolder<M, std::void_t<typename M::ContainedType>>
    : std::is_base_of<::torch::nn::ModuleHolder<typename M::ContainedType>, M> {};

/// The module behind a ModuleHolder (torch::nn::Conv2d), a shared_ptr or a plain pointer, callable
/// (its forward() is not const).
template <class M>
auto* module_pointer(const M& module) {
  if constexpr (IsModuleHolder<M>::value) {
    return module.ptr().get();
  } else if constexpr (std::is_pointer_v<M>) {
    return module;
  } else {
    return module.get();
  }
}

}  // namespace detail

/// function(args...) with `module`'s parameters gathered when it is a stage-3 unit: the call site
/// of a unit whose work is not its own forward() (a function of its layers, say). `module` is
/// what forward() takes. A checkpointed unit (checkpoint_units) calls `function` again in
/// backward: capture by value what it reads.
template <class ModulePointer, class Function, class... Args>
auto call(const ModulePointer& module, Function&& function, Args&&... args) {
  const ::torch::nn::Module& unit = [&]() -> const ::torch::nn::Module& {
    if constexpr (std::is_same_v<ModulePointer, ::torch::nn::AnyModule>) {
      return *module.ptr();
    } else {
      return *detail::module_pointer(module);
    }
  }();
  UnitScope scope(unit);
  using Output = decltype(function(std::forward<Args>(args)...));
  if constexpr (sizeof...(Args) == 1 && std::is_same_v<Output, at::Tensor> &&
                (std::is_convertible_v<Args, const at::Tensor&> && ...)) {
    if (scope.checkpointed()) return scope.checkpoint(function, args...);
  } else if (scope.checkpointed()) {
    throw UsageError(
        "zeroshard::torch::forward: a checkpointed unit takes one tensor and returns "
        "one; wrap this module's call in a module that does");
  }
  return scope.leave(function(std::forward<Args>(args)...));
}

/// module->forward(args...) with the module's parameters gathered when it is a stage-3 unit: the
/// one change a stage-3 model makes at each unit's call site. `module` is a ModuleHolder (a
/// torch::nn::Linear member), a shared_ptr or pointer to a module, or an AnyModule (what iterating
/// a Sequential yields: its forward returns a tensor). A Sequential's own forward needs none of
/// this: while an optimizer lives, each of its entries that is a unit calls the unit through
/// forward() (`sequential[i]` is that caller, named and printed as the layer; named_children()
/// still yields the layers), so `sequential->forward(x)` gathers its units one at a time.
template <class ModulePointer, class... Args>
auto forward(const ModulePointer& module, Args&&... args) {
  if constexpr (std::is_same_v<ModulePointer, ::torch::nn::AnyModule>) {
    // AnyModule::forward is not const; a copy shares the module.
    return call(
        module,
        [any = module](auto&&... inputs) mutable {
          return any.forward(std::forward<decltype(inputs)>(inputs)...);
        },
        std::forward<Args>(args)...);
  } else {
    return call(
        module,
        [pointer = detail::module_pointer(module)](auto&&... inputs) {
          return pointer->forward(std::forward<decltype(inputs)>(inputs)...);
        },
        std::forward<Args>(args)...);
  }
}

}  // namespace zeroshard::torch
