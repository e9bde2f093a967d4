// Sequence numbers, the first-timeout rule, the diagnosis a timeout reports, the dump of the
// flight recorder and the registry of the process's live trackers.
#include "comm/collective_tracker.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "util/log.h"
#include "zeroshard/error.h"

namespace zeroshard::detail {
namespace {

// How long a timed-out rank waits for the other ranks to answer its side-channel question. Peers
// that wait in a collective answer within milliseconds; one that does not answer in this time is
// stopped, busy outside the communicator or dead, and waiting longer would only delay the error.
constexpr std::chrono::duration<double> kPeerAnswerWindow{0.5};

std::atomic<int> g_next_communicator_id{0};

// The trackers alive in this process, in creation order. Built by the first tracker, so that it
// outlives every tracker, those of communicators held in globals included.
struct LiveTrackers {
  std::mutex mutex;
  std::vector<CollectiveTracker*> trackers;
};

LiveTrackers& live_trackers() {
  static LiveTrackers live;
  return live;
}

double wall_seconds(std::chrono::system_clock::time_point time) {
  return std::chrono::duration<double>(time.time_since_epoch()).count();
}

double wall_now() { return wall_seconds(std::chrono::system_clock::now()); }

std::string fixed(double value, int digits = 1) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(digits) << value;
  return os.str();
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "unknown";
  return name;
}

std::string op_name(std::int64_t op) {
  if (op < 0 || op >= kCollectiveCount) return "collective";
  return to_string(static_cast<Collective>(op));
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ",") + std::to_string(r);
  return out;
}

// Writes `text` to `path` so that a reader never sees half a file: a temporary file in the same
// directory, renamed over the target (atomic on POSIX file systems).
void write_atomically(const std::filesystem::path& path, const std::string& text) {
  std::filesystem::create_directories(path.parent_path());
  const std::filesystem::path temporary =
      path.string() + ".tmp." + std::to_string(static_cast<long>(getpid()));
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw IoError("writing " + temporary.string() + " failed");
  }
  std::filesystem::rename(temporary, path);
}

}  // namespace

CollectiveTracker::CollectiveTracker()
    : id_(g_next_communicator_id.fetch_add(1)),
      recorder_(flight_recorder_size_from_environment()),
      board_(std::make_shared<ProgressBoard>()) {
  LiveTrackers& live = live_trackers();
  const std::lock_guard<std::mutex> lock(live.mutex);
  live.trackers.push_back(this);
}

CollectiveTracker::~CollectiveTracker() {
  LiveTrackers& live = live_trackers();
  const std::lock_guard<std::mutex> lock(live.mutex);
  std::erase(live.trackers, this);
}

void CollectiveTracker::identify(int rank, int size, std::string backend) {
  rank_ = rank;
  size_ = size;
  backend_ = std::move(backend);
}

std::int64_t CollectiveTracker::begin(Collective op, std::int64_t count,
                                      std::optional<DType> dtype) {
  const std::int64_t seq = next_seq_;
  check_usable(seq);
  ++next_seq_;
  recorder_.add(seq, op, count, dtype);
  update_board();
  return seq;
}

void CollectiveTracker::complete(std::int64_t seq) noexcept {
  if (FlightRecord* record = recorder_.find(seq)) {
    record->state = RecordState::kCompleted;
    record->ended = std::chrono::steady_clock::now();
    if (timing_.enabled && timing_.kinds[static_cast<int>(record->op)]) {
      try {
        time_completion(*record);
      } catch (const std::exception&) {
        // Only bad_alloc can get here; a lost timing must not fail a collective that succeeded.
      }
    }
  }
  update_board();
}

void CollectiveTracker::set_timing(const TimingOptions& options) {
  timing_ = options;
  timings_.clear();
}

std::vector<CollectiveTiming> CollectiveTracker::timings() const {
  std::vector<CollectiveTiming> all;
  all.reserve(timings_.size());
  for (const auto& [key, timing] : timings_) all.push_back(timing);
  return all;
}

void CollectiveTracker::time_completion(const FlightRecord& record) {
  const std::int64_t bytes =
      record.dtype ? record.count * static_cast<std::int64_t>(size_of(*record.dtype)) : 0;
  const double seconds = record.seconds(record.ended);
  CollectiveTiming& timing = timings_[{static_cast<int>(record.op), bytes}];
  timing.op = record.op;
  timing.message_bytes = bytes;
  timing.calls += 1;
  timing.seconds += seconds;
  if (!timing_.log_each) return;
  ZEROSHARD_LOG(kProgress, "comm op: " << to_string(record.op) << " | time (ms): " << seconds * 1e3
                                       << " | msg size: " << bytes << " B"
                                       << (timing_.log_detail
                                               ? " | seq " + std::to_string(record.seq) +
                                                     (record.dtype ? std::string(" | dtype ") +
                                                                         to_string(*record.dtype)
                                                                   : std::string())
                                               : std::string()));
}

void CollectiveTracker::fail(std::int64_t seq) noexcept {
  if (FlightRecord* record = recorder_.find(seq)) {
    record->state = RecordState::kFailed;
    record->ended = std::chrono::steady_clock::now();
  }
  update_board();
}

