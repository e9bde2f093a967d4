// IoUringRing: liburing calls with their errors turned into IoError or a logged fallback.
#include "offload/io_uring_ring.h"

#include <liburing.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "util/log.h"
#include "zeroshard/error.h"

namespace zeroshard::detail {
namespace {

std::string describe(int negative_errno) { return std::strerror(-negative_errno); }

}  // namespace

IoUringRing::IoUringRing(unsigned entries, const std::string& what, const RingOptions& options)
    : ring_(std::make_unique<io_uring>()), entries_(entries), what_(what) {
  // The kernel refuses COOP_TASKRUN beside SQPOLL: completions then run on the polling thread.
  unsigned flags = IORING_SETUP_CQSIZE;
  if (options.sq_poll) {
    flags |= IORING_SETUP_SQPOLL;
    if (options.sq_poll_cpu >= 0) flags |= IORING_SETUP_SQ_AFF;
  } else {
    flags |= IORING_SETUP_COOP_TASKRUN;
  }
  int rc = 0;
  for (;;) {
    io_uring_params params{};
    params.flags = flags;
    params.cq_entries = 2 * entries;
    params.sq_thread_cpu = static_cast<unsigned>(std::max(options.sq_poll_cpu, 0));
    params.sq_thread_idle = options.sq_poll_idle_ms;
    rc = io_uring_queue_init_params(entries, ring_.get(), &params);
    if (rc >= 0) break;
    // Each optional flag is dropped in turn where the kernel refuses it, as fio does.
    if ((flags & IORING_SETUP_SQPOLL) && (rc == -EPERM || rc == -EINVAL)) {
      ZEROSHARD_LOG(kWarning, "io_uring with a submission-polling thread (IORING_SETUP_SQPOLL"
                                  << (options.sq_poll_cpu >= 0
                                          ? " on CPU " + std::to_string(options.sq_poll_cpu)
                                          : std::string())
                                  << ") for " << what_ << " refused (" << describe(rc)
                                  << "); submitting with system calls instead");
      flags = (flags & ~(IORING_SETUP_SQPOLL | IORING_SETUP_SQ_AFF)) | IORING_SETUP_COOP_TASKRUN;
      continue;
    }
    if ((flags & IORING_SETUP_COOP_TASKRUN) && rc == -EINVAL) {
      flags &= ~IORING_SETUP_COOP_TASKRUN;  // before Linux 5.19
      continue;
    }
    break;
  }
  sq_polling_ = (flags & IORING_SETUP_SQPOLL) != 0;
  if (rc < 0) {
    ring_.reset();
    throw IoError("io_uring_queue_init(" + std::to_string(entries) + ") for " + what_ +
                  " failed: " + describe(rc) +
                  "; io_uring needs Linux 5.6+ and, in containers, a seccomp profile that "
                  "allows it (see docs/nvme.md)");
  }
}

IoUringRing::IoUringRing(IoUringRing&& other) noexcept
    : ring_(std::move(other.ring_)),
      entries_(std::exchange(other.entries_, 0)),
      sq_polling_(other.sq_polling_),
      unsubmitted_(std::exchange(other.unsubmitted_, 0)),
      what_(std::move(other.what_)) {}

IoUringRing& IoUringRing::operator=(IoUringRing&& other) noexcept {
  if (this != &other) {
    if (ring_) io_uring_queue_exit(ring_.get());
    ring_ = std::move(other.ring_);
    entries_ = std::exchange(other.entries_, 0);
    sq_polling_ = other.sq_polling_;
    unsubmitted_ = std::exchange(other.unsubmitted_, 0);
    what_ = std::move(other.what_);
  }
  return *this;
}

IoUringRing::~IoUringRing() {
  if (ring_) io_uring_queue_exit(ring_.get());
}

bool IoUringRing::register_buffers(std::span<const iovec> buffers) {
  const int rc =
      io_uring_register_buffers(ring_.get(), buffers.data(), static_cast<unsigned>(buffers.size()));
  if (rc == 0) return true;
  if (rc == -ENOMEM || rc == -EPERM || rc == -EOPNOTSUPP) {
    ZEROSHARD_LOG(kWarning, "io_uring_register_buffers for " << what_ << " failed (" << describe(rc)
                                                             << "); using unregistered buffers. "
                                                                "Raise RLIMIT_MEMLOCK (ulimit -l) "
                                                                "to register them");
    return false;
  }
  throw IoError("io_uring_register_buffers for " + what_ + " failed: " + describe(rc));
}

bool IoUringRing::register_files(std::span<const int> fds) {
  const int rc =
      io_uring_register_files(ring_.get(), fds.data(), static_cast<unsigned>(fds.size()));
  if (rc == 0) return true;
  ZEROSHARD_LOG(kWarning, "io_uring_register_files for " << what_ << " failed (" << describe(rc)
                                                         << "); using the plain descriptor");
  return false;
}

void IoUringRing::register_eventfd(int eventfd) {
  const int rc = io_uring_register_eventfd(ring_.get(), eventfd);
  if (rc < 0) throw IoError("io_uring_register_eventfd for " + what_ + " failed: " + describe(rc));
}

io_uring_sqe* IoUringRing::next_sqe() {
  io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
  if (!sqe) throw IoError("io_uring submission queue of " + what_ + " is full (internal error)");
  ++unsubmitted_;
  return sqe;
}

int IoUringRing::submit() {
  const int rc = io_uring_submit(ring_.get());
  // With SQPOLL, io_uring_submit publishes every prepared entry to the polling thread and counts
  // those it has not taken yet, which may be none.
  if (rc >= 0) return sq_polling_ ? static_cast<int>(std::exchange(unsubmitted_, 0)) : rc;
  if (rc == -EAGAIN || rc == -EBUSY || rc == -EINTR) return 0;
  throw IoError("io_uring_submit for " + what_ + " failed: " + describe(rc));
}

int IoUringRing::wait(unsigned count, std::span<RingCompletion> out) {
  io_uring_cqe* cqe = nullptr;
  if (count > 0) {
    int rc;
    do {
      rc = io_uring_wait_cqe_nr(ring_.get(), &cqe, count);
    } while (rc == -EINTR || rc == -EAGAIN);
    if (rc < 0) throw IoError("io_uring_wait_cqe for " + what_ + " failed: " + describe(rc));
  }
  int copied = 0;
  while (static_cast<std::size_t>(copied) < out.size()) {
    const int rc = io_uring_peek_cqe(ring_.get(), &cqe);
    if (rc == -EAGAIN) break;
    if (rc < 0) throw IoError("io_uring_peek_cqe for " + what_ + " failed: " + describe(rc));
    out[copied].user_data = cqe->user_data;
    out[copied].result = cqe->res;
    ++copied;
    io_uring_cqe_seen(ring_.get(), cqe);
  }
  return copied;
}

}  // namespace zeroshard::detail
