// The flight recorder's ring: it keeps the newest entries, finds them by sequence number and
// knows the oldest one still pending.
#include "comm/flight_recorder.h"

#include <gtest/gtest.h>

namespace zeroshard::detail {
namespace {

TEST(FlightRecorder, KeepsTheNewestEntriesOnceFull) {
  FlightRecorder recorder(3);
  for (std::int64_t seq = 1; seq <= 5; ++seq) {
    recorder.add(seq, Collective::kAllReduce, 10 * seq, DType::kFloat32);
  }
  const std::vector<FlightRecord> records = recorder.in_order();
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records.front().seq, 3);
  EXPECT_EQ(records.back().seq, 5);
  EXPECT_EQ(recorder.find(2), nullptr);
  ASSERT_NE(recorder.find(4), nullptr);
  EXPECT_EQ(recorder.find(4)->count, 40);
  EXPECT_EQ(recorder.find(6), nullptr);
}

TEST(FlightRecorder, FindsTheOldestPendingEntry) {
  FlightRecorder recorder(4);
  recorder.add(1, Collective::kAllGather, 8, DType::kBFloat16).state = RecordState::kCompleted;
  recorder.add(2, Collective::kReduceScatter, 8, DType::kFloat16);
  recorder.add(3, Collective::kBarrier, 0, std::nullopt);
  ASSERT_NE(recorder.oldest_pending(), nullptr);
  EXPECT_EQ(recorder.oldest_pending()->seq, 2);
  recorder.find(2)->state = RecordState::kCompleted;
  EXPECT_EQ(recorder.oldest_pending()->seq, 3);
  recorder.find(3)->state = RecordState::kCompleted;
  EXPECT_EQ(recorder.oldest_pending(), nullptr);
}

TEST(FlightRecorder, MeasuresPendingEntriesUpToNow) {
  FlightRecorder recorder(2);
  FlightRecord& record = recorder.add(1, Collective::kBroadcast, 4, DType::kFloat32);
  EXPECT_GE(record.seconds(record.started + std::chrono::seconds(2)), 2.0);
  record.state = RecordState::kCompleted;
  record.ended = record.started + std::chrono::milliseconds(500);
  EXPECT_DOUBLE_EQ(record.seconds(record.started + std::chrono::seconds(9)), 0.5);
}

}  // namespace
}  // namespace zeroshard::detail
