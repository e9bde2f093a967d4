// The library's tests reach an engine's components through this, to provoke what a public call
// cannot (an I/O error in the middle of a step); programs use the public API only.
#pragma once

#include "engine/engine_state.h"

namespace zeroshard::detail {

struct EngineInternals {
  static EngineState& state(Engine& engine) { return *engine.state_; }
};

}  // namespace zeroshard::detail
