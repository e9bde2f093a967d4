// EventFd: creation, signal and wait, every errno checked.
#include "offload/event_fd.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "zeroshard/error.h"

namespace zeroshard::detail {

EventFd::EventFd() : fd_(eventfd(0, EFD_CLOEXEC)) {
  if (fd_ < 0) {
    throw IoError(std::string("eventfd for the swap I/O thread failed: ") + std::strerror(errno) +
                  "; raise the open-files limit (ulimit -n)");
  }
}

EventFd::~EventFd() { close(fd_); }

void EventFd::signal() noexcept {
  const std::uint64_t one = 1;
  // Only a counter at its maximum refuses, and then a wake-up is pending anyway.
  [[maybe_unused]] const ssize_t n = write(fd_, &one, sizeof one);
}

void EventFd::wait() {
  std::uint64_t count = 0;
  while (read(fd_, &count, sizeof count) < 0) {
    if (errno != EINTR) {
      throw IoError(std::string("eventfd wait for the swap I/O thread failed: ") +
                    std::strerror(errno));
    }
  }
}

}  // namespace zeroshard::detail
