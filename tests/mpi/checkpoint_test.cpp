// Checkpoints resume exactly: saving midway and training on in a new engine gives parameters, step
// and loss scale bit-identical to a run that never stopped, at every stage, in fp32, fp16 and bf16,
// with and without optimizer offload. Every bad input is refused by name and changes nothing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>  // nlohmann::json, to read safetensors headers independently
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "checkpoint/checkpoint_format.h"
#include "manifest_mutations.h"
#include "mpi/toy_model.h"
#include "precision/half_conversion.h"
#include "zeroshard/checkpoint.h"

namespace zeroshard::testing {
namespace {

namespace fs = std::filesystem;

constexpr std::int64_t kSteps = 6;
constexpr std::int64_t kSaveAt = 3;

Config resume_config(int stage, DType dtype, bool offload) {
  Config config = toy_config(stage);
  config.fp16.enabled = dtype == DType::kFloat16;
  config.fp16.initial_scale_power = 8;
  // A short window: the scale grows during the run, and the save falls inside a window.
  config.fp16.loss_scale_window = 2;
  config.bf16.enabled = dtype == DType::kBFloat16;
  config.gradient_accumulation_steps = 2;
  config.gradient_clipping = 1.0;
  config.scheduler.type = "WarmupLR";
  config.scheduler.params = {{"warmup_num_steps", 5.0}, {"warmup_max_lr", 0.01}};
  if (offload) config.zero_optimization.offload_optimizer.device = OffloadDevice::kCpu;
  if (dtype != DType::kFloat32 && stage >= 2) config.grad_accum_dtype = "fp32";
  return config;
}

/// Optimizer steps [from, to): two micro-steps each.
void train(Engine& engine, const std::vector<ToyTensor>& tensors,
           const std::vector<Parameter>& handles, std::int64_t from, std::int64_t to) {
  for (std::int64_t s = from; s < to; ++s) {
    for (int micro = 0; micro < 2; ++micro) {
      toy_micro_step_any_precision(engine, tensors, handles, 2 * s + micro);
      engine.step();
    }
  }
}

/// The same folder name on every rank, new for each test.
std::string shared_dir(Engine& engine, const std::string& name) {
  const std::vector<std::string> pids =
      engine.communicator().all_gather_text(std::to_string(::getpid()));
  const fs::path dir =
      fs::temp_directory_path() /
      ("zeroshard-ckpt-" + name + "-np" + std::to_string(engine.world_size()) + "-" + pids[0]);
  engine.communicator().barrier();
  if (engine.rank() == 0) fs::remove_all(dir);
  engine.communicator().barrier();
  return dir.string();
}

struct Outcome {
  std::vector<float> params;
  std::vector<float> frozen;
  std::int64_t step;
  double scale;
  double lr;
};

Outcome outcome(Engine& engine, const std::vector<Parameter>& handles) {
  Outcome o{
      engine.consolidated_parameters(), {}, engine.global_step(), engine.loss_scale(), engine.lr()};
  const Parameter frozen = handles[2];
  const std::vector<char> raw =
      to_host(engine, frozen.raw_data(), frozen.numel() * size_of(engine.model_dtype()));
  o.frozen.resize(frozen.numel());
  detail::convert_to_float(raw.data(), engine.model_dtype(), o.frozen.data(), frozen.numel());
  return o;
}

using ResumeCase = std::tuple<int, DType, bool>;  // stage, precision, offload

class CheckpointResume : public ::testing::TestWithParam<ResumeCase> {};

TEST_P(CheckpointResume, GivesTheParametersOfARunThatNeverStopped) {
  const auto [stage, dtype, offload] = GetParam();
  if (stage == 0 && offload) GTEST_SKIP() << "optimizer offload needs stage 1, 2 or 3";
  const std::vector<ToyTensor> tensors = uneven_toy_tensors();
  Engine straight = make_engine(resume_config(stage, dtype, offload), rule_cases()[0].make());
  const std::vector<Parameter> straight_handles = register_toy(straight, tensors);
  train(straight, tensors, straight_handles, 0, kSteps);
  const Outcome expected = outcome(straight, straight_handles);

  const std::string dir = shared_dir(straight, "resume");
  {
    Engine first = make_engine(resume_config(stage, dtype, offload), rule_cases()[0].make());
    const std::vector<Parameter> handles = register_toy(first, tensors);
    train(first, tensors, handles, 0, kSaveAt);
    first.save_checkpoint(dir, "step3", "data position 17");
  }
  Engine resumed = make_engine(resume_config(stage, dtype, offload), rule_cases()[0].make());
  const std::vector<Parameter> handles = register_toy(resumed, tensors);
  // The fresh engine's own initial values and step must all be replaced, and the gradients of
  // its half-done accumulation window dropped.
  toy_micro_step_any_precision(resumed, tensors, handles, 0);
  resumed.step();
  const MemoryReport before = resumed.memory_report();
  const CheckpointInfo info = resumed.load_checkpoint(dir);
  // Arrays staged in twins of their own buffers and swapped in: the old ones are freed. At stage 3
  // the load also ends the half-done window, which frees the released modules' gathered buffers
  // kept for reuse, so parameter bytes may only drop.
  const MemoryReport after = resumed.memory_report();
  for (int where = 0; where < kMemoryLocationCount; ++where) {
    for (int what = 0; what < kMemoryCategoryCount; ++what) {
      const std::int64_t was = before.usage[where][what].current;
      const std::int64_t is = after.usage[where][what].current;
      const std::string name = std::string(to_string(static_cast<MemoryCategory>(what))) + " at " +
                               to_string(static_cast<MemoryLocation>(where));
      if (stage == 3 && what == static_cast<int>(MemoryCategory::kParameters)) {
        EXPECT_LE(is, was) << name;
      } else if (what == static_cast<int>(MemoryCategory::kCommunication) &&
                 where == static_cast<int>(MemoryLocation::kHost) && resumed.device().is_cuda()) {
        // Ranks sharing a GPU over MPI stage collectives through a pool of pinned host buffers
        // that keeps each size it has served (the load's texts are new sizes): a few bytes.
        EXPECT_GE(is, was) << name;
        EXPECT_LE(is, was + backend_workspace_allowance(resumed)) << name;
      } else {
        EXPECT_EQ(is, was) << name;
      }
    }
  }
  EXPECT_EQ(info.tag, "step3");
  EXPECT_EQ(info.global_step, kSaveAt);
  EXPECT_EQ(info.user_state, "data position 17");
  train(resumed, tensors, handles, kSaveAt, kSteps);
  const Outcome actual = outcome(resumed, handles);
  EXPECT_EQ(actual.step, expected.step);
  EXPECT_EQ(actual.scale, expected.scale);
  EXPECT_EQ(actual.lr, expected.lr);
  EXPECT_EQ(actual.frozen, expected.frozen);
  ASSERT_EQ(actual.params.size(), expected.params.size());
  for (std::size_t i = 0; i < expected.params.size(); ++i) {
    ASSERT_EQ(actual.params[i], expected.params[i]) << "element " << i;
  }
  if (dtype == DType::kFloat16) {
    EXPECT_GT(expected.scale, 256.0) << "the scale never grew";
  }
  resumed.communicator().barrier();
  if (resumed.rank() == 0) fs::remove_all(dir);
}

std::string resume_name(const ::testing::TestParamInfo<ResumeCase>& info) {
  const auto [stage, dtype, offload] = info.param;
  return "stage" + std::to_string(stage) + "_" + to_string(dtype) + (offload ? "_offload" : "");
}

INSTANTIATE_TEST_SUITE_P(EveryStagePrecisionAndOffload, CheckpointResume,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3),
                                            ::testing::Values(DType::kFloat32, DType::kFloat16,
                                                              DType::kBFloat16),
                                            ::testing::Bool()),
                         resume_name);

