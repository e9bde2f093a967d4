// An eventfd as a move-only RAII handle: one descriptor a thread sleeps on until another thread,
// or an io_uring ring that posts completions to it, says something happened.
#pragma once

namespace zeroshard::detail {

class EventFd {
 public:
  /// Throws IoError when the kernel refuses an eventfd (out of descriptors).
  EventFd();
  EventFd(const EventFd&) = delete;
  EventFd& operator=(const EventFd&) = delete;
  ~EventFd();

  int fd() const noexcept { return fd_; }
  /// Wakes the waiter, or the next wait() if none is waiting.
  void signal() noexcept;
  /// Blocks until at least one signal (or ring completion) since the last wait() returned.
  void wait();

 private:
  int fd_ = -1;
};

}  // namespace zeroshard::detail
