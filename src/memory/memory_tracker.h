// The accounting allocator: every buffer the engine owns is a TrackedBuffer, so the memory
// report is exact rather than estimated.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "zeroshard/memory_report.h"

namespace zeroshard::detail {

/// Counts bytes per (location, category), current and peak. One per engine; thread-safe.
class MemoryTracker {
 public:
  /// `adopted`: the bytes are the model's own memory, counted and also listed as adopted.
  void add(MemoryLocation location, MemoryCategory category, std::int64_t bytes,
           bool adopted = false);
  void remove(MemoryLocation location, MemoryCategory category, std::int64_t bytes,
              bool adopted = false);
  /// Moves bytes from `category` to kept-for-reuse and back; the total does not change.
  void keep(MemoryLocation location, MemoryCategory category, std::int64_t bytes);
  void reuse(MemoryLocation location, MemoryCategory category, std::int64_t bytes);
  /// Kept bytes freed.
  void remove_kept(MemoryLocation location, std::int64_t bytes);
  MemoryReport report(int rank, int world_size) const;
  /// The same without process_peak_rss (0), which costs a read of /proc: for every step's
  /// monitor series.
  MemoryReport counted(int rank, int world_size) const;
  /// Every peak becomes the current value.
  void reset_peaks();
  std::int64_t current(MemoryCategory category,
                       MemoryLocation location = MemoryLocation::kHost) const;

 private:
  mutable std::mutex mutex_;
  std::array<std::array<MemoryUsage, kMemoryCategoryCount>, kMemoryLocationCount> usage_{};
  std::array<std::array<std::int64_t, kMemoryCategoryCount>, kMemoryLocationCount> adopted_{};
  std::array<MemoryUsage, kMemoryLocationCount> kept_{};
  std::array<std::int64_t, kMemoryLocationCount> total_current_{};
  std::array<std::int64_t, kMemoryLocationCount> total_peak_{};
};

/// Alignment of every host buffer: a cache line, and a multiple of any SIMD width we use.
inline constexpr std::size_t kBufferAlignment = 64;

/// Where TrackedBuffers get their memory: host memory, or a GPU's (see compute_backend.h).
class MemoryResource {
 public:
  virtual ~MemoryResource() = default;
  virtual MemoryLocation location() const noexcept = 0;
  /// `bytes` zero-filled bytes, aligned to at least kBufferAlignment. Throws OutOfMemoryError
  /// naming the size and the category when there is no room.
  virtual void* allocate(std::size_t bytes, MemoryCategory category) = 0;
  /// The same without the zero fill, for memory that is about to be overwritten whole; host
  /// memory comes aligned for O_DIRECT. Resources that cannot skip the fill give allocate()'s.
  virtual void* allocate_uninitialized(std::size_t bytes, MemoryCategory category) {
    return allocate(bytes, category);
  }
  virtual void deallocate(void* data) noexcept = 0;
};

/// Aligned host memory from the C heap.
MemoryResource& host_memory() noexcept;

/// A zero-initialised, aligned allocation charged to one category at its resource's location.
/// Move-only.
class TrackedBuffer {
 public:
  TrackedBuffer() = default;
  TrackedBuffer(MemoryTracker& tracker, MemoryCategory category, std::size_t bytes,
                MemoryResource& resource = host_memory());
  /// The same allocation without the zero fill, for memory about to be overwritten whole.
  static TrackedBuffer uninitialized(MemoryTracker& tracker, MemoryCategory category,
                                     std::size_t bytes, MemoryResource& resource = host_memory());
  /// Memory the model owns (Engine::adopt_memory), charged to `category` at `resource`'s
  /// location and listed as adopted; never freed, nor zeroed.
  static TrackedBuffer adopt(MemoryTracker& tracker, MemoryCategory category, std::size_t bytes,
                             MemoryResource& resource, void* data);
  TrackedBuffer(TrackedBuffer&& other) noexcept;
  TrackedBuffer& operator=(TrackedBuffer&& other) noexcept;
  TrackedBuffer(const TrackedBuffer&) = delete;
  TrackedBuffer& operator=(const TrackedBuffer&) = delete;
  ~TrackedBuffer();

  void* data() const noexcept { return data_; }
  template <class T>
  T* as() const noexcept {
    return static_cast<T*>(data_);
  }
  std::size_t bytes() const noexcept { return bytes_; }
  bool empty() const noexcept { return data_ == nullptr; }
  MemoryLocation location() const noexcept {
    return resource_ ? resource_->location() : MemoryLocation::kHost;
  }
  /// Frees the memory now (adopted memory is only no longer counted); the buffer becomes empty.
  void reset() noexcept;
  /// Counts the buffer as kept for reuse instead of under its category until reuse(): for a
  /// buffer held between uses rather than freed (never the model's own memory).
  void keep_for_reuse() noexcept;
  void reuse() noexcept;
  /// A buffer of the same size, category and resource whose contents are undefined, to be
  /// filled and then swapped in for this one; empty for an empty buffer or the model's memory.
  TrackedBuffer uninitialized_twin() const;

 private:
  MemoryTracker* tracker_ = nullptr;
  MemoryResource* resource_ = nullptr;
  MemoryCategory category_ = MemoryCategory::kParameters;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  bool adopted_ = false;
  bool kept_ = false;
};

/// Peak resident set size of this process in bytes (VmHWM from /proc/self/status), 0 if unknown.
std::int64_t process_peak_rss_bytes();

}  // namespace zeroshard::detail
