// Internal side of the log facility: the emit call and a macro that formats only records that
// pass the threshold.
#pragma once

#include <sstream>
#include <string>

#include "zeroshard/log.h"

namespace zeroshard::detail {

/// Never throws: a bad ZEROSHARD_LOG_LEVEL is reported as a warning and the default kept.
bool log_enabled(LogLevel level) noexcept;
/// Hands one record to the sink; never throws (a failing sink is reported on stderr).
void log(LogLevel level, const std::string& message) noexcept;

}  // namespace zeroshard::detail

/// ZEROSHARD_LOG(kWarning, "bucket " << i << " is late"): the message is built only when shown.
#define ZEROSHARD_LOG(level, msg)                                                      \
  do {                                                                                 \
    if (::zeroshard::detail::log_enabled(::zeroshard::LogLevel::level)) {              \
      std::ostringstream zeroshard_log_os_;                                            \
      zeroshard_log_os_ << msg;                                                        \
      ::zeroshard::detail::log(::zeroshard::LogLevel::level, zeroshard_log_os_.str()); \
    }                                                                                  \
  } while (0)
