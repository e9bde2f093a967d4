// Owning, move-only CUDA streams and events, and a guard that makes a device current for a scope.
#pragma once

#include <cuda_runtime_api.h>

namespace zeroshard::cuda {

/// A non-blocking stream on the device current at construction: it never synchronises implicitly
/// with the legacy default stream, so ordering against other streams is always explicit (events).
class CudaStream {
 public:
  CudaStream();
  CudaStream(CudaStream&& other) noexcept;
  CudaStream& operator=(CudaStream&& other) noexcept;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  ~CudaStream();

  cudaStream_t get() const noexcept { return stream_; }
  /// Blocks the host until all work queued so far has finished.
  void synchronize() const;

 private:
  cudaStream_t stream_ = nullptr;
};

/// A CUDA event on the device current at construction. Without timing it is cheaper to record
/// and to wait on, which is all the ordering between streams needs.
class CudaEvent {
 public:
  enum class Timing { kDisabled, kEnabled };

  explicit CudaEvent(Timing timing = Timing::kDisabled);
  CudaEvent(CudaEvent&& other) noexcept;
  CudaEvent& operator=(CudaEvent&& other) noexcept;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  ~CudaEvent();

  cudaEvent_t get() const noexcept { return event_; }
  /// Captures the work queued on `stream` so far.
  void record(cudaStream_t stream);
  /// Makes `stream` wait, on the device, for the captured work; the host does not block.
  void make_wait(cudaStream_t stream) const;
  /// True once the captured work has finished; throws CudaError if it failed.
  bool query() const;
  void synchronize() const;
  /// Milliseconds from `start` to this event; both need Timing::kEnabled and to have completed.
  float elapsed_ms_since(const CudaEvent& start) const;

 private:
  cudaEvent_t event_ = nullptr;
};

/// Makes `device` current and restores the previous device on scope exit.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  ~DeviceGuard();

 private:
  int previous_ = -1;
};

}  // namespace zeroshard::cuda
