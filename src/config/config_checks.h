// The checks of a whole Config that the engine relies on, in one place: the parser runs them at
// the end of every parse and the engine runs them on the Config it is given, so that what
// zeroshard-config accepts the engine accepts, and a Config built in code is held to the same
// rules.
#pragma once

#include <cstdint>

#include "zeroshard/config.h"

namespace zeroshard {

/// What the NVMe swapper can do, which check_aio() holds the aio section to: O_DIRECT pieces of
/// whole pages up to 1 GiB, and no more than kAioMaxInFlight pieces in flight.
inline constexpr std::int64_t kAioBlockAlignment = 4096;
inline constexpr std::int64_t kAioMaxBlockSize = std::int64_t{1} << 30;
inline constexpr std::int64_t kAioMaxInFlight = 4096;

/// Throws ConfigError naming the key when `config` asks for what the engine refuses: a key that
/// is accepted only at its default set otherwise (aio.use_gds, contiguous_gradients, ...), offload
/// devices that do not go together, aio settings the swapper cannot use, gradient types the
/// engine cannot honour, or optimizer and scheduler params that the update rule or the schedule
/// refuses (the scheduler is checked as for a rule with betas when the config names no optimizer;
/// the engine checks it again with the program's rule).
void check_config(const Config& config);

/// The aio settings alone, for the swapper, which is also built without a Config.
void check_aio(const AioConfig& aio);

}  // namespace zeroshard
