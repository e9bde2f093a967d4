// Internal check macros: a failed check throws the matching zeroshard error with the expression,
// the source location and this process's rank in the message.
#pragma once

#include <sstream>
#include <string>

#include "zeroshard/error.h"

namespace zeroshard::detail {

/// Rank shown in error messages; set once the communicator knows it (-1 = unknown).
int rank_for_messages() noexcept;
void set_rank_for_messages(int rank) noexcept;

std::string where(const char* file, int line);

}  // namespace zeroshard::detail

#define ZEROSHARD_STRINGIFY_(x) #x

/// Throws UsageError when `cond` is false; the streamed `msg` says what to do instead.
#define ZEROSHARD_CHECK_USAGE(cond, msg)                                                   \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      std::ostringstream zeroshard_check_os_;                                              \
      zeroshard_check_os_ << msg << " [" << ::zeroshard::detail::where(__FILE__, __LINE__) \
                          << ", check '" ZEROSHARD_STRINGIFY_(cond) "']";                  \
      throw ::zeroshard::UsageError(zeroshard_check_os_.str());                            \
    }                                                                                      \
  } while (0)
