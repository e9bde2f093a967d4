// The diagnosis behind zeroshard-trace. The side channel's records (who heard whom) come first:
// ranks that the others, hearing one another, could not hear explain a stall by themselves, and
// then every other rank's position is a consequence. Sequence numbers alone name a rank only
// where they cannot be explained by non-blocking collectives in flight: a rank that did not start
// the oldest collective the others wait in, that waits alone in one they all completed, or that
// started one after another rank had given up in it.
#include "tools/trace_diagnosis.h"

#include <algorithm>
#include <iomanip>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <type_traits>
#include <utility>

namespace zeroshard::trace {
namespace {

using nlohmann::json;
using Ranks = std::vector<int>;

constexpr const char* kFormat = "zeroshard-flight-recorder-1";

// The reasons the recorder gives for a dump that is not its own timeout's (collective_tracker.cpp).
constexpr std::string_view kAbortReason = "abort(";
constexpr std::string_view kWithOtherReason = "dumped with communicator ";

template <class T>
constexpr const char* kTypeName = std::is_same_v<T, std::string> ? "a string"
                                  : std::is_same_v<T, bool>      ? "a boolean"
                                                                 : "a number";

template <class T>
T field(const json& object, const char* key, const std::string& where) {
  const auto it = object.find(key);
  if (it == object.end()) throw std::runtime_error(where + ": missing field '" + key + "'");
  const bool fits = std::is_same_v<T, std::string> ? it->is_string()
                    : std::is_same_v<T, bool>      ? it->is_boolean()
                                                   : it->is_number();
  if (!fits) {
    throw std::runtime_error(where + ": field '" + key + "' is " + it->type_name() + ", expected " +
                             kTypeName<T>);
  }
  return it->get<T>();
}

template <class T>
T optional_field(const json& object, const char* key, T fallback, const std::string& where) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  return field<T>(object, key, where);
}

const json& array_field(const json& object, const char* key, const std::string& where) {
  static const json kEmpty = json::array();
  const auto it = object.find(key);
  if (it == object.end()) return kEmpty;
  if (!it->is_array()) {
    throw std::runtime_error(where + ": field '" + key + "' is " + it->type_name() +
                             ", expected an array");
  }
  return *it;
}

Entry parse_entry(const json& item, const std::string& where) {
  Entry entry;
  entry.seq = field<std::int64_t>(item, "seq", where);
  entry.op = field<std::string>(item, "op", where);
  entry.count = optional_field<std::int64_t>(item, "count", 0, where);
  entry.dtype = optional_field<std::string>(item, "dtype", "none", where);
  entry.state = field<std::string>(item, "state", where);
  if (entry.state != "pending" && entry.state != "completed" && entry.state != "failed") {
    throw std::runtime_error(where + ": state '" + entry.state +
                             "', expected pending, completed or failed");
  }
  entry.start_s = field<double>(item, "start_s", where);
  if (item.contains("end_s") && !item.at("end_s").is_null()) {
    entry.end_s = field<double>(item, "end_s", where);
  }
  entry.duration_s = optional_field<double>(item, "duration_s", 0.0, where);
  return entry;
}

PeerRecord parse_peer(const json& item, const std::string& where) {
  return {.rank = field<int>(item, "rank", where),
          .heard = field<bool>(item, "heard", where),
          .last_started = optional_field<std::int64_t>(item, "last_started", 0, where),
          .last_completed = optional_field<std::int64_t>(item, "last_completed", 0, where),
          .waiting_in = optional_field<std::int64_t>(item, "waiting_in", 0, where),
          .gave_up_in = optional_field<std::int64_t>(item, "gave_up_in", 0, where)};
}

std::string joined(const Ranks& ranks) {
  std::string out;
  for (int rank : ranks) out += (out.empty() ? "" : ",") + std::to_string(rank);
  return out;
}

// "rank 3" or "ranks 0,1,2".
std::string ranks_text(const Ranks& ranks) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + joined(ranks);
}

std::string seconds(double value) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1) << value << " s";
  return os.str();
}

