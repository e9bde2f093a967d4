// The log facility: threshold from ZEROSHARD_LOG_LEVEL, a replaceable sink, stderr by default.
#include "util/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <utility>

#include "util/check.h"
#include "util/text.h"

namespace zeroshard {
namespace {

constexpr LogLevel kAllLevels[] = {LogLevel::kDebug,   LogLevel::kInfo,  LogLevel::kProgress,
                                   LogLevel::kWarning, LogLevel::kError, LogLevel::kOff};

LogLevel level_from_environment() {
  const char* value = std::getenv("ZEROSHARD_LOG_LEVEL");
  if (value == nullptr || *value == '\0') return LogLevel::kProgress;
  const std::string name = detail::ascii_lower(value);
  for (LogLevel level : kAllLevels) {
    if (name == to_string(level)) return level;
  }
  throw UsageError("ZEROSHARD_LOG_LEVEL='" + std::string(value) +
                   "': expected debug, info, progress, warning, error or off");
}

// -1 until the first record or set_log_level(): reading the environment lazily lets a bad value
// surface as an exception from a library call rather than before main().
std::atomic<int> g_threshold{-1};

std::mutex& sink_mutex() {
  static std::mutex mutex;
  return mutex;
}

LogSink& sink() {
  static LogSink installed;
  return installed;
}

void write_to_stderr(const LogRecord& record) {
  if (record.rank >= 0) {
    std::fprintf(stderr, "zeroshard [rank %d] %s: %.*s\n", record.rank, to_string(record.level),
                 static_cast<int>(record.message.size()), record.message.data());
  } else {
    std::fprintf(stderr, "zeroshard %s: %.*s\n", to_string(record.level),
                 static_cast<int>(record.message.size()), record.message.data());
  }
  std::fflush(stderr);
}

}  // namespace

const char* to_string(LogLevel level) noexcept {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kProgress:
      return "progress";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kError:
      return "error";
    case LogLevel::kOff:
      return "off";
  }
  return "unknown";
}

void set_log_sink(LogSink new_sink) {
  std::lock_guard<std::mutex> lock(sink_mutex());
  sink() = std::move(new_sink);
}

void set_log_level(LogLevel level) noexcept {
  g_threshold.store(static_cast<int>(level), std::memory_order_relaxed);
}

LogLevel log_level() {
  int threshold = g_threshold.load(std::memory_order_relaxed);
  if (threshold < 0) {
    threshold = static_cast<int>(level_from_environment());
    g_threshold.store(threshold, std::memory_order_relaxed);
  }
  return static_cast<LogLevel>(threshold);
}

namespace detail {

bool log_enabled(LogLevel level) noexcept {
  LogLevel threshold = LogLevel::kProgress;
  try {
    threshold = log_level();
  } catch (const Error& error) {
    // A record may be emitted from a destructor, so a bad variable cannot throw here: it is said
    // once and the default threshold kept.
    set_log_level(threshold);
    log(LogLevel::kWarning, std::string(error.what()) + "; using progress");
  }
  return level != LogLevel::kOff && static_cast<int>(level) >= static_cast<int>(threshold);
}

void log(LogLevel level, const std::string& message) noexcept {
  const LogRecord record{.level = level, .rank = rank_for_messages(), .message = message};
  std::lock_guard<std::mutex> lock(sink_mutex());
  try {
    if (sink()) {
      sink()(record);
      return;
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "zeroshard: the log sink threw (%s); this record follows on stderr\n",
                 error.what());
  }
  write_to_stderr(record);
}

}  // namespace detail
}  // namespace zeroshard
