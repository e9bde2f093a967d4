// The flight recorder: a ring of this rank's last collectives (number, operation, size, when it
// started and ended), kept so that a hang can be traced to the collective and rank it began at.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "zeroshard/communicator.h"
#include "zeroshard/dtype.h"

namespace zeroshard::detail {

/// Entries kept when ZEROSHARD_FLIGHT_RECORDER_SIZE is not set.
inline constexpr std::size_t kDefaultFlightRecorderSize = 256;

/// ZEROSHARD_FLIGHT_RECORDER_SIZE, or the default; throws ConfigError unless it is 1..1000000.
std::size_t flight_recorder_size_from_environment();

enum class RecordState { kPending, kCompleted, kFailed };
const char* to_string(RecordState state) noexcept;

struct FlightRecord {
  std::int64_t seq = 0;
  Collective op = Collective::kBarrier;
  std::int64_t count = 0;
  std::optional<DType> dtype;  ///< none for a barrier
  RecordState state = RecordState::kPending;
  // Wall-clock times are what ranks on different hosts can compare; the steady clock gives
  // durations that a clock adjustment cannot distort.
  std::chrono::system_clock::time_point started_wall;
  std::chrono::steady_clock::time_point started;
  std::chrono::steady_clock::time_point ended;  ///< meaningful unless pending

  /// Seconds from start to end, or to `now` while pending.
  double seconds(std::chrono::steady_clock::time_point now) const noexcept;
};

/// The ring itself. Not thread-safe, like the communicator that owns it.
class FlightRecorder {
 public:
  explicit FlightRecorder(std::size_t capacity);

  /// Records a collective starting now; overwrites the oldest entry once the ring is full.
  FlightRecord& add(std::int64_t seq, Collective op, std::int64_t count,
                    std::optional<DType> dtype);
  /// The entry for `seq`, or null when it has left the ring.
  FlightRecord* find(std::int64_t seq) noexcept;
  const FlightRecord* find(std::int64_t seq) const noexcept;
  /// The oldest entry still pending, or null.
  const FlightRecord* oldest_pending() const noexcept;
  /// Entries oldest first.
  std::vector<FlightRecord> in_order() const;
  std::size_t capacity() const noexcept { return ring_.size(); }

 private:
  std::vector<FlightRecord> ring_;
  std::size_t next_ = 0;  // slot the next add() writes
  std::size_t filled_ = 0;
};

}  // namespace zeroshard::detail
