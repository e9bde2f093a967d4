// zeroshard-trace: reads the flight-recorder dumps every rank wrote to ZEROSHARD_TRACE_DIR on a
// timeout or abort and says which rank could not be heard, is missing, behind, or issued a
// different collective, with the evidence (trace_diagnosis.h).
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>  // nlohmann::json, the dumps' format
#include <string>
#include <vector>

#include "tools/command_line.h"
#include "tools/trace_diagnosis.h"

namespace {

namespace fs = std::filesystem;

// Exit codes, as documented in docs/troubleshooting.md.
constexpr int kCulpritNamed = 0;       // a rank was singled out
constexpr int kNothingSingledOut = 1;  // the dumps single out no rank
constexpr int kBadInput = 2;           // bad command line, no dumps, or a dump that cannot be read

constexpr const char* kDescription =
    R"(Reads the flight-recorder dumps (rank-R.json, rank-R.comm-N.json) that ranks write to
ZEROSHARD_TRACE_DIR=DIR when a collective times out or the job is aborted, and prints, per
communicator, which rank the others could not hear over the side channel, which left no dump,
which is behind or issued a different collective, and the records that show it.

Exit status: 0 a rank was named; 1 the dumps single out no rank; 2 bad command line, no dumps
in DIR, or an unreadable dump.)";

std::vector<zeroshard::trace::Dump> read_dumps(const fs::path& dir) {
  std::vector<zeroshard::trace::Dump> dumps;
  for (const fs::directory_entry& file : fs::directory_iterator(dir)) {
    const std::string name = file.path().filename().string();
    if (name.rfind("rank-", 0) != 0 || file.path().extension() != ".json") continue;
    std::ifstream in(file.path());
    if (!in) throw std::runtime_error("cannot open " + name);
    dumps.push_back(zeroshard::trace::parse_dump(nlohmann::json::parse(in), name));
  }
  return dumps;
}

}  // namespace

int main(int argc, char** argv) {
  fs::path dir;
  CLI::App app(kDescription, "zeroshard-trace");
  app.add_option("DIR", dir, "the folder ZEROSHARD_TRACE_DIR named")->required();
  if (const auto exit_code = zeroshard::cli::parse(app, argc, argv)) return *exit_code;
  std::vector<zeroshard::trace::Dump> dumps;
  try {
    dumps = read_dumps(dir);
  } catch (const std::exception& error) {
    std::cerr << "zeroshard-trace: " << dir.string() << ": " << error.what() << "\n";
    return kBadInput;
  }
  if (dumps.empty()) {
    std::cerr << "zeroshard-trace: no rank-*.json dumps in " << dir.string()
              << "; set ZEROSHARD_TRACE_DIR to this directory for every rank of the job\n";
    return kBadInput;
  }
  const std::vector<zeroshard::trace::CommunicatorDiagnosis> diagnoses =
      zeroshard::trace::diagnose(dumps);
  std::cout << zeroshard::trace::to_text(diagnoses);
  for (const auto& diagnosis : diagnoses) {
    if (!diagnosis.blamed().empty()) return kCulpritNamed;
  }
  return kNothingSingledOut;
}
