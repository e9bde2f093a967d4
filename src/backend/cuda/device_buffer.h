// Owning, move-only allocations of device memory and of pinned (page-locked) host memory, sized
// in bytes.
#pragma once

#include <cstddef>

namespace zeroshard::cuda {

/// Where a CudaAllocation lives: cudaMalloc'd memory on the current device, or cudaMallocHost'd
/// host memory the GPU can copy to and from asynchronously at full bandwidth.
enum class AllocationKind { kDevice, kPinnedHost };

/// Memory of one kind, freed on destruction. Contents start uninitialised. A zero-byte buffer
/// holds no allocation.
template <AllocationKind Kind>
class CudaAllocation {
 public:
  CudaAllocation() = default;
  /// Throws OutOfMemoryError naming `bytes` and `what` (default: the kind) when there is no room.
  explicit CudaAllocation(std::size_t bytes, const char* what = nullptr);
  CudaAllocation(CudaAllocation&& other) noexcept;
  CudaAllocation& operator=(CudaAllocation&& other) noexcept;
  CudaAllocation(const CudaAllocation&) = delete;
  CudaAllocation& operator=(const CudaAllocation&) = delete;
  ~CudaAllocation();

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

using DeviceBuffer = CudaAllocation<AllocationKind::kDevice>;
using PinnedHostBuffer = CudaAllocation<AllocationKind::kPinnedHost>;

extern template class CudaAllocation<AllocationKind::kDevice>;
extern template class CudaAllocation<AllocationKind::kPinnedHost>;

}  // namespace zeroshard::cuda
