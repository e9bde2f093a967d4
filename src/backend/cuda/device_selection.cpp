// Device presence, the launcher's local rank, and the device picked from it.
#include "backend/cuda/device_selection.h"

#include <cuda_runtime_api.h>

#include <charconv>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/cuda_check.h"

namespace zeroshard::cuda {
namespace {

// cudaGetDeviceCount's result without throwing; also clears the runtime's last-error state so a
// failed probe is not reported again by the next, unrelated check.
cudaError_t probe_device_count(int* count) noexcept {
  *count = 0;
  const cudaError_t error = cudaGetDeviceCount(count);
  cudaGetLastError();
  return error;
}

}  // namespace

bool cuda_device_available() noexcept {
  int count = 0;
  return probe_device_count(&count) == cudaSuccess && count > 0;
}

std::string cuda_unavailable_reason() {
  int count = 0;
  const cudaError_t error = probe_device_count(&count);
  if (error != cudaSuccess) {
    return std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(error) + " (" +
           cudaGetErrorString(error) + ")";
  }
  if (count == 0) return "cudaGetDeviceCount reports 0 devices";
  return "";
}

int local_rank_from_environment() {
  for (const char* name :
       {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}) {
    const char* value = std::getenv(name);
    if (value == nullptr) continue;
    int rank = -1;
    const char* end = value + std::strlen(value);
    const auto [parsed_to, error] = std::from_chars(value, end, rank);
    ZEROSHARD_CHECK_USAGE(
        error == std::errc() && parsed_to == end && parsed_to != value && rank >= 0,
        "environment variable " << name << "='" << value
                                << "' is not a local rank (expected an integer >= 0)");
    return rank;
  }
  return 0;
}

int select_device_for_local_rank() {
  if (!cuda_device_available())
    throw CudaError("no CUDA device to select: " + cuda_unavailable_reason());
  int count = 0;
  ZEROSHARD_CUDA_CHECK(cudaGetDeviceCount(&count));
  const int device = local_rank_from_environment() % count;
  ZEROSHARD_CUDA_CHECK(cudaSetDevice(device));
  return device;
}

}  // namespace zeroshard::cuda
