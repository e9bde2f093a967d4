// The zeroshard-estimate tool as a user runs it: its printed GB figures, the inverse question, and
// its messages for bad input.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "zeroshard/memory_estimator.h"

namespace {

/// Runs a command and returns what it printed on stdout.
std::string run(const std::string& command) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  std::string out;
  char buffer[4096];
  while (pipe && std::fgets(buffer, sizeof buffer, pipe.get()) != nullptr) out += buffer;
  return out;
}

std::string tool() {
  const char* dir = std::getenv("ZEROSHARD_TOOLS_DIR");
  return std::string(dir != nullptr ? dir : ".") + "/zeroshard-estimate";
}

/// The first line of `text` that contains `key`, or "".
std::string line_with(const std::string& text, const std::string& key) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.find(key) != std::string::npos) return line;
  }
  return {};
}

TEST(EstimateTool, PrintsThePaperFiguresInGB) {
  const std::string out =
      run(tool() + " --params 7.5B --ranks 64 --precision fp16 --optimizer adam");
  const std::string paper_row = line_with(out, "model states (ZeRO paper)");
  ASSERT_FALSE(paper_row.empty()) << out;
  std::size_t at = 0;
  for (const char* figure : {"120.0 GB", "31.4 GB", "16.6 GB", "1.9 GB"}) {
    at = paper_row.find(figure, at);
    ASSERT_NE(at, std::string::npos) << figure << " missing in order from: " << paper_row;
  }
  EXPECT_NE(out.find("GiB"), std::string::npos);
}

TEST(EstimateTool, AnswersTheInverseQuestion) {
  const std::string out = run(tool() + " --params 1B --ranks 8 --fit-memory 80GB");
  EXPECT_NE(out.find("largest model in 80.0 GB"), std::string::npos) << out;
}

TEST(EstimateTool, JsonGivesTheEstimatorsBytesForEveryStage) {
  const std::string out =
      run(tool() + " --params 7.5B --ranks 64 --precision fp16 --optimizer adam --json");
  const nlohmann::json estimates = nlohmann::json::parse(out);
  ASSERT_EQ(estimates.size(), 4u) << out;
  for (int stage = 0; stage <= 3; ++stage) {
    zeroshard::EstimateInput in;
    in.params = 7'500'000'000;
    in.ranks = 64;
    in.stage = stage;
    in.precision = zeroshard::DType::kFloat16;
    in.optimizer = "adam";
    const zeroshard::MemoryEstimate expected = zeroshard::estimate(in);
    const nlohmann::json& e = estimates[stage];
    EXPECT_EQ(e["stage"], stage);
    EXPECT_EQ(e["device"]["model_states"], expected.model_state_bytes()) << "stage " << stage;
    EXPECT_EQ(e["device"]["peak"], expected.device_peak()) << "stage " << stage;
    EXPECT_EQ(e["host"]["total"], expected.total(zeroshard::MemoryTier::kHost));
    EXPECT_EQ(e["device"]["optimizer_states"],
              expected.at(zeroshard::MemoryCategory::kOptimizerStates));
  }
}

TEST(EstimateTool, OffloadRatioSplitsTheOptimizerBetweenDeviceAndHost) {
  const std::string out =
      run(tool() +
          " --params 7B --ranks 1 --stage 3 --precision bf16 --offload-optimizer"
          " cpu --offload-ratio 0.25 --json");
  const nlohmann::json estimates = nlohmann::json::parse(out);
  ASSERT_EQ(estimates.size(), 1u) << out;
  zeroshard::EstimateInput in;
  in.params = 7'000'000'000;
  in.stage = 3;
  in.precision = zeroshard::DType::kBFloat16;
  in.offload_optimizer = zeroshard::OffloadDevice::kCpu;
  in.offload_ratio = 0.25;
  const zeroshard::MemoryEstimate expected = zeroshard::estimate(in);
  const nlohmann::json& e = estimates[0];
  EXPECT_EQ(e["device"]["optimizer_states"],
            expected.at(zeroshard::MemoryCategory::kOptimizerStates));
  EXPECT_EQ(e["host"]["optimizer_states"],
            expected.at(zeroshard::MemoryCategory::kOptimizerStates, zeroshard::MemoryTier::kHost));
  // A quarter of Adam's 8 bytes per parameter on the host, the rest on the device.
  const double host_states = e["host"]["optimizer_states"].get<double>();
  const double device_states = e["device"]["optimizer_states"].get<double>();
  EXPECT_NEAR(host_states / (host_states + device_states), 0.25, 1e-6) << out;

  const std::string bad = run(tool() + " --params 1B --offload-ratio 1.5 2>&1");
  EXPECT_NE(bad.find("--offload-ratio: got 1.5, expected a share in (0, 1]"), std::string::npos)
      << bad;
}

