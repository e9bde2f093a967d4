// The log facility: thresholds, a program's own sink, and the default that restores stderr.
#include "util/log.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "zeroshard/error.h"
#include "zeroshard/log.h"

namespace zeroshard {
namespace {

class Log : public ::testing::Test {
 protected:
  void SetUp() override {
    set_log_sink([this](const LogRecord& record) {
      records_.push_back({record.level, std::string(record.message)});
    });
  }
  void TearDown() override {
    set_log_sink({});
    set_log_level(LogLevel::kProgress);
  }

  struct Seen {
    LogLevel level;
    std::string message;
  };
  std::vector<Seen> records_;
};

TEST_F(Log, ShowsProgressAndWarningsButNotInfoByDefault) {
  set_log_level(LogLevel::kProgress);
  ZEROSHARD_LOG(kInfo, "hidden");
  ZEROSHARD_LOG(kProgress, "step " << 10);
  ZEROSHARD_LOG(kWarning, "late");
  ASSERT_EQ(records_.size(), 2u);
  EXPECT_EQ(records_[0].level, LogLevel::kProgress);
  EXPECT_EQ(records_[0].message, "step 10");
  EXPECT_EQ(records_[1].level, LogLevel::kWarning);
}

TEST_F(Log, DoesNotFormatRecordsBelowTheThreshold) {
  set_log_level(LogLevel::kError);
  int formatted = 0;
  const auto count = [&formatted] { return ++formatted; };
  ZEROSHARD_LOG(kWarning, "value " << count());
  EXPECT_EQ(formatted, 0);
  EXPECT_TRUE(records_.empty());
}

TEST_F(Log, OffSilencesEverything) {
  set_log_level(LogLevel::kOff);
  ZEROSHARD_LOG(kError, "broken");
  EXPECT_TRUE(records_.empty());
}

TEST_F(Log, AThrowingSinkDoesNotEscape) {
  set_log_sink([](const LogRecord&) { throw UsageError("sink failed"); });
  EXPECT_NO_THROW(detail::log(LogLevel::kError, "still reported"));
}

TEST(LogLevelNames, RoundTripThroughTheirNames) {
  EXPECT_STREQ(to_string(LogLevel::kProgress), "progress");
  EXPECT_STREQ(to_string(LogLevel::kWarning), "warning");
}

}  // namespace
}  // namespace zeroshard
