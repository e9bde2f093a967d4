// The accounting allocator counts every byte by category, keeps true peaks, zeroes large buffers
// on the OpenMP team on huge-page boundaries, and the report renders the same numbers as a table
// and as JSON.
#include "memory/memory_tracker.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include <nlohmann/json.hpp>

#include "memory/host_first_touch.h"  // kHugePageBytes

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

TEST(MemoryTracker, LargeBuffersAreOnHugePageBoundariesAndZeroedOnAnyThreadCount) {
  MemoryTracker tracker;
  // Past the threshold of the team's fill, ending inside a tile; reused memory holds old bytes.
  const std::size_t bytes = (std::size_t{5} << 20) + 4100;
  const int saved_threads = omp_get_max_threads();
  for (int threads = 1; threads <= 3; ++threads) {
    omp_set_num_threads(threads);
    {
      TrackedBuffer dirty(tracker, MemoryCategory::kOptimizerStates, bytes);
      std::memset(dirty.data(), 0xA5, bytes);
    }
    TrackedBuffer a(tracker, MemoryCategory::kOptimizerStates, bytes);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a.data()) % kHugePageBytes, 0u);
    const auto* data = a.as<unsigned char>();
    EXPECT_EQ(std::count(data, data + bytes, 0), static_cast<std::ptrdiff_t>(bytes))
        << threads << " threads";
  }
  omp_set_num_threads(saved_threads);
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

TEST(MemoryTracker, ResetPeaksStartsThemOverFromTheCurrentBytes) {
  MemoryTracker tracker;
  TrackedBuffer kept(tracker, MemoryCategory::kGradients, 100);
  { TrackedBuffer gone(tracker, MemoryCategory::kCommunication, 1000); }
  tracker.reset_peaks();
  const MemoryReport report = tracker.report(0, 1);
  EXPECT_EQ(report.at(MemoryCategory::kCommunication).peak, 0);
  EXPECT_EQ(report.at(MemoryCategory::kGradients).peak, 100);
  EXPECT_EQ(report.total_peak[0], 100);
}

TEST(MemoryReport, AdoptedMemoryIsCountedListedAndNeverFreed) {
  MemoryTracker tracker;
  std::vector<float> model(256, 1.5f);
  {
    TrackedBuffer own(tracker, MemoryCategory::kParameters, 512);
    TrackedBuffer adopted =
        TrackedBuffer::adopt(tracker, MemoryCategory::kParameters, model.size() * sizeof(float),
                             host_memory(), model.data());
    EXPECT_EQ(adopted.as<float>(), model.data());
    EXPECT_EQ(adopted.as<float>()[7], 1.5f) << "adopting must not zero the model's values";
    const MemoryReport report = tracker.report(0, 1);
    EXPECT_EQ(report.at(MemoryCategory::kParameters).current, 512 + 1024);
    EXPECT_EQ(report.adopted[0][static_cast<int>(MemoryCategory::kParameters)], 1024);
    const auto json = nlohmann::json::parse(report.to_json());
    EXPECT_EQ(json["host"]["parameters"]["adopted"], 1024);
    EXPECT_NE(report.to_table().find("of which the model's own parameters: 1024 B"),
              std::string::npos);
    TrackedBuffer moved = std::move(adopted);
    EXPECT_EQ(moved.data(), model.data());
  }
  const MemoryReport after = tracker.report(0, 1);
  EXPECT_EQ(after.at(MemoryCategory::kParameters).current, 0);
  EXPECT_EQ(after.adopted[0][static_cast<int>(MemoryCategory::kParameters)], 0);
  EXPECT_EQ(model[255], 1.5f);
}

TEST(MemoryReport, KeptBuffersLeaveTheirCategoryButStayInTheTotal) {
  MemoryTracker tracker;
  TrackedBuffer gathered(tracker, MemoryCategory::kParameters, 800);
  TrackedBuffer shard(tracker, MemoryCategory::kParameters, 200);
  const void* address = gathered.data();
  gathered.keep_for_reuse();
  MemoryReport report = tracker.report(0, 1);
  EXPECT_EQ(report.at(MemoryCategory::kParameters).current, 200);
  EXPECT_EQ(report.at(MemoryCategory::kParameters).peak, 1000);
  EXPECT_EQ(report.kept_for_reuse[0].current, 800);
  EXPECT_EQ(report.total_current(), 1000);
  EXPECT_EQ(report.total_peak[0], 1000) << "keeping moves bytes; it allocates none";
  EXPECT_EQ(report.model_state_bytes(), 200);
  const auto json = nlohmann::json::parse(report.to_json());
  EXPECT_EQ(json["host"]["kept_for_reuse"]["current"], 800);
  EXPECT_EQ(json["host"]["kept_for_reuse"]["peak"], 800);
  EXPECT_NE(report.to_table().find("kept for reuse"), std::string::npos);

  TrackedBuffer moved = std::move(gathered);
  moved.reuse();
  EXPECT_EQ(moved.data(), address);
  report = tracker.report(0, 1);
  EXPECT_EQ(report.at(MemoryCategory::kParameters).current, 1000);
  EXPECT_EQ(report.kept_for_reuse[0].current, 0);
  EXPECT_EQ(report.kept_for_reuse[0].peak, 800);

  // A kept buffer freed leaves the kept bytes and the total, not its category.
  moved.keep_for_reuse();
  moved.reset();
  report = tracker.report(0, 1);
  EXPECT_EQ(report.at(MemoryCategory::kParameters).current, 200);
  EXPECT_EQ(report.kept_for_reuse[0].current, 0);
  EXPECT_EQ(report.total_current(), 200);
  EXPECT_EQ(report.total_peak[0], 1000);
}

}  // namespace
}  // namespace zeroshard::detail