const Entry* find(const Dump& dump, std::int64_t seq) {
  for (const Entry& entry : dump.entries) {
    if (entry.seq == seq) return &entry;
  }
  return nullptr;
}

// The collective this rank is stuck in: its oldest one not completed.
const Entry* stuck_in(const Dump& dump) {
  for (const Entry& entry : dump.entries) {
    if (entry.state != "completed") return &entry;
  }
  return nullptr;
}

bool completed(const Dump& dump, std::int64_t seq) {
  if (seq > dump.last_started) return false;
  if (const Entry* entry = find(dump, seq)) return entry->state == "completed";
  return seq <= dump.last_completed;  // older than the ring holds
}

// Where a rank stands, from its own dump.
std::string position(const Dump& dump) {
  if (const Entry* stuck = stuck_in(dump)) {
    return "it was waiting in " + stuck->describe() + " (" +
           (stuck->state == "failed" ? "gave up after " : "for ") + seconds(stuck->duration_s) +
           ")";
  }
  if (const Entry* last = find(dump, dump.last_started)) {
    return "its last collective is " + last->describe() + " (completed)";
  }
  return "it had started no collective";
}

// What one peer record says of a rank's progress.
std::string as_heard(const PeerRecord& peer) {
  std::string text = "it had started #" + std::to_string(peer.last_started) + " and completed #" +
                     std::to_string(peer.last_completed);
  if (peer.gave_up_in != 0) {
    text += ", and had given up in #" + std::to_string(peer.gave_up_in);
  } else if (peer.waiting_in != 0) {
    text += ", waiting in #" + std::to_string(peer.waiting_in);
  }
  return text;
}

enum class Trigger { kTimeout, kAbort, kWithOther, kOther };

// Why a dump was written, from its records and its reason.
Trigger trigger_of(const Dump& dump) {
  if (dump.gave_up_in != 0) return Trigger::kTimeout;
  if (dump.reason.starts_with(kAbortReason)) return Trigger::kAbort;
  if (dump.reason.starts_with(kWithOtherReason)) return Trigger::kWithOther;
  return Trigger::kOther;
}

std::string trigger_text(Trigger trigger) {
  switch (trigger) {
    case Trigger::kTimeout:
      return "timed out here";
    case Trigger::kAbort:
      return "written on abort()";
    case Trigger::kWithOther:
      return "written when another communicator of its process timed out";
    case Trigger::kOther:
      break;
  }
  return "written for another reason";
}

// One communicator's dumps, and the others of the same processes for what they wait in.
class Analysis {
 public:
  Analysis(std::map<int, const Dump*> dumps, const std::vector<Dump>& all)
      : dumps_(std::move(dumps)), all_(all) {
    for (const auto& [rank, dump] : dumps_) size_ = std::max(size_, dump->size);
  }

  CommunicatorDiagnosis run() {
    const Dump& any = *dumps_.begin()->second;
    std::string head = header();
    reachability();
    mismatch();
    sequence();
    missing();
    std::stable_partition(findings_.begin(), findings_.end(),
                          [](const Finding& finding) { return finding.blamed; });
    return {.communicator = any.communicator,
            .backend = any.backend,
            .size = size_,
            .header = std::move(head),
            .findings = std::move(findings_)};
  }

 private:
  std::string header() const {
    std::ostringstream os;
    os << "communicator " << dumps_.begin()->second->communicator << " ("
       << dumps_.begin()->second->backend << ", " << size_ << " ranks): dumps from "
       << dumps_.size() << " of " << size_;
    std::map<Trigger, Ranks> by_trigger;
    for (const auto& [rank, dump] : dumps_) by_trigger[trigger_of(*dump)].push_back(rank);
    std::string separator = " (";
    for (const auto& [trigger, ranks] : by_trigger) {
      os << separator << trigger_text(trigger) << ": " << ranks_text(ranks);
      separator = "; ";
    }
    if (!by_trigger.empty()) os << ")";
    return os.str();
  }

  void add(Ranks ranks, bool blamed, std::string text) {
    for (int rank : ranks) explained_.insert(rank);
    findings_.push_back({.ranks = std::move(ranks), .blamed = blamed, .text = std::move(text)});
  }

