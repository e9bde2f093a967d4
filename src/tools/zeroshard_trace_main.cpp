// zeroshard-trace: reads the flight-recorder dumps every rank wrote to ZEROSHARD_TRACE_DIR on a
// timeout or abort and says which rank is behind or missing, and at which collective.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>  // nlohmann::json, the dumps' format
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "command_line.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Exit codes, as documented in docs/troubleshooting.md.
constexpr int kCulpritNamed = 0;  // a rank is behind, missing, or issued a different collective
constexpr int kNothingSingledOut = 1;  // every dump agrees; no rank stands out
constexpr int kBadInput = 2;           // bad command line, no dumps, or a dump that cannot be read

constexpr const char* kDescription =
    R"(Reads the flight-recorder dumps (rank-R.json, rank-R.comm-N.json) that ranks write to
ZEROSHARD_TRACE_DIR=DIR when a collective times out or the job is aborted, and prints, per
communicator, which rank is behind or missing and at which collective.

Exit status: 0 a rank was named (behind, missing, or issuing a different collective);
1 the dumps agree and no rank stands out; 2 bad command line, no dumps in DIR, or an
unreadable dump.)";

struct Entry {
  std::int64_t seq = 0;
  std::string op;
  std::int64_t count = 0;
  std::string dtype;
  std::string state;  // pending, completed, failed
  double start_s = 0;
  std::optional<double> end_s;
  double duration_s = 0;

  std::string describe() const {
    std::ostringstream os;
    os << "#" << seq << " " << op;
    if (dtype != "none") os << " of " << count << " " << dtype << " elements";
    return os.str();
  }
};

struct Dump {
  int rank = -1;
  int size = 0;
  std::string backend;
  std::string host;
  std::int64_t last_started = 0;
  std::int64_t gave_up_in = 0;
  std::string reason;
  std::vector<Entry> entries;
  json peers;

  const Entry* find(std::int64_t seq) const {
    for (const Entry& entry : entries) {
      if (entry.seq == seq) return &entry;
    }
    return nullptr;
  }
  // The collective this rank is stuck in: the oldest one not completed.
  const Entry* stuck_in() const {
    for (const Entry& entry : entries) {
      if (entry.state != "completed") return &entry;
    }
    return nullptr;
  }
};

Dump read_dump(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path.string());
  const json document = json::parse(in);
  Dump dump;
  dump.rank = document.at("rank").get<int>();
  dump.size = document.at("size").get<int>();
  dump.backend = document.value("backend", "");
  dump.host = document.value("host", "");
  dump.last_started = document.at("last_started").get<std::int64_t>();
  dump.gave_up_in = document.value("gave_up_in", std::int64_t{0});
  dump.reason = document.value("reason", "");
  dump.peers = document.value("peers", json::array());
  for (const json& item : document.at("entries")) {
    Entry entry;
    entry.seq = item.at("seq").get<std::int64_t>();
    entry.op = item.at("op").get<std::string>();
    entry.count = item.value("count", std::int64_t{0});
    entry.dtype = item.value("dtype", "none");
    entry.state = item.at("state").get<std::string>();
    entry.start_s = item.at("start_s").get<double>();
    if (!item.at("end_s").is_null()) entry.end_s = item.at("end_s").get<double>();
    entry.duration_s = item.value("duration_s", 0.0);
    dump.entries.push_back(entry);
  }
  return dump;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) out += (i ? "," : "") + std::to_string(ranks[i]);
  return out;
}

std::string seconds(double value) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1) << value << " s";
  return os.str();
}

// What the dumped ranks' side channels last heard of a rank that left no dump.
std::string peers_view_of(int rank, const std::map<int, Dump>& dumps) {
  for (const auto& [r, dump] : dumps) {
    for (const json& peer : dump.peers) {
      if (peer.value("rank", -1) != rank || !peer.value("heard", false)) continue;
      std::ostringstream os;
      os << "; rank " << r << " last heard it had started #" << peer.value("last_started", 0)
         << " and completed #" << peer.value("last_completed", 0);
      return os.str();
    }
  }
  return dumps.empty() ? "" : "; no other rank heard from it either";
}

