// zeroshard-trace as a user runs it, on dumps written here: a missing rank, a rank behind, ranks
// that issued different collectives, dumps that agree, and a directory without dumps; and on the
// dumps of a real 4-host job whose host 3 lost its data link (tests/trace_dumps).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

namespace {

namespace fs = std::filesystem;

struct ToolRun {
  std::string out;
  int status = -1;
};

ToolRun run_tool(const fs::path& dir) {
  const char* tools = std::getenv("ZEROSHARD_TOOLS_DIR");
  const std::string command =
      std::string(tools != nullptr ? tools : ".") + "/zeroshard-trace " + dir.string() + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ToolRun run;
  char buffer[4096];
  while (pipe != nullptr && std::fgets(buffer, sizeof buffer, pipe) != nullptr) run.out += buffer;
  const int status = pipe != nullptr ? pclose(pipe) : -1;
  run.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

// One rank's dump with collectives 1..last, the last `pending` of them not completed (the very
// last one failed, as a timeout leaves it); `last_op` names the last one.
void write_dump(const fs::path& dir, int rank, int size, int last, int pending,
                const std::string& last_op = "all-reduce") {
  std::ostringstream entries;
  for (int seq = 1; seq <= last; ++seq) {
    const bool done = seq <= last - pending;
    const std::string state = done ? "completed" : (seq == last ? "failed" : "pending");
    entries << (seq > 1 ? "," : "") << R"({"seq":)" << seq << R"(,"op":")"
            << (seq == last ? last_op : "all-reduce") << R"(","count":16,"dtype":"fp32",)"
            << R"("state":")" << state << R"(","start_s":)" << 1000 + seq << R"(,"end_s":)"
            << (state == "pending" ? "null" : std::to_string(1000.5 + seq))
            << R"(,"duration_s":0.5})";
  }
  std::ofstream(dir / ("rank-" + std::to_string(rank) + ".json"))
      << R"({"rank":)" << rank << R"(,"size":)" << size << R"(,"backend":"mpi","communicator":0,)"
      << R"("last_started":)" << last << R"(,"last_completed":)" << last - pending
      << R"(,"gave_up_in":)" << last << R"(,"peers":[],"entries":[)" << entries.str() << "]}";
}

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("trace_tool_test_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

TEST(TraceTool, NamesARankWithoutADumpAndWhereTheOthersWait) {
  const fs::path dir = fresh_dir("missing");
  for (int rank : {0, 1, 2}) write_dump(dir, rank, 4, 42, 1, "reduce-scatter");
  const ToolRun run = run_tool(dir);
  EXPECT_EQ(run.status, 0) << run.out;
  EXPECT_NE(run.out.find("rank 3: no dump (dead or stopped"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("ranks 0,1,2 are waiting in #42 reduce-scatter of 16 fp32 elements"),
            std::string::npos)
      << run.out;
}

TEST(TraceTool, NamesTheRankBehindAndItsLastCollective) {
  const fs::path dir = fresh_dir("behind");
  write_dump(dir, 0, 3, 42, 1, "reduce-scatter");
  write_dump(dir, 1, 3, 42, 1, "reduce-scatter");
  write_dump(dir, 2, 3, 41, 1);
  const ToolRun run = run_tool(dir);
  EXPECT_EQ(run.status, 0) << run.out;
  EXPECT_NE(run.out.find("rank 2 is behind: its last collective is #41 all-reduce of 16 fp32 "
                         "elements (started, not completed)"),
            std::string::npos)
      << run.out;
  EXPECT_NE(run.out.find("ranks 0,1 are waiting in #42 reduce-scatter"), std::string::npos)
      << run.out;
}

TEST(TraceTool, NamesARankThatIssuedADifferentCollective) {
  const fs::path dir = fresh_dir("mismatch");
  write_dump(dir, 0, 2, 7, 1, "all-reduce");
  write_dump(dir, 1, 2, 7, 1, "broadcast");
  const ToolRun run = run_tool(dir);
  EXPECT_EQ(run.status, 0) << run.out;
  EXPECT_NE(run.out.find("rank 1 issued a different collective as #7: #7 broadcast"),
            std::string::npos)
      << run.out;
}

TEST(TraceTool, ExitsOneWhenTheDumpsAgree) {
  const fs::path dir = fresh_dir("agree");
  write_dump(dir, 0, 2, 5, 0);
  write_dump(dir, 1, 2, 5, 0);
  const ToolRun run = run_tool(dir);
  EXPECT_EQ(run.status, 1) << run.out;
  EXPECT_NE(run.out.find("no rank is singled out"), std::string::npos) << run.out;
}

fs::path recorded_set(const std::string& name) {
  const char* source = std::getenv("ZEROSHARD_SOURCE_DIR");
  return fs::path(source != nullptr ? source : ".") / "tests" / "trace_dumps" / name;
}

TEST(TraceTool, NamesTheRankWhoseLinkWasCutAndNoHealthyRank) {
  // The cut rank had started more collectives than the healthy ones, which wait in an earlier one.
  const ToolRun run = run_tool(recorded_set("link_cut_numbers_differ"));
  EXPECT_EQ(run.status, 0) << run.out;
  EXPECT_NE(run.out.find("rank 2 is cut off: ranks 0,1,3 heard one another"), std::string::npos)
      << run.out;
  EXPECT_NE(run.out.find("\nnamed: rank 2\n"), std::string::npos) << run.out;
  EXPECT_EQ(run.out.find(" is behind:"), std::string::npos) << run.out;
}

TEST(TraceTool, NamesTheRankNoOtherHeardWhenAllWaitInTheSameCollective) {
  const ToolRun run = run_tool(recorded_set("link_cut_numbers_agree"));
  EXPECT_EQ(run.status, 0) << run.out;
  EXPECT_NE(run.out.find("\nnamed: rank 2\n"), std::string::npos) << run.out;
}

TEST(TraceTool, ExitsTwoNamingTheFieldOfABadDump) {
  const fs::path dir = fresh_dir("bad");
  std::ofstream(dir / "rank-0.json") << R"({"rank":0,"size":2,"entries":[]})";
  const ToolRun run = run_tool(dir);
  EXPECT_EQ(run.status, 2) << run.out;
  EXPECT_NE(run.out.find("rank-0.json: missing field 'last_started'"), std::string::npos)
      << run.out;
}

TEST(TraceTool, ExitsTwoWithoutDumps) {
  const ToolRun run = run_tool(fresh_dir("empty"));
  EXPECT_EQ(run.status, 2) << run.out;
  EXPECT_NE(run.out.find("no rank-*.json dumps"), std::string::npos) << run.out;
}

}  // namespace