/// A saved checkpoint and an engine that has trained elsewhere, for the bad-input cases.
class CheckpointBadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    Engine saver = make_engine(resume_config(2, DType::kFloat32, false), rule_cases()[0].make());
    const std::vector<Parameter> saver_handles = register_toy(saver, tensors_);
    train(saver, tensors_, saver_handles, 0, 2);
    dir_ = shared_dir(saver, "bad");
    saver.save_checkpoint(dir_, "good");
  }
  void TearDown() override {
    if (engine_) {
      engine_->communicator().barrier();
      if (engine_->rank() == 0) fs::remove_all(dir_);
    }
  }

  /// Copies the good checkpoint to tag "bad" and lets rank 0 damage it.
  void damage(const std::function<void(const fs::path&)>& edit) {
    engine().communicator().barrier();
    if (engine().rank() == 0) {
      fs::copy(dir_ + "/good", dir_ + "/bad", fs::copy_options::recursive);
      edit(fs::path(dir_) / "bad");
    }
    engine().communicator().barrier();
  }

  Engine& engine(std::vector<ToyTensor> tensors = uneven_toy_tensors()) {
    if (!engine_) {
      engine_.emplace(
          make_engine(resume_config(2, DType::kFloat32, false), rule_cases()[0].make()));
      handles_ = register_toy(*engine_, tensors);
      train(*engine_, tensors, handles_, 0, 1);
    }
    return *engine_;
  }

  /// Loading `tag` ("bad" unless told; empty: the one `latest` names) throws CheckpointError
  /// whose message holds `expected`; nothing changes.
  void expect_refused(const std::string& expected, const std::string& tag = "bad") {
    const std::vector<float> before = engine().consolidated_parameters();
    const std::int64_t step = engine().global_step();
    try {
      engine().load_checkpoint(dir_, tag);
      ADD_FAILURE() << "the load succeeded";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
    EXPECT_EQ(engine().consolidated_parameters(), before);
    EXPECT_EQ(engine().global_step(), step);
  }

  std::vector<ToyTensor> tensors_ = uneven_toy_tensors();
  std::string dir_;
  std::optional<Engine> engine_;
  std::vector<Parameter> handles_;
};

