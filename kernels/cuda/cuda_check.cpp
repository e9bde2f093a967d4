// Builds the messages of the CUDA and NCCL check macros.
#include "kernels/cuda/cuda_check.h"

#include <sstream>
#include <string>

#include "util/log.h"

namespace zeroshard::cuda {
namespace {

std::string describe(const char* expression, const char* what, const char* file, int line) {
  std::ostringstream os;
  os << expression << " failed: " << what << " [" << detail::where(file, line) << "]";
  return os.str();
}

}  // namespace

void throw_cuda_error(cudaError_t error, const char* expression, const char* file, int line) {
  const std::string what =
      std::string(cudaGetErrorName(error)) + " (" + cudaGetErrorString(error) + ")";
  if (error == cudaErrorMemoryAllocation) {
    throw OutOfMemoryError(describe(expression, what.c_str(), file, line));
  }
  throw CudaError(describe(expression, what.c_str(), file, line));
}

void throw_nccl_error(int result, const char* error_string, const char* expression,
                      const char* file, int line) {
  const std::string what =
      std::string(error_string) + " (ncclResult_t " + std::to_string(result) + ")";
  throw CommError(ErrorCode::kNccl, describe(expression, what.c_str(), file, line));
}

void report_cuda_error(cudaError_t error, const char* expression, const char* file,
                       int line) noexcept {
  if (error == cudaErrorCudartUnloading) return;
  ZEROSHARD_LOG(kError, expression << " failed: " << cudaGetErrorName(error) << " ("
                                   << cudaGetErrorString(error) << ") [" << file << ":" << line
                                   << "]");
}

void throw_allocation_error(const char* call, std::size_t bytes, const char* what,
                            cudaError_t error) {
  if (error != cudaErrorMemoryAllocation) throw_cuda_error(error, call, __FILE__, __LINE__);
  // Clears the error so that the next, unrelated check does not report it again.
  cudaGetLastError();
  std::ostringstream os;
  os << call << " of " << bytes << " bytes for " << what
     << " failed: " << cudaGetErrorString(error);
  if (int device = -1; cudaGetDevice(&device) == cudaSuccess) {
    std::size_t free_bytes = 0;
    std::size_t total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
      os << " (device " << device << " has " << free_bytes << " of " << total_bytes
         << " bytes free)";
    }
  }
  os << " [" << detail::where(__FILE__, __LINE__) << "]";
  throw OutOfMemoryError(os.str());
}

}  // namespace zeroshard::cuda
