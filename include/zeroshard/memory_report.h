// Where every byte goes: the per-rank bytes the library holds, by category and location, current
// and peak, as counted by the one allocator all its buffers come from.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "zeroshard/export.h"

namespace zeroshard {

/// What a buffer holds. Master weights are the fp32 copy kept beside 16-bit parameters; with fp32
/// training the parameters are the master weights and this category stays empty. Communication
/// also holds the engine's other bounded working buffers (the fp32 chunk 16-bit gradients are
/// widened in), so that the first four categories are exactly the model states.
enum class MemoryCategory {
  kParameters,
  kGradients,
  kMasterWeights,
  kOptimizerStates,
  kCommunication,
  kActivations,
};
inline constexpr int kMemoryCategoryCount = 6;
/// "parameters", "gradients", "master_weights", "optimizer_states", "communication",
/// "activations".
ZEROSHARD_API const char* to_string(MemoryCategory category) noexcept;

/// Host memory, memory on the accelerator, or swap files on NVMe (bytes on disk).
enum class MemoryLocation { kHost, kDevice, kNvme };
inline constexpr int kMemoryLocationCount = 3;
/// "host", "device" or "nvme".
ZEROSHARD_API const char* to_string(MemoryLocation location) noexcept;

/// Bytes held now and the most ever held at once, for one category at one location.
struct MemoryUsage {
  std::int64_t current = 0;
  std::int64_t peak = 0;
};

/// A snapshot of one rank's memory, taken from the engine's allocator.
struct ZEROSHARD_API MemoryReport {
  int rank = 0;
  int world_size = 1;
  std::array<std::array<MemoryUsage, kMemoryCategoryCount>, kMemoryLocationCount> usage{};
  /// Of `usage`, the current bytes that are the model's own memory the engine works in
  /// (Engine::adopt_memory) rather than buffers it allocated.
  std::array<std::array<std::int64_t, kMemoryCategoryCount>, kMemoryLocationCount> adopted{};
  /// Buffers held between uses instead of being freed and allocated again, apart from every
  /// category: stage 3's gathered copies across a step where they are host memory, to which a
  /// fresh allocation would fault new pages in at every step.
  std::array<MemoryUsage, kMemoryLocationCount> kept_for_reuse{};
  /// Peak of the sum over categories and kept_for_reuse at one location (not the sum of the
  /// per-category peaks).
  std::array<std::int64_t, kMemoryLocationCount> total_peak{};
  /// Peak resident set size of the whole process (VmHWM), as the kernel reports it.
  std::int64_t process_peak_rss = 0;

  const MemoryUsage& at(MemoryCategory category,
                        MemoryLocation location = MemoryLocation::kHost) const {
    return usage[static_cast<int>(location)][static_cast<int>(category)];
  }
  /// Parameters + gradients + master weights + optimizer states, current bytes.
  std::int64_t model_state_bytes(MemoryLocation location = MemoryLocation::kHost) const;
  /// Every category and kept_for_reuse, current bytes.
  std::int64_t total_current(MemoryLocation location = MemoryLocation::kHost) const;

  /// A fixed-width table, one row per category, with current and peak in bytes and MiB.
  std::string to_table() const;
  /// {"rank":0,"world_size":4,"host":{"parameters":{"current":..,"peak":..,"adopted":..},...},...}
  std::string to_json() const;
};

}  // namespace zeroshard
