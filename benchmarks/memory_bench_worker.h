// The memory benchmark's worker: one process of an mpirun world, it runs every configuration of
// the sweep at this world size and writes what it measured, one JSON line per configuration.
#pragma once

#include <string>

#include "memory_sweep.h"

namespace zeroshard::bench {

/// The file a worker rank writes its records to, one JSON object per line.
std::string worker_results_path(const std::string& dir, int world_size, int rank);

/// Runs the sweep in the world this process was started in. Rank 0 prints "progress K" on
/// stdout after configuration K has finished on every rank. Returns the exit code.
int run_worker(const BenchOptions& options);

}  // namespace zeroshard::bench
