// The NCCL implementation of Communicator for GPU ranks: collectives on a dedicated stream,
// completion polled against a deadline so that a missing or diverging rank becomes an error
// instead of a hang, and the bootstrap of NCCL's unique id through MPI or a rendezvous file.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "zeroshard/communicator.h"

namespace zeroshard::cuda {

/// Copies rank 0's `count` bytes at `bytes` into every other rank's `bytes` (MPI_Bcast from rank
/// 0 under MPI). Lets the NCCL bootstrap use MPI without this code including mpi.h.
using BroadcastFromRank0 = std::function<void(void* bytes, std::size_t count)>;

/// Collectives over NCCL. Buffers are device pointers on this rank's device. Contracts beyond
/// Communicator's:
/// - Ordering: work queued on the compute stream (set_compute_stream, default the legacy default
///   stream) before a collective is called is finished before the collective reads its buffers;
///   the host is not blocked for that. After Request::wait() returns, the results are in place
///   for any stream.
/// - Uneven counts: when every rank's count is equal, reduce_scatter and all_gather are one
///   ncclReduceScatter / ncclAllGather. Otherwise they are one NCCL group of ncclReduce (resp.
///   ncclBroadcast) calls, one per rank's slice: no padding and no staging copy, at about the
///   same bytes per rank as the ring collectives but with less of NCCL's tuning. Pad shards to
///   equal sizes where speed matters.
/// - Failure: each wait polls for NCCL's asynchronous errors; after ZEROSHARD_COLLECTIVE_TIMEOUT_S
///   seconds (default 600) without completion the communicator is aborted and TimeoutError names
///   the rank and the collective. An aborted communicator refuses further collectives.
/// Not thread-safe: one thread issues the collectives, as NCCL requires.
class NcclCommunicator final : public Communicator {
 public:
  /// The NCCL handle, stream and failure state, shared with pending requests; defined in the .cpp.
  struct State;

  /// Joins the `world` ranks that use the same `unique_id` (ncclUniqueId bytes) on `device`.
  /// Prefer the make_nccl_communicator factories.
  NcclCommunicator(int rank, int world, int device, const void* unique_id);
  /// Takes over `comm`, a communicator on `device` that has finished initialising.
  NcclCommunicator(ncclComm* comm, int device);
  ~NcclCommunicator() override;

  int rank() const noexcept override;
  int size() const noexcept override;
  std::string backend() const override { return "nccl"; }

  /// The stream the collectives run on.
  cudaStream_t stream() const noexcept;
  int device() const noexcept;
  DeviceType buffer_device() const noexcept override { return DeviceType::kCuda; }
  /// The stream whose earlier work every later collective waits for (on the device).
  void set_compute_stream(void* stream) noexcept override {
    compute_stream_ = static_cast<cudaStream_t>(stream);
  }

 protected:
  /// Through a device buffer of the elements' size, and back.
  void all_gather_host(void* data, std::span<const std::int64_t> counts, DType dtype) override;
  Request start_all_reduce(void* data, std::int64_t count, DType dtype, ReduceOp op) override;
  Request start_reduce_scatter(const void* input, void* output,
                               std::span<const std::int64_t> counts, DType dtype,
                               ReduceOp op) override;
  Request start_all_gather(void* data, std::span<const std::int64_t> counts, DType dtype) override;
  Request start_broadcast(void* data, std::int64_t count, DType dtype, int root) override;
  Request start_all_to_all(const void* input, std::span<const std::int64_t> send_counts,
                           void* output, std::span<const std::int64_t> recv_counts,
                           DType dtype) override;
  std::unique_ptr<Communicator> make_split(int color, int key) override;
  void run_barrier() override;
  [[noreturn]] void end_job(int error_code) noexcept override;

 private:
  // Orders the communication stream after the compute stream's work so far.
  void order_after_compute();
  // Waits until NCCL has queued what was just issued, then returns a request for its completion.
  Request finish(Collective collective);

  std::shared_ptr<State> state_;  // shared with pending requests, which may outlive *this
  cudaStream_t compute_stream_ = cudaStreamLegacy;
};

/// The bytes of a new ncclUniqueId: rank 0 creates one, every other rank receives a copy.
std::vector<std::byte> new_nccl_unique_id();

/// The loaded NCCL library's version code, e.g. 22809 for 2.28.9.
int nccl_version();

/// Rank 0 creates the unique id, `broadcast_from_rank0` hands it to the others, and every rank
/// joins on its `device` (see Device::from_environment()).
std::unique_ptr<NcclCommunicator> make_nccl_communicator(
    int device, int rank, int world, const BroadcastFromRank0& broadcast_from_rank0);

/// A communicator split from the program's NCCL communicator `parent` (ncclCommSplit): the ranks
/// giving the same `color` join one, ordered by `key`, on the current CUDA device. Collective
/// over `parent`.
std::unique_ptr<NcclCommunicator> split_nccl_communicator(ncclComm* parent, int color, int key);

/// Without MPI: rank and world from RANK and WORLD_SIZE, and the id
/// passed through the file ZEROSHARD_RDZV_FILE names (see exchange_through_file; rank 0 removes
/// it once every rank has joined). Throws UsageError naming a missing or malformed variable.
std::unique_ptr<NcclCommunicator> make_nccl_communicator_from_environment(int device);

}  // namespace zeroshard::cuda
