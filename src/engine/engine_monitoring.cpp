// The engine's side of csv_monitor, tensorboard and comms_logger: opening them at finalize(),
// measuring each window's series from the step's timers, the communicator's counters and the
// memory tracker, and the comms summary when the engine ends.
#include <chrono>
#include <exception>

#include "engine/engine_state.h"
#include "monitor/comms_report.h"
#include "util/log.h"
#include "zeroshard/error.h"

namespace zeroshard::detail {

void EngineState::open_monitors() {
  comm_->set_timing(timing_options(config_.comms_logger));
  monitored_traffic_ = comm_->traffic();
  last_window_end_ = std::chrono::steady_clock::now();
  // The same on every rank (check_ranks_agree compared the configs): all skip the agreement.
  if (!config_.csv_monitor.enabled && !config_.tensorboard.enabled) return;
  std::exception_ptr failure;
  try {
    auto monitor = std::make_unique<TrainingMonitor>(config_, rank_);
    if (monitor->enabled()) monitor_ = std::move(monitor);
  } catch (...) {
    failure = std::current_exception();
  }
  // A rank that cannot write must not leave the others training into a collective it never joins.
  const std::string first = failure_on_any_rank(failure);
  if (failure) std::rethrow_exception(failure);
  if (!first.empty()) throw IoError("opening the monitors failed on " + first);
}

std::int64_t EngineState::samples_seen() const {
  // A Config built in code may leave train_batch_size unset (0); the identity gives it.
  const std::int64_t batch =
      config_.train_batch_size > 0
          ? config_.train_batch_size
          : config_.train_micro_batch_size_per_gpu * config_.gradient_accumulation_steps * world_;
  return windows_ * batch;
}

void EngineState::monitor_step(const StepResult& result) {
  ++windows_;
  if (result.skipped) ++skipped_steps_;
  if (!monitor_) return;
  MonitoredStep step;
  step.step = windows_;
  step.samples = samples_seen();
  step.lr = result.lr;
  step.loss_scale = loss_scale();
  step.grad_norm = result.grad_norm;
  step.skipped = result.skipped;
  step.skipped_steps = skipped_steps_;

  const auto now = std::chrono::steady_clock::now();
  const auto ms = [](double seconds) { return seconds * 1e3; };
  const StepTimes& before = monitored_times_;
  step.times_ms = {
      {"Time/step_ms", std::chrono::duration<double, std::milli>(now - last_window_end_).count()},
      {"Time/reduce_ms", ms(times_.reduce - before.reduce)},
      {"Time/update_ms", ms(times_.update - before.update)},
      {"Time/scan_ms", ms(times_.scan - before.scan)},
      {"Time/norm_wait_ms", ms(times_.norm_wait - before.norm_wait)},
      {"Time/rule_ms", ms(times_.rule - before.rule)},
      {"Time/gather_ms", ms(times_.gather - before.gather)}};
  if (optimizer_->offloaded()) {
    step.times_ms.emplace_back("Time/copy_wait_ms", ms(times_.copy_wait - before.copy_wait));
    step.times_ms.emplace_back("Time/landed_scan_ms", ms(times_.landed_scan - before.landed_scan));
  }
  if (optimizer_->swaps()) {
    step.times_ms.emplace_back("Time/swap_read_wait_ms",
                               ms(times_.swap_read_wait - before.swap_read_wait));
    step.times_ms.emplace_back("Time/swap_write_wait_ms",
                               ms(times_.swap_write_wait - before.swap_write_wait));
  }
  last_window_end_ = now;
  monitored_times_ = times_;

  const TrafficCounters& traffic = comm_->traffic();
  for (int kind = 0; kind < kCollectiveCount; ++kind) {
    step.traffic.bytes[kind] = traffic.bytes[kind] - monitored_traffic_.bytes[kind];
    step.traffic.elements[kind] = traffic.elements[kind] - monitored_traffic_.elements[kind];
    step.traffic.calls[kind] = traffic.calls[kind] - monitored_traffic_.calls[kind];
  }
  monitored_traffic_ = traffic;
  step.memory = tracker_.counted(rank_, world_);
  monitor_->write_step(step);
}

void EngineState::log_loss(double loss) {
  if (monitor_) monitor_->write_loss(samples_seen(), loss);
}

void EngineState::log_comms_summary() noexcept {
  if (!config_.comms_logger.enabled || rank_ != 0 || !finalized_) return;
  try {
    ZEROSHARD_LOG(kProgress, "comms_logger summary over " << global_step_ << " steps:\n"
                                                          << comms_table(comm_->timings(), world_));
  } catch (const std::exception& error) {
    ZEROSHARD_LOG(kWarning, "comms_logger summary failed: " << error.what());
  }
}

}  // namespace zeroshard::detail
