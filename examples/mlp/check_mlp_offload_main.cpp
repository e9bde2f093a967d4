// zeroshard-check-mlp-offload: compares zeroshard-train-mlp reports pairwise, each run without
// offload followed by the same run with it: the same losses at every step, bit for bit (offload
// moves the optimizer, not its arithmetic), and the offloaded run's optimizer states in host
// memory only.
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

std::int64_t rank0_bytes(const nlohmann::json& report, const char* location, const char* category) {
  const nlohmann::json& memory = report.at("memory").at(0);
  if (!memory.contains(location)) return 0;
  return memory.at(location).at(category).at("current").get<std::int64_t>();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || argc % 2 != 1) {
    std::fprintf(stderr,
                 "usage: zeroshard-check-mlp-offload RESIDENT.json OFFLOADED.json "
                 "[RESIDENT.json OFFLOADED.json ...]\n");
    return 2;
  }
  try {
    for (int i = 1; i + 1 < argc; i += 2) {
      nlohmann::json pair[2];
      for (int k = 0; k < 2; ++k) {
        std::ifstream file(argv[i + k]);
        if (!file) {
          std::fprintf(stderr, "zeroshard-check-mlp-offload: cannot read %s\n", argv[i + k]);
          return 1;
        }
        pair[k] = nlohmann::json::parse(file);
      }
      const int stage = pair[1].at("stage").get<int>();
      const std::vector<double> resident = pair[0].at("losses").get<std::vector<double>>();
      const std::vector<double> offloaded = pair[1].at("losses").get<std::vector<double>>();
      char line[256];
      std::snprintf(line, sizeof line,
                    "stage %d: %zu losses with offload equal the %zu without, bit for bit "
                    "(final %.9f and %.9f)",
                    stage, offloaded.size(), resident.size(), offloaded.back(), resident.back());
      expect(pair[0].at("stage").get<int>() == stage && resident == offloaded, line);
      // A CPU run keeps every buffer in host memory, so where the states live says nothing
      // there; a GPU run must hold none on the device.
      const std::int64_t device_states = rank0_bytes(pair[1], "device", "optimizer_states");
      const std::int64_t host_states = rank0_bytes(pair[1], "host", "optimizer_states");
      std::snprintf(line, sizeof line,
                    "stage %d: rank 0's offloaded optimizer states: %lld bytes on the host, %lld "
                    "on the device",
                    stage, static_cast<long long>(host_states),
                    static_cast<long long>(device_states));
      expect(host_states > 0 && device_states == 0, line);
    }
  } catch (const nlohmann::json::exception& error) {
    std::fprintf(stderr, "zeroshard-check-mlp-offload: malformed report: %s\n", error.what());
    return 1;
  }
  if (failures != 0) std::printf("%d check(s) failed\n", failures);
  return failures == 0 ? 0 : 1;
}
