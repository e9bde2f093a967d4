// zeroshard::torch::Optimizer: registers a libtorch module's parameters with an Engine, makes
// them views of its memory, and keeps torch's param_groups and the engine's learning rate in step.
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <span>
#include <sstream>
#include <unordered_map>

#include "torch/optimizer_state.h"

namespace zeroshard::torch {

namespace {

using ::torch::nn::Module;

bool is_container(const Module& module) {
  return dynamic_cast<const ::torch::nn::ModuleListImpl*>(&module) != nullptr ||
         dynamic_cast<const ::torch::nn::SequentialImpl*>(&module) != nullptr;
}

struct FoundUnit {
  std::string name;
  const Module* module;
};

void find_units(Module& module, const std::string& prefix, const UnitPredicate& is_unit,
                std::vector<FoundUnit>& units) {
  for (const auto& child : module.named_children()) {
    const std::string name = prefix.empty() ? child.key() : prefix + "." + child.key();
    const bool unit = is_unit ? is_unit(name, *child.value()) : is_container(module);
    if (unit) {
      units.push_back({name, child.value().get()});
    } else {
      find_units(*child.value(), name, is_unit, units);
    }
  }
}

// Without OptimizerOptions::checkpoint_units nothing is checkpointed, so these keys would be
// parsed and ignored: refused instead.
void refuse_activation_checkpointing(const Config& config, const OptimizerOptions& options) {
  if (options.checkpoint_units) return;
  const ActivationCheckpointingConfig& checkpointing = config.activation_checkpointing;
  const char* key = checkpointing.partition_activations ? "partition_activations"
                    : checkpointing.cpu_checkpointing   ? "cpu_checkpointing"
                    : checkpointing.contiguous_memory_optimization
                        ? "contiguous_memory_optimization"
                    : checkpointing.number_checkpoints ? "number_checkpoints"
                                                       : nullptr;
  if (key == nullptr) return;
  throw ConfigError(std::string("activation_checkpointing.") + key,
                    "asks for activation checkpointing, but zeroshard::torch checkpoints units "
                    "only with OptimizerOptions::checkpoint_units = true; set it, or remove the "
                    "key");
}

Device device_of(Module& model, const OptimizerOptions& options) {
  if (options.device) return *options.device;
  const auto parameters = model.parameters();
  return parameters.empty() ? Device::cpu() : detail::engine_device(parameters.front().device());
}

Engine make_engine(Module& model, Config config, OptimizerOptions& options) {
  refuse_activation_checkpointing(config, options);
  const Device device = device_of(model, options);
  std::unique_ptr<Communicator> communicator = std::move(options.communicator);
  if (!communicator) communicator = Communicator::from_environment(device);
  Engine engine(std::move(config), device, std::move(communicator), std::move(options.rule));
  detail::follow_current_stream(engine);
  return engine;
}

// The index of the unit holding parameter `parameter_name`, or -1.
int unit_of(const std::string& parameter_name, const std::vector<FoundUnit>& units) {
  for (std::size_t u = 0; u < units.size(); ++u) {
    const std::string& unit = units[u].name;
    if (parameter_name.size() > unit.size() && parameter_name.compare(0, unit.size(), unit) == 0 &&
        parameter_name[unit.size()] == '.') {
      return static_cast<int>(u);
    }
  }
  return -1;
}

// Parameter -> the optimizer training it, over every optimizer alive: two engines updating one
// tensor would train two diverging copies.
std::mutex claims_mutex;
std::unordered_map<const c10::TensorImpl*, const Optimizer::State*>& claims() {
  static std::unordered_map<const c10::TensorImpl*, const Optimizer::State*> owners;
  return owners;
}

void refuse_claimed(const std::vector<std::pair<std::string, at::Tensor>>& named) {
  std::lock_guard lock(claims_mutex);
  for (const auto& [name, tensor] : named) {
    if (claims().count(tensor.unsafeGetTensorImpl()) != 0) {
      throw UsageError("zeroshard::torch::Optimizer: parameter '" + name +
                       "' is already trained by another zeroshard::torch::Optimizer; give each "
                       "parameter to one optimizer (one over both models, with a ParamGroup for "
                       "other options, or freeze it with requires_grad(false))");
    }
  }
}

std::vector<float> fp32_values(const at::Tensor& tensor) {
  const at::Tensor host = tensor.detach().to(at::kCPU, at::kFloat).contiguous();
  return std::vector<float>(host.data_ptr<float>(), host.data_ptr<float>() + host.numel());
}

}  // namespace

Optimizer::State::State(Module& model, Config config, OptimizerOptions options)
    : engine(make_engine(model, std::move(config), options)) {
  // The model's frozen tensors stay views of the engine's frozen parameters for the whole run,
  // which this key keeps only as int8 blocks, decoded while a module is gathered.
  if (engine.config().zero_optimization.quantized_nontrainable_weights) {
    throw ConfigError("zero_optimization.zero_quantized_nontrainable_weights",
                      "got true, which zeroshard::torch does not support yet: the model's frozen "
                      "tensors are read outside the engine's gathers; remove the key");
  }
  const int stage = engine.stage();
  per_parameter_grads = stage >= 2;
  reduce_during_backward = options.reduce_during_backward;
  broadcast_buffers = options.broadcast_buffers;
  units_gather = stage == 3;

  std::vector<FoundUnit> found_units;
  if (units_gather || options.checkpoint_units) find_units(model, "", options.is_unit, found_units);

  // Groups: the default one (index 0), then the caller's, each with the engine's group index.
  const double base_lr = engine.update_rule().default_lr();
  const double base_weight_decay = engine.update_rule().default_weight_decay();
  groups.push_back({"default", {}, 1.0, base_weight_decay, 0.0});
  std::unordered_map<const c10::TensorImpl*, int> group_of;
  for (const ParamGroup& group : options.groups) {
    const int index = engine.add_param_group({group.name, group.lr, group.weight_decay});
    groups.push_back({group.name,
                      {},
                      group.lr.value_or(base_lr) / base_lr,
                      group.weight_decay.value_or(base_weight_decay),
                      0.0});
    for (const at::Tensor& tensor : group.parameters) {
      if (!group_of.emplace(tensor.unsafeGetTensorImpl(), index).second) {
        throw UsageError("zeroshard::torch::Optimizer: a parameter is in more than one group ('" +
                         group.name + "' and another); list each parameter once");
      }
    }
  }

  // Each tensor once (a tied weight appears under every name that shares it), in module order,
  // so that a unit's parameters are registered one after another as the engine requires.
  std::unordered_map<const c10::TensorImpl*, bool> seen;
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    if (seen.emplace(item.value().unsafeGetTensorImpl(), true).second) {
      named.emplace_back(item.key(), item.value());
    }
  }
  refuse_claimed(named);
  for (const auto& item : model.named_buffers(/*recurse=*/true)) {
    buffers.emplace_back(item.key(), item.value());
  }
  std::vector<int> unit_of_param;
  for (const auto& [name, tensor] : named) {
    const int unit = unit_of(name, found_units);
    unit_of_param.push_back(unit);
    const auto group = group_of.find(tensor.unsafeGetTensorImpl());
    ParamOptions param_options;
    param_options.group = group == group_of.end() ? 0 : group->second;
    param_options.trainable = tensor.requires_grad();
    if (unit >= 0) param_options.module = found_units[static_cast<std::size_t>(unit)].name;
    Parameter parameter = engine.register_parameter(name, tensor.sizes().vec(), param_options);
    groups[static_cast<std::size_t>(param_options.group)].params.push_back(
        static_cast<int>(params.size()));
    params.push_back({detail::EngineBackedTensor(tensor, engine.model_dtype(), engine.device()),
                      parameter,
                      nullptr,
                      {},
                      {}});
  }
  for (const auto& [impl, index] : group_of) {
    if (seen.find(impl) == seen.end()) {
      throw UsageError("zeroshard::torch::Optimizer: group '" +
                       groups[static_cast<std::size_t>(index)].name +
                       "' lists a tensor that is not a parameter of the model");
    }
  }
  engine.finalize();

