// The zeroshard-estimate tool as a user runs it: its printed GB figures, the inverse question, and
// its messages for bad input.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>

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

TEST(EstimateTool, PrintsThePaperFiguresInGB) {
  const std::string out =
      run(tool() + " --params 7.5B --ranks 64 --precision fp16 --optimizer adam");
  std::istringstream lines(out);
  std::string line;
  std::string paper_row;
  while (std::getline(lines, line)) {
    if (line.find("model states (ZeRO paper)") != std::string::npos) paper_row = line;
  }
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

TEST(EstimateTool, RejectsABadStageNamingTheOption) {
  const std::string out = run(tool() + " --params 1B --stage 5 2>&1");
  EXPECT_NE(out.find("--stage: got 5, expected 0..3"), std::string::npos) << out;
}

}  // namespace
