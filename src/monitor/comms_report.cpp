// Formatting comms_logger's timings, and the bandwidth formulas of nccl-tests' PERFORMANCE.md.
#include "monitor/comms_report.h"

#include <cstdio>
#include <map>
#include <utility>

namespace zeroshard::detail {
namespace {

// The names prof_ops takes, in Collective's order (torch.distributed's spelling).
constexpr const char* kOpNames[kCollectiveCount] = {"all_reduce", "reduce_scatter", "all_gather",
                                                    "broadcast",  "barrier",        "all_to_all"};

std::string size_text(std::int64_t bytes) {
  char text[32];
  if (bytes >= (std::int64_t{1} << 20)) {
    std::snprintf(text, sizeof text, "%.2f MB", static_cast<double>(bytes) / 1048576.0);
  } else if (bytes >= 1024) {
    std::snprintf(text, sizeof text, "%.2f KB", static_cast<double>(bytes) / 1024.0);
  } else {
    std::snprintf(text, sizeof text, "%lld B", static_cast<long long>(bytes));
  }
  return text;
}

}  // namespace

TimingOptions timing_options(const CommsLoggerConfig& logger) {
  TimingOptions options;
  options.enabled = logger.enabled;
  options.log_each = logger.verbose;
  options.log_detail = logger.debug;
  if (!logger.prof_all) {
    for (int kind = 0; kind < kCollectiveCount; ++kind) {
      options.kinds[kind] = false;
      for (const std::string& name : logger.prof_ops) options.kinds[kind] |= name == kOpNames[kind];
    }
  }
  return options;
}

std::vector<CollectiveTiming> timings_since(const std::vector<CollectiveTiming>& before,
                                            const std::vector<CollectiveTiming>& now) {
  std::map<std::pair<Collective, std::int64_t>, const CollectiveTiming*> earlier;
  for (const CollectiveTiming& timing : before)
    earlier[{timing.op, timing.message_bytes}] = &timing;
  std::vector<CollectiveTiming> since;
  for (CollectiveTiming timing : now) {
    if (auto it = earlier.find({timing.op, timing.message_bytes}); it != earlier.end()) {
      timing.calls -= it->second->calls;
      timing.seconds -= it->second->seconds;
    }
    if (timing.calls > 0) since.push_back(timing);
  }
  return since;
}

Bandwidth bandwidth(const CollectiveTiming& timing, int world) {
  if (timing.calls == 0 || timing.seconds <= 0.0) return {};
  const double n = world;
  const double rate = static_cast<double>(timing.message_bytes) * timing.calls / timing.seconds;
  switch (timing.op) {
    case Collective::kAllReduce:
      return {.algorithm = 2.0 * rate, .bus = rate * 2.0 * (n - 1.0) / n};
    case Collective::kAllGather:
    case Collective::kReduceScatter:
    case Collective::kAllToAll:
      return {.algorithm = rate, .bus = rate * (n - 1.0) / n};
    case Collective::kBroadcast:
      return {.algorithm = rate, .bus = rate};
    case Collective::kBarrier:
      return {};
  }
  return {};
}

std::string comms_table(const std::vector<CollectiveTiming>& timings, int world) {
  std::string table =
      "Comm. Op        Message Size   Count   Total Latency(ms)  Avg Latency(ms)  "
      "tput_avg (Gbps)  busbw_avg (Gbps)";
  for (const CollectiveTiming& timing : timings) {
    const Bandwidth rate = bandwidth(timing, world);
    char line[200];
    std::snprintf(line, sizeof line, "\n%-15s %12s %7lld %19.3f %16.3f %16.3f %17.3f",
                  to_string(timing.op), size_text(timing.message_bytes).c_str(),
                  static_cast<long long>(timing.calls), timing.seconds * 1e3,
                  timing.seconds * 1e3 / static_cast<double>(timing.calls),
                  rate.algorithm * 8.0 / 1e9, rate.bus * 8.0 / 1e9);
    table += line;
  }
  return table;
}

}  // namespace zeroshard::detail
