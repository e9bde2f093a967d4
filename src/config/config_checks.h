// The checks of a whole Config that the engine relies on, in one place: the parser runs them at
// the end of every parse and the engine runs them on the Config it is given, so that what
// zeroshard-config accepts the engine accepts, and a Config built in code is held to the same
// rules.
#pragma once

#include <array>
#include <cstdint>

#include "zeroshard/config.h"

namespace zeroshard {

/// What the NVMe swapper can do, which check_aio() holds the aio section to: O_DIRECT pieces of
/// whole pages up to 1 GiB, and no more than kAioMaxInFlight pieces in flight.
inline constexpr std::int64_t kAioBlockAlignment = 4096;
inline constexpr std::int64_t kAioMaxBlockSize = std::int64_t{1} << 30;
inline constexpr std::int64_t kAioMaxInFlight = 4096;

/// Throws ConfigError naming the key when keys of `config` contradict each other: fp16 and bf16
/// both enabled, an NVMe offload without nvme_path, an offload the ZeRO stage cannot do, a
/// contiguous activation buffer without number_checkpoints (or the number without the buffer),
/// or a scheduler without a param its type requires. The first part of check_config(); the
/// parser also runs it before its own checks, so that these mistakes are reported before a
/// request for something zeroshard does not implement.
void check_key_combinations(const Config& config);

/// Throws ConfigError naming the key when `config` asks for what the engine refuses: any of
/// check_key_combinations(), a key that is accepted only at its default set otherwise
/// (aio.use_gds, contiguous_gradients, ...), offload devices that do not go together, aio
/// settings the swapper cannot use, gradient types the engine cannot honour, optimizer and
/// scheduler params that the update rule or the schedule refuses (the scheduler is checked as for
/// a rule with betas when the config names no optimizer; the engine checks it again with the
/// program's rule), or an offload_optimizer.ratio other than 1 (not implemented yet).
void check_config(const Config& config);

/// An offload section of zero_optimization with its key path, for rules that hold for both.
struct OffloadSection {
  const char* path;  ///< "zero_optimization.offload_optimizer" or "...offload_param"
  const OffloadConfig& config;
};
std::array<OffloadSection, 2> offload_sections(const ZeroConfig& zero);

/// The aio settings alone, for the swapper, which is also built without a Config.
void check_aio(const AioConfig& aio);

}  // namespace zeroshard
