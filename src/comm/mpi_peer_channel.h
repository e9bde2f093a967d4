// The MPI side channel a timed-out rank asks the other ranks' progress through: small
// point-to-point messages on a communicator of its own, never the collective that is stuck.
#pragma once

#include <mpi.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "comm/collective_tracker.h"

namespace zeroshard::detail {

/// Why point-to-point and not an MPI window read with MPI_Get: a passive-target Get needs
/// MPI_Win_unlock or a flush to complete, and both block with no deadline; Open MPI's
/// osc/pt2pt needs the target to progress, so a stopped target would block the reader for
/// ever, and MPI_Win_free at destruction is collective. A non-blocking send completes locally
/// (the message is a few bytes, sent eagerly), a receive is only attempted for a message that
/// has arrived (MPI_Improbe), so no call here can block on a stopped peer. Ranks answer while
/// they poll their own collectives (service()); a rank that gave up tells its peers so in its
/// question, so a rank resumed later learns that it was the one they waited for.
class MpiPeerChannel final : public PeerChannel {
 public:
  /// Takes ownership of `comm` (a duplicate of the collectives' communicator, freed here unless
  /// MPI is finalized); `board` is this rank's progress as the tracker keeps it.
  MpiPeerChannel(MPI_Comm comm, std::shared_ptr<const ProgressBoard> board);
  MpiPeerChannel(const MpiPeerChannel&) = delete;
  MpiPeerChannel& operator=(const MpiPeerChannel&) = delete;
  ~MpiPeerChannel() override;

  /// Receives what has arrived and answers questions; cheap enough to call on every poll, as
  /// it looks at the channel at most once per millisecond.
  void service() noexcept;
  std::vector<PeerReport> exchange(std::chrono::duration<double> window) override;
  std::string how() const override { return "asked over MPI point-to-point"; }

 private:
  using Message = std::array<std::int64_t, 8>;
  void send(int peer, bool question) noexcept;
  void receive_arrived() noexcept;

  MPI_Comm comm_;
  int rank_ = -1;
  int size_ = 0;
  std::shared_ptr<const ProgressBoard> board_;
  std::vector<PeerReport> peers_;
  std::vector<double> answered_at_;  // wall seconds of each peer's latest message
  // Sends in flight and their buffers; a deque keeps the buffers where MPI was told they are.
  std::deque<Message> send_buffers_;
  std::vector<MPI_Request> sends_;
  std::chrono::steady_clock::time_point last_service_;
};

}  // namespace zeroshard::detail
