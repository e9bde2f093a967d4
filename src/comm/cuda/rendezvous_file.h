// Hands a few bytes from rank 0 to every other rank through a file on a shared file system: the
// bootstrap of NCCL's unique id when no MPI is around.
#pragma once

#include <chrono>
#include <cstddef>
#include <filesystem>

namespace zeroshard::cuda {

/// Rank 0 publishes `count` bytes at `path`, writing a temporary sibling and renaming it so that
/// no reader ever sees a partial file; every other rank polls until the file appears and reads
/// the bytes into `bytes`. Throws TimeoutError naming the path when the file has not appeared
/// within `timeout`, and IoError when it cannot be written or holds other than `count` bytes.
/// Use a fresh path per job: a file left over from an earlier job would be read as this one's.
void exchange_through_file(const std::filesystem::path& path, int rank, void* bytes,
                           std::size_t count, std::chrono::duration<double> timeout);

}  // namespace zeroshard::cuda
