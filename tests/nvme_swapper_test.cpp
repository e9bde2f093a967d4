// The NVMe swapper: round trips, generations, CRC32C on both paths, and every promised fault
// (EIO, short transfers, EAGAIN, EFBIG, a truncated file, a flipped byte, tmpfs) as an IoError
// that leaves the previous generation readable. Files live under the build tree.
#include "offload/nvme_swapper.h"

#include <fcntl.h>
#include <gmock/gmock.h>  // HasSubstr
#include <gtest/gtest.h>
#include <sys/resource.h>  // setrlimit(RLIMIT_FSIZE)
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "util/crc32c.h"
#include "zeroshard/error.h"

namespace zeroshard::detail {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

bool direct_io_supported(const fs::path& directory) {
  const fs::path probe = directory / "o_direct_probe";
  const int fd = ::open(probe.c_str(), O_RDWR | O_CREAT | O_DIRECT, 0600);
  if (fd < 0) return false;
  ::close(fd);
  fs::remove(probe);
  return true;
}

class NvmeSwapperTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    directory_ = fs::current_path() / "nvme_swapper_test_files" / info->name();
    fs::remove_all(directory_);
    fs::create_directories(directory_);
    if (!direct_io_supported(directory_)) {
      GTEST_SKIP() << directory_ << " is on a file system without O_DIRECT";
    }
  }
  void TearDown() override { fs::remove_all(directory_); }

  NvmeSwapperOptions options(std::int64_t slot_count, std::int64_t slot_bytes) const {
    NvmeSwapperOptions o;
    o.directory = directory_.string();
    o.rank = 3;
    o.kind = "optimizer";
    o.slot_count = slot_count;
    o.slot_bytes = slot_bytes;
    o.buffer_count = 4;
    o.aio.block_size = 64 * 1024;
    o.aio.queue_depth = 4;
    return o;
  }

  // A pattern that differs per slot and per generation, so a stale copy is caught.
  static void fill(std::span<std::byte> payload, std::int64_t slot, int version) {
    for (std::size_t i = 0; i < payload.size(); ++i) {
      payload[i] = static_cast<std::byte>(
          (i * 131 + static_cast<std::size_t>(slot) * 7 + static_cast<std::size_t>(version) * 29) &
          0xFF);
    }
  }
  static bool holds(std::span<const std::byte> payload, std::int64_t slot, int version) {
    std::vector<std::byte> expected(payload.size());
    fill(expected, slot, version);
    return std::memcmp(expected.data(), payload.data(), payload.size()) == 0;
  }

  static void write_now(NvmeSwapper& swapper, std::int64_t slot, int version, int buffer = 0) {
    fill(swapper.buffer(buffer), slot, version);
    swapper.wait(swapper.write(slot, buffer));
  }
  static bool read_holds(NvmeSwapper& swapper, std::int64_t slot, int version, int buffer = 1) {
    std::memset(swapper.buffer(buffer).data(), 0xEE, swapper.buffer(buffer).size());
    swapper.wait(swapper.read(slot, buffer));
    return holds(swapper.buffer(buffer), slot, version);
  }

  fs::path directory_;
};