// Prints the diagnosis of one communicator's dumps; returns true when a rank was singled out.
bool analyse(int communicator, const std::map<int, Dump>& dumps) {
  int size = 0;
  for (const auto& [rank, dump] : dumps) size = std::max(size, dump.size);
  const Dump& any = dumps.begin()->second;
  std::cout << "communicator " << communicator << " (" << any.backend << ", " << size
            << " ranks): dumps from " << dumps.size() << " of " << size << "\n";
  bool named = false;

  // The furthest any rank got; a dumped rank that did not start it is behind.
  std::int64_t frontier = 0;
  for (const auto& [rank, dump] : dumps) frontier = std::max(frontier, dump.last_started);

  std::map<std::int64_t, std::vector<int>> waiting;  // stuck collective -> ranks in it
  for (const auto& [rank, dump] : dumps) {
    const Entry* stuck = dump.stuck_in();
    if (dump.last_started < frontier) {
      const Entry* last = dump.find(dump.last_started);
      std::cout << "rank " << rank << " is behind: its last collective is "
                << (last ? last->describe() : "#" + std::to_string(dump.last_started))
                << (last && last->state == "completed" ? " (completed)"
                                                       : " (started, not completed)")
                << "\n";
      named = true;
    } else if (stuck != nullptr) {
      waiting[stuck->seq].push_back(rank);
    }
  }

  for (const auto& [seq, ranks] : waiting) {
    // A rank that began this collective only after another had given up waiting in it was the
    // one the others waited for (stopped, then resumed).
    std::optional<double> first_give_up;
    int first_to_give_up = -1;
    for (int rank : ranks) {
      const Entry* entry = dumps.at(rank).find(seq);
      if (entry->state == "failed" && entry->end_s &&
          (!first_give_up || *entry->end_s < *first_give_up)) {
        first_give_up = entry->end_s;
        first_to_give_up = rank;
      }
    }
    std::vector<int> on_time;
    for (int rank : ranks) {
      const Entry* entry = dumps.at(rank).find(seq);
      if (first_give_up && entry->start_s > *first_give_up) {
        std::cout << "rank " << rank << " is behind: it started #" << seq << " "
                  << seconds(entry->start_s - *first_give_up) << " after rank " << first_to_give_up
                  << " had given up waiting in it (it was stopped or stalled before it)\n";
        named = true;
      } else {
        on_time.push_back(rank);
      }
    }
    if (on_time.empty()) continue;
    const Entry* first = dumps.at(on_time.front()).find(seq);
    double longest = 0;
    for (int rank : on_time) longest = std::max(longest, dumps.at(rank).find(seq)->duration_s);
    const bool timed_out = first->state == "failed";
    std::cout << rank_list(on_time) << (on_time.size() == 1 ? " is" : " are") << " waiting in "
              << first->describe() << " (" << (timed_out ? "gave up after " : "for ")
              << seconds(longest) << ")\n";
    // Ranks in the same collective must agree on what it is.
    for (int rank : on_time) {
      const Entry* entry = dumps.at(rank).find(seq);
      if (entry->op != first->op || entry->count != first->count || entry->dtype != first->dtype) {
        std::cout << "rank " << rank << " issued a different collective as #" << seq << ": "
                  << entry->describe() << " (rank " << on_time.front() << ": " << first->describe()
                  << ")\n";
        named = true;
      }
    }
  }

  for (int rank = 0; rank < size; ++rank) {
    if (dumps.count(rank) != 0) continue;
    std::cout << "rank " << rank << ": no dump (dead or stopped" << peers_view_of(rank, dumps)
              << ")\n";
    named = true;
  }
  if (!named) std::cout << "no rank is behind or missing in these dumps\n";
  return named;
}

}  // namespace

int main(int argc, char** argv) {
  fs::path dir;
  CLI::App app(kDescription, "zeroshard-trace");
  app.add_option("DIR", dir, "the folder ZEROSHARD_TRACE_DIR named")->required();
  if (const auto exit_code = zeroshard::cli::parse(app, argc, argv)) return *exit_code;
  std::map<int, std::map<int, Dump>> communicators;  // communicator -> rank -> dump
  try {
    for (const fs::directory_entry& file : fs::directory_iterator(dir)) {
      const std::string name = file.path().filename().string();
      if (name.rfind("rank-", 0) != 0 || file.path().extension() != ".json") continue;
      std::ifstream in(file.path());
      const int communicator = json::parse(in).value("communicator", 0);
      Dump dump = read_dump(file.path());
      communicators[communicator][dump.rank] = std::move(dump);
    }
  } catch (const std::exception& error) {
    std::cerr << "zeroshard-trace: " << dir.string() << ": " << error.what() << "\n";
    return kBadInput;
  }
  if (communicators.empty()) {
    std::cerr << "zeroshard-trace: no rank-*.json dumps in " << dir.string()
              << "; set ZEROSHARD_TRACE_DIR to this directory for every rank of the job\n";
    return kBadInput;
  }
  bool named = false;
  for (const auto& [communicator, dumps] : communicators) {
    named = analyse(communicator, dumps) || named;
  }
  return named ? kCulpritNamed : kNothingSingledOut;
}
