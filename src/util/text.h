// Text for messages: the shortest number that reads back (one definition for every message), bytes
// from files made printable, and ASCII lower case for names read case-insensitively.
#pragma once

#include <string>
#include <string_view>

namespace zeroshard::detail {

/// The shortest text that reads back as `number`: 500000000, 0.001, 1e+30, inf.
std::string format_number(double number);

/// Text from the file (a key, a string value) as a message shows it: printable ASCII as is; `"`,
/// `\` and control characters escaped as in JSON (`\n`, `\u0000`, `\u001b`); every non-ASCII
/// byte as `\xNN`; cut with "..." once 64 characters are written.
std::string printable_text(std::string_view text);

/// The lower-case copy of an ASCII string.
std::string ascii_lower(std::string text);

}  // namespace zeroshard::detail
