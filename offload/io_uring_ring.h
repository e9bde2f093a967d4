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

/// How a ring is set up beyond its size.
struct RingOptions {
  /// IORING_SETUP_SQPOLL: a kernel thread takes submissions from the queue, so submitting needs
  /// no system call while it is awake. Where the kernel refuses (EPERM, EINVAL, e.g. an old
  /// kernel or a container without the capability) the ring is made without it and a warning
  /// logged.
  bool sq_poll = false;
  int sq_poll_cpu = -1;  ///< pins the polling thread to this CPU (IORING_SETUP_SQ_AFF); -1: any
  unsigned sq_poll_idle_ms = 1000;  ///< the polling thread sleeps after this long without work
};

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
  /// when a container's seccomp profile blocks io_uring. Without SQPOLL it asks for
  /// IORING_SETUP_COOP_TASKRUN (completions run when the task enters the kernel, not by
  /// interrupting it), as fio does, and goes without it on kernels before 5.19.
  IoUringRing(unsigned entries, const std::string& what, const RingOptions& options = {});
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
  /// Whether a kernel thread polls the submission queue (asked for and granted).
  bool sq_polling() const noexcept { return sq_polling_; }
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
  bool sq_polling_ = false;
  unsigned unsubmitted_ = 0;  // entries handed out by next_sqe() since the last submit()
  std::string what_;
};

}  // namespace zeroshard::detail