  for (ManagedParam& param : params) {
    param.parameter.copy_from(fp32_values(param.backing.tensor()));
  }
  // A unit without parameters (an activation module, say) has nothing to gather.
  std::vector<UnitScope::Unit*> unit_of_found(found_units.size(), nullptr);
  for (std::size_t i = 0; i < params.size(); ++i) {
    ManagedParam& param = params[i];
    if (unit_of_param[i] >= 0) {
      const FoundUnit& found = found_units[static_cast<std::size_t>(unit_of_param[i])];
      UnitScope::Unit*& slot = unit_of_found[static_cast<std::size_t>(unit_of_param[i])];
      if (slot == nullptr) {
        units.push_back(std::make_unique<UnitScope::Unit>());
        slot = units.back().get();
        slot->owner = this;
        slot->name = found.name;
        slot->torch_module = found.module;
        slot->module = engine.module(found.name);
      }
      UnitScope::Unit& unit = *slot;
      param.unit = &unit;
      unit.params.push_back(static_cast<int>(i));
      if (param.parameter.trainable()) ++unit.trainable;
    } else if (units_gather && param.parameter.trainable() &&
               std::find(modules_of_no_unit.begin(), modules_of_no_unit.end(),
                         param.parameter.module()) == modules_of_no_unit.end()) {
      modules_of_no_unit.push_back(param.parameter.module());
    }
  }
  // The tensors' original storage is dropped here: from now on the engine's memory is the model's.
  // A unit's parameters take the model's type and full shape first, so that autograd's
  // accumulator (created by the hooks, and kept while type and device stay) expects gradients
  // of that shape and type.
  gather_units_of_no_unit();
  for (ManagedParam& param : params) {
    if (follows_its_unit(param)) {
      param.backing.shape_without_values();
    } else {
      param.backing.point_at(param.parameter.raw_data());
    }
  }
  install_gradient_hooks();
  std::int64_t widest_released = 0;
  for (ManagedParam& param : params) {
    if (follows_its_unit(param))
      widest_released = std::max(widest_released, param.parameter.numel());
  }
  if (widest_released > 0) {
    released_values = at::full({widest_released}, std::numeric_limits<double>::quiet_NaN(),
                               at::TensorOptions()
                                   .dtype(detail::scalar_type(engine.model_dtype()))
                                   .device(detail::torch_device(engine.device())));
  }
  for (ManagedParam& param : params) {
    if (follows_its_unit(param)) param.backing.point_at_nothing(released_values.data_ptr());
  }
  if (options.checkpoint_units) start_checkpointing();
  for (Group& group : groups) group.lr_written = engine.lr() * group.lr_ratio;
  broadcast_module_buffers();
  // Last: a constructor that throws runs no ~State to put the entries back.
  route_sequentials_through_units(model);
  std::lock_guard lock(claims_mutex);
  for (const ManagedParam& param : params) {
    claims()[param.backing.tensor().unsafeGetTensorImpl()] = this;
  }
}

