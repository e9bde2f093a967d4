// DeepSpeed-compatible number reading and value formatting for config messages.
#include "config/config_values.h"

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

std::string printable_text(std::string_view text) {
  // Long enough for every DeepSpeed key and value; a megabyte-long key still gives a one-line
  // message.
  constexpr std::size_t kShownLength = 64;
  constexpr char kHex[] = "0123456789abcdef";
  std::string shown;
  for (char c : text) {
    if (shown.size() >= kShownLength) return shown + "...";
    const auto byte = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      shown += {'\\', c};
    } else if (c == '\n') {
      shown += "\\n";
    } else if (c == '\t') {
      shown += "\\t";
    } else if (byte >= 0x20 && byte < 0x7f) {
      shown += c;
    } else {
      // Non-ASCII bytes are escaped too, not passed on as UTF-8: a zero-width space, a
      // right-to-left override or a C1 control (U+009B starts a terminal escape) would make a
      // key look like a different, possibly valid, one. Config keys and values are ASCII.
      shown += byte < 0x80 ? "\\u00" : "\\x";
      shown += {kHex[byte >> 4], kHex[byte & 0xf]};
    }
  }
  return shown;
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

std::string ascii_lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

}  // namespace zeroshard::detail