void CollectiveTracker::update_board() noexcept {
  ProgressBoard& board = *board_;
  board.last_started = next_seq_ - 1;
  const FlightRecord* pending = recorder_.oldest_pending();
  board.waiting_in = pending != nullptr ? pending->seq : 0;
  board.waiting_op = pending != nullptr ? static_cast<std::int64_t>(pending->op) : 0;
  board.waiting_since = pending != nullptr ? wall_seconds(pending->started_wall) : 0;
  // Collectives complete in order on every transport, so all before the oldest pending are done.
  board.last_completed = pending != nullptr ? pending->seq - 1 : board.last_started;
}

std::string CollectiveTracker::describe(std::int64_t seq) const {
  std::ostringstream os;
  os << "#" << seq;
  if (const FlightRecord* record = recorder_.find(seq)) {
    os << " " << to_string(record->op);
    if (record->dtype)
      os << " of " << record->count << " " << to_string(*record->dtype) << " elements";
  }
  os << " on rank " << rank_ << " of " << size_ << " (" << backend_ << ")";
  return os.str();
}

void CollectiveTracker::check_usable(std::int64_t seq) const {
  if (first_timeout_.empty()) return;
  throw TimeoutError("collective " + describe(seq) +
                     " abandoned at once: an earlier timeout on this communicator left it "
                     "unusable (" +
                     first_timeout_ +
                     "); see that error for the rank behind, end the job and restart it");
}

std::string CollectiveTracker::describe_peers(std::int64_t seq,
                                              const std::vector<PeerReport>& peers) const {
  std::ostringstream os;
  std::vector<int> behind;
  std::vector<int> silent;
  std::vector<int> ahead;
  const FlightRecord* mine = recorder_.find(seq);
  const double my_start = mine != nullptr ? wall_seconds(mine->started_wall) : 0;
  const double now = wall_now();
  std::string late_self;
  // Classifies one peer into the lists above and says what is known of it.
  const auto describe_one = [&](const PeerReport& peer, std::ostringstream& entry) {
    if (!peer.heard) {
      entry << "no answer within " << fixed(kPeerAnswerWindow.count()) << " s (stopped, hung "
            << "outside a collective, or dead)";
      silent.push_back(peer.rank);
      return;
    }
    const ProgressBoard& b = peer.board;
    if (b.gave_up_in != 0) {
      entry << "gave up waiting in #" << b.gave_up_in << " " << fixed(now - b.gave_up_at)
            << " s ago";
      // A peer that gave up in this very collective before this rank even started it was waiting
      // for this rank: the stall is here, not there.
      if (b.gave_up_in == seq && mine != nullptr && b.gave_up_at < my_start) {
        late_self += (late_self.empty() ? "" : ", ") + std::string("rank ") +
                     std::to_string(peer.rank) + " gave up on it " +
                     fixed(my_start - b.gave_up_at) + " s before this rank started it";
      }
      if (b.gave_up_in > seq) ahead.push_back(peer.rank);
      return;
    }
    if (b.waiting_in == seq) {
      entry << "waiting in #" << seq << " too, for " << fixed(now - b.waiting_since) << " s";
    } else if (b.last_started < seq) {
      entry << "behind: its last collective is #" << b.last_started
            << (b.last_completed == b.last_started ? " (completed)" : " (started, not completed)");
      behind.push_back(peer.rank);
    } else if (b.waiting_in > seq || (b.waiting_in == 0 && b.last_completed >= seq)) {
      entry << "ahead: completed #" << b.last_completed;
      if (b.waiting_in != 0) {
        entry << ", waiting in #" << b.waiting_in << " " << op_name(b.waiting_op);
      }
      ahead.push_back(peer.rank);
    } else {
      entry << "waiting in #" << b.waiting_in << " " << op_name(b.waiting_op);
    }
  };
  for (const PeerReport& peer : peers) {
    std::ostringstream entry;
    describe_one(peer, entry);
    os << (&peer == &peers.front() ? ": " : "; ") << "rank " << peer.rank << ": " << entry.str();
    if (peer.heard && now - peer.heard_at > 2 * kPeerAnswerWindow.count()) {
      os << " (as it told " << fixed(now - peer.heard_at) << " s ago; no answer now)";
    }
  }
  std::ostringstream verdict;
  if (!late_self.empty()) {
    verdict << " This rank is the one that stalled, not its peers: " << late_self
            << " (this rank was stopped, descheduled or busy before it).";
  } else if (!ahead.empty() && behind.empty() && silent.empty()) {
    verdict << " This rank is behind: rank(s) " << rank_list(ahead) << " are already past #" << seq
            << ".";
  } else if (!behind.empty() || !silent.empty()) {
    std::vector<int> suspects = behind;
    suspects.insert(suspects.end(), silent.begin(), silent.end());
    verdict << " Behind or missing: rank " << rank_list(suspects) << ".";
  } else if (!peers.empty()) {
    verdict << " Every rank that answered is in #" << seq
            << "; a rank may have issued a different collective or the transport is stuck.";
  }
  return os.str() + "." + verdict.str();
}

