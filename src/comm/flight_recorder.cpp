// The flight recorder's ring and its size from the environment.
#include "comm/flight_recorder.h"

#include <cstdlib>
#include <string>
#include <utility>

#include "zeroshard/error.h"

namespace zeroshard::detail {

std::size_t flight_recorder_size_from_environment() {
  const char* text = std::getenv("ZEROSHARD_FLIGHT_RECORDER_SIZE");
  if (text == nullptr || *text == '\0') return kDefaultFlightRecorderSize;
  char* end = nullptr;
  const long long value = std::strtoll(text, &end, 10);
  if (*end != '\0' || value < 1 || value > 1000000) {
    throw ConfigError("ZEROSHARD_FLIGHT_RECORDER_SIZE",
                      std::string("got '") + text + "', expected a number of entries 1..1000000");
  }
  return static_cast<std::size_t>(value);
}

const char* to_string(RecordState state) noexcept {
  switch (state) {
    case RecordState::kPending:
      return "pending";
    case RecordState::kCompleted:
      return "completed";
    case RecordState::kFailed:
      return "failed";
  }
  return "unknown";
}

double FlightRecord::seconds(std::chrono::steady_clock::time_point now) const noexcept {
  const auto end = state == RecordState::kPending ? now : ended;
  return std::chrono::duration<double>(end - started).count();
}

FlightRecorder::FlightRecorder(std::size_t capacity) : ring_(capacity) {}

FlightRecord& FlightRecorder::add(std::int64_t seq, Collective op, std::int64_t count,
                                  std::optional<DType> dtype) {
  FlightRecord& record = ring_[next_];
  record = FlightRecord{.seq = seq,
                        .op = op,
                        .count = count,
                        .dtype = dtype,
                        .started_wall = std::chrono::system_clock::now(),
                        .started = std::chrono::steady_clock::now(),
                        .ended = {}};
  next_ = (next_ + 1) % ring_.size();
  if (filled_ < ring_.size()) ++filled_;
  return record;
}

FlightRecord* FlightRecorder::find(std::int64_t seq) noexcept {
  return const_cast<FlightRecord*>(std::as_const(*this).find(seq));
}

const FlightRecord* FlightRecorder::find(std::int64_t seq) const noexcept {
  // Sequence numbers are consecutive, so the entry's slot follows from the newest one's.
  if (filled_ == 0) return nullptr;
  const std::size_t newest = (next_ + ring_.size() - 1) % ring_.size();
  const std::int64_t back = ring_[newest].seq - seq;
  if (back < 0 || back >= static_cast<std::int64_t>(filled_)) return nullptr;
  const FlightRecord& record =
      ring_[(newest + ring_.size() - static_cast<std::size_t>(back)) % ring_.size()];
  return record.seq == seq ? &record : nullptr;
}

const FlightRecord* FlightRecorder::oldest_pending() const noexcept {
  const std::size_t oldest = (next_ + ring_.size() - filled_) % ring_.size();
  for (std::size_t i = 0; i < filled_; ++i) {
    const FlightRecord& record = ring_[(oldest + i) % ring_.size()];
    if (record.state == RecordState::kPending) return &record;
  }
  return nullptr;
}

std::vector<FlightRecord> FlightRecorder::in_order() const {
  std::vector<FlightRecord> records;
  records.reserve(filled_);
  const std::size_t oldest = (next_ + ring_.size() - filled_) % ring_.size();
  for (std::size_t i = 0; i < filled_; ++i) records.push_back(ring_[(oldest + i) % ring_.size()]);
  return records;
}

}  // namespace zeroshard::detail
