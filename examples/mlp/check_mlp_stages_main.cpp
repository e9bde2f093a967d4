// zeroshard-check-mlp-stages: compares the --report-json files of zeroshard-train-mlp runs at
// stages 0, 1, 2, 3 (in that order): the same losses and final parameters bit for bit, a falling
// loss, and sharded optimizer states.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "command_line.h"

namespace {

// Every stage sums each gradient element over the ranks in the same order (stage 0 reduce-scatters
// as stages 1-3 do and gathers the sums back) and takes the same norm, so the runs agree bit for
// bit: every loss and the final parameters' checksum.
// The loss must have visibly fallen by the last step.
constexpr double kRequiredLossRatio = 0.9;

int failures = 0;

void expect(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "[ ok ]" : "[FAIL]", what.c_str());
  if (!ok) ++failures;
}

// Optimizer-state bytes rank 0 holds, wherever they live (host, or device with the CUDA backend).
std::int64_t rank0_optimizer_states(const nlohmann::json& report) {
  std::int64_t bytes = 0;
  for (const char* location : {"host", "device"}) {
    const nlohmann::json& memory = report.at("memory").at(0);
    if (memory.contains(location)) {
      bytes += memory.at(location).at("optimizer_states").at("current").get<std::int64_t>();
    }
  }
  return bytes;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> files;
  if (const std::optional<int> exit_code = zeroshard::cli::parse_files(
          argc, argv, "zeroshard-check-mlp-stages",
          "Compares the --report-json files of zeroshard-train-mlp runs at stages 0, 1, 2, 3.",
          "ZERO0.json ZERO1.json ZERO2.json ZERO3.json", 4, files)) {
    return *exit_code;
  }
  std::vector<nlohmann::json> reports;
  for (const std::string& path : files) {
    std::ifstream file(path);
    if (!file) {
      std::fprintf(stderr, "zeroshard-check-mlp-stages: cannot read %s\n", path.c_str());
      return 1;
    }
    try {
      reports.push_back(nlohmann::json::parse(file));
    } catch (const nlohmann::json::exception& error) {
      std::fprintf(stderr, "zeroshard-check-mlp-stages: %s: %s\n", path.c_str(), error.what());
      return 1;
    }
  }

  try {
    const nlohmann::json& losses0 = reports[0].at("losses");
    const std::int64_t states0 = rank0_optimizer_states(reports[0]);
    const int world = reports[0].at("world_size").get<int>();
    char line[256];
    for (int stage = 0; stage < 4; ++stage) {
      const nlohmann::json& report = reports[static_cast<std::size_t>(stage)];
      std::snprintf(line, sizeof line, "report %d is stage %d on %d ranks", stage,
                    report.at("stage").get<int>(), report.at("world_size").get<int>());
      expect(report.at("stage").get<int>() == stage && report.at("world_size").get<int>() == world,
             line);

      const std::vector<double> losses = report.at("losses").get<std::vector<double>>();
      const double final_loss = report.at("final_loss").get<double>();
      std::snprintf(line, sizeof line, "stage %d: loss fell from %.6f to %.6f (< %.2f x first)",
                    stage, losses.front(), final_loss, kRequiredLossRatio);
      expect(final_loss < kRequiredLossRatio * losses.front(), line);

      if (stage == 0) continue;
      std::snprintf(line, sizeof line,
                    "stage %d: every loss and the final parameter checksum equal stage 0's, bit "
                    "for bit (final loss %.9g, stage 0's %.9g)",
                    stage, final_loss, reports[0].at("final_loss").get<double>());
      expect(report.at("losses") == losses0 &&
                 report.at("param_checksum") == reports[0].at("param_checksum"),
             line);

      // Each rank holds the states of its shard of the padded flat buffer: a world-th of the
      // unpadded states plus at most the padding's share.
      const std::int64_t states = rank0_optimizer_states(report);
      const std::int64_t parameters = report.at("parameters").get<std::int64_t>();
      const std::int64_t padded = report.at("padded_parameters").get<std::int64_t>();
      const double bytes_per_element = static_cast<double>(states0) / parameters;
      const double ideal = static_cast<double>(states0) / world;
      const double slack = bytes_per_element * (padded - parameters);
      std::snprintf(line, sizeof line,
                    "stage %d: rank 0 holds %lld optimizer-state bytes, stage 0 / %d = %.0f "
                    "(padding allows %.0f more)",
                    stage, static_cast<long long>(states), world, ideal, slack);
      expect(states >= ideal - bytes_per_element && states <= ideal + slack, line);
    }
  } catch (const nlohmann::json::exception& error) {
    std::fprintf(stderr, "zeroshard-check-mlp-stages: malformed report: %s\n", error.what());
    return 1;
  }
  if (failures != 0) std::printf("%d check(s) failed\n", failures);
  return failures == 0 ? 0 : 1;
}