TEST_F(CheckpointBadInput, TheGoodCheckpointLoads) {
  EXPECT_EQ(engine().load_checkpoint(dir_, "good").global_step, 2);
  EXPECT_EQ(engine().global_step(), 2);
}

TEST_F(CheckpointBadInput, ATruncatedShardIsNamed) {
  damage([](const fs::path& bad) {
    fs::resize_file(bad / "rank_00000.bin", fs::file_size(bad / "rank_00000.bin") - 4);
  });
  expect_refused("truncated");
}

TEST_F(CheckpointBadInput, AChecksumMismatchIsNamed) {
  damage([](const fs::path& bad) {
    std::fstream f(bad / "rank_00000.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    f.put('\x5a');
  });
  expect_refused("checksum");
}

TEST_F(CheckpointBadInput, AMissingShardIsNamed) {
  damage([](const fs::path& bad) { fs::remove(bad / "rank_00000.bin"); });
  expect_refused("is missing");
}

TEST_F(CheckpointBadInput, ANewerFormatIsRefused) {
  damage([](const fs::path& bad) {
    std::ifstream in(bad / "manifest.json");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    in.close();
    const std::string key =
        "\"format_version\": " + std::to_string(detail::kCheckpointFormatVersion);
    ASSERT_NE(text.find(key), std::string::npos);
    text.replace(text.find(key), key.size(), "\"format_version\": 99");
    std::ofstream(bad / "manifest.json") << text;
  });
  expect_refused("format_version 99");
}

TEST_F(CheckpointBadInput, AnIncompleteSaveIsNeverLoaded) {
  damage([](const fs::path& bad) {
    fs::rename(bad, bad.string() + ".tmp");
    fs::remove(fs::path(bad.string() + ".tmp") / "manifest.json");
  });
  expect_refused("never completed");
}

TEST_F(CheckpointBadInput, AnotherParameterNameIsNamed) {
  std::vector<ToyTensor> renamed = tensors_;
  renamed[1].name = "a.beta";
  engine(renamed);
  damage([](const fs::path&) {});
  expect_refused("'a.bias' in the checkpoint and 'a.beta' in the engine");
}

TEST_F(CheckpointBadInput, AnotherShapeIsNamed) {
  std::vector<ToyTensor> resized = tensors_;
  resized[3].numel = 78;
  engine(resized);
  damage([](const fs::path&) {});
  expect_refused("'b.weight' has shape [77] in the checkpoint and [78]");
}

TEST_F(CheckpointBadInput, ANegativeGlobalStepIsRefusedByName) {
  damage([](const fs::path& bad) {
    std::ifstream in(bad / "manifest.json");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    in.close();
    const std::string key = "\"global_step\": 2";
    ASSERT_NE(text.find(key), std::string::npos);
    text.replace(text.find(key), key.size(), "\"global_step\": -5");
    std::ofstream(bad / "manifest.json") << text;
  });
  expect_refused("field 'global_step': got -5");
}

// A few hundred loads of a damaged manifest, each leaf given each of manifest_mutations() in turn:
// every load succeeds on every rank (and the engine trains on from it) or throws CheckpointError on
// every rank. Run it under UBSan too (docs/testing.md): a step counter of 2^63 - 1 once loaded and
// then wrapped at the next step.
TEST_F(CheckpointBadInput, EveryMutatedManifestFieldLoadsOrIsRefused) {
  damage([](const fs::path&) {});
  const fs::path manifest = fs::path(dir_) / "bad" / "manifest.json";
  nlohmann::json good;
  {
    std::ifstream in(manifest);
    good = nlohmann::json::parse(in);
  }
  int loaded = 0;
  int refused = 0;
  for (const nlohmann::json::json_pointer& leaf : manifest_leaves(good, true)) {
    for (const nlohmann::json& value : manifest_mutations()) {
      engine().communicator().barrier();
      if (engine().rank() == 0) {
        nlohmann::json damaged = good;
        damaged[leaf] = value;
        std::ofstream(manifest) << damaged.dump(1);
      }
      engine().communicator().barrier();
      const std::string where = leaf.to_string() + " = " + value.dump();
      try {
        engine().load_checkpoint(dir_, "bad");
      } catch (const CheckpointError&) {
        ++refused;
        continue;
      }
      ++loaded;
      try {
        toy_micro_step(engine(), tensors_, handles_, 0);
        engine().step();
      } catch (const Error& error) {
        ADD_FAILURE() << "after loading " << where << ": " << error.what();
      }
    }
  }
  EXPECT_GT(loaded, 0);
  EXPECT_GT(refused, 200);
}

// `latest` edited to name a checkpoint beside the folder, which would load.
TEST_F(CheckpointBadInput, ALatestNamingAFolderOutsideIsRefused) {
  const fs::path outside = dir_ + "-other";
  damage([&](const fs::path&) {
    fs::remove_all(outside);
    fs::create_directories(outside / "good");
    fs::copy(dir_ + "/good", outside / "good", fs::copy_options::recursive);
    std::ofstream(fs::path(dir_) / "latest") << "../" << outside.filename().string() << "/good\n";
  });
  expect_refused("path separator '/'", "");
  engine().communicator().barrier();
  if (engine().rank() == 0) fs::remove_all(outside);
}

// A tag with a newline would save, but `latest` (one line) could not name it afterwards.
TEST_F(CheckpointBadInput, ATagWithANewlineIsRefusedAtSave) {
  try {
    engine().save_checkpoint(dir_, "step\n2");
    ADD_FAILURE() << "a tag with a newline was saved";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("a newline"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir_ + "/step\n2"));
  EXPECT_EQ(engine().load_checkpoint(dir_).tag, "good");
}

TEST_F(CheckpointBadInput, AnExistingTagIsNotOverwritten) {
  EXPECT_THROW(engine().save_checkpoint(dir_, "good"), CheckpointError);
  EXPECT_EQ(engine().load_checkpoint(dir_).global_step, 2);
}

TEST_F(CheckpointBadInput, SavingInsideAnAccumulationWindowIsRefused) {
  toy_micro_step_any_precision(engine(), tensors_, handles_, 10);
  engine().step();
  EXPECT_THROW(engine().save_checkpoint(dir_, "mid"), UsageError);
}

/// A safetensors file read with nothing of zeroshard's: name -> (dtype, shape, raw bytes).
struct ReadTensor {
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::vector<char> bytes;
};
std::map<std::string, ReadTensor> read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(file[i]);
  EXPECT_EQ((8 + n) % 8, 0u) << "the data is not 8-byte aligned";
  const nlohmann::json header = nlohmann::json::parse(file.begin() + 8, file.begin() + 8 + n);
  EXPECT_EQ(header.at("__metadata__").at("format"), "pt");
  std::map<std::string, ReadTensor> tensors;
  std::int64_t last_end = 0;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") continue;
    const auto offsets = value.at("data_offsets").get<std::vector<std::int64_t>>();
    last_end = std::max(last_end, offsets[1]);
    tensors[name] = {
        value.at("dtype").get<std::string>(), value.at("shape").get<std::vector<std::int64_t>>(),
        std::vector<char>(file.begin() + 8 + n + offsets[0], file.begin() + 8 + n + offsets[1])};
  }
  EXPECT_EQ(static_cast<std::int64_t>(8 + n) + last_end, static_cast<std::int64_t>(file.size()));
  return tensors;
}

