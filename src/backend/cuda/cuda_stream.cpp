// Creation and destruction of streams and events, and the device guard.
#include "backend/cuda/cuda_stream.h"

#include <utility>

#include "kernels/cuda/cuda_check.h"

namespace zeroshard::cuda {

CudaStream::CudaStream() {
  ZEROSHARD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

CudaStream::CudaStream(CudaStream&& other) noexcept
    : stream_(std::exchange(other.stream_, nullptr)) {}

CudaStream& CudaStream::operator=(CudaStream&& other) noexcept {
  if (this != &other) {
    CudaStream old(std::move(*this));
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

CudaStream::~CudaStream() {
  if (stream_ != nullptr) ZEROSHARD_CUDA_CHECK_NOTHROW(cudaStreamDestroy(stream_));
}

void CudaStream::synchronize() const { ZEROSHARD_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

CudaEvent::CudaEvent(Timing timing) {
  const unsigned flags = timing == Timing::kEnabled ? cudaEventDefault : cudaEventDisableTiming;
  ZEROSHARD_CUDA_CHECK(cudaEventCreateWithFlags(&event_, flags));
}

CudaEvent::CudaEvent(CudaEvent&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}

CudaEvent& CudaEvent::operator=(CudaEvent&& other) noexcept {
  if (this != &other) {
    CudaEvent old(std::move(*this));
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

CudaEvent::~CudaEvent() {
  if (event_ != nullptr) ZEROSHARD_CUDA_CHECK_NOTHROW(cudaEventDestroy(event_));
}

void CudaEvent::record(cudaStream_t stream) {
  ZEROSHARD_CUDA_CHECK(cudaEventRecord(event_, stream));
}

void CudaEvent::make_wait(cudaStream_t stream) const {
  ZEROSHARD_CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0));
}

bool CudaEvent::query() const {
  const cudaError_t status = cudaEventQuery(event_);
  if (status == cudaErrorNotReady) return false;
  if (status != cudaSuccess) throw_cuda_error(status, "cudaEventQuery", __FILE__, __LINE__);
  return true;
}

void CudaEvent::synchronize() const { ZEROSHARD_CUDA_CHECK(cudaEventSynchronize(event_)); }

float CudaEvent::elapsed_ms_since(const CudaEvent& start) const {
  float ms = 0.0f;
  ZEROSHARD_CUDA_CHECK(cudaEventElapsedTime(&ms, start.event_, event_));
  return ms;
}

DeviceGuard::DeviceGuard(int device) {
  ZEROSHARD_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) ZEROSHARD_CUDA_CHECK(cudaSetDevice(device));
}

DeviceGuard::~DeviceGuard() { ZEROSHARD_CUDA_CHECK_NOTHROW(cudaSetDevice(previous_)); }

}  // namespace zeroshard::cuda