TEST(Crc32c, MatchesKnownVectorsOnBothPaths) {
  const std::string digits = "123456789";
  std::vector<unsigned char> zeros(32, 0x00), ones(32, 0xFF);
  EXPECT_EQ(crc32c_portable(digits.data(), digits.size()), 0xE3069283u);
  EXPECT_EQ(crc32c_portable(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(crc32c_portable(ones.data(), ones.size()), 0x62A8AB43u);
  EXPECT_EQ(crc32c_portable(nullptr, 0), 0u);
  EXPECT_EQ(crc32c(digits.data(), digits.size()), 0xE3069283u);
  if (!crc32c_hardware_available()) GTEST_SKIP() << "this CPU has no SSE4.2 crc32";
  EXPECT_EQ(crc32c_hardware(digits.data(), digits.size()), 0xE3069283u);
  EXPECT_EQ(crc32c_hardware(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(crc32c_hardware(ones.data(), ones.size()), 0x62A8AB43u);
}

TEST(Crc32c, HardwareAndPortablePathsAgreeOnAnyLengthAndAlignment) {
  if (!crc32c_hardware_available()) GTEST_SKIP() << "this CPU has no SSE4.2 crc32";
  std::vector<unsigned char> data(5000);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i * 37 + 11);
  for (std::size_t start : {0, 1, 3, 7, 8}) {
    for (std::size_t length : {0, 1, 7, 8, 9, 63, 64, 1000, 4991}) {
      ASSERT_EQ(crc32c_hardware(data.data() + start, length),
                crc32c_portable(data.data() + start, length))
          << "start " << start << " length " << length;
    }
  }
  // Continuing from a previous value equals one pass over the whole.
  const std::uint32_t head = crc32c_hardware(data.data(), 100);
  EXPECT_EQ(crc32c_hardware(data.data() + 100, 900, head), crc32c_portable(data.data(), 1000));
}

// Long buffers take the three-stream paths (blocks of 8 KiB, then of 256 bytes) and their joins.
TEST(Crc32c, ThreeStreamPathsAgreeWithThePortableLoop) {
  if (!crc32c_hardware_available()) GTEST_SKIP() << "this CPU has no SSE4.2 crc32";
  std::vector<unsigned char> data(3 * 8192 * 3 + 3 * 256 * 2 + 77);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i * 131 + 7);
  for (const std::size_t length :
       {std::size_t{3 * 256}, std::size_t{3 * 256 * 2 + 5}, std::size_t{3 * 8192},
        std::size_t{3 * 8192 + 3 * 256 + 9}, data.size() - 8}) {
    for (std::size_t start = 0; start < 8; ++start) {
      ASSERT_EQ(crc32c_hardware(data.data() + start, length, 0x1234u),
                crc32c_portable(data.data() + start, length, 0x1234u))
          << "length " << length << ", start " << start;
    }
  }
}

TEST_F(NvmeSwapperTest, NamesTheFileByRankAndKindAndSizesItForTwoCopies) {
  NvmeSwapper swapper(options(5, 10000));
  EXPECT_EQ(swapper.path(), (directory_ / "zeroshard_rank3_optimizer.swp").string());
  EXPECT_EQ(swapper.record_bytes(), 4096 + 12288);
  EXPECT_EQ(swapper.disk_bytes(), 2 * 5 * swapper.record_bytes());
  EXPECT_EQ(static_cast<std::int64_t>(fs::file_size(swapper.path())), swapper.disk_bytes());
}

TEST_F(NvmeSwapperTest, RoundTripsManySlotsOfOddSizesWithSeveralInFlight) {
  for (const std::int64_t slot_bytes : {1L, 4095L, 4096L, 3 * 65536L + 123L, 1000003L}) {
    SCOPED_TRACE("slot_bytes " + std::to_string(slot_bytes));
    NvmeSwapperOptions o = options(13, slot_bytes);
    o.aio.intra_op_parallelism = 2;
    NvmeSwapper swapper(o);
    // Four writes in flight at a time, one per buffer.
    for (std::int64_t first = 0; first < 13; first += 4) {
      std::vector<SwapTicket> tickets;
      for (std::int64_t slot = first; slot < std::min<std::int64_t>(first + 4, 13); ++slot) {
        const int buffer = static_cast<int>(slot - first);
        fill(swapper.buffer(buffer), slot, 1);
        tickets.push_back(swapper.write(slot, buffer));
      }
      for (SwapTicket t : tickets) swapper.wait(t);
    }
    for (std::int64_t first = 0; first < 13; first += 4) {
      std::vector<std::pair<SwapTicket, std::int64_t>> tickets;
      for (std::int64_t slot = first; slot < std::min<std::int64_t>(first + 4, 13); ++slot) {
        const int buffer = static_cast<int>(slot - first);
        std::memset(swapper.buffer(buffer).data(), 0, swapper.buffer(buffer).size());
        tickets.emplace_back(swapper.read(12 - slot, buffer), 12 - slot);
      }
      for (auto [t, slot] : tickets) {
        swapper.wait(t);
        const int buffer = static_cast<int>(12 - slot - first);
        EXPECT_TRUE(holds(swapper.buffer(buffer), slot, 1)) << "slot " << slot;
      }
    }
  }
}

TEST_F(NvmeSwapperTest, RoundTripsWithSingleSubmitAndWithoutOverlappedEvents) {
  for (const bool single_submit : {false, true}) {
    for (const bool overlap_events : {false, true}) {
      SCOPED_TRACE(std::string("single_submit ") + (single_submit ? "true" : "false") +
                   ", overlap_events " + (overlap_events ? "true" : "false"));
      NvmeSwapperOptions o = options(3, 700000);
      o.aio.single_submit = single_submit;
      o.aio.overlap_events = overlap_events;
      o.aio.block_size = 4096 * 8;
      NvmeSwapper swapper(o);
      for (std::int64_t slot = 0; slot < 3; ++slot) write_now(swapper, slot, 5);
      for (std::int64_t slot = 0; slot < 3; ++slot) EXPECT_TRUE(read_holds(swapper, slot, 5));
    }
  }
}

TEST_F(NvmeSwapperTest, EachWriteIsTheNextGenerationInTheOtherCopy) {
  NvmeSwapper swapper(options(2, 50000));
  EXPECT_EQ(swapper.generation(1), 0u);
  EXPECT_EQ(swapper.current_copy(1), -1);
  for (int version = 1; version <= 4; ++version) {
    write_now(swapper, 1, version);
    EXPECT_EQ(swapper.generation(1), static_cast<std::uint64_t>(version));
    EXPECT_EQ(swapper.current_copy(1), (version - 1) % 2);
    EXPECT_TRUE(read_holds(swapper, 1, version));
  }
  EXPECT_EQ(swapper.generation(0), 0u);
}

TEST_F(NvmeSwapperTest, EioAtRequestKLeavesThePreviousGenerationReadable) {
  NvmeSwapper swapper(options(2, 300000));  // 5 pieces of 64 KiB per record
  write_now(swapper, 0, 1);
  fill(swapper.buffer(0), 0, 2);
  swapper.inject_fault({IoFaultKind::kEio, 3, 1});
  const SwapTicket ticket = swapper.write(0, 0);
  try {
    swapper.wait(ticket);
    FAIL() << "an injected EIO must fail the write";
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), HasSubstr(swapper.path()));
    EXPECT_THAT(e.what(), HasSubstr("offset"));
    EXPECT_THAT(e.what(), HasSubstr("write of slot 0"));
    EXPECT_THAT(e.what(), HasSubstr("Input/output error"));
    EXPECT_THAT(e.what(), HasSubstr("previous generation is still readable"));
  }
  EXPECT_EQ(swapper.generation(0), 1u);
  EXPECT_TRUE(read_holds(swapper, 0, 1));
  // The fault is cleared: the next write succeeds and becomes current.
  write_now(swapper, 0, 2);
  EXPECT_EQ(swapper.generation(0), 2u);
  EXPECT_TRUE(read_holds(swapper, 0, 2));
}

