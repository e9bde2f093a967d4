// zeroshard-trace's diagnosis on sets of dumps: sets the flight recorder wrote (tests/trace_dumps:
// a 4-host job whose host 3 lost its data link, the ranks at different and at the same collective
// numbers; the stalled-rank test's, before and after the stopped rank resumed), and sets written
// here in the recorder's format for cases a real run does not give on demand.
#include "trace_diagnosis.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace zeroshard::trace {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

std::vector<Dump> recorded_set(const std::string& name) {
  const char* source = std::getenv("ZEROSHARD_SOURCE_DIR");
  const std::filesystem::path dir =
      std::filesystem::path(source != nullptr ? source : ".") / "tests" / "trace_dumps" / name;
  std::vector<Dump> dumps;
  for (const auto& file : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(file.path());
    dumps.push_back(parse_dump(json::parse(in), file.path().filename().string()));
  }
  return dumps;
}

const Dump& dump_of(const std::vector<Dump>& dumps, int communicator, int rank) {
  return *std::find_if(dumps.begin(), dumps.end(), [&](const Dump& dump) {
    return dump.communicator == communicator && dump.rank == rank;
  });
}

// One rank's dump as collective_tracker.cpp writes it: collectives up to `last` started, up to
// `completed` completed; when `timed_out`, the next one failed (the rank gave up in it) and the
// peers it asked are listed.
struct DumpSpec {
  int rank = 0;
  int size = 4;
  int communicator = 1;
  std::int64_t completed = 40;
  std::int64_t last = 41;
  bool timed_out = true;
  std::vector<std::pair<int, bool>> peers = {};  // (rank, heard)
  std::string op = "all-gather";
  std::string backend = "mpi";
  long pid = 0;
};

Dump recorder_dump(const DumpSpec& spec) {
  json entries = json::array();
  for (std::int64_t seq = std::max<std::int64_t>(1, spec.last - 15); seq <= spec.last; ++seq) {
    const double start = 1000 + 0.01 * static_cast<double>(seq);
    const bool done = seq <= spec.completed;
    const bool failed = spec.timed_out && seq == spec.completed + 1;
    const double duration = done ? 0.001 : 6.0;
    entries.push_back({{"seq", seq},
                       {"op", spec.op},
                       {"count", 100},
                       {"dtype", "fp32"},
                       {"state", done     ? "completed"
                                 : failed ? "failed"
                                          : "pending"},
                       {"start_s", start},
                       {"duration_s", duration},
                       {"end_s", done || failed ? json(start + duration) : json(nullptr)}});
  }
  json peers = json::array();
  for (const auto& [rank, heard] : spec.peers) {
    json item = {{"rank", rank}, {"heard", heard}};
    if (heard) {
      item["last_started"] = spec.last;
      item["last_completed"] = spec.completed;
      item["waiting_in"] = spec.completed + 1;
      item["gave_up_in"] = spec.completed + 1;
    }
    peers.push_back(item);
  }
  const std::string rank = std::to_string(spec.rank);
  const json document = {
      {"format", "zeroshard-flight-recorder-1"},
      {"rank", spec.rank},
      {"size", spec.size},
      {"backend", spec.backend},
      {"communicator", spec.communicator},
      {"host", "host" + rank},
      {"pid", spec.pid},
      {"dumped_at_s", 1010.0},
      {"reason", spec.timed_out ? "collective #" + std::to_string(spec.completed + 1) +
                                      " all-gather ... timed out 6.0 s after it started"
                                : "abort(1) called on rank " + rank},
      {"capacity", 16},
      {"last_started", spec.last},
      {"last_completed", spec.completed},
      {"gave_up_in", spec.timed_out ? spec.completed + 1 : 0},
      {"peers", peers},
      {"entries", entries}};
  return parse_dump(document, "rank-" + rank + ".json");
}

// The peers `self` lists in a world of `size`: heard when in `heard`, not heard otherwise.
std::vector<std::pair<int, bool>> hearing(int self, const std::vector<int>& heard, int size) {
  std::vector<std::pair<int, bool>> peers;
  for (int rank = 0; rank < size; ++rank) {
    if (rank == self) continue;
    peers.emplace_back(rank, std::find(heard.begin(), heard.end(), rank) != heard.end());
  }
  return peers;
}

