// The checkpoint format on one rank: CRC-32C, the manifest's round trip, the writing and the
// checked reading of shard sections, a disk that fills up during a save, and crash safety: a
// process killed between its shard writes and the `latest` update leaves the previous checkpoint
// the one that loads, and a save that never completed is never loaded.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>  // nlohmann::json

#include "checkpoint/checkpoint_format.h"
#include "checkpoint/direct_io.h"
#include "checkpoint/shard_writer.h"
#include "comm/self_communicator.h"
#include "manifest_mutations.h"
#include "mpi/toy_model.h"
#include "util/crc32c.h"

extern char** environ;

namespace zeroshard::testing {
namespace {

namespace fs = std::filesystem;

// A manifest of two ranks' shards at stage 3 in fp16, with a loss scaler's state.
detail::Manifest sample_manifest() {
  detail::Manifest m;
  m.world_size = 2;
  m.stage = 3;
  m.precision = "fp16";
  m.alignment = 16;
  m.unpadded_total = 10;
  m.padded_total = 32;
  m.shard_size = 16;
  m.tensors.push_back({"w", {2, 5}, 10, 0, true, 0});
  m.rule = "adamw";
  m.state_count = 2;
  m.rule_lr = 0.1;
  m.rule_beta1 = 0.9;
  m.global_step = 7;
  m.scaler = detail::LossScalerState{.scale = 512.0,
                                     .iterations_since_overflow = 3,
                                     .hysteresis_left = 2,
                                     .overflows = 1,
                                     .iteration = 8};
  m.shards = {{"rank_00000.bin", 3 * 16 * 4, 8, {{1, 2}, {3, 4}, {5, 6}}},
              {"rank_00001.bin", 3 * 16 * 4, 8, {{7, 8}, {9, 10}, {11, 12}}}};
  return m;
}

TEST(CheckpointManifest, SurvivesItsJsonRoundTrip) {
  detail::Manifest m = sample_manifest();
  m.user_state = "{\"epoch\": 2}\n\x01";
  const detail::Manifest back = detail::manifest_from_json(detail::manifest_to_json(m), "m");
  EXPECT_EQ(back.tensors[0].shape, m.tensors[0].shape);
  EXPECT_EQ(back.rule_lr, 0.1);
  EXPECT_EQ(back.rule_beta1, 0.9);
  EXPECT_EQ(back.scaler->scale, 512.0);
  EXPECT_EQ(back.scaler->iteration, 8);
  EXPECT_EQ(back.shards[1].chunk_elements, 8);
  EXPECT_EQ(back.shards[1].chunk_crc[2], (std::vector<std::uint32_t>{11, 12}));
  EXPECT_EQ(back.user_state, m.user_state);
  EXPECT_FALSE(back.frozen.has_value());

  // Format 1 checksummed each section whole: it reads as one chunk per section.
  nlohmann::json v1 = nlohmann::json::parse(detail::manifest_to_json(m));
  v1["format_version"] = 1;
  for (nlohmann::json& file : v1["shards"]) {
    file.erase("chunk_elements");
    file.erase("chunk_crc32c");
    file["section_crc32c"] = {21, 22, 23};
  }
  const detail::Manifest old = detail::manifest_from_json(v1.dump(), "m");
  EXPECT_EQ(old.shards[0].chunk_elements, 16);
  EXPECT_EQ(old.shards[0].chunk_crc, (std::vector<std::vector<std::uint32_t>>{{21}, {22}, {23}}));
}

TEST(CheckpointManifest, AShardListThatDoesNotFitIsDamage) {
  detail::Manifest m;
  m.world_size = 2;
  m.padded_total = 32;
  m.shard_size = 16;
  m.shards = {{"rank_00000.bin", 64, 16, {{1}}}};
  EXPECT_THROW(detail::manifest_from_json(detail::manifest_to_json(m), "m"), CheckpointError);
  EXPECT_THROW(detail::manifest_from_json("{\"format_version\": 1", "m"), CheckpointError);
}

/// `call()` throws Error with a message that holds `expected` and no raw newline.
template <class Error, class Call>
void expect_error(Call call, const std::string& expected) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one saying: " << expected;
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(expected), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << "unescaped: " << message;
  }
}