TEST_F(NvmeSwapperTest, EioOnAReadLeavesTheSlotReadableAfterwards) {
  NvmeSwapper swapper(options(1, 200000));
  write_now(swapper, 0, 1);
  swapper.inject_fault({IoFaultKind::kEio, 2, 1});
  EXPECT_THROW(swapper.wait(swapper.read(0, 1)), IoError);
  EXPECT_TRUE(read_holds(swapper, 0, 1));
}

TEST_F(NvmeSwapperTest, ShortTransfersAreCompletedWithTheRest) {
  NvmeSwapper swapper(options(2, 400000));
  swapper.inject_fault({IoFaultKind::kShortTransfer, 1, 6});
  write_now(swapper, 1, 1);
  EXPECT_GE(swapper.resubmissions(), 6);
  swapper.inject_fault({IoFaultKind::kShortTransfer, 2, 4});
  EXPECT_TRUE(read_holds(swapper, 1, 1));
  EXPECT_GE(swapper.resubmissions(), 10);
}

TEST_F(NvmeSwapperTest, EagainIsResubmitted) {
  NvmeSwapper swapper(options(1, 150000));
  swapper.inject_fault({IoFaultKind::kEagain, 1, 3});
  write_now(swapper, 0, 1);
  EXPECT_EQ(swapper.resubmissions(), 3);
  swapper.inject_fault({IoFaultKind::kEagain, 1, 2});
  EXPECT_TRUE(read_holds(swapper, 0, 1));
  EXPECT_EQ(swapper.resubmissions(), 5);
}

TEST_F(NvmeSwapperTest, EndlessEagainBecomesAnIoError) {
  NvmeSwapperOptions o = options(1, 4096);
  o.aio.block_size = 8192;
  NvmeSwapper swapper(o);
  write_now(swapper, 0, 1);
  swapper.inject_fault({IoFaultKind::kEagain, 1, 1000000});
  fill(swapper.buffer(0), 0, 2);
  try {
    swapper.wait(swapper.write(0, 0));
    FAIL() << "endless EAGAIN must end in an IoError";
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), HasSubstr("EAGAIN"));
  }
  swapper.inject_fault({});
  EXPECT_TRUE(read_holds(swapper, 0, 1));
}

