// zeroshard-check-mlp-checkpointing: compares zeroshard-train-mlp reports pairwise, each run
// without activation checkpointing followed by the same run with it: the same losses and
// parameters, bit for bit (checkpointing recomputes, it does not change the arithmetic, and
// dropout draws the same masks), and fewer activation bytes at the peak.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "[ ok ]" : "[FAIL]", what.c_str());
  if (!ok) ++failures;
}

// Rank 0's activations peak wherever the engine counted them.
std::int64_t rank0_activation_peak(const nlohmann::json& report) {
  std::int64_t peak = 0;
  const nlohmann::json& memory = report.at("memory").at(0);
  for (const char* location : {"host", "device"}) {
    if (memory.contains(location)) {
      peak += memory.at(location).at("activations").at("peak").get<std::int64_t>();
    }
  }
  return peak;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || argc % 2 != 1) {
    std::fprintf(stderr,
                 "usage: zeroshard-check-mlp-checkpointing PLAIN.json CHECKPOINTED.json "
                 "[PLAIN.json CHECKPOINTED.json ...]\n");
    return 2;
  }
  try {
    for (int i = 1; i + 1 < argc; i += 2) {
      nlohmann::json pair[2];
      for (int k = 0; k < 2; ++k) {
        std::ifstream file(argv[i + k]);
        if (!file) {
          std::fprintf(stderr, "zeroshard-check-mlp-checkpointing: cannot read %s\n", argv[i + k]);
          return 1;
        }
        pair[k] = nlohmann::json::parse(file);
      }
      const int stage = pair[1].at("stage").get<int>();
      const int every = pair[1].at("checkpoint_every").get<int>();
      const double dropout = pair[1].at("dropout").get<double>();
      const std::vector<double> plain = pair[0].at("losses").get<std::vector<double>>();
      const std::vector<double> checkpointed = pair[1].at("losses").get<std::vector<double>>();
      char line[256];
      std::snprintf(line, sizeof line,
                    "stage %d, checkpoint every %d, dropout %g: %zu losses equal the %zu without, "
                    "bit for bit (final %.9f and %.9f)",
                    stage, every, dropout, checkpointed.size(), plain.size(), checkpointed.back(),
                    plain.back());
      expect(pair[0].at("stage").get<int>() == stage && every > 0 &&
                 pair[0].at("checkpoint_every").get<int>() == 0 &&
                 pair[0].at("dropout").get<double>() == dropout && plain == checkpointed,
             line);
      expect(pair[0].at("param_checksum") == pair[1].at("param_checksum"),
             "stage " + std::to_string(stage) + ": the parameter checksums are equal");
      const std::int64_t before = rank0_activation_peak(pair[0]);
      const std::int64_t after = rank0_activation_peak(pair[1]);
      std::snprintf(line, sizeof line,
                    "stage %d: rank 0's activations peak %lld bytes, %lld without", stage,
                    static_cast<long long>(after), static_cast<long long>(before));
      expect(after < before, line);
      const nlohmann::json& checkpointing = pair[1].at("checkpointing");
      if (checkpointing.at("cpu_checkpointing").get<bool>()) {
        const auto device = checkpointing.at("peak_kept_device").get<std::int64_t>();
        const auto host = checkpointing.at("peak_kept_host").get<std::int64_t>();
        std::snprintf(line, sizeof line,
                      "stage %d, cpu_checkpointing: kept inputs peak %lld bytes in pinned host "
                      "memory, %lld on the device",
                      stage, static_cast<long long>(host), static_cast<long long>(device));
        expect(host > 0 && device == 0, line);
      }
    }
  } catch (const nlohmann::json::exception& error) {
    std::fprintf(stderr, "zeroshard-check-mlp-checkpointing: malformed report: %s\n", error.what());
    return 1;
  }
  if (failures != 0) std::printf("%d check(s) failed\n", failures);
  return failures == 0 ? 0 : 1;
}
