// Fault injection for the swapper's tests: replace the result of a chosen completed request, so
// that EIO, short transfers and EAGAIN can be provoked on any file system.
#pragma once

#include <cstdint>

namespace zeroshard::detail {

enum class IoFaultKind {
  kNone,
  kEio,            ///< the request fails with -EIO (its bytes may well have reached the file)
  kShortTransfer,  ///< the request reports half its bytes (rounded down to a page) done
  kEagain,         ///< the request reports -EAGAIN, as a busy queue may
};

/// From the moment it is set: completions number 1, 2, ...; completions `at_completion` to
/// `at_completion + count - 1` get `kind`'s result instead of their own.
struct IoFault {
  IoFaultKind kind = IoFaultKind::kNone;
  std::int64_t at_completion = 1;
  std::int64_t count = 1;
};

}  // namespace zeroshard::detail