TEST_F(NvmeSwapperTest, FileSizeLimitIsAnIoErrorNamingEfbig) {
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  // Exceeding RLIMIT_FSIZE also raises SIGXFSZ, which would kill the test.
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit limited = saved;
  limited.rlim_cur = 256 * 1024;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limited), 0);
  std::optional<std::string> message;
  try {
    NvmeSwapper swapper(options(4, 1 << 20));
  } catch (const IoError& e) {
    message = e.what();
  }
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &saved), 0);
  std::signal(SIGXFSZ, old_handler);
  ASSERT_TRUE(message) << "a file over RLIMIT_FSIZE must raise IoError";
  EXPECT_THAT(*message, HasSubstr("zeroshard_rank3_optimizer.swp"));
  EXPECT_THAT(*message, HasSubstr("File too large"));
  EXPECT_THAT(*message, HasSubstr("ulimit -f"));
  // With the limit restored the same swapper can be made.
  NvmeSwapper swapper(options(4, 1 << 20));
  write_now(swapper, 3, 1);
  EXPECT_TRUE(read_holds(swapper, 3, 1));
}

TEST_F(NvmeSwapperTest, TruncatedFileIsAnIoErrorOnRead) {
  NvmeSwapper swapper(options(3, 100000));
  write_now(swapper, 2, 1);
  ASSERT_EQ(::truncate(swapper.path().c_str(), swapper.record_offset(2, 0)), 0);
  try {
    swapper.wait(swapper.read(2, 1));
    FAIL() << "reading a truncated file must raise IoError";
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), HasSubstr(swapper.path()));
    EXPECT_THAT(e.what(), HasSubstr("truncated"));
    EXPECT_THAT(e.what(), HasSubstr("checkpoint"));
  }
}

TEST_F(NvmeSwapperTest, FlippedByteIsAChecksumIoError) {
  NvmeSwapper swapper(options(2, 100000));
  write_now(swapper, 1, 1);
  const std::int64_t offset = swapper.record_offset(1, swapper.current_copy(1)) + 4096 + 777;
  {
    const int fd = ::open(swapper.path().c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    unsigned char byte = 0;
    ASSERT_EQ(::pread(fd, &byte, 1, offset), 1);
    byte ^= 0x10;
    ASSERT_EQ(::pwrite(fd, &byte, 1, offset), 1);
    ::close(fd);
  }
  try {
    swapper.wait(swapper.read(1, 1));
    FAIL() << "a flipped byte must fail the checksum";
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), HasSubstr("checksum mismatch"));
    EXPECT_THAT(e.what(), HasSubstr(swapper.path()));
    EXPECT_THAT(e.what(), HasSubstr("offset " + std::to_string(swapper.record_offset(1, 0))));
  }
  // Writing the slot again repairs it.
  write_now(swapper, 1, 2);
  EXPECT_TRUE(read_holds(swapper, 1, 2));
}

// The payload is checked on the checksum thread as blocks land; with three stripes they land out
// of order, and a byte flipped in the last block is still found.
TEST_F(NvmeSwapperTest, AFlippedByteInAStripeLandingOutOfOrderIsAChecksumIoError) {
  NvmeSwapperOptions o = options(1, 20 * 65536 + 100);
  o.aio.intra_op_parallelism = 3;
  NvmeSwapper swapper(o);
  write_now(swapper, 0, 1);
  EXPECT_TRUE(read_holds(swapper, 0, 1));
  const std::int64_t offset = swapper.record_offset(0, 0) + swapper.record_bytes() - 4096 - 1;
  {
    const int fd = ::open(swapper.path().c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    unsigned char byte = 0;
    ASSERT_EQ(::pread(fd, &byte, 1, offset), 1);
    byte ^= 0x01;
    ASSERT_EQ(::pwrite(fd, &byte, 1, offset), 1);
    ::close(fd);
  }
  try {
    swapper.wait(swapper.read(0, 1));
    FAIL() << "a flipped byte must fail the checksum";
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), HasSubstr("payload checksum mismatch"));
  }
  write_now(swapper, 0, 2);
  EXPECT_TRUE(read_holds(swapper, 0, 2));
}

