// What every example trainer's --report-json file holds: losses, parameter checksums, the run's
// stage, precision and device, activation checkpointing's counters, and every rank's memory
// report. Each trainer adds its own fields before writing it.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "zeroshard/zeroshard.h"

namespace zeroshard::examples {

/// Sums over the parameters: equal checksums say two runs ended with the same weights.
struct Checksum {
  double sum = 0.0;
  double abs_sum = 0.0;
};

/// Collective: over every trainable parameter's fp32 master values, streamed a chunk at a time
/// (Engine::visit_consolidated_parameters), so the whole model is never copied for it.
Checksum checksum(Engine& engine);

/// Every rank's memory report, gathered over the program's communicator.
struct GatheredMemory {
  std::vector<std::string> tables;  ///< MemoryReport::to_table() of each rank
  std::vector<std::string> json;    ///< MemoryReport::to_json() of each rank
};

GatheredMemory gather_memory(Communicator& communicator, const MemoryReport& report);

/// The fields every trainer's report has.
struct RunSummary {
  const std::vector<double>& losses;  ///< the global loss of each step run
  Checksum initial;                   ///< after initialisation (and --resume / --init-from)
  Checksum final;
  int first_step = 0;
  int world = 1;
  std::int64_t parameters = 0;
  int checkpoint_every = 0;
  /// With activation checkpointing, the report's "checkpointing" section holds where kept inputs
  /// went, the recomputes and the peaks they kept.
  const ActivationCheckpointer* checkpointer = nullptr;
};

nlohmann::json run_report(const Engine& engine, const Config& config, const Device& device,
                          const RunSummary& run);

/// Adds every rank's memory report to `report` and writes it, indented, to `path`.
void write_report_json(const std::string& path, nlohmann::json report,
                       const GatheredMemory& memory);

}  // namespace zeroshard::examples