// The model outlives its optimizer, not the engine's memory: each parameter keeps a copy of its
// values (stage 3: a unit's parameters stay empty, the engine alone held their shards), gradients
// that were views of the engine's are dropped, and the hooks that call into this state go.
Optimizer::State::~State() {
  restore_sequentials();
  {
    std::lock_guard lock(claims_mutex);
    for (const ManagedParam& param : params) {
      const auto claim = claims().find(param.backing.tensor().unsafeGetTensorImpl());
      if (claim != claims().end() && claim->second == this) claims().erase(claim);
    }
  }
  for (ManagedParam& param : params) {
    param.backing.keep_values();
    if (!param.parameter.trainable()) continue;
    at::Tensor& grad = param.backing.tensor().mutable_grad();
    if (grad.defined() && grad.is_same(param.grad_view)) grad = at::Tensor();
    if (param.accumulator) param.accumulator->del_post_hook(param.hook);
  }
}

std::vector<::torch::optim::OptimizerParamGroup> Optimizer::State::torch_groups() const {
  std::vector<::torch::optim::OptimizerParamGroup> result;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    std::vector<at::Tensor> tensors;
    for (int index : groups[g].params) {
      tensors.push_back(params[static_cast<std::size_t>(index)].backing.tensor());
    }
    result.emplace_back(std::move(tensors), group_options(g));
  }
  return result;
}

