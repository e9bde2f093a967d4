// zeroshard-check-mlp-handover: compares zeroshard-train-mlp runs that hand gradients over per
// layer with the same runs handing them over at the end of backward (--grad-handover end): the
// same losses and parameters bit for bit at every stage, stage 2 holding no more bytes per rank
// than stage 0 in either order, and smaller buckets no more than larger ones. Prints the bytes per
// rank of every run as a Markdown table.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "command_line.h"

#include "report_pairs.h"

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "[ ok ]" : "[FAIL]", what.c_str());
  if (!ok) ++failures;
}

using zeroshard::examples::most_per_rank;

std::string describe(const nlohmann::json& report) {
  return "stage " + std::to_string(report.at("stage").get<int>()) + ", " +
         report.at("grad_handover").get<std::string>() + ", buckets of " +
         std::to_string(report.at("reduce_bucket_size").get<std::int64_t>());
}

void print_table(const std::vector<nlohmann::json>& reports) {
  std::printf(
      "\n| stage | handover | reduce_bucket_size | parameters | gradients | optimizer "
      "states | communication | total peak per rank |\n|---|---|---|---|---|---|---|---|\n");
  for (const nlohmann::json& r : reports) {
    std::printf("| %d | %s | %lld | %lld | %lld | %lld | %lld | %lld |\n", r.at("stage").get<int>(),
                r.at("grad_handover").get<std::string>().c_str(),
                static_cast<long long>(r.at("reduce_bucket_size").get<std::int64_t>()),
                static_cast<long long>(most_per_rank(r, "parameters")),
                static_cast<long long>(most_per_rank(r, "gradients")),
                static_cast<long long>(most_per_rank(r, "optimizer_states")),
                static_cast<long long>(most_per_rank(r, "communication")),
                static_cast<long long>(most_per_rank(r, "total_peak")));
  }
  std::printf("\n(bytes; peaks, the most any rank held; %d ranks)\n",
              reports.front().at("world_size").get<int>());
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> files;
  if (const std::optional<int> exit_code = zeroshard::cli::parse_files(
          argc, argv, "zeroshard-check-mlp-handover",
          "Compares zeroshard-train-mlp runs that hand gradients over per layer with the same "
          "runs handing them over at the end of backward.",
          "LAYER0.json LAYER1.json LAYER2.json LAYER3.json END0.json END1.json END2.json "
          "END3.json END2_SMALL_BUCKETS.json",
          9, files)) {
    return *exit_code;
  }
  std::vector<nlohmann::json> reports;
  try {
    for (const std::string& path : files) {
      std::ifstream file(path);
      if (!file) {
        std::fprintf(stderr, "zeroshard-check-mlp-handover: cannot read %s\n", path.c_str());
        return 1;
      }
      reports.push_back(nlohmann::json::parse(file));
    }
    char line[320];
    for (int stage = 0; stage < 4; ++stage) {
      const nlohmann::json& layer = reports[static_cast<std::size_t>(stage)];
      const nlohmann::json& end = reports[static_cast<std::size_t>(4 + stage)];
      std::snprintf(line, sizeof line, "reports %d and %d are stage %d per layer and at the end",
                    stage, 4 + stage, stage);
      expect(layer.at("stage").get<int>() == stage && end.at("stage").get<int>() == stage &&
                 layer.at("grad_handover") == "layer" && end.at("grad_handover") == "end",
             line);
      // The same buckets reduce the same sums in the same order: only where they wait differs.
      std::snprintf(line, sizeof line,
                    "stage %d: losses and parameter checksum at the end equal per layer's, bit for "
                    "bit (final loss %.9f and %.9f)",
                    stage, end.at("final_loss").get<double>(),
                    layer.at("final_loss").get<double>());
      expect(end.at("losses") == layer.at("losses") &&
                 end.at("param_checksum") == layer.at("param_checksum"),
             line);
    }
    const nlohmann::json& small = reports[8];
    expect(small.at("stage").get<int>() == 2 && small.at("grad_handover") == "end" &&
               small.at("reduce_bucket_size").get<std::int64_t>() <
                   reports[6].at("reduce_bucket_size").get<std::int64_t>(),
           "the last report is stage 2 at the end with smaller buckets");
    expect(small.at("losses") == reports[6].at("losses"),
           "stage 2 at the end: smaller buckets give the same losses, bit for bit");
    const auto compare = [&](const nlohmann::json& lower, const nlohmann::json& higher) {
      const std::int64_t low = most_per_rank(lower, "total_peak");
      const std::int64_t high = most_per_rank(higher, "total_peak");
      std::snprintf(line, sizeof line, "%s holds %lld bytes per rank at most, %s %lld",
                    describe(lower).c_str(), static_cast<long long>(low), describe(higher).c_str(),
                    static_cast<long long>(high));
      expect(low <= high, line);
    };
    compare(reports[2], reports[0]);
    compare(reports[6], reports[4]);
    compare(small, reports[6]);
    print_table(reports);
  } catch (const nlohmann::json::exception& error) {
    std::fprintf(stderr, "zeroshard-check-mlp-handover: malformed report: %s\n", error.what());
    return 1;
  }
  if (failures != 0) std::printf("%d check(s) failed\n", failures);
  return failures == 0 ? 0 : 1;
}
