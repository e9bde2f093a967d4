// Parsing and formatting of element counts and byte sizes for the command-line tools.
#include "zeroshard/quantity.h"

#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

#include "zeroshard/error.h"

namespace zeroshard {

namespace {

std::string lower(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c != ' ') out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

/// Splits "7.5e9gb" into 7.5e9 and "gb"; false when there is no leading number.
bool split_number(const std::string& text, double& value, std::string& unit) {
  const char* begin = text.data();
  const char* end = begin + text.size();
  const auto [stop, error] = std::from_chars(begin, end, value);
  if (error != std::errc() || !std::isfinite(value) || value < 0) return false;
  unit.assign(stop, end);
  return true;
}

template <std::size_t N>
bool scale_for(const std::string& unit, const std::array<std::pair<const char*, double>, N>& units,
               double& scale) {
  for (const auto& [name, factor] : units) {
    if (unit == name) {
      scale = factor;
      return true;
    }
  }
  return false;
}

std::int64_t checked(double value, std::string_view text, std::string_view option,
                     const char* expected) {
  if (value > 9.2e18) {
    throw UsageError(std::string(option) + ": \"" + std::string(text) + "\" is too large");
  }
  const double rounded = std::llround(value);
  if (std::abs(rounded - value) > 1e-6 * std::max(1.0, value)) {
    throw UsageError(std::string(option) + ": got \"" + std::string(text) + "\", expected " +
                     expected + " (a whole number once scaled)");
  }
  return static_cast<std::int64_t>(rounded);
}

// A number with one of `units` after it, scaled to a whole count.
template <std::size_t N>
std::int64_t parse_scaled(std::string_view text, std::string_view option, const char* expected,
                          const std::array<std::pair<const char*, double>, N>& units) {
  double value = 0;
  std::string unit;
  double scale = 0;
  if (!split_number(lower(text), value, unit) || !scale_for(unit, units, scale)) {
    throw UsageError(std::string(option) + ": got \"" + std::string(text) + "\", expected " +
                     expected);
  }
  return checked(value * scale, text, option, expected);
}

}  // namespace

std::int64_t parse_count(std::string_view text, std::string_view option) {
  static constexpr const char* kExpected = "a count such as 7500000000, 7.5e9, 7.5B or 1.3M";
  static constexpr std::array<std::pair<const char*, double>, 6> kUnits{
      {{"", 1.0}, {"k", 1e3}, {"m", 1e6}, {"b", 1e9}, {"g", 1e9}, {"t", 1e12}}};
  return parse_scaled(text, option, kExpected, kUnits);
}

std::int64_t parse_bytes(std::string_view text, std::string_view option) {
  static constexpr const char* kExpected = "a size such as 80GB, 80e9, 16GiB or 512MiB";
  static constexpr std::array<std::pair<const char*, double>, 10> kUnits{{{"", 1.0},
                                                                          {"b", 1.0},
                                                                          {"kb", 1e3},
                                                                          {"mb", 1e6},
                                                                          {"gb", 1e9},
                                                                          {"tb", 1e12},
                                                                          {"kib", 0x1p10},
                                                                          {"mib", 0x1p20},
                                                                          {"gib", 0x1p30},
                                                                          {"tib", 0x1p40}}};
  return parse_scaled(text, option, kExpected, kUnits);
}

namespace {

std::string format_scaled(double value, const char* const* units, int unit_count, double step,
                          int decimals) {
  int unit = 0;
  while (unit + 1 < unit_count && std::abs(value) >= step) {
    value /= step;
    ++unit;
  }
  char text[48];
  std::snprintf(text, sizeof text, "%.*f %s", unit == 0 ? 0 : decimals, value, units[unit]);
  return text;
}

}  // namespace

std::string format_decimal_bytes(std::int64_t bytes) {
  // GB is the largest unit: the paper and the GPU spec sheets quote model memory in GB.
  static constexpr const char* kUnits[] = {"B", "kB", "MB", "GB"};
  return format_scaled(static_cast<double>(bytes), kUnits, 4, 1e3, 1);
}

std::string format_binary_bytes(std::int64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB"};
  return format_scaled(static_cast<double>(bytes), kUnits, 4, 1024.0, 2);
}

std::string format_count(std::int64_t count) {
  static constexpr const char* kUnits[] = {"", "K", "M", "B", "T"};
  std::string text = format_scaled(static_cast<double>(count), kUnits, 5, 1e3, 2);
  text.erase(text.find(' '), 1);
  return text;
}

}  // namespace zeroshard
