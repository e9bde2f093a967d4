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

DeviceBuffer::DeviceBuffer(std::size_t bytes, const char* what) : bytes_(bytes) {
  if (bytes == 0) return;
  const cudaError_t error = cudaMalloc(&data_, bytes);
  if (error == cudaErrorMemoryAllocation) throw_out_of_memory("cudaMalloc", bytes, what, error);
  if (error != cudaSuccess) throw_cuda_error(error, "cudaMalloc", __FILE__, __LINE__);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    DeviceBuffer old(std::move(*this));
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) ZEROSHARD_CUDA_CHECK_NOTHROW(cudaFree(data_));
}

PinnedHostBuffer::PinnedHostBuffer(std::size_t bytes, const char* what) : bytes_(bytes) {
  if (bytes == 0) return;
  const cudaError_t error = cudaMallocHost(&data_, bytes);
  if (error == cudaErrorMemoryAllocation) {
    throw_out_of_memory("cudaMallocHost", bytes, what, error);
  }
  if (error != cudaSuccess) throw_cuda_error(error, "cudaMallocHost", __FILE__, __LINE__);
}

PinnedHostBuffer::PinnedHostBuffer(PinnedHostBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

PinnedHostBuffer& PinnedHostBuffer::operator=(PinnedHostBuffer&& other) noexcept {
  if (this != &other) {
    PinnedHostBuffer old(std::move(*this));
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

PinnedHostBuffer::~PinnedHostBuffer() {
  if (data_ != nullptr) ZEROSHARD_CUDA_CHECK_NOTHROW(cudaFreeHost(data_));
}

}  // namespace zeroshard::cuda
