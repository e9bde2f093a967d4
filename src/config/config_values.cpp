// DeepSpeed-compatible number reading and value formatting for config messages.
#include "config/config_values.h"

#include <cmath>
#include <limits>

#include "util/text.h"

namespace zeroshard::detail {

std::optional<std::int64_t> integer_value(const nlohmann::json& value) {
  if (value.is_number_unsigned()) {
    auto number = value.get<std::uint64_t>();
    if (number > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      return std::nullopt;
    }
    return static_cast<std::int64_t>(number);
  }
  if (value.is_number_integer()) return value.get<std::int64_t>();
  if (value.is_number_float()) {
    double number = value.get<double>();
    // 2^63 is the first double past INT64_MAX; casting it or anything larger is undefined.
    constexpr double kTwoToThe63 = 9223372036854775808.0;
    if (std::isfinite(number) && number == std::floor(number) && number >= -kTwoToThe63 &&
        number < kTwoToThe63) {
      return static_cast<std::int64_t>(number);
    }
  }
  return std::nullopt;
}

std::string describe_value(const nlohmann::json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::null:
      return "null";
    case nlohmann::json::value_t::boolean:
      return value.get<bool>() ? "true" : "false";
    case nlohmann::json::value_t::string:
      return "string \"" + printable_text(value.get_ref<const std::string&>()) + "\"";
    case nlohmann::json::value_t::object:
      return "an object";
    case nlohmann::json::value_t::array:
      return "an array";
    case nlohmann::json::value_t::number_float:
      return format_number(value.get<double>());
    default:
      return value.dump();
  }
}

}  // namespace zeroshard::detail
