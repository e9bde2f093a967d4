// Owning, move-only allocations of device memory and of pinned (page-locked) host memory, sized
// in bytes.
#pragma once

#include <cstddef>

namespace zeroshard::cuda {

/// cudaMalloc'd memory on the current device, freed on destruction. Contents start
/// uninitialised. A zero-byte buffer holds no allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  /// Throws OutOfMemoryError naming `bytes` and `what` when the device has no room.
  explicit DeviceBuffer(std::size_t bytes, const char* what = "device buffer");
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* data() const noexcept { return data_; }
  template <class T>
  T* as() const noexcept {
    return static_cast<T*>(data_);
  }
  std::size_t bytes() const noexcept { return bytes_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

/// cudaMallocHost'd memory: host memory the GPU can copy to and from asynchronously at full
/// bandwidth. Contents start uninitialised.
class PinnedHostBuffer {
 public:
  PinnedHostBuffer() = default;
  explicit PinnedHostBuffer(std::size_t bytes, const char* what = "pinned host buffer");
  PinnedHostBuffer(PinnedHostBuffer&& other) noexcept;
  PinnedHostBuffer& operator=(PinnedHostBuffer&& other) noexcept;
  PinnedHostBuffer(const PinnedHostBuffer&) = delete;
  PinnedHostBuffer& operator=(const PinnedHostBuffer&) = delete;
  ~PinnedHostBuffer();

  void* data() const noexcept { return data_; }
  template <class T>
  T* as() const noexcept {
    return static_cast<T*>(data_);
  }
  std::size_t bytes() const noexcept { return bytes_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace zeroshard::cuda