  // Once the side channel showed the network failing, a rank behind is its consequence.
  void behind(int rank, const std::string& evidence) {
    add({rank}, network_cause_.empty(),
        "rank " + std::to_string(rank) +
            (network_cause_.empty()
                 ? " is behind: "
                 : " is behind only as a consequence of " + network_cause_ + ": ") +
            evidence);
  }

  const Dump* dump_of(int rank) const {
    const auto it = dumps_.find(rank);
    return it == dumps_.end() ? nullptr : it->second;
  }

  // The collective the same process is stuck in on another communicator, if any: a rank that
  // waits there neither answers here nor starts this communicator's next collective.
  std::optional<std::pair<const Dump*, const Entry*>> waits_elsewhere(const Dump& dump) const {
    if (dump.pid == 0) return std::nullopt;
    for (const Dump& other : all_) {
      if (other.communicator == dump.communicator || other.pid != dump.pid ||
          other.host != dump.host) {
        continue;
      }
      if (const Entry* stuck = stuck_in(other)) return std::make_pair(&other, stuck);
    }
    return std::nullopt;
  }

  static std::string elsewhere_text(const std::pair<const Dump*, const Entry*>& elsewhere) {
    return "its process waits in communicator " + std::to_string(elsewhere.first->communicator) +
           "'s " + elsewhere.second->describe() + " (see that communicator)";
  }

  // Who heard whom when they timed out. Ranks joined by a record of hearing form groups; the
  // group with the most ranks (then the most dumps) is the job, and a rank outside it that none
  // of the job's ranks could hear is the cause, whatever the sequence numbers say.
  void reachability() {
    Ranks askers;
    for (const auto& [rank, dump] : dumps_) {
      if (!dump->peers.empty()) askers.push_back(rank);
    }
    if (askers.empty()) return;
    std::vector<int> parent(static_cast<std::size_t>(size_));
    std::iota(parent.begin(), parent.end(), 0);
    const auto root = [&](int rank) {
      while (parent[rank] != rank) rank = parent[rank] = parent[parent[rank]];
      return rank;
    };
    for (int rank : askers) {
      for (const PeerRecord& peer : dump_of(rank)->peers) {
        if (peer.heard && peer.rank >= 0 && peer.rank < size_) parent[root(peer.rank)] = root(rank);
      }
    }
    std::map<int, Ranks> by_root;
    for (int rank = 0; rank < size_; ++rank) by_root[root(rank)].push_back(rank);
    std::vector<Ranks> groups;
    for (auto& [top, ranks] : by_root) groups.push_back(std::move(ranks));
    if (groups.size() == 1) return;
    const auto weight = [&](const Ranks& group) {
      const auto dumped = std::count_if(group.begin(), group.end(),
                                        [&](int rank) { return dump_of(rank) != nullptr; });
      return std::make_pair(group.size(), dumped);
    };
    std::stable_sort(groups.begin(), groups.end(),
                     [&](const Ranks& a, const Ranks& b) { return weight(a) > weight(b); });
    if (weight(groups[0]) == weight(groups[1])) {
      network_cause_ = "the network failure above";
      std::string split;
      for (const Ranks& group : groups) split += (split.empty() ? "" : " | ") + joined(group);
      add({}, false,
          groups[0].size() == 1
              ? "no rank heard any other over the side channel (asked by " + ranks_text(askers) +
                    "): the network failed between all of them, so the records single out no rank"
              : "the ranks heard one another only in separate groups (" + split +
                    "): the network split, and the records cannot tell which side was cut off");
      return;
    }
    network_cause_ = "the ranks the others could not hear";
    for (std::size_t i = 1; i < groups.size(); ++i) not_heard(groups[i], groups[0]);
  }

  // What the job's side-channel records say of `whom`, which they never heard.
  static std::string unheard_by(const Ranks& job, const std::string& whom) {
    return job.size() == 1
               ? ranks_text(job) + " asked over the side channel and did not hear " + whom
               : ranks_text(job) + " heard one another over the side channel but not " + whom;
  }

