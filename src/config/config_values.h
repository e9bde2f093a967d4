// Reading JSON config values the way DeepSpeed does (5e8 is an integer, a boolean is not a
// number) and showing them in error messages.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace zeroshard::detail {

/// The value as a 64-bit integer when it is a JSON number with an integral value in range
/// (5e8 and 500000000 both qualify; 1.5, true and "5" do not).
std::optional<std::int64_t> integer_value(const nlohmann::json& value);

/// The value as an error message shows it: `string "3"`, `1.5`, `true`, `an object`.
std::string describe_value(const nlohmann::json& value);

}  // namespace zeroshard::detail
