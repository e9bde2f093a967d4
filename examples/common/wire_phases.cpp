// Per-phase interface bytes of a training step across hosts (wire_phases.h).
#include "wire_phases.h"

#include <unistd.h>  // gethostname

#include <algorithm>
#include <utility>
#include <vector>

#include "transmitted_bytes.h"
#include "zeroshard/error.h"  // UsageError

namespace zeroshard::examples {
namespace {

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

}  // namespace

WirePhases::WirePhases(Communicator& communicator, std::string interface)
    : communicator_(communicator), interface_(std::move(interface)) {
  const std::string host = host_name();
  const std::vector<std::string> hosts = communicator_.all_gather_text(host);
  const auto first = std::find(hosts.begin(), hosts.end(), host);
  reads_ = first - hosts.begin() == communicator_.rank();
  std::vector<std::string> distinct = hosts;
  std::sort(distinct.begin(), distinct.end());
  hosts_ = static_cast<int>(std::unique(distinct.begin(), distinct.end()) - distinct.begin());
  if (reads_ && transmitted_bytes(interface_) < 0) {
    throw UsageError("--wire-interface: got '" + interface_ + "', which host " + host +
                     " does not have (/proc/net/dev)");
  }
}

void WirePhases::read_boundary(int phase) {
  communicator_.barrier();
  if (!reads_) return;
  const std::int64_t now = transmitted_bytes(interface_);
  if (phase >= 0 && counted_) bytes_[phase] += static_cast<double>(now - last_);
  last_ = now;
}

void WirePhases::start_step(bool counted) {
  read_boundary(-1);
  counted_ = counted;
  if (counted) ++steps_;
}

void WirePhases::end_phase(WirePhase phase) { read_boundary(static_cast<int>(phase)); }

nlohmann::json WirePhases::report() {
  double sums[kWirePhaseCount];
  std::copy(std::begin(bytes_), std::end(bytes_), sums);
  communicator_.all_reduce(sums, kWirePhaseCount, DType::kFloat64, ReduceOp::kSum);
  const double steps = steps_ > 0 ? steps_ : 1;
  return {{"interface", interface_},
          {"hosts", hosts_},
          {"steps", steps_},
          {"forward", sums[0] / steps},
          {"backward", sums[1] / steps},
          {"step", sums[2] / steps}};
}

}  // namespace zeroshard::examples
