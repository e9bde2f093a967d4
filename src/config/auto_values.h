// Hugging Face style "auto" values: filled from the program's ConfigOverrides the way
// transformers' HfTrainerDeepSpeedConfig fills them from the Trainer's arguments.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zeroshard/config.h"

namespace zeroshard::detail {

/// Replaces every "auto" in `document` (aliases already resolved) and checks that keys the
/// Trainer would fill, when given as numbers, equal the override. An "auto" that stands for
/// DeepSpeed's default (KeySpec::auto_is_default) is removed, with a line in `notices`. Throws
/// ConfigError naming the key and the override (and its zeroshard-config flag) for an "auto"
/// nothing fills, and for a mismatch.
void resolve_auto_values(nlohmann::json& document, const ConfigOverrides& overrides, int world_size,
                         std::vector<std::string>& notices);

}  // namespace zeroshard::detail
