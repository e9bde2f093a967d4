// An io_uring instance as a move-only RAII handle: setup, registered buffers and files, and the
// submit/complete calls the swapper uses, every liburing return code checked.
#pragma once

#include <sys/uio.h>  // iovec

#include <memory>
#include <span>
#include <string>

struct io_uring;
struct io_uring_sqe;
struct io_uring_cqe;

namespace zeroshard::detail {

/// One completion, copied out of the ring before it is marked seen.
struct RingCompletion {
  unsigned long long user_data = 0;
  int result = 0;
};

/// Owns an io_uring with `entries` submission slots (the completion queue is twice as large, so
/// with at most `entries` requests in flight it never overflows). Not thread-safe.
class IoUringRing {
 public:
  /// Throws IoError naming `what` (the file the ring serves) when io_uring_queue_init fails, e.g.
  /// when a container's seccomp profile blocks io_uring.
  IoUringRing(unsigned entries, const std::string& what);
  IoUringRing(IoUringRing&&) noexcept;
  IoUringRing& operator=(IoUringRing&&) noexcept;
  IoUringRing(const IoUringRing&) = delete;
  IoUringRing& operator=(const IoUringRing&) = delete;
  ~IoUringRing();

  /// Registers `buffers` for fixed reads and writes. Returns false (and logs a warning) when the
  /// kernel refuses for lack of lockable memory (RLIMIT_MEMLOCK), so the caller uses plain I/O;
  /// throws IoError on any other failure.
  bool register_buffers(std::span<const iovec> buffers);
  /// Registers `fds` as fixed files 0..n-1; false (with a warning) where unsupported.
  bool register_files(std::span<const int> fds);
  /// Signals `eventfd` for every completion posted from now on; throws IoError if refused.
  void register_eventfd(int eventfd);

  unsigned entries() const noexcept { return entries_; }
  /// A free submission entry; throws IoError if the queue is full (a bookkeeping bug).
  io_uring_sqe* next_sqe();
  /// Submits every prepared entry; returns how many. -EAGAIN/-EBUSY/-EINTR give 0 (retry later).
  int submit();
  /// Blocks until at least `count` completions are ready and copies up to `out.size()` of them
  /// into `out`, marking them seen; returns how many were copied.
  int wait(unsigned count, std::span<RingCompletion> out);

 private:
  std::unique_ptr<io_uring> ring_;
  unsigned entries_ = 0;
  std::string what_;
};

}  // namespace zeroshard::detail
