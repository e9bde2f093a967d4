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
#include <optional>
#include <string>
#include <vector>

#include "command_line.h"

namespace zeroshard::examples {

class ReportPairs {
 public:
  /// `description` (what the program checks) and `names` (the file names it takes) make its
  /// --help.
  ReportPairs(const char* program, const char* description, const char* names)
      : program_(program), description_(description), names_(names) {}

  void expect(bool ok, const std::string& what) {
    std::printf("%s %s\n", ok ? "[ ok ]" : "[FAIL]", what.c_str());
    if (!ok) ++failures_;
  }

  /// Calls `check(first, second)` for each pair of files on the command line; returns the exit
  /// code: 0 when every check passed, 1 on a failed check or an unreadable report, 2 on usage.
  int run(int argc, char** argv,
          const std::function<void(const nlohmann::json&, const nlohmann::json&)>& check) {
    std::vector<std::string> files;
    if (const std::optional<int> exit_code =
            cli::parse_files(argc, argv, program_, description_, names_, 0, files)) {
      return *exit_code;
    }
    if (files.size() % 2 != 0) {
      return cli::bad_command_line(program_, "give the reports in pairs: " + std::string(names_));
    }
    try {
      for (std::size_t i = 0; i < files.size(); i += 2) {
        nlohmann::json pair[2];
        for (std::size_t k = 0; k < 2; ++k) {
          std::ifstream file(files[i + k]);
          if (!file) {
            std::fprintf(stderr, "%s: cannot read %s\n", program_, files[i + k].c_str());
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
  const char* description_;
  const char* names_;
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
