// A swap file as a move-only RAII handle: one per rank per tensor kind under nvme_path, opened
// with O_DIRECT and given its full size up front, so a full disk shows at creation.
#pragma once

#include <cstdint>
#include <string>

namespace zeroshard::detail {

/// The file a rank's swap of one tensor kind lives in: `<directory>/zeroshard_rank<R>_<kind>.swp`.
std::string swap_file_path(const std::string& directory, int rank, const std::string& kind);

/// Creates `directory` and its missing parents, as DeepSpeed does with nvme_path; several ranks
/// may do so at once. Returns it; IoError naming it when it cannot be made (a file in the way, no
/// permission).
const std::string& make_swap_directory(const std::string& directory);

/// An O_DIRECT file of exactly `bytes` bytes, created (or reused and resized) at `path`.
class SwapFile {
 public:
  /// Creates the directory's file and reserves `bytes` (fallocate; ftruncate where the file
  /// system has no fallocate). Throws IoError naming the path, the operation and what to do when
  /// the directory is missing, the file system is tmpfs or refuses O_DIRECT, the disk is full
  /// (ENOSPC) or the size exceeds RLIMIT_FSIZE (EFBIG).
  SwapFile(std::string path, std::int64_t bytes);
  SwapFile(SwapFile&& other) noexcept;
  SwapFile& operator=(SwapFile&& other) noexcept;
  SwapFile(const SwapFile&) = delete;
  SwapFile& operator=(const SwapFile&) = delete;
  ~SwapFile();

  int fd() const noexcept { return fd_; }
  const std::string& path() const noexcept { return path_; }
  std::int64_t bytes() const noexcept { return bytes_; }
  /// Throws IoError when the file has been deleted or its size is no longer bytes(): a
  /// truncated or replaced file must not be read as if it held the swapped data.
  void check_intact(const char* operation) const;

 private:
  int fd_ = -1;
  std::string path_;
  std::int64_t bytes_ = 0;
};

}  // namespace zeroshard::detail
