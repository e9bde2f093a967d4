// zeroshard-check-mlp-precision: compares --report-json files of zeroshard-train-mlp runs of the
// same model and stage in fp32, fp16 and bf16: the 16-bit runs learn as fp32 does, and keep
// fewer model-state bytes.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "command_line.h"

namespace {

// 16-bit weights and gradients round every step (fp16 keeps 11 significant bits, bf16 8), so
// the curves drift apart slowly; over the test's 20 steps the final losses differ by well under
// 1% (0.06% fp16, 0.3% bf16 were measured over 40 steps), and 2% still catches a broken path
// (a missing unscale or a lost update moves the loss by tens of percent).
constexpr double kRelativeTolerance = 0.02;

int failures = 0;

void expect(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "[ ok ]" : "[FAIL]", what.c_str());
  if (!ok) ++failures;
}

nlohmann::json read(const char* path) {
  std::ifstream file(path);
  if (!file) {
    std::fprintf(stderr, "zeroshard-check-mlp-precision: cannot read %s\n", path);
    std::exit(1);
  }
  return nlohmann::json::parse(file);
}

std::int64_t rank0_model_states(const nlohmann::json& report) {
  const nlohmann::json& host = report.at("memory").at(0).at("host");
  std::int64_t bytes = 0;
  for (const char* category : {"parameters", "gradients", "master_weights", "optimizer_states"}) {
    bytes += host.at(category).at("current").get<std::int64_t>();
  }
  return bytes;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> files;
  if (const std::optional<int> exit_code = zeroshard::cli::parse_files(
          argc, argv, "zeroshard-check-mlp-precision",
          "Compares --report-json files of zeroshard-train-mlp runs of the same model in fp32, "
          "fp16 and bf16.",
          "FP32.json FP16.json BF16.json", 3, files)) {
    return *exit_code;
  }
  const nlohmann::json fp32 = read(files[0].c_str());
  const double reference = fp32.at("final_loss").get<double>();
  for (std::size_t i = 1; i < files.size(); ++i) {
    const nlohmann::json run = read(files[i].c_str());
    const std::string name = run.at("precision").get<std::string>();
    const double final_loss = run.at("final_loss").get<double>();
    const double first = run.at("losses").at(0).get<double>();
    std::printf("%s: first loss %.6f, final %.6f (fp32 final %.6f)\n", name.c_str(), first,
                final_loss, reference);
    expect(std::fabs(final_loss - reference) <= kRelativeTolerance * reference,
           name + " final loss within 2% of fp32's");
    expect(final_loss < 0.9 * first, name + " loss fell");
    expect(rank0_model_states(run) < rank0_model_states(fp32),
           name + " keeps fewer model-state bytes than fp32");
  }
  return failures == 0 ? 0 : 1;
}
