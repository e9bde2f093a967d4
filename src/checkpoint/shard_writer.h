// Writing a checkpoint's data file: sections of fp32 values front to back, each checksummed,
// with the drive writing one chunk while the caller fills the next.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_format.h"
#include "checkpoint/direct_io.h"

namespace zeroshard::detail {

/// Creates a new file and writes it sequentially through two aligned chunks: a worker writes
/// chunk k with O_DIRECT (straight from the chunk to the drive: no copy into the page cache, no
/// dirty pages left for fsync) while the caller fills and checksums chunk k + 1. A file system
/// that refuses O_DIRECT gets the same writes through the page cache.
class ShardWriter {
 public:
  /// Fills out[0, n) with the section's elements [first, first + n).
  using Producer = std::function<void(float* out, std::int64_t first, std::int64_t n)>;

  /// Creates `path`; IoError when it exists or cannot be created.
  explicit ShardWriter(const std::string& path);
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;
  /// Waits for the write in flight; the file stays incomplete unless finish() returned.
  ~ShardWriter();

  /// Appends `count` elements taken from `produce` and returns the CRC-32C of each chunk of
  /// kIoChunk elements of them (the manifest's chunk_crc of the section).
  std::vector<std::uint32_t> write_section(std::int64_t count, const Producer& produce);
  /// Writes what is buffered, sets the exact length and fsyncs: the file is durable when it
  /// returns. IoError naming the file on any failure (a full disk included).
  void finish();

 private:
  /// Hands the current chunk's first `bytes` to the worker once the previous write is done.
  void submit(std::int64_t bytes);
  /// On the worker: `bytes` of `data` at `offset`, direct while the file system allows it.
  void write_chunk(const float* data, std::int64_t bytes, std::int64_t offset);

  FileHandle buffered_;
  std::optional<FileHandle> direct_;  ///< empty when the file system refuses O_DIRECT
  AlignedChunk chunks_[2];
  int current_ = 0;
  std::int64_t filled_ = 0;   ///< elements in the current chunk
  std::int64_t written_ = 0;  ///< bytes handed to the worker
  std::future<void> pending_;
};

}  // namespace zeroshard::detail
