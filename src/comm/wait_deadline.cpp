// The stall-aware deadline of a wait.
#include "comm/wait_deadline.h"

#include <algorithm>

namespace zeroshard::detail {

WaitDeadline::WaitDeadline(std::chrono::duration<double> timeout)
    : gap_(std::chrono::duration_cast<Clock::duration>(
          std::max(timeout / 4, std::chrono::duration<double>(1.0)))),
      deadline_(Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout)),
      last_poll_(Clock::now()) {}

bool WaitDeadline::expired() {
  const Clock::time_point now = Clock::now();
  if (now - last_poll_ > gap_) {
    deadline_ += now - last_poll_;
    not_running_ += now - last_poll_;
  }
  last_poll_ = now;
  return now >= deadline_;
}

}  // namespace zeroshard::detail
