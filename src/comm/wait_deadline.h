// The deadline of one wait for a collective, blind to time the process did not run.
#pragma once

#include <chrono>

namespace zeroshard::detail {

/// A gap between two polls longer than a quarter of the timeout (at least a second) means the
/// process was stopped (SIGSTOP, a debugger) or descheduled, not that the peers were late: that
/// time is added to the deadline, so that a rank resumed after a stop does not blame its peers
/// for its own absence.
class WaitDeadline {
 public:
  explicit WaitDeadline(std::chrono::duration<double> timeout);
  /// True once the deadline has passed; call it on every poll.
  bool expired();
  /// Seconds this wait did not run (the gaps found).
  double not_running_s() const noexcept { return not_running_.count(); }

 private:
  using Clock = std::chrono::steady_clock;
  Clock::duration gap_;
  Clock::time_point deadline_;
  Clock::time_point last_poll_;
  std::chrono::duration<double> not_running_{0};
};

}  // namespace zeroshard::detail