  // A group outside the job: the evidence for each of its ranks.
  void not_heard(const Ranks& group, const Ranks& job) {
    const std::string who = ranks_text(group);
    if (group.size() > 1) {
      add(group, true,
          who + " are cut off from the others: " + unheard_by(job, who) +
              ", which heard only each other (their host's link is cut, or the host is down)");
      return;
    }
    const int rank = group.front();
    const Dump* dump = dump_of(rank);
    if (dump == nullptr) {
      add(group, true,
          who + ": no dump (dead or stopped, or its link is cut; " + unheard_by(job, "it") + ")");
      return;
    }
    if (!dump->peers.empty()) {
      add(group, true,
          who + " is cut off: " + unheard_by(job, who) + ", and " + who +
              ", asking in turn, heard none of them (its link is cut); " + position(*dump));
      return;
    }
    if (const auto elsewhere = waits_elsewhere(*dump)) {
      add(group, false, who + " did not answer here: " + elsewhere_text(*elsewhere));
      return;
    }
    add(group, true,
        who + " did not answer: " + unheard_by(job, who) +
            " (stopped, cut off, or busy outside this communicator); its dump was " +
            trigger_text(trigger_of(*dump)) + ", and " + position(*dump));
  }

  // Ranks whose entries for the same number differ: the earliest such number, each rank
  // measured against what most ranks issued.
  void mismatch() {
    std::map<std::int64_t, std::map<std::string, Ranks>> variants;
    for (const auto& [rank, dump] : dumps_) {
      for (const Entry& entry : dump->entries)
        variants[entry.seq][entry.describe()].push_back(rank);
    }
    for (const auto& [seq, by_text] : variants) {
      if (by_text.size() < 2) continue;
      const auto reference =
          std::max_element(by_text.begin(), by_text.end(), [](const auto& a, const auto& b) {
            return a.second.size() != b.second.size() ? a.second.size() < b.second.size()
                                                      : a.second.front() > b.second.front();
          });
      for (auto variant = by_text.begin(); variant != by_text.end(); ++variant) {
        if (variant == reference) continue;
        for (int rank : variant->second) {
          add({rank}, true,
              "rank " + std::to_string(rank) + " issued a different collective as #" +
                  std::to_string(seq) + ": " + variant->first + " (rank " +
                  std::to_string(reference->second.front()) + ": " + reference->first + ")");
        }
      }
      return;
    }
  }

  // Sequence numbers: ranks with non-blocking collectives in flight are normally at different
  // numbers, so only a rank that leaves the others no way forward is named.
  void sequence() {
    std::map<std::int64_t, Ranks> waiting;  // oldest collective not completed -> ranks in it
    for (const auto& [rank, dump] : dumps_) {
      if (const Entry* stuck = stuck_in(*dump)) waiting[stuck->seq].push_back(rank);
    }
    if (waiting.empty()) return;
    const std::int64_t oldest = waiting.begin()->first;
    for (const auto& [rank, dump] : dumps_) {
      if (explained_.count(rank) != 0) continue;
      const Entry* stuck = stuck_in(*dump);
      if (stuck == nullptr) {
        if (dump->last_started >= oldest) continue;
        const Ranks& in_oldest = waiting.begin()->second;
        const std::string not_started = "it has not started #" + std::to_string(oldest) +
                                        ", in which " + ranks_text(in_oldest) +
                                        (in_oldest.size() == 1 ? " waits" : " wait");
        if (const auto elsewhere = waits_elsewhere(*dump)) {
          add({rank}, false,
              "rank " + std::to_string(rank) + " is not behind here: " + not_started +
                  ", because " + elsewhere_text(*elsewhere));
        } else {
          behind(rank, position(*dump) + ", and " + not_started);
        }
        continue;
      }
      Ranks done;
      bool alone = true;
      for (const auto& [other, other_dump] : dumps_) {
        if (other == rank) continue;
        if (completed(*other_dump, stuck->seq)) {
          done.push_back(other);
        } else {
          alone = false;
        }
      }
      if (!alone || done.empty()) continue;
      const std::string where =
          stuck->seq == dump->last_started
              ? "its last collective is " + stuck->describe() + " (started, not completed)"
              : "it is stuck in " + stuck->describe() + " (it started up to #" +
                    std::to_string(dump->last_started) + ")";
      behind(rank, where + ", which " + ranks_text(done) + " completed");
    }
    late_starters(waiting);
    waiting_lines(waiting);
  }

