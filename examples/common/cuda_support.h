// What the example models' GPU code shares: error checks that name the example, the launch shape
// of their element-wise kernels, and RAII owners (neither copied nor moved) of the device, stream
// and cuBLAS handle each model computes on. For .cu files only: it includes the CUDA headers.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "zeroshard/error.h"

namespace zeroshard::examples {

/// Throws CudaError("<owner>: <what> failed: <reason>") for a failed CUDA or cuBLAS call.
class CudaCheck {
 public:
  /// `owner` names the example in messages, e.g. "MLP example".
  constexpr explicit CudaCheck(const char* owner) : owner_(owner) {}

  const char* owner() const noexcept { return owner_; }

  void operator()(cudaError_t error, const char* what) const {
    if (error != cudaSuccess) {
      throw CudaError(std::string(owner_) + ": " + what + " failed: " + cudaGetErrorString(error));
    }
  }

  void operator()(cublasStatus_t status, const char* what) const {
    if (status != CUBLAS_STATUS_SUCCESS) {
      throw CudaError(std::string(owner_) + ": " + what +
                      " failed: " + cublasGetStatusString(status));
    }
  }

 private:
  const char* owner_;
};

/// Threads per block of the element-wise kernels.
constexpr int kThreads = 256;

/// Blocks of kThreads covering `count` threads (at least one).
inline unsigned blocks_for(std::int64_t count) {
  return static_cast<unsigned>(std::max<std::int64_t>(1, (count + kThreads - 1) / kThreads));
}

/// A non-blocking stream, so the engine's streams need not wait for the legacy default stream.
class CudaStreamOwner {
 public:
  explicit CudaStreamOwner(const CudaCheck& check) {
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  CudaStreamOwner(const CudaStreamOwner&) = delete;
  CudaStreamOwner& operator=(const CudaStreamOwner&) = delete;
  ~CudaStreamOwner() { cudaStreamDestroy(stream_); }
  cudaStream_t get() const noexcept { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

/// A cuBLAS handle whose work goes to `stream`.
class CublasOwner {
 public:
  CublasOwner(cudaStream_t stream, const CudaCheck& check) {
    check(cublasCreate(&handle_), "cublasCreate");
    check(cublasSetStream(handle_, stream), "cublasSetStream");
  }
  CublasOwner(const CublasOwner&) = delete;
  CublasOwner& operator=(const CublasOwner&) = delete;
  ~CublasOwner() { cublasDestroy(handle_); }
  cublasHandle_t get() const noexcept { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

/// The device a model computes on, made current first so that its stream and cuBLAS handle are
/// created on it, and the stream the engine orders its own work and its collectives after.
class CudaDeviceStream {
 public:
  CudaDeviceStream(int device, const CudaCheck& check)
      : current_(device, check), stream_(check), cublas_(stream_.get(), check) {}

  cudaStream_t stream() const noexcept { return stream_.get(); }
  cublasHandle_t cublas() const noexcept { return cublas_.get(); }

 private:
  struct CurrentDevice {
    CurrentDevice(int device, const CudaCheck& check) {
      check(cudaSetDevice(device), "cudaSetDevice");
    }
  };

  CurrentDevice current_;
  CudaStreamOwner stream_;
  CublasOwner cublas_;
};

}  // namespace zeroshard::examples