TEST(TraceDiagnosis, NamesTheRankWhoseLinkWasCutNotTheHealthyRanksAtLowerNumbers) {
  const std::vector<Dump> dumps = recorded_set("link_cut_numbers_differ");
  // The case of the issue: the cut rank had started more collectives than the healthy ones.
  for (int rank : {0, 1, 3}) {
    EXPECT_LT(dump_of(dumps, 1, rank).last_started, dump_of(dumps, 1, 2).last_started);
  }
  const std::vector<CommunicatorDiagnosis> diagnoses = diagnose(dumps);
  ASSERT_EQ(diagnoses.size(), 2u);
  EXPECT_EQ(diagnoses[0].communicator, 0);
  EXPECT_TRUE(diagnoses[0].blamed().empty()) << to_text(diagnoses);
  EXPECT_EQ(diagnoses[1].blamed(), std::vector<int>{2}) << to_text(diagnoses);
  EXPECT_THAT(to_text(diagnoses),
              HasSubstr("rank 2 is cut off: ranks 0,1,3 heard one another over the side channel "
                        "but not rank 2, and rank 2, asking in turn, heard none of them"));
  EXPECT_THAT(to_text(diagnoses), HasSubstr("ranks 0,1,3 are waiting in #"));
  EXPECT_THAT(to_text(diagnoses), Not(HasSubstr("rank 0 is behind")));
}

TEST(TraceDiagnosis, NamesTheRankNoOtherHeardWhenEveryDumpIsAtTheSameCollective) {
  const std::vector<Dump> dumps = recorded_set("link_cut_numbers_agree");
  int not_hearing_rank_2 = 0;
  for (int rank : {0, 1, 3}) {
    const Dump& dump = dump_of(dumps, 1, rank);
    EXPECT_EQ(dump.last_started, dump_of(dumps, 1, 2).last_started);
    for (const PeerRecord& peer : dump.peers) not_hearing_rank_2 += peer.rank == 2 && !peer.heard;
  }
  ASSERT_EQ(not_hearing_rank_2, 3);
  const std::vector<CommunicatorDiagnosis> diagnoses = diagnose(dumps);
  ASSERT_EQ(diagnoses.size(), 2u);
  EXPECT_EQ(diagnoses[1].blamed(), std::vector<int>{2}) << to_text(diagnoses);
  EXPECT_THAT(to_text(diagnoses), HasSubstr("named: rank 2"));
  // The program's communicator was dumped because the engine's timed out, in the same process.
  EXPECT_THAT(diagnoses[0].header,
              HasSubstr("written when another communicator of its process timed out: ranks "
                        "0,1,2,3"));
}

TEST(TraceDiagnosis, NamesAStoppedRankThatLeftNoDump) {
  const std::vector<CommunicatorDiagnosis> diagnoses =
      diagnose(recorded_set("stalled_rank_stopped"));
  ASSERT_EQ(diagnoses.size(), 1u);
  EXPECT_EQ(diagnoses[0].blamed(), std::vector<int>{2}) << to_text(diagnoses);
  EXPECT_THAT(to_text(diagnoses), HasSubstr("rank 2: no dump (dead or stopped"));
  EXPECT_THAT(to_text(diagnoses), HasSubstr("ranks 0,1 are waiting in #7 reduce-scatter"));
}

TEST(TraceDiagnosis, NamesAResumedRankThatStartedAfterTheOthersGaveUp) {
  const std::vector<CommunicatorDiagnosis> diagnoses =
      diagnose(recorded_set("stalled_rank_resumed"));
  ASSERT_EQ(diagnoses.size(), 1u);
  EXPECT_EQ(diagnoses[0].blamed(), std::vector<int>{2}) << to_text(diagnoses);
  EXPECT_THAT(to_text(diagnoses), HasSubstr("rank 2 is behind: it started #7"));
}

TEST(TraceDiagnosis, RanksAtDifferentNumbersWithCollectivesInFlightAreNotBehind) {
  // No side channel (NCCL): only the numbers. Every rank waits in #41, with more started after it.
  std::vector<Dump> dumps;
  for (const auto& [rank, last] : {std::pair{0, 43}, {1, 42}, {2, 41}, {3, 41}}) {
    dumps.push_back(recorder_dump({.rank = rank, .last = last, .backend = "nccl"}));
  }
  const std::vector<CommunicatorDiagnosis> diagnoses = diagnose(dumps);
  EXPECT_TRUE(diagnoses[0].blamed().empty()) << to_text(diagnoses);
  EXPECT_THAT(to_text(diagnoses), HasSubstr("ranks 0,1,2,3 are waiting in #41 all-gather"));
  EXPECT_THAT(to_text(diagnoses),
              HasSubstr("started different numbers of collectives (ranks 2,3 up to #41, rank 1 "
                        "up to #42, rank 0 up to #43)"));
  EXPECT_THAT(to_text(diagnoses), HasSubstr("no rank is singled out"));
}

