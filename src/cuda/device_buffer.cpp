// Allocation and release of device and pinned host buffers.
#include "cuda/device_buffer.h"

#include <cuda_runtime_api.h>

#include <sstream>
#include <utility>

#include "cuda/cuda_check.h"

namespace zeroshard::cuda {
namespace {

[[noreturn]] void throw_out_of_memory(const char* call, std::size_t bytes, const char* what,
                                      cudaError_t error) {
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

}  // namespace

// The two kinds differ only in the allocation and release calls.
template <AllocationKind Kind>
CudaAllocation<Kind>::CudaAllocation(std::size_t bytes, const char* what) : bytes_(bytes) {
  if (bytes == 0) return;
  constexpr bool device = Kind == AllocationKind::kDevice;
  const char* call = device ? "cudaMalloc" : "cudaMallocHost";
  if (what == nullptr) what = device ? "device buffer" : "pinned host buffer";
  const cudaError_t error = device ? cudaMalloc(&data_, bytes) : cudaMallocHost(&data_, bytes);
  if (error == cudaErrorMemoryAllocation) throw_out_of_memory(call, bytes, what, error);
  if (error != cudaSuccess) throw_cuda_error(error, call, __FILE__, __LINE__);
}

template <AllocationKind Kind>
CudaAllocation<Kind>::CudaAllocation(CudaAllocation&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

template <AllocationKind Kind>
CudaAllocation<Kind>& CudaAllocation<Kind>::operator=(CudaAllocation&& other) noexcept {
  if (this != &other) {
    CudaAllocation old(std::move(*this));
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

template <AllocationKind Kind>
CudaAllocation<Kind>::~CudaAllocation() {
  if (data_ == nullptr) return;
  if constexpr (Kind == AllocationKind::kDevice) {
    ZEROSHARD_CUDA_CHECK_NOTHROW(cudaFree(data_));
  } else {
    ZEROSHARD_CUDA_CHECK_NOTHROW(cudaFreeHost(data_));
  }
}

template class CudaAllocation<AllocationKind::kDevice>;
template class CudaAllocation<AllocationKind::kPinnedHost>;

}  // namespace zeroshard::cuda
