// The rendezvous file that carries NCCL's unique id from rank 0 to the other ranks without MPI.
// Plain file I/O: runs without a GPU, but is built only with the CUDA backend that uses it.
#include <gtest/gtest.h>

#if ZEROSHARD_WITH_CUDA

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <thread>

#include "comm/cuda/rendezvous_file.h"
#include "zeroshard/error.h"

namespace zeroshard::cuda {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

class RendezvousFile : public ::testing::Test {
 protected:
  void SetUp() override {
    directory_ = fs::temp_directory_path() /
                 ("zeroshard_rdzv_" + std::to_string(::getpid()) + "_" +
                  ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(directory_);
    fs::create_directories(directory_);
  }
  void TearDown() override { fs::remove_all(directory_); }

  fs::path directory_;
};

TEST_F(RendezvousFile, OtherRanksReadWhatRankZeroPublishesLater) {
  const fs::path path = directory_ / "id";
  std::array<std::uint8_t, 128> sent{};
  std::iota(sent.begin(), sent.end(), std::uint8_t{1});
  std::array<std::array<std::uint8_t, 128>, 2> received{};
  std::thread readers[2];
  for (int reader = 0; reader < 2; ++reader) {
    readers[reader] = std::thread([&, reader] {
      exchange_through_file(path, reader + 1, received[reader].data(), 128, 10s);
    });
  }
  std::this_thread::sleep_for(50ms);
  exchange_through_file(path, 0, sent.data(), 128, 10s);
  for (std::thread& reader : readers) reader.join();
  EXPECT_EQ(received[0], sent);
  EXPECT_EQ(received[1], sent);
}

TEST_F(RendezvousFile, PublishingLeavesOnlyTheFinalFile) {
  const fs::path path = directory_ / "id";
  std::array<std::uint8_t, 16> bytes{};
  exchange_through_file(path, 0, bytes.data(), bytes.size(), 1s);
  int files = 0;
  for (const fs::directory_entry& entry : fs::directory_iterator(directory_)) {
    EXPECT_EQ(entry.path(), path);
    ++files;
  }
  EXPECT_EQ(files, 1);
  EXPECT_EQ(fs::file_size(path), bytes.size());
}

TEST_F(RendezvousFile, ReaderTimesOutNamingThePathWhenRankZeroNeverWrites) {
  const fs::path path = directory_ / "never_written";
  std::array<std::uint8_t, 16> bytes{};
  try {
    exchange_through_file(path, 3, bytes.data(), bytes.size(), 50ms);
    FAIL() << "expected TimeoutError";
  } catch (const TimeoutError& error) {
    EXPECT_NE(std::string(error.what()).find(path.string()), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("rank 3"), std::string::npos) << error.what();
  }
}

TEST_F(RendezvousFile, FileOfTheWrongSizeIsAnIoError) {
  const fs::path path = directory_ / "foreign";
  std::ofstream(path) << "abc";
  std::array<std::uint8_t, 16> bytes{};
  EXPECT_THROW(exchange_through_file(path, 1, bytes.data(), bytes.size(), 1s), IoError);
}

TEST_F(RendezvousFile, UnwritableDirectoryIsAnIoError) {
  const fs::path path = directory_ / "missing_directory" / "id";
  std::array<std::uint8_t, 16> bytes{};
  EXPECT_THROW(exchange_through_file(path, 0, bytes.data(), bytes.size(), 1s), IoError);
}

}  // namespace
}  // namespace zeroshard::cuda

#else  // !ZEROSHARD_WITH_CUDA

TEST(RendezvousFile, NeedsTheCudaBackend) {
  GTEST_SKIP() << "zeroshard was built without CUDA; the rendezvous file only bootstraps NCCL";
}

#endif
