// Where the engine keeps its buffers and runs its arithmetic: the host CPU, or one CUDA GPU.
#pragma once

#include <cstddef>
#include <string>

#include "zeroshard/export.h"

namespace zeroshard {

enum class DeviceType { kCpu, kCuda };

/// The processor an Engine computes on. On a CUDA device every buffer the engine hands out
/// (Parameter::raw_data(), raw_grad(), ActivationBuffer::data()) is device memory on it.
struct ZEROSHARD_API Device {
  DeviceType type = DeviceType::kCpu;
  int index = -1;  ///< CUDA device ordinal; -1 for the CPU

  static Device cpu() noexcept { return {}; }
  /// Throws UsageError when the library was built without CUDA or the ordinal does not exist.
  static Device cuda(int index);
  /// What a launched rank should use: the GPU its local rank picks (LOCAL_RANK, Open MPI's or
  /// Slurm's local rank, modulo the GPU count) when the library has CUDA and a GPU is present,
  /// the CPU otherwise. ZEROSHARD_DEVICE=cpu forces the CPU, ZEROSHARD_DEVICE=cuda requires a GPU
  /// (UsageError with the reason when there is none).
  static Device from_environment();

  bool is_cuda() const noexcept { return type == DeviceType::kCuda; }
  /// "cpu" or "cuda:<index>".
  std::string to_string() const;
  friend bool operator==(const Device&, const Device&) = default;
};

/// True when this build of the library contains the CUDA backend.
ZEROSHARD_API bool cuda_built() noexcept;
/// True when the CUDA backend is built and a GPU is usable. Never throws.
ZEROSHARD_API bool cuda_available() noexcept;
/// Why cuda_available() is false ("built without CUDA", "cudaGetDeviceCount failed: ..."); empty
/// when it is true.
ZEROSHARD_API std::string cuda_unavailable_reason();

/// Blocking copies between host memory and memory of `device` (a plain memcpy for the CPU), for
/// models and tools that read or fill engine buffers from the host. They wait for the work queued
/// on `stream` (a cudaStream_t; null means the legacy default stream) before copying.
ZEROSHARD_API void copy_to_host(const Device& device, void* host, const void* source,
                                std::size_t bytes, void* stream = nullptr);
ZEROSHARD_API void copy_from_host(const Device& device, void* destination, const void* host,
                                  std::size_t bytes, void* stream = nullptr);

}  // namespace zeroshard
