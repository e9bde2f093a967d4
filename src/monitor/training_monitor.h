// The training series the csv_monitor and tensorboard keys ask for: what one optimizer step
// reports, the names it is written under (DeepSpeed's where it has them) and the writers of this
// rank, which a failing disk turns off with a warning rather than stopping training. Files are
// flushed once a second and at the end rather than at every step: some forty small writes per
// step would cost a sub-millisecond step (the MLP example's) over 10%.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "monitor/series_writer.h"
#include "zeroshard/communicator.h"
#include "zeroshard/config.h"
#include "zeroshard/memory_report.h"

namespace zeroshard::detail {

/// What the engine knows of one optimizer step (an accumulation window's end).
struct MonitoredStep {
  std::int64_t step = 0;     ///< windows ended, skipped ones included: the x of zeroshard's series
  std::int64_t samples = 0;  ///< step x train_batch_size: the x of DeepSpeed's Train/Samples
  double lr = 0.0;
  double loss_scale = 1.0;
  double grad_norm = 0.0;
  bool skipped = false;
  std::int64_t skipped_steps = 0;  ///< skipped so far
  /// Wall-clock milliseconds of this step's parts, by series ("Time/step_ms", ...).
  std::vector<std::pair<const char*, double>> times_ms;
  TrafficCounters traffic;  ///< sent by this rank in this step
  MemoryReport memory;      ///< this rank's, at the step's end
};

/// The series files of one rank. Rank 0 writes every series; the others their memory only.
class TrainingMonitor {
 public:
  /// Opens output_path/job_name of each enabled monitor (rank r > 0: the tensorboard run
  /// job_name/rank<r>); IoError naming the key and the folder when it cannot be written.
  TrainingMonitor(const Config& config, int rank);
  /// Flushes what is still buffered.
  ~TrainingMonitor();
  TrainingMonitor(const TrainingMonitor&) = delete;
  TrainingMonitor& operator=(const TrainingMonitor&) = delete;
  bool enabled() const noexcept { return !writers_.empty(); }

  /// Writes one step's series; flushes when the last flush is kFlushInterval old.
  void write_step(const MonitoredStep& step);
  /// Rank 0: Train/Samples/train_loss at `samples`; other ranks: nothing.
  void write_loss(std::int64_t samples, double loss);
  /// Hands everything written so far to the system.
  void flush();

  /// A crash loses at most this much of the series (a step, where steps take longer).
  static constexpr std::chrono::seconds kFlushInterval{1};

 private:
  void add(std::string_view tag, std::int64_t x, double value);
  void flush_when_due();

  int rank_;
  // The series' names, made once rather than at every step.
  std::array<std::string, kCollectiveCount> comm_tags_;
  /// Per location and category: current and peak bytes; then the location's total peak.
  std::array<std::array<std::array<std::string, 2>, kMemoryCategoryCount>, kMemoryLocationCount>
      memory_tags_;
  std::array<std::string, kMemoryLocationCount> total_peak_tags_;
  std::vector<std::unique_ptr<SeriesWriter>> writers_;
  std::chrono::steady_clock::time_point last_flush_ = std::chrono::steady_clock::now();
};

}  // namespace zeroshard::detail
