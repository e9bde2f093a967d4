// Which GPU this process uses: presence of a usable device, the local rank the launcher gives, and
// the device picked from it.
#pragma once

#include <string>

namespace zeroshard::cuda {

/// True when the CUDA runtime loads and sees at least one device. Never throws, so callers can
/// choose the CPU path (or skip a test) on machines without a GPU or driver.
bool cuda_device_available() noexcept;

/// Why cuda_device_available() is false, e.g. "cudaGetDeviceCount failed: cudaErrorNoDevice (no
/// CUDA-capable device is detected)"; empty when a device is available.
std::string cuda_unavailable_reason();

/// This process's rank among those on its host, from the first of LOCAL_RANK (torchrun),
/// OMPI_COMM_WORLD_LOCAL_RANK (Open MPI), MPI_LOCALRANKID (MPICH) and SLURM_LOCALID that is set;
/// 0 when none is. Throws UsageError naming the variable when its value is not a non-negative
/// integer.
int local_rank_from_environment();

/// Makes device local_rank_from_environment() % device count current and returns it, so that
/// ranks on one host spread over its GPUs. Throws CudaError when no device is available.
int select_device_for_local_rank();

}  // namespace zeroshard::cuda
