// The library's own parts outside the engine (the activation checkpointer moves kept inputs with
// the engine's backend) and its tests (to provoke what a public call cannot, such as an I/O error
// in the middle of a step) reach an engine's components through this; programs use the public API
// only.
#pragma once

#include "engine/engine_state.h"

namespace zeroshard::detail {

struct EngineInternals {
  static EngineState& state(Engine& engine) { return *engine.state_; }
};

}  // namespace zeroshard::detail
