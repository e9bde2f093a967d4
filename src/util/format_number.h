// Shortest round-trip text of a double for error messages ("-1", "0.001", "1e-10"), the way
// PyTorch's C++ API prints option values.
#pragma once

#include <charconv>
#include <string>

namespace zeroshard::detail {

inline std::string format_number(double value) {
  char text[32];
  const auto result = std::to_chars(text, text + sizeof(text), value);
  return std::string(text, result.ptr);
}

}  // namespace zeroshard::detail
