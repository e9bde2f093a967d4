// The accounting allocator counts every byte by category, keeps true peaks, and the report
// renders the same numbers as a table and as JSON.
#include "memory/memory_tracker.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace zeroshard::detail {
namespace {

TEST(MemoryTracker, CountsCurrentAndPeakPerCategory) {
  MemoryTracker tracker;
  {
    TrackedBuffer a(tracker, MemoryCategory::kParameters, 1000);
    TrackedBuffer b(tracker, MemoryCategory::kCommunication, 300);
    EXPECT_EQ(tracker.current(MemoryCategory::kParameters), 1000);
    EXPECT_EQ(tracker.current(MemoryCategory::kCommunication), 300);
    b.reset();
    EXPECT_EQ(tracker.current(MemoryCategory::kCommunication), 0);
    TrackedBuffer c(tracker, MemoryCategory::kCommunication, 200);
  }
  const MemoryReport report = tracker.report(0, 1);
  EXPECT_EQ(report.at(MemoryCategory::kParameters).current, 0);
  EXPECT_EQ(report.at(MemoryCategory::kParameters).peak, 1000);
  EXPECT_EQ(report.at(MemoryCategory::kCommunication).peak, 300);
  // The total peak is the most held at once (1300), not the sum of the category peaks.
  EXPECT_EQ(report.total_peak[0], 1300);
}

TEST(MemoryTracker, BuffersAreAlignedZeroedAndMovable) {
  MemoryTracker tracker;
  TrackedBuffer a(tracker, MemoryCategory::kGradients, 100);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a.data()) % kBufferAlignment, 0u);
  for (std::size_t i = 0; i < 100; ++i) EXPECT_EQ(a.as<unsigned char>()[i], 0);
  TrackedBuffer b = std::move(a);
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(tracker.current(MemoryCategory::kGradients), 100);
  b = TrackedBuffer();
  EXPECT_EQ(tracker.current(MemoryCategory::kGradients), 0);
}

TEST(MemoryReport, JsonAndTableCarryTheSameNumbers) {
  MemoryTracker tracker;
  TrackedBuffer a(tracker, MemoryCategory::kOptimizerStates, 4096);
  const MemoryReport report = tracker.report(2, 4);
  const auto json = nlohmann::json::parse(report.to_json());
  EXPECT_EQ(json["rank"], 2);
  EXPECT_EQ(json["world_size"], 4);
  EXPECT_EQ(json["host"]["optimizer_states"]["current"], 4096);
  EXPECT_EQ(json["host"]["parameters"]["peak"], 0);
  EXPECT_GT(json["process_peak_rss"].get<std::int64_t>(), 0);
  const std::string table = report.to_table();
  EXPECT_NE(table.find("optimizer_states"), std::string::npos);
  EXPECT_NE(table.find("4096"), std::string::npos);
  EXPECT_NE(table.find("rank 2/4"), std::string::npos);
}

}  // namespace
}  // namespace zeroshard::detail
