// csv_monitor and tensorboard: the event encoding byte for byte, the CSV files an engine writes
// (one row per step, equal to what step() returned, memory peaks equal to the final report), and
// a folder that cannot be written or a full disk as a named error before the first step.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "comm/self_communicator.h"
#include "monitor/comms_report.h"
#include "monitor/event_encoding.h"
#include "monitor/series_writer.h"
#include "mpi/toy_model.h"
#include "util/crc32c.h"

namespace zeroshard::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

/// A fresh folder under the temporary directory, removed at the end.
class TempFolder {
 public:
  explicit TempFolder(const std::string& name)
      : path_(fs::temp_directory_path() /
              ("zeroshard-monitor-" + name + "-" + std::to_string(::getpid()))) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempFolder() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::string bytes(std::initializer_list<int> values) {
  std::string text;
  for (int v : values) text.push_back(static_cast<char>(v));
  return text;
}

TEST(EventEncoding, ScalarRecordIsTheProtobufWireFormatInAFrame) {
  // Event{wall_time 0.5 (field 1, fixed64), step 300 (field 2, varint), summary (field 5)
  // {value (field 1) {tag "a" (field 1), simple_value 1.0f (field 2, fixed32)}}}.
  const std::string expected =
      bytes({0x09, 0,    0,    0,    0, 0, 0,    0xe0, 0x3f,  // 0.5 little-endian
             0x10, 0xac, 0x02,                                // 300 as a varint
             0x2a, 0x0a, 0x0a, 0x08,                          // summary, value
             0x0a, 0x01, 'a',  0x15, 0, 0, 0x80, 0x3f});
  std::string record = "kept";
  detail::append_scalar_record(record, 0.5, 300, "a", 1.0f);
  EXPECT_EQ(record, "kept" + detail::tfrecord_frame(expected));
  EXPECT_EQ(detail::file_version_event(0.0, "v"), bytes({0x09, 0, 0, 0, 0, 0, 0, 0, 0,  //
                                                         0x1a, 0x01, 'v'}));
}

TEST(EventEncoding, FramesCarryTheLengthAndMaskedChecksums) {
  const std::string data = "scalar";
  const std::string frame = detail::tfrecord_frame(data);
  ASSERT_EQ(frame.size(), 8 + 4 + data.size() + 4);
  EXPECT_EQ(frame.substr(0, 8), bytes({6, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(frame.substr(12, data.size()), data);
  // The mask TFRecord defines: rotate right by 15 bits, add 0xa282ead8.
  const std::uint32_t crc = detail::crc32c(data.data(), data.size());
  const std::uint32_t masked = ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
  std::uint32_t stored = 0;
  for (int i = 3; i >= 0; --i) stored = (stored << 8) | static_cast<unsigned char>(frame[18 + i]);
  EXPECT_EQ(stored, masked);
  EXPECT_EQ(detail::masked_crc32c(data), masked);
}

/// The rows of one CSV file, x -> value, with its header.
struct CsvSeries {
  std::string header;
  std::map<std::int64_t, double> rows;
  std::int64_t row_count = 0;
};

CsvSeries read_csv(const fs::path& file) {
  CsvSeries series;
  std::ifstream in(file);
  EXPECT_TRUE(in) << "missing " << file;
  std::getline(in, series.header);
  std::string line;
  while (std::getline(in, line)) {
    const auto comma = line.find(',');
    series.rows[std::stoll(line.substr(0, comma))] = std::stod(line.substr(comma + 1));
    ++series.row_count;
  }
  return series;
}

TEST(CsvWriter, WritesDeepSpeedsLayoutWithExactValues) {
  const TempFolder folder("csv");
  {
    detail::CsvWriter writer(folder.path().string());
    writer.add("Train/Samples/lr", 8, 0.1);
    writer.add("Train/Samples/lr", 16, 1.0 / 3.0);
    writer.flush();
  }
  const CsvSeries lr = read_csv(folder.path() / "Train_Samples_lr.csv");
  EXPECT_EQ(lr.header, "step,lr");
  ASSERT_EQ(lr.row_count, 2);
  EXPECT_EQ(lr.rows.at(8), 0.1);
  EXPECT_EQ(lr.rows.at(16), 1.0 / 3.0);
}

Config monitored_config(const std::string& output_path) {
  Config config = toy_config(2);
  config.csv_monitor = {.enabled = true, .output_path = output_path, .job_name = "toy"};
  config.tensorboard = {.enabled = true, .output_path = output_path, .job_name = "toy"};
  return config;
}

TEST(TrainingMonitor, EngineWritesOneRowPerStepEqualToStepResults) {
  const TempFolder folder("engine");
  const std::vector<ToyTensor> tensors = uneven_toy_tensors();
  constexpr int kSteps = 5;
  std::vector<StepResult> results;
  MemoryReport report;
  std::int64_t batch = 0;
  {
    Engine engine(monitored_config(folder.path().string()), detail::make_self_communicator(),
                  rule_cases()[0].make());
    const std::vector<Parameter> handles = register_toy(engine, tensors);
    for (int s = 0; s < kSteps; ++s) {
      toy_micro_step(engine, tensors, handles, s);
      results.push_back(engine.step());
      engine.log_loss(10.0 - s);
    }
    report = engine.memory_report();
    // A Config built in code leaves train_batch_size 0: samples count micro batches x ranks.
    batch = engine.config().train_micro_batch_size_per_gpu;
    // The engine's end waits for its monitors' writing thread.
  }
  const fs::path job = folder.path() / "toy";
  const CsvSeries lr = read_csv(job / "Train_Samples_lr.csv");
  const CsvSeries loss = read_csv(job / "Train_Samples_train_loss.csv");
  const CsvSeries norm = read_csv(job / "Train_Step_grad_norm.csv");
  const CsvSeries step_ms = read_csv(job / "Time_step_ms.csv");
  ASSERT_EQ(lr.row_count, kSteps);
  ASSERT_EQ(loss.row_count, kSteps);
  ASSERT_EQ(norm.row_count, kSteps);
  EXPECT_EQ(step_ms.row_count, kSteps);
  for (int s = 0; s < kSteps; ++s) {
    EXPECT_EQ(lr.rows.at((s + 1) * batch), results[s].lr) << "step " << s + 1;
    EXPECT_EQ(loss.rows.at((s + 1) * batch), 10.0 - s) << "step " << s + 1;
    EXPECT_EQ(norm.rows.at(s + 1), results[s].grad_norm) << "step " << s + 1;
  }
  // The series' last peaks are the report's after the last step.
  for (int c = 0; c < kMemoryCategoryCount; ++c) {
    const std::string category = to_string(static_cast<MemoryCategory>(c));
    const CsvSeries peak = read_csv(job / ("Memory_rank0_host_" + category + "_peak_bytes.csv"));
    const CsvSeries current =
        read_csv(job / ("Memory_rank0_host_" + category + "_current_bytes.csv"));
    ASSERT_EQ(peak.row_count, kSteps) << category;
    EXPECT_EQ(peak.rows.rbegin()->second, report.at(static_cast<MemoryCategory>(c)).peak)
        << category;
    EXPECT_EQ(current.rows.rbegin()->second, report.at(static_cast<MemoryCategory>(c)).current)
        << category;
  }
  EXPECT_GT(report.at(MemoryCategory::kOptimizerStates).peak, 0);
  // The event file is there, and opens with its file_version record.
  int event_files = 0;
  for (const auto& entry : fs::directory_iterator(job)) {
    if (entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0) ++event_files;
  }
  EXPECT_EQ(event_files, 1);
}

TEST(TrainingMonitor, AnUnwritableOutputPathIsANamedErrorAtStartUp) {
  const TempFolder folder("unwritable");
  // A regular file where a folder should be: no process, root included, can make folders in it.
  const fs::path file = folder.path() / "a-file";
  std::ofstream(file) << "x";
  const std::vector<ToyTensor> tensors = uneven_toy_tensors();
  Engine engine(monitored_config((file / "runs").string()), detail::make_self_communicator(),
                rule_cases()[0].make());
  try {
    // Registration's copy_from() is the first use of a buffer: it finalizes.
    register_toy(engine, tensors);
    engine.finalize();
    ADD_FAILURE() << "finalize() opened monitors under a regular file";
  } catch (const IoError& error) {
    EXPECT_THAT(error.what(), HasSubstr("csv_monitor.output_path"));
    EXPECT_THAT(error.what(), HasSubstr((file / "runs" / "toy").string()));
  }
}

/// A 1 MiB tmpfs at a fresh folder, standing in for a disk that is full; unmounted at the end.
class SmallDisk {
 public:
  SmallDisk() : folder_("small-disk") {
    mounted_ = ::mount("tmpfs", folder_.path().c_str(), "tmpfs", 0, "size=1m") == 0;
    if (!mounted_) error_ = std::strerror(errno);
  }
  ~SmallDisk() {
    if (mounted_) ::umount2(folder_.path().c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }
  const fs::path& path() const { return folder_.path(); }

 private:
  TempFolder folder_;
  bool mounted_ = false;
  std::string error_;
};

TEST(TrainingMonitor, AFullDiskIsANamedErrorAtStartUp) {
  const SmallDisk disk;
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a 1 MiB tmpfs here: " << disk.error();
  fs::create_directories(disk.path() / "toy");
  {
    std::ofstream filler(disk.path() / "filler", std::ios::binary);
    const std::vector<char> block(4096, 'x');
    while (filler.write(block.data(), static_cast<std::streamsize>(block.size()))) filler.flush();
  }
  const std::vector<ToyTensor> tensors = uneven_toy_tensors();
  Engine engine(monitored_config(disk.path().string()), detail::make_self_communicator(),
                rule_cases()[0].make());
  try {
    register_toy(engine, tensors);
    engine.finalize();
    ADD_FAILURE() << "finalize() opened monitors on a full disk";
  } catch (const IoError& error) {
    EXPECT_THAT(error.what(), HasSubstr(std::strerror(ENOSPC)));
    EXPECT_THAT(error.what(), HasSubstr((disk.path() / "toy").string()));
  }
}

TEST(CommsReport, BandwidthFollowsTheCollectivesTraffic) {
  // 1 MB in 1 ms on 4 ranks: 1 GB/s of message.
  const CollectiveTiming all_reduce{
      .op = Collective::kAllReduce, .message_bytes = 1000000, .calls = 2, .seconds = 0.002};
  EXPECT_DOUBLE_EQ(detail::bandwidth(all_reduce, 4).algorithm, 2e9);
  EXPECT_DOUBLE_EQ(detail::bandwidth(all_reduce, 4).bus, 1e9 * 2 * 3 / 4);
  CollectiveTiming gather = all_reduce;
  gather.op = Collective::kAllGather;
  EXPECT_DOUBLE_EQ(detail::bandwidth(gather, 4).algorithm, 1e9);
  EXPECT_DOUBLE_EQ(detail::bandwidth(gather, 4).bus, 1e9 * 3 / 4);
  const std::vector<CollectiveTiming> since = detail::timings_since(
      {all_reduce},
      {CollectiveTiming{
           .op = Collective::kAllReduce, .message_bytes = 1000000, .calls = 5, .seconds = 0.005},
       gather});
  ASSERT_EQ(since.size(), 2u);
  EXPECT_EQ(since[0].calls, 3);
  EXPECT_DOUBLE_EQ(since[0].seconds, 0.003);
  EXPECT_EQ(since[1].calls, 2);
}

TEST(CommsReport, CommunicatorTimesTheKindsItIsAskedFor) {
  const std::unique_ptr<Communicator> comm = detail::make_self_communicator();
  std::vector<float> data(1000, 1.0f);
  comm->all_reduce(std::span<float>(data));
  EXPECT_TRUE(comm->timings().empty()) << "timed before set_timing()";
  TimingOptions options{.enabled = true};
  options.kinds[static_cast<int>(Collective::kBroadcast)] = false;
  comm->set_timing(options);
  comm->all_reduce(std::span<float>(data));
  comm->all_reduce(std::span<float>(data).first(10));
  comm->all_reduce(std::span<float>(data));
  comm->broadcast(std::span<float>(data), 0);
  const std::vector<CollectiveTiming> timings = comm->timings();
  ASSERT_EQ(timings.size(), 2u);
  EXPECT_EQ(timings[0].op, Collective::kAllReduce);
  EXPECT_EQ(timings[0].message_bytes, 40);
  EXPECT_EQ(timings[0].calls, 1);
  EXPECT_EQ(timings[1].message_bytes, 4000);
  EXPECT_EQ(timings[1].calls, 2);
  EXPECT_GE(timings[1].seconds, 0.0);
}

TEST(CommsReport, ProfOpsChoosesTheTimedKindsWhenProfAllIsOff) {
  CommsLoggerConfig logger{.enabled = true, .prof_all = false, .prof_ops = {"all_gather"}};
  const TimingOptions options = detail::timing_options(logger);
  EXPECT_TRUE(options.enabled);
  EXPECT_TRUE(options.kinds[static_cast<int>(Collective::kAllGather)]);
  EXPECT_FALSE(options.kinds[static_cast<int>(Collective::kAllReduce)]);
  logger.prof_all = true;
  EXPECT_TRUE(detail::timing_options(logger).kinds[static_cast<int>(Collective::kAllReduce)]);
}

}  // namespace
}  // namespace zeroshard::testing