// A record of one block is only the piece that carries the header, sent once its checksum is in.
TEST_F(NvmeSwapperTest, ARecordOfOneBlockIsWrittenOnceItsChecksumIsDone) {
  NvmeSwapper swapper(options(2, 1000));
  for (int version = 1; version <= 3; ++version) {
    write_now(swapper, version % 2, version);
    EXPECT_TRUE(read_holds(swapper, version % 2, version));
  }
}

// Reads and writes of several slots in flight at once, each write's header waiting for its own
// checksum and each read checked as it lands, while others keep the queue full.
TEST_F(NvmeSwapperTest, InterleavedReadsAndWritesEachGetTheirOwnChecksum) {
  NvmeSwapper swapper(options(4, 500000));
  for (std::int64_t slot = 0; slot < 2; ++slot) write_now(swapper, slot, 1, 0);
  fill(swapper.buffer(0), 2, 1);
  fill(swapper.buffer(1), 3, 1);
  const SwapTicket w2 = swapper.write(2, 0);
  const SwapTicket r0 = swapper.read(0, 2);
  const SwapTicket w3 = swapper.write(3, 1);
  const SwapTicket r1 = swapper.read(1, 3);
  swapper.wait(r1);
  swapper.wait(w3);
  swapper.wait(r0);
  swapper.wait(w2);
  EXPECT_TRUE(holds(swapper.buffer(2), 0, 1));
  EXPECT_TRUE(holds(swapper.buffer(3), 1, 1));
  EXPECT_TRUE(read_holds(swapper, 2, 1, 2));
  EXPECT_TRUE(read_holds(swapper, 3, 1, 3));
}

// With sq_poll the ring has a submission-polling thread where the kernel allows it and none
// (a logged fallback) where not; records round-trip either way.
TEST_F(NvmeSwapperTest, RoundTripsWithASubmissionPollingThreadWhereAllowed) {
  NvmeSwapperOptions o = options(3, 300000);
  o.ring.sq_poll = true;
  NvmeSwapper swapper(o);
  for (std::int64_t slot = 0; slot < 3; ++slot) write_now(swapper, slot, 4);
  for (std::int64_t slot = 0; slot < 3; ++slot) EXPECT_TRUE(read_holds(swapper, slot, 4));
}

// A record that is whole and of the expected slot, copy and generation but that another rank, a
// swapper of another kind or another run wrote (its file copied over this one's) is refused by
// what differs, and the slot reads again once rewritten.
TEST_F(NvmeSwapperTest, ARecordOfAnotherRankKindOrRunIsRefusedByWhatDiffers) {
  NvmeSwapperOptions mine = options(2, 4096);
  mine.run_id = 0x1234;
  const auto file_bytes = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  struct Case {
    NvmeSwapperOptions theirs;
    std::string holds;
    std::string why;
  };
  std::vector<Case> cases(3, Case{mine, "", ""});
  cases[0].theirs.rank = 4;
  cases[0].holds = "holds rank 4's optimizer of run 0x1234";
  cases[0].why = "another rank's swap file";
  cases[1].theirs.kind = "optimizer_b";
  cases[1].holds = "holds rank 3's optimizer_b of run 0x1234";
  cases[1].why = "another kind's swap file";
  cases[2].theirs.run_id = 0x5678;
  cases[2].holds = "holds rank 3's optimizer of run 0x5678";
  cases[2].why = "a swap file of another run";
  for (const Case& c : cases) {
    std::vector<char> foreign;
    {
      NvmeSwapper theirs(c.theirs);
      write_now(theirs, 0, 1);
      foreign = file_bytes(theirs.path());
    }
    NvmeSwapper swapper(mine);
    write_now(swapper, 0, 1);
    ASSERT_EQ(file_bytes(swapper.path()).size(), foreign.size());
    {
      std::ofstream out(swapper.path(), std::ios::binary | std::ios::in | std::ios::out);
      out.write(foreign.data(), static_cast<std::streamsize>(foreign.size()));
    }
    try {
      swapper.wait(swapper.read(0, 1));
      ADD_FAILURE() << c.holds << ": the record was read as this swapper's";
    } catch (const IoError& e) {
      EXPECT_THAT(e.what(), HasSubstr(swapper.path()));
      EXPECT_THAT(e.what(), HasSubstr(c.holds));
      EXPECT_THAT(e.what(), HasSubstr("expected rank 3's optimizer of run 0x1234"));
      EXPECT_THAT(e.what(), HasSubstr(c.why));
    }
    write_now(swapper, 0, 2);
    EXPECT_TRUE(read_holds(swapper, 0, 2));
  }
}

