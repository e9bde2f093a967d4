// A Sequential called as torch programs call it, `sequential->forward(x)`, gathers its units one
// at a time: libtorch modules have no forward hooks, but SequentialImpl::forward calls each entry
// through an AnyModule, which the optimizer swaps, while it lives, for one that calls the unit
// through zeroshard::torch::forward(). So a stage-3 port keeps its Sequential call sites.
#include <torch/nn/modules/container/sequential.h>

#include <unordered_set>

#include "torch/optimizer_state.h"

namespace zeroshard::torch {

namespace {

using ::torch::nn::AnyModule;
using ::torch::nn::Module;
using ::torch::nn::SequentialImpl;

// Named and printed as the unit it calls, so that printing the model reads as before. One tensor
// in and out: what a Sequential passes every entry but its first.
class UnitEntryImpl : public Module {
 public:
  explicit UnitEntryImpl(AnyModule unit) : Module(unit.ptr()->name()), unit_(std::move(unit)) {}
  at::Tensor forward(at::Tensor input) {
    return zeroshard::torch::forward(unit_, std::move(input));
  }
  void pretty_print(std::ostream& stream) const override { unit_.ptr()->pretty_print(stream); }

 private:
  AnyModule unit_;
};

}  // namespace

void Optimizer::State::route_sequentials_through_units(Module& model) {
  std::unordered_set<const Module*> unit_modules;
  for (const auto& unit : units) unit_modules.insert(unit->torch_module);
  if (unit_modules.empty()) return;
  const auto route = [&](const std::weak_ptr<Module>& owner, SequentialImpl& sequential) {
    std::size_t index = 0;
    for (AnyModule& entry : sequential) {
      if (unit_modules.count(entry.ptr().get()) != 0) {
        auto caller = std::make_shared<UnitEntryImpl>(entry);
        routed_entries.push_back({owner, index, std::move(entry), caller.get()});
        entry = AnyModule(std::move(caller));
      }
      ++index;
    }
  };
  // A model held by no shared_ptr (a SequentialImpl on the stack) cannot be watched: its entries
  // keep calling through, which once the optimizer is gone is a plain call of the layer.
  if (auto* root = dynamic_cast<SequentialImpl*>(&model)) route(model.weak_from_this(), *root);
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    if (auto* sequential = dynamic_cast<SequentialImpl*>(item.value().get())) {
      route(item.value(), *sequential);
    }
  }
}

void Optimizer::State::restore_sequentials() noexcept {
  for (RoutedEntry& routed : routed_entries) {
    const std::shared_ptr<Module> owner = routed.sequential.lock();
    if (!owner) continue;
    // Module is a virtual base of SequentialImpl: no static_cast down.
    auto& sequential = dynamic_cast<SequentialImpl&>(*owner);
    // An entry the program replaced or removed since stays as the program left it.
    if (routed.index >= sequential.size() || sequential.ptr(routed.index).get() != routed.caller) {
      continue;
    }
    *(sequential.begin() + static_cast<std::ptrdiff_t>(routed.index)) = std::move(routed.unit);
  }
  routed_entries.clear();
}

}  // namespace zeroshard::torch