// Each way a tag cannot name one folder inside the checkpoint directory, named in the error.
TEST(CheckpointTag, EachBadTagIsRefusedByWhatIsWrong) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "is empty"},
      {"step\n2", "a newline (\\n) at position 4"},
      {"step\r", "a carriage return (\\r) at position 4"},
      {std::string("a\0b", 3), "a control character (0x00) at position 1"},
      {"a\x1b[2J", "a control character (0x1b) at position 1"},
      {"../other/tag", "a path separator '/' at position 2"},
      {"a/b", "a path separator '/' at position 1"},
      {"..", "'..', the parent folder"},
      {".", "'.', the checkpoint directory itself"},
      {"latest", "the name of the file that points at the latest checkpoint"},
      {"step2.tmp", "ends in '.tmp'"},
  };
  for (const auto& [tag, expected] : cases) {
    expect_error<UsageError>([&] { detail::check_tag(tag); }, expected);
  }
  for (const std::string tag : {"step2", "global_step100", "a..b", "run 3", ".hidden", "tmp"}) {
    EXPECT_NO_THROW(detail::check_tag(tag)) << tag;
  }
}

// `latest` is read as the tag it names and held to the same rules: what it names must be a
// folder inside the directory.
TEST(CheckpointTag, LatestIsCheckedAsATag) {
  const fs::path dir =
      fs::temp_directory_path() / ("zeroshard-latest-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const auto resolve_with = [&](const std::string& content) {
    std::ofstream(dir / "latest", std::ios::binary | std::ios::trunc) << content;
    return detail::resolve_tag(dir.string(), "");
  };
  EXPECT_EQ(resolve_with("step3\n"), "step3");
  EXPECT_EQ(resolve_with("step3"), "step3");  // DeepSpeed writes it without a newline
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"../other/tag\n", "a path separator '/' at position 2"},
      {"/etc\n", "a path separator '/' at position 0"},
      {"..\n", "'..', the parent folder"},
      {"step3\nstep4\n", "a newline (\\n) at position 5"},
      {"step3\r\n", "a carriage return (\\r) at position 5"},
      {"\n", "is empty"},
      {"", "is empty"},
  };
  for (const auto& [content, expected] : refused) {
    expect_error<CheckpointError>([&] { resolve_with(content); },
                                  "checkpoint pointer " + (dir / "latest").string());
    expect_error<CheckpointError>([&] { resolve_with(content); }, expected);
  }
  fs::remove_all(dir);
}

TEST(CheckpointManifest, NegativeCountersAreRefusedByName) {
  detail::Manifest m;
  m.world_size = 1;
  m.padded_total = 16;
  m.shard_size = 16;
  m.shards = {{"rank_00000.bin", 64, 16, {{1}}}};
  EXPECT_NO_THROW(detail::manifest_from_json(detail::manifest_to_json(m), "m"));
  for (const char* key : {"global_step", "micro_step"}) {
    nlohmann::json j = nlohmann::json::parse(detail::manifest_to_json(m));
    j[key] = -1;
    expect_error<CheckpointError>(
        [&] { detail::manifest_from_json(j.dump(), "m"); },
        "field '" + std::string(key) + "': got -1, expected an integer 0..");
  }
}

