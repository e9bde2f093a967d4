// What the zeroshard-check-mlp-* programs that compare runs pairwise share: reading pairs of
// zeroshard-train-mlp --report-json files from the command line, printing each check as
// "[ ok ]" or "[FAIL]", and the bytes of one memory category held by rank 0 or by any rank.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>

namespace zeroshard::examples {

class ReportPairs {
 public:
  /// `usage` is printed when the arguments are not pairs of files.
  ReportPairs(const char* program, const char* usage) : program_(program), usage_(usage) {}

  void expect(bool ok, const std::string& what) {
    std::printf("%s %s\n", ok ? "[ ok ]" : "[FAIL]", what.c_str());
    if (!ok) ++failures_;
  }

  /// Calls `check(first, second)` for each pair of files on the command line; returns the exit
  /// code: 0 when every check passed, 1 on a failed check or an unreadable report, 2 on usage.
  int run(int argc, char** argv,
          const std::function<void(const nlohmann::json&, const nlohmann::json&)>& check) {
    if (argc < 3 || argc % 2 != 1) {
      std::fprintf(stderr, "usage: %s %s\n", program_, usage_);
      return 2;
    }
    try {
      for (int i = 1; i + 1 < argc; i += 2) {
        nlohmann::json pair[2];
        for (int k = 0; k < 2; ++k) {
          std::ifstream file(argv[i + k]);
          if (!file) {
            std::fprintf(stderr, "%s: cannot read %s\n", program_, argv[i + k]);
            return 1;
          }
          pair[k] = nlohmann::json::parse(file);
        }
        check(pair[0], pair[1]);
      }
    } catch (const nlohmann::json::exception& error) {
      std::fprintf(stderr, "%s: malformed report: %s\n", program_, error.what());
      return 1;
    }
    if (failures_ != 0) std::printf("%d check(s) failed\n", failures_);
    return failures_ == 0 ? 0 : 1;
  }

 private:
  const char* program_;
  const char* usage_;
  int failures_ = 0;
};

/// Rank 0's `field` ("current" or "peak") bytes of `category`, summed over `locations`.
inline std::int64_t rank0_bytes(const nlohmann::json& report, const char* category,
                                const char* field,
                                std::initializer_list<const char*> locations = {"host", "device"}) {
  const nlohmann::json& memory = report.at("memory").at(0);
  std::int64_t bytes = 0;
  for (const char* location : locations) {
    if (memory.contains(location)) {
      bytes += memory.at(location).at(category).at(field).get<std::int64_t>();
    }
  }
  return bytes;
}

/// The most any rank held of `category`'s `field` ("peak" or "adopted"), host and device
/// together; category "total_peak" for the whole footprint (`field` is then not read).
inline std::int64_t most_per_rank(const nlohmann::json& report, const char* category,
                                  const char* field = "peak") {
  std::int64_t worst = 0;
  for (const nlohmann::json& memory : report.at("memory")) {
    std::int64_t bytes = 0;
    for (const char* location : {"host", "device"}) {
      if (!memory.contains(location)) continue;
      const nlohmann::json& at = memory.at(location);
      bytes += std::string(category) == "total_peak"
                   ? at.at("total_peak").get<std::int64_t>()
                   : at.at(category).at(field).get<std::int64_t>();
    }
    worst = std::max(worst, bytes);
  }
  return worst;
}

}  // namespace zeroshard::examples
