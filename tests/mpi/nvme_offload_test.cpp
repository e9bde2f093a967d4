// Optimizer states on NVMe: host memory holds buffer_count sub-groups whatever the model's size,
// the files hold two records per sub-group, a fault in the middle of a step undoes the step on
// every rank (and training goes on as if that window had been skipped), damage on disk and bad
// paths give an IoError naming the file, and checkpoints round-trip through the swap files.
// (Bit-for-bit equality with resident training, for every stage, precision, rule and pipeline
// shape, is in offload_test.cpp.)
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "engine/engine_internals.h"
#include "mpi/toy_model.h"
#include "offload/nvme_swapper.h"  // swap_record_bytes, swap_file_path

namespace zeroshard::testing {
namespace {

using ::testing::HasSubstr;

constexpr std::int64_t kSubGroup = 24;

Config nvme_config(int stage, DType dtype = DType::kFloat32) {
  Config config = toy_config(stage);
  config.bf16.enabled = dtype == DType::kBFloat16;
  config.zero_optimization.sub_group_size = kSubGroup;
  OffloadConfig& offload = config.zero_optimization.offload_optimizer;
  offload.device = OffloadDevice::kNvme;
  offload.nvme_path = nvme_test_directory();
  offload.buffer_count = 3;
  offload.pipeline_read = true;
  offload.pipeline_write = true;
  return config;
}

// ZeRO-Infinity: the parameter shard on NVMe too, in tiles of 10 elements through 2 buffers, with
// the first 5 elements of each rank's shard kept in CPU memory (max_in_cpu).
constexpr std::int64_t kParamTile = 10;
constexpr std::int64_t kParamsInCpu = 5;

Config infinity_config(DType dtype = DType::kFloat32) {
  Config config = nvme_config(3, dtype);
  OffloadConfig& params = config.zero_optimization.offload_param;
  params.device = OffloadDevice::kNvme;
  params.nvme_path = nvme_test_directory();
  params.buffer_size = kParamTile;
  params.buffer_count = 2;
  params.max_in_cpu = kParamsInCpu;
  return config;
}

struct Trainer {
  Engine engine;
  std::vector<ToyTensor> tensors = uneven_toy_tensors();
  std::vector<Parameter> handles;
  std::int64_t step = 0;

