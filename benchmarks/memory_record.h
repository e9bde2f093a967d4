// What the memory benchmark measured on one rank for one configuration, beside the estimator's
// figures for it, and how a record is stored (JSON) and shown (CSV row, table line).
#pragma once

#include <array>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zeroshard/memory_report.h"

namespace zeroshard::bench {

struct Record {
  int world_size = 1;
  int rank = 0;
  /// The configuration's value of every sweep dimension, in dimensions() order.
  std::vector<std::string> values;
  /// "ok", "not supported yet: <why>" (the engine or the model refused the configuration) or
  /// "failed: <why>" (it broke while running).
  std::string status = "ok";

  std::int64_t params = 0;
  std::int64_t padded_params = 0;

  // Measured, from engine.memory_report() after the last timed step (host and device summed).
  std::array<MemoryUsage, kMemoryCategoryCount> measured{};
  std::int64_t measured_total_peak = 0;
  std::int64_t process_peak_rss = 0;
  double step_ms = 0.0;
  /// Of step_ms: running checkpointed blocks' forwards again in backward (0 without).
  double recompute_ms = 0.0;
  std::int64_t sent_bytes_per_step = 0;

  // The estimator's figures for the same configuration (device and host tiers summed).
  std::array<std::int64_t, kMemoryCategoryCount> theory{};
  std::int64_t theory_device_peak = 0;
  std::int64_t theory_sent_bytes_per_step = 0;

  bool ok() const { return status == "ok"; }
  const std::string& value(const char* dimension) const;
  std::int64_t measured_model_states() const;
  std::int64_t theory_model_states() const;
  std::int64_t measured_current(MemoryCategory c) const {
    return measured[static_cast<int>(c)].current;
  }
  std::int64_t measured_peak(MemoryCategory c) const { return measured[static_cast<int>(c)].peak; }
  std::int64_t theory_of(MemoryCategory c) const { return theory[static_cast<int>(c)]; }
  /// measured / theory of the model-state bytes: the figure the test holds to 1 +- 2%.
  double model_state_ratio() const;
  double sent_over_theory() const;
};

nlohmann::json to_json(const Record& record);
Record record_from_json(const nlohmann::json& json);

/// Header and rows of the CSV; one row per rank and configuration. The column `model_state_ratio`
/// holds measured / theory of the model-state bytes.
std::string csv_header();
std::string csv_row(const Record& record);

/// One line per configuration: the largest figure over its ranks (the rank that has to fit), and
/// the ratio furthest from 1.
void print_table(std::ostream& out, const std::vector<Record>& records);

}  // namespace zeroshard::bench
