// What every communicator knows about its own collectives, whatever the transport: their sequence
// numbers, the flight recorder, the first timeout (after which the communicator refuses to wait
// again), the diagnosis a timeout reports, with what a transport's side channel says of peers, and
// the dump of every communicator of the process when one of them times out or aborts.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/flight_recorder.h"
#include "zeroshard/communicator.h"

namespace zeroshard::detail {

/// This rank's progress as other ranks are told it. Times are wall-clock seconds since the epoch,
/// comparable across hosts whose clocks are synchronised (NTP keeps them within milliseconds,
/// far below a collective timeout). Sequence 0 means "none".
struct ProgressBoard {
  std::int64_t last_started = 0;
  std::int64_t last_completed = 0;  ///< the highest sequence number completed
  std::int64_t waiting_in = 0;      ///< the oldest collective still pending
  std::int64_t waiting_op = 0;      ///< its Collective, as an integer
  double waiting_since = 0;
  std::int64_t gave_up_in = 0;  ///< the collective this rank timed out in
  double gave_up_at = 0;
};

/// What a side channel learnt of one other rank.
struct PeerReport {
  int rank = -1;
  bool heard = false;  ///< false: nothing ever arrived from it
  ProgressBoard board;
  double heard_at = 0;  ///< wall-clock seconds of the latest news
};

/// A way to learn the other ranks' progress that does not depend on the collective that is stuck;
/// each transport provides its own, or none.
class PeerChannel {
 public:
  virtual ~PeerChannel() = default;
  /// Tells every other rank this rank's board and collects their answers for at most `window`;
  /// returns what is known of each other rank (answers that came earlier included). Never blocks
  /// past the window, whatever the peers do.
  virtual std::vector<PeerReport> exchange(std::chrono::duration<double> window) = 0;
  /// How this transport can hear a peer, for messages: "over MPI point-to-point".
  virtual std::string how() const = 0;
};

/// Shared by a communicator and its requests, which may outlive it. Not thread-safe. Each tracker
/// is listed in a process-wide registry for its lifetime, so that the dump of one communicator
/// brings the others' with it.
class CollectiveTracker {
 public:
  CollectiveTracker();
  ~CollectiveTracker();
  CollectiveTracker(const CollectiveTracker&) = delete;
  CollectiveTracker& operator=(const CollectiveTracker&) = delete;

  /// Sets the rank, world size and transport name shown in messages and dumps; the base class
  /// calls it before the first collective, when the transport knows them.
  void identify(int rank, int size, std::string backend);
  bool identified() const noexcept { return rank_ >= 0; }
  void set_peer_channel(std::shared_ptr<PeerChannel> channel) { channel_ = std::move(channel); }
  /// The board a side channel sends; updated as collectives start and end.
  std::shared_ptr<const ProgressBoard> board() const noexcept { return board_; }

  /// Numbers and records a collective starting now; throws TimeoutError after a timeout.
  std::int64_t begin(Collective op, std::int64_t count, std::optional<DType> dtype);
  void complete(std::int64_t seq) noexcept;
  /// Marks `seq` failed by an error that is not a timeout (the communicator stays usable).
  void fail(std::int64_t seq) noexcept;
  /// Communicator::set_timing and timings(): completed collectives timed per kind and size.
  void set_timing(const TimingOptions& options);
  std::vector<CollectiveTiming> timings() const;
  /// Throws TimeoutError, pointing at the first timeout, when there was one.
  void check_usable(std::int64_t seq) const;
  bool timed_out() const noexcept { return !first_timeout_.empty(); }
  /// Records the first timeout, in `seq`: logs and returns the full diagnosis (what was awaited,
  /// for how long, what the peers said, who is behind) and dumps this recorder, and every other
  /// live one of the process, when asked to.
  std::string diagnose_timeout(std::int64_t seq, const std::string& transport_message);
  /// Writes the recorder to ZEROSHARD_TRACE_DIR/rank-R.json (temporary file, then rename) when
  /// that variable is set; returns the path, or "" when it is unset or writing failed (logged).
  /// The first reason stays the reason of later dumps (an abort after a timeout does not hide
  /// the timeout), except that this tracker's own timeout replaces it with its diagnosis.
  std::string dump(const std::string& reason) noexcept;
  /// dump() of every tracker alive in this process but `except` (null: all of them); returns the
  /// paths written. The program's communicator and the engine's stall together, and the one that
  /// times out first is not always the one whose records explain the stall. Reads the other
  /// trackers from the calling thread, which is sound because one thread drives them all, as for
  /// any tracker.
  static std::vector<std::string> dump_all(const CollectiveTracker* except,
                                           const std::string& reason) noexcept;

 private:
  void update_board() noexcept;
  void time_completion(const FlightRecord& record);
  std::string describe(std::int64_t seq) const;
  std::string describe_peers(std::int64_t seq, const std::vector<PeerReport>& peers) const;

  int rank_ = -1;
  int size_ = 0;
  std::string backend_;
  int id_;  // which communicator of this process, in creation order
  std::int64_t next_seq_ = 1;
  FlightRecorder recorder_;
  std::shared_ptr<ProgressBoard> board_;
  std::shared_ptr<PeerChannel> channel_;
  std::vector<PeerReport> last_peers_;
  std::string first_timeout_;
  std::string dump_reason_;  // why the recorder was first dumped, or this tracker's diagnosis
  TimingOptions timing_;
  std::map<std::pair<int, std::int64_t>, CollectiveTiming> timings_;  // by (kind, message bytes)
};

}  // namespace zeroshard::detail
