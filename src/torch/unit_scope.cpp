// Stage 3 for libtorch modules, which have no forward hooks: zeroshard::torch::forward() gathers a
// unit around its forward, and an autograd function at the unit's output gathers it again before
// its backward; the unit is released once its last gradient is handed over.
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>

#include <mutex>
#include <unordered_map>

#include "torch/optimizer_state.h"

namespace zeroshard::torch {

namespace {

// Module -> unit, for every optimizer alive: forward() is a free function that sees a module only.
std::mutex registry_mutex;
std::unordered_map<const ::torch::nn::Module*, UnitScope::Unit*>& registry() {
  static std::unordered_map<const ::torch::nn::Module*, UnitScope::Unit*> units;
  return units;
}

UnitScope::Unit* unit_of(const ::torch::nn::Module& module) {
  std::lock_guard lock(registry_mutex);
  const auto found = registry().find(&module);
  return found == registry().end() ? nullptr : found->second;
}

// Identity forward; its backward runs before any of the unit's, so it gathers the parameters the
// unit's backward reads (autograd saved views of their storage, which the gather re-points).
struct GatherBeforeBackward : public ::torch::autograd::Function<GatherBeforeBackward> {
  static at::Tensor forward(::torch::autograd::AutogradContext* context, at::Tensor output,
                            std::int64_t unit) {
    context->saved_data["unit"] = unit;
    return output;
  }
  static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* context,
                                                   ::torch::autograd::variable_list grads) {
    reinterpret_cast<UnitScope::Unit*>(context->saved_data["unit"].toInt())->gather_for_backward();
    return {grads.at(0), at::Tensor()};
  }
};

}  // namespace

void Optimizer::State::register_units() {
  std::lock_guard lock(registry_mutex);
  for (const auto& unit : units) registry()[unit->torch_module] = unit.get();
}

void Optimizer::State::unregister_units() noexcept {
  std::lock_guard lock(registry_mutex);
  for (const auto& unit : units) registry().erase(unit->torch_module);
}

void UnitScope::Unit::gather() {
  if (!owner->units_gather) return;
  Engine& engine = owner->engine;
  // In backward this runs on autograd's thread for the device, whose current stream is the one
  // the unit's forward ran on.
  detail::follow_current_stream(engine);
  engine.gather(module);
  if (holders++ > 0) return;
  for (int index : params) {
    ManagedParam& param = owner->params[static_cast<std::size_t>(index)];
    if (!owner->follows_its_unit(param)) continue;
    if (param.backing.replaced()) owner->check_parameters_are_ours();
    param.backing.point_at(param.parameter.raw_data());
  }
}

void UnitScope::Unit::release() {
  if (!owner->units_gather) return;
  owner->engine.release(module);
  if (--holders > 0) return;
  for (int index : params) {
    ManagedParam& param = owner->params[static_cast<std::size_t>(index)];
    if (owner->follows_its_unit(param)) {
      param.backing.point_at_nothing(owner->released_values.data_ptr());
    }
  }
}

void UnitScope::Unit::gather_for_backward() {
  if (held_for_backward || !owner->units_gather) return;
  gather();
  held_for_backward = true;
  grads_pending = trainable;
  if (!owner->backward_callback_queued) {
    owner->backward_callback_queued = true;
    Optimizer::State* state = owner;
    ::torch::autograd::Engine::get_default_engine().queue_callback([state] {
      state->backward_callback_queued = false;
      for (const auto& unit : state->units) unit->end_backward();
    });
  }
}

void UnitScope::Unit::gradient_handed_over() {
  if (held_for_backward && --grads_pending == 0) end_backward();
}

void UnitScope::Unit::end_backward() {
  if (!held_for_backward) return;
  held_for_backward = false;
  release();
}

UnitScope::UnitScope(const ::torch::nn::Module& module) : unit_(unit_of(module)) {
  if (unit_ != nullptr) unit_->gather();
}

UnitScope::~UnitScope() {
  if (unit_ != nullptr) unit_->release();
}

at::Tensor UnitScope::leave(at::Tensor output) const {
  if (unit_ == nullptr || !unit_->owner->units_gather || !output.defined() ||
      !output.requires_grad()) {
    return output;
  }
  return GatherBeforeBackward::apply(output, reinterpret_cast<std::int64_t>(unit_));
}

std::vector<at::Tensor> UnitScope::leave(std::vector<at::Tensor> outputs) const {
  for (at::Tensor& output : outputs) output = leave(std::move(output));
  return outputs;
}

}  // namespace zeroshard::torch