  // A rank that began a collective only after another had given up waiting in it was the one
  // the others waited for (stopped, then resumed).
  void late_starters(const std::map<std::int64_t, Ranks>& waiting) {
    for (const auto& [seq, ranks] : waiting) {
      std::optional<double> first_give_up;
      int first_to_give_up = -1;
      for (int rank : ranks) {
        const Entry* entry = find(*dump_of(rank), seq);
        if (entry->state == "failed" && entry->end_s &&
            (!first_give_up || *entry->end_s < *first_give_up)) {
          first_give_up = entry->end_s;
          first_to_give_up = rank;
        }
      }
      if (!first_give_up) continue;
      for (int rank : ranks) {
        const Entry* entry = find(*dump_of(rank), seq);
        if (explained_.count(rank) != 0 || entry->start_s <= *first_give_up) continue;
        behind(rank, "it started #" + std::to_string(seq) + " " +
                         seconds(entry->start_s - *first_give_up) + " after rank " +
                         std::to_string(first_to_give_up) +
                         " had given up waiting in it (it was stopped or stalled before it)");
      }
    }
  }

  // Where the ranks not singled out wait, and why their different numbers name no one.
  void waiting_lines(const std::map<std::int64_t, Ranks>& waiting) {
    std::map<std::int64_t, Ranks> started_up_to;
    for (const auto& [seq, ranks] : waiting) {
      Ranks on_time;
      for (int rank : ranks) {
        if (explained_.count(rank) == 0) on_time.push_back(rank);
      }
      if (on_time.empty()) continue;
      const Entry* first = find(*dump_of(on_time.front()), seq);
      double longest = 0;
      for (int rank : on_time) {
        longest = std::max(longest, find(*dump_of(rank), seq)->duration_s);
        started_up_to[dump_of(rank)->last_started].push_back(rank);
      }
      findings_.push_back({.ranks = on_time,
                           .blamed = false,
                           .text = ranks_text(on_time) + (on_time.size() == 1 ? " is" : " are") +
                                   " waiting in " + first->describe() + " (" +
                                   (first->state == "failed" ? "gave up after " : "for ") +
                                   seconds(longest) + ")"});
    }
    if (started_up_to.size() < 2) return;
    std::string numbers;
    for (const auto& [last, ranks] : started_up_to) {
      numbers +=
          (numbers.empty() ? "" : ", ") + ranks_text(ranks) + " up to #" + std::to_string(last);
    }
    findings_.push_back(
        {.ranks = {},
         .blamed = false,
         .text = "the ranks waiting started different numbers of collectives (" + numbers +
                 "): non-blocking collectives in flight, which each rank starts at its own "
                 "pace, so the numbers alone name no rank"});
  }

  // Ranks without a dump that the reachability above did not account for.
  void missing() {
    for (int rank = 0; rank < size_; ++rank) {
      if (dump_of(rank) != nullptr || explained_.count(rank) != 0) continue;
      const std::string who = "rank " + std::to_string(rank);
      const PeerRecord* heard = nullptr;
      int hearer = -1;
      for (const auto& [r, dump] : dumps_) {
        for (const PeerRecord& peer : dump->peers) {
          if (peer.rank == rank && peer.heard && heard == nullptr) {
            heard = &peer;
            hearer = r;
          }
        }
      }
      if (heard != nullptr) {
        add({rank}, false,
            who + ": no dump, but rank " + std::to_string(hearer) +
                " heard it over the side channel: " + as_heard(*heard) +
                " (alive when asked; the job ended before it wrote one)");
      } else if (!network_cause_.empty()) {
        add({rank}, false, who + ": no dump, and no rank heard it (" + network_cause_ + ")");
      } else {
        add({rank}, true, who + ": no dump (dead or stopped; no rank asked over a side channel)");
      }
    }
  }

