// Reading JSON config values the way DeepSpeed does (5e8 is an integer, a boolean is not a
// number) and showing them in error messages.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace zeroshard::detail {

/// The value as a 64-bit integer when it is a JSON number with an integral value in range
/// (5e8 and 500000000 both qualify; 1.5, true and "5" do not).
std::optional<std::int64_t> integer_value(const nlohmann::json& value);

/// The shortest text that reads back as `number`: 500000000, 0.001, 1e+30, inf.
std::string format_number(double number);

/// Text from the file (a key, a string value) as a message shows it: printable ASCII as is; `"`,
/// `\` and control characters escaped as in JSON (`\n`, `\u0000`, `\u001b`); every non-ASCII
/// byte as `\xNN`; cut with "..." once 64 characters are written.
std::string printable_text(std::string_view text);

/// The value as an error message shows it: `string "3"`, `1.5`, `true`, `an object`.
std::string describe_value(const nlohmann::json& value);

/// The lower-case copy of an ASCII string.
std::string ascii_lower(std::string text);

}  // namespace zeroshard::detail