class SafetensorsExport : public ::testing::TestWithParam<int> {};

TEST_P(SafetensorsExport, HoldsTheGatheredParametersAndLoadsBack) {
  const int stage = GetParam();
  const std::vector<ToyTensor> tensors = uneven_toy_tensors();
  Engine engine = make_engine(resume_config(stage, DType::kFloat32, false), rule_cases()[0].make());
  const std::vector<Parameter> handles = register_toy(engine, tensors);
  // WarmupLR starts at lr 0: four steps make the parameters move.
  train(engine, tensors, handles, 0, 4);
  const Outcome trained = outcome(engine, handles);
  const std::string dir = shared_dir(engine, "export" + std::to_string(stage));
  engine.save_checkpoint(dir, "trained");
  const std::string fp32 = dir + "/model.safetensors";
  const std::string bf16 = dir + "/model.bf16.safetensors";
  const std::string fp64 = dir + "/model.fp64.safetensors";
  if (engine.rank() == 0) {
    consolidate_checkpoint(dir, fp32);
    consolidate_checkpoint(dir, bf16, "trained", DType::kBFloat16);
    consolidate_checkpoint(dir, fp64, "trained", DType::kFloat64);
  }
  engine.communicator().barrier();
  const std::map<std::string, ReadTensor> read = read_safetensors(fp32);
  const std::map<std::string, ReadTensor> read16 = read_safetensors(bf16);
  const std::map<std::string, ReadTensor> read64 = read_safetensors(fp64);
  ASSERT_EQ(read.size(), tensors.size());
  std::int64_t at = 0;
  for (const ToyTensor& t : tensors) {
    const ReadTensor& r = read.at(t.name);
    EXPECT_EQ(r.dtype, "F32");
    EXPECT_EQ(r.shape, std::vector<std::int64_t>{t.numel});
    std::vector<float> values(t.numel);
    std::memcpy(values.data(), r.bytes.data(), r.bytes.size());
    const std::vector<float> expected =
        t.trainable
            ? std::vector<float>(trained.params.begin() + at, trained.params.begin() + at + t.numel)
            : trained.frozen;
    if (t.trainable) at += t.numel;
    EXPECT_EQ(values, expected) << t.name;
    std::vector<char> rounded(t.numel * 2);
    detail::convert_from_float(expected.data(), rounded.data(), DType::kBFloat16, t.numel);
    EXPECT_EQ(read16.at(t.name).dtype, "BF16");
    EXPECT_EQ(read16.at(t.name).bytes, rounded) << t.name;
    // fp64 holds every fp32 value exactly.
    const std::vector<double> widened(expected.begin(), expected.end());
    std::vector<char> widened_bytes(t.numel * sizeof(double));
    std::memcpy(widened_bytes.data(), widened.data(), widened_bytes.size());
    EXPECT_EQ(read64.at(t.name).dtype, "F64");
    EXPECT_EQ(read64.at(t.name).bytes, widened_bytes) << t.name;
  }

  // A fresh engine of another stage takes the weights from the file.
  Engine fresh =
      make_engine(resume_config(3 - stage, DType::kFloat32, false), rule_cases()[0].make());
  const std::vector<Parameter> fresh_handles = register_toy(fresh, tensors);
  EXPECT_NE(fresh.consolidated_parameters(), trained.params);
  fresh.load_weights(fp32);
  const Outcome loaded = outcome(fresh, fresh_handles);
  EXPECT_EQ(loaded.params, trained.params);
  EXPECT_EQ(loaded.frozen, trained.frozen);
  EXPECT_EQ(loaded.step, 0);
  // The fp64 export loads back to the same fp32 weights.
  Engine from_fp64 =
      make_engine(resume_config(3 - stage, DType::kFloat32, false), rule_cases()[0].make());
  const std::vector<Parameter> fp64_handles = register_toy(from_fp64, tensors);
  from_fp64.load_weights(fp64);
  EXPECT_EQ(outcome(from_fp64, fp64_handles).params, trained.params);

  // Another model is refused by name, and changes nothing.
  std::vector<ToyTensor> other = tensors;
  other[5].numel = 34;
  Engine mismatched =
      make_engine(resume_config(stage, DType::kFloat32, false), rule_cases()[0].make());
  register_toy(mismatched, other);
  const std::vector<float> before = mismatched.consolidated_parameters();
  try {
    mismatched.load_weights(fp32);
    ADD_FAILURE() << "weights of another shape loaded";
  } catch (const CheckpointError& e) {
    EXPECT_NE(
        std::string(e.what()).find("'c.weight' has shape [33], the registered parameter [34]"),
        std::string::npos)
        << e.what();
  }
  EXPECT_EQ(mismatched.consolidated_parameters(), before);

  engine.communicator().barrier();
  if (engine.rank() == 0) fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Stages, SafetensorsExport, ::testing::Values(0, 3));