// Every leaf of a manifest, put in turn each of manifest_mutations(): the parse succeeds or throws
// CheckpointError naming the file, and no integer field takes 2^63 - 1 (the step counters would
// wrap at the next step). Run it under UBSan too (docs/testing.md).
TEST(CheckpointManifest, EveryMutatedFieldParsesOrIsRefusedNamingTheFileAndTheField) {
  detail::Manifest m = sample_manifest();
  m.frozen_total = 4;
  m.tensors.push_back({"f", {4}, 4, 0, false, 0});
  m.groups.push_back({"default", 0.5, 0.25});
  m.frozen = detail::ManifestFile{"frozen.bin", 16, 4, {{13}}};
  m.user_state = "{}";
  const nlohmann::json good = nlohmann::json::parse(detail::manifest_to_json(m));
  ASSERT_NO_THROW(detail::manifest_from_json(good.dump(), "damaged.json"));
  const nlohmann::json largest = std::numeric_limits<std::int64_t>::max();
  int parsed = 0;
  int refused = 0;
  for (const nlohmann::json::json_pointer& leaf : manifest_leaves(good, false)) {
    std::string field = leaf.back();
    for (auto p = leaf; field.find_first_not_of("0123456789") == std::string::npos;) {
      p = p.parent_pointer();
      field = p.back();
    }
    const bool integer = good.at(leaf).is_number_integer();
    for (const nlohmann::json& value : manifest_mutations()) {
      nlohmann::json damaged = good;
      damaged[leaf] = value;
      const std::string where = leaf.to_string() + " = " + value.dump();
      try {
        detail::manifest_from_json(damaged.dump(), "damaged.json");
        ++parsed;
        EXPECT_FALSE(integer && value == largest) << where << " was accepted";
      } catch (const CheckpointError& error) {
        ++refused;
        EXPECT_THAT(error.what(), ::testing::HasSubstr("damaged.json")) << where;
        if (integer && value == largest) {
          EXPECT_THAT(error.what(), ::testing::HasSubstr("'" + field + "'")) << where;
        }
      }
    }
  }
  EXPECT_GT(parsed, 0);
  EXPECT_GT(refused, 300);
}

Engine one_rank_engine() {
  Config config = toy_config(2);
  config.scheduler.type = "WarmupLR";
  config.scheduler.params = {{"warmup_num_steps", 5.0}, {"warmup_max_lr", 0.01}};
  return Engine(std::move(config), detail::make_self_communicator(), rule_cases()[0].make());
}

void train(Engine& engine, const std::vector<ToyTensor>& tensors,
           const std::vector<Parameter>& handles, std::int64_t from, std::int64_t to) {
  for (std::int64_t s = from; s < to; ++s) {
    toy_micro_step(engine, tensors, handles, s);
    engine.step();
  }
}

// The child process of the crash tests: saves step1, then dies where it is told during step2.
TEST(CheckpointCrashChild, SavesUntilKilled) {
  const char* dir = std::getenv("ZEROSHARD_TEST_CRASH_DIR");
  const char* point = std::getenv("ZEROSHARD_TEST_CRASH_POINT");
  if (dir == nullptr || point == nullptr) GTEST_SKIP() << "runs only as the crash tests' child";
  const std::vector<ToyTensor> tensors = uneven_toy_tensors();
  Engine engine = one_rank_engine();
  const std::vector<Parameter> handles = register_toy(engine, tensors);
  train(engine, tensors, handles, 0, 1);
  engine.save_checkpoint(dir, "step1");
  train(engine, tensors, handles, 1, 2);
  detail::set_checkpoint_kill_point(point);
  engine.save_checkpoint(dir, "step2");
  ADD_FAILURE() << "the save passed kill point " << point;
}

/// Runs the child in a new process, which must die of SIGKILL.
void run_killed_child(const std::string& dir, const std::string& point) {
  ::setenv("ZEROSHARD_TEST_CRASH_DIR", dir.c_str(), 1);
  ::setenv("ZEROSHARD_TEST_CRASH_POINT", point.c_str(), 1);
  std::string self = fs::read_symlink("/proc/self/exe").string();
  std::string filter = "--gtest_filter=CheckpointCrashChild.SavesUntilKilled";
  char* argv[] = {self.data(), filter.data(), nullptr};
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv, environ);
  ::unsetenv("ZEROSHARD_TEST_CRASH_DIR");
  ::unsetenv("ZEROSHARD_TEST_CRASH_POINT");
  ASSERT_EQ(spawned, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the child exited with status " << WEXITSTATUS(status);
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
}

class CheckpointCrash : public ::testing::TestWithParam<const char*> {};

