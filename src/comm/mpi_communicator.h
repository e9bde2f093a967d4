// The MPI backend of Communicator: non-blocking MPI collectives on a duplicate of
// MPI_COMM_WORLD or of the program's communicator, waited on with a deadline so that a dead peer
// becomes an error, not a hang.
#pragma once

#include <chrono>
#include <climits>
#include <cstdint>
#include <memory>

#include "zeroshard/communicator.h"

namespace zeroshard::detail {

/// How long a collective may take when ZEROSHARD_COLLECTIVE_TIMEOUT_S is not set.
inline constexpr std::chrono::seconds kDefaultCollectiveTimeout{600};

/// How the MPI backend reduce-scatters: a ring of point-to-point messages, which sends (N-1)/N of
/// the input per rank, or MPI's own MPI_Ireduce_scatter, whose algorithm OpenMPI picks and which
/// can send more (kept to measure the difference).
enum class ReduceScatterAlgorithm { kRing, kMpi };

struct MpiCommunicatorOptions {
  /// How long Request::wait(), barrier() and the communicator's creation wait for the other ranks
  /// before throwing TimeoutError. Counted from the start of the wait, not of the collective.
  std::chrono::duration<double> timeout = kDefaultCollectiveTimeout;
  /// The most elements handed to one MPI call: MPI counts and displacements are int, so larger
  /// collectives are split into several calls. Tests lower it to exercise the split.
  std::int64_t max_elements_per_call = INT_MAX;
  /// The ring also sends no message longer than max_elements_per_call.
  ReduceScatterAlgorithm reduce_scatter = ReduceScatterAlgorithm::kRing;
};

/// ZEROSHARD_COLLECTIVE_TIMEOUT_S (seconds, fractions allowed), or kDefaultCollectiveTimeout when
/// it is unset; throws ConfigError when it is not a positive number.
std::chrono::duration<double> collective_timeout_from_environment();

/// ZEROSHARD_REDUCE_SCATTER: "ring" (the default when unset) or "mpi"; throws ConfigError
/// otherwise.
ReduceScatterAlgorithm reduce_scatter_algorithm_from_environment();

/// A communicator over a new duplicate of MPI_COMM_WORLD, initialising MPI on first use. It is a
/// collective call: every rank of the world must make it.
std::unique_ptr<Communicator> make_mpi_communicator(const MpiCommunicatorOptions& options);

/// A communicator over a new duplicate of the program's communicator, given as its Fortran handle
/// (MPI_Comm_c2f), which is an int in every MPI, so that no MPI type crosses the library's
/// interface. Collective over that communicator; MPI must be initialised.
std::unique_ptr<Communicator> make_mpi_communicator(const MpiCommunicatorOptions& options,
                                                    int fortran_handle);

}  // namespace zeroshard::detail