TEST(Save16BitModel, AtStage3GathersOnlyWhenTheConfigSays) {
  const std::vector<ToyTensor> tensors = uneven_toy_tensors();
  for (const bool gather : {false, true}) {
    Config config = resume_config(3, DType::kBFloat16, false);
    config.zero_optimization.gather_16bit_weights_on_model_save = gather;
    Engine engine = make_engine(std::move(config), rule_cases()[0].make());
    const std::vector<Parameter> handles = register_toy(engine, tensors);
    train(engine, tensors, handles, 0, 2);
    const std::string dir = shared_dir(engine, std::string("bf16model") + (gather ? "1" : "0"));
    if (engine.rank() == 0) fs::create_directories(dir);
    const std::string file = dir + "/model.safetensors";
    EXPECT_EQ(engine.save_16bit_model(file), gather);
    EXPECT_EQ(fs::exists(file), gather);
    if (gather) {
      const std::map<std::string, ReadTensor> read = read_safetensors(file);
      const std::vector<float> master = engine.consolidated_parameters();
      std::int64_t at = 0;
      for (const ToyTensor& t : tensors) {
        if (!t.trainable) continue;
        std::vector<char> rounded(t.numel * 2);
        detail::convert_from_float(master.data() + at, rounded.data(), DType::kBFloat16, t.numel);
        at += t.numel;
        EXPECT_EQ(read.at(t.name).dtype, "BF16");
        EXPECT_EQ(read.at(t.name).bytes, rounded) << t.name;
      }
    }
    engine.communicator().barrier();
    if (engine.rank() == 0) fs::remove_all(dir);
  }
}