std::unique_ptr<GroupOptions> Optimizer::State::group_options(std::size_t g) const {
  return std::make_unique<GroupOptions>(groups[g].lr_written, groups[g].weight_decay);
}

void Optimizer::State::push_learning_rates(
    std::vector<::torch::optim::OptimizerParamGroup>& torch_groups) {
  bool changed = false;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const auto& options = static_cast<const GroupOptions&>(torch_groups[g].options());
    changed = changed || options.lr() != groups[g].lr_written;
    if (options.weight_decay() != groups[g].weight_decay) {
      throw UsageError("zeroshard::torch::Optimizer: the weight decay of group '" + groups[g].name +
                       "' changed after the optimizer was built; it is fixed");
    }
  }
  if (!changed) return;
  const double lr = static_cast<const GroupOptions&>(torch_groups.front().options()).lr();
  for (std::size_t g = 1; g < groups.size(); ++g) {
    const double expected = lr * groups[g].lr_ratio;
    const double got = static_cast<const GroupOptions&>(torch_groups[g].options()).lr();
    if (std::abs(got - expected) > 1e-12 * std::max(1.0, std::abs(expected))) {
      std::ostringstream message;
      message << "zeroshard::torch::Optimizer: group '" << groups[g].name << "' has lr " << got
              << " but the default group's lr " << lr << " times the ratio the groups were built "
              << "with (" << groups[g].lr_ratio << ") is " << expected
              << "; the engine keeps each group's lr in that ratio, so scale every group alike";
      throw UsageError(message.str());
    }
  }
  engine.set_lr(lr);
}

void Optimizer::State::pull_learning_rates(
    std::vector<::torch::optim::OptimizerParamGroup>& torch_groups) {
  for (std::size_t g = 0; g < groups.size(); ++g) {
    groups[g].lr_written = engine.lr() * groups[g].lr_ratio;
    torch_groups[g].options().set_lr(groups[g].lr_written);
  }
}

void Optimizer::State::check_parameters_are_ours() const {
  for (const ManagedParam& param : params) {
    if (!param.backing.replaced()) continue;
    throw UsageError("zeroshard::torch::Optimizer: parameter '" + param.parameter.name() +
                     "' was given new data (set_data(), or module->to() a dtype or device) after "
                     "the optimizer was built, so the model no longer reads what the engine "
                     "trains; move or cast the model first, then build the optimizer, and write "
                     "new values in place (copy_() under torch::NoGradGuard)");
  }
}

void Optimizer::State::gather_units_of_no_unit() {
  for (ModuleId module : modules_of_no_unit) engine.gather(module);
  for (ManagedParam& param : params) {
    if (param.unit == nullptr && units_gather && param.parameter.trainable()) {
      param.backing.point_at(param.parameter.raw_data());
    }
  }
}

void Optimizer::State::release_units_of_no_unit() {
  for (ModuleId module : modules_of_no_unit) engine.release(module);
}

Optimizer::Optimizer(::torch::nn::Module& model, Config config, OptimizerOptions options)
    : Optimizer(std::make_unique<State>(model, std::move(config), std::move(options))) {}

Optimizer::Optimizer(::torch::nn::Module& model, const std::string& config_file,
                     OptimizerOptions options)
    : Optimizer([&] {
        if (!options.communicator) {
          options.communicator = Communicator::from_environment(device_of(model, options));
        }
        Config config = Config::from_json_file(config_file, options.communicator->size());
        return std::make_unique<State>(model, std::move(config), std::move(options));
      }()) {}

