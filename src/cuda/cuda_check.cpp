// Builds the messages of the CUDA and NCCL check macros.
#include "cuda/cuda_check.h"

#include <cstdio>
#include <sstream>
#include <string>

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
  std::fprintf(stderr, "zeroshard: %s failed: %s (%s) [%s:%d]\n", expression,
               cudaGetErrorName(error), cudaGetErrorString(error), file, line);
}

}  // namespace zeroshard::cuda
