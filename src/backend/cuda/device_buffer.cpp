// Allocation and release of device and pinned host buffers.
#include "backend/cuda/device_buffer.h"

#include <cuda_runtime_api.h>

#include <utility>

#include "kernels/cuda/cuda_check.h"

namespace zeroshard::cuda {

// The two kinds differ only in the allocation and release calls.
template <AllocationKind Kind>
CudaAllocation<Kind>::CudaAllocation(std::size_t bytes, const char* what) : bytes_(bytes) {
  if (bytes == 0) return;
  constexpr bool device = Kind == AllocationKind::kDevice;
  const char* call = device ? "cudaMalloc" : "cudaMallocHost";
  if (what == nullptr) what = device ? "device buffer" : "pinned host buffer";
  const cudaError_t error = device ? cudaMalloc(&data_, bytes) : cudaMallocHost(&data_, bytes);
  if (error != cudaSuccess) throw_allocation_error(call, bytes, what, error);
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
