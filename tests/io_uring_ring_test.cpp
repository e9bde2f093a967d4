// IoUringRing: a ring with a submission-polling thread moves data as one without, and a refused
// SQPOLL falls back to a plain ring instead of failing.
#include "offload/io_uring_ring.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <liburing.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <filesystem>
#include <string>

namespace zeroshard::detail {
namespace {

namespace fs = std::filesystem;

// Writes `text` at offset 0 of a fresh file through `ring` and reads it back with pread.
std::string write_through(IoUringRing& ring, const fs::path& file, const std::string& text) {
  const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  EXPECT_GE(fd, 0);
  io_uring_prep_write(ring.next_sqe(), fd, text.data(), static_cast<unsigned>(text.size()), 0);
  int submitted = 0;
  while (submitted == 0) submitted = ring.submit();
  std::array<RingCompletion, 2> completions{};
  EXPECT_EQ(ring.wait(1, completions), 1);
  EXPECT_EQ(completions[0].result, static_cast<int>(text.size()));
  std::string back(text.size(), '\0');
  EXPECT_EQ(::pread(fd, back.data(), back.size(), 0), static_cast<ssize_t>(back.size()));
  ::close(fd);
  fs::remove(file);
  return back;
}

fs::path test_file() {
  return fs::current_path() / (std::string("io_uring_ring_test_") +
                               ::testing::UnitTest::GetInstance()->current_test_info()->name());
}

TEST(IoUringRing, WritesWithOrWithoutASubmissionPollingThread) {
  for (const bool sq_poll : {false, true}) {
    SCOPED_TRACE(sq_poll ? "sq_poll" : "no sq_poll");
    RingOptions options;
    options.sq_poll = sq_poll;
    IoUringRing ring(4, "the test file", options);
    if (!sq_poll) {
      EXPECT_FALSE(ring.sq_polling());
    }
    EXPECT_EQ(write_through(ring, test_file(), "zeroshard ring"), "zeroshard ring");
  }
}

TEST(IoUringRing, ARefusedSqPollFallsBackToAPlainRing) {
  RingOptions options;
  options.sq_poll = true;
  options.sq_poll_cpu = 1 << 20;  // no such CPU: the kernel refuses with EINVAL
  IoUringRing ring(4, "the test file", options);
  EXPECT_FALSE(ring.sq_polling());
  EXPECT_EQ(write_through(ring, test_file(), "after the fallback"), "after the fallback");
}

}  // namespace
}  // namespace zeroshard::detail
