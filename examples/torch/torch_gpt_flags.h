// The model-shape flags the example and its benchmark share.
#pragma once

#include <CLI/CLI.hpp>

#include "torch_gpt_model.h"

namespace torch_gpt {

/// --layers, --width, --heads and --seq-len, into `shape` (its values are the defaults shown).
void add_shape_flags(CLI::App& app, GptShape& shape);

}  // namespace torch_gpt
