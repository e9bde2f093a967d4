// Page-aligned, page-locked host memory for O_DIRECT I/O, charged to the memory tracker.
#pragma once

#include <cstddef>

#include "memory/memory_tracker.h"  // MemoryTracker, MemoryCategory

namespace zeroshard::detail {

/// Bytes every O_DIRECT buffer, offset and length is a multiple of: a page, which also covers
/// 512 B and 4 KiB logical sectors.
inline constexpr std::size_t kDirectIoAlignment = 4096;

/// Rounds `bytes` up to a multiple of kDirectIoAlignment.
constexpr std::size_t round_up_to_page(std::size_t bytes) noexcept {
  return (bytes + kDirectIoAlignment - 1) / kDirectIoAlignment * kDirectIoAlignment;
}

/// Anonymous mmap'd memory (io_uring can register only anonymous memory), zero-filled, locked
/// with mlock where RLIMIT_MEMLOCK allows (a warning is logged otherwise), and charged to
/// `tracker` as host bytes of `category` when a tracker is given. Move-only.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(std::size_t bytes, MemoryTracker* tracker = nullptr,
               MemoryCategory category = MemoryCategory::kOptimizerStates);
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer();

  std::byte* data() const noexcept { return data_; }
  /// Rounded up to a whole page.
  std::size_t bytes() const noexcept { return bytes_; }
  bool locked() const noexcept { return locked_; }
  void reset() noexcept;

 private:
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
  bool locked_ = false;
  MemoryTracker* tracker_ = nullptr;
  MemoryCategory category_ = MemoryCategory::kOptimizerStates;
};

}  // namespace zeroshard::detail