Optimizer::Optimizer(std::unique_ptr<State> state)
    : ::torch::optim::Optimizer(state->torch_groups(), state->group_options(0)),
      state_(std::move(state)) {
  // libtorch 2.x merges each group's options with the defaults, and for an options class it does
  // not know keeps a copy of the defaults instead: every group's own lr and weight decay would
  // read back as the default group's. Each group's are set again.
  for (std::size_t g = 0; g < param_groups_.size(); ++g) {
    param_groups_[g].set_options(state_->group_options(g));
  }
  state_->register_units();
}

Optimizer::~Optimizer() {
  if (state_) state_->unregister_units();
}

at::Tensor Optimizer::step(LossClosure closure) {
  at::Tensor loss;
  if (closure) {
    ::torch::AutoGradMode enable_grad(true);
    loss = closure();
  }
  State& state = *state_;
  detail::follow_current_stream(state.engine);
  state.check_parameters_are_ours();
  state.push_learning_rates(param_groups_);
  state.drop_pending_checkpoints();
  state.hand_over_gradients();
  state.engine.all_grads_ready();
  state.release_units_of_no_unit();
  state.last_step = state.engine.step();
  state.gather_units_of_no_unit();
  state.pull_learning_rates(param_groups_);
  for (ManagedParam& param : state.params) param.handed_over = false;
  state.broadcast_module_buffers();
  return loss;
}

void Optimizer::zero_grad() {
  detail::follow_current_stream(state_->engine);
  state_->engine.zero_grad();
  for (ManagedParam& param : state_->params) {
    if (!param.parameter.trainable()) continue;
    param.handed_over = false;
    // A caller (or torch's own zero_grad(set_to_none)) may have replaced .grad(); stages 0-1
    // put the view of the engine's gradient memory back, stages 2-3 keep none between backwards.
    param.backing.tensor().mutable_grad() = param.grad_view;
  }
}

void Optimizer::backward(const at::Tensor& loss) {
  const double scale = loss_scale();
  if (scale == 1.0) {
    loss.backward();
  } else {
    (loss * scale).backward();
  }
}

double Optimizer::loss_scale() const { return state_->engine.loss_scale(); }

void Optimizer::log_loss(double loss) { state_->engine.log_loss(loss); }

const StepResult& Optimizer::last_step() const noexcept { return state_->last_step; }

void Optimizer::save_checkpoint(const std::string& dir, const std::string& tag,
                                const std::string& user_state) {
  detail::follow_current_stream(state_->engine);
  state_->engine.save_checkpoint(dir, tag, user_state);
  state_->save_module_buffers(dir, tag);
}

CheckpointInfo Optimizer::load_checkpoint(const std::string& dir, const std::string& tag) {
  State& state = *state_;
  detail::follow_current_stream(state.engine);
  // Gathered copies would be stale after the load: released first, gathered from the new shards.
  state.release_units_of_no_unit();
  CheckpointInfo info = state.engine.load_checkpoint(dir, tag);
  state.load_module_buffers(dir, info.tag);
  state.gather_units_of_no_unit();
  state.pull_learning_rates(param_groups_);
  return info;
}

void Optimizer::save(::torch::serialize::OutputArchive& /*archive*/) const {
  throw UsageError(
      "zeroshard::torch::Optimizer: torch::save would write one rank's shard as if it were the "
      "whole optimizer; call save_checkpoint(dir, tag) on every rank instead");
}

void Optimizer::load(::torch::serialize::InputArchive& /*archive*/) {
  throw UsageError(
      "zeroshard::torch::Optimizer: torch::load cannot restore a sharded optimizer; call "
      "load_checkpoint(dir) on every rank instead");
}

double Optimizer::mean_over_ranks(double value) {
  Communicator& communicator = state_->engine.communicator();
  communicator.all_reduce(std::span<double>(&value, 1));
  return value / communicator.size();
}

Engine& Optimizer::engine() { return state_->engine; }
const Engine& Optimizer::engine() const { return state_->engine; }

}  // namespace zeroshard::torch
