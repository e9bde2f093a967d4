// ChecksumThread: a job's CRC32C is that of its bytes however they were made ready, several jobs
// are served at once, and a dropped job is let go of.
#include "offload/checksum_thread.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

#include "util/crc32c.h"
#include "zeroshard/error.h"

namespace zeroshard::detail {
namespace {

std::vector<std::byte> pattern(std::size_t bytes, unsigned seed) {
  std::vector<std::byte> data(bytes);
  for (std::size_t i = 0; i < bytes; ++i) {
    data[i] = static_cast<std::byte>((i * 2654435761u + seed) >> 13);
  }
  return data;
}

TEST(ChecksumThread, AJobReadyAtOnceGivesItsCrc32c) {
  ChecksumThread thread;
  const std::vector<std::byte> data = pattern(3 * (1 << 20) + 17, 1);
  const std::uint64_t job = thread.start(data.data(), data.size(), data.size());
  EXPECT_EQ(thread.wait(job), crc32c(data.data(), data.size()));
}

TEST(ChecksumThread, AJobExtendedPieceByPieceGivesTheSameCrc32c) {
  ChecksumThread thread;
  const std::vector<std::byte> data = pattern(5 * (1 << 20) + 4093, 2);
  const std::uint64_t job = thread.start(data.data(), data.size(), 0);
  for (std::size_t ready = 4096; ready < data.size(); ready += 777777) {
    thread.extend(job, ready);
    EXPECT_FALSE(thread.take(job).has_value());  // bytes are still missing
  }
  thread.extend(job, data.size());
  EXPECT_EQ(thread.wait(job), crc32c(data.data(), data.size()));
}

TEST(ChecksumThread, AJobWaitingForBytesDoesNotHoldBackAnother) {
  ChecksumThread thread;
  const std::vector<std::byte> first = pattern(2 << 20, 3);
  const std::vector<std::byte> second = pattern(3 << 20, 4);
  const std::uint64_t waiting = thread.start(first.data(), first.size(), 1000);
  const std::uint64_t ready = thread.start(second.data(), second.size(), second.size());
  EXPECT_EQ(thread.wait(ready), crc32c(second.data(), second.size()));
  thread.extend(waiting, first.size());
  EXPECT_EQ(thread.wait(waiting), crc32c(first.data(), first.size()));
}

TEST(ChecksumThread, ADroppedJobIsGoneAndOthersGoOn) {
  ChecksumThread thread;
  const std::vector<std::byte> data = pattern(8 << 20, 5);
  const std::uint64_t dropped = thread.start(data.data(), data.size(), data.size());
  thread.drop(dropped);
  EXPECT_THROW(thread.take(dropped), UsageError);
  const std::uint64_t kept = thread.start(data.data(), 4096, 4096);
  EXPECT_EQ(thread.wait(kept), crc32c(data.data(), 4096));
}

TEST(ChecksumThread, WaitingForAJobWithBytesMissingIsAUsageError) {
  ChecksumThread thread;
  const std::vector<std::byte> data = pattern(4096, 6);
  const std::uint64_t job = thread.start(data.data(), data.size(), 100);
  EXPECT_THROW(thread.wait(job), UsageError);
  thread.drop(job);
}

}  // namespace
}  // namespace zeroshard::detail