  explicit Trainer(const Config& config) : engine(make_engine(config, make_adamw())) {
    handles = register_toy(engine, tensors);
  }
  StepResult train_step() {
    toy_micro_step_any_precision(engine, tensors, handles, step++);
    return engine.step();
  }
  /// The window a failed step dropped: its batch is passed over.
  void skip_step() { ++step; }
  std::vector<char> model_bytes() { return testing::model_bytes(engine, tensors, handles); }
};

std::string swap_path(const Trainer& run, const char* kind) {
  return detail::swap_file_path(nvme_test_directory(), run.engine.rank(), kind);
}

TEST(NvmeOffloadMemory, HostHoldsBufferCountSubGroupsAndTheFilesTwoRecordsEach) {
  const Config config = nvme_config(2, DType::kBFloat16);
  Trainer run(config);
  for (int s = 0; s < 3; ++s) run.train_step();
  const MemoryReport report = run.engine.memory_report();
  const std::int64_t owned = run.engine.shard_end() - run.engine.shard_begin();
  const std::int64_t tile = std::min(kSubGroup, owned);
  const std::int64_t tiles = (owned + tile - 1) / tile;
  const std::int64_t master_record = detail::swap_record_bytes(4 * tile);
  const std::int64_t states_record = detail::swap_record_bytes(2 * 4 * tile);
  const MemoryLocation host = MemoryLocation::kHost;
  const MemoryLocation nvme = MemoryLocation::kNvme;
  // Host memory: buffer_count records of each file, and never more at any moment of the steps.
  EXPECT_EQ(report.at(MemoryCategory::kMasterWeights, host).current, 3 * master_record);
  EXPECT_EQ(report.at(MemoryCategory::kOptimizerStates, host).current, 3 * states_record);
  EXPECT_EQ(report.at(MemoryCategory::kMasterWeights, host).peak, 3 * master_record);
  EXPECT_EQ(report.at(MemoryCategory::kOptimizerStates, host).peak, 3 * states_record);
  EXPECT_EQ(report.at(MemoryCategory::kMasterWeights, nvme).current, 2 * tiles * master_record);
  EXPECT_EQ(report.at(MemoryCategory::kOptimizerStates, nvme).current, 2 * tiles * states_record);
  // The bf16 gradient shard stays in host memory, beside the update.
  EXPECT_EQ(report.at(MemoryCategory::kGradients, host).current,
            2 * (run.engine.shard_end() - run.engine.shard_begin()));

  // The estimator says the same, byte for byte, for every category the optimizer shard owns.
  EstimateInput in = estimate_input_from_config(config, 0, run.engine.world_size());
  for (const ToyTensor& t : run.tensors) {
    if (t.trainable) in.tensors.push_back(t.numel);
  }
  in.frozen_params = 15;
  const MemoryEstimate estimate = zeroshard::estimate(in);
  ASSERT_TRUE(estimate.valid) << estimate.reason;
  for (MemoryCategory category : {MemoryCategory::kMasterWeights, MemoryCategory::kOptimizerStates,
                                  MemoryCategory::kGradients}) {
    EXPECT_EQ(estimate.at(category, MemoryTier::kHost), report.at(category, host).current)
        << to_string(category);
    EXPECT_EQ(estimate.at(category, MemoryTier::kNvme), report.at(category, nvme).current)
        << to_string(category);
  }
}

TEST(NvmeOffloadMemory, FastInitOffLeavesEveryRecordWrittenBeforeTheFirstStep) {
  Config config = nvme_config(1);
  config.zero_optimization.offload_optimizer.fast_init = false;
  Trainer eager(config);
  // Registration wrote the records: the files hold generation-1 headers from the first page on.
  const std::string master = swap_path(eager, "optimizer_master");
  std::vector<char> head(8);
  const int fd = ::open(master.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0) << master;
  ASSERT_EQ(::pread(fd, head.data(), head.size(), 0), 8);
  ::close(fd);
  EXPECT_EQ(std::string(head.data(), 6), "ZSSWAP");
}

// After a step that failed: `nvme` is back where the step began (`before`, `model_before`), and
// two more steps train it as `resident`, which skips the failed step's window.
void expect_undone_then_as_skipped(Trainer& nvme, Trainer& resident,
                                   const std::vector<float>& before,
                                   const std::vector<char>& model_before, const std::string& what) {
  EXPECT_EQ(nvme.engine.consolidated_parameters(), before) << what;
  EXPECT_EQ(nvme.model_bytes(), model_before) << what;
  resident.skip_step();
  for (int s = 0; s < 2; ++s) {
    nvme.train_step();
    resident.train_step();
  }
  EXPECT_EQ(nvme.engine.consolidated_parameters(), resident.engine.consolidated_parameters())
      << what;
  EXPECT_EQ(nvme.model_bytes(), resident.model_bytes()) << what;
}

// An I/O error part-way through one rank's update: every rank throws, every rank is back at the
// step's start, and training goes on exactly as a run that dropped that window's gradients.
TEST(NvmeOffloadFaults, AnEioMidStepUndoesTheStepOnEveryRank) {
  for (const int array : {0, 1}) {
    for (const std::int64_t at : {std::int64_t{1}, std::int64_t{4}}) {
      Config config = nvme_config(2);
      Trainer nvme(config);
      Config resident_config = toy_config(2);
      Trainer resident(resident_config);
      for (int s = 0; s < 2; ++s) {
        nvme.train_step();
        resident.train_step();
      }
      const std::vector<float> before = nvme.engine.consolidated_parameters();
      const std::vector<char> model_before = nvme.model_bytes();
      const int faulty_rank = nvme.engine.world_size() - 1;
      if (nvme.engine.rank() == faulty_rank) {
        detail::EngineInternals::state(nvme.engine)
            .optimizer()
            .inject_swap_fault(array, {detail::IoFaultKind::kEio, at, 1});
      }
      try {
        nvme.train_step();
        ADD_FAILURE() << "a step whose swap I/O failed on rank " << faulty_rank << " succeeded";
      } catch (const IoError& error) {
        EXPECT_THAT(error.what(), HasSubstr("failed on rank " + std::to_string(faulty_rank)));
        EXPECT_THAT(error.what(), HasSubstr("not applied on any rank"));
        EXPECT_THAT(error.what(), HasSubstr(".swp"));
      }
      EXPECT_EQ(nvme.engine.global_step(), 2);
      expect_undone_then_as_skipped(
          nvme, resident, before, model_before,
          "array " + std::to_string(array) + " at completion " + std::to_string(at));
    }
  }
}

// Short transfers and EAGAIN are re-queued by the swapper: the step goes through unchanged.
TEST(NvmeOffloadFaults, ShortTransfersAndEagainAreCompletedTransparently) {
  for (const auto kind : {detail::IoFaultKind::kShortTransfer, detail::IoFaultKind::kEagain}) {
    Trainer nvme(nvme_config(3, DType::kBFloat16));
    Config resident_config = toy_config(3);
    resident_config.bf16.enabled = true;
    Trainer resident(resident_config);
    nvme.train_step();
    resident.train_step();
    detail::EngineInternals::state(nvme.engine).optimizer().inject_swap_fault(1, {kind, 2, 3});
    for (int s = 0; s < 2; ++s) {
      EXPECT_TRUE(nvme.train_step().updated);
      resident.train_step();
    }
    EXPECT_EQ(nvme.engine.consolidated_parameters(), resident.engine.consolidated_parameters());
    EXPECT_EQ(nvme.model_bytes(), resident.model_bytes());
  }
}

// The step's I/O runs on its own thread, so which request completes when varies with the
// depth; the bits must not. Sub-groups of 8 elements give every rank several tiles per buffer.
Config pipeline_config(int buffers, bool read_ahead, bool write_behind) {
  Config config = nvme_config(2);
  config.zero_optimization.sub_group_size = 8;
  OffloadConfig& offload = config.zero_optimization.offload_optimizer;
  offload.buffer_count = buffers;
  offload.pipeline_read = read_ahead;
  offload.pipeline_write = write_behind;
  return config;
}

TEST(NvmeOffloadPipeline, EveryDepthGivesTheBitsOfResidentTraining) {
  Trainer resident(toy_config(2));
  for (int s = 0; s < 3; ++s) resident.train_step();
  const std::vector<float> expected = resident.engine.consolidated_parameters();
  const std::vector<char> expected_model = resident.model_bytes();
  struct Shape {
    int buffers;
    bool read_ahead;
    bool write_behind;
  };
  for (const Shape shape :
       {Shape{1, false, false}, Shape{1, true, true}, Shape{4, false, false}, Shape{4, true, false},
        Shape{4, false, true}, Shape{4, true, true}, Shape{7, true, true}}) {
    Trainer nvme(pipeline_config(shape.buffers, shape.read_ahead, shape.write_behind));
    for (int s = 0; s < 3; ++s) nvme.train_step();
    EXPECT_EQ(nvme.engine.consolidated_parameters(), expected)
        << "buffer_count " << shape.buffers << ", pipeline_read " << shape.read_ahead
        << ", pipeline_write " << shape.write_behind;
    EXPECT_EQ(nvme.model_bytes(), expected_model) << "buffer_count " << shape.buffers;
  }
}

/// Every array of the optimizer shard (the master, then each state) over the owned range, read
/// through the engine: from host memory, or from the swap files and the buffers that cache them.
std::vector<std::vector<float>> optimizer_arrays(Engine& engine) {
  detail::OptimizerShard& shard = detail::EngineInternals::state(engine).optimizer();
  std::vector<std::vector<float>> arrays(static_cast<std::size_t>(shard.array_count()));
  const std::int64_t count = shard.owned_end() - shard.owned_begin();
  for (int a = 0; a < shard.array_count(); ++a) {
    arrays[static_cast<std::size_t>(a)].resize(static_cast<std::size_t>(count));
    shard.read_owned(a, shard.owned_begin(), arrays[static_cast<std::size_t>(a)].data(), count);
  }
  return arrays;
}

// Steps alternate the direction of their pass and do not read again the sub-groups the step
// before left in the buffers. Over seven steps, with a checkpoint saved after the third (read
// through those buffers), an fp16 step skipped for overflow (which runs no pass), and the
// checkpoint loaded back two steps later over newer values (written through the buffers), the
// model's values stay the resident optimizer's after every step, and master and states after the
// third and the last, bit for bit. (Reading them goes through the buffers too, so it is done only
// there, where the save reads them anyway and at the end.)
TEST(NvmeOffloadPipeline, AlternatingPassesKeepTheBitsAcrossACheckpointAndASkippedStep) {
  const auto fp16 = [](Config config) {
    config.fp16.enabled = true;
    // 2^8 keeps the scaled toy gradients finite (as in offload_test.cpp).
    config.fp16.initial_scale_power = 8;
    return config;
  };
  Trainer nvme(fp16(pipeline_config(3, true, true)));
  Trainer resident(fp16(toy_config(2)));
  const std::string dir =
      (std::filesystem::current_path() /
       ("nvme_alternating_checkpoints_np" + std::to_string(nvme.engine.world_size())))
          .string();
  if (nvme.engine.rank() == 0) std::filesystem::remove_all(dir);
  nvme.engine.communicator().barrier();
  // One non-finite gradient element, in the first tensor only.
  const GradientTerm overflow = [](std::size_t k) {
    return [k](std::int64_t i) {
      return k == 0 && i == 0 ? std::numeric_limits<float>::infinity() : 0.0f;
    };
  };
  for (int s = 0; s < 7; ++s) {
    const std::string what = "after step " + std::to_string(s);
    for (Trainer* run : {&nvme, &resident}) {
      const std::string tag = run == &nvme ? "nvme" : "resident";
      if (s == 3) run->engine.save_checkpoint(dir, tag);
      if (s == 5) run->engine.load_checkpoint(dir, tag);
    }
    if (s == 4) {
      for (Trainer* run : {&nvme, &resident}) {
        toy_micro_step_any_precision(run->engine, run->tensors, run->handles, run->step++,
                                     overflow);
        EXPECT_TRUE(run->engine.step().skipped) << what;
      }
    } else {
      EXPECT_TRUE(nvme.train_step().updated) << what;
      EXPECT_TRUE(resident.train_step().updated) << what;
    }
    if (s == 2 || s == 6) {
      EXPECT_EQ(optimizer_arrays(nvme.engine), optimizer_arrays(resident.engine)) << what;
    }
    EXPECT_EQ(nvme.model_bytes(), resident.model_bytes()) << what;
  }
}

// What a step reads and writes once the buffers hold the step before's last sub-groups: every
// sub-group is written, and all but those buffer_count are read.
TEST(NvmeOffloadPipeline, TheSubGroupsLeftInTheBuffersAreNotReadAgain) {
  constexpr int kBuffers = 3;
  Trainer nvme(pipeline_config(kBuffers, true, true));
  const detail::OptimizerShard& shard = detail::EngineInternals::state(nvme.engine).optimizer();
  const std::int64_t tile = 8;
  const std::int64_t tiles = (shard.owned_end() - shard.owned_begin() + tile - 1) / tile;
  // One record of the master's file and one of the states' (AdamW: two arrays) per sub-group.
  const std::int64_t records =
      detail::swap_record_bytes(4 * tile) + detail::swap_record_bytes(2 * 4 * tile);
  nvme.train_step();
  for (int s = 1; s < 4; ++s) {
    const detail::SwapTimes before = shard.swap_times();
    nvme.train_step();
    const detail::SwapTimes after = shard.swap_times();
    EXPECT_EQ(after.bytes_read - before.bytes_read,
              (tiles - std::min<std::int64_t>(kBuffers, tiles)) * records)
        << "step " << s << " of " << tiles << " sub-groups";
    EXPECT_EQ(after.bytes_written - before.bytes_written, tiles * records) << "step " << s;
  }
}

// An EIO at each completion in turn of one rank's file, reads and writes alike, whichever tile's
// request is in flight then: the step is undone on every rank with the promised error, and
// training goes on bit for bit as if that window had been skipped.
TEST(NvmeOffloadFaults, AFailureAnywhereInTheDeepPipelineUndoesTheStep) {
  int write_failures = 0;
  for (std::int64_t at = 1;; ++at) {
    Trainer nvme(pipeline_config(4, true, true));
    Trainer resident(toy_config(2));
    nvme.train_step();
    resident.train_step();
    detail::EngineState& state = detail::EngineInternals::state(nvme.engine);
    const std::int64_t tiles =
        (state.optimizer().owned_end() - state.optimizer().owned_begin() + 7) / 8;
    // Every tile is written once a step, one request each, and read unless the step before left
    // it in one of the 4 buffers.
    if (at > 2 * tiles - std::min<std::int64_t>(4, tiles)) break;
    const std::vector<float> before = nvme.engine.consolidated_parameters();
    const std::vector<char> model_before = nvme.model_bytes();
    const int faulty_rank = nvme.engine.world_size() - 1;
    const int array = static_cast<int>(at % 2);
    if (nvme.engine.rank() == faulty_rank) {
      state.optimizer().inject_swap_fault(array, {detail::IoFaultKind::kEio, at, 1});
    }
    try {
      nvme.train_step();
      ADD_FAILURE() << "a step whose swap I/O failed at completion " << at << " succeeded";
    } catch (const IoError& error) {
      EXPECT_THAT(error.what(), HasSubstr("failed on rank " + std::to_string(faulty_rank)));
      EXPECT_THAT(error.what(), HasSubstr("not applied on any rank"));
      if (std::string(error.what()).find(": write of") != std::string::npos) ++write_failures;
    }
    expect_undone_then_as_skipped(
        nvme, resident, before, model_before,
        "array " + std::to_string(array) + " at completion " + std::to_string(at));
  }
  EXPECT_GT(write_failures, 0) << "no injected failure hit a write";
}

/// Rank 0's swap file of `kind`, whose slots hold `slot_bytes`: cut short, or one byte flipped.
void damage_first_rank(Trainer& run, const char* kind, bool truncate,
                       std::int64_t slot_bytes = 4 * kSubGroup) {
  if (run.engine.rank() != 0) return;
  const std::string path = swap_path(run, kind);
  const int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << path;
  if (truncate) {
    ASSERT_EQ(::ftruncate(fd, 4096), 0);
  } else {
    // One byte of slot 0's payload, in both of its records: whichever is current is damaged.
    const std::int64_t record = detail::swap_record_bytes(slot_bytes);
    for (const std::int64_t offset : {std::int64_t{4096 + 3}, record + 4096 + 3}) {
      char byte = 0;
      ASSERT_EQ(::pread(fd, &byte, 1, offset), 1);
      byte = static_cast<char>(byte ^ 0x5a);
      ASSERT_EQ(::pwrite(fd, &byte, 1, offset), 1);
    }
    ASSERT_EQ(::fsync(fd), 0);
  }
  ::close(fd);
}

/// The bytes of the swap file at `path`, whole.
std::vector<char> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// Writes `bytes` over the file at `path` in place, as `cp` over an open file does: the engine's
/// descriptor still reads the same file, now holding other records.
void overwrite_file(const std::string& path, const std::vector<char>& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(::pwrite(fd, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
  ASSERT_EQ(::fsync(fd), 0);
  ::close(fd);
}

// Rank 0's optimizer file copied over rank 1's between steps: the records are whole, of the same
// slot, copy and generation, so only the rank in their headers tells them apart. The step does
// not read the sub-groups the step before left in the buffers; it updates them, then refuses the
// first record it reads, and going back to the step's start must read theirs, rank 0's too: every
// rank says that rank 1's state before the step is lost.
TEST(NvmeOffloadFaults, ARecordOfAnotherRankIsRefusedByName) {
  Trainer run(nvme_config(2));
  if (run.engine.world_size() < 2) GTEST_SKIP() << "needs a second rank";
  run.train_step();
  run.engine.communicator().barrier();  // rank 0's records are written
  if (run.engine.rank() == 1) {
    const std::vector<char> foreign =
        file_bytes(detail::swap_file_path(nvme_test_directory(), 0, "optimizer_master"));
    ASSERT_EQ(foreign.size(), file_bytes(swap_path(run, "optimizer_master")).size());
    overwrite_file(swap_path(run, "optimizer_master"), foreign);
  }
  run.engine.communicator().barrier();
  try {
    run.train_step();
    ADD_FAILURE() << "rank 0's swap records were read as rank 1's";
  } catch (const IoError& error) {
    EXPECT_THAT(error.what(), HasSubstr("failed on rank 1"));
    EXPECT_THAT(error.what(), HasSubstr("rank1_optimizer_master.swp"));
    EXPECT_THAT(error.what(), HasSubstr("holds rank 0's optimizer_master"));
    EXPECT_THAT(error.what(), HasSubstr("expected rank 1's optimizer_master"));
    EXPECT_THAT(error.what(), HasSubstr("going back to the step's start failed too, on rank 1"));
    EXPECT_THAT(error.what(), HasSubstr("load the last checkpoint"));
  }
  EXPECT_EQ(run.engine.global_step(), 1);
}

// The same rank's file of an earlier run, put back between steps: its records match in every
// field but the run id, which each engine draws anew and shares over its ranks.
TEST(NvmeOffloadFaults, ARecordOfAnEarlierRunIsRefusedByName) {
  std::vector<char> earlier;
  std::string path;
  {
    Trainer first(nvme_config(2));
    first.train_step();
    path = swap_path(first, "optimizer_states");
    earlier = file_bytes(path);
  }
  Trainer second(nvme_config(2));
  second.train_step();
  ASSERT_EQ(file_bytes(path).size(), earlier.size());
  overwrite_file(path, earlier);
  try {
    second.train_step();
    ADD_FAILURE() << "a swap record of an earlier run was read as this run's";
  } catch (const IoError& error) {
    EXPECT_THAT(error.what(), HasSubstr("optimizer_states.swp"));
    EXPECT_THAT(error.what(), HasSubstr("optimizer_states of run 0x"));
    EXPECT_THAT(error.what(), HasSubstr("a swap file of another run"));
  }
  EXPECT_EQ(second.engine.global_step(), 1);
}

TEST(NvmeOffloadMemory, ParametersOnNvmeKeepMaxInCpuAndTheSwapBuffersInHostMemory) {
  const Config config = infinity_config(DType::kBFloat16);
  Trainer run(config);
  for (int s = 0; s < 3; ++s) run.train_step();
  const MemoryReport report = run.engine.memory_report();
  const std::int64_t shard = run.engine.shard_end() - run.engine.shard_begin();
  const std::int64_t swapped = shard - kParamsInCpu;
  const std::int64_t tile = std::min(kParamTile, swapped);
  const std::int64_t tiles = (swapped + tile - 1) / tile;
  const std::int64_t record = detail::swap_record_bytes(2 * tile);
  const MemoryLocation host = MemoryLocation::kHost;
  const MemoryUsage& in_cpu = report.at(MemoryCategory::kParameters, host);
  // The gathered modules and persistent copies are "device" memory; on a CPU rank that is host
  // memory too, so the shard's part is what the report holds beyond the gathered bytes there.
  const std::int64_t shard_part = 2 * kParamsInCpu + 2 * record;
  if (run.engine.device().is_cuda()) {
    EXPECT_EQ(in_cpu.current, shard_part);
  } else {
    EXPECT_GE(in_cpu.current, shard_part);
  }
  EXPECT_EQ(report.at(MemoryCategory::kParameters, MemoryLocation::kNvme).current,
            2 * tiles * record);
  // The estimator says the same, on NVMe and for the shard's part in host memory.
  EstimateInput in = estimate_input_from_config(config, 0, run.engine.world_size());
  for (const ToyTensor& t : run.tensors) {
    if (t.trainable) in.tensors.push_back(t.numel);
  }
  in.frozen_params = 15;
  const MemoryEstimate estimate = zeroshard::estimate(in);
  ASSERT_TRUE(estimate.valid) << estimate.reason;
  EXPECT_EQ(estimate.at(MemoryCategory::kParameters, MemoryTier::kNvme),
            report.at(MemoryCategory::kParameters, MemoryLocation::kNvme).current);
  if (run.engine.device().is_cuda()) {
    EXPECT_EQ(estimate.at(MemoryCategory::kParameters, MemoryTier::kHost), in_cpu.current);
  }
  // Every model read went through the file: the model's copy equals the resident run's.
  Config resident_config = toy_config(3);
  resident_config.bf16.enabled = true;
  Trainer resident(resident_config);
  for (int s = 0; s < 3; ++s) resident.train_step();
  EXPECT_EQ(run.model_bytes(), resident.model_bytes());
}

// A write of the parameter shard's file fails part-way through one rank's update: the step is
// undone on every rank, optimizer files and parameter file alike, and training goes on.
TEST(NvmeOffloadFaults, AnEioInTheParameterFileUndoesTheStepOnEveryRank) {
  for (const std::int64_t at : {std::int64_t{1}, std::int64_t{2}}) {
    Trainer nvme(infinity_config());
    Trainer resident(toy_config(3));
    for (int s = 0; s < 2; ++s) {
      nvme.train_step();
      resident.train_step();
    }
    const std::vector<float> before = nvme.engine.consolidated_parameters();
    const std::vector<char> model_before = nvme.model_bytes();
    // Rank 0's shard is all parameters (the last rank's may be mostly padding, never written).
    const int faulty_rank = 0;
    // After forward and backward, whose gathers read the file too: the fault hits the update.
    toy_micro_step_any_precision(nvme.engine, nvme.tensors, nvme.handles, nvme.step++);
    if (nvme.engine.rank() == faulty_rank) {
      detail::EngineInternals::state(nvme.engine)
          .coordinator()
          .inject_swap_fault({detail::IoFaultKind::kEio, at, 1});
    }
    try {
      nvme.engine.step();
      ADD_FAILURE() << "a step whose parameter write failed on rank " << faulty_rank
                    << " succeeded";
    } catch (const IoError& error) {
      EXPECT_THAT(error.what(), HasSubstr("failed on rank " + std::to_string(faulty_rank)));
      EXPECT_THAT(error.what(), HasSubstr("not applied on any rank"));
    }
    EXPECT_EQ(nvme.engine.global_step(), 2);
    expect_undone_then_as_skipped(nvme, resident, before, model_before,
                                  "at completion " + std::to_string(at));
  }
}

TEST(NvmeOffloadFaults, AFlippedByteInTheParameterFileIsCaughtAtTheGather) {
  Trainer run(infinity_config());
  run.train_step();
  damage_first_rank(run, "param_shard", false, 4 * kParamTile);
  // Rank 0 reads the damaged record when a gather needs it; the other ranks then wait in that
  // gather's collective, so only rank 0's error is checked (the test ends the job's use of it).
  if (run.engine.rank() != 0) return;
  auto& params = detail::EngineInternals::state(run.engine).coordinator();
  std::vector<char> out(static_cast<std::size_t>(4 * kParamTile));
  try {
    params.read_owned(run.engine.shard_begin() + kParamsInCpu, out.data(), MemoryLocation::kHost,
                      kParamTile);
    ADD_FAILURE() << "a damaged parameter record was read as good data";
  } catch (const IoError& error) {
    EXPECT_THAT(error.what(), HasSubstr("param_shard.swp"));
    EXPECT_THAT(error.what(), HasSubstr("checksum"));
  }
}

TEST(NvmeOffloadKeys, ParametersOnNvmeNeedTheOptimizerOnNvme) {
  Config config = infinity_config();
  config.zero_optimization.offload_optimizer = OffloadConfig{};
  config.zero_optimization.offload_optimizer.device = OffloadDevice::kCpu;
  try {
    Trainer run(config);
    ADD_FAILURE() << "parameters on NVMe with optimizer states in CPU memory were accepted";
  } catch (const ConfigError& error) {
    EXPECT_THAT(error.what(), HasSubstr("zero_optimization.offload_param.device"));
    EXPECT_THAT(error.what(), HasSubstr("offload_optimizer.device"));
  }
}

TEST(NvmeOffloadFaults, AFlippedByteIsCaughtByTheChecksumOnEveryRank) {
  Trainer run(nvme_config(1));
  run.train_step();
  damage_first_rank(run, "optimizer_master", false);
  try {
    run.train_step();
    ADD_FAILURE() << "a damaged swap record was read as good data";
  } catch (const IoError& error) {
    EXPECT_THAT(error.what(), HasSubstr("rank 0"));
    EXPECT_THAT(error.what(), HasSubstr("optimizer_master.swp"));
    EXPECT_THAT(error.what(), HasSubstr("checksum"));
  }
}

TEST(NvmeOffloadFaults, ATruncatedSwapFileIsNamed) {
  Trainer run(nvme_config(2));
  run.train_step();
  damage_first_rank(run, "optimizer_states", true);
  try {
    run.train_step();
    ADD_FAILURE() << "a truncated swap file was read";
  } catch (const IoError& error) {
    EXPECT_THAT(error.what(), HasSubstr("optimizer_states.swp"));
    EXPECT_THAT(error.what(), HasSubstr("truncated"));
  }
}

TEST(NvmeOffloadFaults, ATmpfsPathIsRefusedAtFinalize) {
  if (!std::filesystem::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm here";
  Config config = nvme_config(1);
  // Every rank names the same folder (the ranks must agree on nvme_path).
  const std::string shm = "/dev/shm/zeroshard_nvme_test_" +
                          std::filesystem::path(nvme_test_directory()).filename().string();
  std::filesystem::create_directories(shm);
  config.zero_optimization.offload_optimizer.nvme_path = shm;
  try {
    Trainer run(config);
    ADD_FAILURE() << "swap files on tmpfs were accepted";
  } catch (const IoError& error) {
    EXPECT_THAT(error.what(), HasSubstr("tmpfs"));
    EXPECT_THAT(error.what(), HasSubstr(shm));
  }
  // Removed once every rank has tried it.
  const std::unique_ptr<Communicator> world = Communicator::from_environment();
  world->barrier();
  if (world->rank() == 0) std::filesystem::remove_all(shm);
}

TEST(NvmeOffloadFaults, AFileSizeLimitGivesEfbigNamingTheFile) {
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  // Beyond the limit the kernel sends SIGXFSZ, whose default action ends the process; ignored,
  // the call fails with EFBIG instead, which is what the library must report.
  const auto previous = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = saved;
  small.rlim_cur = 8192;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  try {
    Trainer run(nvme_config(1));
    ADD_FAILURE() << "swap files larger than RLIMIT_FSIZE were accepted";
  } catch (const IoError& error) {
    EXPECT_THAT(error.what(), HasSubstr("file-size limit"));
    EXPECT_THAT(error.what(), HasSubstr(".swp"));
  }
  ::setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, previous);
}

TEST(NvmeOffloadFaults, TwoEnginesOnOnePathAreRefused) {
  Trainer first(nvme_config(1));
  try {
    Trainer second(nvme_config(1));
    ADD_FAILURE() << "two engines shared one rank's swap files";
  } catch (const IoError& error) {
    EXPECT_THAT(error.what(), HasSubstr("already in use"));
  }
  EXPECT_TRUE(first.train_step().updated);
}

// A checkpoint reads the master and states out of the swap files and a load writes them back:
// training resumed from it continues bit for bit.
TEST(NvmeOffloadCheckpoint, ResumesBitForBit) {
  // Every rank writes into one folder; runs at other world sizes may run beside this one.
  const Trainer probe(toy_config(1));
  const std::string dir =
      (std::filesystem::current_path() /
       ("nvme_offload_checkpoints_np" + std::to_string(probe.engine.world_size())))
          .string();
  // The other ranks cannot reach save_checkpoint before rank 0 joins the engine's collectives.
  if (probe.engine.rank() == 0) std::filesystem::remove_all(dir);
  std::vector<float> expected;
  {
    Trainer run(nvme_config(2, DType::kBFloat16));
    for (int s = 0; s < 2; ++s) run.train_step();
    run.engine.save_checkpoint(dir, "step2");
    for (int s = 0; s < 2; ++s) run.train_step();
    expected = run.engine.consolidated_parameters();
  }
  {
    // One engine per swap file at a time: this one closes its files before the next run.
    Trainer resumed(nvme_config(2, DType::kBFloat16));
    resumed.engine.load_checkpoint(dir, "step2");
    resumed.step = 2;
    for (int s = 0; s < 2; ++s) resumed.train_step();
    EXPECT_EQ(resumed.engine.consolidated_parameters(), expected);
  }

  // With the parameter shard on NVMe too: the load rounds the parameters from the loaded master
  // into the parameter file, and the model reads them from there.
  if (probe.engine.rank() == 0) std::filesystem::remove_all(dir);
  std::vector<char> expected_model;
  {
    Trainer run(infinity_config(DType::kBFloat16));
    for (int s = 0; s < 2; ++s) run.train_step();
    run.engine.save_checkpoint(dir, "step2");
    for (int s = 0; s < 2; ++s) run.train_step();
    expected = run.engine.consolidated_parameters();
    expected_model = run.model_bytes();
  }
  Trainer infinity(infinity_config(DType::kBFloat16));
  infinity.engine.load_checkpoint(dir, "step2");
  infinity.step = 2;
  for (int s = 0; s < 2; ++s) infinity.train_step();
  EXPECT_EQ(infinity.engine.consolidated_parameters(), expected);
  EXPECT_EQ(infinity.model_bytes(), expected_model);
}

}  // namespace
}  // namespace zeroshard::testing
