// What an engine leaves to the handles it gave out (Parameter, GatheredModule, GatheredModel),
// which may outlive it: whether it still lives, and the names and shapes that Parameter::name()
// and shape() return by reference.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace zeroshard::detail {

class EngineState;

class EngineLifetime {
 public:
  explicit EngineLifetime(EngineState& state) noexcept : state_(&state) {}

  /// The engine's state wherever its Engine object now is; null once it was destroyed.
  EngineState* state() const noexcept { return state_; }
  /// The state's destructor calls it first: from then on the handles refuse every call.
  void end() noexcept { state_ = nullptr; }

  /// Keeps a copy of a registered parameter's name and shape, parameters in registration order.
  void add_parameter(std::string name, std::vector<std::int64_t> shape) {
    parameters_.push_back({std::move(name), std::move(shape)});
  }
  const std::string& name(int index) const { return parameters_[index].name; }
  const std::vector<std::int64_t>& shape(int index) const { return parameters_[index].shape; }

 private:
  struct Identity {
    std::string name;
    std::vector<std::int64_t> shape;
  };
  EngineState* state_;
  /// A deque, so that the references handed out stay put while parameters are added.
  std::deque<Identity> parameters_;
};

}  // namespace zeroshard::detail