TEST(LoadFromFp32Weights, FalseRebuildsTheMasterFromThe16BitWeights) {
  const std::vector<ToyTensor> tensors = uneven_toy_tensors();
  Engine saver = make_engine(resume_config(2, DType::kBFloat16, false), rule_cases()[0].make());
  const std::vector<Parameter> saver_handles = register_toy(saver, tensors);
  train(saver, tensors, saver_handles, 0, 4);
  const std::vector<float> master = saver.consolidated_parameters();
  const std::string dir = shared_dir(saver, "fp32weights");
  saver.save_checkpoint(dir, "saved");
  std::vector<float> rounded(master.size());
  std::vector<char> narrow(master.size() * 2);
  detail::convert_from_float(master.data(), narrow.data(), DType::kBFloat16,
                             static_cast<std::int64_t>(master.size()));
  detail::convert_to_float(narrow.data(), DType::kBFloat16, rounded.data(),
                           static_cast<std::int64_t>(master.size()));
  ASSERT_NE(rounded, master) << "the master holds nothing beyond bf16; the test proves nothing";
  for (const bool from_fp32 : {true, false}) {
    Config config = resume_config(2, DType::kBFloat16, false);
    config.zero_optimization.load_from_fp32_weights = from_fp32;
    Engine engine = make_engine(std::move(config), rule_cases()[0].make());
    register_toy(engine, tensors);
    engine.load_checkpoint(dir);
    EXPECT_EQ(engine.consolidated_parameters(), from_fp32 ? master : rounded) << from_fp32;
  }
  saver.communicator().barrier();
  if (saver.rank() == 0) fs::remove_all(dir);
}

}  // namespace
}  // namespace zeroshard::testing