TEST(EstimateTool, ReadsADeepSpeedConfig) {
  const std::string path = ::testing::TempDir() + "estimate_tool_test_config.json";
  std::ofstream(path) << R"({"train_micro_batch_size_per_gpu": 4,
                             "bf16": {"enabled": true},
                             "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
                             "zero_optimization": {"stage": 2, "reduce_bucket_size": 1e6}})";
  const std::string out = run(tool() + " --config " + path + " --params 1B --ranks 8");
  EXPECT_NE(out.find("bf16 parameters"), std::string::npos) << out;
  EXPECT_NE(out.find("reduce_bucket_size: 1000000"), std::string::npos) << out;
  EXPECT_NE(out.find("stage 2"), std::string::npos) << out;
  EXPECT_EQ(out.find("stage 0"), std::string::npos) << "only the config's stage: " << out;
  // bf16 parameters 2P = 2.0 GB, and (2 + 4 + 8) P / 8 for the gradient shard, the master
  // weights and AdamW's states: 3.75 GB.
  EXPECT_NE(line_with(out, "model states (ZeRO paper)").find(" 3.8 GB"), std::string::npos) << out;
}

TEST(EstimateTool, FillsAutoValuesFromTheOverrideFlags) {
  const std::string path = ::testing::TempDir() + "estimate_tool_test_auto_config.json";
  std::ofstream(path) << R"({"train_micro_batch_size_per_gpu": "auto", "bf16": {"enabled": "auto"},
                             "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}})";
  const std::string out =
      run(tool() + " --config " + path +
          " --params 1B --ranks 8 --per-device-train-batch-size 4 --bf16 true --hidden-size=1000");
  EXPECT_NE(out.find("bf16 parameters"), std::string::npos) << out;
  EXPECT_NE(out.find("reduce_bucket_size: 1000000"), std::string::npos) << out;
  const std::string missing = run(tool() + " --config " + path + " --params 1B 2>&1");
  EXPECT_NE(missing.find("train_micro_batch_size_per_gpu"), std::string::npos) << missing;
  EXPECT_NE(missing.find("--per-device-train-batch-size"), std::string::npos) << missing;
}

TEST(EstimateTool, NamesTheConfigKeyThatIsWrong) {
  const std::string path = ::testing::TempDir() + "estimate_tool_test_bad_config.json";
  std::ofstream(path) << R"({"train_micro_batch_size_per_gpu": 4,
                             "zero_optimization": {"stage": 7}})";
  const std::string out = run(tool() + " --config " + path + " --params 1B 2>&1");
  EXPECT_NE(out.find("zero_optimization.stage"), std::string::npos) << out;
}

TEST(EstimateTool, RejectsABadStageNamingTheOption) {
  const std::string out = run(tool() + " --params 1B --stage 5 2>&1");
  EXPECT_NE(out.find("--stage: got 5, expected 0..3"), std::string::npos) << out;
}

TEST(EstimateTool, OffloadRowsCarryNoClaimThatTheEngineLacksOffload) {
  // The engine offloads to CPU memory and to NVMe (docs/offload.md, docs/nvme.md).
  for (const char* device : {"cpu", "nvme"}) {
    const std::string out = run(tool() + " --params 1B --ranks 8 --stage 3 --offload-optimizer " +
                                device + " --offload-param " + device);
    EXPECT_NE(out.find("optimizer states"), std::string::npos) << out;
    EXPECT_EQ(out.find("not implement"), std::string::npos) << out;
  }
}

}  // namespace
