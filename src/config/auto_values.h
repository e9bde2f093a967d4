// Hugging Face style "auto" values: filled from the program's ConfigOverrides the way
// transformers' HfTrainerDeepSpeedConfig fills them from the Trainer's arguments.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zeroshard/config.h"

namespace zeroshard::detail {

/// Replaces every "auto" in `document` (aliases already resolved) and checks that keys the
/// Trainer would fill, when given as numbers, equal the override. An "auto" nothing fills in a
/// section DeepSpeed reads through pydantic (zero_optimization, fp16, bf16, the monitors), and a
/// hidden-size based size without ConfigOverrides::hidden_size, is removed so that DeepSpeed's
/// default applies, with a line in `notices` naming the key and the value. Throws ConfigError
/// naming the key and the override (and its zeroshard-config flag) for a Trainer-filled "auto"
/// without its override, for any other "auto", and for a mismatch.
void resolve_auto_values(nlohmann::json& document, const ConfigOverrides& overrides, int world_size,
                         std::vector<std::string>& notices);

}  // namespace zeroshard::detail
