// What O_DIRECT reads and writes of checkpoint files need: the block alignment of file offsets,
// lengths and memory, and buffers that meet it.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "zeroshard/error.h"

namespace zeroshard::detail {

/// 4096 covers every common drive's logical block (512 and 4096-byte sectors).
inline constexpr std::int64_t kDirectAlign = 4096;

/// Elements per chunk of a checkpoint file read or written (16 MiB of fp32): the unit one thread
/// transfers while the caller checksums the other.
inline constexpr std::int64_t kIoChunk = std::int64_t{1} << 22;

struct AlignedFree {
  void operator()(float* p) const noexcept { std::free(p); }
};
using AlignedChunk = std::unique_ptr<float[], AlignedFree>;

/// `count` floats at a kDirectAlign boundary; OutOfMemoryError naming `what` when there are none.
inline AlignedChunk aligned_chunk(std::int64_t count, const char* what) {
  const std::size_t bytes = (static_cast<std::size_t>(count) * sizeof(float) + kDirectAlign - 1) /
                            kDirectAlign * kDirectAlign;
  void* p = std::aligned_alloc(kDirectAlign, bytes);
  if (p == nullptr) {
    throw OutOfMemoryError("cannot allocate a " + std::to_string(bytes) + "-byte " + what);
  }
  return AlignedChunk(static_cast<float*>(p));
}

}  // namespace zeroshard::detail
