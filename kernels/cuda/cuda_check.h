// Check macros for CUDA runtime and NCCL return codes: a failure throws CudaError or
// CommError(kNccl) whose message names the call, the error, the source location and the rank.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "util/check.h"

namespace zeroshard::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t error, const char* expression, const char* file,
                                   int line);
/// `result` is an ncclResult_t passed as int so that this header does not need nccl.h.
[[noreturn]] void throw_nccl_error(int result, const char* error_string, const char* expression,
                                   const char* file, int line);
/// For a failed allocation `call` of `bytes` bytes for `what`: OutOfMemoryError naming the size
/// and the device's free memory when the device is full, CudaError otherwise.
[[noreturn]] void throw_allocation_error(const char* call, std::size_t bytes, const char* what,
                                         cudaError_t error);

/// For destructors, which must not throw: prints the failure to stderr instead. Stays silent on
/// cudaErrorCudartUnloading, which only says the process is already tearing CUDA down.
void report_cuda_error(cudaError_t error, const char* expression, const char* file,
                       int line) noexcept;

}  // namespace zeroshard::cuda

/// Throws CudaError when the CUDA runtime call `expr` does not return cudaSuccess.
#define ZEROSHARD_CUDA_CHECK(expr)                                                           \
  do {                                                                                       \
    const cudaError_t zeroshard_cuda_error_ = (expr);                                        \
    if (zeroshard_cuda_error_ != cudaSuccess) {                                              \
      ::zeroshard::cuda::throw_cuda_error(zeroshard_cuda_error_, #expr, __FILE__, __LINE__); \
    }                                                                                        \
  } while (0)

/// Like ZEROSHARD_CUDA_CHECK but reports instead of throwing; for noexcept destructors.
#define ZEROSHARD_CUDA_CHECK_NOTHROW(expr)                                                    \
  do {                                                                                        \
    const cudaError_t zeroshard_cuda_error_ = (expr);                                         \
    if (zeroshard_cuda_error_ != cudaSuccess) {                                               \
      ::zeroshard::cuda::report_cuda_error(zeroshard_cuda_error_, #expr, __FILE__, __LINE__); \
    }                                                                                         \
  } while (0)

/// Throws CommError(kNccl) when the NCCL call `expr` returns neither ncclSuccess nor, on a
/// non-blocking communicator, ncclInProgress (the caller then polls for completion). Uses nccl.h
/// only where it expands.
#define ZEROSHARD_NCCL_CHECK(expr)                                                           \
  do {                                                                                       \
    const ncclResult_t zeroshard_nccl_result_ = (expr);                                      \
    if (zeroshard_nccl_result_ != ncclSuccess && zeroshard_nccl_result_ != ncclInProgress) { \
      ::zeroshard::cuda::throw_nccl_error(static_cast<int>(zeroshard_nccl_result_),          \
                                          ncclGetErrorString(zeroshard_nccl_result_), #expr, \
                                          __FILE__, __LINE__);                               \
    }                                                                                        \
  } while (0)
