// A reduce-scatter as a pipelined ring of point-to-point messages, advanced without blocking each
// time its request is polled: each rank sends (N-1)/N of the input, what a ring must and no more.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "zeroshard/communicator.h"
#include "zeroshard/dtype.h"

namespace zeroshard::detail {

/// What one ring reduce-scatter moves, and over which communicator and tag.
struct RingPlan {
  const void* input = nullptr;
  void* output = nullptr;
  std::vector<std::int64_t> counts;  // elements per rank's slice, as the collective's contract
  DType dtype = DType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  int rank = 0;
  int size = 1;
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Datatype type = MPI_DATATYPE_NULL;
  int tag = 0;                      // unique among the rings in flight on `comm`
  std::int64_t chunk_elements = 1;  // the most elements in one message (fits an int)
  std::string description;          // names the collective and rank in errors
};

/// Rank r owns slice r. In step s (0..N-2) it sends slice (r-s-1) mod N to rank r+1 and receives
/// slice (r-s-2) mod N from rank r-1, which it reduces with its own input of that slice before
/// forwarding it in step s+1; in the last step the received slice is its own, reduced straight into
/// the output. So slice b is summed in the same order on every run: x[b+1], then x[b+2], ...,
/// x[N-1], x[0], ..., x[b], each added as reduce_into(x[k], partial). Each slice travels in chunks
/// of at most chunk_elements, and chunk c goes on to the next step as soon as it has been reduced,
/// so sending one chunk overlaps receiving and reducing the next. Needs two staging slices of the
/// largest slice (none at N=2). In place (the output is this rank's slice of the input, which no
/// step sends), the last step receives each chunk into one of two chunk buffers; a sum is added
/// into the output as reduce_into(partial, x[r]), the same bits since IEEE addition commutes, and
/// a max, which picks between +0 and -0 by argument order, is reduced as above and copied there.
/// N=1 is a copy (none in place), done by the constructor.
class RingReduceScatter {
 public:
  explicit RingReduceScatter(RingPlan plan);
  RingReduceScatter(const RingReduceScatter&) = delete;
  RingReduceScatter& operator=(const RingReduceScatter&) = delete;

  /// Starts what can start, completes what has arrived; never blocks. True once every message has
  /// been sent and every received chunk reduced. Throws CommError when an MPI call fails.
  bool advance();
  /// True while MPI may still read or write this ring's buffers.
  bool in_flight() const noexcept;

 private:
  struct Transfer {
    MPI_Request request = MPI_REQUEST_NULL;
    int step = 0;
    std::int64_t chunk = 0;
    bool done = false;  // a send has completed; a receive has completed and been reduced
  };

  int send_slice(int step) const noexcept;
  int receive_slice(int step) const noexcept;
  std::int64_t chunk_length(int slice, std::int64_t chunk) const noexcept;
  const std::byte* send_source(const Transfer& send) const noexcept;
  std::byte* receive_target(const Transfer& receive) noexcept;
  bool can_send(const Transfer& send) const noexcept;
  bool can_receive(const Transfer& receive) const noexcept;
  void complete_receives();
  void complete_sends();
  void check(int rc, const char* call) const;

  RingPlan plan_;
  std::size_t element_bytes_;
  std::vector<std::int64_t> offsets_;  // of each slice in the input, in elements
  int steps_;
  // Flattened (step, chunk) in step order; posted strictly in this order, so that messages of
  // one ring, which share a tag, match in order (MPI does not let them overtake each other).
  std::vector<Transfer> sends_;
  std::vector<Transfer> receives_;
  std::vector<std::size_t> send_start_;     // index in sends_ of each step's first chunk
  std::vector<std::size_t> receive_start_;  // index in receives_ of each step's first chunk
  std::size_t next_send_ = 0;
  std::size_t next_receive_ = 0;
  std::size_t first_open_send_ = 0;     // every send before it is done
  std::size_t first_open_receive_ = 0;  // every receive before it is done
  std::vector<std::byte> staging_[2];   // step s receives into staging_[s % 2], but the last
  bool in_place_ = false;
  std::vector<std::byte> last_chunks_[2];  // in place: chunk c of the last step lands in [c % 2]
  bool finished_ = false;
};

}  // namespace zeroshard::detail
