// How Communicator::from_environment(device) picks the transport for GPU buffers. The choice is
// made here, without CUDA headers, so that the override variable is checked in every build; the
// communicators themselves are built in src/backend/cuda/gpu_communicator_factory.cpp.
#pragma once

#include <memory>
#include <optional>

#include "zeroshard/communicator.h"
#include "zeroshard/device.h"

namespace zeroshard::detail {

enum class GpuTransport {
  kAuto,        ///< NCCL unless ranks share a GPU, then MPI with host staging
  kNccl,        ///< ZEROSHARD_COMM_BACKEND=nccl
  kMpiStaging,  ///< ZEROSHARD_COMM_BACKEND=mpi
};

/// ZEROSHARD_COMM_BACKEND: unset or empty is kAuto; "nccl" and "mpi" (any case) force one.
/// Throws UsageError naming the variable and the values it takes otherwise.
GpuTransport gpu_transport_from_environment();

#if ZEROSHARD_WITH_CUDA
/// The communicator for buffers on the CUDA `device`; `launched_by_mpi` says whether an MPI
/// launcher started the process.
std::unique_ptr<Communicator> make_gpu_communicator(const Device& device, GpuTransport transport,
                                                    bool launched_by_mpi);
/// Communicator::from_nccl: split from `parent` by `color`, ranked by `key` (nullopt: the rank in
/// `parent`, which makes color 0 a duplicate).
std::unique_ptr<Communicator> make_split_nccl_communicator(ncclComm* parent, int color,
                                                           std::optional<int> key);
#endif

}  // namespace zeroshard::detail
