// The one channel through which the library reports anything: levelled records handed to a sink
// the program may replace. zeroshard never writes to stdout.
#pragma once

#include <functional>
#include <string_view>

#include "zeroshard/export.h"

namespace zeroshard {

/// Severity, lowest first. kProgress carries the lines the config asks for (steps_per_print,
/// skipped steps), so the default threshold shows them beside warnings and errors.
enum class LogLevel { kDebug, kInfo, kProgress, kWarning, kError, kOff };

/// "debug", "info", "progress", "warning", "error" or "off".
ZEROSHARD_API const char* to_string(LogLevel level) noexcept;

/// One line the library emits; `rank` is -1 before a communicator knows it.
struct LogRecord {
  LogLevel level;
  int rank;
  std::string_view message;
};

using LogSink = std::function<void(const LogRecord&)>;

/// Replaces where records go; an empty sink restores the default, which writes
/// "zeroshard [rank R] LEVEL: message" to stderr. Calls to the sink are serialised.
ZEROSHARD_API void set_log_sink(LogSink sink);

/// Records below `level` are dropped before they are formatted. The initial threshold comes from
/// ZEROSHARD_LOG_LEVEL (a level name above; default "progress"). log_level() throws UsageError for
/// an unknown name there; the library's own records then warn once and keep the default.
ZEROSHARD_API void set_log_level(LogLevel level) noexcept;
ZEROSHARD_API LogLevel log_level();

}  // namespace zeroshard
