// The bytes a network interface sends in each phase of a training step, summed over hosts: what
// crosses between test hosts in forward, in backward and in the optimizer step
// (tests/multihost/run_multihost.sh zeropp).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "zeroshard/communicator.h"  // Communicator

namespace zeroshard::examples {

/// A phase of a training step, named by where it ends.
enum class WirePhase {
  kForward,   ///< from the step's start (or the previous micro-step's step()) to the loss
  kBackward,  ///< from the loss to the last layer's backward, before an at-end gradient handover
  kStep,      ///< from there to the end of Engine::step()
};
inline constexpr int kWirePhaseCount = 3;

/// Reads one interface's transmit counter (/proc/net/dev of the rank's network namespace) at each
/// phase boundary, after a barrier of `communicator`, so that every rank has left the phase
/// before the counter is read. Only the first rank of each host reads it: the ranks of a host
/// (grouped by gethostname(), as hpZ and qgZ group them) share its interface. Every call is
/// collective.
class WirePhases {
 public:
  /// Throws UsageError on a rank whose host has no `interface`.
  WirePhases(Communicator& communicator, std::string interface);

  /// A step begins; its phases add to the totals when `counted`.
  void start_step(bool counted);
  /// `phase`, which began at the previous boundary, ends.
  void end_phase(WirePhase phase);
  /// Bytes per counted step of each phase, summed over hosts: {"interface", "hosts",
  /// "steps", "forward", "backward", "step"}.
  nlohmann::json report();

 private:
  void read_boundary(int phase);

  Communicator& communicator_;
  std::string interface_;
  bool reads_ = false;
  int hosts_ = 0;
  bool counted_ = false;
  int steps_ = 0;
  std::int64_t last_ = 0;
  double bytes_[kWirePhaseCount] = {};
};

}  // namespace zeroshard::examples
