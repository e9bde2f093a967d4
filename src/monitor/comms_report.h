// comms_logger's tables: the engine's collectives per kind and message size, with their count,
// latency and algorithm and bus bandwidth, as DeepSpeed's comms logger prints them.
#pragma once

#include <string>
#include <vector>

#include "zeroshard/communicator.h"
#include "zeroshard/config.h"

namespace zeroshard::detail {

/// What Communicator::set_timing is given for `logger` (kinds from prof_ops unless prof_all).
TimingOptions timing_options(const CommsLoggerConfig& logger);

/// The collectives in `now` that are not in `before` (both from Communicator::timings()).
std::vector<CollectiveTiming> timings_since(const std::vector<CollectiveTiming>& before,
                                            const std::vector<CollectiveTiming>& now);

/// Bytes per second the collective moved, as nccl-tests and DeepSpeed define them for `world`
/// ranks: the algorithm bandwidth (an all-reduce counts its message twice) and the bus bandwidth
/// (the algorithm's bytes scaled by what each link carries: 2(n-1)/n for an all-reduce, (n-1)/n
/// for all-gather, reduce-scatter and all-to-all, 1 for a broadcast).
struct Bandwidth {
  double algorithm = 0.0;
  double bus = 0.0;
};
Bandwidth bandwidth(const CollectiveTiming& timing, int world);

/// A header line and one line per kind and size: "Comm. Op | Message Size | Count | Total
/// Latency(ms) | Avg Latency(ms) | tput_avg (Gbps) | busbw_avg (Gbps)".
std::string comms_table(const std::vector<CollectiveTiming>& timings, int world);

}  // namespace zeroshard::detail