TEST(TraceDiagnosis, NamesARankThatNeverStartedTheCollectiveTheOthersWaitIn) {
  std::vector<Dump> dumps;
  for (int rank : {0, 1, 2}) {
    dumps.push_back(recorder_dump({.rank = rank, .peers = hearing(rank, {0, 1, 2, 3}, 4)}));
  }
  dumps.push_back(recorder_dump({.rank = 3, .last = 40, .timed_out = false}));
  const std::vector<CommunicatorDiagnosis> diagnoses = diagnose(dumps);
  EXPECT_EQ(diagnoses[0].blamed(), std::vector<int>{3}) << to_text(diagnoses);
  EXPECT_THAT(to_text(diagnoses),
              HasSubstr("rank 3 is behind: its last collective is #40 all-gather of 100 fp32 "
                        "elements (completed), and it has not started #41, in which ranks 0,1,2 "
                        "wait"));
}

TEST(TraceDiagnosis, ARankWaitingInAnotherCommunicatorOfItsProcessIsNotBehindHere) {
  // Rank 3 entered the program's all-reduce (communicator 0, #12) while ranks 0-2 entered the
  // engine's all-gather (communicator 1, #41): each side waits for the other.
  std::vector<Dump> dumps;
  for (int rank = 0; rank < 4; ++rank) {
    const bool in_engine = rank != 3;
    dumps.push_back(recorder_dump(
        {.rank = rank, .last = in_engine ? 41 : 40, .timed_out = in_engine, .pid = 100 + rank}));
    dumps.push_back(recorder_dump({.rank = rank,
                                   .communicator = 0,
                                   .completed = 11,
                                   .last = in_engine ? 11 : 12,
                                   .timed_out = !in_engine,
                                   .op = "all-reduce",
                                   .pid = 100 + rank}));
  }
  const std::vector<CommunicatorDiagnosis> diagnoses = diagnose(dumps);
  ASSERT_EQ(diagnoses.size(), 2u);
  EXPECT_TRUE(diagnoses[0].blamed().empty()) << to_text(diagnoses);
  EXPECT_TRUE(diagnoses[1].blamed().empty()) << to_text(diagnoses);
  EXPECT_THAT(to_text(diagnoses),
              HasSubstr("rank 3 is not behind here: it has not started #41, in which ranks 0,1,2 "
                        "wait, because its process waits in communicator 0's #12 all-reduce"));
  EXPECT_THAT(to_text(diagnoses),
              HasSubstr("rank 0 is not behind here: it has not started #12, in which rank 3 "
                        "waits, because its process waits in communicator 1's #41 all-gather"));
}

TEST(TraceDiagnosis, ARankWithoutADumpThatOthersHeardIsNotBlamed) {
  std::vector<Dump> dumps;
  for (int rank : {0, 1, 3}) {
    dumps.push_back(recorder_dump({.rank = rank, .peers = hearing(rank, {0, 1, 2, 3}, 4)}));
  }
  const std::vector<CommunicatorDiagnosis> diagnoses = diagnose(dumps);
  EXPECT_TRUE(diagnoses[0].blamed().empty()) << to_text(diagnoses);
  EXPECT_THAT(to_text(diagnoses),
              HasSubstr("rank 2: no dump, but rank 0 heard it over the side channel: it had "
                        "started #41 and completed #40, and had given up in #41"));
}

TEST(TraceDiagnosis, NamesTheSilentRankOfTwoWhenOnlyTheOtherLeftADump) {
  const std::vector<CommunicatorDiagnosis> diagnoses =
      diagnose({recorder_dump({.rank = 0, .size = 2, .peers = hearing(0, {}, 2)})});
  EXPECT_EQ(diagnoses[0].blamed(), std::vector<int>{1}) << to_text(diagnoses);
  EXPECT_THAT(to_text(diagnoses),
              HasSubstr("rank 1: no dump (dead or stopped, or its link is cut; rank 0 asked over "
                        "the side channel and did not hear it)"));
}

TEST(TraceDiagnosis, NamesARankThatDumpedWithoutAnsweringTheOthers) {
  std::vector<Dump> dumps;
  for (int rank : {0, 1, 2}) {
    dumps.push_back(recorder_dump({.rank = rank, .peers = hearing(rank, {0, 1, 2}, 4)}));
  }
  dumps.push_back(recorder_dump({.rank = 3, .timed_out = false}));
  const std::vector<CommunicatorDiagnosis> diagnoses = diagnose(dumps);
  EXPECT_EQ(diagnoses[0].blamed(), std::vector<int>{3}) << to_text(diagnoses);
  EXPECT_THAT(to_text(diagnoses),
              HasSubstr("rank 3 did not answer: ranks 0,1,2 heard one another over the side "
                        "channel but not rank 3 (stopped, cut off, or busy outside this "
                        "communicator); its dump was written on abort(), and it was waiting in "
                        "#41 all-gather"));
}