TEST_F(NvmeSwapperTest, TmpfsPathIsAnIoErrorNamingIt) {
  if (!fs::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm on this machine";
  const fs::path shm = fs::path("/dev/shm") / ("zeroshard_nvme_test_" + std::to_string(getpid()));
  fs::create_directories(shm);
  NvmeSwapperOptions o = options(1, 4096);
  o.directory = shm.string();
  try {
    NvmeSwapper swapper(o);
    ADD_FAILURE() << "a tmpfs directory must be refused";
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), HasSubstr(shm.string()));
    EXPECT_THAT(e.what(), HasSubstr("tmpfs"));
    EXPECT_THAT(e.what(), HasSubstr("nvme_path"));
  }
  fs::remove_all(shm);
}

// As DeepSpeed does, a missing nvme_path is created, parents included.
TEST_F(NvmeSwapperTest, AMissingDirectoryIsCreated) {
  NvmeSwapperOptions o = options(1, 4096);
  o.directory = (directory_ / "absent" / "deeper").string();
  NvmeSwapper swapper(o);
  EXPECT_TRUE(fs::is_directory(o.directory));
  EXPECT_TRUE(fs::exists(swap_file_path(o.directory, o.rank, o.kind)));
}

TEST_F(NvmeSwapperTest, AFileInTheWayOfTheDirectoryIsAnIoErrorNamingIt) {
  const fs::path blocker = directory_ / "blocker";
  { std::ofstream(blocker) << "a file, not a directory"; }
  for (const fs::path& directory : {blocker, blocker / "below"}) {
    NvmeSwapperOptions o = options(1, 4096);
    o.directory = directory.string();
    try {
      NvmeSwapper swapper(o);
      ADD_FAILURE() << directory << ": a file in the way must be refused";
    } catch (const IoError& e) {
      EXPECT_THAT(e.what(), HasSubstr(directory.string()));
      EXPECT_THAT(e.what(), HasSubstr("nvme_path"));
      EXPECT_THAT(e.what(), HasSubstr("not a directory"));
    }
  }
}

TEST_F(NvmeSwapperTest, ChargesPinnedBuffersAndDiskBytesToTheTracker) {
  MemoryTracker tracker;
  {
    NvmeSwapperOptions o = options(3, 100000);
    o.tracker = &tracker;
    o.category = MemoryCategory::kMasterWeights;
    NvmeSwapper swapper(o);
    EXPECT_EQ(swapper.buffer_bytes(), 4 * swapper.record_bytes());
    EXPECT_EQ(tracker.current(MemoryCategory::kMasterWeights), swapper.buffer_bytes());
    EXPECT_EQ(tracker.current(MemoryCategory::kMasterWeights, MemoryLocation::kNvme),
              swapper.disk_bytes());
    const MemoryReport report = tracker.report(0, 1);
    EXPECT_THAT(report.to_json(), HasSubstr("\"nvme\""));
  }
  EXPECT_EQ(tracker.current(MemoryCategory::kMasterWeights), 0);
  EXPECT_EQ(tracker.current(MemoryCategory::kMasterWeights, MemoryLocation::kNvme), 0);
}

TEST_F(NvmeSwapperTest, RefusesBadAioSettingsByKey) {
  NvmeSwapperOptions o = options(1, 4096);
  o.aio.block_size = 1000;
  try {
    NvmeSwapper swapper(o);
    ADD_FAILURE() << "block_size 1000 must be refused";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key_path(), "aio.block_size");
  }
  o = options(1, 4096);
  o.aio.use_gds = true;
  try {
    NvmeSwapper swapper(o);
    ADD_FAILURE() << "use_gds must be refused";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key_path(), "aio.use_gds");
  }
}

TEST_F(NvmeSwapperTest, RefusesABusySlotABusyBufferAndAnUnwrittenRead) {
  NvmeSwapper swapper(options(2, 100000));
  EXPECT_THROW(swapper.read(0, 0), UsageError);
  const SwapTicket t = swapper.write(0, 0);
  EXPECT_THROW(swapper.write(0, 1), UsageError);  // slot 0 has a write in flight
  EXPECT_THROW(swapper.write(1, 0), UsageError);  // buffer 0 is not waited for
  swapper.wait(t);
  EXPECT_THROW(swapper.wait(t), UsageError);  // each ticket once
  EXPECT_THROW(swapper.read(5, 0), UsageError);
}

}  // namespace
}  // namespace zeroshard::detail