  std::map<int, const Dump*> dumps_;
  const std::vector<Dump>& all_;
  int size_ = 0;
  // What the side channel shows failed (ranks that could not be heard, or the whole network),
  // when it does: that explains the stall, and the sequence numbers are its consequences.
  std::string network_cause_;
  std::set<int> explained_;  // ranks a finding already covers
  std::vector<Finding> findings_;
};

}  // namespace

std::string Entry::describe() const {
  std::ostringstream os;
  os << "#" << seq << " " << op;
  if (dtype != "none") os << " of " << count << " " << dtype << " elements";
  return os.str();
}

Dump parse_dump(const json& document, const std::string& where) {
  if (!document.is_object()) {
    throw std::runtime_error(where + ": got " + document.type_name() + ", expected an object");
  }
  const std::string format = optional_field<std::string>(document, "format", kFormat, where);
  if (format != kFormat) {
    throw std::runtime_error(where + ": format '" + format + "', expected '" + kFormat + "'");
  }
  Dump dump;
  dump.rank = field<int>(document, "rank", where);
  dump.size = field<int>(document, "size", where);
  if (dump.size < 1 || dump.rank < 0 || dump.rank >= dump.size) {
    throw std::runtime_error(where + ": rank " + std::to_string(dump.rank) + " of size " +
                             std::to_string(dump.size) + ", expected 0 <= rank < size");
  }
  dump.communicator = optional_field<int>(document, "communicator", 0, where);
  dump.backend = optional_field<std::string>(document, "backend", "", where);
  dump.host = optional_field<std::string>(document, "host", "", where);
  dump.pid = optional_field<long>(document, "pid", 0, where);
  dump.last_started = field<std::int64_t>(document, "last_started", where);
  dump.gave_up_in = optional_field<std::int64_t>(document, "gave_up_in", 0, where);
  dump.reason = optional_field<std::string>(document, "reason", "", where);
  if (!document.contains("entries")) throw std::runtime_error(where + ": missing field 'entries'");
  const json& entries = array_field(document, "entries", where);
  for (std::size_t i = 0; i < entries.size(); ++i) {
    dump.entries.push_back(parse_entry(entries[i], where + ": entries[" + std::to_string(i) + "]"));
  }
  const json& peers = array_field(document, "peers", where);
  for (std::size_t i = 0; i < peers.size(); ++i) {
    dump.peers.push_back(parse_peer(peers[i], where + ": peers[" + std::to_string(i) + "]"));
  }
  // Collectives complete in order, so all before the oldest one not completed are done.
  const Entry* stuck = stuck_in(dump);
  dump.last_completed = optional_field<std::int64_t>(
      document, "last_completed", stuck != nullptr ? stuck->seq - 1 : dump.last_started, where);
  return dump;
}

std::vector<int> CommunicatorDiagnosis::blamed() const {
  std::set<int> ranks;
  for (const Finding& finding : findings) {
    if (finding.blamed) ranks.insert(finding.ranks.begin(), finding.ranks.end());
  }
  return {ranks.begin(), ranks.end()};
}

std::vector<CommunicatorDiagnosis> diagnose(const std::vector<Dump>& dumps) {
  std::map<int, std::map<int, const Dump*>> by_communicator;
  for (const Dump& dump : dumps) by_communicator[dump.communicator][dump.rank] = &dump;
  std::vector<CommunicatorDiagnosis> diagnoses;
  for (auto& [communicator, ranks] : by_communicator) {
    diagnoses.push_back(Analysis(std::move(ranks), dumps).run());
  }
  return diagnoses;
}

std::string to_text(const std::vector<CommunicatorDiagnosis>& diagnoses) {
  std::string text;
  for (const CommunicatorDiagnosis& diagnosis : diagnoses) {
    text += diagnosis.header + "\n";
    for (const Finding& finding : diagnosis.findings) text += finding.text + "\n";
    const std::vector<int> blamed = diagnosis.blamed();
    text += blamed.empty() ? "no rank is singled out in these dumps\n"
                           : "named: " + ranks_text(blamed) + "\n";
  }
  return text;
}

}  // namespace zeroshard::trace
