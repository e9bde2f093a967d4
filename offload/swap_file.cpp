// SwapFile: open with O_DIRECT, refuse tmpfs, reserve the size, and check it is still whole.
#include "offload/swap_file.h"

#include <fcntl.h>
#include <linux/magic.h>  // TMPFS_MAGIC
#include <sys/file.h>     // flock
#include <sys/stat.h>
#include <sys/vfs.h>  // fstatfs
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "zeroshard/error.h"

namespace zeroshard::detail {
namespace {

std::string errno_text(int error) {
  return std::string(std::strerror(error)) + " (errno " + std::to_string(error) + ")";
}

std::string advice(int error) {
  switch (error) {
    case ENOSPC:
      return "free space on the drive or point nvme_path at a larger one";
    case EFBIG:
      return "the size exceeds the file-size limit (ulimit -f / RLIMIT_FSIZE) or the file "
             "system's largest file; raise the limit or use another file system";
    case EINVAL:
      return "the file system refuses O_DIRECT; point nvme_path at a directory on a local "
             "NVMe drive (ext4, xfs)";
    case ENOENT:
      return "a part of nvme_path was removed while the engine started; check the drive";
    case ENOTDIR:
    case EEXIST:
      return "nvme_path or one of its parents is a file, not a directory; point nvme_path "
             "elsewhere";
    case EACCES:
    case EPERM:
    case EROFS:
      return "make nvme_path writable by this process";
    default:
      return "check the drive and the directory named by nvme_path";
  }
}

}  // namespace

std::string swap_file_path(const std::string& directory, int rank, const std::string& kind) {
  std::string path = directory;
  if (!path.empty() && path.back() != '/') path += '/';
  return path + "zeroshard_rank" + std::to_string(rank) + "_" + kind + ".swp";
}

const std::string& make_swap_directory(const std::string& directory) {
  std::error_code error;
  // A directory another rank made a moment before is no error: create_directories reports it as
  // there already.
  std::filesystem::create_directories(directory, error);
  if (!error && !std::filesystem::is_directory(directory, error)) {
    error = std::make_error_code(std::errc::not_a_directory);
  }
  if (error) {
    throw IoError("swap directory " + directory + " (nvme_path): cannot create it: " +
                  errno_text(error.value()) + "; " + advice(error.value()));
  }
  return directory;
}

SwapFile::SwapFile(std::string path, std::int64_t bytes) : path_(std::move(path)), bytes_(bytes) {
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
  if (fd_ < 0) {
    const int error = errno;
    throw IoError("swap file " + path_ + ": open with O_DIRECT failed: " + errno_text(error) +
                  "; " + advice(error));
  }
  // tmpfs has accepted O_DIRECT since Linux 6.6, but a swap file there is host memory again:
  // refuse it by file system type rather than by the open's result.
  struct statfs fs {};
  if (fstatfs(fd_, &fs) == 0 && fs.f_type == TMPFS_MAGIC) {
    ::close(fd_);
    fd_ = -1;
    ::unlink(path_.c_str());
    throw IoError("swap file " + path_ +
                  ": the directory is on tmpfs, which keeps the file in host memory and so "
                  "defeats NVMe offload (and refuses O_DIRECT before Linux 6.6); point nvme_path "
                  "at a directory on a local NVMe drive");
  }
  // Two engines (in this process or another job) given the same nvme_path and rank would
  // overwrite each other's records; the lock is per open file, so it catches both before the file
  // is resized.
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    ::close(fd_);
    fd_ = -1;
    throw IoError("swap file " + path_ + ": already in use (flock: " + errno_text(error) +
                  ") by another engine of this process or another job with the same nvme_path "
                  "and rank; give each run its own nvme_path");
  }
  int rc = ::posix_fallocate(fd_, 0, bytes_);
  if (rc == EOPNOTSUPP || rc == EINVAL) rc = ::ftruncate(fd_, bytes_) == 0 ? 0 : errno;
  if (rc == 0) {
    // A file reused from an earlier run may be larger; the size is part of the format.
    struct stat st {};
    if (::fstat(fd_, &st) == 0 && st.st_size != bytes_ && ::ftruncate(fd_, bytes_) != 0) rc = errno;
  }
  if (rc != 0) {
    ::close(fd_);
    fd_ = -1;
    throw IoError("swap file " + path_ + ": reserving " + std::to_string(bytes_) +
                  " bytes (offset 0, fallocate) failed: " + errno_text(rc) + "; " + advice(rc));
  }
}

SwapFile::SwapFile(SwapFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      path_(std::move(other.path_)),
      bytes_(std::exchange(other.bytes_, 0)) {}

SwapFile& SwapFile::operator=(SwapFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) {
      ::flock(fd_, LOCK_UN);
      ::close(fd_);
    }
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

SwapFile::~SwapFile() {
  if (fd_ < 0) return;
  // A ring that registered the file keeps its open file description, and with it the lock,
  // until the kernel's deferred teardown of the ring: unlock now so the next engine can open it.
  ::flock(fd_, LOCK_UN);
  ::close(fd_);
}

void SwapFile::check_intact(const char* operation) const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int error = errno;
    throw IoError("swap file " + path_ + ": fstat before " + operation +
                  " failed: " + errno_text(error));
  }
  if (st.st_nlink == 0) {
    throw IoError("swap file " + path_ + " was deleted while in use (before " + operation +
                  "); its swapped data is lost: restart from a checkpoint");
  }
  if (st.st_size != bytes_) {
    throw IoError("swap file " + path_ + " is " + std::to_string(st.st_size) + " bytes, expected " +
                  std::to_string(bytes_) + " (before " + operation +
                  "): it was truncated or replaced; restart from a checkpoint");
  }
}

}  // namespace zeroshard::detail
