// DeepSpeed-compatible number reading and value formatting for config messages.
#include "config_values.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>

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

std::string format_number(double number) {
  if (std::isnan(number)) return "nan";
  if (std::isinf(number)) return number > 0 ? "inf" : "-inf";
  char buffer[64];
  // Plain notation up to 1e15 reads better than the shortest form (5e+08) in messages.
  if (number == std::floor(number) && std::fabs(number) < 1e15) {
    auto result = std::to_chars(buffer, buffer + sizeof buffer, number, std::chars_format::fixed);
    return std::string(buffer, result.ptr);
  }
  auto result = std::to_chars(buffer, buffer + sizeof buffer, number);
  return std::string(buffer, result.ptr);
}

std::string describe_value(const nlohmann::json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::null:
      return "null";
    case nlohmann::json::value_t::boolean:
      return value.get<bool>() ? "true" : "false";
    case nlohmann::json::value_t::string:
      return "string " + value.dump();
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

std::string ascii_lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

}  // namespace zeroshard::detail
