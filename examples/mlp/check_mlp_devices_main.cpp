// zeroshard-check-mlp-devices: compares the --report-json file of a zeroshard-train-mlp run on
// the CPU with the same run on a GPU: the GPU run really ran there, and learned what the CPU run
// learned. Exits 77 (skipped) when the GPU report is missing because the GPU run was skipped.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "command_line.h"

namespace {

// cuBLAS sums the matrix products in another order than OpenBLAS, so the curves agree to
// rounding that grows over the steps; a wrong gradient or a lost update moves the loss by far
// more than this.
constexpr double kRelativeTolerance = 1e-3;

nlohmann::json read(const char* path) {
  std::ifstream file(path);
  return nlohmann::json::parse(file);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> files;
  if (const std::optional<int> exit_code = zeroshard::cli::parse_files(
          argc, argv, "zeroshard-check-mlp-devices",
          "Compares the --report-json file of a zeroshard-train-mlp run on the CPU with the same "
          "run's on a GPU.",
          "CPU_REPORT.json GPU_REPORT.json", 2, files)) {
    return *exit_code;
  }
  if (!std::filesystem::exists(files[1])) {
    std::printf("SKIPPED: %s does not exist (the GPU run was skipped: no GPU)\n", files[1].c_str());
    return 77;
  }
  int failures = 0;
  try {
    const nlohmann::json cpu = read(files[0].c_str());
    const nlohmann::json gpu = read(files[1].c_str());
    const std::string device = gpu.at("device").get<std::string>();
    const bool on_gpu = device.rfind("cuda:", 0) == 0;
    std::printf("%s GPU report ran on %s\n", on_gpu ? "[ ok ]" : "[FAIL]", device.c_str());
    failures += on_gpu ? 0 : 1;
    const auto cpu_losses = cpu.at("losses").get<std::vector<double>>();
    const auto gpu_losses = gpu.at("losses").get<std::vector<double>>();
    if (cpu_losses.size() != gpu_losses.size()) {
      std::printf("[FAIL] %zu CPU steps against %zu GPU steps\n", cpu_losses.size(),
                  gpu_losses.size());
      return 1;
    }
    for (std::size_t i = 0; i < cpu_losses.size(); ++i) {
      const double relative = std::fabs(gpu_losses[i] - cpu_losses[i]) / std::fabs(cpu_losses[i]);
      if (relative <= kRelativeTolerance) continue;
      std::printf("[FAIL] step %zu: GPU loss %.9f, CPU loss %.9f (relative %.2e > %.0e)\n", i + 1,
                  gpu_losses[i], cpu_losses[i], relative, kRelativeTolerance);
      ++failures;
    }
    std::printf("%s %zu losses agree within %.0e relative (final: GPU %.9f, CPU %.9f)\n",
                failures == 0 ? "[ ok ]" : "[FAIL]", cpu_losses.size(), kRelativeTolerance,
                gpu_losses.back(), cpu_losses.back());
  } catch (const std::exception& error) {
    std::fprintf(stderr, "zeroshard-check-mlp-devices: %s\n", error.what());
    return 1;
  }
  return failures == 0 ? 0 : 1;
}