std::string CollectiveTracker::diagnose_timeout(std::int64_t seq,
                                                const std::string& transport_message) {
  std::ostringstream os;
  os << "collective " << describe(seq) << " timed out";
  if (FlightRecord* record = recorder_.find(seq)) {
    record->state = RecordState::kFailed;
    record->ended = std::chrono::steady_clock::now();
    os << " " << fixed(record->seconds(record->ended)) << " s after it started";
  }
  board_->gave_up_in = seq;
  board_->gave_up_at = wall_now();
  os << ": " << transport_message << ". Other ranks";
  if (channel_) {
    last_peers_ = channel_->exchange(kPeerAnswerWindow);
    os << " (" << channel_->how() << ")" << describe_peers(seq, last_peers_);
  } else {
    os << ": the " << backend_ << " transport cannot tell which ranks arrived; compare the "
       << "ranks' dumps with zeroshard-trace.";
  }
  first_timeout_ = "collective " + describe(seq) + " timed out first";
  dump_reason_ = os.str();
  const std::string path = dump(dump_reason_);
  if (!path.empty()) {
    os << " Flight recorder: " << path;
    const std::vector<std::string> others =
        dump_all(this, "dumped with communicator " + std::to_string(id_) +
                           " of this process, whose " + first_timeout_);
    if (!others.empty()) {
      os << ", and this process's other communicators': " << others.front();
      for (std::size_t i = 1; i < others.size(); ++i) os << ", " << others[i];
    }
    os << " (run zeroshard-trace on its directory).";
  } else {
    os << " Set ZEROSHARD_TRACE_DIR to dump every rank's flight recorder for zeroshard-trace.";
  }
  ZEROSHARD_LOG(kError, os.str());
  return os.str();
}

std::string CollectiveTracker::dump(const std::string& reason) noexcept {
  const char* dir = std::getenv("ZEROSHARD_TRACE_DIR");
  if (dir == nullptr || *dir == '\0') return {};
  try {
    if (dump_reason_.empty()) dump_reason_ = reason;
    using nlohmann::json;
    const auto now = std::chrono::steady_clock::now();
    json entries = json::array();
    for (const FlightRecord& record : recorder_.in_order()) {
      json entry = {{"seq", record.seq},
                    {"op", to_string(record.op)},
                    {"count", record.count},
                    {"dtype", record.dtype ? to_string(*record.dtype) : "none"},
                    {"state", to_string(record.state)},
                    {"start_s", wall_seconds(record.started_wall)},
                    {"duration_s", record.seconds(now)}};
      entry["end_s"] = record.state == RecordState::kPending
                           ? json(nullptr)
                           : json(wall_seconds(record.started_wall) + record.seconds(now));
      entries.push_back(std::move(entry));
    }
    json peers = json::array();
    for (const PeerReport& peer : last_peers_) {
      json item = {{"rank", peer.rank}, {"heard", peer.heard}};
      if (peer.heard) {
        item["last_started"] = peer.board.last_started;
        item["last_completed"] = peer.board.last_completed;
        item["waiting_in"] = peer.board.waiting_in;
        item["gave_up_in"] = peer.board.gave_up_in;
      }
      peers.push_back(std::move(item));
    }
    const json document = {{"format", "zeroshard-flight-recorder-1"},
                           {"rank", rank_},
                           {"size", size_},
                           {"backend", backend_},
                           {"communicator", id_},
                           {"host", host_name()},
                           {"pid", static_cast<long>(getpid())},
                           {"dumped_at_s", wall_now()},
                           {"reason", dump_reason_},
                           {"capacity", recorder_.capacity()},
                           {"last_started", board_->last_started},
                           {"last_completed", board_->last_completed},
                           {"gave_up_in", board_->gave_up_in},
                           {"peers", std::move(peers)},
                           {"entries", std::move(entries)}};
    std::string name = "rank-" + std::to_string(rank_);
    if (id_ != 0) name += ".comm-" + std::to_string(id_);
    const std::filesystem::path path = std::filesystem::path(dir) / (name + ".json");
    write_atomically(path, document.dump(1) + "\n");
    return path.string();
  } catch (const std::exception& error) {
    ZEROSHARD_LOG(kError, "could not write the flight recorder to ZEROSHARD_TRACE_DIR='"
                              << dir << "': " << error.what());
    return {};
  }
}

std::vector<std::string> CollectiveTracker::dump_all(const CollectiveTracker* except,
                                                     const std::string& reason) noexcept {
  std::vector<std::string> paths;
  try {
    LiveTrackers& live = live_trackers();
    const std::lock_guard<std::mutex> lock(live.mutex);
    for (CollectiveTracker* tracker : live.trackers) {
      if (tracker == except) continue;
      std::string path = tracker->dump(reason);
      if (!path.empty()) paths.push_back(std::move(path));
    }
  } catch (const std::exception& error) {
    ZEROSHARD_LOG(kError, "could not dump every communicator's flight recorder: " << error.what());
  }
  return paths;
}

}  // namespace zeroshard::detail
