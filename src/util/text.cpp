// Text for messages: numbers as they read back, untrusted bytes made printable, ASCII case.
#include "util/text.h"

#include <cctype>
#include <charconv>
#include <cmath>

namespace zeroshard::detail {

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

std::string ascii_lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

}  // namespace zeroshard::detail
