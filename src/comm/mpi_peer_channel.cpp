// Questions and answers about progress between MPI ranks, for the diagnosis of a timeout.
#include "comm/mpi_peer_channel.h"

#include <algorithm>
#include <thread>

#include "comm/mpi_runtime.h"
#include "util/log.h"

namespace zeroshard::detail {
namespace {

constexpr int kTag = 7;
constexpr std::int64_t kAnswer = 0;
constexpr std::int64_t kQuestion = 1;

double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

MpiPeerChannel::MpiPeerChannel(MPI_Comm comm, std::shared_ptr<const ProgressBoard> board)
    : comm_(comm), board_(std::move(board)) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  answered_at_.assign(static_cast<std::size_t>(size_), 0.0);
  for (int r = 0; r < size_; ++r) {
    if (r != rank_)
      peers_.push_back(PeerReport{.rank = r, .heard = false, .board = {}, .heard_at = 0});
  }
}

MpiPeerChannel::~MpiPeerChannel() {
  if (mpi_finalized()) return;
  // A send to a peer that never receives it cannot complete; freeing the request lets MPI finish
  // or drop it on its own. Its buffer is then leaked, as MPI may still read it.
  for (MPI_Request& request : sends_) {
    if (request != MPI_REQUEST_NULL) MPI_Request_free(&request);
  }
  if (!sends_.empty()) static_cast<void>(new std::deque<Message>(std::move(send_buffers_)));
  MPI_Comm_free(&comm_);
}

void MpiPeerChannel::send(int peer, bool question) noexcept {
  const ProgressBoard& b = *board_;
  // Times travel as microseconds since the epoch, so that the message is one integer type.
  const auto micros = [](double seconds) { return static_cast<std::int64_t>(seconds * 1e6); };
  send_buffers_.push_back({question ? kQuestion : kAnswer, b.last_started, b.last_completed,
                           b.waiting_in, b.waiting_op, micros(b.waiting_since), b.gave_up_in,
                           micros(b.gave_up_at)});
  MPI_Request request = MPI_REQUEST_NULL;
  if (MPI_Isend(send_buffers_.back().data(), static_cast<int>(send_buffers_.back().size()),
                MPI_INT64_T, peer, kTag, comm_, &request) != MPI_SUCCESS) {
    send_buffers_.pop_back();
    return;
  }
  sends_.push_back(request);
}

void MpiPeerChannel::receive_arrived() noexcept {
  for (;;) {
    int arrived = 0;
    MPI_Message handle = MPI_MESSAGE_NULL;
    MPI_Status status;
    if (MPI_Improbe(MPI_ANY_SOURCE, kTag, comm_, &arrived, &handle, &status) != MPI_SUCCESS ||
        !arrived) {
      break;
    }
    Message message{};
    if (MPI_Mrecv(message.data(), static_cast<int>(message.size()), MPI_INT64_T, &handle,
                  MPI_STATUS_IGNORE) != MPI_SUCCESS) {
      break;
    }
    const int source = status.MPI_SOURCE;
    auto peer = std::find_if(peers_.begin(), peers_.end(),
                             [source](const PeerReport& p) { return p.rank == source; });
    if (peer == peers_.end()) continue;
    peer->heard = true;
    peer->heard_at = wall_now();
    peer->board = ProgressBoard{.last_started = message[1],
                                .last_completed = message[2],
                                .waiting_in = message[3],
                                .waiting_op = message[4],
                                .waiting_since = static_cast<double>(message[5]) / 1e6,
                                .gave_up_in = message[6],
                                .gave_up_at = static_cast<double>(message[7]) / 1e6};
    answered_at_[static_cast<std::size_t>(source)] = peer->heard_at;
    if (message[0] == kQuestion) send(source, false);
  }
  // Drop the sends that have completed, so that the lists do not grow over a long run.
  while (!sends_.empty()) {
    int done = 0;
    if (MPI_Test(&sends_.front(), &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || !done) break;
    sends_.erase(sends_.begin());
    send_buffers_.pop_front();
  }
}

void MpiPeerChannel::service() noexcept {
  const auto now = std::chrono::steady_clock::now();
  if (now - last_service_ < std::chrono::milliseconds(1)) return;
  last_service_ = now;
  receive_arrived();
}

std::vector<PeerReport> MpiPeerChannel::exchange(std::chrono::duration<double> window) {
  const double asked_at = wall_now();
  for (const PeerReport& peer : peers_) send(peer.rank, true);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(window);
  for (;;) {
    receive_arrived();
    const bool all_answered = std::all_of(peers_.begin(), peers_.end(), [&](const PeerReport& p) {
      return answered_at_[static_cast<std::size_t>(p.rank)] >= asked_at;
    });
    if (all_answered || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // A peer that told its progress before (its own question, or an answer to an earlier one) but
  // not now is reported with that older news; one never heard from stays "not heard".
  return peers_;
}

}  // namespace zeroshard::detail
