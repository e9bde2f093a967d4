// Reading and writing the quantities the command-line tools deal in: element counts such as
// 7.5B or 1.3M, and byte sizes in decimal (GB, as the ZeRO paper counts) or binary (GiB) units.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "zeroshard/export.h"

namespace zeroshard {

/// "7500000000", "7.5e9", "7.5B", "1.3M", "125K", "2T" (K/M/B/G/T, case-insensitive) as a count.
/// Throws UsageError naming `option` and the text when it is not one.
ZEROSHARD_API std::int64_t parse_count(std::string_view text, std::string_view option);

/// "80GB", "80 GB", "80e9", "16GiB", "512MiB", "1.5TB" as bytes (kB/MB/GB/TB decimal, KiB/MiB/
/// GiB/TiB binary, a bare number is bytes). Throws UsageError naming `option` otherwise.
ZEROSHARD_API std::int64_t parse_bytes(std::string_view text, std::string_view option);

/// "120.0 GB", "31.4 GB", "562.5 MB", "64 B": one decimal in the largest decimal unit that
/// keeps the figure at least 1.
ZEROSHARD_API std::string format_decimal_bytes(std::int64_t bytes);
/// "111.76 GiB", "1.00 MiB", "64 B": two decimals in the largest binary unit.
ZEROSHARD_API std::string format_binary_bytes(std::int64_t bytes);
/// "7.50B", "1.30M", "950": a parameter count in the units people quote models in.
ZEROSHARD_API std::string format_count(std::int64_t count);

}  // namespace zeroshard
