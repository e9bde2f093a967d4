// What zeroshard-trace concludes from a job's flight-recorder dumps: per communicator, the ranks
// that did not answer, left no dump, are behind or issued a different collective, each with its
// evidence. A pure function of the parsed dumps, so that tests can feed it any set of them.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>  // nlohmann::json, the dumps' format
#include <optional>
#include <string>
#include <vector>

namespace zeroshard::trace {

/// One collective of a dump.
struct Entry {
  std::int64_t seq = 0;
  std::string op;
  std::int64_t count = 0;
  std::string dtype = "none";  ///< "none" for a barrier
  std::string state;           ///< pending, completed, failed
  double start_s = 0;          ///< wall clock, seconds since the epoch
  std::optional<double> end_s;
  double duration_s = 0;

  /// "#7 reduce-scatter of 3072 fp32 elements".
  std::string describe() const;
};

/// What a rank's side-channel question, asked when it timed out, learnt of one other rank.
struct PeerRecord {
  int rank = -1;
  bool heard = false;  ///< false: nothing ever arrived from it
  std::int64_t last_started = 0;
  std::int64_t last_completed = 0;
  std::int64_t waiting_in = 0;
  std::int64_t gave_up_in = 0;
};

/// One rank's dump of one communicator (rank-R.json or rank-R.comm-N.json).
struct Dump {
  int rank = -1;
  int size = 0;
  int communicator = 0;
  std::string backend;
  std::string host;
  long pid = 0;  ///< 0 when the dump does not say; with `host`, names the process
  std::int64_t last_started = 0;
  std::int64_t last_completed = 0;
  std::int64_t gave_up_in = 0;    ///< the collective this rank timed out in; 0: none
  std::string reason;             ///< why it was written: a timeout's diagnosis, abort(), ...
  std::vector<PeerRecord> peers;  ///< empty unless this rank asked its peers (a timeout here)
  std::vector<Entry> entries;     ///< oldest first
};

/// Reads a dump as the flight recorder writes it; throws std::runtime_error naming `where` and
/// the field that is missing or of the wrong type.
Dump parse_dump(const nlohmann::json& document, const std::string& where);

/// One conclusion about one or more ranks, with its evidence in one line.
struct Finding {
  std::vector<int> ranks;
  bool blamed = false;  ///< the ranks are singled out as the cause, not merely described
  std::string text;
};

struct CommunicatorDiagnosis {
  int communicator = 0;
  std::string backend;
  int size = 0;
  std::string header;             ///< which dumps there are and why they were written
  std::vector<Finding> findings;  ///< blamed ones first

  /// The ranks singled out, in increasing order.
  std::vector<int> blamed() const;
};

/// Diagnoses every communicator the dumps belong to, in increasing communicator number. Dumps of
/// other communicators of the same process (same host and pid) explain a rank that waits there.
std::vector<CommunicatorDiagnosis> diagnose(const std::vector<Dump>& dumps);

/// The report zeroshard-trace prints: per communicator, its header, one line per finding, and
/// "named: rank R" (or "no rank is singled out in these dumps").
std::string to_text(const std::vector<CommunicatorDiagnosis>& diagnoses);

}  // namespace zeroshard::trace