TEST(TraceDiagnosis, NamesNoRankWhenNoRankHeardAnyOther) {
  std::vector<Dump> dumps;
  for (int rank = 0; rank < 4; ++rank) {
    dumps.push_back(recorder_dump({.rank = rank, .peers = hearing(rank, {}, 4)}));
  }
  const std::vector<CommunicatorDiagnosis> diagnoses = diagnose(dumps);
  EXPECT_TRUE(diagnoses[0].blamed().empty()) << to_text(diagnoses);
  EXPECT_THAT(to_text(diagnoses), HasSubstr("no rank heard any other over the side channel"));
}

TEST(TraceDiagnosis, NamesNoSideOfANetworkSplitInTwoEqualHalves) {
  std::vector<Dump> dumps;
  for (int rank = 0; rank < 4; ++rank) {
    const std::vector<int> half = rank < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3};
    dumps.push_back(recorder_dump({.rank = rank, .peers = hearing(rank, half, 4)}));
  }
  const std::vector<CommunicatorDiagnosis> diagnoses = diagnose(dumps);
  EXPECT_TRUE(diagnoses[0].blamed().empty()) << to_text(diagnoses);
  EXPECT_THAT(to_text(diagnoses), HasSubstr("only in separate groups (0,1 | 2,3)"));
}

TEST(TraceDiagnosis, NamesBothRanksOfAHostThatWasCutOff) {
  // Six ranks, two per host; host 3's ranks 4 and 5 still hear each other.
  std::vector<Dump> dumps;
  for (int rank = 0; rank < 6; ++rank) {
    const std::vector<int> group = rank < 4 ? std::vector<int>{0, 1, 2, 3} : std::vector<int>{4, 5};
    dumps.push_back(recorder_dump({.rank = rank, .size = 6, .peers = hearing(rank, group, 6)}));
  }
  const std::vector<CommunicatorDiagnosis> diagnoses = diagnose(dumps);
  EXPECT_EQ(diagnoses[0].blamed(), (std::vector<int>{4, 5})) << to_text(diagnoses);
  EXPECT_THAT(to_text(diagnoses), HasSubstr("ranks 4,5 are cut off from the others"));
}

TEST(TraceDiagnosis, NamesTheRankWhoseCollectiveDiffersFromTheMajoritys) {
  std::vector<Dump> dumps;
  for (int rank = 0; rank < 3; ++rank) {
    dumps.push_back(
        recorder_dump({.rank = rank, .size = 3, .op = rank == 1 ? "broadcast" : "all-reduce"}));
  }
  const std::vector<CommunicatorDiagnosis> diagnoses = diagnose(dumps);
  EXPECT_EQ(diagnoses[0].blamed(), std::vector<int>{1}) << to_text(diagnoses);
  EXPECT_THAT(to_text(diagnoses), HasSubstr("rank 1 issued a different collective as #26: #26 "
                                            "broadcast of 100 fp32 elements (rank 0: #26 "
                                            "all-reduce of 100 fp32 elements)"));
}

TEST(TraceDiagnosis, RefusesADumpNamingTheFieldAndTheFile) {
  const auto message_for = [](json document) {
    try {
      parse_dump(document, "rank-1.json");
    } catch (const std::runtime_error& error) {
      return std::string(error.what());
    }
    return std::string("accepted");
  };
  const json good = {{"rank", 1}, {"size", 2}, {"last_started", 0}, {"entries", json::array()}};
  json no_rank = good;
  no_rank.erase("rank");
  EXPECT_EQ(message_for(no_rank), "rank-1.json: missing field 'rank'");
  json text_size = good;
  text_size["size"] = "two";
  EXPECT_EQ(message_for(text_size), "rank-1.json: field 'size' is string, expected a number");
  json outside = good;
  outside["rank"] = 2;
  EXPECT_EQ(message_for(outside), "rank-1.json: rank 2 of size 2, expected 0 <= rank < size");
  json bad_state = good;
  bad_state["entries"] = {{{"seq", 1}, {"op", "barrier"}, {"state", "done"}, {"start_s", 1.0}}};
  EXPECT_EQ(message_for(bad_state),
            "rank-1.json: entries[0]: state 'done', expected pending, completed or failed");
  json other_format = good;
  other_format["format"] = "zeroshard-flight-recorder-9";
  EXPECT_THAT(message_for(other_format), HasSubstr("format 'zeroshard-flight-recorder-9'"));
  EXPECT_EQ(message_for(good), "accepted");
}

}  // namespace
}  // namespace zeroshard::trace