TEST_P(CheckpointCrash, LeavesThePreviousCheckpointTheLatest) {
  const fs::path dir = fs::temp_directory_path() / ("zeroshard-crash-" + std::string(GetParam()) +
                                                    "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  run_killed_child(dir.string(), GetParam());
  const std::vector<ToyTensor> tensors = uneven_toy_tensors();
  Engine engine = one_rank_engine();
  const std::vector<Parameter> handles = register_toy(engine, tensors);
  const CheckpointInfo info = engine.load_checkpoint(dir.string());
  EXPECT_EQ(info.tag, "step1");
  EXPECT_EQ(engine.global_step(), 1);
  if (std::string(GetParam()) == "before_rename") {
    EXPECT_TRUE(fs::exists(dir / "step2.tmp"));
    try {
      engine.load_checkpoint(dir.string(), "step2");
      ADD_FAILURE() << "an incomplete checkpoint loaded";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("never completed"), std::string::npos) << e.what();
    }
    // The next save of that tag replaces the leftover.
    train(engine, tensors, handles, 1, 2);
    engine.save_checkpoint(dir.string(), "step2");
    EXPECT_FALSE(fs::exists(dir / "step2.tmp"));
    EXPECT_EQ(engine.load_checkpoint(dir.string()).tag, "step2");
  } else {
    // Complete but not yet the latest: loadable by its tag.
    EXPECT_EQ(engine.load_checkpoint(dir.string(), "step2").global_step, 2);
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(AtEachCommitPoint, CheckpointCrash,
                         ::testing::Values("before_rename", "before_latest"));

/// Element `flat` of section `section` in the synthetic rank files (exact in fp32).
float synthetic_value(int section, std::int64_t flat) {
  return static_cast<float>(flat % 1000003) + 0.5f * static_cast<float>(section);
}

// Sections longer than a chunk, of a few elements, and ending off a block boundary: the file holds
// exactly their values, the returned checksums are those of each 16 MiB chunk of the section, and
// the file is never an existing one. On the temporary folder and on tmpfs (/dev/shm) where there is
// one.
class ShardWriterFolders : public ::testing::TestWithParam<const char*> {};

TEST_P(ShardWriterFolders, WritesEverySectionExactlyWithItsChecksum) {
  const fs::path root = *GetParam() != '\0' ? fs::path(GetParam()) : fs::temp_directory_path();
  if (!fs::is_directory(root)) GTEST_SKIP() << root << " does not exist";
  const fs::path path = root / ("zeroshard-writer-" + std::to_string(::getpid()) + ".bin");
  fs::remove(path);
  const std::int64_t lengths[] = {detail::kIoChunk + 1003, 5, detail::kIoChunk - 7};
  std::vector<std::vector<float>> sections;
  {
    detail::ShardWriter writer(path.string());
    for (int k = 0; k < 3; ++k) {
      std::vector<float>& values = sections.emplace_back(static_cast<std::size_t>(lengths[k]));
      for (std::int64_t i = 0; i < lengths[k]; ++i) values[i] = synthetic_value(k, i);
      const std::vector<std::uint32_t> crcs =
          writer.write_section(lengths[k], [&](float* out, std::int64_t first, std::int64_t n) {
            std::copy_n(values.data() + first, n, out);
          });
      std::vector<std::uint32_t> expected;
      for (std::int64_t at = 0; at < lengths[k]; at += detail::kIoChunk) {
        const std::int64_t n = std::min(detail::kIoChunk, lengths[k] - at);
        expected.push_back(detail::crc32c(values.data() + at, n * 4));
      }
      EXPECT_EQ(crcs, expected) << "section " << k;
    }
    writer.finish();
  }
  EXPECT_EQ(fs::file_size(path), (lengths[0] + lengths[1] + lengths[2]) * 4);
  std::ifstream in(path, std::ios::binary);
  for (int k = 0; k < 3; ++k) {
    std::vector<float> back(sections[k].size());
    in.read(reinterpret_cast<char*>(back.data()), static_cast<std::streamsize>(back.size() * 4));
    EXPECT_TRUE(back == sections[k]) << "section " << k << " differs in the file";
  }
  try {
    detail::ShardWriter again(path.string());
    ADD_FAILURE() << "an existing file was opened for writing";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
  }
  fs::remove(path);
}

INSTANTIATE_TEST_SUITE_P(OnEachFileSystem, ShardWriterFolders, ::testing::Values("", "/dev/shm"));

/// A 1 MiB tmpfs at a fresh folder, standing in for a disk that fills up; unmounted on
/// destruction. mounted() is false where this process may not mount one.
class SmallDisk {
 public:
  SmallDisk()
      : path_(fs::temp_directory_path() / ("zeroshard-small-" + std::to_string(::getpid()))) {
    fs::create_directories(path_);
    mounted_ = ::mount("tmpfs", path_.c_str(), "tmpfs", 0, "size=1m") == 0;
    if (!mounted_) error_ = std::strerror(errno);
  }
  SmallDisk(const SmallDisk&) = delete;
  SmallDisk& operator=(const SmallDisk&) = delete;
  ~SmallDisk() {
    if (mounted_) ::umount2(path_.c_str(), MNT_DETACH);
    fs::remove_all(path_);
  }
  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
  bool mounted_ = false;
  std::string error_;
};

TEST(CheckpointFullDisk, AFailedSaveNamesTheFileAndKeepsThePreviousLatest) {
  const SmallDisk disk;
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a 1 MiB tmpfs here: " << disk.error();
  const std::string dir = (disk.path() / "ckpt").string();
  const std::vector<ToyTensor> tensors = uneven_toy_tensors();
  Engine engine = one_rank_engine();
  const std::vector<Parameter> handles = register_toy(engine, tensors);
  train(engine, tensors, handles, 0, 1);
  engine.save_checkpoint(dir, "step1");
  {
    // Whatever room is left goes to another file.
    std::ofstream filler(disk.path() / "filler", std::ios::binary);
    const std::vector<char> block(4096, 'x');
    while (filler.write(block.data(), static_cast<std::streamsize>(block.size()))) {
      filler.flush();
    }
  }
  train(engine, tensors, handles, 1, 2);
  try {
    engine.save_checkpoint(dir, "step2");
    ADD_FAILURE() << "a save onto a full disk succeeded";
  } catch (const IoError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rank_00000.bin"), std::string::npos) << what;
    EXPECT_NE(what.find(std::strerror(ENOSPC)), std::string::npos) << what;
    EXPECT_NE(what.find("free space"), std::string::npos) << what;
  }
  fs::remove(disk.path() / "filler");
  Engine fresh = one_rank_engine();
  register_toy(fresh, tensors);
  const CheckpointInfo info = fresh.load_checkpoint(dir);
  EXPECT_EQ(info.tag, "step1");
  EXPECT_EQ(fresh.global_step(), 1);
}

/// Two rank files of two sections each, large enough for several read chunks (16 MiB) with a
/// tail, checksummed per chunk (format 2) and per section (format 1): section 0 starts 4096-aligned
/// (read through O_DIRECT where the file system allows it, its tail through the page cache),
/// section 1 does not (read through the page cache).
class ShardReaderFiles : public ::testing::Test {
 protected:
  static constexpr std::int64_t kShard = (std::int64_t{1} << 22) + 1008;

  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("zeroshard-reader-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    m_.world_size = 2;
    m_.state_count = 1;
    m_.shard_size = kShard;
    m_.padded_total = 2 * kShard;
    std::vector<float> section(static_cast<std::size_t>(kShard));
    for (int r = 0; r < 2; ++r) {
      detail::ManifestFile file{detail::shard_file_name(r), 2 * kShard * 4, detail::kIoChunk, {}};
      detail::ManifestFile whole{file.name, file.bytes, kShard, {}};
      std::ofstream out(dir_ / file.name, std::ios::binary);
      for (int k = 0; k < 2; ++k) {
        for (std::int64_t i = 0; i < kShard; ++i) section[i] = synthetic_value(k, r * kShard + i);
        out.write(reinterpret_cast<const char*>(section.data()), kShard * 4);
        file.chunk_crc.push_back(
            {detail::crc32c(section.data(), detail::kIoChunk * 4),
             detail::crc32c(section.data() + detail::kIoChunk, (kShard - detail::kIoChunk) * 4)});
        whole.chunk_crc.push_back({detail::crc32c(section.data(), kShard * 4)});
      }
      m_.shards.push_back(file);
      format_one_.push_back(whole);
    }
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Flips one byte at `offset` of rank file `rank`.
  void damage(int rank, std::int64_t offset) {
    std::fstream f(dir_ / detail::shard_file_name(rank),
                   std::ios::binary | std::ios::in | std::ios::out);
    f.seekg(offset);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x40);
    f.seekp(offset);
    f.write(&c, 1);
  }

  fs::path dir_;
  detail::Manifest m_;
  std::vector<detail::ManifestFile> format_one_;  ///< the same files, checksummed per section
};

TEST_F(ShardReaderFiles, ReadsEveryElementOfAWholeShardAndOfARangeAcrossFiles) {
  const detail::ShardReader reader(m_, dir_.string());
  for (int section = 0; section < 2; ++section) {
    // A whole rank file's section, read into place, and a range across both files, read
    // through the bounce buffers, padded past the saved total with zeros.
    const std::int64_t ranges[2][2] = {{kShard, 2 * kShard}, {kShard - 5000, 2 * kShard + 40}};
    for (const auto& range : ranges) {
      std::vector<float> out(static_cast<std::size_t>(range[1] - range[0]), -1.0f);
      reader.read(section, range[0], range[1], out.data());
      std::int64_t wrong = 0;
      for (std::int64_t flat = range[0]; flat < range[1]; ++flat) {
        const float expected = flat < 2 * kShard ? synthetic_value(section, flat) : 0.0f;
        wrong += out[flat - range[0]] != expected;
      }
      EXPECT_EQ(wrong, 0) << "section " << section << ", range [" << range[0] << ", " << range[1]
                          << ")";
    }
  }
}

TEST_F(ShardReaderFiles, ADamagedByteInAnyChunkIsNamed) {
  // In the aligned section's last full chunk, in its tail, and in the unaligned section.
  const std::int64_t offsets[] = {(std::int64_t{1} << 24) - 3, kShard * 4 - 2, kShard * 4 + 777};
  const char* sections[] = {"section 0", "section 0", "section 1"};
  for (int i = 0; i < 3; ++i) {
    damage(1, offsets[i]);
    std::vector<float> out(static_cast<std::size_t>(kShard));
    try {
      detail::ShardReader(m_, dir_.string()).read(i < 2 ? 0 : 1, kShard, 2 * kShard, out.data());
      ADD_FAILURE() << "a damaged byte at " << offsets[i] << " was read";
    } catch (const CheckpointError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("rank_00001.bin"), std::string::npos) << what;
      EXPECT_NE(what.find(sections[i]), std::string::npos) << what;
      EXPECT_NE(what.find("damaged"), std::string::npos) << what;
    }
    damage(1, offsets[i]);  // restored
  }
}

TEST_F(ShardReaderFiles, AReshardReadsOnlyTheChunksItNeeds) {
  // A damaged byte in rank 1's second chunk of section 0: a range inside its first chunk never
  // reads it; a range that reaches into it names it. Format 1 reads the section whole.
  const std::int64_t damaged = (detail::kIoChunk + 25) * 4;
  damage(1, damaged);
  std::vector<float> out(1000);
  detail::ShardReader(m_, dir_.string()).read(0, kShard + 10, kShard + 1010, out.data());
  std::int64_t wrong = 0;
  for (std::int64_t i = 0; i < 1000; ++i) wrong += out[i] != synthetic_value(0, kShard + 10 + i);
  EXPECT_EQ(wrong, 0);
  const auto expect_named = [&](const detail::Manifest& m, std::int64_t lo, const char* range) {
    try {
      detail::ShardReader(m, dir_.string()).read(0, lo, lo + 1000, out.data());
      ADD_FAILURE() << "a damaged chunk was read, from element " << lo;
    } catch (const CheckpointError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("rank_00001.bin"), std::string::npos) << what;
      EXPECT_NE(what.find(range), std::string::npos) << what;
    }
  };
  expect_named(m_, 2 * kShard - 1000, "elements [4194304, 4195312)");
  detail::Manifest format_one = m_;
  format_one.shards = format_one_;
  expect_named(format_one, kShard + 10, "elements [0, 4195312)");
  damage(1, damaged);  // restored
}

TEST_F(ShardReaderFiles, ATruncatedFileIsNamedWhereItEnds) {
  // Inside the first chunk, not on a block boundary: the direct read comes back short.
  fs::resize_file(dir_ / detail::shard_file_name(0), (std::int64_t{1} << 24) - 10000);
  std::vector<float> out(static_cast<std::size_t>(kShard));
  try {
    detail::ShardReader(m_, dir_.string()).read(0, 0, kShard, out.data());
    ADD_FAILURE() << "a truncated file was read";
  } catch (const CheckpointError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rank_00000.bin"), std::string::npos) << what;
    EXPECT_NE(what.find("truncated"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace zeroshard::testing
